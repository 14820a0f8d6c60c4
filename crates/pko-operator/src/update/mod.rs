//! The Update controller ([`controller`], asynchronous: a reconcile queues a job) and its workers
//! ([`worker`]: one operation on an agent lent by [`crate::agents`], in named steps), with the pure
//! pieces: the agent request ([`request`]), the values it carries resolved ([`values`]), and the
//! Update's status from an agent's operation result ([`status`]).

pub mod controller;
pub mod dispatch;
pub mod fence;
pub mod request;
pub mod status;
pub mod values;
pub mod worker;
