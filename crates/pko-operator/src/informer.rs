//! One watch per kind, shared by every controller that needs it (the informer of client-go's shared
//! informer factory; kube's own shared streams are behind `unstable-runtime-subscribe`, whose
//! subscriber stalls when an object is deleted between its event and its read).
//!
//! An [`Informer`] runs one watch per *source* — the whole cluster, or each namespace of
//! `--namespaces` — merges them into one [`Store`], and hands every change to each subscriber:
//! controllers get their trigger stream from [`Informer::objects`] and their cache from
//! [`Informer::store`]. With several namespaces every watch is namespaced, so a namespace-scoped
//! install needs only namespaced RBAC and pays nothing for other namespaces' churn.
//!
//! [`Informers`] holds one informer per kind, created when a controller first subscribes, so a
//! process (or a test) that runs only some controllers watches only their kinds.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Debug;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Api;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use pko_api::{Program, Stack, Update, Workspace};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamMap;
use tokio_util::sync::CancellationToken;

/// Where a replica watches (the operator's `--namespaces`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum WatchScope {
    /// Every namespace: one cluster-wide watch per kind (needs cluster-wide RBAC).
    #[default]
    Cluster,
    /// These namespaces: one namespaced watch per kind and namespace (namespaced RBAC suffices).
    Namespaces(Vec<String>),
}

impl WatchScope {
    /// `Cluster` for an empty list, else the listed namespaces (duplicates dropped).
    pub fn from_namespaces(namespaces: &[String]) -> Self {
        let mut seen = HashSet::new();
        let list: Vec<String> = namespaces.iter().filter(|n| seen.insert(n.as_str())).cloned().collect();
        if list.is_empty() { Self::Cluster } else { Self::Namespaces(list) }
    }
}

/// A change an informer saw: an object created or changed (also every object of a re-list), or
/// deleted.
#[derive(Debug, Clone, PartialEq)]
pub enum Change<K> {
    /// Created, changed, or listed again.
    Applied(K),
    /// Deleted (or gone from a re-list).
    Deleted(K),
}

impl<K> Change<K> {
    /// The object, whichever the change.
    pub fn into_object(self) -> K {
        match self {
            Change::Applied(k) | Change::Deleted(k) => k,
        }
    }
}

/// The bound on what kinds an informer watches: namespaced, statically typed Kubernetes objects.
pub trait Watched: kube::Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug + Send + Sync + 'static {}
impl<K> Watched for K where K: kube::Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug + Send + Sync + 'static {}

/// Changes a subscriber may hold before the informer waits for it (backpressure, never loss).
const SUBSCRIBER_BUFFER: usize = 1024;

/// One kind's shared watch: its sources, its store, its subscribers.
pub struct Informer<K: Watched> {
    apis: Vec<Api<K>>,
    config: watcher::Config,
    writer: Writer<K>,
    /// Boxed: a channel allocates its slots in blocks of 32, and a `Stack` is kilobytes inline.
    subscribers: Vec<mpsc::Sender<Box<Change<K>>>>,
    shards: Option<watch::Receiver<HeldShards>>,
}

/// The shards a fleet replica holds out of `total`, as the fleet publishes them to the informers of
/// sharded kinds ([`Informers::with_shards`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldShards {
    /// The held shards.
    pub shards: BTreeSet<u32>,
    /// The fleet's shard count (`--shards`).
    pub total: u32,
}

impl<K: Watched> Informer<K> {
    /// An informer of `K` over `scope` with `config` (label or field selectors); it watches nothing
    /// until [`Self::run`].
    pub fn new(client: &kube::Client, scope: &WatchScope, config: watcher::Config) -> Self {
        let apis = match scope {
            WatchScope::Cluster => vec![Api::all(client.clone())],
            WatchScope::Namespaces(list) => list.iter().map(|ns| Api::namespaced(client.clone(), ns)).collect(),
        };
        Self { apis, config, writer: Writer::default(), subscribers: Vec::new(), shards: None }
    }

