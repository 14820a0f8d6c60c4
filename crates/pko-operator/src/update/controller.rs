//! The Update controller — asynchronous: a reconcile never waits for an operation. It starts a task per
//! Update (bounded by a semaphore: how many operations this replica drives at once) and returns; the task
//! runs the operation on the Workspace's agent ([`super::dispatch`]) and writes the result. A Progressing
//! Update found without a task (operator restart) gets a new task, which re-attaches to the running
//! operation by its stable id. Completed Updates are deleted after `ttlAfterCompleted`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Resource, ResourceExt};
use pko_api::constants::update_condition as uc;
use pko_api::{Update, Workspace};
use pko_proto::v1::ResultStatus;
use tokio::sync::Semaphore;

use super::status::{self, Phase};
use crate::context::Context;

/// State of the Update controller.
pub struct UpdateController {
    ctx: Arc<Context>,
    running: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
    permits: Arc<Semaphore>,
    /// Bearer token for agents (none: agents without authentication).
    token: Option<String>,
}

impl std::fmt::Debug for UpdateController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpdateController").field("running", &self.running.lock().unwrap().len()).finish()
    }
}

/// Errors of an Update reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing the API failed.
    #[error("{0}")]
    Kube(#[from] kube::Error),
}

fn is_complete(u: &Update) -> bool {
    u.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == uc::COMPLETE && c.status == "True"))
}

/// Parses a Go duration such as `24h`, `90s`, `1h30m`, `500ms` (the `ttlAfterCompleted` format).
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let n: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += n * scale;
    }
    Some(Duration::from_secs_f64(total))
}

impl UpdateController {
    /// A controller driving at most `max_operations` operations at once.
    pub fn new(ctx: Arc<Context>, max_operations: usize, token: Option<String>) -> Arc<Self> {
        Arc::new(Self { ctx, running: Mutex::default(), permits: Arc::new(Semaphore::new(max_operations.max(1))), token })
    }

    /// Runs the controller until shutdown.
    pub async fn run(self: Arc<Self>) {
        let api: Api<Update> = Api::all(self.ctx.client.clone());
        Controller::new(api, watcher::Config::default())
            .shutdown_on_signal()
            .run(|u, c| async move { c.reconcile(u).await }, |_u, e, _c| {
                tracing::warn!(error = %e, "update reconcile failed");
                Action::requeue(Duration::from_secs(5))
            }, self)
            .for_each(|_| async {})
            .await;
    }

    async fn reconcile(self: Arc<Self>, update: Arc<Update>) -> Result<Action, Error> {
        let ns = update.namespace().unwrap_or_default();
        let name = update.name_any();
        if !self.ctx.ownership.owns(&ns, &name) || update.meta().deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let api: Api<Update> = Api::namespaced(self.ctx.client.clone(), &ns);
        if is_complete(&update) {
            return self.expire(&api, &update).await;
        }
        let key = update.uid().unwrap_or_default();
        {
            let mut running = self.running.lock().unwrap();
            running.retain(|_, h| !h.is_finished());
            if running.contains_key(&key) {
                return Ok(Action::await_change());
            }
        }
        let ws_name = update.spec.workspace_name.clone().unwrap_or_default();
        let workspace = Api::<Workspace>::namespaced(self.ctx.client.clone(), &ns).get_opt(&ws_name).await?;
        let address = workspace.as_ref().and_then(|w| w.status.as_ref()).and_then(|s| s.address.clone());
        let (Some(workspace), Some(address)) = (workspace.clone(), address) else {
            let (reason, message) = match workspace {
                None => (uc::WORKSPACE_NOT_FOUND, format!("workspace {ws_name:?} not found")),
                Some(_) => (uc::WORKSPACE_NOT_READY, format!("workspace {ws_name} has no agent address yet")),
            };
            self.wait(&api, &update, reason, message).await?;
            return Ok(Action::requeue(Duration::from_secs(5)));
        };
        let agent = if address.starts_with("http") { address } else { format!("http://{address}") };
        let this = self.clone();
        let epoch = self.ctx.ownership.epoch(&ns, &name);
        let handle = tokio::spawn(async move {
            let Ok(_permit) = this.permits.clone().acquire_owned().await else { return };
            match super::dispatch::run_on_agent(&this.ctx.client, &agent, this.token.as_deref(), epoch, &update, &workspace).await {
                Ok(r) if r.status == ResultStatus::Interrupted as i32 => tracing::info!(update = %update.name_any(), "operation interrupted by agent shutdown; will run again"),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(update = %update.name_any(), error = %e, "dispatch failed; retrying");
                    let _ = this.wait(&Api::namespaced(this.ctx.client.clone(), &update.namespace().unwrap_or_default()), &update, uc::TRANSIENT_FAILURE, e.to_string()).await;
                }
            }
        });
        self.running.lock().unwrap().insert(key, handle);
        // Look again later: a finished task lets the next reconcile see the result (or retry).
        Ok(Action::requeue(Duration::from_secs(10)))
    }

    async fn wait(&self, api: &Api<Update>, update: &Update, reason: &'static str, message: String) -> Result<(), kube::Error> {
        let mut st = update.status.clone().unwrap_or_default();
        let old = st.conditions.clone().unwrap_or_default();
        st.conditions = Some(status::conditions(&Phase::Waiting { reason, message }, update.meta().generation, &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()), &old));
        let patch = serde_json::json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update", "status": st});
        api.patch_status(&update.name_any(), &kube::api::PatchParams::apply(pko_api::constants::field_manager::UPDATE_STATUS).force(), &kube::api::Patch::Apply(&patch)).await?;
        Ok(())
    }

    async fn expire(&self, api: &Api<Update>, update: &Update) -> Result<Action, Error> {
        let Some(ttl) = update.spec.ttl_after_completed.as_deref().and_then(parse_go_duration) else { return Ok(Action::await_change()) };
        let Some(end) = update.status.as_ref().and_then(|s| s.end_time.clone()) else { return Ok(Action::await_change()) };
        let age = k8s_openapi::jiff::Timestamp::now().duration_since(end.0).unsigned_abs();
        if age >= ttl {
            api.delete(&update.name_any(), &DeleteParams::background()).await?;
            tracing::info!(update = %update.name_any(), "update expired (ttlAfterCompleted)");
            return Ok(Action::await_change());
        }
        Ok(Action::requeue(ttl - age))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse_go_duration("24h"), Some(Duration::from_secs(86_400)));
        assert_eq!(parse_go_duration("1h30m"), Some(Duration::from_secs(5_400)));
        assert_eq!(parse_go_duration("1.5s"), Some(Duration::from_millis(1_500)));
        assert_eq!(parse_go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("5"), None);
        assert_eq!(parse_go_duration(""), None);
        assert_eq!(parse_go_duration("3d"), None);
    }
}
