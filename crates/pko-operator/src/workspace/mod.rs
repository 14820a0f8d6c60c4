//! The Workspace controller ([`controller`]): brings each Workspace's agents up through the runtime of
//! [`crate::agents`] and reports them in its status (`Ready`, `address`, `pool`, `observedGeneration`); the Workspace's
//! `Stalled` condition is the shared contract [`crate::stalled`].

pub mod controller;
