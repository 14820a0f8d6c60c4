//! The artifact server: `GET /programs/<namespace>/<name>/<generation>/<digest>.tar.gz` returns the
//! Program's tarball, regenerated on the fly (deterministic, so it matches `status.artifact.digest`).
//!
//! The server reads the Program controller's cache (no API request per download, so unknown paths cost
//! nothing) and answers 404 unless the Program is in that cache (the replica's watch scope, e.g.
//! `--namespaces`), at that generation, with that digest. In a fleet every replica serves every Program
//! of its scope, not only those of its shards: any replica behind the operator's Service answers, and a
//! Program's URL keeps working while its shard moves. The digest (sha256 of the tarball) makes the URL a capability: it can be had only from the
//! Program's status (RBAC on Programs of its namespace) or from the content itself, so a caller cannot
//! fetch another tenant's Program by guessing names (PKO serves `/programs/<ns>/<name>` to anyone).
//! Agents verify the digest of what they download, so the endpoint needs no other authentication
//! (docs/security.md).

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use pko_api::Program;

/// What the artifact server reads: the Program controller's cache.
#[derive(Clone)]
pub struct ArtifactState {
    /// The Program controller's store (its watch scope bounds what is served).
    pub programs: Store<Program>,
}

/// The router of the artifact server.
pub fn router(state: ArtifactState) -> Router {
    Router::new().route("/programs/{namespace}/{name}/{generation}/{file}", get(program_artifact)).with_state(state)
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "no such artifact").into_response()
}

async fn program_artifact(State(s): State<ArtifactState>, Path((namespace, name, generation, file)): Path<(String, String, String, String)>) -> Response {
    let Some(program) = s.programs.get(&ObjectRef::new(&name).within(&namespace)) else { return not_found() };
    if program.meta().generation.map(|g| g.to_string()).as_deref() != Some(generation.as_str()) {
        return not_found();
    }
    let bytes = match crate::program::tarball(&program) {
        Ok(b) => b,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    // `<hex>.tar.gz`: the digest of exactly these bytes
    let digest = crate::program::digest(&bytes);
    if file.strip_suffix(".tar.gz") != digest.strip_prefix("sha256:") {
        return not_found();
    }
    ([(header::CONTENT_TYPE, "application/gzip")], bytes).into_response()
}

/// Serves the artifact router on `listener` until the future is dropped.
pub async fn serve(listener: tokio::net::TcpListener, state: ArtifactState) -> std::io::Result<()> {
    axum::serve(listener, router(state)).await
}
