//! `Update` (`auto.pulumi.com/v1alpha1`): one Pulumi operation against a Workspace (PKO
//! `operator/api/auto/v1alpha1/update_types.go`, v2.9).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::workspace::ProjectInfo;

/// Desired state of an Update (PKO `UpdateSpec`). Immutable in practice: the operation runs once.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "auto.pulumi.com",
    version = "v1alpha1",
    kind = "Update",
    namespaced,
    status = "UpdateStatus",
    category = "pulumi",
    derive = "PartialEq",
    derive = "Default",
    doc = "An Update is one Pulumi operation (preview, up, refresh or destroy) against a stack of a Workspace.",
    printcolumn(name = "Workspace", type_ = "string", json_path = ".spec.workspaceName"),
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type", priority = 10),
    printcolumn(name = "Start Time", type_ = "date", json_path = ".status.startTime", priority = 10),
    printcolumn(name = "End Time", type_ = "date", json_path = ".status.endTime", priority = 10),
    printcolumn(
        name = "Progressing",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Progressing\")].status"
    ),
    printcolumn(name = "Failed", type_ = "string", json_path = ".status.conditions[?(@.type==\"Failed\")].status"),
    printcolumn(name = "Complete", type_ = "string", json_path = ".status.conditions[?(@.type==\"Complete\")].status"),
    printcolumn(name = "URL", type_ = "string", json_path = ".status.permalink")
)]
#[serde(rename_all = "camelCase")]
pub struct UpdateSpec {
    /// Name of the Workspace (same namespace) to run the operation in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_name: Option<String>,
    /// The Pulumi stack to select.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_name: Option<String>,
    /// The operation: `preview`, `up`, `refresh` or `destroy`.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "type")]
    pub update_type: Option<UpdateType>,
    /// How long a completed Update is kept before it is deleted (Go duration, e.g. `24h`). Unset: kept forever;
    /// Stack-generated Updates get `24h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::duration")]
    pub ttl_after_completed: Option<String>,
    /// How long the operation may send no event at all (Go duration, e.g. `30m`) before it is stopped (CTRL-C on its
    /// agent) and the Update fails `IdleTimeout` (PKO PR #1296: there, abandoned). Measures silence, not duration: a
    /// slow but talkative operation is never stopped. `0s` disables it; unset: the operator's `--update-idle-timeout`
    /// (30 min).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::duration")]
    pub idle_timeout: Option<String>,
    /// How long the operation may run in all (Go duration, e.g. `2h`) before it is stopped (CTRL-C on its agent) and
    /// the Update fails `DeadlineExceeded`; counted from its start, across a handoff to another replica. Ours
    /// (additive). `0s` disables it; unset: the operator's `--operation-timeout` (none). A Stack sets it from
    /// `spec.operationTimeoutSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::duration")]
    pub timeout: Option<String>,
    /// Resource operations run in parallel (1 for none). Unbounded when unset, 0 or negative (no minimum in the schema,
    /// as PKO).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<i32>,
    /// Message associated with the operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Fail if the operation would make any change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_no_changes: Option<bool>,
    /// URNs of resources to replace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace: Option<Vec<String>>,
    /// URNs of the only resources to operate on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Vec<String>>,
    /// Also operate on dependents of `target`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_dependents: Option<bool>,
    /// Refresh before the operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<bool>,
    /// Continue despite resource errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_on_error: Option<bool>,
    /// Remove the stack and its configuration after a destroy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remove: Option<bool>,
    /// Run the program during destroy and refresh (`--run-program`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_program: Option<bool>,
    /// Refresh without writing state (refresh only): a drift check. Not in a PKO release; PKO's proposed
    /// drift-detection API (#1037, branch `eron/drift-detection`) has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview_only: Option<bool>,
    /// Ours (additive): the Stack generation this Update runs, written by the Stack controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub stack_generation: Option<i64>,
    /// Ours (additive): the Workspace `metadata.generation` the Stack controller applied for this Update; the operation
    /// is built from the Workspace at that generation, read fresh when the operator's cache shows another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub workspace_generation: Option<i64>,
    /// Ours (additive): the source revision this Update runs (a commit, a Program generation, a Flux artifact
    /// revision), as the Stack resolved it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Ours (additive): what this Update must run, `sha256:<hex>` over its Workspace's source, stack settings, config
    /// and environment, secrets by reference (`pko_proto::digest`). The operator and the agent refuse to run anything
    /// else (Failed `RunMismatch`); unset: not checked (made by hand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_digest: Option<String>,
    /// Ours (additive), `preview` only: save the plan of the preview (`pulumi preview --save-plan`); its id lands in
    /// `status.plan`, the plan itself in the operator's plan store (outside etcd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub save_plan: Option<bool>,
    /// Ours (additive), `up` only: the id of a saved plan (`status.plan` of the preview that saved it) the update is
    /// constrained to (`pulumi up --plan`): Pulumi fails it at the first step the plan does not contain. The plan must
    /// have been saved for the Update's Workspace and run digest; otherwise the Update fails without running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
}

crate::open_enum! {
    /// Kind of Pulumi operation of an Update (PKO `UpdateType`, a Go string: any value is admitted; one this version
    /// does not know fails the Update, naming `spec.type`).
    pub enum UpdateType {
        /// `pulumi preview`.
        Preview = "preview",
        /// `pulumi up`.
        Up = "up",
        /// `pulumi destroy`.
        Destroy = "destroy",
        /// `pulumi refresh`.
        Refresh = "refresh",
    }
}

/// Observed state of an Update (PKO `UpdateStatus`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// When the operation started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the operation ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<Time>,
    /// Pulumi Console URL of the operation; none for DIY (file://, s3://, …) backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permalink: Option<String>,
    /// Result message (error text on failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Name of the Secret holding the outputs (`<update>-stack-outputs`, `up` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<String>,
    /// Project name and runtime reported by the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_info: Option<ProjectInfo>,
    /// Conditions; known types: `Progressing`, `Complete`, `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Option<Vec<Condition>>,
    /// Ours: Pulumi's change summary of the operation, step kind → count (`same: 3`, `update: 1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change_summary: Option<std::collections::BTreeMap<String, i32>>,
    /// Ours: the resources a preview-only `refresh` (a drift check) found changed, at most [`MAX_RESOURCE_CHANGES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_changes: Option<Vec<ResourceChange>>,
    /// Ours: the run digest of what the agent ran (`sha256:<hex>`, see `spec.runDigest`), as the agent computed it from
    /// the request it received and ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_digest: Option<String>,
    /// Ours: the id of the plan a `preview` with `spec.savePlan` saved (16 hex digits of its SHA-256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
}

/// Most entries of `status.resourceChanges` (the rest are counted in `changeSummary`).
pub const MAX_RESOURCE_CHANGES: usize = 100;

/// A resource a drift check found changed (ours): an engine event of `pulumi refresh --preview-only`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceChange {
    /// The resource's URN.
    pub urn: String,
    /// Pulumi's step kind: `create`, `update`, `delete`, `replace`, … (in a drift check: `update` for a resource
    /// changed behind Pulumi's back, `delete` for one gone).
    pub op: String,
    /// The properties that differ, when Pulumi names them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub properties: Option<Vec<String>>,
}
