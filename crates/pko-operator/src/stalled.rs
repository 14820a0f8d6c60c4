//! The Workspace's `Stalled` condition and `pulumiVersion` from operations (PKO's Workspace lifecycle, issue 13 item 6)
//! XX a shared contract between two peers. **Writer:** the Update worker ([`crate::update::dispatch`], [`record`],
//! [`record_pulumi_version`]), for the Workspace an operation ran on; the Workspace controller for a spec it cannot run
//! ([`spec_error`]) and for its own initialization of the Workspace's stacks ([`record`], PKO's, before any Update).
//! **Reader:** the Workspace controller ([`crate::workspace::controller`]), which derives `Ready` from it.
//!
//! PKO initialises each workspace pod once (`pulumi install`, then select, configure and add the environments of each
//! stack) and marks the Workspace Stalled — Ready False with the same reason — when that fails:
//! `InstallationFailed`, `InitializationFailed`, or `IncompatibleConfiguration` (the CLI is too old for structured
//! config). Here every operation prepares its workspace too, and its result says how that went ([`verdict`]): the
//! Update dispatcher records it on the Workspace ([`record`]). The Workspace controller initializes a Workspace as PKO
//! does before it is first Ready (on its own agent; on pooled agents for a `create: false` stack; and any Workspace
//! Stalled again every minute) and records that the same way; it derives `Ready` from the condition, and stalls a spec
//! it cannot run ([`spec_error`], reason `SpecInvalid`).
//!
//! The condition is applied with its own field manager ([`field_manager::WORKSPACE_STALLED`]), so the Workspace
//! controller's status writes (which carry only `Ready`) leave it alone, and it is cleared by applying no conditions
//! with that manager.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use kube::{Resource, ResourceExt};
use pko_api::Workspace;
use pko_api::constants::{event_reason as ev, field_manager, workspace_condition as wc};
use pko_api::workspace::{PullPolicy, SecurityProfile, WorkspaceSpec};
use pko_proto::v1::{ErrorReason, OperationResult, ResultStatus};

/// What an operation's result says about the Workspace it ran on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The workspace could not be prepared: Stalled with this reason (a [`wc`] reason) and message.
    Stalled {
        /// `InstallationFailed`, `InitializationFailed` or `IncompatibleConfiguration`.
        reason: &'static str,
        /// The agent's message.
        message: String,
    },
    /// The workspace was prepared (the operation got as far as running Pulumi's command).
    Initialized,
    /// Says nothing about the workspace (e.g. the source could not be fetched, the operation was interrupted or the
    /// request was refused).
    Unknown,
}

/// The [`Verdict`] of `result`. Pure.
pub fn verdict(result: &OperationResult) -> Verdict {
    if result.status == ResultStatus::Succeeded as i32 {
        return Verdict::Initialized;
    }
    let reason = result.error.as_ref().map(|e| ErrorReason::try_from(e.reason).unwrap_or(ErrorReason::Unspecified));
    let stalled = |reason| Verdict::Stalled { reason, message: result.message.clone() };
    match reason {
        Some(ErrorReason::InstallationFailed) => stalled(wc::INSTALLATION_FAILED),
        // PKO: a stack that does not exist and may not be created fails its SelectStack
        Some(ErrorReason::InitializationFailed | ErrorReason::StackNotFound) => stalled(wc::INITIALIZATION_FAILED),
        Some(ErrorReason::IncompatibleConfiguration) => stalled(wc::INCOMPATIBLE_CONFIGURATION),
        Some(ErrorReason::UpdateFailed | ErrorReason::UpdateConflict) => Verdict::Initialized,
        _ => Verdict::Unknown,
    }
}

