//! Saved plans at dispatch (`spec.savePlan`, `spec.plan`; [`pko_queue::plans`]): a preview's plan is kept before its
//! Update is written succeeded, so a Stack never waits on a plan that is not kept; an `up` constrained to a plan gets
//! the kept bytes in its request, only when they are the plan it names and were saved for the run it makes.

use kube::ResourceExt;
use pko_api::Update;
use pko_proto::v1::{OperationRequest, OperationResult};
use pko_queue::plans::{PlanMeta, PlanStore, SavedPlan};

/// The plan store's key of `update`'s Stack: `<namespace>/<workspace>` (a Stack's Workspace bears its name).
pub fn stack_key(update: &Update) -> String {
    format!("{}/{}", update.namespace().unwrap_or_default(), update.spec.workspace_name.as_deref().unwrap_or_default())
}

/// Whether the kept plan `kept` is the plan `id` an `up` of run digest `run_digest` may run. `Err`: the Update's
/// message. Pure.
pub fn check(kept: Option<&PlanMeta>, id: &str, run_digest: Option<&str>) -> Result<(), String> {
    let Some(kept) = kept else {
        return Err(format!(
            "plan {id} is not kept (expired, or lost with the only replica that kept it): nothing ran; the Stack \
                previews again"
        ));
    };
    if kept.id != id {
        return Err(format!("plan {id} was superseded by plan {} (Update {}): nothing ran", kept.id, kept.update));
    }
    match run_digest {
        Some(d) if d != kept.run_digest => Err(format!(
            "plan {id} was saved for run {} and this Update runs {d} (its source, config or environment changed): \
                nothing ran",
            kept.run_digest
        )),
        _ => Ok(()),
    }
}

/// Step **prepare**, for an `up` with `spec.plan`: the kept plan's bytes into `req`. `Ok(Err(message))`: not the plan
/// to run ([`check`]): the Update fails with it.
///
/// Errors: the store did not answer (the message; retried later).
pub async fn attach(
    store: &dyn PlanStore,
    update: &Update,
    req: &mut OperationRequest,
) -> Result<Result<(), String>, String> {
    let Some(id) = update.spec.plan.as_deref().filter(|p| !p.is_empty()) else { return Ok(Ok(())) };
    let kept = store.get(&stack_key(update)).await.map_err(|e| format!("reading plan: {e}"))?;
    if let Err(message) = check(kept.as_ref().map(|k| &k.meta), id, update.spec.run_digest.as_deref()) {
        return Ok(Err(message));
    }
    if let (Some(options), Some(kept)) = (req.options.as_mut(), kept) {
        options.plan = kept.bytes;
    }
    Ok(Ok(()))
}

/// What a finished preview with `spec.savePlan` leaves to keep: `Ok(None)` for any other operation or a failed one;
/// `Err` when a succeeded one returned no plan, or one whose id is not its bytes'. Pure.
pub fn saved(update: &Update, result: &OperationResult, now: &str) -> Result<Option<SavedPlan>, String> {
    let succeeded = result.status == pko_proto::v1::ResultStatus::Succeeded as i32;
    if update.spec.save_plan != Some(true) || !succeeded {
        return Ok(None);
    }
    if result.plan.is_empty() {
        return Err("the agent returned no plan (an agent older than this operator ignores spec.savePlan)".into());
    }
    let id = pko_proto::plan::id(&result.plan);
    if id != result.plan_id {
        return Err(format!("the agent named plan {} but returned plan {id}", result.plan_id));
    }
    let meta = PlanMeta {
        id,
        update: update.name_any(),
        run_digest: update.spec.run_digest.clone().unwrap_or_else(|| result.run_digest.clone()),
        revision: update.spec.revision.clone().unwrap_or_else(|| result.revision.clone()),
        saved: now.to_string(),
    };
    Ok(Some(SavedPlan { meta, bytes: result.plan.clone() }))
}

/// Step **record**, for a preview with `spec.savePlan`: the plan kept; its id, or why the preview fails instead.
pub async fn keep(store: &dyn PlanStore, update: &Update, result: &OperationResult) -> Result<Option<String>, String> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let Some(plan) = saved(update, result, &now)? else { return Ok(None) };
    store.put(&stack_key(update), &plan).await.map_err(|e| format!("the plan could not be kept: {e}"))?;
    metrics::histogram!(crate::metric_names::PLAN_BYTES).record(plan.bytes.len() as f64);
    Ok(Some(plan.meta.id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_proto::v1::ResultStatus;

    fn meta(id: &str, digest: &str) -> PlanMeta {
        PlanMeta {
            id: id.into(),
            update: "s-1".into(),
            run_digest: digest.into(),
            revision: "r".into(),
            saved: "t".into(),
        }
    }

    #[test]
    fn an_up_runs_only_the_kept_plan_it_names_for_the_run_it_was_saved_for() {
        assert!(check(Some(&meta("a", "sha256:1")), "a", Some("sha256:1")).is_ok());
        assert!(check(Some(&meta("a", "sha256:1")), "a", None).is_ok(), "an Update made by hand names no digest");
        let superseded = check(Some(&meta("b", "sha256:1")), "a", Some("sha256:1")).unwrap_err();
        assert!(superseded.contains("superseded by plan b"), "{superseded}");
        let other_run = check(Some(&meta("a", "sha256:1")), "a", Some("sha256:2")).unwrap_err();
        assert!(other_run.contains("saved for run sha256:1"), "{other_run}");
        assert!(check(None, "a", None).unwrap_err().contains("not kept"));
    }

    #[test]
    fn a_preview_that_saves_a_plan_keeps_it_only_when_it_is_the_plan_named() {
        let mut u = Update::new("s-1", Default::default());
        u.spec.workspace_name = Some("s".into());
        u.spec.run_digest = Some("sha256:9".into());
        u.metadata.namespace = Some("ns".into());
        let bytes = b"{\"resourcePlans\":{}}".to_vec();
        let ok = OperationResult {
            status: ResultStatus::Succeeded as i32,
            plan_id: pko_proto::plan::id(&bytes),
            plan: bytes.clone(),
            ..Default::default()
        };
        assert_eq!(saved(&u, &ok, "t").unwrap(), None, "no spec.savePlan: nothing kept");
        u.spec.save_plan = Some(true);
        let plan = saved(&u, &ok, "t").unwrap().unwrap();
        assert_eq!((plan.meta.id.as_str(), plan.meta.run_digest.as_str()), (ok.plan_id.as_str(), "sha256:9"));
        assert_eq!(stack_key(&u), "ns/s");
        let failed = OperationResult { status: ResultStatus::Failed as i32, ..ok.clone() };
        assert_eq!(saved(&u, &failed, "t").unwrap(), None);
        let none = OperationResult { plan: Vec::new(), ..ok.clone() };
        assert!(saved(&u, &none, "t").unwrap_err().contains("no plan"));
        let forged = OperationResult { plan_id: "0000000000000000".into(), ..ok };
        assert!(saved(&u, &forged, "t").unwrap_err().contains("returned plan"));
    }
}