    /// Watches and keeps only the objects of the shards `held` names (the fleet: the shards this
    /// replica holds), labelled [`pko_api::constants::SHARD_LABEL`], in watch groups ([`Groups`]): a
    /// gain watches only the gained shards, a loss drops their objects from the store without a list,
    /// and the watches of shards still held never stop.
    pub fn with_held_shards(mut self, held: watch::Receiver<HeldShards>) -> Self {
        self.shards = Some(held);
        self
    }

    /// The cache: every object of every source, ready once each source has listed once.
    pub fn store(&self) -> Store<K> {
        self.writer.as_reader()
    }

    /// Every change from now on. Subscribe before [`Self::run`] to see the first list; a subscriber
    /// that is not read holds the informer back (bounded buffer), a dropped one is forgotten.
    pub fn subscribe(&mut self) -> impl Stream<Item = Change<K>> + Send + 'static {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        self.subscribers.push(tx);
        tokio_stream::wrappers::ReceiverStream::new(rx).map(|c| *c)
    }

    /// The objects of every change, as kube's `Controller::for_stream` / `watches_stream` take them.
    pub fn objects(&mut self) -> BoxStream<'static, Result<K, watcher::Error>> {
        self.subscribe().map(|c| Ok(c.into_object())).boxed()
    }

    /// Watches until `shutdown` is cancelled: keeps the store and hands every change to the
    /// subscribers. Watch errors are logged and retried with kube's default backoff.
    pub async fn run(self, shutdown: CancellationToken) {
        let Informer { apis, config, mut writer, mut subscribers, mut shards } = self;
        let kind = K::kind(&());
        let reader = writer.as_reader();
        let lookup = |r: &ObjectRef<K>| reader.get(r);
        let all = || reader.state().iter().map(|o| (**o).clone()).collect::<Vec<K>>();
        let mut merge = Merge::default();
        let mut streams: StreamMap<Src, SourceStream<K>> = StreamMap::new();
        let mut groups = Groups::default();
        // the held shards the watches follow (sharded kinds), and what an event must be of to count
        let mut held: Option<HeldShards> = None;
        let first = match shards.as_mut() {
            None => vec![Regroup::Watch { group: 0, shards: BTreeSet::new() }],
            Some(rx) => {
                let now = rx.borrow_and_update().clone();
                let steps = groups.follow(&now.shards);
                held = Some(now);
                steps
            }
        };
        let mut pending: Vec<Step<K>> = Vec::new();
        for r in first {
            pending.extend(Self::regroup(r, &apis, &config, held.as_ref(), &mut merge, &mut streams, &lookup, &all));
        }
        if !deliver(pending, &mut writer, &mut subscribers, &shutdown).await {
            return;
        }
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                e = streams.next(), if !streams.is_empty() => e,
                Ok(()) = async { match shards.as_mut() { Some(s) => s.changed().await, None => std::future::pending().await } } => {
                    let Some(rx) = shards.as_mut() else { continue };
                    let now = rx.borrow_and_update().clone();
                    let regroups = groups.follow(&now.shards);
                    for r in &regroups {
                        match r {
                            Regroup::Forget(lost) => tracing::info!(kind = %kind, shards = lost.len(), "shards lost: their objects leave the cache, nothing is listed"),
                            Regroup::Unwatch(group) => tracing::info!(kind = %kind, group, "watch group closed: none of its shards is held"),
                            Regroup::Watch { group, shards } => tracing::info!(kind = %kind, group, shards = shards.len(), "shards gained: listing and watching only them"),
                            Regroup::Rebuild { group, shards, replaces } => tracing::info!(kind = %kind, group, shards = shards.len(), replaced = replaces.len(), "watch groups folded into one: listing every held shard again"),
                        }
                    }
                    held = Some(now);
                    let mut steps = Vec::new();
                    for r in regroups {
                        steps.extend(Self::regroup(r, &apis, &config, held.as_ref(), &mut merge, &mut streams, &lookup, &all));
                    }
                    if !deliver(steps, &mut writer, &mut subscribers, &shutdown).await {
                        return;
                    }
                    continue;
                }
            };
            let Some((source, event)) = next else { continue };
            let event = match event {
                Ok(e) => e,
                Err(e) => {
                    tracing::warn!(kind = %kind, error = %e, "watch failed; retrying");
                    continue;
                }
            };
            // a watch whose selector covers shards no longer held (a group that lost some): not ours
            if let Some(h) = &held
                && event_object(&event).is_some_and(|o| shard_of(o).is_some_and(|k| !h.shards.contains(&k)))
            {
                continue;
            }
            let steps = merge.handle(source, event, &lookup, &all);
            if !deliver(steps, &mut writer, &mut subscribers, &shutdown).await {
                return;
            }
        }
    }

    /// Carries out one [`Regroup`]: opens or closes a group's watches (one per source), drops the
    /// objects of lost shards; returns the store writes and changes to hand on.
    #[allow(clippy::too_many_arguments)]
    fn regroup(
        step: Regroup,
        apis: &[Api<K>],
        config: &watcher::Config,
        held: Option<&HeldShards>,
        merge: &mut Merge<K>,
        streams: &mut StreamMap<Src, SourceStream<K>>,
        lookup: &impl Fn(&ObjectRef<K>) -> Option<Arc<K>>,
        all: &impl Fn() -> Vec<K>,
    ) -> Vec<Step<K>> {
        let open = |group: u64, shards: &BTreeSet<u32>, streams: &mut StreamMap<Src, SourceStream<K>>| {
            let mut config = config.clone();
            if let Some(h) = held {
                let selector = shard_selector(shards, h.total);
                config.label_selector = Some(match config.label_selector.take() {
                    Some(own) if !own.is_empty() => format!("{own},{selector}"),
                    _ => selector,
                });
            }
            for (i, api) in apis.iter().enumerate() {
                streams.insert((group, i), watcher(api.clone(), config.clone()).default_backoff().modify(prune).boxed());
            }
        };
        match step {
            Regroup::Watch { group, shards } => {
                open(group, &shards, streams);
                for i in 0..apis.len() {
                    merge.add_source((group, i));
                }
                Vec::new()
            }
            Regroup::Unwatch(group) => {
                let mut steps = Vec::new();
                for i in 0..apis.len() {
                    streams.remove(&(group, i));
                    steps.extend(merge.remove_source((group, i), lookup, all));
                }
                steps
            }
            Regroup::Forget(lost) => merge.forget(|o| shard_of(o).is_some_and(|k| lost.contains(&k)), lookup),
            Regroup::Rebuild { group, shards, replaces } => {
                open(group, &shards, streams);
                let mut steps = Vec::new();
                for i in 0..apis.len() {
                    for old in &replaces {
                        streams.remove(&(*old, i));
                    }
                    steps.extend(merge.carry(replaces.iter().map(|old| (*old, i)).collect(), (group, i), all));
                }
                steps
            }
        }
    }
}

