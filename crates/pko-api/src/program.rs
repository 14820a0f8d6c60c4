//! `Program` (`pulumi.com/v1`): a Pulumi YAML program stored in the cluster. The body sits under the top-level
//! `program` key, not `spec` (PKO `operator/api/pulumi/v1/program_types.go`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The fields of a Program: a single `program` key (PKO `Program.program`).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "pulumi.com",
    version = "v1",
    kind = "Program",
    namespaced,
    no_spec,
    status = "ProgramStatus",
    category = "pulumi",
    derive = "PartialEq",
    derive = "Default",
    doc = "A Program is a Pulumi YAML program stored in the cluster, used as the source of Stacks.",
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "URL", type_ = "string", json_path = ".status.artifact.url")
)]
pub struct ProgramFields {
    /// The Pulumi YAML program body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<ProgramSpec>,
}

/// A Pulumi YAML program body (PKO `ProgramSpec`): the keys of a `Pulumi.yaml` after `name`/`runtime`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ProgramSpec {
    /// Configuration the program reads, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<BTreeMap<String, Configuration>>,
    /// Resources, by logical name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<BTreeMap<String, Resource>>,
    /// Variables, by name (any JSON/YAML expression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::json_map")]
    pub variables: Option<BTreeMap<String, serde_json::Value>>,
    /// Stack outputs, by name (any JSON/YAML expression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::json_map")]
    pub outputs: Option<BTreeMap<String, serde_json::Value>>,
    /// Packages (parameterized or VCS packages), name → descriptor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages: Option<BTreeMap<String, String>>,
}

/// A configuration declaration (PKO `Configuration`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Configuration {
    /// Type: `String`, `Number`, `List<Number>` or `List<String>`.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "type")]
    pub config_type: Option<ConfigType>,
    /// Default value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_json")]
    pub default: Option<serde_json::Value>,
}

/// Type of a Program configuration value.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ConfigType {
    /// A string.
    String,
    /// A number.
    Number,
    /// A list of numbers.
    #[serde(rename = "List<Number>")]
    ListNumber,
    /// A list of strings.
    #[serde(rename = "List<String>")]
    ListString,
}

/// A resource declaration (PKO `Resource`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Resource {
    /// Resource type token, e.g. `command:local:Command`.
    #[serde(rename = "type")]
    #[schemars(length(min = 1))]
    pub resource_type: String,
    /// Input properties (any JSON/YAML expression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::json_map")]
    pub properties: Option<BTreeMap<String, serde_json::Value>>,
    /// Read an existing resource instead of managing it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub get: Option<Getter>,
    /// Resource options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Options>,
}

/// Reads an existing resource (PKO `Getter`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Getter {
    /// Provider ID of the resource.
    pub id: String,
    /// State inputs identifying the resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::json_map")]
    pub state: Option<BTreeMap<String, serde_json::Value>>,
}

/// Resource options (PKO `Options`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Options {
    /// Output properties to treat as secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_secret_outputs: Option<Vec<String>>,
    /// Aliases (former URNs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aliases: Option<Vec<String>>,
    /// Timeouts of CRUD operations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_timeouts: Option<CustomTimeouts>,
    /// Delete before creating a replacement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_before_replace: Option<bool>,
    /// Explicit dependencies (expressions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_json")]
    pub depends_on: Option<serde_json::Value>,
    /// Property names whose changes are ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_changes: Option<Vec<String>>,
    /// Import an existing resource with this ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import: Option<String>,
    /// Parent resource (expression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_json")]
    pub parent: Option<serde_json::Value>,
    /// Protect from deletion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protect: Option<bool>,
    /// Explicit provider (expression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_json")]
    pub provider: Option<serde_json::Value>,
    /// Explicit providers for children (expression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_json")]
    pub providers: Option<serde_json::Value>,
    /// Provider plugin version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// Custom timeouts (Go duration strings).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct CustomTimeouts {
    /// Create timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create: Option<String>,
    /// Update timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update: Option<String>,
    /// Delete timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete: Option<String>,
}

/// Observed state of a Program (PKO `ProgramStatus`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProgramStatus {
    /// The `metadata.generation` the artifact was built from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// The rendered program as a Flux-compatible artifact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<Artifact>,
}

/// A downloadable tarball (PKO `Artifact`, deliberately identical in shape to Flux's `Artifact`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    /// Relative path, `programs/<namespace>/<name>/<generation>.tar.gz`.
    pub path: String,
    /// URL to download it from, `http://<advertised address>/programs/<namespace>/<name>/<generation>`.
    pub url: String,
    /// Revision: the Program generation as a string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Digest of the tarball, `sha256:<hex>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$"))]
    pub digest: Option<String>,
    /// When the artifact last changed.
    pub last_update_time: Time,
    /// Size of the tarball in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    /// Free-form metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}
