//! Whether a StackRollout holds a Stack's new revision (pure): the Stack's side of `crate::rollout`. A Stack governed
//! by a rollout (the first by name whose selector it matches) that has run a revision before and now wants another
//! updates only once the rollout's status admits it to that revision; until then it keeps its last good revision,
//! `Reconciling` `RolloutHeld`, and says why in `status.rollout`. Its first deployment, a change of its own spec at the
//! same revision, and a destroy are not held.

use std::sync::Arc;

use kube::ResourceExt;
use pko_api::rollout::{RolloutPhase, StackRolloutRef};
use pko_api::stack::StackStatus;
use pko_api::{Stack, StackRollout};

/// The Stack's hold: what `status.rollout` becomes, and the `RolloutHeld` message when the new revision must wait.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Hold {
    /// `status.rollout` as it becomes.
    pub rollout: Option<StackRolloutRef>,
    /// Why the Stack waits (`None`: it may update).
    pub held: Option<String>,
}

/// The hold of `stack` (status `status`, the pass's draft) wanting `revision`, under `rollouts`, `deleting` or not.
pub fn judge(
    stack: &Stack,
    status: &StackStatus,
    revision: &str,
    rollouts: &[Arc<StackRollout>],
    deleting: bool,
) -> Hold {
    let ns = stack.namespace().unwrap_or_default();
    let Some(r) = pko_api::rollout::governing(rollouts, &ns, stack.labels()) else { return Hold::default() };
    let last_good = status.last_update.as_ref().and_then(|l| l.last_successful_commit.as_deref());
    let new_revision = last_good.is_some_and(|g| g != revision) && !revision.is_empty();
    if deleting || !new_revision {
        return Hold::default();
    }
    let st = r.status.clone().unwrap_or_default();
    let name = stack.name_any();
    let admitted = st.revision.as_deref() == Some(revision) && st.admitted.contains(&name);
    let held = (!admitted).then(|| why(&r.name_any(), &st, revision, last_good.unwrap_or_default()));
    let rollout =
        StackRolloutRef { name: r.name_any(), revision: revision.to_string(), admitted, message: held.clone() };
    Hold { rollout: Some(rollout), held }
}

/// Whether a change of `rollout` may change the hold of `stack` (the Stack controller's watch of rollouts): a Stack
/// this rollout holds, when the rollout now admits it or no longer progresses (halted, paused, aborted, completed:
/// its reason changes). A progressing rollout's status changes with every Stack it updates; waking every Stack it
/// selects each time would reconcile them all per completion, for nothing. Other changes of a held Stack's reason
/// reach it at its next look (30 s). Pure.
pub fn wakes(rollout: &StackRollout, stack: &Stack) -> bool {
    let held = stack.status.as_ref().and_then(|s| s.rollout.as_ref()).filter(|h| !h.admitted);
    let Some(held) = held.filter(|h| Some(h.name.as_str()) == rollout.metadata.name.as_deref()) else { return false };
    if stack.namespace() != rollout.namespace() {
        return false;
    }
    let st = rollout.status.clone().unwrap_or_default();
    let admitted = st.revision.as_deref() == Some(held.revision.as_str()) && st.admitted.contains(&stack.name_any());
    admitted || st.phase != RolloutPhase::Progressing
}

