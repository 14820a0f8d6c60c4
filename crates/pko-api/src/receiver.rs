//! `Receiver` (`pulumi.com/v1alpha1`, ours, additive): a webhook that reconciles the Stacks a git push concerns at
//! once instead of at their next poll. Shaped like Flux's `notification.toolkit.fluxcd.io/v1` Receiver (`type`,
//! `events`, `secretRef`, `resources`, `status.webhookPath`), so its users know it; PKO has none.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a Receiver accepts and which Stacks it wakes.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "pulumi.com",
    version = "v1alpha1",
    kind = "Receiver",
    namespaced,
    status = "ReceiverStatus",
    category = "pulumi",
    derive = "PartialEq",
    derive = "Default",
    doc = "A Receiver is a webhook (a git host's push, or any caller with its token) that requests a sync of the \
           Stacks of its namespace that it selects and the push concerns.",
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Path", type_ = "string", json_path = ".status.webhookPath"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ReceiverSpec {
    /// Who calls and how the call is signed (Flux's `type`): `github` (`X-Hub-Signature-256`), `gitlab`
    /// (`X-Gitlab-Token`), `bitbucket` (Bitbucket Server, `X-Hub-Signature`), `gitea` (`X-Gitea-Signature`),
    /// `generic` (the path is the only secret), `generic-hmac` (`X-Signature: sha256=<hex>` of the body).
    #[serde(rename = "type")]
    pub receiver_type: ReceiverType,
    /// Events accepted (`X-GitHub-Event`, `X-Gitlab-Event`, `X-Event-Key`, `X-Gitea-Event`), e.g. `push`, `Push Hook`,
    /// `repo:refs_changed`; empty: any. A delivery of another event is acknowledged and wakes nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<String>,
    /// The Secret of the Receiver's namespace whose key `token` is the shared secret (the HMAC key, or GitLab's
    /// token); it also makes the webhook path.
    pub secret_ref: SecretName,
    /// The Stacks it may wake, directly or through their Program: by name (`*`: all) or by labels, in the Receiver's
    /// own namespace only.
    pub resources: Vec<ReceiverResource>,
    /// Refuse deliveries (404) while true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
}

/// A Secret of the same namespace, by name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct SecretName {
    /// The Secret's name.
    pub name: String,
}

/// How a Receiver's deliveries are signed (Flux's receiver types that carry a git push); admission refuses others.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ReceiverType {
    /// GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`, event `X-GitHub-Event`.
    #[default]
    Github,
    /// GitLab: `X-Gitlab-Token: <token>`, event `X-Gitlab-Event`.
    Gitlab,
    /// Bitbucket Server: `X-Hub-Signature: sha256=<hex>`, event `X-Event-Key`.
    Bitbucket,
    /// Gitea or Forgejo: `X-Gitea-Signature: <hex>` (or GitHub's header), event `X-Gitea-Event`.
    Gitea,
    /// Any caller: the path (a digest of the token) is the credential; no repository, every selected Stack syncs.
    Generic,
    /// Any caller signing the body: `X-Signature: sha256=<hex>`; every selected Stack syncs.
    GenericHmac,
}

/// Stacks a Receiver may wake.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReceiverResource {
    /// `Stack` (the Stack itself) or `Program` (the Stacks whose `programRef` names it).
    pub kind: String,
    /// `pulumi.com/v1`, accepted for Flux's shape; ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// The object's name, or `*` (with `matchLabels`: every object carrying them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Only the Receiver's own namespace (Flux's field, accepted empty or equal; another is refused: Stalled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Labels the objects carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<BTreeMap<String, String>>,
}

/// What the operator observed of a Receiver.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReceiverStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (True once the path serves), `Stalled` (the Secret or a resource is refused, named in the message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Option<Vec<Condition>>,
    /// `/hook/<sha256 of token + name + namespace, hex>` (Flux's), on every replica's webhook port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_path: Option<String>,
    /// The last delivery that passed the signature check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_delivery: Option<Delivery>,
}

/// One accepted delivery.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Delivery {
    /// When it arrived (RFC 3339).
    pub time: String,
    /// `synced` (Stacks were asked to sync), `unchanged` (none needed it), `ignored` (an event not accepted).
    pub result: String,
    /// The pushed revision (commit SHA), when the payload names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The pushed repository and ref, when the payload names them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// The Stacks asked to sync, by name (at most 100).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: Vec<String>,
}
