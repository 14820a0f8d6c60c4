//! One watch per kind, shared by every controller that needs it (the informer of client-go's shared informer factory;
//! kube's own shared streams are behind `unstable-runtime-subscribe`, whose subscriber stalls when an object is deleted
//! between its event and its read).
//!
//! An [`Informer`] runs one watch per *source* — the whole cluster, or each namespace of `--namespaces` — merges
//! them into one [`Store`], and hands every change to each subscriber: controllers get their trigger stream from
//! [`Informer::objects`] and their cache from [`Informer::store`]. With several namespaces every watch is namespaced,
//! so a namespace-scoped install needs only namespaced RBAC and pays nothing for other namespaces' churn.
//!
//! [`Informers`] holds one informer per kind, created when a controller first subscribes, so a process (or a test) that
//! runs only some controllers watches only their kinds.

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
use pko_api::{Program, Receiver, Stack, Update, Workspace};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamMap;
use tokio_util::sync::CancellationToken;

mod groups;
pub mod lenient;
mod merge;
mod watches;
pub use groups::{Groups, MAX_WATCH_GROUPS, Regroup};
use lenient::{Lenient, Undecodable};
use merge::*;
use watches::{Reads, Watches};

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

/// A change an informer saw: an object created or changed (also every object of a re-list), or deleted.
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
pub trait Watched:
    kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
}
impl<K> Watched for K where
    K: kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static
{
}

/// Changes a subscriber may hold before the informer waits for it (backpressure, never loss).
const SUBSCRIBER_BUFFER: usize = 1024;

/// One kind's shared watch: its sources, its store, its subscribers.
pub struct Informer<K: Watched> {
    apis: Vec<Api<Lenient<K>>>,
    config: watcher::Config,
    writer: Writer<K>,
    /// Boxed: a channel allocates its slots in blocks of 32, and a `Stack` is kilobytes inline.
    subscribers: Vec<mpsc::Sender<Box<Change<K>>>>,
    /// Who is told of objects that do not decode ([`Informer::undecodable`]).
    reporters: Vec<mpsc::Sender<Undecodable>>,
    shards: Option<watch::Receiver<HeldShards>>,
}

/// The shards a fleet replica holds out of `total`, as the fleet publishes them to the informers of sharded kinds
/// ([`Informers::with_shards`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldShards {
    /// The held shards.
    pub shards: BTreeSet<u32>,
    /// The fleet's shard count (`--shards`).
    pub total: u32,
}

impl<K: Watched> Informer<K> {
    /// An informer of `K` over `scope` with `config` (label or field selectors); it watches nothing until
    /// [`Self::run`].
    pub fn new(client: &kube::Client, scope: &WatchScope, config: watcher::Config) -> Self {
        let apis = match scope {
            WatchScope::Cluster => vec![Api::all(client.clone())],
            WatchScope::Namespaces(list) => list.iter().map(|ns| Api::namespaced(client.clone(), ns)).collect(),
        };
        let (writer, subscribers, reporters) = (Writer::default(), Vec::new(), Vec::new());
        Self { apis, config, writer, subscribers, reporters, shards: None }
    }

    /// Watches and keeps only the objects of the shards `held` names (the fleet: the shards this replica holds),
    /// labelled [`pko_api::constants::SHARD_LABEL`], in watch groups ([`Groups`]): a gain watches only the gained
    /// shards, a loss drops their objects from the store without a list, and the watches of shards still held never
    /// stop.
    pub fn with_held_shards(mut self, held: watch::Receiver<HeldShards>) -> Self {
        self.shards = Some(held);
        self
    }

    /// The cache: every object of every source, ready once each source has listed once.
    pub fn store(&self) -> Store<K> {
        self.writer.as_reader()
    }

