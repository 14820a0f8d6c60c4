//! A replica's turns: from the cached Leases and its renewals, accept a lapse, plan the takes and releases of its shard
//! count's table ([`crate::planning`]), write them in one guarded write, and publish what it holds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::leases::{ByKind, Leases, table_of};
use super::renewer::Renewal;
use super::{Fleet, STANDING_BY};
use crate::lease::{self, LeaseKind, Written};
use crate::planning::{
    LiveMember, Liveness, OwnWrite, Standing, Step, holding_another_count, live_members, own_write, plan, stand_down,
    standing, with_own_writes,
};
use crate::table::{Entry, ShardTable, TABLE_ANNOTATION};

/// What a turn's steps act on: the shard table of this replica's count as planned from (the cached Lease with this
/// replica's own write overlaid; `None`: never written), decoded, and the epochs of the shard Leases of an earlier
/// version (a take goes above them).
struct Planned {
    lease: Option<Arc<Lease>>,
    table: ShardTable,
    earlier_epochs: BTreeMap<u32, i64>,
}

/// What [`Fleet::run`] carries from one turn to the next.
#[derive(Default)]
pub(super) struct Turn {
    liveness: Liveness,
    /// The shards held, with their epochs.
    shards: BTreeMap<u32, i64>,
    /// Shard tables (by count) written here, or read fresh after a refused write, that the cache may not show yet.
    own: BTreeMap<u32, OwnWrite>,
    /// The ring's desired holders.
    ring_cache: Option<RingCache>,
    /// The last plan without a step.
    settled: Option<Settled>,
    live: BTreeSet<String>,
    /// The live member of another shard count whose shards this replica waits for, as last logged.
    waiting_for: Option<(String, u32)>,
    /// The lapses the current holding was built after.
    pub accepted_lapses: u64,
    /// The resourceVersion of this count's table last logged as undecodable (logged once per version, not once a turn).
    undecodable: Option<String>,
}

/// The ring's members and each shard's desired holder, kept while the members stay.
struct RingCache {
    members: BTreeSet<String>,
    holders: Vec<String>,
}

/// The inputs of the last plan that had no step: planning again from the same ones, while no shard table changed, would
/// find no step either.
struct Settled {
    live: Vec<LiveMember>,
    standing: Standing,
    held: BTreeMap<u32, i64>,
}

/// What a turn's writes are valid under: the last renewal, the lapses the holding was built after, and whether the
/// replica is shutting down.
struct Validity<'a> {
    renewed: &'a watch::Receiver<Option<Renewal>>,
    accepted_lapses: u64,
    shutdown: &'a CancellationToken,
}

impl Fleet {
    /// One turn, after the renewal `current`: accept a lapse (hold nothing), or — while the membership is valid —
    /// plan and apply the steps, then publish what is held.
    pub(super) async fn turn(
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
            let at = Validity { renewed, accepted_lapses: t.accepted_lapses, shutdown };
            self.apply(steps, &planned, &mut t.shards, &live, at, &mut t.own).await;
        }
        self.publish(&t.shards, &t.live, self.valid_until(renewed, t.accepted_lapses), t.accepted_lapses);
    }

    /// The steps of this turn and the table they act on, from the cached `leases`; `None` when the inputs are those of
    /// the last plan that had nothing to do and no table changed since, or when this count's table does not decode
    /// (logged: nothing is taken or released from it).
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
        if t.ring_cache.as_ref().is_none_or(|c| c.members != peers) {
            let holders = self.ring.assign(mine, &peers.iter().cloned().collect::<Vec<_>>());
            t.ring_cache = Some(RingCache { members: peers.clone(), holders });
        }
        // the same inputs as the last plan that had nothing to do: nothing to do again
        if !tables_changed
            && t.settled.as_ref().is_some_and(|s| s.live == infos && s.standing == now_standing && s.held == t.shards)
        {
            return None;
        }
        let tables = with_own_writes(by.tables, &mut t.own);
        let table = match table_of(tables.get(&mine)) {
            Ok(table) => table,
            Err(e) => {
                let version = tables.get(&mine).and_then(|l| l.metadata.resource_version.clone());
                if t.undecodable != version {
                    tracing::error!(error = %e, table = %lease::table_name(&self.cfg.fleet, mine),
                        "taking and releasing nothing until the shard table is readable");
                    t.undecodable = version;
                }
                return None;
            }
        };
        let steps = match now_standing {
            Standing::Active => self.active_steps(t, &infos, &table, &tables),
            _ => stand_down(me, &table.0, &t.shards),
        };
        t.settled =
            steps.is_empty().then(|| Settled { live: infos.clone(), standing: now_standing, held: t.shards.clone() });
        Some((steps, Planned { lease: tables.get(&mine).cloned(), table, earlier_epochs: by.earlier_epochs }))
    }

    /// The steps of an active replica: the plan, with takes held back while a live member of another shard count still
    /// holds shards in its count's table (logged once per holder).
    fn active_steps(
        &self,
        t: &mut Turn,
        infos: &[LiveMember],
        table: &ShardTable,
        tables: &BTreeMap<u32, Arc<Lease>>,
    ) -> Vec<Step> {
        let (me, mine) = (self.cfg.replica.as_str(), self.cfg.shards);
        let desired = t.ring_cache.as_ref().map(|c| c.holders.as_slice()).unwrap_or_default();
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
                tracing::info!(holder = %holder, holder_shards = n, shards = mine,
                    "a live member of another shard count still holds shards: taking none until it has released them");
            }
            t.waiting_for = blocker;
        }
        steps
    }

    /// Publishes `now` as this replica's standing when it changed, with a log line and [`STANDING_BY`].
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
                "standing by: the fleet runs with --shards={prevailing} (its eldest live member {eldest}), this \
                    replica with --shards={}; holding no shard until every replica of the other count has gone",
                self.cfg.shards
            ),
            Standing::Earlier { member } => tracing::warn!(
                member = %member,
                "standing by: {member} runs an earlier version of the operator, which holds shards through one Lease \
                    per shard; holding no shard until every replica of that version has gone (a rolling upgrade \
                    hands every shard over when its last replica stops)"
            ),
            Standing::Active => tracing::info!(
                shards = self.cfg.shards,
                "this replica's shard count prevails in the fleet: taking part"
            ),
        }
    }

    /// Carries out `steps` in one write of the table: drops and releases stop at once (published before the write),
    /// takes count once the write is done. A replica shutting down takes nothing. A write refused (409: the table was
    /// written since it was read) or failed changes nothing held but the drops and releases; the table is read fresh
    /// and the next turn plans again.
    async fn apply(
        &self,
        steps: Vec<Step>,
        planned: &Planned,
        shards: &mut BTreeMap<u32, i64>,
        live: &BTreeSet<String>,
        Validity { renewed, accepted_lapses, shutdown }: Validity<'_>,
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

    /// Writes `next` as this replica's count's shard table: a guarded merge patch of its annotation over `read`, or a
    /// create when there is none ([`Written::Conflict`] if it exists by then).
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
