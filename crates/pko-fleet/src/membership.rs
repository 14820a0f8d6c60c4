//! A replica's membership in the fleet and the shards it holds.
//!
//! Each replica renews its membership Lease every [`FleetConfig::renew_interval`]; the others count it
//! live while they see its `renewTime` change within its `leaseDurationSeconds`, measured on their own
//! clock from when they saw the change (client-go's rule, immune to clock offsets). From the live
//! members, every replica computes the same desired holder of each shard ([`crate::ring`]) and, in
//! **one** resourceVersion-guarded write of the shard table ([`crate::table`]) per turn:
//! - takes the shards it should hold that are free, released, held by a member no longer live, or
//!   never taken (each one epoch later: the new fencing token);
//! - releases the shards another live member should hold, after it has stopped acting on them;
//! - drops at once a shard the table gives someone else.
//!
//! A write refused because another replica wrote the table since (409) is read fresh and planned
//! again; a handoff or a takeover costs each replica one or two writes, whatever the shard count.
//!
//! A replica that has not renewed its membership within [`FleetConfig::renew_deadline`] holds nothing
//! (checked on every [`Ownership::owns`], so a process that was frozen acts on nothing once it runs
//! again); others take its shards only after a full lease duration without a renewal, which is longer.
//! On shutdown a replica releases its membership (one write): its shards are free for the others at
//! once. At rest the fleet writes one membership renewal per replica per interval and nothing else.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::Ownership;
use crate::lease::{self, FLEET_LABEL, KIND_LABEL, LeaseKind, Written};
use crate::planning::*;
use crate::ring::{Ring, shard_of};
use crate::table::{Entry, ShardTable, TABLE_ANNOTATION};

/// How a replica takes part in the fleet.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Namespace of the Leases (the operator's).
    pub namespace: String,
    /// Name of the fleet (prefix of its Leases, value of their `pulumi.com/fleet` label).
    pub fleet: String,
    /// This replica's id (its pod name).
    pub replica: String,
    /// Number of virtual shards (every replica of a fleet must agree).
    pub shards: u32,
    /// How long a membership lasts without renewal before others take its shards.
    pub lease_duration: Duration,
    /// How often a replica renews its membership.
    pub renew_interval: Duration,
    /// A replica that could not renew within this long holds nothing (shorter than the duration).
    pub renew_deadline: Duration,
    /// More annotations of the membership Lease, asked anew at each renewal (the operator's load:
    /// what the replica says about itself, at no write beyond the renewal's).
    pub announce: Option<Announce>,
}

/// Annotations a replica announces on its membership Lease, computed at each renewal.
#[derive(Clone)]
pub struct Announce(pub Arc<dyn Fn() -> BTreeMap<String, String> + Send + Sync>);

impl std::fmt::Debug for Announce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Announce")
    }
}

impl FleetConfig {
    /// Defaults of client-go's leader election: 15 s duration, 10 s renew deadline; renewals every
    /// 5 s (0.2 writes per second per replica at rest).
    pub fn new(
        namespace: impl Into<String>,
        fleet: impl Into<String>,
        replica: impl Into<String>,
        shards: u32,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            fleet: fleet.into(),
            replica: replica.into(),
            shards,
            lease_duration: Duration::from_secs(15),
            renew_interval: Duration::from_secs(5),
            renew_deadline: Duration::from_secs(10),
            announce: None,
        }
    }
}

/// What a replica holds now, published on every change.
#[derive(Debug, Clone, Default)]
pub struct Held {
    /// Held shards and their epochs.
    pub shards: BTreeMap<u32, i64>,
    /// Live members as this replica last saw them (sorted).
    pub members: Vec<String>,
    /// Until when the holding is valid (the renew deadline of the last renewal); `None`: nothing held.
    pub valid_until: Option<Instant>,
    /// The membership lapses counted before this holding was built: only a renewal with the same
    /// count may advance `valid_until` (a holding from before a lapse is void).
    pub lapses: u64,
}

impl Held {
    /// The validity a successful renewal started at `started` (`until` = `started` + renew deadline)
    /// gives this holding at `now`, when it advances it: the renewal was counted after the same lapses
    /// as the holding, something is held, `until` is still ahead and later than the current validity.
    /// `None`: leave the holding as it is. Pure.
    pub fn advanced_by_renewal(&self, lapses: u64, until: Instant, now: Instant) -> Option<Instant> {
        let later = self.valid_until.is_none_or(|v| until > v);
        (lapses == self.lapses && !self.shards.is_empty() && until > now && later).then_some(until)
    }

