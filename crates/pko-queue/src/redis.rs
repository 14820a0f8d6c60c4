//! The Redis work queue (`--redis-url`): jobs survive the replica that queued them, and a shard's new holder picks up
//! its jobs — queued ones and those whose dispatcher stopped — at once, fenced by the shard's epoch so that the old
//! holder can neither acknowledge nor queue anything for it any more.
//!
//! Redis is an accelerator, not the source of truth: every job is derived from an Update in the API server, and the
//! Update controller pushes again every Update that is not complete, so a Redis that lost everything (restart without
//! persistence, `FLUSHALL`) is refilled by the owners' reconciles.
//!
//! Keys (prefix `P`, default `pko`), every change through one Lua script (atomic):
//! - `P:job:<key>` hash: `job` (JSON), `shard`, `epoch`, `state` (`queued` | `running`), `worker`, `queued_ms` (when
//!   first queued, for the wait time), `lease_ms` (a running job's visibility deadline, renewed by
//!   [`RedisQueue::heartbeat`]);
//! - `P:shard:<k>` set of the job keys of shard `k` (what its next holder adopts);
//! - `P:fence:<k>` the newest epoch of shard `k` seen: a push, claim, heartbeat or acknowledgement with an older epoch
//!   is refused.
//!
//! The order of starting is local to the replica ([`crate::fair::Fair`]: round-robin over namespaces, a per-namespace
//! limit); Redis holds what must outlive the replica.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use redis::Script;

use crate::connect::{Pools, Target};
use crate::{Claimed, Job, Local, NamespaceLimits, Ordered, QueueError, WorkQueue};

/// Errors of the Redis queue.
#[derive(Debug, thiserror::Error)]
pub enum RedisQueueError {
    /// The URL could not make a pool (`--redis-url`).
    #[error("{0}")]
    Url(String),
    /// Redis refused or failed a command.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// No connection from the pool.
    #[error("redis connection: {0}")]
    Pool(#[from] deadpool_redis::PoolError),
    /// A job record that is not ours (not JSON of a job).
    #[error("job record {0}: {1}")]
    Record(String, serde_json::Error),
}

/// How long a running job stays claimed without a heartbeat.
pub const VISIBILITY: Duration = Duration::from_secs(30);

/// Prepended to every script: `current(fence key, epoch)` is false when `epoch` is older than the shard's newest, and
/// raises the newest to `epoch` otherwise.
const FENCE: &str = r#"
local function current(fence_key, epoch)
  local fence = tonumber(redis.call('GET', fence_key) or '0')
  if epoch < fence then return false end
  if epoch > fence then redis.call('SET', fence_key, epoch) end
  return true
end
"#;

const PUSH: &str = r#"
local epoch = tonumber(ARGV[2])
if not current(KEYS[3], epoch) then return -1 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'job', ARGV[3], 'shard', ARGV[4], 'epoch', epoch, 'state', 'queued', 'queued_ms', ARGV[5])
redis.call('SADD', KEYS[2], ARGV[1])
return 1
"#;

const CLAIM: &str = r#"
local epoch = tonumber(ARGV[2])
if not current(KEYS[3], epoch) then return {-1, 0} end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'job', ARGV[3], 'shard', ARGV[4], 'queued_ms', ARGV[5])
  redis.call('SADD', KEYS[2], ARGV[1])
end
redis.call('HSET', KEYS[1], 'epoch', epoch, 'state', 'running', 'worker', ARGV[6], 'lease_ms', ARGV[7])
return {1, tonumber(redis.call('HGET', KEYS[1], 'queued_ms') or ARGV[5])}
"#;

const HEARTBEAT: &str = r#"
if not current(KEYS[2], tonumber(ARGV[1])) then return -1 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'lease_ms', ARGV[2])
return 1
"#;

const ACK: &str = r#"
if not current(KEYS[3], tonumber(ARGV[2])) then return -1 end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return 1
"#;

const ADOPT: &str = r#"
if not current(KEYS[2], tonumber(ARGV[1])) then return {} end
local out = {}
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local job = redis.call('HGET', ARGV[2] .. key, 'job')
  if job then table.insert(out, job) else redis.call('SREM', KEYS[1], key) end
end
return out
"#;

/// `body` behind the [`FENCE`] prelude.
fn fenced(body: &str) -> Script {
    Script::new(&format!("{FENCE}{body}"))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The Redis queue of one replica.
pub struct RedisQueue {
    pool: Pools,
    prefix: String,
    worker: String,
    local: Local,
    scripts: Arc<Scripts>,
}

struct Scripts {
    push: Script,
    claim: Script,
    heartbeat: Script,
    ack: Script,
    adopt: Script,
}

impl std::fmt::Debug for RedisQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisQueue").field("prefix", &self.prefix).field("worker", &self.worker).finish()
    }
}

