//! What operations printed, kept outside etcd for `kubectl pko logs`: the last [`Limits::lines`] lines of the last
//! [`Limits::operations`] operations of each Stack, bounded.
//!
//! Two implementations behind [`OutputStore`]: [`MemoryOutput`] (one replica; also bounded in total bytes, the oldest
//! operations of any Stack going first) and [`RedisOutput`] (the fleet: every replica reads what any replica stored, so
//! a shard's new holder serves what the previous one kept). Redis keys (prefix `P`): `P:out:<ns>/<stack>:ops` (sorted
//! set of Update names by start, in ms), `P:out:<ns>/<stack>:info` (hash Update name → [`OperationInfo`] JSON) and
//! `P:out:<ns>/<stack>/<update>` (a stream, `MAXLEN` [`Limits::lines`], entry id `0-<seq + 1>`, field `l` = [`Line`]
//! JSON); every key expires [`Limits::ttl_seconds`] after the last append.
//!
//! Lines are appended by the replica that follows the operation, with the agent's event sequence: appending a sequence
//! already stored (a new holder attaching replays the operation from its start) is a no-op, so a line is kept once.
//! Lines arrive masked (`[secret]`): the agent masks them.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::QueueError;
use crate::connect::Pools;

/// One line of an operation's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    /// The agent's event sequence number (`OperationEvent.sequence`): increasing within an operation.
    pub seq: u64,
    /// When the agent emitted it (RFC 3339).
    pub time: String,
    /// `engine`, `stdout`, `stderr`, `agent` or `result` (`pko_proto::lines::line_of`).
    pub stream: String,
    /// The text, masked.
    pub text: String,
}

/// Which operation lines belong to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationInfo {
    /// The Update's name.
    pub update: String,
    /// `preview`, `up`, `refresh`, `destroy`.
    pub operation: String,
    /// When its first line was stored, in ms since the Unix epoch (orders a Stack's operations).
    pub started_ms: u64,
}

/// An operation's stored output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    /// Whose.
    pub info: OperationInfo,
    /// Lines with a sequence above the one asked for, oldest first.
    pub lines: Vec<Line>,
    /// Whether earlier lines were dropped to keep [`Limits::lines`].
    pub truncated: bool,
}

/// The bounds of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Lines kept per operation (the last ones): `--output-lines`, default 2,000.
    pub lines: usize,
    /// Operations kept per Stack (the newest): `--output-operations`, default 5.
    pub operations: usize,
    /// Bytes of line text kept in total by [`MemoryOutput`] (the oldest operations go first): 64 MiB.
    pub bytes: usize,
    /// Seconds a Stack's output is kept in Redis after its last append: 7 days.
    pub ttl_seconds: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { lines: 2_000, operations: 5, bytes: 64 << 20, ttl_seconds: 7 * 24 * 3600 }
    }
}

/// Where operations' output is kept. `stack` is `<namespace>/<name>` of the Stack (the Workspace, for an Update made by
/// hand).
pub trait OutputStore: Send + Sync + std::fmt::Debug {
    /// Appends `lines` (sequences increasing) of operation `info` of `stack`; lines with a sequence already stored are
    /// skipped.
    ///
    /// Errors: the backing store's (Redis); the caller logs them, the operation goes on.
    fn append<'a>(
        &'a self,
        stack: &'a str,
        info: &'a OperationInfo,
        lines: &'a [Line],
    ) -> BoxFuture<'a, Result<(), QueueError>>;
    /// The kept operations of `stack`, newest first.
    ///
    /// Errors: the backing store's.
    fn operations<'a>(&'a self, stack: &'a str) -> BoxFuture<'a, Result<Vec<OperationInfo>, QueueError>>;
    /// The lines of Update `update` of `stack` with a sequence above `after` (all when `None`); `None` when nothing of
    /// it is kept.
    ///
    /// Errors: the backing store's.
    fn read<'a>(
        &'a self,
        stack: &'a str,
        update: &'a str,
        after: Option<u64>,
    ) -> BoxFuture<'a, Result<Option<Output>, QueueError>>;
}

#[derive(Debug, Default)]
struct Kept {
    info: Option<OperationInfo>,
    lines: VecDeque<Line>,
    truncated: bool,
    bytes: usize,
}

