//! The shard table: who holds each of a fleet's S shards, and at which epoch, in **one** Lease (`<fleet>-shards-<S>`,
//! annotation [`TABLE_ANNOTATION`]). Taking or releasing any number of shards is one resourceVersion-guarded write of
//! that Lease, so a handoff or a takeover costs each replica one write (two after a 409: read, write again) whatever S
//! is — where one Lease per shard cost one write per shard moved (~680 of 2,048 for a replica of three). Pure:
//! encoding, decoding, changes.
//!
//! The encoding groups consecutive shards of one holder and one epoch into ranges, by holder (`""`: released or never
//! taken): `{"r-0":[[0,17,5],[40,80,6]],"":[[18,39,4]]}` — shards 0–17 held by `r-0` at epoch 5, 18–39 free
//! (their last epoch 4), … A shard missing from the table was never taken (epoch 0). 2,048 shards after many moves
//! stay a few KiB (the annotation limit is 256 KiB).

use std::collections::BTreeMap;

/// Annotation of the shard table Lease carrying the table ([`ShardTable::encode`]).
pub const TABLE_ANNOTATION: &str = "pulumi.com/shard-table";

/// The most shards a fleet may have (`--shards`): the table of that many shards, each in a range of its own at a
/// six-digit epoch (the worst case), stays under Kubernetes' 256 KiB limit on an object's annotations (tested below).
pub const MAX_SHARDS: u32 = 8192;

/// One shard's record: its holder (`None`: released, or never taken) and its epoch — the fencing token, raised by one
/// at each take (as a shard Lease's `leaseTransitions` was).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Entry {
    /// The replica holding the shard.
    pub holder: Option<String>,
    /// The shard's epoch.
    pub epoch: i64,
}

impl Entry {
    /// An entry held by `holder` at `epoch`.
    pub fn held(holder: &str, epoch: i64) -> Self {
        Self { holder: Some(holder.to_string()), epoch }
    }
}

/// Every recorded shard's [`Entry`], by shard.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardTable(pub BTreeMap<u32, Entry>);

/// A table annotation that does not decode: the fleet takes and releases nothing from it (it would otherwise hand out
/// shards at epochs already used), and says so.
#[derive(Debug, thiserror::Error)]
#[error("the shard table annotation {TABLE_ANNOTATION} does not decode: {0}")]
pub struct TableError(String);

type Encoded = BTreeMap<String, Vec<(u32, u32, i64)>>;

impl ShardTable {
    /// The table as the annotation value (pure; ranges of one holder and epoch, holders in order).
    pub fn encode(&self) -> String {
        let mut out: Encoded = BTreeMap::new();
        let mut run: Option<(u32, u32, &Entry)> = None;
        let close = |run: Option<(u32, u32, &Entry)>, out: &mut Encoded| {
            if let Some((first, last, e)) = run {
                out.entry(e.holder.clone().unwrap_or_default()).or_default().push((first, last, e.epoch));
            }
        };
        for (k, e) in &self.0 {
            run = match run {
                Some((first, last, r)) if last + 1 == *k && r == e => Some((first, *k, r)),
                other => {
                    close(other, &mut out);
                    Some((*k, *k, e))
                }
            };
        }
        close(run, &mut out);
        serde_json::to_string(&out).unwrap_or_default()
    }

    /// The table of an annotation value ([`ShardTable::encode`]'s form).
    ///
    /// Errors: [`TableError`] for anything else: not that JSON, a range whose first shard is after its last, a shard in
    /// two ranges.
    pub fn decode(value: &str) -> Result<Self, TableError> {
        let encoded: Encoded = serde_json::from_str(value).map_err(|e| TableError(e.to_string()))?;
        let mut table = BTreeMap::new();
        for (holder, ranges) in encoded {
            for (first, last, epoch) in ranges {
                if first > last {
                    return Err(TableError(format!("range {first}..{last} of {holder:?} is empty")));
                }
                for k in first..=last {
                    let entry = Entry { holder: (!holder.is_empty()).then(|| holder.clone()), epoch };
                    if table.insert(k, entry).is_some() {
                        return Err(TableError(format!("shard {k} is recorded twice")));
                    }
                }
            }
        }
        Ok(Self(table))
    }

    /// The table a shard table Lease carries (none: empty, as before the first write).
    ///
    /// Errors: [`TableError`] for an annotation that does not decode.
    pub fn of(lease: &k8s_openapi::api::coordination::v1::Lease) -> Result<Self, TableError> {
        match lease.metadata.annotations.as_ref().and_then(|a| a.get(TABLE_ANNOTATION)) {
            Some(value) => Self::decode(value),
            None => Ok(Self::default()),
        }
    }

