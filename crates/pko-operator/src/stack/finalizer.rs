//! The Stack finalizer (PKO `finalizer.pulumi.com/destroy` on `Stack`, and on the Updates a Stack has
//! not absorbed yet), added and removed the way kube-runtime's `finalizer` does: a JSON patch whose
//! `test` operations pin the list as read.

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use pko_api::Update;
use pko_api::constants::STACK_FINALIZER;
use serde_json::json;

/// Adds (`add`) or removes the Stack finalizer of `object` (a Stack, or an Update of one) with a JSON
/// patch whose `test` operations pin the finalizer list as read (kube-runtime's `finalizer` pattern):
/// another controller's finalizer is never clobbered, and a status write of the same pass (which moves
/// `resourceVersion`) is no conflict. Returns the `resourceVersion` the patch gave the object (`None`:
/// nothing to change).
///
/// Errors: the API refused the patch — 422 when a `test` failed (the list changed since it was read).
pub(super) async fn set_finalizers<K>(api: &Api<K>, object: &K, add: bool) -> Result<Option<String>, kube::Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = finalizer_patch(object.finalizers(), add);
    if patch.is_empty() {
        return Ok(None);
    }
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(patch)).map_err(kube::Error::SerdeError)?;
    let written = api.patch(&object.name_any(), &PatchParams::default(), &Patch::<()>::Json(patch)).await?;
    Ok(written.resource_version())
}

/// Releases the Stack finalizer of an absorbed Update. `update` may come from the informer cache: the
/// patch's `test` pins the list as cached, and when the list has changed since (422) or the Update is
/// newer than the cache, it is read once fresh and released from there. Gone already: nothing to do.
///
/// Errors: the read or the patch failed.
pub(super) async fn release_update(api: &Api<Update>, update: &Update) -> Result<(), kube::Error> {
    match set_finalizers(api, update, false).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 422 || e.code == 409 => match api.get_opt(&update.name_any()).await? {
            Some(fresh) => set_finalizers(api, &fresh, false).await.map(|_| ()),
            None => Ok(()),
        },
        Err(e) => Err(e),
    }
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
