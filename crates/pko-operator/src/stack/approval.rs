//! Plan approval (`spec.approval.mode: manual`; ours, by analogy with tofu-controller's `approvePlan`): which Update a
//! change makes, and what a finished one means for the Stack's plan (`status.plan`). Pure.
//!
//! A change (new generation, revision or sync request, or a drift remediation) first runs a `preview` that saves a
//! plan (`spec.savePlan`); its id lands in `status.plan` (`Pending`) and the Stack waits `Reconciling`
//! `AwaitingApproval`. The annotation `pulumi.com/approve-plan: <id>` naming that plan makes an `up` constrained to it
//! (`spec.plan`, `pulumi up --plan`): `Applied` when it succeeds, `Failed` when Pulumi refuses a step the plan does not
//! hold — then, after the retry backoff, a new preview saves a new plan to approve (no retry of the refused `up`). A
//! plan made for another generation, revision or sync request than the Stack asks for now is `Superseded`: its id
//! approves nothing. An annotation value is judged once (`status.observedApproval`): approved, or refused with a
//! Warning event. In manual mode a Stack is Ready only after an `up`: a succeeded preview is not a sync.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use pko_api::approval::{APPROVE_PLAN_ANNOTATION, ApprovalMode, PlanState, StackPlan};
use pko_api::constants::{RECONCILE_REQUEST_ANNOTATION, event_reason as ev};
use pko_api::stack::{CurrentStackUpdate, StackStatus};
use pko_api::{Stack, Update};

use crate::k8s::Severity;

/// An event a judgement emits: severity, reason, note.
pub type Note = (Severity, &'static str, String);

/// What the gate lets a pass do.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    /// Not gated (`mode: auto`, `spec.preview`, a Stack being deleted): PKO's path.
    Off,
    /// Gated, no plan waits for what the Stack asks now: the sync decides; an update it needs is a preview that saves
    /// a plan, and a succeeded preview is not a sync.
    Open,
    /// The pending plan `id` is approved: make the `up` constrained to it.
    Apply(String),
    /// The pending plan waits for approval; the condition message.
    Await(String),
}

/// A judgement of the gate: the gate, the Stack's plan and observed approval as they become, and the events.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    /// What the pass may do.
    pub gate: Gate,
    /// `status.plan` as it becomes.
    pub plan: Option<StackPlan>,
    /// `status.observedApproval` as it becomes.
    pub observed_approval: Option<String>,
    /// Events to emit.
    pub notes: Vec<Note>,
}

/// Whether `stack`'s changes wait for approval: `mode: manual`, not in preview mode (which never updates).
pub fn gated(stack: &Stack) -> bool {
    let manual = stack.spec.approval.as_ref().and_then(|a| a.mode) == Some(ApprovalMode::Manual);
    manual && stack.spec.preview != Some(true)
}

/// Whether `plan` was made for what `stack` asks for now at `revision`: its generation, sync request and revision.
pub fn made_for_now(plan: &StackPlan, stack: &Stack, revision: &str) -> bool {
    plan.generation == stack.metadata.generation
        && plan.reconcile_request.as_deref()
            == stack.annotations().get(RECONCILE_REQUEST_ANNOTATION).map(String::as_str)
        && plan.commit.as_deref() == Some(revision)
}

