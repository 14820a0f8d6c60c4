//! The Workspace controller ([`controller`]) and its two agent runtimes: workspace pods, whose objects
//! [`pod`] builds (pure), and agent processes on this machine ([`local`]), one per Workspace or pooled per class ([`pool`]);
//! the Workspace's `Stalled` condition ([`stalled`]); the strategic merge of `podTemplate` ([`merge`]).

pub mod controller;
pub mod local;
pub mod merge;
pub mod pod;
pub mod pod_pool;
pub mod pool;
pub mod probe;
pub mod stalled;
