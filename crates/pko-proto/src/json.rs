//! JSON ↔ protobuf `Struct`/`Value`: engine events travel as `google.protobuf.Struct`, config values as
//! `google.protobuf.Value` (both sides of the agent API convert with these).

use prost_types::{ListValue, Struct, Value, value::Kind};

/// A JSON value as a protobuf `Value`.
pub fn to_value(v: &serde_json::Value) -> Value {
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(ListValue { values: a.iter().map(to_value).collect() }),
        serde_json::Value::Object(m) => Kind::StructValue(to_struct(m)),
    };
    Value { kind: Some(kind) }
}

/// A JSON object as a protobuf `Struct`.
pub fn to_struct(m: &serde_json::Map<String, serde_json::Value>) -> Struct {
    Struct { fields: m.iter().map(|(k, v)| (k.clone(), to_value(v))).collect() }
}

/// A protobuf `Value` as JSON. Whole numbers come back as integers.
pub fn from_value(v: &Value) -> serde_json::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::NumberValue(n)) => {
            if n.fract() == 0.0 && n.abs() < 9e15 {
                serde_json::Value::from(*n as i64)
            } else {
                serde_json::Number::from_f64(*n).map(serde_json::Value::Number).unwrap_or(serde_json::Value::Null)
            }
        }
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::ListValue(l)) => serde_json::Value::Array(l.values.iter().map(from_value).collect()),
        Some(Kind::StructValue(s)) => from_struct(s),
    }
}

/// A protobuf `Struct` as a JSON object.
pub fn from_struct(s: &Struct) -> serde_json::Value {
    serde_json::Value::Object(s.fields.iter().map(|(k, v)| (k.clone(), from_value(v))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trips() {
        let j = serde_json::json!({"a": [1, 2.5, "x", null, true], "b": {"c": -3}});
        assert_eq!(from_value(&to_value(&j)), j);
    }
}
