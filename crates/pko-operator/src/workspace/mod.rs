//! The Workspace controller ([`controller`]) and its two agent runtimes: workspace pods, whose objects
//! [`pod`] builds (pure), and agent processes on this machine ([`local`]), one per Workspace or pooled per class ([`pool`]);
//! the Workspace's `Stalled` condition ([`stalled`]).

pub mod controller;
pub mod local;
pub mod pod;
pub mod pool;
pub mod stalled;
