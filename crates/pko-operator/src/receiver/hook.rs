//! The hook endpoint (`POST /hook/<digest>` on `--webhook-bind-address`, every replica): a short driver over the
//! steps of a delivery, each refusing early and cheaply — size (413 from `Content-Length`, before reading; a body
//! read past 1 MiB is dropped), path (404: the published paths compared in constant time, all of them), signature
//! (401, `verify.rs`, before the payload is parsed), event (200 `ignored`), then the Stacks (`select.rs`, listed from
//! the API server's watch cache) and one merge patch of `pulumi.com/reconciliation-request` on each that needs it.
//! Every answer is counted in `pko_webhook_deliveries_total{result}`; the Receiver's `status.lastDelivery` records
//! accepted ones (field manager `…/receiver-delivery`, any replica).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use pko_api::constants::RECONCILE_REQUEST_ANNOTATION;
use pko_api::receiver::Delivery;
use pko_api::{Receiver, Stack};
use subtle::ConstantTimeEq;

use super::payload::{self, Push};
use super::{select, verify};

/// The largest body read (bytes: 1 MiB; GitHub's own limit is 25 MiB, but a push payload is a few KiB).
pub const MAX_BODY: usize = 1 << 20;

/// The field manager of `status.lastDelivery`.
pub const DELIVERY_FIELD_MANAGER: &str = "pulumi-kubernetes-operator/receiver-delivery";

/// What every delivery needs: the published Receivers, the client, the Secrets.
#[derive(Clone)]
pub struct Hooks {
    /// The Receiver cache (the Receiver controller's).
    pub receivers: Store<Receiver>,
    /// The operator's client.
    pub client: kube::Client,
    /// Receivers' tokens, read once per Secret version.
    pub secrets: crate::secret_cache::SecretCache,
}

/// The hook routes.
pub fn router(hooks: Hooks) -> Router {
    Router::new().route("/hook/{digest}", post(deliver)).with_state(hooks)
}

/// Serves [`router`] on `listener` (plain HTTP; TLS is the ingress's) until the future is dropped.
///
/// Errors: the listener's.
pub async fn serve(listener: tokio::net::TcpListener, hooks: Hooks) -> std::io::Result<()> {
    axum::serve(listener, router(hooks)).await
}

/// An answer, counted by `result`.
fn answer(code: StatusCode, result: &'static str, body: serde_json::Value) -> Response {
    metrics::counter!(crate::metric_names::WEBHOOK_DELIVERIES_TOTAL, "result" => result).increment(1);
    (code, axum::Json(body)).into_response()
}

fn refusal(code: StatusCode, result: &'static str, message: &str) -> Response {
    answer(code, result, serde_json::json!({ "error": message }))
}

/// The Receiver publishing `path` (not suspended), comparing every published path in constant time so that the
/// answer's time does not tell how much of a guessed path was right.
fn find(receivers: &Store<Receiver>, path: &str) -> Option<Arc<Receiver>> {
    let mut found = None;
    for r in receivers.state() {
        let published = r.status.as_ref().and_then(|s| s.webhook_path.as_deref()).unwrap_or_default();
        if bool::from(published.as_bytes().ct_eq(path.as_bytes())) && !r.spec.suspend {
            found = Some(r);
        }
    }
    found
}

async fn deliver(
    State(h): State<Hooks>,
    Path(digest): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let declared = headers.get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BODY) {
        return refusal(StatusCode::PAYLOAD_TOO_LARGE, "too_large", "the body is over 1 MiB");
    }
    let Some(receiver) = find(&h.receivers, &format!("/hook/{digest}")) else {
        return refusal(StatusCode::NOT_FOUND, "not_found", "not found");
    };
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY).await else {
        return refusal(StatusCode::PAYLOAD_TOO_LARGE, "too_large", "the body is over 1 MiB");
    };
    let ns = receiver.namespace().unwrap_or_default();
    let token = match h.secrets.read(&h.client, &ns, &receiver.spec.secret_ref.name).await {
        Ok(data) => data.get(super::TOKEN_KEY).cloned().unwrap_or_default(),
        Err(_) => return refusal(StatusCode::SERVICE_UNAVAILABLE, "failed", "the Receiver's Secret cannot be read"),
    };
    if token.is_empty() {
        return refusal(StatusCode::NOT_FOUND, "not_found", "not found");
    }
    if let Err(e) = verify::verify(receiver.spec.receiver_type, &token, &headers, &body) {
        return refusal(StatusCode::UNAUTHORIZED, "unauthorized", &e.to_string());
    }
    accepted(&h, &receiver, &headers, &body).await
}

