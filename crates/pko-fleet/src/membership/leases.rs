//! The fleet's Leases as a replica watches them: a slim cache, a notification at every change, a flag for changes that
//! may concern shards (anything but a member's renewal), and the Leases by kind.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::sync::Notify;

use super::Fleet;
use crate::lease::{self, FLEET_LABEL, LeaseKind};
use crate::table::ShardTable;

/// The fleet's Leases as [`Fleet::run`] watches them.
pub(super) struct Leases {
    pub store: reflector::Store<Lease>,
    /// Notified at every watch event.
    pub changed: Arc<Notify>,
    /// Set by every event that may change a shard Lease.
    pub shards_changed: Arc<AtomicBool>,
    pub watch: tokio::task::JoinHandle<()>,
}

/// Whether a watch event of the fleet's Leases is only about membership Leases (a renewal), so that no shard Lease
/// changed (pure). Re-lists count as changes.
fn member_event(fleet: &str, event: &watcher::Event<Lease>) -> bool {
    match event {
        watcher::Event::Apply(l) | watcher::Event::Delete(l) => {
            matches!(kind(fleet, l), Some(LeaseKind::Replica | LeaseKind::LegacyMember))
        }
        watcher::Event::Init | watcher::Event::InitApply(_) | watcher::Event::InitDone => false,
    }
}

/// The kind of `lease` in `fleet`, by its name (the cache keeps no labels: [`lease::slim`]).
fn kind(fleet: &str, lease: &Lease) -> Option<LeaseKind> {
    LeaseKind::of(fleet, lease.metadata.name.as_deref()?)
}

/// The fleet's cached Leases by kind (pure).
#[derive(Default)]
pub(super) struct ByKind<'a> {
    /// Membership Leases of this version.
    pub replicas: Vec<&'a Lease>,
    /// Membership Leases of an earlier version.
    pub members: Vec<&'a Lease>,
    /// Shard tables by shard count.
    pub tables: BTreeMap<u32, Arc<Lease>>,
    /// An earlier version's shard Leases: their epochs.
    pub earlier_epochs: BTreeMap<u32, i64>,
}

impl<'a> ByKind<'a> {
    pub fn of(fleet: &str, leases: &'a [Arc<Lease>]) -> Self {
        let mut by = Self::default();
        for l in leases {
            match kind(fleet, l) {
                Some(LeaseKind::Replica) => by.replicas.push(l),
                Some(LeaseKind::LegacyMember) => by.members.push(l),
                Some(LeaseKind::Table(n)) => {
                    by.tables.insert(n, l.clone());
                }
                Some(LeaseKind::LegacyShard(k)) => {
                    by.earlier_epochs.insert(k, lease::transitions(l));
                }
                None => {}
            }
        }
        by
    }
}

/// The decoded table of `lease` (none: empty).
///
/// Errors: [`crate::table::TableError`] for an annotation that does not decode.
pub(super) fn table_of(lease: Option<&Arc<Lease>>) -> Result<ShardTable, crate::table::TableError> {
    lease.map_or(Ok(ShardTable::default()), |l| ShardTable::of(l))
}

impl Fleet {
    /// The fleet's Leases, watched into a store: `changed` is notified at every event, `shards_changed` set by every
    /// event that may change a shard Lease (anything but a member's renewal) — only then, or when the live members or
    /// the held shards changed, is the plan worked out again.
    pub(super) fn watch_leases(&self) -> Leases {
        let selector = format!("{FLEET_LABEL}={}", self.cfg.fleet);
        let (store, writer) = reflector::store();
        let changed = Arc::new(Notify::new());
        let shards_changed = Arc::new(AtomicBool::new(true));
        let (notify, shards_flag, fleet) = (changed.clone(), shards_changed.clone(), self.cfg.fleet.clone());
        let watch = watcher(self.watch_api.clone(), watcher::Config::default().labels(&selector))
            .default_backoff()
            // the cache keeps what decisions and guarded writes need, nothing more (2,048 shard Leases)
            .modify(lease::slim)
            .reflect(writer)
            .for_each(move |event| {
                match event {
                    // e.g. no RBAC for Leases in the fleet's namespace: say so rather than wait silently
                    Err(e) => tracing::warn!(error = %e, "watching the fleet's Leases failed; retrying"),
                    Ok(e) => {
                        if !member_event(&fleet, &e) {
                            shards_flag.store(true, Ordering::SeqCst);
                        }
                        notify.notify_one();
                    }
                }
                async {}
            });
        Leases { store, changed, shards_changed, watch: tokio::spawn(watch) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planning::tests::lease;

    #[test]
    fn only_a_member_leases_own_event_leaves_the_plan_as_it_was() {
        let named = |name: &str| {
            let mut l = lease(Some("a"), 1);
            l.metadata.name = Some(name.to_string());
            l
        };
        let member = || named(&lease::replica_name("pko", "r-1"));
        let shard = || named(&lease::table_name("pko", 64));
        assert!(member_event("pko", &watcher::Event::Apply(member())), "a renewal");
        assert!(
            member_event("pko", &watcher::Event::Apply(named(&lease::member_name("pko", "old")))),
            "an earlier version's renewal"
        );
        assert!(
            !member_event("pko", &watcher::Event::Apply(named(&lease::shard_name("pko", 7)))),
            "an earlier version's shard Lease"
        );
        assert!(member_event("pko", &watcher::Event::Delete(member())));
        assert!(!member_event("pko", &watcher::Event::Apply(shard())), "shards taken or released");
        assert!(!member_event("pko", &watcher::Event::Delete(shard())));
        assert!(!member_event("pko", &watcher::Event::Apply(lease(Some("a"), 1))), "unnamed: counted as a change");
        assert!(!member_event("other", &watcher::Event::Apply(member())), "another fleet's name: counted as a change");
        assert!(!member_event("pko", &watcher::Event::InitApply(member())), "a re-list");
        assert!(!member_event("pko", &watcher::Event::InitDone));
    }
}
