//! Prometheus metrics and health probes of the operator.
//!
//! `GET /metrics` (PKO's metrics endpoint, Helm port 8383) answers, in the Prometheus text format:
//! - PKO's gauges, computed at scrape time from the Stack and Program controllers' caches (objects this replica owns),
//!   so a deleted Stack's series disappears with it: `stacks_active`, `stacks_failing{namespace,name}` (1 when
//!   `status.lastUpdate.state` is `failed`), `programs_active`;
//! - reconciles of each controller: `pko_reconciles_total{controller}`, `pko_reconcile_errors_total{controller,step}`,
//!   `pko_reconcile_duration_seconds{controller}`;
//! - ours, through the `metrics` facade and `metrics-exporter-prometheus` (every `*_seconds` metric a histogram):
//!   `pko_update_operations_total{type,result}` (counter), `pko_update_operation_duration_seconds{type}` (histogram,
//!   seconds), `pko_update_operations_queued` and `pko_update_operations_in_flight` (gauges, this replica's work
//!   queue), `pko_update_operations_deferred_total` (counter: jobs put back because their workspace class was full),
//!   `pko_update_operations_held_total` (counter: jobs held for the busy pool agents that ran their Stack),
//!   `pko_pool_lends_total{affinity="warm"|"cold"|"none"}` (counter: agents lent, by whether they ran the Stack
//!   before),
//!   `pko_dispatch_wait_seconds{namespace}` (histogram: first push to a worker taking it),
//!   `pko_dispatch_latency_seconds{namespace}` (histogram: first push to the operation's first event on its agent),
//!   `pko_queue_depth{namespace}` (gauge), `pko_operations_running{class}` (gauge), `pko_pool_agents{class,state}`
//!   (gauge), `pko_pool_agents_started_total`, `pko_pool_agents_stopped_total` (counters);
//! - the fleet's (`--fleet`): `pko_fleet_shards_held`, `pko_fleet_members` (gauges),
//!   `pko_fleet_shard_transitions_total{change="gained"|"lost"}`, `pko_fleet_holding_gaps_total` (counters),
//!   `pko_fleet_lease_writes_total{lease="member"|"table",result="done"|"conflict"}` (counter: the coordination cost,
//!   every series from zero); `pko_update_operations_deferred_total` also starts at zero;
//! - the process's (`metrics-process`): `process_cpu_seconds_total`, `process_resident_memory_bytes`, …
//!
//! `GET /healthz` and `GET /readyz` answer `ok` (PKO's probe paths) on the probe endpoint ([`serve_probes`], PKO
//! `--health-probe-bind-address`).
//!
//! `/metrics` names namespaces and Stacks, so by default (PKO `--metrics-secure=true`) it is served over HTTPS and only
//! to callers whose bearer token passes a TokenReview and a SubjectAccessReview for `get` on the non-resource URL
//! `/metrics` — controller-runtime's `WithAuthenticationAndAuthorization`, which PKO uses; grant it with a
//! ClusterRole such as `deploy/manifests/operator.yaml`'s `pko-metrics-reader`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use metrics_exporter_prometheus::{LabelSet, PrometheusBuilder, PrometheusHandle};
use pko_api::stack::StackUpdateStateMessage;
use pko_api::{Program, Stack};

use crate::ownership::Ownership;

/// Metric names (the PKO ones keep PKO's spelling).
pub use crate::metric_names as names;

/// The process-wide Prometheus recorder of the `metrics` facade: installed by the first call, the same handle for every
/// later one (several in-process operators in one test binary share it).
pub fn install_recorder() -> PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            // `*_seconds` metrics are histograms (buckets from 5 ms to 30 minutes), not summaries
            let buckets = [
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
            ];
            let builder = PrometheusBuilder::new();
            let builder = builder
                .set_buckets_for_metric(metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()), &buckets)
                .unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// PKO's gauges for `stacks` and `programs` (those this replica owns, by `owns(namespace, name)`), in the Prometheus