/// A verified delivery: the event filter, the Stacks, the requests, the record.
async fn accepted(h: &Hooks, receiver: &Receiver, headers: &HeaderMap, body: &Bytes) -> Response {
    let kind = receiver.spec.receiver_type;
    let event = payload::event(kind, headers);
    if !receiver.spec.events.is_empty() && !event.as_ref().is_some_and(|e| receiver.spec.events.contains(e)) {
        record(h, receiver, "ignored", None, vec![]).await;
        return answer(StatusCode::OK, "ignored", serde_json::json!({"result": "ignored", "event": event}));
    }
    let push = payload::push(kind, body);
    let git_host =
        !matches!(kind, pko_api::receiver::ReceiverType::Generic | pko_api::receiver::ReceiverType::GenericHmac);
    if git_host && push.is_none() {
        record(h, receiver, "ignored", None, vec![]).await;
        return answer(StatusCode::OK, "ignored", serde_json::json!({"result": "ignored", "reason": "no push"}));
    }
    match request_syncs(h, receiver, push.as_ref()).await {
        Ok(stacks) => {
            let result = if stacks.is_empty() { "unchanged" } else { "synced" };
            record(h, receiver, result, push.as_ref(), stacks.clone()).await;
            let revision = push.as_ref().and_then(|p| p.revision.clone());
            answer(
                StatusCode::OK,
                result,
                serde_json::json!({"result": result, "revision": revision, "stacks": stacks}),
            )
        }
        Err(e) => refusal(StatusCode::SERVICE_UNAVAILABLE, "failed", &format!("asking Stacks to sync: {e}")),
    }
}

/// Asks each Stack of the Receiver's namespace that `push` concerns (and that needs asking,
/// [`select::needs_request`]) to sync, 16 patches in flight; their names.
///
/// Errors: the list or a patch failed (the host retries the delivery; a repeated request is a no-op).
async fn request_syncs(h: &Hooks, receiver: &Receiver, push: Option<&Push>) -> Result<Vec<String>, kube::Error> {
    use futures::{StreamExt, TryStreamExt};
    let ns = receiver.namespace().unwrap_or_default();
    let stacks: Api<Stack> = Api::namespaced(h.client.clone(), &ns);
    let listed = stacks.list(&ListParams::default().match_any()).await?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    // a generic delivery has no revision: requests within one second are one
    let value = select::request_value(push, now.as_secs() as u128);
    let due: Vec<String> = listed
        .items
        .iter()
        .filter(|s| select::wakes(receiver, s, push))
        .filter(|s| select::needs_request(s, &value))
        .map(|s| s.name_any())
        .collect();
    let patch = serde_json::json!({"metadata": {"annotations": {RECONCILE_REQUEST_ANNOTATION: value}}});
    futures::stream::iter(due.clone())
        .map(|name| {
            let (stacks, patch) = (stacks.clone(), patch.clone());
            async move { stacks.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await }
        })
        .buffer_unordered(16)
        .try_for_each(|_| async {
            metrics::counter!(crate::metric_names::WEBHOOK_SYNCS_TOTAL).increment(1);
            Ok(())
        })
        .await?;
    Ok(due)
}

/// Records the delivery on the Receiver (best effort: a failed write is logged, the delivery stands).
async fn record(h: &Hooks, receiver: &Receiver, result: &str, push: Option<&Push>, mut stacks: Vec<String>) {
    stacks.truncate(100);
    let delivery = Delivery {
        time: pko_api::conditions::now().0.to_string(),
        result: result.into(),
        revision: push.and_then(|p| p.revision.clone()),
        repository: push.map(|p| format!("{} {}", p.urls[0], p.branch.as_deref().unwrap_or("-"))),
        stacks,
    };
    let api: Api<Receiver> = Api::namespaced(h.client.clone(), &receiver.namespace().unwrap_or_default());
    let body = serde_json::json!({"apiVersion": Receiver::api_version(&()), "kind": "Receiver",
        "status": {"lastDelivery": delivery}});
    let params = PatchParams::apply(DELIVERY_FIELD_MANAGER).force();
    if let Err(e) = api.patch_status(&receiver.name_any(), &params, &Patch::Apply(&body)).await {
        tracing::warn!(receiver = %receiver.name_any(), error = %e, "recording a delivery");
    }
}