/// Why the Workspace's spec cannot run, naming each field (`spec.securityProfile: unsupported value "privileged"; one
/// of "baseline" or "restricted"`); `None` when it can. PKO's schema admits any string for these (Go string types), so
/// the API server lets them through. Pure.
pub fn spec_error(spec: &WorkspaceSpec) -> Option<String> {
    let mut errors = Vec::new();
    if let Some(p) = spec.security_profile.as_ref().filter(|p| !p.is_known()) {
        errors.push(format!(
            "spec.securityProfile: unsupported value {:?}; one of {}",
            p.as_str(),
            SecurityProfile::expected()
        ));
    }
    if let Some(p) = spec.image_pull_policy.as_ref().filter(|p| !p.is_known()) {
        errors.push(format!(
            "spec.imagePullPolicy: unsupported value {:?}; one of {}",
            p.as_str(),
            PullPolicy::expected()
        ));
    }
    if let Some(m) = spec.service_account_name.as_deref().and_then(pko_api::validation::service_account_name_error) {
        errors.push(format!("spec.serviceAccountName: {m}"));
    }
    (!errors.is_empty()).then(|| errors.join("; "))
}

/// Whether the Workspace controller clears `ws`'s `Stalled` condition: it was recorded for an earlier generation, or it
/// is `SpecInvalid` (the controller's own; a spec that still cannot run stalls it again at once). Pure.
pub fn outdated(ws: &Workspace) -> bool {
    let current = pko_api::conditions::find(
        ws.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default(),
        wc::STALLED,
    );
    current.is_some_and(|c| {
        c.status == "True" && (c.observed_generation != ws.meta().generation || c.reason == wc::SPEC_INVALID)
    })
}

/// The event PKO emits when a workspace stalls with `reason` preparing stack `stack`, and its text (PKO's `Failed to
/// initialize stack "<name>": <error>` for a stack that could not be selected). Pure.
pub fn stall_event(reason: &str, message: &str, stack: &str) -> Option<(&'static str, String)> {
    match reason {
        wc::INSTALLATION_FAILED => Some((ev::INSTALLATION_FAILURE, message.to_string())),
        wc::INITIALIZATION_FAILED | wc::INCOMPATIBLE_CONFIGURATION => {
            Some((ev::STACK_INITIALIZATION_FAILURE, format!("Failed to initialize stack {stack:?}: {message}")))
        }
        _ => None,
    }
}

