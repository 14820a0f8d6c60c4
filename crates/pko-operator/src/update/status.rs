//! Update conditions as PKO writes them (`Progressing`, `Complete`, `Failed`), from the agent's result.

use self::pko_proto_reason::Reason;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use pko_api::constants::update_condition as uc;

/// The state of an Update's operation, as the conditions tell it.
#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    /// Running.
    Progressing,
    /// Finished successfully.
    Succeeded,
    /// Finished with a failure; `reason` is the `Failed` condition's reason (`UpdateFailed`,
    /// `UpdateConflict`, `InvalidAccessToken`, `Unknown`, `Canceled`, …), `message` the error.
    Failed {
        /// Reason of the Failed condition.
        reason: String,
        /// Error text.
        message: String,
    },
    /// Waiting: `reason` is `WorkspaceNotFound`, `WorkspaceNotReady` or `TransientFailure`.
    Waiting {
        /// Reason of the Progressing=False condition.
        reason: &'static str,
        /// Why.
        message: String,
    },
}

/// The three conditions for `phase` (sorted by type), keeping transition times of unchanged statuses
/// ([`pko_api::conditions::set`]).
pub fn conditions(phase: &Phase, generation: Option<i64>, now: &Time, old: &[Condition]) -> Vec<Condition> {
    // (status, reason, message) of Progressing, Complete and Failed
    type Triple<'a> = (&'a str, &'a str, &'a str);
    let (progressing, complete, failed): (Triple, Triple, Triple) = match phase {
        Phase::Progressing => (("True", uc::REASON_PROGRESSING, ""), ("False", uc::REASON_PROGRESSING, ""), ("False", uc::REASON_PROGRESSING, "")),
        Phase::Succeeded => (("False", uc::REASON_COMPLETE, ""), ("True", uc::UPDATED, ""), ("False", uc::UPDATE_SUCCEEDED, "")),
        Phase::Failed { reason, message } => (("False", uc::REASON_FAILED, ""), ("True", uc::REASON_FAILED, ""), ("True", reason, message)),
        Phase::Waiting { reason, message } => (("False", reason, message), ("False", uc::REASON_PROGRESSING, ""), ("False", uc::REASON_PROGRESSING, "")),
    };
    let mut v: Vec<Condition> = old.iter().filter(|c| [uc::PROGRESSING, uc::COMPLETE, uc::FAILED].contains(&c.type_.as_str())).cloned().collect();
    for (type_, (status, reason, message)) in [(uc::PROGRESSING, progressing), (uc::COMPLETE, complete), (uc::FAILED, failed)] {
        pko_api::conditions::set(&mut v, type_, status, reason, message, generation, now);
    }
    v
}

/// PKO's `Failed` reason and Update `status.message` for a failed operation of type `update_type`
/// (`up`, `preview`, `refresh`, `destroy`) with the agent's `message` (PKO `update_controller.go`
/// `setStatusBlockFromGRPCErr` over its agent's `server.go`): a lock conflict and a refused token keep
/// their own reason and message (PKO's `PulumiErrorInfo`); a cancel is `Canceled`; any other failure
/// is `Unknown` with `<type> failed: <message>`, as PKO's agent wraps every Automation API error. Pure.
pub fn failure(reason: Reason, update_type: &str, message: &str) -> (&'static str, String) {
    match reason {
        Reason::UpdateConflict => (uc::UPDATE_CONFLICT, message.to_string()),
        Reason::InvalidAccessToken => (uc::INVALID_ACCESS_TOKEN, message.to_string()),
        Reason::Cancelled => (uc::CANCELED, message.to_string()),
        Reason::UpdateFailed | Reason::Other => {
            let prefix = format!("{update_type} failed");
            let message = if message.starts_with(&prefix) { message.to_string() } else { format!("{prefix}: {message}") };
            (uc::UNKNOWN, message)
        }
    }
}

/// The agent's error reasons as the Update controller distinguishes them (kept independent of the
/// generated protobuf enum so this module stays pure).
pub mod pko_proto_reason {
    /// Agent error reason.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Reason {
        /// Another update holds the lock.
        UpdateConflict,
        /// The backend refused the token.
        InvalidAccessToken,
        /// The engine reported failure.
        UpdateFailed,
        /// Cancelled.
        Cancelled,
        /// Anything else.
        Other,
    }
}

