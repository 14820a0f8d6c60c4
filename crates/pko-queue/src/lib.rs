//! The work queue between reconciles and operation workers. Reconciles push a job per Update; a fixed set of workers
//! pops jobs and drives the operations. Two implementations behind [`WorkQueue`]: [`InMemoryQueue`] (one replica) and
//! [`redis::RedisQueue`] (the fleet: jobs outlive their replica, fenced by shard epoch). Both start jobs in the same
//! order ([`fair::Fair`]: round-robin over namespaces, an optional per-namespace limit). No PKO types or Kubernetes
//! here.
#![forbid(unsafe_code)]

pub mod connect;
pub mod fair;
pub mod output;
pub mod plans;
pub mod redis;
pub mod slots;
pub mod tail;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::Notify;

use crate::fair::Fair;

/// How many operations one namespace may run at once on a replica of `workers` workers: its share is
/// `share_percent` of them (rounded up, at least one; 100 or more: no share), its cap `explicit` (0: none). With the
/// default share of 50 a quiet namespace's job gets the next free worker however many a noisy one has waiting. Pure.
pub fn namespace_limit(workers: usize, share_percent: u8, explicit: usize) -> NamespaceLimits {
    let share = if share_percent >= 100 || workers == 0 {
        0
    } else {
        (workers * usize::from(share_percent)).div_ceil(100).max(1)
    };
    NamespaceLimits { share, cap: explicit }
}

/// How many operations one namespace may run at once on a replica (0: no limit of that kind). `share`
/// (`--namespace-share-percent`) holds only while another namespace under its share has a job waiting: idle workers
/// are lent past it. `cap` (`--max-operations-per-namespace`) always holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NamespaceLimits {
    /// Operations a namespace runs before it yields the next free worker to another namespace that waits.
    pub share: usize,
    /// Operations a namespace never runs more than.
    pub cap: usize,
}

impl NamespaceLimits {
    /// No limit: every worker for whoever is next in the rotation.
    pub const NONE: Self = Self { share: 0, cap: 0 };

    /// Whether a namespace running `running` operations may start one more in any case.
    pub fn under_cap(self, running: usize) -> bool {
        self.cap == 0 || running < self.cap
    }

    /// Whether a namespace running `running` operations is under its share (and cap): first to get a free worker.
    pub fn under_share(self, running: usize) -> bool {
        self.under_cap(running) && (self.share == 0 || running < self.share)
    }

    /// The limit a namespace meets when others wait: the smaller of share and cap (0: none).
    pub fn effective_share(self) -> usize {
        match (self.share, self.cap) {
            (0, c) => c,
            (s, 0) => s,
            (s, c) => s.min(c),
        }
    }
}

/// One Update to run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Job {
    /// Dedup key: the operation id (`<namespace>/<name>/<uid>`).
    pub key: String,
    /// Namespace of the Update (the unit of fairness).
    pub namespace: String,
    /// Name of the Update.
    pub name: String,
    /// Fencing epoch of the shard that pushed it.
    pub epoch: i64,
    /// The shard of the Update (0 outside a fleet).
    #[serde(default)]
    pub shard: u32,
}

/// A job handed to a worker, and how long it waited since it was first queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The job.
    pub job: Job,
    /// Time from the first push to this claim.
    pub waited: Duration,
}

/// An error of a queue's backing store (the in-memory queue has none).
pub type QueueError = Box<dyn std::error::Error + Send + Sync>;

/// The replica-local half of every queue: the order of starting ([`Fair`]) and the wake-ups of waiting workers.
///
/// A namespace's limits: [`namespace_limit`].
#[derive(Debug, Default)]
pub struct Local {
    fair: Mutex<Fair>,
    notify: Notify,
}

impl Local {
    /// Each namespace held to `limits`.
    pub fn new(limits: NamespaceLimits) -> Self {
        Self { fair: Mutex::new(Fair::new(limits)), notify: Notify::new() }
    }

    fn fair(&self) -> std::sync::MutexGuard<'_, Fair> {
        self.fair.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `job` now (or at `at`); `false` when its key is queued or in flight.
    pub fn push(&self, job: Job, at: Option<Instant>) -> bool {
        let pushed = match at {
            Some(at) => self.fair().push_at(job, at),
            None => self.fair().push(job),
        };
        if pushed {
            self.notify.notify_one();
        }
        pushed
    }

