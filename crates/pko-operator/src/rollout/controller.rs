//! The StackRollout controller: the holder of a rollout's shard reads the Stacks it governs (one list from the API
//! server's watch cache: in a fleet the Stacks are spread over every replica's shards) and writes the rollout's next
//! status ([`super::plan`]) once per change. A short driver over three steps: `stacks` (I/O), `advance` (pure), one
//! status write.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use pko_api::rollout::{ROLLOUT_ABORT_ANNOTATION, ROLLOUT_RESUME_ANNOTATION, RolloutPhase, StackRolloutStatus};
use pko_api::stack::StackUpdateStateMessage;
use pko_api::{Stack, StackRollout};

use super::plan::{self, Requests, StackView};
use crate::context::Context;

/// The field manager of the rollout's status.
pub const STATUS_FIELD_MANAGER: &str = "pulumi-kubernetes-operator/rollout-status";

/// How often a rollout with nothing to do looks for Stacks that want a new revision, when no Stack of this replica's
/// shards woke it: 15 seconds.
const IDLE_RECHECK: Duration = Duration::from_secs(15);

/// A rollout reconcile's failure, by step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Listing the governed Stacks failed.
    #[error("listing the stacks: {0}")]
    Stacks(kube::Error),
    /// Writing the status failed.
    #[error("writing the status: {0}")]
    Status(kube::Error),
}

impl crate::k8s::ReconcileError for Error {
    fn step(&self) -> &'static str {
        match self {
            Error::Stacks(_) => "stacks",
            Error::Status(_) => "status",
        }
    }
}

/// What the rollout controller's reconciles share.
pub struct RolloutController {
    /// The operator's context.
    pub ctx: Arc<Context>,
    /// Every rollout (a Stack two rollouts select is governed by the first by name).
    pub rollouts: Store<StackRollout>,
}

/// What the rollout `name` reads of `stack`. Pure.
pub fn view(stack: &Stack, name: &str) -> StackView {
    let status = stack.status.as_ref();
    let last = status.and_then(|s| s.last_update.as_ref());
    StackView {
        name: stack.name_any(),
        labels: stack.labels().clone(),
        wants: status.and_then(|s| s.rollout.as_ref()).filter(|r| r.name == name).map(|r| r.revision.clone()),
        runs: last.and_then(|l| l.last_successful_commit.clone()),
        failed: last
            .filter(|l| l.state == Some(StackUpdateStateMessage::Failed))
            .and_then(|l| l.last_attempted_commit.clone()),
        source: source(stack),
    }
}

/// Where `stack` takes its revisions from, as a key two Stacks share when they learn the same revisions: its Program
/// (`program:<name>`), its Flux source (`flux:<kind>/<name>`), or its git repository and branch or commit
/// (`git:<repo>@<branch|commit>`; `spec.repoDir` does not change the revision). `None` when it has none. Pure.
pub fn source(stack: &Stack) -> Option<String> {
    let spec = &stack.spec;
    if let Some(p) = &spec.program_ref {
        return Some(format!("program:{}", p.name));
    }
    if let Some(f) = &spec.flux_source {
        return Some(format!("flux:{}/{}", f.source_ref.kind, f.source_ref.name));
    }
    let at = spec.commit.as_deref().or(spec.branch.as_deref()).unwrap_or_default();
    spec.project_repo.as_ref().map(|repo| format!("git:{repo}@{at}"))
}

/// The annotation values of `rollout` not judged yet. Pure.
pub fn requests(rollout: &StackRollout) -> Requests {
    let status = rollout.status.clone().unwrap_or_default();
    let new =
        |a: &str, seen: &Option<String>| rollout.annotations().get(a).filter(|v| Some(*v) != seen.as_ref()).cloned();
    Requests {
        abort: new(ROLLOUT_ABORT_ANNOTATION, &status.observed_abort),
        resume: new(ROLLOUT_RESUME_ANNOTATION, &status.observed_resume),
    }
}

/// Step **stacks**: the Stacks of the rollout's namespace that it governs, as it reads them.
///
/// Errors: [`Error::Stacks`].
async fn stacks(c: &RolloutController, rollout: &StackRollout) -> Result<Vec<StackView>, Error> {
    let ns = rollout.namespace().unwrap_or_default();
    let selector: Vec<String> = rollout.spec.selector.match_labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let params = ListParams::default().match_any().labels(&selector.join(","));
    let listed = Api::<Stack>::namespaced(c.ctx.client.clone(), &ns).list(&params).await.map_err(Error::Stacks)?;
    let rollouts = c.rollouts.state();
    let name = rollout.name_any();
    Ok(listed
        .items
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .filter(|s| pko_api::rollout::governing(&rollouts, &ns, s.labels()).is_some_and(|r| r.name_any() == name))
        .map(|s| view(s, &name))
        .collect())
}

