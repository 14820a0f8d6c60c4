//! The run digest: what an operation runs, as one `sha256:<hex>` — the source (a commit, an artifact's digest, a
//! directory), the stack's settings, its config (values, or the references they come from) and its environment
//! (likewise), with the Workspace's `envFrom` sources by name. The Stack controller writes it on each Update it makes
//! (`spec.runDigest`, from the Workspace it applied), the dispatcher checks the request it built against it, and the
//! agent checks the request it received and reports what it ran (`status.runDigest`); the Stack is Ready at a
//! generation only from a run of that generation's digest.
//!
//! Left out on purpose: secret values and whatever a reference resolves to (a Secret rotated is the same run), the
//! operation and its options (the Update's own spec), credentials for the source, mirrors and an artifact's URL when it
//! has a digest (the same bytes from another replica), the agent's own environment and the Pulumi CLI.

use sha2::{Digest, Sha256};

use crate::v1::{self, OperationRequest, ValueRef, source, value_ref};

/// Version of the canonical form below; a change of form changes every digest.
const FORM: &str = "pko-run-digest/1";

/// The origin of a variable of an `envFrom` source ([`ValueRef::origin`]): not digested.
pub const ENV_FROM_ORIGIN: &str = "envFrom";

/// The run digest of `req` (`sha256:` and 64 lowercase hex digits). Pure; resolving `req`'s references (which records
/// their [`ValueRef::origin`]) or adding mirrors leaves it unchanged.
pub fn run_digest(req: &OperationRequest) -> String {
    let mut lines = vec![FORM.to_string(), source_line(req.source.as_ref())];
    let stack = req.stack.clone().unwrap_or_default();
    lines.push(json(&serde_json::json!(["stack", stack.name, stack.secrets_provider, stack.environments])));
    for c in &req.config {
        let value = match &c.value {
            Some(v1::config_item::Value::Literal(v)) => {
                serde_json::json!({"literal": canonical(&crate::json::from_value(v))})
            }
            Some(v1::config_item::Value::ValueFrom(r)) => reference(r),
            None => serde_json::Value::Null,
        };
        lines.push(json(&serde_json::json!(["config", c.key, c.path, c.secret, c.json, value])));
    }
    for e in &req.env {
        if e.value.as_ref().is_some_and(|v| v.origin == ENV_FROM_ORIGIN) {
            continue;
        }
        lines.push(json(&serde_json::json!(["env", e.name, e.secret, e.value.as_ref().map(reference)])));
    }
    for f in &req.env_from {
        lines.push(json(&serde_json::json!(["envFrom", f])));
    }
    let mut hash = Sha256::new();
    for l in &lines {
        hash.update(l.as_bytes());
        hash.update(b"\n");
    }
    format!("sha256:{}", hex(&hash.finalize()))
}

fn source_line(source: Option<&v1::Source>) -> String {
    let s = match source.and_then(|s| s.kind.as_ref()) {
        None => serde_json::json!(["source"]),
        Some(source::Kind::Git(g)) => serde_json::json!(["source", "git", g.url, g.revision, g.dir]),
        // the same bytes whichever replica serves them: the URL only identifies an undigested artifact
        Some(source::Kind::Artifact(a)) if !a.digest.is_empty() => {
            serde_json::json!(["source", "artifact", a.digest, a.dir])
        }
        Some(source::Kind::Artifact(a)) => serde_json::json!(["source", "artifact-url", a.url, a.dir]),
        Some(source::Kind::Local(l)) => serde_json::json!(["source", "local", l.dir]),
        Some(source::Kind::ProjectInfo(p)) => serde_json::json!(["source", "project", p.name, p.runtime]),
    };
    json(&s)
}

/// A value by where it comes from: its origin once resolved, else its reference, else the literal.
fn reference(r: &ValueRef) -> serde_json::Value {
    if !r.origin.is_empty() {
        return serde_json::json!({"ref": r.origin});
    }
    match &r.kind {
        Some(value_ref::Kind::Literal(v)) => serde_json::json!({"literal": v}),
        Some(value_ref::Kind::Secret(k)) => serde_json::json!({"ref": secret_origin(&k.name, &k.key)}),
        Some(value_ref::Kind::ConfigMap(k)) => serde_json::json!({"ref": config_map_origin(&k.name, &k.key)}),
        Some(value_ref::Kind::Env(n)) => serde_json::json!({"ref": format!("env:{n}")}),
        Some(value_ref::Kind::Path(p)) => serde_json::json!({"ref": format!("path:{p}")}),
        None => serde_json::Value::Null,
    }
}

/// The origin of a value read from key `key` of Secret `name` ([`ValueRef::origin`]).
pub fn secret_origin(name: &str, key: &str) -> String {
    format!("secret:{name}/{key}")
}

/// The origin of a value read from key `key` of ConfigMap `name` ([`ValueRef::origin`]).
pub fn config_map_origin(name: &str, key: &str) -> String {
    format!("configmap:{name}/{key}")
}

