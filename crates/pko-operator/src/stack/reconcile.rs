//! One reconcile of a Stack (PKO `stack_controller.go` `Reconcile`), as a short driver over named steps:
//!
//! 1. **dereference**: the Stack as stored (not the watch cache, which can lag behind our own
//!    `currentUpdate` write) and its finalizer;
//! 2. **current update**: wait for it, absorb a finished one ([`super::absorb`], pure), or heal a
//!    dangling reference (PKO #1292);
//! 3. **deletion**: release the finalizer when no destroy is due; stall in a terminating namespace;
//! 4. **source**: resolve the revision, validate the spec, keep a refused template stalled;
//! 5. **plan**: in sync or not ([`super::plan`], pure);
//! 6. **prerequisites**;
//! 7. **workspace**: build ([`super::build`], pure) and apply; wait until it is Ready;
//! 8. **update**: follow one in flight, or write `currentUpdate` then create the Update — or, for a
//!    synced Stack whose drift check is due ([`super::drift`]), create the check's Update once a
//!    fleet-wide slot is free. A running check leaves the Stack Ready.
//!
//! Each step changes the pass's status and may end the pass; the driver then writes the status once
//! (nothing when unchanged) and carries out what must follow the write (events, releasing the absorbed
//! Update's finalizer, the Stack's finalizer, reclaiming the Workspace). One write comes earlier: the
//! `currentUpdate` intent before an Update is created, so that a crash never leaves an Update the Stack
//! does not know. Each step fails with its own [`Error`] variant.

use super::applied::AppliedWorkspaces;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use pko_api::constants::{
    RECONCILE_REQUEST_ANNOTATION, STACK_FINALIZER, event_reason as ev, field_manager, stack_condition as sc,
};
use pko_api::stack::{CurrentStackUpdate, StackStatus, StackUpdateStateMessage};
use pko_api::{Stack, Update, UpdateType, Workspace};
use serde_json::json;

use super::build::{self, ResolvedSource};
use super::finalizer;
use super::io;
use super::messages;
use super::plan::{self, Sync};
use super::source::{self, Resolved};
use super::{absorb, conditions, drift, prerequisites};
use crate::context::Context;
use crate::k8s::{self, Severity};

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
    /// The Stack's shard stopped being held during the pass (it moved, or this replica passed its
    /// renew deadline, e.g. frozen): nothing more is written; its new holder reconciles it.
    #[error("fenced: the stack's shard is no longer held here")]
    Fenced,
    /// The pass ran on a cached Stack that was not the stored one (its pinned write got 409, or the
    /// read before its effects showed a newer version): nothing more is written; the cache's newer
    /// version is reconciled (not counted as a failure).
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

/// How a pass ends: with an action, or with an error for the error policy (after the status write).
enum Exit {
    Done(Action),
    Retry(Error),
}

/// What must happen after the status write.
enum Effect {
    Event(Severity, &'static str, String),
    /// Drop the Stack finalizer from the absorbed Update (its result is in the status now).
    ReleaseUpdate(Box<Update>),
    /// Drop the Stack's own finalizer (deletion done).
    RemoveFinalizer,
    /// Delete the Workspace (`workspaceReclaimPolicy: Delete`).
    ReclaimWorkspace,
    /// Give the Stack's drift-check slot back (its check ended).
    ReleaseDriftSlot,
    /// Delete the Update of an earlier drift check (a newer one's result is in the status).
    DeleteUpdate(String),
    /// Annotate the running Update with the Stack's new cancel request (its controller stops it).
    ForwardCancel(String, String),
}

/// How soon a due drift check that found no free fleet-wide slot looks again: 5 seconds (within
/// [`pko_queue::slots::WAITER_TTL`], so it keeps its place in line).
pub const DRIFT_SLOT_RETRY: Duration = Duration::from_secs(5);

/// How long a drift check holds its fleet-wide slot without renewal; every pass while it runs (each
/// 30 s) renews it, so only a check whose replica died holds a slot that long.
pub const DRIFT_SLOT_LEASE: Duration = Duration::from_secs(600);

/// What a pass that is not in sync goes on to do.
enum Work {
    /// Create an Update (`up`, `preview` or `destroy`) for this reason.
    Update(String),
    /// Create the drift check for this tick.
    DriftCheck { tick: k8s_openapi::jiff::Timestamp, auto_remediate: bool },
}

/// The state of one pass: the Stack as read, the status being built, and the effects to carry out.
struct Pass {
    ownership: Arc<dyn crate::ownership::Ownership>,
    stack: Arc<Stack>,
    api: Api<Stack>,
    updates: Api<Update>,
    /// The Update informer's cache ([`io::in_flight_update`], and an Update still running).
    cached_updates: kube::runtime::reflector::Store<Update>,
    /// The Program informer's cache ([`source::resolve`]).
    programs: kube::runtime::reflector::Store<pko_api::Program>,
    /// The Workspace informer's cache and what this replica last applied ([`workspace`]).
    cached_workspaces: kube::runtime::reflector::Store<Workspace>,
    applied_workspaces: Arc<AppliedWorkspaces>,
    ns: String,
    name: String,
    generation: Option<i64>,
    request: Option<String>,
    /// A `pulumi.com/cancel-request` value not seen before ([`messages::new_request`]).
    cancel: Option<String>,
    /// A `pulumi.com/unlock-request` value not judged before ([`messages::new_request`]).
    unlock: Option<String>,
    /// The lock holders an accepted unlock request releases with the next Update ([`unlock`]).
    release: Option<Vec<pko_proto::locks::Holder>>,
    /// The Stack's `resourceVersion` after this pass's last write of it (status or finalizer).
    version: Option<String>,
    /// The cached Stack's `resourceVersion` while the pass has not shown that it is the stored one
    /// ([`OwnWrites`] did not know it): its status write is pinned to it, and its effects wait for
    /// [`Pass::ensure_current`]. `None`: known current.
    unverified: Option<String>,
    /// This pass removed the Stack's finalizer (it is going away).
    removed_finalizer: bool,
    deleting: bool,
    now: Time,
    status: StackStatus,
    conditions: Vec<Condition>,
    written: Option<StackStatus>,
    effects: Vec<Effect>,
    /// The shortest time between two drift checks ([`Context::drift_min_interval`]).
    drift_min_interval: Duration,
}

impl Pass {
    fn new(ctx: &Context, state: &StackController, api: Api<Stack>, stack: Arc<Stack>) -> Self {
        let (ns, name) = (stack.namespace().unwrap_or_default(), stack.name_any());
        let generation = stack.meta().generation;
        let request = stack.annotations().get(RECONCILE_REQUEST_ANNOTATION).cloned();
        let mut status = stack.status.clone().unwrap_or_default();
        status.observed_generation = generation;
        status.observed_reconcile_request = request.clone();
        let asked = stack.annotations().get(pko_api::constants::CANCEL_REQUEST_ANNOTATION).cloned();
        let cancel =
            messages::new_request(asked.as_deref(), status.observed_cancel_request.as_deref()).map(str::to_string);
        status.observed_cancel_request = asked;
        let unlock_asked = stack.annotations().get(pko_api::constants::UNLOCK_REQUEST_ANNOTATION);
        let unlock = messages::new_request(unlock_asked.map(String::as_str), status.observed_unlock_request.as_deref())
            .map(str::to_string);
        let conditions = status.conditions.clone().unwrap_or_default();
        Pass {
            ownership: ctx.ownership.clone(),
            updates: Api::namespaced(ctx.client.clone(), &ns),
            cached_updates: state.updates.clone(),
            programs: state.programs.clone(),
            cached_workspaces: state.workspaces.clone(),
            applied_workspaces: state.applied_workspaces.clone(),
            deleting: stack.meta().deletion_timestamp.is_some(),
            written: stack.status.clone(),
            api,
            stack,
            ns,
            name,
            generation,
            request,
            cancel,
            unlock,
            release: None,
            version: None,
            unverified: None,
            removed_finalizer: false,
            now: pko_api::conditions::now(),
            status,
            conditions,
            effects: Vec::new(),
            drift_min_interval: ctx.drift_min_interval,
        }
    }

