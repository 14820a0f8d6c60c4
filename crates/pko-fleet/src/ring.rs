//! Which shard an object is in, and which replica should hold each shard. Pure: no I/O, no clock.
//!
//! - An object's shard is a stable hash of its key (`namespace/name`): the first 8 bytes of its SHA-256, modulo the
//!   shard count. It never changes for a given shard count, so it is written once, as a label, and every replica
//!   computes the same value.
//! - The desired holder of each shard comes from a [`Ring`] over the live replicas. [`BoundedRing`] is consistent
//!   hashing (the `hashring` crate, [`VIRTUAL_NODES`] points per replica) with bounded loads (Mirrokni, Thorup and
//!   Zadimoghaddam, "Consistent Hashing with Bounded Loads", 2018; Argo CD's `consistent-hashing` sharding): a shard
//!   goes to the first replica clockwise from its point that is under the cap `max(⌈S/N⌉, ⌊1.15·S/N⌋)`.
//!
//! Why bounded loads: plain consistent hashing could not meet the fleet's two properties at a shard count whose Lease
//! writes stay affordable. Measured over 1–20 replicas (see the tests and `docs/architecture.md`): with 200 virtual
//! nodes, the most loaded replica held 1.63× the mean at S = 256, 1.46× at 1,024 and 1.37× at 4,096 (1.15 is the
//! bound); 1,000 virtual nodes reach 1.15 only at S = 4,096. The cap makes balance hold by construction; the walk past
//! full replicas keeps moves on a resize close to the minimum. With bounded loads, moves from N to N+1 replicas (as a
//! multiple of the minimum S/(N+1)) were, worst over 1–20 replicas: 1.24 at S = 1,024 and 256 points, 1.24 at S =
//! 2,048 and 128 points, 1.16 at S = 2,048 and 512 points (the default), 1.11 at S = 4,096.

use std::hash::{Hash, Hasher};

use sha2::{Digest, Sha256};

/// Points each replica has on the ring.
pub const VIRTUAL_NODES: u32 = 512;

/// How far above the mean a replica's shard count may go (max/mean ≤ 1 + this).
pub const LOAD_SLACK: f64 = 0.15;

/// The shard of the object `key` (`namespace/name`) among `shards` (> 0): `u64` of the first 8 bytes of SHA-256(`key`),
/// big-endian, modulo `shards`. Stable across processes, versions and platforms.
pub fn shard_of(key: &str, shards: u32) -> u32 {
    let digest = Sha256::digest(key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) % u64::from(shards.max(1))) as u32
}

/// Assigns shards to replicas. Implementations must be deterministic: every replica computes the same assignment from
/// the same member set, whatever its order.
pub trait Ring: Send + Sync + std::fmt::Debug {
    /// The desired holder of each shard `0..shards` (index = shard) among `members` (replica ids); empty when there is
    /// no member.
    fn assign(&self, shards: u32, members: &[String]) -> Vec<String>;
}

/// Consistent hashing with virtual nodes and bounded loads (see the module documentation).
#[derive(Debug, Clone, Copy)]
pub struct BoundedRing {
    /// Points per replica.
    pub virtual_nodes: u32,
    /// Allowed load above the mean (0.15: max/mean ≤ 1.15).
    pub slack: f64,
}

impl Default for BoundedRing {
    fn default() -> Self {
        Self { virtual_nodes: VIRTUAL_NODES, slack: LOAD_SLACK }
    }
}

/// One point of a replica on the ring: its id and the point's index. Hashed by value, so a replica's points do not
/// depend on the other members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Point<'a>(&'a str, u32);

impl Hash for Point<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
        self.1.hash(state);
    }
}

/// The key of a shard on the ring.
#[derive(Hash)]
struct ShardKey(u32);

