//! The operator's side of the sharded fleet (`--fleet`): the membership of `pko-fleet` turned into what the controllers
//! use — an [`Ownership`] (held shards, within `--namespaces` when given), the label selector of the held shards that
//! the informers watch with, and the labeller that writes `pulumi.com/shard` and `pulumi.com/shards` once on every
//! Stack, Workspace and Update that lacks them or was labelled for another shard count.
//!
//! Any replica labels an unlabelled object, by server-side apply with its own field manager: the value is a pure
//! function of the object (`pko_fleet::ring::shard_of` of its namespace and [`ShardKey`]), so replicas agree and the
//! write is idempotent. A Stack's Workspace and Updates are built with the Stack's label (`stack::build`); the labeller
//! catches those made directly.
//!
//! The labels are an index for watches, never the truth of ownership (that is the hash): a user can copy them (`kubectl
//! get -o yaml` of another Stack) or write anything. An object filed under a shard that is not its own sits in the
//! caches of the replica holding that shard, which does not own it: that replica relabels it ([`relabel_misfiled`]). An
//! object whose shard label is no shard of the fleet at all (`garbage`, `99999`) sits in no cache: the labeller watches
//! for those too ([`misnumbered_selector`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::Api;
use pko_fleet::membership::{Fleet, FleetConfig, ShardOwnership};
use pko_fleet::planning::Standing;
use pko_fleet::ring::BoundedRing;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::args::FleetArgs;
use crate::informer::HeldShards;
use crate::ownership::{Namespaces, Ownership};

mod labeller;
pub use labeller::{
    LABEL_FALLBACK, label_delay, label_patch, label_unsharded, misfiled, misnumbered_selector, needs_labels,
    relabel_misfiled, relabel_misfiled_kinds, shard_labels, unlabelled_selector,
};

/// Field manager of the shard label.
pub const SHARD_FIELD_MANAGER: &str = "pulumi-kubernetes-operator/shard";

/// How long a holding had lapsed when a new one is published, given the validity of the `previous` and `current`
/// holdings at `now`; `None`: no gap (still valid, not valid now either, or nothing held before). A late renewal lapses
/// a holding without anything published: `Held::epoch` fences everything from its deadline on, by the clock. Pure.
pub fn resumed_after_gap(previous: Option<Instant>, current: Option<Instant>, now: Instant) -> Option<Duration> {
    let previous = previous?;
    let current = current.filter(|c| *c > now)?;
    (previous <= now && current > previous).then(|| now - previous)
}

/// How the held shards changed between two published holdings (counts of shards).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HoldingChange {
    /// Held now, not before.
    pub gained: usize,
    /// Held before, not now.
    pub lost: usize,
    /// Held before and now at another epoch: lost and taken again in between, unseen (the holdings between were not
    /// published to this observer).
    pub regained: usize,
}

/// How `now` (shard → epoch) differs from `before`. Pure.
pub fn holding_change(before: &BTreeMap<u32, i64>, now: &BTreeMap<u32, i64>) -> HoldingChange {
    HoldingChange {
        gained: now.keys().filter(|s| !before.contains_key(s)).count(),
        lost: before.keys().filter(|s| !now.contains_key(s)).count(),
        regained: now.iter().filter(|(s, e)| before.get(s).is_some_and(|b| b != *e)).count(),
    }
}

/// Ownership by held shards, within some namespaces when the replica is scoped (`--namespaces`).
#[derive(Debug, Clone)]
pub struct FleetOwnership {
    shards: ShardOwnership,
    namespaces: Option<Namespaces>,
}

impl Ownership for FleetOwnership {
    fn owns(&self, namespace: &str, name: &str) -> bool {
        self.namespaces.as_ref().is_none_or(|n| n.owns(namespace, name)) && self.shards.owns(namespace, name)
    }

    fn epoch(&self, namespace: &str, name: &str) -> i64 {
        self.shards.epoch(namespace, name)
    }

    fn shard(&self, namespace: &str, name: &str) -> u32 {
        self.shards.shard(namespace, name)
    }

    fn not_after(&self, namespace: &str, name: &str) -> Option<std::time::SystemTime> {
        self.shards.not_after(namespace, name)
    }
}

impl FleetOwnership {
    /// Every change of the held shards.
    pub fn changes(&self) -> watch::Receiver<Arc<pko_fleet::membership::Held>> {
        self.shards.changes()
    }

    /// Every change of whether this replica's `--shards` prevails in its fleet.
    pub fn standing(&self) -> watch::Receiver<Standing> {
        self.shards.standing()
    }
}

