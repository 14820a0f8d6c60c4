//! The running half of an [`Informer`]: its watch streams (one per source and watch group), the shard groups they
//! follow, and what each event and each change of the held shards does to the store, to the subscribers, and to the
//! reports of objects that do not decode ([`super::lenient`]).

use super::lenient::{Lenient, Undecodable};
use super::*;

/// The events of one source's watch.
pub(super) type SourceStream<K> = BoxStream<'static, watcher::Result<watcher::Event<Lenient<K>>>>;

/// The watches of one kind and the merge of their events.
pub(super) struct Watches<K: Watched> {
    apis: Vec<Api<Lenient<K>>>,
    config: watcher::Config,
    merge: Merge<K>,
    pub streams: StreamMap<Src, SourceStream<K>>,
    groups: Groups,
    /// The held shards the watches follow (sharded kinds): what an event must be of to count.
    held: Option<HeldShards>,
}

/// Reads of the store the merge needs.
pub(super) struct Reads<'a, K: Watched> {
    pub lookup: &'a (dyn Fn(&ObjectRef<K>) -> Option<Arc<K>> + Sync),
    pub all: &'a (dyn Fn() -> Vec<K> + Sync),
}

impl<K: Watched> Watches<K> {
    pub fn new(apis: Vec<Api<Lenient<K>>>, config: watcher::Config) -> Self {
        let (merge, streams, groups) = (Merge::default(), StreamMap::new(), Groups::default());
        Self { apis, config, merge, streams, groups, held: None }
    }

    /// The steps for the shards held now (`None`: an unsharded kind, watched whole): the groups to open, close, fold or
    /// forget ([`Groups::follow`]), carried out.
    pub fn follow(&mut self, now: Option<HeldShards>, reads: &Reads<'_, K>) -> Vec<Step<K>> {
        let kind = K::kind(&());
        let regroups = match &now {
            None => vec![Regroup::Watch { group: 0, shards: BTreeSet::new() }],
            Some(h) => self.groups.follow(&h.shards),
        };
        for r in &regroups {
            match r {
                Regroup::Forget(lost) => {
                    tracing::info!(kind = %kind, shards = lost.len(), "shards lost: their objects leave the cache")
                }
                Regroup::Unwatch(group) => {
                    tracing::info!(kind = %kind, group, "watch group closed: none of its shards is held")
                }
                Regroup::Watch { group, shards } => {
                    tracing::info!(kind = %kind, group, shards = shards.len(),
                        "shards gained: listing and watching only them")
                }
                Regroup::Rebuild { group, shards, replaces } => {
                    tracing::info!(kind = %kind, group, shards = shards.len(), replaced = replaces.len(),
                        "watch groups folded into one: listing every held shard again")
                }
            }
        }
        self.held = now;
        regroups.into_iter().flat_map(|r| self.regroup(r, reads)).collect()
    }

    /// Opens the watches of `group` (one per source), over `shards` when the kind is sharded.
    fn open(&mut self, group: u64, shards: &BTreeSet<u32>) {
        let mut config = self.config.clone();
        if let Some(h) = &self.held {
            let selector = shard_selector(shards, h.total);
            config.label_selector = Some(match config.label_selector.take() {
                Some(own) if !own.is_empty() => format!("{own},{selector}"),
                _ => selector,
            });
        }
        for (i, api) in self.apis.iter().enumerate() {
            let stream = watcher(api.clone(), config.clone()).default_backoff().modify(prune).boxed();
            self.streams.insert((group, i), stream);
        }
    }

    /// Carries out one [`Regroup`]: opens or closes a group's watches, drops the objects of lost shards; returns the
    /// store writes and changes to hand on.
    fn regroup(&mut self, step: Regroup, reads: &Reads<'_, K>) -> Vec<Step<K>> {
        let sources = 0..self.apis.len();
        match step {
            Regroup::Watch { group, shards } => {
                self.open(group, &shards);
                sources.for_each(|i| self.merge.add_source((group, i)));
                Vec::new()
            }
            Regroup::Unwatch(group) => sources
                .flat_map(|i| {
                    self.streams.remove(&(group, i));
                    self.merge.remove_source((group, i), &reads.lookup, &reads.all)
                })
                .collect(),
            Regroup::Forget(lost) => {
                self.merge.forget(|o| shard_of(o).is_some_and(|k| lost.contains(&k)), &reads.lookup)
            }
            Regroup::Rebuild { group, shards, replaces } => {
                self.open(group, &shards);
                let mut steps = Vec::new();
                for i in sources {
                    replaces.iter().for_each(|old| _ = self.streams.remove(&(*old, i)));
                    steps.extend(self.merge.carry(
                        replaces.iter().map(|old| (*old, i)).collect(),
                        (group, i),
                        &reads.all,
                    ));
                }
                steps
            }
        }
    }

    /// What `event` of `source` does: the store writes and changes to hand on, and the objects that do not decode (an
    /// older decoded version of one leaves the store: it no longer says what is asked). An event of a shard not held (a
    /// group's selector still covers a lost one) is dropped.
    pub fn on_event(
        &mut self,
        source: Src,
        event: watcher::Event<Lenient<K>>,
        reads: &Reads<'_, K>,
    ) -> (Vec<Step<K>>, Vec<Undecodable>) {
        if let Some(h) = &self.held
            && event_meta(&event).is_some_and(|o| shard_of(o).is_some_and(|k| !h.shards.contains(&k)))
        {
            return (Vec::new(), Vec::new());
        }
        let deleting = matches!(event, watcher::Event::Delete(_));
        let (decoded, bad) = split(event);
        let mut steps = match decoded {
            Some(e) => self.merge.handle(source, e, &reads.lookup, &reads.all),
            None => Vec::new(),
        };
        for u in &bad {
            let r = ObjectRef::new(u.meta.name.as_deref().unwrap_or_default())
                .within(u.meta.namespace.as_deref().unwrap_or_default());
            if let Some(stored) = (reads.lookup)(&r) {
                steps.extend(deleted((*stored).clone()));
            }
        }
        // a deleted object needs no report
        (steps, if deleting { Vec::new() } else { bad })
    }
}

/// The decoded event of `event`, and the objects of it that do not decode (dropped from the event). Pure.
fn split<K: Clone>(event: watcher::Event<Lenient<K>>) -> (Option<watcher::Event<K>>, Vec<Undecodable>) {
    use watcher::Event as E;
    let one = |o: Lenient<K>, wrap: fn(K) -> E<K>| match o {
        Lenient::Decoded(k) => (Some(wrap(k)), Vec::new()),
        Lenient::Undecodable(u) => (None, vec![*u]),
    };
    match event {
        E::Init => (Some(E::Init), Vec::new()),
        E::InitDone => (Some(E::InitDone), Vec::new()),
        E::InitApply(o) => one(o, E::InitApply),
        E::Apply(o) => one(o, E::Apply),
        // the delete of an object that did not decode: whatever the store holds of it leaves
        E::Delete(o) => one(o, E::Delete),
    }
}

/// The metadata of the object an event is about (none for the markers of a list).
fn event_meta<K: kube::Resource>(event: &watcher::Event<K>) -> Option<&K> {
    match event {
        watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o) => Some(o),
        watcher::Event::Init | watcher::Event::InitDone => None,
    }
}

/// The shard an object is labelled with ([`pko_api::constants::SHARD_LABEL`]); `None` without a label, or with one that
/// is no shard number.
pub(super) fn shard_of<K: kube::Resource>(object: &K) -> Option<u32> {
    object.meta().labels.as_ref()?.get(pko_api::constants::SHARD_LABEL)?.parse().ok()
}
