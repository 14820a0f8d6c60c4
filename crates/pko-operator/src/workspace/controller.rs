//! The Workspace controller with two runtimes behind one interface ([`Runtime`]; the local one in
//! [`super::local`]):
//! - `pod` (production): the Service and StatefulSet of [`super::pod`], Ready once a replica is ready;
//! - `local` (development and tests): agent processes on this machine, each using a kubeconfig whose
//!   token is a TokenRequest for the Workspace's service account, so its reads of Secrets and ConfigMaps
//!   go through real RBAC.
//!
//! Status: `Ready` with PKO's reasons, `address`, `observedGeneration` (`pulumiVersion` and `Stalled`
//! come from operations, [`super::stalled`]). A Stalled Workspace is Ready False with the stall's reason
//! and message, as PKO's; a spec this version cannot run is Stalled `SpecInvalid` here.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use pko_api::Workspace;
use pko_api::constants::{field_manager, workspace_condition as wc};
use pko_api::shard::ShardKey;
use pko_api::workspace::WorkspaceStatus;

pub use super::local::{LocalRuntime, local_agent_env};
use super::pod::{self, PodRuntimeConfig};
use super::pool::AgentPools;
use super::probe::{self, Probe};
use crate::context::Context;
use crate::informer::{Change, Informers};
use crate::update::tokens::AgentTokens;

/// The failing part: `api` or `local_runtime`.
impl crate::k8s::ReconcileError for Error {
    fn step(&self) -> &'static str {
        match self {
            Error::Kube(_) => "api",
            Error::Local(_) => "local_runtime",
        }
    }
}

