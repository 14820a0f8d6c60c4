//! The one definition of a workspace class, used by the pools and the operation limits alike: agents of one class are
//! interchangeable, because every operation request carries its whole source, settings and environment (`env` and
//! `envFrom` resolved by the operator), and everything else that shapes an agent — the namespace, image and pull
//! policy, resources, service account, security profile, pod template and Pulumi log level — is the same for every
//! Workspace of the class. A pool's pods carry no Workspace's `env` or `envFrom` ([`super::pool::pods::pool_objects`]):
//! one Stack's environment never reaches another's operation through them.

use pko_api::Workspace;

/// The class of `ws`: its namespace and the 16-hex-character hash of what shapes its agent, e.g. `team-a/3f2a…`,
/// PKO's defaults applied. Workspaces that differ only in name, stacks, config or source share a class. Pure.
pub fn workspace_class(ws: &Workspace) -> String {
    // with PKO's defaults applied: a Workspace that names the `default` service account or the default
    // image gets the same agent as one that leaves them unset
    let s = ws.spec.with_defaults();
    let key = serde_json::json!([
        s.image,
        s.image_pull_policy,
        s.resources,
        s.service_account_name,
        s.security_profile,
        s.pod_template,
        s.pulumi_log_level.filter(|l| *l > 0)
    ]);
    let hash = pko_api::hash::sha256_hex(key.to_string(), 8);
    format!("{}/{hash}", ws.metadata.namespace.as_deref().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws(ns: &str, name: &str, spec: serde_json::Value) -> Workspace {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": ns}, "spec": spec})).unwrap()
    }

    #[test]
    fn a_class_is_the_namespace_and_what_shapes_an_agent() {
        let a = workspace_class(&ws("team", "a", serde_json::json!({"stacks": [{"name": "dev"}]})));
        assert_eq!(
            a,
            workspace_class(&ws("team", "b", serde_json::json!({"stacks": [{"name": "prod"}]}))),
            "name and stacks do not matter"
        );
        assert_eq!(
            a,
            workspace_class(&ws("team", "c", serde_json::json!({"serviceAccountName": "default"}))),
            "defaults applied"
        );
        assert!(a.starts_with("team/") && a.len() == "team/".len() + 16, "{a}");
        assert_ne!(a, workspace_class(&ws("other", "a", serde_json::json!({}))), "namespace");
        assert_ne!(
            a,
            workspace_class(&ws("team", "a", serde_json::json!({"serviceAccountName": "deployer"}))),
            "service account"
        );
        assert_ne!(a, workspace_class(&ws("team", "a", serde_json::json!({"image": "pulumi/pulumi:3"}))), "image");
        assert_eq!(
            a,
            workspace_class(&ws("team", "a", serde_json::json!({"env": [{"name": "A", "value": "1"}]}))),
            "the environment travels with each request"
        );
        assert_ne!(
            a,
            workspace_class(&ws("team", "a", serde_json::json!({"resources": {"limits": {"memory": "1Gi"}}}))),
            "resources"
        );
    }
}
