//! Validation the API server cannot do with OpenAPI and CEL. The Stack controller calls these and reports a failure as
//! `Stalled` with reason `SpecInvalid` and the error's message (PKO reports the same cases the same way). Pure
//! functions: no client, no I/O.

use std::fmt;

use crate::shared::{ResourceRef, ResourceSelectorType};
use crate::stack::StackSpec;

/// One problem in a spec: the field's path (e.g. `spec.envRefs.TOKEN`) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the field, starting at `spec`.
    pub field: String,
    /// What is wrong, in a sentence.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// All the problems found in a spec (never empty when returned as an error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SpecInvalid(pub Vec<FieldError>);

impl fmt::Display for SpecInvalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join("; "))
    }
}

/// Checks what CEL cannot: every [`ResourceRef`] (envRefs, secretsRef, gitAuth) is `Literal` or `Secret` with the
/// matching selector, and no Secret reference leaves the Stack's `namespace`.
///
/// Errors: [`SpecInvalid`] listing every offending field (`spec.envRefs.NAME`, `spec.secretsRef.KEY`,
/// `spec.gitAuth.accessToken`, …).
pub fn validate_stack_spec(spec: &StackSpec, namespace: &str) -> Result<(), SpecInvalid> {
    let mut errors = Vec::new();
    for (name, r) in spec.env_refs.iter().flatten() {
        check_ref(&format!("spec.envRefs.{name}"), r, namespace, &mut errors);
    }
    for (key, r) in spec.secrets_ref.iter().flatten() {
        check_ref(&format!("spec.secretsRef.{key}"), r, namespace, &mut errors);
    }
    if let Some(auth) = &spec.git_auth {
        if let Some(r) = &auth.access_token {
            check_ref("spec.gitAuth.accessToken", r, namespace, &mut errors);
        }
        if let Some(ssh) = &auth.ssh_auth {
            check_ref("spec.gitAuth.sshAuth.sshPrivateKey", &ssh.ssh_private_key, namespace, &mut errors);
            if let Some(p) = &ssh.password {
                check_ref("spec.gitAuth.sshAuth.password", p, namespace, &mut errors);
            }
        }
        if let Some(basic) = &auth.basic_auth {
            check_ref("spec.gitAuth.basicAuth.userName", &basic.user_name, namespace, &mut errors);
            check_ref("spec.gitAuth.basicAuth.password", &basic.password, namespace, &mut errors);
        }
        if let Some(app) = &auth.github_app {
            check_ref("spec.gitAuth.githubApp.appID", &app.app_id, namespace, &mut errors);
            check_ref("spec.gitAuth.githubApp.installationID", &app.installation_id, namespace, &mut errors);
            check_ref("spec.gitAuth.githubApp.privateKey", &app.private_key, namespace, &mut errors);
        }
    }
    if let Some(sa) =
        spec.workspace_template.as_ref().and_then(|t| t.spec.as_ref()).and_then(|s| s.service_account_name.as_deref())
        && let Some(message) = service_account_name_error(sa)
    {
        errors.push(FieldError { field: "spec.workspaceTemplate.spec.serviceAccountName".into(), message });
    }
    let templates = [
        ("spec.workspaceTemplate.metadata", spec.workspace_template.as_ref().and_then(|t| t.metadata.as_ref())),
        ("spec.updateTemplate.metadata", spec.update_template.as_ref().and_then(|t| t.metadata.as_ref())),
    ];
    for (field, meta) in templates {
        if let Some(m) = meta {
            check_metadata(field, m, &mut errors);
        }
    }
    if errors.is_empty() { Ok(()) } else { Err(SpecInvalid(errors)) }
}

/// Largest total size of an object's annotations, in bytes (Kubernetes `TotalAnnotationSizeLimitB`).
pub const MAX_ANNOTATIONS_BYTES: usize = 256 << 10;

/// Whether `s` is a Kubernetes "qualified name" part: 1–63 characters, alphanumerics with `-`, `_`, `.` inside.
fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Whether `s` is a DNS subdomain (RFC 1123): at most 253 characters of lower-case labels.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// Why `name` cannot name a ServiceAccount (Kubernetes `ValidateServiceAccountName`: a lower-case DNS subdomain of at
/// most 253 characters), checked before any request names it; `None` when it can.
pub fn service_account_name_error(name: &str) -> Option<String> {
    (!is_dns_subdomain(name)).then(|| {
        format!(
            "{name:?} is not a valid service account name: a lower-case DNS \
        subdomain (a-z, 0-9, '-', '.') of at most 253 characters"
        )
    })
}

