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

use std::collections::HashSet;
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
    subscribers: Vec<mpsc::Sender<Change<K>>>,
    shards: Option<watch::Receiver<String>>,
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

    /// Watches only the objects `selector` picks besides the informer's own selector (the fleet: the
    /// shards this replica holds); each change of it re-lists, and what no longer matches leaves the
    /// store as deleted.
    pub fn with_shard_selector(mut self, selector: watch::Receiver<String>) -> Self {
        self.shards = Some(selector);
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
        tokio_stream::wrappers::ReceiverStream::new(rx)
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
        let mut merge = Merge::new(apis.len());
        let mut events = futures::stream::select_all(Self::sources(&apis, &config, shards.as_mut()));
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                e = events.next() => e,
                Ok(()) = async { match shards.as_mut() { Some(s) => s.changed().await, None => std::future::pending().await } } => {
                    // held shards changed: watch again with the new selector (a re-list per source),
                    // handing on only the objects new to the store or changed
                    merge.skip_unchanged_in_next_lists();
                    events = futures::stream::select_all(Self::sources(&apis, &config, shards.as_mut()));
                    continue;
                }
            };
            let Some((source, event)) = next else { return };
            let event = match event {
                Ok(e) => e,
                Err(e) => {
                    tracing::warn!(kind = %kind, error = %e, "watch failed; retrying");
                    continue;
                }
            };
            for step in merge.handle(source, event, |r| reader.get(r), || reader.state().iter().map(|o| (**o).clone()).collect()) {
                match step {
                    Step::Store(e) => writer.apply_watcher_event(&e),
                    Step::Notify(change) => {
                        for tx in &subscribers {
                            tokio::select! {
                                _ = shutdown.cancelled() => return,
                                _ = tx.send(change.clone()) => {}
                            }
                        }
                        subscribers.retain(|tx| !tx.is_closed());
                    }
                }
            }
        }
    }
}

impl<K: Watched> Informer<K> {
    /// One watch per source, with `shards`' current selector joined to `config`'s.
    fn sources(apis: &[Api<K>], config: &watcher::Config, shards: Option<&mut watch::Receiver<String>>) -> Vec<BoxStream<'static, (usize, watcher::Result<watcher::Event<K>>)>> {
        let mut config = config.clone();
        if let Some(s) = shards {
            let selector = s.borrow_and_update().clone();
            config.label_selector = Some(match config.label_selector.take() {
                Some(own) if !own.is_empty() => format!("{own},{selector}"),
                _ => selector,
            });
        }
        apis.iter().enumerate().map(|(i, api)| watcher(api.clone(), config.clone()).default_backoff().modify(prune).map(move |e| (i, e)).boxed()).collect()
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

/// Merges the watch events of several sources (disjoint: one namespace each, or the cluster) into one
/// store. Each source's re-list replaces only that source's objects: what it no longer lists is
/// deleted. Once every source has listed, the store is marked ready (kube's store is ready after its
/// first `InitDone`, so the merge replays the store's contents as one init).
///
/// The re-list that follows a change of the held shards hands on only the objects new to the store or
/// changed since (another `resourceVersion`): a replica that gains a few shards re-lists everything it
/// holds, and handing on the thousands it already had made each controller reconcile every one of
/// them again (a ~60-80 s halt of a 10,000-Stack fleet after a failover). Controllers of sharded kinds
/// look again by themselves at what they skipped while not owning it ([`crate::fleet::unowned`]), so
/// nothing relies on that re-list to be looked at again. A re-list after a failed watch (kube's
/// watcher, e.g. `410 Gone`) hands on everything, as kube's own reflector does.
struct Merge<K: Watched> {
    known: Vec<HashSet<ObjectRef<K>>>,
    listing: Vec<Option<HashSet<ObjectRef<K>>>>,
    listed: Vec<bool>,
    ready: bool,
    skip_unchanged: Vec<bool>,
}

impl<K: Watched> Merge<K> {
    fn new(sources: usize) -> Self {
        Self { known: vec![HashSet::new(); sources], listing: vec![None; sources], listed: vec![false; sources], ready: false, skip_unchanged: vec![false; sources] }
    }

