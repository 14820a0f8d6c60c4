//! Kubernetes plumbing every controller shares, written once: the server-side-apply status write, the event recorders,
//! the test-pinned finalizer patch, and the observation of each reconcile (span, counter, duration).

use crate::events::Recorder;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;

/// Applies `status` to object `name` (server-side apply of the status subresource, forced, as `field_manager`).
///
/// Errors: the API refused the write.
pub async fn apply_status<K>(
    api: &Api<K>,
    name: &str,
    field_manager: &str,
    status: &impl Serialize,
) -> Result<(), kube::Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    apply_status_versioned(api, name, field_manager, status, None).await.map(|_| ())
}

/// Whether `e` is the API server's 409 Conflict (a precondition or an optimistic-concurrency check failed). Pure.
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(r) if r.code == 409)
}

/// Whether `e` is the API server's 404 Not Found.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(r) if r.code == 404)
}

/// [`apply_status`] while the object is still at `resource_version`, when one is given: the apply carries it as a
/// precondition (Kubernetes optimistic concurrency), so a write decided on a cached read that has gone stale is refused
/// with 409 Conflict instead of overwriting what changed since. Returns the `resourceVersion` the write gave the object
/// (`None`: the API server returned none), for a controller that reads its own writes through its cache.
///
/// Errors: the API refused the write (409: the object is no longer at `resource_version`).
pub async fn apply_status_versioned<K>(
    api: &Api<K>,
    name: &str,
    field_manager: &str,
    status: &impl Serialize,
    resource_version: Option<&str>,
) -> Result<Option<String>, kube::Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut patch = serde_json::json!({ "apiVersion": K::api_version(&()), "kind": K::kind(&()), "status": status });
    if let Some(rv) = resource_version {
        patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
    }
    let written = api.patch_status(name, &PatchParams::apply(field_manager).force(), &Patch::Apply(&patch)).await?;
    Ok(written.meta().resource_version.clone())
}

/// The JSON patch operations that add (`add`) or remove `finalizer` given the object's current list (empty: nothing to
/// do), each change behind a `test` that pins the list as read (kube-runtime's `finalizer` pattern: another
/// controller's finalizer is never clobbered; a list changed since is refused with 422). Pure.
pub fn finalizer_patch(current: &[String], finalizer: &str, add: bool) -> Vec<serde_json::Value> {
    use serde_json::json;
    let at = current.iter().position(|f| f == finalizer);
    match (add, at) {
        (true, Some(_)) | (false, None) => Vec::new(),
        (true, None) if current.is_empty() => {
            vec![
                json!({"op": "test", "path": "/metadata/finalizers", "value": null}),
                json!({"op": "add", "path": "/metadata/finalizers", "value": [finalizer]}),
            ]
        }
        (true, None) => {
            vec![
                json!({"op": "test", "path": "/metadata/finalizers", "value": current}),
                json!({"op": "add", "path": "/metadata/finalizers/-", "value": finalizer}),
            ]
        }
        (false, Some(i)) => {
            vec![
                json!({"op": "test", "path": format!("/metadata/finalizers/{i}"), "value": finalizer}),
                json!({"op": "remove", "path": format!("/metadata/finalizers/{i}")}),
            ]
        }
    }
}

/// Object `name` of `api`'s namespace from the informer cache `store` when it is there and `usable` says the cached
/// version will do; otherwise read from the API server (not cached yet — just created, a shard just gained, a cache
/// not listed yet — or a newer version may matter). The object's later changes must wake the caller's reconcile, so a
/// stale cached version is seen again once the cache has the newer one. `Ok(None)`: there is no such object.
///
/// Errors: the API read failed.
pub async fn cached_or_get<K>(
    store: &kube::runtime::reflector::Store<K>,
    api: &Api<K>,
    name: &str,
    usable: impl Fn(&K) -> bool,
) -> Result<Option<K>, kube::Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let key = kube::runtime::reflector::ObjectRef::new(name).within(api.namespace().unwrap_or_default());
    if let Some(cached) = store.get(&key).filter(|o| usable(o)) {
        return Ok(Some((*cached).clone()));
    }
    api.get_opt(name).await
}

pub use crate::events::Severity;

