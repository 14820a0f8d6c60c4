//! The Stack controller ([`controller`]: the I/O) and its pure parts: the sync decision ([`plan`]),
//! prerequisites ([`prerequisites`]), the Workspace and Update builders ([`build`]) and condition
//! bookkeeping ([`conditions`]).

pub mod build;
pub mod conditions;
pub mod controller;
pub mod plan;
pub mod prerequisites;