#[derive(Debug, Default)]
struct Memory {
    /// Stack → its operations, oldest first.
    stacks: HashMap<String, VecDeque<Kept>>,
    /// `(stack, update)` in the order operations were first stored: the eviction order.
    order: VecDeque<(String, String)>,
    bytes: usize,
}

/// The output of one replica's operations, in memory.
#[derive(Debug, Default)]
pub struct MemoryOutput {
    limits: Limits,
    inner: Mutex<Memory>,
}

impl MemoryOutput {
    /// An empty store bounded by `limits`.
    pub fn new(limits: Limits) -> Self {
        MemoryOutput { limits, inner: Mutex::default() }
    }

    /// Bytes of line text kept now.
    pub fn bytes(&self) -> usize {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).bytes
    }
}

impl Memory {
    /// The kept operation `info` of `stack`, made (and older ones of the Stack dropped) when new.
    fn entry(&mut self, stack: &str, info: &OperationInfo, keep: usize) -> &mut Kept {
        let ops = self.stacks.entry(stack.to_string()).or_default();
        if !ops.iter().any(|k| k.info.as_ref().is_some_and(|i| i.update == info.update)) {
            ops.push_back(Kept { info: Some(info.clone()), ..Default::default() });
            self.order.push_back((stack.to_string(), info.update.clone()));
            while ops.len() > keep.max(1) {
                if let Some(old) = ops.pop_front() {
                    self.bytes -= old.bytes;
                    let gone = old.info.map(|i| i.update).unwrap_or_default();
                    self.order.retain(|(s, u)| !(s == stack && *u == gone));
                }
            }
        }
        let ops = self.stacks.entry(stack.to_string()).or_default();
        let i = ops.iter().position(|k| k.info.as_ref().is_some_and(|i| i.update == info.update)).unwrap_or(0);
        &mut ops[i]
    }

    /// Drops the oldest operations (never `(stack, update)`) until at most `max` bytes are kept.
    fn evict(&mut self, max: usize, stack: &str, update: &str) {
        let mut spared = VecDeque::new();
        while self.bytes > max {
            let Some((s, u)) = self.order.pop_front() else { break };
            if s == stack && u == update {
                spared.push_back((s, u));
                continue;
            }
            if let Some(ops) = self.stacks.get_mut(&s)
                && let Some(i) = ops.iter().position(|k| k.info.as_ref().is_some_and(|i| i.update == u))
                && let Some(old) = ops.remove(i)
            {
                self.bytes -= old.bytes;
            }
        }
        spared.extend(self.order.drain(..));
        self.order = spared;
        self.stacks.retain(|_, ops| !ops.is_empty());
    }
}

impl OutputStore for MemoryOutput {
    fn append<'a>(
        &'a self,
        stack: &'a str,
        info: &'a OperationInfo,
        lines: &'a [Line],
    ) -> BoxFuture<'a, Result<(), QueueError>> {
        Box::pin(async move {
            let mut m = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let (limit, mut added, mut removed) = (self.limits.lines.max(1), 0, 0);
            let kept = m.entry(stack, info, self.limits.operations);
            for l in lines {
                if kept.lines.back().is_some_and(|last| last.seq >= l.seq) {
                    continue;
                }
                added += l.text.len();
                kept.lines.push_back(l.clone());
                if kept.lines.len() > limit
                    && let Some(old) = kept.lines.pop_front()
                {
                    removed += old.text.len();
                    kept.truncated = true;
                }
            }
            kept.bytes = kept.bytes + added - removed;
            m.bytes = m.bytes + added - removed;
            m.evict(self.limits.bytes, stack, &info.update);
            Ok(())
        })
    }

    fn operations<'a>(&'a self, stack: &'a str) -> BoxFuture<'a, Result<Vec<OperationInfo>, QueueError>> {
        Box::pin(async move {
            let m = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            Ok(m.stacks
                .get(stack)
                .map(|ops| ops.iter().rev().filter_map(|k| k.info.clone()).collect())
                .unwrap_or_default())
        })
    }

    fn read<'a>(
        &'a self,
        stack: &'a str,
        update: &'a str,
        after: Option<u64>,
    ) -> BoxFuture<'a, Result<Option<Output>, QueueError>> {
        Box::pin(async move {
            let m = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let kept = m
                .stacks
                .get(stack)
                .and_then(|ops| ops.iter().find(|k| k.info.as_ref().is_some_and(|i| i.update == update)));
            Ok(kept.and_then(|k| {
                let lines = k.lines.iter().filter(|l| after.is_none_or(|a| l.seq > a)).cloned().collect();
                Some(Output { info: k.info.clone()?, lines, truncated: k.truncated })
            }))
        })
    }
}

