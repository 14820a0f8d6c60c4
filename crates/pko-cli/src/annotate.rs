//! `kubectl pko sync STACK`, `kubectl pko cancel STACK` and `kubectl pko unlock STACK`: a new value (the current time)
//! for PKO's `pulumi.com/reconciliation-request` or our `pulumi.com/cancel-request` or `pulumi.com/unlock-request`
//! annotation on the Stack, with the caller's own kubeconfig and rights (`patch` on `stacks.pulumi.com`) — no new
//! privileged path.

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};

/// PKO's annotation whose new value requests a sync.
pub const SYNC: &str = "pulumi.com/reconciliation-request";
/// Our annotation whose new value cancels the running operation.
pub const CANCEL: &str = "pulumi.com/cancel-request";

/// Our annotation whose new value asks to release the backend locks the Stack's last Update failed on; the operator
/// accepts or refuses it with an event ([`unlock_verdict`]).
pub const UNLOCK: &str = "pulumi.com/unlock-request";

/// Event reason of an accepted unlock request.
pub const UNLOCK_ACCEPTED: &str = "StackUnlockAccepted";
/// Event reason of a refused unlock request.
pub const UNLOCK_REFUSED: &str = "StackUnlockRefused";

/// The operator's verdict on the unlock request sent at `since` (RFC 3339), from the Stack's events (`core/v1` Event
/// JSON): `(accepted, note)` of the newest `StackUnlockAccepted`/`StackUnlockRefused` event recorded at or after
/// `since` (to the second); `None` while there is none. Pure.
pub fn unlock_verdict(events: &[serde_json::Value], since: &str) -> Option<(bool, String)> {
    let since: k8s_openapi::jiff::Timestamp = since.parse().ok()?;
    let at = |e: &serde_json::Value| -> Option<k8s_openapi::jiff::Timestamp> {
        [&e["eventTime"], &e["lastTimestamp"], &e["metadata"]["creationTimestamp"]]
            .into_iter()
            .find_map(|t| t.as_str()?.parse().ok())
    };
    events
        .iter()
        .filter(|e| e["reason"] == UNLOCK_ACCEPTED || e["reason"] == UNLOCK_REFUSED)
        .filter_map(|e| Some((at(e)?, e)))
        .filter(|(t, _)| *t + std::time::Duration::from_secs(1) >= since)
        .max_by_key(|(t, _)| *t)
        .map(|(_, e)| {
            (
                e["reason"] == UNLOCK_ACCEPTED,
                e["message"].as_str().or(e["note"].as_str()).unwrap_or_default().to_string(),
            )
        })
}

/// The Stack kind (`pulumi.com/v1`).
pub fn stacks() -> ApiResource {
    ApiResource {
        group: "pulumi.com".into(),
        version: "v1".into(),
        api_version: "pulumi.com/v1".into(),
        kind: "Stack".into(),
        plural: "stacks".into(),
    }
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
    match api
        .patch(
            name,
            &PatchParams { field_manager: Some("kubectl-pko".into()), ..Default::default() },
            &Patch::Merge(patch(annotation, value)),
        )
        .await
    {
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
    fn the_verdict_is_the_newest_unlock_event_since_the_request() {
        use serde_json::json;
        let ev = |reason: &str, t: &str, m: &str| json!({"reason": reason, "eventTime": t, "message": m});
        let events = [
            ev(UNLOCK_REFUSED, "2026-11-26T10:00:00.000000Z", "old"),
            ev("StackUpdateFailure", "2026-11-26T10:05:00.000000Z", "x"),
            ev(UNLOCK_REFUSED, "2026-11-26T10:05:01.000000Z", "the lock held by me@laptop (pid 7) is kept"),
        ];
        assert_eq!(
            unlock_verdict(&events, "2026-11-26T10:05:00Z"),
            Some((false, "the lock held by me@laptop (pid 7) is kept".into()))
        );
        assert_eq!(
            unlock_verdict(&events[..2], "2026-11-26T10:05:00Z"),
            None,
            "the earlier request's verdict is not this one's"
        );
        let accepted = [json!({"reason": UNLOCK_ACCEPTED, "lastTimestamp": "2026-11-26T10:05:02Z",
                "message": "releasing 1 backend lock(s)"})];
        assert_eq!(unlock_verdict(&accepted, "2026-11-26T10:05:00Z").map(|v| v.0), Some(true));
    }

    #[test]
    fn the_patch_sets_one_annotation() {
        assert_eq!(
            patch(CANCEL, "t"),
            serde_json::json!({"metadata": {"annotations": {"pulumi.com/cancel-request": "t"}}})
        );
        assert_eq!(stacks().api_version, "pulumi.com/v1");
    }
}
