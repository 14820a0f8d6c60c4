//! The Workspace controller: brings each Workspace's agents up through the runtime of [`crate::agents`] (its own pod or
//! process, or its class's pool) and reports them in its status: `Ready` with PKO's reasons, `address`, `pool`,
//! `observedGeneration` (`pulumiVersion` and `Stalled` also come from operations, [`crate::stalled`]). A Stalled
//! Workspace is Ready False with the stall's reason and message, as PKO's; a spec this version cannot run is Stalled
//! `SpecInvalid` here.
//!
//! The reconcile is a short driver over named steps: ownership → deletion → spec stall → the runtime's readiness
//! ([`crate::agents::Agents::prepare`]) → one status write.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::Api;
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use pko_api::Workspace;
use pko_api::constants::{field_manager, workspace_condition as wc};
use pko_api::shard::ShardKey;
use pko_api::workspace::WorkspaceStatus;

use crate::agents::initialize::Initialization;
use crate::agents::{Agents, Readiness, Ready};
use crate::context::Context;
use crate::informer::Informers;
use crate::stalled::Verdict;

/// The failing step: `api` (an API read or write).
impl crate::k8s::ReconcileError for Error {
    fn step(&self) -> &'static str {
        match self {
            Error::Kube(_) => "api",
        }
    }
}

/// Errors of a Workspace reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// API server error.
    #[error("{0}")]
    Kube(#[from] kube::Error),
}

/// The `Ready` condition `(status, reason, message)` to write.
type ReadyCondition = (String, String, String);

/// Whether the status to write — `new` (address, pool, observedGeneration) with the Ready condition `ready` — is
/// what `stored` already says; then nothing is written (a runtime that looks every few seconds must not write each
/// time). Pure.
fn status_unchanged(
    stored: &WorkspaceStatus,
    new: &WorkspaceStatus,
    (status, reason, message): (&str, &str, &str),
) -> bool {
    let conds = stored.conditions.as_deref().unwrap_or_default();
    stored.address == new.address
        && stored.pool == new.pool
        && stored.observed_generation == new.observed_generation
        && conds.iter().filter(|c| c.type_ == wc::READY).count() == 1
        && conds.iter().any(|c| {
            c.type_ == wc::READY
                && c.status == status
                && c.reason == reason
                && c.message == message
                && c.observed_generation == new.observed_generation
        })
}

/// The `Ready` condition of `ws` whose runtime says `ready`: up or waiting, False with the stall's reason and message
/// while `ws` is Stalled (PKO); failed, as it says. Pure.
fn with_stall(ws: &Workspace, ready: &Ready) -> ReadyCondition {
    let own = |s: &str, r: &str, m: &str| (s.to_string(), r.to_string(), m.to_string());
    match (ready, ws.stalled()) {
        (Ready::Failed(reason, message), _) => own("False", reason, message),
        (_, Some(c)) => own("False", &c.reason, &c.message),
        (Ready::Up, None) => own("True", wc::SUCCEEDED, ""),
        (Ready::Waiting(reason, message), None) => own("False", reason, message),
    }
}

/// The status `stored` with what `r` reports (address, pool, the agent's CLI) at generation `generation`. Pure.
fn reported(stored: &WorkspaceStatus, r: &Readiness, generation: Option<i64>) -> WorkspaceStatus {
    let mut st = stored.clone();
    st.observed_generation = generation;
    st.address = r.address.clone();
    st.pool = r.pool.clone();
    if let Some(v) = &r.pulumi_version {
        st.pulumi_version = Some(v.clone());
    }
    st
}

/// How a pass ends after its status write: looked at again when the runtime says, else at the next change. Pure.
fn next(r: &Readiness) -> Action {
    r.again.map(Action::requeue).unwrap_or_else(Action::await_change)
}

/// The last initialization of a Workspace (by uid) on this replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// Initialized (later generations are prepared by their operations).
    Done,
    /// Stalled at this generation, at this instant (tried again after [`INITIALIZE_AGAIN`]).
    Stalled(Option<i64>, std::time::Instant),
}

