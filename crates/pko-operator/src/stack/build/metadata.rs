//! The metadata of the objects made for a Stack: PKO's labels, the template's, the Stack's shard; owner references.

use std::collections::BTreeMap;

use super::BuildError;

pub(super) fn owner_ref<K: kube::Resource<DynamicType = ()>>(
    owner: &K,
    what: &'static str,
) -> Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference, BuildError> {
    owner.controller_owner_ref(&()).ok_or(BuildError::NoUid(what))
}

/// The labels of an object made for `stack`: PKO's, then the template's, then the Stack's shard and the shard count it
/// was computed for (ours, never overridden by a template: they decide which replica sees the object).
pub(super) fn child_labels(
    stack: &pko_api::Stack,
    template: Option<BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    use kube::ResourceExt;
    let mut labels = stack_labels(&stack.name_any());
    labels.extend(template.unwrap_or_default());
    for key in [pko_api::constants::SHARD_LABEL, pko_api::constants::SHARDS_LABEL] {
        labels.remove(key);
        if let Some(value) = stack.labels().get(key) {
            labels.insert(key.into(), value.clone());
        }
    }
    labels
}

/// Labels PKO puts on objects generated for a Stack.
pub fn stack_labels(stack: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (pko_api::constants::STACK_COMPONENT_LABEL.to_string(), "stack".to_string()),
        (pko_api::constants::STACK_NAME_LABEL.to_string(), stack.to_string()),
    ])
}
