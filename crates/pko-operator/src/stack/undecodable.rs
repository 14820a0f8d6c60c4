//! Stacks that do not decode ([`crate::informer::lenient`]): a value PKO's schema admits that the Stack's type cannot
//! hold (an `int32` field out of range, say). Such a Stack is in no cache and reaches no reconcile; this reporter marks
//! it Stalled `SpecInvalid` with the field and why, with a Warning `StackConfigInvalid`, once per version and only on
//! the replica holding its shard. Nothing else of the Stack is touched: a fixed spec is reconciled as any other.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Resource;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use pko_api::Stack;
use pko_api::constants::{event_reason as ev, field_manager, stack_condition as sc};
use serde_json::json;

use super::conditions;
use crate::context::Context;
use crate::informer::lenient::Undecodable;
use crate::k8s::{self, Severity};

/// The Stalled message of a Stack that does not decode. Pure.
pub fn message(u: &Undecodable) -> String {
    format!("the Stack's spec cannot be read: {} (the operator leaves the Stack alone until it changes)", u.error)
}

/// The conditions to write on `u`, or `None` when it says so already. Pure.
pub fn stalled_conditions(u: &Undecodable) -> Option<Vec<Condition>> {
    let message = message(u);
    if conditions::is_stalled_with(&u.conditions, sc::SPEC_INVALID, &message) {
        return None;
    }
    let mut c = u.conditions.clone();
    conditions::mark_stalled(&mut c, sc::SPEC_INVALID, &message, u.meta.generation, &pko_api::conditions::now());
    Some(c)
}

/// The status to write on `u`: as stored, with `conditions` and the generation they were judged at. Written whole, by
/// server-side apply under the Stack status's field manager, so the first reconcile of the mended Stack, which applies
/// its status under that manager, replaces the stall. Pure.
pub fn status_patch(u: &Undecodable, conditions: &[Condition]) -> serde_json::Value {
    let mut status = match &u.status {
        serde_json::Value::Object(o) => o.clone(),
        _ => serde_json::Map::new(),
    };
    status.insert("conditions".into(), json!(conditions));
    status.insert("observedGeneration".into(), json!(u.meta.generation));
    // pinned to the version read: a newer one (fixed, or written since) is reported on its own
    json!({"apiVersion": Stack::api_version(&()), "kind": Stack::kind(&()),
           "metadata": {"name": u.meta.name, "resourceVersion": u.meta.resource_version}, "status": status})
}

/// Reports every undecodable Stack of `bad` until the stream ends.
pub async fn report(ctx: Arc<Context>, bad: impl Stream<Item = Undecodable>) {
    let mut bad = std::pin::pin!(bad);
    while let Some(u) = bad.next().await {
        let (ns, name) = (u.meta.namespace.clone().unwrap_or_default(), u.meta.name.clone().unwrap_or_default());
        if !ctx.ownership.owns(&ns, &name) {
            continue;
        }
        let Some(conditions) = stalled_conditions(&u) else { continue };
        // written and read back untyped: the answer is the same Stack, which does not decode either
        let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &ApiResource::erase::<Stack>(&()));
        let params = PatchParams::apply(field_manager::STACK_STATUS).force();
        match api.patch_status(&name, &params, &Patch::Apply(status_patch(&u, &conditions))).await {
            Ok(_) => {
                let stack = Stack { metadata: u.meta.clone(), spec: Default::default(), status: None };
                k8s::publish(&ctx.events.stack, &stack, Severity::Warning, ev::STACK_CONFIG_INVALID, message(&u)).await;
            }
            Err(e) if k8s::is_conflict(&e) || k8s::is_not_found(&e) => {}
            Err(e) => {
                tracing::warn!(stack = %name, namespace = %ns, error = %e, "marking an undecodable Stack stalled")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_undecodable_stack_is_stalled_naming_the_field_once() {
        let mut u = Undecodable {
            meta: kube::api::ObjectMeta { name: Some("big".into()), generation: Some(2), ..Default::default() },
            conditions: Vec::new(),
            status: json!({"outputs": {"url": "https://x"}}),
            error: "spec.updateTemplate.spec.parallel: invalid value: integer `99999999999`, expected i32".into(),
        };
        let c = stalled_conditions(&u).expect("written the first time");
        let stalled = c.iter().find(|c| c.type_ == sc::STALLED).unwrap();
        assert_eq!((stalled.status.as_str(), stalled.reason.as_str()), ("True", sc::SPEC_INVALID));
        assert!(stalled.message.contains("spec.updateTemplate.spec.parallel"), "{}", stalled.message);
        assert_eq!(stalled.observed_generation, Some(2));
        let patch = status_patch(&u, &c);
        assert_eq!(patch["status"]["outputs"]["url"], "https://x", "the rest of the status is kept");
        assert_eq!((&patch["status"]["observedGeneration"], &patch["status"]["conditions"]), (&json!(2), &json!(c)));
        u.conditions = c;
        assert_eq!(stalled_conditions(&u), None, "said already: no second write");
    }
}
