//! The operator: the Program, Stack, Workspace and Update controllers (peers that meet through API objects), the
//! artifact server, metrics and probes, and the one assembly that wires them ([`run`], flags in [`args`]). The fleet's
//! seams live in crates of their own below this one: ownership ([`ownership`] = `pko-fleet`) and the work queue
//! ([`queue`] = `pko-queue`). `docs/architecture.md` has the module map.
#![forbid(unsafe_code)]

pub mod agents;
pub mod args;
pub mod artifacts;
pub mod authz;
pub mod context;
pub mod events;
pub mod fleet;
pub mod git_heads;
pub mod informer;
pub mod k8s;
pub mod leader;
pub mod load;
pub mod logs;
pub mod logs_api;
/// Ownership of objects by this replica: the `pko-fleet` crate (the fleet implements it there).
pub use pko_fleet as ownership;
/// The work queue between the Update controller and its workers: the `pko-queue` crate.
pub use pko_queue as queue;
pub mod metric_names;
pub mod metrics;
pub mod outputs;
pub mod own_writes;
pub mod program;
pub mod receiver;
pub mod rollout;
pub mod run;
pub mod secret_cache;
pub mod stack;
pub mod stalled;
pub mod update;
pub mod workspace;
