//! The state of one pass over a Stack: the Stack as read, the status being drafted, what the pass knows of the stored
//! Stack and its own writes, the requests it judged, and the effects that must follow the status write; how a step
//! halts the pass.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use pko_api::Stack;
use pko_api::Update;
use pko_api::constants::{RECONCILE_REQUEST_ANNOTATION, stack_condition as sc};
use pko_api::stack::{CurrentStackUpdate, StackStatus};
use serde_json::json;

use super::{Error, StackController};
use crate::k8s::{self, Severity};
use crate::stack::build::BuildError;
use crate::stack::{conditions, finalizer, io, messages};

/// Why a pass stops before its last step.
pub(super) enum Halt {
    /// Done: the status is written, the effects carried out, then this action.
    Done(Action),
    /// The status is written and the effects carried out, then the error policy retries with this.
    Retry(Error),
    /// Failed: nothing more is written.
    Failed(Error),
}

impl From<Error> for Halt {
    fn from(e: Error) -> Self {
        Halt::Failed(e)
    }
}

impl Pass {
    /// What a builder gave: the object, or — for a template merged onto the generated spec that gives no valid spec
    /// — the Stack Stalled `SpecInvalid` naming the template, with PKO's Warning `StackConfigInvalid` once, until the
    /// spec changes; any other build error fails the pass.
    pub fn built<T>(&mut self, built: Result<T, BuildError>) -> Step<T> {
        match built {
            Ok(t) => Ok(t),
            Err(e @ BuildError::Template { .. }) => {
                let message = e.to_string();
                if !conditions::is_stalled_with(self.conditions(), sc::SPEC_INVALID, &message) {
                    self.event(
                        Severity::Warning,
                        pko_api::constants::event_reason::STACK_CONFIG_INVALID,
                        message.clone(),
                    );
                }
                self.stalled(sc::SPEC_INVALID, &message);
                Err(await_change())
            }
            Err(e) => Err(Halt::Failed(Error::Build(e))),
        }
    }
}

/// A step's result: its value, or why the pass halts.
pub(super) type Step<T = ()> = Result<T, Halt>;

/// How soon a pass looks again at what moves by itself — an Update in flight, a source not yet available, a
/// terminating namespace, a drift check running: 30 seconds (PKO's requeue; the object's own watch event usually comes
/// first).
pub(super) const LOOK_AGAIN: Duration = Duration::from_secs(30);

/// `Halt::Done` with a requeue after [`LOOK_AGAIN`].
pub(super) fn look_again() -> Halt {
    Halt::Done(Action::requeue(LOOK_AGAIN))
}

/// `Halt::Done` until the Stack or what it watches changes.
pub(super) fn await_change() -> Halt {
    Halt::Done(Action::await_change())
}

/// What a pass that is not in sync goes on to do.
pub(super) enum Work {
    /// Create an Update (`up`, `preview` or `destroy`) for this reason.
    Update(String),
    /// Create the drift check for this tick.
    DriftCheck { tick: k8s_openapi::jiff::Timestamp, auto_remediate: bool },
}

/// What must happen after the status write.
pub(super) enum Effect {
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

/// What a pass knows of the stored Stack and of its own writes.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum WriteState {
    /// The cached Stack is not shown to be the stored one: the status write is pinned to this `resourceVersion`, and
    /// the effects wait for one read that shows it ([`Pass::ensure_current`]).
    Unverified(String),
    /// The cached Stack is the stored one (this replica's last write); nothing written yet.
    Current,
    /// This pass wrote the Stack: its `resourceVersion` then, and the status written.
    Written { version: Option<String>, status: Box<StackStatus> },
    /// This pass removed the Stack's finalizer: it is going away.
    Gone,
}

/// The requests of the Stack's annotations this pass judged.
#[derive(Debug, Default)]
pub(super) struct Requests {
    /// A `pulumi.com/cancel-request` value not seen before ([`messages::new_request`]).
    pub cancel: Option<String>,
    /// A `pulumi.com/unlock-request` value not judged before ([`messages::new_request`]).
    pub unlock: Option<String>,
    /// The lock holders an accepted unlock request releases with the next Update.
    pub release: Option<Vec<pko_proto::locks::Holder>>,
}

