//! The Stack controller: [`controller`] wires the watches; [`reconcile`] is the driver over named steps (dereference
//! → absorb → plan → build → apply → one status write), with its I/O in [`source`] (source resolution),
//! [`finalizer`] and [`io`] (status write, reclaim, lookups) and its texts in [`messages`], and what it last applied as
//! each Workspace in [`applied`]. The pure parts: finished Updates into status ([`absorb`]), the sync decision
//! ([`plan`]), prerequisites ([`prerequisites`]), the whole Workspace and Update objects ([`build`]) and condition
//! bookkeeping ([`conditions`]), scheduled drift detection ([`drift`]), plan approval ([`approval`]), a rollout's
//! hold ([`rollout_hold`]); the Flux source watches are [`flux`].

pub mod absorb;
pub mod applied;
pub mod approval;
pub mod build;
pub mod conditions;
pub mod controller;
pub mod drift;
pub mod finalizer;
pub mod flux;
pub mod io;
pub mod messages;
pub mod plan;
pub mod prerequisites;
pub mod reconcile;
pub mod rollout_hold;
pub mod source;
pub mod undecodable;
pub mod unlock;
