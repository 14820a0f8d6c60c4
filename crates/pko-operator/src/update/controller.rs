//! The Update controller — asynchronous: a reconcile never waits for an operation. It pushes a job onto the work
//! queue ([`crate::queue`]) and returns; a fixed set of workers (how many operations this replica drives at once,
//! [`super::worker`]) pops jobs and runs each on an agent of the runtime ([`crate::agents`]), writing the result. A
//! Progressing Update found without a job (operator restart) is pushed again, and its worker re-attaches to the running
//! operation by its stable id. Completed Updates are deleted after `ttlAfterCompleted`.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DeleteParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use pko_api::constants::update_condition as uc;
use pko_api::shard::ShardKey;
use pko_api::{Update, Workspace};

use super::status::{self, Phase};
use crate::agents::Agents;
use crate::agents::limits::ClassLimits;
use crate::agents::tokens::AgentTokens;
use crate::context::Context;
use crate::informer::Informers;
use crate::queue::{InMemoryQueue, Job, WorkQueue};

/// State of the Update controller and its workers ([`super::worker`]).
pub struct UpdateController {
    pub(super) ctx: Arc<Context>,
    pub(super) queue: Arc<dyn WorkQueue>,
    workers: usize,
    /// Operations per workspace class.
    pub(super) class_limits: Arc<ClassLimits>,
    /// Where agents run, and how they are lent.
    pub(super) agents: Arc<Agents>,
    /// The queue's gauges.
    pub(super) gauges: QueueGauges,
    /// The Workspace informer's cache, set by [`Self::run`] ([`Self::workspace`]).
    workspaces: Option<kube::runtime::reflector::Store<Workspace>>,
    /// The Update informer's cache, set by [`Self::run`] ([`Self::update`]).
    updates: Option<kube::runtime::reflector::Store<Update>>,
    /// Cancel requests of running operations, for their workers ([`super::cancel`]).
    pub(super) cancels: super::cancel::CancelRequests,
    /// Jobs held for a busy pool agent, woken when it is given back ([`super::holds`]).
    pub(super) holds: super::holds::Holds,
}

impl std::fmt::Debug for UpdateController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpdateController")
            .field("queued", &self.queue.queued())
            .field("in_flight", &self.queue.in_flight())
            .finish()
    }
}

/// The queue's gauges: depth per namespace (a namespace whose queue emptied is set to 0 once, then forgotten), queued
/// and in flight.
#[derive(Debug, Default)]
pub struct QueueGauges {
    shown: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl QueueGauges {
    /// Publishes `queue`'s depth.
    pub fn record(&self, queue: &dyn WorkQueue) {
        let depth = queue.queued_by_namespace();
        crate::load::set_queue(&depth, queue.in_flight());
        let mut shown = self.shown.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for gone in shown.iter().filter(|n| !depth.contains_key(*n)) {
            metrics::gauge!(crate::metric_names::QUEUE_DEPTH, "namespace" => gone.clone()).set(0.0);
        }
        for (ns, n) in &depth {
            metrics::gauge!(crate::metric_names::QUEUE_DEPTH, "namespace" => ns.clone()).set(*n as f64);
        }
        *shown = depth.into_keys().collect();
        metrics::gauge!(crate::metric_names::OPERATIONS_QUEUED).set(queue.queued() as f64);
        metrics::gauge!(crate::metric_names::WORKQUEUE_DEPTH, "name" => "update").set(queue.queued() as f64);
        metrics::gauge!(crate::metric_names::OPERATIONS_IN_FLIGHT).set(queue.in_flight() as f64);
    }
}

/// The message of an Update canceled for having no controller owner.
pub const ORPHANED_MESSAGE: &str = "canceled: the Update has no controller owner; as in PKO, an Update runs only with \
    an ownerReference (controller: true) to its Workspace or Stack";

/// Whether a job's claim may take the cached Update as it is: one neither started (whose agent must be looked for with
/// what is stored) nor complete nor being deleted. Pure.
pub fn claimable_as_cached(update: &Update) -> bool {
    !update.was_started() && !update.is_complete() && update.meta().deletion_timestamp.is_none()
}

/// Whether `update` was never started and has no controller owner reference: PKO cancels such an Update (`isOrphaned`:
/// an Update created by hand, or left behind by an owner deleted with `--cascade=orphan`). One that was started is
/// followed to its result (its agent may be running it). Pure.
pub fn orphaned(update: &Update) -> bool {
    !update.was_started() && !update.owner_references().iter().any(|o| o.controller == Some(true))
}

/// Why a queued Update of namespace `ns` waits: the namespace runs `running` operations, its `limit`
/// (`--namespace-share-percent` of `--max-operations`, or `--max-operations-per-namespace`). Pure.
pub fn queued_message(ns: &str, running: usize, limit: usize) -> String {
    format!(
        "waiting for an operation slot: namespace {ns} runs {running} operation(s), its share of this replica's \
            workers is {limit}"
    )
}

/// Why a queued Update of workspace class `class` waits: the class runs `running` operations, its `limit`
/// (`--max-operations-per-class`). Pure.
pub fn class_queued_message(class: &str, running: usize, limit: usize) -> String {
    format!("waiting for an operation slot: workspace class {class} runs {running} operation(s), its limit is {limit}")
}

/// An Update reconcile fails only on the API (step `api`).
impl crate::k8s::ReconcileError for Error {
    fn step(&self) -> &'static str {
        "api"
    }
}

