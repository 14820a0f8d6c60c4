//! A cap on how many holders of one kind of work run at once, across every replica of a fleet (a counting semaphore
//! whose slots are leases). The operator holds one slot per running drift check (`--max-concurrent-drift-checks`), so a
//! schedule shared by thousands of Stacks cannot start thousands of refreshes at the same minute.
//!
//! Two implementations behind [`Slots`]: [`MemorySlots`] (one replica) and [`RedisSlots`] (the fleet: one sorted set
//! `P:slots:<name>`, member = holder key, score = lease deadline in ms of the Redis server's clock; expired leases are
//! dropped before counting, so a replica that died frees its slots after the lease). Holders renew by acquiring again
//! and release when done.
//!
//! **Fair**: a key refused a slot waits in line (first refusal first; `P:slots:<name>:wait`, score = the first refusal
//! in µs, and `P:slots:<name>:seen`, score = when its place lapses). A free slot goes to the oldest waiters before
//! anyone who did not wait, so a holder that asks again the moment it released (a schedule as fast as the retry) cannot
//! take the slot from a waiter round after round. A waiter that does not ask again within [`WAITER_TTL`] loses its
//! place (a Stack deleted or no longer due holds no one up for longer).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use crate::QueueError;
use crate::connect::Pools;

/// How long a refused key keeps its place in line without asking again: 15 seconds (the operator asks every 5).
pub const WAITER_TTL: Duration = Duration::from_secs(15);

/// A fleet-wide cap on concurrent holders.
pub trait Slots: Send + Sync + std::fmt::Debug {
    /// Takes (or renews) the slot of `key` for `lease`: `true` when held now, `false` when every slot is taken by
    /// others or a free one is owed to keys that waited longer (then `key` waits in line, see the module). A cap of 0
    /// means no limit (always `true`).
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
    state: Mutex<MemoryState>,
}

/// Holders (key → lease deadline) and waiters (key → (first refusal, place lapses at)).
#[derive(Debug, Default)]
struct MemoryState {
    held: HashMap<String, Instant>,
    waiting: HashMap<String, (Instant, Instant)>,
}

impl MemoryState {
    /// The slot of `key` now (see [`Slots::acquire`]), at `now`.
    fn acquire(&mut self, cap: usize, key: &str, lease: Duration, now: Instant) -> bool {
        self.held.retain(|_, deadline| *deadline > now);
        self.waiting.retain(|_, (_, lapses)| *lapses > now);
        let free = cap.saturating_sub(self.held.len());
        let first = self.waiting.get(key).map(|(first, _)| *first);
        let ahead = self.waiting.values().filter(|(f, _)| first.is_none_or(|mine| *f < mine)).count();
        if self.held.contains_key(key) || ahead < free {
            self.held.insert(key.to_string(), now + lease);
            self.waiting.remove(key);
            return true;
        }
        self.waiting.insert(key.to_string(), (first.unwrap_or(now), now + WAITER_TTL));
        false
    }
}

impl MemorySlots {
    /// At most `cap` holders at once (0: no limit).
    pub fn new(cap: usize) -> Self {
        Self { cap, state: Mutex::new(MemoryState::default()) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Holders whose lease has not run out.
    pub fn held(&self) -> usize {
        let now = Instant::now();
        self.state().held.values().filter(|d| **d > now).count()
    }
}

impl Slots for MemorySlots {
    fn acquire<'a>(&'a self, key: &'a str, lease: Duration) -> BoxFuture<'a, Result<bool, QueueError>> {
        Box::pin(async move {
            if self.cap == 0 {
                return Ok(true);
            }
            Ok(self.state().acquire(self.cap, key, lease, Instant::now()))
        })
    }

    fn release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), QueueError>> {
        Box::pin(async move {
            self.state().held.remove(key);
            Ok(())
        })
    }
}

/// KEYS[1] the holders, KEYS[2] the waiters by first refusal, KEYS[3] the waiters by when their place lapses; ARGV
/// member, lease (ms), cap, waiter TTL (ms). The Redis server's clock decides expiry, so the replicas' clocks need not
/// agree. A key is granted when it holds, or when fewer waiters are ahead of it (all of them when it does not wait)
/// than slots are free.
const ACQUIRE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
if #lapsed > 0 then
  redis.call('ZREM', KEYS[2], unpack(lapsed))
  redis.call('ZREM', KEYS[3], unpack(lapsed))
end
local free = tonumber(ARGV[3]) - redis.call('ZCARD', KEYS[1])
local ahead = redis.call('ZRANK', KEYS[2], ARGV[1]) or redis.call('ZCARD', KEYS[2])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) or ahead < free then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  return 1
end
redis.call('ZADD', KEYS[2], 'NX', tonumber(t[1]) * 1000000 + tonumber(t[2]), ARGV[1])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[4]), ARGV[1])
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[4]) * 2)
redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[4]) * 2)
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
            let (wait, seen) = (format!("{}:wait", self.key), format!("{}:seen", self.key));
            let held: i64 = self
                .acquire
                .key(&self.key)
                .key(wait)
                .key(seen)
                .arg(key)
                .arg(lease.as_millis().max(1) as u64)
                .arg(self.cap)
                .arg(WAITER_TTL.as_millis() as u64)
                .invoke_async(&mut c)
                .await?;
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

    /// A holder that releases and asks again at once does not take the slot from a key that waited; waiters are served
    /// first refused, first served; a waiter that stops asking loses its place.
    #[test]
    fn a_free_slot_goes_to_the_oldest_waiter_and_a_silent_waiter_lapses() {
        let (mut s, lease, t0) = (MemoryState::default(), Duration::from_secs(60), Instant::now());
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        assert!(s.acquire(1, "one", lease, at(0)));
        assert!(!s.acquire(1, "two", lease, at(1)), "taken");
        assert!(!s.acquire(1, "three", lease, at(2)), "taken");
        s.held.remove("one");
        assert!(!s.acquire(1, "one", lease, at(3)), "two and three waited: the freed slot is theirs");
        assert!(!s.acquire(1, "three", lease, at(4)), "two waited longer");
        assert!(s.acquire(1, "two", lease, at(5)));
        s.held.remove("two");
        assert!(s.acquire(1, "three", lease, at(6)), "next in line");
        s.held.remove("three");
        assert!(s.acquire(1, "one", lease, at(7)));
        s.held.remove("one");
        assert!(s.acquire(1, "x", lease, at(8)), "none waiting: granted");
        assert!(!s.acquire(1, "y", lease, at(8)), "x holds the one slot");
        s.held.clear();
        assert!(!s.acquire(1, "z", lease, at(9)), "y waits and has not lapsed");
        assert!(s.acquire(1, "z", lease, at(9) + WAITER_TTL), "y stopped asking: its place lapsed");
    }
}