impl Ring for BoundedRing {
    fn assign(&self, shards: u32, members: &[String]) -> Vec<String> {
        let mut names: Vec<&str> = members.iter().map(String::as_str).collect();
        names.sort_unstable();
        names.dedup();
        if names.is_empty() {
            return Vec::new();
        }
        let mut ring = hashring::HashRing::new();
        ring.batch_add(names.iter().flat_map(|m| (0..self.virtual_nodes.max(1)).map(move |i| Point(m, i))).collect());
        let n = names.len() as f64;
        let cap = ((f64::from(shards) / n).ceil() as usize)
            .max((f64::from(shards) / n * (1.0 + self.slack)).floor() as usize);
        let mut load: std::collections::HashMap<&str, usize> = names.iter().map(|m| (*m, 0)).collect();
        let mut out = vec![String::new(); shards as usize];
        // in clockwise order of the shards' points (who fills a replica first is then a property of
        // the ring, not of the shard numbering)
        let mut order: Vec<u32> = (0..shards).collect();
        order.sort_by_key(|s| std::hash::BuildHasher::hash_one(&hashring::DefaultHashBuilder, ShardKey(*s)));
        for shard in order {
            // every point clockwise from the shard's; the first replica under the cap takes it (the
            // total capacity N·cap ≥ S, so one always has room)
            let walk = ring.get_with_replicas(&ShardKey(shard), ring.len()).unwrap_or_default();
            let holder = walk.iter().map(|p| p.0).find(|m| load.get(m).is_some_and(|l| *l < cap)).unwrap_or(names[0]);
            *load.entry(holder).or_default() += 1;
            out[shard as usize] = holder.to_string();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("pko-operator-{i}")).collect()
    }

    /// max/mean shards per replica over 1–20 replicas, and the worst moves from N to N+1 replicas as a multiple of
    /// S/(N+1), for `shards`.
    fn properties(ring: &dyn Ring, shards: u32) -> (f64, f64) {
        let (mut worst_balance, mut worst_moves) = (0.0f64, 0.0f64);
        let mut before = ring.assign(shards, &members(1));
        for n in 1..=20usize {
            let mut count = std::collections::HashMap::new();
            for m in &before {
                *count.entry(m.clone()).or_insert(0usize) += 1;
            }
            assert_eq!(count.len(), n, "every replica holds shards at N={n}");
            let max = *count.values().max().unwrap_or(&0) as f64;
            worst_balance = worst_balance.max(max / (f64::from(shards) / n as f64));
            let after = ring.assign(shards, &members(n + 1));
            let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count() as f64;
            worst_moves = worst_moves.max(moved / (f64::from(shards) / (n + 1) as f64));
            before = after;
        }
        (worst_balance, worst_moves)
    }

    #[test]
    fn the_default_ring_meets_the_fleet_properties_at_the_default_shard_count() {
        let (balance, moves) = properties(&BoundedRing::default(), crate::DEFAULT_SHARDS);
        eprintln!(
            "S={} V={VIRTUAL_NODES}: worst max/mean {balance:.3}, worst moves {moves:.3}·S/(N+1)",
            crate::DEFAULT_SHARDS
        );
        assert!(balance <= 1.15, "max/mean {balance}");
        assert!(moves <= 1.2, "moves {moves}·S/(N+1)");
    }

    #[test]
    fn the_assignment_ignores_member_order_and_duplicates() {
        let ring = BoundedRing::default();
        let a = ring.assign(64, &["a".into(), "b".into(), "c".into()]);
        let b = ring.assign(64, &["c".into(), "a".into(), "b".into(), "a".into()]);
        assert_eq!(a, b);
        assert!(ring.assign(64, &[]).is_empty());
        assert!(ring.assign(64, &["only".into()]).iter().all(|m| m == "only"));
    }

    #[test]
    fn a_departing_replica_moves_only_its_own_shards() {
        let ring = BoundedRing::default();
        let three = ring.assign(crate::DEFAULT_SHARDS, &members(3));
        let two = ring.assign(crate::DEFAULT_SHARDS, &members(2));
        let gone = "pko-operator-2";
        let moved_from_survivors = three.iter().zip(&two).filter(|(a, b)| a != b && a.as_str() != gone).count();
        let orphans = three.iter().filter(|m| m.as_str() == gone).count();
        eprintln!(
            "3 → 2 replicas: {orphans} shards of the departed replica moved, {moved_from_survivors} between survivors"
        );
        assert!(
            moved_from_survivors as f64 <= 0.2 * orphans as f64,
            "{moved_from_survivors} shards moved between survivors"
        );
    }

    #[test]
    fn shards_are_stable_and_spread() {
        // pinned: a change of the hash would move every Stack of an installed fleet
        assert_eq!(shard_of("default/my-stack", 2048), 278, "SHA-256 big-endian u64 mod S (as Python computes it)");
        assert_eq!(shard_of("", 1), 0);
        assert_eq!(shard_of("x", 0), 0, "a shard count of 0 is taken as 1");
        let mut count = vec![0usize; 64];
        for i in 0..64_000 {
            count[shard_of(&format!("ns-{}/stack-{i}", i % 7), 64) as usize] += 1;
        }
        let (min, max) = (*count.iter().min().unwrap_or(&0), *count.iter().max().unwrap_or(&0));
        assert!(min > 850 && max < 1150, "64k keys over 64 shards: {min}..{max}");
    }
}