/// text format with `metrics-exporter-prometheus`'s own escaping. Pure: the caller passes the cached objects.
pub fn pko_gauges<'a>(
    stacks: impl IntoIterator<Item = &'a Stack>,
    programs: usize,
    owns: &dyn Fn(&str, &str) -> bool,
) -> String {
    // Collector-style gauges, computed at scrape time as PKO computes them from its informers: the `metrics` facade
    // cannot delete a series (PKO deletes a deleted Stack's `stacks_failing`), and its recorder is process-wide, so
    // replicas sharing one process (the fleet tests) would overwrite one another's `stacks_active`.
    use metrics_exporter_prometheus::formatting::{write_help_line, write_metric_line, write_type_line};
    let no_labels = LabelSet::from_key_and_global(&metrics::Key::from_name(names::STACKS_ACTIVE), &Default::default());
    let mut failing = Vec::new();
    for s in stacks {
        let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
        if owns(&ns, &name) {
            let failed = s
                .status
                .as_ref()
                .and_then(|st| st.last_update.as_ref())
                .is_some_and(|l| l.state == Some(StackUpdateStateMessage::Failed));
            failing.push((ns, name, u8::from(failed)));
        }
    }
    failing.sort();
    let mut out = String::new();
    let gauge = |out: &mut String, name: &str, help: &str| {
        write_help_line(out, name, None, None, help);
        write_type_line(out, name, None, None, "gauge");
    };
    gauge(&mut out, names::STACKS_ACTIVE, "Number of Stacks the operator manages.");
    write_metric_line::<&str, usize>(&mut out, names::STACKS_ACTIVE, None, &no_labels, None, failing.len(), None);
    gauge(&mut out, names::STACKS_FAILING, "Whether a Stack's last update failed (1) or not (0).");
    for (ns, name, failed) in failing {
        let key = metrics::Key::from_parts(
            names::STACKS_FAILING,
            vec![metrics::Label::new("namespace", ns), metrics::Label::new("name", name)],
        );
        write_metric_line::<&str, u8>(
            &mut out,
            names::STACKS_FAILING,
            None,
            &LabelSet::from_key_and_global(&key, &Default::default()),
            None,
            failed,
            None,
        );
    }
    gauge(&mut out, names::PROGRAMS_ACTIVE, "Number of Programs the operator manages.");
    write_metric_line::<&str, usize>(&mut out, names::PROGRAMS_ACTIVE, None, &no_labels, None, programs, None);
    out
}

#[derive(Clone)]
struct MetricsState {
    stacks: Store<Stack>,
    programs: Store<Program>,
    ownership: Arc<dyn Ownership>,
    handle: PrometheusHandle,
}

/// The process's own metrics (`metrics-process`: `process_cpu_seconds_total`, `process_resident_memory_bytes`, open
/// fds, threads, …), collected at each scrape — the per-replica CPU and memory of the fleet dashboard.
fn collect_process_metrics() {
    static COLLECTOR: std::sync::OnceLock<metrics_process::Collector> = std::sync::OnceLock::new();
    COLLECTOR
        .get_or_init(|| {
            let c = metrics_process::Collector::default();
            c.describe();
            c
        })
        .collect();
}

async fn render(State(s): State<MetricsState>) -> String {
    collect_process_metrics();
    let stacks = s.stacks.state();
    let owns = |ns: &str, name: &str| s.ownership.owns(ns, name);
    let programs =
        s.programs.state().iter().filter(|p| owns(&p.namespace().unwrap_or_default(), &p.name_any())).count();
    let mut out = pko_gauges(stacks.iter().map(|x| &**x), programs, &owns);
    out.push_str(&s.handle.render());
    out
}

/// What `/metrics` reads: the Stack and Program controllers' caches (no watch of its own), this replica's ownership,
/// and the `metrics` facade's recorder.
#[derive(Clone)]
pub struct Sources {
    /// The Stack controller's store.
    pub stacks: Store<Stack>,
    /// The Program controller's store.
    pub programs: Store<Program>,
    /// Which objects this replica reports.
    pub ownership: Arc<dyn Ownership>,
    /// The recorder of [`install_recorder`].
    pub handle: PrometheusHandle,
}

/// The `/metrics` router over `sources`.
pub fn router(sources: Sources) -> Router {
    let Sources { stacks, programs, ownership, handle } = sources;
    Router::new().route("/metrics", get(render)).with_state(MetricsState { stacks, programs, ownership, handle })
}

/// How `/metrics` is protected (PKO `--metrics-secure`).
pub enum Security {
    /// Plain HTTP, no authentication (`--metrics-secure=false`).
    Insecure,
    /// HTTPS with `tls`; callers authenticated and authorized by [`Authz`].
    Secure {
        /// Certificate and key (self-signed by [`self_signed_tls`] unless given).
        tls: axum_server::tls_rustls::RustlsConfig,
    },
}

/// A TLS configuration with a self-signed certificate for `localhost` and `names` (controller-runtime generates one the
/// same way when no certificate is given). Errors: certificate generation failed.
pub async fn self_signed_tls(names: Vec<String>) -> std::io::Result<axum_server::tls_rustls::RustlsConfig> {
    let mut sans = vec!["localhost".to_string()];
    sans.extend(names);
    let cert = rcgen::generate_simple_self_signed(sans).map_err(std::io::Error::other)?;
    axum_server::tls_rustls::RustlsConfig::from_pem(
        cert.cert.pem().into_bytes(),
        cert.signing_key.serialize_pem().into_bytes(),
    )
    .await
}

