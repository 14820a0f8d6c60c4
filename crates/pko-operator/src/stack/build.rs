//! Pure builders of the Stack controller: the whole Workspace and Update objects a Stack needs
//! (metadata, owner references, templates and spec; PKO `stack_controller.go` steps 2, 6 and 10). No
//! client.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMapEnvSource, EnvFromSource, EnvVar, EnvVarSource, SecretEnvSource, SecretKeySelector,
};
use pko_api::shared::{ResourceRef, ResourceSelectorType};
use pko_api::stack::StackSpec;
use pko_api::workspace::{
    ConfigItem, ConfigValueFrom, FluxSource, GitAuth, GitSource, ProjectInfo, WorkspaceSpec, WorkspaceStack,
};
use pko_api::{UpdateSpec, UpdateType};

/// Where the program of a Stack comes from, resolved to a revision.
#[derive(Debug, Clone, PartialEq)]
pub enum ResolvedSource {
    /// A git repository at a commit.
    Git {
        /// Repository URL.
        url: String,
        /// Commit SHA.
        commit: String,
        /// Credentials as Secret key references ([`git_auth`]).
        auth: Option<Box<GitAuth>>,
    },
    /// A Flux-style artifact (a Program's or a Flux source's).
    Artifact {
        /// Tarball URL.
        url: String,
        /// `sha256:<hex>`.
        digest: String,
        /// Revision string (the Program generation, or the Flux artifact revision).
        revision: String,
        /// Directory in the artifact.
        dir: Option<String>,
    },
    /// No source: destroy from state with a synthesised project.
    ProjectInfo(ProjectInfo),
    /// No source in the Stack: the Workspace template's own (`workspaceTemplate.spec.local`, a
    /// program baked into the image — PKO's `examples/custom-source`), or none at all (PKO's
    /// source-less Workspace, whose pod's init container puts the program in `/share/workspace`); its
    /// revision is empty, as PKO's commit is for a Stack without a source.
    Template,
}

impl ResolvedSource {
    /// The revision recorded as `lastAttemptedCommit`/`lastSuccessfulCommit`.
    pub fn revision(&self) -> String {
        match self {
            ResolvedSource::Git { commit, .. } => commit.clone(),
            ResolvedSource::Artifact { revision, .. } => revision.clone(),
            ResolvedSource::ProjectInfo(p) => format!("project:{}", p.name.clone().unwrap_or_default()),
            ResolvedSource::Template => String::new(),
        }
    }
}

fn secret_key(name: &str, key: &str) -> SecretKeySelector {
    SecretKeySelector { name: name.into(), key: key.into(), optional: None }
}

/// Env var name carrying the value of config `key` behind `prefix` (the agent reads it with
/// `valueFrom.env`): `<prefix>_<key>` with the key's ASCII letters and digits kept as they are and every
/// other byte written `_xx` (hex), so two keys never share a variable (`dbpass` → `…_dbpass`, `dbPass` →
/// `…_dbPass`, `db.pass` → `…_db_2epass`, `db_pass` → `…_db_5fpass`).
pub fn config_env(prefix: &str, key: &str) -> String {
    let mut out = format!("{prefix}_");
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() {
            out.push(b as char);
        } else {
            out.push_str(&format!("_{b:02x}"));
        }
    }
    out
}

/// Prefix of the variables carrying `secretsRef` values ([`config_env`]).
pub const SECRET_CONFIG_ENV_PREFIX: &str = "PKO_SECRET_CONFIG";
/// Prefix of the variables carrying `configRef` values ([`config_env`]).
pub const CONFIGMAP_ENV_PREFIX: &str = "PKO_CONFIGMAP";

fn ref_env(name: &str, r: &ResourceRef) -> Option<EnvVar> {
    match &r.selector_type {
        ResourceSelectorType::Literal => {
            Some(EnvVar { name: name.into(), value: r.literal.as_ref().map(|l| l.value.clone()), value_from: None })
        }
        ResourceSelectorType::Secret => r.secret.as_ref().map(|s| EnvVar {
            name: name.into(),
            value: None,
            value_from: Some(EnvVarSource { secret_key_ref: Some(secret_key(&s.name, &s.key)), ..Default::default() }),
        }),
        // refused by validation before building
        ResourceSelectorType::Env | ResourceSelectorType::Fs | ResourceSelectorType::Unknown(_) => None,
    }
}

