//! `Stack` (`pulumi.com/v1`, the storage version, and `pulumi.com/v1alpha1`, served, not stored): a Pulumi stack the
//! operator keeps deployed (PKO `operator/api/pulumi/shared/stack_types.go` and
//! `operator/api/pulumi/v1/stack_types.go`, v2.9). Both versions share [`StackSpec`].

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::shared::{EmbeddedObjectMeta, ResourceRef};
use crate::update::{UpdateSpec, UpdateType};
use crate::workspace::{ProjectInfo, WorkspaceSpec};

/// Default and minimum of `spec.resyncFrequencySeconds` (seconds).
pub const MIN_RESYNC_FREQUENCY_SECONDS: i64 = 60;
/// Default of `spec.retryMaxBackoffDurationSeconds` (seconds): 24 h.
pub const DEFAULT_RETRY_MAX_BACKOFF_SECONDS: i64 = 86_400;
/// Maximum length of a Stack name (PKO CEL rule; leaves room for `-workspace` and a hash in pod labels).
pub const MAX_STACK_NAME_LENGTH: usize = 42;

/// Desired state of a Stack (PKO `shared.StackSpec`).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "pulumi.com",
    version = "v1",
    kind = "Stack",
    namespaced,
    status = "StackStatus",
    category = "pulumi",
    derive = "PartialEq",
    derive = "Default",
    doc = "A Stack is a Pulumi stack the operator keeps deployed from a program source.",
    validation = Rule::new("size(self.metadata.name) <= 42").message("Stack name must be no more than 42 characters in \
        length."),
    printcolumn(name = "Stack", type_ = "string", json_path = ".spec.stack", priority = 10),
    printcolumn(name = "Last Update", type_ = "string", json_path = ".status.lastUpdate.state"),
    printcolumn(name = "Age", type_ = "date", json_path = ".status.lastUpdate.lastResyncTime"),
    printcolumn(name = "Last Commit", type_ = "string", json_path = ".status.lastUpdate.lastAttemptedCommit",
        priority = 10),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Reconciling", type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Reconciling\")].reason"),
    printcolumn(name = "Stalled", type_ = "string", json_path = ".status.conditions[?(@.type==\"Stalled\")].reason"),
    printcolumn(name = "Permalink", type_ = "string", json_path = ".status.lastUpdate.permalink")
)]
#[serde(rename_all = "camelCase")]
pub struct StackSpec {
    // --- auth and environment ---
    /// Deprecated: name of a Secret whose key `accessToken` becomes `PULUMI_ACCESS_TOKEN`. Use `envRefs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_token_secret: Option<String>,
    /// Deprecated: names of ConfigMaps whose keys become environment variables. Use `envRefs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envs: Option<Vec<String>>,
    /// Environment variables of the Pulumi process: name → `Literal` or `Secret` reference (`Env` and `FS` make the
    /// Stack Stalled `SpecInvalid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_refs: Option<BTreeMap<String, ResourceRef>>,
    /// Deprecated: names of Secrets whose keys become environment variables. Use `envRefs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_secrets: Option<Vec<String>>,
    /// Backend URL (`PULUMI_BACKEND_URL`): Pulumi Cloud (default), `file://`, `s3://`, `azblob://`, `gs://` or a
    /// self-hosted service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,

    // --- identity and configuration ---
    /// Fully qualified stack name (`org/project/stack`, or `stack`). Required (no minimum length, as PKO: an empty name
    /// fails the Update with Pulumi's message).
    pub stack: String,
    /// Inline configuration: key → string, or any structured JSON value (needs Pulumi CLI ≥ 3.202.0). Keys without
    /// `project:` are prefixed with the project name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::json_map")]
    pub config: Option<BTreeMap<String, serde_json::Value>>,
    /// Configuration from ConfigMap keys: config key → ConfigMap reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_ref: Option<BTreeMap<String, ConfigMapRef>>,
    /// Deprecated: inline secret configuration. Use `secretsRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<BTreeMap<String, String>>,
    /// Secret configuration: config key → `Secret` (or `Literal`) reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets_ref: Option<BTreeMap<String, ResourceRef>>,
    /// Secrets provider for a newly created stack (`pulumi stack init --secrets-provider`), e.g. `passphrase`,
    /// `awskms://…`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets_provider: Option<String>,
    /// Pulumi ESC environments imported by the stack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<Vec<String>>,
    /// Do not create the stack when it does not exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_local_stack_only: Option<bool>,

