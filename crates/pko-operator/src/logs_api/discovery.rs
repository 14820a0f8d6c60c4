//! What the aggregated API says about itself: API discovery (the API server's aggregator asks
//! `/apis/logs.pulumi.com/v1alpha1` to mark the APIService Available, `kubectl` asks the rest), an empty OpenAPI v2
//! document (the aggregator merges it; the `log` subresources take no body), health, and errors as Kubernetes `Status`
//! objects (`kubectl` prints their message: `Error from server (Forbidden): …`). Unauthenticated, as the API server's
//! own discovery: nothing here depends on the caller.

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use super::{GROUP, VERSION};

/// The discovery, OpenAPI and health routes.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let group_version = format!("{GROUP}/{VERSION}");
    let group = json!({"name": GROUP, "versions": [{"groupVersion": group_version, "version": VERSION}],
        "preferredVersion": {"groupVersion": group_version, "version": VERSION}});
    let groups = json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group.clone()]});
    let mut one = group;
    one["kind"] = json!("APIGroup");
    one["apiVersion"] = json!("v1");
    let resource = |name: &str, kind: &str| {
        let mut r = json!({"name": name, "singularName": "", "namespaced": true, "kind": kind});
        r["verbs"] = json!(["get"]);
        r
    };
    let resources = json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
        "resources": [resource("stacks/log", "Stack"), resource("updates/log", "Update")]});
    let openapi = json!({"swagger": "2.0", "info": {"title": GROUP, "version": VERSION}, "paths": {}});
    Router::new()
        .route("/apis", get(move || async move { axum::Json(groups) }))
        .route(&format!("/apis/{GROUP}"), get(move || async move { axum::Json(one) }))
        .route(&format!("/apis/{GROUP}/{VERSION}"), get(move || async move { axum::Json(resources) }))
        .route("/openapi/v2", get(move || async move { axum::Json(openapi) }))
        .route("/healthz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
}

/// A Kubernetes `Status` failure with `code` and `message` (Kubernetes API conventions: `reason` from the code).
pub fn status(code: StatusCode, message: impl Into<String>) -> Response {
    let reason = match code {
        StatusCode::UNAUTHORIZED => "Unauthorized",
        StatusCode::FORBIDDEN => "Forbidden",
        StatusCode::NOT_FOUND => "NotFound",
        StatusCode::BAD_REQUEST => "BadRequest",
        StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailable",
        _ => "InternalError",
    };
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message.into(), "reason": reason, "code": code.as_u16()});
    (code, axum::Json(body)).into_response()
}
