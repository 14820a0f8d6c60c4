//! Agent pools of the `pod` runtime (`--runtime pod --agent-pools`): the workspace pods of one class ([`super::class`]:
//! the namespace and everything that shapes the pod — image, env, resources, service account, security profile, pod
//! template, log level) are interchangeable, so a class gets one StatefulSet `pko-pool-<class hash>-workspace` (and its
//! headless Service), built from the class's pod exactly as a Workspace's own ([`super::pod::stateful_set`]), and
//! scaled by the operator: from 0 (the default minimum: an idle class costs no pod — PKO keeps one pod per Stack,
//! 24/7) up to `max` pods while operations wait, and down again once the highest pod has been idle for the idle
//! timeout.
//!
//! Shared by the fleet: every replica lends the class's pods to its own operations, and the pods themselves are the
//! truth about who runs what — an agent refuses a second operation (`UNAVAILABLE: agent busy`), so two replicas that
//! pick the same idle pod at once lose nothing (the one refused defers its operation:
//! [`crate::agents::lend::End::Busy`]). Growing is done by any replica that finds no idle pod (a
//! resourceVersion-guarded raise of `spec.replicas`, never a lowering); shrinking by one replica only, the holder of
//! the pool's own shard (`<namespace>/<pool name>`, as any object's): it lowers `spec.replicas` by one when the highest
//! pod answers idle for at least the idle timeout — by the agent's own clock
//! ([`pko_proto::v1::StatusResponse::idle_seconds`]), whoever lent it. Lending prefers the lowest ordinal, so the
//! highest pods are the ones that go idle (a StatefulSet removes its highest pod first).
//!
//! Agents authenticate the operator as with a Workspace's own pod (`--auth kube`), with the pool's name in the
//! Workspace's place: tokens for the audience `<pool>.<namespace>`, and the SubjectAccessReview `use workspaces/rpc`
//! named after the pool, which PKO's operator role already grants.
//!
//! Invariants: `spec.replicas` is only raised by lenders and only lowered by the pool's maintainer, each write guarded
//! by the resourceVersion it read; a pod is lent by at most one dispatcher of this replica at a time (`lent`), and runs
//! at most one operation at a time (its capacity); an operation found running on a pod (`started`) is followed there,
//! never started on another.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use pko_api::Workspace;
use pko_proto::v1::status_response::State;

use super::{Ledger, PoolId};
use crate::agents::lend::{Acquired, End, GiveBack, Held, Hold, IdentityChecks, Lent, PoolConfig};
use crate::agents::pod::{self, PodRuntimeConfig};
use crate::agents::tokens::AgentTokens;
use crate::ownership::Ownership;

mod maintain;
mod objects;
pub use objects::{agent_address, candidates, grow_slot, hold_for, pool_name, pool_objects, resize};

/// Label of a pool's StatefulSet and Service: the class hash (the part of the class after the namespace). Replicas find
/// the pools they maintain by it after a restart.
pub const POOL_LABEL: &str = "auto.pulumi.com/pool";
/// Annotation of a pool's StatefulSet: hash of its generated pod template; a different one (a new operator version, a
/// new agent image) replaces the template.
pub const POOL_TEMPLATE_ANNOTATION: &str = "auto.pulumi.com/pool-template-hash";
/// How long a lender waits for the pod it added to answer (seconds: scheduling, image pull, start).
pub const START_TIMEOUT: Duration = Duration::from_secs(180);
/// How often the pools are looked after (seconds).
pub const MAINTAIN_EVERY: Duration = Duration::from_secs(5);
/// How often the pools of the cluster are listed, to maintain those this replica did not create.
pub const DISCOVER_EVERY: Duration = Duration::from_secs(60);

