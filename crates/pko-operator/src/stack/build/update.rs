//! The Update of a Stack's sync or drift check: its metadata and owners, its spec with `updateTemplate` merged
//! ([`super::overlay`]), its name, and what it runs ([`pin_run`]).

use pko_api::stack::StackSpec;
use pko_api::{UpdateSpec, UpdateType};

use super::BuildError;
use super::metadata::{child_labels, owner_ref};

/// The Update spec for a sync of `spec` (PKO step 10): destroy when finalizing, preview in preview mode, else up;
/// `ttlAfterCompleted` 24h; `updateTemplate` fields win.
pub fn update_spec(spec: &StackSpec, workspace: &str, deleting: bool, message: &str) -> Result<UpdateSpec, BuildError> {
    let kind = if deleting {
        UpdateType::Destroy
    } else if spec.preview == Some(true) {
        UpdateType::Preview
    } else {
        UpdateType::Up
    };
    let mut u = UpdateSpec {
        workspace_name: Some(workspace.into()),
        stack_name: Some(spec.stack.clone()),
        update_type: Some(kind.clone()),
        ttl_after_completed: Some("24h".into()),
        message: Some(message.into()),
        timeout: spec.operation_timeout_seconds.filter(|s| *s > 0).map(|s| format!("{s}s")),
        ..Default::default()
    };
    if kind != UpdateType::Destroy {
        u.target = spec.targets.clone();
        u.target_dependents = spec.target_dependents;
        u.refresh = spec.refresh;
    } else {
        u.run_program = spec.run_program;
    }
    match spec.update_template.as_ref().and_then(|t| t.spec.as_ref()) {
        Some(t) => super::overlay(&u, t, "spec.updateTemplate.spec"),
        None => Ok(u),
    }
}

/// The name of the Update a sync creates: `<stack>-<8 hex digits>` of a hash of what the sync is for (generation,
/// reconcile request, revision, destroy or not) and of the previous Update (its name and failure count). Deterministic:
/// a pass that retries a failed create chooses the same name, so writing it to `currentUpdate` again changes nothing
/// (and wakes no watch); every new sync differs from the last Update, so it never collides with one that still exists.
pub fn update_name(
    stack: &str,
    generation: Option<i64>,
    request: Option<&str>,
    revision: &str,
    deleting: bool,
    last: Option<&pko_api::stack::StackUpdateState>,
) -> String {
    let key = format!(
        "{}\n{}\n{revision}\n{deleting}\n{}\n{}",
        generation.unwrap_or(0),
        request.unwrap_or(""),
        last.and_then(|l| l.name.as_deref()).unwrap_or(""),
        last.and_then(|l| l.failures).unwrap_or(0)
    );
    format!("{stack}-{}", pko_api::hash::sha256_hex(key, 4))
}

/// The Update `name` of `stack` on `workspace`: PKO's labels plus `updateTemplate.metadata`, the Workspace as
/// controlling owner and the Stack as a second owner (blocking its deletion), the Stack finalizer (released once the
/// result is absorbed), and [`update_spec`].
pub fn update(
    stack: &pko_api::Stack,
    workspace: &pko_api::Workspace,
    name: &str,
    deleting: bool,
    reason: &str,
) -> Result<pko_api::Update, BuildError> {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::ResourceExt;
    let stack_name = stack.name_any();
    let ws_owner = OwnerReference { controller: Some(true), ..owner_ref(workspace, "workspace")? };
    let stack_owner =
        OwnerReference { controller: Some(false), block_owner_deletion: Some(true), ..owner_ref(stack, "stack")? };
    let template = stack.spec.update_template.as_ref().and_then(|t| t.metadata.clone()).unwrap_or_default();
    let labels = child_labels(stack, template.labels);
    let annotations = template.annotations.filter(|a| !a.is_empty());
    let metadata = kube::api::ObjectMeta {
        name: Some(name.to_string()),
        namespace: stack.namespace(),
        labels: Some(labels),
        annotations,
        owner_references: Some(vec![ws_owner, stack_owner]),
        finalizers: Some(vec![pko_api::constants::STACK_FINALIZER.into()]),
        ..Default::default()
    };
    Ok(pko_api::Update { metadata, spec: update_spec(&stack.spec, &stack_name, deleting, reason)?, status: None })
}

/// Records on `u` what it runs (ours, additive Update fields): the Stack's generation, the generation of `workspace`
/// (as the apply returned it), the source `revision`, and the run digest of `u` on `workspace`
/// ([`crate::agents::request::run_digest`]), after the update template was merged, so no template sets them. A
/// Workspace no request can be built from gets no digest: the dispatch fails the Update naming the field. Pure.
pub fn pin_run(u: &mut pko_api::Update, stack: &pko_api::Stack, workspace: &pko_api::Workspace, revision: &str) {
    use kube::ResourceExt;
    u.spec.stack_generation = stack.metadata.generation;
    u.spec.workspace_generation = workspace.metadata.generation;
    u.spec.revision = Some(revision.to_string()).filter(|r| !r.is_empty());
    u.spec.run_digest =
        crate::agents::request::run_digest(&stack.namespace().unwrap_or_default(), &workspace.spec, &u.spec).ok();
}