/// Why rollout `name` (status `st`) holds a Stack at `last_good` that wants `revision`.
fn why(name: &str, st: &pko_api::rollout::StackRolloutStatus, revision: &str, last_good: &str) -> String {
    let state = match (st.revision.as_deref(), st.phase) {
        (Some(r), RolloutPhase::Halted | RolloutPhase::Aborted | RolloutPhase::Paused) if r == revision => {
            format!("{:?}: {}", st.phase, st.message.clone().unwrap_or_default())
        }
        (Some(r), _) if r == revision => format!("its step has not started (step {} now)", st.step + 1),
        _ => "the rollout has not taken this revision up yet".to_string(),
    };
    format!("held by StackRollout {name} at {last_good}: {revision} waits ({state})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_api::rollout::{StackRolloutSpec, StackRolloutStatus, StackSelector};
    use pko_api::stack::StackUpdateState;
    use std::collections::BTreeMap;

    fn rollout(name: &str, app: &str, status: StackRolloutStatus) -> Arc<StackRollout> {
        let selector = StackSelector { match_labels: BTreeMap::from([("app".to_string(), app.to_string())]) };
        let mut r = StackRollout::new(name, StackRolloutSpec { selector, ..Default::default() });
        r.metadata.namespace = Some("ns".into());
        r.status = Some(status);
        Arc::new(r)
    }

    fn stack(app: &str) -> (Stack, StackStatus) {
        let mut s = Stack::new("web", Default::default());
        s.metadata.namespace = Some("ns".into());
        s.metadata.labels = Some(BTreeMap::from([("app".to_string(), app.to_string())]));
        let last = StackUpdateState { last_successful_commit: Some("r1".into()), ..Default::default() };
        (s, StackStatus { last_update: Some(last), ..Default::default() })
    }

    fn progressing(revision: &str, admitted: &[&str]) -> StackRolloutStatus {
        StackRolloutStatus {
            phase: RolloutPhase::Progressing,
            revision: Some(revision.into()),
            admitted: admitted.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_governed_stack_waits_for_its_admission_to_the_new_revision() {
        let (s, st) = stack("web");
        let held = judge(&s, &st, "r2", &[rollout("waves", "web", progressing("r2", &["other"]))], false);
        let message = held.held.clone().unwrap();
        assert!(message.contains("held by StackRollout waves at r1: r2 waits"), "{message}");
        assert_eq!(held.rollout.as_ref().map(|r| (r.revision.as_str(), r.admitted)), Some(("r2", false)));
        let admitted = judge(&s, &st, "r2", &[rollout("waves", "web", progressing("r2", &["web"]))], false);
        assert_eq!(admitted.held, None);
        assert!(admitted.rollout.unwrap().admitted);
        let other_revision = judge(&s, &st, "r3", &[rollout("waves", "web", progressing("r2", &["web"]))], false);
        assert!(other_revision.held.is_some(), "admitted to r2, not to r3");
    }

    #[test]
    fn a_rollout_wakes_only_the_stacks_it_holds_when_it_admits_them_or_stops_progressing() {
        let (mut s, mut st) = stack("web");
        let held = |admitted| StackRolloutRef { name: "waves".into(), revision: "r2".into(), admitted, message: None };
        st.rollout = Some(held(false));
        s.status = Some(st.clone());
        assert!(!wakes(&rollout("waves", "web", progressing("r2", &["other"])), &s), "still held: nothing to do");
        assert!(wakes(&rollout("waves", "web", progressing("r2", &["web"])), &s), "admitted now");
        assert!(!wakes(&rollout("waves", "web", progressing("r3", &["web"])), &s), "admitted to another revision");
        let halted = StackRolloutStatus { phase: RolloutPhase::Halted, ..progressing("r2", &[]) };
        assert!(wakes(&rollout("waves", "web", halted), &s), "its reason changes");
        assert!(!wakes(&rollout("zeta", "web", progressing("r2", &["web"])), &s), "held by another rollout");
        st.rollout = Some(held(true));
        s.status = Some(st);
        assert!(!wakes(&rollout("waves", "web", progressing("r2", &["web"])), &s), "admitted already");
    }

    #[test]
    fn ungoverned_first_deployments_same_revisions_and_destroys_are_not_held() {
        let (s, st) = stack("web");
        let none = progressing("r2", &[]);
        assert_eq!(judge(&s, &st, "r2", &[rollout("waves", "api", none.clone())], false), Hold::default());
        assert_eq!(judge(&s, &st, "r1", &[rollout("waves", "web", none.clone())], false), Hold::default());
        assert_eq!(judge(&s, &st, "r2", &[rollout("waves", "web", none.clone())], true), Hold::default());
        let first = StackStatus::default();
        assert_eq!(judge(&s, &first, "r2", &[rollout("waves", "web", none)], false), Hold::default());
    }

    #[test]
    fn a_halted_rollout_says_why_and_the_first_rollout_by_name_governs() {
        let (s, st) = stack("web");
        let halted = StackRolloutStatus {
            phase: RolloutPhase::Halted,
            message: Some("halted: step 1: 2 Stack(s) failed".into()),
            ..progressing("r2", &[])
        };
        let both = [rollout("zeta", "web", progressing("r2", &["web"])), rollout("alpha", "web", halted)];
        let hold = judge(&s, &st, "r2", &both, false);
        assert_eq!(hold.rollout.as_ref().map(|r| r.name.as_str()), Some("alpha"));
        assert!(hold.held.unwrap().contains("Halted: halted: step 1: 2 Stack(s) failed"));
    }
}
