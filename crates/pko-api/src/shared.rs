//! Types shared by the Stack versions and the Workspace: references to values held elsewhere.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a value is loaded from (PKO `shared.ResourceRef`): `{type, env|filesystem|secret|literal}`.
///
/// PKO v2 accepts only `Literal` and `Secret`; `Env` and `FS` read the operator's own environment or file system in PKO
/// v1 and make a v2 Stack Stalled `SpecInvalid` (checked by the Stack controller).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRef {
    /// The kind of selector: one of `Env`, `FS`, `Secret`, `Literal`.
    #[serde(rename = "type")]
    pub selector_type: ResourceSelectorType,
    /// Selects an environment variable of the operator process (PKO v1 only; refused in v2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<EnvSelector>,
    /// Selects a file on the operator's file system (PKO v1 only; refused in v2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<FsSelector>,
    /// Selects a key of a Kubernetes Secret in the Stack's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretSelector>,
    /// A literal value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub literal: Option<LiteralRef>,
}

impl ResourceRef {
    /// A `Literal` reference holding `value`.
    pub fn literal(value: impl Into<String>) -> Self {
        Self {
            selector_type: ResourceSelectorType::Literal,
            env: None,
            filesystem: None,
            secret: None,
            literal: Some(LiteralRef { value: value.into() }),
        }
    }

    /// A `Secret` reference to `key` of the Secret `name` in the Stack's namespace.
    pub fn secret(name: impl Into<String>, key: impl Into<String>) -> Self {
        Self {
            selector_type: ResourceSelectorType::Secret,
            env: None,
            filesystem: None,
            secret: Some(SecretSelector { namespace: None, name: name.into(), key: key.into() }),
            literal: None,
        }
    }
}

crate::open_enum! {
    /// The type of a [`ResourceRef`] (PKO `ResourceSelectorType`, a Go string: any value is admitted; one this version
    /// does not know makes the Stack Stalled `SpecInvalid`).
    pub enum ResourceSelectorType {
        /// An environment variable of the operator (refused in v2).
        Env = "Env",
        /// A file on the operator's file system (refused in v2).
        Fs = "FS",
        /// A key of a Kubernetes Secret.
        Secret = "Secret",
        /// A literal value.
        Literal = "Literal",
    }
}

/// Names an environment variable (PKO `EnvSelector`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct EnvSelector {
    /// Name of the environment variable.
    pub name: String,
}

/// Names a file (PKO `FSSelector`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct FsSelector {
    /// Path on the file system.
    pub path: String,
}

/// Names a key of a Secret (PKO `SecretSelector`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct SecretSelector {
    /// Deprecated: namespace of the Secret. Any value other than the Stack's own namespace is refused (cross-namespace
    /// references are not allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the Secret.
    pub name: String,
    /// Key within the Secret.
    pub key: String,
}

/// A literal value (PKO `LiteralRef`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct LiteralRef {
    /// The value.
    pub value: String,
}

/// A subset of `ObjectMeta` for embedded templates (PKO `EmbeddedObjectMeta`): labels and annotations.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct EmbeddedObjectMeta {
    /// Labels to add.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<std::collections::BTreeMap<String, String>>,
    /// Annotations to add.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<std::collections::BTreeMap<String, String>>,
}
