//! The Workspace of a Stack: its metadata, and its spec from the Stack's source, backend, environment, config and
//! secrets, with `workspaceTemplate` merged ([`super::overlay`]).

use k8s_openapi::api::core::v1::{ConfigMapEnvSource, EnvFromSource, EnvVar, EnvVarSource, SecretEnvSource};
use pko_api::shared::{ResourceRef, ResourceSelectorType};
use pko_api::stack::StackSpec;
use pko_api::workspace::{ConfigItem, ConfigValueFrom, FluxSource, GitSource, WorkspaceSpec, WorkspaceStack};

use super::BuildError;
use super::metadata::{child_labels, owner_ref};
use crate::stack::source::{ResolvedSource, secret_key};

/// Env var name carrying the value of config `key` behind `prefix` (the agent reads it with `valueFrom.env`):
/// `<prefix>_<key>` with the key's ASCII letters and digits kept as they are and every other byte written `_xx` (hex),
/// so two keys never share a variable (`dbpass` → `…_dbpass`, `dbPass` → `…_dbPass`, `db.pass` →
/// `…_db_2epass`, `db_pass` → `…_db_5fpass`).
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

/// The Workspace spec of a Stack, `workspaceTemplate.spec` merged.
///
/// Errors: [`BuildError::Template`].
pub fn workspace_spec(spec: &StackSpec, source: &ResolvedSource) -> Result<WorkspaceSpec, BuildError> {
    let mut env = base_env(spec);
    let config = config_items(spec, &mut env);
    let env_from: Vec<EnvFromSource> = env_from(spec);
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
    set_source(&mut ws, spec, source);
    match spec.workspace_template.as_ref().and_then(|t| t.spec.clone()) {
        Some(t) => merge_workspace(ws, t),
        None => Ok(ws),
    }
}

/// The environment every Stack's Workspace gets: the backend URL, the access token Secret, and the `envRefs` (sorted by
/// name, so the generated spec is stable). Pure.
fn base_env(spec: &StackSpec) -> Vec<EnvVar> {
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
    for (name, r) in spec.env_refs.iter().flatten() {
        env.extend(ref_env(name, r));
    }
    env
}

/// The Workspace's `envFrom`: the Stack's `envs` (ConfigMaps), then its `envSecrets`. Pure.
fn env_from(spec: &StackSpec) -> Vec<EnvFromSource> {
    let maps = spec.envs.iter().flatten().map(|n| EnvFromSource {
        config_map_ref: Some(ConfigMapEnvSource { name: n.clone(), optional: None }),
        ..Default::default()
    });
    let secrets = spec.env_secrets.iter().flatten().map(|n| EnvFromSource {
        secret_ref: Some(SecretEnvSource { name: n.clone(), optional: None }),
        ..Default::default()
    });
    maps.chain(secrets).collect()
}

/// The stack's config items in PKO's order — inline `config` (sorted), `configRef`, `secrets`, `secretsRef` —
/// adding to `env` the variables that carry referenced values ([`config_env`]). Pure.
fn config_items(spec: &StackSpec, env: &mut Vec<EnvVar>) -> Vec<ConfigItem> {
    let mut config: Vec<ConfigItem> = Vec::new();
    for (k, v) in spec.config.iter().flatten() {
        config.push(ConfigItem { key: k.clone(), value: Some(v.clone()), ..Default::default() });
    }
    for (k, r) in spec.config_ref.iter().flatten() {
        let var = config_env(CONFIGMAP_ENV_PREFIX, k);
        let selector = k8s_openapi::api::core::v1::ConfigMapKeySelector {
            name: r.name.clone(),
            key: r.key.clone(),
            optional: None,
        };
        let from = EnvVarSource { config_map_key_ref: Some(selector), ..Default::default() };
        env.push(EnvVar { name: var.clone(), value: None, value_from: Some(from) });
        let value_from = Some(ConfigValueFrom { env: Some(var), path: None, json: r.json });
        config.push(ConfigItem { key: k.clone(), value_from, ..Default::default() });
    }
    for (k, v) in spec.secrets.iter().flatten() {
        let value = Some(serde_json::Value::String(v.clone()));
        config.push(ConfigItem { key: k.clone(), value, secret: Some(true), ..Default::default() });
    }
    for (k, r) in spec.secrets_ref.iter().flatten() {
        config.push(secret_ref_item(k, r, env));
    }
    config
}

/// The config item of `secretsRef` entry `key` → `r`: a literal as a secret value, any other reference through a
/// variable of `env` ([`SECRET_CONFIG_ENV_PREFIX`]). Pure.
fn secret_ref_item(key: &str, r: &ResourceRef, env: &mut Vec<EnvVar>) -> ConfigItem {
    if r.selector_type == ResourceSelectorType::Literal {
        let value = r.literal.as_ref().map(|l| serde_json::Value::String(l.value.clone()));
        return ConfigItem { key: key.to_string(), value, secret: Some(true), ..Default::default() };
    }
    let var = config_env(SECRET_CONFIG_ENV_PREFIX, key);
    env.extend(ref_env(&var, r));
    let value_from = Some(ConfigValueFrom { env: Some(var), path: None, json: None });
    ConfigItem { key: key.to_string(), value_from, secret: Some(true), ..Default::default() }
}

