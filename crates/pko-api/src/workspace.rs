//! `Workspace` (`auto.pulumi.com/v1alpha1`): an execution context — one Pulumi project, its program, and the stacks
//! selected in it (PKO `operator/api/auto/v1alpha1/workspace_types.go`, v2.9).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvFromSource, EnvVar, PodSpec, ResourceRequirements, SecretKeySelector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::shared::EmbeddedObjectMeta;

/// Default `spec.serviceAccountName` of a Workspace.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// Default image for the `restricted` security profile.
pub const DEFAULT_IMAGE_RESTRICTED: &str = "pulumi/pulumi:latest-nonroot";
/// Default image for the `baseline` security profile.
pub const DEFAULT_IMAGE_BASELINE: &str = "pulumi/pulumi:latest";
/// Port of the workspace agent's gRPC service.
pub const AGENT_PORT: i32 = 50051;

/// Desired state of a Workspace (PKO `WorkspaceSpec`).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "auto.pulumi.com",
    version = "v1alpha1",
    kind = "Workspace",
    namespaced,
    status = "WorkspaceStatus",
    category = "pulumi",
    derive = "PartialEq",
    derive = "Default",
    doc = "A Workspace is an execution context containing a single Pulumi project, a program, and multiple stacks.",
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.image"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Address", type_ = "string", json_path = ".status.address")
)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceSpec {
    /// Kubernetes service account identity of the workspace pods. Default `default`. It must be bound to
    /// `system:auth-delegator` so the agent can authenticate its callers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Security profile of the pods: `restricted` (default; non-root, Pod Security Standards *restricted*) or
    /// `baseline` (root, *baseline*).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_profile: Option<SecurityProfile>,
    /// Container image holding the `pulumi` CLI. Default `pulumi/pulumi:latest-nonroot` (restricted) or
    /// `pulumi/pulumi:latest` (baseline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Image pull policy of the `pulumi` container: `Always`, `Never` or `IfNotPresent` (Kubernetes default when
    /// unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Git source holding the program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitSource>,
    /// Flux-style artifact (tarball URL + digest) holding the program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flux: Option<FluxSource>,
    /// Program already present in the workspace image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<LocalSource>,
    /// No source: a minimal `Pulumi.yaml` is synthesised from this, so a stack can be destroyed from its state alone
    /// (PKO 2.8, used when a Stack's source is gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_info: Option<ProjectInfo>,
    /// Sources of environment variables of the `pulumi` container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub env_from: Option<Vec<EnvFromSource>>,
    /// Environment variables of the `pulumi` container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub env: Option<Vec<EnvVar>>,
    /// Compute resources of the `pulumi` container. Default requests: memory 64Mi, cpu 100m; no limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Pod template merged (strategic merge) onto the generated pod template; extra init containers run after the
    /// built-in ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<EmbeddedPodTemplateSpec>,
    /// Extra labels and annotations for the generated Service (PKO 2.9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_template: Option<EmbeddedServiceTemplateSpec>,
    /// Pulumi CLI log verbosity (`-v`); 0 or unset disables verbose logging. PKO's `uint32`: 0 to 4294967295 (values
    /// PKO's decoder refuses — negative or larger — are refused at admission).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::uint32")]
    pub pulumi_log_level: Option<u32>,
    /// Skips the `pulumi install` that resolves the program's dependencies and plugins before an operation: the image
    /// already has everything the program needs (vendored dependencies, a prebuilt binary). PKO's proposed
    /// `skipInstall` (PR #1298); a project declaring `runtime.options.binary` skips it without this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_install: Option<bool>,
    /// Stacks this workspace selects (and creates) and configures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub stacks: Option<Vec<WorkspaceStack>>,
}

crate::open_enum! {
    /// Pod security profile of a Workspace (PKO `SecurityProfile`, a Go string: any value is admitted; one this version
    /// does not know makes the Workspace Stalled `SpecInvalid`).
    #[derive(Default)]
    pub enum SecurityProfile {
        /// Runs as root, Pod Security Standards *baseline*.
        Baseline = "baseline",
        /// Runs as uid 1000, no privilege escalation, all capabilities dropped but `NET_BIND_SERVICE` (Pod Security
        /// Standards *restricted*). The default.
        #[default]
        Restricted = "restricted",
    }
}

