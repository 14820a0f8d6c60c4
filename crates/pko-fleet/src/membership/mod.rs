//! A replica's membership in the fleet and the shards it holds: what it holds ([`held`]), its membership renewals
//! ([`renewer`]), the fleet's Leases as it watches them ([`leases`]), and the turns that plan and write its takes and
//! releases ([`planner`]).
//!
//! Each replica renews its membership Lease every [`FleetConfig::renew_interval`]; the others count it live while they
//! see its `renewTime` change within its `leaseDurationSeconds`, measured on their own clock from when they saw the
//! change (client-go's rule, immune to clock offsets). From the live members, every replica computes the same desired
//! holder of each shard ([`crate::ring`]) and, in **one** resourceVersion-guarded write of the shard table
//! ([`crate::table`]) per turn:
//! - takes the shards it should hold that are free, released, held by a member no longer live, or never taken (each one
//!   epoch later: the new fencing token);
//! - releases the shards another live member should hold, after it has stopped acting on them;
//! - drops at once a shard the table gives someone else.
//!
//! A write refused because another replica wrote the table since (409) is read fresh and planned again; a handoff or a
//! takeover costs each replica one or two writes, whatever the shard count.
//!
//! A replica that has not renewed its membership within [`FleetConfig::renew_deadline`] holds nothing (checked on every
//! [`Ownership::owns`], so a process that was frozen acts on nothing once it runs again); others take its shards only
//! after a full lease duration without a renewal, which is longer. On shutdown a replica releases its membership (one
//! write): its shards are free for the others at once. At rest the fleet writes one membership renewal per replica per
//! interval and nothing else.

mod held;
mod leases;
mod planner;
mod renewer;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::lease::{self, FLEET_LABEL, KIND_LABEL, LeaseKind};
use crate::planning::Standing;
use crate::ring::Ring;
use held::published_validity;
pub use held::{Held, STANDING_BY, ShardOwnership};
use planner::Turn;
use renewer::Renewal;

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
    /// More annotations of the membership Lease, asked anew at each renewal (the operator's load: what the replica says
    /// about itself, at no write beyond the renewal's).
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
    /// Defaults of client-go's leader election: 15 s duration, 10 s renew deadline; renewals every 5 s (0.2 writes per
    /// second per replica at rest).
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

/// How a replica takes part in the fleet. A replica's membership: run [`Fleet::run`] until shutdown; [`ShardOwnership`]
/// tells the controllers what it holds.
pub struct Fleet {
    cfg: FleetConfig,
    api: Api<Lease>,
    /// The Leases' watch: through a client without a read timeout ([`Fleet::with_watch_client`]).
    watch_api: Api<Lease>,
    ring: Arc<dyn Ring>,
    held: watch::Sender<Arc<Held>>,
    standing: watch::Sender<Standing>,
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

    /// Watches the Leases through `client` — one without a read timeout, where the writes' client has one
    /// (`--kube-api-timeout`): a watch quiet for longer than that timeout would be cut and resumed, or listed again
    /// once its resourceVersion has expired.
    #[must_use]
    pub fn with_watch_client(mut self, client: kube::Client) -> Self {
        self.watch_api = Api::namespaced(client, &self.cfg.namespace);
        self
    }

    fn labels(&self, kind: &str) -> BTreeMap<String, String> {
        [(FLEET_LABEL.to_string(), self.cfg.fleet.clone()), (KIND_LABEL.to_string(), kind.to_string())].into()
    }

    /// Publishes `shards` held after `lapses`, valid until `valid_until` (or later, when the renewer advanced the
    /// current holding meanwhile).
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

    /// Takes part in the fleet until `shutdown`: renews the membership, takes and releases shards. On shutdown it holds
    /// nothing and releases its membership, so the others take its shards at once.
    pub async fn run(self, shutdown: CancellationToken) {
        lease::init_write_counters();
        let leases = self.watch_leases();
        if leases.store.wait_until_ready().await.is_err() {
            return;
        }
        let (renewed_tx, mut renewed) = watch::channel(None::<Renewal>);
        // aborted with this future too (a task aborted mid-run, as a crash): no renewal outlives it
        let renewer = AbortOnDropHandle::new(renewer::spawn_renewer(
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

    /// Leaves the fleet: holds nothing, then releases the membership (successors need not wait for it to expire; they
    /// take its shards from the table at once).
    async fn leave(&self, accepted_lapses: u64) {
        self.publish(&BTreeMap::new(), &BTreeSet::new(), None, accepted_lapses);
        let name = lease::replica_name(&self.cfg.fleet, &self.cfg.replica);
        if let Ok(Some(l)) = self.api.get_opt(&name).await {
            let _ = lease::replace(&self.api, &l, LeaseKind::Replica, lease::release).await;
        }
    }

    /// Until when what this replica holds is valid: the renew deadline after the start of its last successful renewal
    /// (`renewed`), if still ahead and no lapse happened since the holding was built (`accepted_lapses`): a holding
    /// from before a lapse is never published as valid again.
    fn valid_until(&self, renewed: &watch::Receiver<Option<Renewal>>, accepted_lapses: u64) -> Option<Instant> {
        renewed
            .borrow()
            .filter(|r| r.lapses == accepted_lapses)
            .map(|r| r.started + self.cfg.renew_deadline)
            .filter(|u| *u > Instant::now())
    }
}
