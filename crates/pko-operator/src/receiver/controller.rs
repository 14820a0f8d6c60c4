//! The Receiver controller: the holder of a Receiver's shard publishes its webhook path and readiness, one status
//! write per change. A short driver over two steps — `token` (the Secret, I/O) and `status` (pure) — and one write.
//! The hook endpoint serves only paths published here (`hook.rs` reads the Receiver cache).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use pko_api::Receiver;
use pko_api::receiver::ReceiverStatus;

use crate::context::Context;

/// The field manager of the controller's status fields (`lastDelivery` is the hook's, `hook.rs`).
pub const STATUS_FIELD_MANAGER: &str = "pulumi-kubernetes-operator/receiver-status";

/// How soon a Receiver stalled on its Secret looks again (Secrets do not wake it).
const SECRET_RETRY: Duration = Duration::from_secs(30);

/// How often a Ready Receiver's token is read again (from the Secret cache: no request unless it changed), so that a
/// rotated token publishes its new path.
const TOKEN_RECHECK: Duration = Duration::from_secs(300);

/// A Receiver reconcile's failure, by step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the Secret failed for another reason than its absence (the API server).
    #[error("reading the Secret: {0}")]
    Token(kube::Error),
    /// Writing the status failed.
    #[error("writing the status: {0}")]
    Status(kube::Error),
}

impl crate::k8s::ReconcileError for Error {
    fn step(&self) -> &'static str {
        match self {
            Error::Token(_) => "token",
            Error::Status(_) => "status",
        }
    }
}

/// The token of `receiver`'s Secret; `Err(message)` naming the field when it cannot be had (Stalled).
///
/// Errors: [`Error::Token`] when the API server did not answer.
async fn token(receiver: &Receiver, ctx: &Context) -> Result<Result<Vec<u8>, String>, Error> {
    let ns = receiver.namespace().unwrap_or_default();
    let name = &receiver.spec.secret_ref.name;
    match ctx.secrets.read(&ctx.client, &ns, name).await {
        Ok(data) => Ok(match data.get(super::TOKEN_KEY).filter(|t| !t.is_empty()) {
            Some(t) => Ok(t.clone()),
            None => Err(format!("spec.secretRef: Secret {ns}/{name} has no key {:?}", super::TOKEN_KEY)),
        }),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Err(format!("spec.secretRef: Secret {ns}/{name} not found"))),
        Err(e) => Err(Error::Token(e)),
    }
}