    /// Shard → holder, for the shards held (pure).
    pub fn holders(&self) -> BTreeMap<u32, String> {
        self.0.iter().filter_map(|(k, e)| Some((*k, e.holder.clone()?))).collect()
    }

    /// The table after `me` takes `takes` (each one epoch above its last, at least `floor`'s epoch for it: a shard
    /// Lease of a replica older than the table) and releases `releases` (pure).
    pub fn changed(&self, me: &str, takes: &[u32], releases: &[u32], floor: &BTreeMap<u32, i64>) -> Self {
        let mut next = self.clone();
        for k in releases {
            if let Some(e) = next.0.get_mut(k) {
                e.holder = None;
            }
        }
        for k in takes {
            let last = self.0.get(k).map_or(0, |e| e.epoch).max(floor.get(k).copied().unwrap_or(0));
            next.0.insert(*k, Entry::held(me, last + 1));
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_encodes_ranges_of_one_holder_and_epoch_and_decodes_back() {
        let mut t = ShardTable::default();
        for k in 0..=17 {
            t.0.insert(k, Entry::held("r-0", 5));
        }
        for k in 18..=39 {
            t.0.insert(k, Entry { holder: None, epoch: 4 });
        }
        t.0.insert(40, Entry::held("r-0", 6));
        t.0.insert(41, Entry::held("r-0", 6));
        t.0.insert(50, Entry::held("r-0", 6)); // a gap: a range of its own
        let s = t.encode();
        assert_eq!(s, r#"{"":[[18,39,4]],"r-0":[[0,17,5],[40,41,6],[50,50,6]]}"#);
        assert_eq!(ShardTable::decode(&s).expect("decodes"), t);
        assert_eq!(ShardTable::default().encode(), "{}");
        assert_eq!(ShardTable::decode("{}").expect("empty"), ShardTable::default());
    }

    #[test]
    fn a_table_of_2048_shards_scattered_over_three_holders_stays_small() {
        let mut t = ShardTable::default();
        for k in 0..2048u32 {
            let holder = ["replica-0", "replica-1", "replica-2"][(k.wrapping_mul(2_654_435_761) >> 7) as usize % 3];
            t.0.insert(k, Entry::held(holder, i64::from(k % 7) + 1));
        }
        let s = t.encode();
        assert!(s.len() < 40_000, "{} bytes", s.len());
        assert_eq!(ShardTable::decode(&s).expect("decodes"), t);
    }

    #[test]
    fn the_worst_table_of_the_most_shards_fits_in_an_objects_annotations() {
        // every shard a range of its own (holders alternate), epochs of six digits, 63-character holders
        let holders = ["a".repeat(63), "b".repeat(63), "c".repeat(63)];
        let t = ShardTable(
            (0..MAX_SHARDS).map(|k| (k, Entry::held(&holders[k as usize % 3], 100_000 + i64::from(k)))).collect(),
        );
        let size = TABLE_ANNOTATION.len() + t.encode().len();
        assert!(size < 256 * 1024, "{size} bytes");
    }

    #[test]
    fn a_table_that_is_not_the_encoding_is_an_error_naming_why() {
        for (bad, why) in [
            ("x", "expected"),
            (r#"{"a":[[3,1,1]]}"#, "empty"),
            (r#"{"a":[[0,3,1]],"b":[[3,4,1]]}"#, "shard 3 is recorded twice"),
            (r#"{"a":[[0,-1,1]]}"#, ""),
        ] {
            let e = ShardTable::decode(bad).expect_err(bad).to_string();
            assert!(e.contains(TABLE_ANNOTATION) && e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn a_take_raises_the_epoch_past_the_table_and_the_floor_and_a_release_keeps_it() {
        let t = ShardTable(
            [(0, Entry::held("a", 3)), (1, Entry::held("me", 2)), (2, Entry { holder: None, epoch: 9 })].into(),
        );
        let next = t.changed("me", &[0, 2, 5, 6], &[1], &[(5, 11)].into());
        assert_eq!(next.0[&0], Entry::held("me", 4));
        assert_eq!(next.0[&1], Entry { holder: None, epoch: 2 }, "released: the epoch stays");
        assert_eq!(next.0[&2], Entry::held("me", 10));
        assert_eq!(next.0[&5], Entry::held("me", 12), "above the shard Lease of an earlier version");
        assert_eq!(next.0[&6], Entry::held("me", 1), "never taken: epoch 1");
        assert_eq!(t.changed("me", &[], &[], &BTreeMap::new()), t);
    }
}
