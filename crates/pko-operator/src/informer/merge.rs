//! How one kind's watches become one store: each source's (or shard group's) watch events are merged into [`Step`]s for
//! the store and the subscribers — a source's relist deletes only what it no longer has, a gained shard group hands
//! on only new and changed objects, a lost shard's objects leave — and the store is ready once every source has
//! listed ([`Merge`]). Which shards are watched in which group is [`Groups`]'s plan. Pure: the tests feed it events.

use super::*;

/// A source of an informer: (watch group, index of the namespace's `Api`, or 0 for the cluster).
pub(super) type Src = (u64, usize);

/// What the merge asks of the informer: write an event into the store, or hand a change on.
#[derive(Debug)]
pub(super) enum Step<K> {
    Store(watcher::Event<K>),
    Notify(Change<K>),
}

/// The two steps of an object leaving the store: its delete, then the `Deleted` change handed on.
pub(super) fn deleted<K: Clone>(o: K) -> [Step<K>; 2] {
    [Step::Store(watcher::Event::Delete(o.clone())), Step::Notify(Change::Deleted(o))]
}

/// Merges the watch events of several disjoint sources into one store: a source's re-list replaces only its own
/// objects; the store is ready once every source there was has listed. A source opened in place of others
/// ([`Merge::carry`]) takes over their objects and hands on only what is new or changed (a rebuilt group must not
/// reconcile every object again); a re-list after a failed watch hands on all.
pub(super) struct Merge<K: Watched> {
    sources: HashMap<Src, Source<K>>,
    /// Sources that must list once before the store is ready.
    unlisted: HashSet<Src>,
    ready: bool,
}

/// What the merge knows of one source.
pub(super) struct Source<K: Watched> {
    known: HashSet<ObjectRef<K>>,
    listing: Option<HashSet<ObjectRef<K>>>,
    skip_unchanged: bool,
}

impl<K: Watched> Default for Source<K> {
    fn default() -> Self {
        Self { known: HashSet::new(), listing: None, skip_unchanged: false }
    }
}

impl<K: Watched> Default for Merge<K> {
    fn default() -> Self {
        Self { sources: HashMap::new(), unlisted: HashSet::new(), ready: false }
    }
}

impl<K: Watched> Merge<K> {
    /// A merge of sources `(0, 0)` … `(0, n - 1)`.
    #[cfg(test)]
    pub(super) fn new(sources: usize) -> Self {
        let mut m = Self::default();
        for i in 0..sources {
            m.add_source((0, i));
        }
        m
    }

    /// A new source; before the store is ready, the store waits for its list too.
    pub(super) fn add_source(&mut self, src: Src) {
        self.sources.insert(src, Source::default());
        if !self.ready {
            self.unlisted.insert(src);
        }
    }

    /// Removes `src`: its objects leave the store as deleted.
    pub(super) fn remove_source(
        &mut self,
        src: Src,
        lookup: &impl Fn(&ObjectRef<K>) -> Option<Arc<K>>,
        all: &impl Fn() -> Vec<K>,
    ) -> Vec<Step<K>> {
        let mut steps = Vec::new();
        if let Some(gone) = self.sources.remove(&src) {
            for o in gone.known.iter().filter_map(lookup) {
                steps.extend(deleted((*o).clone()));
            }
        }
        self.unlisted.remove(&src);
        steps.extend(self.ready_if_listed(all));
        steps
    }

    /// Opens `to` in place of the sources `from`: their objects become `to`'s, and `to`'s first list hands on only
    /// objects new to the store or changed.
    pub(super) fn carry(&mut self, from: Vec<Src>, to: Src, all: &impl Fn() -> Vec<K>) -> Vec<Step<K>> {
        let mut source = Source { skip_unchanged: true, ..Source::default() };
        for f in from {
            if let Some(old) = self.sources.remove(&f) {
                source.known.extend(old.known);
            }
            self.unlisted.remove(&f);
        }
        self.sources.insert(to, source);
        if !self.ready {
            self.unlisted.insert(to);
        }
        self.ready_if_listed(all)
    }

    /// Drops from the store (as deleted) every object `gone` picks, whichever source has it.
    pub(super) fn forget(
        &mut self,
        gone: impl Fn(&K) -> bool,
        lookup: &impl Fn(&ObjectRef<K>) -> Option<Arc<K>>,
    ) -> Vec<Step<K>> {
        let mut steps = Vec::new();
        for source in self.sources.values_mut() {
            source.known.retain(|r| {
                let Some(o) = lookup(r) else { return true };
                if !gone(&o) {
                    return true;
                }
                steps.extend(deleted((*o).clone()));
                false
            });
        }
        steps
    }

