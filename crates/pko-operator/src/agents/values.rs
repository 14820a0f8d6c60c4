//! The Secret and ConfigMap references of an operation, resolved by the operator.
//!
//! PKO puts a workspace's Secret and ConfigMap values into its pod through the kubelet (`secretKeyRef`, `envFrom`,
//! volumes), so a workspace service account needs nothing but `system:auth-delegator`. Ours runs operations on agents
//! that outlive one Stack (pools) and takes config and secret changes without a pod rollout (PKO #965), so values
//! cannot be baked into a pod. To need exactly PKO's RBAC, the operator reads every Secret and ConfigMap a request
//! refers to (`envRefs`, `secretsRef`, `accessTokenSecret`, git credentials, Workspace `env[].valueFrom`) with its own
//! identity and sends the values in the request.
//!
//! Trust model (the same boundary as PKO's): a request reads only in its Update's namespace — the namespace of the
//! Stack, its Workspace and the pod PKO would create, whose kubelet would read the same Secrets. Nothing here can name
//! another namespace. Values travel only in the `Run` call (TLS and a bearer token in a cluster); they are never
//! logged, never in status, conditions or events (errors name the object and key, never a value), and the agent masks
//! those of Secrets (`EnvVar` `secret`, secret config) in every line of output.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use pb::value_ref::Kind;
use pko_proto::v1 as pb;

/// A Secret or a ConfigMap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ObjectKind {
    /// `v1/Secret` (`data`, base64 in the API, bytes here).
    Secret,
    /// `v1/ConfigMap` (`data`).
    ConfigMap,
}

impl std::fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ObjectKind::Secret => "Secret",
            ObjectKind::ConfigMap => "ConfigMap",
        })
    }
}

/// Which object and key a reference names, and where in the request it sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The request field (`env[0] (NAME)`, `config[2] (key)`, `source.git.auth.token`).
    pub field: String,
    /// Secret or ConfigMap.
    pub kind: ObjectKind,
    /// The Update's namespace.
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The key in its `data`.
    pub key: String,
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} {}/{}", self.field, self.kind, self.namespace, self.name)
    }
}

/// Why a reference could not be resolved; names the request field, the object and the key — never a value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ValuesError {
    /// The object could not be read (missing, forbidden to the operator, API server error): the reason, and the API
    /// server's HTTP status (`None`: no answer).
    #[error("{0} could not be read: {1}")]
    Read(Box<Reference>, String, Option<u16>),
    /// The object has no such key.
    #[error("{0} has no key {key:?}", key = .0.key)]
    NoKey(Box<Reference>),
    /// A value that is not UTF-8 (an environment variable or config value must be text).
    #[error("{0} key {key:?} is not UTF-8", key = .0.key)]
    NotUtf8(Box<Reference>),
    /// A reference that names no object (an `envFrom` entry with neither or both refs): the field and why.
    #[error("{0}")]
    Malformed(String),
}

impl ValuesError {
    /// Whether trying again may succeed without anyone changing anything: no answer, or the API server busy or failing
    /// (429, 5xx). A missing object, key or permission is the user's to fix: the Update fails with the message.
    pub fn is_transient(&self) -> bool {
        matches!(self, ValuesError::Read(_, _, code) if code.is_none_or(|c| c == 429 || c >= 500))
    }
}

/// Every value reference of `req` with the request field it sits in (pure): `env[i] (NAME)`, `config[i] (key)`,
/// `source.git.auth.<credential>`.
pub fn references(req: &mut pb::OperationRequest) -> Vec<(String, &mut pb::ValueRef)> {
    let mut out = Vec::new();
    for (i, e) in req.env.iter_mut().enumerate() {
        let field = format!("env[{i}] ({})", e.name);
        if let Some(v) = e.value.as_mut() {
            out.push((field, v));
        }
    }
    for (i, c) in req.config.iter_mut().enumerate() {
        let field = format!("config[{i}] ({})", c.key);
        if let Some(pb::config_item::Value::ValueFrom(v)) = c.value.as_mut() {
            out.push((field, v));
        }
    }
    if let Some(pb::source::Kind::Git(g)) = req.source.as_mut().and_then(|s| s.kind.as_mut())
        && let Some(a) = g.auth.as_mut()
    {
        for (name, v) in [
            ("ssh_private_key", &mut a.ssh_private_key),
            ("ssh_passphrase", &mut a.ssh_passphrase),
            ("token", &mut a.token),
            ("username", &mut a.username),
            ("password", &mut a.password),
            ("github_app_id", &mut a.github_app_id),
            ("github_app_installation_id", &mut a.github_app_installation_id),
            ("github_app_private_key", &mut a.github_app_private_key),
        ] {
            if let Some(v) = v.as_mut() {
                out.push((format!("source.git.auth.{name}"), v));
            }
        }
    }
    out
}

