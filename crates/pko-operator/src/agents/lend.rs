//! What lending an agent means, for every runtime: a [`Lent`] agent (its address, the token it wants, and the pool slot
//! to give back), what a pool answers ([`Acquired`], [`Held`]), how its operation [`End`]ed, the pools' shared
//! configuration ([`PoolConfig`]) and the cache of service-account identity checks ([`IdentityChecks`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a successful identity check of a service account stands for the Workspaces that use it (seconds): the check
/// is a TokenRequest (local pools) or a read of the account (pods), and every Workspace reconcile asks it, so 1,000
/// Stacks of one namespace would otherwise cost 1,000 API calls a pass. A failed check is never kept: the next
/// reconcile asks again.
pub const IDENTITY_CHECK_TTL: Duration = Duration::from_secs(60);

/// The service accounts (`namespace/name`) whose identity check passed lately, and when.
#[derive(Debug, Default)]
pub struct IdentityChecks(Mutex<HashMap<String, Instant>>);

impl IdentityChecks {
    /// Whether `account` passed a check less than [`IDENTITY_CHECK_TTL`] before `now`.
    pub fn fresh(&self, account: &str, now: Instant) -> bool {
        let mut passed = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        passed.retain(|_, at| now.duration_since(*at) < IDENTITY_CHECK_TTL);
        passed.contains_key(account)
    }

    /// Records that `account` passed a check at `now`.
    pub fn passed(&self, account: &str, now: Instant) {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(account.to_string(), now);
    }

    /// Whether the agents of `ws` can have its identity — its service account `(namespace, name)`, PKO's default
    /// applied — as `probe` says, asked at most once per [`IDENTITY_CHECK_TTL`] for an account that passed.
    ///
    /// Errors: `probe`'s (never kept: the next call asks again).
    pub async fn check<E, F, Fut>(&self, ws: &pko_api::Workspace, probe: F) -> Result<(), E>
    where
        F: FnOnce(String, String) -> Fut,
        Fut: std::future::Future<Output = Result<(), E>>,
    {
        let ns = ws.metadata.namespace.clone().unwrap_or_default();
        let sa = ws
            .spec
            .with_defaults()
            .service_account_name
            .unwrap_or_else(|| pko_api::workspace::DEFAULT_SERVICE_ACCOUNT.into());
        let account = format!("{ns}/{sa}");
        if self.fresh(&account, Instant::now()) {
            return Ok(());
        }
        probe(ns, sa).await?;
        self.passed(&account, Instant::now());
        Ok(())
    }
}

/// Size and idleness of every pool (flags `--pool-min-agents`, `--pool-max-agents`, `--pool-idle-timeout-seconds`).
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Agents kept running per class even when idle (default 0).
    pub min: usize,
    /// Most agents per class (at least 1); an operation finding every agent busy waits in the queue.
    pub max: usize,
    /// How long an agent may stay idle before it is stopped (while the pool has more than `min`).
    pub idle_timeout: Duration,
    /// How long an operation may be held for the busy agent that ran its Workspace last, while another could run it
    /// (`--pool-affinity-wait-seconds`; zero: never held).
    pub affinity_wait: Duration,
    /// More arguments of every pool agent (`--hollow-seconds 1` for a load test's hollow agents). Pool agents run one
    /// operation at a time (the pool lends an agent to one operation).
    pub agent_args: Vec<String>,
}

/// An operation held for the busy agents that ran its Workspace ([`super::pool::Affinity::hold`]): which agents, and
/// for how long at most before it takes any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The pool.
    pub pool: super::pool::PoolId,
    /// The agents' numbers (slots or pod ordinals).
    pub agents: Vec<usize>,
    /// How much longer it may wait.
    pub left: Duration,
}

/// Whether a request for an agent may be held for the busy agents that ran its Workspace ([`Held`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Up to the pool's configured wait (`--pool-affinity-wait-seconds`): an Update's operation, whose queued job a
    /// given-back agent wakes.
    ForWarmAgents,
    /// Never: an initialization, retried by its Workspace's reconcile with no queued job that a given-back agent
    /// would wake.
    Never,
}

impl Hold {
    /// The longest wait for the warm agents, given the pool's configured one: zero for [`Hold::Never`], which
    /// [`super::pool::Affinity::hold`] answers with "do not hold".
    pub fn wait(self, configured: Duration) -> Duration {
        match self {
            Hold::ForWarmAgents => configured,
            Hold::Never => Duration::ZERO,
        }
    }
}

