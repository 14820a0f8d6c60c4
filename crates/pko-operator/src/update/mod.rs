//! The Update controller ([`controller`], asynchronous: a reconcile queues a job) and its workers ([`worker`]: one
//! operation on an agent lent by [`crate::agents`], in named steps, its request built by [`crate::agents::request`]),
//! with the pure pieces: the job's fence ([`fence`]), the jobs held for a busy pool agent ([`holds`]) and the Update's
//! status from an agent's operation result ([`status`]); the lines an operation prints, kept as they stream in
//! ([`capture`]).

pub mod cancel;
pub mod capture;
pub mod controller;
pub mod dispatch;
pub mod fence;
pub mod holds;
pub mod limits;
pub mod plans;
pub mod status;
pub mod worker;