impl RedisQueue {
    /// A queue on `url` (`redis://` or `rediss://`, password in the URL) with key prefix `prefix`, claiming as `worker`
    /// (the replica id), each namespace held to `limits`. Connects lazily;
    /// [`Self::ping`] checks the connection.
    ///
    /// Errors: [`RedisQueueError::Url`].
    pub fn new(url: &str, prefix: &str, worker: &str, limits: NamespaceLimits) -> Result<Self, RedisQueueError> {
        Self::on(&Target::parse(url, None).map_err(RedisQueueError::Url)?, prefix, worker, limits)
    }

    /// A queue on `target` (one server, or the master Sentinel names); otherwise as [`Self::new`].
    ///
    /// Errors: [`RedisQueueError::Url`].
    pub fn on(target: &Target, prefix: &str, worker: &str, limits: NamespaceLimits) -> Result<Self, RedisQueueError> {
        let pool = Pools::new(target).map_err(|e| RedisQueueError::Url(format!("--redis-url: {e}")))?;
        Ok(Self {
            pool,
            prefix: prefix.to_string(),
            worker: worker.to_string(),
            local: Local::new(limits),
            scripts: Arc::new(Scripts {
                push: fenced(PUSH),
                claim: fenced(CLAIM),
                heartbeat: fenced(HEARTBEAT),
                ack: fenced(ACK),
                adopt: fenced(ADOPT),
            }),
        })
    }

    /// Fleet-wide slots named `name` on this queue's Redis (key `P:slots:<name>`), at most `cap` held at once (0: no
    /// limit).
    pub fn slots(&self, name: &str, cap: usize) -> crate::slots::RedisSlots {
        crate::slots::RedisSlots::new(self.pool.clone(), format!("{}:slots:{name}", self.prefix), cap)
    }

    /// The fleet's store of what operations printed ([`crate::output`]), under this queue's prefix.
    pub fn output(&self, limits: crate::output::Limits) -> crate::output::RedisOutput {
        crate::output::RedisOutput::new(self.pool.clone(), self.prefix.clone(), limits)
    }

    /// The fleet's saved plans ([`crate::plans`]), under this queue's prefix.
    pub fn plans(&self) -> crate::plans::RedisPlans {
        crate::plans::RedisPlans::new(self.pool.clone(), self.prefix.clone())
    }

    /// Checks that Redis answers.
    ///
    /// Errors: the connection's.
    pub async fn ping(&self) -> Result<(), RedisQueueError> {
        let mut c = self.pool.get().await?;
        redis::cmd("PING").query_async::<String>(&mut c).await?;
        Ok(())
    }

    fn job_key(&self, key: &str) -> String {
        format!("{}:job:{key}", self.prefix)
    }
    fn shard_key(&self, shard: u32) -> String {
        format!("{}:shard:{shard}", self.prefix)
    }
    fn fence_key(&self, shard: u32) -> String {
        format!("{}:fence:{shard}", self.prefix)
    }

