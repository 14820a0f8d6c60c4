//! The operator's side of the sharded fleet (`--fleet`): the membership of `pko-fleet` turned into
//! what the controllers use — an [`Ownership`] (held shards, within `--namespaces` when given), the
//! label selector of the held shards that the informers watch with, and the labeller that writes
//! `pulumi.com/shard` and `pulumi.com/shards` once on every Stack, Workspace and Update that lacks
//! them or was labelled for another shard count.
//!
//! Any replica labels an unlabelled object, by server-side apply with its own field manager: the
//! value is a pure function of the object (`pko_fleet::ring::shard_of` of its namespace and
//! [`ShardKey`]), so replicas agree and the write is idempotent. A Stack's Workspace and Updates are
//! built with the Stack's label (`stack::build`); the labeller catches those made directly.
//!
//! The labels are an index for watches, never the truth of ownership (that is the hash): a user can
//! copy them (`kubectl get -o yaml` of another Stack) or write anything. An object filed under a shard
//! that is not its own sits in the caches of the replica holding that shard, which does not own it:
//! that replica relabels it ([`relabel_misfiled`]). An object whose shard label is no shard of the
//! fleet at all (`garbage`, `99999`) sits in no cache: the labeller watches for those too
//! ([`misnumbered_selector`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use pko_api::constants::{SHARD_LABEL, SHARDS_LABEL, STACK_FINALIZER};
use pko_api::shard::ShardKey;
use pko_api::{Stack, Update, Workspace};
use pko_fleet::membership::{Fleet, FleetConfig, ShardOwnership};
use pko_fleet::planning::Standing;
use pko_fleet::ring::{BoundedRing, shard_of};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::args::FleetArgs;
use crate::informer::{Change, HeldShards, Informer, WatchScope, Watched};
use crate::ownership::{Namespaces, Ownership};

/// Field manager of the shard label.
pub const SHARD_FIELD_MANAGER: &str = "pulumi-kubernetes-operator/shard";

/// How long a holding had lapsed when a new one is published (pure): `previous` is the validity of
/// the holding published before, `current` that of the new one, at `now`. A holding lapses without
/// anything being published when its renewal comes late (the membership loop busy writing Leases, the
/// API server slow): `Held::epoch` fences everything from its deadline on, by the clock. `None`: no
/// gap (still valid, or not valid now either, or nothing held before).
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
    /// Held before and now at another epoch: lost and taken again in between, unseen (the holdings
    /// between were not published to this observer).
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

/// Keeps `queue` in step with the held shards: a gained shard's jobs recorded elsewhere are adopted at
/// its epoch, a lost shard's waiting jobs forgotten. Runs until the membership ends.
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

/// Refuses a second replica without Redis: each replica's in-memory queue is its own, so operations a
/// stopped replica had queued would wait for the next reconcile instead of moving with their shard.
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
                "replica {holder} is live in fleet {}: more than one replica needs --redis-url (the work queue they share)",
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
    /// Counts the times this replica gained shards, took one again at a new epoch, or had its holding
    /// back after a lapse (for `reconcile_all_on` of unsharded kinds).
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

/// Joins the fleet of `args` as `replica` ([`replica_id`]): starts the membership (until `shutdown`)
/// and publishes the selector of the held shards. Leases are written through `client` and watched
/// through `watch_client` (no read timeout).
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
    let mut changes = shards.changes();
    let total = args.shards;
    let (tx, selector) = watch::channel(HeldShards { shards: BTreeSet::new(), total });
    let (gained_tx, gained) = watch::channel(0u64);
    let publish = tokio::spawn(async move {
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
    });
    let membership = tokio::spawn(fleet.run(shutdown.clone()));
    let namespaces = (!namespaces.is_empty()).then(|| Namespaces(namespaces.iter().cloned().collect()));
    Ok(Member {
        ownership: Arc::new(FleetOwnership { shards, namespaces }),
        held: selector,
        gained,
        tasks: vec![membership, publish],
    })
}

/// How long a replica that does not hold an unlabelled object's shard waits before labelling it
/// itself: the holder labels at once; this covers a shard that had no holder at that moment (seconds).
pub const LABEL_FALLBACK: Duration = Duration::from_secs(5);

/// When this replica labels an unlabelled object: at once when it holds the object's shard (`owned`),
/// else after [`LABEL_FALLBACK`] if the object is still unlabelled then. Every replica may label any
/// object (the label is idempotent), but each new Stack labelled by every replica at once cost one
/// write per replica. Pure.
pub fn label_delay(owned: bool) -> Duration {
    if owned { Duration::ZERO } else { LABEL_FALLBACK }
}

