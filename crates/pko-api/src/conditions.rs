//! Conditions, written once for every kind: look-ups by type and one setter with Kubernetes `meta.SetStatusCondition`
//! semantics (the transition time moves only when the status changes), plus the look-ups the controllers share on
//! [`Update`] and [`Workspace`] (PKO's condition types from [`crate::constants`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::constants::{update_condition as uc, workspace_condition as wc};
use crate::{Update, Workspace};

/// The condition `type_` of `conditions`, if any.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether condition `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Sets (or replaces) condition `type_` and keeps the list sorted by type; `lastTransitionTime` stays when the status
/// did not change (Kubernetes `meta.SetStatusCondition`), else becomes `now`.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let transition = find(conditions, type_)
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    conditions.retain(|c| c.type_ != type_);
    conditions.push(Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: transition,
    });
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
}

/// Removes condition `type_`.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) {
    conditions.retain(|c| c.type_ != type_);
}

/// The current time as a Kubernetes `Time`.
pub fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

impl Update {
    fn conditions(&self) -> &[Condition] {
        self.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default()
    }

    /// Why it waits to be started: the message of `Progressing=False` with reason `Queued` (its namespace holds its
    /// share of the workers), if so.
    pub fn queued_message(&self) -> Option<&str> {
        find(self.conditions(), uc::PROGRESSING)
            .filter(|c| c.status == "False" && c.reason == uc::QUEUED)
            .map(|c| c.message.as_str())
    }

    /// `Complete=True`: the operation ended (successfully or not).
    pub fn is_complete(&self) -> bool {
        is_true(self.conditions(), uc::COMPLETE)
    }

    /// `status.startTime` is set: the operation was handed to an agent once — a dispatcher records it right before it
    /// calls the agent's `Run` — so an agent may run it still (after the dispatcher's restart or crash, or a shard
    /// move), and it is looked for there rather than started again.
    pub fn was_started(&self) -> bool {
        self.status.as_ref().is_some_and(|s| s.start_time.is_some())
    }

    /// `Failed=False` is present: the operation succeeded (meaningful once complete).
    pub fn succeeded(&self) -> bool {
        find(self.conditions(), uc::FAILED).is_some_and(|c| c.status == "False")
    }

    /// Reason of `Failed=True` (e.g. `UpdateConflict`), if it failed.
    pub fn failed_reason(&self) -> Option<&str> {
        find(self.conditions(), uc::FAILED).filter(|c| c.status == "True").map(|c| c.reason.as_str())
    }

    /// The agent operation id of this Update, `<namespace>/<name>/<uid>`: stable across operator restarts and distinct
    /// for a re-created Update of the same name.
    pub fn operation_id(&self) -> String {
        let m = &self.metadata;
        format!(
            "{}/{}/{}",
            m.namespace.as_deref().unwrap_or_default(),
            m.name.as_deref().unwrap_or_default(),
            m.uid.as_deref().unwrap_or_default()
        )
    }
}

impl Workspace {
    /// `Ready=True`.
    pub fn is_ready(&self) -> bool {
        is_true(self.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default(), wc::READY)
    }

    /// The `Ready` condition when it is not True and says why (its message is not empty).
    pub fn not_ready_reason(&self) -> Option<&Condition> {
        find(self.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default(), wc::READY)
            .filter(|c| c.status != "True" && !c.message.is_empty())
    }

    /// `Stalled=True` for the current generation (PKO's Workspace `Stalled`: `InstallationFailed`,
    /// `InitializationFailed`, `IncompatibleConfiguration`; ours also `SpecInvalid`). A stall recorded for an earlier
    /// generation does not count: a spec change is tried again.
    pub fn stalled(&self) -> Option<&Condition> {
        let c = find(self.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default(), wc::STALLED)?;
        (c.status == "True" && c.observed_generation == self.metadata.generation).then_some(c)
    }

    /// Whether an Update already made may run on this Workspace: it is Ready, or Stalled only by an earlier operation's
    /// or initialization's result ([`wc::OPERATION_STALLS`]; its success clears the stall). No new Update is made
    /// against a Workspace Stalled at its generation: the operator's Workspace controller initializes it again until it
    /// recovers.
    pub fn runnable(&self) -> bool {
        self.is_ready() || self.stalled().is_some_and(|c| wc::OPERATION_STALLS.contains(&c.reason.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn set_keeps_the_transition_time_of_an_unchanged_status() {
        let mut c = Vec::new();
        set(&mut c, "Ready", "False", "A", "", Some(1), &t(1));
        set(&mut c, "Ready", "False", "B", "m", Some(2), &t(5));
        assert_eq!((c[0].reason.as_str(), c[0].last_transition_time.clone()), ("B", t(1)));
        set(&mut c, "Ready", "True", "C", "", Some(2), &t(9));
        assert_eq!(c[0].last_transition_time, t(9));
        set(&mut c, "Abc", "True", "X", "", None, &t(9));
        assert_eq!(c.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(), ["Abc", "Ready"], "sorted by type");
        remove(&mut c, "Abc");
        assert!(find(&c, "Abc").is_none() && is_true(&c, "Ready"));
    }

    #[test]
    fn update_lookups_read_pko_conditions() {
        let mut u = Update::new("u", Default::default());
        u.metadata.namespace = Some("ns".into());
        u.metadata.uid = Some("id".into());
        assert!(!u.is_complete() && !u.succeeded() && u.failed_reason().is_none());
        assert_eq!(u.operation_id(), "ns/u/id");
        let mut conds = Vec::new();
        set(&mut conds, uc::COMPLETE, "True", uc::REASON_FAILED, "", None, &t(0));
        set(&mut conds, uc::FAILED, "True", uc::UPDATE_CONFLICT, "locked", None, &t(0));
        u.status = Some(crate::UpdateStatus { conditions: Some(conds), ..Default::default() });
        assert!(u.is_complete() && !u.succeeded());
        assert_eq!(u.failed_reason(), Some(uc::UPDATE_CONFLICT));
    }
}
