//! Schema helpers for fields whose shape PKO leaves free-form or whose OpenAPI needs Kubernetes extensions.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

/// Any JSON value (config values, program bodies, outputs): `x-kubernetes-preserve-unknown-fields`.
pub fn any_json(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "x-kubernetes-preserve-unknown-fields": true })
}

/// A map from string to any JSON value.
pub fn json_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "additionalProperties": { "x-kubernetes-preserve-unknown-fields": true }
    })
}

/// A Go `metav1.Duration` string (e.g. `24h`, `90s`, `1h30m`, `-5m`): what Go's `time.ParseDuration` reads, negative
/// values included, as PKO's decoder reads them. Anything else is refused at admission: PKO admits it but cannot decode
/// the object (its informer for the kind then fails), so no working PKO manifest carries one.
pub fn duration(_: &mut SchemaGenerator) -> Schema {
    // an OpenAPI pattern, not a CEL rule: a regular expression in CEL over unbounded strings in
    // unbounded lists exceeds the API server's cost budget
    json_schema!({ "type": "string", "pattern": crate::duration::GO_DURATION_PATTERN })
}

/// A Go `uint32` (PKO's `pulumiLogLevel`): an integer from 0 to 4294967295 — what PKO's decoder reads; no `format`,
/// whose `int32` would understate the range.
pub fn uint32(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "integer", "minimum": 0, "maximum": u32::MAX })
}

/// `metav1.Condition` list with `listType: map` keyed on `type` (as PKO declares its conditions).
pub fn conditions(g: &mut SchemaGenerator) -> Schema {
    let item = <k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition as JsonSchema>::json_schema(g);
    json_schema!({
        "type": "array",
        "items": item,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"]
    })
}

/// A `metav1.Time` (RFC 3339 date-time string).
pub fn date_time(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "string", "format": "date-time" })
}
