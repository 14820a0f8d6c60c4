//! The Update controller's pure pieces: Update status from an agent's operation result ([`status`]) and
//! the outputs Secret ([`outputs`]).

pub mod outputs;
pub mod status;