    // --- source: at most one of projectRepo, fluxSource, programRef ---
    /// Git repository URL holding the program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_repo: Option<String>,
    /// Deprecated: Secret with git credentials (`sshPrivateKey`(+`password`) > `accessToken` > `username`+`password`).
    /// Use `gitAuth`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_auth_secret: Option<String>,
    /// Git credentials (precedence: SSH key > access token > GitHub App > basic auth).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_auth: Option<GitAuthConfig>,
    /// Directory of the repository holding `Pulumi.yaml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_dir: Option<String>,
    /// Commit SHA to deploy; exactly one of `commit` and `branch` with `projectRepo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Branch to track (`main` or `refs/heads/main`), polled every `resyncFrequencySeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// Shallow clone in the workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shallow: Option<bool>,
    /// A Flux source object (any kind with `status.artifact`) holding the program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flux_source: Option<FluxSource>,
    /// A Program object in the Stack's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program_ref: Option<ProgramReference>,

    // --- lifecycle ---
    /// URNs of the only resources to update (up and preview).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<Vec<String>>,
    /// Also update dependents of `targets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_dependents: Option<bool>,
    /// Other Stacks of the namespace that must have succeeded (optionally recently) before this one runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prerequisites: Option<Vec<PrerequisiteRef>>,
    /// Re-run `up` every resync period even when the source revision did not change (drift, dynamic programs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_resync_on_commit_match: Option<bool>,
    /// Resync and branch-poll period in seconds; default 60, values below 60 (0 and negative ones included: no minimum
    /// in the schema, as PKO) mean 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync_frequency_seconds: Option<i64>,
    /// Refresh before up and preview.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<bool>,
    /// Deprecated and ignored by PKO v2: fail when a refresh finds changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_no_refresh_changes: Option<bool>,
    /// Destroy the stack's resources before the Stack object is removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destroy_on_finalize: Option<bool>,
    /// Run the program during destroy (`--run-program`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_program: Option<bool>,
    /// Deprecated and ignored by PKO v2: retry on update conflicts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_on_update_conflict: Option<bool>,
    /// Cap of the failed-update backoff in seconds; default 86400 (24 h). No minimum in the schema (PKO); 0 or negative
    /// retry at once (after 1 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_max_backoff_duration_seconds: Option<i64>,
    /// Consecutive failed updates retried before the Stack is `Stalled` `UpdateFailed` (PKO PR #1322: default 3,
    /// minimum 1 — the Stack stalls when the update after that many retries fails too). A preview may fail once more
    /// before it stalls (PKO #1294).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_update_failures: Option<i64>,
    /// First wait after a failed update, in seconds (default 10, PKO's); each further failure waits
    /// `retryBackoffFactor` times longer, up to `retryMaxBackoffDurationSeconds`. Ours (additive; PKO
    /// #1294, #827).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub retry_backoff_base_seconds: Option<i64>,
    /// Growth of the wait per failed update (default 3, PKO's; 1: a constant wait). Ours (additive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1.0))]
    pub retry_backoff_factor: Option<f64>,
    /// Longest an operation of this Stack may run, in seconds, before it is stopped and its Update fails
    /// `DeadlineExceeded` (ours, additive: the Updates' `spec.timeout`); unset or 0: the operator's
    /// `--operation-timeout`. PKO has none (PKO #1318).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub operation_timeout_seconds: Option<i64>,
    /// Only ever run `preview`; deletion never destroys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<bool>,
    /// `Retain` (default) or `Delete` the Workspace after a successful sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_reclaim_policy: Option<WorkspaceReclaimPolicy>,
    /// Service account of the stack's workspace (must be bound to `system:auth-delegator`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Merged (strategic merge) onto the generated Workspace: image, resources, pod template, log level, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_template: Option<WorkspaceTemplate>,
    /// Merged (strategic merge) onto every generated Update: `ttlAfterCompleted`, `parallel`, `remove`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_template: Option<UpdateTemplate>,
    /// Scheduled drift detection: a preview-only refresh on each cron tick, reported in the `DriftDetected` condition,
    /// optionally remediated with `up --refresh` (PKO's proposed API,
    /// #1037 / branch `eron/drift-detection`; not in a PKO release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift_detection: Option<DriftDetection>,
    /// Plan approval (ours, additive; tofu-controller's `approvePlan`): `mode: manual` runs each change as a preview
    /// that saves a plan and waits for `pulumi.com/approve-plan: <plan id>` before `up --plan` runs exactly it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<crate::approval::Approval>,
}

/// Scheduled drift detection of a Stack (PKO's proposed `DriftDetectionSpec`, #1037).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriftDetection {
    /// When to check; the earliest next tick of all schedules wins. None or empty: no checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedules: Option<Vec<DriftSchedule>>,
}

/// One drift-check schedule (PKO's proposed `DriftSchedule`, #1037).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriftSchedule {
    /// Cron expression in UTC: five fields as in a Kubernetes CronJob (`*/15 * * * *`), the
    /// `@hourly`/`@daily`/`@weekly`/`@monthly`/`@yearly` shorthands, or six fields with leading seconds (ours). Several
    /// ticks missed while the operator was down give one check.
    pub cron: String,
    /// Run `up --refresh` when a check on this schedule finds drift (default false: report only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_remediate: Option<bool>,
}

