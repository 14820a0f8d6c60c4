//! What an operation printed, kept as it streams in (issue "See what Pulumi did"): the replica that follows an
//! operation turns each event into a line ([`pko_proto::lines::line_of`]) and appends them, in batches, to the output
//! store (`pko_queue::output`: memory, or the fleet's Redis), keyed by the Update's namespace and Workspace (named
//! after its Stack). A new holder attaching gets the operation replayed from its first event; the store keeps each
//! sequence once. The store failing costs lines, never the operation.

use std::time::Duration;

use tokio::time::Instant;

use pko_proto::v1::{OperationEvent, operation_event::Event};
use pko_queue::output::{Line, OperationInfo, OutputStore};

/// Lines gathered before they are appended at once.
pub const BATCH_LINES: usize = 64;
/// Longest a line waits before it is appended (a live tail sees it this late at most, plus its poll).
pub const BATCH_WAIT: Duration = Duration::from_millis(500);

/// The line an event reads as, with its sequence and time; `None` for events Pulumi prints nothing for. Pure.
pub fn line(event: &OperationEvent) -> Option<Line> {
    let (stream, text) = pko_proto::lines::line_of(event)?;
    let time = event.time.as_ref().map(|t| t.to_string()).unwrap_or_default();
    Some(Line { seq: event.sequence, time, stream: stream.to_string(), text })
}

/// Whether gathered lines are appended now: a full batch, the result, or the oldest waited [`BATCH_WAIT`]. Pure.
pub fn due(pending: usize, last: bool, waited: Duration) -> bool {
    pending > 0 && (last || pending >= BATCH_LINES || waited >= BATCH_WAIT)
}

/// The lines of one operation on their way to the store.
pub struct Capture<'a> {
    store: &'a dyn OutputStore,
    stack: String,
    info: OperationInfo,
    pending: Vec<Line>,
    since: Instant,
}

impl<'a> Capture<'a> {
    /// Lines of Update `update` (of type `operation`) of Workspace `ns/workspace`, into `store`.
    pub fn new(store: &'a dyn OutputStore, ns: &str, workspace: &str, update: &str, operation: &str) -> Self {
        let started_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default();
        let info = OperationInfo { update: update.to_string(), operation: operation.to_string(), started_ms };
        Capture { store, stack: format!("{ns}/{workspace}"), info, pending: Vec::new(), since: Instant::now() }
    }

    /// Takes `event`; appends the gathered lines when [`due`].
    pub async fn take(&mut self, event: &OperationEvent) {
        if let Some(l) = line(event) {
            if self.pending.is_empty() {
                self.since = Instant::now();
            }
            self.pending.push(l);
        }
        if due(self.pending.len(), matches!(event.event, Some(Event::Result(_))), self.since.elapsed()) {
            self.flush().await;
        }
    }

    /// When gathered lines are due by time ([`BATCH_WAIT`] after the oldest); `None` when none wait.
    pub fn deadline(&self) -> Option<Instant> {
        (!self.pending.is_empty()).then(|| self.since + BATCH_WAIT)
    }

    /// Appends what is gathered (a failure is logged and counted: the lines are lost, not retried).
    pub async fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let lines = std::mem::take(&mut self.pending);
        if let Err(e) = self.store.append(&self.stack, &self.info, &lines).await {
            tracing::warn!(stack = %self.stack, update = %self.info.update, error = %e, lines = lines.len(),
                "operation output not stored");
            metrics::counter!(crate::metric_names::OUTPUT_LINES_LOST_TOTAL).increment(lines.len() as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_proto::v1::{LogLine, OperationResult, log_line};
    use pko_queue::output::{Limits, MemoryOutput};

    fn log(seq: u64, text: &str) -> OperationEvent {
        OperationEvent {
            sequence: seq,
            event: Some(Event::Log(LogLine { stream: log_line::Stream::Stdout as i32, text: text.into() })),
            ..Default::default()
        }
    }

    #[test]
    fn lines_are_appended_in_batches_or_when_they_waited() {
        assert!(!due(0, true, BATCH_WAIT), "nothing to append");
        assert!(due(1, true, Duration::ZERO), "the result goes at once");
        assert!(due(BATCH_LINES, false, Duration::ZERO));
        assert!(!due(3, false, Duration::from_millis(10)));
        assert!(due(3, false, BATCH_WAIT));
        assert_eq!(line(&log(4, "hi")).map(|l| (l.seq, l.stream, l.text)), Some((4, "stdout".into(), "hi".into())));
        assert_eq!(line(&OperationEvent::default()), None);
    }

    #[tokio::test]
    async fn an_operation_s_lines_reach_the_store_by_its_result() {
        let store = MemoryOutput::new(Limits::default());
        let mut c = Capture::new(&store, "team-a", "web", "web-1", "up");
        c.take(&log(0, "one")).await;
        assert_eq!(store.read("team-a/web", "web-1", None).await.unwrap(), None, "gathered, not yet appended");
        let result = OperationEvent {
            sequence: 1,
            event: Some(Event::Result(OperationResult { status: 1, ..Default::default() })),
            ..Default::default()
        };
        c.take(&result).await;
        let out = store.read("team-a/web", "web-1", None).await.unwrap().unwrap();
        assert_eq!(out.lines.iter().map(|l| l.text.as_str()).collect::<Vec<_>>(), ["one", "succeeded"]);
        assert_eq!(out.info.operation, "up");
    }
}