/// A source of an informer: (watch group, index of the namespace's `Api`, or 0 for the cluster).
type Src = (u64, usize);

/// The events of one source's watch.
type SourceStream<K> = BoxStream<'static, watcher::Result<watcher::Event<K>>>;

/// The object an event is about (none for the markers of a list).
fn event_object<K>(event: &watcher::Event<K>) -> Option<&K> {
    match event {
        watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o) => Some(o),
        watcher::Event::Init | watcher::Event::InitDone => None,
    }
}

/// The shard an object is labelled with ([`pko_api::constants::SHARD_LABEL`]); `None` without a
/// label, or with one that is no shard number.
fn shard_of<K: kube::Resource>(object: &K) -> Option<u32> {
    object.meta().labels.as_ref()?.get(pko_api::constants::SHARD_LABEL)?.parse().ok()
}

/// Writes `steps` into the store and hands their changes to `subscribers` (dropping the closed
/// ones); `false` once `shutdown` is cancelled while a subscriber was full.
async fn deliver<K: Watched>(steps: Vec<Step<K>>, writer: &mut Writer<K>, subscribers: &mut Vec<mpsc::Sender<Box<Change<K>>>>, shutdown: &CancellationToken) -> bool {
    for step in steps {
        match step {
            Step::Store(e) => writer.apply_watcher_event(&e),
            Step::Notify(change) => {
                for tx in subscribers.iter() {
                    tokio::select! {
                        _ = shutdown.cancelled() => return false,
                        _ = tx.send(Box::new(change.clone())) => {}
                    }
                }
                subscribers.retain(|tx| !tx.is_closed());
            }
        }
    }
    true
}

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
    /// Watch every held shard as one group in place of the groups `replaces`: one re-list of
    /// everything held, whose objects already stored carry over and are handed on only when new or
    /// changed.
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

