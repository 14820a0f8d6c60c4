//! The labeller: writes `pulumi.com/shard` and `pulumi.com/shards` once on every Stack, Workspace and Update that lacks
//! them or was labelled for another shard count, and relabels an object filed under a shard that is not its own (see
//! the parent module for why the labels are an index, never ownership).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use pko_api::constants::{SHARD_LABEL, SHARDS_LABEL, STACK_FINALIZER};
use pko_api::shard::ShardKey;
use pko_api::{Stack, Update, Workspace};
use pko_fleet::planning::Standing;
use pko_fleet::ring::shard_of;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::SHARD_FIELD_MANAGER;
use crate::informer::{Change, Informer, WatchScope, Watched};
use crate::ownership::Ownership;

/// How long a replica that does not hold an unlabelled object's shard waits before labelling it itself: the holder
/// labels at once; this covers a shard that had no holder at that moment (seconds).
pub const LABEL_FALLBACK: Duration = Duration::from_secs(5);

/// When this replica labels an unlabelled object: at once when it holds the object's shard (`owned`), else after
/// [`LABEL_FALLBACK`] if the object is still unlabelled then. Every replica may label any object (the label is
/// idempotent), but each new Stack labelled by every replica at once cost one write per replica. Pure.
pub fn label_delay(owned: bool) -> Duration {
    if owned { Duration::ZERO } else { LABEL_FALLBACK }
}

/// The shard labels of the object `namespace/key` in a fleet of `shards` virtual shards (pure): [`SHARD_LABEL`] its
/// shard (`pko_fleet::ring::shard_of`) and [`SHARDS_LABEL`] the count.
pub fn shard_labels(namespace: &str, key: &str, shards: u32) -> BTreeMap<String, String> {
    BTreeMap::from([
        (SHARD_LABEL.to_string(), shard_of(&format!("{namespace}/{key}"), shards).to_string()),
        (SHARDS_LABEL.to_string(), shards.to_string()),
    ])
}

/// The label selector of the objects the labeller writes in a fleet of `shards` (pure): those whose [`SHARDS_LABEL`] is
/// not `shards` — without one (new objects, and objects labelled before the count was recorded) or labelled for
/// another count (after a change of `--shards`). Kubernetes' `!=` matches objects without the label too.
pub fn unlabelled_selector(shards: u32) -> String {
    format!("{SHARDS_LABEL}!={shards}")
}

/// The label selector of objects labelled for the fleet's count `shards` whose shard label names no shard of it (no
/// label, a value that is not a number below `shards`): `pulumi.com/shards=S, pulumi.com/shard notin (0,…,S−1)`
/// (`notin` also matches a missing label). Pure.
pub fn misnumbered_selector(shards: u32) -> String {
    let all: Vec<String> = (0..shards).map(|s| s.to_string()).collect();
    format!("{SHARDS_LABEL}={shards},{SHARD_LABEL} notin ({})", all.join(","))
}

/// Whether `labels` file the object `namespace/key` of a fleet of `shards` under another shard than its own: labelled
/// for this count, but not with the object's shard (copied from another object, or written by hand). Pure.
pub fn misfiled(labels: &BTreeMap<String, String>, namespace: &str, key: &str, shards: u32) -> bool {
    labels.get(SHARDS_LABEL).is_some_and(|s| *s == shards.to_string())
        && labels.get(SHARD_LABEL) != Some(&shard_of(&format!("{namespace}/{key}"), shards).to_string())
}

/// Whether an object `namespace/key` with `labels` needs its shard labels written in a fleet of `shards`: labelled for
/// another count (or none), or [`misfiled`]. Pure.
pub fn needs_labels(labels: &BTreeMap<String, String>, namespace: &str, key: &str, shards: u32) -> bool {
    labels.get(SHARDS_LABEL) != Some(&shards.to_string()) || misfiled(labels, namespace, key, shards)
}

/// Relabels every object of kind `K` this replica's sharded cache holds under a shard that is not its own
/// ([`misfiled`]; `changes` is the cache's subscription): its real shard's holder, which never sees it otherwise, then
/// does. Only while this replica's count prevails (`standing`). One write per misfiled object, by the holder of the
/// shard it claims. Runs until `changes` ends or `shutdown`.
pub async fn relabel_misfiled<K: Watched + ShardKey>(
    changes: impl futures::Stream<Item = Change<K>> + Send + 'static,
    client: kube::Client,
    shards: u32,
    standing: watch::Receiver<Standing>,
    shutdown: CancellationToken,
) {
    use futures::StreamExt;
    let mut changes = Box::pin(changes);
    loop {
        let change = tokio::select! {
            _ = shutdown.cancelled() => return,
            c = changes.next() => match c { Some(c) => c, None => return },
        };
        let Change::Applied(object) = change else { continue };
        let ns = object.namespace().unwrap_or_default();
        if *standing.borrow() == Standing::Active && misfiled(object.labels(), &ns, &object.shard_key(), shards) {
            tracing::info!(kind = %K::kind(&()), namespace = %ns, name = %object.name_any(),
                shard = ?object.labels().get(SHARD_LABEL),
                    "relabelling an object filed under another shard than its own");
            label(&client, &object, shards, None).await;
        }
    }
}