fn secret_selector(r: &ResourceRef) -> Option<SecretKeySelector> {
    r.secret.as_ref().map(|s| secret_key(&s.name, &s.key))
}

/// Git credentials of a Stack as Secret key references (the Workspace's `git.auth`): from `gitAuth`, or
/// else from the deprecated `gitAuthSecret`, whose Secret holds the keys `auth_secret_keys` (PKO's
/// precedence: `sshPrivateKey` (+ `password`) > `accessToken` > `username` + `password`). `None`: no
/// credentials. `gitAuth.githubApp` is carried as Secret references too; the operator exchanges it for
/// an installation token for each operation (`update::values`).
pub fn git_auth(spec: &StackSpec, auth_secret_keys: Option<&std::collections::BTreeSet<String>>) -> Option<GitAuth> {
    if let Some(a) = &spec.git_auth {
        return Some(GitAuth {
            ssh_private_key: a.ssh_auth.as_ref().and_then(|s| secret_selector(&s.ssh_private_key)),
            password: a
                .ssh_auth
                .as_ref()
                .and_then(|s| s.password.as_ref())
                .and_then(secret_selector)
                .or_else(|| a.basic_auth.as_ref().and_then(|b| secret_selector(&b.password))),
            token: a.access_token.as_ref().and_then(secret_selector),
            username: a.basic_auth.as_ref().and_then(|b| secret_selector(&b.user_name)),
            github_app: a.github_app.as_ref().map(|g| pko_api::workspace::GitHubAppSecretAuth {
                app_id: secret_selector(&g.app_id),
                installation_id: secret_selector(&g.installation_id),
                private_key: secret_selector(&g.private_key),
            }),
        });
    }
    let (name, keys) = (spec.git_auth_secret.as_ref()?, auth_secret_keys?);
    let sel = |k: &str| keys.contains(k).then(|| secret_key(name, k));
    if keys.contains("sshPrivateKey") {
        Some(GitAuth { ssh_private_key: sel("sshPrivateKey"), password: sel("password"), ..Default::default() })
    } else if keys.contains("accessToken") {
        Some(GitAuth { token: sel("accessToken"), ..Default::default() })
    } else if keys.contains("username") && keys.contains("password") {
        Some(GitAuth { username: sel("username"), password: sel("password"), ..Default::default() })
    } else {
        None
    }
}

