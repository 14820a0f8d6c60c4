//! A replica's membership in the fleet and the shards it holds.
//!
//! Each replica renews its membership Lease every [`FleetConfig::renew_interval`]; the others count it
//! live while they see its `renewTime` change within its `leaseDurationSeconds`, measured on their own
//! clock from when they saw the change (client-go's rule, immune to clock offsets). From the live
//! members, every replica computes the same desired holder of each shard ([`crate::ring`]) and:
//! - takes a shard it should hold when its Lease is free, released, held by a member no longer live,
//!   or missing (resourceVersion-guarded, one transition later: the new epoch);
//! - releases a shard another live member should hold, after it has stopped acting on it;
//! - drops at once a shard whose Lease names someone else.
//!
//! A replica that has not renewed its membership within [`FleetConfig::renew_deadline`] holds nothing
//! (checked on every [`Ownership::owns`], so a process that was frozen acts on nothing once it runs
//! again); others take its shards only after a full lease duration without a renewal, which is longer.
//! On shutdown a replica releases its membership (one write): its shards are free for the others at
//! once. At rest the fleet writes one membership renewal per replica per interval and nothing else.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::lease::{self, FLEET_LABEL, KIND_LABEL, LeaseKind, SHARD_LABEL, Written};
use crate::ring::{Ring, shard_of};
use crate::{Backlog, Ownership};

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
}

impl FleetConfig {
    /// Defaults of client-go's leader election: 15 s duration, 10 s renew deadline; renewals every
    /// 5 s (0.2 writes per second per replica at rest).
    pub fn new(namespace: impl Into<String>, fleet: impl Into<String>, replica: impl Into<String>, shards: u32) -> Self {
        Self {
            namespace: namespace.into(),
            fleet: fleet.into(),
            replica: replica.into(),
            shards,
            lease_duration: Duration::from_secs(15),
            renew_interval: Duration::from_secs(5),
            renew_deadline: Duration::from_secs(10),
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
            Some(until) if now < until && self.shards.contains_key(&shard) => std::time::SystemTime::now() + (until - now),
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

/// Who is live, by watching membership Leases change (pure: the caller passes the clock).
#[derive(Debug, Default)]
pub struct Liveness {
    seen: HashMap<String, (Option<String>, Instant)>,
    /// When [`Liveness::live`] last looked.
    looked: Option<Instant>,
}

/// Longest time [`Liveness::live`] may go without looking before what it saw counts for nothing: a
/// process frozen (SIGSTOP, a paused VM) or starved longer did not watch the members renew meanwhile,
/// so it cannot tell who stopped renewing — it watches again for a full lease before judging anyone dead.
pub const BLIND_AFTER: Duration = Duration::from_secs(3);

impl Liveness {
    /// The live members among membership Leases `members` at `now`: a holder whose `renewTime`
    /// changed less than its `leaseDurationSeconds` ago (as first seen here), not released. After a
    /// gap of more than [`BLIND_AFTER`] since the last look, every member counts as just seen: a member
    /// is dead only once this process has watched it go un-renewed for a full lease on its own clock.
    pub fn live<'a>(&mut self, members: impl IntoIterator<Item = &'a Lease>, now: Instant) -> BTreeSet<String> {
        if self.looked.is_some_and(|t| now.saturating_duration_since(t) > BLIND_AFTER) {
            for entry in self.seen.values_mut() {
                entry.1 = now;
            }
        }
        self.looked = Some(now);
        let mut live = BTreeSet::new();
        for l in members {
            let Some(holder) = lease::holder(l) else { continue };
            let spec = l.spec.as_ref();
            let renewed = spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0.to_string());
            let duration = Duration::from_secs(spec.and_then(|s| s.lease_duration_seconds).unwrap_or(15).max(1) as u64);
            let entry = self.seen.entry(holder.to_string()).or_insert_with(|| (renewed.clone(), now));
            if entry.0 != renewed {
                *entry = (renewed, now);
            }
            if now.saturating_duration_since(entry.1) < duration {
                live.insert(holder.to_string());
            }
        }
        live
    }
}

/// A live member as its membership Lease shows it: the shard count it announces
/// ([`lease::SHARDS_ANNOTATION`]; `None`: a replica older than the announcement) and since when it is a
/// member (`acquireTime`; `None`: not known yet, counted as the youngest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveMember {
    /// The replica's id (`holderIdentity`).
    pub name: String,
    /// The shard count it runs with.
    pub shards: Option<u32>,
    /// When it became a member.
    pub since: Option<k8s_openapi::jiff::Timestamp>,
}

/// What a replica may do, given the shard counts its fleet's live members announce.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Standing {
    /// Its count prevails: it takes part in holding shards.
    #[default]
    Active,
    /// Another count prevails: it holds nothing (and releases what it held), so that replicas of two
    /// counts never hold shards at once; it takes part again once its count prevails.
    StandingBy {
        /// The prevailing count.
        prevailing: u32,
        /// The eldest live member, which announces it.
        eldest: String,
    },
}

/// Whether `mine` prevails among the live `members` (pure): the count of the eldest member announcing
/// one prevails (earliest `since`, then the smaller name; an unknown `since` is the youngest). A fleet
/// whose `--shards` changes by a rolling update keeps its old count until the last replica running it
/// has gone, then the new one — never both: a replica of the new count starts taking only once no live
/// member of another count holds a shard ([`holding_another_count`]). Members announcing no count are
/// taken to agree with everyone.
pub fn standing(mine: u32, members: &[LiveMember]) -> Standing {
    let key = |m: &&LiveMember| (m.since.is_none(), m.since, m.name.clone());
    match members.iter().filter(|m| m.shards.is_some()).min_by_key(key) {
        Some(LiveMember { name, shards: Some(n), .. }) if *n != mine => Standing::StandingBy { prevailing: *n, eldest: name.clone() },
        _ => Standing::Active,
    }
}

