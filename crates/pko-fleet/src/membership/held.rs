//! What a replica holds (published on every change) and the [`Ownership`] the controllers read from it: a shard is
//! owned while it is held and the holding valid, by the clock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use crate::Ownership;
use crate::planning::Standing;
use crate::ring::shard_of;

/// What a replica holds now, published on every change.
#[derive(Debug, Clone, Default)]
pub struct Held {
    /// Held shards and their epochs.
    pub shards: BTreeMap<u32, i64>,
    /// Live members as this replica last saw them (sorted).
    pub members: Vec<String>,
    /// Until when the holding is valid (the renew deadline of the last renewal); `None`: nothing held.
    pub valid_until: Option<Instant>,
    /// The membership lapses counted before this holding was built: only a renewal with the same count may advance
    /// `valid_until` (a holding from before a lapse is void).
    pub lapses: u64,
}

impl Held {
    /// The validity a successful renewal started at `started` (`until` = `started` + renew deadline) gives this holding
    /// at `now`, when it advances it: the renewal was counted after the same lapses as the holding, something is held,
    /// `until` is still ahead and later than the current validity. `None`: leave the holding as it is. Pure.
    pub fn advanced_by_renewal(&self, lapses: u64, until: Instant, now: Instant) -> Option<Instant> {
        let later = self.valid_until.is_none_or(|v| until > v);
        (lapses == self.lapses && !self.shards.is_empty() && until > now && later).then_some(until)
    }

    /// The epoch of `shard` if it is held and the holding still valid.
    pub fn epoch(&self, shard: u32) -> Option<i64> {
        self.valid_until.filter(|until| Instant::now() < *until).and_then(|_| self.shards.get(&shard).copied())
    }

    /// Until when (wall clock) `shard` is held validly: the renew deadline of the last renewal, or the Unix epoch
    /// (already past) when the shard is not held or the holding lapsed.
    pub fn not_after(&self, shard: u32) -> std::time::SystemTime {
        let now = Instant::now();
        match self.valid_until {
            Some(until) if now < until && self.shards.contains_key(&shard) => {
                std::time::SystemTime::now() + (until - now)
            }
            _ => std::time::SystemTime::UNIX_EPOCH,
        }
    }
}

/// [`Ownership`] by held shards: an object is owned when its shard is held and the holding valid.
#[derive(Debug, Clone)]
pub struct ShardOwnership {
    pub(super) shards: u32,
    pub(super) held: watch::Receiver<Arc<Held>>,
    pub(super) standing: watch::Receiver<Standing>,
}

impl ShardOwnership {
    /// Every change of what this replica holds.
    pub fn changes(&self) -> watch::Receiver<Arc<Held>> {
        self.held.clone()
    }

    /// Whether this replica's shard count prevails in its fleet ([`standing`]), on every change.
    pub fn standing(&self) -> watch::Receiver<Standing> {
        self.standing.clone()
    }
}

impl Ownership for ShardOwnership {
    fn owns(&self, namespace: &str, name: &str) -> bool {
        self.held.borrow().epoch(self.shard(namespace, name)).is_some()
    }

    fn epoch(&self, namespace: &str, name: &str) -> i64 {
        self.held.borrow().epoch(self.shard(namespace, name)).unwrap_or(0)
    }

    fn not_after(&self, namespace: &str, name: &str) -> Option<std::time::SystemTime> {
        Some(self.held.borrow().not_after(self.shard(namespace, name)))
    }

    fn shard(&self, namespace: &str, name: &str) -> u32 {
        shard_of(&format!("{namespace}/{name}"), self.shards)
    }
}

/// Gauge of a replica standing by (1) or taking part (0): `pko_fleet_standing_by` — 1 while a live member of the
/// fleet runs with another `--shards` that prevails ([`standing`]).
pub const STANDING_BY: &str = "pko_fleet_standing_by";