    /// The epoch of `shard` if it is held and the holding still valid.
    pub fn epoch(&self, shard: u32) -> Option<i64> {
        self.valid_until.filter(|until| Instant::now() < *until).and_then(|_| self.shards.get(&shard).copied())
    }

    /// Until when (wall clock) `shard` is held validly: the renew deadline of the last renewal, or
    /// the Unix epoch (already past) when the shard is not held or the holding lapsed.
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
    shards: u32,
    held: watch::Receiver<Arc<Held>>,
    standing: watch::Receiver<Standing>,
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

/// Gauge of a replica standing by (1) or taking part (0): `pko_fleet_standing_by` — 1 while a live
/// member of the fleet runs with another `--shards` that prevails ([`standing`]).
pub const STANDING_BY: &str = "pko_fleet_standing_by";

/// Whether a watch event of the fleet's Leases is only about membership Leases (a renewal), so that
/// no shard Lease changed (pure). Re-lists count as changes.
fn member_event(fleet: &str, event: &watcher::Event<Lease>) -> bool {
    match event {
        watcher::Event::Apply(l) | watcher::Event::Delete(l) => {
            matches!(kind(fleet, l), Some(LeaseKind::Replica | LeaseKind::Member))
        }
        watcher::Event::Init | watcher::Event::InitApply(_) | watcher::Event::InitDone => false,
    }
}

/// The kind of `lease` in `fleet`, by its name (the cache keeps no labels: [`lease::slim`]).
fn kind(fleet: &str, lease: &Lease) -> Option<LeaseKind> {
    LeaseKind::of(fleet, lease.metadata.name.as_deref()?)
}

/// A replica's membership: run [`Fleet::run`] until shutdown; [`ShardOwnership`] tells the
/// controllers what it holds.
pub struct Fleet {
    cfg: FleetConfig,
    api: Api<Lease>,
    /// The Leases' watch: through a client without a read timeout ([`Fleet::with_watch_client`]).
    watch_api: Api<Lease>,
    ring: Arc<dyn Ring>,
    held: watch::Sender<Arc<Held>>,
    standing: watch::Sender<Standing>,
}

/// The validity a publish gives (pure): `proposed` (from the last renewal the main loop read), or the
/// current one when a renewal advanced it meanwhile (same lapses, later); `None` stays `None`.
fn published_validity(current: &Held, lapses: u64, proposed: Option<Instant>) -> Option<Instant> {
    let proposed = proposed?;
    Some(match current.valid_until {
        Some(c) if current.lapses == lapses && c > proposed => c,
        _ => proposed,
    })
}

/// Renews (or creates) `cfg.replica`'s membership Lease; `true` when it was written.
async fn renew(
    api: &Api<Lease>,
    cfg: &FleetConfig,
    labels: BTreeMap<String, String>,
    store: &reflector::Store<Lease>,
) -> bool {
    let name = lease::replica_name(&cfg.fleet, &cfg.replica);
    let secs = cfg.lease_duration.as_secs().max(1) as i32;
    let current = store.get(&reflector::ObjectRef::new(&name).within(&cfg.namespace));
    let mut announce = lease::announcing(cfg.shards);
    if let Some(more) = &cfg.announce {
        announce.extend((more.0)());
    }
    let written = match current {
        Some(l) => {
            lease::replace_announcing(api, &l, LeaseKind::Member, &announce, |s| lease::renew(s, &cfg.replica, secs))
                .await
        }
        None => {
            lease::create_announcing(api, &name, labels, announce.clone(), lease::member_spec(&cfg.replica, secs)).await
        }
    };
    match written {
        Ok(Written::Done(_)) => true,
        Ok(Written::Conflict) => {
            // our cached copy is stale: read it and try once more
            match api.get_opt(&name).await {
                Ok(Some(l)) => matches!(
                    lease::replace_announcing(api, &l, LeaseKind::Member, &announce, |s| lease::renew(
                        s,
                        &cfg.replica,
                        secs
                    ))
                    .await,
                    Ok(Written::Done(_))
                ),
                _ => false,
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "membership renewal failed");
            false
        }
    }
}

/// What a turn's steps act on: the shard table of this replica's count as planned from (the cached
/// Lease with this replica's own write overlaid; `None`: never written), decoded, and the epochs of
/// the shard Leases of an earlier version (a take goes above them).
struct Planned {
    lease: Option<Arc<Lease>>,
    table: ShardTable,
    earlier_epochs: BTreeMap<u32, i64>,
}

/// The fleet's cached Leases by kind (pure).
#[derive(Default)]
struct ByKind<'a> {
    /// Membership Leases of this version.
    replicas: Vec<&'a Lease>,
    /// Membership Leases of an earlier version.
    members: Vec<&'a Lease>,
    /// Shard tables by shard count.
    tables: BTreeMap<u32, Arc<Lease>>,
    /// An earlier version's shard Leases: their epochs.
    earlier_epochs: BTreeMap<u32, i64>,
}