crate::open_enum! {
    /// Kubernetes image pull policy (`corev1.PullPolicy`, a Go string: any value is admitted; one this version does not
    /// know makes the Workspace Stalled `SpecInvalid`).
    pub enum PullPolicy {
        /// Always pull.
        Always = "Always",
        /// Never pull; the image must be present on the node.
        Never = "Never",
        /// Pull only when the image is not present.
        IfNotPresent = "IfNotPresent",
    }
}

/// A git source (PKO `auto.GitSource`). The Stack controller always puts a resolved commit SHA in `ref`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitSource {
    /// Repository URL (`https://…`, `ssh://…` or `git@host:org/repo.git` for SSH keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Ref to fetch: a commit SHA, a tag or a branch.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "ref")]
    pub git_ref: Option<String>,
    /// Directory of the repository holding `Pulumi.yaml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    /// Credentials for the clone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<GitAuth>,
    /// Shallow clone (no history).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shallow: Option<bool>,
}

/// Git credentials of a Workspace, as Secret key references (PKO `auto.GitAuth`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitAuth {
    /// SSH private key (the URL must then be `git@host:org/repo.git`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_private_key: Option<SecretKeySelector>,
    /// User name for basic auth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<SecretKeySelector>,
    /// Password for basic auth, or the passphrase of the SSH key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<SecretKeySelector>,
    /// Personal access token (sent as basic auth with user `git`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<SecretKeySelector>,
    /// GitHub App credentials (PKO 2.7), exchanged for an installation token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub github_app: Option<GitHubAppSecretAuth>,
}

/// GitHub App credentials as Secret key references.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct GitHubAppSecretAuth {
    /// The App ID.
    #[serde(default, rename = "appID", skip_serializing_if = "Option::is_none")]
    pub app_id: Option<SecretKeySelector>,
    /// The installation ID.
    #[serde(default, rename = "installationID", skip_serializing_if = "Option::is_none")]
    pub installation_id: Option<SecretKeySelector>,
    /// The App's PEM private key.
    #[serde(default, rename = "privateKey", skip_serializing_if = "Option::is_none")]
    pub private_key: Option<SecretKeySelector>,
}

/// A Flux-style artifact (PKO `auto.FluxSource`): a gzipped tarball verified against its digest.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FluxSource {
    /// URL of the tarball.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Digest of the tarball, `sha256:<hex>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Directory in the artifact holding `Pulumi.yaml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
}

/// A program inside the workspace image (PKO `auto.LocalSource`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct LocalSource {
    /// Directory in the image holding `Pulumi.yaml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
}

/// Name and runtime of a Pulumi project (PKO `ProjectInfo`), as read from `Pulumi.yaml`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ProjectInfo {
    /// Project name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Project runtime (`yaml`, `nodejs`, `python`, `go`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
}

/// An embedded pod template (PKO `EmbeddedPodTemplateSpec`): reduced metadata and a full `PodSpec`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct EmbeddedPodTemplateSpec {
    /// Labels and annotations for the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<EmbeddedObjectMeta>,
    /// Pod spec merged onto the generated one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodSpec>,
}

/// An embedded Service template (PKO 2.9 `serviceTemplate`): labels and annotations only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct EmbeddedServiceTemplateSpec {
    /// Labels and annotations for the generated Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<EmbeddedObjectMeta>,
}

/// A stack of a Workspace (PKO `WorkspaceStack`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceStack {
    /// Stack name (`stack` or `org/project/stack`).
    pub name: String,
    /// Create the stack when it does not exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create: Option<bool>,
    /// Secrets provider for a newly created stack (`pulumi stack init --secrets-provider`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets_provider: Option<String>,
    /// Configuration to set on the stack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["key"]))]
    pub config: Option<Vec<ConfigItem>>,
    /// Pulumi ESC environments imported by the stack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub environment: Option<Vec<String>>,
}

/// One configuration value of a stack (PKO `ConfigItem`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct ConfigItem {
    /// Configuration key (`project:name` or `name`), or a path when `path` is true.
    pub key: String,
    /// The key is a property path (`a.b[0]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<bool>,
    /// The value: a string, or (Pulumi CLI ≥ 3.202.0) any structured JSON value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_json")]
    pub value: Option<serde_json::Value>,
    /// Read the value from the environment or a file of the `pulumi` container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<ConfigValueFrom>,
    /// Store the value as a secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<bool>,
}

/// Where a [`ConfigItem`] value comes from (PKO `ConfigValueFrom`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct ConfigValueFrom {
    /// Environment variable of the `pulumi` container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// Path of a file in the `pulumi` container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Parse the value as JSON (structured config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<bool>,
}

