//! Where agents run — the agent runtime, below the controllers and importing none of them. Four runtimes behind one
//! interface ([`Agents`]):
//! - a Workspace's own pod ([`pod`]: its Service and StatefulSet, PKO's layout);
//! - a Workspace's own process on this machine ([`local`], development and tests);
//! - a pool of agent processes per workspace class ([`pool::processes`], the local default);
//! - a pool of workspace pods per class ([`pool::pods`]);
//!
//! (the hollow agents of the load tests are either pool, with the agent's simulate flag). Shared pieces: the one
//! definition of a workspace class ([`class`]) and its operation limits ([`limits`]), what lending an agent means
//! ([`lend`]), the operator's tokens towards agents ([`tokens`]), the gRPC client ([`client`]), PKO's workspace
//! initialization on an agent ([`initialize`]), the agent request of an operation or an initialization with its values
//! resolved ([`request`], [`values`]), the readiness probe of a new pod's agent ([`probe`]) and the strategic merge of
//! `podTemplate` ([`merge`]).

pub mod class;
pub mod client;
pub mod initialize;
pub mod lend;
pub mod limits;
pub mod local;
pub mod merge;
pub mod own_pod;
pub mod pod;
pub mod pool;
pub mod probe;
pub mod request;
pub mod tokens;
pub mod values;

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::reflector::Store;
use pko_api::Workspace;
use pko_api::constants::workspace_condition as wc;

use crate::informer::Change;
pub use lend::{End, Hold, Lent, PoolConfig};
use local::{LocalError, LocalRuntime};
use pod::PodRuntimeConfig;
use pool::pods::{PodPoolError, PodPools};
use pool::processes::LocalPools;
use tokens::AgentTokens;

/// Whether a Workspace's agents can run operations, as its `Ready` condition says it (PKO's reasons).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ready {
    /// They can: Ready True `Succeeded` — unless the Workspace is Stalled (then its stall shows).
    Up,
    /// Not yet, and nothing is wrong (a StatefulSet rolling out, a pod starting): Ready False with this reason and
    /// message — unless the Workspace is Stalled (then its stall shows).
    Waiting(&'static str, String),
    /// They cannot be had (unreachable, refused, the service account missing): Ready False with this reason and
    /// message, whatever else holds.
    Failed(String, String),
}

/// What [`Agents::prepare`] found for a Workspace: what its status says and when to look again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// The `Ready` verdict.
    pub ready: Ready,
    /// `status.address`: the Workspace's own agent (`host:port`); `None` while it has none, and with pools (an agent is
    /// lent per operation).
    pub address: Option<String>,
    /// `status.pool`: the class whose pool runs the Workspace's operations (pools only).
    pub pool: Option<String>,
    /// `status.pulumiVersion` as the agent reported it; `None`: unchanged.
    pub pulumi_version: Option<String>,
    /// When to look again; `None`: at the Workspace's next change.
    pub again: Option<Duration>,
    /// The text of PKO's `ConnectionFailure` Warning event, when the agent could not be reached.
    pub warning: Option<String>,
}

impl Readiness {
    /// `ready`, with nothing else to report and no look again.
    pub fn new(ready: Ready) -> Self {
        Self { ready, address: None, pool: None, pulumi_version: None, again: None, warning: None }
    }
}

/// Why a Workspace without a source cannot run on agents that are processes of the operator's host.
pub const NO_SOURCE_LOCALLY: &str = "the Workspace has no source (git, flux, local): its program is put in \
    /share/workspace by an init container of its pod (spec.podTemplate), \
     and the operator's local runtime runs no workspace pod; set a source, or run the operator with --runtime pod";

/// What [`Agents::lend`] found for an operation.
pub enum Lending {
    /// An agent, to run the operation on (or follow it where it runs).
    Lent(Lent),
    /// Every agent of the pool is busy and the pool is at its maximum: try again shortly.
    Busy,
    /// Held for the busy agents that ran the Workspace ([`pool::Affinity::hold`]): try again when one of them is given
    /// back, or once the hold's time is up.
    Held(lend::Held),
    /// The Workspace's own agent has no address yet: its Update waits for the Workspace.
    NoAgent,
}

/// Why no agent could be had.
#[derive(Debug, thiserror::Error)]
pub enum AgentsError {
    /// The operator's token for the agent could not be had (TokenRequest refused or failed).
    #[error("requesting a token for the workspace agent: {0}")]
    Token(kube::Error),
    /// An agent process could not be started (process pools).
    #[error("{0}")]
    Process(#[from] LocalError),
    /// A pool of pods could not be created, scaled or reached.
    #[error("{0}")]
    Pod(#[from] PodPoolError),
}

/// The four runtimes, plus agents run by someone else (tests).
enum Runtime {
    /// A Workspace's own pod ([`own_pod`]).
    OwnPod(PodRuntimeConfig),
    /// A Workspace's own process on this machine ([`local`]).
    OwnProcess(LocalRuntime),
    /// Pools of agent processes per class ([`pool::processes`]).
    ProcessPool(Arc<LocalPools>),
    /// Pools of workspace pods per class ([`pool::pods`]).
    PodPool(Arc<PodPools>),
    /// Agents someone else runs, at the Workspace's `status.address` (tests drive the Update controller alone with
    /// agents they started).
    Addressed,
}

/// Where this replica's agents run, behind one interface: the Workspace controller asks [`Self::prepare`], the Update
/// workers [`Self::lend`], both [`Self::class`]; [`Self::maintain`] keeps the runtime in shape. `tokens`: the
/// operator's tokens towards agents that authenticate their caller (`--auth kube`: pods), one cache for every user.
pub struct Agents {
    client: kube::Client,
    runtime: Runtime,
    tokens: Option<Arc<AgentTokens>>,
}

impl std::fmt::Debug for Agents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agents").field("kind", &self.kind()).field("tokens", &self.tokens).finish()
    }
}

