//! The Update workers: each pops a job from the queue and drives its operation to a result, in the Stack's shape — a
//! short driver ([`UpdateController::drive`]) over named steps:
//!
//! 1. **claim** — the Update read fresh (not complete, not being deleted), the job's fence held, its Workspace usable
//!    ([`crate::agents::Agents::usable`]);
//! 2. **permit** — a slot of the Workspace's class ([`crate::agents::limits`]), else deferred;
//! 3. **lend** — an agent of the runtime ([`crate::agents::Agents::lend`]), else deferred (pool busy) or waiting (no
//!    agent, no token);
//! 4. **run** — the operation on the agent ([`super::dispatch::run`]) under a tracing span, raced against the fence
//!    ([`super::fence::Fence::lost`]): once lost, this replica stops following and writes nothing more (the agent keeps
//!    running it; the shard's new holder attaches);
//! 5. **give back** — the agent, with how the operation ended ([`end_of`]), and what becomes of the job ([`settle`],
//!    pure).

use std::time::{Duration, Instant};

use kube::Resource;
use kube::api::Api;
use pko_api::constants::update_condition as uc;
use pko_api::shard::ShardKey;
use pko_api::{Update, Workspace};
use pko_proto::v1::{OperationResult, ResultStatus};
use pko_queue::Job;
use tracing::Instrument;

use super::controller::UpdateController;
use super::dispatch::{self, DispatchError};
use super::fence::Fence;
use crate::agents::{End, Lending, Lent};

/// What became of a job a worker popped.
#[derive(Debug, PartialEq, Eq)]
pub enum Drive {
    /// Run to a result, or nothing to run (gone, complete, no agent yet: its reconcile looks again).
    Done,
    /// Its workspace class was full, or its pool busy: to be offered again.
    Deferred,
    /// Its agent is shutting down (`INTERRUPTED`): to be run again at once, on another agent.
    Again,
    /// Held for the busy agents that ran its Workspace: offered again when one of them is given back, at the latest
    /// after this long.
    Held(Duration),
}

/// What the worker does after an operation's run: the job's fate, and the waiting message to write on the Update
/// (`TransientFailure`) when it is to be retried by its reconcile.
#[derive(Debug, PartialEq, Eq)]
pub struct Settled {
    /// The job's fate.
    pub drive: Drive,
    /// `TransientFailure` message to write, if any.
    pub wait: Option<String>,
}

/// How a lent agent's operation ended, for its pool. Pure.
pub fn end_of(outcome: &Result<OperationResult, DispatchError>) -> End {
    match outcome {
        Ok(r) if r.status == ResultStatus::Interrupted as i32 => End::Interrupted,
        Ok(_) => End::Result,
        // nothing was asked of the agent: it is free
        Err(DispatchError::Stale) => End::Result,
        Err(DispatchError::Busy(..)) => End::Busy,
        Err(_) => End::Unknown,
    }
}

/// What becomes of a job whose operation ended as `outcome`, on pooled agents or not (`pooled`): interrupted on a pool
/// → again at once elsewhere; refused by a busy pool agent → deferred; fenced → done, nothing written; any other
/// failure → done, the Update waits `TransientFailure` and its reconcile pushes it again. Pure.
pub fn settle(outcome: &Result<OperationResult, DispatchError>, pooled: bool) -> Settled {
    let done = |wait: Option<String>| Settled { drive: Drive::Done, wait };
    match outcome {
        Ok(r) if r.status == ResultStatus::Interrupted as i32 && pooled => Settled { drive: Drive::Again, wait: None },
        Ok(_) | Err(DispatchError::Fenced(_) | DispatchError::Stale) => done(None),
        Err(DispatchError::Busy(..)) if pooled => Settled { drive: Drive::Deferred, wait: None },
        Err(e) => done(Some(e.to_string())),
    }
}

/// The `result` label of `pko_update_operations_total` for a result. Pure.
fn result_label(r: &OperationResult) -> &'static str {
    match ResultStatus::try_from(r.status) {
        Ok(ResultStatus::Succeeded) => "succeeded",
        Ok(ResultStatus::Interrupted) => "interrupted",
        _ => "failed",
    }
}

