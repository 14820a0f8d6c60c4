//! Stacks that do not decode ([`crate::informer::lenient`]): a value PKO's schema admits that the
//! Stack's type cannot hold (an `int32` field out of range, say). Such a Stack is in no cache and
//! reaches no reconcile; this reporter marks it Stalled `SpecInvalid` with the field and why, with a
//! Warning `StackConfigInvalid`, once per version and only on the replica holding its shard. Nothing
//! else of the Stack is touched: a fixed spec is reconciled as any other.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::api::{Api, Patch, PatchParams};
use pko_api::Stack;
use pko_api::constants::{event_reason as ev, stack_condition as sc};
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
pub fn stalled_conditions(u: &Undecodable) -> Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>> {
    let message = message(u);
    if conditions::is_stalled_with(&u.conditions, sc::SPEC_INVALID, &message) {
        return None;
    }
    let mut c = u.conditions.clone();
    conditions::mark_stalled(&mut c, sc::SPEC_INVALID, &message, u.meta.generation, &pko_api::conditions::now());
    Some(c)
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
        // pinned to the version read: a newer one (fixed, or written since) is reported on its own
        let patch = json!({"metadata": {"resourceVersion": u.meta.resource_version},
                           "status": {"observedGeneration": u.meta.generation, "conditions": conditions}});
        let api: Api<Stack> = Api::namespaced(ctx.client.clone(), &ns);
        match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
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
            error: "spec.updateTemplate.spec.parallel: invalid value: integer `99999999999`, expected i32".into(),
        };
        let c = stalled_conditions(&u).expect("written the first time");
        let stalled = c.iter().find(|c| c.type_ == sc::STALLED).unwrap();
        assert_eq!((stalled.status.as_str(), stalled.reason.as_str()), ("True", sc::SPEC_INVALID));
        assert!(stalled.message.contains("spec.updateTemplate.spec.parallel"), "{}", stalled.message);
        assert_eq!(stalled.observed_generation, Some(2));
        u.conditions = c;
        assert_eq!(stalled_conditions(&u), None, "said already: no second write");
    }
}