/// One event recorder per controller, kept for the process's life, so that a repeated event (same object, reason and
/// note) is one series, written as client-go writes series ([`crate::events`]) (PKO's controller names:
/// `stack-controller`, `update-controller`, `workspace-controller`).
#[derive(Clone)]
pub struct Events {
    /// The Stack controller's recorder.
    pub stack: Recorder,
    /// The Update controller's recorder.
    pub update: Recorder,
    /// The Workspace controller's recorder.
    pub workspace: Recorder,
}

impl Events {
    /// Recorders for `client`, reporting as this pod (`POD_NAME`) when set.
    pub fn new(client: &kube::Client) -> Self {
        let recorder = |controller: &str| Recorder::new(client.clone(), controller, std::env::var("POD_NAME").ok());
        Self {
            stack: recorder("stack-controller"),
            update: recorder("update-controller"),
            workspace: recorder("workspace-controller"),
        }
    }
}

/// Publishes an event about `object` with `recorder`. Failures are logged, never returned: an event is not worth
/// failing a reconcile.
pub async fn publish<K: kube::Resource<DynamicType = ()>>(
    recorder: &Recorder,
    object: &K,
    severity: Severity,
    reason: &str,
    note: String,
) {
    if let Err(e) = recorder.publish(&object.object_ref(&()), severity, reason, note).await {
        tracing::debug!(error = %e, reason, "event not published");
    }
}