/// The state of one pass.
pub(super) struct Pass {
    /// The Stack as the pass read it.
    pub stack: Arc<Stack>,
    /// The status being drafted, its conditions included.
    pub draft: StackStatus,
    /// What the pass knows of the stored Stack.
    pub write: WriteState,
    /// The requests judged.
    pub requests: Requests,
    /// What follows the status write, in order.
    pub effects: Vec<Effect>,
    /// The pass's one clock reading.
    pub now: Time,
    /// What plan approval lets the pass do ([`crate::stack::approval`]); judged by the sync step.
    pub gate: crate::stack::approval::Gate,
}

impl Pass {
    /// A pass over `stack`, as `write` judged the cached copy.
    pub fn new(stack: Arc<Stack>, write: WriteState) -> Self {
        let mut draft = stack.status.clone().unwrap_or_default();
        draft.observed_generation = stack.meta().generation;
        draft.observed_reconcile_request = stack.annotations().get(RECONCILE_REQUEST_ANNOTATION).cloned();
        let asked = |a: &str| stack.annotations().get(a).cloned();
        let cancel_asked = asked(pko_api::constants::CANCEL_REQUEST_ANNOTATION);
        let unlock_asked = asked(pko_api::constants::UNLOCK_REQUEST_ANNOTATION);
        let requests = Requests {
            cancel: messages::new_request(cancel_asked.as_deref(), draft.observed_cancel_request.as_deref())
                .map(str::to_string),
            unlock: messages::new_request(unlock_asked.as_deref(), draft.observed_unlock_request.as_deref())
                .map(str::to_string),
            release: None,
        };
        draft.observed_cancel_request = cancel_asked;
        draft.conditions.get_or_insert_default();
        let (effects, now, gate) = (Vec::new(), pko_api::conditions::now(), crate::stack::approval::Gate::Off);
        Pass { stack, draft, write, requests, effects, now, gate }
    }

    pub fn ns(&self) -> String {
        self.stack.namespace().unwrap_or_default()
    }

    pub fn name(&self) -> String {
        self.stack.name_any()
    }

    pub fn generation(&self) -> Option<i64> {
        self.stack.meta().generation
    }

    pub fn deleting(&self) -> bool {
        self.stack.meta().deletion_timestamp.is_some()
    }

    /// The draft's conditions.
    pub fn conditions(&mut self) -> &mut Vec<Condition> {
        self.draft.conditions.get_or_insert_default()
    }

    pub fn reconciling(&mut self, reason: &str, message: &str) {
        let (generation, now) = (self.generation(), self.now.clone());
        conditions::mark_reconciling(self.conditions(), reason, message, generation, &now);
    }

    pub fn stalled(&mut self, reason: &str, message: &str) {
        let (generation, now) = (self.generation(), self.now.clone());
        conditions::mark_stalled(self.conditions(), reason, message, generation, &now);
    }

    pub fn set_drift(&mut self, status: &str, reason: &str, message: &str) {
        let (generation, now) = (self.generation(), self.now.clone());
        conditions::set(self.conditions(), sc::DRIFT_DETECTED, status, reason, message, generation, &now);
    }

    pub fn event(&mut self, severity: Severity, reason: &'static str, note: String) {
        self.effects.push(Effect::Event(severity, reason, note));
    }

    /// `currentUpdate` naming Update `name` of source `revision`, for this pass's generation and reconcile request.
    pub fn current_update_named(&self, name: String, revision: String) -> CurrentStackUpdate {
        CurrentStackUpdate {
            generation: self.generation(),
            reconcile_request: self.draft.observed_reconcile_request.clone(),
            name: Some(name),
            commit: Some(revision),
        }
    }

    /// The key of this Stack's drift-check slot.
    pub fn slot_key(&self) -> String {
        format!("{}/{}", self.ns(), self.name())
    }

    /// Fails with [`Error::Fenced`] once the Stack's shard is not held here any more: asked right before every write of
    /// the pass.
    pub fn fence(&self, c: &StackController) -> Result<(), Error> {
        if c.ctx.ownership.owns(&self.ns(), &self.name()) { Ok(()) } else { Err(Error::Fenced) }
    }

