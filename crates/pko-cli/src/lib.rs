//! `kubectl-pko`, the operator's kubectl plugin: `kubectl pko logs stack/<name>` prints what Pulumi printed for a
//! Stack's operations, read from the operator's `/logs` endpoint (the operator's `crate::logs`), which answers only
//! callers allowed to `get` the Stack; `kubectl pko sync STACK` and `kubectl pko cancel STACK` annotate the Stack with
//! the caller's own rights.

pub mod annotate;
pub mod discover;
pub mod fleet;
pub mod logs;
pub mod status;