/// The status to apply with [`field_manager::WORKSPACE_STALLED`] so that `ws` is Stalled with `stall` (`Some((reason,
/// message))`) or not at all (`None`); `None` when it already says so. Pure.
pub fn patch(
    ws: &Workspace,
    stall: Option<(&str, &str)>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> Option<serde_json::Value> {
    let current = pko_api::conditions::find(
        ws.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default(),
        wc::STALLED,
    );
    match (stall, current) {
        (None, None) => None,
        (None, Some(_)) => Some(serde_json::json!({ "conditions": [] })),
        (Some((reason, message)), Some(c))
            if c.status == "True"
                && c.reason == reason
                && c.message == message
                && c.observed_generation == ws.meta().generation =>
        {
            None
        }
        (Some((reason, message)), c) => {
            // the transition time stays while the condition stays True (a new message or generation)
            let since =
                c.filter(|c| c.status == "True").map(|c| c.last_transition_time.clone()).unwrap_or_else(|| now.clone());
            let condition = Condition {
                type_: wc::STALLED.into(),
                status: "True".into(),
                reason: reason.into(),
                message: message.into(),
                observed_generation: ws.meta().generation,
                last_transition_time: since,
            };
            Some(serde_json::json!({ "conditions": [condition] }))
        }
    }
}

/// Applies [`patch`] to `ws` (nothing when it already says so). Returns whether it wrote.
pub async fn apply(client: &kube::Client, ws: &Workspace, stall: Option<(&str, &str)>) -> Result<bool, kube::Error> {
    let Some(status) = patch(ws, stall, &pko_api::conditions::now()) else { return Ok(false) };
    let api: Api<Workspace> = Api::namespaced(client.clone(), &ws.namespace().unwrap_or_default());
    crate::k8s::apply_status(&api, &ws.name_any(), field_manager::WORKSPACE_STALLED, &status).await?;
    Ok(true)
}

/// Records `verdict` (of an operation that ran on `ws`) on the Workspace, with PKO's events: a stall sets `Stalled`
/// (`InstallationFailure` / `StackInitializationFailure` Warning); a workspace prepared again clears a stall
/// (`Initialized`). Errors are logged: the operation's own result is written already.
pub async fn record(
    client: &kube::Client,
    events: &crate::k8s::Events,
    ws: &Workspace,
    verdict: &Verdict,
    stack: &str,
) {
    let outcome = match verdict {
        Verdict::Unknown => return,
        Verdict::Stalled { reason, message } => {
            apply(client, ws, Some((reason, message))).await.map(|w| (w, stall_event(reason, message, stack)))
        }
        Verdict::Initialized => {
            let was = ws.stalled().map(|c| c.reason.clone());
            apply(client, ws, None).await.map(|w| {
                (
                    w && was.is_some(),
                    Some((
                        ev::INITIALIZED,
                        format!(
                            "Initialized workspace {:?} (it was stalled: {})",
                            ws.name_any(),
                            was.unwrap_or_default()
                        ),
                    )),
                )
            })
        }
    };
    match outcome {
        Ok((true, Some((reason, note)))) => {
            let severity =
                if reason == ev::INITIALIZED { crate::k8s::Severity::Normal } else { crate::k8s::Severity::Warning };
            crate::k8s::publish(&events.workspace, ws, severity, reason, note).await;
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(workspace = %ws.name_any(), error = %e, "recording the workspace's Stalled condition"),
    }
}

/// Records the Pulumi CLI version `cli` reported by the agent that ran an operation on `ws` as its
/// `status.pulumiVersion` (PKO's), with its own field manager, when it changed. Errors are logged: the operation's own
/// result is written already.
pub async fn record_pulumi_version(client: &kube::Client, ws: &Workspace, cli: &str) {
    let version = pko_proto::pulumi_version(cli);
    if version.is_empty() || ws.status.as_ref().and_then(|w| w.pulumi_version.as_deref()) == Some(version.as_str()) {
        return;
    }
    let api: Api<Workspace> = Api::namespaced(client.clone(), &ws.namespace().unwrap_or_default());
    let st = serde_json::json!({ "pulumiVersion": version });
    if let Err(e) = crate::k8s::apply_status(&api, &ws.name_any(), field_manager::WORKSPACE_PULUMI_VERSION, &st).await {
        tracing::warn!(error = %e, "writing the workspace's pulumiVersion");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use pko_proto::v1::ErrorInfo;

    fn result(status: ResultStatus, reason: Option<ErrorReason>) -> OperationResult {
        OperationResult {
            status: status as i32,
            message: "pulumi install failed: no plugin".into(),
            error: reason.map(|r| ErrorInfo { reason: r as i32, ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn results_tell_how_the_workspace_fared() {
        assert_eq!(verdict(&result(ResultStatus::Succeeded, None)), Verdict::Initialized);
        let installed = verdict(&result(ResultStatus::Failed, Some(ErrorReason::InstallationFailed)));
        assert_eq!(
            installed,
            Verdict::Stalled { reason: wc::INSTALLATION_FAILED, message: "pulumi install failed: no plugin".into() }
        );
        for r in [ErrorReason::InitializationFailed, ErrorReason::StackNotFound] {
            assert!(
                matches!(
                    verdict(&result(ResultStatus::Failed, Some(r))),
                    Verdict::Stalled { reason: wc::INITIALIZATION_FAILED, .. }
                ),
                "{r:?}"
            );
        }
        assert!(matches!(
            verdict(&result(ResultStatus::Failed, Some(ErrorReason::IncompatibleConfiguration))),
            Verdict::Stalled { reason: wc::INCOMPATIBLE_CONFIGURATION, .. }
        ));
        assert_eq!(
            verdict(&result(ResultStatus::Failed, Some(ErrorReason::UpdateFailed))),
            Verdict::Initialized,
            "the program ran: the workspace was fine"
        );
        for r in [
            ErrorReason::InvalidSource,
            ErrorReason::Interrupted,
            ErrorReason::Internal,
            ErrorReason::InvalidAccessToken,
        ] {
            assert_eq!(verdict(&result(ResultStatus::Failed, Some(r))), Verdict::Unknown, "{r:?}");
        }
    }

    #[test]
    fn unknown_profiles_and_pull_policies_are_named() {
        assert_eq!(spec_error(&WorkspaceSpec::default()), None);
        let s = WorkspaceSpec {
            security_profile: Some("privileged".into()),
            image_pull_policy: Some("Sometimes".into()),
            ..Default::default()
        };
        assert_eq!(
            spec_error(&s).as_deref(),
            Some(concat!(
                r#"spec.securityProfile: unsupported value "privileged"; one of "baseline" or "restricted"; "#,
                r#"spec.imagePullPolicy: unsupported value "Sometimes"; one of "Always", "Never" or "IfNotPresent""#
            ))
        );
        let ok = WorkspaceSpec {
            security_profile: Some(SecurityProfile::Baseline),
            image_pull_policy: Some(PullPolicy::Never),
            ..Default::default()
        };
        assert_eq!(spec_error(&ok), None);
        let sa = WorkspaceSpec { service_account_name: Some("../x".into()), ..Default::default() };
        assert!(
            spec_error(&sa).is_some_and(|e| e.starts_with(
                "spec.serviceAccountName: \"../x\" is not a valid \
            service account name"
            )),
            "{:?}",
            spec_error(&sa)
        );
        let sa = WorkspaceSpec { service_account_name: Some("deployer.team-a".into()), ..Default::default() };
        assert_eq!(spec_error(&sa), None, "a DNS subdomain is a valid name");
    }

    fn ws(generation: i64, stalled: Option<(&str, &str, i64)>) -> Workspace {
        let mut w = Workspace::new("w", Default::default());
        w.metadata.generation = Some(generation);
        w.status = Some(pko_api::workspace::WorkspaceStatus {
            conditions: stalled.map(|(reason, message, g)| {
                vec![Condition {
                    type_: wc::STALLED.into(),
                    status: "True".into(),
                    reason: reason.into(),
                    message: message.into(),
                    observed_generation: Some(g),
                    last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                }]
            }),
            ..Default::default()
        });
        w
    }

    #[test]
    fn the_condition_is_written_only_when_it_changes() {
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(100).unwrap());
        assert_eq!(patch(&ws(1, None), None, &now), None, "nothing to clear");
        assert_eq!(
            patch(&ws(1, Some(("InstallationFailed", "m", 1))), None, &now),
            Some(serde_json::json!({"conditions": []})),
            "cleared"
        );
        assert_eq!(
            patch(&ws(1, Some(("InstallationFailed", "m", 1))), Some(("InstallationFailed", "m")), &now),
            None,
            "already so"
        );
        let p = patch(&ws(2, Some(("InstallationFailed", "m", 1))), Some(("InstallationFailed", "m")), &now)
            .expect("a new generation is recorded");
        assert_eq!(p["conditions"][0]["observedGeneration"], 2);
        assert_eq!(
            p["conditions"][0]["lastTransitionTime"], "1970-01-01T00:00:00Z",
            "still True: the transition time stays"
        );
        let p = patch(&ws(1, None), Some(("InitializationFailed", "no stack")), &now).unwrap();
        assert_eq!(
            (p["conditions"][0]["reason"].as_str(), p["conditions"][0]["lastTransitionTime"].as_str()),
            (Some("InitializationFailed"), Some("1970-01-01T00:01:40Z"))
        );
    }

    #[test]
    fn a_stall_of_an_earlier_generation_does_not_count() {
        assert!(ws(1, Some(("InstallationFailed", "m", 1))).stalled().is_some());
        assert!(ws(2, Some(("InstallationFailed", "m", 1))).stalled().is_none());
        assert!(
            ws(1, Some(("InstallationFailed", "m", 1))).runnable(),
            "an operation may run again: that is how it recovers"
        );
        assert!(!ws(1, Some((wc::SPEC_INVALID, "m", 1))).runnable(), "a spec it cannot run waits for a new spec");
    }

    #[test]
    fn the_controller_clears_old_stalls_and_its_own() {
        assert!(!outdated(&ws(1, None)));
        assert!(
            !outdated(&ws(1, Some(("InstallationFailed", "m", 1)))),
            "an operation's stall of this generation stays"
        );
        assert!(outdated(&ws(2, Some(("InstallationFailed", "m", 1)))), "of an earlier generation");
        assert!(outdated(&ws(1, Some((wc::SPEC_INVALID, "m", 1)))), "its own: checked again on every pass");
    }
}
