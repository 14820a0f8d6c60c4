//! Steps 2–6 of a pass: the current Update, deletion, an unlock request, the source, the sync decision and the
//! prerequisites.

use std::ops::ControlFlow;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use pko_api::constants::{RECONCILE_REQUEST_ANNOTATION, event_reason as ev, field_manager, stack_condition as sc};
use pko_api::stack::StackUpdateStateMessage;
use pko_api::{Stack, Update, UpdateType, Workspace};
use serde_json::json;

use super::pass::{Effect, Halt, Pass, Step, Work, await_change, look_again};
use super::{Error, StackController, drift_steps};
use crate::k8s::{self, Severity};
use crate::stack::approval::{self, Gate};
use crate::stack::plan::{self, RetryPolicy, Sync};
use crate::stack::rollout_hold;
use crate::stack::source::{self, Resolved, ResolvedSource};
use crate::stack::{absorb, conditions, drift, io, messages, prerequisites as prereq, unlock as unlocking};

/// How long a Stack waits for its prerequisites before it looks again by itself: 5 minutes (their changes wake it
/// through the controller's watch; this covers a missed event).
const PREREQUISITES_RECHECK: Duration = Duration::from_secs(300);

/// Whether a pass may take the cached Update as it is, without reading it fresh. Pure. Yes when the cache shows it
/// complete: a complete Update's status is final and the one write absorbing it makes to it, the finalizer release, is
/// fenced by the cached `resourceVersion`. Yes when it shows an operation (not a drift check) still running: the pass
/// only waits, and the completion wakes the Stack once the cache has it. A running drift check is read fresh.
pub(super) fn cache_will_do(u: &Update) -> bool {
    u.is_complete() || !drift::is_check(u)
}

/// Step 2: the current Update — wait while it runs, absorb it once complete, forget it when gone.
pub(super) async fn current_update(c: &StackController, p: &mut Pass) -> Step {
    let Some(cur) = p.draft.current_update.clone() else { return Ok(()) };
    let updates: Api<Update> = Api::namespaced(c.ctx.client.clone(), &p.ns());
    let name = cur.name.as_deref().unwrap_or_default();
    let cached = k8s::cached_or_get(&c.updates, &updates, name, cache_will_do).await;
    let Some(u) = cached.map_err(Error::CurrentUpdate)? else {
        p.draft.current_update = None;
        return Ok(());
    };
    if drift::is_check(&u) {
        return drift_steps::drift_checked(c, p, u).await;
    }
    if !u.is_complete() {
        // a new cancel request goes to the Update it cancels (its controller stops the operation)
        if let Some(v) = p.requests.cancel.clone()
            && u.annotations().get(pko_api::constants::CANCEL_REQUEST_ANNOTATION) != Some(&v)
        {
            // seen only once the Update carries it: a patch that fails is sent again by the next pass
            p.draft.observed_cancel_request = p.stack.status.as_ref().and_then(|s| s.observed_cancel_request.clone());
            p.effects.push(Effect::ForwardCancel(u.name_any(), v));
        }
        // PKO's text; why a queued Update waits is on the Update and in `kubectl pko status`
        p.reconciling(sc::STACK_PROCESSING, sc::STACK_BEING_PROCESSED_MESSAGE);
        return Err(look_again());
    }
    absorb_finished(c, p, &cur, u).await
}