/// Time to live of a finished drift check's Update (a schedule every 15 minutes keeps 4, not 96 as with the 24 h of
/// other Updates); `updateTemplate.spec.ttlAfterCompleted` overrides it.
pub const DRIFT_CHECK_TTL: &str = "1h";

/// The Update of a drift check of `stack` (PKO's proposal, #1037): a `refresh` with `previewOnly` (nothing written to
/// the stack's state), message `Drift detection`, the Stack's `targets`, the update template's other settings;
/// annotated when its schedule remediates. Owned as [`update`]'s.
///
/// Errors: [`BuildError::NoUid`].
pub fn drift_check(
    stack: &pko_api::Stack,
    workspace: &pko_api::Workspace,
    name: &str,
    auto_remediate: bool,
) -> Result<pko_api::Update, BuildError> {
    let mut u = update(stack, workspace, name, false, "Drift detection")?;
    let ttl_set = stack
        .spec
        .update_template
        .as_ref()
        .and_then(|t| t.spec.as_ref())
        .and_then(|s| s.ttl_after_completed.as_ref())
        .is_some();
    u.spec.update_type = Some(UpdateType::Refresh);
    u.spec.preview_only = Some(true);
    u.spec.refresh = None;
    u.spec.target_dependents = None;
    if !ttl_set {
        u.spec.ttl_after_completed = Some(DRIFT_CHECK_TTL.into());
    }
    if auto_remediate {
        u.metadata
            .annotations
            .get_or_insert_default()
            .insert(pko_api::constants::DRIFT_AUTO_REMEDIATE_ANNOTATION.into(), "true".into());
    }
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::build::workspace;
    use crate::stack::source::ResolvedSource;
    use pko_api::workspace::ProjectInfo;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> StackSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_drift_check_is_a_preview_only_refresh_with_a_short_ttl() {
        let mut stack = pko_api::Stack::new(
            "web",
            spec(json!({"stack": "dev", "refresh": true, "targets": ["urn:a"],
                    "updateTemplate": {"spec": {"parallel": 3}}})),
        );
        stack.metadata.uid = Some("u1".into());
        stack.metadata.namespace = Some("ns".into());
        let mut ws = pko_api::Workspace::new("web", Default::default());
        ws.metadata.uid = Some("u2".into());
        let u = drift_check(&stack, &ws, "web-drift-01020304", true).unwrap();
        assert_eq!(
            (u.spec.update_type, u.spec.preview_only, u.spec.refresh),
            (Some(UpdateType::Refresh), Some(true), None)
        );
        assert_eq!(
            (u.spec.ttl_after_completed.as_deref(), u.spec.parallel, u.spec.message.as_deref()),
            (Some("1h"), Some(3), Some("Drift detection"))
        );
        assert_eq!(u.spec.target, Some(vec!["urn:a".to_string()]));
        assert_eq!(u.metadata.annotations.unwrap()[pko_api::constants::DRIFT_AUTO_REMEDIATE_ANNOTATION], "true");
        stack.spec.update_template =
            Some(serde_json::from_value(json!({"spec": {"ttlAfterCompleted": "5m"}})).unwrap());
        let u = drift_check(&stack, &ws, "web-drift-01020304", false).unwrap();
        assert_eq!(u.spec.ttl_after_completed.as_deref(), Some("5m"), "the template's TTL wins");
        assert!(u.metadata.annotations.is_none());
    }

    #[test]
    fn update_names_repeat_for_a_retry_and_change_for_a_new_sync() {
        use pko_api::stack::StackUpdateState;
        let a = update_name("web", Some(3), None, "abc", false, None);
        assert_eq!(a, update_name("web", Some(3), None, "abc", false, None), "a retried create picks the same name");
        assert!(a.starts_with("web-") && a.len() == "web-".len() + 8, "{a}");
        let done = StackUpdateState { name: Some(a.clone()), failures: Some(0), ..Default::default() };
        let resync = update_name("web", Some(3), None, "abc", false, Some(&done));
        assert_ne!(resync, a, "a resync after the Update differs from it");
        let failed_again = StackUpdateState { name: Some(a.clone()), failures: Some(1), ..Default::default() };
        assert_ne!(update_name("web", Some(3), None, "abc", false, Some(&failed_again)), resync);
        for other in [
            update_name("web", Some(4), None, "abc", false, None),
            update_name("web", Some(3), Some("req"), "abc", false, None),
            update_name("web", Some(3), None, "def", false, None),
            update_name("web", Some(3), None, "abc", true, None),
        ] {
            assert_ne!(other, a);
        }
    }

    #[test]
    fn update_kind_options_and_template() {
        let s = spec(json!({"stack": "dev", "targets": ["urn:a"], "refresh": true, "runProgram": true,
                "updateTemplate": {"spec": {"ttlAfterCompleted": "1h", "parallel": 2}}}));
        let up = update_spec(&s, "ws", false, "Initial stack update").unwrap();
        assert_eq!(
            (up.update_type, up.ttl_after_completed.as_deref(), up.parallel, up.refresh),
            (Some(UpdateType::Up), Some("1h"), Some(2), Some(true))
        );
        assert_eq!(up.target, Some(vec!["urn:a".to_string()]));
        let d = update_spec(&s, "ws", true, "Stack marked for deletion").unwrap();
        assert_eq!((d.update_type, d.run_program, d.target.clone()), (Some(UpdateType::Destroy), Some(true), None));
        let p = update_spec(&spec(json!({"stack": "dev", "preview": true})), "ws", false, "m").unwrap();
        assert_eq!(
            (p.update_type, p.ttl_after_completed.as_deref(), p.timeout),
            (Some(UpdateType::Preview), Some("24h"), None)
        );
        let t = update_spec(&spec(json!({"stack": "dev", "operationTimeoutSeconds": 90})), "ws", false, "m").unwrap();
        assert_eq!(t.timeout.as_deref(), Some("90s"), "the Stack's deadline reaches its Updates");
        let t = update_spec(
            &spec(json!({"stack": "dev", "operationTimeoutSeconds": 90, "updateTemplate": {"spec": {"timeout": "1h",
                    "idleTimeout": "5m"}}})),
            "ws",
            false,
            "m",
        )
        .unwrap();
        assert_eq!(
            (t.timeout.as_deref(), t.idle_timeout.as_deref()),
            (Some("1h"), Some("5m")),
            "the update template wins"
        );
    }

    #[test]
    fn whole_objects_carry_labels_templates_and_owners() {
        let mut stack: pko_api::Stack = serde_json::from_value(json!({
            "apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "web", "namespace": "team",
                "labels": {"pulumi.com/shard": "17", "pulumi.com/shards": "64"}},
            "spec": {"stack": "dev", "workspaceTemplate": {"metadata": {"labels": {"tier": "a", "pulumi.com/shard": "3",
                "pulumi.com/shards": "8"}, "annotations": {"n": "1"}}},
                     "updateTemplate": {"metadata": {"labels": {"kind": "u"}}}}
        }))
        .unwrap();
        let src = ResolvedSource::ProjectInfo(ProjectInfo::default());
        assert_eq!(
            workspace(&stack, &src).unwrap_err(),
            BuildError::NoUid("stack"),
            "no owner reference without a uid"
        );
        stack.metadata.uid = Some("s-uid".into());
        let mut ws = workspace(&stack, &src).unwrap();
        let labels = ws.metadata.labels.clone().unwrap();
        assert_eq!((labels["tier"].as_str(), labels[pko_api::constants::STACK_NAME_LABEL].as_str()), ("a", "web"));
        assert_eq!(labels[pko_api::constants::SHARD_LABEL], "17", "the Stack's shard, whatever the template says");
        assert_eq!(labels[pko_api::constants::SHARDS_LABEL], "64", "and the count it was computed for");
        let mut unlabelled = stack.clone();
        unlabelled.metadata.labels = None;
        let labels = workspace(&unlabelled, &src).unwrap().metadata.labels.unwrap();
        assert!(
            !labels.contains_key(pko_api::constants::SHARD_LABEL)
                && !labels.contains_key(pko_api::constants::SHARDS_LABEL),
            "a template never shards an object: {labels:?}"
        );
        assert_eq!(ws.metadata.annotations.clone().unwrap()["n"], "1");
        assert_eq!(ws.metadata.owner_references.clone().unwrap()[0].uid, "s-uid");
        assert!(update(&stack, &ws, "web-1", false, "m").is_err(), "the Workspace needs a uid too");
        ws.metadata.uid = Some("w-uid".into());
        let u = update(&stack, &ws, "web-1", false, "m").unwrap();
        let owners = u.metadata.owner_references.unwrap();
        assert_eq!((owners[0].uid.as_str(), owners[0].controller), ("w-uid", Some(true)));
        assert_eq!(
            (owners[1].uid.as_str(), owners[1].controller, owners[1].block_owner_deletion),
            ("s-uid", Some(false), Some(true))
        );
        assert_eq!(u.metadata.labels.unwrap()["kind"], "u");
        assert_eq!(u.metadata.finalizers.unwrap(), [pko_api::constants::STACK_FINALIZER]);
        assert_eq!(u.metadata.namespace.as_deref(), Some("team"));
        assert_eq!(u.spec.update_type, Some(UpdateType::Up));
    }
}