/// [`relabel_misfiled`] for the Stacks, Workspaces and Updates of `informers` (subscribed now, before they run), each
/// on a task of its own.
pub fn relabel_misfiled_kinds(
    informers: &mut crate::informer::Informers,
    client: &kube::Client,
    shards: u32,
    standing: &watch::Receiver<Standing>,
    shutdown: &CancellationToken,
) -> [tokio::task::JoinHandle<()>; 3] {
    [
        tokio::spawn(relabel_misfiled(
            informers.stacks().subscribe(),
            client.clone(),
            shards,
            standing.clone(),
            shutdown.clone(),
        )),
        tokio::spawn(relabel_misfiled(
            informers.workspaces().subscribe(),
            client.clone(),
            shards,
            standing.clone(),
            shutdown.clone(),
        )),
        tokio::spawn(relabel_misfiled(
            informers.updates().subscribe(),
            client.clone(),
            shards,
            standing.clone(),
            shutdown.clone(),
        )),
    ]
}

/// The labeller, until `shutdown` and while this replica's shard count prevails (`standing`): watches the Stacks,
/// Workspaces and Updates of `scope` not labelled for `shards` ([`unlabelled_selector`], [`misnumbered_selector`];
/// through `watch_client`, without a read timeout) and writes their [`shard_labels`] through `client` — at once for a
/// shard `ownership` says is held ([`label_delay`]).
pub async fn label_unsharded(
    client: kube::Client,
    watch_client: kube::Client,
    scope: WatchScope,
    shards: u32,
    ownership: Arc<dyn Ownership>,
    mut standing: watch::Receiver<Standing>,
    shutdown: CancellationToken,
) {
    loop {
        // wait until this replica's count prevails
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = standing.wait_for(|s| *s == Standing::Active) => if r.is_err() { return },
        }
        let to = LabelTo { client: client.clone(), shards, ownership: ownership.clone(), stop: shutdown.child_token() };
        let watches = [unlabelled_selector(shards), misnumbered_selector(shards)]
            .iter()
            .flat_map(|selector| kind_watches(&watch_client, &scope, selector, &to))
            .collect::<Vec<_>>();
        let standing_by = async {
            let _ = standing.wait_for(|s| *s != Standing::Active).await;
            tracing::info!("standing by: the labeller stops");
            to.stop.cancel();
        };
        tokio::select! {
            _ = futures::future::join_all(watches) => {}
            () = standing_by => {}
        }
        to.stop.cancel();
        if shutdown.is_cancelled() {
            return;
        }
    }
}

/// Where and how the labeller writes: `client`, the fleet's `shards`, this replica's `ownership`, and `stop`, which
/// ends the watches of one active period.
#[derive(Clone)]
struct LabelTo {
    client: kube::Client,
    shards: u32,
    ownership: Arc<dyn Ownership>,
    stop: CancellationToken,
}

/// The label watches of the objects `selector` matches, one per kind (Stacks with their finalizer).
fn kind_watches(
    watch_client: &kube::Client,
    scope: &WatchScope,
    selector: &str,
    to: &LabelTo,
) -> [BoxFuture<'static, ()>; 3] {
    let config = || crate::informer::list_config().labels(selector);
    [
        label_kind::<Stack>(Informer::new(watch_client, scope, config()), to.clone(), Some(STACK_FINALIZER)).boxed(),
        label_kind::<Workspace>(Informer::new(watch_client, scope, config()), to.clone(), None).boxed(),
        label_kind::<Update>(Informer::new(watch_client, scope, config()), to.clone(), None).boxed(),
    ]
}

