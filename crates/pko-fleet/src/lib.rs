//! Shard ownership: whether this replica may act on an object, and with which fencing epoch. One replica owns
//! everything ([`SingleReplica`], or [`Namespaces`]); a fleet splits objects over virtual shards ([`ring`]) held
//! through Leases ([`lease`], [`membership`]): one membership Lease per replica and one shard table per shard count
//! ([`table`]). No PKO types here.
#![forbid(unsafe_code)]

pub mod lease;
pub mod load;
pub mod membership;
pub mod planning;
pub mod ring;
pub mod table;

/// Virtual shards of a fleet by default (`--shards`): the smallest power of two at which the default
/// [`ring::BoundedRing`] keeps max/mean shards per replica ≤ 1.15 and moves ≤ 1.2·S/(N+1) shards from N to N+1
/// replicas, for 1–20 replicas (measured in `ring`'s tests). The shard table is written only when shards change
/// hands, once per replica whatever S, so S costs nothing at rest.
pub const DEFAULT_SHARDS: u32 = 2048;

/// Decides which objects this replica reconciles and with which fencing epoch.
pub trait Ownership: Send + Sync + std::fmt::Debug + 'static {
    /// Whether this replica owns the object `namespace/name` now.
    fn owns(&self, namespace: &str, name: &str) -> bool;
    /// Fencing epoch of the shard holding `namespace/name` (carried by every side effect).
    fn epoch(&self, namespace: &str, name: &str) -> i64;
    /// The shard of `namespace/name` (0 outside a fleet).
    fn shard(&self, _namespace: &str, _name: &str) -> u32 {
        0
    }
    /// Until when (wall clock) this replica's hold on the shard of `namespace/name` stays valid (its renew deadline),
    /// carried by every agent `Run` (`OperationRequest.not_after`) so an agent refuses a request delivered after it.
    /// `None`: no deadline (one replica); a shard not held gives a time already past.
    fn not_after(&self, _namespace: &str, _name: &str) -> Option<std::time::SystemTime> {
        None
    }
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

/// A replica that owns every object of the listed namespaces and nothing else, epoch 1: an operator scoped to some
/// namespaces (Kubernetes' namespace-scoped operator convention), and tests that share one API server without acting on
/// each other's objects.
#[derive(Debug, Default, Clone)]
pub struct Namespaces(pub std::collections::BTreeSet<String>);

impl Namespaces {
    /// Owns exactly the objects of `namespace`.
    pub fn one(namespace: &str) -> Self {
        Self([namespace.to_string()].into())
    }
}

impl Ownership for Namespaces {
    fn owns(&self, namespace: &str, _name: &str) -> bool {
        self.0.contains(namespace)
    }
    fn epoch(&self, _namespace: &str, _name: &str) -> i64 {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_own_only_their_objects() {
        let o = Namespaces::one("team-a");
        assert!(o.owns("team-a", "s1"));
        assert!(!o.owns("team-b", "s1"));
        assert!(!o.owns("", "s1"));
        assert!(SingleReplica.owns("team-b", "s1"));
    }
}
