//! Pure builders of the Stack controller: the whole Workspace ([`workspace`]) and Update ([`update`]) objects a Stack
//! needs — metadata and owner references ([`metadata`]), templates and spec (PKO `stack_controller.go` steps 2, 6 and
//! 10) — and the one merge of a template onto what is generated ([`overlay`]). No client.

mod metadata;
mod update;
mod workspace;

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use metadata::stack_labels;
pub use update::{DRIFT_CHECK_TTL, drift_check, pin_run, update, update_name, update_spec};
pub use workspace::{CONFIGMAP_ENV_PREFIX, SECRET_CONFIG_ENV_PREFIX, config_env, workspace, workspace_spec};

/// An object that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The owner has no uid (it was not read from the API server), so no owner reference can name it.
    #[error("the {0} has no uid yet")]
    NoUid(&'static str),
    /// A template merged onto the generated spec gives no valid spec (`field`: the template, e.g.
    /// `spec.updateTemplate.spec`): the Stack is Stalled `SpecInvalid` with this text.
    #[error("{field}: {message}")]
    Template {
        /// The template's field.
        field: &'static str,
        /// Why the merged spec does not decode.
        message: String,
    },
}

/// The one merge of a template (`workspaceTemplate.spec`, `updateTemplate.spec`) onto what the operator generates:
/// every top-level field `template` sets (not null) replaces `base`'s, whole.
///
/// Errors: [`BuildError::Template`] naming `field`, when the merged object does not decode as `T` (it is never silently
/// replaced by the generated one).
pub fn overlay<T: Serialize + DeserializeOwned>(base: &T, template: &T, field: &'static str) -> Result<T, BuildError> {
    let bad = |e: serde_json::Error| BuildError::Template { field, message: e.to_string() };
    let mut merged = serde_json::to_value(base).map_err(bad)?;
    let over = serde_json::to_value(template).map_err(bad)?;
    if let (Some(m), Some(o)) = (merged.as_object_mut(), over.as_object()) {
        for (k, v) in o.iter().filter(|(_, v)| !v.is_null()) {
            m.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(merged).map_err(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
    struct Spec {
        a: Option<u32>,
        b: Option<String>,
        x: Option<f64>,
    }

    #[test]
    fn a_template_replaces_the_fields_it_sets_and_a_merge_that_does_not_decode_is_an_error() {
        let base = Spec { a: Some(1), b: Some("gen".into()), x: None };
        let t = Spec { a: None, b: Some("tmpl".into()), x: None };
        assert_eq!(overlay(&base, &t, "spec.t").unwrap(), Spec { a: Some(1), b: Some("tmpl".into()), x: None });
        // a field written as text that reads back only as a number: the merge says so instead of
        // keeping the generated spec
        #[derive(Debug, Serialize, serde::Deserialize)]
        struct Odd {
            #[serde(serialize_with = "as_text")]
            n: u32,
        }
        fn as_text<S: serde::Serializer>(n: &u32, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str(&n.to_string())
        }
        let e = overlay(&Odd { n: 1 }, &Odd { n: 2 }, "spec.t").unwrap_err();
        assert!(matches!(&e, BuildError::Template { field: "spec.t", .. }), "{e:?}");
        assert!(e.to_string().starts_with("spec.t: "), "{e}");
    }
}
