//! The artifact server: `GET /programs/<namespace>/<name>/<generation>` returns the Program's tarball,
//! regenerated on the fly (deterministic, so it matches `status.artifact.digest`); a generation other than
//! the current one is 404, as in PKO. Agents verify the digest, so the endpoint needs no authentication.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kube::Api;
use kube::Resource;
use pko_api::Program;

/// The router of the artifact server.
pub fn router(client: kube::Client) -> Router {
    Router::new().route("/programs/{namespace}/{name}/{generation}", get(program_artifact)).with_state(client)
}

async fn program_artifact(State(client): State<kube::Client>, Path((namespace, name, generation)): Path<(String, String, String)>) -> Response {
    let generation = generation.trim_end_matches(".tar.gz");
    let program = match Api::<Program>::namespaced(client, &namespace).get_opt(&name).await {
        Ok(Some(p)) => p,
        Ok(None) => return (StatusCode::NOT_FOUND, format!("program {namespace}/{name} not found")).into_response(),
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, format!("reading program {namespace}/{name}: {e}")).into_response(),
    };
    if program.meta().generation.map(|g| g.to_string()).as_deref() != Some(generation) {
        return (StatusCode::NOT_FOUND, format!("program {namespace}/{name} is not at generation {generation}")).into_response();
    }
    match crate::program::tarball(&program) {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/gzip")], bytes).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Serves the artifact router on `listener` until the future is dropped.
pub async fn serve(listener: tokio::net::TcpListener, client: kube::Client) -> std::io::Result<()> {
    axum::serve(listener, router(client)).await
}