/// The status for `receiver` given its token (or why it is stalled), keeping `lastDelivery` and unchanged
/// transition times. Pure.
pub fn status(
    receiver: &Receiver,
    token: Result<&[u8], &str>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> ReceiverStatus {
    use pko_api::conditions::set;
    let old = receiver.status.clone().unwrap_or_default();
    let generation = receiver.meta().generation;
    let mut conditions: Vec<Condition> = old.conditions.clone().unwrap_or_default();
    let refused = super::select::refused_resource(receiver).map(|m| ("SpecInvalid", m));
    let stalled = refused.or_else(|| token.err().map(|m| ("SecretNotFound", m.to_string())));
    let path = match (&stalled, token) {
        (None, Ok(t)) => Some(super::webhook_path(t, &receiver.name_any(), &receiver.namespace().unwrap_or_default())),
        _ => None,
    };
    match (&stalled, &path) {
        (Some((reason, message)), _) => {
            set(&mut conditions, "Ready", "False", reason, message, generation, now);
            set(&mut conditions, "Stalled", "True", reason, message, generation, now);
        }
        (None, Some(p)) => {
            pko_api::conditions::remove(&mut conditions, "Stalled");
            let message = format!("Receiver initialized for path: {p}");
            set(&mut conditions, "Ready", "True", "Succeeded", &message, generation, now);
        }
        (None, None) => {}
    }
    ReceiverStatus { observed_generation: generation, conditions: Some(conditions), webhook_path: path, ..old }
}

/// Publishes `receiver`'s path and readiness when they changed (the shard holder only).
///
/// Errors: the Secret could not be read (not for its absence), or the status write failed.
pub async fn reconcile(receiver: Arc<Receiver>, ctx: Arc<Context>) -> Result<Action, Error> {
    let (ns, name) = (receiver.namespace().unwrap_or_default(), receiver.name_any());
    if !ctx.ownership.owns(&ns, &name) {
        return Ok(Action::await_change());
    }
    let token = token(&receiver, &ctx).await?;
    let now = pko_api::conditions::now();
    let desired = status(&receiver, token.as_deref().map_err(String::as_str), &now);
    let old = receiver.status.clone().unwrap_or_default();
    let same = |a: &ReceiverStatus, b: &ReceiverStatus| {
        a.webhook_path == b.webhook_path && a.observed_generation == b.observed_generation && {
            let strip = |c: &Option<Vec<Condition>>| {
                c.iter().flatten().map(|c| (c.type_.clone(), c.status.clone(), c.message.clone())).collect::<Vec<_>>()
            };
            strip(&a.conditions) == strip(&b.conditions)
        }
    };
    if !same(&desired, &old) {
        let body = serde_json::json!({"observedGeneration": desired.observed_generation,
            "conditions": desired.conditions, "webhookPath": desired.webhook_path});
        crate::k8s::apply_status(
            &Api::<Receiver>::namespaced(ctx.client.clone(), &ns),
            &name,
            STATUS_FIELD_MANAGER,
            &body,
        )
        .await
        .map_err(Error::Status)?;
        tracing::info!(receiver = %format!("{ns}/{name}"), path = ?desired.webhook_path, "receiver status");
    }
    Ok(match token {
        // a rotated token changes the path: looked at again now and then (a Secret does not wake its Receiver)
        Ok(_) => Action::requeue(TOKEN_RECHECK),
        Err(_) => Action::requeue(SECRET_RETRY),
    })
}

/// The Receiver controller over the Receiver informer (watched whole); its store feeds the hook endpoint.
pub fn controller(
    ctx: Arc<Context>,
    informers: &mut crate::informer::Informers,
) -> (kube::runtime::reflector::Store<Receiver>, impl std::future::Future<Output = ()> + Send + 'static) {
    let receivers = informers.receivers();
    let store = receivers.store();
    let mut controller = kube::runtime::Controller::for_stream(receivers.objects(), store.clone());
    if let Some(ticks) = ctx.shards_gained_ticks() {
        // watched whole: one that was not ours may be now
        controller = controller.reconcile_all_on(ticks);
    }
    let run = async move { crate::k8s::run_controller(controller, ctx.running(), "receiver", reconcile, ctx).await };
    (store, run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn receiver(resources: serde_json::Value) -> Receiver {
        serde_json::from_value(json!({"apiVersion": "pulumi.com/v1alpha1", "kind": "Receiver",
            "metadata": {"name": "r", "namespace": "team", "generation": 2},
            "spec": {"type": "github", "secretRef": {"name": "s"}, "resources": resources},
            "status": {"lastDelivery": {"time": "t", "result": "synced"}}}))
        .unwrap()
    }

    #[test]
    fn a_receiver_is_ready_with_its_path_or_stalled_naming_the_field() {
        let now = pko_api::conditions::now();
        let r = receiver(json!([{"kind": "Stack", "name": "*"}]));
        let ok = status(&r, Ok(b"tok"), &now);
        assert_eq!(ok.webhook_path.as_deref(), Some(super::super::webhook_path(b"tok", "r", "team").as_str()));
        let conds = ok.conditions.clone().unwrap();
        assert!(
            pko_api::conditions::is_true(&conds, "Ready") && pko_api::conditions::find(&conds, "Stalled").is_none()
        );
        assert_eq!(ok.last_delivery.unwrap().result, "synced", "the hook's field is kept");
        let missing = status(&r, Err("spec.secretRef: Secret team/s not found"), &now);
        let c = missing.conditions.unwrap();
        assert_eq!(pko_api::conditions::find(&c, "Stalled").unwrap().reason, "SecretNotFound");
        assert!(missing.webhook_path.is_none(), "no path without a token");
        let bad = status(&receiver(json!([{"kind": "Stack", "name": "a", "namespace": "x"}])), Ok(b"tok"), &now);
        let c = bad.conditions.unwrap();
        let stalled = pko_api::conditions::find(&c, "Stalled").unwrap();
        assert!(stalled.reason == "SpecInvalid" && stalled.message.contains("spec.resources[0].namespace"));
    }
}
