//! Shard ownership: whether this replica may act on an object. The fleet (several replicas splitting
//! Stacks over Lease-held shards) implements [`Ownership`]; until then one replica owns everything.

/// Decides which objects this replica reconciles and with which fencing epoch.
pub trait Ownership: Send + Sync + std::fmt::Debug + 'static {
    /// Whether this replica owns the object `namespace/name` now.
    fn owns(&self, namespace: &str, name: &str) -> bool;
    /// Fencing epoch of the shard holding `namespace/name` (carried by every side effect).
    fn epoch(&self, namespace: &str, name: &str) -> i64;
}

/// A single replica: owns every object, epoch 1.
#[derive(Debug, Default, Clone, Copy)]
pub struct SingleReplica;

impl Ownership for SingleReplica {
    fn owns(&self, _namespace: &str, _name: &str) -> bool {
        true
    }
    fn epoch(&self, _namespace: &str, _name: &str) -> i64 {
        1
    }
}
