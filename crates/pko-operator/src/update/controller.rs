//! The Update controller — asynchronous: a reconcile never waits for an operation. It pushes a job onto
//! the work queue ([`crate::queue`]) and returns; a fixed set of workers (how many operations this replica
//! drives at once) pops jobs and runs each on the Workspace's agent ([`super::dispatch`]), writing the
//! result. A Progressing Update found without a job (operator restart) is pushed again, and its worker
//! re-attaches to the running operation by its stable id. Completed Updates are deleted after
//! `ttlAfterCompleted`.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DeleteParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;

use crate::informer::Informers;
use kube::{Resource, ResourceExt};
use pko_api::constants::update_condition as uc;
use pko_api::shard::ShardKey;
use pko_api::{Update, Workspace};
use pko_proto::v1::ResultStatus;

use super::limits::{ClassLimits, workspace_class};
use super::status::{self, Phase};
use super::tokens::AgentTokens;
use crate::context::Context;
use crate::queue::{InMemoryQueue, Job, WorkQueue};
use crate::workspace::pool::{AgentPools, End, Lent};

/// State of the Update controller.
pub struct UpdateController {
    ctx: Arc<Context>,
    queue: Arc<dyn WorkQueue>,
    workers: usize,
    /// Operations per workspace class.
    class_limits: Arc<ClassLimits>,
    /// Per-workspace tokens for agents that authenticate callers (`--auth kube`); none: no credentials.
    tokens: Option<AgentTokens>,
    /// Agent pools per workspace class (`--agent-pools`); none: each Workspace's own agent
    /// (`status.address`).
    pools: Option<AgentPools>,
    /// Namespaces whose queue depth was last published (to set a drained one to 0).
    depth_shown: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// The Workspace informer's cache, set by [`Self::run`] ([`Self::workspace`]).
    workspaces: Option<kube::runtime::reflector::Store<Workspace>>,
}

impl std::fmt::Debug for UpdateController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpdateController").field("queued", &self.queue.queued()).field("in_flight", &self.queue.in_flight()).finish()
    }
}

/// What became of a job a worker popped.
#[derive(Debug, PartialEq, Eq)]
enum Drive {
    /// Run to a result, or nothing to run (gone, complete, no agent yet: its reconcile looks again).
    Done,
    /// Its workspace class was full: to be offered again.
    Deferred,
    /// Its agent is shutting down (`INTERRUPTED`): to be run again at once, on another agent.
    Again,
}

/// Whether an operation can run on Workspace `w`: pooled (`pooled`), a Ready Workspace is enough (its
/// agent is lent per operation) — or one Stalled by an earlier operation, which this one may mend;
/// else its own agent's address must be known. Pure.
/// The message of an Update canceled for having no controller owner.
pub const ORPHANED_MESSAGE: &str =
    "canceled: the Update has no controller owner; as in PKO, an Update runs only with an ownerReference (controller: true) to its Workspace or Stack";

/// Whether `update` was never started and has no controller owner reference: PKO cancels such an
/// Update (`isOrphaned`: an Update created by hand, or left behind by an owner deleted with
/// `--cascade=orphan`). One that was started is followed to its result (its agent may be running
/// it). Pure.
pub fn orphaned(update: &Update) -> bool {
    !update.was_started() && !update.owner_references().iter().any(|o| o.controller == Some(true))
}

fn workspace_usable(w: &Workspace, pooled: bool) -> bool {
    if pooled { w.runnable() } else { w.status.as_ref().and_then(|s| s.address.as_ref()).is_some() }
}

