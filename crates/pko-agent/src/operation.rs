//! Operations the agent knows: a bounded event log per operation that any number of clients follow from its first event
//! (Run and Attach), the running Pulumi process for Cancel and shutdown, and retention of finished operations.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::Stream;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pko_proto::v1::{LogLine, OperationEvent, OperationResult, log_line, operation_event::Event};
use tokio::sync::watch;

/// One operation's shared state.
#[derive(Debug)]
pub struct Operation {
    /// Caller-chosen id.
    pub id: String,
    /// The newest fencing epoch seen for this operation (its `Run`, then any later caller's).
    epoch: std::sync::atomic::AtomicI64,
    log: Mutex<EventLog>,
    count: watch::Sender<usize>,
    pid: AtomicU32,
    /// The signal that stops the running process at once with all it started (`Cli::hard_stop`).
    hard_stop: std::sync::atomic::AtomicI32,
    /// Cancel was requested.
    pub cancelled: AtomicBool,
    /// The agent is shutting down: the operation ends Interrupted.
    pub interrupted: AtomicBool,
    finished_at: Mutex<Option<Instant>>,
    /// Whose operation it is, for its lines on the agent's standard output (unset: not printed).
    output: std::sync::OnceLock<crate::output::Context>,
}

#[derive(Debug)]
struct EventLog {
    events: Vec<OperationEvent>,
    next_seq: u64,
    dropped: u64,
    max: usize,
}

impl Operation {
    fn new(id: String, epoch: i64, max_events: usize) -> Self {
        let (count, _) = watch::channel(0);
        Self {
            id,
            epoch: std::sync::atomic::AtomicI64::new(epoch),
            log: Mutex::new(EventLog { events: Vec::new(), next_seq: 0, dropped: 0, max: max_events.max(2) }),
            count,
            pid: AtomicU32::new(0),
            hard_stop: std::sync::atomic::AtomicI32::new(Signal::SIGKILL as i32),
            cancelled: AtomicBool::new(false),
            interrupted: AtomicBool::new(false),
            finished_at: Mutex::new(None),
            output: std::sync::OnceLock::new(),
        }
    }

    /// The newest fencing epoch seen for this operation.
    pub fn epoch(&self) -> i64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Admits a caller with `epoch`: refused (`Err(newest)`) when older than the newest seen, which it becomes
    /// otherwise. A replica that lost the operation's shard cannot follow, cancel or restart it once the shard's new
    /// holder has called.
    pub fn admit(&self, epoch: i64) -> Result<(), i64> {
        let newest = self.epoch.fetch_max(epoch, Ordering::SeqCst);
        if epoch < newest { Err(newest) } else { Ok(()) }
    }

    /// Prints the operation's lines to the agent's standard output from now on, as `ctx` says ([`crate::output`]); set
    /// once.
    pub fn print_to(&self, ctx: crate::output::Context) {
        let _ = self.output.set(ctx);
    }

    /// Prints engine event `event` as Pulumi would (when it prints anything for it).
    pub fn print_engine(&self, event: &serde_json::Map<String, serde_json::Value>) {
        if let (Some(out), Some(line)) = (self.output.get(), pko_proto::lines::render(event)) {
            out.print("engine", &line);
        }
    }

    /// Appends an event. Past the buffer bound, engine events and logs are dropped (counted); the result is always
    /// kept.
    pub fn publish(&self, event: Event) {
        if let Some(out) = self.output.get() {
            match &event {
                Event::Log(l) => out.print(pko_proto::lines::stream_name(l.stream), &l.text),
                Event::Result(r) => out.print("result", &r.message),
                Event::EngineEvent(_) => {}
            }
        }
        let is_result = matches!(event, Event::Result(_));
        let len = {
            let mut log = self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if !is_result && log.events.len() + 1 >= log.max {
                log.dropped += 1;
                return;
            }
            if is_result && log.dropped > 0 {
                let seq = log.next_seq;
                let text = format!("{} events were not buffered (limit {})", log.dropped, log.max);
                log.events.push(self.wrap(seq, Event::Log(LogLine { stream: log_line::Stream::Agent as i32, text })));
                log.next_seq += 1;
            }
            let seq = log.next_seq;
            log.events.push(self.wrap(seq, event));
            log.next_seq += 1;
            log.events.len()
        };
        if is_result {
            *self.finished_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        }
        self.count.send_replace(len);
    }

    fn wrap(&self, sequence: u64, event: Event) -> OperationEvent {
        OperationEvent {
            operation_id: self.id.clone(),
            sequence,
            epoch: self.epoch(),
            time: Some(crate::convert::now()),
            event: Some(event),
        }
    }

    /// An agent log line.
    pub fn log(&self, text: impl Into<String>) {
        self.publish(Event::Log(LogLine { stream: log_line::Stream::Agent as i32, text: text.into() }));
    }

