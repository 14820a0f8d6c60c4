//! The immutable outputs Secret of an `up` Update (PKO: `<update>-stack-outputs`) and the Stack's
//! `status.outputs` read back from it with secret values masked — a shared contract between two peers.
//! **Writer:** the Update worker ([`crate::update::dispatch`], [`secret`]). **Reader:** the Stack
//! controller ([`crate::stack::reconcile`], [`stack_outputs`]).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use pko_api::constants::{AUTO_COMPONENT_LABEL, SECRET_MASK, SECRET_OUTPUTS_ANNOTATION, UPDATE_NAME_LABEL};
use serde_json::Value;

/// Name of the outputs Secret of Update `update`.
pub fn secret_name(update: &str) -> String {
    format!("{update}-stack-outputs")
}

/// Data key of output `name`: characters outside `[-._a-zA-Z0-9]` become `_` (Secret key rules).
pub fn data_key(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || "-._".contains(c) { c } else { '_' }).collect()
}

/// The outputs Secret: `outputs` maps output name → (JSON value, secret flag); owned by the Update.
pub fn secret(update: &str, namespace: &str, owner: OwnerReference, outputs: &BTreeMap<String, (Value, bool)>) -> Secret {
    let secrets: Vec<String> = outputs.iter().filter(|(_, (_, s))| *s).map(|(k, _)| data_key(k)).collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(update)),
            namespace: Some(namespace.into()),
            owner_references: Some(vec![owner]),
            labels: Some(BTreeMap::from([(AUTO_COMPONENT_LABEL.to_string(), "update".to_string()), (UPDATE_NAME_LABEL.to_string(), update.to_string())])),
            annotations: Some(BTreeMap::from([(SECRET_OUTPUTS_ANNOTATION.to_string(), serde_json::to_string(&secrets).expect("list of strings"))])),
            ..Default::default()
        },
        immutable: Some(true),
        data: Some(outputs.iter().map(|(k, (v, _))| (data_key(k), ByteString(v.to_string().into_bytes()))).collect()),
        ..Default::default()
    }
}

/// `Stack.status.outputs` from an outputs Secret: JSON values, secret ones replaced by `[secret]`.
pub fn stack_outputs(secret: &Secret) -> BTreeMap<String, Value> {
    let secret_keys: Vec<String> =
        secret.metadata.annotations.as_ref().and_then(|a| a.get(SECRET_OUTPUTS_ANNOTATION)).and_then(|s| serde_json::from_str(s).ok()).unwrap_or_default();
    secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| {
            let value = if secret_keys.contains(k) { Value::String(SECRET_MASK.into()) } else { serde_json::from_slice(&v.0).unwrap_or(Value::Null) };
            (k.clone(), value)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secret_round_trip_masks_secret_outputs() {
        let owner = OwnerReference { api_version: "auto.pulumi.com/v1alpha1".into(), kind: "Update".into(), name: "u1".into(), uid: "uid".into(), ..Default::default() };
        let outs = BTreeMap::from([
            ("url".to_string(), (json!("https://x"), false)),
            ("db password".to_string(), (json!("hunter2"), true)),
            ("obj".to_string(), (json!({"a": [1]}), false)),
        ]);
        let s = secret("u1", "ns", owner, &outs);
        assert_eq!(s.metadata.name.as_deref(), Some("u1-stack-outputs"));
        assert_eq!(s.immutable, Some(true));
        assert_eq!(s.metadata.annotations.as_ref().unwrap()[SECRET_OUTPUTS_ANNOTATION], r#"["db_password"]"#);
        assert_eq!(s.metadata.labels.as_ref().unwrap()[UPDATE_NAME_LABEL], "u1");
        let status = stack_outputs(&s);
        assert_eq!(status["url"], json!("https://x"));
        assert_eq!(status["db_password"], json!("[secret]"));
        assert_eq!(status["obj"], json!({"a": [1]}));
        assert!(!serde_json::to_string(&status).unwrap().contains("hunter2"));
    }

    #[test]
    fn keys_follow_secret_key_rules() {
        assert_eq!(data_key("a/b:c d-e.f_g"), "a_b_c_d-e.f_g");
    }
}