/// The object and key `r` reads, if it is a Secret or ConfigMap reference (pure).
fn object_of(r: &pb::ValueRef) -> Option<(ObjectKind, &pb::KeyRef)> {
    match &r.kind {
        Some(Kind::Secret(k)) => Some((ObjectKind::Secret, k)),
        Some(Kind::ConfigMap(k)) => Some((ObjectKind::ConfigMap, k)),
        _ => None,
    }
}

/// The data of a Secret or ConfigMap as read: key → bytes.
use crate::secret_cache::{Data, SecretCache};

/// The value `reference` names in `data`, its object's data as read (pure).
///
/// Errors: [`ValuesError::NoKey`], [`ValuesError::NotUtf8`].
pub fn value_in(data: &Data, reference: &Reference) -> Result<String, ValuesError> {
    let bytes = data.get(&reference.key).ok_or_else(|| ValuesError::NoKey(Box::new(reference.clone())))?;
    String::from_utf8(bytes.clone()).map_err(|_| ValuesError::NotUtf8(Box::new(reference.clone())))
}

/// The data of a Secret (through `secrets`, [`SecretCache`]) or a ConfigMap (read).
async fn read(
    client: &kube::Client,
    secrets: &SecretCache,
    namespace: &str,
    kind: ObjectKind,
    name: &str,
) -> Result<std::sync::Arc<Data>, kube::Error> {
    Ok(match kind {
        ObjectKind::Secret => secrets.read(client, namespace, name).await?,
        ObjectKind::ConfigMap => {
            let cm = Api::<ConfigMap>::namespaced(client.clone(), namespace).get(name).await?;
            let text = cm.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.into_bytes()));
            // binaryData as PKO's kubelet would mount it (a key is in one of the two maps)
            std::sync::Arc::new(
                text.chain(cm.binary_data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0))).collect(),
            )
        }
    })
}

fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

fn short(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => other.to_string(),
    }
}

/// Replaces every Secret and ConfigMap reference of `req` by its value, read with the operator's identity in
/// `namespace` (the Update's), each object once, Secrets through `secrets`. Returns how many references it resolved.
/// Environment variables read from a Secret stay marked `secret` (masked by the agent).
///
/// Errors: the first reference that cannot be resolved ([`ValuesError`]); `req` is then partly resolved and must not be
/// sent.
pub async fn resolve(
    client: &kube::Client,
    secrets: &SecretCache,
    namespace: &str,
    req: &mut pb::OperationRequest,
) -> Result<usize, ValuesError> {
    for e in &mut req.env {
        if e.value.as_ref().and_then(object_of).is_some_and(|(k, _)| k == ObjectKind::Secret) {
            e.secret = true;
        }
    }
    let mut read_objects: BTreeMap<(ObjectKind, String), std::sync::Arc<Data>> = BTreeMap::new();
    let mut resolved = 0;
    for (field, r) in references(req) {
        let Some((kind, key)) = object_of(r) else { continue };
        let reference =
            Reference { field, kind, namespace: namespace.into(), name: key.name.clone(), key: key.key.clone() };
        // each object once per request
        let data = match read_objects.entry((kind, reference.name.clone())) {
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => v.insert(
                read(client, secrets, namespace, kind, &reference.name)
                    .await
                    .map_err(|e| ValuesError::Read(Box::new(reference.clone()), short(&e), code(&e)))?,
            ),
        };
        let value = value_in(data, &reference)?;
        // the run digest covers where the value came from, never the value
        r.origin = match kind {
            ObjectKind::Secret => pko_proto::digest::secret_origin(&reference.name, &reference.key),
            ObjectKind::ConfigMap => pko_proto::digest::config_map_origin(&reference.name, &reference.key),
        };
        r.kind = Some(Kind::Literal(value));
        resolved += 1;
    }
    Ok(resolved)
}

/// One `envFrom` entry of a Workspace (Stack `envs` → ConfigMap, `envSecrets` → Secret), as the kubelet reads it
/// for a container (Kubernetes `EnvFromSource`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvSource {
    /// The Workspace field, `spec.envFrom[i]`.
    pub field: String,
    /// Secret or ConfigMap.
    pub kind: ObjectKind,
    /// The object's name, in the Update's namespace.
    pub name: String,
    /// Prepended to every key (`prefix`).
    pub prefix: String,
    /// A missing object is no error (`optional`).
    pub optional: bool,
}

