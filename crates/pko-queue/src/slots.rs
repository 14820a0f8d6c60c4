//! A cap on how many holders of one kind of work run at once, across every replica of a fleet (a
//! counting semaphore whose slots are leases). The operator holds one slot per running drift check
//! (`--max-concurrent-drift-checks`), so a schedule shared by thousands of Stacks cannot start
//! thousands of refreshes at the same minute.
//!
//! Two implementations behind [`Slots`]: [`MemorySlots`] (one replica) and [`RedisSlots`] (the
//! fleet: one sorted set `P:slots:<name>`, member = holder key, score = lease deadline in ms of the
//! Redis server's clock; expired leases are dropped before counting, so a replica that died frees its
//! slots after the lease). Holders renew by acquiring again and release when done.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use crate::QueueError;
use crate::connect::Pools;

/// A fleet-wide cap on concurrent holders.
pub trait Slots: Send + Sync + std::fmt::Debug {
    /// Takes (or renews) the slot of `key` for `lease`: `true` when held now, `false` when every slot
    /// is taken by others. A cap of 0 means no limit (always `true`).
    ///
    /// Errors: the backing store's (Redis); callers treat them as "not now".
    fn acquire<'a>(&'a self, key: &'a str, lease: Duration) -> BoxFuture<'a, Result<bool, QueueError>>;
    /// Gives the slot of `key` back (nothing when it holds none).
    ///
    /// Errors: the backing store's.
    fn release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), QueueError>>;
}

/// Slots of one replica.
#[derive(Debug)]
pub struct MemorySlots {
    cap: usize,
    held: Mutex<HashMap<String, Instant>>,
}

impl MemorySlots {
    /// At most `cap` holders at once (0: no limit).
    pub fn new(cap: usize) -> Self {
        Self { cap, held: Mutex::new(HashMap::new()) }
    }

    /// Holders whose lease has not run out.
    pub fn held(&self) -> usize {
        let now = Instant::now();
        self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values().filter(|d| **d > now).count()
    }
}

impl Slots for MemorySlots {
    fn acquire<'a>(&'a self, key: &'a str, lease: Duration) -> BoxFuture<'a, Result<bool, QueueError>> {
        Box::pin(async move {
            if self.cap == 0 {
                return Ok(true);
            }
            let now = Instant::now();
            let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            held.retain(|_, deadline| *deadline > now);
            if held.contains_key(key) || held.len() < self.cap {
                held.insert(key.to_string(), now + lease);
                return Ok(true);
            }
            Ok(false)
        })
    }

    fn release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), QueueError>> {
        Box::pin(async move {
            self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(key);
            Ok(())
        })
    }
}

/// KEYS[1] the sorted set; ARGV member, lease (ms), cap. The Redis server's clock decides expiry, so
/// the replicas' clocks need not agree.
const ACQUIRE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
  return 1
end
return 0
"#;

/// Slots shared by a fleet through Redis.
pub struct RedisSlots {
    pool: Pools,
    key: String,
    cap: usize,
    acquire: redis::Script,
}

impl std::fmt::Debug for RedisSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSlots").field("key", &self.key).field("cap", &self.cap).finish()
    }
}

impl RedisSlots {
    pub(crate) fn new(pool: Pools, key: String, cap: usize) -> Self {
        Self { pool, key, cap, acquire: redis::Script::new(ACQUIRE) }
    }

    /// Holders whose lease has not run out (by the Redis server's clock).
    ///
    /// Errors: Redis.
    pub async fn held(&self) -> Result<usize, QueueError> {
        let mut c = self.pool.get().await?;
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut c).await?;
        let now = secs * 1000 + micros / 1000;
        Ok(redis::cmd("ZCOUNT").arg(&self.key).arg(format!("({now}")).arg("+inf").query_async::<usize>(&mut c).await?)
    }
}

impl Slots for RedisSlots {
    fn acquire<'a>(&'a self, key: &'a str, lease: Duration) -> BoxFuture<'a, Result<bool, QueueError>> {
        Box::pin(async move {
            if self.cap == 0 {
                return Ok(true);
            }
            let mut c = self.pool.get().await?;
            let held: i64 = self.acquire.key(&self.key).arg(key).arg(lease.as_millis().max(1) as u64).arg(self.cap).invoke_async(&mut c).await?;
            Ok(held == 1)
        })
    }

    fn release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), QueueError>> {
        Box::pin(async move {
            let mut c = self.pool.get().await?;
            redis::cmd("ZREM").arg(&self.key).arg(key).query_async::<i64>(&mut c).await?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_slots_cap_holders_renew_and_expire() {
        let s = MemorySlots::new(2);
        let lease = Duration::from_secs(60);
        assert!(s.acquire("a", lease).await.unwrap());
        assert!(s.acquire("b", lease).await.unwrap());
        assert!(!s.acquire("c", lease).await.unwrap(), "both slots are taken");
        assert!(s.acquire("a", lease).await.unwrap(), "a holder renews");
        s.release("a").await.unwrap();
        assert!(s.acquire("c", lease).await.unwrap());
        assert!(s.acquire("d", Duration::ZERO).await.is_ok_and(|held| !held));
        let short = MemorySlots::new(1);
        assert!(short.acquire("x", Duration::from_millis(1)).await.unwrap());
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(short.acquire("y", lease).await.unwrap(), "an expired lease frees its slot");
        assert_eq!(short.held(), 1);
        let unlimited = MemorySlots::new(0);
        for k in ["1", "2", "3"] {
            assert!(unlimited.acquire(k, lease).await.unwrap());
        }
    }
}
