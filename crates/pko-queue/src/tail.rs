//! What a reader of a Stack's output is shown (`kubectl pko logs`, the operator's `logs.pulumi.com` API): the newest
//! kept operation, a named one, or all of them oldest first, each line as text, followed live until the operation's
//! `result` line. One implementation for the operator (over its [`OutputStore`]) and the plugin (over the metrics
//! port's JSON, for clusters without the aggregated API), so both print the same.

use std::time::Duration;

use futures::future::BoxFuture;

use crate::output::{Line, OperationInfo, Output, OutputStore};

/// How often a follower asks for new lines (the store is not watched).
pub const POLL: Duration = Duration::from_secs(1);

/// Where kept output is read: the operator's store, or the plugin's HTTP endpoint.
pub trait Source: Send + Sync {
    /// The kept operations of `stack` (`<namespace>/<name>`), newest first.
    ///
    /// Errors: the source did not answer ([`TailError::Source`]) or refused.
    fn operations<'a>(&'a self, stack: &'a str) -> BoxFuture<'a, Result<Vec<OperationInfo>, TailError>>;
    /// Lines of Update `update` of `stack` above sequence `after` (all without it); `None` when not kept.
    ///
    /// Errors: the source did not answer or refused.
    fn read<'a>(
        &'a self,
        stack: &'a str,
        update: &'a str,
        after: Option<u64>,
    ) -> BoxFuture<'a, Result<Option<Output>, TailError>>;
}

/// An [`OutputStore`] as a [`Source`].
pub struct Store<'s>(pub &'s dyn OutputStore);

impl Source for Store<'_> {
    fn operations<'a>(&'a self, stack: &'a str) -> BoxFuture<'a, Result<Vec<OperationInfo>, TailError>> {
        Box::pin(async move { self.0.operations(stack).await.map_err(|e| TailError::Source(e.to_string())) })
    }

    fn read<'a>(
        &'a self,
        stack: &'a str,
        update: &'a str,
        after: Option<u64>,
    ) -> BoxFuture<'a, Result<Option<Output>, TailError>> {
        Box::pin(async move { self.0.read(stack, update, after).await.map_err(|e| TailError::Source(e.to_string())) })
    }
}

/// What to show of one Stack's output (the query of `stacks/<name>/log`, the flags of `kubectl pko logs`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// `<namespace>/<name>` of the Stack.
    pub stack: String,
    /// The Update whose output to show (default: the newest kept operation).
    pub update: Option<String>,
    /// Follow the operation until its `result` line (waiting for one when none is kept yet).
    pub follow: bool,
    /// Every kept operation, oldest first, each after a header line (not with `update` or `follow`).
    pub all: bool,
    /// Each line after its time (RFC 3339).
    pub timestamps: bool,
}

/// Why nothing (more) can be shown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TailError {
    /// Nothing of the Stack is kept (and not following).
    #[error(
        "no output of stack {0} is kept (no operation since it was stored, or it was given up: --output-operations)"
    )]
    NothingKept(String),
    /// The Update named is not among the kept operations.
    #[error("no output of update {update} is kept; kept: {}", listed(.kept))]
    UpdateNotKept {
        /// The Update asked for.
        update: String,
        /// The Updates whose output is kept, newest first.
        kept: Vec<String>,
    },
    /// The operation being shown was given up by the store meanwhile.
    #[error("the output of update {0} is no longer kept")]
    NoLongerKept(String),
    /// `all` with `update` or `follow`.
    #[error("all cannot be combined with update or follow")]
    Conflict,
    /// The source did not answer, or refused (its message).
    #[error("{0}")]
    Source(String),
}

/// `names` joined by commas, or `none`.
fn listed(names: &[String]) -> String {
    if names.is_empty() { "none".into() } else { names.join(", ") }
}

/// Where shown lines go, one text line at a time (no newline).
pub trait Sink: Send {
    /// Shows `text`; `false` when the reader is gone (stop).
    fn line(&mut self, text: String) -> bool;
    /// Whether the reader left (checked while waiting for lines, so that a follower of a quiet operation stops).
    fn gone(&self) -> bool {
        false
    }
}

impl<F: FnMut(String) -> bool + Send> Sink for F {
    fn line(&mut self, text: String) -> bool {
        self(text)
    }
}

/// `line` as shown: its text, after its time with `timestamps`. Pure.
pub fn render(line: &Line, timestamps: bool) -> String {
    if timestamps { format!("{} {}", line.time, line.text) } else { line.text.clone() }
}

/// The header shown before each operation with [`Request::all`]. Pure.
pub fn header(info: &OperationInfo) -> String {
    format!("== update {} ({}) ==", info.update, info.operation)
}

/// The operations to show among `kept` (newest first): oldest first with `all`; else the one named, or the newest;
/// empty when nothing is kept and the reader follows (it waits for one). Pure.
///
/// Errors: [`TailError::Conflict`], [`TailError::UpdateNotKept`], [`TailError::NothingKept`] (not following).
pub fn choose(kept: &[OperationInfo], req: &Request) -> Result<Vec<OperationInfo>, TailError> {
    if req.all {
        if req.update.is_some() || req.follow {
            return Err(TailError::Conflict);
        }
        return Ok(kept.iter().rev().cloned().collect());
    }
    match &req.update {
        Some(u) => match kept.iter().find(|o| &o.update == u) {
            Some(info) => Ok(vec![info.clone()]),
            None => Err(TailError::UpdateNotKept {
                update: u.clone(),
                kept: kept.iter().map(|o| o.update.clone()).collect(),
            }),
        },
        None => match kept.first() {
            Some(info) => Ok(vec![info.clone()]),
            None if req.follow => Ok(vec![]),
            None => Err(TailError::NothingKept(req.stack.clone())),
        },
    }
}

