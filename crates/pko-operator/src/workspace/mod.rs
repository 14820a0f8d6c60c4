//! The Workspace controller ([`controller`]) and its two agent runtimes: workspace pods, whose objects
//! [`pod`] builds (pure), and agent processes on this machine ([`local`]), one per Workspace or pooled per class ([`pool`]).

pub mod controller;
pub mod local;
pub mod pod;
pub mod pool;