/// The watch groups of a sharded informer (pure): each watches the shards it was opened for and
/// keeps those still held. A gain opens a group for the gained shards; a group none of whose shards
/// is held closes; the objects of lost shards leave the store at once. Groups fold into one when
/// there are more than [`MAX_WATCH_GROUPS`], or when their selectors cover more than twice the held
/// shards (events of shards not held are dropped on arrival, but still sent).
#[derive(Debug, Default)]
pub struct Groups {
    next: u64,
    /// Group id → (shards its selector watches, of those the ones still held).
    groups: BTreeMap<u64, (BTreeSet<u32>, BTreeSet<u32>)>,
    held: Option<BTreeSet<u32>>,
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

    /// Whether the groups' selectors, and a group for `adding` more shards, cover more than twice
    /// the held shards.
    fn too_wide(&self, held: &BTreeSet<u32>, adding: usize) -> bool {
        self.groups.values().map(|(w, _)| w.len()).sum::<usize>() + adding > 2 * held.len().max(1)
    }

    fn open(&mut self, shards: BTreeSet<u32>) -> Regroup {
        let group = self.next_id();
        self.groups.insert(group, (shards.clone(), shards.clone()));
        Regroup::Watch { group, shards }
    }

    fn next_id(&mut self) -> u64 {
        let id = self.next;
        self.next += 1;
        id
    }
}

/// The watch configuration every informer starts from: its lists are served from the API server's
/// watch cache (`resourceVersion=0`, client-go's reflector default; kube's `any_semantic`) instead of
/// a quorum read from etcd in pages of 500. A list may then be a moment older than the store; the watch
/// resumes from that list's `resourceVersion`, so the events between bring the store forward again.
/// At 10,000 Stacks a re-list from etcd costs the API server seconds per kind, and a selector that
/// matches few objects (the labeller's `!pulumi.com/shard`) scans them all.
pub fn list_config() -> watcher::Config {
    watcher::Config::default().any_semantic()
}

/// The annotation client-side `kubectl apply` keeps a whole copy of the last applied object in.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what no controller reads from a watched object before it is cached or handed on: its
/// `managedFields` (every field manager's field set, often larger than the spec) and the
/// [`LAST_APPLIED_ANNOTATION`] (a copy of the applied object). Kube-rs' documented memory pruning;
/// safe because the operator writes these kinds only with patches and server-side apply, never with
/// a whole-object `PUT` from the cache (an empty `managedFields` list would leave the server's as
/// they are anyway).
pub fn prune<K: kube::Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
    if let Some(annotations) = object.meta_mut().annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
    }
}

/// What the merge asks of the informer: write an event into the store, or hand a change on.
#[derive(Debug)]
enum Step<K> {
    Store(watcher::Event<K>),
    Notify(Change<K>),
}

/// The two steps of an object leaving the store: its delete, then the `Deleted` change handed on.
fn deleted<K: Clone>(o: K) -> [Step<K>; 2] {
    [Step::Store(watcher::Event::Delete(o.clone())), Step::Notify(Change::Deleted(o))]
}

/// Merges the watch events of several sources (disjoint: one namespace each, or the cluster, per watch
/// group) into one store. Each source's re-list replaces only that source's objects: what it no
/// longer lists is deleted. Once every source there was before the store was ready has listed, the
/// store is marked ready (kube's store is ready after its first `InitDone`, so the merge replays the
/// store's contents as one init).
///
/// A source opened in place of others ([`Merge::carry`], a watch group rebuilt) takes over their
/// objects, and its first list hands on only the objects new to the store or changed since (another
/// `resourceVersion`): handing on the thousands already there made each controller reconcile every
/// one of them again (a ~60-80 s halt of a 10,000-Stack fleet after a failover). Controllers of
/// sharded kinds look again by themselves at what they skipped while not owning it
/// ([`crate::k8s::unowned`]), so nothing relies on a re-list to be looked at again. A re-list after a
/// failed watch (kube's watcher, e.g. `410 Gone`) hands on everything, as kube's own reflector does.
struct Merge<K: Watched> {
    sources: HashMap<Src, Source<K>>,
    /// Sources that must list once before the store is ready.
    unlisted: HashSet<Src>,
    ready: bool,
}