async fn require_authz(
    State(authz): State<Arc<crate::authz::Authz>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    match authz.decide(crate::authz::bearer(req.headers()), &crate::authz::Access::Metrics).await {
        axum::http::StatusCode::OK => next.run(req).await,
        code => (code, code.canonical_reason().unwrap_or("refused")).into_response(),
    }
}

/// Serves `/metrics` ([`router`]) and the operations' output (`/logs/…`, [`crate::logs`], always authorized per
/// Stack) on `listener` until the future is dropped: plain HTTP, or HTTPS with authentication and authorization of
/// `/metrics` ([`Security::Secure`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    client: kube::Client,
    sources: Sources,
    security: Security,
    output: Arc<dyn pko_queue::output::OutputStore>,
) -> std::io::Result<()> {
    let authz = crate::authz::Authz::new(client);
    let logs = crate::logs::router(output, authz.clone());
    match security {
        Security::Insecure => axum::serve(listener, router(sources).merge(logs)).await,
        Security::Secure { tls } => {
            let router = router(sources).layer(axum::middleware::from_fn_with_state(authz, require_authz)).merge(logs);
            axum_server::from_tcp_rustls(listener.into_std()?, tls)?.serve(router.into_make_service()).await
        }
    }
}

/// Serves the probes on `listener`, unauthenticated (PKO `--health-probe-bind-address`, `:8081`), until the future is
/// dropped: `/healthz` answers `ok` while the process runs; `/readyz` answers `503` until `ready` is set (the
/// controllers' caches have synced), then `ok`.
pub async fn serve_probes(listener: tokio::net::TcpListener, ready: crate::informer::Synced) -> std::io::Result<()> {
    use axum::http::StatusCode;
    let readyz = move || {
        let ready = ready.clone();
        async move {
            if ready.get() { (StatusCode::OK, "ok") } else { (StatusCode::SERVICE_UNAVAILABLE, "caches not synced") }
        }
    };
    let router: Router = Router::new().route("/healthz", get(|| async { "ok" })).route("/readyz", get(readyz));
    axum::serve(listener, router).await
}

/// Serves the probes of a replica waiting for the leader Lease (`--leader-elect`) on `listener` until `stop` is
/// cancelled: `/healthz` and `/readyz` answer `ok` ("standby"), as controller-runtime's manager answers before it
/// leads. A Deployment's rolling update then sees the new pod Ready and stops the old one, whose release of the Lease
/// lets the new one lead (a readiness tied to leadership would keep both waiting for each other).
pub async fn serve_standby_probes(
    listener: tokio::net::TcpListener,
    stop: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let router: Router = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok (standby: waiting for the leader Lease)" }));
    axum::serve(listener, router).with_graceful_shutdown(async move { stop.cancelled().await }).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_api::StackSpec;
    use pko_api::stack::{StackStatus, StackUpdateState};

    fn stack(ns: &str, name: &str, state: Option<StackUpdateStateMessage>) -> Stack {
        let mut s = Stack::new(name, StackSpec { stack: "dev".into(), ..Default::default() });
        s.metadata.namespace = Some(ns.into());
        s.status = Some(StackStatus {
            last_update: state.map(|st| StackUpdateState { state: Some(st), ..Default::default() }),
            ..Default::default()
        });
        s
    }

    #[test]
    fn pko_gauges_count_owned_stacks_and_flag_failed_ones() {
        let stacks = [
            stack("a", "ok", Some(StackUpdateStateMessage::Succeeded)),
            stack("a", "bad", Some(StackUpdateStateMessage::Failed)),
            stack("a", "new", None),
            stack("other", "x", Some(StackUpdateStateMessage::Failed)),
        ];
        let text = pko_gauges(stacks.iter(), 2, &|ns, _| ns == "a");
        assert!(text.contains("\nstacks_active 3\n"), "{text}");
        assert!(text.contains("stacks_failing{namespace=\"a\",name=\"bad\"} 1\n"));
        assert!(text.contains("stacks_failing{namespace=\"a\",name=\"ok\"} 0\n"));
        assert!(text.contains("stacks_failing{namespace=\"a\",name=\"new\"} 0\n"));
        assert!(!text.contains("namespace=\"other\""), "not owned, not reported");
        assert!(text.contains("\nprograms_active 2\n"));
        assert!(text.contains("# TYPE stacks_failing gauge\n"));
    }

    #[test]
    fn label_values_are_escaped() {
        let text = pko_gauges([stack("a", "b\"c\\d", None)].iter(), 0, &|_, _| true);
        assert!(text.contains(r#"stacks_failing{namespace="a",name="b\"c\\d"} 0"#), "{text}");
    }
}