/// Why a queued Update of namespace `ns` waits: the namespace runs `running` operations, its `limit`
/// (`--namespace-share-percent` of `--max-operations`, or `--max-operations-per-namespace`). Pure.
pub fn queued_message(ns: &str, running: usize, limit: usize) -> String {
    format!("waiting for an operation slot: namespace {ns} runs {running} operation(s), its share of this replica's workers is {limit}")
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
    /// A controller driving at most `max_operations` operations at once, with the in-memory queue,
    /// calling agents without credentials (local agents, `--auth none`).
    pub fn new(ctx: Arc<Context>, max_operations: usize) -> Self {
        Self::with_queue(ctx, Arc::new(InMemoryQueue::default()), max_operations)
    }

    /// A controller on `queue` with `workers` operation workers.
    pub fn with_queue(ctx: Arc<Context>, queue: Arc<dyn WorkQueue>, workers: usize) -> Self {
        Self { ctx, queue, workers: workers.max(1), class_limits: ClassLimits::new(workers), tokens: None, pools: None, depth_shown: Default::default(), workspaces: None }
    }

    /// Authenticates to agents with tokens of a service account, one per Workspace audience
    /// ([`super::tokens`]) — what agents in pods (`--auth kube`) require.
    pub fn with_agent_tokens(mut self, tokens: AgentTokens) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// Runs operations on the agent pools of `pools` instead of each Workspace's own agent.
    pub fn with_pools(mut self, pools: AgentPools) -> Self {
        self.pools = Some(pools);
        self
    }

    /// At most `limit` operations at once per workspace class ([`super::limits`]); by default the number
    /// of workers (no limit beyond theirs).
    pub fn with_class_limit(mut self, limit: usize) -> Self {
        self.class_limits = ClassLimits::new(limit);
        self
    }

    /// The controller and its workers, watching Updates through `informers`: run the future until
    /// shutdown.
    pub fn run(mut self, informers: &mut Informers) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.workspaces = Some(informers.workspaces().store());
        let updates = informers.updates();
        let controller = Controller::for_stream(updates.objects(), updates.store());
        let this = Arc::new(self);
        async move {
            let workers: Vec<_> = (0..this.workers).map(|_| tokio::spawn(this.clone().worker())).collect();
            crate::k8s::run_controller(controller, this.ctx.running(), "update", |u, c: Arc<Self>| c.reconcile(u), this.clone()).await;
            for w in workers {
                w.abort();
            }
        }
    }

    /// The Workspace `ns/name` an operation runs on: from the Workspace cache when it is there and
    /// ready for one ([`workspace_usable`]; its spec changes only with its Stack's, which makes a new
    /// Update), else read from the API server (not cached yet, or not ready as cached: a newer version
    /// may be). `None`: there is none.
    ///
    /// Errors: the read failed.
    async fn workspace(&self, ns: &str, name: &str) -> Result<Option<Workspace>, kube::Error> {
        let api = Api::<Workspace>::namespaced(self.ctx.client.clone(), ns);
        match &self.workspaces {
            Some(store) => crate::k8s::cached_or_get(store, &api, name, |w| workspace_usable(w, self.pools.is_some())).await,
            None => api.get_opt(name).await,
        }
    }

    /// Pops jobs and drives their operations, one at a time.
    async fn worker(self: Arc<Self>) {
        loop {
            let claimed = self.queue.pop().await;
            let popped = std::time::Instant::now();
            let job = claimed.job;
            metrics::histogram!(crate::metrics::names::DISPATCH_WAIT_SECONDS, "namespace" => job.namespace.clone()).record(claimed.waited.as_secs_f64());
            self.record_queue();
            // boxed: an idle worker waiting in `pop` keeps no room for an operation's state (tens of
            // KiB each, times --max-operations workers)
            match Box::pin(self.drive(&job, claimed.waited, popped)).await {
                // its class is full: offer it again shortly (never hold a worker waiting for a slot)
                Drive::Deferred => self.queue.retry_after(job, Duration::from_secs(1)),
                // handed over: its agent stopped it cleanly (SIGTERM → Ctrl-C); another one runs it
                Drive::Again => self.queue.retry_after(job, Duration::ZERO),
                Drive::Done => self.queue.done(&job).await,
            }
            self.record_queue();
        }
    }

    /// Returns once `job` may no longer be driven here: its shard is not held at its epoch any more, or
    /// the queue's heartbeat says so. Checked every second (ownership) and every 10 s (heartbeat).
    async fn fenced(&self, job: &Job, shard_key: &str) {
        let mut tick = 0u32;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            tick += 1;
            if self.ctx.ownership.epoch(&job.namespace, shard_key) != job.epoch {
                return;
            }
            if tick.is_multiple_of(10) && !self.queue.heartbeat(job).await {
                return;
            }
        }
    }

    fn record_queue(&self) {
        // per namespace; a namespace whose queue emptied is set to 0 once, then forgotten
        let depth = self.queue.queued_by_namespace();
        let mut shown = self.depth_shown.lock().unwrap_or_else(|e| e.into_inner());
        for gone in shown.iter().filter(|n| !depth.contains_key(*n)) {
            metrics::gauge!(crate::metrics::names::QUEUE_DEPTH, "namespace" => gone.clone()).set(0.0);
        }
        for (ns, n) in &depth {
            metrics::gauge!(crate::metrics::names::QUEUE_DEPTH, "namespace" => ns.clone()).set(*n as f64);
        }
        *shown = depth.into_keys().collect();
        metrics::gauge!(crate::metrics::names::OPERATIONS_QUEUED).set(self.queue.queued() as f64);
        metrics::gauge!(crate::metrics::names::WORKQUEUE_DEPTH, "name" => "update").set(self.queue.queued() as f64);
        metrics::gauge!(crate::metrics::names::OPERATIONS_IN_FLIGHT).set(self.queue.in_flight() as f64);
    }

    /// Drives `job`, popped at `popped` after waiting `waited` in the queue.
    async fn drive(&self, job: &Job, waited: Duration, popped: std::time::Instant) -> Drive {
        let api: Api<Update> = Api::namespaced(self.ctx.client.clone(), &job.namespace);
        let Ok(Some(update)) = api.get_opt(&job.name).await else { return Drive::Done };
        if update.is_complete() || update.meta().deletion_timestamp.is_some() {
            return Drive::Done;
        }
        // fenced: a job pushed under an epoch this replica no longer holds is dropped (the shard's new
        // holder pushes its own)
        if self.ctx.ownership.epoch(&job.namespace, &update.shard_key()) != job.epoch {
            tracing::info!(update = %job.name, epoch = job.epoch, "shard no longer held at this epoch; job dropped");
            return Drive::Done;
        }
        let ws_name = update.spec.workspace_name.clone().unwrap_or_default();
        let Ok(Some(workspace)) = self.workspace(&job.namespace, &ws_name).await else { return Drive::Done };
        let class = workspace_class(&workspace);
        let Some(_permit) = self.class_limits.try_acquire(&class) else {
            tracing::debug!(update = %job.name, %class, "workspace class at its operation limit; deferred");
            metrics::counter!(crate::metrics::names::OPERATIONS_DEFERRED_TOTAL).increment(1);
            return Drive::Deferred;
        };
        let (address, lent) = match self.agent_for(job, &api, &update, &workspace).await {
            Ok(found) => found,
            Err(drive) => return drive,
        };
        let agent = if address.starts_with("http") { address } else { format!("http://{address}") };
        // a pool of pods names its own audience; else the Workspace's own agent's
        let audience = lent.as_ref().and_then(|l| l.audience.clone()).unwrap_or_else(|| pko_proto::workspace_audience(&job.namespace, &ws_name));
        let token = match &self.tokens {
            Some(tokens) => match tokens.token(&audience).await {
                Ok(t) => Some(t),
                Err(e) => {
                    let message = format!("requesting a token for the workspace agent: {e}");
                    tracing::warn!(update = %job.name, error = %e, "no token for the agent; retrying");
                    let _ = self.wait(&api, &update, Some(job.epoch), uc::TRANSIENT_FAILURE, message).await;
                    return Drive::Done;
                }
            },
            None => None,
        };
        let started = std::time::Instant::now();
        let kind = update.spec.update_type.as_ref().map(pko_api::UpdateType::label).unwrap_or("up");
        let shard_key = update.shard_key();
        let fenced = || self.ctx.ownership.epoch(&job.namespace, &shard_key) != job.epoch;
        // dispatch latency: first push → the operation's first event on its agent
        let on_started = || {
            metrics::histogram!(crate::metrics::names::DISPATCH_LATENCY_SECONDS, "namespace" => job.namespace.clone()).record((waited + popped.elapsed()).as_secs_f64());
        };
        // fenced again right before the agent is called: finding the agent may have taken a while (an
        // agent started, or this replica frozen), and the queue knows whether the shard's new holder
        // has raised its fence since (a stale `Run` on a new agent would start the operation twice)
        if fenced() || !self.queue.heartbeat(job).await {
            tracing::info!(update = %job.name, epoch = job.epoch, "shard lost before the operation started: not started here");
            if let Some(lent) = lent {
                lent.finish(End::Result);
            }
            return Drive::Done;
        }
        let not_after = || self.ctx.ownership.not_after(&job.namespace, &shard_key);
        let hooks = super::dispatch::Hooks { fenced: &fenced, started: &on_started, not_after: &not_after, github_api_url: &self.ctx.github_api_url };
        let dispatch = super::dispatch::run_on_agent(&self.ctx.client, &self.ctx.events, &agent, token.as_deref(), job.epoch, &update, &workspace, &hooks);
        // fenced while it runs: once the shard moved (or the queue says the job's epoch is stale), this
        // replica stops following the operation and writes nothing more; the agent keeps running it and
        // the shard's new holder attaches
        let outcome = tokio::select! {
            outcome = dispatch => outcome,
            () = self.fenced(job, &shard_key) => {
                tracing::info!(update = %job.name, epoch = job.epoch, "shard lost while the operation runs: handed to its new holder");
                return Drive::Done;
            }
        };
        if let Ok(r) = &outcome {
            let result = match ResultStatus::try_from(r.status) {
                Ok(ResultStatus::Succeeded) => "succeeded",
                Ok(ResultStatus::Interrupted) => "interrupted",
                _ => "failed",
            };
            metrics::counter!(crate::metrics::names::OPERATIONS_TOTAL, "type" => kind, "result" => result).increment(1);
            metrics::histogram!(crate::metrics::names::OPERATION_DURATION_SECONDS, "type" => kind).record(started.elapsed().as_secs_f64());
        }
        let interrupted = matches!(&outcome, Ok(r) if r.status == ResultStatus::Interrupted as i32);
        if let Some(lent) = lent {
            lent.finish(match &outcome {
                Ok(_) if interrupted => End::Interrupted,
                Ok(_) => End::Result,
                Err(super::dispatch::DispatchError::Busy(..)) => End::Busy,
                Err(_) => End::Unknown,
            });
        }
        match outcome {
            Ok(_) if interrupted => {
                tracing::info!(update = %job.name, "operation interrupted by agent shutdown; will run again");
                if self.pools.is_some() {
                    return Drive::Again;
                }
            }
            Ok(_) => {}
            Err(super::dispatch::DispatchError::Fenced) => tracing::info!(update = %job.name, epoch = job.epoch, "shard lost: stopped following; nothing written"),
            Err(super::dispatch::DispatchError::Busy(agent, why)) if self.pools.is_some() => {
                // another replica lent that pod first, or it is going away: another agent, later
                tracing::debug!(update = %job.name, %agent, %why, "pool agent refused the operation; deferred");
                metrics::counter!(crate::metrics::names::OPERATIONS_DEFERRED_TOTAL).increment(1);
                return Drive::Deferred;
            }
            Err(e) => {
                tracing::warn!(update = %job.name, error = %e, "dispatch failed; retrying");
                let _ = self.wait(&api, &update, Some(job.epoch), uc::TRANSIENT_FAILURE, e.to_string()).await;
            }
        }
        Drive::Done
    }

    /// The agent to run `update` on: one of its class's pool (the one running it already, after a
    /// restart or a shard move), or the Workspace's own (`status.address`). `Err`: what became of the job
    /// instead (deferred while the pool is full; done when there is no agent, the Update then waits
    /// `TransientFailure` and its reconcile pushes it again).
    async fn agent_for(&self, job: &Job, api: &Api<Update>, update: &Update, workspace: &Workspace) -> Result<(String, Option<Lent>), Drive> {
        let Some(pools) = &self.pools else {
            return workspace.status.as_ref().and_then(|s| s.address.clone()).map(|a| (a, None)).ok_or(Drive::Done);
        };
        match pools.acquire(workspace, &update.operation_id(), job.epoch, update.was_started()).await {
            Ok(Some(lent)) => Ok((lent.address.clone(), Some(lent))),
            Ok(None) => {
                tracing::debug!(update = %job.name, "every agent of the pool is busy; deferred");
                metrics::counter!(crate::metrics::names::OPERATIONS_DEFERRED_TOTAL).increment(1);
                Err(Drive::Deferred)
            }
            Err(e) => {
                tracing::warn!(update = %job.name, error = %e, "no pool agent; retrying");
                let _ = self.wait(api, update, Some(job.epoch), uc::TRANSIENT_FAILURE, e.to_string()).await;
                Err(Drive::Done)
            }
        }
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
            self.cancel(&api, &update).await?;
            return Ok(Action::await_change());
        }
        let ws_name = update.spec.workspace_name.clone().unwrap_or_default();
        let workspace = self.workspace(&ns, &ws_name).await?;
        let ready = workspace.as_ref().is_some_and(|w| workspace_usable(w, self.pools.is_some()));
        if !ready {
            let (reason, message) = match workspace {
                None => (uc::WORKSPACE_NOT_FOUND, format!("workspace {ws_name:?} not found")),
                Some(w) => match w.not_ready_reason() {
                    Some(c) => (uc::WORKSPACE_NOT_READY, format!("workspace {ws_name} is not ready: {}: {}", c.reason, c.message)),
                    None => (uc::WORKSPACE_NOT_READY, format!("workspace {ws_name} is not ready (no agent address yet)")),
                },
            };
            self.wait(&api, &update, None, reason, message).await?;
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
        let key = update.operation_id();
        let job =
            Job { key: key.clone(), namespace: ns.clone(), name: name.clone(), epoch: self.ctx.ownership.epoch(&ns, &shard_key), shard: self.ctx.ownership.shard(&ns, &shard_key) };
        match self.queue.push(job).await {
            Ok(true) => {
                tracing::debug!(update = %name, "queued");
                self.record_queue();
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(update = %name, error = %e, "not queued; retrying"),
        }
        // held back by its namespace's share: said once on the Update (its Stack shows it)
        if let Some(message) = self.queue.local().held_by_limit(&key).map(|(running, limit)| queued_message(&ns, running, limit))
            && update.queued_message() != Some(message.as_str())
        {
            self.wait(&api, &update, None, uc::QUEUED, message).await?;
        }
        // Look again later: a finished job lets the next reconcile see the result (or push it again).
        Ok(Action::requeue(Duration::from_secs(10)))
    }

    /// Writes the Update's status as waiting (`reason`, `message`) — unless fenced: the shard is not
    /// held any more (or, for a job's dispatch, not at the job's `epoch`), e.g. because this replica was
    /// frozen while it read the API; then nothing is written.
    async fn wait(&self, api: &Api<Update>, update: &Update, epoch: Option<i64>, reason: &'static str, message: String) -> Result<(), kube::Error> {
        let (ns, key) = (update.namespace().unwrap_or_default(), update.shard_key());
        let fenced = match epoch {
            Some(e) => self.ctx.ownership.epoch(&ns, &key) != e,
            None => !self.ctx.ownership.owns(&ns, &key),
        };
        if fenced {
            tracing::info!(update = %update.name_any(), %reason, "shard not held (at this epoch): waiting status not written");
            return Ok(());
        }
        let mut st = update.status.clone().unwrap_or_default();
        let old = st.conditions.clone().unwrap_or_default();
        st.conditions = Some(status::conditions(&Phase::Waiting { reason, message }, update.meta().generation, &pko_api::conditions::now(), &old));
        crate::k8s::apply_status(api, &update.name_any(), pko_api::constants::field_manager::UPDATE_STATUS, &st).await
    }

    /// Marks an [`orphaned`] Update Failed `Canceled` (PKO's `isOrphaned`), once, unless fenced.
    async fn cancel(&self, api: &Api<Update>, update: &Update) -> Result<(), kube::Error> {
        if !self.ctx.ownership.owns(&update.namespace().unwrap_or_default(), &update.shard_key()) {
            return Ok(());
        }
        let mut st = update.status.clone().unwrap_or_default();
        let old = st.conditions.clone().unwrap_or_default();
        let now = pko_api::conditions::now();
        st.conditions = Some(status::conditions(&Phase::Failed { reason: uc::CANCELED.into(), message: ORPHANED_MESSAGE.into() }, update.meta().generation, &now, &old));
        st.observed_generation = update.meta().generation;
        st.message = Some(ORPHANED_MESSAGE.into());
        st.end_time = Some(now);
        tracing::info!(update = %update.name_any(), "no controller owner: canceled (as PKO)");
        crate::k8s::apply_status(api, &update.name_any(), pko_api::constants::field_manager::UPDATE_STATUS, &st).await
    }

    async fn expire(&self, api: &Api<Update>, update: &Update) -> Result<Action, Error> {
        let Some(ttl) = update.spec.ttl_after_completed.as_deref().and_then(|d| pko_api::duration::parse_go_duration_or_zero(d).ok()) else { return Ok(Action::await_change()) };
        let Some(end) = update.status.as_ref().and_then(|s| s.end_time.clone()) else { return Ok(Action::await_change()) };
        let age = k8s_openapi::jiff::Timestamp::now().duration_since(end.0).unsigned_abs();
        if age >= ttl {
            // fenced: the event and the delete are writes
            if !self.ctx.ownership.owns(&update.namespace().unwrap_or_default(), &update.shard_key()) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use pko_api::constants::workspace_condition as wc;
    use pko_api::workspace::WorkspaceStatus;

    fn workspace(ready: &str, address: Option<&str>) -> Workspace {
        let mut w = Workspace::new("w", Default::default());
        let mut conds = Vec::new();
        let at = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::from_second(0).unwrap_or_default());
        pko_api::conditions::set(&mut conds, wc::READY, ready, wc::SUCCEEDED, "", None, &at);
        w.status = Some(WorkspaceStatus { conditions: Some(conds), address: address.map(str::to_string), ..Default::default() });
        w
    }

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
        let mut u: Update = serde_json::from_value(serde_json::json!({"metadata": {"name": "u"}, "spec": {"workspaceName": "w"}})).unwrap();
        assert!(orphaned(&u), "created by hand");
        u.metadata.owner_references = Some(vec![owner(None)]);
        assert!(orphaned(&u), "an owner that is not the controller");
        u.metadata.owner_references = Some(vec![owner(Some(true))]);
        assert!(!orphaned(&u));
        u.metadata.owner_references = None;
        u.status = Some(pko_api::update::UpdateStatus { start_time: Some(pko_api::conditions::now()), ..Default::default() });
        assert!(!orphaned(&u), "started: followed to its result");
    }

    #[test]
    fn a_pooled_operation_needs_a_ready_workspace_and_an_own_agent_its_address() {
        assert!(workspace_usable(&workspace("True", None), true));
        assert!(!workspace_usable(&workspace("False", None), true), "not Ready: read fresh, then wait");
        assert!(!workspace_usable(&workspace("True", None), false), "its own agent has no address yet");
        assert!(workspace_usable(&workspace("False", Some("10.0.0.1:50051")), false));
        assert!(!workspace_usable(&Workspace::new("w", Default::default()), true), "no status yet");
    }
}