/// The validity a publish gives (pure): `proposed` (from the last renewal the main loop read), or the current one when
/// a renewal advanced it meanwhile (same lapses, later); `None` stays `None`.
pub(super) fn published_validity(current: &Held, lapses: u64, proposed: Option<Instant>) -> Option<Instant> {
    let proposed = proposed?;
    Some(match current.valid_until {
        Some(c) if current.lapses == lapses && c > proposed => c,
        _ => proposed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_held_shard_is_valid_until_the_renew_deadline_in_wall_clock_and_anything_else_is_already_past() {
        let held = Held {
            shards: BTreeMap::from([(3, 7)]),
            members: vec![],
            valid_until: Some(Instant::now() + Duration::from_secs(4)),
            lapses: 0,
        };
        let until = held.not_after(3).duration_since(std::time::SystemTime::now()).expect("in the future");
        assert!(until > Duration::from_secs(3) && until <= Duration::from_secs(4), "{until:?}");
        assert_eq!(held.not_after(4), std::time::SystemTime::UNIX_EPOCH, "a shard not held");
        let lapsed = Held { valid_until: Some(Instant::now() - Duration::from_millis(1)), ..held.clone() };
        assert_eq!(lapsed.not_after(3), std::time::SystemTime::UNIX_EPOCH, "a lapsed holding");
        assert_eq!(Held { valid_until: None, ..held }.not_after(3), std::time::SystemTime::UNIX_EPOCH, "nothing held");
    }

    #[test]
    fn a_renewal_advances_the_holding_built_after_the_same_lapses_and_nothing_else() {
        let now = Instant::now();
        let secs = Duration::from_secs;
        let held =
            Held { shards: BTreeMap::from([(3, 7)]), members: vec![], valid_until: Some(now + secs(2)), lapses: 1 };
        assert_eq!(
            held.advanced_by_renewal(1, now + secs(9), now),
            Some(now + secs(9)),
            "a later renewal, same lapses"
        );
        assert_eq!(
            held.advanced_by_renewal(2, now + secs(9), now),
            None,
            "a renewal after a lapse the holding predates"
        );
        assert_eq!(held.advanced_by_renewal(1, now + secs(1), now), None, "never earlier than the current validity");
        assert_eq!(held.advanced_by_renewal(1, now, now), None, "a renewal already past its deadline");
        let expired = Held { valid_until: Some(now - secs(1)), ..held.clone() };
        assert_eq!(
            expired.advanced_by_renewal(1, now + secs(9), now),
            Some(now + secs(9)),
            "a holding that lapsed by the clock only (a late renewal)"
        );
        let published_invalid = Held { valid_until: None, ..held.clone() };
        assert_eq!(
            published_invalid.advanced_by_renewal(1, now + secs(9), now),
            Some(now + secs(9)),
            "published with a late renewal, shards kept"
        );
        let empty = Held { shards: BTreeMap::new(), valid_until: None, ..held };
        assert_eq!(empty.advanced_by_renewal(1, now + secs(9), now), None, "nothing held");
    }

    #[test]
    fn a_publish_never_moves_validity_back_past_what_a_renewal_gave() {
        let now = Instant::now();
        let secs = Duration::from_secs;
        let current =
            Held { shards: BTreeMap::from([(3, 7)]), members: vec![], valid_until: Some(now + secs(9)), lapses: 1 };
        assert_eq!(
            published_validity(&current, 1, Some(now + secs(4))),
            Some(now + secs(9)),
            "computed from an older renewal"
        );
        assert_eq!(published_validity(&current, 1, Some(now + secs(12))), Some(now + secs(12)), "a newer renewal");
        assert_eq!(
            published_validity(&current, 2, Some(now + secs(4))),
            Some(now + secs(4)),
            "built after another lapse"
        );
        assert_eq!(published_validity(&current, 1, None), None, "invalid stays invalid");
    }

    #[test]
    fn an_expired_holding_owns_nothing() {
        let held = Held {
            shards: [(1, 3)].into(),
            members: vec![],
            valid_until: Some(Instant::now() - Duration::from_millis(1)),
            lapses: 0,
        };
        assert_eq!(held.epoch(1), None);
        let held = Held { valid_until: Some(Instant::now() + Duration::from_secs(5)), ..held };
        assert_eq!(held.epoch(1), Some(3));
        assert_eq!(held.epoch(2), None);
    }
}