    /// `script` with the keys and arguments every job script starts with: KEYS job, shard set, fence; ARGV key, epoch,
    /// job JSON, shard, now (ms).
    fn job_call<'s>(
        &self,
        script: &'s Script,
        job: &Job,
        now: u64,
    ) -> Result<redis::ScriptInvocation<'s>, RedisQueueError> {
        let json = serde_json::to_string(job).map_err(|e| RedisQueueError::Record(job.key.clone(), e))?;
        let mut call = script.key(self.job_key(&job.key));
        call.key(self.shard_key(job.shard))
            .key(self.fence_key(job.shard))
            .arg(&job.key)
            .arg(job.epoch)
            .arg(json)
            .arg(job.shard)
            .arg(now);
        Ok(call)
    }

    /// Records `job` in Redis: 1 new, 0 already there, -1 its epoch is stale.
    async fn record(&self, job: &Job) -> Result<i64, RedisQueueError> {
        let call = self.job_call(&self.scripts.push, job, now_ms())?;
        let mut c = self.pool.get().await?;
        Ok(call.invoke_async(&mut c).await?)
    }

    /// Claims `job` for this replica: `Some(queued for)` when it may run, `None` when its epoch is stale. A job Redis
    /// lost is recorded again (Redis is not the source of truth).
    async fn claim(&self, job: &Job) -> Result<Option<Duration>, RedisQueueError> {
        let now = now_ms();
        let mut call = self.job_call(&self.scripts.claim, job, now)?;
        call.arg(&self.worker).arg(now + VISIBILITY.as_millis() as u64);
        let mut c = self.pool.get().await?;
        let (ok, queued): (i64, u64) = call.invoke_async(&mut c).await?;
        Ok((ok == 1).then(|| Duration::from_millis(now.saturating_sub(queued))))
    }

    /// Extends the visibility of the running `job`; `false` when its epoch is stale (stop driving it).
    ///
    /// Errors: Redis.
    pub async fn extend(&self, job: &Job) -> Result<bool, RedisQueueError> {
        let mut c = self.pool.get().await?;
        let r: i64 = self
            .scripts
            .heartbeat
            .key(self.job_key(&job.key))
            .key(self.fence_key(job.shard))
            .arg(job.epoch)
            .arg(now_ms() + VISIBILITY.as_millis() as u64)
            .invoke_async(&mut c)
            .await?;
        Ok(r >= 0)
    }

    /// Takes over `shard` at `epoch`: fences older epochs and queues the shard's jobs here (queued ones, and running
    /// ones whose dispatcher stopped: running again re-attaches on the agent). Returns how many were queued.
    ///
    /// Errors: Redis; a record that is not a job.
    pub async fn adopt_shard(&self, shard: u32, epoch: i64) -> Result<usize, RedisQueueError> {
        let mut c = self.pool.get().await?;
        let records: Vec<String> = self
            .scripts
            .adopt
            .key(self.shard_key(shard))
            .key(self.fence_key(shard))
            .arg(epoch)
            .arg(format!("{}:job:", self.prefix))
            .invoke_async(&mut c)
            .await?;
        let mut queued = 0;
        for r in records {
            let job: Job = serde_json::from_str(&r).map_err(|e| RedisQueueError::Record(r.clone(), e))?;
            if self.local.push(Job { epoch, ..job }, None) {
                queued += 1;
            }
        }
        Ok(queued)
    }
}

impl RedisQueue {
    async fn ack(&self, job: &Job) -> Result<(), RedisQueueError> {
        let mut c = self.pool.get().await?;
        let _: i64 = self
            .scripts
            .ack
            .key(self.job_key(&job.key))
            .key(self.shard_key(job.shard))
            .key(self.fence_key(job.shard))
            .arg(&job.key)
            .arg(job.epoch)
            .invoke_async(&mut c)
            .await?;
        Ok(())
    }
}

impl Ordered for RedisQueue {
    fn local(&self) -> &Local {
        &self.local
    }
}

impl WorkQueue for RedisQueue {
    fn push(&self, job: Job) -> BoxFuture<'_, Result<bool, QueueError>> {
        Box::pin(async move {
            match self.record(&job).await {
                Ok(-1) => return Ok(false), // fenced: the shard has a newer holder
                Ok(_) => {}
                // Redis is an accelerator: without it the job still runs here, and the next reconcile
                // records it again
                Err(e) => tracing::warn!(error = %e, job = %job.key, "job not recorded in Redis; queued locally"),
            }
            Ok(self.local.push(job, None))
        })
    }

    fn pop(&self) -> BoxFuture<'_, Claimed> {
        Box::pin(async move {
            loop {
                let (job, queued_at) = self.local.take().await;
                // boxed: a pop waiting for a job keeps no room for the claim's Redis call
                match Box::pin(self.claim(&job)).await {
                    Ok(Some(waited)) => return Claimed { job, waited },
                    Ok(None) => {
                        tracing::info!(job = %job.key, epoch = job.epoch, "job fenced: its shard has a newer holder");
                        self.local.done(&job.key);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, job = %job.key, "job not claimed in Redis; running it anyway");
                        return Claimed { job, waited: queued_at.elapsed() };
                    }
                }
            }
        })
    }

    fn heartbeat<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            match self.extend(job).await {
                Ok(current) => current,
                Err(e) => {
                    tracing::debug!(error = %e, job = %job.key, "heartbeat not recorded");
                    true
                }
            }
        })
    }

    fn done<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, ()> {
        self.local.done(&job.key);
        Box::pin(async move {
            if let Err(e) = self.ack(job).await {
                tracing::warn!(error = %e, job = %job.key, "job not acknowledged in Redis");
            }
        })
    }

    fn adopt(&self, shard: u32, epoch: i64) -> BoxFuture<'_, Result<usize, QueueError>> {
        Box::pin(async move { Ok(self.adopt_shard(shard, epoch).await?) })
    }
}
