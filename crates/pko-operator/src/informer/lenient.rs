//! Objects as a watch delivers them, decoded one by one: an object whose CRD admits a value its Rust type cannot hold
//! (an `int32` field out of range — the API server does not enforce `format: int32` — or any field of a type the
//! schema only loosely describes) is kept as its metadata and the reason, instead of failing the whole list and
//! stopping the watch of every object of the kind (one tenant's Stack would stop every Stack of the shard). Its
//! controller says so on the object.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// An object of kind `K`: decoded, or what of it could be read and why the rest could not.
#[derive(Debug, Clone)]
pub enum Lenient<K> {
    /// Decoded as `K`.
    Decoded(K),
    /// Not decodable as `K` (boxed: rare, and larger than most objects' inline part).
    Undecodable(Box<Undecodable>),
}

/// An object that does not decode as its kind's type.
#[derive(Debug, Clone, PartialEq)]
pub struct Undecodable {
    /// Its metadata (decoded on its own).
    pub meta: ObjectMeta,
    /// Its `status.conditions`, when they decode (so a reporter writes its condition once).
    pub conditions: Vec<Condition>,
    /// Its whole `status` as stored (`Null`: none), so a reporter can write it back with one condition changed and lose
    /// nothing.
    pub status: serde_json::Value,
    /// Where and why it does not decode: `spec.updateTemplate.spec.parallel: invalid value: …`.
    pub error: String,
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<serde_json::value::RawValue>::deserialize(d)?;
        let mut de = serde_json::Deserializer::from_str(raw.get());
        match serde_path_to_error::deserialize::<_, K>(&mut de) {
            Ok(k) => Ok(Lenient::Decoded(k)),
            Err(e) => Ok(Lenient::Undecodable(Box::new(undecodable(raw.get(), &e)))),
        }
    }
}

/// What can be read of the object `text` that failed with `e`. Pure.
fn undecodable(text: &str, e: &serde_path_to_error::Error<serde_json::Error>) -> Undecodable {
    #[derive(Deserialize, Default)]
    struct Partial {
        #[serde(default)]
        metadata: ObjectMeta,
        #[serde(default)]
        status: serde_json::Value,
    }
    let partial: Partial = serde_json::from_str(text).unwrap_or_default();
    let conditions = serde_json::from_value(partial.status["conditions"].clone()).unwrap_or_default();
    let path = e.path().to_string();
    // the position in the list's text says nothing to the Stack's owner
    let inner = e.inner().to_string();
    let inner = inner.rsplit_once(" at line ").map_or(inner.as_str(), |(what, _)| what);
    let error = if path == "." { inner.to_string() } else { format!("{path}: {inner}") };
    Undecodable { meta: partial.metadata, conditions, status: partial.status, error }
}

impl<K: Resource<DynamicType = ()>> Resource for Lenient<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        match self {
            Lenient::Decoded(k) => k.meta(),
            Lenient::Undecodable(u) => &u.meta,
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Lenient::Decoded(k) => k.meta_mut(),
            Lenient::Undecodable(u) => &mut u.meta,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_api::Stack;

    #[test]
    fn a_list_with_an_undecodable_stack_keeps_the_others_and_says_where() {
        let list = serde_json::json!([
            {"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "good", "namespace": "a"},
                "spec": {"stack": "dev"}},
            {"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "big", "namespace": "a",
                "generation": 3},
             "spec": {"stack": "dev", "updateTemplate": {"spec": {"parallel": 99_999_999_999u64}}},
             "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "X", "message": "",
                                        "lastTransitionTime": "2026-11-28T00:00:00Z"}]}}
        ]);
        // as kube reads a response: from its text (a raw value needs serde_json's own reader)
        let items: Vec<Lenient<Stack>> = serde_json::from_str(&list.to_string()).unwrap();
        assert!(matches!(&items[0], Lenient::Decoded(s) if s.spec.stack == "dev"));
        let Lenient::Undecodable(u) = &items[1] else { panic!("{:?}", items[1]) };
        assert_eq!((u.meta.name.as_deref(), u.meta.generation), (Some("big"), Some(3)));
        assert!(u.error.starts_with("spec.updateTemplate.spec.parallel: "), "{}", u.error);
        assert!(u.error.contains("99999999999"), "{}", u.error);
        assert!(!u.error.contains(" at line "), "no position in the list's text: {}", u.error);
        assert_eq!(u.conditions.len(), 1, "its conditions, read on their own");
        assert_eq!(u.status["conditions"][0]["reason"], "X", "its whole status, as stored");
    }
}
