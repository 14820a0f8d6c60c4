//! The Stack finalizer (PKO `finalizer.pulumi.com/destroy` on `Stack`, and on the Updates a Stack has not absorbed
//! yet), added and removed the way kube-runtime's `finalizer` does: a JSON patch whose `test` operations pin the list
//! as read.

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use pko_api::Update;
use pko_api::constants::STACK_FINALIZER;

/// Adds (`add`) or removes the Stack finalizer of `object` (a Stack, or an Update of one) with a JSON patch whose
/// `test` operations pin the finalizer list as read (kube-runtime's `finalizer` pattern): another controller's
/// finalizer is never clobbered, and a status write of the same pass (which moves `resourceVersion`) is no conflict.
/// Returns the `resourceVersion` the patch gave the object (`None`: nothing to change).
///
/// Errors: the API refused the patch — 422 when a `test` failed (the list changed since it was read).
pub(super) async fn set_finalizers<K>(api: &Api<K>, object: &K, add: bool) -> Result<Option<String>, kube::Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = crate::k8s::finalizer_patch(object.finalizers(), STACK_FINALIZER, add);
    if patch.is_empty() {
        return Ok(None);
    }
    let patch: json_patch::Patch =
        serde_json::from_value(serde_json::Value::Array(patch)).map_err(kube::Error::SerdeError)?;
    let written = api.patch(&object.name_any(), &PatchParams::default(), &Patch::<()>::Json(patch)).await?;
    Ok(written.resource_version())
}

/// Releases the Stack finalizer of an absorbed Update. `update` may come from the informer cache: the patch's `test`
/// pins the list as cached, and when the list has changed since (422) or the Update is newer than the cache, it is read
/// once fresh and released from there. Gone already: nothing to do.
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