/// The Workspace spec of a Stack (before `workspaceTemplate`).
pub fn workspace_spec(spec: &StackSpec, source: &ResolvedSource) -> WorkspaceSpec {
    let mut env: Vec<EnvVar> = Vec::new();
    if let Some(b) = &spec.backend {
        env.push(EnvVar { name: "PULUMI_BACKEND_URL".into(), value: Some(b.clone()), value_from: None });
    }
    if let Some(s) = &spec.access_token_secret {
        env.push(EnvVar {
            name: "PULUMI_ACCESS_TOKEN".into(),
            value: None,
            value_from: Some(EnvVarSource { secret_key_ref: Some(secret_key(s, "accessToken")), ..Default::default() }),
        });
    }
    // envRefs sorted by name (BTreeMap) so the generated spec is stable
    for (name, r) in spec.env_refs.iter().flatten() {
        env.extend(ref_env(name, r));
    }
    let mut env_from: Vec<EnvFromSource> = Vec::new();
    env_from.extend(spec.envs.iter().flatten().map(|n| EnvFromSource {
        config_map_ref: Some(ConfigMapEnvSource { name: n.clone(), optional: None }),
        ..Default::default()
    }));
    env_from.extend(spec.env_secrets.iter().flatten().map(|n| EnvFromSource {
        secret_ref: Some(SecretEnvSource { name: n.clone(), optional: None }),
        ..Default::default()
    }));

    // config: inline (sorted), configRef, secrets, secretsRef (PKO's order)
    let mut config: Vec<ConfigItem> = Vec::new();
    for (k, v) in spec.config.iter().flatten() {
        config.push(ConfigItem { key: k.clone(), value: Some(v.clone()), ..Default::default() });
    }
    for (k, r) in spec.config_ref.iter().flatten() {
        let var = config_env(CONFIGMAP_ENV_PREFIX, k);
        env.push(EnvVar {
            name: var.clone(),
            value: None,
            value_from: Some(EnvVarSource {
                config_map_key_ref: Some(k8s_openapi::api::core::v1::ConfigMapKeySelector {
                    name: r.name.clone(),
                    key: r.key.clone(),
                    optional: None,
                }),
                ..Default::default()
            }),
        });
        config.push(ConfigItem {
            key: k.clone(),
            value_from: Some(ConfigValueFrom { env: Some(var), path: None, json: r.json }),
            ..Default::default()
        });
    }
    for (k, v) in spec.secrets.iter().flatten() {
        config.push(ConfigItem {
            key: k.clone(),
            value: Some(serde_json::Value::String(v.clone())),
            secret: Some(true),
            ..Default::default()
        });
    }
    for (k, r) in spec.secrets_ref.iter().flatten() {
        match r.selector_type {
            ResourceSelectorType::Literal => config.push(ConfigItem {
                key: k.clone(),
                value: r.literal.as_ref().map(|l| serde_json::Value::String(l.value.clone())),
                secret: Some(true),
                ..Default::default()
            }),
            _ => {
                let var = config_env(SECRET_CONFIG_ENV_PREFIX, k);
                env.extend(ref_env(&var, r));
                config.push(ConfigItem {
                    key: k.clone(),
                    value_from: Some(ConfigValueFrom { env: Some(var), path: None, json: None }),
                    secret: Some(true),
                    ..Default::default()
                });
            }
        }
    }

    let mut ws = WorkspaceSpec {
        service_account_name: spec.service_account_name.clone(),
        env: (!env.is_empty()).then_some(env),
        env_from: (!env_from.is_empty()).then_some(env_from),
        stacks: Some(vec![WorkspaceStack {
            name: spec.stack.clone(),
            create: Some(spec.use_local_stack_only != Some(true)),
            secrets_provider: spec.secrets_provider.clone(),
            config: (!config.is_empty()).then_some(config),
            environment: spec.environment.clone(),
        }]),
        ..Default::default()
    };
    match source {
        ResolvedSource::Git { url, commit, auth } => {
            ws.git = Some(GitSource {
                url: Some(url.clone()),
                git_ref: Some(commit.clone()),
                dir: spec.repo_dir.clone(),
                auth: auth.as_deref().cloned(),
                shallow: spec.shallow,
            });
        }
        ResolvedSource::Artifact { url, digest, dir, .. } => {
            ws.flux = Some(FluxSource { url: Some(url.clone()), digest: Some(digest.clone()), dir: dir.clone() })
        }
        ResolvedSource::ProjectInfo(p) => ws.project_info = Some(p.clone()),
        ResolvedSource::Template => {}
    }
    if let Some(t) = spec.workspace_template.as_ref().and_then(|t| t.spec.clone()) {
        merge_workspace(&mut ws, t);
    }
    ws
}

/// Fields set in `template` replace the generated ones; `env` merges by name, `stacks` by name. A
/// source in the template (`git`, `flux`, `local`, `projectInfo`) replaces the generated source as a
/// whole: an agent runs one source, and a Stack destroyed from its cached project info while its
/// template names `local` was refused forever (two sources; PKO #1300, fixed in v2.9.1 by #1327).
fn merge_workspace(ws: &mut WorkspaceSpec, t: WorkspaceSpec) {
    if t.git.is_some() || t.flux.is_some() || t.local.is_some() || t.project_info.is_some() {
        (ws.git, ws.flux, ws.local, ws.project_info) = (None, None, None, None);
    }
    macro_rules! take {
        ($($f:ident),*) => { $( if t.$f.is_some() { ws.$f = t.$f; } )* };
    }
    take!(
        service_account_name,
        security_profile,
        image,
        image_pull_policy,
        git,
        flux,
        local,
        project_info,
        env_from,
        resources,
        pod_template,
        service_template,
        pulumi_log_level,
        skip_install
    );
    if let Some(extra) = t.env {
        let env = ws.env.get_or_insert_with(Vec::new);
        for e in extra {
            env.retain(|x| x.name != e.name);
            env.push(e);
        }
    }
    if let Some(extra) = t.stacks {
        let stacks = ws.stacks.get_or_insert_with(Vec::new);
        for s in extra {
            stacks.retain(|x| x.name != s.name);
            stacks.push(s);
        }
    }
}

