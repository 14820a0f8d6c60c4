//! Secret contents for operation requests without a Secret GET per operation (issue "Be light on the API server": the
//! passphrase Secret a Stack's `envRefs` name was the last read on the hot path).
//!
//! A metadata-only watch of Secrets (a watch of `PartialObjectMeta`: names and `resourceVersion`s, no data, one watch
//! per source of the operator's [`WatchScope`], the operator's own outputs Secrets left out: [`versions_selector`])
//! says which version of each Secret is current; the contents read last are kept in memory by `(namespace, name)` with
//! the `resourceVersion` they were read at, and are used only while that version is still the current one. A changed
//! Secret is read again at its next use; until its watch has listed once, or without a watch at all
//! ([`SecretCache::default`]), every use reads it. The watch lags the API server as any informer does
//! (controller-runtime's cached client reads Secrets the same way; PKO's workspace pod reads its `secretKeyRef`s once,
//! when it starts).
//!
//! Contents stay in this process's memory only (never in Redis, logs or metrics), for at most [`CONTENT_TTL`] after
//! their last read, at most [`CONTENT_CAPACITY`] Secrets.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, future::BoxFuture};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

use pko_api::constants::AUTO_COMPONENT_LABEL;

use crate::informer::WatchScope;

/// A Secret's data: key → bytes.
pub type Data = BTreeMap<String, Vec<u8>>;

/// How long contents are kept after their last use (seconds: 600).
pub const CONTENT_TTL: Duration = Duration::from_secs(600);

/// How many Secrets' contents are kept at most.
pub const CONTENT_CAPACITY: u64 = 4096;

/// The Secrets' current versions: one store per watched namespace, or one for the cluster (`None`).
type Versions = BTreeMap<Option<String>, Store<PartialObjectMeta<Secret>>>;

/// Reads Secrets' data through a content cache checked against a metadata watch (see the module). Cheap to clone
/// (shared state).
#[derive(Clone)]
pub struct SecretCache {
    versions: Arc<Versions>,
    contents: moka::future::Cache<(String, String), (String, Arc<Data>)>,
}

impl Default for SecretCache {
    /// No watch: every read goes to the API server.
    fn default() -> Self {
        Self::with_versions(Versions::new())
    }
}

impl std::fmt::Debug for SecretCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretCache")
            .field("watched", &self.versions.keys().collect::<Vec<_>>())
            .field("contents", &self.contents.entry_count())
            .finish()
    }
}

impl SecretCache {
    fn with_versions(versions: Versions) -> Self {
        let contents = moka::future::Cache::builder().max_capacity(CONTENT_CAPACITY).time_to_idle(CONTENT_TTL).build();
        Self { versions: Arc::new(versions), contents }
    }

    /// A cache whose versions come from a metadata watch of Secrets over `scope` through `client` (the watch client: no
    /// read timeout), and the watch to run until `shutdown` (errors are logged and retried with kube's default backoff;
    /// a watch refused by RBAC leaves its namespace uncached).
    pub fn watched(
        client: &kube::Client,
        scope: &WatchScope,
        shutdown: CancellationToken,
    ) -> (Self, BoxFuture<'static, ()>) {
        // an `Api` of `PartialObjectMeta` lists and watches metadata only (kube's metadata watch)
        let sources: Vec<(Option<String>, Api<PartialObjectMeta<Secret>>)> = match scope {
            WatchScope::Cluster => vec![(None, Api::all(client.clone()))],
            WatchScope::Namespaces(list) => {
                list.iter().map(|ns| (Some(ns.clone()), Api::namespaced(client.clone(), ns))).collect()
            }
        };
        let mut versions = Versions::new();
        let mut watches = Vec::new();
        for (key, api) in sources {
            let namespace = key.clone().unwrap_or_else(|| "(cluster)".into());
            let (reader, writer) = reflector::store();
            versions.insert(key, reader);
            let stream = reflector::reflector(
                writer,
                watcher(api, versions_config()).default_backoff().modify(keep_version_only),
            );
            // the first error of a source is a warning (RBAC refusing the watch leaves every read of
            // its Secrets uncached), the retries after it are debug lines
            let warned = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            watches.push(stream.for_each(move |event| {
                let (warned, namespace) = (warned.clone(), namespace.clone());
                async move {
                    let Err(e) = event else { return };
                    if warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        tracing::debug!(error = %e, %namespace, "secret versions: watch error (retried)");
                    } else {
                        tracing::warn!(error = %e, %namespace,
                            "secret versions: watch failed (retried; until it lists, every use of a Secret here reads \
                                it)");
                    }
                }
            }));
        }
        let run = async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = futures::future::join_all(watches) => {}
            }
        };
        (Self::with_versions(versions), Box::pin(run))
    }

    /// The current `resourceVersion` of Secret `name` in `namespace` as the watch last saw it; `None` when no watch
    /// covers it (an outputs Secret: [`versions_selector`]), its watch has not listed yet, or it does not exist.
    pub fn current_version(&self, namespace: &str, name: &str) -> Option<String> {
        let store = self.versions.get(&Some(namespace.to_string())).or_else(|| self.versions.get(&None))?;
        store.get(&ObjectRef::new(name).within(namespace))?.metadata.resource_version.clone()
    }

    /// The data of Secret `name` in `namespace`: the cached contents when they were read at the version the watch says
    /// is current, else read through `client` (and kept).
    ///
    /// Errors: the API server's (404 for a missing Secret, 403, …).
    pub async fn read(&self, client: &kube::Client, namespace: &str, name: &str) -> Result<Arc<Data>, kube::Error> {
        let key = (namespace.to_string(), name.to_string());
        if let Some(data) =
            usable(self.current_version(namespace, name).as_deref(), self.contents.get(&key).await.as_ref())
        {
            metrics::counter!(crate::metric_names::SECRET_READS_TOTAL, "source" => "cache").increment(1);
            return Ok(data);
        }
        metrics::counter!(crate::metric_names::SECRET_READS_TOTAL, "source" => "api").increment(1);
        let secret = Api::<Secret>::namespaced(client.clone(), namespace).get(name).await?;
        let data: Arc<Data> = Arc::new(secret.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect());
        if let Some(rv) = secret.metadata.resource_version {
            self.contents.insert(key, (rv, data.clone())).await;
        }
        Ok(data)
    }
}