    /// The next list of every source hands on only the objects new to the store or changed.
    #[cfg(test)]
    pub(super) fn skip_unchanged_in_next_lists(&mut self) {
        for s in self.sources.values_mut() {
            s.skip_unchanged = true;
        }
    }

    /// Once every source there was before the store was ready has listed: the store's ready replay.
    pub(super) fn ready_if_listed(&mut self, all: &impl Fn() -> Vec<K>) -> Vec<Step<K>> {
        if self.ready || !self.unlisted.is_empty() {
            return Vec::new();
        }
        self.ready = true;
        let mut steps = vec![Step::Store(watcher::Event::Init)];
        steps.extend(all().into_iter().map(|o| Step::Store(watcher::Event::InitApply(o))));
        steps.push(Step::Store(watcher::Event::InitDone));
        steps
    }

    /// The steps for `event` of `source`; `lookup` reads an object from the store, `all` every one. An event of a
    /// source no longer there (closed meanwhile) changes nothing.
    pub(super) fn handle(
        &mut self,
        source: Src,
        event: watcher::Event<K>,
        lookup: &impl Fn(&ObjectRef<K>) -> Option<Arc<K>>,
        all: &impl Fn() -> Vec<K>,
    ) -> Vec<Step<K>> {
        let Some(state) = self.sources.get_mut(&source) else { return Vec::new() };
        match event {
            watcher::Event::Apply(o) => {
                let r = ObjectRef::from_obj(&o);
                state.known.insert(r.clone());
                // never back: a watch replaying, or one of two whose selectors both cover a shard
                // lost and regained, may deliver a version older than the one stored
                if older_than_stored(lookup(&r).as_deref(), &o) {
                    return vec![];
                }
                vec![Step::Store(watcher::Event::Apply(o.clone())), Step::Notify(Change::Applied(o))]
            }
            watcher::Event::Delete(o) => {
                let r = ObjectRef::from_obj(&o);
                state.known.remove(&r);
                // the delete of an earlier object of that name: the one stored was made since
                if lookup(&r).is_some_and(|stored| stored.meta().uid.is_some() && stored.meta().uid != o.meta().uid) {
                    return vec![];
                }
                deleted(o).into()
            }
            watcher::Event::Init => {
                state.listing = Some(HashSet::new());
                vec![]
            }
            watcher::Event::InitApply(o) => {
                let r = ObjectRef::from_obj(&o);
                let stored = lookup(&r);
                let unchanged = state.skip_unchanged
                    && state.known.contains(&r)
                    && stored.as_deref().is_some_and(|old| same_version(old, &o));
                state.listing.get_or_insert_with(HashSet::new).insert(r.clone());
                state.known.insert(r);
                // a list from the API server's watch cache (`resourceVersion=0`) may be older than
                // the store: the newer stored version stays, and the watch goes on from the list
                if unchanged || older_than_stored(stored.as_deref(), &o) {
                    return vec![];
                }
                vec![Step::Store(watcher::Event::Apply(o.clone())), Step::Notify(Change::Applied(o))]
            }
            watcher::Event::InitDone => {
                state.skip_unchanged = false;
                let listed = state.listing.take().unwrap_or_default();
                let gone: Vec<_> = state.known.difference(&listed).cloned().collect();
                state.known = listed;
                let mut steps = Vec::new();
                for o in gone.iter().filter_map(lookup) {
                    steps.extend(deleted((*o).clone()));
                }
                self.unlisted.remove(&source);
                steps.extend(self.ready_if_listed(all));
                steps
            }
        }
    }
}

/// Whether `incoming` is an older version of the very object `stored` (same uid, a lower `resourceVersion`). Resource
/// versions of one resource compare as integers (KEP-5504, stable in Kubernetes 1.35: decimal, no leading zeros,
/// compared by length then digits); a version that is not one (an object without it, as in unit tests) is never judged
/// older. Pure.
pub(super) fn older_than_stored<K: kube::Resource>(stored: Option<&K>, incoming: &K) -> bool {
    let Some(stored) = stored else { return false };
    let same_object = stored.meta().uid.is_some() && stored.meta().uid == incoming.meta().uid;
    let (Some(a), Some(b)) = (incoming.meta().resource_version.as_deref(), stored.meta().resource_version.as_deref())
    else {
        return false;
    };
    same_object && compare_resource_versions(a, b) == Some(std::cmp::Ordering::Less)
}

