//! The drift steps of a pass ([`crate::stack::drift`] decides, these do the I/O): when a check is due or a remediation
//! runs, taking a fleet-wide check slot and creating the check's Update, and a finished check's result into
//! `DriftDetected` and `status.driftDetection`.

use std::ops::ControlFlow;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use pko_api::constants::{event_reason as ev, stack_condition as sc};
use pko_api::{Update, Workspace};

use super::pass::{Effect, Halt, Pass, Step, Work, look_again};
use super::{Error, StackController};
use crate::k8s::Severity;
use crate::stack::source::ResolvedSource;
use crate::stack::{build, conditions, drift, io, messages};

/// How soon a due drift check that found no free fleet-wide slot looks again: 5 seconds (within
/// [`pko_queue::slots::WAITER_TTL`], so it keeps its place in line).
pub const DRIFT_SLOT_RETRY: Duration = Duration::from_secs(5);

/// How long a drift check holds its fleet-wide slot without renewal; every pass while it runs (each 30 s) renews it, so
/// only a check whose replica died holds a slot that long.
pub const DRIFT_SLOT_LEASE: Duration = Duration::from_secs(600);

/// Step 2, for a drift check: while it runs the Stack stays as it is (Ready) and the check's slot is renewed; once it
/// ended, its result sets `DriftDetected` and `status.driftDetection` (never `lastUpdate`: a check is not an update of
/// the stack).
pub(super) async fn drift_checked(c: &StackController, p: &mut Pass, u: Update) -> Step {
    if !u.is_complete() {
        if let Err(e) = c.ctx.drift_slots.acquire(&p.slot_key(), DRIFT_SLOT_LEASE).await {
            tracing::warn!(error = %e, "renewing the drift-check slot");
        }
        return Err(look_again());
    }
    let o = drift::outcome(&u);
    let auto_remediate =
        u.annotations().get(pko_api::constants::DRIFT_AUTO_REMEDIATE_ANNOTATION).is_some_and(|v| v == "true");
    // one check's Update is kept (the last), not one per check until its TTL
    let detection = p.draft.drift_detection.as_ref();
    let previous = detection.and_then(|d| d.last_check_update.clone()).filter(|n| Some(n) != u.metadata.name.as_ref());
    p.draft.drift_detection = Some(drift::checked(detection, &u, &o, p.now.0, auto_remediate));
    match drift::tightened(&p.stack, p.now.0, c.ctx.drift_min_interval) {
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
    p.draft.current_update = None;
    p.effects.push(Effect::ReleaseUpdate(Box::new(u)));
    p.effects.push(Effect::ReleaseDriftSlot);
    Ok(())
}

/// Step 5, for a synced, Ready Stack: drift to remediate (`Break` an Update), a check due (`Break` the check), or when
/// to look again (`Continue` with the time to the next tick). Keeps `DriftDetected` and
/// `status.driftDetection.nextCheck` current.
pub(super) fn drift_due(c: &StackController, p: &mut Pass) -> ControlFlow<Work, Option<Duration>> {
    match drift::remediation(&p.draft) {
        drift::Remediation::Run(reason) => {
            metrics::counter!(crate::metric_names::DRIFT_REMEDIATIONS_TOTAL).increment(1);
            return ControlFlow::Break(Work::Update(reason));
        }
        drift::Remediation::Done(message) => p.set_drift("False", sc::DRIFT_NO_CHANGES, &message),
        drift::Remediation::None => {}
    }
    match drift::due(&p.stack, &p.draft, p.now.0, c.ctx.drift_min_interval) {
        drift::Due::Off => {
            // drift detection was turned off: nothing of it is left to read
            conditions::remove(p.conditions(), sc::DRIFT_DETECTED);
            p.draft.drift_detection = None;
            ControlFlow::Continue(None)
        }
        drift::Due::Invalid(message) => {
            let known =
                pko_api::conditions::find(p.conditions(), sc::DRIFT_DETECTED).is_some_and(|c| c.message == message);
            if !known {
                p.event(Severity::Warning, ev::STACK_CONFIG_INVALID, message.clone());
            }
            p.set_drift("Unknown", sc::DRIFT_INVALID_SCHEDULE, &message);
            ControlFlow::Continue(None)
        }
        drift::Due::At(tick) => {
            p.draft.drift_detection.get_or_insert_default().next_check = Some(Time(tick));
            ControlFlow::Continue(Some(tick.duration_since(p.now.0).unsigned_abs().max(Duration::from_secs(1))))
        }
        drift::Due::Check { tick, auto_remediate } => {
            p.draft.drift_detection.get_or_insert_default().next_check = Some(Time(tick));
            ControlFlow::Break(Work::DriftCheck { tick, auto_remediate })
        }
    }
}

/// Step 8, for a due drift check: take a fleet-wide slot (none free: look again in [`DRIFT_SLOT_RETRY`]), write
/// `currentUpdate`, create the check's Update. The Stack stays Ready.
pub(super) async fn drift_check(
    c: &StackController,
    p: &mut Pass,
    ws: &Workspace,
    source: &ResolvedSource,
    tick: k8s_openapi::jiff::Timestamp,
    auto_remediate: bool,
) -> Step<Action> {
    let revision = source.revision();
    if let Some(running) = io::in_flight_update(&c.updates, &p.ns(), &p.name()) {
        p.draft.current_update = Some(p.current_update_named(running, revision));
        return Err(look_again());
    }
    take_slot(c, p).await?;
    let name = drift::check_name(&p.name(), tick);
    let built = build::drift_check(&p.stack, ws, &name, auto_remediate);
    let mut check = p.built(built)?;
    build::pin_run(&mut check, &p.stack, ws, &revision);
    p.draft.current_update = Some(p.current_update_named(name.clone(), revision));
    p.write_status(c).await?;
    p.ensure_current(c).await?;
    p.fence(c)?;
    let updates: Api<Update> = Api::namespaced(c.ctx.client.clone(), &p.ns());
    match updates.create(&PostParams::default(), &check).await {
        Ok(_) => tracing::info!(update = %name, auto_remediate, "drift check started"),
        Err(e) if crate::k8s::is_conflict(&e) => {}
        Err(e) => {
            p.draft.current_update = None;
            p.effects.push(Effect::ReleaseDriftSlot);
            let (_, msg) = messages::refusal(messages::REFUSED_UPDATE, &e);
            p.set_drift("Unknown", sc::DRIFT_CHECK_FAILED, &msg);
            return Err(Halt::Retry(Error::Update(e)));
        }
    }
    Ok(Action::requeue(super::pass::LOOK_AGAIN))
}

/// A fleet-wide drift-check slot for the Stack, or why the pass halts: none free (said once on `DriftDetected`, looked
/// at again in [`DRIFT_SLOT_RETRY`], keeping its place in the slots' line), or the slots could not be asked (again in
/// 30 s).
async fn take_slot(c: &StackController, p: &mut Pass) -> Step {
    match c.ctx.drift_slots.acquire(&p.slot_key(), DRIFT_SLOT_LEASE).await {
        Ok(true) => Ok(()),
        Ok(false) => {
            metrics::counter!(crate::metric_names::DRIFT_CHECKS_DEFERRED_TOTAL).increment(1);
            let current = pko_api::conditions::find(p.conditions(), sc::DRIFT_DETECTED)
                .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
            let current = current.as_ref().map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()));
            if let Some((status, reason, message)) = drift::deferred(current) {
                p.set_drift(&status, &reason, &message);
            }
            // a pass that changes nothing writes nothing; the line keeps a Stack that asks as fast as
            // this retry from taking the slot round after round
            Err(Halt::Done(Action::requeue(DRIFT_SLOT_RETRY)))
        }
        Err(e) => {
            tracing::warn!(error = %e, "taking a drift-check slot; trying again in 30 s");
            Err(look_again())
        }
    }
}