/// Step 2, once the current Update is complete: its result into `lastUpdate`, its outputs into `status.outputs` (handed
/// over by this replica's dispatcher, else read from the outputs Secret), the events, and its finalizer released after
/// the status write.
async fn absorb_finished(
    c: &StackController,
    p: &mut Pass,
    cur: &pko_api::stack::CurrentStackUpdate,
    u: Update,
) -> Step {
    let policy = RetryPolicy::of(&p.stack.spec);
    let a = absorb::absorb(p.draft.last_update.as_ref(), cur, &u, &p.now, policy.max_failures);
    if let Some(why) = &a.mismatch {
        tracing::error!(update = %u.name_any(), %why, "a finished Update is not taken as a success");
        metrics::counter!(crate::metric_names::RUN_MISMATCHES_TOTAL, "check" => "absorb").increment(1);
    }
    if let Some(pi) = a.project_info.clone() {
        p.draft.project_info = Some(pi);
    }
    if let Some(secret) = a.outputs_secret.as_deref() {
        if let Some(outputs) = c.ctx.outputs.take(u.metadata.uid.as_deref().unwrap_or_default()).await {
            metrics::counter!(crate::metric_names::OUTPUTS_READS_TOTAL, "source" => "handed_over").increment(1);
            p.draft.outputs = Some((*outputs).clone());
        } else {
            metrics::counter!(crate::metric_names::OUTPUTS_READS_TOTAL, "source" => "api").increment(1);
            tracing::debug!(update = %u.name_any(), "outputs not handed over: reading the outputs Secret");
            let secrets = Api::<Secret>::namespaced(c.ctx.client.clone(), &p.ns());
            if let Some(s) = secrets.get_opt(secret).await.map_err(Error::CurrentUpdate)? {
                p.draft.outputs = Some(crate::outputs::stack_outputs(&s));
            }
        }
    }
    p.draft.last_update = Some(a.last_update.clone());
    p.draft.current_update = None;
    let (plan, note) = approval::absorbed(p.draft.plan.as_ref(), &u, cur, (a.succeeded, &a.message), &p.now);
    p.draft.plan = plan;
    if let Some((severity, reason, note)) = note {
        p.event(severity, reason, note);
    }
    if a.succeeded {
        p.event(Severity::Normal, ev::STACK_CREATED, "Successfully updated stack".into());
    } else {
        p.event(Severity::Warning, ev::STACK_UPDATE_FAILURE, format!("Failed to update stack: {}", a.message));
        if a.conflict {
            let msg = messages::conflict_message(p.draft.last_update.as_ref(), &policy);
            p.event(Severity::Warning, ev::STACK_UPDATE_CONFLICT_DETECTED, msg);
        }
    }
    p.effects.push(Effect::ReleaseUpdate(Box::new(u)));
    Ok(())
}

/// Step 3: a Stack being deleted without a destroy due lets go; a terminating namespace stalls it.
pub(super) async fn deletion(c: &StackController, p: &mut Pass) -> Step {
    if !p.deleting() {
        return Ok(());
    }
    let spec = &p.stack.spec;
    // not asked for, or nothing ever ran (PKO: no prior update)
    let never_ran = p.draft.last_update.is_none() && p.draft.current_update.is_none();
    if spec.destroy_on_finalize != Some(true) || spec.preview == Some(true) || never_ran {
        p.effects.push(Effect::RemoveFinalizer);
        return Err(await_change());
    }
    // a destroy cannot run in a terminating namespace (no Workspace or Update can be created there)
    if io::namespace_terminating(&c.ctx, &p.ns()).await.map_err(Error::Deletion)? {
        let msg = messages::namespace_terminating_message(&p.ns(), &p.name());
        p.stalled(sc::NAMESPACE_TERMINATING, &msg);
        return Err(look_again());
    }
    Ok(())
}

/// Step 3b: a new unlock request, judged once no Update of the Stack runs ([`unlocking`]): accepted, the next Update
/// releases the holders; refused, an event names the holder kept.
pub(super) async fn unlock(c: &StackController, p: &mut Pass) -> Step {
    let Some(request) = p.requests.unlock.clone() else { return Ok(()) };
    let message = p.draft.last_update.as_ref().and_then(|l| l.message.clone());
    let holders = pko_proto::locks::holders(message.as_deref().unwrap_or_default());
    tracing::debug!(request = %request, holders = holders.len(), "judging an unlock request");
    let facts = io::unlock_facts(&c.ctx, &p.ns(), &p.name(), &holders).await.map_err(Error::Unlock)?;
    match unlocking::decide(message.as_deref(), &facts, unlocking::process_alive) {
        unlocking::Decision::Release(holders, note) => {
            tracing::warn!(request = %request, holders = %note, "unlock request accepted");
            p.event(Severity::Normal, ev::STACK_UNLOCK_ACCEPTED, note);
            p.requests.release = Some(holders);
        }
        unlocking::Decision::Refuse(note) => {
            tracing::info!(request = %request, reason = %note, "unlock request refused");
            p.event(Severity::Warning, ev::STACK_UNLOCK_REFUSED, note);
        }
    }
    p.draft.observed_unlock_request = Some(request);
    Ok(())
}

