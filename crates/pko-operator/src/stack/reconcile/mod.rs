//! One reconcile of a Stack (PKO `stack_controller.go` `Reconcile`), as a short driver over named steps:
//!
//! 1. **dereference**: the cached Stack, judged by this replica's own last write of it ([`crate::own_writes`]), and its
//!    finalizer;
//! 2. **current update** ([`steps`]): wait for it, absorb a finished one ([`super::absorb`]), or heal a dangling
//!    reference (PKO #1292); a drift check's result ([`drift_steps`]);
//! 3. **deletion**: release the finalizer when no destroy is due; stall in a terminating namespace;
//! 4. **source**: resolve the revision, validate the spec, keep a refused template stalled;
//! 5. **plan**: in sync or not ([`super::plan`]);
//! 6. **prerequisites**;
//! 7. **workspace** ([`update_steps`]): build ([`super::build`]) and apply; wait until it is Ready;
//! 8. **update**: follow one in flight, or write `currentUpdate` then create the Update — or, for a synced Stack
//!    whose drift check is due, create the check's Update once a fleet-wide slot is free.
//!
//! Each step changes the pass's draft status ([`pass::Pass`]) and may halt the pass ([`pass::Halt`]); the driver then
//! writes the status once (nothing when unchanged) and carries out what must follow the write. One write comes earlier:
//! the `currentUpdate` intent before an Update is created, so a crash never leaves an Update the Stack does not know.
//! Each step fails with its own [`Error`] variant.

mod drift_steps;
mod pass;
mod steps;
mod update_steps;

use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use pko_api::constants::STACK_FINALIZER;
use pko_api::{Stack, Update, Workspace};

use super::applied::AppliedWorkspaces;
use super::build;
use super::finalizer;
use crate::context::Context;
use crate::own_writes::{Cached, OwnWrites};
use pass::{Halt, Pass, Step, WriteState};

pub use drift_steps::{DRIFT_SLOT_LEASE, DRIFT_SLOT_RETRY};
pub use update_steps::ready_for_update;