/// A live member announcing a count other than `mine` that holds a shard Lease among `leases`, with its
/// count (pure). While there is one, a replica takes no shard: an object's shard under one count and
/// under another are different Leases, so holders of two counts could both own it.
pub fn holding_another_count(mine: u32, members: &[LiveMember], leases: &BTreeMap<u32, Arc<Lease>>) -> Option<(String, u32)> {
    let others: HashMap<&str, u32> = members.iter().filter_map(|m| m.shards.filter(|n| *n != mine).map(|n| (m.name.as_str(), n))).collect();
    if others.is_empty() {
        return None;
    }
    leases.values().filter_map(|l| lease::holder(l)).find_map(|h| others.get(h).map(|n| (h.to_string(), *n)))
}

/// The steps of replica `me` standing by (pure): let go of every shard it holds and release every
/// Lease still naming it (drop, without a write, a held shard whose Lease names someone else).
pub fn stand_down(me: &str, leases: &BTreeMap<u32, Arc<Lease>>, held: &BTreeMap<u32, i64>) -> Vec<Step> {
    let mut steps: Vec<Step> = held.keys().filter(|k| leases.get(k).and_then(|l| lease::holder(l)) != Some(me)).map(|k| Step::Drop(*k)).collect();
    steps.extend(leases.iter().filter(|(_, l)| lease::holder(l) == Some(me)).map(|(k, _)| Step::Release(*k)));
    steps
}

/// The live members among the fleet's membership Leases `members`, named in `live`, as
/// [`LiveMember`]s; `me` announces `mine` whatever its Lease shows yet (pure).
pub fn live_members<'a>(me: &str, mine: u32, members: impl IntoIterator<Item = &'a Lease>, live: &BTreeSet<String>) -> Vec<LiveMember> {
    let mut out: Vec<LiveMember> = members
        .into_iter()
        .filter_map(|l| {
            let name = lease::holder(l).filter(|h| live.contains(*h))?.to_string();
            let since = l.spec.as_ref().and_then(|s| s.acquire_time.as_ref()).map(|t| t.0);
            let shards = if name == me { Some(mine) } else { lease::announced_shards(l) };
            Some(LiveMember { name, shards, since })
        })
        .collect();
    if !out.iter().any(|m| m.name == me) {
        out.push(LiveMember { name: me.to_string(), shards: Some(mine), since: None });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup_by(|a, b| a.name == b.name);
    out
}

/// Gauge of a replica standing by (1) or taking part (0): `pko_fleet_standing_by` — 1 while a live
/// member of the fleet runs with another `--shards` that prevails ([`standing`]).
pub const STANDING_BY: &str = "pko_fleet_standing_by";

/// Whether a watch event of the fleet's Leases is only about membership Leases (a renewal), so that
/// no shard Lease changed (pure). Re-lists count as changes.
fn member_event(fleet: &str, event: &watcher::Event<Lease>) -> bool {
    match event {
        watcher::Event::Apply(l) | watcher::Event::Delete(l) => kind(fleet, l) == Some(LeaseKind::Member),
        watcher::Event::Init | watcher::Event::InitApply(_) | watcher::Event::InitDone => false,
    }
}

/// The kind of `lease` in `fleet`, by its name (the cache keeps no labels: [`lease::slim`]).
fn kind(fleet: &str, lease: &Lease) -> Option<LeaseKind> {
    LeaseKind::of(fleet, lease.metadata.name.as_deref()?)
}

/// A shard Lease this replica wrote that its cache may not show yet: the resourceVersion the write was
/// guarded by (`None` for a create) and the Lease as written ([`lease::slim`]).
#[derive(Debug, Clone)]
pub struct OwnWrite {
    /// The resourceVersion the cache showed when the write was made (`None`: no Lease, a create).
    pub before: Option<String>,
    /// The Lease as the API server returned it.
    pub written: Arc<Lease>,
}

/// The shard Leases a plan reads (pure): `cached`, except where this replica wrote a Lease the cache
/// still shows as it was before that write (`own`, whose entries the cache has caught up with are
/// retired). Watch events arrive in order, so a cache showing any other version than the one a write
/// was guarded by shows that write or a later one. Planning from the cache alone, a replica that had
/// just taken shards saw their Leases still naming the old holder, dropped them, and took them again
/// at a new epoch (fencing their running operations), in every formation and takeover.
pub fn with_own_writes(mut cached: BTreeMap<u32, Arc<Lease>>, own: &mut BTreeMap<u32, OwnWrite>) -> BTreeMap<u32, Arc<Lease>> {
    own.retain(|k, w| cached.get(k).and_then(|l| l.metadata.resource_version.clone()) == w.before);
    for (k, w) in own.iter() {
        cached.insert(*k, w.written.clone());
    }
    cached
}

/// `written` (slimmed) as this replica's own write over the version `before`.
fn own_write(before: Option<String>, mut written: Lease) -> OwnWrite {
    lease::slim(&mut written);
    OwnWrite { before, written: Arc::new(written) }
}

/// One step of a replica towards the desired assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Create the missing Lease of the shard, held by this replica.
    Create(u32),
    /// Take the shard's Lease (free, or its holder is not live).
    Take(u32),
    /// Stop acting on the shard, then release its Lease to the live member that should hold it.
    Release(u32),
    /// Stop acting on the shard at once: its Lease names someone else.
    Drop(u32),
}

