//! The texts a Stack's conditions and events carry, and the pure rules about them (PKO's words where PKO has them):
//! waiting for a Workspace, a terminating namespace, a lock conflict, a refused template.

use pko_api::Workspace;
use pko_api::constants::stack_condition as sc;
use pko_api::stack::StackUpdateState;

use super::plan;

/// The Stalled `NamespaceTerminating` message: why the destroy cannot run and how to let the Stack go.
pub(super) fn namespace_terminating_message(ns: &str, name: &str) -> String {
    format!(
        "namespace {ns} is being deleted, so the destroy of this Stack (destroyOnFinalize) cannot run: no Workspace or \
            Update can be created in it. \
         Either destroy the stack's resources yourself and remove the finalizer with \
         `kubectl -n {ns} patch stack {name} --type=json -p \
         '[{{\"op\":\"remove\",\"path\":\"/metadata/finalizers\"}}]'`, \
         or apply a Stack with the same spec in another namespace to destroy them."
    )
}

/// PKO's "waiting for workspace readiness", followed by why the Workspace is not Ready when it says (e.g. `:
/// ConnectionFailed: serviceaccounts "deployer" not found`), so a Stack never waits silently.
pub(super) fn workspace_wait_message(ws: &Workspace) -> String {
    match ws.not_ready_reason() {
        Some(c) => format!("{}: {}: {}", sc::WAITING_FOR_WORKSPACE_MESSAGE, c.reason, c.message),
        None => sc::WAITING_FOR_WORKSPACE_MESSAGE.to_string(),
    }
}

/// The Stack's `Stalled` reason and PKO's message (`<reason>: <message>`) while `ws` is Stalled at its current
/// generation: `PulumiVersionTooLow` for a CLI too old for the spec, else `WorkspaceFailed` (PKO's). A stall of an
/// earlier generation is the Workspace controller's to clear: none ([`Workspace::stalled`]). Pure.
pub(super) fn workspace_stall(ws: &Workspace) -> Option<(&'static str, String)> {
    use pko_api::constants::workspace_condition as wc;
    let c = ws.stalled()?;
    let reason =
        if c.reason == wc::INCOMPATIBLE_CONFIGURATION { sc::PULUMI_VERSION_TOO_LOW } else { sc::WORKSPACE_FAILED };
    Some((reason, format!("{}: {}", c.reason, c.message)))
}

/// Text of the `StackUpdateConflictDetected` event: the lock holder's message and what happens next (a retry after the
/// cooldown, or the stall once the retry limit is reached).
pub(super) fn conflict_message(last: Option<&StackUpdateState>, policy: &plan::RetryPolicy) -> String {
    let failures = last.and_then(|l| l.failures).unwrap_or(0);
    let cause = last.and_then(|l| l.message.clone()).unwrap_or_default();
    let next = if failures >= policy.max_failures {
        "retry limit reached: the Stack is Stalled until the lock is gone and a sync is requested".to_string()
    } else {
        format!("retrying in {} s", policy.cooldown(failures).as_secs())
    };
    format!(
        "Another update holds the stack lock ({cause}); {next}. A lock left by a dead process is cleared with `pulumi \
            cancel`."
    )
}

/// A request annotation `asked` (the Stack's `pulumi.com/cancel-request` or `pulumi.com/unlock-request`) when it is
/// new: set, not empty and not the value last seen (`observed`). A value is acted on once. Pure.
pub(super) fn new_request<'a>(asked: Option<&'a str>, observed: Option<&str>) -> Option<&'a str> {
    asked.filter(|a| !a.is_empty() && Some(*a) != observed)
}

/// Start of the `SpecInvalid` message when the API server refused the generated Workspace. Why an Update runs after an
/// accepted unlock request (its `message`).
pub(super) const UNLOCK_REASON: &str =
    "unlock requested (pulumi.com/unlock-request): releasing backend locks whose holders are known dead";

pub(super) const REFUSED_WORKSPACE: &str = "spec.workspaceTemplate: the API server refused the Workspace";

/// Start of the `SpecInvalid` message when the API server refused the generated Update.
pub(super) const REFUSED_UPDATE: &str = "spec.updateTemplate: the API server refused the Update";

/// Whether API error `e` on a generated object is a refusal of its content (HTTP 400 or 422: the templates made it
/// invalid), and the condition message: `<what>: <API message>`.
pub(super) fn refusal(what: &str, e: &kube::Error) -> (bool, String) {
    match e {
        kube::Error::Api(s) if s.code == 400 || s.code == 422 => (true, format!("{what}: {}", s.message)),
        other => (false, format!("{what}: {other}")),
    }
}