/// Labels the objects `informer` sees (see [`label_unsharded`]); `finalizer` is added with the labels where this
/// replica holds the object's shard, as its controller would add it next (the Stack finalizer; a replica that does not
/// hold the shard adds none: the object may be no replica's, as outside `--namespaces`).
async fn label_kind<K: Watched + ShardKey>(mut informer: Informer<K>, to: LabelTo, finalizer: Option<&'static str>) {
    let LabelTo { client, shards, ownership, stop } = to;
    use futures::StreamExt;
    let store = informer.store();
    let mut changes = Box::pin(informer.subscribe());
    let watch = tokio::spawn(informer.run(stop.clone()));
    loop {
        let change = tokio::select! {
            _ = stop.cancelled() => break,
            c = changes.next() => match c { Some(c) => c, None => break },
        };
        let Change::Applied(object) = change else { continue };
        let ns = object.namespace().unwrap_or_default();
        let delay = label_delay(ownership.owns(&ns, &object.shard_key()));
        if delay.is_zero() {
            label(&client, &object, shards, finalizer).await;
            continue;
        }
        let (client, store, stop) = (client.clone(), store.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            // still in the store of unlabelled objects: its shard's holder may not have labelled it —
            // read it fresh before writing (the store can be stale: this process may have been frozen
            // since, its watch not caught up; a replica writes nothing on what it only remembers)
            if stop.is_cancelled() || store.get(&kube::runtime::reflector::ObjectRef::from_obj(&object)).is_none() {
                return;
            }
            let ns = object.namespace().unwrap_or_default();
            match Api::<K>::namespaced(client.clone(), &ns).get_opt(&object.name_any()).await {
                Ok(Some(fresh)) if needs_labels(fresh.labels(), &ns, &fresh.shard_key(), shards) => {
                    label(&client, &fresh, shards, None).await
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(kind = %K::kind(&()), name = %object.name_any(), error = %e,
                        "reading an unlabelled object before labelling it")
                }
            }
        });
    }
    watch.abort();
}

/// Writes `object`'s [`shard_labels`], with `finalizer` when [`label_patch`] can carry it in the same JSON patch (the
/// labeller's own field manager); otherwise, or when that patch is refused (422: the object changed since it was read),
/// the labels alone by server-side apply. Failures are logged: the object stays in the labeller's watch and its
/// holder's fallback labels it.
async fn label<K: Watched + ShardKey>(client: &kube::Client, object: &K, shards: u32, finalizer: Option<&str>) {
    let ns = object.namespace().unwrap_or_default();
    let labels = shard_labels(&ns, &object.shard_key(), shards);
    let api: Api<K> = Api::namespaced(client.clone(), &ns);
    if let Some(ops) = label_patch(object.meta(), &labels, finalizer) {
        let params = PatchParams { field_manager: Some(SHARD_FIELD_MANAGER.into()), ..Default::default() };
        let written = match serde_json::from_value::<json_patch::Patch>(serde_json::Value::Array(ops)) {
            Ok(patch) => api.patch(&object.name_any(), &params, &Patch::<()>::Json(patch)).await.map(|_| ()),
            Err(e) => Err(kube::Error::SerdeError(e)),
        };
        match written {
            Ok(()) => return,
            Err(e) => {
                tracing::debug!(kind = %K::kind(&()), name = %object.name_any(), error = %e,
                    "labels and finalizer not written in one patch; the labels alone")
            }
        }
    }
    let patch = serde_json::json!({"apiVersion": K::api_version(&()), "kind": K::kind(&()),
        "metadata": {"name": object.name_any(), "labels": labels}});
    if let Err(e) =
        api.patch(&object.name_any(), &PatchParams::apply(SHARD_FIELD_MANAGER).force(), &Patch::Apply(&patch)).await
    {
        tracing::debug!(kind = %K::kind(&()), name = %object.name_any(), error = %e, "shard labels not written");
    }
}