/// How long a Workspace whose initialization stalled waits before it is tried again (PKO tries only with a new pod;
/// here a stack created since, or a Secret mended, is found within this).
pub const INITIALIZE_AGAIN: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a Workspace whose initialization could not run now (no agent free, unreachable) waits.
const INITIALIZE_LATER: std::time::Duration = std::time::Duration::from_secs(5);

/// PKO's Ready message while a Workspace is initialized.
pub const INITIALIZING_MESSAGE: &str = "Initializing and selecting a Pulumi stack";

/// Whether `ws`, whose agents are up, is initialized now (PKO's workspace initialization), given this replica's last
/// attempt `last` at `now`: before it is first Ready (on pooled agents only for a stack with `create: false`), and on
/// any runtime again every [`INITIALIZE_AGAIN`] while Stalled at this generation by an initialization or an operation.
/// Pure.
fn wants_initialization(ws: &Workspace, pooled: bool, last: Option<Attempt>, now: std::time::Instant) -> bool {
    // Later generations are prepared by their operations: an initialization per spec change would hold the agent from
    // the Update that follows; pooled operations select their stack anyway.
    let generation = ws.meta().generation;
    let stacks = ws.spec.stacks.as_deref().unwrap_or_default();
    let stalled = ws
        .stalled()
        .is_some_and(|c| c.observed_generation == generation && wc::OPERATION_STALLS.contains(&c.reason.as_str()));
    match last {
        Some(Attempt::Stalled(g, at)) if g == generation && now.duration_since(at) < INITIALIZE_AGAIN => false,
        _ if stacks.is_empty() || ws.meta().deletion_timestamp.is_some() => false,
        _ if stalled => true,
        Some(Attempt::Done) => false,
        _ if ws.is_ready() => false,
        _ => !pooled || stacks.iter().any(|s| s.create == Some(false)),
    }
}

/// When the initialization of `ws`, Stalled at its generation after this replica's attempt `last`, is due again at
/// `now`; `None` when it is not stalled or not waiting on an attempt. Pure.
fn retry_due(ws: &Workspace, last: Option<Attempt>, now: std::time::Instant) -> Option<std::time::Duration> {
    let stalled = ws.stalled().is_some_and(|c| wc::OPERATION_STALLS.contains(&c.reason.as_str()));
    match last {
        Some(Attempt::Stalled(g, at)) if stalled && g == ws.meta().generation => {
            Some(INITIALIZE_AGAIN.saturating_sub(now.duration_since(at)).max(std::time::Duration::from_secs(1)))
        }
        _ => None,
    }
}

/// The Workspace controller.
pub struct WorkspaceController {
    ctx: Arc<Context>,
    agents: Arc<Agents>,
    attempts: std::sync::Mutex<std::collections::HashMap<String, Attempt>>,
}

impl WorkspaceController {
    /// A controller bringing agents up with `agents`.
    pub fn new(ctx: Arc<Context>, agents: Arc<Agents>) -> Arc<Self> {
        Arc::new(Self { ctx, agents, attempts: Default::default() })
    }