/// A label or annotation key (`[prefix/]name`, Kubernetes `IsQualifiedName`): why it is invalid.
pub fn qualified_name_error(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if prefix.is_some_and(|p| !is_dns_subdomain(p)) {
        return Some("the prefix before '/' must be a lower-case DNS subdomain of at most 253 characters".into());
    }
    if !is_name_part(name) {
        return Some(
            "the name must be 1-63 characters: alphanumerics, '-', '_' or '.', starting and ending with an \
            alphanumeric"
                .into(),
        );
    }
    None
}

/// Checks labels and annotations as the API server will (keys qualified names, label values at most 63 characters of
/// the same alphabet or empty, annotations at most [`MAX_ANNOTATIONS_BYTES`] in all), so a template the API server
/// would refuse stalls the Stack naming the field instead of failing each write.
fn check_metadata(field: &str, m: &crate::shared::EmbeddedObjectMeta, errors: &mut Vec<FieldError>) {
    for (k, v) in m.labels.iter().flatten() {
        if let Some(why) = qualified_name_error(k) {
            errors.push(FieldError {
                field: format!("{field}.labels[{k:?}]"),
                message: format!("invalid label key: {why}"),
            });
        }
        if !v.is_empty() && !is_name_part(v) {
            errors.push(FieldError {
                field: format!("{field}.labels[{k:?}]"),
                message: format!(
                    "invalid label value {v:?}: at most 63 characters, alphanumerics, '-', '_' or '.', \
                    starting and ending with an alphanumeric"
                ),
            });
        }
    }
    let mut total = 0usize;
    for (k, v) in m.annotations.iter().flatten() {
        total += k.len() + v.len();
        if let Some(why) = qualified_name_error(k) {
            errors.push(FieldError {
                field: format!("{field}.annotations[{k:?}]"),
                message: format!("invalid annotation key: {why}"),
            });
        }
    }
    if total > MAX_ANNOTATIONS_BYTES {
        errors.push(FieldError {
            field: format!("{field}.annotations"),
            message: format!("annotations take {total} bytes; the limit is {MAX_ANNOTATIONS_BYTES}"),
        });
    }
}