/// Appends lines, keeps the newest operations of the Stack and refreshes expiry, atomically. KEYS: ops, info, stream.
/// ARGV: update, info JSON, started ms, max lines, max operations, ttl seconds, stream key prefix, then (seq, line
/// JSON) pairs.
const APPEND: &str = r#"
local top = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
local last = 0
if #top > 0 then last = tonumber(string.match(top[1][1], '%-(%d+)$')) end
for i = 8, #ARGV, 2 do
  local id = tonumber(ARGV[i]) + 1
  if id > last then
    redis.call('XADD', KEYS[3], 'MAXLEN', ARGV[4], '0-' .. id, 'l', ARGV[i + 1])
    last = id
  end
end
redis.call('ZADD', KEYS[1], 'NX', ARGV[3], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
local n = redis.call('ZCARD', KEYS[1])
local keep = tonumber(ARGV[5])
if n > keep then
  local old = redis.call('ZPOPMIN', KEYS[1], n - keep)
  for j = 1, #old, 2 do
    redis.call('DEL', ARGV[7] .. old[j])
    redis.call('HDEL', KEYS[2], old[j])
  end
end
for k = 1, 3 do redis.call('EXPIRE', KEYS[k], ARGV[6]) end
return last
"#;

/// The output of the fleet's operations, in Redis.
pub struct RedisOutput {
    pool: Pools,
    prefix: String,
    limits: Limits,
    append: redis::Script,
}

impl std::fmt::Debug for RedisOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOutput").field("prefix", &self.prefix).field("limits", &self.limits).finish()
    }
}

impl RedisOutput {
    pub(crate) fn new(pool: Pools, prefix: String, limits: Limits) -> Self {
        RedisOutput { pool, prefix: format!("{prefix}:out:"), limits, append: redis::Script::new(APPEND) }
    }

    fn stream(&self, stack: &str, update: &str) -> String {
        format!("{}{stack}/{update}", self.prefix)
    }
}

