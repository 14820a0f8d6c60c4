//! The agent request for an Update: the Workspace says where the program is and how the stack is configured, the Update
//! says which operation with which options. Pure.

use pko_api::workspace::{ConfigItem as WsConfigItem, WorkspaceSpec};
use pko_api::{UpdateSpec, UpdateType};
use pko_proto::v1 as pb;

/// Why a request could not be built (reported on the Update as a failure naming the field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RequestError {
    /// Path of the offending field, e.g. `spec.stacks[dev].config[2]`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> RequestError {
    RequestError { field: field.into(), message: message.into() }
}

fn secret_ref(s: &k8s_openapi::api::core::v1::SecretKeySelector) -> pb::ValueRef {
    pb::ValueRef {
        kind: Some(pb::value_ref::Kind::Secret(pb::KeyRef { name: s.name.clone(), key: s.key.clone() })),
        origin: String::new(),
    }
}

/// The program source of a Workspace: at most one of git, flux, local, projectInfo; `None` for a Workspace without one
/// (PKO's source-less Workspace: the agent runs what an init container of its pod put in `/share/workspace`).
///
/// Errors: two sources or more (field `spec`), a source missing its required field.
pub fn source(ws: &WorkspaceSpec) -> Result<Option<pb::Source>, RequestError> {
    use pb::source::Kind;
    let kinds = [ws.git.is_some(), ws.flux.is_some(), ws.local.is_some(), ws.project_info.is_some()]
        .iter()
        .filter(|b| **b)
        .count();
    match kinds {
        0 => return Ok(None),
        1 => {}
        _ => {
            return Err(err(
                "spec",
                format!("at most one source (git, flux, local, projectInfo) may be set, found {kinds}"),
            ));
        }
    }
    let kind = if let Some(g) = &ws.git {
        let auth = g.auth.as_ref().map(|a| pb::GitAuth {
            ssh_private_key: a.ssh_private_key.as_ref().map(secret_ref),
            ssh_passphrase: a.ssh_private_key.as_ref().and(a.password.as_ref()).map(secret_ref),
            token: a.token.as_ref().map(secret_ref),
            username: a.username.as_ref().map(secret_ref),
            password: a.password.as_ref().map(secret_ref),
            github_app_id: a.github_app.as_ref().and_then(|g| g.app_id.as_ref()).map(secret_ref),
            github_app_installation_id: a.github_app.as_ref().and_then(|g| g.installation_id.as_ref()).map(secret_ref),
            github_app_private_key: a.github_app.as_ref().and_then(|g| g.private_key.as_ref()).map(secret_ref),
        });
        Kind::Git(pb::GitSource {
            url: g.url.clone().ok_or_else(|| err("spec.git.url", "required"))?,
            revision: g.git_ref.clone().unwrap_or_default(),
            dir: g.dir.clone().unwrap_or_default(),
            shallow: g.shallow.unwrap_or(false),
            auth,
        })
    } else if let Some(f) = &ws.flux {
        Kind::Artifact(pb::ArtifactSource {
            url: f.url.clone().ok_or_else(|| err("spec.flux.url", "required"))?,
            // optional, as in PKO: without one the agent downloads unverified
            digest: f.digest.clone().unwrap_or_default(),
            dir: f.dir.clone().unwrap_or_default(),
            mirrors: Vec::new(),
        })
    } else if let Some(l) = &ws.local {
        Kind::Local(pb::LocalSource { dir: l.dir.clone().ok_or_else(|| err("spec.local.dir", "required"))? })
    } else {
        let p = ws.project_info.clone().unwrap_or_default();
        Kind::ProjectInfo(pb::ProjectInfo {
            name: p.name.ok_or_else(|| err("spec.projectInfo.name", "required"))?,
            runtime: p.runtime.ok_or_else(|| err("spec.projectInfo.runtime", "required"))?,
        })
    };
    Ok(Some(pb::Source { kind: Some(kind) }))
}

/// `r`'s Program artifact with this replica's artifact server (`artifact_addr`, host:port) as a mirror when the URL
/// names another address, so an Update dispatched here gets its program while the publishing replica is gone. Only for
/// a URL of the operator's artifact path in `namespace` with a digest, which the agent verifies. Pure.
pub fn mirror_artifact(r: &mut pb::OperationRequest, namespace: &str, artifact_addr: &str) {
    let Some(pb::Source { kind: Some(pb::source::Kind::Artifact(a)) }) = r.source.as_mut() else { return };
    let Ok(uri) = a.url.parse::<http::Uri>() else { return };
    let ours = uri.scheme_str() == Some("http")
        && uri.path().starts_with(&format!("/programs/{namespace}/"))
        && uri.query().is_none();
    let elsewhere = uri.authority().is_some_and(|h| h.as_str() != artifact_addr);
    if ours && elsewhere && !a.digest.is_empty() && !artifact_addr.is_empty() {
        a.mirrors.push(format!("http://{artifact_addr}{}", uri.path()));
    }
}

