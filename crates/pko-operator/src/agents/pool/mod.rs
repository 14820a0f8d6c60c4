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

/// Which agent of a pool last ran each Workspace's operation (by the agent's number: a slot or a pod ordinal), so the
/// next operation of that Workspace goes to it when it is free: what an agent keeps for a Stack between its operations
/// (the prepared revision, the Stack's own compile cache, `pko_agent::stack_cache`) is found again. A hint the lender
/// follows only among free agents — never a wait — and forgets beyond [`Affinity::MAX`] Workspaces.
#[derive(Debug, Default)]
pub struct Affinity(HashMap<String, usize>);

impl Affinity {
    /// Most Workspaces remembered per pool; past it the memory starts over (a miss costs a cold cache, nothing else).
    pub const MAX: usize = 4096;

    /// The agent that last ran an operation of `workspace` (`<namespace>/<name>`).
    pub fn last(&self, workspace: &str) -> Option<usize> {
        self.0.get(workspace).copied()
    }

    /// Records that agent `n` runs an operation of `workspace`.
    pub fn ran(&mut self, workspace: &str, n: usize) {
        if self.0.len() >= Self::MAX && !self.0.contains_key(workspace) {
            self.0.clear();
        }
        self.0.insert(workspace.to_string(), n);
    }
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
