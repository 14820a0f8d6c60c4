//! What Pulumi printed, on the agent's standard output: every line of an operation — the agent's own, Pulumi's stdout
//! and stderr, and its engine events rendered as Pulumi prints them (resource steps, diagnostics, the summary) — with
//! the operation's namespace, stack, update and type on each line, so a cluster's log pipeline (and `kubectl logs` of a
//! pool's pod) has it. Text by default; JSON with `--log-format json` or PKO's `AGENT_JSON_LOG=true` (PKO PR #1306).
//! Lines arrive masked (secrets as `[secret]`): nothing here sees a secret value.

use std::io::Write;

use serde_json::json;

/// How operation lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// `<time> <stream> namespace=… stack=… update=… operation=… | <line>`.
    #[default]
    Text,
    /// One JSON object per line: `time`, `stream`, `namespace`, `stack`, `update`, `operation`, `msg`.
    Json,
}

impl Format {
    /// The format `flag` asks for, JSON when PKO's `AGENT_JSON_LOG` (`json_env`) is `true` or `1`.
    pub fn chosen(flag: Format, json_env: Option<&str>) -> Format {
        match json_env {
            Some(v) if v == "1" || v.eq_ignore_ascii_case("true") => Format::Json,
            _ => flag,
        }
    }
}

/// Whose operation a line belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    /// The Update's namespace (the first part of the operator's operation id `<ns>/<name>/<uid>`).
    pub namespace: String,
    /// The Update's name (or the whole operation id when it is not the operator's form).
    pub update: String,
    /// The Pulumi stack.
    pub stack: String,
    /// `preview`, `up`, `refresh`, `destroy` or `initialize`.
    pub operation: String,
    /// How lines are written.
    pub format: Format,
}

impl Context {
    /// The context of operation `id` (`<ns>/<name>/<uid>` from the operator) on `stack`, of type `operation`, written
    /// as `format`. Pure.
    pub fn of(id: &str, stack: &str, operation: &str, format: Format) -> Context {
        let parts: Vec<&str> = id.split('/').collect();
        let (namespace, update) = match parts.as_slice() {
            [ns, name, _] => (ns.to_string(), name.to_string()),
            _ => (String::new(), id.to_string()),
        };
        Context { namespace, update, stack: stack.to_string(), operation: operation.to_string(), format }
    }

    /// `text` of `stream` (`agent`, `stdout`, `stderr`, `engine`) as one output line at `time` (RFC 3339). Pure.
    pub fn line(&self, time: &str, stream: &str, text: &str) -> String {
        match self.format {
            Format::Text => format!(
                "{time} {stream} namespace={} stack={} update={} operation={} | {}",
                self.namespace,
                self.stack,
                self.update,
                self.operation,
                text.trim_end()
            ),
            Format::Json => json!({"time": time, "stream": stream, "namespace": self.namespace, "stack": self.stack,
                "update": self.update,
                                   "operation": self.operation, "msg": text.trim_end()})
            .to_string(),
        }
    }

    /// Queues `text` of `stream` for standard output, one line per line of `text`; never blocks the operation (see
    /// [`Queue`]). A closed output (an adopted local agent whose operator is gone) is ignored.
    pub fn print(&self, stream: &str, text: &str) {
        let time = crate::convert::now().to_string();
        let queue = stdout_queue();
        for l in text.lines().filter(|l| !l.trim().is_empty()) {
            queue.push(self.line(&time, stream, l));
        }
    }
}

/// Lines waiting for standard output at most (about 2,000 bytes each at worst: a few MiB).
pub const QUEUE_LINES: usize = 8_192;

/// Operation lines on their way to a writer thread: a reader of the agent's standard output that stops reading (a
/// frozen operator draining a local agent's pipe, a stalled log pipeline) must never stall a Pulumi operation, so when
/// [`QUEUE_LINES`] are waiting, further lines are dropped and counted, and the next line that fits is preceded by `…
/// <n> output lines dropped: standard output was not read`.
pub struct Queue {
    tx: std::sync::mpsc::SyncSender<String>,
    dropped: std::sync::atomic::AtomicU64,
}

impl Queue {
    /// A queue feeding `tx`'s receiver, as many lines as its channel holds.
    fn new(tx: std::sync::mpsc::SyncSender<String>) -> Queue {
        Queue { tx, dropped: std::sync::atomic::AtomicU64::new(0) }
    }

    /// Queues `line` without waiting; a full (or closed) queue drops it and counts it.
    pub fn push(&self, line: String) {
        use std::sync::atomic::Ordering::Relaxed;
        let dropped = self.dropped.swap(0, Relaxed);
        if dropped > 0
            && self.tx.try_send(format!("… {dropped} output lines dropped: standard output was not read")).is_err()
        {
            self.dropped.fetch_add(dropped + 1, Relaxed);
            return;
        }
        if self.tx.try_send(line).is_err() {
            self.dropped.fetch_add(1, Relaxed);
        }
    }
}

/// The process's queue to standard output, with its writer thread started on first use.
fn stdout_queue() -> &'static Queue {
    static QUEUE: std::sync::OnceLock<Queue> = std::sync::OnceLock::new();
    QUEUE.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<String>(QUEUE_LINES);
        // without the thread every line is dropped and counted: output is best effort, the operation is not
        let _ = std::thread::Builder::new().name("pko-output".into()).spawn(move || {
            for line in rx {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{line}");
            }
        });
        Queue::new(tx)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn lines_carry_whose_operation_they_are() {
        let ctx = Context::of("team-a/web-1a2b/uid-9", "dev", "up", Format::Text);
        assert_eq!((ctx.namespace.as_str(), ctx.update.as_str()), ("team-a", "web-1a2b"));
        assert_eq!(
            ctx.line("2026-11-26T08:00:00Z", "stdout", "hello\n"),
            "2026-11-26T08:00:00Z stdout namespace=team-a stack=dev update=web-1a2b operation=up | hello"
        );
        let json: Value =
            serde_json::from_str(&Context { format: Format::Json, ..ctx }.line("t", "engine", "+ a b creating"))
                .unwrap();
        assert_eq!(
            json,
            json!({"time": "t", "stream": "engine", "namespace": "team-a", "stack": "dev", "update": "web-1a2b",
                "operation": "up", "msg": "+ a b creating"})
        );
        assert_eq!(Context::of("plain-id", "s", "preview", Format::Text).update, "plain-id");
        assert_eq!(Format::chosen(Format::Text, Some("true")), Format::Json, "PKO's AGENT_JSON_LOG");
        assert_eq!(Format::chosen(Format::Text, Some("false")), Format::Text);
        assert_eq!(Format::chosen(Format::Json, None), Format::Json);
    }

    #[test]
    fn a_reader_that_stops_reading_costs_lines_never_the_operation() {
        let (tx, rx) = std::sync::mpsc::sync_channel(3);
        let q = Queue::new(tx);
        for i in 0..8 {
            q.push(format!("l{i}"));
        }
        let first: Vec<String> = rx.try_iter().collect();
        assert_eq!(first, ["l0", "l1", "l2"], "pushing never waited, the queue kept what fitted");
        q.push("l8".into());
        let next: Vec<String> = rx.try_iter().collect();
        assert_eq!(next, ["… 5 output lines dropped: standard output was not read", "l8"]);
        drop(rx);
        q.push("gone".into());
    }
}