/// The steps of replica `me` (pure): `desired` holder per shard, shard Leases by shard, `live`
/// members, and what `me` holds.
pub fn plan(me: &str, desired: &[String], leases: &BTreeMap<u32, Arc<Lease>>, live: &BTreeSet<String>, held: &BTreeMap<u32, i64>) -> Vec<Step> {
    let mut steps = Vec::new();
    for (shard, want) in desired.iter().enumerate() {
        let shard = shard as u32;
        let lease = leases.get(&shard);
        let holder = lease.and_then(|l| lease::holder(l));
        if held.contains_key(&shard) {
            if holder != Some(me) {
                steps.push(Step::Drop(shard));
            } else if want != me && live.contains(want) {
                steps.push(Step::Release(shard));
            }
        } else if holder == Some(me) && want != me {
            // the Lease still names us (a release that failed, or an earlier life): let it go
            steps.push(Step::Release(shard));
        } else if want == me {
            match (lease, holder) {
                (None, _) => steps.push(Step::Create(shard)),
                (Some(_), None) => steps.push(Step::Take(shard)),
                (Some(_), Some(h)) if h == me || !live.contains(h) => steps.push(Step::Take(shard)),
                (Some(_), Some(_)) => {} // a live member holds it: it releases when it sees us
            }
        }
    }
    steps
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
    backlog: Option<Arc<dyn Backlog>>,
}

/// How long a takeover waits for the [`Backlog`] before taking in shard order.
pub const BACKLOG_TIMEOUT: Duration = Duration::from_secs(2);