/// Why a pool of pods could not give an agent.
#[derive(Debug, thiserror::Error)]
pub enum PodPoolError {
    /// Reading, creating or scaling the pool's objects failed.
    #[error("pool {pool}: {source}")]
    Api {
        /// `namespace/name` of the pool.
        pool: String,
        /// The API server's answer.
        source: kube::Error,
    },
    /// The operator could not get a token for the pool's agents (TokenRequest on its own service account).
    #[error("requesting a token for the agents of pool {pool}: {source}")]
    Token {
        /// `namespace/name` of the pool.
        pool: String,
        /// The API server's answer.
        source: kube::Error,
    },
    /// The class's service account does not exist: the pool's pods could not be created.
    #[error("service account {0} not found: the workspace's pods cannot run")]
    ServiceAccount(String),
    /// The pod added for an operation did not answer in time.
    #[error("pool {pool}: agent {address} did not answer within {seconds} s of being added: {last}")]
    Start {
        /// `namespace/name` of the pool.
        pool: String,
        /// The agent's address.
        address: String,
        /// [`START_TIMEOUT`] in seconds.
        seconds: u64,
        /// The last error of the attempts.
        last: String,
    },
}

/// What this replica knows of one pool.
struct PodPool {
    namespace: String,
    /// Its name ([`pool_name`]).
    name: String,
    /// Pods lent by this replica now: ordinal → operation (also pods reserved while they start).
    lent: HashMap<usize, String>,
    /// The ordinal that last ran each Workspace's operation.
    affinity: super::Affinity,
    /// Service and StatefulSet checked (created, template current) by this replica.
    ensured: bool,
}

/// The pools of pods this replica lends from and maintains, by class.
pub struct PodPools {
    client: kube::Client,
    cfg: PoolConfig,
    pod: PodRuntimeConfig,
    tokens: Arc<AgentTokens>,
    ownership: Arc<dyn Ownership>,
    pools: Ledger<PodPool>,
    identities: IdentityChecks,
    /// When the cluster's pools were last listed ([`DISCOVER_EVERY`]).
    discovered: std::sync::Mutex<Option<Instant>>,
}

