//! What operations printed, served to the people allowed to see them (issue "See what Pulumi did"): on the metrics
//! port, always behind a TokenReview and a SubjectAccessReview of `get` on the Stack (`pulumi.com`, `stacks`, in its
//! namespace) — whatever `--metrics-secure` says — so a user reads the output only of Stacks they may `get`. Read
//! from the output store (`pko_queue::output`): with `--redis-url` every replica serves every Stack, whoever ran its
//! operations.
//!
//! - `GET /logs/{namespace}/{stack}`: `{"operations": [OperationInfo…]}`, newest first;
//! - `GET /logs/{namespace}/{stack}/{update}?after=<seq>`: an [`pko_queue::output::Output`] (lines above sequence
//!   `after`, all without it); `404` when nothing of it is kept.
//!
//! A live tail (`kubectl pko logs -f`) polls the second with the last sequence it printed until a line of stream
//! `result`.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use pko_queue::output::OutputStore;

use crate::authz::{Access, Authz};

#[derive(Clone)]
struct Logs {
    output: Arc<dyn OutputStore>,
    authz: Arc<Authz>,
}

/// `after` of a read.
#[derive(Debug, serde::Deserialize)]
struct After {
    after: Option<u64>,
}

/// The `/logs` routes over `output`, each authorized by `authz`.
pub fn router(output: Arc<dyn OutputStore>, authz: Arc<Authz>) -> Router {
    Router::new()
        .route("/logs/{namespace}/{stack}", get(operations))
        .route("/logs/{namespace}/{stack}/{update}", get(read))
        .with_state(Logs { output, authz })
}

/// `Err(response)` unless the caller's token may `get` Stack `namespace/name`.
async fn allowed(logs: &Logs, headers: &HeaderMap, namespace: &str, name: &str) -> Result<(), Response> {
    let access = Access::Stack { namespace: namespace.to_string(), name: name.to_string() };
    match logs.authz.decide(crate::authz::bearer(headers), &access).await {
        StatusCode::OK => Ok(()),
        code => Err((
            code,
            format!("{}: get stacks.pulumi.com {namespace}/{name}\n", code.canonical_reason().unwrap_or("refused")),
        )
            .into_response()),
    }
}

async fn operations(
    State(logs): State<Logs>,
    headers: HeaderMap,
    Path((namespace, stack)): Path<(String, String)>,
) -> Response {
    if let Err(r) = allowed(&logs, &headers, &namespace, &stack).await {
        return r;
    }
    match logs.output.operations(&format!("{namespace}/{stack}")).await {
        Ok(ops) => axum::Json(serde_json::json!({ "operations": ops })).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("the output store did not answer: {e}\n")).into_response(),
    }
}

async fn read(
    State(logs): State<Logs>,
    headers: HeaderMap,
    Path((namespace, stack, update)): Path<(String, String, String)>,
    Query(q): Query<After>,
) -> Response {
    if let Err(r) = allowed(&logs, &headers, &namespace, &stack).await {
        return r;
    }
    match logs.output.read(&format!("{namespace}/{stack}"), &update, q.after).await {
        Ok(Some(out)) => axum::Json(out).into_response(),
        Ok(None) => {
            (StatusCode::NOT_FOUND, format!("no output of update {update} of stack {namespace}/{stack} is kept\n"))
                .into_response()
        }
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("the output store did not answer: {e}\n")).into_response(),
    }
}