/// Errors of a Workspace reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// API server error.
    #[error("{0}")]
    Kube(#[from] kube::Error),
    /// The local runtime could not run the agent.
    #[error("{0}")]
    Local(#[from] super::local::LocalError),
}

/// Where agents run.
pub enum Runtime {
    /// Workspace pods (StatefulSet per Workspace).
    Pod(PodRuntimeConfig),
    /// Agent processes on this machine, one per Workspace.
    Local(LocalRuntime),
    /// Agents pooled per workspace class, processes ([`super::pool`]) or pods ([`super::pod_pool`]):
    /// the Workspace is Ready once its class's identity exists and reports its pool; agents are
    /// started per operation by the Update controller, which shares these pools.
    Pooled(AgentPools),
}

/// How often the local runtime checks that a Workspace's agent process still runs (seconds).
pub const LOCAL_AGENT_CHECK: Duration = Duration::from_secs(15);

/// Whether the status to write — `new` (address, observedGeneration) with the Ready condition
/// `(status, reason, message)` — is what `stored` already says; then nothing is written (the local
/// runtime looks every [`LOCAL_AGENT_CHECK`] and must not write each time).
fn status_unchanged(stored: &WorkspaceStatus, new: &WorkspaceStatus, (status, reason, message): (&str, &str, &str)) -> bool {
    let conds = stored.conditions.as_deref().unwrap_or_default();
    stored.address == new.address
        && stored.pool == new.pool
        && stored.observed_generation == new.observed_generation
        && conds.iter().filter(|c| c.type_ == wc::READY).count() == 1
        && conds.iter().any(|c| c.type_ == wc::READY && c.status == status && c.reason == reason && c.message == message && c.observed_generation == new.observed_generation)
}

/// The `Ready` condition `(status, reason, message)` of a Workspace whose runtime says `ready`: False
/// with the stall's reason and message while `ws` is Stalled (PKO). Pure.
fn with_stall<'a>(ws: &'a Workspace, ready: (&'a str, &'a str, &'a str)) -> (&'a str, &'a str, &'a str) {
    match ws.stalled() {
        Some(c) => ("False", c.reason.as_str(), c.message.as_str()),
        None => ready,
    }
}

/// PKO's `Ready` for a workspace StatefulSet `sts`: False `RollingUpdate` while its controller has not
/// observed its generation or a new revision rolls out, False `WaitingForReplicas` until a replica is
/// available, else True. Pure.
pub fn stateful_set_ready(sts: &StatefulSet) -> (&'static str, &'static str, &'static str) {
    let st = sts.status.clone().unwrap_or_default();
    if st.observed_generation != sts.metadata.generation || st.update_revision != st.current_revision {
        return ("False", wc::ROLLING_UPDATE, "Waiting for the statefulset to be updated");
    }
    if st.available_replicas.unwrap_or(0) < 1 {
        return ("False", wc::WAITING_FOR_REPLICAS, "Waiting for the workspace pod to be available");
    }
    ("True", wc::SUCCEEDED, "")
}

/// The Workspace controller.
pub struct WorkspaceController {
    ctx: Arc<Context>,
    runtime: Runtime,
    /// The operator's tokens for agents in pods (`--auth kube`), presented when their connection is
    /// checked ([`super::probe`]); none: no credentials.
    tokens: Option<AgentTokens>,
}

impl WorkspaceController {
    /// A controller using `runtime`.
    pub fn new(ctx: Arc<Context>, runtime: Runtime) -> Arc<Self> {
        Arc::new(Self { ctx, runtime, tokens: None })
    }

    /// A controller using `runtime` that presents `tokens` to the agents of workspace pods.
    pub fn with_agent_tokens(ctx: Arc<Context>, runtime: Runtime, tokens: AgentTokens) -> Arc<Self> {
        Arc::new(Self { ctx, runtime, tokens: Some(tokens) })
    }

    /// The controller's run, watching through `informers` (Workspaces, and the agents' StatefulSets
    /// with the pod runtime): run the future until shutdown; the local runtime's agents are stopped at
    /// the end.
    pub fn run(self: Arc<Self>, informers: &mut Informers) -> impl std::future::Future<Output = ()> + Send + 'static {
        let store = informers.workspaces().store();
        let controller = Controller::for_stream(informers.workspaces().objects(), store.clone());
        let controller = match self.runtime {
            Runtime::Pod(_) => controller.owns_stream(informers.stateful_sets().objects()),
            Runtime::Local(_) | Runtime::Pooled(_) => controller,
        };
        // local agents whose Workspace is gone are stopped: once the cache has synced (agents adopted
        // from an earlier operator), then on each deletion the watch reports (the pod runtime needs no
        // sweeper: a Workspace's StatefulSet goes with it)
        let deletions = matches!(self.runtime, Runtime::Local(_)).then(|| informers.workspaces().subscribe());
        let this = self.clone();
        async move {
            let sweeper = deletions.map(|d| tokio::spawn(this.clone().sweep(store, d)));
            crate::k8s::run_controller(controller, this.ctx.running(), "workspace", |w, c: Arc<Self>| c.reconcile(w), this.clone()).await;
            if let Some(s) = sweeper {
                s.abort();
            }
            if let Runtime::Local(l) = &this.runtime {
                l.stop_all();
            }
        }
    }

    /// Stops local agents whose Workspace is gone from `store`: after the first sync, then at every
    /// deletion in `changes`.
    async fn sweep(self: Arc<Self>, store: Store<Workspace>, changes: impl futures::Stream<Item = Change<Workspace>> + Send + 'static) {
        let Runtime::Local(local) = &self.runtime else { return };
        let retain = || local.retain(&store.state().iter().filter_map(|w| w.uid()).collect());
        // read the changes while waiting for the sync: an unread subscription holds the informer back
        let mut changes = std::pin::pin!(changes);
        let mut synced = false;
        loop {
            tokio::select! {
                ready = store.wait_until_ready(), if !synced => {
                    if ready.is_err() {
                        return;
                    }
                    synced = true;
                    retain();
                }
                change = changes.next() => match change {
                    None => return,
                    Some(Change::Deleted(_)) if synced => retain(),
                    Some(_) => {}
                },
            }
        }
    }

    async fn reconcile(self: Arc<Self>, ws: Arc<Workspace>) -> Result<Action, Error> {
        let ns = ws.namespace().unwrap_or_default();
        let name = ws.name_any();
        if !self.ctx.ownership.owns(&ns, &ws.shard_key()) {
            return Ok(crate::k8s::unowned());
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let api: Api<Workspace> = Api::namespaced(self.ctx.client.clone(), &ns);
        let mut st = ws.status.clone().unwrap_or_default();
        st.observed_generation = ws.meta().generation;
        if ws.meta().deletion_timestamp.is_some() {
            return self.write(&api, &ws, st, ("False", wc::DELETING, "workspace is being deleted"), &now).await.map(|_| Action::await_change());
        }
        // a spec this version cannot run (PKO's schema admits any string for these): Stalled until it
        // changes; a stall of an earlier generation, or of a spec since mended, is cleared
        match super::stalled::spec_error(&ws.spec) {
            Some(message) => {
                // fenced: the shard may have moved since the check above
                if !self.ctx.ownership.owns(&ns, &ws.shard_key()) {
                    return Ok(crate::k8s::unowned());
                }
                super::stalled::apply(&self.ctx.client, &ws, Some((wc::SPEC_INVALID, &message))).await?;
                self.write(&api, &ws, st, ("False", wc::SPEC_INVALID, &message), &now).await?;
                return Ok(Action::await_change());
            }
            None if super::stalled::outdated(&ws) => {
                if !self.ctx.ownership.owns(&ns, &ws.shard_key()) {
                    return Ok(crate::k8s::unowned());
                }
                // the write wakes this controller again, with the condition gone
                super::stalled::apply(&self.ctx.client, &ws, None).await?;
                return Ok(Action::await_change());
            }
            None => {}
        }
        if let Runtime::Pooled(pools) = &self.runtime {
            st.address = None;
            st.pool = Some(pools.class_of(&ws));
            if let Err(e) = pools.check_identity(&ws).await {
                // as with an agent of its own: not Ready, and why (e.g. its service account is missing)
                self.write(&api, &ws, st, ("False", wc::CONNECTION_FAILED, &e.to_string()), &now).await?;
                return Ok(Action::requeue(Duration::from_secs(5)));
            }
            self.write(&api, &ws, st, with_stall(&ws, ("True", wc::SUCCEEDED, "")), &now).await?;
            return Ok(Action::await_change());
        }
        let (ready, address, requeue) = match &self.runtime {
            Runtime::Pod(cfg) => {
                let pp = PatchParams::apply(field_manager::OPERATOR).force();
                Api::<Service>::namespaced(self.ctx.client.clone(), &ns).patch(&pod::object_name(&name), &pp, &Patch::Apply(pod::service(&ws))).await?;
                let sts = Api::<StatefulSet>::namespaced(self.ctx.client.clone(), &ns).patch(&pod::object_name(&name), &pp, &Patch::Apply(pod::stateful_set(&ws, cfg))).await?;
                match stateful_set_ready(&sts) {
                    ready @ ("True", _, _) if !probe::needed(&ws) => (ready, Some(pod::address(&name, &ns)), Duration::from_secs(300)),
                    ("True", _, _) => {
                        // PKO: a new pod's agent is reached, and answers, before the Workspace is Ready
                        let address = pod::address(&name, &ns);
                        let found = match &self.tokens {
                            Some(tokens) => match tokens.token(&pko_proto::workspace_audience(&ns, &name)).await {
                                Ok(t) => probe::probe(&address, Some(&t)).await,
                                Err(e) => Probe::Unreachable(format!("requesting a token for the workspace agent: {e}")),
                            },
                            None => probe::probe(&address, None).await,
                        };
                        let ((status, reason, message), again) = probe::ready_of(&found);
                        if let Probe::Answered(v) = &found {
                            let v = crate::update::dispatch::pulumi_version(v);
                            if !v.is_empty() {
                                st.pulumi_version = Some(v);
                            }
                        }
                        if let Some(again) = again {
                            tracing::info!(workspace = %name, namespace = %ns, %reason, %message, "workspace agent not answering; looking again");
                            crate::k8s::publish(
                                &self.ctx.events.workspace,
                                ws.as_ref(),
                                crate::k8s::Severity::Warning,
                                pko_api::constants::event_reason::CONNECTION_FAILURE,
                                message.clone(),
                            )
                            .await;
                            st.address = None;
                            self.write(&api, &ws, st, (status, &reason, &message), &now).await?;
                            return Ok(Action::requeue(again));
                        }
                        (("True", wc::SUCCEEDED, ""), Some(address), Duration::from_secs(300))
                    }
                    not_ready => (not_ready, None, Duration::from_secs(10)),
                }
            }
            Runtime::Local(local) => match local.ensure_agent(&self.ctx.client, &ws).await {
                // look again soon: an agent process that died is restarted here (a pod's restart is the
                // kubelet's, and its StatefulSet event wakes this controller)
                Ok(addr) => (("True", wc::SUCCEEDED, ""), Some(addr), LOCAL_AGENT_CHECK),
                Err(e) => {
                    let msg = e.to_string();
                    st.address = None;
                    self.write(&api, &ws, st, ("False", wc::CONNECTION_FAILED, &msg), &now).await?;
                    return Ok(Action::requeue(Duration::from_secs(5)));
                }
            },
            Runtime::Pooled(_) => return Ok(Action::await_change()),
        };
        st.address = address;
        self.write(&api, &ws, st, with_stall(&ws, ready), &now).await?;
        Ok(Action::requeue(requeue))
    }

    async fn write(&self, api: &Api<Workspace>, ws: &Workspace, mut st: WorkspaceStatus, (status, reason, message): (&str, &str, &str), now: &Time) -> Result<(), Error> {
        let name = ws.name_any();
        let name = name.as_str();
        let old = st.conditions.clone().unwrap_or_default();
        if status_unchanged(&ws.status.clone().unwrap_or_default(), &st, (status, reason, message)) {
            return Ok(());
        }
        // fenced: the shard may have moved while this pass ran (or this replica was frozen)
        if !self.ctx.ownership.owns(&ws.namespace().unwrap_or_default(), &ws.shard_key()) {
            return Ok(());
        }
        let mut conditions: Vec<Condition> = old.into_iter().filter(|c| c.type_ == wc::READY).collect();
        pko_api::conditions::set(&mut conditions, wc::READY, status, reason, message, st.observed_generation, now);
        st.conditions = Some(conditions);
        crate::k8s::apply_status(api, name, field_manager::WORKSPACE_STATUS, &st).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(address: Option<&str>, generation: i64, status: &str, reason: &str) -> WorkspaceStatus {
        WorkspaceStatus {
            address: address.map(str::to_string),
            observed_generation: Some(generation),
            conditions: Some(vec![Condition {
                type_: wc::READY.into(),
                status: status.into(),
                reason: reason.into(),
                message: String::new(),
                observed_generation: Some(generation),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn a_statefulset_is_ready_once_rolled_out_and_available() {
        use k8s_openapi::api::apps::v1::StatefulSetStatus;
        let sts = |generation: i64, observed: i64, current: &str, update: &str, available: i32| StatefulSet {
            metadata: kube::api::ObjectMeta { generation: Some(generation), ..Default::default() },
            status: Some(StatefulSetStatus {
                observed_generation: Some(observed),
                current_revision: Some(current.into()),
                update_revision: Some(update.into()),
                available_replicas: Some(available),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(stateful_set_ready(&sts(2, 1, "a", "a", 1)).1, wc::ROLLING_UPDATE, "generation not observed yet");
        assert_eq!(stateful_set_ready(&sts(2, 2, "a", "b", 1)).1, wc::ROLLING_UPDATE, "a new revision rolls out");
        assert_eq!(stateful_set_ready(&sts(2, 2, "b", "b", 0)).1, wc::WAITING_FOR_REPLICAS);
        assert_eq!(stateful_set_ready(&sts(2, 2, "b", "b", 1)), ("True", wc::SUCCEEDED, ""));
    }

    #[test]
    fn a_stalled_workspace_is_not_ready_with_the_stall_s_reason() {
        let mut ws = Workspace::new("w", Default::default());
        ws.metadata.generation = Some(3);
        assert_eq!(with_stall(&ws, ("True", wc::SUCCEEDED, "")), ("True", wc::SUCCEEDED, ""));
        let mut stall = stored(None, 3, "True", wc::INSTALLATION_FAILED);
        stall.conditions.as_mut().unwrap()[0].type_ = wc::STALLED.into();
        stall.conditions.as_mut().unwrap()[0].message = "pulumi install failed".into();
        ws.status = Some(stall);
        assert_eq!(with_stall(&ws, ("True", wc::SUCCEEDED, "")), ("False", wc::INSTALLATION_FAILED, "pulumi install failed"));
        ws.metadata.generation = Some(4);
        assert_eq!(with_stall(&ws, ("True", wc::SUCCEEDED, "")), ("True", wc::SUCCEEDED, ""), "a new generation is tried again");
    }

    #[test]
    fn status_is_written_only_when_it_changes() {
        let s = stored(Some("127.0.0.1:1"), 1, "True", wc::SUCCEEDED);
        assert!(status_unchanged(&s, &s, ("True", wc::SUCCEEDED, "")));
        let moved = WorkspaceStatus { address: Some("127.0.0.1:2".into()), ..s.clone() };
        assert!(!status_unchanged(&s, &moved, ("True", wc::SUCCEEDED, "")), "a restarted agent has a new address");
        assert!(!status_unchanged(&s, &s, ("False", wc::CONNECTION_FAILED, "agent did not start")));
        let next = WorkspaceStatus { observed_generation: Some(2), ..s.clone() };
        assert!(!status_unchanged(&s, &next, ("True", wc::SUCCEEDED, "")), "a new generation is observed");
        assert!(!status_unchanged(&WorkspaceStatus::default(), &s, ("True", wc::SUCCEEDED, "")), "nothing written yet");
    }
}