/// The `envFrom` entries of a Workspace (pure). An entry naming neither or both of `configMapRef` and `secretRef` is
/// refused, naming it.
pub fn env_sources(env_from: &[k8s_openapi::api::core::v1::EnvFromSource]) -> Result<Vec<EnvSource>, String> {
    env_from
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let field = format!("spec.envFrom[{i}]");
            let (kind, name, optional) = match (&e.config_map_ref, &e.secret_ref) {
                (Some(c), None) => (ObjectKind::ConfigMap, c.name.clone(), c.optional),
                (None, Some(s)) => (ObjectKind::Secret, s.name.clone(), s.optional),
                _ => return Err(format!("{field}: exactly one of configMapRef or secretRef is required")),
            };
            Ok(EnvSource {
                field,
                kind,
                name,
                prefix: e.prefix.clone().unwrap_or_default(),
                optional: optional.unwrap_or(false),
            })
        })
        .collect()
}

/// Kubernetes' rule for an environment variable name (`IsEnvVarName`): `[-._a-zA-Z][-._a-zA-Z0-9]*`.
pub fn is_env_var_name(name: &str) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    name.chars().next().is_some_and(|c| ok(c) && !c.is_ascii_digit()) && name.chars().all(ok)
}

/// The environment of an operation as the kubelet builds a container's (pure): the variables of `sources` in order (a
/// later source's key wins; `None` data is a missing optional object), then `env` on top (an `env` entry wins over any
/// `envFrom` key). Values of Secrets are marked `secret`. Returns the variables and the keys skipped because, prefixed,
/// they are no variable name (the kubelet skips them too, with an event).
///
/// Errors: [`ValuesError::NotUtf8`] for a value that is not text.
pub fn merge_env(
    sources: &[(EnvSource, Option<Data>)],
    env: Vec<pb::EnvVar>,
) -> Result<(Vec<pb::EnvVar>, Vec<String>), ValuesError> {
    let mut vars: BTreeMap<String, pb::EnvVar> = BTreeMap::new();
    let mut skipped = Vec::new();
    for (source, data) in sources {
        for (key, bytes) in data.iter().flatten() {
            let name = format!("{}{key}", source.prefix);
            if !is_env_var_name(&name) {
                skipped.push(format!("{} {}/{key}", source.kind, source.name));
                continue;
            }
            let reference = || {
                Box::new(Reference {
                    field: source.field.clone(),
                    kind: source.kind,
                    namespace: String::new(),
                    name: source.name.clone(),
                    key: key.clone(),
                })
            };
            let value = String::from_utf8(bytes.clone()).map_err(|_| ValuesError::NotUtf8(reference()))?;
            let secret = source.kind == ObjectKind::Secret;
            let value =
                pb::ValueRef { kind: Some(Kind::Literal(value)), origin: pko_proto::digest::ENV_FROM_ORIGIN.into() };
            vars.insert(name.clone(), pb::EnvVar { name, value: Some(value), secret });
        }
    }
    for e in &env {
        vars.remove(&e.name);
    }
    Ok((vars.into_values().chain(env).collect(), skipped))
}

async fn read_env_source(
    client: &kube::Client,
    secrets: &SecretCache,
    namespace: &str,
    kind: ObjectKind,
    name: &str,
) -> Result<Data, kube::Error> {
    Ok(match kind {
        ObjectKind::Secret => Data::clone(&*secrets.read(client, namespace, name).await?),
        // the kubelet takes `data` only for envFrom (not binaryData)
        ObjectKind::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .get(name)
            .await?
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect(),
    })
}

/// Puts the Workspace's `envFrom` (`env_from`) into `req.env` as the kubelet would into a pod (see [`merge_env`]),
/// reading each Secret and ConfigMap with the operator's identity in `namespace` (the Update's), so that Stack
/// `envs`/`envSecrets` reach the program on every runtime, not only in pods. Returns the keys skipped for their names.
///
/// Errors: a malformed entry or a missing object that is not `optional` ([`ValuesError::Read`]), a value that is not
/// text.
pub async fn expand_env_from(
    client: &kube::Client,
    secrets: &SecretCache,
    namespace: &str,
    env_from: &[k8s_openapi::api::core::v1::EnvFromSource],
    req: &mut pb::OperationRequest,
) -> Result<Vec<String>, ValuesError> {
    let sources = env_sources(env_from).map_err(ValuesError::Malformed)?;
    let mut read_sources = Vec::with_capacity(sources.len());
    for source in sources {
        let data = match read_env_source(client, secrets, namespace, source.kind, &source.name).await {
            Ok(d) => Some(d),
            Err(kube::Error::Api(s)) if s.code == 404 && source.optional => None,
            Err(e) => {
                let reference = Reference {
                    field: source.field.clone(),
                    kind: source.kind,
                    namespace: namespace.into(),
                    name: source.name.clone(),
                    key: String::new(),
                };
                return Err(ValuesError::Read(Box::new(reference), short(&e), code(&e)));
            }
        };
        read_sources.push((source, data));
    }
    let (env, skipped) = merge_env(&read_sources, std::mem::take(&mut req.env))?;
    req.env = env;
    Ok(skipped)
}

