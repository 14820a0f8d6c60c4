//! Watches on the Flux sources Stacks refer to (PKO `stack_controller.go`: a watch is added for each source kind the
//! first time a Stack's `spec.fluxSource.sourceRef` names it, filtered by Flux's `SourceRevisionChangePredicate`). A
//! new artifact revision of a `GitRepository`, `OCIRepository`, `Bucket` or any other Flux source kind reconciles the
//! Stacks that refer to it, whose plan then sees a new commit (the artifact revision) and runs an Update.
//!
//! The watches are made lazily, per kind and per namespace of the operator's watch scope, so an install without Flux
//! watches nothing and needs no Flux RBAC until a Stack names a Flux source; a kind whose CRD is missing is retried
//! with kube's default backoff and logged.

use std::collections::{HashMap, HashSet};

use futures::stream::{BoxStream, SelectAll};
use futures::{Stream, StreamExt};
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use pko_api::Stack;
use tokio::sync::mpsc;

use crate::informer::{Change, WatchScope};

/// A Flux source kind as a Stack names it in `spec.fluxSource.sourceRef`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceKind {
    /// `apiVersion`, e.g. `source.toolkit.fluxcd.io/v1`.
    pub api_version: String,
    /// `kind`, e.g. `GitRepository`.
    pub kind: String,
}

impl SourceKind {
    /// The kind `source_ref` names.
    pub fn of(source_ref: &pko_api::stack::FluxSourceReference) -> Self {
        Self { api_version: source_ref.api_version.clone(), kind: source_ref.kind.clone() }
    }

    /// The API resource of this kind (plural by kube's rules, as the Stack controller reads sources).
    pub fn api_resource(&self) -> ApiResource {
        let (group, version) = self.api_version.rsplit_once('/').unwrap_or(("", &self.api_version));
        ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &self.kind))
    }
}

/// The source kind `stack`'s `spec.fluxSource` refers to, if it has one. Pure.
pub fn source_kind(stack: &Stack) -> Option<SourceKind> {
    Some(SourceKind::of(&stack.spec.flux_source.as_ref()?.source_ref))
}

/// The Stacks among `stacks` that refer to the source `ns`/`name` of `kind` (a Flux source is referred to from its own
/// namespace only). Pure.
pub fn referring<'a>(
    stacks: impl IntoIterator<Item = &'a Stack>,
    kind: &SourceKind,
    ns: &str,
    name: &str,
) -> Vec<ObjectRef<Stack>> {
    stacks
        .into_iter()
        .filter(|s| s.namespace().as_deref() == Some(ns))
        .filter(|s| {
            s.spec
                .flux_source
                .as_ref()
                .is_some_and(|f| f.source_ref.name == name && SourceKind::of(&f.source_ref) == *kind)
        })
        .map(ObjectRef::from_obj)
        .collect()
}

/// The artifact revision of a Flux source object (`status.artifact.revision`), if it has an artifact. Pure.
pub fn revision(obj: &DynamicObject) -> Option<String> {
    obj.data.get("status")?.get("artifact")?.get("revision")?.as_str().map(str::to_string)
}

/// The artifact revision last seen of every watched source, keyed by kind, namespace and name; says which events are
/// revision changes (Flux's `SourceRevisionChangePredicate`: an object seen for the first time passes, as a create
/// event does; later, only a changed revision).
#[derive(Debug, Default)]
pub struct Revisions(HashMap<(SourceKind, String, String), Option<String>>);

impl Revisions {
    /// Records `revision` of `ns`/`name` of `kind`; true when it is new or differs from the last seen. Pure.
    pub fn changed(&mut self, kind: &SourceKind, ns: &str, name: &str, revision: Option<String>) -> bool {
        match self.0.insert((kind.clone(), ns.to_string(), name.to_string()), revision.clone()) {
            None => true,
            Some(previous) => previous != revision,
        }
    }
}

/// The watch streams of `kind` over `scope`: one cluster-wide, or one per namespace.
fn watches(
    client: &kube::Client,
    scope: &WatchScope,
    kind: &SourceKind,
) -> Vec<BoxStream<'static, (SourceKind, Result<DynamicObject, watcher::Error>)>> {
    let ar = kind.api_resource();
    let apis: Vec<Api<DynamicObject>> = match scope {
        WatchScope::Cluster => vec![Api::all_with(client.clone(), &ar)],
        WatchScope::Namespaces(list) => list.iter().map(|ns| Api::namespaced_with(client.clone(), ns, &ar)).collect(),
    };
    apis.into_iter()
        .map(|api| {
            let kind = kind.clone();
            watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .map(move |r| (kind.clone(), r))
                .boxed()
        })
        .collect()
}

