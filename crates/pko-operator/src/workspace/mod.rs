//! The Workspace controller ([`controller`]) and its two agent runtimes: workspace pods, whose objects
//! [`pod`] builds (pure), and agent processes on this machine ([`local`]).

pub mod controller;
pub mod local;
pub mod pod;
