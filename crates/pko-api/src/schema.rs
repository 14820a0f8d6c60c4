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

/// A Go `metav1.Duration` string (e.g. `24h`, `90s`, `1h30m`) that must not be negative.
pub fn duration(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "x-kubernetes-validations": [{
            "rule": "duration(self) >= duration('0s')",
            "message": "must be a non-negative duration such as 90s, 15m or 24h"
        }]
    })
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
