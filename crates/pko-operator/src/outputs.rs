//! The immutable outputs Secret of an `up` Update (PKO: `<update>-stack-outputs`) and the Stack's `status.outputs` read
//! back from it with secret values masked — a shared contract between two peers. **Writer:** the Update worker
//! ([`crate::update::dispatch`], [`secret`]). **Reader:** the Stack controller ([`crate::stack::reconcile`],
//! [`stack_outputs`]). Within one replica the writer also hands the reader what it wrote ([`Written`]), so the usual
//! absorb — by the replica that ran the operation — reads no Secret back.

use std::collections::BTreeMap;
use std::sync::Arc;

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
pub fn secret(
    update: &str,
    namespace: &str,
    owner: OwnerReference,
    outputs: &BTreeMap<String, (Value, bool)>,
) -> Secret {
    let secrets: Vec<String> = outputs.iter().filter(|(_, (_, s))| *s).map(|(k, _)| data_key(k)).collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(update)),
            namespace: Some(namespace.into()),
            owner_references: Some(vec![owner]),
            labels: Some(BTreeMap::from([
                (AUTO_COMPONENT_LABEL.to_string(), "update".to_string()),
                (UPDATE_NAME_LABEL.to_string(), update.to_string()),
            ])),
            annotations: Some(BTreeMap::from([(
                SECRET_OUTPUTS_ANNOTATION.to_string(),
                serde_json::to_string(&secrets).expect("list of strings"),
            )])),
            ..Default::default()
        },
        immutable: Some(true),
        data: Some(outputs.iter().map(|(k, (v, _))| (data_key(k), ByteString(v.to_string().into_bytes()))).collect()),
        ..Default::default()
    }
}

/// `Stack.status.outputs` from an outputs Secret: JSON values, secret ones replaced by `[secret]`.
pub fn stack_outputs(secret: &Secret) -> BTreeMap<String, Value> {
    let secret_keys: Vec<String> = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SECRET_OUTPUTS_ANNOTATION))
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default();
    secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| {
            let value = if secret_keys.contains(k) {
                Value::String(SECRET_MASK.into())
            } else {
                serde_json::from_slice(&v.0).unwrap_or(Value::Null)
            };
            (k.clone(), value)
        })
        .collect()
}

/// The masked outputs ([`stack_outputs`]) of the outputs Secrets this replica wrote lately, by the Update's `uid`: the
/// Stack controller absorbing that Update takes them from here instead of reading the Secret back (one GET per
/// operation less). Holds no secret value (they are masked). Bounded: [`WRITTEN_CAPACITY`] Updates, each kept
/// [`WRITTEN_FOR`]; a miss (another replica ran it, a restart, evicted) reads the Secret as before.
#[derive(Clone)]
pub struct Written(moka::future::Cache<String, Arc<BTreeMap<String, Value>>>);

/// How many Updates' outputs [`Written`] keeps at most.
pub const WRITTEN_CAPACITY: u64 = 4096;

/// How long [`Written`] keeps an Update's outputs: 15 minutes (an Update is absorbed within seconds of its result
/// unless its Stack's replica is busy or down).
pub const WRITTEN_FOR: std::time::Duration = std::time::Duration::from_secs(15 * 60);

impl Default for Written {
    fn default() -> Self {
        Self(moka::future::Cache::builder().max_capacity(WRITTEN_CAPACITY).time_to_live(WRITTEN_FOR).build())
    }
}

impl std::fmt::Debug for Written {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Written").field("entries", &self.0.entry_count()).finish()
    }
}

impl Written {
    /// Records the outputs Secret written for the Update `update_uid`, masked.
    pub async fn wrote(&self, update_uid: &str, secret: &Secret) {
        self.0.insert(update_uid.to_string(), Arc::new(stack_outputs(secret))).await;
    }

    /// The masked outputs written for the Update `update_uid` by this replica, once: `None` when it did not write them
    /// (or they were evicted).
    pub async fn take(&self, update_uid: &str) -> Option<Arc<BTreeMap<String, Value>>> {
        self.0.remove(update_uid).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn what_was_written_is_taken_once_masked() {
        let owner = OwnerReference { name: "u1".into(), uid: "uid-1".into(), ..Default::default() };
        let s = secret(
            "u1",
            "ns",
            owner,
            &BTreeMap::from([
                ("url".to_string(), (json!("https://x"), false)),
                ("pw".to_string(), (json!("hunter2"), true)),
            ]),
        );
        let written = Written::default();
        assert!(written.take("uid-1").await.is_none(), "nothing written yet");
        written.wrote("uid-1", &s).await;
        let taken = written.take("uid-1").await.expect("written here");
        assert_eq!(taken.get("url"), Some(&json!("https://x")));
        assert_eq!(taken.get("pw"), Some(&json!(SECRET_MASK)), "no secret value is kept");
        assert!(written.take("uid-1").await.is_none(), "taken once");
    }

    #[test]
    fn secret_round_trip_masks_secret_outputs() {
        let owner = OwnerReference {
            api_version: "auto.pulumi.com/v1alpha1".into(),
            kind: "Update".into(),
            name: "u1".into(),
            uid: "uid".into(),
            ..Default::default()
        };
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