/// `takes` in the order they are taken, chunked (pure): the shards with work (`urgent`) first, in
/// chunks of their own, then the others, at most `chunk` shards per chunk. Each chunk is published
/// once written.
pub fn take_order(takes: &[u32], urgent: &BTreeSet<u32>, chunk: usize) -> Vec<Vec<u32>> {
    let (first, rest): (Vec<u32>, Vec<u32>) = takes.iter().partition(|k| urgent.contains(k));
    first.chunks(chunk.max(1)).chain(rest.chunks(chunk.max(1))).map(<[u32]>::to_vec).collect()
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

/// Shard Leases written at once while taking or releasing many (a fleet's first start takes S).
const WRITE_CONCURRENCY: usize = 32;

/// Shards taken per published step: ownership of the first ones is published while the rest are
/// still being written.
const TAKE_CHUNK: usize = 128;

/// Renews (or creates) `cfg.replica`'s membership Lease; `true` when it was written.
async fn renew(api: &Api<Lease>, cfg: &FleetConfig, labels: BTreeMap<String, String>, store: &reflector::Store<Lease>) -> bool {
    let name = lease::member_name(&cfg.fleet, &cfg.replica);
    let secs = cfg.lease_duration.as_secs().max(1) as i32;
    let current = store.get(&reflector::ObjectRef::new(&name).within(&cfg.namespace));
    let announce = lease::announcing(cfg.shards);
    let written = match current {
        Some(l) => lease::replace_announcing(api, &l, LeaseKind::Member, &announce, |s| lease::renew(s, &cfg.replica, secs)).await,
        None => lease::create_announcing(api, &name, labels, announce.clone(), lease::member_spec(&cfg.replica, secs)).await,
    };
    match written {
        Ok(Written::Done(_)) => true,
        Ok(Written::Conflict) => {
            // our cached copy is stale: read it and try once more
            match api.get_opt(&name).await {
                Ok(Some(l)) => matches!(lease::replace_announcing(api, &l, LeaseKind::Member, &announce, |s| lease::renew(s, &cfg.replica, secs)).await, Ok(Written::Done(_))),
                _ => false,
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "membership renewal failed");
            false
        }
    }
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
        (Self { cfg, watch_api: api.clone(), api, ring, held, standing, backlog: None }, ownership)
    }

    /// Watches the Leases through `client` — one without a read timeout, where the writes' client has
    /// one (`--kube-api-timeout`): a watch quiet for longer than that timeout would be cut and resumed,
    /// or listed again once its resourceVersion has expired.
    #[must_use]
    pub fn with_watch_client(mut self, client: kube::Client) -> Self {
        self.watch_api = Api::namespaced(client, &self.cfg.namespace);
        self
    }

    /// Takes the shards `backlog` names first on every takeover.
    #[must_use]
    pub fn with_backlog(mut self, backlog: Arc<dyn Backlog>) -> Self {
        self.backlog = Some(backlog);
        self
    }

    /// The shards among `takes` with work, by the backlog, within [`BACKLOG_TIMEOUT`] (empty otherwise).
    async fn urgent(&self, takes: &[u32]) -> BTreeSet<u32> {
        let Some(backlog) = &self.backlog else { return BTreeSet::new() };
        match tokio::time::timeout(BACKLOG_TIMEOUT, backlog.with_work(takes)).await {
            Ok(urgent) => urgent,
            Err(_) => {
                tracing::warn!(seconds = BACKLOG_TIMEOUT.as_secs(), "the work queue did not say which shards have work in time: taking in shard order");
                BTreeSet::new()
            }
        }
    }

    fn labels(&self, kind: &str) -> BTreeMap<String, String> {
        [(FLEET_LABEL.to_string(), self.cfg.fleet.clone()), (KIND_LABEL.to_string(), kind.to_string())].into()
    }

    /// Publishes `shards` held after `lapses`, valid until `valid_until` (or later, when the renewer
    /// advanced the current holding meanwhile).
    fn publish(&self, shards: &BTreeMap<u32, i64>, members: &BTreeSet<String>, valid_until: Option<Instant>, lapses: u64) {
        // only a change wakes the receivers (the queue's shard follower, the selector publisher)
        self.held.send_if_modified(|h| {
            let valid_until = published_validity(h, lapses, valid_until).filter(|_| !shards.is_empty());
            let same = h.valid_until == valid_until && h.lapses == lapses && h.shards == *shards && h.members.iter().eq(members.iter());
            if !same {
                *h = Arc::new(Held { shards: shards.clone(), members: members.iter().cloned().collect(), valid_until, lapses });
            }
            !same
        });
    }

    /// Takes part in the fleet until `shutdown`: renews the membership, takes and releases shards.
    /// On shutdown it holds nothing and releases its membership, so the others take its shards at once.
    pub async fn run(self, shutdown: CancellationToken) {
        let selector = format!("{FLEET_LABEL}={}", self.cfg.fleet);
        let (store, writer) = reflector::store();
        let changed = Arc::new(Notify::new());
        let notify = changed.clone();
        // set by every event that may change a shard Lease (anything but a member's renewal): only
        // then, or when the live members or the held shards changed, is the plan worked out again
        let shards_changed = Arc::new(AtomicBool::new(true));
        let shards_flag = shards_changed.clone();
        let fleet = self.cfg.fleet.clone();
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
        let watch = tokio::spawn(watch);
        if store.wait_until_ready().await.is_err() {
            return;
        }
        let mut liveness = Liveness::default();
        let mut shards: BTreeMap<u32, i64> = BTreeMap::new();
        // shard Leases written here that the cache may not show yet
        let mut own: BTreeMap<u32, OwnWrite> = BTreeMap::new();
        let (renewed_tx, mut renewed) = watch::channel(None::<Renewal>);
        // aborted with this future too (a task aborted mid-run, as a crash): no renewal outlives it
        let renewer = AbortOnDrop(spawn_renewer(self.api.clone(), self.cfg.clone(), self.labels("member"), store.clone(), renewed_tx, self.held.clone()));
        let mut ring_cache: Option<(BTreeSet<String>, Vec<String>)> = None;
        // the live members and held shards of the last plan that had no step, while no shard Lease
        // changed since: planning again from them would find no step either
        let mut settled: Option<(Vec<LiveMember>, BTreeMap<u32, i64>)> = None;
        let mut live = BTreeSet::new();
        // the live member of another shard count whose shards this replica waits for, as last logged
        let mut waiting_for: Option<(String, u32)> = None;
        // the lapses the current holding was built after
        let mut accepted_lapses = 0;
        loop {
            let current = *renewed.borrow_and_update();
            // a renewal after a lapse (this process was frozen, or the API server unreachable, for
            // longer than the deadline): hold nothing; shards come back only through
            // resourceVersion-guarded takes, which fail for a Lease another replica wrote meanwhile.
            if let Some(r) = current
                && r.lapses != accepted_lapses
            {
                if !shards.is_empty() {
                    tracing::warn!(held = shards.len(), "membership lapsed between renewals: holding nothing");
                    shards.clear();
                }
                accepted_lapses = r.lapses;
                self.publish(&shards, &live, None, accepted_lapses);
            }
            let valid_until = self.valid_until(&renewed, accepted_lapses);
            if valid_until.is_none() {
                if !shards.is_empty() {
                    tracing::warn!(held = shards.len(), "membership not renewed within its deadline: holding nothing");
                    shards.clear();
                }
                self.publish(&shards, &live, None, accepted_lapses);
            } else {
                // read before the store: a change after this read sets it again for the next turn
                let shard_leases_changed = shards_changed.swap(false, Ordering::SeqCst);
                let leases = store.state();
                let fleet = self.cfg.fleet.as_str();
                let members: Vec<&Lease> = leases.iter().filter(|l| kind(fleet, l) == Some(LeaseKind::Member)).map(|l| &**l).collect();
                live = liveness.live(members.iter().copied(), Instant::now());
                live.insert(self.cfg.replica.clone());
                let (me, mine) = (self.cfg.replica.as_str(), self.cfg.shards);
                let infos = live_members(me, mine, members, &live);
                let now_standing = standing(mine, &infos);
                self.stand(&now_standing);
                // the ring spans the live members of this replica's count (and those announcing none)
                let peers: BTreeSet<String> = infos.iter().filter(|m| m.shards.is_none_or(|n| n == mine)).map(|m| m.name.clone()).collect();
                if ring_cache.as_ref().is_none_or(|(set, _)| *set != peers) {
                    ring_cache = Some((peers.clone(), self.ring.assign(mine, &peers.iter().cloned().collect::<Vec<_>>())));
                }
                // the same inputs as the last plan that had nothing to do: nothing to do again
                let unchanged = settled.as_ref().is_some_and(|(l, s)| *l == infos && *s == shards);
                if shard_leases_changed || !unchanged {
                    let cached: BTreeMap<u32, Arc<Lease>> = leases
                        .iter()
                        .filter_map(|l| match kind(fleet, l) {
                            Some(LeaseKind::Shard(k)) => Some((k, l.clone())),
                            _ => None,
                        })
                        .collect();
                    let by_shard = with_own_writes(cached, &mut own);
                    let desired = ring_cache.as_ref().map(|(_, d)| d.as_slice()).unwrap_or_default();
                    let steps = match now_standing {
                        Standing::StandingBy { .. } => stand_down(me, &by_shard, &shards),
                        Standing::Active => {
                            let mut steps = plan(me, desired, &by_shard, &live, &shards);
                            let blocker = holding_another_count(mine, &infos, &by_shard);
                            if blocker.is_some() {
                                // shards of another count are still held: take nothing until released
                                steps.retain(|s| matches!(s, Step::Release(_) | Step::Drop(_)));
                            }
                            if blocker != waiting_for {
                                if let Some((holder, n)) = &blocker {
                                    tracing::info!(holder = %holder, holder_shards = n, shards = mine, "a live member of another shard count still holds shards: taking none until it has released them");
                                }
                                waiting_for = blocker;
                            }
                            steps
                        }
                    };
                    settled = steps.is_empty().then(|| (infos.clone(), shards.clone()));
                    self.apply(steps, &by_shard, &mut shards, &live, (&renewed, accepted_lapses, &shutdown), &mut own).await;
                }
                self.publish(&shards, &live, self.valid_until(&renewed, accepted_lapses), accepted_lapses);
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = changed.notified() => {}
                Ok(()) = renewed.changed() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
        drop(renewer);
        // hold nothing, then release the membership: successors need not wait for it to expire
        self.publish(&BTreeMap::new(), &BTreeSet::new(), None, accepted_lapses);
        let name = lease::member_name(&self.cfg.fleet, &self.cfg.replica);
        if let Ok(Some(l)) = self.api.get_opt(&name).await {
            let _ = lease::replace(&self.api, &l, LeaseKind::Member, lease::release).await;
        }
        watch.abort();
    }

    /// Publishes `now` as this replica's standing when it changed, with a log line and
    /// [`STANDING_BY`].
    fn stand(&self, now: &Standing) {
        // set on every plan, so that the series exists from the first one on
        metrics::gauge!(STANDING_BY).set(if matches!(now, Standing::StandingBy { .. }) { 1.0 } else { 0.0 });
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
            Standing::Active => tracing::info!(shards = self.cfg.shards, "this replica's shard count prevails in the fleet: taking part"),
        }
    }

    /// Carries out `steps`: drops and releases first (stop acting, publish, then write), then takes.
    /// Until when what this replica holds is valid: the renew deadline after the start of its last
    /// successful renewal (`renewed`), if still ahead and no lapse happened since the holding was built
    /// (`accepted_lapses`): a holding from before a lapse is never published as valid again.
    fn valid_until(&self, renewed: &watch::Receiver<Option<Renewal>>, accepted_lapses: u64) -> Option<Instant> {
        renewed.borrow().filter(|r| r.lapses == accepted_lapses).map(|r| r.started + self.cfg.renew_deadline).filter(|u| *u > Instant::now())
    }

    async fn apply(
        &self,
        steps: Vec<Step>,
        leases: &BTreeMap<u32, Arc<Lease>>,
        shards: &mut BTreeMap<u32, i64>,
        live: &BTreeSet<String>,
        (renewed, accepted_lapses, shutdown): (&watch::Receiver<Option<Renewal>>, u64, &CancellationToken),
        own: &mut BTreeMap<u32, OwnWrite>,
    ) {
        let mut releases = Vec::new();
        let mut takes = Vec::new();
        for step in steps {
            match step {
                Step::Drop(k) => {
                    shards.remove(&k);
                }
                Step::Release(k) => {
                    shards.remove(&k);
                    releases.push(k);
                }
                Step::Create(k) | Step::Take(k) => takes.push(k),
            }
        }
        if !releases.is_empty() {
            // nobody acts on them any more before their Leases say so
            self.publish(shards, live, self.valid_until(renewed, accepted_lapses), accepted_lapses);
            let writes = futures::stream::iter(releases.into_iter().filter_map(|k| Some((k, leases.get(&k).cloned()?))))
                .map(|(k, l)| async move { (k, l.metadata.resource_version.clone(), lease::replace(&self.api, &l, LeaseKind::Shard(k), lease::release).await) })
                .buffer_unordered(WRITE_CONCURRENCY);
            let written: Vec<(u32, Option<String>, Box<Lease>)> = writes
                .filter_map(|(k, before, w)| {
                    std::future::ready(match w {
                        Ok(Written::Done(l)) => Some((k, before, l)),
                        _ => None,
                    })
                })
                .collect()
                .await;
            tracing::info!(released = written.len(), "shards released to their new holders");
            for (k, before, l) in written {
                own.insert(k, own_write(before, *l));
            }
        }
        // a replica shutting down takes nothing: what it took would only be handed on again
        if takes.is_empty() || shutdown.is_cancelled() {
            return;
        }
        let urgent = self.urgent(&takes).await;
        tracing::info!(taking = takes.len(), with_work = urgent.len(), "taking shards");
        // in chunks, each published as soon as it is written: the shards with work first, so that
        // their operations resume while the rest are still being taken
        for chunk in take_order(&takes, &urgent, TAKE_CHUNK) {
            if shutdown.is_cancelled() {
                tracing::info!("shutting down: taking no more shards");
                return;
            }
            let started = Instant::now();
            let written = self.take(&chunk, leases).await;
            let mut taken = Vec::with_capacity(written.len());
            for (k, before, l) in written {
                taken.push((k, lease::transitions(&l)));
                own.insert(k, own_write(before, *l));
            }
            if !taken.is_empty() {
                tracing::info!(taken = taken.len(), held = shards.len() + taken.len(), seconds = started.elapsed().as_secs_f64(), "shards taken");
                shards.extend(taken);
                self.publish(shards, live, self.valid_until(renewed, accepted_lapses), accepted_lapses);
            }
        }
    }

    /// Takes the shards of `chunk` (their Leases as read in `leases`, or new ones),
    /// [`WRITE_CONCURRENCY`] writes at a time; returns those taken, each with the resourceVersion its
    /// write was guarded by (`None`: created) and its Lease as written (the epoch is its transitions).
    async fn take(&self, chunk: &[u32], leases: &BTreeMap<u32, Arc<Lease>>) -> Vec<(u32, Option<String>, Box<Lease>)> {
        let me = self.cfg.replica.clone();
        let writes = futures::stream::iter(chunk.iter().copied())
            .map(|k| {
                let me = me.clone();
                let lease = leases.get(&k).cloned();
                let before = lease.as_ref().and_then(|l| l.metadata.resource_version.clone());
                async move {
                    let written = match lease {
                        Some(l) => lease::replace(&self.api, &l, LeaseKind::Shard(k), |s| lease::take(s, &me)).await,
                        None => {
                            let mut spec = Default::default();
                            lease::take(&mut spec, &me);
                            let mut labels = self.labels("shard");
                            labels.insert(SHARD_LABEL.into(), k.to_string());
                            lease::create(&self.api, &lease::shard_name(&self.cfg.fleet, k), labels, spec).await
                        }
                    };
                    (k, before, written)
                }
            })
            .buffer_unordered(WRITE_CONCURRENCY);
        writes
            .filter_map(|(k, before, w)| {
                std::future::ready(match w {
                    Ok(Written::Done(l)) => Some((k, before, l)),
                    Ok(Written::Conflict) => None,
                    Err(e) => {
                        tracing::warn!(shard = k, error = %e, "taking a shard failed");
                        None
                    }
                })
            })
            .collect()
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    #[test]
    fn a_held_shard_is_valid_until_the_renew_deadline_in_wall_clock_and_anything_else_is_already_past() {
        let held = Held { shards: BTreeMap::from([(3, 7)]), members: vec![], valid_until: Some(Instant::now() + Duration::from_secs(4)), lapses: 0 };
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
        let held = Held { shards: BTreeMap::from([(3, 7)]), members: vec![], valid_until: Some(now + secs(2)), lapses: 1 };
        assert_eq!(held.advanced_by_renewal(1, now + secs(9), now), Some(now + secs(9)), "a later renewal, same lapses");
        assert_eq!(held.advanced_by_renewal(2, now + secs(9), now), None, "a renewal after a lapse the holding predates");
        assert_eq!(held.advanced_by_renewal(1, now + secs(1), now), None, "never earlier than the current validity");
        assert_eq!(held.advanced_by_renewal(1, now, now), None, "a renewal already past its deadline");
        let expired = Held { valid_until: Some(now - secs(1)), ..held.clone() };
        assert_eq!(expired.advanced_by_renewal(1, now + secs(9), now), Some(now + secs(9)), "a holding that lapsed by the clock only (a late renewal)");
        let published_invalid = Held { valid_until: None, ..held.clone() };
        assert_eq!(published_invalid.advanced_by_renewal(1, now + secs(9), now), Some(now + secs(9)), "published with a late renewal, shards kept");
        let empty = Held { shards: BTreeMap::new(), valid_until: None, ..held };
        assert_eq!(empty.advanced_by_renewal(1, now + secs(9), now), None, "nothing held");
    }

    #[test]
    fn shards_with_work_are_taken_first_in_chunks_of_their_own() {
        let takes: Vec<u32> = (0..10).collect();
        assert_eq!(take_order(&takes, &BTreeSet::from([7, 2, 42]), 4), vec![vec![2, 7], vec![0, 1, 3, 4], vec![5, 6, 8, 9]], "42 is not taken");
        assert_eq!(take_order(&takes, &BTreeSet::new(), 4), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
        assert_eq!(take_order(&[3, 1], &BTreeSet::from([1, 3]), 1), vec![vec![3], vec![1]], "order of the plan kept");
        assert!(take_order(&[], &BTreeSet::from([1]), 4).is_empty());
    }

    #[test]
    fn a_publish_never_moves_validity_back_past_what_a_renewal_gave() {
        let now = Instant::now();
        let secs = Duration::from_secs;
        let current = Held { shards: BTreeMap::from([(3, 7)]), members: vec![], valid_until: Some(now + secs(9)), lapses: 1 };
        assert_eq!(published_validity(&current, 1, Some(now + secs(4))), Some(now + secs(9)), "computed from an older renewal");
        assert_eq!(published_validity(&current, 1, Some(now + secs(12))), Some(now + secs(12)), "a newer renewal");
        assert_eq!(published_validity(&current, 2, Some(now + secs(4))), Some(now + secs(4)), "built after another lapse");
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
    fn the_plan_reads_a_replicas_own_writes_until_the_cache_shows_them_or_a_later_version() {
        let at = |holder: &str, rv: &str| {
            let mut l = lease(Some(holder), 1);
            l.metadata.resource_version = Some(rv.into());
            Arc::new(l)
        };
        let holder = |m: &BTreeMap<u32, Arc<Lease>>, k: u32| m.get(&k).and_then(|l| lease::holder(l)).map(str::to_string);
        let mut own: BTreeMap<u32, OwnWrite> = [
            (1, OwnWrite { before: Some("10".into()), written: at("me", "11") }),
            (2, OwnWrite { before: None, written: at("me", "12") }),
            (3, OwnWrite { before: Some("13".into()), written: at("me", "14") }),
        ]
        .into();
        // the cache: 1 as it was before the write (stale), 2 not there yet (a create), 3 moved on (another
        // replica wrote after us: the cache is the truth again), 4 never written here
        let cached: BTreeMap<u32, Arc<Lease>> = [(1, at("dead", "10")), (3, at("other", "20")), (4, at("other", "5"))].into();
        let read = with_own_writes(cached.clone(), &mut own);
        assert_eq!(holder(&read, 1).as_deref(), Some("me"), "the cache is behind our take");
        assert_eq!(holder(&read, 2).as_deref(), Some("me"), "our create is not in the cache yet");
        assert_eq!(holder(&read, 3).as_deref(), Some("other"), "a later write by another replica wins");
        assert_eq!(holder(&read, 4).as_deref(), Some("other"));
        assert_eq!(own.keys().copied().collect::<Vec<_>>(), [1, 2], "the write the cache moved past is retired");
        // the cache catches up: every own write is retired
        let caught_up: BTreeMap<u32, Arc<Lease>> = [(1, at("me", "11")), (2, at("me", "12"))].into();
        assert_eq!(holder(&with_own_writes(caught_up, &mut own), 1).as_deref(), Some("me"));
        assert!(own.is_empty());
        // what planning from the stale cache alone did: drop the shard just taken
        let held = BTreeMap::from([(1, 11)]);
        let desired = vec!["x".to_string(), "me".to_string()];
        let live: BTreeSet<String> = ["me".to_string(), "x".to_string()].into();
        assert_eq!(plan("me", &desired, &cached, &live, &held), [Step::Drop(1)], "the stale cache");
        let mut own: BTreeMap<u32, OwnWrite> = [(1, OwnWrite { before: Some("10".into()), written: at("me", "11") })].into();
        assert_eq!(plan("me", &desired, &with_own_writes(cached, &mut own), &live, &held), [], "with its own write: nothing to do");
    }

    #[test]
    fn only_a_member_leases_own_event_leaves_the_plan_as_it_was() {
        let named = |name: &str| {
            let mut l = lease(Some("a"), 1);
            l.metadata.name = Some(name.to_string());
            l
        };
        let member = || named(&lease::member_name("pko", "r-1"));
        let shard = || named(&lease::shard_name("pko", 7));
        assert!(member_event("pko", &watcher::Event::Apply(member())), "a renewal");
        assert!(member_event("pko", &watcher::Event::Delete(member())));
        assert!(!member_event("pko", &watcher::Event::Apply(shard())), "a shard taken or released");
        assert!(!member_event("pko", &watcher::Event::Delete(shard())));
        assert!(!member_event("pko", &watcher::Event::Apply(lease(Some("a"), 1))), "unnamed: counted as a change");
        assert!(!member_event("other", &watcher::Event::Apply(member())), "another fleet's name: counted as a change");
        assert!(!member_event("pko", &watcher::Event::InitApply(member())), "a re-list");
        assert!(!member_event("pko", &watcher::Event::InitDone));
    }

    fn lease(holder: Option<&str>, renewed_secs: i64) -> Lease {
        Lease {
            metadata: Default::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::from_second(renewed_secs).unwrap_or_default())),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn after_a_blind_gap_a_member_is_judged_only_on_what_is_watched_afterwards() {
        let t0 = Instant::now();
        let mut l = Liveness::default();
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(l.live([&lease(Some("a"), 1)], t0), set(&["a"]));
        for s in 1..=2 {
            l.live([&lease(Some("a"), 1)], t0 + Duration::from_secs(s));
        }
        // frozen for 20 s: its cache still shows a's renewal of before the freeze
        let woke = t0 + Duration::from_secs(22);
        assert_eq!(l.live([&lease(Some("a"), 1)], woke), set(&["a"]), "not judged dead on what it did not watch");
        assert_eq!(l.live([&lease(Some("a"), 1)], woke + Duration::from_secs(2)), set(&["a"]));
        // watched without a renewal for a full lease (15 s) since waking, looking every second
        let mut now = woke + Duration::from_secs(2);
        while now < woke + Duration::from_secs(16) {
            now += Duration::from_secs(1);
            l.live([&lease(Some("a"), 1)], now);
        }
        assert_eq!(l.live([&lease(Some("a"), 1)], now), set(&[]), "dead once watched for a full lease");
    }

    #[test]
    fn a_member_is_live_while_its_renewals_are_seen_and_dead_after_a_duration_without() {
        let t0 = Instant::now();
        let mut l = Liveness::default();
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        // the membership loop looks every second (and more often on events)
        let look_until = |l: &mut Liveness, leases: &[Lease], from: u64, to: u64| {
            let mut last = BTreeSet::new();
            for s in from..=to {
                last = l.live(leases.iter(), t0 + Duration::from_secs(s));
            }
            last
        };
        assert_eq!(look_until(&mut l, &[lease(Some("a"), 1), lease(Some("b"), 1)], 0, 0), set(&["a", "b"]));
        // a renews, b does not
        assert_eq!(look_until(&mut l, &[lease(Some("a"), 2), lease(Some("b"), 1)], 1, 10), set(&["a", "b"]));
        assert_eq!(look_until(&mut l, &[lease(Some("a"), 3), lease(Some("b"), 1)], 11, 16), set(&["a"]), "b: 16 s without a renewal");
        // a released membership is not live at once
        assert_eq!(look_until(&mut l, &[lease(None, 3)], 17, 17), set(&[]));
        // the clock of the writer does not matter: only that renewTime changes
        assert_eq!(look_until(&mut l, &[lease(Some("b"), -5000)], 18, 18), set(&["b"]));
    }

    fn shard_lease(holder: Option<&str>) -> Arc<Lease> {
        Arc::new(lease(holder, 0))
    }

    #[test]
    fn plan_takes_what_it_should_hold_once_free_and_releases_to_live_members() {
        let desired: Vec<String> = ["me", "me", "me", "other", "other", "me"].iter().map(|s| s.to_string()).collect();
        let live: BTreeSet<String> = ["me".to_string(), "other".to_string()].into();
        let leases: BTreeMap<u32, Arc<Lease>> = [
            // 0 missing
            (1, shard_lease(None)),
            (2, shard_lease(Some("dead"))),
            (3, shard_lease(Some("me"))),
            (4, shard_lease(Some("other"))),
            (5, shard_lease(Some("other"))),
        ]
        .into();
        let held: BTreeMap<u32, i64> = [(3, 7), (4, 2)].into();
        let steps = plan("me", &desired, &leases, &live, &held);
        assert_eq!(
            steps,
            [
                Step::Create(0),
                Step::Take(1),
                Step::Take(2),    // its holder is not live
                Step::Release(3), // other should hold it and is live
                Step::Drop(4),    // the Lease names other: never act on it
                                  // 5: other holds it and is live — wait for its release
            ]
        );
    }

    #[test]
    fn a_lease_still_naming_us_is_released_when_another_should_hold_it() {
        let desired = vec!["other".to_string()];
        let live: BTreeSet<String> = ["me".to_string(), "other".to_string()].into();
        let leases: BTreeMap<u32, Arc<Lease>> = [(0, shard_lease(Some("me")))].into();
        assert_eq!(plan("me", &desired, &leases, &live, &BTreeMap::new()), [Step::Release(0)], "a release that failed is tried again");
    }

    #[test]
    fn a_shard_held_in_a_previous_life_is_taken_again_with_a_new_epoch() {
        let desired = vec!["me".to_string()];
        let live: BTreeSet<String> = ["me".to_string()].into();
        let leases: BTreeMap<u32, Arc<Lease>> = [(0, shard_lease(Some("me")))].into();
        assert_eq!(plan("me", &desired, &leases, &live, &BTreeMap::new()), [Step::Take(0)]);
        let mut spec = LeaseSpec { lease_transitions: Some(4), ..Default::default() };
        lease::take(&mut spec, "me");
        assert_eq!(spec.lease_transitions, Some(5));
    }

    fn member(name: &str, shards: Option<u32>, since: Option<i64>) -> LiveMember {
        LiveMember { name: name.into(), shards, since: since.map(|s| k8s_openapi::jiff::Timestamp::from_second(s).unwrap_or_default()) }
    }

    #[test]
    fn the_eldest_live_members_shard_count_prevails() {
        // one count everywhere
        assert_eq!(standing(64, &[member("a", Some(64), Some(1)), member("b", Some(64), Some(2))]), Standing::Active);
        // a rolling update to 128: the new replica is the youngest, the old count prevails
        let rolling = [member("old-0", Some(64), Some(10)), member("old-1", Some(64), Some(11)), member("new-0", Some(128), Some(20))];
        assert_eq!(standing(128, &rolling), Standing::StandingBy { prevailing: 64, eldest: "old-0".into() });
        assert_eq!(standing(64, &rolling), Standing::Active);
        // the last old replica gone: the new count prevails
        let done = [member("new-0", Some(128), Some(20)), member("new-1", Some(128), Some(21))];
        assert_eq!(standing(128, &done), Standing::Active);
        assert_eq!(standing(64, &done), Standing::StandingBy { prevailing: 128, eldest: "new-0".into() }, "an old replica restarted late");
        // equal times: the smaller name; an unknown time is the youngest
        assert_eq!(standing(2, &[member("b", Some(1), Some(5)), member("a", Some(2), Some(5))]), Standing::Active);
        assert_eq!(standing(2, &[member("a", Some(2), None), member("b", Some(1), Some(9))]), Standing::StandingBy { prevailing: 1, eldest: "b".into() });
        // a member announcing nothing (an older replica) agrees with everyone
        assert_eq!(standing(8, &[member("old", None, Some(1)), member("me", Some(8), Some(2))]), Standing::Active);
        assert_eq!(standing(8, &[]), Standing::Active);
    }

    #[test]
    fn no_shard_is_taken_while_a_live_member_of_another_count_holds_one() {
        let members = [member("old", Some(64), Some(1)), member("me", Some(128), Some(2)), member("quiet", None, Some(3))];
        let leases: BTreeMap<u32, Arc<Lease>> = [(0, shard_lease(Some("me"))), (1, shard_lease(None)), (2, shard_lease(Some("dead")))].into();
        assert_eq!(holding_another_count(128, &members, &leases), None, "no Lease names a live member of another count");
        let mut leases = leases;
        leases.insert(70, shard_lease(Some("old")));
        assert_eq!(holding_another_count(128, &members, &leases), Some(("old".into(), 64)), "a Lease beyond this count counts too");
        assert_eq!(holding_another_count(64, &members, &leases), Some(("me".into(), 128)), "old's view: me holds shard 0");
        assert_eq!(holding_another_count(128, &[member("quiet", None, Some(3))], &[(0, shard_lease(Some("quiet")))].into()), None, "no count announced");
    }

    #[test]
    fn a_replica_standing_by_releases_every_lease_naming_it_and_drops_the_rest() {
        let leases: BTreeMap<u32, Arc<Lease>> = [(0, shard_lease(Some("me"))), (1, shard_lease(Some("other"))), (2, shard_lease(Some("me"))), (3, shard_lease(None))].into();
        let held: BTreeMap<u32, i64> = [(0, 4), (1, 2)].into();
        assert_eq!(stand_down("me", &leases, &held), [Step::Drop(1), Step::Release(0), Step::Release(2)]);
        assert!(stand_down("me", &[(3, shard_lease(None))].into(), &BTreeMap::new()).is_empty(), "nothing held: nothing to do");
    }

    #[test]
    fn live_members_read_their_count_and_time_from_their_membership_leases() {
        let lease_of = |holder: &str, shards: Option<&str>, acquired: i64| {
            let mut l = lease(Some(holder), 1);
            l.metadata.annotations = shards.map(|n| [(lease::SHARDS_ANNOTATION.to_string(), n.to_string())].into());
            if let Some(s) = l.spec.as_mut() {
                s.acquire_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::from_second(acquired).unwrap_or_default()));
            }
            l
        };
        let ls = [lease_of("a", Some("64"), 5), lease_of("b", Some("x"), 6), lease_of("dead", Some("8"), 1), lease_of("me", Some("64"), 7)];
        let live: BTreeSet<String> = ["a", "b", "me"].iter().map(|s| s.to_string()).collect();
        let got = live_members("me", 128, ls.iter(), &live);
        assert_eq!(
            got,
            vec![member("a", Some(64), Some(5)), member("b", None, Some(6)), member("me", Some(128), Some(7))],
            "me announces its own count; an unreadable one is none"
        );
        let got = live_members("me", 128, ls[..1].iter(), &live);
        assert_eq!(got, vec![member("a", Some(64), Some(5)), member("me", Some(128), None)], "its own Lease not cached yet: the youngest");
    }

    #[test]
    fn an_expired_holding_owns_nothing() {
        let held = Held { shards: [(1, 3)].into(), members: vec![], valid_until: Some(Instant::now() - Duration::from_millis(1)), lapses: 0 };
        assert_eq!(held.epoch(1), None);
        let held = Held { valid_until: Some(Instant::now() + Duration::from_secs(5)), ..held };
        assert_eq!(held.epoch(1), Some(3));
        assert_eq!(held.epoch(2), None);
    }
}
