//! `kubectl-pko`, the operator's kubectl plugin: `kubectl pko logs stack/<name>` prints what Pulumi printed for a
//! Stack's operations, read from the operator's aggregated API `logs.pulumi.com` through the API server (RBAC on
//! `stacks/log`); `sync`, `cancel`, `unlock` and `approve` annotate the Stack with the caller's own rights;
//! `status`, `plan`, `fleet` and `receivers` read the objects and Leases; `rollout` reads and steers
//! StackRollouts.

pub mod annotate;
pub mod approve;
pub mod discover;
pub mod fleet;
pub mod logs;
pub mod receivers;
pub mod rollout;
pub mod status;