/// Errors of an Update reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing the API failed.
    #[error("{0}")]
    Kube(#[from] kube::Error),
}

impl UpdateController {
    /// A controller driving at most `max_operations` operations at once, with the in-memory queue, on agents someone
    /// else runs at each Workspace's `status.address`, called without credentials.
    pub fn new(ctx: Arc<Context>, max_operations: usize) -> Self {
        Self::with_queue(ctx, Arc::new(InMemoryQueue::default()), max_operations)
    }

    /// A controller on `queue` with `workers` operation workers.
    pub fn with_queue(ctx: Arc<Context>, queue: Arc<dyn WorkQueue>, workers: usize) -> Self {
        let agents = Arc::new(Agents::addressed(ctx.client.clone(), None));
        Self {
            ctx,
            queue,
            workers: workers.max(1),
            class_limits: ClassLimits::new(workers),
            agents,
            gauges: QueueGauges::default(),
            workspaces: None,
            updates: None,
            cancels: Default::default(),
            holds: Default::default(),
        }
    }

    /// Runs operations on the agents of `agents` (the runtime the Workspace controller shares).
    pub fn with_agents(mut self, agents: Arc<Agents>) -> Self {
        self.agents = agents;
        self
    }

    /// Calls agents someone else runs at each Workspace's `status.address` with tokens of a service account, one per
    /// Workspace audience ([`crate::agents::tokens`]) — what agents in pods (`--auth kube`) require.
    pub fn with_agent_tokens(mut self, tokens: AgentTokens) -> Self {
        self.agents = Arc::new(Agents::addressed(self.ctx.client.clone(), Some(Arc::new(tokens))));
        self
    }

    /// At most `limit` operations at once per workspace class ([`crate::agents::limits`]); by default the number of
    /// workers (no limit beyond theirs).
    pub fn with_class_limit(mut self, limit: usize) -> Self {
        self.class_limits = ClassLimits::new(limit);
        self
    }

