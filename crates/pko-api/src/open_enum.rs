//! String enums that keep values they do not know.
//!
//! PKO declares `ResourceRef.type`, `securityProfile`, `imagePullPolicy` and the Update `type` as Go string types
//! without an enum in the schema: the API server admits any string, and PKO decodes it. Ours must admit the same
//! manifests (a PKO-valid object is never refused at admission), so these types decode any string — a value this
//! version does not know is kept as [`Unknown`](self) and written back unchanged — and the controllers refuse it
//! where it is used, with a condition naming the field and the values it takes.

/// Declares an enum of API strings with an `Unknown(String)` variant for any other value.
///
/// Generated: `as_str` (the value as written in the API), `KNOWN` (the known values), `is_known`, `From<&str>`,
/// `Display`, string `Serialize`/`Deserialize`, and a `JsonSchema` of a plain `string` (no enum: the schema admits what
/// PKO's admits).
#[macro_export]
macro_rules! open_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value this version does not know, kept as written; refused where it is used.
            Unknown(String),
        }

        impl $name {
            /// The values this version knows, as written in the API.
            pub const KNOWN: &'static [&'static str] = &[$($text),+];

            /// The value as written in the API.
            pub fn as_str(&self) -> &str {
                match self {
                    $( Self::$variant => $text, )+
                    Self::Unknown(s) => s,
                }
            }

            /// The value as a metric label: the known value, or `unknown` for any other (bounded cardinality: a user's
            /// free text never becomes a label).
            pub fn label(&self) -> &'static str {
                match self {
                    $( Self::$variant => $text, )+
                    Self::Unknown(_) => "unknown",
                }
            }

            /// Whether this is one of [`Self::KNOWN`].
            pub fn is_known(&self) -> bool {
                !matches!(self, Self::Unknown(_))
            }

            /// The known values as a message lists them, quoted: `"a", "b" or "c"`.
            pub fn expected() -> String {
                let quoted: Vec<String> = Self::KNOWN.iter().map(|k| format!("{k:?}")).collect();
                match quoted.split_last() {
                    Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
                    _ => quoted.join(""),
                }
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                match s {
                    $( $text => Self::$variant, )+
                    other => Self::Unknown(other.to_string()),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <String as serde::Deserialize>::deserialize(d)?;
                Ok(Self::from(s.as_str()))
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn inline_schema() -> bool {
                true
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "type": "string" })
            }
        }
    };
}

#[cfg(test)]
mod tests {
    crate::open_enum! {
        /// A test enum.
        enum Colour {
            /// Red.
            Red = "red",
            /// Green.
            Green = "Green",
        }
    }

    #[test]
    fn known_and_unknown_values_round_trip() {
        let c: Colour = serde_json::from_str("\"red\"").unwrap();
        assert_eq!(c, Colour::Red);
        let other: Colour = serde_json::from_str("\"Blue\"").unwrap();
        assert_eq!(other, Colour::Unknown("Blue".into()));
        assert!(!other.is_known() && c.is_known());
        assert_eq!(serde_json::to_string(&other).unwrap(), "\"Blue\"", "kept as written");
        assert_eq!(serde_json::to_string(&Colour::Green).unwrap(), "\"Green\"");
        assert_eq!(Colour::expected(), "\"red\" or \"Green\"");
        assert_eq!((other.label(), Colour::Red.label()), ("unknown", "red"));
        let schema = schemars::schema_for!(Colour);
        assert_eq!(schema.get("type"), Some(&serde_json::json!("string")));
        assert!(schema.get("enum").is_none(), "the schema admits any string, as PKO's");
    }
}