fn config_item(stack: &str, i: usize, c: &WsConfigItem) -> Result<pb::ConfigItem, RequestError> {
    let field = format!("spec.stacks[{stack}].config[{i}]");
    let value = match (&c.value, &c.value_from) {
        (Some(v), None) => pb::config_item::Value::Literal(pko_proto::json::to_value(v)),
        (None, Some(from)) => {
            let kind = match (&from.env, &from.path) {
                (Some(e), None) => pb::value_ref::Kind::Env(e.clone()),
                (None, Some(p)) => pb::value_ref::Kind::Path(p.clone()),
                _ => return Err(err(format!("{field}.valueFrom"), "exactly one of env or path is required")),
            };
            pb::config_item::Value::ValueFrom(pb::ValueRef { kind: Some(kind), origin: String::new() })
        }
        _ => return Err(err(field, "exactly one of value or valueFrom is required")),
    };
    Ok(pb::ConfigItem {
        key: c.key.clone(),
        path: c.path.unwrap_or(false),
        value: Some(value),
        secret: c.secret.unwrap_or(false),
        json: c.value_from.as_ref().and_then(|f| f.json).unwrap_or(false),
    })
}

/// The values of a Workspace `env[].valueFrom.fieldRef` the operator knows on every runtime (the downward API of PKO's
/// pod): `metadata.namespace` and `spec.serviceAccountName` (else `default`). Any other field path and every
/// `resourceFieldRef` are read from the agent pod's environment ([`pb::value_ref::Kind::Env`] of the same name); an
/// agent outside a pod (`--runtime local`) fails the Update naming the variable.
fn downward(
    ws: &WorkspaceSpec,
    namespace: &str,
    var: &str,
    from: &k8s_openapi::api::core::v1::EnvVarSource,
) -> pb::value_ref::Kind {
    match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
        Some("metadata.namespace") => pb::value_ref::Kind::Literal(namespace.into()),
        Some("spec.serviceAccountName") => {
            pb::value_ref::Kind::Literal(ws.service_account_name.clone().unwrap_or_else(|| "default".into()))
        }
        _ => pb::value_ref::Kind::Env(var.into()),
    }
}

/// Environment of the Pulumi process from the Workspace's `env` in `namespace`: literals, Secret and ConfigMap key
/// references (resolved by the operator, [`super::values`]), and the downward API (`fieldRef`, `resourceFieldRef`, see
/// [`downward`]). The Workspace's `envFrom` is expanded at dispatch ([`super::values::expand_env_from`]), under these.
///
/// Errors: a variable with both `value` and `valueFrom`, or a `valueFrom` naming not exactly one source.
pub fn env(ws: &WorkspaceSpec, namespace: &str) -> Result<Vec<pb::EnvVar>, RequestError> {
    let mut out = Vec::new();
    for e in ws.env.iter().flatten() {
        let field = format!("spec.env[{}]", e.name);
        let value = match (&e.value, &e.value_from) {
            (Some(v), None) => pb::value_ref::Kind::Literal(v.clone()),
            (None, Some(from)) => {
                match (&from.secret_key_ref, &from.config_map_key_ref, &from.field_ref, &from.resource_field_ref) {
                    (Some(s), None, None, None) => {
                        pb::value_ref::Kind::Secret(pb::KeyRef { name: s.name.clone(), key: s.key.clone() })
                    }
                    (None, Some(c), None, None) => {
                        pb::value_ref::Kind::ConfigMap(pb::KeyRef { name: c.name.clone(), key: c.key.clone() })
                    }
                    (None, None, Some(_), None) | (None, None, None, Some(_)) => downward(ws, namespace, &e.name, from),
                    _ => {
                        return Err(err(
                            format!("{field}.valueFrom"),
                            "exactly one of secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef is required",
                        ));
                    }
                }
            }
            (None, None) => pb::value_ref::Kind::Literal(String::new()),
            (Some(_), Some(_)) => return Err(err(field, "value and valueFrom are exclusive")),
        };
        let secret = matches!(value, pb::value_ref::Kind::Secret(_));
        out.push(pb::EnvVar {
            name: e.name.clone(),
            value: Some(pb::ValueRef { kind: Some(value), origin: String::new() }),
            secret,
        });
    }
    Ok(out)
}

