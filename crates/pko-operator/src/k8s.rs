//! Kubernetes plumbing every controller shares, written once: the server-side-apply status write and
//! the event recorders.

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde::Serialize;

/// Writes `status` of object `name` through `api` by server-side apply with `field_manager` (forced:
/// each status field has one owner, the controller). `K` gives the apiVersion and kind of the patch.
///
/// Errors: the API server's.
pub async fn apply_status<K>(api: &Api<K>, name: &str, field_manager: &str, status: &impl Serialize) -> Result<(), kube::Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = serde_json::json!({ "apiVersion": K::api_version(&()), "kind": K::kind(&()), "status": status });
    api.patch_status(name, &PatchParams::apply(field_manager).force(), &Patch::Apply(&patch)).await?;
    Ok(())
}

/// Whether an event reports normal operation or a problem (Kubernetes `type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// `Normal`.
    Normal,
    /// `Warning`.
    Warning,
}

/// One event recorder per controller, kept for the process's life, so that kube's recorder aggregates
/// a repeated event (same object, reason and note) into one series instead of new objects (PKO's
/// controller names: `stack-controller`, `update-controller`, `workspace-controller`).
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
        let recorder = |controller: &str| Recorder::new(client.clone(), Reporter { controller: controller.into(), instance: std::env::var("POD_NAME").ok() });
        Self { stack: recorder("stack-controller"), update: recorder("update-controller"), workspace: recorder("workspace-controller") }
    }
}

/// Publishes an event about `object` with `recorder`. Failures are logged, never returned: an event is
/// not worth failing a reconcile.
pub async fn publish<K: kube::Resource<DynamicType = ()>>(recorder: &Recorder, object: &K, severity: Severity, reason: &str, note: String) {
    let type_ = if severity == Severity::Warning { EventType::Warning } else { EventType::Normal };
    let ev = Event { type_, reason: reason.into(), note: Some(note), action: reason.into(), secondary: None };
    if let Err(e) = recorder.publish(&ev, &object.object_ref(&())).await {
        tracing::debug!(error = %e, reason, "event not published");
    }
}