/// The label selector of the Secrets whose versions are watched: all but the operator's immutable outputs Secrets
/// (`auto.pulumi.com/component=update`), one per Update and most of what a replica would hold otherwise; the Stack
/// reads those directly, and one named in `envRefs` is read at each use ([`usable`]). Pure.
pub fn versions_selector() -> String {
    format!("{AUTO_COMPONENT_LABEL}!=update")
}

/// The metadata watch's configuration: [`versions_selector`], listed from the API server's watch cache
/// ([`crate::informer::list_config`]). Pure.
fn versions_config() -> watcher::Config {
    crate::informer::list_config().labels(&versions_selector())
}

/// Step **usable** (pure): the cached contents `cached` (version read at, data) when they were read at `current`, the
/// version the watch says is current; `None` (read again) otherwise.
fn usable(current: Option<&str>, cached: Option<&(String, Arc<Data>)>) -> Option<Arc<Data>> {
    match (current, cached) {
        (Some(current), Some((read_at, data))) if current == read_at => Some(data.clone()),
        _ => None,
    }
}

/// Keeps only what the cache needs of a Secret's metadata (namespace, name, `resourceVersion`), so a cluster's Secrets
/// cost a few hundred bytes each in memory.
fn keep_version_only(meta: &mut PartialObjectMeta<Secret>) {
    let m = &mut meta.metadata;
    *m = kube::api::ObjectMeta {
        name: m.name.take(),
        namespace: m.namespace.take(),
        resource_version: m.resource_version.take(),
        ..Default::default()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(v: &str) -> Arc<Data> {
        Arc::new(BTreeMap::from([("k".to_string(), v.as_bytes().to_vec())]))
    }

    #[test]
    fn contents_are_used_only_at_the_current_version() {
        let cached = ("7".to_string(), data("old"));
        assert_eq!(usable(Some("7"), Some(&cached)), Some(data("old")));
        assert_eq!(usable(Some("8"), Some(&cached)), None, "the Secret changed since it was read");
        assert_eq!(usable(None, Some(&cached)), None, "no watch, not listed yet, or deleted: read it");
        assert_eq!(usable(Some("7"), None), None, "never read");
    }

    #[test]
    fn only_the_version_is_kept_of_the_metadata() {
        let mut meta: PartialObjectMeta<Secret> = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": "p", "namespace": "n", "resourceVersion": "9", "labels": {"a": "b"},
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{…}"},
                         "managedFields": [{"manager": "kubectl"}]}
        }))
        .unwrap();
        keep_version_only(&mut meta);
        assert_eq!(
            (
                meta.metadata.name.as_deref(),
                meta.metadata.namespace.as_deref(),
                meta.metadata.resource_version.as_deref()
            ),
            (Some("p"), Some("n"), Some("9"))
        );
        assert!(
            meta.metadata.labels.is_none()
                && meta.metadata.annotations.is_none()
                && meta.metadata.managed_fields.is_none()
        );
    }

    #[test]
    fn the_operators_outputs_secrets_are_not_watched() {
        assert_eq!(versions_selector(), "auto.pulumi.com/component!=update");
        assert_eq!(versions_config().label_selector.as_deref(), Some("auto.pulumi.com/component!=update"));
        let outputs = crate::outputs::secret("u", "n", Default::default(), &BTreeMap::new());
        assert_eq!(
            outputs.metadata.labels.unwrap_or_default().get(AUTO_COMPONENT_LABEL).map(String::as_str),
            Some("update"),
            "the label the selector leaves out"
        );
    }

    #[tokio::test]
    async fn without_a_watch_no_version_is_current() {
        let cache = SecretCache::default();
        assert_eq!(cache.current_version("n", "p"), None);
    }
}