/// The gate for `stack` with status `status` (the pass's draft) at source `revision`, `deleting` or not.
pub fn judge(stack: &Stack, status: &StackStatus, revision: &str, deleting: bool) -> Judged {
    let mut j = Judged {
        gate: Gate::Off,
        plan: status.plan.clone(),
        observed_approval: status.observed_approval.clone(),
        notes: Vec::new(),
    };
    if deleting || !gated(stack) {
        return j;
    }
    j.gate = Gate::Open;
    let approval = stack.annotations().get(APPROVE_PLAN_ANNOTATION).cloned().filter(|a| !a.is_empty());
    let new_approval = approval.clone().filter(|a| Some(a) != status.observed_approval.as_ref());
    let name = stack.name_any();
    // approved, its up not made yet (a create that failed): made again, as approved
    if let Some(plan) = j.plan.as_ref().filter(|p| p.state == PlanState::Approved && p.applied_by.is_none())
        && made_for_now(plan, stack, revision)
    {
        j.gate = Gate::Apply(plan.id.clone());
        return j;
    }
    let waiting =
        |p: &StackPlan| p.state == PlanState::Pending || (p.state == PlanState::Approved && p.applied_by.is_none());
    if let Some(plan) = j.plan.as_mut().filter(|p| waiting(p)) {
        if !made_for_now(plan, stack, revision) {
            plan.state = PlanState::Superseded;
            plan.message = Some(format!("superseded before its approval: {}", what_changed(plan, stack, revision)));
            let note = format!(
                "plan {} superseded: {}; a new preview saves a new plan",
                plan.id,
                what_changed(plan, stack, revision)
            );
            j.notes.push((Severity::Normal, ev::STACK_PLAN_SUPERSEDED, note));
        } else if approval.as_deref() == Some(plan.id.as_str()) {
            plan.state = PlanState::Approved;
            j.observed_approval = approval;
            j.notes.push((Severity::Normal, ev::STACK_PLAN_APPROVED, format!("plan {} approved: running it", plan.id)));
            j.gate = Gate::Apply(plan.id.clone());
            return j;
        } else {
            if let Some(a) = new_approval {
                let note =
                    format!("{APPROVE_PLAN_ANNOTATION}: {a} names no pending plan; the pending plan is {}", plan.id);
                j.notes.push((Severity::Warning, ev::STACK_APPROVAL_REFUSED, note));
                j.observed_approval = Some(a);
            }
            j.gate = Gate::Await(awaiting_message(plan, &name));
            return j;
        }
    }
    if let Some(a) = new_approval {
        let note = format!("{APPROVE_PLAN_ANNOTATION}: {a} names no pending plan (none waits for approval)");
        j.notes.push((Severity::Warning, ev::STACK_APPROVAL_REFUSED, note));
        j.observed_approval = Some(a);
    }
    j
}

/// What differs between what `plan` was made for and what `stack` asks for at `revision`.
fn what_changed(plan: &StackPlan, stack: &Stack, revision: &str) -> String {
    if plan.generation != stack.metadata.generation {
        return format!("the Stack is at generation {}", stack.metadata.generation.unwrap_or(0));
    }
    if plan.commit.as_deref() != Some(revision) {
        return format!("the source is at {revision}");
    }
    "a new sync was requested (pulumi.com/reconciliation-request)".into()
}

/// The `AwaitingApproval` message of `plan` of Stack `name`: its id, its changes and how to approve it.
pub fn awaiting_message(plan: &StackPlan, name: &str) -> String {
    format!(
        "plan {} ({}) awaits approval: kubectl pko approve stack/{name} --plan {} (annotation \
            {APPROVE_PLAN_ANNOTATION})",
        plan.id,
        summary(plan),
        plan.id
    )
}

/// A plan's change summary as `create 1, update 2` (changes only; `no changes` when none).
pub fn summary(plan: &StackPlan) -> String {
    let changes: Vec<String> = plan
        .change_summary
        .iter()
        .flatten()
        .filter(|(op, n)| op.as_str() != "same" && **n > 0)
        .map(|(op, n)| format!("{op} {n}"))
        .collect();
    if changes.is_empty() { "no changes".into() } else { changes.join(", ") }
}