/// Errors of a Stack reconcile, one per step (user-facing problems become conditions instead).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the Stack.
    #[error("reading the stack: {0}")]
    Dereference(#[source] kube::Error),
    /// Adding or removing the Stack finalizer.
    #[error("updating the stack finalizer: {0}")]
    Finalizer(#[source] kube::Error),
    /// Reading the current Update or its outputs, or releasing it.
    #[error("absorbing the current update: {0}")]
    CurrentUpdate(#[source] kube::Error),
    /// Checking the namespace of a Stack being deleted.
    #[error("checking the namespace: {0}")]
    Deletion(#[source] kube::Error),
    /// Reading what an unlock request judges lock holders by (Pods, membership Leases).
    #[error("judging an unlock request: {0}")]
    Unlock(#[source] kube::Error),
    /// Resolving the source (Program, git credentials, Flux source).
    #[error("resolving the source: {0}")]
    Source(#[source] kube::Error),
    /// Reading prerequisites or requesting their resync.
    #[error("checking prerequisites: {0}")]
    Prerequisites(#[source] kube::Error),
    /// Building the Workspace or the Update (an owner not read from the API server).
    #[error("building: {0}")]
    Build(#[from] build::BuildError),
    /// Applying the Workspace, or reclaiming it.
    #[error("applying the workspace: {0}")]
    Workspace(#[source] kube::Error),
    /// Listing in-flight Updates or creating the Update.
    #[error("creating the update: {0}")]
    Update(#[source] kube::Error),
    /// Writing the Stack status.
    #[error("writing the stack status: {0}")]
    Status(#[source] kube::Error),
    /// The Stack's shard stopped being held during the pass (it moved, or this replica passed its renew deadline, e.g.
    /// frozen): nothing more is written; its new holder reconciles it.
    #[error("fenced: the stack's shard is no longer held here")]
    Fenced,
    /// The pass ran on a cached Stack that was not the stored one (its pinned write got 409, or the read before its
    /// effects showed a newer version): nothing more is written; the cache's newer version is reconciled (not counted
    /// as a failure).
    #[error("the cached stack was not the stored one")]
    Stale,
}

impl crate::k8s::ReconcileError for Error {
    fn step(&self) -> &'static str {
        match self {
            Error::Dereference(_) => "dereference",
            Error::Finalizer(_) => "finalizer",
            Error::CurrentUpdate(_) => "current_update",
            Error::Deletion(_) => "deletion",
            Error::Unlock(_) => "unlock",
            Error::Source(_) => "source",
            Error::Prerequisites(_) => "prerequisites",
            Error::Build(_) => "build",
            Error::Workspace(_) => "workspace",
            Error::Update(_) => "update",
            Error::Status(_) => "status",
            Error::Fenced => "fenced",
            Error::Stale => "stale",
        }
    }
}

/// What the Stack controller's reconciles share: the operator's [`Context`], the informer caches a pass reads, and what
/// this replica last wrote (Stacks) and applied (Workspaces).
pub struct StackController {
    /// The operator's context.
    pub ctx: Arc<Context>,
    /// The Update informer's cache (the Updates of the shards this replica holds).
    pub updates: kube::runtime::reflector::Store<Update>,
    /// The Program informer's cache (every Program of the watched namespaces), which a pass reads a `programRef`'s
    /// artifact from ([`super::source::resolve`]).
    pub programs: kube::runtime::reflector::Store<pko_api::Program>,
    /// The `resourceVersion` of each Stack after this replica's last write of it.
    pub own_writes: OwnWrites<Stack>,
    /// The StackRollout informer's cache (every rollout of the watched namespaces): the rollout that governs a Stack
    /// may hold its new revision ([`super::rollout_hold`]).
    pub rollouts: kube::runtime::reflector::Store<pko_api::StackRollout>,
    /// The Workspace informer's cache (the Workspaces of the shards this replica holds).
    pub workspaces: kube::runtime::reflector::Store<Workspace>,
    /// What each Stack last applied as its Workspace from this replica ([`AppliedWorkspaces`]).
    pub applied_workspaces: Arc<AppliedWorkspaces>,
}

impl StackController {
    /// The epoch of the shard of Stack `ns/name` held here (0: not held, or no fleet).
    fn epoch(&self, ns: &str, name: &str) -> i64 {
        self.ctx.ownership.epoch(ns, name)
    }
}

/// How soon a pass that found the cache behind runs again (the newer version's watch event usually comes first): 2
/// seconds.
pub const STALE_RETRY: Duration = Duration::from_secs(2);

/// One reconcile of a Stack: ownership, dereference, the steps, one status write, the effects.
pub async fn reconcile(cached: Arc<Stack>, c: Arc<StackController>) -> Result<Action, Error> {
    let (ns, name) = (cached.namespace().unwrap_or_default(), cached.name_any());
    if !c.ctx.ownership.owns(&ns, &name) {
        return Ok(crate::k8s::unowned());
    }
    // the cached Stack, always: known current when it is the version this replica wrote last; just
    // after our own write, awaited; else unverified — its writes pinned to its resourceVersion, its
    // effects behind one read
    let write = match c.own_writes.judge(&cached, std::time::Instant::now(), c.epoch(&ns, &name)) {
        Cached::Current | Cached::Unverified(None) => WriteState::Current,
        Cached::CatchingUp(wait) => return Ok(Action::requeue(wait)),
        Cached::Unverified(Some(rv)) => WriteState::Unverified(rv),
    };
    match pass(&c, cached, write).await {
        Err(Error::Stale) => {
            tracing::debug!("the cached stack was behind the stored one; reconciled again from the newer version");
            metrics::counter!(crate::metric_names::STALE_PASSES_TOTAL, "controller" => "stack").increment(1);
            Ok(Action::requeue(STALE_RETRY))
        }
        done => done,
    }
}

/// The pass over `cached` as `write` judged it: the finalizer, then the steps, one status write, the effects.
async fn pass(c: &StackController, cached: Arc<Stack>, write: WriteState) -> Result<Action, Error> {
    let (ns, name) = (cached.namespace().unwrap_or_default(), cached.name_any());
    if !cached.finalizers().iter().any(|f| f == STACK_FINALIZER) {
        return add_finalizer(c, &cached, &write).await;
    }
    let mut p = Pass::new(cached, write);
    let exit = match steps(c, &mut p).await {
        Ok(action) | Err(Halt::Done(action)) => Ok(action),
        Err(Halt::Retry(e)) => Err(e),
        Err(Halt::Failed(e)) => return Err(e),
    };
    p.write_status(c).await?;
    if !p.effects.is_empty() {
        p.ensure_current(c).await?;
    }
    let after = p.apply_effects(c).await;
    match &p.write {
        WriteState::Written { version, .. } => c.own_writes.record(&ns, &name, version.clone(), c.epoch(&ns, &name)),
        WriteState::Gone => c.own_writes.record(&ns, &name, None, 0),
        WriteState::Current | WriteState::Unverified(_) => {}
    }
    let after = after?;
    exit.map(|action| after.unwrap_or(action))
}

/// A Stack without the Stack finalizer gets it (unless it is being deleted); the patch's test pins the finalizer list
/// as cached: 422 when the cache was behind ([`Error::Stale`]).
async fn add_finalizer(c: &StackController, stack: &Stack, write: &WriteState) -> Result<Action, Error> {
    let (ns, name) = (stack.namespace().unwrap_or_default(), stack.name_any());
    if stack.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    // fenced: the judgement above may have crossed a freeze or a shard move
    if !c.ctx.ownership.owns(&ns, &name) {
        return Ok(crate::k8s::unowned());
    }
    let api: Api<Stack> = Api::namespaced(c.ctx.client.clone(), &ns);
    let version = match finalizer::set_finalizers(&api, stack, true).await {
        Err(kube::Error::Api(e)) if matches!(write, WriteState::Unverified(_)) && e.code == 422 => {
            return Err(Error::Stale);
        }
        written => written.map_err(Error::Finalizer)?,
    };
    c.own_writes.record(&ns, &name, version, c.epoch(&ns, &name));
    Ok(Action::await_change())
}

/// The steps, in order; each may halt the pass.
async fn steps(c: &StackController, p: &mut Pass) -> Step<Action> {
    steps::current_update(c, p).await?;
    steps::deletion(c, p).await?;
    steps::unlock(c, p).await?;
    let source = steps::source(c, p).await?;
    let stall = steps::workspace_stall(c, p).await?;
    let work = steps::sync(c, p, &source, stall.as_ref().map(|(r, m)| (r.as_str(), m.as_str())))?;
    // a drift check only reads: prerequisites gate updates
    if matches!(work, pass::Work::Update(_)) {
        steps::prerequisites(c, p).await?;
    }
    let ws = update_steps::workspace(c, p, &source).await?;
    match work {
        pass::Work::Update(reason) => update_steps::update(c, p, &ws, &source, reason).await,
        pass::Work::DriftCheck { tick, auto_remediate } => {
            drift_steps::drift_check(c, p, &ws, &source, tick, auto_remediate).await
        }
    }
}
