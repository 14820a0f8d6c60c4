//! The Update controller's pure pieces: Update status from an agent's operation result ([`status`]) and
//! the outputs Secret ([`outputs`]) and the agent request ([`request`]).

pub mod controller;
pub mod dispatch;
pub mod outputs;
pub mod request;
pub mod status;