impl UpdateController {
    /// Pops jobs and drives their operations, one at a time.
    pub(super) async fn worker(self: std::sync::Arc<Self>) {
        loop {
            let claimed = self.queue.pop().await;
            let popped = Instant::now();
            let job = claimed.job;
            metrics::histogram!(crate::metric_names::DISPATCH_WAIT_SECONDS, "namespace" => job.namespace.clone())
                .record(claimed.waited.as_secs_f64());
            self.gauges.record(&*self.queue);
            // boxed: an idle worker waiting in `pop` keeps no room for an operation's state (tens of
            // KiB each, times --max-operations workers)
            match Box::pin(self.drive(&job, claimed.waited, popped)).await {
                // its class is full: offer it again shortly (never hold a worker waiting for a slot)
                Drive::Deferred => self.queue.retry_after(job, Duration::from_secs(1)),
                // handed over: its agent stopped it cleanly (SIGTERM → Ctrl-C); another one runs it
                Drive::Again => self.queue.retry_after(job, Duration::ZERO),
                // woken earlier when its agent is given back ([`super::holds`])
                Drive::Held(left) => self.queue.retry_after(job, left),
                Drive::Done => self.queue.done(&job).await,
            }
            self.gauges.record(&*self.queue);
        }
    }

    /// Drives `job`, popped at `popped` after waiting `waited` in the queue: the driver over the steps.
    async fn drive(&self, job: &Job, waited: Duration, popped: Instant) -> Drive {
        let Some((update, workspace)) = self.claim(job).await else { return Drive::Done };
        let fence = Fence::new(&*self.ctx.ownership, &*self.queue, job, update.shard_key());
        let class = self.agents.class(&workspace);
        let Some(_permit) = self.class_limits.try_acquire(&class) else {
            tracing::debug!(update = %job.name, %class, "workspace class at its operation limit; deferred");
            metrics::counter!(crate::metric_names::OPERATIONS_DEFERRED_TOTAL).increment(1);
            self.said_class_full(&update, &fence, &class).await;
            return Drive::Deferred;
        };
        let lent = match self.lend(&fence, &update, &workspace).await {
            Ok(lent) => lent,
            Err(drive) => return drive,
        };
        // fenced again right before the agent is called: finding the agent may have taken a while (an
        // agent started, or this replica frozen), and the queue knows whether the shard's new holder
        // has raised its fence since (a stale `Run` on a new agent would start the operation twice)
        if !fence.confirmed().await {
            tracing::info!(update = %job.name, epoch = job.epoch,
                "shard lost before the operation started: not started here");
            self.give_back(lent, End::Result);
            return Drive::Done;
        }
        let stack = update.spec.stack_name.clone().unwrap_or_default();
        let span = tracing::info_span!("operation", namespace = %job.namespace, stack = %stack, update = %job.name,
            epoch = job.epoch, agent = %lent.address);
        let ran =
            self.run_operation(&fence, &update, &workspace, &lent, waited + popped.elapsed()).instrument(span).await;
        let Some(outcome) = ran else {
            // the fence was lost while it ran: given back as a drop would, waking what it held
            self.give_back(lent, End::Unknown);
            return Drive::Done;
        };
        self.give_back(lent, end_of(&outcome));
        let settled = settle(&outcome, self.agents.pooled());
        if let Some(message) = settled.wait {
            let _ = self
                .wait(
                    &Api::namespaced(self.ctx.client.clone(), &job.namespace),
                    &update,
                    fence.holds(),
                    uc::TRANSIENT_FAILURE,
                    message,
                )
                .await;
        }
        settled.drive
    }

    /// Step **claim**: the Update and its Workspace, when the job is still to be driven here. An Update the cache shows
    /// not started is taken from it ([`super::controller::UpdateController::update`]): the first write about it — the
    /// wait, the refusal or *mark started*, all before any agent can run it — carries its `resourceVersion` as a
    /// precondition, so a stale one is refused there.
    async fn claim(&self, job: &Job) -> Option<(Update, Workspace)> {
        let update = self.update(&job.namespace, &job.name).await.ok()??;
        if update.is_complete() || update.meta().deletion_timestamp.is_some() {
            return None;
        }
        // fenced: a job pushed under an epoch this replica no longer holds is dropped (the shard's new
        // holder pushes its own)
        if self.ctx.ownership.epoch(&job.namespace, &update.shard_key()) != job.epoch {
            tracing::info!(update = %job.name, epoch = job.epoch, "shard no longer held at this epoch; job dropped");
            return None;
        }
        let workspace = self.workspace(&update).await.ok()??;
        Some((update, workspace))
    }

