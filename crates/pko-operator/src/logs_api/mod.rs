//! What Pulumi printed, as a Kubernetes API (issue 50): the aggregated API `logs.pulumi.com/v1alpha1`, served by every
//! replica on `--logs-api-bind-address` behind the chart's APIService, with the `log` subresource of Stacks and of
//! Updates:
//!
//! - `GET /apis/logs.pulumi.com/v1alpha1/namespaces/{ns}/stacks/{name}/log` — the newest kept operation of the Stack;
//! - `GET /apis/logs.pulumi.com/v1alpha1/namespaces/{ns}/updates/{name}/log` — that Update's operation;
//!
//! with the query `follow=true` (stream until the operation's result; a Stack with none kept yet waits for one),
//! `update=<name>` (a Stack's, among the kept), `all=true` (every kept operation of the Stack, oldest first) and
//! `timestamps=true`. The body is text, one line of Pulumi's output each (`kubectl get --raw` prints it); a refusal
//! is a Kubernetes `Status`. `kubectl pko logs` reads it with whatever credentials the kubeconfig has.
//!
//! Who may read: the API server authenticates the caller and proxies the request with its front proxy's client
//! certificate and the user in headers ([`caller`]; a bearer token is taken too, by TokenReview); then a
//! SubjectAccessReview of `get` on `stacks/log` (`updates/log`) in group `logs.pulumi.com` decides, so RBAC grants it
//! per namespace (the chart adds it to the aggregated `view` and `edit` roles). Any replica answers for any Stack:
//! the output store is Redis in a fleet (`pko_queue::output`); what is shown is `pko_queue::tail`'s, as the plugin's.

pub mod caller;
mod discovery;
pub mod tls;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum_server::tls::TlsInfo;
use k8s_openapi::api::authentication::v1::UserInfo;
use pko_queue::output::OutputStore;
use pko_queue::tail::{self, Request, Sink, TailError};

use crate::authz::{Access, Authz};
use caller::FrontProxy;
pub use discovery::status;

/// The API group (distinct from `pulumi.com`, whose kinds are CRDs).
pub const GROUP: &str = crate::authz::LOGS_GROUP;
/// The API version.
pub const VERSION: &str = crate::authz::LOGS_VERSION;

/// What the API's handlers share.
#[derive(Clone)]
pub struct LogsApi {
    /// Where operations' output is kept.
    pub output: Arc<dyn OutputStore>,
    /// TokenReviews and SubjectAccessReviews, cached.
    pub authz: Arc<Authz>,
    /// The API server's front proxy (`None`: bearer tokens only).
    pub proxy: Option<Arc<FrontProxy>>,
    /// The operator's client (an Update's Workspace is read with it, after the caller was authorized).
    pub client: kube::Client,
}

/// The query of a `log` subresource.
#[derive(Debug, Default, serde::Deserialize)]
struct LogQuery {
    update: Option<String>,
    #[serde(default)]
    follow: bool,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    timestamps: bool,
}

/// The API's routes.
pub fn router(api: LogsApi) -> Router {
    let base = format!("/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}");
    Router::new()
        .route(&format!("{base}/stacks/{{name}}/log"), get(stack_log))
        .route(&format!("{base}/updates/{{name}}/log"), get(update_log))
        .merge(discovery::router())
        .with_state(api)
}

/// Serves [`router`] over TLS with `config` ([`tls::server_config`]) on `listener` until the future is dropped.
///
/// Errors: the listener's.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: Arc<rustls::ServerConfig>,
    api: LogsApi,
) -> std::io::Result<()> {
    let tls = axum_server::tls_rustls::RustlsConfig::from_config(config);
    axum_server::from_tcp_rustls(listener.into_std()?, tls)?.serve(router(api).into_make_service()).await
}