/// What the finished Update `u` (the Stack's `current`, `succeeded` or not with `message`) means for the Stack's plan
/// `plan` at `now`: a preview that saved a plan makes it the pending plan (an event says how to approve it); the `up`
/// of a plan marks it `Applied` or `Failed`. Anything else leaves it.
pub fn absorbed(
    plan: Option<&StackPlan>,
    u: &Update,
    current: &CurrentStackUpdate,
    (succeeded, message): (bool, &str),
    now: &Time,
) -> (Option<StackPlan>, Option<Note>) {
    let stack = u.spec.workspace_name.clone().unwrap_or_default();
    let saved = u.status.as_ref().and_then(|s| s.plan.clone()).filter(|_| succeeded && u.spec.save_plan == Some(true));
    if let Some(id) = saved {
        let p = StackPlan {
            id,
            update: u.name_any(),
            state: PlanState::Pending,
            generation: current.generation,
            reconcile_request: current.reconcile_request.clone(),
            commit: current.commit.clone(),
            run_digest: u.spec.run_digest.clone(),
            change_summary: u.status.as_ref().and_then(|s| s.change_summary.clone()),
            created_at: Some(now.clone()),
            applied_by: None,
            message: None,
        };
        let note = (Severity::Normal, ev::STACK_APPROVAL_REQUIRED, awaiting_message(&p, &stack));
        return (Some(p), Some(note));
    }
    let Some(id) = u.spec.plan.as_deref() else { return (plan.cloned(), None) };
    let Some(mut p) = plan.filter(|p| p.id == id).cloned() else { return (plan.cloned(), None) };
    p.applied_by = Some(u.name_any());
    if succeeded {
        p.state = PlanState::Applied;
        p.message = None;
    } else {
        p.state = PlanState::Failed;
        let first = message.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default();
        p.message = Some(crate::stack::plan::with_last_error("the constrained up failed".into(), Some(first)));
    }
    (Some(p), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_api::approval::Approval;
    use std::collections::BTreeMap;

    fn stack(generation: i64, mode: ApprovalMode, approve: Option<&str>) -> Stack {
        let mut s = Stack::new("web", Default::default());
        s.spec.approval = Some(Approval { mode: Some(mode) });
        s.metadata.generation = Some(generation);
        if let Some(a) = approve {
            s.metadata.annotations = Some(BTreeMap::from([(APPROVE_PLAN_ANNOTATION.to_string(), a.to_string())]));
        }
        s
    }

    fn pending(id: &str, generation: i64, commit: &str) -> StackPlan {
        StackPlan {
            id: id.into(),
            update: "web-1".into(),
            state: PlanState::Pending,
            generation: Some(generation),
            commit: Some(commit.into()),
            change_summary: Some(BTreeMap::from([("create".to_string(), 1), ("same".to_string(), 2)])),
            ..Default::default()
        }
    }

    fn status(plan: Option<StackPlan>, observed: Option<&str>) -> StackStatus {
        StackStatus { plan, observed_approval: observed.map(str::to_string), ..Default::default() }
    }

    #[test]
    fn auto_preview_mode_and_deletion_are_not_gated() {
        let st = status(Some(pending("a", 1, "r1")), None);
        assert_eq!(judge(&stack(1, ApprovalMode::Auto, Some("a")), &st, "r1", false).gate, Gate::Off);
        let mut preview = stack(1, ApprovalMode::Manual, Some("a"));
        preview.spec.preview = Some(true);
        assert_eq!(judge(&preview, &st, "r1", false).gate, Gate::Off);
        assert_eq!(judge(&stack(1, ApprovalMode::Manual, Some("a")), &st, "r1", true).gate, Gate::Off);
    }

    #[test]
    fn the_pending_plan_waits_until_the_annotation_names_it_then_runs() {
        let st = status(Some(pending("a", 1, "r1")), None);
        let waits = judge(&stack(1, ApprovalMode::Manual, None), &st, "r1", false);
        match &waits.gate {
            Gate::Await(m) => assert!(m.contains("plan a (create 1) awaits approval") && m.contains("--plan a"), "{m}"),
            other => panic!("expected a wait, got {other:?}"),
        }
        assert!(waits.notes.is_empty());
        let approved = judge(&stack(1, ApprovalMode::Manual, Some("a")), &st, "r1", false);
        assert_eq!(approved.gate, Gate::Apply("a".into()));
        assert_eq!(approved.plan.as_ref().map(|p| p.state), Some(PlanState::Approved));
        assert_eq!(approved.observed_approval.as_deref(), Some("a"));
        assert_eq!(approved.notes[0].1, ev::STACK_PLAN_APPROVED);
    }

    #[test]
    fn an_approved_plan_whose_up_was_not_made_is_made_again_unless_superseded() {
        let approved = StackPlan { state: PlanState::Approved, ..pending("a", 1, "r1") };
        let st = status(Some(approved), Some("a"));
        let again = judge(&stack(1, ApprovalMode::Manual, Some("a")), &st, "r1", false);
        assert_eq!(again.gate, Gate::Apply("a".into()));
        assert!(again.notes.is_empty(), "approved once");
        let moved = judge(&stack(1, ApprovalMode::Manual, Some("a")), &st, "r2", false);
        assert_eq!((moved.gate, moved.plan.map(|p| p.state)), (Gate::Open, Some(PlanState::Superseded)));
    }

    #[test]
    fn an_approval_of_another_plan_is_refused_once_and_runs_nothing() {
        let st = status(Some(pending("b", 2, "r1")), None);
        let refused = judge(&stack(2, ApprovalMode::Manual, Some("a")), &st, "r1", false);
        assert!(matches!(refused.gate, Gate::Await(_)));
        assert_eq!(refused.notes.len(), 1);
        assert_eq!((refused.notes[0].0, refused.notes[0].1), (Severity::Warning, ev::STACK_APPROVAL_REFUSED));
        assert!(refused.notes[0].2.contains("the pending plan is b"), "{}", refused.notes[0].2);
        assert_eq!(refused.observed_approval.as_deref(), Some("a"));
        let again = judge(&stack(2, ApprovalMode::Manual, Some("a")), &status(st.plan.clone(), Some("a")), "r1", false);
        assert!(again.notes.is_empty(), "judged once");
        let none = judge(&stack(2, ApprovalMode::Manual, Some("c")), &status(None, None), "r1", false);
        assert_eq!(none.gate, Gate::Open);
        assert_eq!(none.notes[0].1, ev::STACK_APPROVAL_REFUSED, "no plan waits: refused too");
    }

    #[test]
    fn a_new_generation_revision_or_request_supersedes_the_pending_plan() {
        let st = status(Some(pending("a", 1, "r1")), None);
        for (s, revision, why) in [
            (stack(2, ApprovalMode::Manual, Some("a")), "r1", "generation 2"),
            (stack(1, ApprovalMode::Manual, Some("a")), "r2", "the source is at r2"),
        ] {
            let j = judge(&s, &st, revision, false);
            assert_eq!(j.gate, Gate::Open, "an approval of a superseded plan runs nothing");
            let plan = j.plan.unwrap();
            assert_eq!(plan.state, PlanState::Superseded);
            assert!(plan.message.unwrap().contains(why));
            assert_eq!(j.notes[0].1, ev::STACK_PLAN_SUPERSEDED);
            assert_eq!(j.notes[1].1, ev::STACK_APPROVAL_REFUSED, "its id approves nothing");
        }
        let mut requested = stack(1, ApprovalMode::Manual, None);
        requested.annotations_mut().insert(RECONCILE_REQUEST_ANNOTATION.into(), "now".into());
        assert_eq!(judge(&requested, &st, "r1", false).plan.unwrap().state, PlanState::Superseded);
    }

    #[test]
    fn a_saving_preview_makes_the_pending_plan_and_its_up_applies_or_fails_it() {
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap());
        let current = CurrentStackUpdate {
            generation: Some(3),
            reconcile_request: None,
            name: Some("web-p".into()),
            commit: Some("r9".into()),
        };
        let mut preview = Update::new("web-p", Default::default());
        preview.spec.workspace_name = Some("web".into());
        preview.spec.save_plan = Some(true);
        preview.status = Some(pko_api::UpdateStatus { plan: Some("abc".into()), ..Default::default() });
        let (plan, note) = absorbed(None, &preview, &current, (true, ""), &now);
        let plan = plan.unwrap();
        assert_eq!((plan.id.as_str(), plan.state, plan.commit.as_deref()), ("abc", PlanState::Pending, Some("r9")));
        assert_eq!(plan.generation, Some(3));
        let note = note.unwrap();
        assert_eq!(note.1, ev::STACK_APPROVAL_REQUIRED);
        assert!(note.2.contains("kubectl pko approve stack/web --plan abc"), "{}", note.2);
        assert_eq!(absorbed(None, &preview, &current, (false, "boom"), &now).0, None, "a failed preview saves none");
        let mut up = Update::new("web-u", Default::default());
        up.spec.plan = Some("abc".into());
        let approved = StackPlan { state: PlanState::Approved, ..plan.clone() };
        let applied = absorbed(Some(&approved), &up, &current, (true, ""), &now).0.unwrap();
        assert_eq!((applied.state, applied.applied_by.as_deref()), (PlanState::Applied, Some("web-u")));
        let failed =
            absorbed(Some(&approved), &up, &current, (false, "error: violates plan: x\nmore"), &now).0.unwrap();
        assert_eq!(failed.state, PlanState::Failed);
        assert_eq!(failed.message.as_deref(), Some("the constrained up failed: error: violates plan: x"));
    }
}
