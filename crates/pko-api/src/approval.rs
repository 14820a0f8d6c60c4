//! Plan approval of a Stack (ours, additive; named by analogy with tofu-controller's `approvePlan` and Atlantis'
//! `apply_requirements: [approved]`): `spec.approval`, and the plan a Stack waits on in `status.plan`. With
//! `mode: manual` a change first runs `pulumi preview --save-plan`; the Stack waits `Reconciling` `AwaitingApproval`
//! until the annotation [`APPROVE_PLAN_ANNOTATION`] names that plan's id, then runs `pulumi up --plan` with exactly
//! that plan. PKO has no approval (its `spec.preview` only previews).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The annotation that approves a Stack's pending plan: its value is the plan's id (`status.plan.id`);
/// `kubectl pko approve stack/<name> --plan <id>` writes it, and so can any GitOps tool. A value that names no
/// pending plan is refused once (a Warning event `ApprovalRefused`) and approves nothing.
pub const APPROVE_PLAN_ANNOTATION: &str = "pulumi.com/approve-plan";

/// How a Stack's changes are approved (`spec.approval`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Approval {
    /// `auto` (the default, PKO's behaviour: a change runs `up` at once) or `manual` (a change runs a preview that
    /// saves a plan, and waits for its approval).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ApprovalMode>,
}

/// When a Stack's change runs (`spec.approval.mode`). Ours, so the schema lists the values: the API server refuses
/// any other, naming the field.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalMode {
    /// A change runs `up` at once (default).
    #[default]
    Auto,
    /// A change runs `preview --save-plan`, then `up --plan` once the plan is approved.
    Manual,
}

/// Where a Stack's saved plan stands (`status.plan.state`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PlanState {
    /// Saved; waiting for approval.
    #[default]
    Pending,
    /// Approved: the constrained `up` was made.
    Approved,
    /// The constrained `up` succeeded.
    Applied,
    /// The constrained `up` failed (e.g. the program no longer does what the plan says); a new preview follows.
    Failed,
    /// A newer revision, config or sync request came before the approval: the plan can no longer be approved.
    Superseded,
}

/// The plan a Stack saved last (`status.plan`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StackPlan {
    /// The plan's id: the first 16 hex digits of the SHA-256 of the plan Pulumi saved. The value
    /// [`APPROVE_PLAN_ANNOTATION`] must hold to approve it.
    pub id: String,
    /// The preview Update that saved it.
    pub update: String,
    /// Where it stands.
    pub state: PlanState,
    /// The Stack generation it was made for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// The reconcile request it was made for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconcile_request: Option<String>,
    /// The source revision it was made from (a commit, a Program generation, a Flux artifact revision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The run digest it was made from (`sha256:<hex>`: source, stack settings, config, environment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_digest: Option<String>,
    /// Pulumi's change summary of the preview, step kind → count (`create: 1`, `same: 3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change_summary: Option<BTreeMap<String, i32>>,
    /// When the preview saved it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Time>,
    /// The constrained `up` that applied it (state `Approved`, `Applied`, `Failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_by: Option<String>,
    /// Why it failed or was superseded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
