//! Agent pools: the agents of one workspace class are interchangeable (every operation request carries its whole
//! source, settings and environment), so an operation goes to any idle agent of its class, not to an agent per
//! Workspace. Two kinds share this skeleton — a pool's identity ([`PoolId`]), the ledger of what a replica knows of
//! each pool ([`Ledger`]), the maintenance loop ([`every`]) — and lend agents as [`super::lend::Lent`], taken back
//! through [`super::lend::GiveBack`]:
//!
//! - [`processes`]: agent processes on the operator's host (the local runtime's default);
//! - [`pods`]: workspace pods of a StatefulSet per class (`--runtime pod --agent-pools`).

pub mod pods;
pub mod processes;

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// A pool's identity: its workspace class, `<namespace>/<hash>` ([`super::class::workspace_class`]), the same on every
/// replica and for every runtime.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId(String);

impl PoolId {
    /// The pool of `ws`'s class.
    pub fn of(ws: &pko_api::Workspace) -> Self {
        Self(super::class::workspace_class(ws))
    }

    /// The pool of class `class` (`<namespace>/<hash>`, as a pod pool's label and name carry it).
    pub fn from_class(class: String) -> Self {
        Self(class)
    }

    /// The class, `<namespace>/<hash>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The namespace of the class.
    pub fn namespace(&self) -> &str {
        self.0.split('/').next().unwrap_or_default()
    }

    /// The class's hash (the part after the namespace): a pod pool's name and label.
    pub fn hash(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or_default()
    }
}

impl std::fmt::Display for PoolId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which agents of a pool ran each Workspace's operations (by the agent's number: a slot or a pod ordinal), the most
/// recent first, at most [`Affinity::WARM`] of them: what an agent keeps for a Stack between its operations (the
/// prepared revision, the selected stack, the Stack's own compile cache, `pko_agent::stack_cache`) is there, so the
/// next operation goes to one of them when it is free. When all of them are busy while another agent is free (or
/// could be started), the operation is held for them at most `--pool-affinity-wait-seconds` from the first time it was
/// held ([`Affinity::hold`]), woken as soon as one of them is given back; past that it takes any free agent (which
/// then holds the Stack's caches too). A hint in the replica's memory, forgotten beyond [`Affinity::MAX`] Workspaces or
/// held operations (a miss costs a cold cache, nothing else).
#[derive(Debug, Default)]
pub struct Affinity {
    warm: HashMap<String, Vec<usize>>,
    held: HashMap<String, std::time::Instant>,
}

impl Affinity {
    /// Most Workspaces (and held operations) remembered per pool; past it the memory starts over.
    pub const MAX: usize = 4096;
    /// Most agents remembered per Workspace.
    pub const WARM: usize = 4;

    /// The agents that ran operations of `workspace` (`<namespace>/<name>`), the most recent first.
    pub fn warm(&self, workspace: &str) -> &[usize] {
        self.warm.get(workspace).map_or(&[], Vec::as_slice)
    }

    /// Records that agent `n` runs operation `op` of `workspace`: it is no longer held.
    pub fn ran(&mut self, workspace: &str, op: &str, n: usize) {
        if self.warm.len() >= Self::MAX && !self.warm.contains_key(workspace) {
            self.warm.clear();
        }
        let agents = self.warm.entry(workspace.to_string()).or_default();
        agents.retain(|a| *a != n);
        agents.insert(0, n);
        agents.truncate(Self::WARM);
        self.held.remove(op);
    }

    /// How much longer operation `op` may be held for its Workspace's busy agents at `now`, at most `wait` from the
    /// first time it was held (recorded now when it was not); `None`: not at all (`wait` is zero, or it is spent).
    pub fn hold(&mut self, op: &str, now: std::time::Instant, wait: Duration) -> Option<Duration> {
        if wait.is_zero() {
            return None;
        }
        if self.held.len() >= Self::MAX && !self.held.contains_key(op) {
            self.held.retain(|_, since| now.saturating_duration_since(*since) < wait);
        }
        let since = *self.held.entry(op.to_string()).or_insert(now);
        wait.checked_sub(now.saturating_duration_since(since)).filter(|left| !left.is_zero())
    }
}

/// Counts a lend of agent `n` (`None`: a new one) in `pko_pool_lends_total{affinity}`: `warm` when the agent ran the
/// Workspace before (`warm` holds it), `cold` when others did, `none` when no agent did.
pub fn count_lend(warm: &[usize], n: Option<usize>) {
    let affinity = match (warm.is_empty(), n.is_some_and(|n| warm.contains(&n))) {
        (true, _) => "none",
        (false, true) => "warm",
        (false, false) => "cold",
    };
    metrics::counter!(crate::metric_names::POOL_LENDS_TOTAL, "affinity" => affinity).increment(1);
}

/// How often a pool asks its agents how much they keep on disk (for `kubectl pko fleet`): 10 seconds (a `Status` call
/// per agent; the agent measures each prepared source once).
pub const DISK_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The bytes a class's agents keep on disk, from their `Status` answers (the sizes of their cached sources): the total
/// and the largest agent's. Pure.
pub fn disk(answers: &[pko_proto::v1::StatusResponse]) -> (u64, u64) {
    let each: Vec<u64> = answers
        .iter()
        .map(|a| a.cached_sources.iter().map(|c| u64::try_from(c.size_bytes).unwrap_or(0)).sum())
        .collect();
    (each.iter().sum(), each.iter().copied().max().unwrap_or(0))
}

