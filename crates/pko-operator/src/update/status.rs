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
    /// Finished with a failure; `reason` is the `Failed` condition's reason (`UpdateFailed`, `UpdateConflict`,
    /// `InvalidAccessToken`, `Unknown`, `Canceled`, …), `message` the error.
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
        Phase::Progressing => (
            ("True", uc::REASON_PROGRESSING, ""),
            ("False", uc::REASON_PROGRESSING, ""),
            ("False", uc::REASON_PROGRESSING, ""),
        ),
        Phase::Succeeded => {
            (("False", uc::REASON_COMPLETE, ""), ("True", uc::UPDATED, ""), ("False", uc::UPDATE_SUCCEEDED, ""))
        }
        Phase::Failed { reason, message } => {
            (("False", uc::REASON_FAILED, ""), ("True", uc::REASON_FAILED, ""), ("True", reason, message))
        }
        Phase::Waiting { reason, message } => {
            (("False", reason, message), ("False", uc::REASON_PROGRESSING, ""), ("False", uc::REASON_PROGRESSING, ""))
        }
    };
    let mut v: Vec<Condition> = old
        .iter()
        .filter(|c| [uc::PROGRESSING, uc::COMPLETE, uc::FAILED].contains(&c.type_.as_str()))
        .cloned()
        .collect();
    for (type_, (status, reason, message)) in
        [(uc::PROGRESSING, progressing), (uc::COMPLETE, complete), (uc::FAILED, failed)]
    {
        pko_api::conditions::set(&mut v, type_, status, reason, message, generation, now);
    }
    v
}

/// Names the agent running the operation (`address`: its gRPC address, a pod's under its Service) in the
/// `Progressing=True` condition's message of `conditions` (PKO leaves it empty): `running on agent <address>`, what
/// `kubectl pko status` shows. Pure.
pub fn name_agent(conditions: &mut [Condition], address: &str) {
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == uc::PROGRESSING && c.status == "True") {
        c.message = format!("running on agent {address}");
    }
}

/// PKO's `Failed` reason and Update `status.message` for a failed operation of `update_type` with the agent's `message`
/// (PKO's `setStatusBlockFromGRPCErr`): a lock conflict and a refused token keep their own reason and message, a cancel
/// is `Canceled`, any other failure `Unknown` with `<type> failed: <message>`, as PKO's agent wraps it. Pure.
pub fn failure(reason: Reason, update_type: &str, message: &str) -> (&'static str, String) {
    match reason {
        Reason::UpdateConflict => (uc::UPDATE_CONFLICT, message.to_string()),
        Reason::InvalidAccessToken => (uc::INVALID_ACCESS_TOKEN, message.to_string()),
        Reason::Cancelled => (uc::CANCELED, message.to_string()),
        Reason::RunMismatch => (uc::RUN_MISMATCH, message.to_string()),
        Reason::UpdateFailed | Reason::Other => {
            let prefix = format!("{update_type} failed");
            let message =
                if message.starts_with(&prefix) { message.to_string() } else { format!("{prefix}: {message}") };
            (uc::UNKNOWN, message)
        }
    }
}

/// The agent's error reasons as the Update controller distinguishes them (kept independent of the generated protobuf
/// enum so this module stays pure).
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
        /// The request, or the stack config written, was not what the Update names.
        RunMismatch,
        /// Anything else.
        Other,
    }
}

/// The agent's error reason of `r` as [`failure`] distinguishes it. Pure.
pub fn reason_of(r: &pko_proto::v1::OperationResult) -> Reason {
    use pko_proto::v1::ErrorReason;
    match r.error.as_ref().map(|e| ErrorReason::try_from(e.reason).unwrap_or(ErrorReason::Unspecified)) {
        Some(ErrorReason::UpdateConflict) => Reason::UpdateConflict,
        Some(ErrorReason::InvalidAccessToken) => Reason::InvalidAccessToken,
        Some(ErrorReason::UpdateFailed) => Reason::UpdateFailed,
        Some(ErrorReason::Cancelled) => Reason::Cancelled,
        Some(ErrorReason::RunMismatch) => Reason::RunMismatch,
        _ => Reason::Other,
    }
}

