//! The kstatus "ready protocol" on a Stack (PKO `MarkReadyCondition`, `MarkReconcilingCondition`,
//! `MarkStalledCondition`): Ready=True stands alone; Ready=False always comes with exactly one of Reconciling=True or
//! Stalled=True.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use pko_api::constants::stack_condition as sc;

pub use pko_api::conditions::{remove, set};

/// Ready=True `ProcessingCompleted`; Reconciling and Stalled removed.
pub fn mark_ready(conditions: &mut Vec<Condition>, generation: Option<i64>, now: &Time) {
    remove(conditions, sc::RECONCILING);
    remove(conditions, sc::STALLED);
    set(conditions, sc::READY, "True", sc::PROCESSING_COMPLETED, sc::PROCESSING_COMPLETED_MESSAGE, generation, now);
}

/// Ready=False `NotReadyInProgress` + Reconciling=True with `reason`; Stalled removed.
pub fn mark_reconciling(
    conditions: &mut Vec<Condition>,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    remove(conditions, sc::STALLED);
    set(conditions, sc::READY, "False", sc::NOT_READY_IN_PROGRESS, sc::NOT_READY_IN_PROGRESS_MESSAGE, generation, now);
    set(conditions, sc::RECONCILING, "True", reason, message, generation, now);
}

/// Ready=False `NotReadyStalled` + Stalled=True with `reason`; Reconciling removed.
pub fn mark_stalled(conditions: &mut Vec<Condition>, reason: &str, message: &str, generation: Option<i64>, now: &Time) {
    remove(conditions, sc::RECONCILING);
    set(conditions, sc::READY, "False", sc::NOT_READY_STALLED, sc::NOT_READY_STALLED_MESSAGE, generation, now);
    set(conditions, sc::STALLED, "True", reason, message, generation, now);
}

/// Whether `conditions` already say Stalled=True with `reason` and `message` (an event for the same stall was published
/// when it began). Pure.
pub fn is_stalled_with(conditions: &[Condition], reason: &str, message: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == sc::STALLED && c.status == "True" && c.reason == reason && c.message == message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_is_recognised_by_reason_and_message() {
        let mut c = Vec::new();
        assert!(!is_stalled_with(&c, "SpecInvalid", "m"));
        mark_stalled(&mut c, "SpecInvalid", "m", Some(1), &t(1));
        assert!(is_stalled_with(&c, "SpecInvalid", "m"));
        assert!(!is_stalled_with(&c, "SpecInvalid", "other"), "a new message is a new stall");
        assert!(!is_stalled_with(&c, "SourceUnavailable", "m"));
    }

    fn t(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    fn types(c: &[Condition]) -> Vec<(String, String, String)> {
        c.iter().map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone())).collect()
    }

    #[test]
    fn ready_protocol_holds_exactly_one_companion() {
        let mut c = Vec::new();
        mark_reconciling(&mut c, sc::STACK_PROCESSING, "stack is being processed", Some(1), &t(1));
        assert_eq!(
            types(&c),
            vec![
                ("Ready".into(), "False".into(), "NotReadyInProgress".into()),
                ("Reconciling".into(), "True".into(), "StackProcessing".into())
            ]
        );
        mark_stalled(&mut c, sc::UPDATE_FAILED, "up failed 3 times", Some(1), &t(2));
        assert_eq!(
            types(&c),
            vec![
                ("Ready".into(), "False".into(), "NotReadyStalled".into()),
                ("Stalled".into(), "True".into(), "UpdateFailed".into())
            ]
        );
        mark_ready(&mut c, Some(2), &t(3));
        assert_eq!(types(&c), vec![("Ready".into(), "True".into(), "ProcessingCompleted".into())]);
        assert_eq!(c[0].observed_generation, Some(2));
    }

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let mut c = Vec::new();
        mark_reconciling(&mut c, sc::STACK_PROCESSING, "a", None, &t(10));
        mark_reconciling(&mut c, sc::RETRYING_AFTER_FAILURE, "b", None, &t(20));
        let ready = c.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.last_transition_time, t(10), "Ready stayed False");
        mark_ready(&mut c, None, &t(30));
        assert_eq!(c[0].last_transition_time, t(30));
    }
}