impl OutputStore for RedisOutput {
    fn append<'a>(
        &'a self,
        stack: &'a str,
        info: &'a OperationInfo,
        lines: &'a [Line],
    ) -> BoxFuture<'a, Result<(), QueueError>> {
        Box::pin(async move {
            let mut c = self.pool.get().await?;
            let mut call = self.append.prepare_invoke();
            call.key(format!("{}{stack}:ops", self.prefix))
                .key(format!("{}{stack}:info", self.prefix))
                .key(self.stream(stack, &info.update));
            call.arg(&info.update)
                .arg(serde_json::to_string(info)?)
                .arg(info.started_ms)
                .arg(self.limits.lines.max(1))
                .arg(self.limits.operations.max(1));
            call.arg(self.limits.ttl_seconds.max(1)).arg(format!("{}{stack}/", self.prefix));
            for l in lines {
                call.arg(l.seq).arg(serde_json::to_string(l)?);
            }
            let _: i64 = call.invoke_async(&mut c).await?;
            Ok(())
        })
    }

    fn operations<'a>(&'a self, stack: &'a str) -> BoxFuture<'a, Result<Vec<OperationInfo>, QueueError>> {
        Box::pin(async move {
            let mut c = self.pool.get().await?;
            let names: Vec<String> = redis::cmd("ZREVRANGE")
                .arg(format!("{}{stack}:ops", self.prefix))
                .arg(0)
                .arg(-1)
                .query_async(&mut c)
                .await?;
            if names.is_empty() {
                return Ok(vec![]);
            }
            let infos: Vec<Option<String>> =
                redis::cmd("HMGET").arg(format!("{}{stack}:info", self.prefix)).arg(&names).query_async(&mut c).await?;
            Ok(infos.into_iter().flatten().filter_map(|i| serde_json::from_str(&i).ok()).collect())
        })
    }

    fn read<'a>(
        &'a self,
        stack: &'a str,
        update: &'a str,
        after: Option<u64>,
    ) -> BoxFuture<'a, Result<Option<Output>, QueueError>> {
        Box::pin(async move {
            let mut c = self.pool.get().await?;
            let info: Option<String> =
                redis::cmd("HGET").arg(format!("{}{stack}:info", self.prefix)).arg(update).query_async(&mut c).await?;
            let Some(info) = info.and_then(|i| serde_json::from_str::<OperationInfo>(&i).ok()) else { return Ok(None) };
            let key = self.stream(stack, update);
            let from = after.map(|a| format!("(0-{}", a + 1)).unwrap_or_else(|| "-".into());
            let entries: Vec<(String, Vec<(String, String)>)> =
                redis::cmd("XRANGE").arg(&key).arg(from).arg("+").query_async(&mut c).await?;
            let len: usize = redis::cmd("XLEN").arg(&key).query_async(&mut c).await?;
            let lines: Vec<Line> = entries
                .into_iter()
                .flat_map(|(_, fields)| fields)
                .filter_map(|(_, v)| serde_json::from_str(&v).ok())
                .collect();
            // full to MAXLEN and the oldest kept is not the operation's first event: lines were dropped
            let first: Option<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
                .arg(&key)
                .arg("-")
                .arg("+")
                .arg("COUNT")
                .arg(1)
                .query_async::<Vec<_>>(&mut c)
                .await?
                .into_iter()
                .next();
            let truncated = len >= self.limits.lines.max(1) && first.is_some_and(|(id, _)| id != "0-1");
            Ok(Some(Output { info, lines, truncated }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(update: &str, started_ms: u64) -> OperationInfo {
        OperationInfo { update: update.into(), operation: "up".into(), started_ms }
    }

    fn lines(seqs: std::ops::Range<u64>) -> Vec<Line> {
        seqs.map(|s| Line { seq: s, time: "t".into(), stream: "engine".into(), text: format!("line {s:04}") }).collect()
    }

    #[tokio::test]
    async fn memory_keeps_the_last_lines_of_the_newest_operations_once_each() {
        let store = MemoryOutput::new(Limits { lines: 3, operations: 2, ..Limits::default() });
        store.append("ns/s", &info("u1", 1), &lines(0..2)).await.unwrap();
        store.append("ns/s", &info("u1", 1), &lines(0..5)).await.unwrap();
        let out = store.read("ns/s", "u1", None).await.unwrap().unwrap();
        assert_eq!(
            out.lines.iter().map(|l| l.seq).collect::<Vec<_>>(),
            [2, 3, 4],
            "replayed lines kept once, the last 3"
        );
        assert!(out.truncated);
        assert_eq!(store.read("ns/s", "u1", Some(3)).await.unwrap().unwrap().lines.len(), 1, "after a sequence");
        store.append("ns/s", &info("u2", 2), &lines(0..1)).await.unwrap();
        store.append("ns/s", &info("u3", 3), &lines(0..1)).await.unwrap();
        let names: Vec<String> = store.operations("ns/s").await.unwrap().into_iter().map(|i| i.update).collect();
        assert_eq!(names, ["u3", "u2"], "the newest 2, newest first");
        assert_eq!(store.read("ns/s", "u1", None).await.unwrap(), None);
        assert_eq!(store.bytes(), 2 * "line 0000".len());
        assert_eq!(store.operations("ns/other").await.unwrap(), vec![]);
    }

    #[tokio::test]
    async fn memory_gives_up_the_oldest_operations_of_any_stack_past_its_bytes() {
        let store = MemoryOutput::new(Limits { bytes: 25, ..Limits::default() });
        store.append("ns/a", &info("a1", 1), &lines(0..2)).await.unwrap();
        store.append("ns/b", &info("b1", 2), &lines(0..2)).await.unwrap();
        assert_eq!(store.read("ns/a", "a1", None).await.unwrap(), None, "the oldest went");
        assert_eq!(store.read("ns/b", "b1", None).await.unwrap().unwrap().lines.len(), 2);
        store.append("ns/b", &info("b1", 2), &lines(2..5)).await.unwrap();
        assert_eq!(
            store.read("ns/b", "b1", None).await.unwrap().unwrap().lines.len(),
            5,
            "the operation being written is never given up"
        );
        assert!(store.bytes() <= 5 * 9);
    }
}
