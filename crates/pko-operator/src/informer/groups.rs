//! Which shards a sharded informer watches in which watch groups ([`Groups`]), and what a change of the held shards
//! does to them ([`Regroup`]). Pure.

use super::*;

/// What a change of the held shards does to a sharded informer's watches ([`Groups::follow`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Regroup {
    /// Drop from the store (as deleted) the objects of these shards, no longer held: no list.
    Forget(BTreeSet<u32>),
    /// Stop the watches of this group: none of its shards is held any more.
    Unwatch(u64),
    /// Watch these shards as a group of their own: one list of only their objects, then their changes.
    Watch {
        /// The group's id.
        group: u64,
        /// Its shards.
        shards: BTreeSet<u32>,
    },
    /// Watch every held shard as one group in place of the groups `replaces`: one re-list of everything held, whose
    /// objects already stored carry over and are handed on only when new or changed.
    Rebuild {
        /// The new group's id.
        group: u64,
        /// Every held shard.
        shards: BTreeSet<u32>,
        /// The groups it replaces.
        replaces: Vec<u64>,
    },
}

/// Most watch groups a sharded informer keeps before it folds them into one ([`Regroup::Rebuild`]).
pub const MAX_WATCH_GROUPS: usize = 4;

/// The watch groups of a sharded informer (pure): each watches the shards it was opened for and keeps those still held.
/// A gain opens a group for the gained shards; a group none of whose shards is held closes; the objects of lost shards
/// leave the store at once. Groups fold into one when there are more than [`MAX_WATCH_GROUPS`], or when their selectors
/// cover more than twice the held shards (events of shards not held are dropped on arrival, but still sent).
#[derive(Debug, Default)]
pub struct Groups {
    pub(super) next: u64,
    /// Group id → (shards its selector watches, of those the ones still held).
    pub(super) groups: BTreeMap<u64, (BTreeSet<u32>, BTreeSet<u32>)>,
    pub(super) held: Option<BTreeSet<u32>>,
}

impl Groups {
    /// What to do now that `held` are the held shards.
    pub fn follow(&mut self, held: &BTreeSet<u32>) -> Vec<Regroup> {
        let Some(before) = self.held.replace(held.clone()) else {
            return vec![self.open(held.clone())];
        };
        let lost: BTreeSet<u32> = before.difference(held).copied().collect();
        let gained: BTreeSet<u32> = held.difference(&before).copied().collect();
        let mut steps = Vec::new();
        if !lost.is_empty() {
            steps.push(Regroup::Forget(lost));
        }
        // groups none of whose shards is held (lost, or opened for none)
        let mut closed = Vec::new();
        for (id, (_, kept)) in self.groups.iter_mut() {
            kept.retain(|k| held.contains(k));
            if kept.is_empty() {
                closed.push(*id);
            }
        }
        for id in closed {
            self.groups.remove(&id);
            steps.push(Regroup::Unwatch(id));
        }
        if gained.is_empty() && !self.too_wide(held, 0) {
            return steps;
        }
        let groups_after = self.groups.len() + usize::from(!gained.is_empty());
        if groups_after > MAX_WATCH_GROUPS || self.too_wide(held, gained.len()) {
            let replaces: Vec<u64> = std::mem::take(&mut self.groups).into_keys().collect();
            let group = self.next_id();
            self.groups.insert(group, (held.clone(), held.clone()));
            steps.push(Regroup::Rebuild { group, shards: held.clone(), replaces });
        } else if !gained.is_empty() {
            steps.push(self.open(gained));
        }
        steps
    }

    /// Whether the groups' selectors, and a group for `adding` more shards, cover more than twice the held shards.
    pub(super) fn too_wide(&self, held: &BTreeSet<u32>, adding: usize) -> bool {
        self.groups.values().map(|(w, _)| w.len()).sum::<usize>() + adding > 2 * held.len().max(1)
    }

    pub(super) fn open(&mut self, shards: BTreeSet<u32>) -> Regroup {
        let group = self.next_id();
        self.groups.insert(group, (shards.clone(), shards.clone()));
        Regroup::Watch { group, shards }
    }

    pub(super) fn next_id(&mut self) -> u64 {
        let id = self.next;
        self.next += 1;
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[u32]) -> BTreeSet<u32> {
        v.iter().copied().collect()
    }

    #[test]
    fn a_gain_watches_only_the_gained_shards_a_loss_lists_nothing_and_groups_fold_when_many_or_wide() {
        let mut g = Groups::default();
        assert_eq!(
            g.follow(&set(&[])),
            [Regroup::Watch { group: 0, shards: set(&[]) }],
            "the first watch, even of nothing"
        );
        assert_eq!(g.follow(&set(&[1, 2])), [Regroup::Unwatch(0), Regroup::Watch { group: 1, shards: set(&[1, 2]) }]);
        assert_eq!(g.follow(&set(&[1, 2])), [], "no change");
        // a takeover: only the gained shards are listed
        assert_eq!(g.follow(&set(&[1, 2, 5])), [Regroup::Watch { group: 2, shards: set(&[5]) }]);
        // the victim is back: its shards leave the store and their watch closes, nothing is listed
        assert_eq!(g.follow(&set(&[1, 2])), [Regroup::Forget(set(&[5])), Regroup::Unwatch(2)]);
        // a loss from a group that keeps others: its watch stays
        assert_eq!(g.follow(&set(&[1, 2, 3, 4])), [Regroup::Watch { group: 3, shards: set(&[3, 4]) }]);
        assert_eq!(g.follow(&set(&[1, 3, 4])), [Regroup::Forget(set(&[2]))]);
        // more than MAX_WATCH_GROUPS: one re-list of everything held in their place
        assert_eq!(g.follow(&set(&[1, 3, 4, 6])), [Regroup::Watch { group: 4, shards: set(&[6]) }]);
        assert_eq!(g.follow(&set(&[1, 3, 4, 6, 7])), [Regroup::Watch { group: 5, shards: set(&[7]) }]);
        assert_eq!(
            g.follow(&set(&[1, 3, 4, 6, 7, 8])),
            [Regroup::Rebuild { group: 6, shards: set(&[1, 3, 4, 6, 7, 8]), replaces: vec![1, 3, 4, 5] }]
        );
        // selectors covering more than twice what is held (a replica that held everything, then
        // handed most over as others joined): one re-list of what is held
        let mut g = Groups::default();
        g.follow(&set(&[0, 1, 2, 3, 4, 5, 6, 7]));
        assert_eq!(g.follow(&set(&[0, 1, 2, 3])), [Regroup::Forget(set(&[4, 5, 6, 7]))], "twice: still one watch");
        assert_eq!(
            g.follow(&set(&[0, 1, 2])),
            [Regroup::Forget(set(&[3])), Regroup::Rebuild { group: 1, shards: set(&[0, 1, 2]), replaces: vec![0] }]
        );
        // everything lost: no watch at all, until a gain
        assert_eq!(g.follow(&set(&[])), [Regroup::Forget(set(&[0, 1, 2])), Regroup::Unwatch(1)]);
        assert_eq!(g.follow(&set(&[9])), [Regroup::Watch { group: 2, shards: set(&[9]) }]);
    }
}
