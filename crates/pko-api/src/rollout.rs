//! `StackRollout` (`pulumi.com/v1alpha1`, ours, additive): one source change (a new commit, Program generation or Flux
//! artifact) shared by many Stacks, rolled out in ordered steps instead of everywhere at once — Argo CD
//! ApplicationSet's `RollingSync` (steps matching labels, `maxUpdate`) for Stacks, with a pause between steps, a
//! deadline and a failure budget per step. PKO has none. A Stack governed by a rollout whose new revision the rollout
//! has not admitted yet keeps its last good revision, and says so (`status.rollout`, `Reconciling` `RolloutHeld`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The annotation whose new value aborts the rollout of the current revision (`kubectl pko rollout abort`): the
/// Stacks not yet admitted keep their last good revision until the next revision.
pub const ROLLOUT_ABORT_ANNOTATION: &str = "pulumi.com/rollout-abort";

/// The annotation whose new value resumes a halted rollout at its current step, with a new deadline (`kubectl pko
/// rollout resume` also clears `spec.paused`).
pub const ROLLOUT_RESUME_ANNOTATION: &str = "pulumi.com/rollout-resume";

/// Which Stacks of its namespace a rollout governs, and in which order they take a new revision.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "pulumi.com",
    version = "v1alpha1",
    kind = "StackRollout",
    namespaced,
    status = "StackRolloutStatus",
    category = "pulumi",
    derive = "PartialEq",
    derive = "Default",
    doc = "A StackRollout rolls a new source revision shared by the Stacks it selects out in ordered steps.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Step", type_ = "integer", json_path = ".status.step"),
    printcolumn(name = "Revision", type_ = "string", json_path = ".status.revision"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct StackRolloutSpec {
    /// The Stacks of the rollout's namespace it governs: those carrying every one of these labels (empty: every Stack
    /// of the namespace). A Stack two rollouts select is governed by the first by name.
    #[serde(default)]
    pub selector: StackSelector,
    /// The steps, in order. Each takes the governed Stacks carrying its labels that no earlier step took; the Stacks
    /// no step takes form a last step of their own.
    pub steps: Vec<RolloutStep>,
    /// Seconds to wait after a step is done before the next one starts (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub pause_seconds: Option<i64>,
    /// Seconds a step may take from its start until every one of its Stacks runs the revision (default 1800); past
    /// it the rollout halts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub step_deadline_seconds: Option<i64>,
    /// Stacks of one step whose update of the revision may fail before the rollout halts (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub failure_budget: Option<i32>,
    /// Admit no more Stacks while true (`kubectl pko rollout pause` / `resume`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// Whether `labels` carry every label of `wanted`. Pure.
pub fn carries(wanted: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The rollout of `rollouts` that governs a Stack of namespace `ns` with `labels`: the first by name, not being
/// deleted, whose selector the labels carry. The contract between the rollout controller (which counts the Stacks it
/// governs) and the Stack controller (which a governing rollout holds). Pure.
pub fn governing<'a, R: std::ops::Deref<Target = StackRollout>>(
    rollouts: &'a [R],
    ns: &str,
    labels: &BTreeMap<String, String>,
) -> Option<&'a R> {
    rollouts
        .iter()
        .filter(|r| r.metadata.namespace.as_deref() == Some(ns) && r.metadata.deletion_timestamp.is_none())
        .filter(|r| carries(&r.spec.selector.match_labels, labels))
        .min_by(|a, b| a.metadata.name.cmp(&b.metadata.name))
}

/// Labels Stacks carry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StackSelector {
    /// Every one of these labels, with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
}

/// One step of a rollout.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStep {
    /// The governed Stacks carrying every one of these labels (that no earlier step took).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// How many of the step's Stacks update at once: a count (`2`) or a percentage of the step's Stacks (`"25%"`,
    /// rounded up, at least 1); default all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_update: Option<IntOrString>,
}

/// Where a rollout stands (`status.phase`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RolloutPhase {
    /// No revision to roll out.
    #[default]
    Idle,
    /// Admitting the current step's Stacks.
    Progressing,
    /// `spec.paused`: no Stack is admitted.
    Paused,
    /// Every governed Stack that wanted the revision runs it.
    Completed,
    /// A step failed (more failures than the budget, or its deadline passed): no Stack is admitted until
    /// `kubectl pko rollout resume` or a new revision.
    Halted,
    /// Aborted by `kubectl pko rollout abort`: no Stack is admitted until a new revision.
    Aborted,
}

/// What the operator observed of a rollout; written by the holder of its shard only, read by every Stack's.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StackRolloutStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Where it stands.
    #[serde(default)]
    pub phase: RolloutPhase,
    /// The revision being rolled out (what the held Stacks want).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The current step, from 0 (`steps.len()`: the Stacks no step takes).
    #[serde(default)]
    pub step: i32,
    /// When the current step started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_started_at: Option<Time>,
    /// When the current step was done (its pause then runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_done_at: Option<Time>,
    /// The Stacks admitted to the revision, by name: they update to it; the others keep their last good revision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admitted: Vec<String>,
    /// Each step's record for this revision, in order: when it started and ended, how it went.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepRecord>,
    /// Why it halted, or what it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The last `pulumi.com/rollout-abort` value judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_abort: Option<String>,
    /// The last `pulumi.com/rollout-resume` value judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_resume: Option<String>,
    /// `Ready` (True while not Halted or Aborted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Option<Vec<Condition>>,
}

/// One step's record for the revision being rolled out.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    /// Its Stacks that wanted the revision.
    pub stacks: i32,
    /// When it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When every one of its Stacks ran the revision (or failed within the budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_at: Option<Time>,
    /// Its Stacks whose update of the revision failed.
    #[serde(default)]
    pub failed: i32,
    /// Why it halted the rollout, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<String>,
}

/// A Stack's hold by a rollout (`Stack.status.rollout`), written by the Stack's controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StackRolloutRef {
    /// The StackRollout that governs the Stack.
    pub name: String,
    /// The revision the Stack wants and the rollout holds or admitted.
    pub revision: String,
    /// Admitted to it (else held at its last good revision).
    #[serde(default)]
    pub admitted: bool,
    /// Why it is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