/// Runs until `stacks` ends: adds a watch for every Flux source kind a Stack of `stacks` (the Stack informer's changes)
/// names, and sends to `reconcile` the Stacks of `store` that refer to a source whose artifact revision changed. Watch
/// errors (for instance a Flux CRD not installed) are logged and retried with backoff.
pub async fn run(
    client: kube::Client,
    scope: WatchScope,
    stacks: impl Stream<Item = Change<Stack>> + Send,
    store: Store<Stack>,
    reconcile: mpsc::Sender<ObjectRef<Stack>>,
) {
    let mut stacks = std::pin::pin!(stacks);
    let mut watched: HashSet<SourceKind> = HashSet::new();
    let mut events: SelectAll<BoxStream<'static, (SourceKind, Result<DynamicObject, watcher::Error>)>> =
        SelectAll::new();
    let mut revisions = Revisions::default();
    loop {
        tokio::select! {
            change = stacks.next() => {
                let Some(change) = change else { return };
                if let Some(kind) = source_kind(&change.into_object()).filter(|k| !watched.contains(k)) {
                    tracing::info!(api_version = %kind.api_version, kind = %kind.kind, "watching a Flux source kind");
                    events.extend(watches(&client, &scope, &kind));
                    watched.insert(kind);
                }
            }
            Some((kind, event)) = events.next(), if !events.is_empty() => match event {
                Ok(obj) => {
                    let (ns, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
                    if revisions.changed(&kind, &ns, &name, revision(&obj)) {
                        let state = store.state();
                        for stack in referring(state.iter().map(|s| &**s), &kind, &ns, &name) {
                            tracing::debug!(stack = %stack, source = %name, kind = %kind.kind,
                                "Flux source revision changed");
                            if reconcile.send(stack).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(kind = %kind.kind, api_version = %kind.api_version, error = %e,
                    "watching a Flux source kind"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stack(ns: &str, name: &str, source: Option<(&str, &str, &str)>) -> Stack {
        let mut spec = json!({"stack": "dev"});
        if let Some((api_version, kind, src)) = source {
            spec["fluxSource"] = json!({"sourceRef": {"apiVersion": api_version, "kind": kind, "name": src}});
        }
        serde_json::from_value(json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name,
            "namespace": ns}, "spec": spec}))
        .unwrap()
    }

    fn git() -> SourceKind {
        SourceKind { api_version: "source.toolkit.fluxcd.io/v1".into(), kind: "GitRepository".into() }
    }

    #[test]
    fn the_kind_and_its_resource_come_from_the_source_ref() {
        let s = stack("a", "s", Some(("source.toolkit.fluxcd.io/v1", "GitRepository", "infra")));
        assert_eq!(source_kind(&s), Some(git()));
        let ar = git().api_resource();
        assert_eq!(
            (ar.group.as_str(), ar.version.as_str(), ar.plural.as_str()),
            ("source.toolkit.fluxcd.io", "v1", "gitrepositories")
        );
        assert_eq!(source_kind(&stack("a", "s", None)), None);
    }

    #[test]
    fn only_stacks_of_the_same_namespace_kind_and_name_refer_to_a_source() {
        let stacks = [
            stack("a", "yes", Some(("source.toolkit.fluxcd.io/v1", "GitRepository", "infra"))),
            stack("b", "other-namespace", Some(("source.toolkit.fluxcd.io/v1", "GitRepository", "infra"))),
            stack("a", "other-kind", Some(("source.toolkit.fluxcd.io/v1beta2", "OCIRepository", "infra"))),
            stack("a", "other-name", Some(("source.toolkit.fluxcd.io/v1", "GitRepository", "apps"))),
            stack("a", "no-flux", None),
        ];
        let names: Vec<String> = referring(&stacks, &git(), "a", "infra").into_iter().map(|r| r.name).collect();
        assert_eq!(names, vec!["yes"]);
    }

    #[test]
    fn first_sight_and_revision_changes_pass_other_events_do_not() {
        let mut r = Revisions::default();
        assert!(r.changed(&git(), "a", "infra", None), "first sight passes, as a create event");
        assert!(!r.changed(&git(), "a", "infra", None), "no artifact yet, still none");
        assert!(r.changed(&git(), "a", "infra", Some("main@sha1:1".into())), "the first artifact");
        assert!(!r.changed(&git(), "a", "infra", Some("main@sha1:1".into())), "a status or label change");
        assert!(r.changed(&git(), "a", "infra", Some("main@sha1:2".into())), "a new revision");
        assert!(r.changed(&git(), "b", "infra", Some("main@sha1:2".into())), "each source on its own");
    }

    #[test]
    fn the_revision_is_read_from_the_artifact() {
        let obj: DynamicObject = serde_json::from_value(
            json!({"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "metadata": {"name": "g"},
            "status": {"artifact": {"revision": "main@sha1:abc", "url": "http://x/a.tar.gz"}}}),
        )
        .unwrap();
        assert_eq!(revision(&obj).as_deref(), Some("main@sha1:abc"));
        let none: DynamicObject = serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "GitRepository", "metadata": {"name": "g"}, "status": {}}),
        )
        .unwrap();
        assert_eq!(revision(&none), None);
    }
}