    /// Every change from now on. Subscribe before [`Self::run`] to see the first list; a subscriber that is not read
    /// holds the informer back (bounded buffer), a dropped one is forgotten.
    pub fn subscribe(&mut self) -> impl Stream<Item = Change<K>> + Send + 'static + use<K> {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        self.subscribers.push(tx);
        tokio_stream::wrappers::ReceiverStream::new(rx).map(|c| *c)
    }

    /// The objects of every change, as kube's `Controller::for_stream` / `watches_stream` take them.
    pub fn objects(&mut self) -> BoxStream<'static, Result<K, watcher::Error>> {
        self.subscribe().map(|c| Ok(c.into_object())).boxed()
    }

    /// Every object listed or changed from now on that does not decode as `K` ([`Undecodable`]): it is in no store and
    /// reaches no controller, so its controller says so on it. Backpressure as [`Self::subscribe`]'s.
    pub fn undecodable(&mut self) -> impl Stream<Item = Undecodable> + Send + 'static + use<K> {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        self.reporters.push(tx);
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }

    /// Watches until `shutdown` is cancelled: keeps the store, hands every change to the subscribers and every
    /// undecodable object to the reporters. Watch errors are logged and retried with kube's default backoff.
    pub async fn run(self, shutdown: CancellationToken) {
        let Informer { apis, config, writer, subscribers, reporters, mut shards } = self;
        let reader = writer.as_reader();
        let lookup = |r: &ObjectRef<K>| reader.get(r);
        let all = || reader.state().iter().map(|o| (**o).clone()).collect::<Vec<K>>();
        let reads = Reads { lookup: &lookup, all: &all };
        let mut out = Out { writer, subscribers, reporters };
        let mut w = Watches::new(apis, config);
        let first = w.follow(shards.as_mut().map(|rx| rx.borrow_and_update().clone()), &reads);
        if !out.deliver(first, Vec::new(), &shutdown).await {
            return;
        }
        loop {
            let changed = async {
                match shards.as_mut() {
                    Some(s) => s.changed().await.map(|()| s.borrow_and_update().clone()),
                    None => std::future::pending().await,
                }
            };
            let (steps, bad) = tokio::select! {
                _ = shutdown.cancelled() => return,
                Some((source, event)) = w.streams.next(), if !w.streams.is_empty() => match event {
                    Ok(e) => w.on_event(source, e, &reads),
                    Err(e) => {
                        tracing::warn!(kind = %K::kind(&()), error = %e, "watch failed; retrying");
                        continue;
                    }
                },
                Ok(now) = changed => (w.follow(Some(now), &reads), Vec::new()),
            };
            if !out.deliver(steps, bad, &shutdown).await {
                return;
            }
        }
    }
}

/// Where an informer's results go: its store, its subscribers, its reporters.
struct Out<K: Watched> {
    writer: Writer<K>,
    subscribers: Vec<mpsc::Sender<Box<Change<K>>>>,
    reporters: Vec<mpsc::Sender<Undecodable>>,
}

impl<K: Watched> Out<K> {
    /// Writes `steps` into the store, hands their changes to the subscribers and `bad` to the reporters (dropping the
    /// closed ones); `false` once `shutdown` is cancelled while one was full.
    async fn deliver(&mut self, steps: Vec<Step<K>>, bad: Vec<Undecodable>, shutdown: &CancellationToken) -> bool {
        for step in steps {
            match step {
                Step::Store(e) => self.writer.apply_watcher_event(&e),
                Step::Notify(change) => {
                    if !send_all(&self.subscribers, || Box::new(change.clone()), shutdown).await {
                        return false;
                    }
                    self.subscribers.retain(|tx| !tx.is_closed());
                }
            }
        }
        for u in bad {
            tracing::warn!(kind = %K::kind(&()), name = ?u.meta.name, namespace = ?u.meta.namespace, error = %u.error,
                "an object does not decode: left out of the cache");
            metrics::counter!(crate::metric_names::UNDECODABLE_OBJECTS_TOTAL, "kind" => K::kind(&()).to_string())
                .increment(1);
            if !send_all(&self.reporters, || u.clone(), shutdown).await {
                return false;
            }
            self.reporters.retain(|tx| !tx.is_closed());
        }
        true
    }
}

/// Sends what `item` makes to each of `to`, waiting for a full one; `false` once `shutdown` is cancelled meanwhile.
async fn send_all<T>(to: &[mpsc::Sender<T>], item: impl Fn() -> T, shutdown: &CancellationToken) -> bool {
    for tx in to {
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tx.send(item()) => {}
        }
    }
    true
}

/// The watch configuration every informer starts from: lists served from the API server's watch cache
/// (`resourceVersion=0`, kube's `any_semantic`), unpaged — kube-core leaves `resourceVersion=0` out of a list with a
/// `limit`, which would make it a consistent read from etcd of every object of the kind. A list may be a moment older
/// than the store: the store keeps the newer version ([`merge`]).
pub fn list_config() -> watcher::Config {
    let mut config = watcher::Config::default().any_semantic();
    config.page_size = None;
    config
}