/// Publishes the disk of class `class`'s agents from their `answers` (load board and `pko_pool_agent_disk_bytes`).
pub fn publish_disk(class: &str, answers: &[pko_proto::v1::StatusResponse]) {
    let (total, max) = disk(answers);
    metrics::gauge!(crate::metric_names::POOL_AGENT_DISK_BYTES, "class" => class.to_string()).set(total as f64);
    crate::load::set_agent_disk(class, total, max);
}

/// The key [`Affinity`] remembers a Workspace by: `<namespace>/<name>`.
pub fn affinity_key(ws: &pko_api::Workspace) -> String {
    use kube::ResourceExt;
    format!("{}/{}", ws.namespace().unwrap_or_default(), ws.name_any())
}

/// What a replica knows of each pool of one runtime (`P`), by [`PoolId`]. Every critical section is one lookup, insert
/// or removal (the crate's lock rule: a poisoned lock is taken as it is).
#[derive(Debug)]
pub struct Ledger<P>(Mutex<HashMap<PoolId, P>>);

impl<P> Default for Ledger<P> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<P> Ledger<P> {
    /// Every pool, locked.
    pub fn lock(&self) -> MutexGuard<'_, HashMap<PoolId, P>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `f` of pool `id`, if known.
    pub fn with<T>(&self, id: &PoolId, f: impl FnOnce(&mut P) -> T) -> Option<T> {
        self.lock().get_mut(id).map(f)
    }

    /// `f` of pool `id`, known from now on (`make` when it was not).
    pub fn with_or_insert<T>(&self, id: &PoolId, make: impl FnOnce() -> P, f: impl FnOnce(&mut P) -> T) -> T {
        f(self.lock().entry(id.clone()).or_insert_with(make))
    }

    /// Forgets pool `id`.
    pub fn remove(&self, id: &PoolId) {
        self.lock().remove(id);
    }
}

/// Runs `tick` every `period` until `shutdown` (a tick that overran delays the next, never bunches).
pub async fn every<F, Fut>(period: Duration, shutdown: &CancellationToken, mut tick: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => tick().await,
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_is_known_by_its_class_and_its_namespace_is_the_class_s() {
        let id = PoolId::from_class("team-a/3f9a".into());
        assert_eq!((id.as_str(), id.namespace(), id.hash()), ("team-a/3f9a", "team-a", "3f9a"));
        assert_eq!(id.to_string(), "team-a/3f9a");
        let ledger = Ledger::<u32>::default();
        assert_eq!(ledger.with(&id, |n| *n), None);
        assert_eq!(ledger.with_or_insert(&id, || 1, |n| std::mem::replace(n, 2)), 1);
        assert_eq!(ledger.with(&id, |n| *n), Some(2));
        ledger.remove(&id);
        assert!(ledger.lock().is_empty());
    }

    #[test]
    fn an_operation_is_held_for_its_agent_at_most_the_wait_from_its_first_hold() {
        let mut a = Affinity::default();
        let (t0, wait) = (std::time::Instant::now(), Duration::from_secs(3));
        a.ran("ns/s", "op1", 1);
        assert_eq!(a.warm("ns/s"), [1]);
        assert_eq!(a.hold("op2", t0, wait), Some(wait));
        assert_eq!(a.hold("op2", t0 + Duration::from_secs(1), wait), Some(Duration::from_secs(2)), "from the first");
        assert_eq!(a.hold("op2", t0 + wait, wait), None, "spent: any agent");
        a.ran("ns/s", "op2", 0);
        assert_eq!(a.hold("op2", t0 + wait, wait), Some(wait), "lent: a later hold starts over");
        assert_eq!(a.hold("op3", t0, Duration::ZERO), None, "a wait of zero never holds");
    }

    #[test]
    fn a_workspace_is_warm_on_the_agents_that_ran_it_the_most_recent_first() {
        let mut a = Affinity::default();
        assert!(a.warm("ns/s").is_empty());
        for n in [1, 0, 1, 2, 3, 4] {
            a.ran("ns/s", "op", n);
        }
        assert_eq!(a.warm("ns/s"), [4, 3, 2, 1], "each once, at most four");
        assert!(a.warm("ns/other").is_empty());
    }

    #[test]
    fn a_class_s_disk_is_the_sum_of_its_agents_cached_sources_and_the_largest_agent_s() {
        let agent = |sizes: &[i64]| pko_proto::v1::StatusResponse {
            cached_sources: sizes
                .iter()
                .map(|n| pko_proto::v1::CachedSource { size_bytes: *n, ..Default::default() })
                .collect(),
            ..Default::default()
        };
        assert_eq!(disk(&[agent(&[10, 20]), agent(&[5]), agent(&[])]), (35, 30));
        assert_eq!(disk(&[]), (0, 0));
        assert_eq!(disk(&[agent(&[-1, 4])]), (4, 4), "a negative size counts as nothing");
    }
}