/// Observed state of a Workspace (PKO `WorkspaceStatus`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// gRPC address of the agent, `<workspace>-workspace.<namespace>:50051` for the pod runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Version of the Pulumi CLI in the workspace (PKO 2.9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulumi_version: Option<String>,
    /// The agent pool this Workspace's operations run on, `<namespace>/<class>` — the Workspaces with the same
    /// namespace, service account, image, pod template and log level share one pool (our extension: in PKO each
    /// Workspace has its own pod). Unset when the Workspace has its own agent (`address`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Conditions; known type: `Ready` (and `Stalled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Option<Vec<Condition>>,
}

impl WorkspaceSpec {
    /// Whether the spec names a program source (`git`, `flux`, `local` or `projectInfo`). A Workspace without one is
    /// PKO's source-less Workspace: an init container of its pod (`podTemplate`) puts the program in
    /// `/share/workspace`, which only a workspace pod has.
    pub fn has_source(&self) -> bool {
        self.git.is_some() || self.flux.is_some() || self.local.is_some() || self.project_info.is_some()
    }

    /// The spec with PKO's defaults filled in where unset: service account `default`, profile `restricted`, the
    /// profile's image, requests memory 64Mi / cpu 100m — each only where the user set neither that request (or set
    /// it to zero, as PKO's `IsZero`) nor a limit for it.
    pub fn with_defaults(&self) -> WorkspaceSpec {
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let mut s = self.clone();
        s.service_account_name.get_or_insert_with(|| DEFAULT_SERVICE_ACCOUNT.to_string());
        let profile = s.security_profile.get_or_insert(SecurityProfile::Restricted).clone();
        // PKO: the non-root image unless the profile is `baseline`
        s.image.get_or_insert_with(|| match profile {
            SecurityProfile::Baseline => DEFAULT_IMAGE_BASELINE.to_string(),
            _ => DEFAULT_IMAGE_RESTRICTED.to_string(),
        });
        // PKO's webhook, per field: a request the user did not set gets its default — unless the user
        // set a limit for it, which Kubernetes then takes as the request (PKO would request 64Mi under
        // a lower limit, which the API server refuses)
        let resources = s.resources.get_or_insert_with(Default::default);
        for (name, default) in [("memory", "64Mi"), ("cpu", "100m")] {
            let limited = resources.limits.as_ref().is_some_and(|l| l.contains_key(name));
            let requests = resources.requests.get_or_insert_with(BTreeMap::new);
            let zero = |q: &Quantity| {
                q.0.trim().trim_end_matches(|c: char| c.is_ascii_alphabetic()).parse::<f64>().is_ok_and(|v| v == 0.0)
            };
            if !limited && requests.get(name).is_none_or(zero) {
                requests.insert(name.to_string(), Quantity(default.into()));
            }
        }
        if resources.requests.as_ref().is_some_and(BTreeMap::is_empty) {
            resources.requests = None;
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn resources(json: serde_json::Value) -> WorkspaceSpec {
        WorkspaceSpec { resources: Some(serde_json::from_value(json).unwrap()), ..Default::default() }
    }

    fn requests(s: &WorkspaceSpec) -> BTreeMap<String, String> {
        s.with_defaults()
            .resources
            .unwrap()
            .requests
            .unwrap_or_default()
            .into_iter()
            .map(|(k, Quantity(v))| (k, v))
            .collect()
    }

    #[test]
    fn resource_requests_default_per_field_as_pko() {
        let both =
            BTreeMap::from([("cpu".to_string(), "100m".to_string()), ("memory".to_string(), "64Mi".to_string())]);
        assert_eq!(requests(&WorkspaceSpec::default()), both);
        let cpu_only = requests(&resources(serde_json::json!({"requests": {"cpu": "2"}})));
        assert_eq!(
            cpu_only,
            BTreeMap::from([("cpu".to_string(), "2".to_string()), ("memory".to_string(), "64Mi".to_string())]),
            "the memory request still defaults"
        );
        let zero = requests(&resources(serde_json::json!({"requests": {"cpu": "0", "memory": "0Mi"}})));
        assert_eq!(zero, both, "a zero request is defaulted (PKO's IsZero)");
        let limited = requests(&resources(serde_json::json!({"limits": {"memory": "32Mi"}})));
        assert_eq!(
            limited,
            BTreeMap::from([("cpu".to_string(), "100m".to_string())]),
            "a limit is left to Kubernetes as the request, never a request above it"
        );
    }
}