/// Step 4: the source at a revision, and a valid spec.
pub(super) async fn source(c: &StackController, p: &mut Pass) -> Step<ResolvedSource> {
    let resolved = source::resolve(&c.ctx, &c.programs, &p.stack, p.deleting()).await.map_err(Error::Source)?;
    let source = match resolved {
        Resolved::Source(s) => s,
        Resolved::Stalled(reason, msg) => {
            // PKO's Warning `StackConfigInvalid` for a source or credentials it cannot use; once per
            // transition (the pass is repeated every 30 s: a Secret created later is then found)
            if reason == sc::SPEC_INVALID && !conditions::is_stalled_with(p.conditions(), reason, &msg) {
                p.event(Severity::Warning, ev::STACK_CONFIG_INVALID, msg.clone());
            }
            p.stalled(reason, &msg);
            return Err(look_again());
        }
    };
    if let Err(e) = pko_api::validation::validate_stack_spec(&p.stack.spec, &p.ns()) {
        p.event(Severity::Warning, ev::STACK_CONFIG_INVALID, e.to_string());
        p.stalled(sc::SPEC_INVALID, &e.to_string());
        return Err(await_change());
    }
    // a template the API server refused stays refused for this generation (a spec change tries again)
    let generation = p.generation();
    if messages::refused_this_generation(p.conditions(), generation) {
        return Err(await_change());
    }
    Ok(source)
}

/// Before step 5: after a failed update, whether the Stack's Workspace is Stalled (its reason and message): then the
/// failure is not retried (PKO's `WorkspaceFailed`). One read, only on that path.
pub(super) async fn workspace_stall(c: &StackController, p: &Pass) -> Step<Option<(String, String)>> {
    if p.draft.last_update.as_ref().and_then(|l| l.state) != Some(StackUpdateStateMessage::Failed) {
        return Ok(None);
    }
    let api = Api::<Workspace>::namespaced(c.ctx.client.clone(), &p.ns());
    let ws = api.get_opt(&p.name()).await.map_err(Error::Workspace)?;
    Ok(ws.as_ref().and_then(Workspace::stalled).map(|c| (c.reason.clone(), c.message.clone())))
}