/// The agent request for `update` (id `operation_id`, fencing `epoch`) against `workspace` in `namespace` (the Update's
/// and the Workspace's).
///
/// Errors: a missing or unknown `spec.type`/`spec.stackName`, a Workspace field the request cannot carry
/// ([`RequestError`] names it).
pub fn build(
    operation_id: &str,
    epoch: i64,
    namespace: &str,
    workspace: &WorkspaceSpec,
    update: &UpdateSpec,
) -> Result<pb::OperationRequest, RequestError> {
    let stack_name =
        update.stack_name.clone().filter(|s| !s.is_empty()).ok_or_else(|| err("spec.stackName", "required"))?;
    let kind = match update.update_type.as_ref().ok_or_else(|| err("spec.type", "required"))? {
        UpdateType::Preview => pb::OperationType::Preview,
        UpdateType::Up => pb::OperationType::Up,
        UpdateType::Refresh => pb::OperationType::Refresh,
        UpdateType::Destroy => pb::OperationType::Destroy,
        UpdateType::Unknown(t) => {
            return Err(err("spec.type", format!("unsupported update type {t:?}; one of {}", UpdateType::expected())));
        }
    };
    let save_plan = update.save_plan.unwrap_or(false);
    if save_plan && kind != pb::OperationType::Preview {
        return Err(err("spec.savePlan", "only a preview saves a plan"));
    }
    let plan_id = update.plan.clone().unwrap_or_default();
    if !plan_id.is_empty() && (kind != pb::OperationType::Up || !pko_proto::plan::is_id(&plan_id)) {
        let why = format!("an up runs with a saved plan named by its id (16 lowercase hex digits), not {plan_id:?}");
        return Err(err("spec.plan", why));
    }
    let mut r = on_workspace(operation_id, epoch, namespace, workspace, stack_name, kind)?;
    r.options = Some(pb::OperationOptions {
        parallel: update.parallel.unwrap_or(0),
        message: update.message.clone().unwrap_or_default(),
        expect_no_changes: update.expect_no_changes.unwrap_or(false),
        replace: update.replace.clone().unwrap_or_default(),
        target: update.target.clone().unwrap_or_default(),
        target_dependents: update.target_dependents.unwrap_or(false),
        refresh: update.refresh.unwrap_or(false),
        continue_on_error: update.continue_on_error.unwrap_or(false),
        remove: update.remove.unwrap_or(false),
        run_program: update.run_program.unwrap_or(false),
        preview_only: update.preview_only.unwrap_or(false),
        save_plan,
        plan_id,
        // the plan's bytes come from the plan store at dispatch (`update::plans::attach`)
        plan: Vec::new(),
    });
    Ok(r)
}

/// The backend lock holders an Update's `pulumi.com/release-locks` annotation (`annotation`, written by the Stack
/// controller on an accepted unlock request) lets its agent release (`OperationRequest.release_locks`); none without
/// it. Pure.
pub fn release_locks(annotation: Option<&str>) -> Vec<pb::LockHolder> {
    pko_proto::locks::holders(annotation.unwrap_or_default())
        .into_iter()
        .map(|h| pb::LockHolder { who: h.who, pid: h.pid })
        .collect()
}

/// The request initializing stack `stack_name` of `workspace` in `namespace` (PKO's workspace initialization: source,
/// `pulumi install`, select or create, config and environments; no Pulumi operation), with id `operation_id` at epoch 0
/// (it changes nothing a fence guards).
///
/// Errors: as [`build`]'s for the Workspace's fields.
pub fn initialization(
    operation_id: &str,
    namespace: &str,
    workspace: &WorkspaceSpec,
    stack_name: &str,
) -> Result<pb::OperationRequest, RequestError> {
    on_workspace(operation_id, 0, namespace, workspace, stack_name.to_string(), pb::OperationType::Initialize)
}

