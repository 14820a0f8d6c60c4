//! The Stack finalizer (PKO `finalizer.pulumi.com/destroy` on `Stack`), added and removed the way
//! kube-runtime's `finalizer` does: a JSON patch whose `test` operations pin the list as read.

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use pko_api::Stack;
use pko_api::constants::STACK_FINALIZER;
use serde_json::json;

/// Adds (`add`) or removes the Stack finalizer with a JSON patch whose `test` operations pin the
/// finalizer list as read (kube-runtime's `finalizer` pattern): another controller's finalizer is never
/// clobbered, and a status write of the same pass (which moves `resourceVersion`) is no conflict.
pub(super) async fn set_finalizers(api: &Api<Stack>, stack: &Stack, add: bool) -> Result<(), kube::Error> {
    let patch = finalizer_patch(stack.finalizers(), add);
    if patch.is_empty() {
        return Ok(());
    }
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(patch)).map_err(kube::Error::SerdeError)?;
    api.patch(&stack.name_any(), &PatchParams::default(), &Patch::<()>::Json(patch)).await?;
    Ok(())
}

/// The JSON patch operations that add or remove [`STACK_FINALIZER`] given the current list (empty: nothing
/// to do). Pure.
fn finalizer_patch(current: &[String], add: bool) -> Vec<serde_json::Value> {
    let at = current.iter().position(|f| f == STACK_FINALIZER);
    match (add, at) {
        (true, Some(_)) | (false, None) => Vec::new(),
        (true, None) if current.is_empty() => {
            vec![json!({"op": "test", "path": "/metadata/finalizers", "value": null}), json!({"op": "add", "path": "/metadata/finalizers", "value": [STACK_FINALIZER]})]
        }
        (true, None) => {
            vec![json!({"op": "test", "path": "/metadata/finalizers", "value": current}), json!({"op": "add", "path": "/metadata/finalizers/-", "value": STACK_FINALIZER})]
        }
        (false, Some(i)) => {
            vec![json!({"op": "test", "path": format!("/metadata/finalizers/{i}"), "value": STACK_FINALIZER}), json!({"op": "remove", "path": format!("/metadata/finalizers/{i}")})]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalizer_patches_test_the_list_they_change() {
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(finalizer_patch(&f(&[STACK_FINALIZER]), true).is_empty());
        assert!(finalizer_patch(&f(&["other"]), false).is_empty());
        let add_first = finalizer_patch(&[], true);
        assert_eq!(add_first[0], json!({"op": "test", "path": "/metadata/finalizers", "value": null}));
        let add = finalizer_patch(&f(&["other"]), true);
        assert_eq!(add[0]["value"], json!(["other"]));
        assert_eq!(add[1], json!({"op": "add", "path": "/metadata/finalizers/-", "value": STACK_FINALIZER}));
        let remove = finalizer_patch(&f(&["other", STACK_FINALIZER]), false);
        assert_eq!(remove[0], json!({"op": "test", "path": "/metadata/finalizers/1", "value": STACK_FINALIZER}));
        assert_eq!(remove[1], json!({"op": "remove", "path": "/metadata/finalizers/1"}));
    }
}