/// Runs `reconcile` — one reconcile of `controller` on `object` — inside a tracing span `reconcile` with the
/// controller, namespace, name, generation and a reconcile id (unique in this process), and records it:
/// `pko_reconciles_total{controller}` and `pko_reconcile_duration_seconds{controller}` (a histogram, seconds).
pub async fn observe<K, F, T, E>(controller: &'static str, object: &K, reconcile: F) -> Result<T, E>
where
    K: kube::Resource,
    F: std::future::Future<Output = Result<T, E>>,
{
    use tracing::Instrument;
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let meta = object.meta();
    let span = tracing::info_span!(
        "reconcile",
        controller,
        namespace = meta.namespace.as_deref().unwrap_or_default(),
        name = meta.name.as_deref().unwrap_or_default(),
        generation = meta.generation.unwrap_or_default(),
        reconcile_id = id
    );
    use crate::metric_names as n;
    let start = std::time::Instant::now();
    metrics::counter!(n::WORKQUEUE_ADDS_TOTAL, "name" => controller).increment(1);
    let result = reconcile.instrument(span).await;
    let seconds = start.elapsed().as_secs_f64();
    metrics::counter!(n::RECONCILES_TOTAL, "controller" => controller).increment(1);
    metrics::histogram!(n::RECONCILE_DURATION_SECONDS, "controller" => controller).record(seconds);
    // controller-runtime's and client-go's series, as PKO's manager exports them
    metrics::counter!(n::CR_RECONCILE_TOTAL, "controller" => controller,
        "result" => if result.is_ok() { "success" } else { "error" })
    .increment(1);
    metrics::histogram!(n::CR_RECONCILE_TIME_SECONDS, "controller" => controller).record(seconds);
    metrics::histogram!(n::WORKQUEUE_WORK_DURATION_SECONDS, "name" => controller).record(seconds);
    result
}

/// An error of a reconcile: which step failed, and when to try again.
pub trait ReconcileError: std::error::Error {
    /// The step that failed, as a metric label (`pko_reconcile_errors_total{step}`).
    fn step(&self) -> &'static str;
    /// When to reconcile again: after this long, or (`None`) only when the object changes. Default: 5 seconds.
    fn retry_after(&self) -> Option<std::time::Duration> {
        Some(std::time::Duration::from_secs(5))
    }
}

/// The error policy of `controller` (kube's `error_policy`): counts and logs the failure ([`reconcile_failed`]) and
/// requeues as [`ReconcileError::retry_after`] says.
pub fn error_policy<K, E: ReconcileError, C>(
    controller: &'static str,
) -> impl Fn(std::sync::Arc<K>, &E, std::sync::Arc<C>) -> kube::runtime::controller::Action {
    move |_object, error, _ctx| {
        reconcile_failed(controller, error.step(), error);
        match error.retry_after() {
            Some(after) => {
                metrics::counter!(crate::metric_names::WORKQUEUE_RETRIES_TOTAL, "name" => controller).increment(1);
                kube::runtime::controller::Action::requeue(after)
            }
            None => kube::runtime::controller::Action::await_change(),
        }
    }
}

/// How one controller runs: kube's controller configuration (the reconcile concurrency, PKO
/// `MAX_CONCURRENT_RECONCILES`) and the shutdown token it stops taking work on.
#[derive(Clone, Debug)]
pub struct Running {
    /// kube's controller configuration.
    pub config: kube::runtime::controller::Config,
    /// Cancelled to stop the controller (kube's `graceful_shutdown_on`).
    pub shutdown: tokio_util::sync::CancellationToken,
}

/// Runs `controller` (named `name` in spans, metrics and logs) until `running.shutdown`: with its configuration, each
/// reconcile observed ([`observe`]) and failures handled by [`error_policy`]. `state` is what `reconcile` gets besides
/// the object.
pub async fn run_controller<K, C, F, Fut, E>(
    controller: kube::runtime::Controller<K>,
    running: Running,
    name: &'static str,
    reconcile: F,
    state: std::sync::Arc<C>,
) where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    C: Send + Sync + 'static,
    F: Fn(std::sync::Arc<K>, std::sync::Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<kube::runtime::controller::Action, E>> + Send + 'static,
    E: ReconcileError + Send + 'static,
{
    use futures::StreamExt;
    controller
        .with_config(running.config)
        .graceful_shutdown_on(running.shutdown.cancelled_owned())
        .run(
            move |object, state| {
                let work = reconcile(object.clone(), state);
                async move { observe(name, &*object, work).await }
            },
            error_policy(name),
            state,
        )
        .for_each(|_| async {})
        .await;
}

/// Counts a failed reconcile of `controller` at `step` (`pko_reconcile_errors_total{controller,step}`) and logs it; the
/// error policy of every controller calls this.
pub fn reconcile_failed(controller: &'static str, step: &'static str, error: &dyn std::fmt::Display) {
    tracing::warn!(controller, step, %error, "reconcile failed");
    metrics::counter!(crate::metric_names::RECONCILE_ERRORS_TOTAL, "controller" => controller, "step" => step)
        .increment(1);
    metrics::counter!(crate::metric_names::CR_RECONCILE_ERRORS_TOTAL, "controller" => controller).increment(1);
}

/// How soon a controller of a sharded kind (Stack, Workspace, Update) looks again at an object it skipped because this
/// replica did not own it at that instant (seconds).
pub const UNOWNED_RECHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// What a reconcile of a sharded kind returns for an object this replica does not own now: look again in
/// [`UNOWNED_RECHECK`], so an object whose shard was lost and regained between two published holdings (still in the
/// store) is reconciled once held again. Cost: one in-memory check per object of a lost shard until the re-list drops
/// it.
pub fn unowned() -> kube::runtime::controller::Action {
    // An object of a shard held elsewhere leaves the store with the re-list that follows the move, and kube's
    // controller drops a scheduled reconcile of an object no longer stored; nothing else would look at one that stays
    // (a re-list hands on only what changed).
    kube::runtime::controller::Action::requeue(UNOWNED_RECHECK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finalizer_patches_test_the_list_they_change() {
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mine = "finalizer.stack.pulumi.com";
        assert!(finalizer_patch(&f(&[mine]), mine, true).is_empty());
        assert!(finalizer_patch(&f(&["other"]), mine, false).is_empty());
        let add_first = finalizer_patch(&[], mine, true);
        assert_eq!(add_first[0], json!({"op": "test", "path": "/metadata/finalizers", "value": null}));
        assert_eq!(add_first[1], json!({"op": "add", "path": "/metadata/finalizers", "value": [mine]}));
        let add = finalizer_patch(&f(&["other"]), mine, true);
        assert_eq!(add[0]["value"], json!(["other"]));
        assert_eq!(add[1], json!({"op": "add", "path": "/metadata/finalizers/-", "value": mine}));
        let remove = finalizer_patch(&f(&["other", mine]), mine, false);
        assert_eq!(remove[0], json!({"op": "test", "path": "/metadata/finalizers/1", "value": mine}));
        assert_eq!(remove[1], json!({"op": "remove", "path": "/metadata/finalizers/1"}));
    }
}