/// The shard labels of the object `namespace/key` in a fleet of `shards` virtual shards (pure):
/// [`SHARD_LABEL`] its shard (`pko_fleet::ring::shard_of`) and [`SHARDS_LABEL`] the count.
pub fn shard_labels(namespace: &str, key: &str, shards: u32) -> BTreeMap<String, String> {
    BTreeMap::from([
        (SHARD_LABEL.to_string(), shard_of(&format!("{namespace}/{key}"), shards).to_string()),
        (SHARDS_LABEL.to_string(), shards.to_string()),
    ])
}

/// The label selector of the objects the labeller writes in a fleet of `shards` (pure): those whose
/// [`SHARDS_LABEL`] is not `shards` — without one (new objects, and objects labelled before the
/// count was recorded) or labelled for another count (after a change of `--shards`). Kubernetes'
/// `!=` matches objects without the label too.
pub fn unlabelled_selector(shards: u32) -> String {
    format!("{SHARDS_LABEL}!={shards}")
}

/// The label selector of objects labelled for the fleet's count `shards` whose shard label names no
/// shard of it (no label, a value that is not a number below `shards`): `pulumi.com/shards=S,
/// pulumi.com/shard notin (0,…,S−1)` (`notin` also matches a missing label). Pure.
pub fn misnumbered_selector(shards: u32) -> String {
    let all: Vec<String> = (0..shards).map(|s| s.to_string()).collect();
    format!("{SHARDS_LABEL}={shards},{SHARD_LABEL} notin ({})", all.join(","))
}

/// Whether `labels` file the object `namespace/key` of a fleet of `shards` under another shard than
/// its own: labelled for this count, but not with the object's shard (copied from another object,
/// or written by hand). Pure.
pub fn misfiled(labels: &BTreeMap<String, String>, namespace: &str, key: &str, shards: u32) -> bool {
    labels.get(SHARDS_LABEL).is_some_and(|s| *s == shards.to_string())
        && labels.get(SHARD_LABEL) != Some(&shard_of(&format!("{namespace}/{key}"), shards).to_string())
}

/// Whether an object `namespace/key` with `labels` needs its shard labels written in a fleet of
/// `shards`: labelled for another count (or none), or [`misfiled`]. Pure.
pub fn needs_labels(labels: &BTreeMap<String, String>, namespace: &str, key: &str, shards: u32) -> bool {
    labels.get(SHARDS_LABEL) != Some(&shards.to_string()) || misfiled(labels, namespace, key, shards)
}

/// Relabels every object of kind `K` this replica's sharded cache holds under a shard that is not its
/// own ([`misfiled`]; `changes` is the cache's subscription): its real shard's holder, which never
/// sees it otherwise, then does. Only while this replica's count prevails (`standing`). One write per
/// misfiled object, by the holder of the shard it claims. Runs until `changes` ends or `shutdown`.
pub async fn relabel_misfiled<K: Watched + ShardKey>(
    changes: impl futures::Stream<Item = Change<K>> + Send + 'static,
    client: kube::Client,
    shards: u32,
    standing: watch::Receiver<Standing>,
    shutdown: CancellationToken,
) {
    use futures::StreamExt;
    let mut changes = Box::pin(changes);
    loop {
        let change = tokio::select! {
            _ = shutdown.cancelled() => return,
            c = changes.next() => match c { Some(c) => c, None => return },
        };
        let Change::Applied(object) = change else { continue };
        let ns = object.namespace().unwrap_or_default();
        if *standing.borrow() == Standing::Active && misfiled(object.labels(), &ns, &object.shard_key(), shards) {
            tracing::info!(kind = %K::kind(&()), namespace = %ns, name = %object.name_any(), shard = ?object.labels().get(SHARD_LABEL), "relabelling an object filed under another shard than its own");
            label(&client, &object, shards, None).await;
        }
    }
}

/// [`relabel_misfiled`] for the Stacks, Workspaces and Updates of `informers` (subscribed now, before
/// they run), each on a task of its own.
pub fn relabel_misfiled_kinds(
    informers: &mut crate::informer::Informers,
    client: &kube::Client,
    shards: u32,
    standing: &watch::Receiver<Standing>,
    shutdown: &CancellationToken,
) -> [tokio::task::JoinHandle<()>; 3] {
    [
        tokio::spawn(relabel_misfiled(
            informers.stacks().subscribe(),
            client.clone(),
            shards,
            standing.clone(),
            shutdown.clone(),
        )),
        tokio::spawn(relabel_misfiled(
            informers.workspaces().subscribe(),
            client.clone(),
            shards,
            standing.clone(),
            shutdown.clone(),
        )),
        tokio::spawn(relabel_misfiled(
            informers.updates().subscribe(),
            client.clone(),
            shards,
            standing.clone(),
            shutdown.clone(),
        )),
    ]
}