/// `v` with every object's keys in order (a protobuf `Struct` has none).
fn canonical(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let pairs: Vec<serde_json::Value> =
                keys.into_iter().map(|k| serde_json::json!([k, canonical(&m[k])])).collect();
            serde_json::json!({"object": pairs})
        }
        serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

fn json(v: &serde_json::Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{ArtifactSource, ConfigItem, EnvVar, KeyRef, Source, StackSettings};

    fn request() -> OperationRequest {
        let secret = ValueRef {
            kind: Some(value_ref::Kind::Secret(KeyRef { name: "s".into(), key: "k".into() })),
            origin: String::new(),
        };
        OperationRequest {
            operation_id: "ns/u/1".into(),
            epoch: 3,
            source: Some(Source {
                kind: Some(source::Kind::Artifact(ArtifactSource {
                    url: "http://a/p.tgz".into(),
                    digest: "sha256:ab".into(),
                    dir: String::new(),
                    mirrors: vec![],
                })),
            }),
            stack: Some(StackSettings {
                name: "dev".into(),
                create: true,
                secrets_provider: String::new(),
                environments: vec![],
            }),
            config: vec![
                ConfigItem {
                    key: "n".into(),
                    value: Some(v1::config_item::Value::Literal(crate::json::to_value(&serde_json::json!("1")))),
                    ..Default::default()
                },
                ConfigItem {
                    key: "pw".into(),
                    secret: true,
                    value: Some(v1::config_item::Value::ValueFrom(ValueRef {
                        kind: Some(value_ref::Kind::Env("PW".into())),
                        origin: String::new(),
                    })),
                    ..Default::default()
                },
            ],
            env: vec![EnvVar { name: "PW".into(), value: Some(secret), secret: true }],
            env_from: vec!["secret:more".into()],
            ..Default::default()
        }
    }

    #[test]
    fn resolving_references_or_moving_the_artifact_keeps_the_digest() {
        let before = run_digest(&request());
        assert!(before.starts_with("sha256:") && before.len() == 7 + 64, "{before}");
        let mut resolved = request();
        let v = resolved.env[0].value.as_mut().unwrap();
        *v = ValueRef { kind: Some(value_ref::Kind::Literal("hunter2".into())), origin: secret_origin("s", "k") };
        resolved.env.push(EnvVar {
            name: "FROM_SECRET".into(),
            value: Some(ValueRef { kind: Some(value_ref::Kind::Literal("x".into())), origin: ENV_FROM_ORIGIN.into() }),
            secret: true,
        });
        if let Some(source::Kind::Artifact(a)) = resolved.source.as_mut().and_then(|s| s.kind.as_mut()) {
            a.url = "http://b/p.tgz".into();
            a.mirrors.push("http://c/p.tgz".into());
        }
        (resolved.epoch, resolved.operation_id, resolved.r#type) = (9, "other".into(), 2);
        assert_eq!(run_digest(&resolved), before, "the same run, resolved and dispatched elsewhere");
    }

    #[test]
    fn what_runs_changes_the_digest() {
        let before = run_digest(&request());
        let changed = |f: &dyn Fn(&mut OperationRequest)| {
            let mut r = request();
            f(&mut r);
            run_digest(&r)
        };
        let literal = |v: serde_json::Value| Some(v1::config_item::Value::Literal(crate::json::to_value(&v)));
        assert_ne!(changed(&|r| r.config[0].value = literal(serde_json::json!("2"))), before, "a config value");
        assert_ne!(changed(&|r| r.config[0].secret = true), before, "a config item made secret");
        assert_ne!(changed(&|r| r.config.pop().map(|_| ()).unwrap_or_default()), before, "a config item gone");
        assert_ne!(
            changed(&|r| r.env[0].value.as_mut().unwrap().kind =
                Some(value_ref::Kind::Secret(KeyRef { name: "t".into(), key: "k".into() }))),
            before,
            "another Secret"
        );
        assert_ne!(changed(&|r| r.env_from.clear()), before, "an envFrom source");
        assert_ne!(changed(&|r| r.stack.as_mut().unwrap().name = "prod".into()), before, "another stack");
        assert_ne!(changed(&|r| r.source = None), before, "no source");
        let object = |a: serde_json::Value| {
            let mut r = request();
            r.config[0].value = literal(a);
            run_digest(&r)
        };
        assert_eq!(
            object(serde_json::json!({"a": 1, "b": [2]})),
            object(serde_json::json!({"b": [2], "a": 1})),
            "object keys in any order"
        );
        assert_ne!(object(serde_json::json!({"a": 1})), object(serde_json::json!({"a": 2})));
    }

    #[test]
    fn a_secret_value_never_enters_the_digest() {
        let with = |value: &str| {
            let mut r = request();
            r.env[0].value =
                Some(ValueRef { kind: Some(value_ref::Kind::Literal(value.into())), origin: secret_origin("s", "k") });
            run_digest(&r)
        };
        assert_eq!(with("hunter2"), with("correct horse"), "the Secret's value is not digested");
    }
}