/// Keeps `queue` in step with the held shards: a gained shard's jobs recorded elsewhere are adopted at its epoch, a
/// lost shard's waiting jobs forgotten. Runs until the membership ends.
pub async fn follow_shards(ownership: Arc<FleetOwnership>, queue: Arc<dyn crate::queue::WorkQueue>) {
    let mut changes = ownership.changes();
    let mut last: std::collections::BTreeMap<u32, i64> = Default::default();
    loop {
        let held = changes.borrow_and_update().shards.clone();
        if held != last {
            let now = held.clone();
            queue.forget(&move |job| now.contains_key(&job.shard));
            for (shard, epoch) in held.iter().filter(|(s, e)| last.get(s) != Some(e)) {
                match queue.adopt(*shard, *epoch).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(shard, epoch, jobs = n, "adopted the shard's queued operations"),
                    Err(e) => tracing::warn!(shard, error = %e, "could not adopt the shard's queued operations"),
                }
            }
            last = held;
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// Refuses a second replica without Redis: each replica's in-memory queue is its own, so operations a stopped replica
/// had queued would wait for the next reconcile instead of moving with their shard.
///
/// Errors: another live member of the fleet, named.
pub async fn check_single_without_redis(client: &kube::Client, args: &FleetArgs, replica: &str) -> anyhow::Result<()> {
    let Some(namespace) = args.fleet_namespace.as_deref() else { return Ok(()) };
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), namespace);
    let selector =
        format!("{}={},{}=member", pko_fleet::lease::FLEET_LABEL, args.fleet_name, pko_fleet::lease::KIND_LABEL);
    let now = k8s_openapi::jiff::Timestamp::now();
    for l in leases.list(&kube::api::ListParams::default().labels(&selector)).await?.items {
        let Some(spec) = l.spec.as_ref() else { continue };
        let Some(holder) = spec.holder_identity.as_deref().filter(|h| !h.is_empty() && *h != replica) else { continue };
        let fresh = spec
            .renew_time
            .as_ref()
            .is_some_and(|t| now.duration_since(t.0).as_secs() < i64::from(spec.lease_duration_seconds.unwrap_or(15)));
        if fresh {
            anyhow::bail!(
                "replica {holder} is live in fleet {}: more than one replica needs --redis-url (the work queue they \
                    share)",
                args.fleet_name
            );
        }
    }
    Ok(())
}

/// A started fleet member: its ownership, the selector of its held shards, and its task.
pub struct Member {
    /// What this replica owns.
    pub ownership: Arc<FleetOwnership>,
    /// The held shards, published on each gain or loss, for [`crate::informer::Informers::with_shards`].
    pub held: watch::Receiver<HeldShards>,
    /// Counts the times this replica gained shards, took one again at a new epoch, or had its holding back after a
    /// lapse (for `reconcile_all_on` of unsharded kinds).
    pub gained: watch::Receiver<u64>,
    /// The membership and the selector tasks (end at shutdown; the membership is released then).
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Errors starting a fleet member.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// Neither `--fleet-namespace` nor `POD_NAMESPACE` says where the Leases live.
    #[error("--fleet needs --fleet-namespace (env POD_NAMESPACE): the namespace of the fleet's Leases")]
    NoNamespace,
    /// No replica id and no host name.
    #[error("--fleet needs --replica-id (env POD_NAME): this replica's id, unique in the fleet")]
    NoReplicaId,
}

/// This replica's id: `--replica-id` (env `POD_NAME`), else the host name.
///
/// Errors: [`FleetError::NoReplicaId`].
pub fn replica_id(args: &FleetArgs) -> Result<String, FleetError> {
    args.replica_id
        .clone()
        .filter(|r| !r.is_empty())
        .or_else(|| nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()))
        .ok_or(FleetError::NoReplicaId)
}

/// Joins the fleet of `args` as `replica` ([`replica_id`]): starts the membership (until `shutdown`) and publishes the
/// selector of the held shards. Leases are written through `client` and watched through `watch_client` (no read
/// timeout).
///
/// Errors: [`FleetError`] naming the missing flag.
pub fn join(
    client: &kube::Client,
    watch_client: &kube::Client,
    args: &FleetArgs,
    replica: &str,
    namespaces: &[String],
    shutdown: &CancellationToken,
) -> Result<Member, FleetError> {
    let namespace = args.fleet_namespace.clone().filter(|n| !n.is_empty()).ok_or(FleetError::NoNamespace)?;
    let cfg = FleetConfig {
        lease_duration: Duration::from_secs(args.lease_duration_seconds.max(1)),
        renew_interval: Duration::from_secs(args.renew_interval_seconds.max(1)),
        renew_deadline: Duration::from_secs(args.renew_deadline_seconds.max(1)),
        // the replica's load rides on each renewal (`kubectl pko fleet`)
        announce: Some(pko_fleet::membership::Announce(Arc::new(|| {
            [(crate::load::LOAD_ANNOTATION.to_string(), crate::load::announcement())].into()
        }))),
        ..FleetConfig::new(namespace, args.fleet_name.clone(), replica, args.shards)
    };
    tracing::info!(replica = %replica, shards = args.shards, fleet = %args.fleet_name, "joining the fleet");
    let (fleet, shards) = Fleet::new(client.clone(), cfg, Arc::new(BoundedRing::default()));
    let fleet = fleet.with_watch_client(watch_client.clone());
    let changes = shards.changes();
    let total = args.shards;
    let (tx, selector) = watch::channel(HeldShards { shards: BTreeSet::new(), total });
    let (gained_tx, gained) = watch::channel(0u64);
    let publish = tokio::spawn(publish_holdings(changes, tx, gained_tx, total));
    let membership = tokio::spawn(fleet.run(shutdown.clone()));
    let namespaces = (!namespaces.is_empty()).then(|| Namespaces(namespaces.iter().cloned().collect()));
    Ok(Member {
        ownership: Arc::new(FleetOwnership { shards, namespaces }),
        held: selector,
        gained,
        tasks: vec![membership, publish],
    })
}