/// The labeller: while this replica's shard count prevails in its fleet (`standing`; a replica
/// standing by writes nothing, or replicas of two counts would relabel each other's objects back and
/// forth), watches the Stacks, Workspaces and Updates of `scope` whose shard labels were not computed
/// for `shards` ([`unlabelled_selector`], through `watch_client`, which has no read timeout: these
/// watches are quiet for minutes) and writes their [`shard_labels`] through `client`
/// ([`label_delay`]: at once where `ownership` says this replica holds the object's shard); and the
/// objects labelled for `shards` whose shard label names no shard ([`misnumbered_selector`]). Runs
/// until `shutdown`. After a change of `--shards` every object is labelled again, once; so is every object
/// labelled before [`SHARDS_LABEL`] existed.
///
/// Its lists are served from the API server's watch cache ([`crate::informer::list_config`]): the
/// selector matches almost nothing at rest, and a paged list from etcd scans every object of the kind
/// to find it (at 10,000 Stacks such lists hit the API server's 60 s handler timeout).
pub async fn label_unsharded(
    client: kube::Client,
    watch_client: kube::Client,
    scope: WatchScope,
    shards: u32,
    ownership: Arc<dyn Ownership>,
    mut standing: watch::Receiver<Standing>,
    shutdown: CancellationToken,
) {
    loop {
        // wait until this replica's count prevails
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = standing.wait_for(|s| *s == Standing::Active) => if r.is_err() { return },
        }
        let stop = shutdown.child_token();
        let mut watches = Vec::new();
        for selector in [unlabelled_selector(shards), misnumbered_selector(shards)] {
            let config = || crate::informer::list_config().labels(&selector);
            let (c, o, t) = (&client, &ownership, &stop);
            watches.push(
                label_kind::<Stack>(
                    Informer::new(&watch_client, &scope, config()),
                    c.clone(),
                    shards,
                    o.clone(),
                    Some(STACK_FINALIZER),
                    t.clone(),
                )
                .boxed(),
            );
            watches.push(
                label_kind::<Workspace>(
                    Informer::new(&watch_client, &scope, config()),
                    c.clone(),
                    shards,
                    o.clone(),
                    None,
                    t.clone(),
                )
                .boxed(),
            );
            watches.push(
                label_kind::<Update>(
                    Informer::new(&watch_client, &scope, config()),
                    c.clone(),
                    shards,
                    o.clone(),
                    None,
                    t.clone(),
                )
                .boxed(),
            );
        }
        let standing_by = async {
            let _ = standing.wait_for(|s| *s != Standing::Active).await;
            tracing::info!("standing by: the labeller stops");
            stop.cancel();
        };
        tokio::select! {
            _ = futures::future::join_all(watches) => {}
            () = standing_by => {}
        }
        stop.cancel();
        if shutdown.is_cancelled() {
            return;
        }
    }
}

/// Labels the objects `informer` sees (see [`label_unsharded`]); `finalizer` is added with the labels
/// where this replica holds the object's shard, as its controller would add it next (the Stack
/// finalizer; a replica that does not hold the shard adds none: the object may be no replica's, as
/// outside `--namespaces`).
async fn label_kind<K: Watched + ShardKey>(
    mut informer: Informer<K>,
    client: kube::Client,
    shards: u32,
    ownership: Arc<dyn Ownership>,
    finalizer: Option<&'static str>,
    stop: CancellationToken,
) {
    use futures::StreamExt;
    let store = informer.store();
    let mut changes = Box::pin(informer.subscribe());
    let watch = tokio::spawn(informer.run(stop.clone()));
    loop {
        let change = tokio::select! {
            _ = stop.cancelled() => break,
            c = changes.next() => match c { Some(c) => c, None => break },
        };
        let Change::Applied(object) = change else { continue };
        let ns = object.namespace().unwrap_or_default();
        let delay = label_delay(ownership.owns(&ns, &object.shard_key()));
        if delay.is_zero() {
            label(&client, &object, shards, finalizer).await;
            continue;
        }
        let (client, store, stop) = (client.clone(), store.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            // still in the store of unlabelled objects: its shard's holder may not have labelled it —
            // read it fresh before writing (the store can be stale: this process may have been frozen
            // since, its watch not caught up; a replica writes nothing on what it only remembers)
            if stop.is_cancelled() || store.get(&kube::runtime::reflector::ObjectRef::from_obj(&object)).is_none() {
                return;
            }
            let ns = object.namespace().unwrap_or_default();
            match Api::<K>::namespaced(client.clone(), &ns).get_opt(&object.name_any()).await {
                Ok(Some(fresh)) if needs_labels(fresh.labels(), &ns, &fresh.shard_key(), shards) => {
                    label(&client, &fresh, shards, None).await
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(kind = %K::kind(&()), name = %object.name_any(), error = %e, "reading an unlabelled object before labelling it")
                }
            }
        });
    }
    watch.abort();
}