/// The note of an Update's `UpdateSucceeded`/`UpdateFailed` event in PKO's words (`update_controller.go`):
/// `Updated stack "dev"`, `Previewed …`, `Refreshed …`, `Destroyed …`; `Failed to update stack "dev"`
/// (`preview`, `refresh`, `destroy`), followed by `: <message>` when the failure has one. `update_type`
/// is the Update's `spec.type` (`up` when unset). Pure.
pub fn event_note(update_type: Option<&pko_api::UpdateType>, stack: &str, succeeded: bool, message: &str) -> String {
    use pko_api::UpdateType as T;
    let (done, verb) = match update_type {
        Some(T::Preview) => ("Previewed", "preview"),
        Some(T::Refresh) => ("Refreshed", "refresh"),
        Some(T::Destroy) => ("Destroyed", "destroy"),
        _ => ("Updated", "update"),
    };
    let stack = format!("\"{}\"", stack.replace('\\', "\\\\").replace('"', "\\\""));
    match (succeeded, message.is_empty()) {
        (true, _) => format!("{done} stack {stack}"),
        (false, true) => format!("Failed to {verb} stack {stack}"),
        (false, false) => format!("Failed to {verb} stack {stack}: {message}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn event_notes_are_pkos() {
        use super::event_note;
        use pko_api::UpdateType as T;
        assert_eq!(event_note(Some(&T::Up), "dev", true, ""), r#"Updated stack "dev""#);
        assert_eq!(event_note(None, "dev", true, "ignored"), r#"Updated stack "dev""#);
        assert_eq!(event_note(Some(&T::Preview), "dev", true, ""), r#"Previewed stack "dev""#);
        assert_eq!(event_note(Some(&T::Refresh), "dev", true, ""), r#"Refreshed stack "dev""#);
        assert_eq!(event_note(Some(&T::Destroy), "dev", true, ""), r#"Destroyed stack "dev""#);
        assert_eq!(event_note(Some(&T::Up), "dev", false, ""), r#"Failed to update stack "dev""#);
        assert_eq!(event_note(Some(&T::Destroy), "org/p/dev", false, "error: boom"), r#"Failed to destroy stack "org/p/dev": error: boom"#);
    }

    use super::*;

    fn t(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    fn view(v: &[Condition]) -> Vec<(String, String, String)> {
        v.iter().map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone())).collect()
    }

    #[test]
    fn failures_are_reported_as_pko_does() {
        assert_eq!(failure(Reason::UpdateFailed, "up", "exit status 255"), ("Unknown", "up failed: exit status 255".to_string()));
        assert_eq!(failure(Reason::Other, "destroy", "no Pulumi.yaml"), ("Unknown", "destroy failed: no Pulumi.yaml".to_string()));
        assert_eq!(failure(Reason::UpdateFailed, "preview", "preview failed: x").1, "preview failed: x", "never doubled");
        assert_eq!(failure(Reason::UpdateConflict, "up", "locked"), ("UpdateConflict", "locked".to_string()));
        assert_eq!(failure(Reason::InvalidAccessToken, "up", "401"), ("InvalidAccessToken", "401".to_string()));
        assert_eq!(failure(Reason::Cancelled, "up", "cancelled: x").0, "Canceled");
    }

    #[test]
    fn phases_map_to_pko_conditions() {
        let s = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
        assert_eq!(
            view(&conditions(&Phase::Progressing, Some(1), &t(0), &[])),
            vec![s("Complete", "False", "Progressing"), s("Failed", "False", "Progressing"), s("Progressing", "True", "Progressing")]
        );
        assert_eq!(
            view(&conditions(&Phase::Succeeded, Some(1), &t(0), &[])),
            vec![s("Complete", "True", "Updated"), s("Failed", "False", "UpdateSucceeded"), s("Progressing", "False", "Complete")]
        );
        let failed = conditions(&Phase::Failed { reason: failure(Reason::UpdateConflict, "up", "locked").0.into(), message: "locked".into() }, Some(1), &t(0), &[]);
        assert_eq!(view(&failed), vec![s("Complete", "True", "Failed"), s("Failed", "True", "UpdateConflict"), s("Progressing", "False", "Failed")]);
        assert_eq!(failed[1].message, "locked");
    }

    #[test]
    fn transition_times_survive_unchanged_statuses() {
        let first = conditions(&Phase::Progressing, Some(1), &t(5), &[]);
        let again = conditions(&Phase::Progressing, Some(1), &t(9), &first);
        assert!(again.iter().all(|c| c.last_transition_time == t(5)));
        let done = conditions(&Phase::Succeeded, Some(1), &t(9), &again);
        let failed = done.iter().find(|c| c.type_ == "Failed").unwrap();
        assert_eq!(failed.last_transition_time, t(5), "Failed stayed False");
        assert!(done.iter().filter(|c| c.type_ != "Failed").all(|c| c.last_transition_time == t(9)));
    }
}