    /// Step **lend**: an agent for `update`. `Err`: what becomes of the job instead — deferred while the pool is
    /// full; done when there is no agent (the Update then waits `TransientFailure` when the runtime failed, and its
    /// reconcile pushes it again).
    async fn lend(&self, fence: &Fence<'_>, update: &Update, workspace: &Workspace) -> Result<Lent, Drive> {
        let job = fence.job();
        match self.agents.lend(workspace, &update.operation_id(), job.epoch, update.was_started()).await {
            Ok(Lending::Lent(lent)) => Ok(lent),
            Ok(Lending::NoAgent) => Err(Drive::Done),
            Ok(Lending::Held(held)) => {
                tracing::debug!(update = %job.name, agents = ?held.agents, left_s = held.left.as_secs_f64(),
                    "held for the busy agents that ran its workspace");
                metrics::counter!(crate::metric_names::OPERATIONS_HELD_TOTAL).increment(1);
                for n in &held.agents {
                    self.holds.add((held.pool.clone(), *n), &job.key);
                }
                Err(Drive::Held(held.left))
            }
            Ok(Lending::Busy) => {
                tracing::debug!(update = %job.name, "every agent of the pool is busy; deferred");
                metrics::counter!(crate::metric_names::OPERATIONS_DEFERRED_TOTAL).increment(1);
                Err(Drive::Deferred)
            }
            Err(e) => {
                tracing::warn!(update = %job.name, error = %e, "no agent; retrying");
                let api = Api::namespaced(self.ctx.client.clone(), &job.namespace);
                let _ = self
                    .wait_at(
                        &api,
                        update,
                        fence.holds(),
                        uc::TRANSIENT_FAILURE,
                        e.to_string(),
                        update.metadata.resource_version.as_deref(),
                    )
                    .await;
                Err(Drive::Done)
            }
        }
    }

    /// Step **run**: the operation on `lent`, counted (`pko_update_operations_total`, its duration, the dispatch
    /// latency `queued` + to its first event, failures by step), raced against the fence. `None`: the fence was lost
    /// while it ran (handed to the shard's new holder).
    async fn run_operation(
        &self,
        fence: &Fence<'_>,
        update: &Update,
        workspace: &Workspace,
        lent: &Lent,
        queued: Duration,
    ) -> Option<Result<OperationResult, DispatchError>> {
        let job = fence.job();
        let began = Instant::now();
        let operation_id = update.operation_id();
        let started = || {
            metrics::histogram!(crate::metric_names::DISPATCH_LATENCY_SECONDS, "namespace" => job.namespace.clone())
                .record((queued + began.elapsed()).as_secs_f64());
        };
        let op = dispatch::Operation {
            client: &self.ctx.client,
            events: &self.ctx.events,
            github_api_url: &self.ctx.github_api_url,
            artifact_addr: &self.ctx.advertised_addr,
            update,
            workspace,
            agent: lent,
            fence,
            started: &started,
            output: self.ctx.output.as_ref(),
            plans: self.ctx.plans.as_ref(),
            outputs: &self.ctx.outputs,
            secrets: &self.ctx.secrets,
            limits: super::limits::Limits { idle: self.ctx.update_idle_timeout, overall: self.ctx.operation_timeout },
            cancel: &|| self.cancels.get(&operation_id),
        };
        let outcome = tokio::select! {
            outcome = dispatch::run(&op) => outcome,
            () = fence.lost() => {
                self.cancels.forget(&operation_id);
                tracing::info!("shard lost while the operation runs: handed to its new holder");
                metrics::counter!(crate::metric_names::DISPATCH_ERRORS_TOTAL, "step" => "fenced").increment(1);
                return None;
            }
        };
        // a later dispatch gets the request again from the Update's reconcile, which pushes it
        self.cancels.forget(&operation_id);
        let kind = update.spec.update_type.as_ref().map(pko_api::UpdateType::label).unwrap_or("up");
        match &outcome {
            Ok(r) => {
                metrics::counter!(crate::metric_names::OPERATIONS_TOTAL, "type" => kind, "result" => result_label(r))
                    .increment(1);
                metrics::histogram!(crate::metric_names::OPERATION_DURATION_SECONDS, "type" => kind)
                    .record(began.elapsed().as_secs_f64());
                if r.status == ResultStatus::Interrupted as i32 {
                    tracing::info!("operation interrupted by agent shutdown; will run again");
                }
                if r.error.as_ref().is_some_and(|e| e.reason == pko_proto::v1::ErrorReason::RunMismatch as i32) {
                    tracing::warn!(message = %r.message, "the agent refused to run what the Update does not name");
                    metrics::counter!(crate::metric_names::RUN_MISMATCHES_TOTAL, "check" => "agent").increment(1);
                }
            }
            Err(e) => {
                metrics::counter!(crate::metric_names::DISPATCH_ERRORS_TOTAL, "step" => e.step()).increment(1);
                match e {
                    DispatchError::Fenced(_) => tracing::info!("shard lost: stopped following; nothing written"),
                    DispatchError::Stale => {
                        tracing::info!("the Update changed since its claim and is not to start here; nothing written")
                    }
                    DispatchError::Busy(agent, why) => tracing::debug!(%agent, %why, "agent refused the operation"),
                    e => tracing::warn!(error = %e, step = e.step(), "dispatch failed; retrying"),
                }
            }
        }
        Some(outcome)
    }
}