/// Why GitHub App credentials bought no token.
#[derive(Debug, thiserror::Error)]
#[error("source.git.auth.github_app: {0}")]
pub struct GitHubAppExchangeError(#[from] pko_git::github_app::GitHubAppError);

impl GitHubAppExchangeError {
    /// Whether trying again may help: GitHub did not answer, or answered 429/5xx.
    pub fn is_transient(&self) -> bool {
        use pko_git::github_app::GitHubAppError as E;
        matches!(&self.0, E::Request(..)) || matches!(&self.0, E::Refused(_, code, _) if *code == 429 || *code >= 500)
    }
}

/// After [`resolve`]: GitHub App credentials in the request's git auth (PKO `githubApp`) are exchanged at `api_url` for
/// an installation token, which becomes `token`; the App's fields are cleared, so the private key never leaves the
/// operator. Nothing to do without them.
///
/// Errors: [`GitHubAppExchangeError`] (the fields must have been resolved to literals).
pub async fn exchange_github_app(req: &mut pb::OperationRequest, api_url: &str) -> Result<(), GitHubAppExchangeError> {
    let Some(pb::source::Kind::Git(g)) = req.source.as_mut().and_then(|s| s.kind.as_mut()) else { return Ok(()) };
    let Some(a) = g.auth.as_mut() else { return Ok(()) };
    if a.github_app_id.is_none() && a.github_app_installation_id.is_none() && a.github_app_private_key.is_none() {
        return Ok(());
    }
    let literal = |v: &Option<pb::ValueRef>| match v.as_ref().and_then(|v| v.kind.as_ref()) {
        Some(Kind::Literal(s)) => s.clone(),
        _ => String::new(),
    };
    let token = pko_git::github_app::installation_token(
        api_url,
        &literal(&a.github_app_id),
        &literal(&a.github_app_installation_id),
        &literal(&a.github_app_private_key),
    )
    .await?;
    a.token = Some(pb::ValueRef { kind: Some(Kind::Literal(token)), origin: "github-app".into() });
    (a.github_app_id, a.github_app_installation_id, a.github_app_private_key) = (None, None, None);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, key: &str) -> pb::KeyRef {
        pb::KeyRef { name: name.into(), key: key.into() }
    }

    fn r(kind: Kind) -> Option<pb::ValueRef> {
        Some(pb::ValueRef { kind: Some(kind), origin: String::new() })
    }

    #[test]
    fn every_reference_of_a_request_is_found_with_its_field() {
        let mut req = pb::OperationRequest {
            env: vec![pb::EnvVar { name: "A".into(), value: r(Kind::Secret(key("s", "a"))), secret: false }],
            config: vec![
                pb::ConfigItem {
                    key: "lit".into(),
                    value: Some(pb::config_item::Value::Literal(Default::default())),
                    ..Default::default()
                },
                pb::ConfigItem {
                    key: "cm".into(),
                    value: Some(pb::config_item::Value::ValueFrom(pb::ValueRef {
                        kind: Some(Kind::ConfigMap(key("c", "k"))),
                        origin: String::new(),
                    })),
                    ..Default::default()
                },
            ],
            source: Some(pb::Source {
                kind: Some(pb::source::Kind::Git(pb::GitSource {
                    auth: Some(pb::GitAuth {
                        token: r(Kind::Secret(key("git", "t"))),
                        username: r(Kind::Literal("u".into())),
                        ..Default::default()
                    }),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        };
        let fields: Vec<String> = references(&mut req).into_iter().map(|(f, _)| f).collect();
        assert_eq!(fields, ["env[0] (A)", "config[1] (cm)", "source.git.auth.token", "source.git.auth.username"]);
    }

    fn reference(field: &str, kind: ObjectKind, name: &str, key: &str) -> Reference {
        Reference { field: field.into(), kind, namespace: "ns".into(), name: name.into(), key: key.into() }
    }

    #[test]
    fn a_value_is_text_of_an_existing_key_and_errors_name_the_key_never_a_value() {
        let data: Data = [("k".to_string(), b"v4lue".to_vec()), ("bin".to_string(), vec![0xff, 0xfe])].into();
        assert_eq!(value_in(&data, &reference("env[0] (A)", ObjectKind::Secret, "s", "k")), Ok("v4lue".into()));
        let missing = value_in(&data, &reference("env[0] (A)", ObjectKind::Secret, "s", "nope")).unwrap_err();
        assert_eq!(missing.to_string(), "env[0] (A): Secret ns/s has no key \"nope\"");
        let binary = value_in(&data, &reference("config[2] (x)", ObjectKind::Secret, "s", "bin")).unwrap_err();
        assert_eq!(binary.to_string(), "config[2] (x): Secret ns/s key \"bin\" is not UTF-8");
        let cm = value_in(&data, &reference("env[1] (B)", ObjectKind::ConfigMap, "c", "z")).unwrap_err();
        assert!(!cm.to_string().contains("v4lue") && cm.to_string().contains("ConfigMap ns/c"), "{cm}");
        assert!(!cm.is_transient(), "the user's to fix");
    }

    #[test]
    fn env_from_is_merged_as_the_kubelet_does() {
        use k8s_openapi::api::core::v1::{ConfigMapEnvSource, EnvFromSource, SecretEnvSource};
        let from = [
            EnvFromSource {
                config_map_ref: Some(ConfigMapEnvSource { name: "cm".into(), optional: None }),
                ..Default::default()
            },
            EnvFromSource {
                prefix: Some("S_".into()),
                secret_ref: Some(SecretEnvSource { name: "sec".into(), optional: Some(true) }),
                ..Default::default()
            },
            EnvFromSource {
                secret_ref: Some(SecretEnvSource { name: "later".into(), optional: None }),
                ..Default::default()
            },
        ];
        let sources = env_sources(&from).unwrap();
        assert_eq!(
            (sources[1].prefix.as_str(), sources[1].optional, sources[1].kind),
            ("S_", true, ObjectKind::Secret)
        );
        let data = |kv: &[(&str, &str)]| {
            Some(kv.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect::<Data>())
        };
        let read = vec![
            (sources[0].clone(), data(&[("A", "cm-a"), ("B", "cm-b"), ("1bad", "x"), ("OVER", "cm")])),
            (sources[1].clone(), None),
            (sources[2].clone(), data(&[("B", "later-b"), ("K", "s3cret")])),
        ];
        let env = vec![pb::EnvVar { name: "OVER".into(), value: r(Kind::Literal("env".into())), secret: false }];
        let (vars, skipped) = merge_env(&read, env).unwrap();
        let got: Vec<(String, String, bool)> = vars
            .into_iter()
            .map(|e| match e.value.and_then(|v| v.kind) {
                Some(Kind::Literal(v)) => (e.name, v, e.secret),
                other => panic!("{other:?}"),
            })
            .collect();
        let want = [("A", "cm-a", false), ("B", "later-b", true), ("K", "s3cret", true), ("OVER", "env", false)];
        assert_eq!(
            got,
            want.map(|(n, v, s)| (n.to_string(), v.to_string(), s)),
            "a later source wins, env wins over envFrom, Secret values stay masked"
        );
        assert_eq!(skipped, ["ConfigMap cm/1bad"]);
        let both = [EnvFromSource {
            config_map_ref: Some(ConfigMapEnvSource { name: "a".into(), optional: None }),
            secret_ref: Some(SecretEnvSource { name: "b".into(), optional: None }),
            ..Default::default()
        }];
        assert_eq!(
            env_sources(&both).unwrap_err(),
            "spec.envFrom[0]: exactly one of configMapRef or secretRef is required"
        );
        assert!(
            is_env_var_name("_a.b-c1") && !is_env_var_name("") && !is_env_var_name("a b") && !is_env_var_name("9x")
        );
    }

    #[test]
    fn only_unanswered_busy_or_failing_reads_are_transient() {
        let read = |code| ValuesError::Read(Box::new(reference("f", ObjectKind::Secret, "s", "k")), "r".into(), code);
        assert!(read(None).is_transient());
        assert!(read(Some(503)).is_transient());
        assert!(read(Some(429)).is_transient());
        assert!(!read(Some(404)).is_transient(), "missing: the user's to fix");
        assert!(!read(Some(403)).is_transient(), "the operator may not read it");
        assert_eq!(read(Some(404)).to_string(), "f: Secret ns/s could not be read: r");
    }
}
