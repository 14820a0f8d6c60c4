//! `kubectl pko sync STACK` and `kubectl pko cancel STACK`: a new value (the current time) for PKO's
//! `pulumi.com/reconciliation-request` or our `pulumi.com/cancel-request` annotation on the Stack,
//! with the caller's own kubeconfig and rights (`patch` on `stacks.pulumi.com`) — no new privileged
//! path.

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};

/// PKO's annotation whose new value requests a sync.
pub const SYNC: &str = "pulumi.com/reconciliation-request";
/// Our annotation whose new value cancels the running operation.
pub const CANCEL: &str = "pulumi.com/cancel-request";

/// The Stack kind (`pulumi.com/v1`).
pub fn stacks() -> ApiResource {
    ApiResource { group: "pulumi.com".into(), version: "v1".into(), api_version: "pulumi.com/v1".into(), kind: "Stack".into(), plural: "stacks".into() }
}

/// The merge patch setting `annotation` to `value`. Pure.
pub fn patch(annotation: &str, value: &str) -> serde_json::Value {
    serde_json::json!({"metadata": {"annotations": {annotation: value}}})
}

/// Sets `annotation` of Stack `ns/name` to `value` (field manager `kubectl-pko`).
///
/// Errors: the Stack does not exist, or the API server refused the patch (the message says which).
pub async fn annotate(client: kube::Client, ns: &str, name: &str, annotation: &str, value: &str) -> anyhow::Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(client, ns, &stacks());
    match api.patch(name, &PatchParams { field_manager: Some("kubectl-pko".into()), ..Default::default() }, &Patch::Merge(patch(annotation, value))).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => anyhow::bail!("stack {ns}/{name} not found"),
        Err(kube::Error::Api(e)) if e.code == 403 => anyhow::bail!("forbidden: {}", e.message),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_sets_one_annotation() {
        assert_eq!(patch(CANCEL, "t"), serde_json::json!({"metadata": {"annotations": {"pulumi.com/cancel-request": "t"}}}));
        assert_eq!(stacks().api_version, "pulumi.com/v1");
    }
}