/// One reconcile of a rollout (its shard's holder only): its Stacks, its next status, one write when it changed.
///
/// Errors: [`Error`], by step.
pub async fn reconcile(rollout: Arc<StackRollout>, c: Arc<RolloutController>) -> Result<Action, Error> {
    let (ns, name) = (rollout.namespace().unwrap_or_default(), rollout.name_any());
    if !c.ctx.ownership.owns(&ns, &name) {
        return Ok(Action::await_change());
    }
    let views = stacks(&c, &rollout).await?;
    let old = rollout.status.clone().unwrap_or_default();
    let now = pko_api::conditions::now();
    let (mut next, again) = plan::advance(&rollout.spec, &old, &views, &requests(&rollout), &now);
    next.observed_generation = rollout.meta().generation;
    next.conditions = Some(conditions(&old, &next, rollout.meta().generation, &now));
    if next != old {
        if !c.ctx.ownership.owns(&ns, &name) {
            return Ok(Action::await_change());
        }
        let api = Api::<StackRollout>::namespaced(c.ctx.client.clone(), &ns);
        crate::k8s::apply_status(&api, &name, STATUS_FIELD_MANAGER, &next).await.map_err(Error::Status)?;
        if next.phase != old.phase || next.step != old.step {
            tracing::info!(rollout = %format!("{ns}/{name}"), phase = ?next.phase, step = next.step,
                revision = ?next.revision, admitted = next.admitted.len(), "rollout");
        }
    }
    Ok(Action::requeue(again.unwrap_or(IDLE_RECHECK)))
}

/// `Ready`: False while Halted or Aborted (the message says why), else True. Transition times kept. Pure.
fn conditions(
    old: &StackRolloutStatus,
    next: &StackRolloutStatus,
    generation: Option<i64>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    let mut conditions = old.conditions.clone().unwrap_or_default();
    let (status, reason) = match next.phase {
        RolloutPhase::Halted => ("False", "Halted"),
        RolloutPhase::Aborted => ("False", "Aborted"),
        _ => ("True", "Succeeded"),
    };
    let message = next.message.clone().unwrap_or_default();
    pko_api::conditions::set(&mut conditions, "Ready", status, reason, &message, generation, now);
    conditions
}

/// The rollout controller over the StackRollout informer (watched whole), woken also by the Stacks of this replica's
/// shards that it governs.
pub fn controller(
    ctx: Arc<Context>,
    informers: &mut crate::informer::Informers,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let rollouts = informers.rollouts().store();
    let state = Arc::new(RolloutController { ctx: ctx.clone(), rollouts: rollouts.clone() });
    let mut controller = kube::runtime::Controller::for_stream(informers.rollouts().objects(), rollouts.clone());
    if let Some(ticks) = ctx.shards_gained_ticks() {
        // watched whole: one that was not ours may be now
        controller = controller.reconcile_all_on(ticks);
    }
    let by_stack = rollouts.clone();
    let controller = controller.watches_stream(informers.stacks().objects(), move |s: Stack| {
        let ns = s.namespace().unwrap_or_default();
        pko_api::rollout::governing(&by_stack.state(), &ns, s.labels()).map(|r| ObjectRef::from_obj(&**r))
    });
    async move { crate::k8s::run_controller(controller, ctx.running(), "rollout", reconcile, state).await }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(spec: serde_json::Value) -> Stack {
        serde_json::from_value(serde_json::json!({"apiVersion": "pulumi.com/v1", "kind": "Stack",
            "metadata": {"name": "s", "namespace": "ns"}, "spec": spec}))
        .unwrap()
    }

    #[test]
    fn stacks_that_learn_the_same_revisions_share_their_source_key() {
        let at = |dir: &str, branch: &str| {
            source(&stack(serde_json::json!({"stack": "s", "projectRepo": "https://g/r", "repoDir": dir,
                "branch": branch})))
        };
        assert_eq!(at("a", "main"), at("b", "main"), "the directory does not change the revision");
        assert_ne!(at("a", "main"), at("a", "next"));
        let program = source(&stack(serde_json::json!({"stack": "s", "programRef": {"name": "p"}})));
        assert_eq!(program.as_deref(), Some("program:p"));
        let flux = stack(serde_json::json!({"stack": "s", "fluxSource":
            {"sourceRef": {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "g"}}}));
        assert_eq!(source(&flux).as_deref(), Some("flux:GitRepository/g"));
        assert_eq!(source(&stack(serde_json::json!({"stack": "s"}))), None);
    }
}