fn check_ref(field: &str, r: &ResourceRef, namespace: &str, errors: &mut Vec<FieldError>) {
    let mut err = |message: String| errors.push(FieldError { field: field.to_string(), message });
    match &r.selector_type {
        ResourceSelectorType::Env | ResourceSelectorType::Fs => {
            // PKO's text (`errDeprecatedResourceRefEnv`/`FS`), then ours
            err(format!("ref type \"{}\" is deprecated (no longer supported; use Secret or Literal)", r.selector_type))
        }
        ResourceSelectorType::Unknown(t) => {
            err(format!("unsupported resource reference type {t:?}; use Secret or Literal"))
        }
        ResourceSelectorType::Literal => {
            if r.literal.is_none() {
                err("type Literal needs the literal field".into());
            }
        }
        ResourceSelectorType::Secret => match &r.secret {
            None => err("type Secret needs the secret field".into()),
            Some(s) => {
                if s.namespace.as_deref().is_some_and(|ns| !ns.is_empty() && ns != namespace) {
                    err(format!(
                        "cross-namespace refs are not allowed: secret namespace {:?} is not the stack's namespace \
                            {namespace:?}",
                        s.namespace.as_deref().unwrap_or_default()
                    ));
                }
                if s.name.is_empty() || s.key.is_empty() {
                    err("secret reference needs both name and key".into());
                }
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::{EnvSelector, SecretSelector};
    use crate::stack::GitAuthConfig;
    use std::collections::BTreeMap;

    fn spec() -> StackSpec {
        StackSpec { stack: "dev".into(), ..Default::default() }
    }

    #[test]
    fn literal_and_same_namespace_secret_are_valid() {
        let mut s = spec();
        s.env_refs = Some(BTreeMap::from([
            ("A".to_string(), ResourceRef::literal("x")),
            ("B".to_string(), ResourceRef::secret("creds", "token")),
        ]));
        let mut same = ResourceRef::secret("creds", "pw");
        same.secret.as_mut().unwrap().namespace = Some("team-a".into());
        s.secrets_ref = Some(BTreeMap::from([("pw".to_string(), same)]));
        assert_eq!(validate_stack_spec(&s, "team-a"), Ok(()));
    }

    #[test]
    fn a_service_account_name_that_cannot_exist_is_refused_naming_the_field() {
        for bad in ["../x", "a/b", "Deployer", "", "x_y", &"a".repeat(254)] {
            let mut s = spec();
            s.workspace_template = Some(crate::stack::WorkspaceTemplate {
                metadata: None,
                spec: Some(crate::workspace::WorkspaceSpec {
                    service_account_name: Some(bad.to_string()),
                    ..Default::default()
                }),
            });
            let e = validate_stack_spec(&s, "ns").unwrap_err();
            assert_eq!(e.0[0].field, "spec.workspaceTemplate.spec.serviceAccountName", "{bad:?}");
        }
        assert_eq!(service_account_name_error("pulumi.deployer-1"), None);
    }

    #[test]
    fn env_and_fs_refs_are_refused_naming_the_field() {
        let mut s = spec();
        let env = ResourceRef {
            selector_type: ResourceSelectorType::Env,
            env: Some(EnvSelector { name: "HOME".into() }),
            filesystem: None,
            secret: None,
            literal: None,
        };
        s.env_refs = Some(BTreeMap::from([("TOKEN".to_string(), env)]));
        let err = validate_stack_spec(&s, "ns").unwrap_err();
        assert_eq!(err.0.len(), 1);
        assert_eq!(err.0[0].field, "spec.envRefs.TOKEN");
        assert!(err.0[0].message.starts_with(r#"ref type "Env" is deprecated"#), "PKO's text first: {err}");
        // a type PKO's schema admits (a Go string) but nobody knows: Stalled SpecInvalid naming it
        let mut s = spec();
        let odd =
            ResourceRef { selector_type: "ConfigMap".into(), env: None, filesystem: None, secret: None, literal: None };
        s.env_refs = Some(BTreeMap::from([("TOKEN".to_string(), odd)]));
        let err = validate_stack_spec(&s, "ns").unwrap_err();
        assert_eq!(
            (err.0[0].field.as_str(), err.0[0].message.as_str()),
            ("spec.envRefs.TOKEN", r#"unsupported resource reference type "ConfigMap"; use Secret or Literal"#)
        );
    }

    #[test]
    fn cross_namespace_secret_is_refused() {
        let mut s = spec();
        s.git_auth = Some(GitAuthConfig {
            access_token: Some(ResourceRef {
                selector_type: ResourceSelectorType::Secret,
                secret: Some(SecretSelector {
                    namespace: Some("other".into()),
                    name: "git".into(),
                    key: "token".into(),
                }),
                env: None,
                filesystem: None,
                literal: None,
            }),
            ..Default::default()
        });
        let err = validate_stack_spec(&s, "mine").unwrap_err();
        assert_eq!(err.0[0].field, "spec.gitAuth.accessToken");
        assert!(err.to_string().contains("cross-namespace refs are not allowed"), "{err}");
    }

    #[test]
    fn selector_must_match_type() {
        let mut s = spec();
        let bad = ResourceRef {
            selector_type: ResourceSelectorType::Secret,
            env: None,
            filesystem: None,
            secret: None,
            literal: None,
        };
        s.secrets_ref = Some(BTreeMap::from([("k".to_string(), bad)]));
        let err = validate_stack_spec(&s, "ns").unwrap_err();
        assert_eq!(err.0[0].field, "spec.secretsRef.k");
    }

    #[test]
    fn template_metadata_the_api_server_would_refuse_is_invalid() {
        use crate::shared::EmbeddedObjectMeta;
        use crate::stack::{UpdateTemplate, WorkspaceTemplate};
        let meta = |labels: &[(&str, &str)], annotations: &[(&str, &str)]| EmbeddedObjectMeta {
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            annotations: Some(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        };
        let mut s = spec();
        s.update_template = Some(UpdateTemplate {
            metadata: Some(meta(
                &[("team", "a"), ("example.com/tier", ""), ("a.b_c-d", "x.y")],
                &[("note", "any text at all")],
            )),
            spec: None,
        });
        assert_eq!(validate_stack_spec(&s, "ns"), Ok(()));
        s.update_template = Some(UpdateTemplate {
            metadata: Some(meta(&[("bad key!", "x"), ("ok", "not a valid value!")], &[])),
            spec: None,
        });
        let err = validate_stack_spec(&s, "ns").unwrap_err();
        assert_eq!(err.0.len(), 2, "{err}");
        assert_eq!(err.0[0].field, r#"spec.updateTemplate.metadata.labels["bad key!"]"#);
        assert!(err.0[1].message.contains("invalid label value"), "{err}");
        s.update_template = None;
        s.workspace_template = Some(WorkspaceTemplate {
            metadata: Some(meta(&[], &[("Upper.Case/x", "v"), ("big", &"x".repeat(300 << 10))])),
            spec: None,
        });
        let err = validate_stack_spec(&s, "ns").unwrap_err();
        assert!(
            err.0.iter().any(|e| e.field == r#"spec.workspaceTemplate.metadata.annotations["Upper.Case/x"]"#),
            "{err}"
        );
        assert!(
            err.0
                .iter()
                .any(|e| e.field == "spec.workspaceTemplate.metadata.annotations" && e.message.contains("limit")),
            "{err}"
        );
        assert!(qualified_name_error(&"a".repeat(64)).is_some());
    }
}
