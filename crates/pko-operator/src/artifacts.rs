//! The artifact server: `GET /programs/<namespace>/<name>/<generation>/<digest>.tar.gz` returns the Program's tarball,
//! rendered once per generation and cached (deterministic, so it matches `status.artifact.digest`).
//!
//! The server reads the Program controller's cache (no API request per download, so unknown paths cost nothing) and
//! answers 404 unless the Program is in that cache (the replica's watch scope, e.g. `--namespaces`), at that
//! generation, with that digest. In a fleet every replica serves every Program of its scope, not only those of its
//! shards: any replica behind the operator's Service answers, and a Program's URL keeps working while its shard moves.
//! The digest (sha256 of the tarball) makes the URL a capability: it can be had only from the Program's status (RBAC on
//! Programs of its namespace) or from the content itself, so a caller cannot fetch another tenant's Program by guessing
//! names (PKO serves `/programs/<ns>/<name>` to anyone). Agents verify the digest of what they download, so the
//! endpoint needs no other authentication (docs/security.md). What an unauthenticated request can cost is bounded: the
//! path is compared with the published `status.artifact` (generation and digest) before anything is rendered, and a
//! published artifact is rendered once and then served from a cache of [`CACHE_BYTES`] (concurrent first requests share
//! one rendering).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use pko_api::Program;

/// Bytes of rendered tarballs the server keeps ([`ArtifactState::new`]), least recently used out.
pub const CACHE_BYTES: u64 = 64 << 20;

/// What the artifact server reads: the Program controller's cache, and the tarballs it rendered.
#[derive(Clone)]
pub struct ArtifactState {
    /// The Program controller's store (its watch scope bounds what is served).
    pub programs: Store<Program>,
    /// Rendered tarballs by `namespace/name/generation/digest`, at most [`CACHE_BYTES`].
    rendered: moka::future::Cache<String, Arc<Vec<u8>>>,
    /// How many tarballs were rendered (each at most once while cached).
    renders: Arc<AtomicU64>,
}

impl ArtifactState {
    /// A server of `programs`' artifacts with an empty cache.
    pub fn new(programs: Store<Program>) -> Self {
        let rendered = moka::future::Cache::builder()
            .weigher(|_: &String, v: &Arc<Vec<u8>>| u32::try_from(v.len()).unwrap_or(u32::MAX))
            .max_capacity(CACHE_BYTES)
            .build();
        Self { programs, rendered, renders: Arc::default() }
    }

    /// How many tarballs this server rendered so far (a request answered from the cache, or refused before rendering,
    /// renders none).
    pub fn renders(&self) -> u64 {
        self.renders.load(Ordering::Relaxed)
    }
}

/// The router of the artifact server.
pub fn router(state: ArtifactState) -> Router {
    Router::new().route("/programs/{namespace}/{name}/{generation}/{file}", get(program_artifact)).with_state(state)
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "no such artifact").into_response()
}

/// Whether the path's `generation` and `file` (`<hex digest>.tar.gz`) name the artifact `program`'s status publishes
/// for its current generation: compared before any work is done for the request. Pure.
pub fn published(program: &Program, generation: &str, file: &str) -> bool {
    let current = program.meta().generation.map(|g| g.to_string());
    let Some(artifact) = program.status.as_ref().and_then(|s| s.artifact.as_ref()) else { return false };
    let digest = file.strip_suffix(".tar.gz").map(|hex| format!("sha256:{hex}"));
    current.as_deref() == Some(generation)
        && artifact.revision.as_deref() == Some(generation)
        && digest.is_some()
        && artifact.digest == digest
}

async fn program_artifact(
    State(s): State<ArtifactState>,
    Path((namespace, name, generation, file)): Path<(String, String, String, String)>,
) -> Response {
    let Some(program) = s.programs.get(&ObjectRef::new(&name).within(&namespace)) else { return not_found() };
    // an unauthenticated request costs a cache lookup and a comparison unless it names the artifact
    // the Program's status publishes
    if !published(&program, &generation, &file) {
        return not_found();
    }
    let key = format!("{namespace}/{name}/{generation}/{file}");
    let renders = s.renders.clone();
    let rendered = s
        .rendered
        .try_get_with(key, async move {
            renders.fetch_add(1, Ordering::Relaxed);
            crate::program::tarball(&program).map(Arc::new)
        })
        .await;
    let bytes = match rendered {
        Ok(b) => b,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    // `<hex>.tar.gz`: the digest of exactly these bytes (the rendering is deterministic)
    if file.strip_suffix(".tar.gz") != crate::program::digest(&bytes).strip_prefix("sha256:") {
        return not_found();
    }
    ([(header::CONTENT_TYPE, "application/gzip")], bytes.as_ref().clone()).into_response()
}

/// Serves the artifact router on `listener` until the future is dropped.
pub async fn serve(listener: tokio::net::TcpListener, state: ArtifactState) -> std::io::Result<()> {
    axum::serve(listener, router(state)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(generation: i64, revision: &str, digest: &str) -> Program {
        serde_json::from_value(serde_json::json!({"apiVersion": "pulumi.com/v1", "kind": "Program",
            "metadata": {"name": "p", "namespace": "n", "generation": generation},
            "program": {}, "status": {"artifact": {"path": "x", "url": "u", "revision": revision, "digest": digest,
                "lastUpdateTime": "2026-11-25T00:00:00Z"}}}))
        .unwrap()
    }

    #[test]
    fn only_the_published_artifact_of_the_current_generation_is_served() {
        let hex = "ab".repeat(32);
        let p = program(3, "3", &format!("sha256:{hex}"));
        assert!(published(&p, "3", &format!("{hex}.tar.gz")));
        assert!(!published(&p, "3", &format!("{}.tar.gz", "00".repeat(32))), "another digest");
        assert!(!published(&p, "2", &format!("{hex}.tar.gz")), "another generation");
        assert!(!published(&p, "3", &hex), "not a tarball name");
        assert!(
            !published(&program(4, "3", &format!("sha256:{hex}")), "3", &format!("{hex}.tar.gz")),
            "the spec moved on: the status is stale"
        );
        let mut unpublished = p.clone();
        unpublished.status = None;
        assert!(!published(&unpublished, "3", &format!("{hex}.tar.gz")), "nothing published yet");
    }
}
