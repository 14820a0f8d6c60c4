//! Cancel requests of running operations (ours; issue "Operate it"): the Stack copies a new `pulumi.com/cancel-request`
//! onto the Update it cancels; this replica's Update controller, which holds the Update's shard, hands the request to
//! the worker following the operation through this registry, and the worker stops it on its agent at the job's epoch
//! (`dispatch.rs`, step **limit**). An Update canceled before it started is failed `Canceled` by the controller itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use kube::ResourceExt;
use pko_api::Update;

/// The cancel request an Update carries (`pulumi.com/cancel-request`, set by its Stack), if any. Pure.
pub fn requested(update: &Update) -> Option<&str> {
    update
        .annotations()
        .get(pko_api::constants::CANCEL_REQUEST_ANNOTATION)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// The Update's `status.message` when it is canceled on `request`. Pure.
pub fn message(request: &str) -> String {
    format!("canceled by request {request:?} (pulumi.com/cancel-request)")
}

/// Cancel requests by operation id, shared by the Update controller (writer) and its workers (reader).
#[derive(Debug, Clone, Default)]
pub struct CancelRequests(Arc<Mutex<HashMap<String, String>>>);

impl CancelRequests {
    /// Records `request` for operation `id`.
    pub fn request(&self, id: &str, request: &str) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).insert(id.to_string(), request.to_string());
    }

    /// The request recorded for operation `id`.
    pub fn get(&self, id: &str) -> Option<String> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).get(id).cloned()
    }

    /// Forgets operation `id` (its dispatch ended).
    pub fn forget(&self, id: &str) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_read_from_the_update_and_handed_over_by_operation() {
        let mut u = Update::new("u", Default::default());
        assert_eq!(requested(&u), None);
        u.metadata.annotations =
            Some([(pko_api::constants::CANCEL_REQUEST_ANNOTATION.to_string(), "t1".to_string())].into());
        assert_eq!(requested(&u), Some("t1"));
        let r = CancelRequests::default();
        r.request("ns/u/uid", "t1");
        assert_eq!(r.clone().get("ns/u/uid").as_deref(), Some("t1"), "clones share the registry");
        r.forget("ns/u/uid");
        assert_eq!(r.get("ns/u/uid"), None);
        assert_eq!(message("t1"), "canceled by request \"t1\" (pulumi.com/cancel-request)");
    }
}