/// The Update spec for a sync of `spec` (PKO step 10): destroy when finalizing, preview in preview mode,
/// else up; `ttlAfterCompleted` 24h; `updateTemplate` fields win.
pub fn update_spec(spec: &StackSpec, workspace: &str, deleting: bool, message: &str) -> UpdateSpec {
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
    if let Some(t) = spec.update_template.as_ref().and_then(|t| t.spec.clone()) {
        let v = serde_json::to_value(&t).unwrap_or_default();
        let mut base = serde_json::to_value(&u).unwrap_or_default();
        if let (Some(b), Some(o)) = (base.as_object_mut(), v.as_object()) {
            for (k, v) in o {
                b.insert(k.clone(), v.clone());
            }
        }
        u = serde_json::from_value(base).unwrap_or(u);
    }
    u
}

/// The name of the Update a sync creates: `<stack>-<8 hex digits>` of a hash of what the sync is for
/// (generation, reconcile request, revision, destroy or not) and of the previous Update (its name and
/// failure count). Deterministic: a pass that retries a failed create chooses the same name, so writing
/// it to `currentUpdate` again changes nothing (and wakes no watch); every new sync differs from the
/// last Update, so it never collides with one that still exists.
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

/// An object that cannot be built yet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The owner has no uid (it was not read from the API server), so no owner reference can name it.
    #[error("the {0} has no uid yet")]
    NoUid(&'static str),
}

fn owner_ref<K: kube::Resource<DynamicType = ()>>(
    owner: &K,
    what: &'static str,
) -> Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference, BuildError> {
    owner.controller_owner_ref(&()).ok_or(BuildError::NoUid(what))
}

/// The Workspace of `stack` (named after it, in its namespace): PKO's labels plus
/// `workspaceTemplate.metadata`, the Stack as controlling owner, and [`workspace_spec`].
pub fn workspace(stack: &pko_api::Stack, source: &ResolvedSource) -> Result<pko_api::Workspace, BuildError> {
    use kube::ResourceExt;
    let name = stack.name_any();
    let template = stack.spec.workspace_template.as_ref().and_then(|t| t.metadata.clone()).unwrap_or_default();
    let labels = child_labels(stack, template.labels);
    let metadata = kube::api::ObjectMeta {
        name: Some(name),
        namespace: stack.namespace(),
        labels: Some(labels),
        annotations: template.annotations,
        owner_references: Some(vec![owner_ref(stack, "stack")?]),
        ..Default::default()
    };
    Ok(pko_api::Workspace { metadata, spec: workspace_spec(&stack.spec, source), status: None })
}

/// The Update `name` of `stack` on `workspace`: PKO's labels plus `updateTemplate.metadata`, the
/// Workspace as controlling owner and the Stack as a second owner (blocking its deletion), the Stack
/// finalizer (released once the result is absorbed), and [`update_spec`].
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
    Ok(pko_api::Update { metadata, spec: update_spec(&stack.spec, &stack_name, deleting, reason), status: None })
}

/// Records on `u` what it runs (ours, additive Update fields): the Stack's generation, the generation
/// of `workspace` (as the apply returned it), the source `revision`, and the run digest of `u` on
/// `workspace` ([`crate::agents::request::run_digest`]), after the update template was merged, so no
/// template sets them. A Workspace no request can be built from gets no digest: the dispatch fails
/// the Update naming the field. Pure.
pub fn pin_run(u: &mut pko_api::Update, stack: &pko_api::Stack, workspace: &pko_api::Workspace, revision: &str) {
    use kube::ResourceExt;
    u.spec.stack_generation = stack.metadata.generation;
    u.spec.workspace_generation = workspace.metadata.generation;
    u.spec.revision = Some(revision.to_string()).filter(|r| !r.is_empty());
    u.spec.run_digest =
        crate::agents::request::run_digest(&stack.namespace().unwrap_or_default(), &workspace.spec, &u.spec).ok();
}