impl Agents {
    /// Each Workspace in its own pod, shaped by `cfg`; `tokens`: the operator's (the pods' agents run `--auth kube`).
    pub fn own_pods(client: kube::Client, cfg: PodRuntimeConfig, tokens: Option<Arc<AgentTokens>>) -> Self {
        Self { client, runtime: Runtime::OwnPod(cfg), tokens }
    }

    /// Each Workspace's agent a process on this machine, started by `local`.
    pub fn own_processes(client: kube::Client, local: LocalRuntime) -> Self {
        Self { client, runtime: Runtime::OwnProcess(local), tokens: None }
    }

    /// Pools of agent processes per class.
    pub fn process_pools(client: kube::Client, pools: Arc<LocalPools>) -> Self {
        Self { client, runtime: Runtime::ProcessPool(pools), tokens: None }
    }

    /// Pools of workspace pods per class, whose agents accept `tokens` (the pools' own cache too).
    pub fn pod_pools(client: kube::Client, pools: Arc<PodPools>, tokens: Arc<AgentTokens>) -> Self {
        Self { client, runtime: Runtime::PodPool(pools), tokens: Some(tokens) }
    }

    /// Agents run by someone else at each Workspace's `status.address`, called with `tokens` when given.
    pub fn addressed(client: kube::Client, tokens: Option<Arc<AgentTokens>>) -> Self {
        Self { client, runtime: Runtime::Addressed, tokens }
    }