impl UpdateController {
    /// Gives `lent` back to its pool with how its operation ended, and wakes the jobs held for it ([`super::holds`]).
    fn give_back(&self, lent: Lent, end: End) {
        let agent = lent.slot().cloned();
        lent.finish(end);
        if let Some(agent) = agent {
            self.queue.wake(&self.holds.take(&agent));
        }
    }

    /// Says once on an Update not started yet that it waits for a slot of its workspace class (`Queued`,
    /// [`super::controller::class_queued_message`]); nothing when it says so already, when it was started (a re-attach
    /// keeps `Progressing`) or when fenced. A failed write is logged: the job is deferred either way.
    async fn said_class_full(&self, update: &Update, fence: &Fence<'_>, class: &str) {
        if update.was_started() {
            return;
        }
        let message =
            super::controller::class_queued_message(class, self.class_limits.running(class), self.class_limits.limit());
        if update.queued_message() == Some(message.as_str()) {
            return;
        }
        let api: Api<Update> =
            Api::namespaced(self.ctx.client.clone(), update.meta().namespace.as_deref().unwrap_or_default());
        if let Err(e) = self
            .wait_at(&api, update, fence.holds(), uc::QUEUED, message, update.metadata.resource_version.as_deref())
            .await
        {
            tracing::warn!(update = ?update.meta().name, error = %e, "writing the class wait");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::update::fence::Fenced;

    fn result(status: ResultStatus) -> Result<OperationResult, DispatchError> {
        Ok(OperationResult { status: status as i32, ..Default::default() })
    }

    #[test]
    fn an_outcome_tells_the_pool_how_its_agent_ended() {
        assert_eq!(end_of(&result(ResultStatus::Succeeded)), End::Result);
        assert_eq!(end_of(&result(ResultStatus::Failed)), End::Result);
        assert_eq!(end_of(&result(ResultStatus::Interrupted)), End::Interrupted);
        assert_eq!(end_of(&Err(DispatchError::Busy("a".into(), "x".into()))), End::Busy);
        assert_eq!(end_of(&Err(DispatchError::NoResult)), End::Unknown);
    }

    #[test]
    fn an_outcome_settles_the_job() {
        let s = |drive, wait: Option<&str>| Settled { drive, wait: wait.map(str::to_string) };
        assert_eq!(settle(&result(ResultStatus::Succeeded), true), s(Drive::Done, None));
        assert_eq!(
            settle(&result(ResultStatus::Interrupted), true),
            s(Drive::Again, None),
            "a pool runs it on another agent at once"
        );
        assert_eq!(
            settle(&result(ResultStatus::Interrupted), false),
            s(Drive::Done, None),
            "its own agent: the reconcile pushes it again"
        );
        assert_eq!(settle(&Err(DispatchError::Busy("a".into(), "busy".into())), true), s(Drive::Deferred, None));
        assert_eq!(
            settle(&Err(DispatchError::Busy("a".into(), "busy".into())), false),
            s(Drive::Done, Some("agent a: busy"))
        );
        assert_eq!(
            settle(&Err(DispatchError::Fenced(Fenced)), true),
            s(Drive::Done, None),
            "nothing written once fenced"
        );
        assert_eq!(
            settle(&Err(DispatchError::Stale), true),
            s(Drive::Done, None),
            "a stale claim: nothing written, its reconcile decides"
        );
        assert_eq!(end_of(&Err(DispatchError::Stale)), End::Result, "nothing was asked of the agent");
        assert_eq!(
            settle(&Err(DispatchError::NoResult), true),
            s(Drive::Done, Some("the operation stream ended without a result"))
        );
    }
}