impl PodPools {
    /// Pools of pods shaped by `pod`, sized by `cfg`, whose agents accept `tokens` (the operator's), and maintained by
    /// this replica where `ownership` says it holds the pool's shard.
    pub fn new(
        client: kube::Client,
        cfg: PoolConfig,
        pod: PodRuntimeConfig,
        tokens: Arc<AgentTokens>,
        ownership: Arc<dyn Ownership>,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            cfg,
            pod,
            tokens,
            ownership,
            pools: Ledger::default(),
            identities: Default::default(),
            discovered: Default::default(),
        })
    }

    /// Whether the pods of `ws`'s class can be created: its service account exists. A pass stands for
    /// [`crate::agents::lend::IDENTITY_CHECK_TTL`].
    ///
    /// Errors: [`PodPoolError::ServiceAccount`] naming it; [`PodPoolError::Api`] when it cannot be read.
    pub async fn check_identity(&self, ws: &Workspace) -> Result<(), PodPoolError> {
        let pool = pool_label(ws.metadata.namespace.as_deref().unwrap_or_default(), &pool_name(&PoolId::of(ws)));
        self.identities
            .check(ws, |ns, sa| async move {
                match Api::<ServiceAccount>::namespaced(self.client.clone(), &ns).get_opt(&sa).await {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => Err(PodPoolError::ServiceAccount(format!("{ns}/{sa}"))),
                    Err(source) => Err(PodPoolError::Api { pool, source }),
                }
            })
            .await
    }

    /// Lends a pod of `ws`'s class to operation `op` at fencing epoch `epoch`: with `started`, the pod that knows `op`
    /// already (followed); else a pod that ran the Workspace when it is idle, or (as `hold` allows) a hold for them
    /// while this replica lends them ([`super::Affinity`], [`hold_for`]), else the idle pod of lowest ordinal; else a
    /// pod added to the pool (waiting up to [`START_TIMEOUT`] for it) while it has fewer than `max`.
    /// [`Acquired::Full`]: every pod is busy and the pool is at its maximum (the operation waits in the queue).
    ///
    /// Errors: [`PodPoolError`] when the pool's objects cannot be read or written, no token can be had for its agents,
    /// or the added pod does not answer.
    pub async fn acquire(
        self: &Arc<Self>,
        ws: &Workspace,
        op: &str,
        epoch: i64,
        started: bool,
        hold: Hold,
    ) -> Result<Acquired, PodPoolError> {
        let class = PoolId::of(ws);
        let key = super::affinity_key(ws);
        let ns = ws.namespace().unwrap_or_default();
        let name = pool_name(&class);
        let id = pool_label(&ns, &name);
        self.ensure(&class, ws).await?;
        let audience = pko_proto::workspace_audience(&ns, &name);
        let token =
            self.tokens.token(&audience).await.map_err(|source| PodPoolError::Token { pool: id.clone(), source })?;
        let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), &ns);
        let mut replicas = replicas_of(&api, &name).await.map_err(|source| api_error(&id)(source))?;
        if started {
            for i in 0..replicas {
                let address = agent_address(&name, &ns, i);
                if crate::agents::client::knows(&address, Some(&token), op, epoch).await {
                    tracing::info!(pool = %id, operation = op, %address,
                        "found the pod running the operation; following it");
                    self.mark(&class, i, op);
                    return Ok(Acquired::Lent(self.lent(&class, i, address, audience)));
                }
            }
        }
        if let Some(held) = self.hold(&class, &key, op, replicas, hold.wait(self.cfg.affinity_wait)) {
            return Ok(Acquired::Held(held));
        }
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let warm = self.pools.with(&class, |p| p.affinity.warm(&key).to_vec()).unwrap_or_default();
            for i in candidates(replicas, &self.lent_of(&class), &warm) {
                let address = agent_address(&name, &ns, i);
                let idle = matches!(crate::agents::client::status(&address, Some(&token)).await,
                    Ok(s) if s.state == State::Idle as i32);
                if idle && self.try_mark(&class, i, op) {
                    super::count_lend(&warm, Some(i));
                    self.pools.with(&class, |p| p.affinity.ran(&key, op, i));
                    return Ok(Acquired::Lent(self.lent(&class, i, address, audience)));
                }
            }
            if Instant::now() >= deadline {
                return Ok(Acquired::Full);
            }
            let Some(i) = self.reserve(&class, replicas, op) else { return Ok(Acquired::Full) };
            if let Err(source) = self.scale_up(&api, &name, i + 1).await {
                self.unmark(&class, i);
                return Err(api_error(&id)(source));
            }
            let address = agent_address(&name, &ns, i);
            match wait_idle(&address, &token, deadline).await {
                Ok(true) => {
                    super::count_lend(&warm, Some(i));
                    self.pools.with(&class, |p| p.affinity.ran(&key, op, i));
                    return Ok(Acquired::Lent(self.lent(&class, i, address, audience)));
                }
                Ok(false) => {
                    // another replica lent it first: look again
                    self.unmark(&class, i);
                    replicas = replicas_of(&api, &name).await.map_err(|source| api_error(&id)(source))?;
                }
                Err(last) => {
                    self.unmark(&class, i);
                    return Err(PodPoolError::Start { pool: id, address, seconds: START_TIMEOUT.as_secs(), last });
                }
            }
        }
    }

    fn lent(self: &Arc<Self>, class: &PoolId, n: usize, address: String, audience: String) -> Lent {
        Lent::new(address, Some(audience), Some((class.clone(), n)), self.clone())
    }

    /// A hold of operation `op` of Workspace `key` for the pods that ran it, when this replica lends each of them now,
    /// another of the pool's `replicas` pods could run it, and it may still wait: less than `wait` since its first
    /// hold, never for a zero `wait` ([`hold_for`], [`super::Affinity::hold`]).
    fn hold(&self, class: &PoolId, key: &str, op: &str, replicas: usize, wait: Duration) -> Option<Held> {
        let mut pools = self.pools.lock();
        let p = pools.get_mut(class)?;
        let lent: HashSet<usize> = p.lent.keys().copied().collect();
        let agents = hold_for(replicas, &lent, p.affinity.warm(key), self.cfg.max);
        if agents.is_empty() {
            return None;
        }
        let left = p.affinity.hold(op, Instant::now(), wait)?;
        Some(Held { pool: class.clone(), agents, left })
    }

    fn lent_of(&self, class: &PoolId) -> HashSet<usize> {
        self.pools.lock().get(class).map(|p| p.lent.keys().copied().collect()).unwrap_or_default()
    }

    fn mark(&self, class: &PoolId, n: usize, op: &str) {
        if let Some(p) = self.pools.lock().get_mut(class) {
            p.lent.insert(n, op.to_string());
        }
    }

    /// Lends pod `n` unless this replica lent it meanwhile.
    fn try_mark(&self, class: &PoolId, n: usize, op: &str) -> bool {
        let mut pools = self.pools.lock();
        let Some(p) = pools.get_mut(class) else { return false };
        if p.lent.contains_key(&n) {
            return false;
        }
        p.lent.insert(n, op.to_string());
        true
    }

    fn unmark(&self, class: &PoolId, n: usize) {
        if let Some(p) = self.pools.lock().get_mut(class) {
            p.lent.remove(&n);
        }
    }

    /// Reserves the ordinal to add for `op` ([`grow_slot`]).
    fn reserve(&self, class: &PoolId, replicas: usize, op: &str) -> Option<usize> {
        let mut pools = self.pools.lock();
        let p = pools.get_mut(class)?;
        let i = grow_slot(replicas, self.cfg.max, &p.lent.keys().copied().collect())?;
        p.lent.insert(i, op.to_string());
        Some(i)
    }

    /// Creates the pool's Service and StatefulSet (at 0 pods) if they are missing, and replaces the StatefulSet's pod
    /// template if it was generated differently (another operator version).
    async fn ensure(&self, class: &PoolId, ws: &Workspace) -> Result<(), PodPoolError> {
        let ns = ws.namespace().unwrap_or_default();
        let name = pool_name(class);
        {
            let mut pools = self.pools.lock();
            let p = pools.entry(class.clone()).or_insert_with(|| PodPool {
                namespace: ns.clone(),
                name: name.clone(),
                lent: HashMap::new(),
                affinity: Default::default(),
                ensured: false,
            });
            if p.ensured {
                return Ok(());
            }
        }
        let label = pool_label(&ns, &name);
        let api_err = api_error(&label);
        let (service, sts) = pool_objects(ws, &self.pod, &self.cfg.agent_args);
        let object = pod::object_name(&name);
        let services: Api<Service> = Api::namespaced(self.client.clone(), &ns);
        if services.get_opt(&object).await.map_err(api_err)?.is_none() {
            create(&services, &service).await.map_err(api_err)?;
        }
        let sets: Api<StatefulSet> = Api::namespaced(self.client.clone(), &ns);
        match sets.get_opt(&object).await.map_err(api_err)? {
            None => {
                create(&sets, &sts).await.map_err(api_err)?;
                tracing::info!(pool = %label, "agent pool created (0 pods)");
            }
            Some(found)
                if found.annotations().get(POOL_TEMPLATE_ANNOTATION)
                    != sts.annotations().get(POOL_TEMPLATE_ANNOTATION) =>
            {
                let patch = serde_json::json!({
                    "metadata": {"annotations":
                        {POOL_TEMPLATE_ANNOTATION: sts.annotations().get(POOL_TEMPLATE_ANNOTATION)}},
                    "spec": {"template": sts.spec.as_ref().map(|s| &s.template)},
                });
                sets.patch(&object, &PatchParams::default(), &Patch::Merge(patch)).await.map_err(api_err)?;
                tracing::info!(pool = %label, "agent pool's pod template replaced (generated differently)");
            }
            Some(_) => {}
        }
        if let Some(p) = self.pools.lock().get_mut(class) {
            p.ensured = true;
        }
        Ok(())
    }

    /// Raises the pool's `spec.replicas` to at least `n` (at most `max`), guarded by the resourceVersion read (a
    /// conflict is read again, five times at most).
    async fn scale_up(&self, api: &Api<StatefulSet>, name: &str, n: usize) -> Result<(), kube::Error> {
        let object = pod::object_name(name);
        let n = n.min(self.cfg.max.max(1));
        let mut last = None;
        for _ in 0..5 {
            let sts = api.get(&object).await?;
            let current = replicas(&sts);
            if current >= n {
                return Ok(());
            }
            match set_replicas(api, &object, sts.resource_version(), n).await {
                Ok(()) => {
                    tracing::info!(pool = %pool_label(&api_namespace(&sts), name), from = current, to = n,
                        "agent pool grows");
                    metrics::counter!(crate::metric_names::POOL_AGENTS_STARTED_TOTAL).increment((n - current) as u64);
                    return Ok(());
                }
                Err(kube::Error::Api(e)) if e.code == 409 => last = Some(kube::Error::Api(e)),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| kube::Error::Service("scaling the pool: conflicts".into())))
    }

    /// Pods per pool this replica knows: `(class, spec.replicas, lent here)`, sorted by class (tests).
    pub async fn sizes(&self) -> Vec<(String, usize, usize)> {
        let known: Vec<(PoolId, String, String, usize)> = self
            .pools
            .lock()
            .iter()
            .map(|(c, p)| (c.clone(), p.namespace.clone(), p.name.clone(), p.lent.len()))
            .collect();
        let mut out = Vec::new();
        for (class, ns, name, lent) in known {
            let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), &ns);
            let replicas = replicas_of(&api, &name).await.unwrap_or(0);
            out.push((class.to_string(), replicas, lent));
        }
        out.sort();
        out
    }
}

