//! What a controller may take a cached object for, from its own last write of it: the `resourceVersion` each object had
//! after this replica's last write, when, and at which shard epoch.
//!
//! A cached copy at exactly that version is known current (nobody wrote it since, and the cache has caught up). Another
//! version within [`CACHE_CATCH_UP`] of the write is most likely the cache not having caught up yet: wait for it. Any
//! other copy is used unverified, its writes pinned to its `resourceVersion`. A write recorded at another epoch of the
//! object's shard says nothing: the shard was lost since, and its holders in between may have written.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use kube::{Resource, ResourceExt};

/// How long after this replica's own write a cached copy at another version is taken as the cache catching up rather
/// than someone else's newer write: 1 second (the watch delivers a write in milliseconds at rest; a pinned write on the
/// older copy would only be refused with 409).
pub const CACHE_CATCH_UP: Duration = Duration::from_secs(1);

/// What a cached copy may be taken for ([`OwnWrites::judge`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cached {
    /// The version this replica wrote last: current.
    Current,
    /// Another version shortly after our write: wait this long for the cache to catch up.
    CatchingUp(Duration),
    /// Another version: used unverified at this `resourceVersion` (`None`: the copy has none).
    Unverified(Option<String>),
}

/// This replica's last write of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OwnWrite {
    version: String,
    at: Instant,
    epoch: i64,
}

/// This replica's last write of each object of kind `K`, by `(namespace, name)`.
#[derive(Debug)]
pub struct OwnWrites<K> {
    writes: Mutex<HashMap<(String, String), OwnWrite>>,
    kind: std::marker::PhantomData<fn() -> K>,
}

impl<K> Default for OwnWrites<K> {
    fn default() -> Self {
        Self { writes: Mutex::default(), kind: std::marker::PhantomData }
    }
}

impl<K: Resource> OwnWrites<K> {
    fn map(&self) -> MutexGuard<'_, HashMap<(String, String), OwnWrite>> {
        self.writes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What `cached` (the informer's copy) may be taken for at `now`, its shard held at `epoch`. Pure on the map.
    pub fn judge(&self, cached: &K, now: Instant, epoch: i64) -> Cached {
        let key = (cached.namespace().unwrap_or_default(), cached.name_any());
        let rv = cached.meta().resource_version.clone();
        let own = self.map().get(&key).filter(|w| w.epoch == epoch).cloned();
        match (own, rv) {
            (Some(own), Some(rv)) if own.version == rv => Cached::Current,
            (Some(OwnWrite { at, .. }), rv) => {
                match CACHE_CATCH_UP.checked_sub(now.saturating_duration_since(at)).filter(|d| !d.is_zero()) {
                    Some(wait) => Cached::CatchingUp(wait),
                    None => Cached::Unverified(rv),
                }
            }
            (None, rv) => Cached::Unverified(rv),
        }
    }

    /// Records the version a write gave object `ns/name` now, its shard held at `epoch` (`None`: forget it, the object
    /// is going away).
    pub fn record(&self, ns: &str, name: &str, version: Option<String>, epoch: i64) {
        let key = (ns.to_string(), name.to_string());
        match version {
            Some(version) => self.map().insert(key, OwnWrite { version, at: Instant::now(), epoch }),
            None => self.map().remove(&key),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_api::Stack;

    #[test]
    fn the_cache_is_read_only_at_the_version_this_replica_wrote_last_at_this_epoch() {
        let stack = |rv: Option<&str>| {
            let mut s = Stack::new("web", Default::default());
            s.metadata.namespace = Some("team-a".into());
            s.metadata.resource_version = rv.map(str::to_string);
            s
        };
        let own = OwnWrites::<Stack>::default();
        let now = Instant::now();
        let five = || Cached::Unverified(Some("5".into()));
        assert_eq!(own.judge(&stack(Some("5")), now, 1), five(), "never written here: pinned to its version");
        own.record("team-a", "web", Some("5".into()), 1);
        assert_eq!(own.judge(&stack(Some("5")), now, 1), Cached::Current, "the cache shows our own write");
        assert_eq!(own.judge(&stack(Some("5")), now, 2), five(), "written before its shard was lost: says nothing");
        let soon = Instant::now();
        let catching = own.judge(&stack(Some("4")), soon, 1);
        assert!(matches!(catching, Cached::CatchingUp(d) if d <= CACHE_CATCH_UP), "just after our write: awaited");
        let later = soon + CACHE_CATCH_UP;
        let four = Cached::Unverified(Some("4".into()));
        assert_eq!(own.judge(&stack(Some("4")), later, 1), four, "still behind after a second: pinned (409 if stale)");
        let six = Cached::Unverified(Some("6".into()));
        assert_eq!(own.judge(&stack(Some("6")), later, 1), six, "someone else wrote since");
        assert_eq!(own.judge(&stack(None), later, 1), Cached::Unverified(None));
        own.record("team-a", "web", None, 1);
        assert_eq!(own.judge(&stack(Some("5")), soon, 1), five(), "forgotten once gone");
    }
}