    /// Waits for the next job, woken by a push, a done or the next delayed job falling due; returns it with when it was
    /// first queued here.
    pub async fn take(&self) -> (Job, Instant) {
        loop {
            let notified = self.notify.notified();
            let due = {
                let mut f = self.fair();
                if let Some(taken) = f.take_with_time(Instant::now()) {
                    if f.waiting() > 0 {
                        self.notify.notify_one();
                    }
                    return taken;
                }
                f.next_due()
            };
            match due {
                Some(at) => {
                    let _ = tokio::time::timeout_at(at.into(), notified).await;
                }
                None => notified.await,
            }
        }
    }

    /// Why the queued job `key` is not started: its namespace holds all the operations it may ([`Fair::held_by_limit`]:
    /// `(running, limit)`).
    pub fn held_by_limit(&self, key: &str) -> Option<(usize, usize)> {
        self.fair().held_by_limit(key)
    }

    /// The delayed jobs `keys` are due now ([`Fair::wake`]); those not delayed are left as they are.
    pub fn wake(&self, keys: &[String]) {
        let woken = {
            let mut fair = self.fair();
            keys.iter().filter(|k| fair.wake(k)).count()
        };
        if woken > 0 {
            self.notify.notify_one();
        }
    }

    /// The job `key` is finished: its key may be pushed again, its namespace's slot is free.
    pub fn done(&self, key: &str) {
        self.fair().done(key);
        self.notify.notify_one();
    }
}

/// What every queue has: its [`Local`] half. Gives [`WorkQueue`] its local methods.
pub trait Ordered {
    /// The replica-local half.
    fn local(&self) -> &Local;
}

/// A queue of jobs, deduplicated by key from push until [`WorkQueue::done`].
pub trait WorkQueue: Ordered + Send + Sync + std::fmt::Debug + 'static {
    /// Enqueues `job`: `Ok(false)` when a job with its key is queued or in flight, or its epoch is older than its
    /// shard's newest (fenced).
    fn push(&self, job: Job) -> BoxFuture<'_, Result<bool, QueueError>>;
    /// Puts the popped `job` back, to be popped again once `delay` has passed (a retry: its class was full). It stays
    /// recorded as it is in the backing store (not acknowledged), so it moves with its shard meanwhile, and its key
    /// stays taken.
    fn retry_after(&self, job: Job, delay: Duration) {
        let local = self.local();
        local.done(&job.key);
        local.push(job, Some(Instant::now() + delay));
    }
    /// The jobs `keys`, put back with a delay ([`WorkQueue::retry_after`]), are due now: what they waited for came
    /// first (the agent they were held for is free). Replica-local, as the delay is.
    fn wake(&self, keys: &[String]) {
        self.local().wake(keys);
    }
    /// Waits for the next job; it stays in flight until [`WorkQueue::done`].
    fn pop(&self) -> BoxFuture<'_, Claimed>;
    /// The running `job` is still being driven: `false` when it must not be any more (its epoch is stale: the shard
    /// moved).
    fn heartbeat<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, bool>;
    /// The job finished (or was abandoned): its key may be pushed again.
    fn done<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, ()>;
    /// This replica now holds `shard` at `epoch`: jobs recorded for it elsewhere are queued here. Returns how many.
    fn adopt(&self, shard: u32, epoch: i64) -> BoxFuture<'_, Result<usize, QueueError>>;
    /// Forgets the waiting jobs `keep` refuses (shards this replica no longer holds).
    fn forget(&self, keep: &(dyn Fn(&Job) -> bool + Send + Sync)) {
        self.local().fair().retain_waiting(keep);
    }
    /// Jobs waiting.
    fn queued(&self) -> usize {
        self.local().fair().waiting()
    }
    /// Jobs waiting per namespace (namespaces with none are absent).
    fn queued_by_namespace(&self) -> std::collections::BTreeMap<String, usize> {
        self.local().fair().waiting_by_namespace()
    }
    /// Jobs popped and not done.
    fn in_flight(&self) -> usize {
        self.local().fair().in_flight()
    }
}

/// The in-process queue (one replica).
#[derive(Debug, Default)]
pub struct InMemoryQueue {
    local: Local,
}

impl InMemoryQueue {
    /// A queue holding each namespace to `limits`.
    pub fn new(limits: NamespaceLimits) -> Self {
        Self { local: Local::new(limits) }
    }
}

impl Ordered for InMemoryQueue {
    fn local(&self) -> &Local {
        &self.local
    }
}

