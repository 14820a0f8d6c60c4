//! Time conversions; JSON ↔ protobuf lives in [`pko_proto::json`] (shared with the operator).

pub use pko_proto::json::{from_struct, from_value, to_struct, to_value};
use prost_types::Timestamp;

/// Now as a protobuf `Timestamp`.
pub fn now() -> Timestamp {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Timestamp { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}