/// `ws`'s source from the resolved `source` (none for a Stack without one: the template's). Pure.
fn set_source(ws: &mut WorkspaceSpec, spec: &StackSpec, source: &ResolvedSource) {
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
}

/// `ws` with `template` merged ([`super::overlay`]): fields it sets replace the generated ones; `env` and `stacks`
/// merge by name. A source in the template (`git`, `flux`, `local`, `projectInfo`) replaces the generated source as a
/// whole: an agent runs one source (PKO #1300, fixed in v2.9.1 by #1327).
///
/// Errors: [`BuildError::Template`].
fn merge_workspace(mut ws: WorkspaceSpec, mut template: WorkspaceSpec) -> Result<WorkspaceSpec, BuildError> {
    let t = &template;
    if t.git.is_some() || t.flux.is_some() || t.local.is_some() || t.project_info.is_some() {
        (ws.git, ws.flux, ws.local, ws.project_info) = (None, None, None, None);
    }
    let (env, stacks) = (template.env.take(), template.stacks.take());
    let mut ws = super::overlay(&ws, &template, "spec.workspaceTemplate.spec")?;
    for e in env.into_iter().flatten() {
        let all = ws.env.get_or_insert_with(Vec::new);
        all.retain(|x| x.name != e.name);
        all.push(e);
    }
    for s in stacks.into_iter().flatten() {
        let all = ws.stacks.get_or_insert_with(Vec::new);
        all.retain(|x| x.name != s.name);
        all.push(s);
    }
    Ok(ws)
}

/// The Workspace of `stack` (named after it, in its namespace): PKO's labels plus `workspaceTemplate.metadata`, the
/// Stack as controlling owner, and [`workspace_spec`].
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
    Ok(pko_api::Workspace { metadata, spec: workspace_spec(&stack.spec, source)?, status: None })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::source::git_auth;
    use pko_api::workspace::ProjectInfo;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> StackSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn workspace_carries_env_config_and_git_source() {
        let s = spec(json!({
            "stack": "dev", "backend": "file:///s", "accessTokenSecret": "tok", "envs": ["cm"], "envSecrets": ["sec"],
            "envRefs": {"B": {"type": "Literal", "literal": {"value": "1"}}, "A": {"type": "Secret",
                "secret": {"name": "s", "key": "k"}}},
            "config": {"z": "last", "a": {"n": 1}}, "configRef": {"fromCm": {"name": "cfg", "key": "v", "json": true}},
            "secrets": {"legacy": "x"}, "secretsRef": {"pw": {"type": "Secret", "secret": {"name": "db", "key": "pw"}},
                "lit": {"type": "Literal", "literal": {"value": "v"}}},
            "secretsProvider": "passphrase", "useLocalStackOnly": true, "repoDir": "app", "shallow": true,
                "serviceAccountName": "runner",
            "gitAuth": {"accessToken": {"type": "Secret", "secret": {"name": "git", "key": "token"}}},
            "workspaceTemplate": {"spec": {"image": "custom", "env": [{"name": "B", "value": "override"}],
                "skipInstall": true, "pulumiLogLevel": 3}}
        }));
        let ws = workspace_spec(
            &s,
            &ResolvedSource::Git {
                url: "https://g/r.git".into(),
                commit: "abc".into(),
                auth: git_auth(&s, None).map(Box::new),
            },
        )
        .unwrap();
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
        let ws = workspace_spec(&s, &ResolvedSource::ProjectInfo(ProjectInfo::default())).unwrap();
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
        )
        .unwrap();
        assert_eq!(ws.flux.unwrap().dir.as_deref(), Some("d"));
        let ws = workspace_spec(
            &s,
            &ResolvedSource::ProjectInfo(ProjectInfo { name: Some("p".into()), runtime: Some("yaml".into()) }),
        )
        .unwrap();
        assert!(ws.project_info.is_some() && ws.git.is_none());
    }

    #[test]
    fn a_stack_without_a_source_runs_on_its_templates_own() {
        let none = workspace_spec(
            &spec(json!({"stack": "dev", "workspaceTemplate": {"spec": {"image": "mine"}}})),
            &ResolvedSource::Template,
        )
        .unwrap();
        assert!(!none.has_source(), "PKO's source-less Workspace: its pod's init container brings the program");
        let s = spec(json!({"stack": "dev", "workspaceTemplate": {"spec": {"local": {"dir": "/share/program"}}}}));
        let ws = workspace_spec(&s, &ResolvedSource::Template).unwrap();
        assert_eq!(ws.local.and_then(|l| l.dir).as_deref(), Some("/share/program"));
        assert!(ws.git.is_none() && ws.flux.is_none() && ws.project_info.is_none());
        assert_eq!(ResolvedSource::Template.revision(), "", "PKO's commit of a Stack without a source");
        // destroyed from its cached project info (the source may be gone): the template's local source
        // still replaces it — one source, which the agent accepts (PKO #1300/#1327)
        let ws = workspace_spec(
            &s,
            &ResolvedSource::ProjectInfo(ProjectInfo { name: Some("p".into()), runtime: Some("yaml".into()) }),
        )
        .unwrap();
        assert!(ws.local.is_some() && ws.project_info.is_none(), "{ws:?}");
    }
}
