//! The Stack controller's pure decisions ([`plan`]) and condition bookkeeping ([`conditions`]). The I/O
//! side (sources, Workspace, Updates) is being built on top of these.

pub mod build;
pub mod conditions;
pub mod controller;
pub mod plan;
