//! Steps 7–8 of a pass: the Workspace applied and waited for, then the Update followed or created.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use pko_api::constants::{event_reason as ev, field_manager, stack_condition as sc};
use pko_api::{Update, UpdateType, Workspace};

use super::pass::{Halt, LOOK_AGAIN, Pass, Step, await_change, look_again};
use super::{Error, StackController};
use crate::k8s::Severity;
use crate::stack::approval::Gate;
use crate::stack::source::ResolvedSource;
use crate::stack::{build, drift, io, messages};

/// How soon a pass waiting for its Workspace to be ready looks again by itself: 5 seconds (the Workspace's own watch
/// event usually comes first).
const WORKSPACE_RECHECK: Duration = Duration::from_secs(5);

/// Step 7: the Workspace, applied (skipped when this replica applied the same at this shard epoch and the cache shows
/// it, [`crate::stack::applied`]); the pass waits until it is ready for an Update.
pub(super) async fn workspace(c: &StackController, p: &mut Pass, source: &ResolvedSource) -> Step<Workspace> {
    let (ns, name) = (p.ns(), p.name());
    let desired = p.built(build::workspace(&p.stack, source))?;
    let cached = c.workspaces.get(&ObjectRef::new(&name).within(&ns));
    let epoch = c.epoch(&ns, &name);
    let applied = match c.applied_workspaces.unchanged(&ns, &name, &desired, cached.as_deref(), epoch) {
        Some(ws) => Ok(ws),
        None => Api::<Workspace>::namespaced(c.ctx.client.clone(), &ns)
            .patch(&name, &PatchParams::apply(field_manager::OPERATOR).force(), &Patch::Apply(&desired))
            .await
            .inspect(|ws| c.applied_workspaces.record(&ns, &name, &desired, ws, epoch)),
    };
    let ws = match applied {
        Ok(ws) => ws,
        Err(e) => {
            let (stall, msg) = messages::refusal(messages::REFUSED_WORKSPACE, &e);
            if stall {
                p.stalled(sc::SPEC_INVALID, &msg);
                return Err(await_change());
            }
            p.reconciling(sc::STACK_PROCESSING, &msg);
            return Err(Halt::Retry(Error::Workspace(e)));
        }
    };
    // a Workspace stalled at its current generation (a spec it cannot run, or a stack it could not
    // initialize): no Update against it (PKO), Stalled until the Workspace mends or changes — woken by
    // the Workspace's watch
    if let Some((reason, message)) = messages::workspace_stall(&ws) {
        p.stalled(reason, &message);
        return Err(await_change());
    }
    if !ready_for_update(&ws) {
        p.reconciling(sc::STACK_PROCESSING, &messages::workspace_wait_message(&ws));
        return Err(Halt::Done(Action::requeue(WORKSPACE_RECHECK)));
    }
    Ok(ws)
}

/// Whether an Update may be made against `ws` as the apply returned it: runnable, and — for a Workspace with an agent
/// of its own (no `status.pool`: its own pod or process, PKO's model) — observed at its current generation (PKO's
/// `isWorkspaceReady`). A pooled Workspace's operation is built from the Workspace at the generation its Update names,
/// whichever agent runs it, so it does not wait. Pure.
pub fn ready_for_update(ws: &Workspace) -> bool {
    let status = ws.status.as_ref();
    let own_agent = status.is_none_or(|s| s.pool.is_none());
    ws.runnable() && (!own_agent || status.and_then(|s| s.observed_generation) == ws.metadata.generation)
}

/// Step 8: follow an Update already in flight (a write this pass could not see, or another replica's before a shard
/// moved), or write `currentUpdate` and create the Update.
pub(super) async fn update(
    c: &StackController,
    p: &mut Pass,
    ws: &Workspace,
    source: &ResolvedSource,
    reason: String,
) -> Step<Action> {
    let revision = source.revision();
    if let Some(running) = io::in_flight_update(&c.updates, &p.ns(), &p.name()) {
        tracing::info!(update = %running, "an update is already in flight; following it");
        p.draft.current_update = Some(p.current_update_named(running, revision));
        p.reconciling(sc::STACK_PROCESSING, sc::STACK_BEING_PROCESSED_MESSAGE);
        return Err(look_again());
    }
    let last = p.draft.last_update.as_ref();
    let request = p.draft.observed_reconcile_request.as_deref();
    let name = build::update_name(&p.name(), p.generation(), request, &revision, p.deleting(), last);
    let update = update_object(p, ws, &name, &revision, &reason)?;
    p.draft.current_update = Some(p.current_update_named(name.clone(), revision));
    p.reconciling(sc::STACK_PROCESSING, sc::STACK_BEING_PROCESSED_MESSAGE);
    // the intent first: a crash between the two writes leaves a name the next pass heals, never an
    // Update the Stack does not know
    p.write_status(c).await?;
    p.ensure_current(c).await?;
    p.fence(c)?;
    let updates: Api<Update> = Api::namespaced(c.ctx.client.clone(), &p.ns());
    match updates.create(&PostParams::default(), &update).await {
        Ok(_) => {
            tracing::info!(update = %name, %reason, "stack update started");
            p.event(Severity::Normal, ev::STACK_UPDATE_DETECTED, reason);
            Ok(Action::requeue(LOOK_AGAIN))
        }
        // created by an earlier pass that ended before this point: follow it
        Err(e) if crate::k8s::is_conflict(&e) => Ok(Action::requeue(LOOK_AGAIN)),
        Err(e) => refused(p, e),
    }
}