/// Step 5: in sync (conditions, maybe the finalizer or the Workspace go, maybe a drift check is due: halts) or the work
/// to do.
pub(super) fn sync(
    c: &StackController,
    p: &mut Pass,
    source: &ResolvedSource,
    workspace_stall: Option<(&str, &str)>,
) -> Step<Work> {
    approval_gate(p, source)?;
    if let Gate::Apply(id) = &p.gate {
        return Ok(Work::Update(format!("Plan {id} approved")));
    }
    // an accepted unlock runs the operation again now (past a backoff, a retry budget spent)
    if p.requests.release.is_some() {
        return Ok(Work::Update(messages::UNLOCK_REASON.into()));
    }
    let checked = Stack { status: Some(p.draft.clone()), ..(*p.stack).clone() };
    let branch = p.stack.spec.branch.is_some();
    let decided =
        plan::decide_with_workspace(&checked, &source.revision(), p.now.0, branch, p.deleting(), workspace_stall);
    let hold = rollout_hold::judge(&p.stack, &p.draft, &source.revision(), &c.rollouts.state(), p.deleting());
    p.draft.rollout = hold.rollout;
    let (verdict, mut requeue_after) = match decided {
        Sync::NeedsUpdate { reason } => {
            if let Some(message) = hold.held {
                p.reconciling(sc::ROLLOUT_HELD, &message);
                return Err(look_again());
            }
            return Ok(Work::Update(reason));
        }
        Sync::Synced { conditions: verdict, requeue_after } => (verdict, requeue_after),
    };
    let ready = verdict == plan::Conditions::Ready;
    // gated: a succeeded preview is not a sync (its plan was superseded, or lost)
    let previewed = p.draft.last_update.as_ref().is_some_and(|l| l.update_type == Some(UpdateType::Preview));
    if ready && p.gate == Gate::Open && previewed {
        return Ok(Work::Update("Plan not applied yet".into()));
    }
    match verdict {
        plan::Conditions::Ready => {
            let (generation, now) = (p.generation(), p.now.clone());
            conditions::mark_ready(p.conditions(), generation, &now)
        }
        plan::Conditions::Reconciling(r, m) => p.reconciling(r, &m),
        plan::Conditions::Stalled(r, m) => p.stalled(r, &m),
    }
    if ready && !p.deleting() {
        match drift_steps::drift_due(c, p) {
            ControlFlow::Break(work) => return Ok(work),
            ControlFlow::Continue(Some(next)) => requeue_after = Some(requeue_after.map_or(next, |r| r.min(next))),
            ControlFlow::Continue(None) => {}
        }
    }
    let destroyed = p.draft.last_update.as_ref().is_some_and(|l| {
        l.update_type == Some(UpdateType::Destroy) && l.state == Some(StackUpdateStateMessage::Succeeded)
    });
    if p.deleting() && destroyed {
        p.effects.push(Effect::RemoveFinalizer);
    } else if !p.deleting() && io::ready_and_reclaimable(&p.stack, &p.draft) {
        p.effects.push(Effect::ReclaimWorkspace);
    }
    Err(Halt::Done(requeue_after.map(Action::requeue).unwrap_or_else(Action::await_change)))
}

/// Step 5, first: plan approval ([`approval`]): the Stack's plan and observed approval judged, their events; a
/// pending plan not approved halts the pass `AwaitingApproval` (looked at again at the branch's poll period: a new
/// commit supersedes it).
fn approval_gate(p: &mut Pass, source: &ResolvedSource) -> Step {
    let judged = approval::judge(&p.stack, &p.draft, &source.revision(), p.deleting());
    p.draft.plan = judged.plan;
    p.draft.observed_approval = judged.observed_approval;
    for (severity, reason, note) in judged.notes {
        p.event(severity, reason, note);
    }
    p.gate = judged.gate;
    let Gate::Await(message) = p.gate.clone() else { return Ok(()) };
    p.reconciling(sc::AWAITING_APPROVAL, &message);
    let poll = p.stack.spec.branch.is_some().then(|| plan::resync_period(&p.stack));
    Err(Halt::Done(poll.map(Action::requeue).unwrap_or_else(Action::await_change)))
}

/// Step 6: prerequisites (not while deleting: a missing prerequisite never blocks a destroy, PKO #751).
pub(super) async fn prerequisites(c: &StackController, p: &mut Pass) -> Step {
    let Some(prereqs) = p.stack.spec.prerequisites.clone().filter(|pre| !pre.is_empty() && !p.deleting()) else {
        return Ok(());
    };
    let api: Api<Stack> = Api::namespaced(c.ctx.client.clone(), &p.ns());
    let mut found = std::collections::BTreeMap::new();
    for pre in &prereqs {
        if let Some(s) = api.get_opt(&pre.name).await.map_err(Error::Prerequisites)? {
            found.insert(pre.name.clone(), s);
        }
    }
    let prereq::Verdict::NotSatisfied { message, resync } = prereq::check(&prereqs, &found, p.now.0) else {
        return Ok(());
    };
    let params = PatchParams::apply(field_manager::PREREQUISITE_REQUEST).force();
    for (name, value) in resync {
        let patch = json!({"apiVersion": "pulumi.com/v1", "kind": "Stack",
                           "metadata": {"name": name, "annotations": {RECONCILE_REQUEST_ANNOTATION: value}}});
        api.patch(&name, &params, &Patch::Apply(&patch)).await.map_err(Error::Prerequisites)?;
    }
    p.reconciling(sc::PREREQUISITE_NOT_SATISFIED, &message);
    Err(Halt::Done(Action::requeue(PREREQUISITES_RECHECK)))
}