/// The caller: the user the front proxy names (on a connection with its verified client certificate), else the
/// owner of the bearer token.
///
/// Errors: a `Status` response — 401 (no or bad credentials, a certificate not allowed), 503 (TokenReview failed).
async fn caller(api: &LogsApi, tls: Option<&TlsInfo>, headers: &HeaderMap) -> Result<UserInfo, Response> {
    let peer = tls.and_then(|t| t.peer_certificates.first());
    if let (Some(cert), Some(proxy)) = (peer, &api.proxy) {
        let cn = caller::common_name(cert.as_ref()).unwrap_or_default();
        return proxy.user(&cn, headers).map_err(|e| status(StatusCode::UNAUTHORIZED, e.to_string()));
    }
    api.authz.authenticate(crate::authz::bearer(headers)).await.map_err(|code| {
        status(code, "not authenticated: call through the Kubernetes API server (kubectl pko logs, kubectl get --raw)")
    })
}

/// Authenticates and authorizes `get` on the `log` subresource of `resource` `ns/name`.
async fn allowed(
    api: &LogsApi,
    tls: Option<&TlsInfo>,
    headers: &HeaderMap,
    resource: &str,
    (ns, name): (&str, &str),
) -> Result<(), Response> {
    let user = caller(api, tls, headers).await?;
    let access = Access::Log { resource: resource.into(), namespace: ns.into(), name: name.into() };
    match api.authz.authorize(&user, &access).await {
        StatusCode::OK => Ok(()),
        code => Err(status(
            code,
            format!(
                "{} cannot get {resource}/log of {GROUP} {name:?} in namespace {ns:?}",
                user.username.unwrap_or_default()
            ),
        )),
    }
}

async fn stack_log(
    State(api): State<LogsApi>,
    tls: Option<Extension<Arc<TlsInfo>>>,
    headers: HeaderMap,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<LogQuery>,
) -> Response {
    if let Err(r) = allowed(&api, tls.as_deref().map(|t| &**t), &headers, "stacks", (&ns, &name)).await {
        return r;
    }
    let req = Request {
        stack: format!("{ns}/{name}"),
        update: q.update,
        follow: q.follow,
        all: q.all,
        timestamps: q.timestamps,
    };
    respond(api, req).await
}

async fn update_log(
    State(api): State<LogsApi>,
    tls: Option<Extension<Arc<TlsInfo>>>,
    headers: HeaderMap,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<LogQuery>,
) -> Response {
    if let Err(r) = allowed(&api, tls.as_deref().map(|t| &**t), &headers, "updates", (&ns, &name)).await {
        return r;
    }
    let workspace = match kube::Api::<pko_api::Update>::namespaced(api.client.clone(), &ns).get_opt(&name).await {
        Ok(Some(u)) => u.spec.workspace_name.unwrap_or_default(),
        Ok(None) => return status(StatusCode::NOT_FOUND, format!("updates.auto.pulumi.com {name:?} not found")),
        Err(e) => return status(StatusCode::SERVICE_UNAVAILABLE, format!("reading update {ns}/{name}: {e}")),
    };
    let req = Request {
        stack: format!("{ns}/{workspace}"),
        update: Some(name),
        follow: q.follow,
        all: false,
        timestamps: q.timestamps,
    };
    respond(api, req).await
}

/// The operations `req` asks for as a streamed text body, or the refusal (404, 400, 503) before anything is sent.
async fn respond(api: LogsApi, req: Request) -> Response {
    let src = tail::Store(&*api.output);
    let ops = match tail::chosen(&src, &req).await {
        Ok(ops) => ops,
        Err(e @ TailError::Conflict) => return status(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e @ TailError::Source(_)) => return status(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Err(e) => return status(StatusCode::NOT_FOUND, e.to_string()),
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<axum::body::Bytes, std::convert::Infallible>>();
    tokio::spawn(async move {
        let mut sink = Lines(tx);
        if let Err(e) = tail::show(&tail::Store(&*api.output), &req, ops, &mut sink).await {
            sink.line(format!("error: {e}"));
        }
    });
    let body = axum::body::Body::from_stream(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
    ([(axum::http::header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

/// Lines into the response body; the reader is gone once the body is dropped.
struct Lines(tokio::sync::mpsc::UnboundedSender<Result<axum::body::Bytes, std::convert::Infallible>>);

impl Sink for Lines {
    fn line(&mut self, text: String) -> bool {
        self.0.send(Ok(format!("{text}\n").into())).is_ok()
    }

    fn gone(&self) -> bool {
        self.0.is_closed()
    }
}