/// Drift detection state of a Stack (PKO's proposed `DriftDetectionStatus`, #1037, plus ours).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriftDetectionStatus {
    /// When the last drift check ended (PKO).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_check: Option<Time>,
    /// When the next check is due (ours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_check: Option<Time>,
    /// Name of the Update of the last check (ours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_check_update: Option<String>,
    /// The resources the last check found drifted, at most 100 (ours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drifted_resources: Option<Vec<crate::update::ResourceChange>>,
    /// The last check's schedule remediates: an `up --refresh` runs while `DriftDetected` is True (ours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_remediate: Option<bool>,
}

/// A ConfigMap key holding a config value (PKO `ConfigMapRef`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ConfigMapRef {
    /// ConfigMap name (Stack's namespace).
    pub name: String,
    /// Key in the ConfigMap.
    pub key: String,
    /// Parse the value as JSON (structured config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<bool>,
}

/// Git credentials of a Stack (PKO `GitAuthConfig`); only `Secret` references work in v2.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitAuthConfig {
    /// Personal access token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_token: Option<ResourceRef>,
    /// SSH key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_auth: Option<SshAuth>,
    /// User name and password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<BasicAuth>,
    /// GitHub App credentials (PKO 2.7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub github_app: Option<GitHubAppAuth>,
}

/// SSH key authentication (PKO `SSHAuth`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SshAuth {
    /// The private key.
    pub ssh_private_key: ResourceRef,
    /// Its passphrase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<ResourceRef>,
}

/// Basic authentication (PKO `BasicAuth`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BasicAuth {
    /// User name.
    pub user_name: ResourceRef,
    /// Password.
    pub password: ResourceRef,
}

/// GitHub App authentication (PKO 2.7 `GitHubAppAuth`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct GitHubAppAuth {
    /// The App ID.
    #[serde(rename = "appID")]
    pub app_id: ResourceRef,
    /// The installation ID.
    #[serde(rename = "installationID")]
    pub installation_id: ResourceRef,
    /// The App's PEM private key.
    #[serde(rename = "privateKey")]
    pub private_key: ResourceRef,
}

/// A Flux source object holding the program (PKO `FluxSource`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FluxSource {
    /// The source object (same namespace).
    pub source_ref: FluxSourceReference,
    /// Directory of the artifact holding `Pulumi.yaml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
}

/// Reference to a Flux source object (PKO `FluxSourceReference`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FluxSourceReference {
    /// API version, e.g. `source.toolkit.fluxcd.io/v1`.
    pub api_version: String,
    /// Kind, e.g. `GitRepository`, `OCIRepository`, `Bucket`.
    pub kind: String,
    /// Name.
    pub name: String,
}

/// Reference to a Program in the Stack's namespace (PKO `ProgramReference`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ProgramReference {
    /// Program name.
    pub name: String,
}

/// A prerequisite Stack (PKO `PrerequisiteRef`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct PrerequisiteRef {
    /// Name of the Stack (same namespace).
    pub name: String,
    /// Extra requirements beyond "last update succeeded".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requirement: Option<RequirementSpec>,
}

/// Requirements on a prerequisite (PKO `RequirementSpec`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequirementSpec {
    /// The prerequisite must have succeeded within this duration (Go duration, e.g. `1h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::duration")]
    pub succeeded_within_duration: Option<String>,
}

/// Whether a Stack's Workspace is kept after a successful sync (PKO `WorkspaceReclaimPolicy`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum WorkspaceReclaimPolicy {
    /// Keep the Workspace (default).
    #[default]
    Retain,
    /// Delete the Workspace after a successful sync; the next sync recreates it.
    Delete,
}

/// Customisation of a Stack's generated Workspace (PKO `WorkspaceApplyConfiguration`). Only the labels and annotations
/// of the metadata are merged: the operator owns the Workspace's name and namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct WorkspaceTemplate {
    /// Labels and annotations for the Workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<EmbeddedObjectMeta>,
    /// Workspace spec fields to merge; unset fields keep the generated values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<WorkspaceSpec>,
}

/// Customisation of a Stack's generated Updates (PKO `UpdateApplyConfiguration`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct UpdateTemplate {
    /// Labels and annotations for the Updates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<EmbeddedObjectMeta>,
    /// Update spec fields to merge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<UpdateSpec>,
}

/// Outcome of a stack update (`succeeded` or `failed`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StackUpdateStateMessage {
    /// The update succeeded.
    Succeeded,
    /// The update failed.
    Failed,
}