    fn reconciling(&mut self, reason: &str, message: &str) {
        conditions::mark_reconciling(&mut self.conditions, reason, message, self.generation, &self.now);
    }

    fn stalled(&mut self, reason: &str, message: &str) {
        conditions::mark_stalled(&mut self.conditions, reason, message, self.generation, &self.now);
    }

    fn event(&mut self, severity: Severity, reason: &'static str, note: String) {
        self.effects.push(Effect::Event(severity, reason, note));
    }

    /// The key of this Stack's drift-check slot.
    fn slot_key(&self) -> String {
        format!("{}/{}", self.ns, self.name)
    }

    /// The status as it stands in this pass (with the conditions set so far).
    fn view(&self) -> StackStatus {
        StackStatus { conditions: Some(self.conditions.clone()), ..self.status.clone() }
    }

    fn set_drift(&mut self, status: &str, reason: &str, message: &str) {
        conditions::set(&mut self.conditions, sc::DRIFT_DETECTED, status, reason, message, self.generation, &self.now);
    }

    /// Fails with [`Error::Fenced`] once the Stack's shard is not held here any more: asked right
    /// before every write of the pass.
    fn fence(&self) -> Result<(), Error> {
        if self.ownership.owns(&self.ns, &self.name) { Ok(()) } else { Err(Error::Fenced) }
    }

    /// Whether this pass wrote the Stack (its status or its finalizer): its version is then
    /// [`Pass::version`].
    fn written_here(&self) -> bool {
        self.version.is_some() || self.removed_finalizer
    }

    /// Writes the status built so far, unless it is what is stored (or was last written). On an
    /// unverified pass the write is pinned to the cached `resourceVersion`: 409 → [`Error::Stale`].
    async fn write_status(&mut self) -> Result<(), Error> {
        self.status.conditions = Some(self.conditions.clone());
        if self.written.as_ref() == Some(&self.status) {
            return Ok(());
        }
        self.fence()?;
        let pinned = self.unverified.take();
        self.version = match io::write_status(&self.api, &self.name, &self.status, pinned.as_deref()).await {
            Ok(v) => v,
            Err(e)
                if pinned.is_some() && (k8s::is_conflict(&e) || matches!(&e, kube::Error::Api(r) if r.code == 404)) =>
            {
                return Err(Error::Stale);
            }
            Err(e) => return Err(Error::Status(e)),
        };
        self.written = Some(self.status.clone());
        Ok(())
    }

    /// Before a write that is not the pinned status write (an Update created, the effects): an
    /// unverified pass reads the Stack once and goes on only when the cache showed the stored
    /// version; otherwise [`Error::Stale`].
    async fn ensure_current(&mut self) -> Result<(), Error> {
        let Some(cached) = self.unverified.clone() else { return Ok(()) };
        let stored = self.api.get_opt(&self.name).await.map_err(Error::Dereference)?;
        if stored.as_ref().and_then(|s| s.metadata.resource_version.as_deref()) != Some(cached.as_str()) {
            return Err(Error::Stale);
        }
        self.unverified = None;
        Ok(())
    }

    /// Carries out the effects, in order, after the status write.
    async fn apply_effects(&mut self, ctx: &Context) -> Result<Option<Action>, Error> {
        let mut action = None;
        for effect in std::mem::take(&mut self.effects) {
            self.fence()?;
            match effect {
                Effect::Event(severity, reason, note) => {
                    k8s::publish(&ctx.events.stack, &*self.stack, severity, reason, note).await
                }
                Effect::ReleaseUpdate(u) => {
                    finalizer::release_update(&self.updates, &u).await.map_err(Error::CurrentUpdate)?
                }
                Effect::RemoveFinalizer => {
                    finalizer::set_finalizers(&self.api, &self.stack, false).await.map_err(Error::Finalizer)?;
                    // going away: nothing more of it to read
                    self.version = None;
                    self.removed_finalizer = true;
                    action = Some(Action::await_change());
                }
                Effect::ReclaimWorkspace => io::reclaim_workspace(ctx, &self.stack).await.map_err(Error::Workspace)?,
                Effect::ReleaseDriftSlot => {
                    if let Err(e) = ctx.drift_slots.release(&self.slot_key()).await {
                        // the slot's lease runs out by itself
                        tracing::warn!(error = %e, "releasing the drift-check slot");
                    }
                }
                Effect::ForwardCancel(name, request) => {
                    let patch =
                        json!({"metadata": {"annotations": {pko_api::constants::CANCEL_REQUEST_ANNOTATION: request}}});
                    self.updates
                        .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                        .await
                        .map_err(Error::CurrentUpdate)?;
                }
                Effect::DeleteUpdate(name) => {
                    // its TTL deletes it later anyway: a failure only delays that
                    match self.updates.delete(&name, &Default::default()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => {
                            tracing::warn!(update = %name, error = %e, "deleting an earlier drift check's Update")
                        }
                    }
                }
            }
        }
        Ok(action)
    }
}

/// What the Stack controller's reconciles share: the operator's [`Context`] and the Update informer's
/// cache, which a pass reads Updates in flight from before it creates one ([`io::in_flight_update`]).
pub struct StackController {
    /// The operator's context.
    pub ctx: Arc<Context>,
    /// The Update informer's cache (the Updates of the shards this replica holds).
    pub updates: kube::runtime::reflector::Store<Update>,
    /// The Program informer's cache (every Program of the watched namespaces), which a pass reads a
    /// `programRef`'s artifact from ([`source::resolve`]).
    pub programs: kube::runtime::reflector::Store<pko_api::Program>,
    /// The `resourceVersion` of each Stack after this replica's last write of it ([`OwnWrites`]).
    pub own_writes: OwnWrites,
    /// The Workspace informer's cache (the Workspaces of the shards this replica holds).
    pub workspaces: kube::runtime::reflector::Store<Workspace>,
    /// What each Stack last applied as its Workspace from this replica ([`AppliedWorkspaces`]).
    pub applied_workspaces: Arc<AppliedWorkspaces>,
}

/// The `resourceVersion` each Stack had after this replica's last write of it (its status, its
/// finalizer), and when: a pass on a cached copy at exactly that version is known current — nobody
/// wrote it since, and the cache has caught up with our own write. A cached copy at another version
/// within [`CACHE_CATCH_UP`] of our write is most likely the cache not having caught up yet: the pass
/// waits for it (the watch event of our write reconciles again; nothing is sent). Any other cached
/// copy (a change by someone else, a Stack never written here) is used too, unverified: its status
/// write is pinned to its `resourceVersion` and its other writes wait for one read that shows it is
/// the stored version ([`Pass::ensure_current`]); a stale one ends the pass with nothing written
/// ([`Error::Stale`]). No pass reads the Stack before deciding.
#[derive(Debug, Default)]
pub struct OwnWrites(std::sync::Mutex<std::collections::HashMap<(String, String), OwnWrite>>);

/// This replica's last write of a Stack: the `resourceVersion` it gave, when, and the epoch of the
/// Stack's shard it was made at.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OwnWrite {
    version: String,
    at: std::time::Instant,
    epoch: i64,
}