/// The Update `name` of the pass's Stack on `ws`: released lock holders annotated, a drift remediation's refresh, and
/// what it runs pinned ([`build::pin_run`]).
fn update_object(p: &mut Pass, ws: &Workspace, name: &str, revision: &str, reason: &str) -> Step<Update> {
    let built = build::update(&p.stack, ws, name, p.deleting(), reason);
    let mut update = p.built(built)?;
    if let Some(holders) = &p.requests.release {
        let described = pko_proto::locks::describe(holders);
        update.annotations_mut().insert(pko_api::constants::RELEASE_LOCKS_ANNOTATION.into(), described);
    }
    // drift found by an autoRemediate schedule: the up (and its retries) refresh first
    if !p.deleting() && update.spec.update_type == Some(UpdateType::Up) && drift::remediating(&p.draft) {
        update.spec.refresh = Some(true);
    }
    gate(&mut update, &p.gate);
    build::pin_run(&mut update, &p.stack, ws, revision);
    Ok(update)
}

/// Plan approval on the Update of a sync ([`crate::stack::approval`]): gated, an `up` becomes a preview that saves a
/// plan; approved, the `up` is constrained to the plan. Pure.
fn gate(update: &mut Update, gate: &Gate) {
    match gate {
        Gate::Open if update.spec.update_type == Some(UpdateType::Up) => {
            update.spec.update_type = Some(UpdateType::Preview);
            update.spec.save_plan = Some(true);
        }
        Gate::Apply(id) if update.spec.update_type == Some(UpdateType::Up) => update.spec.plan = Some(id.clone()),
        _ => {}
    }
}

/// The API server refused the Update: a spec it will never take stalls the Stack (`currentUpdate` undone) until the
/// spec changes; anything else is retried by the error policy, `currentUpdate` kept as written (the next pass heals the
/// dangling name and writes the same one: no watch event).
fn refused(p: &mut Pass, e: kube::Error) -> Step<Action> {
    let (stall, msg) = messages::refusal(messages::REFUSED_UPDATE, &e);
    if stall {
        p.draft.current_update = None;
        p.stalled(sc::SPEC_INVALID, &msg);
        return Err(await_change());
    }
    p.event(Severity::Warning, ev::STACK_UPDATE_FAILURE, msg);
    Err(Halt::Retry(Error::Update(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_own_agent_workspace_is_waited_for_at_its_generation_a_pooled_one_is_not() {
        let ws = |generation: i64, observed: i64, pool: Option<&str>| {
            let mut w: Workspace = serde_json::from_value(
                serde_json::json!({"metadata": {"name": "w", "generation": generation}, "spec": {}}),
            )
            .unwrap();
            let mut conditions = Vec::new();
            let now = pko_api::conditions::now();
            pko_api::conditions::set(&mut conditions, "Ready", "True", "Succeeded", "", Some(observed), &now);
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
    fn a_gated_change_previews_and_saves_an_approved_one_runs_its_plan() {
        let of = |kind: UpdateType, g: &Gate| {
            let mut u = Update::new("u", Default::default());
            u.spec.update_type = Some(kind);
            u.spec.refresh = Some(true);
            gate(&mut u, g);
            (u.spec.update_type, u.spec.save_plan, u.spec.plan, u.spec.refresh)
        };
        let (p, up) = (Some(UpdateType::Preview), Some(UpdateType::Up));
        assert_eq!(of(UpdateType::Up, &Gate::Open), (p, Some(true), None, Some(true)), "a remediation refreshes too");
        assert_eq!(of(UpdateType::Up, &Gate::Apply("a".into())), (up.clone(), None, Some("a".into()), Some(true)));
        assert_eq!(of(UpdateType::Up, &Gate::Off), (up, None, None, Some(true)));
        let destroy = of(UpdateType::Destroy, &Gate::Open);
        assert_eq!((destroy.0, destroy.1), (Some(UpdateType::Destroy), None), "a destroy is not gated");
    }

    #[test]
    fn a_running_operation_and_a_complete_update_are_taken_from_the_cache() {
        use super::super::steps::cache_will_do;
        use pko_api::constants::update_condition as uc;
        let update = |update_type: UpdateType, preview_only: bool, complete: bool| {
            let mut u = Update::new("u", Default::default());
            u.spec.update_type = Some(update_type);
            u.spec.preview_only = Some(preview_only);
            let mut conds = Vec::new();
            let at = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default());
            let status = if complete { "True" } else { "False" };
            pko_api::conditions::set(&mut conds, uc::COMPLETE, status, uc::UPDATED, "", None, &at);
            u.status = Some(pko_api::update::UpdateStatus { conditions: Some(conds), ..Default::default() });
            u
        };
        assert!(cache_will_do(&update(UpdateType::Up, false, false)), "an up in progress: waited on");
        assert!(cache_will_do(&update(UpdateType::Up, false, true)), "complete: its status is final");
        assert!(cache_will_do(&update(UpdateType::Refresh, true, true)), "a complete drift check too");
        assert!(!cache_will_do(&update(UpdateType::Refresh, true, false)), "a running drift check is read fresh");
        assert!(cache_will_do(&Update::new("u", Default::default())), "no status yet: not started, not complete");
    }
}