impl WorkQueue for InMemoryQueue {
    fn push(&self, job: Job) -> BoxFuture<'_, Result<bool, QueueError>> {
        let pushed = self.local.push(job, None);
        Box::pin(async move { Ok(pushed) })
    }

    fn pop(&self) -> BoxFuture<'_, Claimed> {
        Box::pin(async move {
            let (job, queued_at) = self.local.take().await;
            Claimed { job, waited: queued_at.elapsed() }
        })
    }

    fn heartbeat<'a>(&'a self, _job: &'a Job) -> BoxFuture<'a, bool> {
        Box::pin(async { true })
    }

    fn done<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, ()> {
        self.local.done(&job.key);
        Box::pin(async {})
    }

    fn adopt(&self, _shard: u32, _epoch: i64) -> BoxFuture<'_, Result<usize, QueueError>> {
        Box::pin(async { Ok(0) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn job(k: &str) -> Job {
        Job { key: k.into(), namespace: "ns".into(), name: k.into(), epoch: 1, shard: 0 }
    }

    #[tokio::test]
    async fn fifo_with_dedup_until_done() {
        let q = InMemoryQueue::default();
        assert!(q.push(job("a")).await.unwrap());
        assert!(q.push(job("b")).await.unwrap());
        assert!(!q.push(job("a")).await.unwrap(), "queued twice");
        assert_eq!(q.pop().await.job.key, "a");
        assert!(!q.push(job("a")).await.unwrap(), "in flight");
        assert_eq!((q.queued(), q.in_flight()), (1, 1));
        assert_eq!(
            q.queued_by_namespace().into_iter().collect::<Vec<_>>(),
            [(job("b").namespace, 1)],
            "in-flight jobs are not waiting"
        );
        q.done(&job("a")).await;
        assert!(q.push(job("a")).await.unwrap(), "pushable again once done");
        assert_eq!(q.pop().await.job.key, "b");
        assert_eq!(q.pop().await.job.key, "a");
        assert_eq!(q.in_flight(), 2);
    }

    #[tokio::test]
    async fn pop_waits_for_a_push_and_workers_share_the_jobs() {
        let q = Arc::new(InMemoryQueue::default());
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let q = q.clone();
                tokio::spawn(async move { q.pop().await.job.key })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        for k in ["x", "y", "z"] {
            q.push(job(k)).await.unwrap();
        }
        let mut got = Vec::new();
        for w in workers {
            got.push(tokio::time::timeout(Duration::from_secs(2), w).await.expect("a worker got a job").unwrap());
        }
        got.sort();
        assert_eq!(got, vec!["x", "y", "z"]);
    }

    #[tokio::test]
    async fn a_job_put_back_is_popped_again_when_due_and_stays_deduplicated() {
        let q = InMemoryQueue::default();
        q.push(job("later")).await.unwrap();
        let popped = q.pop().await.job;
        let t = Instant::now();
        q.retry_after(popped, Duration::from_millis(200));
        assert!(!q.push(job("later")).await.unwrap(), "its key stays taken while it waits");
        let c = tokio::time::timeout(Duration::from_secs(2), q.pop()).await.expect("popped once due");
        assert_eq!(c.job.key, "later");
        assert!(t.elapsed() >= Duration::from_millis(200));
    }
}

#[cfg(test)]
mod limit_tests {
    use super::{NamespaceLimits, namespace_limit};

    #[test]
    fn a_namespace_gets_its_share_of_the_workers() {
        let limits = |share, cap| NamespaceLimits { share, cap };
        assert_eq!(namespace_limit(2, 50, 0), limits(1, 0), "two workers: one each while another waits");
        assert_eq!(namespace_limit(256, 50, 0), limits(128, 0));
        assert_eq!(namespace_limit(3, 50, 0), limits(2, 0), "rounded up");
        assert_eq!(namespace_limit(1, 50, 0), limits(1, 0), "at least one");
        assert_eq!(namespace_limit(8, 100, 0), NamespaceLimits::NONE, "no share: no limit");
        assert_eq!(namespace_limit(8, 100, 3), limits(0, 3), "the cap alone");
        assert_eq!(namespace_limit(8, 50, 3).effective_share(), 3, "the smaller of the two when others wait");
        assert_eq!(namespace_limit(8, 25, 5).effective_share(), 2);
        let l = limits(2, 3);
        assert_eq!((l.under_share(1), l.under_share(2), l.under_cap(2), l.under_cap(3)), (true, false, true, false));
    }
}