/// Follows what the membership holds (`changes`) until it stops: publishes the held shards to the informers (`tx`, out
/// of `total`) on a gain or a loss, counts shard transitions, and bumps `gained_tx` on a gain, a regain or a holding
/// valid again after a momentary lapse (the kinds watched whole are reconciled again then).
async fn publish_holdings(
    mut changes: watch::Receiver<Arc<pko_fleet::membership::Held>>,
    tx: watch::Sender<HeldShards>,
    gained_tx: watch::Sender<u64>,
    total: u32,
) {
    let mut last: Option<BTreeMap<u32, i64>> = None;
    let mut last_valid: Option<Instant> = None;
    loop {
        let (held, members, valid_until): (BTreeMap<u32, i64>, usize, Option<Instant>) = {
            let h = changes.borrow_and_update();
            (h.shards.clone(), h.members.len(), h.valid_until)
        };
        metrics::gauge!(crate::metric_names::FLEET_MEMBERS).set(members as f64);
        let gap = resumed_after_gap(last_valid, valid_until, Instant::now());
        last_valid = valid_until;
        let before = last.clone().unwrap_or_default();
        let change = holding_change(&before, &held);
        if let Some(gap) = gap
            && change == HoldingChange::default()
        {
            // Everything was fenced meanwhile: dispatches let their operations go, reconciles of
            // sharded kinds skipped their objects and look again by themselves (`unowned`); the
            // kinds watched whole (Programs) are reconciled again, as on a gain.
            tracing::warn!(
                held = held.len(),
                gap_s = gap.as_secs_f64(),
                "holding valid again after lapsing for a moment: reconciling the Programs again"
            );
            metrics::counter!(crate::metric_names::FLEET_HOLDING_GAPS_TOTAL).increment(1);
            gained_tx.send_modify(|n| *n += 1);
        }
        if last.is_none() || change != HoldingChange::default() {
            metrics::counter!(crate::metric_names::SHARD_TRANSITIONS_TOTAL, "change" => "gained")
                .increment(change.gained as u64);
            metrics::counter!(crate::metric_names::SHARD_TRANSITIONS_TOTAL, "change" => "lost")
                .increment(change.lost as u64);
            if change.gained + change.regained > 0 {
                gained_tx.send_modify(|n| *n += 1);
            }
            metrics::gauge!(crate::metric_names::SHARDS_HELD).set(held.len() as f64);
            if last.is_none() || change.gained + change.lost > 0 {
                tx.send_replace(HeldShards { shards: held.keys().copied().collect(), total });
            }
            last = Some(held);
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_taken_again_at_a_new_epoch_is_regained_and_renewals_are_no_change() {
        let m = |v: &[(u32, i64)]| v.iter().copied().collect::<BTreeMap<u32, i64>>();
        assert_eq!(holding_change(&m(&[(1, 3), (2, 4)]), &m(&[(1, 3), (2, 4)])), HoldingChange::default(), "a renewal");
        assert_eq!(
            holding_change(&m(&[(1, 3)]), &m(&[(1, 3), (2, 4)])),
            HoldingChange { gained: 1, ..Default::default() }
        );
        assert_eq!(
            holding_change(&m(&[(1, 3), (2, 4)]), &m(&[(2, 4)])),
            HoldingChange { lost: 1, ..Default::default() }
        );
        assert_eq!(
            holding_change(&m(&[(1, 3), (2, 4)]), &m(&[(1, 5), (3, 1)])),
            HoldingChange { gained: 1, lost: 1, regained: 1 }
        );
        assert_eq!(holding_change(&m(&[]), &m(&[])), HoldingChange::default());
    }

    #[test]
    fn a_holding_that_lapsed_before_the_next_was_published_is_a_gap_and_others_are_not() {
        let now = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(
            resumed_after_gap(Some(now - s(2)), Some(now + s(8)), now),
            Some(s(2)),
            "lapsed 2 s ago, valid again"
        );
        assert_eq!(resumed_after_gap(Some(now + s(1)), Some(now + s(9)), now), None, "renewed in time");
        assert_eq!(
            resumed_after_gap(None, Some(now + s(9)), now),
            None,
            "nothing valid before (a start, or a lapse already handled)"
        );
        assert_eq!(resumed_after_gap(Some(now - s(2)), None, now), None, "still not valid");
        assert_eq!(resumed_after_gap(Some(now - s(2)), Some(now - s(1)), now), None, "published already expired");
    }
}