    /// The next list of each source hands on only the objects new to the store or changed.
    fn skip_unchanged_in_next_lists(&mut self) {
        self.skip_unchanged.fill(true);
    }

    /// The steps for `event` of `source`; `lookup` reads an object from the store, `all` every one.
    fn handle(&mut self, source: usize, event: watcher::Event<K>, lookup: impl Fn(&ObjectRef<K>) -> Option<Arc<K>>, all: impl FnOnce() -> Vec<K>) -> Vec<Step<K>> {
        match event {
            watcher::Event::Apply(o) => {
                self.known[source].insert(ObjectRef::from_obj(&o));
                vec![Step::Store(watcher::Event::Apply(o.clone())), Step::Notify(Change::Applied(o))]
            }
            watcher::Event::Delete(o) => {
                self.known[source].remove(&ObjectRef::from_obj(&o));
                vec![Step::Store(watcher::Event::Delete(o.clone())), Step::Notify(Change::Deleted(o))]
            }
            watcher::Event::Init => {
                self.listing[source] = Some(HashSet::new());
                vec![]
            }
            watcher::Event::InitApply(o) => {
                let r = ObjectRef::from_obj(&o);
                let unchanged = self.skip_unchanged[source] && self.known[source].contains(&r) && lookup(&r).is_some_and(|old| same_version(&*old, &o));
                self.listing[source].get_or_insert_with(HashSet::new).insert(r.clone());
                self.known[source].insert(r);
                if unchanged {
                    return vec![];
                }
                vec![Step::Store(watcher::Event::Apply(o.clone())), Step::Notify(Change::Applied(o))]
            }
            watcher::Event::InitDone => {
                self.skip_unchanged[source] = false;
                let listed = self.listing[source].take().unwrap_or_default();
                let gone: Vec<_> = self.known[source].difference(&listed).cloned().collect();
                self.known[source] = listed;
                let mut steps = Vec::new();
                for o in gone.iter().filter_map(&lookup) {
                    let o = (*o).clone();
                    steps.push(Step::Store(watcher::Event::Delete(o.clone())));
                    steps.push(Step::Notify(Change::Deleted(o)));
                }
                self.listed[source] = true;
                if !self.ready && self.listed.iter().all(|l| *l) {
                    self.ready = true;
                    steps.push(Step::Store(watcher::Event::Init));
                    steps.extend(all().into_iter().map(|o| Step::Store(watcher::Event::InitApply(o))));
                    steps.push(Step::Store(watcher::Event::InitDone));
                }
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

    fn get(&mut self, client: &kube::Client, scope: &WatchScope, shards: Option<&watch::Receiver<String>>) -> &mut Informer<K> {
        let config = self.config.clone();
        let shards = shards.filter(|_| self.sharded).cloned();
        self.informer.get_or_insert_with(|| {
            let i = Informer::new(client, scope, config);
            match shards {
                Some(s) => i.with_shard_selector(s),
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
    shards: Option<watch::Receiver<String>>,
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

    /// Watches Stacks, Workspaces, Updates and StatefulSets only in the shards `selector` picks (the
    /// fleet's held shards, [`shard_selector`]); Programs stay whole (any Stack may reference one).
    /// Call before the first informer is made.
    pub fn with_shards(mut self, selector: watch::Receiver<String>) -> Self {
        self.shards = Some(selector);
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
            let reader = self.writer.as_reader();
            let steps = self.merge.handle(source, event, |r| reader.get(r), || reader.state().iter().map(|o| (**o).clone()).collect());
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
            let mut n = self.feed(source, watcher::Event::Init);
            for o in objects {
                n.extend(self.feed(source, watcher::Event::InitApply(o.clone())));
            }
            n.extend(self.feed(source, watcher::Event::InitDone));
            n
        }
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