/// How long after this replica's own write of a Stack a cached copy at another version is taken as
/// the cache catching up rather than someone else's newer write: 1 second (the watch delivers a write
/// in milliseconds at rest; a pinned write on the older copy would only be refused with 409).
pub const CACHE_CATCH_UP: Duration = Duration::from_secs(1);

/// What a pass may take a cached Stack for ([`OwnWrites::judge`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cached {
    /// The version this replica wrote last: current.
    Current,
    /// Another version shortly after our write: wait this long for the cache to catch up.
    CatchingUp(Duration),
    /// Another version: used unverified at this `resourceVersion` (`None`: the copy has none).
    Unverified(Option<String>),
}

impl OwnWrites {
    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<(String, String), OwnWrite>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What `cached` (the informer's copy) may be taken for at `now`, its shard held at `epoch`: a
    /// write recorded at another epoch says nothing (the shard was lost since, and its holders in
    /// between may have written). Pure on the map.
    pub fn judge(&self, cached: &Stack, now: std::time::Instant, epoch: i64) -> Cached {
        let key = (cached.namespace().unwrap_or_default(), cached.name_any());
        let rv = cached.metadata.resource_version.clone();
        let own = self.map().get(&key).filter(|w| w.epoch == epoch).cloned();
        match (own, rv) {
            (Some(own), Some(rv)) if own.version == rv => Cached::Current,
            (Some(OwnWrite { at, .. }), rv) => {
                match CACHE_CATCH_UP.checked_sub(now.saturating_duration_since(at)).filter(|d| !d.is_zero()) {
                    Some(wait) => Cached::CatchingUp(wait),
                    None => Cached::Unverified(rv),
                }
            }
            (None, rv) => Cached::Unverified(rv),
        }
    }

    /// Records the version a write gave Stack `ns/name` now, its shard held at `epoch` (`None`: forget it).
    pub fn record(&self, ns: &str, name: &str, version: Option<String>, epoch: i64) {
        let key = (ns.to_string(), name.to_string());
        match version {
            Some(version) => self.map().insert(key, OwnWrite { version, at: std::time::Instant::now(), epoch }),
            None => self.map().remove(&key),
        };
    }
}

/// One reconcile of a Stack: ownership, dereference, the steps, one status write, the effects.
pub async fn reconcile(cached: Arc<Stack>, state: Arc<StackController>) -> Result<Action, Error> {
    let ctx = &state.ctx;
    let (ns, name) = (cached.namespace().unwrap_or_default(), cached.name_any());
    if !ctx.ownership.owns(&ns, &name) {
        return Ok(crate::k8s::unowned());
    }
    let api: Api<Stack> = Api::namespaced(ctx.client.clone(), &ns);
    // the cached Stack, always: known current when it is the version this replica wrote last; just
    // after our own write, awaited; else unverified — its writes pinned to its resourceVersion, its
    // effects behind one read
    let unverified = match state.own_writes.judge(&cached, std::time::Instant::now(), ctx.ownership.epoch(&ns, &name)) {
        Cached::Current => None,
        Cached::CatchingUp(wait) => return Ok(Action::requeue(wait)),
        Cached::Unverified(rv) => rv,
    };
    match pass(&state, api, cached, unverified).await {
        Err(Error::Stale) => {
            tracing::debug!("the cached stack was behind the stored one; reconciled again from the newer version");
            metrics::counter!(crate::metric_names::STALE_PASSES_TOTAL, "controller" => "stack").increment(1);
            Ok(Action::requeue(STALE_RETRY))
        }
        done => done,
    }
}

/// How soon a pass that found the cache behind runs again (the newer version's watch event usually
/// comes first): 2 seconds.
pub const STALE_RETRY: Duration = Duration::from_secs(2);

/// The pass over `cached` (unverified at its `resourceVersion` when given): the finalizer, then the
/// steps, one status write, the effects.
async fn pass(
    state: &StackController,
    api: Api<Stack>,
    cached: Arc<Stack>,
    unverified: Option<String>,
) -> Result<Action, Error> {
    let ctx = &state.ctx;
    let (ns, name) = (cached.namespace().unwrap_or_default(), cached.name_any());
    let stack = (*cached).clone();
    let deleting = stack.meta().deletion_timestamp.is_some();
    let has_finalizer = stack.finalizers().iter().any(|f| f == STACK_FINALIZER);
    if !has_finalizer {
        if deleting {
            return Ok(Action::await_change());
        }
        // fenced: the read above may have crossed a freeze or a shard move
        if !ctx.ownership.owns(&ns, &name) {
            return Ok(crate::k8s::unowned());
        }
        // the patch's test pins the finalizer list as cached: 422 when the cache was behind
        let version = match finalizer::set_finalizers(&api, &stack, true).await {
            Err(kube::Error::Api(e)) if unverified.is_some() && e.code == 422 => return Err(Error::Stale),
            written => written.map_err(Error::Finalizer)?,
        };
        state.own_writes.record(&ns, &name, version, ctx.ownership.epoch(&ns, &name));
        return Ok(Action::await_change());
    }
    let mut pass = Pass::new(ctx, state, api, Arc::new(stack));
    pass.unverified = unverified;
    let exit = match steps(ctx, &mut pass).await? {
        ControlFlow::Break(exit) => exit,
        ControlFlow::Continue(()) => Exit::Done(Action::await_change()),
    };
    pass.write_status().await?;
    if !pass.effects.is_empty() {
        pass.ensure_current().await?;
    }
    let after = pass.apply_effects(ctx).await;
    if pass.written_here() {
        state.own_writes.record(&ns, &name, pass.version.clone(), ctx.ownership.epoch(&ns, &name));
    }
    let after = after?;
    match exit {
        Exit::Done(action) => Ok(after.unwrap_or(action)),
        Exit::Retry(e) => Err(e),
    }
}

type Step<T = ()> = Result<ControlFlow<Exit, T>, Error>;

async fn steps(ctx: &Context, p: &mut Pass) -> Step {
    if let ControlFlow::Break(e) = current_update(ctx, p).await? {
        return Ok(ControlFlow::Break(e));
    }
    if let ControlFlow::Break(e) = deletion(ctx, p).await? {
        return Ok(ControlFlow::Break(e));
    }
    unlock(ctx, p).await?;
    let source = match source(ctx, p).await? {
        ControlFlow::Continue(s) => s,
        ControlFlow::Break(e) => return Ok(ControlFlow::Break(e)),
    };
    let stall = workspace_stall(ctx, p).await?;
    let work = match sync(p, &source, stall.as_ref().map(|(r, m)| (r.as_str(), m.as_str()))) {
        ControlFlow::Continue(w) => w,
        ControlFlow::Break(e) => return Ok(ControlFlow::Break(e)),
    };
    // a drift check only reads: prerequisites gate updates
    if matches!(work, Work::Update(_))
        && let ControlFlow::Break(e) = prerequisites(p).await?
    {
        return Ok(ControlFlow::Break(e));
    }
    let ws = match workspace(ctx, p, &source).await? {
        ControlFlow::Continue(ws) => ws,
        ControlFlow::Break(e) => return Ok(ControlFlow::Break(e)),
    };
    match work {
        Work::Update(reason) => update(p, &ws, &source, reason).await.map(ControlFlow::Break),
        Work::DriftCheck { tick, auto_remediate } => {
            drift_check(ctx, p, &ws, &source, tick, auto_remediate).await.map(ControlFlow::Break)
        }
    }
}

/// Whether a pass may take the cached Update as it is, without reading it fresh. Pure. Yes when the
/// cache shows it complete: a complete Update's status is final (nothing writes it again) and the one
/// write absorbing it makes to it, the finalizer release, is fenced by the cached `resourceVersion`.
/// Yes when it shows an operation (not a drift check) still running: the pass only waits, and the
/// completion wakes the Stack once the cache has it. A running drift check is read fresh.
fn cache_will_do(u: &Update) -> bool {
    u.is_complete() || !drift::is_check(u)
}

/// Step 2: the current Update — wait while it runs, absorb it once complete, forget it when gone.
async fn current_update(ctx: &Context, p: &mut Pass) -> Step {
    let Some(cur) = p.status.current_update.clone() else { return Ok(ControlFlow::Continue(())) };
    let name = cur.name.as_deref().unwrap_or_default();
    let Some(u) =
        k8s::cached_or_get(&p.cached_updates, &p.updates, name, cache_will_do).await.map_err(Error::CurrentUpdate)?
    else {
        p.status.current_update = None;
        return Ok(ControlFlow::Continue(()));
    };
    if drift::is_check(&u) {
        return drift_checked(ctx, p, u).await;
    }
    if !u.is_complete() {
        // a new cancel request goes to the Update it cancels (its controller stops the operation)
        if let Some(v) = p.cancel.clone()
            && u.annotations().get(pko_api::constants::CANCEL_REQUEST_ANNOTATION) != Some(&v)
        {
            // seen only once the Update carries it: a patch that fails is sent again by the next pass
            p.status.observed_cancel_request = p.stack.status.as_ref().and_then(|s| s.observed_cancel_request.clone());
            p.effects.push(Effect::ForwardCancel(u.name_any(), v));
        }
        // PKO's text. Why a queued Update waits is on the Update (Progressing=False Queued, and
        // `kubectl pko status`), not mirrored here: the mirror cost two Stack status writes per
        // queued operation (into the queue and out of it), the most of any status in a busy fleet
        p.reconciling(sc::STACK_PROCESSING, sc::STACK_BEING_PROCESSED_MESSAGE);
        return Ok(ControlFlow::Break(Exit::Done(Action::requeue(Duration::from_secs(30)))));
    }
    let a = absorb::absorb(
        p.status.last_update.as_ref(),
        &cur,
        &u,
        &p.now,
        super::plan::RetryPolicy::of(&p.stack.spec).max_failures,
    );
    if let Some(why) = &a.mismatch {
        tracing::error!(update = %u.name_any(), %why, "a finished Update is not taken as a success");
        metrics::counter!(crate::metric_names::RUN_MISMATCHES_TOTAL, "check" => "absorb").increment(1);
    }
    if let Some(pi) = a.project_info.clone() {
        p.status.project_info = Some(pi);
    }
    if let Some(secret) = a.outputs_secret.as_deref() {
        // handed over by this replica's dispatcher when it ran the operation, else read back
        if let Some(outputs) = ctx.outputs.take(u.metadata.uid.as_deref().unwrap_or_default()).await {
            metrics::counter!(crate::metric_names::OUTPUTS_READS_TOTAL, "source" => "handed_over").increment(1);
            p.status.outputs = Some((*outputs).clone());
        } else {
            metrics::counter!(crate::metric_names::OUTPUTS_READS_TOTAL, "source" => "api").increment(1);
            tracing::debug!(update = %u.name_any(), uid = ?u.metadata.uid, "outputs not handed over: reading the outputs Secret");
            if let Some(s) = Api::<Secret>::namespaced(ctx.client.clone(), &p.ns)
                .get_opt(secret)
                .await
                .map_err(Error::CurrentUpdate)?
            {
                p.status.outputs = Some(crate::outputs::stack_outputs(&s));
            }
        }
    }
    p.status.last_update = Some(a.last_update.clone());
    p.status.current_update = None;
    if a.succeeded {
        p.event(Severity::Normal, ev::STACK_CREATED, "Successfully updated stack".into());
    } else {
        p.event(Severity::Warning, ev::STACK_UPDATE_FAILURE, format!("Failed to update stack: {}", a.message));
        if a.conflict {
            let msg =
                messages::conflict_message(p.status.last_update.as_ref(), &super::plan::RetryPolicy::of(&p.stack.spec));
            p.event(Severity::Warning, ev::STACK_UPDATE_CONFLICT_DETECTED, msg);
        }
    }
    p.effects.push(Effect::ReleaseUpdate(Box::new(u)));
    Ok(ControlFlow::Continue(()))
}

/// Step 2, for a drift check: while it runs the Stack stays as it is (Ready) and the check's slot is
/// renewed; once it ended, its result sets `DriftDetected` and `status.driftDetection` (never
/// `lastUpdate`: a check is not an update of the stack).
async fn drift_checked(ctx: &Context, p: &mut Pass, u: Update) -> Step {
    if !u.is_complete() {
        if let Err(e) = ctx.drift_slots.acquire(&p.slot_key(), DRIFT_SLOT_LEASE).await {
            tracing::warn!(error = %e, "renewing the drift-check slot");
        }
        return Ok(ControlFlow::Break(Exit::Done(Action::requeue(Duration::from_secs(30)))));
    }
    let o = drift::outcome(&u);
    let auto_remediate =
        u.annotations().get(pko_api::constants::DRIFT_AUTO_REMEDIATE_ANNOTATION).is_some_and(|v| v == "true");
    // one check's Update is kept (the last), not one per check until its TTL
    let previous = p
        .status
        .drift_detection
        .as_ref()
        .and_then(|d| d.last_check_update.clone())
        .filter(|n| Some(n) != u.metadata.name.as_ref());
    p.status.drift_detection = Some(drift::checked(p.status.drift_detection.as_ref(), &u, &o, p.now.0, auto_remediate));
    match drift::tightened(&p.stack, p.now.0, ctx.drift_min_interval) {
        Some(note) => p.set_drift(o.status, o.reason, &format!("{} ({note})", o.message)),
        None => p.set_drift(o.status, o.reason, &o.message),
    }
    if let Some(name) = previous {
        p.effects.push(Effect::DeleteUpdate(name));
    }
    let result = match o.reason {
        sc::DRIFT_CHANGES => {
            p.event(Severity::Warning, ev::STACK_DRIFT_DETECTED, o.message.clone());
            "changes"
        }
        sc::DRIFT_CHECK_FAILED => {
            p.event(Severity::Warning, ev::STACK_DRIFT_CHECK_FAILED, o.message.clone());
            "failed"
        }
        _ => "no_changes",
    };
    metrics::counter!(crate::metric_names::DRIFT_CHECKS_TOTAL, "result" => result).increment(1);
    tracing::info!(update = %u.name_any(), result, "drift check ended");
    p.status.current_update = None;
    p.effects.push(Effect::ReleaseUpdate(Box::new(u)));
    p.effects.push(Effect::ReleaseDriftSlot);
    Ok(ControlFlow::Continue(()))
}

/// Step 3: a Stack being deleted without a destroy due lets go; a terminating namespace stalls it.
async fn deletion(ctx: &Context, p: &mut Pass) -> Step {
    if !p.deleting {
        return Ok(ControlFlow::Continue(()));
    }
    let spec = &p.stack.spec;
    // not asked for, or nothing ever ran (PKO: no prior update)
    if spec.destroy_on_finalize != Some(true)
        || spec.preview == Some(true)
        || (p.status.last_update.is_none() && p.status.current_update.is_none())
    {
        p.effects.push(Effect::RemoveFinalizer);
        return Ok(ControlFlow::Break(Exit::Done(Action::await_change())));
    }
    // a destroy cannot run in a terminating namespace (no Workspace or Update can be created there)
    if io::namespace_terminating(ctx, &p.ns).await.map_err(Error::Deletion)? {
        let msg = messages::namespace_terminating_message(&p.ns, &p.name);
        p.stalled(sc::NAMESPACE_TERMINATING, &msg);
        return Ok(ControlFlow::Break(Exit::Done(Action::requeue(Duration::from_secs(30)))));
    }
    Ok(ControlFlow::Continue(()))
}

/// Step 3b: a new unlock request, judged once no Update of the Stack runs ([`super::unlock`]):
/// accepted, the next Update releases the holders; refused, an event names the holder kept.
async fn unlock(ctx: &Context, p: &mut Pass) -> Result<(), Error> {
    let Some(request) = p.unlock.clone() else { return Ok(()) };
    let message = p.status.last_update.as_ref().and_then(|l| l.message.clone());
    let holders = pko_proto::locks::holders(message.as_deref().unwrap_or_default());
    tracing::debug!(request = %request, holders = holders.len(), "judging an unlock request");
    let facts = io::unlock_facts(ctx, &p.ns, &p.name, &holders).await.map_err(Error::Unlock)?;
    match super::unlock::decide(message.as_deref(), &facts, super::unlock::process_alive) {
        super::unlock::Decision::Release(holders, note) => {
            tracing::warn!(request = %request, holders = %note, "unlock request accepted");
            p.event(Severity::Normal, ev::STACK_UNLOCK_ACCEPTED, note);
            p.release = Some(holders);
        }
        super::unlock::Decision::Refuse(note) => {
            tracing::info!(request = %request, reason = %note, "unlock request refused");
            p.event(Severity::Warning, ev::STACK_UNLOCK_REFUSED, note);
        }
    }
    p.status.observed_unlock_request = Some(request);
    Ok(())
}

/// Step 4: the source at a revision, and a valid spec.
async fn source(ctx: &Context, p: &mut Pass) -> Step<ResolvedSource> {
    let source = match source::resolve(ctx, &p.programs, &p.stack, p.deleting).await.map_err(Error::Source)? {
        Resolved::Source(s) => s,
        Resolved::Stalled(reason, msg) => {
            // PKO's Warning `StackConfigInvalid` for a git source or credentials it cannot use; once
            // per transition (the pass is repeated every 30 s: a Secret created later is then found)
            if reason == sc::SPEC_INVALID && !conditions::is_stalled_with(&p.conditions, reason, &msg) {
                p.event(Severity::Warning, ev::STACK_CONFIG_INVALID, msg.clone());
            }
            p.stalled(reason, &msg);
            return Ok(ControlFlow::Break(Exit::Done(Action::requeue(Duration::from_secs(30)))));
        }
    };
    if let Err(e) = pko_api::validation::validate_stack_spec(&p.stack.spec, &p.ns) {
        p.event(Severity::Warning, ev::STACK_CONFIG_INVALID, e.to_string());
        p.stalled(sc::SPEC_INVALID, &e.to_string());
        return Ok(ControlFlow::Break(Exit::Done(Action::await_change())));
    }
    // a template the API server refused stays refused for this generation (a spec change tries again)
    if messages::refused_this_generation(&p.conditions, p.generation) {
        return Ok(ControlFlow::Break(Exit::Done(Action::await_change())));
    }
    Ok(ControlFlow::Continue(source))
}

/// Before step 5: after a failed update, whether the Stack's Workspace is Stalled (its reason and
/// message): then the failure is not retried (PKO's `WorkspaceFailed`). One read, only on that path.
async fn workspace_stall(ctx: &Context, p: &Pass) -> Result<Option<(String, String)>, Error> {
    if p.status.last_update.as_ref().and_then(|l| l.state) != Some(StackUpdateStateMessage::Failed) {
        return Ok(None);
    }
    let ws =
        Api::<Workspace>::namespaced(ctx.client.clone(), &p.ns).get_opt(&p.name).await.map_err(Error::Workspace)?;
    Ok(ws.as_ref().and_then(Workspace::stalled).map(|c| (c.reason.clone(), c.message.clone())))
}

/// Step 5: in sync (conditions, maybe the finalizer or the Workspace go, maybe a drift check is due)
/// or the reason for an Update.
fn sync(p: &mut Pass, source: &ResolvedSource, workspace_stall: Option<(&str, &str)>) -> ControlFlow<Exit, Work> {
    // an accepted unlock runs the operation again now (past a backoff, a retry budget spent)
    if p.release.is_some() {
        return ControlFlow::Continue(Work::Update(messages::UNLOCK_REASON.into()));
    }
    let checked = Stack { status: Some(p.status.clone()), ..(*p.stack).clone() };
    let (c, mut requeue_after) = match plan::decide_with_workspace(
        &checked,
        &source.revision(),
        p.now.0,
        p.stack.spec.branch.is_some(),
        p.deleting,
        workspace_stall,
    ) {
        Sync::NeedsUpdate { reason } => return ControlFlow::Continue(Work::Update(reason)),
        Sync::Synced { conditions: c, requeue_after } => (c, requeue_after),
    };
    let ready = c == plan::Conditions::Ready;
    match c {
        plan::Conditions::Ready => conditions::mark_ready(&mut p.conditions, p.generation, &p.now),
        plan::Conditions::Reconciling(r, m) => p.reconciling(r, &m),
        plan::Conditions::Stalled(r, m) => p.stalled(r, &m),
    }
    if ready && !p.deleting {
        match drift_due(p) {
            ControlFlow::Break(work) => return ControlFlow::Continue(work),
            ControlFlow::Continue(Some(next)) => requeue_after = Some(requeue_after.map_or(next, |r| r.min(next))),
            ControlFlow::Continue(None) => {}
        }
    }
    let destroyed = p.status.last_update.as_ref().is_some_and(|l| {
        l.update_type == Some(UpdateType::Destroy) && l.state == Some(StackUpdateStateMessage::Succeeded)
    });
    if p.deleting && destroyed {
        p.effects.push(Effect::RemoveFinalizer);
    } else if !p.deleting && io::ready_and_reclaimable(&p.stack, &p.status) {
        p.effects.push(Effect::ReclaimWorkspace);
    }
    ControlFlow::Break(Exit::Done(requeue_after.map(Action::requeue).unwrap_or_else(Action::await_change)))
}

/// Step 5, for a synced, Ready Stack: drift to remediate (`Break` an Update), a check due (`Break` the
/// check), or when to look again (`Continue` with the time to the next tick). Keeps `DriftDetected`
/// and `status.driftDetection.nextCheck` current.
fn drift_due(p: &mut Pass) -> ControlFlow<Work, Option<Duration>> {
    match drift::remediation(&p.view()) {
        drift::Remediation::Run(reason) => {
            metrics::counter!(crate::metric_names::DRIFT_REMEDIATIONS_TOTAL).increment(1);
            return ControlFlow::Break(Work::Update(reason));
        }
        drift::Remediation::Done(message) => p.set_drift("False", sc::DRIFT_NO_CHANGES, &message),
        drift::Remediation::None => {}
    }
    match drift::due(&p.stack, &p.view(), p.now.0, p.drift_min_interval) {
        drift::Due::Off => {
            // drift detection was turned off: nothing of it is left to read
            conditions::remove(&mut p.conditions, sc::DRIFT_DETECTED);
            p.status.drift_detection = None;
            ControlFlow::Continue(None)
        }
        drift::Due::Invalid(message) => {
            let known =
                pko_api::conditions::find(&p.conditions, sc::DRIFT_DETECTED).is_some_and(|c| c.message == message);
            if !known {
                p.event(Severity::Warning, ev::STACK_CONFIG_INVALID, message.clone());
            }
            p.set_drift("Unknown", sc::DRIFT_INVALID_SCHEDULE, &message);
            ControlFlow::Continue(None)
        }
        drift::Due::At(tick) => {
            p.status.drift_detection.get_or_insert_default().next_check = Some(Time(tick));
            ControlFlow::Continue(Some(tick.duration_since(p.now.0).unsigned_abs().max(Duration::from_secs(1))))
        }
        drift::Due::Check { tick, auto_remediate } => {
            p.status.drift_detection.get_or_insert_default().next_check = Some(Time(tick));
            ControlFlow::Break(Work::DriftCheck { tick, auto_remediate })
        }
    }
}

/// Step 6: prerequisites (not while deleting: a missing prerequisite never blocks a destroy, PKO #751).
async fn prerequisites(p: &mut Pass) -> Step {
    let Some(prereqs) = p.stack.spec.prerequisites.clone().filter(|pre| !pre.is_empty() && !p.deleting) else {
        return Ok(ControlFlow::Continue(()));
    };
    let mut found = std::collections::BTreeMap::new();
    for pre in &prereqs {
        if let Some(s) = p.api.get_opt(&pre.name).await.map_err(Error::Prerequisites)? {
            found.insert(pre.name.clone(), s);
        }
    }
    let prerequisites::Verdict::NotSatisfied { message, resync } = prerequisites::check(&prereqs, &found, p.now.0)
    else {
        return Ok(ControlFlow::Continue(()));
    };
    for (prereq, value) in resync {
        let patch = json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": prereq, "annotations": {RECONCILE_REQUEST_ANNOTATION: value}}});
        p.api
            .patch(&prereq, &PatchParams::apply(field_manager::PREREQUISITE_REQUEST).force(), &Patch::Apply(&patch))
            .await
            .map_err(Error::Prerequisites)?;
    }
    p.reconciling(sc::PREREQUISITE_NOT_SATISFIED, &message);
    // woken by the prerequisites' changes (see the controller's watches); the requeue covers a missed event
    Ok(ControlFlow::Break(Exit::Done(Action::requeue(Duration::from_secs(300)))))
}

/// Step 7: the Workspace, applied; the pass waits until it is Ready.
async fn workspace(ctx: &Context, p: &mut Pass, source: &ResolvedSource) -> Step<Workspace> {
    let desired = build::workspace(&p.stack, source)?;
    let cached = p.cached_workspaces.get(&kube::runtime::reflector::ObjectRef::new(&p.name).within(&p.ns));
    let epoch = p.ownership.epoch(&p.ns, &p.name);
    let applied = match p.applied_workspaces.unchanged(&p.ns, &p.name, &desired, cached.as_deref(), epoch) {
        Some(ws) => Ok(ws),
        None => Api::<Workspace>::namespaced(ctx.client.clone(), &p.ns)
            .patch(&p.name, &PatchParams::apply(field_manager::OPERATOR).force(), &Patch::Apply(&desired))
            .await
            .inspect(|ws| p.applied_workspaces.record(&p.ns, &p.name, &desired, ws, epoch)),
    };
    let ws = match applied {
        Ok(ws) => ws,
        Err(e) => {
            let (stall, msg) = messages::refusal(messages::REFUSED_WORKSPACE, &e);
            if stall {
                p.stalled(sc::SPEC_INVALID, &msg);
                return Ok(ControlFlow::Break(Exit::Done(Action::await_change())));
            }
            p.reconciling(sc::STACK_PROCESSING, &msg);
            return Ok(ControlFlow::Break(Exit::Retry(Error::Workspace(e))));
        }
    };
    // a Workspace stalled at its current generation (a spec it cannot run, or a stack it could not
    // initialize): no Update against it (PKO), Stalled until the Workspace mends (its controller tries
    // the initialization again) or changes — woken by the Workspace's watch
    if let Some((reason, message)) = messages::workspace_stall(&ws) {
        p.stalled(reason, &message);
        return Ok(ControlFlow::Break(Exit::Done(Action::await_change())));
    }
    if !ready_for_update(&ws) {
        p.reconciling(sc::STACK_PROCESSING, &messages::workspace_wait_message(&ws));
        return Ok(ControlFlow::Break(Exit::Done(Action::requeue(Duration::from_secs(5)))));
    }
    Ok(ControlFlow::Continue(ws))
}

/// Whether an Update may be made against `ws` as the apply returned it: runnable, and — for a Workspace
/// with an agent of its own (no `status.pool`: its own pod or process, PKO's model) — observed at its
/// current generation (PKO's `isWorkspaceReady`): its agent runs the spec just applied (a new image,
/// a pod template rolled out). A pooled Workspace's operation is built from the Workspace at the
/// generation its Update names, whichever agent of the class runs it, so it does not wait. Pure.
pub fn ready_for_update(ws: &Workspace) -> bool {
    let status = ws.status.as_ref();
    let own_agent = status.is_none_or(|s| s.pool.is_none());
    ws.runnable() && (!own_agent || status.and_then(|s| s.observed_generation) == ws.metadata.generation)
}

/// Step 8, for a due drift check: take a fleet-wide slot (none free: look again in [`DRIFT_SLOT_RETRY`]), write
/// `currentUpdate`, create the check's Update. The Stack stays Ready.
async fn drift_check(
    ctx: &Context,
    p: &mut Pass,
    ws: &Workspace,
    source: &ResolvedSource,
    tick: k8s_openapi::jiff::Timestamp,
    auto_remediate: bool,
) -> Result<Exit, Error> {
    let (generation, request, revision) = (p.generation, p.request.clone(), source.revision());
    if let Some(running) = io::in_flight_update(&p.cached_updates, &p.ns, &p.name) {
        p.status.current_update = Some(CurrentStackUpdate {
            generation,
            reconcile_request: request,
            name: Some(running),
            commit: Some(revision),
        });
        return Ok(Exit::Done(Action::requeue(Duration::from_secs(30))));
    }
    match ctx.drift_slots.acquire(&p.slot_key(), DRIFT_SLOT_LEASE).await {
        Ok(true) => {}
        Ok(false) => {
            metrics::counter!(crate::metric_names::DRIFT_CHECKS_DEFERRED_TOTAL).increment(1);
            // said once on DriftDetected (`kubectl pko status -o wide`); the check's result replaces it
            let current = pko_api::conditions::find(&p.conditions, sc::DRIFT_DETECTED)
                .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
            if let Some((status, reason, message)) =
                drift::deferred(current.as_ref().map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str())))
            {
                p.set_drift(&status, &reason, &message);
            }
            // looked at again soon (a pass that changes nothing writes nothing), keeping its place in
            // the slots' line: a Stack whose checks tick as fast as this retry asks again the moment
            // it released and, without the line, took the slot round after round (tests/drift.rs, a
            // waiting Stack starved in CI)
            return Ok(Exit::Done(Action::requeue(DRIFT_SLOT_RETRY)));
        }
        Err(e) => {
            tracing::warn!(error = %e, "taking a drift-check slot; trying again in 30 s");
            return Ok(Exit::Done(Action::requeue(Duration::from_secs(30))));
        }
    }
    let name = drift::check_name(&p.name, tick);
    let mut check = build::drift_check(&p.stack, ws, &name, auto_remediate)?;
    build::pin_run(&mut check, &p.stack, ws, &revision);
    p.status.current_update = Some(CurrentStackUpdate {
        generation,
        reconcile_request: request,
        name: Some(name.clone()),
        commit: Some(revision),
    });
    p.write_status().await?;
    p.ensure_current().await?;
    p.fence()?;
    match p.updates.create(&PostParams::default(), &check).await {
        Ok(_) => tracing::info!(update = %name, auto_remediate, "drift check started"),
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => {
            p.status.current_update = None;
            p.effects.push(Effect::ReleaseDriftSlot);
            let (_, msg) = messages::refusal(messages::REFUSED_UPDATE, &e);
            p.set_drift("Unknown", sc::DRIFT_CHECK_FAILED, &msg);
            return Ok(Exit::Retry(Error::Update(e)));
        }
    }
    Ok(Exit::Done(Action::requeue(Duration::from_secs(30))))
}