/// What the merge knows of one source.
struct Source<K: Watched> {
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
    fn new(sources: usize) -> Self {
        let mut m = Self::default();
        for i in 0..sources {
            m.add_source((0, i));
        }
        m
    }

    /// A new source; before the store is ready, the store waits for its list too.
    fn add_source(&mut self, src: Src) {
        self.sources.insert(src, Source::default());
        if !self.ready {
            self.unlisted.insert(src);
        }
    }

    /// Removes `src`: its objects leave the store as deleted.
    fn remove_source(&mut self, src: Src, lookup: &impl Fn(&ObjectRef<K>) -> Option<Arc<K>>, all: &impl Fn() -> Vec<K>) -> Vec<Step<K>> {
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

    /// Opens `to` in place of the sources `from`: their objects become `to`'s, and `to`'s first list
    /// hands on only objects new to the store or changed.
    fn carry(&mut self, from: Vec<Src>, to: Src, all: &impl Fn() -> Vec<K>) -> Vec<Step<K>> {
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
    fn forget(&mut self, gone: impl Fn(&K) -> bool, lookup: &impl Fn(&ObjectRef<K>) -> Option<Arc<K>>) -> Vec<Step<K>> {
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
    fn skip_unchanged_in_next_lists(&mut self) {
        for s in self.sources.values_mut() {
            s.skip_unchanged = true;
        }
    }

    /// Once every source there was before the store was ready has listed: the store's ready replay.
    fn ready_if_listed(&mut self, all: &impl Fn() -> Vec<K>) -> Vec<Step<K>> {
        if self.ready || !self.unlisted.is_empty() {
            return Vec::new();
        }
        self.ready = true;
        let mut steps = vec![Step::Store(watcher::Event::Init)];
        steps.extend(all().into_iter().map(|o| Step::Store(watcher::Event::InitApply(o))));
        steps.push(Step::Store(watcher::Event::InitDone));
        steps
    }

    /// The steps for `event` of `source`; `lookup` reads an object from the store, `all` every one.
    /// An event of a source no longer there (closed meanwhile) changes nothing.
    fn handle(&mut self, source: Src, event: watcher::Event<K>, lookup: &impl Fn(&ObjectRef<K>) -> Option<Arc<K>>, all: &impl Fn() -> Vec<K>) -> Vec<Step<K>> {
        let Some(state) = self.sources.get_mut(&source) else { return Vec::new() };
        match event {
            watcher::Event::Apply(o) => {
                state.known.insert(ObjectRef::from_obj(&o));
                vec![Step::Store(watcher::Event::Apply(o.clone())), Step::Notify(Change::Applied(o))]
            }
            watcher::Event::Delete(o) => {
                state.known.remove(&ObjectRef::from_obj(&o));
                deleted(o).into()
            }
            watcher::Event::Init => {
                state.listing = Some(HashSet::new());
                vec![]
            }
            watcher::Event::InitApply(o) => {
                let r = ObjectRef::from_obj(&o);
                let unchanged = state.skip_unchanged && state.known.contains(&r) && lookup(&r).is_some_and(|old| same_version(&*old, &o));
                state.listing.get_or_insert_with(HashSet::new).insert(r.clone());
                state.known.insert(r);
                if unchanged {
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

/// Whether `a` and `b` are the same version of an object: both carry a `resourceVersion` and it is the
/// same (an object without one, as in unit tests, is never judged unchanged).
fn same_version<K: kube::Resource>(a: &K, b: &K) -> bool {
    a.meta().resource_version.is_some() && a.meta().resource_version == b.meta().resource_version
}

/// Boxed future of an informer's run.
type InformerRun = futures::future::BoxFuture<'static, ()>;
/// Boxed future that says whether an informer's store became ready.
type SyncWait = futures::future::BoxFuture<'static, bool>;

/// A slot of [`Informers`]: the informer of one kind, made on first use.
struct Slot<K: Watched> {
    config: watcher::Config,
    sharded: bool,
    informer: Option<Informer<K>>,
}

impl<K: Watched> Slot<K> {
    fn new(config: watcher::Config, sharded: bool) -> Self {
        Self { config, sharded, informer: None }
    }

    fn get(&mut self, client: &kube::Client, scope: &WatchScope, shards: Option<&watch::Receiver<HeldShards>>) -> &mut Informer<K> {
        let config = self.config.clone();
        let shards = shards.filter(|_| self.sharded).cloned();
        self.informer.get_or_insert_with(|| {
            let i = Informer::new(client, scope, config);
            match shards {
                Some(s) => i.with_held_shards(s),
                None => i,
            }
        })
    }
}

/// The informers of one operator replica, one per kind: Stacks, Programs, Workspaces, Updates, and the
/// agents' StatefulSets (pod runtime; only those labelled `auto.pulumi.com/component=workspace`).
pub struct Informers {
    client: kube::Client,
    scope: WatchScope,
    shards: Option<watch::Receiver<HeldShards>>,
    stacks: Slot<Stack>,
    programs: Slot<Program>,
    workspaces: Slot<Workspace>,
    updates: Slot<Update>,
    stateful_sets: Slot<StatefulSet>,
}

/// The label of the StatefulSets the Workspace controller makes (PKO's).
pub const WORKSPACE_COMPONENT_SELECTOR: &str = "auto.pulumi.com/component=workspace";

impl Informers {
    /// No informer yet; each is made when first asked for.
    pub fn new(client: kube::Client, scope: WatchScope) -> Self {
        let all = list_config;
        Self {
            client,
            scope,
            shards: None,
            stacks: Slot::new(all(), true),
            programs: Slot::new(all(), false),
            workspaces: Slot::new(all(), true),
            updates: Slot::new(all(), true),
            stateful_sets: Slot::new(all().labels(WORKSPACE_COMPONENT_SELECTOR), true),
        }
    }

    /// Watches Stacks, Workspaces, Updates and StatefulSets only in the shards `held` names (the
    /// fleet's held shards, [`Informer::with_held_shards`]); Programs stay whole (any Stack may
    /// reference one). Call before the first informer is made.
    pub fn with_shards(mut self, held: watch::Receiver<HeldShards>) -> Self {
        self.shards = Some(held);
        self
    }

    /// The client the informers watch through (without the request timeout: a watch waits by design).
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The namespaces watched.
    pub fn scope(&self) -> &WatchScope {
        &self.scope
    }

    /// The Stack informer.
    pub fn stacks(&mut self) -> &mut Informer<Stack> {
        self.stacks.get(&self.client, &self.scope, self.shards.as_ref())
    }

    /// The Program informer.
    pub fn programs(&mut self) -> &mut Informer<Program> {
        self.programs.get(&self.client, &self.scope, self.shards.as_ref())
    }

    /// The Workspace informer.
    pub fn workspaces(&mut self) -> &mut Informer<Workspace> {
        self.workspaces.get(&self.client, &self.scope, self.shards.as_ref())
    }

    /// The Update informer.
    pub fn updates(&mut self) -> &mut Informer<Update> {
        self.updates.get(&self.client, &self.scope, self.shards.as_ref())
    }

    /// The informer of the agents' StatefulSets.
    pub fn stateful_sets(&mut self) -> &mut Informer<StatefulSet> {
        self.stateful_sets.get(&self.client, &self.scope, self.shards.as_ref())
    }

    /// Runs the informers made so far beside `controllers` (the futures their subscribers' controllers
    /// return) until `controllers` ends: for tests and tools that run some controllers without the
    /// whole assembly.
    pub fn drive(self, controllers: impl std::future::Future<Output = ()> + Send + 'static) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (_, watches) = self.run(CancellationToken::new());
        async move {
            futures::pin_mut!(controllers, watches);
            futures::future::select(controllers, watches).await;
        }
    }

    /// Runs every informer made so far until `shutdown`; `synced` is set once each has listed.
    pub fn run(mut self, shutdown: CancellationToken) -> (Synced, impl std::future::Future<Output = ()> + Send + 'static) {
        let mut waits: Vec<SyncWait> = Vec::new();
        let mut runs: Vec<InformerRun> = Vec::new();
        fn add<K: Watched>(slot: &mut Slot<K>, waits: &mut Vec<SyncWait>, runs: &mut Vec<InformerRun>, shutdown: &CancellationToken) {
            if let Some(i) = slot.informer.take() {
                let store = i.store();
                waits.push(async move { store.wait_until_ready().await.is_ok() }.boxed());
                runs.push(i.run(shutdown.clone()).boxed());
            }
        }
        add(&mut self.stacks, &mut waits, &mut runs, &shutdown);
        add(&mut self.programs, &mut waits, &mut runs, &shutdown);
        add(&mut self.workspaces, &mut waits, &mut runs, &shutdown);
        add(&mut self.updates, &mut waits, &mut runs, &shutdown);
        add(&mut self.stateful_sets, &mut waits, &mut runs, &shutdown);
        let synced = Synced(Arc::new(std::sync::atomic::AtomicBool::new(false)));
        let flag = synced.clone();
        let all_synced = async move {
            if futures::future::join_all(waits).await.into_iter().all(|ok| ok) {
                flag.0.store(true, std::sync::atomic::Ordering::Relaxed);
                tracing::info!("caches synced");
            }
        };
        (synced, async move {
            futures::future::join(futures::future::join_all(runs), all_synced).await;
        })
    }
}

/// The label selector of the objects in `held` shards out of `total`: `pulumi.com/shard in (…)`, or
/// `notin` the others when that is shorter, or every labelled object when all are held; nothing (a
/// value no shard has) when none is.
pub fn shard_selector(held: &std::collections::BTreeSet<u32>, total: u32) -> String {
    use pko_api::constants::SHARD_LABEL;
    let list = |it: &mut dyn Iterator<Item = u32>| it.map(|s| s.to_string()).collect::<Vec<_>>().join(",");
    let held_count = held.len() as u32;
    if held_count == 0 {
        format!("{SHARD_LABEL}=none")
    } else if held_count >= total {
        SHARD_LABEL.to_string()
    } else if held_count <= total / 2 {
        format!("{SHARD_LABEL} in ({})", list(&mut held.iter().copied()))
    } else {
        format!("{SHARD_LABEL},{SHARD_LABEL} notin ({})", list(&mut (0..total).filter(|s| !held.contains(s))))
    }
}

/// Whether every informer has listed once (the operator's `/readyz`).
#[derive(Clone, Debug, Default)]
pub struct Synced(Arc<std::sync::atomic::AtomicBool>);

impl Synced {
    /// True once every cache has synced.
    pub fn get(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
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
            let steps = self.merge.handle(source, event, &|r| reader.get(r), &|| reader.state().iter().map(|o| (**o).clone()).collect());
            self.apply(steps)
        }

        /// Carries out `steps` as the informer does; returns the changes handed on.
        fn apply(&mut self, steps: Vec<Step<ConfigMap>>) -> Vec<String> {
            let mut notified = Vec::new();
            for s in steps {
                match s {
                    Step::Store(e) => self.writer.apply_watcher_event(&e),
                    Step::Notify(Change::Applied(o)) => notified.push(format!("+{}/{}", o.namespace().unwrap_or_default(), o.name_any())),
                    Step::Notify(Change::Deleted(o)) => notified.push(format!("-{}/{}", o.namespace().unwrap_or_default(), o.name_any())),
                }
            }
            notified
        }

        fn names(&self) -> Vec<String> {
            let mut v: Vec<String> = self.writer.as_reader().state().iter().map(|o| format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any())).collect();
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
                Regroup::Rebuild { group, replaces, .. } => self.merge.carry(replaces.iter().map(|g| (*g, 0)).collect(), (group, 0), &all),
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
    fn a_gain_watches_only_the_gained_shards_a_loss_lists_nothing_and_groups_fold_when_many_or_wide() {
        let mut g = Groups::default();
        assert_eq!(g.follow(&set(&[])), [Regroup::Watch { group: 0, shards: set(&[]) }], "the first watch, even of nothing");
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
        assert_eq!(g.follow(&set(&[1, 3, 4, 6, 7, 8])), [Regroup::Rebuild { group: 6, shards: set(&[1, 3, 4, 6, 7, 8]), replaces: vec![1, 3, 4, 5] }]);
        // selectors covering more than twice what is held (a replica that held everything, then
        // handed most over as others joined): one re-list of what is held
        let mut g = Groups::default();
        g.follow(&set(&[0, 1, 2, 3, 4, 5, 6, 7]));
        assert_eq!(g.follow(&set(&[0, 1, 2, 3])), [Regroup::Forget(set(&[4, 5, 6, 7]))], "twice: still one watch");
        assert_eq!(g.follow(&set(&[0, 1, 2])), [Regroup::Forget(set(&[3])), Regroup::Rebuild { group: 1, shards: set(&[0, 1, 2]), replaces: vec![0] }]);
        // everything lost: no watch at all, until a gain
        assert_eq!(g.follow(&set(&[])), [Regroup::Forget(set(&[0, 1, 2])), Regroup::Unwatch(1)]);
        assert_eq!(g.follow(&set(&[9])), [Regroup::Watch { group: 2, shards: set(&[9]) }]);
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
        assert_eq!(h.feed_from((0, 0), watcher::Event::Apply(sharded("x", 1, "3"))), ["+a/x"], "shard 1's watch never stopped");
        // lose shard 2: its objects leave the store as deleted, without a list
        let mut notified = Vec::new();
        for r in g.follow(&set(&[1])) {
            notified.extend(h.regroup(r));
        }
        assert_eq!(notified, ["-a/y"]);
        assert_eq!(h.names(), ["a/x"]);
        // a rebuild carries the objects over: its list hands on only the new and the changed
        let one = |k: u32| (set(&[k]), set(&[k]));
        let mut g = Groups { groups: [(0, one(1)), (1, one(4)), (2, one(5)), (3, one(6))].into(), held: Some(set(&[1, 4, 5, 6])), next: 7 };
        let steps = g.follow(&set(&[1, 3, 4, 5, 6]));
        assert_eq!(steps, [Regroup::Rebuild { group: 7, shards: set(&[1, 3, 4, 5, 6]), replaces: vec![0, 1, 2, 3] }], "a fifth group");
        for r in steps {
            h.regroup(r);
        }
        assert_eq!(h.list_from((7, 0), &[sharded("x", 1, "3"), sharded("z", 3, "4")]), ["+a/z"]);
        assert_eq!(h.names(), ["a/x", "a/z"]);
        // an event of a closed source changes nothing
        assert_eq!(h.feed_from((1, 0), watcher::Event::Apply(sharded("y", 2, "5"))), Vec::<String>::new());
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
        assert_eq!(h.writer.as_reader().get(&ObjectRef::new("y").within("a")).unwrap().metadata.resource_version.as_deref(), Some("3"));
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

    #[test]
    fn shard_selectors_stay_short() {
        let held = |v: &[u32]| v.iter().copied().collect::<std::collections::BTreeSet<u32>>();
        assert_eq!(shard_selector(&held(&[]), 8), "pulumi.com/shard=none");
        assert_eq!(shard_selector(&held(&[1, 5]), 8), "pulumi.com/shard in (1,5)");
        assert_eq!(shard_selector(&held(&[0, 1, 2, 3, 4, 6]), 8), "pulumi.com/shard,pulumi.com/shard notin (5,7)");
        assert_eq!(shard_selector(&held(&(0..8).collect::<Vec<_>>()), 8), "pulumi.com/shard");
    }

    #[test]
    fn scope_from_namespaces() {
        assert_eq!(WatchScope::from_namespaces(&[]), WatchScope::Cluster);
        assert_eq!(WatchScope::from_namespaces(&["a".into(), "b".into(), "a".into()]), WatchScope::Namespaces(vec!["a".into(), "b".into()]));
    }
}