/// The last completed update of a Stack (PKO `StackUpdateState`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StackUpdateState {
    /// Stack generation the update was for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Reconcile request (annotation value) the update was for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconcile_request: Option<String>,
    /// Name of the Update object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Kind of operation.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "type")]
    pub update_type: Option<UpdateType>,
    /// `succeeded` or `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StackUpdateStateMessage>,
    /// Result message of the update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Last source revision attempted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempted_commit: Option<String>,
    /// Last source revision applied successfully.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_commit: Option<String>,
    /// Pulumi Console URL of the update (none for DIY backends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permalink: Option<String>,
    /// When the last resync took place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_resync_time: Option<Time>,
    /// Consecutive failed attempts for this generation and reconcile request (0 on the first failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub failures: Option<i64>,
    /// Ours: the resource change counts of that Update (Pulumi's change summary, step kind → count: `create: 2`,
    /// `same: 5`), as its `status.changeSummary`; absent when it reported none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change_summary: Option<BTreeMap<String, i32>>,
    /// Ours: the `pulumi.com/cancel-request` value that canceled that Update; the Stack waits until its spec, source or
    /// reconciliation request changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_request: Option<String>,
    /// Ours: the run digest of that Update (its `status.runDigest`: what ran — source, stack settings, config and
    /// environment, secrets by reference). A Stack is in sync only while it equals the digest of what its current
    /// generation asks for; absent for an Update that recorded none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_digest: Option<String>,
}

/// The update a Stack waits on (PKO `CurrentStackUpdate`); set before the Update is created.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CurrentStackUpdate {
    /// Stack generation the update is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Reconcile request the update is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconcile_request: Option<String>,
    /// Name of the Update object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Source revision of the update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}

/// Stack outputs: name → JSON value; secret outputs are the string `[secret]`.
pub type StackOutputs = BTreeMap<String, serde_json::Value>;

/// Observed state of a `pulumi.com/v1` Stack (PKO `v1.StackStatus`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StackStatus {
    /// Outputs of the last successful update; secret values are `[secret]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::json_map")]
    pub outputs: Option<StackOutputs>,
    /// The last completed update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update: Option<StackUpdateState>,
    /// `metadata.generation` when the controller last processed the Stack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Last seen value of the `pulumi.com/reconciliation-request` annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_reconcile_request: Option<String>,
    /// Ours: last seen value of the `pulumi.com/cancel-request` annotation (a value seen once cancels at most the
    /// operation running then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_cancel_request: Option<String>,
    /// Ours: last judged value of the `pulumi.com/unlock-request` annotation (accepted or refused: see the Stack's
    /// events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_unlock_request: Option<String>,
    /// Conditions `Ready`, `Reconciling`, `Stalled` (kstatus ready protocol).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Option<Vec<Condition>>,
    /// The update being waited on, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_update: Option<CurrentStackUpdate>,
    /// Project name and runtime, cached so the stack can be destroyed when its source is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_info: Option<ProjectInfo>,
    /// Scheduled drift detection (`spec.driftDetection`): the last and next check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift_detection: Option<DriftDetectionStatus>,
    /// Ours: the plan this Stack saved last under `spec.approval.mode: manual`, and where it stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<crate::approval::StackPlan>,
    /// Ours: the last `pulumi.com/approve-plan` value judged (approved, or refused with an event once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_approval: Option<String>,
    /// Ours: the StackRollout that governs this Stack's new revision, and whether it is admitted or held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::rollout::StackRolloutRef>,
}

/// `pulumi.com/v1alpha1` Stack: served for compatibility (not marked deprecated, as in PKO), not stored. Same spec as
/// v1; its status holds only `outputs` and `lastUpdate`. Both versions are served from the same stored object (no
/// conversion webhook), so reading a v1 object as v1alpha1 drops the other status fields.
pub mod v1alpha1 {
    use kube::CustomResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    use super::{StackOutputs, StackUpdateState};

    /// Spec of a `pulumi.com/v1alpha1` Stack: exactly the v1 [`super::StackSpec`].
    #[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
    #[kube(
        group = "pulumi.com",
        version = "v1alpha1",
        kind = "Stack",
        namespaced,
        status = "StackStatus",
        derive = "PartialEq",
        derive = "Default",
        schema = "disabled"
    )]
    pub struct StackSpec {
        /// The shared Stack spec.
        #[serde(flatten)]
        pub spec: super::StackSpec,
    }

    /// Observed state of a `pulumi.com/v1alpha1` Stack (PKO `v1alpha1.StackStatus`).
    #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct StackStatus {
        /// Outputs of the last successful update; secret values are `[secret]`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub outputs: Option<StackOutputs>,
        /// The last completed update.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub last_update: Option<StackUpdateState>,
    }
}