/// Whether the Stack is Stalled because the API server refused a generated object of this generation.
pub(super) fn refused_this_generation(
    conds: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    generation: Option<i64>,
) -> bool {
    conds.iter().any(|c| {
        c.type_ == sc::STALLED
            && c.status == "True"
            && c.reason == sc::SPEC_INVALID
            && c.observed_generation == generation
            && (c.message.starts_with(REFUSED_WORKSPACE) || c.message.starts_with(REFUSED_UPDATE))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn a_waiting_stack_says_why_its_workspace_is_not_ready() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let mut ws = Workspace::new("w", Default::default());
        assert_eq!(workspace_wait_message(&ws), "waiting for workspace readiness");
        ws.status = Some(pko_api::workspace::WorkspaceStatus {
            conditions: Some(vec![Condition {
                type_: "Ready".into(),
                status: "False".into(),
                reason: "ConnectionFailed".into(),
                message: "serviceaccounts \"deployer\" not found".into(),
                observed_generation: None,
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            }]),
            ..Default::default()
        });
        assert_eq!(
            workspace_wait_message(&ws),
            "waiting for workspace readiness: ConnectionFailed: serviceaccounts \"deployer\" not found"
        );
    }

    #[test]
    fn a_workspace_stalled_at_its_generation_stalls_the_stack() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let stalled = |reason: &str, generation: i64| {
            let mut ws = Workspace::new("w", Default::default());
            ws.metadata.generation = Some(2);
            ws.status = Some(pko_api::workspace::WorkspaceStatus {
                conditions: Some(vec![Condition {
                    type_: "Stalled".into(),
                    status: "True".into(),
                    reason: reason.into(),
                    message: "stack dev not found".into(),
                    observed_generation: Some(generation),
                    last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                }]),
                ..Default::default()
            });
            ws
        };
        assert_eq!(
            workspace_stall(&stalled("InitializationFailed", 2)),
            Some((sc::WORKSPACE_FAILED, "InitializationFailed: stack dev not found".into()))
        );
        assert_eq!(
            workspace_stall(&stalled("IncompatibleConfiguration", 2)).map(|s| s.0),
            Some(sc::PULUMI_VERSION_TOO_LOW)
        );
        assert_eq!(
            workspace_stall(&stalled("InitializationFailed", 1)),
            None,
            "of an earlier generation: being cleared"
        );
        assert!(workspace_stall(&stalled("SpecInvalid", 2)).is_some(), "a spec it cannot run");
        assert_eq!(workspace_stall(&Workspace::new("w", Default::default())), None);
    }

    #[test]
    fn namespace_terminating_message_says_how_to_let_go() {
        let m = namespace_terminating_message("team-a", "web");
        assert!(m.contains("namespace team-a is being deleted"), "{m}");
        assert!(m.contains("kubectl -n team-a patch stack web"), "{m}");
        assert!(m.contains(r#""path":"/metadata/finalizers""#), "{m}");
    }

    #[test]
    fn a_refused_template_stalls_for_its_generation_only() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let api = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("metadata.labels: Invalid value: \"bad!\"", "Invalid")
                    .with_code(code)
                    .boxed(),
            )
        };
        let (stall, msg) = refusal(REFUSED_UPDATE, &api(422));
        assert!(
            stall && msg.starts_with("spec.updateTemplate: the API server refused the Update: metadata.labels"),
            "{msg}"
        );
        assert!(!refusal(REFUSED_UPDATE, &api(500)).0, "a server error is retried");
        let stalled = |message: &str, generation: i64| Condition {
            type_: sc::STALLED.into(),
            status: "True".into(),
            reason: sc::SPEC_INVALID.into(),
            message: message.into(),
            observed_generation: Some(generation),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        };
        assert!(refused_this_generation(&[stalled(&msg, 3)], Some(3)));
        assert!(!refused_this_generation(&[stalled(&msg, 3)], Some(4)), "a new generation tries again");
        assert!(
            !refused_this_generation(&[stalled("spec.envRefs.X: bad", 3)], Some(3)),
            "other stalls are decided afresh"
        );
    }

    #[test]
    fn a_cancel_request_is_acted_on_once() {
        assert_eq!(new_request(Some("t1"), None), Some("t1"));
        assert_eq!(new_request(Some("t1"), Some("t1")), None, "seen");
        assert_eq!(new_request(Some("t2"), Some("t1")), Some("t2"));
        assert_eq!(new_request(Some(""), None), None);
        assert_eq!(new_request(None, Some("t1")), None);
    }

    #[test]
    fn conflict_message_names_the_lock_and_the_next_step() {
        let pko = plan::RetryPolicy::of(&Default::default());
        let first = conflict_message(Some(&failed(0)), &pko);
        assert!(first.contains("currently locked by 1 lock(s)"), "{first}");
        assert!(first.contains("retrying in 10 s"), "{first}");
        let capped = plan::RetryPolicy { cap: std::time::Duration::from_secs(5), ..pko };
        assert!(conflict_message(Some(&failed(1)), &capped).contains("retrying in 5 s"));
        let last = conflict_message(Some(&failed(3)), &pko);
        assert!(last.contains("retry limit reached"), "{last}");
    }

    fn failed(failures: i64) -> StackUpdateState {
        StackUpdateState {
            failures: Some(failures),
            message: Some("the stack is currently locked by 1 lock(s)".into()),
            ..Default::default()
        }
    }
}