    /// The final result, if the operation finished.
    pub fn result(&self) -> Option<OperationResult> {
        self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).events.iter().rev().find_map(|e| {
            match &e.event {
                Some(Event::Result(r)) => Some(r.clone()),
                _ => None,
            }
        })
    }

    /// Whether the operation finished.
    pub fn finished(&self) -> bool {
        self.finished_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_some()
    }

    /// Every event from the first, then the new ones as they come, ending after the result.
    pub fn follow(self: &Arc<Self>) -> impl Stream<Item = OperationEvent> + Send + 'static {
        let rx = self.count.subscribe();
        futures::stream::unfold((self.clone(), rx, 0usize, false), |(op, mut rx, idx, done)| async move {
            if done {
                return None;
            }
            loop {
                let next = op.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).events.get(idx).cloned();
                if let Some(e) = next {
                    let last = matches!(e.event, Some(Event::Result(_)));
                    return Some((e, (op, rx, idx + 1, last)));
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        })
    }

    /// Records the running Pulumi process (0: none).
    pub fn set_pid(&self, pid: u32) {
        self.pid.store(pid, Ordering::SeqCst);
    }

    /// Records the running Pulumi process and the signal that stops it at once with everything it started
    /// ([`crate::pulumi::Cli::hard_stop`]: SIGTERM to its supervisor).
    pub fn set_process(&self, pid: u32, hard_stop: Signal) {
        self.hard_stop.store(hard_stop as i32, Ordering::SeqCst);
        self.set_pid(pid);
    }

    /// Stops the running process now, with everything it started. Returns whether one was signalled.
    pub fn stop_now(&self) -> bool {
        let sig = Signal::try_from(self.hard_stop.load(Ordering::SeqCst)).unwrap_or(Signal::SIGKILL);
        self.signal(sig)
    }

    /// Sends `sig` to the running Pulumi process, if any. Returns whether one was signalled.
    pub fn signal(&self, sig: Signal) -> bool {
        let pid = self.pid.load(Ordering::SeqCst);
        pid != 0 && kill(Pid::from_raw(pid as i32), sig).is_ok()
    }

    /// Ctrl-C now; after `grace`, if the process is still the same, [`Operation::stop_now`].
    pub fn interrupt_with_grace(self: &Arc<Self>, grace: Duration) {
        let pid = self.pid.load(Ordering::SeqCst);
        self.signal(Signal::SIGINT);
        let op = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if pid != 0 && op.pid.load(Ordering::SeqCst) == pid {
                tracing::warn!(operation = %op.id, "grace period over: killing pulumi");
                op.stop_now();
            }
        });
    }
}

/// All operations of this agent.
#[derive(Debug, Clone)]
pub struct Registry {
    inner: Arc<Mutex<HashMap<String, Arc<Operation>>>>,
    max_events: usize,
    retention: Duration,
}

impl Registry {
    /// A registry buffering at most `max_events` events per operation and keeping finished operations for `retention`.
    pub fn new(max_events: usize, retention: Duration) -> Self {
        Self { inner: Arc::default(), max_events, retention }
    }

    /// Registers a new operation; `None` when the id is already known.
    pub fn insert(&self, id: &str, epoch: i64) -> Option<Arc<Operation>> {
        let mut m = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.prune(&mut m);
        if m.contains_key(id) {
            return None;
        }
        let op = Arc::new(Operation::new(id.to_string(), epoch, self.max_events));
        m.insert(id.to_string(), op.clone());
        Some(op)
    }

    /// The operation with `id`, if known and not expired.
    pub fn get(&self, id: &str) -> Option<Arc<Operation>> {
        let mut m = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.prune(&mut m);
        m.get(id).cloned()
    }

    /// Operations that have not finished.
    pub fn running(&self) -> Vec<Arc<Operation>> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .filter(|o| !o.finished())
            .cloned()
            .collect()
    }

    fn prune(&self, m: &mut HashMap<String, Arc<Operation>>) {
        let retention = self.retention;
        m.retain(|_, o| {
            o.finished_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .is_none_or(|t| t.elapsed() < retention)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use pko_proto::v1::ResultStatus;

    #[test]
    fn callers_with_an_older_epoch_are_refused_once_a_newer_one_came() {
        let op = Operation::new("op".into(), 3, 10);
        assert_eq!(op.admit(3), Ok(()), "the Run's own epoch");
        assert_eq!(op.admit(2), Err(3));
        assert_eq!(op.admit(5), Ok(()), "a newer holder");
        assert_eq!(op.epoch(), 5);
        assert_eq!(op.admit(3), Err(5), "the previous holder is now stale");
    }

    fn result() -> Event {
        Event::Result(OperationResult { status: ResultStatus::Succeeded as i32, ..Default::default() })
    }

    #[tokio::test]
    async fn followers_see_every_event_from_the_first_and_stop_after_the_result() {
        let reg = Registry::new(100, Duration::from_secs(60));
        let op = reg.insert("op-1", 7).unwrap();
        op.log("one");
        let early = op.follow();
        op.log("two");
        let late_task = {
            let op = op.clone();
            tokio::spawn(async move { op.follow().collect::<Vec<_>>().await })
        };
        op.publish(result());
        let early: Vec<_> = early.collect().await;
        let late = late_task.await.unwrap();
        assert_eq!(early.iter().map(|e| e.sequence).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(early, late, "a late follower replays the same events");
        assert!(early.iter().all(|e| e.epoch == 7 && e.operation_id == "op-1"));
        assert!(reg.insert("op-1", 7).is_none(), "ids are unique");
    }

    #[tokio::test]
    async fn the_buffer_is_bounded_but_keeps_the_result() {
        let reg = Registry::new(5, Duration::from_secs(60));
        let op = reg.insert("op", 0).unwrap();
        for i in 0..20 {
            op.log(format!("line {i}"));
        }
        op.publish(result());
        let all: Vec<_> = op.follow().collect().await;
        assert!(all.len() <= 6, "{}", all.len());
        assert!(matches!(all.last().unwrap().event, Some(Event::Result(_))));
        let note = &all[all.len() - 2];
        assert!(matches!(&note.event, Some(Event::Log(l)) if l.text.contains("not buffered")));
    }

    #[tokio::test]
    async fn finished_operations_expire() {
        let reg = Registry::new(10, Duration::from_millis(50));
        let op = reg.insert("gone", 0).unwrap();
        op.publish(result());
        assert!(reg.get("gone").is_some());
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert!(reg.get("gone").is_none());
    }
}