    fn api(&self, c: &StackController) -> Api<Stack> {
        Api::namespaced(c.ctx.client.clone(), &self.ns())
    }

    /// Writes the draft status, unless it is what is stored (or was last written). An unverified pass's write is pinned
    /// to the cached `resourceVersion`: 409 (or 404) → [`Error::Stale`].
    pub async fn write_status(&mut self, c: &StackController) -> Result<(), Error> {
        let stored = match &self.write {
            WriteState::Written { status, .. } => Some(&**status),
            _ => self.stack.status.as_ref(),
        };
        if stored == Some(&self.draft) {
            return Ok(());
        }
        self.fence(c)?;
        let pinned = match &self.write {
            WriteState::Unverified(rv) => Some(rv.clone()),
            _ => None,
        };
        let version = match io::write_status(&self.api(c), &self.name(), &self.draft, pinned.as_deref()).await {
            Ok(v) => v,
            Err(e) if pinned.is_some() && (k8s::is_conflict(&e) || k8s::is_not_found(&e)) => return Err(Error::Stale),
            Err(e) => return Err(Error::Status(e)),
        };
        self.write = WriteState::Written { version, status: Box::new(self.draft.clone()) };
        Ok(())
    }

    /// Before a write that is not the pinned status write (an Update created, the effects): an unverified pass reads
    /// the Stack once and goes on only when the cache showed the stored version; otherwise [`Error::Stale`].
    pub async fn ensure_current(&mut self, c: &StackController) -> Result<(), Error> {
        let WriteState::Unverified(cached) = &self.write else { return Ok(()) };
        let stored = self.api(c).get_opt(&self.name()).await.map_err(Error::Dereference)?;
        if stored.as_ref().and_then(|s| s.metadata.resource_version.as_deref()) != Some(cached.as_str()) {
            return Err(Error::Stale);
        }
        self.write = WriteState::Current;
        Ok(())
    }

    /// Carries out the effects, in order, after the status write.
    pub async fn apply_effects(&mut self, c: &StackController) -> Result<Option<Action>, Error> {
        let mut action = None;
        let updates: Api<Update> = Api::namespaced(c.ctx.client.clone(), &self.ns());
        for effect in std::mem::take(&mut self.effects) {
            self.fence(c)?;
            match effect {
                Effect::Event(severity, reason, note) => {
                    k8s::publish(&c.ctx.events.stack, &*self.stack, severity, reason, note).await
                }
                Effect::ReleaseUpdate(u) => {
                    finalizer::release_update(&updates, &u).await.map_err(Error::CurrentUpdate)?
                }
                Effect::RemoveFinalizer => {
                    finalizer::set_finalizers(&self.api(c), &self.stack, false).await.map_err(Error::Finalizer)?;
                    // going away: nothing more of it to read
                    self.write = WriteState::Gone;
                    action = Some(Action::await_change());
                }
                Effect::ReclaimWorkspace => {
                    io::reclaim_workspace(&c.ctx, &self.stack).await.map_err(Error::Workspace)?
                }
                Effect::ReleaseDriftSlot => {
                    if let Err(e) = c.ctx.drift_slots.release(&self.slot_key()).await {
                        // the slot's lease runs out by itself
                        tracing::warn!(error = %e, "releasing the drift-check slot");
                    }
                }
                Effect::ForwardCancel(name, request) => {
                    let patch =
                        json!({"metadata": {"annotations": {pko_api::constants::CANCEL_REQUEST_ANNOTATION: request}}});
                    let merge = Patch::Merge(patch);
                    updates.patch(&name, &PatchParams::default(), &merge).await.map_err(Error::CurrentUpdate)?;
                }
                Effect::DeleteUpdate(name) => delete_update(&updates, &name).await,
            }
        }
        Ok(action)
    }
}

/// Deletes an earlier drift check's Update; its TTL deletes it later anyway, so a failure only delays that (logged).
async fn delete_update(updates: &Api<Update>, name: &str) {
    match updates.delete(name, &Default::default()).await {
        Ok(_) => {}
        Err(e) if k8s::is_not_found(&e) => {}
        Err(e) => tracing::warn!(update = %name, error = %e, "deleting an earlier drift check's Update"),
    }
}