impl GiveBack for PodPools {
    /// The pod is free here whatever the end: its own Status says whether it is idle when it is next asked (an
    /// interrupted pod answers draining, and is replaced by the StatefulSet).
    fn give_back(&self, class: &PoolId, n: usize, _end: End) {
        self.unmark(class, n);
    }
}

fn api_namespace(sts: &StatefulSet) -> String {
    sts.namespace().unwrap_or_default()
}

async fn create<K>(api: &Api<K>, obj: &K) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api
        .create(
            &PostParams {
                field_manager: Some(pko_api::constants::field_manager::OPERATOR.into()),
                ..Default::default()
            },
            obj,
        )
        .await
    {
        Ok(_) => Ok(()),
        // another replica created it first
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// `spec.replicas` of the pool `name` (0 when unset).
async fn replicas_of(api: &Api<StatefulSet>, name: &str) -> Result<usize, kube::Error> {
    Ok(replicas(&api.get(&pod::object_name(name)).await?))
}

/// `spec.replicas` of `sts` (0 when unset or negative). Pure.
fn replicas(sts: &StatefulSet) -> usize {
    sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0).max(0) as usize
}

/// How a pool is named in messages: `<namespace>/<name>`. Pure.
fn pool_label(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// [`PodPoolError::Api`] of pool `pool` (its label).
fn api_error(pool: &str) -> impl Fn(kube::Error) -> PodPoolError + Copy + '_ {
    move |source| PodPoolError::Api { pool: pool.to_string(), source }
}

/// Sets `spec.replicas` of StatefulSet `object` to `n` if its resourceVersion is still `rv` (409 otherwise).
async fn set_replicas(api: &Api<StatefulSet>, object: &str, rv: Option<String>, n: usize) -> Result<(), kube::Error> {
    let patch = serde_json::json!({"metadata": {"resourceVersion": rv}, "spec": {"replicas": n}});
    api.patch(
        object,
        &PatchParams { field_manager: Some(pko_api::constants::field_manager::OPERATOR.into()), ..Default::default() },
        &Patch::Merge(patch),
    )
    .await
    .map(|_| ())
}

/// Waits until the agent at `address` answers: `Ok(true)` idle, `Ok(false)` busy or draining (lent by another replica
/// first), `Err` with the last error once `deadline` passes.
async fn wait_idle(address: &str, token: &str, deadline: Instant) -> Result<bool, String> {
    loop {
        let last = match crate::agents::client::status(address, Some(token)).await {
            Ok(s) => return Ok(s.state == State::Idle as i32),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(last);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