/// The operations `req` asks for, read from `src` ([`choose`]): call before showing anything, so that a refusal can
/// be told as one (a 404, an error message) rather than inside the output.
///
/// Errors: those of [`choose`] and of the source.
pub async fn chosen(src: &dyn Source, req: &Request) -> Result<Vec<OperationInfo>, TailError> {
    choose(&src.operations(&req.stack).await?, req)
}

/// Shows `ops` (from [`chosen`]) as `req` asks, through `sink`: each operation's kept lines (after a header with
/// `all`), then, following, new lines every [`POLL`] until the `result` line; with no operation yet (following), first
/// waits for one. Returns when done or when the sink's reader is gone.
///
/// Errors: the source's, and [`TailError::NoLongerKept`] when the store gave the operation up meanwhile.
pub async fn show(
    src: &dyn Source,
    req: &Request,
    mut ops: Vec<OperationInfo>,
    sink: &mut dyn Sink,
) -> Result<(), TailError> {
    while ops.is_empty() {
        if sink.gone() {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
        ops = chosen(src, req).await?;
    }
    if req.all {
        for info in &ops {
            if !sink.line(header(info)) {
                return Ok(());
            }
            if let Some(out) = src.read(&req.stack, &info.update, None).await?
                && !lines(&out.lines, req.timestamps, sink)
            {
                return Ok(());
            }
        }
        return Ok(());
    }
    follow(src, req, &ops[0], sink).await
}

/// One operation's lines, then (following) new ones until its `result` line or the reader leaves.
async fn follow(src: &dyn Source, req: &Request, info: &OperationInfo, sink: &mut dyn Sink) -> Result<(), TailError> {
    let mut after = None;
    loop {
        let Some(out) = src.read(&req.stack, &info.update, after).await? else {
            return Err(TailError::NoLongerKept(info.update.clone()));
        };
        if after.is_none()
            && out.truncated
            && !sink.line(format!("(earlier lines of update {} are not kept)", info.update))
        {
            return Ok(());
        }
        if !lines(&out.lines, req.timestamps, sink) {
            return Ok(());
        }
        after = out.lines.last().map(|l| l.seq).or(after);
        if !req.follow || out.lines.iter().any(|l| l.stream == "result") || sink.gone() {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Shows `lines`; `false` when the reader left.
fn lines(lines: &[Line], timestamps: bool, sink: &mut dyn Sink) -> bool {
    lines.iter().all(|l| sink.line(render(l, timestamps)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::{Limits, MemoryOutput};

    fn info(u: &str) -> OperationInfo {
        OperationInfo { update: u.into(), operation: "up".into(), started_ms: 0 }
    }

    fn line(seq: u64, stream: &str, text: &str) -> Line {
        Line { seq, time: "T".into(), stream: stream.into(), text: text.into() }
    }

    fn req(update: Option<&str>, follow: bool, all: bool) -> Request {
        Request { stack: "ns/s".into(), update: update.map(Into::into), follow, all, timestamps: false }
    }

    #[test]
    fn the_newest_operation_unless_one_is_named_or_all_are_asked_for() {
        let kept = [info("u2"), info("u1")];
        let names = |r: Result<Vec<OperationInfo>, TailError>| -> Vec<String> {
            r.unwrap().into_iter().map(|i| i.update).collect()
        };
        assert_eq!(names(choose(&kept, &req(None, false, false))), ["u2"]);
        assert_eq!(names(choose(&kept, &req(Some("u1"), true, false))), ["u1"]);
        assert_eq!(names(choose(&kept, &req(None, false, true))), ["u1", "u2"]);
        assert_eq!(
            choose(&kept, &req(Some("u9"), false, false)).unwrap_err().to_string(),
            "no output of update u9 is kept; kept: u2, u1"
        );
        assert_eq!(choose(&kept, &req(None, true, true)), Err(TailError::Conflict));
        assert!(matches!(choose(&[], &req(None, false, false)), Err(TailError::NothingKept(_))));
        assert_eq!(choose(&[], &req(None, true, false)), Ok(vec![]));
        assert_eq!(render(&line(1, "engine", "x"), true), "T x");
        assert_eq!(header(&info("u1")), "== update u1 (up) ==");
    }

    #[tokio::test]
    async fn a_follower_gets_every_line_once_until_the_result_and_a_gone_reader_stops_it() {
        let store = MemoryOutput::new(Limits::default());
        store.append("ns/s", &info("u1"), &[line(1, "engine", "a")]).await.unwrap();
        let src = Store(&store);
        let r = req(None, true, false);
        let ops = chosen(&src, &r).await.unwrap();
        let writer = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            store.append("ns/s", &info("u1"), &[line(2, "engine", "b"), line(3, "result", "done")]).await.unwrap();
        };
        let mut shown = Vec::new();
        let mut sink = |t: String| {
            shown.push(t);
            true
        };
        let (shown_result, ()) = tokio::join!(show(&src, &r, ops, &mut sink), writer);
        shown_result.unwrap();
        assert_eq!(shown, ["a", "b", "done"]);
        // a reader gone after the first line ends the show at once, even following an unfinished operation
        store.append("ns/s", &info("u2"), &[line(1, "engine", "x"), line(2, "engine", "y")]).await.unwrap();
        let ops = chosen(&src, &r).await.unwrap();
        let mut count = 0;
        let mut leaving = |_t: String| {
            count += 1;
            false
        };
        show(&src, &r, ops, &mut leaving).await.unwrap();
        assert_eq!(count, 1);
    }
}