/// A protobuf timestamp as a Kubernetes `Time`; `None` when unset or out of range. Pure.
pub fn time_of(t: Option<&prost_types::Timestamp>) -> Option<Time> {
    let t = t?;
    k8s_openapi::jiff::Timestamp::new(t.seconds, t.nanos).ok().map(Time)
}

/// The phase of a finished operation `r` of `spec` and the Update's `status.message`: PKO's — a success's is Pulumi's
/// update summary message (the Update's own `spec.message`); a failure's is the agent's error as PKO words it
/// ([`failure`]). Pure.
pub fn phase_of(spec: &pko_api::update::UpdateSpec, r: &pko_proto::v1::OperationResult) -> (Phase, String) {
    if r.status == pko_proto::v1::ResultStatus::Succeeded as i32 {
        return (Phase::Succeeded, spec.message.clone().unwrap_or_default());
    }
    let update_type = spec.update_type.as_ref().map(pko_api::UpdateType::as_str).unwrap_or("up");
    let (reason, message) = failure(reason_of(r), update_type, &r.message);
    (Phase::Failed { reason: reason.into(), message: message.clone() }, message)
}

/// The Update's status `st` once operation `r` finished as `phase` with `message`, at `now`: conditions, times,
/// message, permalink, project, change summary and resource changes (at most
/// [`pko_api::update::MAX_RESOURCE_CHANGES`]); `outputs`: the outputs Secret's name when one was written. Pure.
pub fn finished(
    mut st: pko_api::update::UpdateStatus,
    (phase, message): (&Phase, String),
    r: &pko_proto::v1::OperationResult,
    generation: Option<i64>,
    outputs: Option<String>,
    now: &Time,
) -> pko_api::update::UpdateStatus {
    use std::collections::BTreeMap;
    st.observed_generation = generation;
    st.outputs = outputs.or(st.outputs);
    st.start_time = st.start_time.clone().or_else(|| time_of(r.start_time.as_ref()));
    st.end_time = time_of(r.end_time.as_ref()).or_else(|| Some(now.clone()));
    st.message = Some(message).filter(|m| !m.is_empty());
    st.permalink = Some(r.permalink.clone()).filter(|p| !p.is_empty());
    st.project_info = r
        .project_info
        .as_ref()
        .map(|p| pko_api::workspace::ProjectInfo { name: Some(p.name.clone()), runtime: Some(p.runtime.clone()) });
    st.change_summary = Some(r.change_summary.iter().map(|(k, v)| (k.clone(), *v)).collect())
        .filter(|m: &BTreeMap<String, i32>| !m.is_empty());
    st.resource_changes = (!r.changes.is_empty()).then(|| {
        let changes = r.changes.iter().take(pko_api::update::MAX_RESOURCE_CHANGES);
        changes
            .map(|c| pko_api::update::ResourceChange {
                urn: c.urn.clone(),
                op: c.op.clone(),
                properties: Some(c.properties.clone()).filter(|p| !p.is_empty()),
            })
            .collect()
    });
    st.run_digest = Some(r.run_digest.clone()).filter(|d| !d.is_empty());
    let current = st.conditions.clone().unwrap_or_default();
    st.conditions = Some(conditions(phase, generation, now, &current));
    st
}