    /// The controller's run, watching through `informers` (Workspaces, and the StatefulSets of their own pods), with
    /// the runtime maintained beside it ([`Agents::maintain`]): run the future until shutdown; the runtime gets 5 s
    /// after the controller to wind down (pools stop idle agents, own processes stop).
    pub fn run(self: Arc<Self>, informers: &mut Informers) -> impl std::future::Future<Output = ()> + Send + 'static {
        let store = informers.workspaces().store();
        let controller = Controller::for_stream(informers.workspaces().objects(), store.clone());
        let controller = if self.agents.owns_stateful_sets() {
            controller.owns_stream(informers.stateful_sets().objects())
        } else {
            controller
        };
        let deletions = self.agents.follows_deletions().then(|| informers.workspaces().subscribe());
        let this = self.clone();
        async move {
            let maintain = tokio::spawn(this.agents.clone().maintain(store, deletions, this.ctx.shutdown.clone()));
            crate::k8s::run_controller(
                controller,
                this.ctx.running(),
                "workspace",
                |w, c: Arc<Self>| c.reconcile(w),
                this.clone(),
            )
            .await;
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), maintain).await;
        }
    }

    fn owned(&self, ws: &Workspace) -> bool {
        self.ctx.ownership.owns(&ws.namespace().unwrap_or_default(), &ws.shard_key())
    }

    async fn reconcile(self: Arc<Self>, ws: Arc<Workspace>) -> Result<Action, Error> {
        if !self.owned(&ws) {
            return Ok(crate::k8s::unowned());
        }
        let api: Api<Workspace> = Api::namespaced(self.ctx.client.clone(), &ws.namespace().unwrap_or_default());
        let stored = ws.status.clone().unwrap_or_default();
        if ws.meta().deletion_timestamp.is_some() {
            self.attempts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&ws.uid().unwrap_or_default());
            let deleting = Readiness::new(Ready::Failed(wc::DELETING.into(), "workspace is being deleted".into()));
            let st = WorkspaceStatus { observed_generation: ws.meta().generation, ..stored };
            self.write(&api, &ws, st, &with_stall(&ws, &deleting.ready)).await?;
            return Ok(Action::await_change());
        }
        if let Some(action) = self.spec_stall(&api, &ws, &stored).await? {
            return Ok(action);
        }
        let readiness = self.agents.prepare(&ws).await?;
        let readiness = if readiness.ready == Ready::Up { self.initialize(&ws, readiness).await } else { readiness };
        if let Some(message) = &readiness.warning {
            tracing::info!(workspace = %ws.name_any(), namespace = ?ws.namespace(), %message,
                "workspace agent not answering; looking again");
            let reason = pko_api::constants::event_reason::CONNECTION_FAILURE;
            crate::k8s::publish(
                &self.ctx.events.workspace,
                ws.as_ref(),
                crate::k8s::Severity::Warning,
                reason,
                message.clone(),
            )
            .await;
        }
        let st = reported(&stored, &readiness, ws.meta().generation);
        self.write(&api, &ws, st, &with_stall(&ws, &readiness.ready)).await?;
        Ok(next(&readiness))
    }

    /// Step **initialize** of a Workspace whose agents are up (`readiness`), when [`wants_initialization`]: its stacks
    /// selected and configured on an agent. A stall (the agent's verdict, or a request the user must fix) is recorded
    /// as an operation's is, with PKO's event, and makes the Workspace Ready False at once; a success clears an earlier
    /// stall; an agent not to be had now leaves it `Initializing`, looked at again soon.
    async fn initialize(&self, ws: &Workspace, readiness: Readiness) -> Readiness {
        let uid = ws.uid().unwrap_or_default();
        let last = self.attempts.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&uid).copied();
        let now = std::time::Instant::now();
        if !wants_initialization(ws, self.agents.pooled(), last, now) {
            // a stalled one is looked at again when its next initialization is due, whatever woke it
            let due = retry_due(ws, last, now);
            return Readiness { again: readiness.again.into_iter().chain(due).min(), ..readiness };
        }
        let verdict = match self
            .agents
            .initialize(ws, &readiness, &self.ctx.github_api_url, &self.ctx.advertised_addr, &self.ctx.secrets)
            .await
        {
            Initialization::Ran(r) => crate::stalled::verdict(&r),
            Initialization::Invalid(message) => Verdict::Stalled { reason: wc::INITIALIZATION_FAILED, message },
            Initialization::Later(m) => {
                let waiting = Ready::Waiting(wc::INITIALIZING, format!("{INITIALIZING_MESSAGE}: {m}"));
                return Readiness { again: Some(INITIALIZE_LATER), ..Readiness { ready: waiting, ..readiness } };
            }
        };
        // fenced: the shard may have moved while the agent ran it
        if !self.owned(ws) {
            return readiness;
        }
        let stack = ws.spec.stacks.as_deref().unwrap_or_default().first().map(|s| s.name.clone()).unwrap_or_default();
        crate::stalled::record(&self.ctx.client, &self.ctx.events, ws, &verdict, &stack).await;
        let generation = ws.meta().generation;
        let (attempt, readiness) = match verdict {
            Verdict::Stalled { reason, message } => (
                Attempt::Stalled(generation, std::time::Instant::now()),
                Readiness {
                    again: Some(INITIALIZE_AGAIN),
                    ..Readiness { ready: Ready::Failed(reason.into(), message), ..readiness }
                },
            ),
            Verdict::Initialized | Verdict::Unknown => (Attempt::Done, readiness),
        };
        self.attempts.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(uid, attempt);
        readiness
    }

    /// A spec this version cannot run (PKO's schema admits any string for these): Stalled `SpecInvalid` until it
    /// changes; a stall of an earlier generation, or of a spec since mended, is cleared. `Some`: the pass ends here.
    async fn spec_stall(
        &self,
        api: &Api<Workspace>,
        ws: &Workspace,
        stored: &WorkspaceStatus,
    ) -> Result<Option<Action>, Error> {
        let error = crate::stalled::spec_error(&ws.spec);
        if error.is_none() && !crate::stalled::outdated(ws) {
            return Ok(None);
        }
        // fenced: the shard may have moved since the pass began
        if !self.owned(ws) {
            return Ok(Some(crate::k8s::unowned()));
        }
        match error {
            Some(message) => {
                crate::stalled::apply(&self.ctx.client, ws, Some((wc::SPEC_INVALID, &message))).await?;
                let st = WorkspaceStatus { observed_generation: ws.meta().generation, ..stored.clone() };
                self.write(api, ws, st, &("False".into(), wc::SPEC_INVALID.into(), message)).await?;
            }
            // the write wakes this controller again, with the condition gone
            None => _ = crate::stalled::apply(&self.ctx.client, ws, None).await?,
        }
        Ok(Some(Action::await_change()))
    }

    /// Writes `st` with the Ready condition `ready` unless that is what is stored, or this replica no longer owns `ws`.
    async fn write(
        &self,
        api: &Api<Workspace>,
        ws: &Workspace,
        mut st: WorkspaceStatus,
        (status, reason, message): &ReadyCondition,
    ) -> Result<(), Error> {
        if status_unchanged(&ws.status.clone().unwrap_or_default(), &st, (status, reason, message)) {
            return Ok(());
        }
        // fenced: the shard may have moved while this pass ran (or this replica was frozen)
        if !self.owned(ws) {
            return Ok(());
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let mut conditions: Vec<Condition> =
            st.conditions.take().unwrap_or_default().into_iter().filter(|c| c.type_ == wc::READY).collect();
        pko_api::conditions::set(&mut conditions, wc::READY, status, reason, message, st.observed_generation, &now);
        st.conditions = Some(conditions);
        crate::k8s::apply_status(api, &ws.name_any(), field_manager::WORKSPACE_STATUS, &st).await?;
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
    fn a_stalled_workspace_is_not_ready_with_the_stall_s_reason() {
        let mut ws = Workspace::new("w", Default::default());
        ws.metadata.generation = Some(3);
        let own = |s: &str, r: &str, m: &str| (s.to_string(), r.to_string(), m.to_string());
        assert_eq!(with_stall(&ws, &Ready::Up), own("True", wc::SUCCEEDED, ""));
        let mut stall = stored(None, 3, "True", wc::INSTALLATION_FAILED);
        stall.conditions.as_mut().unwrap()[0].type_ = wc::STALLED.into();
        stall.conditions.as_mut().unwrap()[0].message = "pulumi install failed".into();
        ws.status = Some(stall);
        assert_eq!(with_stall(&ws, &Ready::Up), own("False", wc::INSTALLATION_FAILED, "pulumi install failed"));
        assert_eq!(
            with_stall(&ws, &Ready::Waiting(wc::WAITING_FOR_REPLICAS, "w".into())),
            own("False", wc::INSTALLATION_FAILED, "pulumi install failed")
        );
        assert_eq!(
            with_stall(&ws, &Ready::Failed(wc::CONNECTION_FAILED.into(), "down".into())),
            own("False", wc::CONNECTION_FAILED, "down"),
            "a failed agent says so"
        );
        ws.metadata.generation = Some(4);
        assert_eq!(with_stall(&ws, &Ready::Up), own("True", wc::SUCCEEDED, ""), "a new generation is tried again");
    }

    #[test]
    fn workspaces_are_initialized_once_per_generation_and_stalled_ones_again_after_a_while() {
        let now = std::time::Instant::now();
        let ws = |create: Option<bool>, stall: Option<(&str, i64)>| {
            let mut w: Workspace =
                serde_json::from_value(serde_json::json!({"metadata": {"name": "w", "generation": 2},
                    "spec": {"stacks": [{"name": "dev", "create": create}]}}))
                .unwrap();
            if let Some((reason, generation)) = stall {
                let mut st = stored(None, generation, "True", reason);
                st.conditions.as_mut().unwrap()[0].type_ = wc::STALLED.into();
                w.status = Some(st);
            }
            w
        };
        let (own, pooled) = (false, true);
        assert!(wants_initialization(&ws(None, None), own, None, now), "its own agent: as PKO's pod");
        assert!(
            !wants_initialization(&ws(None, None), own, Some(Attempt::Done), now),
            "once: a new generation is prepared by its operations"
        );
        let mut ready = ws(None, None);
        ready.status = Some(stored(None, 1, "True", wc::SUCCEEDED));
        assert!(
            !wants_initialization(&ready, own, None, now),
            "Ready before (another replica, an earlier run): not again"
        );
        assert!(!wants_initialization(&ws(None, None), pooled, None, now), "pooled: every operation selects its stack");
        assert!(
            wants_initialization(&ws(Some(false), None), pooled, None, now),
            "pooled, a stack that must exist already"
        );
        let stalled = ws(None, Some((wc::INITIALIZATION_FAILED, 2)));
        assert!(
            wants_initialization(&stalled, pooled, Some(Attempt::Done), now),
            "stalled by an operation: mended by an initialization"
        );
        let just_now = Some(Attempt::Stalled(Some(2), now));
        assert!(!wants_initialization(&stalled, own, just_now, now + std::time::Duration::from_secs(59)));
        assert!(wants_initialization(&stalled, own, just_now, now + INITIALIZE_AGAIN), "tried again after a while");
        assert_eq!(
            retry_due(&stalled, just_now, now + std::time::Duration::from_secs(20)),
            Some(std::time::Duration::from_secs(40)),
            "whatever woke it, looked at again when due"
        );
        assert_eq!(retry_due(&ws(None, None), just_now, now), None, "no longer stalled");
        assert_eq!(retry_due(&stalled, Some(Attempt::Done), now), None);
        assert!(
            !wants_initialization(&ws(None, Some((wc::SPEC_INVALID, 2))), pooled, None, now),
            "a spec it cannot run is not initialized"
        );
        let none: Workspace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "w"}, "spec": {}})).unwrap();
        assert!(!wants_initialization(&none, own, None, now), "no stacks");
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

    #[test]
    fn a_readiness_reports_address_pool_and_cli_and_keeps_what_it_does_not_know() {
        let stored = WorkspaceStatus {
            pulumi_version: Some("3.1.0".into()),
            address: Some("old:1".into()),
            ..Default::default()
        };
        let pooled = Readiness { pool: Some("ns/abc".into()), ..Readiness::new(Ready::Up) };
        let st = reported(&stored, &pooled, Some(2));
        assert_eq!(
            (st.address, st.pool.as_deref(), st.pulumi_version.as_deref(), st.observed_generation),
            (None, Some("ns/abc"), Some("3.1.0"), Some(2))
        );
        let probed = Readiness {
            address: Some("a:1".into()),
            pulumi_version: Some("3.2.0".into()),
            again: Some(std::time::Duration::from_secs(300)),
            ..Readiness::new(Ready::Up)
        };
        assert_eq!(reported(&stored, &probed, Some(2)).pulumi_version.as_deref(), Some("3.2.0"));
        assert_eq!(next(&probed), Action::requeue(std::time::Duration::from_secs(300)));
        assert_eq!(next(&pooled), Action::await_change());
    }
}