/// The JSON patch that labels a new object with `labels` and adds `finalizer` in the same write (saving the Stack
/// controller's own finalizer write), each change pinned by a `test` of what was read (the finalizer list; absent
/// labels). `None` — the labels go alone — when there is no finalizer to add: none given, held already, or the
/// object is being deleted (the API refuses new finalizers then). Pure.
pub fn label_patch(
    meta: &ObjectMeta,
    labels: &BTreeMap<String, String>,
    finalizer: Option<&str>,
) -> Option<Vec<serde_json::Value>> {
    let finalizer = finalizer.filter(|_| meta.deletion_timestamp.is_none())?;
    let mut ops = crate::k8s::finalizer_patch(meta.finalizers.as_deref().unwrap_or_default(), finalizer, true);
    if ops.is_empty() {
        return None;
    }
    match meta.labels.as_ref().filter(|l| !l.is_empty()) {
        None => {
            ops.push(serde_json::json!({"op": "test", "path": "/metadata/labels", "value": meta.labels}));
            ops.push(serde_json::json!({"op": "add", "path": "/metadata/labels", "value": labels}));
        }
        Some(_) => ops.extend(labels.iter().map(|(k, v)| {
            serde_json::json!({"op": "add", "path": format!("/metadata/labels/{}",
                k.replace('~', "~0").replace('/', "~1")), "value": v})
        })),
    }
    Some(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new Stack's labels and finalizer go in one patch, each pinned by a test of what was read; no finalizer to add
    /// (none asked, held already, the object being deleted): no patch.
    #[test]
    fn a_label_patch_carries_the_finalizer_and_pins_what_it_read() {
        let labels = shard_labels("team", "web", 64);
        let fresh = ObjectMeta { name: Some("web".into()), ..Default::default() };
        let ops = label_patch(&fresh, &labels, Some(STACK_FINALIZER)).expect("a patch");
        assert_eq!(ops[0], serde_json::json!({"op": "test", "path": "/metadata/finalizers", "value": null}));
        assert_eq!(
            ops[1],
            serde_json::json!({"op": "add", "path": "/metadata/finalizers", "value": [STACK_FINALIZER]})
        );
        assert_eq!(ops[2], serde_json::json!({"op": "test", "path": "/metadata/labels", "value": null}));
        assert_eq!(ops[3], serde_json::json!({"op": "add", "path": "/metadata/labels", "value": labels}));
        let labelled = ObjectMeta {
            labels: Some([("app".to_string(), "web".to_string())].into()),
            finalizers: Some(vec!["other".into()]),
            ..fresh.clone()
        };
        let ops = label_patch(&labelled, &labels, Some(STACK_FINALIZER)).expect("a patch");
        assert_eq!(ops[0], serde_json::json!({"op": "test", "path": "/metadata/finalizers", "value": ["other"]}));
        assert_eq!(
            ops[2],
            serde_json::json!({"op": "add", "path": "/metadata/labels/pulumi.com~1shard", "value": labels[SHARD_LABEL]})
        );
        assert_eq!(
            ops[3],
            serde_json::json!({"op": "add", "path": "/metadata/labels/pulumi.com~1shards", "value": "64"})
        );
        assert_eq!(ops.len(), 4, "the user's labels are left as they are");
        assert!(label_patch(&fresh, &labels, None).is_none(), "no finalizer asked (Workspaces, Updates)");
        let held = ObjectMeta { finalizers: Some(vec![STACK_FINALIZER.into()]), ..fresh.clone() };
        assert!(label_patch(&held, &labels, Some(STACK_FINALIZER)).is_none());
        let deleting = ObjectMeta {
            deletion_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            )),
            ..fresh
        };
        assert!(
            label_patch(&deleting, &labels, Some(STACK_FINALIZER)).is_none(),
            "the API refuses new finalizers on a deleting object"
        );
    }

    #[test]
    fn shard_labels_name_the_shard_and_the_count_it_was_computed_for() {
        let labels = shard_labels("team", "web", 64);
        assert_eq!(labels[SHARD_LABEL], shard_of("team/web", 64).to_string());
        assert_eq!(labels[SHARDS_LABEL], "64");
        assert_eq!(labels.len(), 2);
        assert_eq!(unlabelled_selector(2048), "pulumi.com/shards!=2048");
        assert_eq!(misnumbered_selector(3), "pulumi.com/shards=3,pulumi.com/shard notin (0,1,2)");
        let selector = misnumbered_selector(2048);
        assert!(selector.len() < 10_000 && selector.ends_with(",2047)"), "{} bytes", selector.len());
    }

    #[test]
    fn an_object_is_misfiled_when_labelled_for_this_count_with_another_shard() {
        let own = shard_labels("team", "web", 64);
        let labels = |shard: &str, count: &str| {
            BTreeMap::from([
                (SHARD_LABEL.to_string(), shard.to_string()),
                (SHARDS_LABEL.to_string(), count.to_string()),
            ])
        };
        assert!(!misfiled(&own, "team", "web", 64), "its own labels");
        let other = (shard_of("team/web", 64) + 1) % 64;
        assert!(misfiled(&labels(&other.to_string(), "64"), "team", "web", 64), "copied from another Stack");
        assert!(misfiled(&labels("garbage", "64"), "team", "web", 64), "not a shard");
        assert!(
            !misfiled(&labels(&other.to_string(), "32"), "team", "web", 64),
            "another count: the labeller's business"
        );
        assert!(!misfiled(&BTreeMap::new(), "team", "web", 64), "unlabelled: the labeller's business");
        assert!(
            needs_labels(&BTreeMap::new(), "team", "web", 64) && needs_labels(&labels("1", "32"), "team", "web", 64)
        );
        assert!(needs_labels(&labels("garbage", "64"), "team", "web", 64) && !needs_labels(&own, "team", "web", 64));
    }

    #[test]
    fn the_holder_labels_at_once_and_the_others_only_what_it_left() {
        assert_eq!(label_delay(true), Duration::ZERO);
        assert_eq!(label_delay(false), LABEL_FALLBACK);
    }
}