/// Writes `object`'s [`shard_labels`], with `finalizer` when [`label_patch`] can carry it in the same
/// JSON patch (the labeller's own field manager); otherwise, or when that patch is refused (422: the
/// object changed since it was read), the labels alone by server-side apply. Failures are logged: the
/// object stays in the labeller's watch and its holder's fallback labels it.
async fn label<K: Watched + ShardKey>(client: &kube::Client, object: &K, shards: u32, finalizer: Option<&str>) {
    let ns = object.namespace().unwrap_or_default();
    let labels = shard_labels(&ns, &object.shard_key(), shards);
    let api: Api<K> = Api::namespaced(client.clone(), &ns);
    if let Some(ops) = label_patch(object.meta(), &labels, finalizer) {
        let params = PatchParams { field_manager: Some(SHARD_FIELD_MANAGER.into()), ..Default::default() };
        let written = match serde_json::from_value::<json_patch::Patch>(serde_json::Value::Array(ops)) {
            Ok(patch) => api.patch(&object.name_any(), &params, &Patch::<()>::Json(patch)).await.map(|_| ()),
            Err(e) => Err(kube::Error::SerdeError(e)),
        };
        match written {
            Ok(()) => return,
            Err(e) => {
                tracing::debug!(kind = %K::kind(&()), name = %object.name_any(), error = %e, "labels and finalizer not written in one patch; the labels alone")
            }
        }
    }
    let patch = serde_json::json!({"apiVersion": K::api_version(&()), "kind": K::kind(&()), "metadata": {"name": object.name_any(), "labels": labels}});
    if let Err(e) =
        api.patch(&object.name_any(), &PatchParams::apply(SHARD_FIELD_MANAGER).force(), &Patch::Apply(&patch)).await
    {
        tracing::debug!(kind = %K::kind(&()), name = %object.name_any(), error = %e, "shard labels not written");
    }
}