/// The note of an Update's `UpdateSucceeded`/`UpdateFailed` event in PKO's words (`update_controller.go`): `Updated
/// stack "dev"`, `Previewed …`, `Refreshed …`, `Destroyed …`; `Failed to update stack "dev"` (`preview`,
/// `refresh`, `destroy`), followed by `: <message>` when the failure has one. `update_type` is the Update's `spec.type`
/// (`up` when unset). Pure.
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
        assert_eq!(
            event_note(Some(&T::Destroy), "org/p/dev", false, "error: boom"),
            r#"Failed to destroy stack "org/p/dev": error: boom"#
        );
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
        assert_eq!(
            failure(Reason::UpdateFailed, "up", "exit status 255"),
            ("Unknown", "up failed: exit status 255".to_string())
        );
        assert_eq!(
            failure(Reason::Other, "destroy", "no Pulumi.yaml"),
            ("Unknown", "destroy failed: no Pulumi.yaml".to_string())
        );
        assert_eq!(
            failure(Reason::UpdateFailed, "preview", "preview failed: x").1,
            "preview failed: x",
            "never doubled"
        );
        assert_eq!(failure(Reason::UpdateConflict, "up", "locked"), ("UpdateConflict", "locked".to_string()));
        assert_eq!(failure(Reason::InvalidAccessToken, "up", "401"), ("InvalidAccessToken", "401".to_string()));
        assert_eq!(failure(Reason::Cancelled, "up", "cancelled: x").0, "Canceled");
    }

    #[test]
    fn phases_map_to_pko_conditions() {
        let s = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
        assert_eq!(
            view(&conditions(&Phase::Progressing, Some(1), &t(0), &[])),
            vec![
                s("Complete", "False", "Progressing"),
                s("Failed", "False", "Progressing"),
                s("Progressing", "True", "Progressing")
            ]
        );
        assert_eq!(
            view(&conditions(&Phase::Succeeded, Some(1), &t(0), &[])),
            vec![
                s("Complete", "True", "Updated"),
                s("Failed", "False", "UpdateSucceeded"),
                s("Progressing", "False", "Complete")
            ]
        );
        let failed = conditions(
            &Phase::Failed {
                reason: failure(Reason::UpdateConflict, "up", "locked").0.into(),
                message: "locked".into(),
            },
            Some(1),
            &t(0),
            &[],
        );
        assert_eq!(
            view(&failed),
            vec![
                s("Complete", "True", "Failed"),
                s("Failed", "True", "UpdateConflict"),
                s("Progressing", "False", "Failed")
            ]
        );
        assert_eq!(failed[1].message, "locked");
        let mut running = conditions(&Phase::Progressing, Some(1), &t(0), &[]);
        name_agent(&mut running, "127.0.0.1:4000");
        assert_eq!(
            running.iter().find(|c| c.type_ == "Progressing").map(|c| c.message.as_str()),
            Some("running on agent 127.0.0.1:4000")
        );
        assert!(
            running.iter().filter(|c| c.type_ != "Progressing").all(|c| c.message.is_empty()),
            "only Progressing=True names it"
        );
        let mut done = failed.clone();
        name_agent(&mut done, "127.0.0.1:4000");
        assert_eq!(done, failed, "a finished Update's conditions are left alone");
    }

    #[test]
    fn a_finished_operation_fills_the_status_as_pko() {
        use pko_proto::v1::{ErrorInfo, OperationResult, ResultStatus};
        let spec = pko_api::update::UpdateSpec {
            message: Some("deploy v2".into()),
            update_type: Some(pko_api::UpdateType::Up),
            ..Default::default()
        };
        let ok = OperationResult {
            status: ResultStatus::Succeeded as i32,
            permalink: "file:///p".into(),
            change_summary: [("create".to_string(), 2)].into(),
            ..Default::default()
        };
        let (phase, message) = phase_of(&spec, &ok);
        assert_eq!((&phase, message.as_str()), (&Phase::Succeeded, "deploy v2"));
        let st = finished(Default::default(), (&phase, message), &ok, Some(3), Some("u-stack-outputs".into()), &t(7));
        assert_eq!(
            (st.message.as_deref(), st.permalink.as_deref(), st.outputs.as_deref(), st.observed_generation),
            (Some("deploy v2"), Some("file:///p"), Some("u-stack-outputs"), Some(3))
        );
        assert_eq!((st.end_time, st.change_summary.unwrap()["create"]), (Some(t(7)), 2));
        let failed = OperationResult {
            status: ResultStatus::Failed as i32,
            message: "exit status 1".into(),
            error: Some(ErrorInfo { reason: pko_proto::v1::ErrorReason::UpdateFailed as i32, ..Default::default() }),
            ..Default::default()
        };
        let (phase, message) = phase_of(&spec, &failed);
        assert_eq!(phase, Phase::Failed { reason: "Unknown".into(), message: "up failed: exit status 1".into() });
        let st = finished(Default::default(), (&phase, message), &failed, Some(3), None, &t(7));
        assert_eq!((st.message.as_deref(), st.permalink, st.outputs), (Some("up failed: exit status 1"), None, None));
        assert!(
            st.conditions.unwrap().iter().any(|c| c.type_ == "Failed" && c.status == "True" && c.reason == "Unknown")
        );
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