/// What every request for stack `stack_name` of `workspace` carries: its source, the stack's settings and config, the
/// environment. Pure.
fn on_workspace(
    operation_id: &str,
    epoch: i64,
    namespace: &str,
    workspace: &WorkspaceSpec,
    stack_name: String,
    kind: pb::OperationType,
) -> Result<pb::OperationRequest, RequestError> {
    let ws_stack = workspace.stacks.iter().flatten().find(|s| s.name == stack_name);
    let config = match ws_stack {
        Some(s) => s
            .config
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, c)| config_item(&s.name, i, c))
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    Ok(pb::OperationRequest {
        operation_id: operation_id.into(),
        epoch,
        source: source(workspace)?,
        stack: Some(pb::StackSettings {
            name: stack_name,
            // PKO's Update controller selects with create=true; a Workspace stack may say otherwise.
            create: ws_stack.and_then(|s| s.create).unwrap_or(true),
            secrets_provider: ws_stack.and_then(|s| s.secrets_provider.clone()).unwrap_or_default(),
            environments: ws_stack.and_then(|s| s.environment.clone()).unwrap_or_default(),
        }),
        config,
        env: env(workspace, namespace)?,
        r#type: kind as i32,
        options: None,
        skip_install: workspace.skip_install.unwrap_or(false),
        release_locks: Vec::new(),
        // set by the dispatcher right before `Run` (`dispatch::Hooks::not_after`)
        not_after: None,
        // set by the dispatcher from the Update (`spec.runDigest`)
        run_digest: String::new(),
        env_from: env_from_names(workspace),
    })
}

/// The Workspace's `envFrom` sources as the run digest names them (`OperationRequest.env_from`): `secret:<name>` or
/// `configmap:<name>`, then `?prefix=<p>` and `&optional` when set; an entry that names neither or both kinds as
/// `invalid` (the dispatch refuses it, naming the field). Pure.
pub fn env_from_names(workspace: &WorkspaceSpec) -> Vec<String> {
    workspace
        .env_from
        .iter()
        .flatten()
        .map(|e| {
            let (kind, name, optional) = match (&e.config_map_ref, &e.secret_ref) {
                (Some(c), None) => ("configmap", c.name.as_str(), c.optional.unwrap_or(false)),
                (None, Some(s)) => ("secret", s.name.as_str(), s.optional.unwrap_or(false)),
                _ => ("invalid", "", false),
            };
            let prefix = e.prefix.as_deref().unwrap_or_default();
            format!("{kind}:{name}?prefix={prefix}{}", if optional { "&optional" } else { "" })
        })
        .collect()
}

/// The run digest of `update` on `workspace` in `namespace` (`pko_proto::digest::run_digest` of the request [`build`]
/// makes, before any value is resolved): what the Stack controller writes as the Update's `spec.runDigest` and the
/// dispatcher checks the Workspace it read against. Pure.
///
/// Errors: as [`build`]'s.
pub fn run_digest(namespace: &str, workspace: &WorkspaceSpec, update: &UpdateSpec) -> Result<String, RequestError> {
    build("", 0, namespace, workspace, update).map(|r| pko_proto::digest::run_digest(&r))
}

/// Why a request could not be completed with its values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Incomplete {
    /// The user's to fix (a missing Secret or key, a refused GitHub App): the operation fails with it.
    #[error("{0}")]
    User(String),
    /// The API server or GitHub did not answer: tried again later.
    #[error("{0}")]
    Transient(String),
}