    /// The runtime's name in logs: `pod`, `local`, `local-pool`, `pod-pool` or `addressed`.
    pub fn kind(&self) -> &'static str {
        match self.runtime {
            Runtime::OwnPod(_) => "pod",
            Runtime::OwnProcess(_) => "local",
            Runtime::ProcessPool(_) => "local-pool",
            Runtime::PodPool(_) => "pod-pool",
            Runtime::Addressed => "addressed",
        }
    }

    /// Whether agents are pooled per class and lent per operation (an interrupted or refused operation then goes to
    /// another agent at once).
    pub fn pooled(&self) -> bool {
        matches!(self.runtime, Runtime::ProcessPool(_) | Runtime::PodPool(_))
    }

    /// Whether the Workspace controller watches the StatefulSets it owns (a Workspace's own pod).
    pub fn owns_stateful_sets(&self) -> bool {
        matches!(self.runtime, Runtime::OwnPod(_))
    }

    /// Whether [`Self::maintain`] needs the Workspaces' deletions (own processes are stopped when their Workspace goes;
    /// a pod goes with its StatefulSet).
    pub fn follows_deletions(&self) -> bool {
        matches!(self.runtime, Runtime::OwnProcess(_))
    }

    /// The class of `ws` ([`class::workspace_class`]), the same for every runtime.
    pub fn class(&self, ws: &Workspace) -> String {
        class::workspace_class(ws)
    }

    /// Whether an operation can be run on `ws` now: pooled, a Ready Workspace is enough (its agent is lent per
    /// operation) — or one Stalled by an earlier operation, which this one may mend; else its own agent's address
    /// must be known, for its current generation (PKO's `isWorkspaceReady`: the agent runs the spec applied). Pure.
    pub fn usable(&self, ws: &Workspace) -> bool {
        let status = ws.status.as_ref();
        if self.pooled() {
            return ws.runnable();
        }
        status.and_then(|s| s.address.as_ref()).is_some()
            && status.and_then(|s| s.observed_generation) == ws.metadata.generation
    }

    /// Brings `ws`'s agent up (its own pod or process) or checks that its class's agents can run with its identity
    /// (pools), and says what its status should show.
    ///
    /// Errors: the API server's, applying a pod's objects (the reconcile is retried); an agent that cannot be had is a
    /// [`Ready::Failed`] readiness, not an error.
    pub async fn prepare(&self, ws: &Workspace) -> Result<Readiness, kube::Error> {
        let failed = |e: &dyn std::fmt::Display| Readiness {
            again: Some(Duration::from_secs(5)),
            ..Readiness::new(Ready::Failed(wc::CONNECTION_FAILED.into(), e.to_string()))
        };
        let pooled = |checked: Result<(), AgentsError>| Readiness {
            pool: Some(self.class(ws)),
            ..checked.map_or_else(|e| failed(&e), |()| Readiness::new(Ready::Up))
        };
        if !ws.spec.has_source() && matches!(self.runtime, Runtime::OwnProcess(_) | Runtime::ProcessPool(_)) {
            return Ok(Readiness::new(Ready::Failed(wc::NO_SOURCE.into(), NO_SOURCE_LOCALLY.into())));
        }
        Ok(match &self.runtime {
            Runtime::OwnPod(cfg) => own_pod::prepare(&self.client, cfg, self.tokens.as_deref(), ws).await?,
            // looked at again soon: an agent process that died is restarted here (a pod's restart is
            // the kubelet's, and its StatefulSet event wakes the controller)
            Runtime::OwnProcess(local) => match local.ensure_agent(&self.client, ws).await {
                Ok(address) => {
                    Readiness { address: Some(address), again: Some(local::AGENT_CHECK), ..Readiness::new(Ready::Up) }
                }
                Err(e) => failed(&e),
            },
            // pooled: Ready once the class's agents can have the Workspace's identity
            Runtime::ProcessPool(p) => pooled(p.check_identity(ws).await.map_err(AgentsError::from)),
            Runtime::PodPool(p) => pooled(p.check_identity(ws).await.map_err(AgentsError::from)),
            Runtime::Addressed => {
                Readiness { address: ws.status.as_ref().and_then(|s| s.address.clone()), ..Readiness::new(Ready::Up) }
            }
        })
    }

    /// An agent for operation `op` of `ws` at fencing epoch `epoch` (`started`: the operation may run somewhere
    /// already: follow it there), with the token it wants; or [`Lending::Held`] for the busy agents that ran `ws`.
    ///
    /// Errors: [`AgentsError`] when no agent could be started or reached, or no token had.
    pub async fn lend(&self, ws: &Workspace, op: &str, epoch: i64, started: bool) -> Result<Lending, AgentsError> {
        self.lend_at(ws, op, epoch, started, None, Hold::ForWarmAgents).await
    }

    /// [`Self::lend`] with the Workspace's own agent at `address` when given (its address known before the
    /// Workspace's status says it: PKO's initialization of a Workspace not yet Ready), held for the Workspace's busy
    /// agents only as `hold` allows ([`Lending::Held`]).
    ///
    /// Errors: as [`Self::lend`].
    pub async fn lend_at(
        &self,
        ws: &Workspace,
        op: &str,
        epoch: i64,
        started: bool,
        address: Option<String>,
        hold: Hold,
    ) -> Result<Lending, AgentsError> {
        let found = match &self.runtime {
            Runtime::ProcessPool(p) => p.acquire(ws, op, epoch, started, hold).await?,
            Runtime::PodPool(p) => p.acquire(ws, op, epoch, started, hold).await?,
            Runtime::OwnPod(_) | Runtime::OwnProcess(_) | Runtime::Addressed => {
                match address.or_else(|| ws.status.as_ref().and_then(|s| s.address.clone())) {
                    Some(address) => lend::Acquired::Lent(Lent::own(address)),
                    None => return Ok(Lending::NoAgent),
                }
            }
        };
        let mut lent = match found {
            lend::Acquired::Lent(lent) => lent,
            lend::Acquired::Full => return Ok(Lending::Busy),
            lend::Acquired::Held(held) => return Ok(Lending::Held(held)),
        };
        if let Some(tokens) = &self.tokens {
            // a pool of pods names its own audience; else the Workspace's own agent's
            let audience = lent
                .audience
                .clone()
                .unwrap_or_else(|| pko_proto::workspace_audience(&ws.namespace().unwrap_or_default(), &ws.name_any()));
            lent.token = Some(tokens.token(&audience).await.map_err(AgentsError::Token)?);
        }
        Ok(Lending::Lent(lent))
    }

    /// Keeps the runtime in shape until `shutdown`: pools stop idle agents and keep their minimum; own processes whose
    /// Workspace is gone from `workspaces` are stopped (once the cache has synced, then at each deletion in `changes`,
    /// asked for when [`Self::follows_deletions`]) and every one at the end. Own pods need nothing (a pod goes with its
    /// StatefulSet).
    pub async fn maintain<S>(
        self: Arc<Self>,
        workspaces: Store<Workspace>,
        changes: Option<S>,
        shutdown: tokio_util::sync::CancellationToken,
    ) where
        S: futures::Stream<Item = Change<Workspace>> + Send + 'static,
    {
        match &self.runtime {
            Runtime::ProcessPool(p) => p.clone().run(shutdown).await,
            Runtime::PodPool(p) => p.clone().run(shutdown).await,
            Runtime::OwnProcess(local) => {
                if let Some(changes) = changes {
                    tokio::select! {
                        () = local::sweep(local, workspaces, changes) => {}
                        () = shutdown.cancelled() => {}
                    }
                }
                shutdown.cancelled().await;
                local.stop_all();
            }
            Runtime::OwnPod(_) | Runtime::Addressed => {}
        }
    }
}
