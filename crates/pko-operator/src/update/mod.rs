//! The Update controller ([`controller`], asynchronous; [`dispatch`] runs one Update on an agent) and its
//! pure pieces: Update status from an agent's operation result ([`status`]), the outputs Secret
//! ([`outputs`]), the agent request ([`request`]), the per-workspace-class limits ([`limits`]) and the operator's
//! tokens towards agents ([`tokens`]).

pub mod controller;
pub mod dispatch;
pub mod limits;
pub mod request;
pub mod status;
pub mod tokens;
pub mod values;