/// What a pool answers a request for an agent ([`super::pool::processes::LocalPools::acquire`],
/// [`super::pool::pods::PodPools::acquire`]).
pub enum Acquired {
    /// An agent, lent.
    Lent(Lent),
    /// Every agent is busy and the pool is at its maximum: the operation waits in the queue.
    Full,
    /// The operation is held for its Workspace's busy agents.
    Held(Held),
}

/// Where a [`Lent`] agent goes back to when its operation ends (each kind of pool).
pub trait GiveBack: Send + Sync {
    /// Agent `n` of pool `pool`, lent before, is given back after its operation ended as `end`.
    fn give_back(&self, pool: &super::pool::PoolId, n: usize, end: End);
}

/// An agent lent to one operation; given back when dropped. Call [`Lent::finish`] with how the operation ended, so the
/// pool knows whether the agent is free.
pub struct Lent {
    /// The agent's gRPC address (`127.0.0.1:<port>` for a process, `<pod>.<service>.<namespace>:50051` for a pod).
    pub address: String,
    /// The audience of the token the agent accepts (`<pool>.<namespace>` for a pool of pods); `None`: the Workspace's
    /// own (`<workspace>.<namespace>`, or no token at all for processes).
    pub audience: Option<String>,
    /// The bearer token the agent wants (`--auth kube`), set by [`super::Agents::lend`]; `None`: the agent takes calls
    /// without one (agent processes, `--auth none`).
    pub token: Option<String>,
    /// `(class, slot)` when the agent is one of this replica's pool; `None` for a Workspace's own agent or another
    /// replica's agent found running the operation (followed, not lent).
    slot: Option<(super::pool::PoolId, usize)>,
    pools: Option<Arc<dyn GiveBack>>,
    ended: End,
}

/// How a lent agent's operation ended, as its dispatcher saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// A result arrived: the agent is free.
    Result,
    /// The agent is shutting down (`INTERRUPTED`): never lend it again.
    Interrupted,
    /// The agent refused the operation: it runs another one (lent by another replica of the fleet) or is shutting down.
    /// Nothing ran here.
    Busy,
    /// The dispatcher stopped following (fenced, stream broken): the agent may still run it.
    Unknown,
}

impl Lent {
    /// An agent at `address` lent as slot `slot` of a pool that takes it back through `pools`.
    pub fn new(
        address: String,
        audience: Option<String>,
        slot: Option<(super::pool::PoolId, usize)>,
        pools: Arc<dyn GiveBack>,
    ) -> Self {
        Self { address, audience, token: None, slot, pools: Some(pools), ended: End::Unknown }
    }

    /// A Workspace's own agent at `address` (nothing to give back).
    pub fn own(address: String) -> Self {
        Self { address, audience: None, token: None, slot: None, pools: None, ended: End::Unknown }
    }

    /// `(class, agent number)` when the agent is one of this replica's pool (given back when this is dropped).
    pub fn slot(&self) -> Option<&(super::pool::PoolId, usize)> {
        self.slot.as_ref()
    }

    /// Records how the operation ended (default when dropped without it: [`End::Unknown`]).
    pub fn finish(mut self, end: End) {
        self.ended = end;
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let (Some((class, n)), Some(pools)) = (self.slot.take(), &self.pools) {
            pools.give_back(&class, n, self.ended);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_initialization_never_waits_for_warm_agents_and_an_operation_waits_the_configured_time() {
        let configured = Duration::from_secs(6);
        assert_eq!(Hold::ForWarmAgents.wait(configured), configured);
        assert_eq!(Hold::Never.wait(configured), Duration::ZERO);
        let mut affinity = super::super::pool::Affinity::default();
        assert_eq!(affinity.hold("init", Instant::now(), Hold::Never.wait(configured)), None, "never held");
    }

    #[test]
    fn an_identity_check_stands_for_its_ttl_and_only_for_its_account() {
        let checks = IdentityChecks::default();
        let t0 = Instant::now();
        assert!(!checks.fresh("a/default", t0), "never checked");
        checks.passed("a/default", t0);
        assert!(checks.fresh("a/default", t0 + IDENTITY_CHECK_TTL - Duration::from_secs(1)));
        assert!(!checks.fresh("b/default", t0), "another namespace's account");
        assert!(!checks.fresh("a/deployer", t0), "another account of the namespace");
        assert!(!checks.fresh("a/default", t0 + IDENTITY_CHECK_TTL), "expired");
        assert!(!checks.fresh("a/default", t0), "an expired pass is forgotten, not revived");
    }
}