/// `a` against `b` as Kubernetes compares resource versions (`CompareResourceVersion`, KEP-5504): positive decimal
/// integers without leading zeros, of any length. `None`: either is not one. Pure.
pub fn compare_resource_versions(a: &str, b: &str) -> Option<std::cmp::Ordering> {
    let valid = |v: &str| !v.is_empty() && !v.starts_with('0') && v.bytes().all(|c| c.is_ascii_digit());
    (valid(a) && valid(b)).then(|| a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
}

/// Whether `a` and `b` are the same version of an object: both carry a `resourceVersion` and it is the same (an object
/// without one, as in unit tests, is never judged unchanged).
pub(super) fn same_version<K: kube::Resource>(a: &K, b: &K) -> bool {
    a.meta().resource_version.is_some() && a.meta().resource_version == b.meta().resource_version
}

#[cfg(test)]
mod tests {
    use super::super::watches::shard_of;
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::ResourceExt;

    fn cm(ns: &str, name: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.namespace = Some(ns.into());
        c.metadata.name = Some(name.into());
        c
    }

    /// A merge feeding a real kube store, as [`Informer::run`] does; returns what it notified.
    struct Harness {
        merge: Merge<ConfigMap>,
        writer: Writer<ConfigMap>,
    }

    impl Harness {
        fn new(sources: usize) -> Self {
            Self { merge: Merge::new(sources), writer: Writer::default() }
        }

        fn feed(&mut self, source: usize, event: watcher::Event<ConfigMap>) -> Vec<String> {
            self.feed_from((0, source), event)
        }

        fn feed_from(&mut self, source: Src, event: watcher::Event<ConfigMap>) -> Vec<String> {
            let reader = self.writer.as_reader();
            let steps = self
                .merge
                .handle(source, event, &|r| reader.get(r), &|| reader.state().iter().map(|o| (**o).clone()).collect());
            self.apply(steps)
        }

        /// Carries out `steps` as the informer does; returns the changes handed on.
        fn apply(&mut self, steps: Vec<Step<ConfigMap>>) -> Vec<String> {
            let mut notified = Vec::new();
            for s in steps {
                match s {
                    Step::Store(e) => self.writer.apply_watcher_event(&e),
                    Step::Notify(Change::Applied(o)) => {
                        notified.push(format!("+{}/{}", o.namespace().unwrap_or_default(), o.name_any()))
                    }
                    Step::Notify(Change::Deleted(o)) => {
                        notified.push(format!("-{}/{}", o.namespace().unwrap_or_default(), o.name_any()))
                    }
                }
            }
            notified
        }

        fn names(&self) -> Vec<String> {
            let mut v: Vec<String> = self
                .writer
                .as_reader()
                .state()
                .iter()
                .map(|o| format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()))
                .collect();
            v.sort();
            v
        }

        fn ready(&self) -> bool {
            self.writer.as_reader().wait_until_ready().now_or_never().is_some_and(|r| r.is_ok())
        }

        fn list(&mut self, source: usize, objects: &[ConfigMap]) -> Vec<String> {
            self.list_from((0, source), objects)
        }

        fn list_from(&mut self, source: Src, objects: &[ConfigMap]) -> Vec<String> {
            let mut n = self.feed_from(source, watcher::Event::Init);
            for o in objects {
                n.extend(self.feed_from(source, watcher::Event::InitApply(o.clone())));
            }
            n.extend(self.feed_from(source, watcher::Event::InitDone));
            n
        }

        /// What the informer does for `regroup` (one source per group: the cluster).
        fn regroup(&mut self, regroup: Regroup) -> Vec<String> {
            let reader = self.writer.as_reader();
            let lookup = |r: &ObjectRef<ConfigMap>| reader.get(r);
            let all = || reader.state().iter().map(|o| (**o).clone()).collect::<Vec<_>>();
            let steps = match regroup {
                Regroup::Watch { group, .. } => {
                    self.merge.add_source((group, 0));
                    Vec::new()
                }
                Regroup::Unwatch(group) => self.merge.remove_source((group, 0), &lookup, &all),
                Regroup::Forget(lost) => self.merge.forget(|o| shard_of(o).is_some_and(|k| lost.contains(&k)), &lookup),
                Regroup::Rebuild { group, replaces, .. } => {
                    self.merge.carry(replaces.iter().map(|g| (*g, 0)).collect(), (group, 0), &all)
                }
            };
            self.apply(steps)
        }
    }

    /// An object of shard `shard` at resourceVersion `rv`.
    fn sharded(name: &str, shard: u32, rv: &str) -> ConfigMap {
        let mut c = cm("a", name);
        c.metadata.labels = Some([(pko_api::constants::SHARD_LABEL.to_string(), shard.to_string())].into());
        c.metadata.resource_version = Some(rv.into());
        c
    }

    fn set(v: &[u32]) -> BTreeSet<u32> {
        v.iter().copied().collect()
    }

    #[test]
    fn a_gained_group_lists_only_its_objects_a_lost_shard_leaves_the_store_and_a_rebuild_hands_on_only_changes() {
        let mut h = Harness { merge: Merge::default(), writer: Writer::default() };
        let mut g = Groups::default();
        for r in g.follow(&set(&[1])) {
            h.regroup(r);
        }
        assert_eq!(h.list_from((0, 0), &[sharded("x", 1, "1")]), ["+a/x"]);
        assert!(h.ready());
        // gain shard 2: its own group lists only its objects; shard 1's watch goes on
        let steps = g.follow(&set(&[1, 2]));
        assert_eq!(steps, [Regroup::Watch { group: 1, shards: set(&[2]) }]);
        for r in steps {
            assert_eq!(h.regroup(r), Vec::<String>::new());
        }
        assert_eq!(h.list_from((1, 0), &[sharded("y", 2, "2")]), ["+a/y"]);
        assert_eq!(
            h.feed_from((0, 0), watcher::Event::Apply(sharded("x", 1, "3"))),
            ["+a/x"],
            "shard 1's watch never stopped"
        );
        // lose shard 2: its objects leave the store as deleted, without a list
        let mut notified = Vec::new();
        for r in g.follow(&set(&[1])) {
            notified.extend(h.regroup(r));
        }
        assert_eq!(notified, ["-a/y"]);
        assert_eq!(h.names(), ["a/x"]);
        // a rebuild carries the objects over: its list hands on only the new and the changed
        let one = |k: u32| (set(&[k]), set(&[k]));
        let mut g = Groups {
            groups: [(0, one(1)), (1, one(4)), (2, one(5)), (3, one(6))].into(),
            held: Some(set(&[1, 4, 5, 6])),
            next: 7,
        };
        let steps = g.follow(&set(&[1, 3, 4, 5, 6]));
        assert_eq!(
            steps,
            [Regroup::Rebuild { group: 7, shards: set(&[1, 3, 4, 5, 6]), replaces: vec![0, 1, 2, 3] }],
            "a fifth group"
        );
        for r in steps {
            h.regroup(r);
        }
        assert_eq!(h.list_from((7, 0), &[sharded("x", 1, "3"), sharded("z", 3, "4")]), ["+a/z"]);
        assert_eq!(h.names(), ["a/x", "a/z"]);
        // an event of a closed source changes nothing
        assert_eq!(h.feed_from((1, 0), watcher::Event::Apply(sharded("y", 2, "5"))), Vec::<String>::new());
    }

    #[test]
    fn the_store_never_goes_back_to_an_older_version_of_an_object() {
        let with = |name: &str, uid: &str, rv: &str| {
            let mut c = sharded(name, 5, rv);
            c.metadata.uid = Some(uid.into());
            c
        };
        let rv = |h: &Harness, name: &str| {
            h.writer
                .as_reader()
                .get(&ObjectRef::new(name).within("a"))
                .and_then(|o| o.metadata.resource_version.clone())
        };
        // shard 5 lost and regained while the first group, covering 1 and 5, stayed open for shard 1:
        // the new group lists it fresh, then the first group's watch delivers what it had buffered
        let mut h = Harness { merge: Merge::default(), writer: Writer::default() };
        h.merge.add_source((0, 0));
        h.merge.add_source((1, 0));
        h.list_from((0, 0), &[with("x", "u1", "7")]);
        assert_eq!(h.list_from((1, 0), &[with("x", "u1", "10")]), ["+a/x"]);
        assert_eq!(
            h.feed_from((0, 0), watcher::Event::Apply(with("x", "u1", "8"))),
            Vec::<String>::new(),
            "an older version: not stored, not handed on"
        );
        assert_eq!(rv(&h, "x").as_deref(), Some("10"));
        assert_eq!(
            h.feed_from((0, 0), watcher::Event::Apply(with("x", "u1", "11"))),
            ["+a/x"],
            "a newer one from either watch"
        );
        // a re-list from the watch cache older than the store keeps the newer version
        h.list_from((1, 0), &[with("x", "u1", "9")]);
        assert_eq!(rv(&h, "x").as_deref(), Some("11"));
        // resource versions compare as integers, not as text
        assert_eq!(h.feed_from((1, 0), watcher::Event::Apply(with("x", "u1", "100"))), ["+a/x"]);
        assert_eq!(rv(&h, "x").as_deref(), Some("100"));
        // recreated under the same name: the new object is taken whatever its version, and the old
        // one's late delete does not remove it
        assert_eq!(h.feed_from((1, 0), watcher::Event::Apply(with("x", "u2", "12"))), ["+a/x"]);
        assert_eq!(h.feed_from((0, 0), watcher::Event::Delete(with("x", "u1", "100"))), Vec::<String>::new());
        assert_eq!(rv(&h, "x").as_deref(), Some("12"));
        assert_eq!(h.feed_from((1, 0), watcher::Event::Delete(with("x", "u2", "13"))), ["-a/x"]);
        assert_eq!(compare_resource_versions("9", "10"), Some(std::cmp::Ordering::Less));
        assert_eq!(compare_resource_versions("010", "9"), None, "not a resource version");
    }

    #[test]
    fn one_source_lists_then_applies_and_deletes() {
        let mut h = Harness::new(1);
        assert!(!h.ready());
        assert_eq!(h.list(0, &[cm("a", "x"), cm("a", "y")]), ["+a/x", "+a/y"]);
        assert!(h.ready(), "ready after the first list");
        assert_eq!(h.names(), ["a/x", "a/y"]);
        assert_eq!(h.feed(0, watcher::Event::Apply(cm("a", "z"))), ["+a/z"]);
        assert_eq!(h.feed(0, watcher::Event::Delete(cm("a", "x"))), ["-a/x"]);
        assert_eq!(h.names(), ["a/y", "a/z"]);
    }

    #[test]
    fn the_store_is_ready_only_once_every_namespace_has_listed() {
        let mut h = Harness::new(2);
        h.list(0, &[cm("a", "x")]);
        assert!(!h.ready(), "namespace b has not listed yet");
        assert_eq!(h.names(), ["a/x"], "a's objects are visible before b lists");
        h.list(1, &[cm("b", "x")]);
        assert!(h.ready());
        assert_eq!(h.names(), ["a/x", "b/x"], "the ready replay loses nothing");
    }

    #[test]
    fn a_relist_deletes_only_what_its_own_namespace_no_longer_has() {
        let mut h = Harness::new(2);
        h.list(0, &[cm("a", "x"), cm("a", "y")]);
        h.list(1, &[cm("b", "x")]);
        // a's watch restarts (a 410 Gone, or a new selector) and y was deleted meanwhile
        assert_eq!(h.list(0, &[cm("a", "x")]), ["+a/x", "-a/y"]);
        assert_eq!(h.names(), ["a/x", "b/x"], "b's objects survive a's re-list");
        // b re-lists: z is new, x is gone
        h.feed(1, watcher::Event::Init);
        h.feed(1, watcher::Event::InitApply(cm("b", "z")));
        assert_eq!(h.feed(1, watcher::Event::InitDone), ["-b/x"]);
        assert_eq!(h.names(), ["a/x", "b/z"]);
    }

    #[test]
    fn a_relist_for_new_shards_hands_on_only_new_and_changed_objects_and_a_failed_watch_everything() {
        let at = |name: &str, rv: &str| {
            let mut c = cm("a", name);
            c.metadata.resource_version = Some(rv.into());
            c
        };
        let mut h = Harness::new(1);
        assert_eq!(h.list(0, &[at("x", "1"), at("y", "1")]), ["+a/x", "+a/y"]);
        // a new selector (shards gained) re-lists: x unchanged, y changed, z new, w gone
        h.feed(0, watcher::Event::Apply(at("w", "2")));
        h.merge.skip_unchanged_in_next_lists();
        assert_eq!(h.list(0, &[at("x", "1"), at("y", "3"), at("z", "3")]), ["+a/y", "+a/z", "-a/w"]);
        assert_eq!(h.names(), ["a/x", "a/y", "a/z"], "the unchanged object stays in the store");
        assert_eq!(
            h.writer.as_reader().get(&ObjectRef::new("y").within("a")).unwrap().metadata.resource_version.as_deref(),
            Some("3")
        );
        // a failed watch's re-list (no new selector) hands on everything, as kube's reflector does
        assert_eq!(h.list(0, &[at("x", "1"), at("y", "3"), at("z", "3")]), ["+a/x", "+a/y", "+a/z"]);
        // an object that left (another shard's) and came back is new again
        h.merge.skip_unchanged_in_next_lists();
        h.list(0, &[at("x", "1")]);
        h.merge.skip_unchanged_in_next_lists();
        assert_eq!(h.list(0, &[at("x", "1"), at("y", "3")]), ["+a/y"]);
        // objects without a resourceVersion are never judged unchanged
        h.merge.skip_unchanged_in_next_lists();
        assert_eq!(h.list(0, &[cm("a", "x")]), ["+a/x", "-a/y"]);
    }
}