/// The annotation client-side `kubectl apply` keeps a whole copy of the last applied object in.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what no controller reads from a watched object before it is cached: its `managedFields` and the
/// [`LAST_APPLIED_ANNOTATION`] (kube-rs' documented memory pruning). Safe because the operator writes these kinds only
/// by patch and server-side apply, never by a whole-object `PUT` from the cache.
pub fn prune<K: kube::Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
    if let Some(annotations) = object.meta_mut().annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
    }
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

    fn get(
        &mut self,
        client: &kube::Client,
        scope: &WatchScope,
        shards: Option<&watch::Receiver<HeldShards>>,
    ) -> &mut Informer<K> {
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

/// The informers of one operator replica, one per kind: Stacks, Programs, Receivers, StackRollouts, Workspaces,
/// Updates, and the agents' StatefulSets (pod runtime; only those labelled `auto.pulumi.com/component=workspace`).
pub struct Informers {
    client: kube::Client,
    scope: WatchScope,
    shards: Option<watch::Receiver<HeldShards>>,
    stacks: Slot<Stack>,
    programs: Slot<Program>,
    receivers: Slot<Receiver>,
    rollouts: Slot<pko_api::StackRollout>,
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
            receivers: Slot::new(all(), false),
            rollouts: Slot::new(all(), false),
            workspaces: Slot::new(all(), true),
            updates: Slot::new(all(), true),
            stateful_sets: Slot::new(all().labels(WORKSPACE_COMPONENT_SELECTOR), true),
        }
    }

    /// Watches Stacks, Workspaces, Updates and StatefulSets only in the shards `held` names (the fleet's held shards,
    /// [`Informer::with_held_shards`]); Programs stay whole (any Stack may reference one). Call before the first
    /// informer is made.
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

    /// The Receiver informer (whole, like Programs: any replica may receive any hook).
    pub fn receivers(&mut self) -> &mut Informer<Receiver> {
        self.receivers.get(&self.client, &self.scope, self.shards.as_ref())
    }

    /// The StackRollout informer (whole: every Stack's controller reads the rollout that governs it).
    pub fn rollouts(&mut self) -> &mut Informer<pko_api::StackRollout> {
        self.rollouts.get(&self.client, &self.scope, self.shards.as_ref())
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

    /// Runs the informers made so far beside `controllers` (the futures their subscribers' controllers return) until
    /// `controllers` ends: for tests and tools that run some controllers without the whole assembly.
    pub fn drive(
        self,
        controllers: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (_, watches) = self.run(CancellationToken::new());
        async move {
            futures::pin_mut!(controllers, watches);
            futures::future::select(controllers, watches).await;
        }
    }

    /// Runs every informer made so far until `shutdown`; `synced` is set once each has listed.
    pub fn run(
        mut self,
        shutdown: CancellationToken,
    ) -> (Synced, impl std::future::Future<Output = ()> + Send + 'static) {
        let mut waits: Vec<SyncWait> = Vec::new();
        let mut runs: Vec<InformerRun> = Vec::new();
        fn add<K: Watched>(
            slot: &mut Slot<K>,
            waits: &mut Vec<SyncWait>,
            runs: &mut Vec<InformerRun>,
            shutdown: &CancellationToken,
        ) {
            if let Some(i) = slot.informer.take() {
                let store = i.store();
                waits.push(async move { store.wait_until_ready().await.is_ok() }.boxed());
                runs.push(i.run(shutdown.clone()).boxed());
            }
        }
        add(&mut self.stacks, &mut waits, &mut runs, &shutdown);
        add(&mut self.programs, &mut waits, &mut runs, &shutdown);
        add(&mut self.receivers, &mut waits, &mut runs, &shutdown);
        add(&mut self.rollouts, &mut waits, &mut runs, &shutdown);
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

/// The label selector of the objects in `held` shards out of `total`: `pulumi.com/shard in (…)`, or `notin` the
/// others when that is shorter, or every labelled object when all are held; nothing (a value no shard has) when none
/// is.
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
        assert_eq!(
            WatchScope::from_namespaces(&["a".into(), "b".into(), "a".into()]),
            WatchScope::Namespaces(vec!["a".into(), "b".into()])
        );
    }
}