/// The JSON patch that labels a new object with `labels` and adds `finalizer` in one write (pure):
/// the Stack finalizer, which the Stack controller would otherwise add with a write of its own right
/// after the label's (one request per new Stack). Each change is pinned by a `test` of what was read:
/// the finalizer list ([`crate::k8s::finalizer_patch`]) and, when the object has no labels, their
/// absence (a map added whole would replace labels written since). `None` — the labels go alone — when
/// there is no finalizer to add: none given, the object is being deleted (the API refuses new
/// finalizers then), or it holds it already.
pub fn label_patch(
    meta: &ObjectMeta,
    labels: &BTreeMap<String, String>,
    finalizer: Option<&str>,
) -> Option<Vec<serde_json::Value>> {
    let finalizer = finalizer.filter(|_| meta.deletion_timestamp.is_none())?;
    let mut ops = crate::k8s::finalizer_patch(meta.finalizers.as_deref().unwrap_or_default(), finalizer, true);
    if ops.is_empty() {
        return None;
    }
    match meta.labels.as_ref().filter(|l| !l.is_empty()) {
        None => {
            ops.push(serde_json::json!({"op": "test", "path": "/metadata/labels", "value": meta.labels}));
            ops.push(serde_json::json!({"op": "add", "path": "/metadata/labels", "value": labels}));
        }
        Some(_) => {
            ops.extend(labels.iter().map(|(k, v)| serde_json::json!({"op": "add", "path": format!("/metadata/labels/{}", k.replace('~', "~0").replace('/', "~1")), "value": v})))
        }
    }
    Some(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new Stack's labels and finalizer go in one patch, each pinned by a test of what was read; no
    /// finalizer to add (none asked, held already, the object being deleted): no patch.
    #[test]
    fn a_label_patch_carries_the_finalizer_and_pins_what_it_read() {
        let labels = shard_labels("team", "web", 64);
        let fresh = ObjectMeta { name: Some("web".into()), ..Default::default() };
        let ops = label_patch(&fresh, &labels, Some(STACK_FINALIZER)).expect("a patch");
        assert_eq!(ops[0], serde_json::json!({"op": "test", "path": "/metadata/finalizers", "value": null}));
        assert_eq!(
            ops[1],
            serde_json::json!({"op": "add", "path": "/metadata/finalizers", "value": [STACK_FINALIZER]})
        );
        assert_eq!(ops[2], serde_json::json!({"op": "test", "path": "/metadata/labels", "value": null}));
        assert_eq!(ops[3], serde_json::json!({"op": "add", "path": "/metadata/labels", "value": labels}));
        let labelled = ObjectMeta {
            labels: Some([("app".to_string(), "web".to_string())].into()),
            finalizers: Some(vec!["other".into()]),
            ..fresh.clone()
        };
        let ops = label_patch(&labelled, &labels, Some(STACK_FINALIZER)).expect("a patch");
        assert_eq!(ops[0], serde_json::json!({"op": "test", "path": "/metadata/finalizers", "value": ["other"]}));
        assert_eq!(
            ops[2],
            serde_json::json!({"op": "add", "path": "/metadata/labels/pulumi.com~1shard", "value": labels[SHARD_LABEL]})
        );
        assert_eq!(
            ops[3],
            serde_json::json!({"op": "add", "path": "/metadata/labels/pulumi.com~1shards", "value": "64"})
        );
        assert_eq!(ops.len(), 4, "the user's labels are left as they are");
        assert!(label_patch(&fresh, &labels, None).is_none(), "no finalizer asked (Workspaces, Updates)");
        let held = ObjectMeta { finalizers: Some(vec![STACK_FINALIZER.into()]), ..fresh.clone() };
        assert!(label_patch(&held, &labels, Some(STACK_FINALIZER)).is_none());
        let deleting = ObjectMeta {
            deletion_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            )),
            ..fresh
        };
        assert!(
            label_patch(&deleting, &labels, Some(STACK_FINALIZER)).is_none(),
            "the API refuses new finalizers on a deleting object"
        );
    }

    #[test]
    fn shard_labels_name_the_shard_and_the_count_it_was_computed_for() {
        let labels = shard_labels("team", "web", 64);
        assert_eq!(labels[SHARD_LABEL], shard_of("team/web", 64).to_string());
        assert_eq!(labels[SHARDS_LABEL], "64");
        assert_eq!(labels.len(), 2);
        assert_eq!(unlabelled_selector(2048), "pulumi.com/shards!=2048");
        assert_eq!(misnumbered_selector(3), "pulumi.com/shards=3,pulumi.com/shard notin (0,1,2)");
        let selector = misnumbered_selector(2048);
        assert!(selector.len() < 10_000 && selector.ends_with(",2047)"), "{} bytes", selector.len());
    }

    #[test]
    fn an_object_is_misfiled_when_labelled_for_this_count_with_another_shard() {
        let own = shard_labels("team", "web", 64);
        let labels = |shard: &str, count: &str| {
            BTreeMap::from([
                (SHARD_LABEL.to_string(), shard.to_string()),
                (SHARDS_LABEL.to_string(), count.to_string()),
            ])
        };
        assert!(!misfiled(&own, "team", "web", 64), "its own labels");
        let other = (shard_of("team/web", 64) + 1) % 64;
        assert!(misfiled(&labels(&other.to_string(), "64"), "team", "web", 64), "copied from another Stack");
        assert!(misfiled(&labels("garbage", "64"), "team", "web", 64), "not a shard");
        assert!(
            !misfiled(&labels(&other.to_string(), "32"), "team", "web", 64),
            "another count: the labeller's business"
        );
        assert!(!misfiled(&BTreeMap::new(), "team", "web", 64), "unlabelled: the labeller's business");
        assert!(
            needs_labels(&BTreeMap::new(), "team", "web", 64) && needs_labels(&labels("1", "32"), "team", "web", 64)
        );
        assert!(needs_labels(&labels("garbage", "64"), "team", "web", 64) && !needs_labels(&own, "team", "web", 64));
    }

    #[test]
    fn the_holder_labels_at_once_and_the_others_only_what_it_left() {
        assert_eq!(label_delay(true), Duration::ZERO);
        assert_eq!(label_delay(false), LABEL_FALLBACK);
    }

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