/// Time to live of a finished drift check's Update (a schedule every 15 minutes keeps 4, not 96 as
/// with the 24 h of other Updates); `updateTemplate.spec.ttlAfterCompleted` overrides it.
pub const DRIFT_CHECK_TTL: &str = "1h";

/// The Update of a drift check of `stack` (PKO's proposal, #1037): a `refresh` with `previewOnly`
/// (nothing written to the stack's state), message `Drift detection`, the Stack's `targets`, the
/// update template's other settings; annotated when its schedule remediates. Owned as [`update`]'s.
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

/// The labels of an object made for `stack`: PKO's, then the template's, then the Stack's shard and the
/// shard count it was computed for (ours, never overridden by a template: they decide which replica
/// sees the object).
fn child_labels(stack: &pko_api::Stack, template: Option<BTreeMap<String, String>>) -> BTreeMap<String, String> {
    use kube::ResourceExt;
    let mut labels = stack_labels(&stack.name_any());
    labels.extend(template.unwrap_or_default());
    for key in [pko_api::constants::SHARD_LABEL, pko_api::constants::SHARDS_LABEL] {
        labels.remove(key);
        if let Some(value) = stack.labels().get(key) {
            labels.insert(key.into(), value.clone());
        }
    }
    labels
}

/// Labels PKO puts on objects generated for a Stack.
pub fn stack_labels(stack: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (pko_api::constants::STACK_COMPONENT_LABEL.to_string(), "stack".to_string()),
        (pko_api::constants::STACK_NAME_LABEL.to_string(), stack.to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> StackSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_drift_check_is_a_preview_only_refresh_with_a_short_ttl() {
        let mut stack = pko_api::Stack::new(
            "web",
            spec(
                json!({"stack": "dev", "refresh": true, "targets": ["urn:a"], "updateTemplate": {"spec": {"parallel": 3}}}),
            ),
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
    fn workspace_carries_env_config_and_git_source() {
        let s = spec(json!({
            "stack": "dev", "backend": "file:///s", "accessTokenSecret": "tok", "envs": ["cm"], "envSecrets": ["sec"],
            "envRefs": {"B": {"type": "Literal", "literal": {"value": "1"}}, "A": {"type": "Secret", "secret": {"name": "s", "key": "k"}}},
            "config": {"z": "last", "a": {"n": 1}}, "configRef": {"fromCm": {"name": "cfg", "key": "v", "json": true}},
            "secrets": {"legacy": "x"}, "secretsRef": {"pw": {"type": "Secret", "secret": {"name": "db", "key": "pw"}}, "lit": {"type": "Literal", "literal": {"value": "v"}}},
            "secretsProvider": "passphrase", "useLocalStackOnly": true, "repoDir": "app", "shallow": true, "serviceAccountName": "runner",
            "gitAuth": {"accessToken": {"type": "Secret", "secret": {"name": "git", "key": "token"}}},
            "workspaceTemplate": {"spec": {"image": "custom", "env": [{"name": "B", "value": "override"}], "skipInstall": true, "pulumiLogLevel": 3}}
        }));
        let ws = workspace_spec(
            &s,
            &ResolvedSource::Git {
                url: "https://g/r.git".into(),
                commit: "abc".into(),
                auth: git_auth(&s, None).map(Box::new),
            },
        );
        let env: Vec<_> = ws.env.as_ref().unwrap().iter().map(|e| e.name.clone()).collect();
        assert_eq!(&env[..4], &["PULUMI_BACKEND_URL", "PULUMI_ACCESS_TOKEN", "A", "PKO_CONFIGMAP_fromCm"], "{env:?}");
        assert_eq!(
            ws.env.as_ref().unwrap().iter().find(|e| e.name == "B").unwrap().value.as_deref(),
            Some("override"),
            "template env wins"
        );
        assert_eq!(ws.env_from.as_ref().unwrap().len(), 2);
        assert_eq!(ws.image.as_deref(), Some("custom"));
        assert_eq!(
            (ws.skip_install, ws.pulumi_log_level),
            (Some(true), Some(3)),
            "every template field reaches the Workspace"
        );
        assert_eq!(ws.service_account_name.as_deref(), Some("runner"));
        let st = &ws.stacks.as_ref().unwrap()[0];
        assert_eq!(
            (st.name.as_str(), st.create, st.secrets_provider.as_deref()),
            ("dev", Some(false), Some("passphrase"))
        );
        let keys: Vec<_> =
            st.config.as_ref().unwrap().iter().map(|c| (c.key.clone(), c.secret.unwrap_or(false))).collect();
        assert_eq!(
            keys,
            vec![
                ("a".into(), false),
                ("z".into(), false),
                ("fromCm".into(), false),
                ("legacy".into(), true),
                ("lit".into(), true),
                ("pw".into(), true)
            ]
        );
        let pw = st.config.as_ref().unwrap().iter().find(|c| c.key == "pw").unwrap();
        assert_eq!(pw.value_from.as_ref().unwrap().env.as_deref(), Some("PKO_SECRET_CONFIG_pw"));
        assert!(
            ws.env.as_ref().unwrap().iter().any(|e| e.name == "PKO_SECRET_CONFIG_pw" && e.value_from.is_some()),
            "the secret value stays in the Secret"
        );
        let git = ws.git.unwrap();
        assert_eq!(
            (git.url.as_deref(), git.git_ref.as_deref(), git.dir.as_deref(), git.shallow),
            (Some("https://g/r.git"), Some("abc"), Some("app"), Some(true))
        );
        assert_eq!(git.auth.unwrap().token.unwrap().name, "git");
    }

    #[test]
    fn whole_objects_carry_labels_templates_and_owners() {
        let mut stack: pko_api::Stack = serde_json::from_value(json!({
            "apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "web", "namespace": "team", "labels": {"pulumi.com/shard": "17", "pulumi.com/shards": "64"}},
            "spec": {"stack": "dev", "workspaceTemplate": {"metadata": {"labels": {"tier": "a", "pulumi.com/shard": "3", "pulumi.com/shards": "8"}, "annotations": {"n": "1"}}},
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
    fn config_variables_never_collide() {
        let keys = ["dbpass", "dbPass", "DBPASS", "db.pass", "db_pass", "db-pass", "db_2epass", "aws:region", "ünï"];
        let vars: std::collections::BTreeSet<String> =
            keys.iter().map(|k| config_env(SECRET_CONFIG_ENV_PREFIX, k)).collect();
        assert_eq!(vars.len(), keys.len(), "{vars:?}");
        assert_eq!(config_env(SECRET_CONFIG_ENV_PREFIX, "db.pass"), "PKO_SECRET_CONFIG_db_2epass");
        assert!(
            vars.iter().all(|v| v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')),
            "valid variable names: {vars:?}"
        );
        let s = spec(json!({"stack": "dev", "secretsRef": {
            "dbpass": {"type": "Secret", "secret": {"name": "s", "key": "a"}},
            "dbPass": {"type": "Secret", "secret": {"name": "s", "key": "b"}}}}));
        let ws = workspace_spec(&s, &ResolvedSource::ProjectInfo(ProjectInfo::default()));
        let env: Vec<_> =
            ws.env.unwrap().into_iter().map(|e| (e.name, e.value_from.unwrap().secret_key_ref.unwrap().key)).collect();
        assert_eq!(
            env,
            vec![
                ("PKO_SECRET_CONFIG_dbPass".to_string(), "b".to_string()),
                ("PKO_SECRET_CONFIG_dbpass".to_string(), "a".to_string())
            ]
        );
    }

    #[test]
    fn artifact_and_project_sources() {
        let s = spec(json!({"stack": "dev"}));
        let ws = workspace_spec(
            &s,
            &ResolvedSource::Artifact {
                url: "http://a".into(),
                digest: "sha256:0".into(),
                revision: "3".into(),
                dir: Some("d".into()),
            },
        );
        assert_eq!(ws.flux.unwrap().dir.as_deref(), Some("d"));
        let ws = workspace_spec(
            &s,
            &ResolvedSource::ProjectInfo(ProjectInfo { name: Some("p".into()), runtime: Some("yaml".into()) }),
        );
        assert!(ws.project_info.is_some() && ws.git.is_none());
    }

    #[test]
    fn a_stack_without_a_source_runs_on_its_templates_own() {
        let none = workspace_spec(
            &spec(json!({"stack": "dev", "workspaceTemplate": {"spec": {"image": "mine"}}})),
            &ResolvedSource::Template,
        );
        assert!(!none.has_source(), "PKO's source-less Workspace: its pod's init container brings the program");
        let s = spec(json!({"stack": "dev", "workspaceTemplate": {"spec": {"local": {"dir": "/share/program"}}}}));
        let ws = workspace_spec(&s, &ResolvedSource::Template);
        assert_eq!(ws.local.and_then(|l| l.dir).as_deref(), Some("/share/program"));
        assert!(ws.git.is_none() && ws.flux.is_none() && ws.project_info.is_none());
        assert_eq!(ResolvedSource::Template.revision(), "", "PKO's commit of a Stack without a source");
        // destroyed from its cached project info (the source may be gone): the template's local source
        // still replaces it — one source, which the agent accepts (PKO #1300/#1327)
        let ws = workspace_spec(
            &s,
            &ResolvedSource::ProjectInfo(ProjectInfo { name: Some("p".into()), runtime: Some("yaml".into()) }),
        );
        assert!(ws.local.is_some() && ws.project_info.is_none(), "{ws:?}");
    }

    #[test]
    fn update_kind_options_and_template() {
        let s = spec(
            json!({"stack": "dev", "targets": ["urn:a"], "refresh": true, "runProgram": true, "updateTemplate": {"spec": {"ttlAfterCompleted": "1h", "parallel": 2}}}),
        );
        let up = update_spec(&s, "ws", false, "Initial stack update");
        assert_eq!(
            (up.update_type, up.ttl_after_completed.as_deref(), up.parallel, up.refresh),
            (Some(UpdateType::Up), Some("1h"), Some(2), Some(true))
        );
        assert_eq!(up.target, Some(vec!["urn:a".to_string()]));
        let d = update_spec(&s, "ws", true, "Stack marked for deletion");
        assert_eq!((d.update_type, d.run_program, d.target.clone()), (Some(UpdateType::Destroy), Some(true), None));
        let p = update_spec(&spec(json!({"stack": "dev", "preview": true})), "ws", false, "m");
        assert_eq!(
            (p.update_type, p.ttl_after_completed.as_deref(), p.timeout),
            (Some(UpdateType::Preview), Some("24h"), None)
        );
        let t = update_spec(&spec(json!({"stack": "dev", "operationTimeoutSeconds": 90})), "ws", false, "m");
        assert_eq!(t.timeout.as_deref(), Some("90s"), "the Stack's deadline reaches its Updates");
        let t = update_spec(
            &spec(
                json!({"stack": "dev", "operationTimeoutSeconds": 90, "updateTemplate": {"spec": {"timeout": "1h", "idleTimeout": "5m"}}}),
            ),
            "ws",
            false,
            "m",
        );
        assert_eq!(
            (t.timeout.as_deref(), t.idle_timeout.as_deref()),
            (Some("1h"), Some("5m")),
            "the update template wins"
        );
    }

    #[test]
    fn git_auth_secret_follows_pko_precedence() {
        let s = spec(json!({"stack": "dev", "gitAuthSecret": "creds"}));
        let keys = |k: &[&str]| k.iter().map(|x| x.to_string()).collect::<std::collections::BTreeSet<_>>();
        let ssh = git_auth(&s, Some(&keys(&["sshPrivateKey", "password", "accessToken"]))).unwrap();
        assert_eq!(
            (ssh.ssh_private_key.unwrap().key, ssh.password.unwrap().key, ssh.token),
            ("sshPrivateKey".into(), "password".into(), None)
        );
        let tok = git_auth(&s, Some(&keys(&["accessToken", "username", "password"]))).unwrap();
        assert_eq!((tok.token.unwrap().name, tok.username), ("creds".into(), None));
        let basic = git_auth(&s, Some(&keys(&["username", "password"]))).unwrap();
        assert_eq!((basic.username.unwrap().key, basic.password.unwrap().key), ("username".into(), "password".into()));
        assert_eq!(git_auth(&s, Some(&keys(&["username"]))), None, "a user name alone is no credential");
        assert_eq!(git_auth(&spec(json!({"stack": "dev"})), None), None);
    }
}