/// Step 8: follow an Update already in flight (a write this pass could not see, or another replica's
/// before a shard moved), or write `currentUpdate` and create the Update.
async fn update(p: &mut Pass, ws: &Workspace, source: &ResolvedSource, reason: String) -> Result<Exit, Error> {
    let revision = source.revision();
    let (generation, request) = (p.generation, p.request.clone());
    if let Some(running) = io::in_flight_update(&p.cached_updates, &p.ns, &p.name) {
        tracing::info!(update = %running, "an update is already in flight; following it");
        p.status.current_update = Some(CurrentStackUpdate {
            generation,
            reconcile_request: request,
            name: Some(running),
            commit: Some(revision),
        });
        p.reconciling(sc::STACK_PROCESSING, sc::STACK_BEING_PROCESSED_MESSAGE);
        return Ok(Exit::Done(Action::requeue(Duration::from_secs(30))));
    }
    let update_name = build::update_name(
        &p.name,
        generation,
        request.as_deref(),
        &revision,
        p.deleting,
        p.status.last_update.as_ref(),
    );
    let mut update = build::update(&p.stack, ws, &update_name, p.deleting, &reason)?;
    if let Some(holders) = &p.release {
        update
            .annotations_mut()
            .insert(pko_api::constants::RELEASE_LOCKS_ANNOTATION.into(), pko_proto::locks::describe(holders));
    }
    // drift found by an autoRemediate schedule: the up (and its retries) refresh first
    if !p.deleting && update.spec.update_type == Some(UpdateType::Up) && drift::remediating(&p.view()) {
        update.spec.refresh = Some(true);
    }
    build::pin_run(&mut update, &p.stack, ws, &revision);
    p.status.current_update = Some(CurrentStackUpdate {
        generation,
        reconcile_request: request,
        name: Some(update_name.clone()),
        commit: Some(revision),
    });
    p.reconciling(sc::STACK_PROCESSING, sc::STACK_BEING_PROCESSED_MESSAGE);
    // the intent first: a crash between the two writes leaves a name the next pass heals, never an
    // Update the Stack does not know
    p.write_status().await?;
    p.ensure_current().await?;
    p.fence()?;
    match p.updates.create(&PostParams::default(), &update).await {
        Ok(_) => {
            tracing::info!(update = %update_name, %reason, "stack update started");
            p.event(Severity::Normal, ev::STACK_UPDATE_DETECTED, reason);
            Ok(Exit::Done(Action::requeue(Duration::from_secs(30))))
        }
        // created by an earlier pass that ended before this point: follow it
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Exit::Done(Action::requeue(Duration::from_secs(30)))),
        Err(e) => {
            let (stall, msg) = messages::refusal(messages::REFUSED_UPDATE, &e);
            if stall {
                // undone and said why; it stays so until the spec changes
                p.status.current_update = None;
                p.stalled(sc::SPEC_INVALID, &msg);
                return Ok(Exit::Done(Action::await_change()));
            }
            // retried by the error policy: currentUpdate stays as written (the next pass heals the dangling
            // name and writes the same one again — no change, so no watch event)
            p.event(Severity::Warning, ev::STACK_UPDATE_FAILURE, msg);
            Ok(Exit::Retry(Error::Update(e)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_api::constants::update_condition as uc;
    use pko_api::update::UpdateStatus;

    fn update(update_type: UpdateType, preview_only: bool, complete: bool) -> Update {
        let mut u = Update::new("u", Default::default());
        u.spec.update_type = Some(update_type);
        u.spec.preview_only = Some(preview_only);
        let mut conds = Vec::new();
        let at = Time(k8s_openapi::jiff::Timestamp::from_second(0).unwrap_or_default());
        pko_api::conditions::set(
            &mut conds,
            uc::COMPLETE,
            if complete { "True" } else { "False" },
            uc::UPDATED,
            "",
            None,
            &at,
        );
        u.status = Some(UpdateStatus { conditions: Some(conds), ..Default::default() });
        u
    }

    #[test]
    fn a_running_operation_and_a_complete_update_are_taken_from_the_cache() {
        assert!(cache_will_do(&update(UpdateType::Up, false, false)), "an up in progress: waited on");
        assert!(cache_will_do(&update(UpdateType::Up, false, true)), "complete: its status is final");
        assert!(cache_will_do(&update(UpdateType::Refresh, true, true)), "a complete drift check too");
        assert!(!cache_will_do(&update(UpdateType::Refresh, true, false)), "a running drift check is read fresh");
        assert!(cache_will_do(&Update::new("u", Default::default())), "no status yet: not started, not complete");
    }

    #[test]
    fn an_own_agent_workspace_is_waited_for_at_its_generation_a_pooled_one_is_not() {
        let ws = |generation: i64, observed: i64, pool: Option<&str>| {
            let mut w: Workspace = serde_json::from_value(
                serde_json::json!({"metadata": {"name": "w", "generation": generation}, "spec": {}}),
            )
            .unwrap();
            let mut conditions = Vec::new();
            pko_api::conditions::set(
                &mut conditions,
                "Ready",
                "True",
                "Succeeded",
                "",
                Some(observed),
                &pko_api::conditions::now(),
            );
            w.status = Some(pko_api::workspace::WorkspaceStatus {
                observed_generation: Some(observed),
                pool: pool.map(str::to_string),
                conditions: Some(conditions),
                ..Default::default()
            });
            w
        };
        assert!(ready_for_update(&ws(3, 3, None)), "its own agent, at its generation");
        assert!(!ready_for_update(&ws(4, 3, None)), "its own agent still runs the previous spec");
        assert!(ready_for_update(&ws(4, 3, Some("class-a"))), "pooled: the dispatch reads generation 4");
    }

    #[test]
    fn the_cache_is_read_only_at_the_version_this_replica_wrote_last() {
        let stack = |rv: Option<&str>| {
            let mut s = Stack::new("web", Default::default());
            s.metadata.namespace = Some("team-a".into());
            s.metadata.resource_version = rv.map(str::to_string);
            s
        };
        let own = OwnWrites::default();
        let now = std::time::Instant::now();
        assert_eq!(
            own.judge(&stack(Some("5")), now, 1),
            Cached::Unverified(Some("5".into())),
            "never written here: pinned to its version"
        );
        own.record("team-a", "web", Some("5".into()), 1);
        assert_eq!(
            own.judge(&stack(Some("5")), now, 2),
            Cached::Unverified(Some("5".into())),
            "written before its shard was lost: says nothing now"
        );
        assert_eq!(own.judge(&stack(Some("5")), now, 1), Cached::Current, "the cache shows our own write");
        let soon = std::time::Instant::now();
        assert!(
            matches!(own.judge(&stack(Some("4")), soon, 1), Cached::CatchingUp(d) if d <= CACHE_CATCH_UP),
            "just after our write: the cache catching up, awaited"
        );
        let later = soon + CACHE_CATCH_UP;
        assert_eq!(
            own.judge(&stack(Some("4")), later, 1),
            Cached::Unverified(Some("4".into())),
            "still behind after a second: pinned (409 if stale)"
        );
        assert_eq!(
            own.judge(&stack(Some("6")), later, 1),
            Cached::Unverified(Some("6".into())),
            "someone else wrote since"
        );
        assert_eq!(own.judge(&stack(None), later, 1), Cached::Unverified(None));
        own.record("team-a", "web", None, 1);
        assert_eq!(own.judge(&stack(Some("5")), soon, 1), Cached::Unverified(Some("5".into())), "forgotten once gone");
    }
}
