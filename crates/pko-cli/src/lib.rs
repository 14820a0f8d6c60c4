//! `kubectl-pko`, the operator's kubectl plugin: `kubectl pko logs stack/<name>` prints what Pulumi
//! printed for a Stack's operations, read from the operator's `/logs` endpoint (the operator's
//! `crate::logs`), which answers only callers allowed to `get` the Stack.

pub mod logs;