    /// The controller and its workers, watching Updates through `informers`: run the future until shutdown.
    pub fn run(mut self, informers: &mut Informers) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.workspaces = Some(informers.workspaces().store());
        let updates = informers.updates();
        self.updates = Some(updates.store());
        let controller = Controller::for_stream(updates.objects(), updates.store());
        let this = Arc::new(self);
        async move {
            // at zero from the start: a rate of deferrals reads 0, not "no data", before the first one
            metrics::counter!(crate::metric_names::OPERATIONS_DEFERRED_TOTAL).increment(0);
            metrics::counter!(crate::metric_names::OPERATIONS_HELD_TOTAL).increment(0);
            let workers: Vec<_> = (0..this.workers).map(|_| tokio::spawn(this.clone().worker())).collect();
            crate::k8s::run_controller(
                controller,
                this.ctx.running(),
                "update",
                |u, c: Arc<Self>| c.reconcile(u),
                this.clone(),
            )
            .await;
            for w in workers {
                w.abort();
            }
        }
    }

    /// The Workspace `update` runs on: the cached one when it is usable ([`Agents::usable`]) and at the generation the
    /// Update was made for ([`made_for`]), else one read from the API server, since a cache can trail the Stack's own
    /// apply and an operation built from it would run the previous spec. `None`: there is none.
    ///
    /// Errors: the read failed.
    pub(super) async fn workspace(&self, update: &Update) -> Result<Option<Workspace>, kube::Error> {
        let ns = update.namespace().unwrap_or_default();
        let name = update.spec.workspace_name.clone().unwrap_or_default();
        let api = Api::<Workspace>::namespaced(self.ctx.client.clone(), &ns);
        match &self.workspaces {
            Some(store) => {
                crate::k8s::cached_or_get(store, &api, &name, |w| self.agents.usable(w) && made_for(update, w)).await
            }
            None => api.get_opt(&name).await,
        }
    }

    /// The Update `ns/name` a job names: from the Update cache when it shows it neither started nor complete nor
    /// deleted (what a claim needs to know; a write decided on it is pinned to its `resourceVersion`), else read from
    /// the API server (not cached yet, or one that may run on an agent already: whose it is must be read as stored).
    /// `None`: there is none.
    ///
    /// Errors: the read failed.
    pub(super) async fn update(&self, ns: &str, name: &str) -> Result<Option<Update>, kube::Error> {
        let api = Api::<Update>::namespaced(self.ctx.client.clone(), ns);
        match &self.updates {
            Some(store) => crate::k8s::cached_or_get(store, &api, name, claimable_as_cached).await,
            None => api.get_opt(name).await,
        }
    }

    fn owns(&self, update: &Update) -> bool {
        self.ctx.ownership.owns(&update.namespace().unwrap_or_default(), &update.shard_key())
    }

    async fn reconcile(self: Arc<Self>, update: Arc<Update>) -> Result<Action, Error> {
        let ns = update.namespace().unwrap_or_default();
        let name = update.name_any();
        let shard_key = update.shard_key();
        if !self.ctx.ownership.owns(&ns, &shard_key) {
            return Ok(crate::k8s::unowned());
        }
        if update.meta().deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let api: Api<Update> = Api::namespaced(self.ctx.client.clone(), &ns);
        if update.is_complete() {
            return self.expire(&api, &update).await;
        }
        if orphaned(&update) {
            self.cancel(&api, &update, ORPHANED_MESSAGE.into()).await?;
            return Ok(Action::await_change());
        }
        // canceled on request: before it started, failed here; while it runs, its worker stops it
        if let Some(request) = super::cancel::requested(&update) {
            if !update.was_started() {
                self.cancel(&api, &update, super::cancel::message(request)).await?;
                return Ok(Action::await_change());
            }
            self.cancels.request(&update.operation_id(), request);
        }
        let ws_name = update.spec.workspace_name.clone().unwrap_or_default();
        let workspace = self.workspace(&update).await?;
        let ready = workspace.as_ref().is_some_and(|w| self.agents.usable(w));
        if !ready {
            let (reason, message) = match workspace {
                None => (uc::WORKSPACE_NOT_FOUND, format!("workspace {ws_name:?} not found")),
                Some(w) => match w.not_ready_reason() {
                    Some(c) => (
                        uc::WORKSPACE_NOT_READY,
                        format!("workspace {ws_name} is not ready: {}: {}", c.reason, c.message),
                    ),
                    None => {
                        (uc::WORKSPACE_NOT_READY, format!("workspace {ws_name} is not ready (no agent address yet)"))
                    }
                },
            };
            self.wait(&api, &update, self.owns(&update), reason, message).await?;
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
        // its last attempt failed a moment ago: not at once again (that attempt's own status writes
        // woke this reconcile)
        if let Some(wait) = transient_retry_in(&update, k8s_openapi::jiff::Timestamp::now()) {
            return Ok(Action::requeue(wait));
        }
        let key = update.operation_id();
        let job = Job {
            key: key.clone(),
            namespace: ns.clone(),
            name: name.clone(),
            epoch: self.ctx.ownership.epoch(&ns, &shard_key),
            shard: self.ctx.ownership.shard(&ns, &shard_key),
        };
        match self.queue.push(job).await {
            Ok(true) => {
                tracing::debug!(update = %name, "queued");
                self.gauges.record(&*self.queue);
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(update = %name, error = %e, "not queued; retrying"),
        }
        // held back by its namespace's share: said once on the Update (its Stack shows it)
        if let Some(message) =
            self.queue.local().held_by_limit(&key).map(|(running, limit)| queued_message(&ns, running, limit))
            && update.queued_message() != Some(message.as_str())
        {
            self.wait(&api, &update, self.owns(&update), uc::QUEUED, message).await?;
        }
        // Look again later: a finished job lets the next reconcile see the result (or push it again).
        Ok(Action::requeue(Duration::from_secs(10)))
    }

    /// Writes the Update's status as waiting (`reason`, `message`) — unless fenced (`holds` false: the shard is not
    /// held any more or, for a job's dispatch, not at the job's epoch), e.g. because this replica was frozen while it
    /// read the API; then nothing is written.
    pub(super) async fn wait(
        &self,
        api: &Api<Update>,
        update: &Update,
        holds: bool,
        reason: &'static str,
        message: String,
    ) -> Result<(), kube::Error> {
        self.wait_at(api, update, holds, reason, message, None).await
    }

    /// [`Self::wait`] only while the Update is still at `resource_version` when one is given (a wait decided on a
    /// cached read: 409 Conflict when the Update changed since, nothing written).
    ///
    /// Errors: the write failed.
    pub(super) async fn wait_at(
        &self,
        api: &Api<Update>,
        update: &Update,
        holds: bool,
        reason: &'static str,
        message: String,
        resource_version: Option<&str>,
    ) -> Result<(), kube::Error> {
        if !holds {
            tracing::info!(update = %update.name_any(), %reason,
                "shard not held (at this epoch): waiting status not written");
            return Ok(());
        }
        let mut st = update.status.clone().unwrap_or_default();
        let old = st.conditions.clone().unwrap_or_default();
        st.conditions = Some(status::conditions(
            &Phase::Waiting { reason, message },
            update.meta().generation,
            &pko_api::conditions::now(),
            &old,
        ));
        crate::k8s::apply_status_versioned(
            api,
            &update.name_any(),
            pko_api::constants::field_manager::UPDATE_STATUS,
            &st,
            resource_version,
        )
        .await
        .map(|_| ())
    }

    /// Marks an Update that never started Failed `Canceled` with `message` — [`orphaned`] (PKO's `isOrphaned`) or
    /// canceled on request — once, unless fenced.
    async fn cancel(&self, api: &Api<Update>, update: &Update, message: String) -> Result<(), kube::Error> {
        if !self.owns(update) {
            return Ok(());
        }
        let mut st = update.status.clone().unwrap_or_default();
        let old = st.conditions.clone().unwrap_or_default();
        let now = pko_api::conditions::now();
        st.conditions = Some(status::conditions(
            &Phase::Failed { reason: uc::CANCELED.into(), message: message.clone() },
            update.meta().generation,
            &now,
            &old,
        ));
        st.observed_generation = update.meta().generation;
        tracing::info!(update = %update.name_any(), %message, "canceled before it started");
        st.message = Some(message);
        st.end_time = Some(now);
        crate::k8s::apply_status(api, &update.name_any(), pko_api::constants::field_manager::UPDATE_STATUS, &st).await
    }

    async fn expire(&self, api: &Api<Update>, update: &Update) -> Result<Action, Error> {
        let Some(ttl) = update
            .spec
            .ttl_after_completed
            .as_deref()
            .and_then(|d| pko_api::duration::parse_go_duration_or_zero(d).ok())
        else {
            return Ok(Action::await_change());
        };
        let Some(end) = update.status.as_ref().and_then(|s| s.end_time.clone()) else {
            return Ok(Action::await_change());
        };
        let age = k8s_openapi::jiff::Timestamp::now().duration_since(end.0).unsigned_abs();
        if age >= ttl {
            // fenced: the event and the delete are writes
            if !self.owns(update) {
                return Ok(crate::k8s::unowned());
            }
            crate::k8s::publish(
                &self.ctx.events.update,
                update,
                crate::k8s::Severity::Normal,
                pko_api::constants::event_reason::UPDATE_EXPIRED,
                // PKO's text, then the ttl
                format!("ttl expired and was deleted (ttlAfterCompleted {ttl:?})"),
            )
            .await;
            api.delete(&update.name_any(), &DeleteParams::background()).await?;
            tracing::info!(update = %update.name_any(), "update expired (ttlAfterCompleted)");
            return Ok(Action::await_change());
        }
        Ok(Action::requeue(ttl - age))
    }
}

/// Whether `workspace` is at the generation `update` was made for (`spec.workspaceGeneration`; any, for an Update that
/// names none: made by hand). Pure.
pub fn made_for(update: &Update, workspace: &Workspace) -> bool {
    update.spec.workspace_generation.is_none_or(|g| workspace.metadata.generation == Some(g))
}

/// How long after an attempt that left its Update `TransientFailure` the job is pushed again.
pub const TRANSIENT_RETRY: Duration = Duration::from_secs(5);

/// The time left before `update`'s job may be pushed again at `now`: some while its `Progressing` condition has said
/// `TransientFailure` for less than [`TRANSIENT_RETRY`] (an agent refusing or unreachable is not called in a tight
/// loop), else none. Pure.
pub fn transient_retry_in(update: &Update, now: k8s_openapi::jiff::Timestamp) -> Option<Duration> {
    let c = update
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == uc::PROGRESSING && c.reason == uc::TRANSIENT_FAILURE)?;
    let since = now.duration_since(c.last_transition_time.0).unsigned_abs();
    TRANSIENT_RETRY.checked_sub(since).filter(|d| !d.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_without_a_controller_owner_is_orphaned_until_started() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let owner = |controller| OwnerReference {
            api_version: "auto.pulumi.com/v1alpha1".into(),
            kind: "Workspace".into(),
            name: "w".into(),
            uid: "u".into(),
            controller,
            ..Default::default()
        };
        let mut u: Update =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "u"}, "spec": {"workspaceName": "w"}}))
                .unwrap();
        assert!(orphaned(&u), "created by hand");
        u.metadata.owner_references = Some(vec![owner(None)]);
        assert!(orphaned(&u), "an owner that is not the controller");
        u.metadata.owner_references = Some(vec![owner(Some(true))]);
        assert!(!orphaned(&u));
        u.metadata.owner_references = None;
        u.status =
            Some(pko_api::update::UpdateStatus { start_time: Some(pko_api::conditions::now()), ..Default::default() });
        assert!(!orphaned(&u), "started: followed to its result");
    }

    #[test]
    fn a_transient_failure_is_retried_after_a_pause_not_at_once() {
        let at = |s: i64| k8s_openapi::jiff::Timestamp::from_second(s).unwrap();
        let mut u: Update = serde_json::from_value(serde_json::json!({"metadata": {"name": "u"}, "spec": {}})).unwrap();
        assert_eq!(transient_retry_in(&u, at(100)), None, "never attempted");
        let conditions = |reason: &'static str| {
            status::conditions(
                &Phase::Waiting { reason, message: "refused".into() },
                Some(1),
                &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(100)),
                &[],
            )
        };
        u.status = Some(pko_api::update::UpdateStatus {
            conditions: Some(conditions(uc::TRANSIENT_FAILURE)),
            ..Default::default()
        });
        assert_eq!(transient_retry_in(&u, at(101)), Some(Duration::from_secs(4)));
        assert_eq!(transient_retry_in(&u, at(105)), None, "the pause is over");
        u.status = Some(pko_api::update::UpdateStatus {
            conditions: Some(conditions(uc::WORKSPACE_NOT_READY)),
            ..Default::default()
        });
        assert_eq!(transient_retry_in(&u, at(101)), None, "only after a failed attempt");
    }
}