impl<'a> ByKind<'a> {
    fn of(fleet: &str, leases: &'a [Arc<Lease>]) -> Self {
        let mut by = Self::default();
        for l in leases {
            match kind(fleet, l) {
                Some(LeaseKind::Replica) => by.replicas.push(l),
                Some(LeaseKind::Member) => by.members.push(l),
                Some(LeaseKind::Table(n)) => {
                    by.tables.insert(n, l.clone());
                }
                Some(LeaseKind::Shard(k)) => {
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
fn table_of(lease: Option<&Arc<Lease>>) -> Result<ShardTable, crate::table::TableError> {
    lease.map_or(Ok(ShardTable::default()), |l| ShardTable::of(l))
}

/// The fleet's Leases as [`Fleet::run`] watches them.
struct Leases {
    store: reflector::Store<Lease>,
    /// Notified at every watch event.
    changed: Arc<Notify>,
    /// Set by every event that may change a shard Lease.
    shards_changed: Arc<AtomicBool>,
    watch: tokio::task::JoinHandle<()>,
}

/// What [`Fleet::run`] carries from one turn to the next.
#[derive(Default)]
struct Turn {
    liveness: Liveness,
    /// The shards held, with their epochs.
    shards: BTreeMap<u32, i64>,
    /// Shard tables (by count) written here, or read fresh after a refused write, that the cache may
    /// not show yet.
    own: BTreeMap<u32, OwnWrite>,
    /// The ring's members and its desired holders, kept while the members stay.
    ring_cache: Option<(BTreeSet<String>, Vec<String>)>,
    /// The live members, standing and held shards of the last plan that had no step, while no shard
    /// table changed since: planning again from them would find no step either.
    settled: Option<(Vec<LiveMember>, Standing, BTreeMap<u32, i64>)>,
    live: BTreeSet<String>,
    /// The live member of another shard count whose shards this replica waits for, as last logged.
    waiting_for: Option<(String, u32)>,
    /// The lapses the current holding was built after.
    accepted_lapses: u64,
    /// The resourceVersion of this count's table last logged as undecodable (logged once per version,
    /// not once a turn).
    undecodable: Option<String>,
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The last successful membership renewal as the renewer saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Renewal {
    /// When it was *started* (the conservative start of its validity).
    started: Instant,
    /// Lapses so far: successful renewals that started more than the renew deadline after the one
    /// before (this process was frozen, or the API server unreachable, in between). A holding built
    /// before a lapse is void, whatever the cached Leases still say.
    lapses: u64,
}

/// Whether a successful renewal started at `started` follows the previous successful one (`previous`)
/// by more than `deadline`: the holding lapsed in between (pure).
fn lapsed(previous: Option<Instant>, started: Instant, deadline: Duration) -> bool {
    previous.is_some_and(|p| started.saturating_duration_since(p) > deadline)
}

/// Renews the membership every `cfg.renew_interval` on its own task until aborted, so that taking or
/// releasing many shards (seconds of Lease writes on a busy API server) never delays it: a renewal
/// late by more than the lease duration would make the others take every shard of a live replica.
/// Sends each successful renewal; lapses are counted here, between consecutive renewals, not where
/// they are observed (a main loop busy writing Leases for longer than the deadline sees renewals
/// seconds apart without any lapse). Each renewal also advances the validity of the published holding
/// itself ([`Held::advanced_by_renewal`]): a main loop busy releasing or taking hundreds of shards for
/// longer than the deadline publishes nothing meanwhile, and its last publish would otherwise expire by
/// the clock and fence every shard the replica still holds (found by `loadtest/failover.sh`: a
/// replica releasing 400 shards to a rejoining one on a saturated API server held nothing for 10 s).
fn spawn_renewer(
    api: Api<Lease>,
    cfg: FleetConfig,
    labels: BTreeMap<String, String>,
    store: reflector::Store<Lease>,
    renewed: watch::Sender<Option<Renewal>>,
    held: watch::Sender<Arc<Held>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lapses = 0;
        let mut previous = None;
        loop {
            let started = Instant::now();
            if renew(&api, &cfg, labels.clone(), &store).await {
                if lapsed(previous, started, cfg.renew_deadline) {
                    lapses += 1;
                }
                previous = Some(started);
                // first the renewal (what the main loop's publishes compute from), then the holding
                renewed.send_replace(Some(Renewal { started, lapses }));
                let until = started + cfg.renew_deadline;
                held.send_if_modified(|h| match h.advanced_by_renewal(lapses, until, Instant::now()) {
                    Some(v) => {
                        Arc::make_mut(h).valid_until = Some(v);
                        true
                    }
                    None => false,
                });
            }
            tokio::time::sleep_until((started + cfg.renew_interval).into()).await;
        }
    })
}

impl Fleet {
    /// A member of `cfg.fleet` using `ring`, and the ownership it publishes.
    pub fn new(client: kube::Client, cfg: FleetConfig, ring: Arc<dyn Ring>) -> (Self, ShardOwnership) {
        let (held, rx) = watch::channel(Arc::new(Held::default()));
        let (standing, standing_rx) = watch::channel(Standing::Active);
        let api = Api::namespaced(client, &cfg.namespace);
        let ownership = ShardOwnership { shards: cfg.shards, held: rx, standing: standing_rx };
        (Self { cfg, watch_api: api.clone(), api, ring, held, standing }, ownership)
    }

    /// Watches the Leases through `client` — one without a read timeout, where the writes' client has
    /// one (`--kube-api-timeout`): a watch quiet for longer than that timeout would be cut and resumed,
    /// or listed again once its resourceVersion has expired.
    #[must_use]
    pub fn with_watch_client(mut self, client: kube::Client) -> Self {
        self.watch_api = Api::namespaced(client, &self.cfg.namespace);
        self
    }

    fn labels(&self, kind: &str) -> BTreeMap<String, String> {
        [(FLEET_LABEL.to_string(), self.cfg.fleet.clone()), (KIND_LABEL.to_string(), kind.to_string())].into()
    }

    /// Publishes `shards` held after `lapses`, valid until `valid_until` (or later, when the renewer
    /// advanced the current holding meanwhile).
    fn publish(
        &self,
        shards: &BTreeMap<u32, i64>,
        members: &BTreeSet<String>,
        valid_until: Option<Instant>,
        lapses: u64,
    ) {
        // only a change wakes the receivers (the queue's shard follower, the selector publisher)
        self.held.send_if_modified(|h| {
            let valid_until = published_validity(h, lapses, valid_until).filter(|_| !shards.is_empty());
            let same = h.valid_until == valid_until
                && h.lapses == lapses
                && h.shards == *shards
                && h.members.iter().eq(members.iter());
            if !same {
                *h = Arc::new(Held {
                    shards: shards.clone(),
                    members: members.iter().cloned().collect(),
                    valid_until,
                    lapses,
                });
            }
            !same
        });
    }

    /// Takes part in the fleet until `shutdown`: renews the membership, takes and releases shards.
    /// On shutdown it holds nothing and releases its membership, so the others take its shards at once.
    pub async fn run(self, shutdown: CancellationToken) {
        lease::init_write_counters();
        let leases = self.watch_leases();
        if leases.store.wait_until_ready().await.is_err() {
            return;
        }
        let (renewed_tx, mut renewed) = watch::channel(None::<Renewal>);
        // aborted with this future too (a task aborted mid-run, as a crash): no renewal outlives it
        let renewer = AbortOnDrop(spawn_renewer(
            self.api.clone(),
            self.cfg.clone(),
            self.labels("member"),
            leases.store.clone(),
            renewed_tx,
            self.held.clone(),
        ));
        let mut turn = Turn::default();
        loop {
            // marked seen here: `renewed.changed()` below wakes only for a newer renewal
            let current = *renewed.borrow_and_update();
            self.turn(&mut turn, current, &leases, &renewed, &shutdown).await;
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = leases.changed.notified() => {}
                Ok(()) = renewed.changed() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
        drop(renewer);
        self.leave(turn.accepted_lapses).await;
        leases.watch.abort();
    }

    /// The fleet's Leases, watched into a store: `changed` is notified at every event, `shards_changed`
    /// set by every event that may change a shard Lease (anything but a member's renewal) — only then,
    /// or when the live members or the held shards changed, is the plan worked out again.
    fn watch_leases(&self) -> Leases {
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

    /// One turn, after the renewal `current`: accept a lapse (hold nothing), or — while the
    /// membership is valid — plan and apply the steps, then publish what is held.
    async fn turn(
        &self,
        t: &mut Turn,
        current: Option<Renewal>,
        leases: &Leases,
        renewed: &watch::Receiver<Option<Renewal>>,
        shutdown: &CancellationToken,
    ) {
        // a renewal after a lapse (this process was frozen, or the API server unreachable, for longer
        // than the deadline): hold nothing; shards come back only through resourceVersion-guarded
        // takes, which fail for a Lease another replica wrote meanwhile.
        if let Some(r) = current
            && r.lapses != t.accepted_lapses
        {
            if !t.shards.is_empty() {
                tracing::warn!(held = t.shards.len(), "membership lapsed between renewals: holding nothing");
                t.shards.clear();
            }
            t.accepted_lapses = r.lapses;
            self.publish(&t.shards, &t.live, None, t.accepted_lapses);
        }
        if self.valid_until(renewed, t.accepted_lapses).is_none() {
            if !t.shards.is_empty() {
                tracing::warn!(held = t.shards.len(), "membership not renewed within its deadline: holding nothing");
                t.shards.clear();
            }
            self.publish(&t.shards, &t.live, None, t.accepted_lapses);
            return;
        }
        // read before the store: a change after this read sets it again for the next turn
        let shard_leases_changed = leases.shards_changed.swap(false, Ordering::SeqCst);
        let state = leases.store.state();
        if let Some((steps, planned)) = self.plan_turn(t, &state, shard_leases_changed) {
            let live = t.live.clone();
            self.apply(steps, &planned, &mut t.shards, &live, (renewed, t.accepted_lapses, shutdown), &mut t.own).await;
        }
        self.publish(&t.shards, &t.live, self.valid_until(renewed, t.accepted_lapses), t.accepted_lapses);
    }

    /// The steps of this turn and the table they act on, from the cached `leases`; `None` when the
    /// inputs are those of the last plan that had nothing to do and no table changed since, or when
    /// this count's table does not decode (logged: nothing is taken or released from it).
    fn plan_turn(&self, t: &mut Turn, leases: &[Arc<Lease>], tables_changed: bool) -> Option<(Vec<Step>, Planned)> {
        let by = ByKind::of(&self.cfg.fleet, leases);
        t.live = t.liveness.live(by.replicas.iter().chain(by.members.iter()).copied(), Instant::now());
        t.live.insert(self.cfg.replica.clone());
        let (me, mine) = (self.cfg.replica.as_str(), self.cfg.shards);
        let infos = live_members(me, mine, by.replicas.iter().copied(), &t.live);
        let earlier = by.members.iter().filter_map(|l| lease::holder(l)).find(|h| t.live.contains(*h));
        let now_standing = match earlier {
            Some(member) => Standing::Earlier { member: member.to_string() },
            None => standing(mine, &infos),
        };
        self.stand(&now_standing);
        // the ring spans the live members of this replica's count (and those announcing none)
        let peers: BTreeSet<String> =
            infos.iter().filter(|m| m.shards.is_none_or(|n| n == mine)).map(|m| m.name.clone()).collect();
        if t.ring_cache.as_ref().is_none_or(|(set, _)| *set != peers) {
            t.ring_cache = Some((peers.clone(), self.ring.assign(mine, &peers.iter().cloned().collect::<Vec<_>>())));
        }
        // the same inputs as the last plan that had nothing to do: nothing to do again
        if !tables_changed
            && t.settled.as_ref().is_some_and(|(l, st, s)| *l == infos && *st == now_standing && *s == t.shards)
        {
            return None;
        }
        let tables = with_own_writes(by.tables, &mut t.own);
        let table = match table_of(tables.get(&mine)) {
            Ok(table) => table,
            Err(e) => {
                let version = tables.get(&mine).and_then(|l| l.metadata.resource_version.clone());
                if t.undecodable != version {
                    tracing::error!(error = %e, table = %lease::table_name(&self.cfg.fleet, mine), "taking and releasing nothing until the shard table is readable");
                    t.undecodable = version;
                }
                return None;
            }
        };
        let steps = match now_standing {
            Standing::Active => self.active_steps(t, &infos, &table, &tables),
            _ => stand_down(me, &table.0, &t.shards),
        };
        t.settled = steps.is_empty().then(|| (infos.clone(), now_standing, t.shards.clone()));
        Some((steps, Planned { lease: tables.get(&mine).cloned(), table, earlier_epochs: by.earlier_epochs }))
    }

    /// The steps of an active replica: the plan, with takes held back while a live member of another
    /// shard count still holds shards in its count's table (logged once per holder).
    fn active_steps(
        &self,
        t: &mut Turn,
        infos: &[LiveMember],
        table: &ShardTable,
        tables: &BTreeMap<u32, Arc<Lease>>,
    ) -> Vec<Step> {
        let (me, mine) = (self.cfg.replica.as_str(), self.cfg.shards);
        let desired = t.ring_cache.as_ref().map(|(_, d)| d.as_slice()).unwrap_or_default();
        let mut steps = plan(me, desired, &table.0, &t.live, &t.shards);
        let others: Vec<Entry> = tables
            .iter()
            .filter(|(n, _)| **n != mine)
            .flat_map(|(_, l)| table_of(Some(l)).map(|t| t.0.into_values().collect::<Vec<_>>()).unwrap_or_default())
            .collect();
        let blocker = holding_another_count(mine, infos, &others);
        if blocker.is_some() {
            // shards of another count are still held: take nothing until released
            steps.retain(|s| matches!(s, Step::Release(_) | Step::Drop(_)));
        }
        if blocker != t.waiting_for {
            if let Some((holder, n)) = &blocker {
                tracing::info!(holder = %holder, holder_shards = n, shards = mine, "a live member of another shard count still holds shards: taking none until it has released them");
            }
            t.waiting_for = blocker;
        }
        steps
    }

    /// Leaves the fleet: holds nothing, then releases the membership (successors need not wait for it
    /// to expire; they take its shards from the table at once).
    async fn leave(&self, accepted_lapses: u64) {
        self.publish(&BTreeMap::new(), &BTreeSet::new(), None, accepted_lapses);
        let name = lease::replica_name(&self.cfg.fleet, &self.cfg.replica);
        if let Ok(Some(l)) = self.api.get_opt(&name).await {
            let _ = lease::replace(&self.api, &l, LeaseKind::Replica, lease::release).await;
        }
    }

    /// Publishes `now` as this replica's standing when it changed, with a log line and
    /// [`STANDING_BY`].
    fn stand(&self, now: &Standing) {
        // set on every plan, so that the series exists from the first one on
        metrics::gauge!(STANDING_BY).set(if *now == Standing::Active { 0.0 } else { 1.0 });
        let changed = self.standing.send_if_modified(|s| {
            let changed = s != now;
            if changed {
                s.clone_from(now);
            }
            changed
        });
        if !changed {
            return;
        }
        match now {
            Standing::StandingBy { prevailing, eldest } => tracing::warn!(
                shards = self.cfg.shards,
                prevailing,
                eldest = %eldest,
                "standing by: the fleet runs with --shards={prevailing} (its eldest live member {eldest}), this replica with --shards={}; holding no shard until every replica of the other count has gone",
                self.cfg.shards
            ),
            Standing::Earlier { member } => tracing::warn!(
                member = %member,
                "standing by: {member} runs an earlier version of the operator, which holds shards through one Lease per shard; holding no shard until every replica of that version has gone (a rolling upgrade hands every shard over when its last replica stops)"
            ),
            Standing::Active => tracing::info!(
                shards = self.cfg.shards,
                "this replica's shard count prevails in the fleet: taking part"
            ),
        }
    }

    /// Until when what this replica holds is valid: the renew deadline after the start of its last
    /// successful renewal (`renewed`), if still ahead and no lapse happened since the holding was built
    /// (`accepted_lapses`): a holding from before a lapse is never published as valid again.
    fn valid_until(&self, renewed: &watch::Receiver<Option<Renewal>>, accepted_lapses: u64) -> Option<Instant> {
        renewed
            .borrow()
            .filter(|r| r.lapses == accepted_lapses)
            .map(|r| r.started + self.cfg.renew_deadline)
            .filter(|u| *u > Instant::now())
    }

    /// Carries out `steps` in one write of the table: drops and releases stop at once (published
    /// before the write), takes count once the write is done. A replica shutting down takes nothing.
    /// A write refused (409: the table was written since it was read) or failed changes nothing held
    /// but the drops and releases; the table is read fresh and the next turn plans again.
    async fn apply(
        &self,
        steps: Vec<Step>,
        planned: &Planned,
        shards: &mut BTreeMap<u32, i64>,
        live: &BTreeSet<String>,
        (renewed, accepted_lapses, shutdown): (&watch::Receiver<Option<Renewal>>, u64, &CancellationToken),
        own: &mut BTreeMap<u32, OwnWrite>,
    ) {
        let (mut releases, mut takes) = (Vec::new(), Vec::new());
        for step in steps {
            match step {
                Step::Drop(k) => {
                    shards.remove(&k);
                }
                Step::Release(k) => {
                    shards.remove(&k);
                    releases.push(k);
                }
                Step::Take(k) => takes.push(k),
            }
        }
        if !releases.is_empty() {
            // nobody acts on them any more before the table says so
            self.publish(shards, live, self.valid_until(renewed, accepted_lapses), accepted_lapses);
        }
        // a replica shutting down takes nothing: what it took would only be handed on again
        if shutdown.is_cancelled() {
            takes.clear();
        }
        if releases.is_empty() && takes.is_empty() {
            return;
        }
        let me = self.cfg.replica.as_str();
        let next = planned.table.changed(me, &takes, &releases, &planned.earlier_epochs);
        let started = Instant::now();
        let before = planned.lease.as_ref().and_then(|l| l.metadata.resource_version.clone());
        match self.write_table(planned.lease.as_deref(), &next).await {
            Ok(Written::Done(l)) => {
                own.insert(self.cfg.shards, own_write(before, *l));
                shards.extend(takes.iter().filter_map(|k| Some((*k, next.0.get(k)?.epoch))));
                let seconds = started.elapsed().as_secs_f64();
                tracing::info!(
                    taken = takes.len(),
                    released = releases.len(),
                    held = shards.len(),
                    seconds,
                    "shard table written"
                );
            }
            Ok(Written::Conflict) => {
                tracing::info!(
                    taking = takes.len(),
                    releasing = releases.len(),
                    "the shard table was written by another replica since it was read: reading it again"
                );
                let name = lease::table_name(&self.cfg.fleet, self.cfg.shards);
                if let Ok(Some(fresh)) = self.api.get_opt(&name).await {
                    own.insert(self.cfg.shards, own_write(before, fresh));
                }
            }
            Err(e) => tracing::warn!(error = %e, "writing the shard table failed"),
        }
    }

    /// Writes `next` as this replica's count's shard table: a guarded merge patch of its annotation
    /// over `read`, or a create when there is none ([`Written::Conflict`] if it exists by then).
    ///
    /// Errors: the API server's, except 409.
    async fn write_table(&self, read: Option<&Lease>, next: &ShardTable) -> Result<Written, kube::Error> {
        let annotations = BTreeMap::from([(TABLE_ANNOTATION.to_string(), next.encode())]);
        match read {
            Some(l) => {
                lease::replace_announcing(&self.api, l, LeaseKind::Table(self.cfg.shards), &annotations, |_| {}).await
            }
            None => {
                let name = lease::table_name(&self.cfg.fleet, self.cfg.shards);
                lease::create_announcing(&self.api, &name, self.labels("table"), annotations, Default::default()).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planning::tests::lease;

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
    fn a_lapse_is_a_gap_between_two_successful_renewals_longer_than_the_deadline() {
        let t0 = Instant::now();
        let deadline = Duration::from_secs(10);
        assert!(!lapsed(None, t0, deadline), "the first renewal");
        assert!(!lapsed(Some(t0), t0 + Duration::from_secs(5), deadline), "on time");
        assert!(!lapsed(Some(t0), t0 + deadline, deadline), "at the deadline exactly");
        assert!(lapsed(Some(t0), t0 + Duration::from_secs(15), deadline), "two renewals failed in between, or frozen");
    }

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