/// `r` with its Secret and ConfigMap references and the Workspace's `envFrom` (`env_from`) resolved with the operator's
/// identity in `namespace` (a workspace's service account needs no RBAC beyond PKO's; Secrets through `secrets`, read
/// only when changed), and GitHub App credentials exchanged at `github_api_url`.
///
/// Errors: [`Incomplete`], the user's to fix or transient.
pub async fn complete(
    client: &kube::Client,
    secrets: &crate::secret_cache::SecretCache,
    namespace: &str,
    env_from: &[k8s_openapi::api::core::v1::EnvFromSource],
    github_api_url: &str,
    mut r: pb::OperationRequest,
) -> Result<pb::OperationRequest, Incomplete> {
    let sort = |transient: bool, e: &dyn std::fmt::Display| {
        if transient { Incomplete::Transient(e.to_string()) } else { Incomplete::User(e.to_string()) }
    };
    super::values::resolve(client, secrets, namespace, &mut r).await.map_err(|e| sort(e.is_transient(), &e))?;
    let skipped = super::values::expand_env_from(client, secrets, namespace, env_from, &mut r)
        .await
        .map_err(|e| sort(e.is_transient(), &e))?;
    if !skipped.is_empty() {
        tracing::info!(?skipped, "envFrom keys skipped: not environment variable names (as the kubelet does)");
    }
    super::values::exchange_github_app(&mut r, github_api_url).await.map_err(|e| sort(e.is_transient(), &e))?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ws(v: serde_json::Value) -> WorkspaceSpec {
        serde_json::from_value(v).unwrap()
    }

    fn upd(v: serde_json::Value) -> UpdateSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_program_artifact_of_another_replica_gets_this_replica_as_mirror() {
        let with = |url: &str, digest: Option<&str>, ns: &str, addr: &str| {
            let mut flux = json!({"url": url});
            if let Some(d) = digest {
                flux["digest"] = json!(d);
            }
            let mut r = initialization("id", ns, &ws(json!({"flux": flux})), "dev").unwrap();
            mirror_artifact(&mut r, ns, addr);
            let Some(pb::source::Kind::Artifact(a)) = r.source.unwrap().kind else { panic!() };
            a.mirrors
        };
        let url = "http://10.0.0.2:9090/programs/ns/p/3/ab12.tar.gz";
        assert_eq!(
            with(url, Some("sha256:ab12"), "ns", "10.0.0.1:9090"),
            ["http://10.0.0.1:9090/programs/ns/p/3/ab12.tar.gz"]
        );
        assert!(
            with(url, Some("sha256:ab12"), "ns", "10.0.0.2:9090").is_empty(),
            "its own URL (or the Service every replica advertises)"
        );
        assert!(
            with(url, None, "ns", "10.0.0.1:9090").is_empty(),
            "no digest: nothing would verify the mirror's bytes"
        );
        assert!(with(url, Some("sha256:ab12"), "other", "10.0.0.1:9090").is_empty(), "another namespace's Program");
        assert!(
            with("https://flux/artifacts/x.tgz", Some("sha256:ab12"), "ns", "10.0.0.1:9090").is_empty(),
            "a Flux source's artifact"
        );
        assert!(
            with("http://h/programs/ns/p/3/ab12.tar.gz?t=1", Some("sha256:ab12"), "ns", "10.0.0.1:9090").is_empty(),
            "not the operator's URL"
        );
        let mut git = initialization("id", "ns", &ws(json!({"git": {"url": "https://g/r.git"}})), "dev").unwrap();
        mirror_artifact(&mut git, "ns", "10.0.0.1:9090");
        assert!(matches!(git.source.unwrap().kind, Some(pb::source::Kind::Git(_))));
    }

    #[test]
    fn release_locks_come_only_from_the_annotation() {
        assert!(release_locks(None).is_empty());
        assert!(release_locks(Some("not a holder")).is_empty());
        let two =
            "lock: created by root@pko-pool-a-3 (pid 17) at 2026-11-26T09:00:00Z\nlock: created by ci@x@h (pid 4)";
        assert_eq!(
            release_locks(Some(two)),
            vec![
                pb::LockHolder { who: "root@pko-pool-a-3".into(), pid: 17 },
                pb::LockHolder { who: "ci@x@h".into(), pid: 4 }
            ]
        );
    }

    #[test]
    fn builds_a_git_up_with_config_env_and_options() {
        let w = ws(json!({
            "git": {"url": "https://g/r.git", "ref": "abc", "dir": "app", "shallow": true,
                "auth": {"token": {"name": "git", "key": "t"}}},
            "env": [{"name": "PULUMI_BACKEND_URL", "value": "file:///s"}, {"name": "PULUMI_CONFIG_PASSPHRASE",
                "valueFrom": {"secretKeyRef": {"name": "p", "key": "k"}}}],
            "stacks": [{"name": "dev", "create": true, "secretsProvider": "passphrase", "environment": ["team/base",
                "team/prod"], "config": [
                {"key": "a", "value": "x"}, {"key": "b", "value": {"n": 1}, "secret": true}, {"key": "c",
                    "valueFrom": {"path": "/f", "json": true}}
            ]}]
        }));
        let u = upd(json!({"workspaceName": "w", "stackName": "dev", "type": "up", "parallel": 3, "target": ["urn:a"],
                "refresh": true}));
        let r = build("ns/u1/uid", 7, "ns", &w, &u).unwrap();
        assert_eq!((r.operation_id.as_str(), r.epoch, r.r#type), ("ns/u1/uid", 7, pb::OperationType::Up as i32));
        let Some(pb::source::Kind::Git(g)) = r.source.unwrap().kind else { panic!() };
        assert_eq!(
            (g.url.as_str(), g.revision.as_str(), g.dir.as_str(), g.shallow),
            ("https://g/r.git", "abc", "app", true)
        );
        assert!(g.auth.unwrap().token.is_some());
        assert_eq!(r.stack.as_ref().unwrap().secrets_provider, "passphrase");
        assert_eq!(
            r.stack.as_ref().unwrap().environments,
            vec!["team/base", "team/prod"],
            "PKO's spec.environment, in order"
        );
        assert_eq!(r.config.len(), 3);
        assert!(r.config[1].secret && r.config[2].json);
        assert_eq!(r.env.len(), 2);
        assert!(r.env[1].secret, "secret env values are masked by the agent");
        let o = r.options.unwrap();
        assert_eq!((o.parallel, o.refresh, o.target.len()), (3, true, 1));
    }

    #[test]
    fn flux_local_and_project_info_sources() {
        let f = source(&ws(json!({"flux": {"url": "http://a/x.tgz", "digest": "sha256:00", "dir": "d"}})))
            .unwrap()
            .unwrap();
        assert!(matches!(f.kind, Some(pb::source::Kind::Artifact(ref a)) if a.dir == "d"));
        let f = source(&ws(json!({"flux": {"url": "http://a/x.tgz"}}))).unwrap().unwrap();
        assert!(
            matches!(f.kind, Some(pb::source::Kind::Artifact(ref a)) if a.digest.is_empty()),
            "a digest is optional (PKO)"
        );
        assert!(matches!(
            source(&ws(json!({"local": {"dir": "/p"}}))).unwrap().unwrap().kind,
            Some(pb::source::Kind::Local(_))
        ));
        assert!(matches!(
            source(&ws(json!({"projectInfo": {"name": "p", "runtime": "yaml"}}))).unwrap().unwrap().kind,
            Some(pb::source::Kind::ProjectInfo(_))
        ));
    }

    #[test]
    fn the_downward_api_is_what_the_workspace_pod_would_see() {
        let w = ws(json!({"local": {"dir": "/p"}, "serviceAccountName": "deployer", "env": [
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}}
        ]}));
        let kinds: Vec<_> = env(&w, "team-a")
            .unwrap()
            .into_iter()
            .map(|e| (e.name, e.value.unwrap().kind.unwrap(), e.secret))
            .collect();
        use pb::value_ref::Kind::{Env, Literal};
        assert_eq!(
            kinds,
            [
                ("NS".into(), Literal("team-a".into()), false),
                ("SA".into(), Literal("deployer".into()), false),
                ("POD_IP".into(), Env("POD_IP".into()), false),
                ("MEM".into(), Env("MEM".into()), false),
            ]
        );
        let default_sa = ws(json!({"local": {"dir": "/p"}, "env": [{"name": "SA",
                "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}}]}));
        assert_eq!(env(&default_sa, "n").unwrap()[0].value.as_ref().unwrap().kind, Some(Literal("default".into())));
    }

    #[test]
    fn bad_specs_name_the_field() {
        assert_eq!(
            source(&ws(json!({}))).unwrap(),
            None,
            "PKO's source-less Workspace: the pod's init container brings the program"
        );
        assert_eq!(
            source(&ws(json!({"local": {"dir": "/p"}, "projectInfo": {"name": "p", "runtime": "yaml"}})))
                .unwrap_err()
                .field,
            "spec"
        );
        assert_eq!(source(&ws(json!({"git": {"ref": "x"}}))).unwrap_err().field, "spec.git.url");
        let w = ws(json!({"local": {"dir": "/p"}, "stacks": [{"name": "dev", "config": [{"key": "a"}]}]}));
        assert_eq!(
            build("o", 1, "ns", &w, &upd(json!({"stackName": "dev", "type": "up"}))).unwrap_err().field,
            "spec.stacks[dev].config[0]"
        );
        assert_eq!(build("o", 1, "ns", &w, &upd(json!({"type": "up"}))).unwrap_err().field, "spec.stackName");
        let w = ws(json!({"local": {"dir": "/p"}, "env": [{"name": "X", "valueFrom": {}}]}));
        assert_eq!(
            build("o", 1, "ns", &w, &upd(json!({"stackName": "dev", "type": "up"}))).unwrap_err().field,
            "spec.env[X].valueFrom"
        );
        // PKO admits any type (a Go string); the Update fails naming it and the types there are
        let w = ws(json!({"local": {"dir": "/p"}}));
        let e = build("o", 1, "ns", &w, &upd(json!({"stackName": "dev", "type": "deploy"}))).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"spec.type: unsupported update type "deploy"; one of "preview", "up", "destroy" or "refresh""#
        );
    }
}
