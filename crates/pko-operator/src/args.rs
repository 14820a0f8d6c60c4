//! Flags of `pko-operator run`, grouped (`#[command(flatten)]`): artifacts, runtime, operations, metrics and logging
//! — and room for the fleet's group. Every flag has PKO's name and environment variable where PKO has one.

use std::path::PathBuf;

use clap::Args;

/// Every flag of `pko-operator run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// The artifact server.
    #[command(flatten)]
    pub artifacts: ArtifactArgs,
    /// Where workspace agents run.
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// What this replica acts on, and how much at once.
    #[command(flatten)]
    pub operations: OperationArgs,
    /// Metrics and probes.
    #[command(flatten)]
    pub metrics: MetricsArgs,
    /// Log output.
    #[command(flatten)]
    pub logging: LoggingArgs,
    /// The sharded fleet.
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// PKO's leader election and API client settings.
    #[command(flatten)]
    pub manager: ManagerArgs,
}

/// A Go duration (`30s`, `1m0s`, `500ms`), as PKO's flags and `LEADER_ELECTION_*`/`KUBE_API_TIMEOUT` take them.
fn go_duration(s: &str) -> Result<std::time::Duration, String> {
    pko_api::duration::parse_go_duration(s).map_err(|e| e.to_string())
}

/// PKO's manager flags: leader election (one active replica outside a fleet) and the API client's timeout. PKO's
/// install manifest sets all of them; they mean the same here.
#[derive(Args, Debug, Clone)]
pub struct ManagerArgs {
    /// Act only while holding the Lease `operator.pulumi.com` in the operator's namespace (PKO `--leader-elect`): one
    /// active replica, the others wait. With `--fleet` every replica is active (shard Leases decide what each acts on)
    /// and this flag changes nothing.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value_t = false,
        action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// How long the leader Lease lasts without renewal (PKO; env `LEADER_ELECTION_LEASE_DURATION`).
    #[arg(long, default_value = "60s", value_parser = go_duration, env = "LEADER_ELECTION_LEASE_DURATION")]
    pub leader_election_lease_duration: std::time::Duration,
    /// How long the leader keeps trying to renew before it gives up (PKO; env `LEADER_ELECTION_RENEW_DEADLINE`): it
    /// renews once less than duration − deadline is left.
    #[arg(long, default_value = "45s", value_parser = go_duration, env = "LEADER_ELECTION_RENEW_DEADLINE")]
    pub leader_election_renew_deadline: std::time::Duration,
    /// How often a waiting replica looks at the leader Lease again (PKO; env `LEADER_ELECTION_RETRY_PERIOD`): a Lease
    /// released on shutdown is taken within it.
    #[arg(long, default_value = "10s", value_parser = go_duration, env = "LEADER_ELECTION_RETRY_PERIOD")]
    pub leader_election_retry_period: std::time::Duration,
    /// Timeout of API requests (PKO `--kube-api-timeout`, env `KUBE_API_TIMEOUT`): connecting, sending, and each wait
    /// for response bytes. Watches are not cut by it (they wait longer by design).
    #[arg(long, default_value = "30s", value_parser = go_duration, env = "KUBE_API_TIMEOUT")]
    pub kube_api_timeout: std::time::Duration,
    /// Accepted for PKO's manifests: the metrics endpoint speaks HTTP/1.1 (PKO's default, for the HTTP/2 rapid-reset
    /// CVEs).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value_t = false,
        action = clap::ArgAction::Set)]
    pub enable_http2: bool,
}

/// The sharded fleet (ours): several replicas split Stacks over Lease-held virtual shards.
#[derive(Args, Debug, Clone)]
pub struct FleetArgs {
    /// Take part in a fleet: hold shards through Leases and act only on their objects. Off: this replica acts on
    /// everything (one replica).
    #[arg(long, env = "PKO_FLEET")]
    pub fleet: bool,
    /// Virtual shards. Replicas of one fleet must agree: a replica whose count differs from the eldest live member's
    /// stands by (holds nothing) until the other count has gone; changing it relabels and moves every Stack once. At
    /// most 8,192 (`pko_fleet::table::MAX_SHARDS`: the shard table must fit in one object's annotations).
    #[arg(long, default_value_t = pko_fleet::DEFAULT_SHARDS, env = "PKO_SHARDS",
        value_parser = clap::value_parser!(u32).range(1..=pko_fleet::table::MAX_SHARDS as i64))]
    pub shards: u32,
    /// Name of the fleet: prefix of its Leases.
    #[arg(long, default_value = "pko", env = "PKO_FLEET_NAME")]
    pub fleet_name: String,
    /// Namespace of the fleet's Leases (the operator's own).
    #[arg(long, env = "POD_NAMESPACE")]
    pub fleet_namespace: Option<String>,
    /// This replica's id in the fleet (default: its pod name, else its host name).
    #[arg(long, env = "POD_NAME")]
    pub replica_id: Option<String>,
    /// Seconds a replica's membership lasts without renewal before others take its shards.
    #[arg(long, default_value_t = 15)]
    pub lease_duration_seconds: u64,
    /// Seconds between membership renewals (writes at rest: one per interval per replica).
    #[arg(long, default_value_t = 5)]
    pub renew_interval_seconds: u64,
    /// Seconds after its last renewal at which a replica that could not renew stops acting.
    #[arg(long, default_value_t = 10)]
    pub renew_deadline_seconds: u64,
}

impl FleetArgs {
    /// Where this replica runs, as an unlock request judges lock holders' hosts against it: this host,
    /// `--fleet-namespace`, and `--fleet-name` with `--fleet`.
    pub fn placement(&self) -> crate::context::Placement {
        crate::context::Placement::here(self.fleet_namespace.clone(), self.fleet.then(|| self.fleet_name.clone()))
    }
}

/// The artifact server (PKO's program file server).
#[derive(Args, Debug, Clone)]
pub struct ArtifactArgs {
    /// Address of the artifact server (PKO `PROGRAM_FS_ADDR`; `:9090` means every interface); port 0 picks a free one.
    #[arg(long, default_value = "0.0.0.0:9090", env = "PROGRAM_FS_ADDR", value_parser = socket_address)]
    pub program_fs_addr: std::net::SocketAddr,
    /// `host:port` under which agents reach the artifact server (PKO `PROGRAM_FS_ADV_ADDR`); default: the bound
    /// address.
    #[arg(long, env = "PROGRAM_FS_ADV_ADDR")]
    pub program_fs_adv_addr: Option<String>,
}

/// Where workspace agents run.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeKind {
    /// StatefulSet per Workspace.
    Pod,
    /// Agent processes on this machine (development, tests, `make demo`).
    Local,
}

/// The agent runtime.
#[derive(Args, Debug, Clone)]
pub struct RuntimeArgs {
    /// Where workspace agents run: `pod` (StatefulSets) or `local` (processes on this machine).
    #[arg(long, value_enum, default_value_t = RuntimeKind::Pod)]
    pub runtime: RuntimeKind,
    /// Image holding `/pko-agent` for the pod runtime.
    #[arg(long, default_value = "pko-agent:latest", env = "AGENT_IMAGE")]
    pub agent_image: String,
    /// Pull policy of `--agent-image` (PKO `AGENT_IMAGE_PULL_POLICY`); default: Kubernetes' for the tag.
    #[arg(long, env = "AGENT_IMAGE_PULL_POLICY", value_parser = ["Always", "IfNotPresent", "Never"])]
    pub agent_image_pull_policy: Option<String>,
    /// Largest uncompressed Flux artifact in bytes that agents extract (PKO `FLUX_MAX_UNTAR_SIZE_BYTES`, passed on to
    /// every agent; −1: no limit); default: the agent's (100 MiB).
    #[arg(long, env = "FLUX_MAX_UNTAR_SIZE_BYTES", allow_negative_numbers = true)]
    pub flux_max_untar_size_bytes: Option<i64>,
    /// The `pko-agent` binary for the local runtime.
    #[arg(long, default_value = "pko-agent")]
    pub agent_bin: PathBuf,
    /// Work directory of local agents.
    #[arg(long, default_value = "/tmp/pko-operator/agents")]
    pub local_work_dir: PathBuf,
    /// API server URL the local agents use (required by `--runtime local`).
    #[arg(long)]
    pub local_api_server: Option<String>,
    /// CA bundle of the API server for the local agents (required by `--runtime local`).
    #[arg(long)]
    pub local_ca_file: Option<PathBuf>,
    /// Run operations on pools of agents per workspace class (namespace, service account, image, pod template, log
    /// level) that start on demand and stop when idle, so an idle Stack costs no process or pod. Default: on with
    /// `--runtime local`, off with `--runtime pod` (a StatefulSet per Workspace, as PKO); `false` gives every Workspace
    /// its own agent.
    #[arg(long, env = "PKO_AGENT_POOLS", num_args = 0..=1, default_missing_value = "true")]
    pub agent_pools: Option<bool>,
    /// Agents each pool keeps running even when idle (`--agent-pools`).
    #[arg(long, default_value_t = 0)]
    pub pool_min_agents: usize,
    /// Most agents per pool (`--agent-pools`); more operations of the class wait in the queue.
    #[arg(long, default_value_t = 16)]
    pub pool_max_agents: usize,
    /// Seconds an operation may wait for the busy agent that ran its Stack last while another agent is free or could be
    /// started (`--agent-pools`): that agent keeps the Stack's prepared revision, selected stack and compile caches, so
    /// a short wait beats a cold start (a TypeScript program's type check, about 3.5 s). Held operations are woken as
    /// soon as their agent is given back; others take the free agents meanwhile. 0: never wait. Default 6: with 50
    /// TypeScript Stacks on 2 agents, 3 s left 2 and 10 of 50 operations per round cold (1.13× and 1.41× a bare
    /// loop), 6 s 0 and 2 (1.09×, 1.20×), in one run after the other (`benches/real_stacks.rs`).
    #[arg(long, default_value = "6", value_parser = seconds)]
    pub pool_affinity_wait_seconds: std::time::Duration,
    /// Seconds an agent of a pool may stay idle before it is stopped (`--agent-pools`).
    #[arg(long, default_value_t = 60)]
    pub pool_idle_timeout_seconds: u64,
    /// Bytes of prepared revisions each pool agent keeps on disk (`pko-agent serve --cache-max-bytes`; the agent's
    /// default, 2 GiB, when unset): the least recently used go first past it.
    #[arg(long)]
    pub pool_cache_max_bytes: Option<u64>,
    /// Bytes of the Stacks' own caches each pool agent keeps between their operations (`pko-agent serve
    /// --stack-cache-max-bytes`: ts-node's, Go's build and module caches; the agent's default, 4 GiB, when unset).
    #[arg(long)]
    pub pool_stack_cache_max_bytes: Option<u64>,
    /// HOLLOW AGENTS, for control-plane load tests only (kubemark-style): pool agents simulate every operation (success
    /// after this many seconds, `pko-agent --hollow-seconds`) instead of running Pulumi. Never a default; never used by
    /// a functional test. Needs `--agent-pools` (either runtime).
    #[arg(long)]
    pub hollow_agents_seconds: Option<f64>,
    /// The operator's own service account as `namespace/name`: agents in pods authenticate the operator with
    /// TokenRequest tokens of it (PKO: `serviceaccounts/token create` on itself). Required by the pod runtime; the
    /// install manifest sets it from the Downward API.
    #[arg(long, env = "OPERATOR_SERVICE_ACCOUNT")]
    pub service_account: Option<String>,
    /// The operator's service account name alone (PKO `POD_SA_NAME`, from the Downward API): with `POD_NAMESPACE` it
    /// stands for `--service-account` when that is not given.
    #[arg(long, env = "POD_SA_NAME", hide = true)]
    pub pod_sa_name: Option<String>,
}

/// What this replica acts on, and how much at once.
#[derive(Args, Debug, Clone)]
pub struct OperationArgs {
    /// Reconciles each controller runs at once (PKO `MAX_CONCURRENT_RECONCILES`).
    #[arg(long, default_value_t = crate::context::DEFAULT_RECONCILE_CONCURRENCY, env = "MAX_CONCURRENT_RECONCILES")]
    pub max_concurrent_reconciles: u16,
    /// Operations this replica drives at once.
    #[arg(long, default_value_t = 256)]
    pub max_operations: usize,
    /// Operations at once per workspace class (namespace, service account, image, pod template); 0: no limit beyond
    /// `--max-operations`.
    #[arg(long, default_value_t = 0)]
    pub max_operations_per_class: usize,
    /// At most this many operations of one namespace at once, whoever else waits (0: no limit); namespaces take turns
    /// either way, so one with 1,000 Stacks cannot starve one with 3.
    #[arg(long, default_value_t = 0, env = "MAX_OPERATIONS_PER_NAMESPACE")]
    pub max_operations_per_namespace: usize,
    /// The share of `--max-operations` one namespace holds while another namespace waits, in percent (rounded up, at
    /// least one operation; 100: no share). Work-conserving: a namespace alone uses every worker; a waiting namespace
    /// under its share gets the next free one. An Update held back says so in its `Progressing` condition.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(1..=100),
        env = "NAMESPACE_SHARE_PERCENT")]
    pub namespace_share_percent: u8,
    /// Drift checks (`spec.driftDetection`) running at once across the fleet (counted in Redis with `--redis-url`); a
    /// due check waits for a free slot. 0: no limit.
    #[arg(long, default_value_t = crate::context::DEFAULT_MAX_DRIFT_CHECKS, env = "MAX_CONCURRENT_DRIFT_CHECKS")]
    pub max_concurrent_drift_checks: usize,
    /// The shortest time between two drift checks of one Stack, in seconds: a schedule that ticks more often is checked
    /// at this pace, and its `DriftDetected` condition says so (PKO's resync floor).
    #[arg(long, default_value_t = crate::context::DEFAULT_DRIFT_MIN_INTERVAL.as_secs(),
        env = "MIN_DRIFT_CHECK_INTERVAL_SECONDS")]
    pub min_drift_check_interval_seconds: u64,
    /// Base URL of the GitHub API that GitHub App git credentials (`gitAuth.githubApp`) are exchanged at for
    /// installation tokens (GitHub Enterprise Server: `https://<host>/api/v3`).
    #[arg(long, default_value = pko_git::github_app::DEFAULT_API_URL, env = "GITHUB_API_URL")]
    pub github_api_url: String,
    /// Default of `Update.spec.idleTimeout` (PKO PR #1296): an operation that sends no event for this long (Go
    /// duration) is stopped and its Update fails `IdleTimeout`; `0s` disables it.
    #[arg(long, default_value = "30m", env = "UPDATE_IDLE_TIMEOUT", value_parser = go_duration)]
    pub update_idle_timeout: std::time::Duration,
    /// Default of `Update.spec.timeout` (ours): an operation running longer (Go duration) is stopped and its Update
    /// fails `DeadlineExceeded`; `0s` (the default) disables it.
    #[arg(long, default_value = "0s", env = "OPERATION_TIMEOUT", value_parser = go_duration)]
    pub operation_timeout: std::time::Duration,
    /// The Redis work queue (`redis://` or `rediss://`, password in the URL): operations outlive the replica that
    /// queued them and move with their shard. Required for more than one replica. With `--redis-sentinel-master`: the
    /// Sentinels, comma-separated (`redis://s1:26379,redis://s2:26379`).
    #[arg(long, env = "PKO_REDIS_URL")]
    pub redis_url: Option<String>,
    /// HA installs: the name of the master the Sentinels of `--redis-url` monitor; the queue follows it through a
    /// failover. The first Sentinel URL's password and database are used for the master.
    #[arg(long, env = "PKO_REDIS_SENTINEL_MASTER")]
    pub redis_sentinel_master: Option<String>,
    /// Prefix of the queue's Redis keys (several fleets may share one Redis).
    #[arg(long, default_value = "pko", env = "PKO_REDIS_PREFIX")]
    pub redis_prefix: String,
    /// Lines of each operation's output kept for `kubectl pko logs` (the last ones).
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub output_lines: u32,
    /// Operations of each Stack whose output is kept (the newest).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub output_operations: u32,
    /// Act only on objects of these namespaces (comma-separated; default: every namespace). An extension of ours:
    /// several operators can share a cluster by namespace.
    #[arg(long, value_delimiter = ',', env = "WATCH_NAMESPACES")]
    pub namespaces: Vec<String>,
}

/// Metrics and probes.
#[derive(Args, Debug, Clone)]
pub struct MetricsArgs {
    /// Address of the metrics endpoint (`/metrics`); `0` turns it off (PKO `--metrics-bind-address`; its Helm chart
    /// uses port 8383). `:port` means every interface.
    #[arg(long, default_value = "0.0.0.0:8383", env = "METRICS_BIND_ADDRESS")]
    pub metrics_bind_address: String,
    /// Serve `/metrics` over HTTPS to callers allowed `get` on the non-resource URL `/metrics` (TokenReview +
    /// SubjectAccessReview), as PKO does by default; `--metrics-secure=false` serves plain HTTP to anyone.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
        default_missing_value = "true")]
    pub metrics_secure: bool,
    /// Directory with `tls.crt` and `tls.key` for the secure metrics endpoint (controller-runtime's `CertDir`);
    /// default: a self-signed certificate made at start.
    #[arg(long)]
    pub metrics_cert_dir: Option<PathBuf>,
    /// Address of the aggregated API `logs.pulumi.com` (HTTPS; `kubectl pko logs`, `kubectl get --raw
    /// /apis/logs.pulumi.com/v1alpha1/namespaces/<ns>/stacks/<name>/log`), which the chart's APIService routes to;
    /// `0` turns it off (the default outside the chart). `:port` means every interface.
    #[arg(long, default_value = "0", env = "LOGS_API_BIND_ADDRESS")]
    pub logs_api_bind_address: String,
    /// Directory with `tls.crt` and `tls.key` for the aggregated API; default: a self-signed certificate made at
    /// start (the chart's APIService then skips verifying it, as metrics-server's does).
    #[arg(long)]
    pub logs_api_cert_dir: Option<PathBuf>,
    /// Address of the Receivers' hook endpoint (`POST /hook/<digest>`, plain HTTP: git hosts' push webhooks, TLS at
    /// the ingress); `0` turns it off and Receivers are not watched (the default outside the chart). Ours.
    #[arg(long, default_value = "0", env = "WEBHOOK_BIND_ADDRESS")]
    pub webhook_bind_address: String,
    /// Address of the probe endpoint (`/healthz`, `/readyz`; PKO `--health-probe-bind-address`); `0` turns it off.
    #[arg(long, default_value = "0.0.0.0:8081", env = "HEALTH_PROBE_BIND_ADDRESS")]
    pub health_probe_bind_address: String,
}

/// Log format.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object a line (PKO's `--zap-encoder=json`).
    Json,
    /// Human-readable text (PKO's `console`); colours only on a terminal.
    #[value(alias = "console")]
    Text,
}

/// Log output (to standard output, as PKO).
#[derive(Args, Debug, Clone)]
pub struct LoggingArgs {
    /// `json` or `text`; PKO's `--zap-encoder` (`json`/`console`) is accepted too.
    #[arg(long, alias = "zap-encoder", value_enum, default_value_t = LogFormat::Text, env = "LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Least level logged (PKO `--zap-log-level`): `debug`, `info`, `error`, `panic`, or zap's integer verbosity (`1`,
    /// `2`, … = debug and below); `RUST_LOG` overrides it.
    #[arg(long, alias = "zap-log-level", default_value = "info", value_parser = log_level)]
    pub log_level: String,
    /// PKO `--zap-devel`: debug level unless `--zap-log-level` says otherwise.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value_t = false,
        action = clap::ArgAction::Set)]
    pub zap_devel: bool,
    /// Accepted for PKO's manifests (`--zap-stacktrace-level`): errors carry their cause chain instead.
    #[arg(long)]
    pub zap_stacktrace_level: Option<String>,
    /// Accepted for PKO's manifests (`--zap-time-encoding`): timestamps are RFC 3339 in UTC.
    #[arg(long, value_parser = ["epoch", "millis", "nano", "iso8601", "rfc3339", "rfc3339nano"])]
    pub zap_time_encoding: Option<String>,
}

impl LoggingArgs {
    /// The `tracing` filter directive of the chosen level (`info` by default; `debug` with `--zap-devel` and no
    /// explicit level).
    pub fn filter(&self) -> &str {
        if self.zap_devel && self.log_level == "info" { "debug" } else { &self.log_level }
    }
}

/// PKO's zap level as a `tracing` level: names as they are (`panic`/`dpanic`/`fatal` → `error`, `warn` stays), a
/// positive integer N (zap's `-N`) → `debug` (N = 1) or `trace` (N ≥ 2).
fn log_level(s: &str) -> Result<String, String> {
    let s = s.trim().to_ascii_lowercase();
    Ok(match s.as_str() {
        "trace" | "debug" | "info" | "warn" | "error" => s,
        "panic" | "dpanic" | "fatal" => "error".into(),
        n => match n.parse::<i64>() {
            Ok(0) => "info".into(),
            Ok(1) => "debug".into(),
            Ok(n) if n > 1 => "trace".into(),
            _ => return Err(format!("{s:?} is not a log level (debug, info, error, panic, or a verbosity 1, 2, …)")),
        },
    })
}

/// A socket address, also in Go's `:port` form (every interface).
/// A number of seconds, fractions allowed (`2.5`), never negative.
fn seconds(s: &str) -> Result<std::time::Duration, String> {
    let n: f64 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    std::time::Duration::try_from_secs_f64(n).map_err(|e| format!("{s:?}: not a number of seconds ≥ 0: {e}"))
}

fn socket_address(s: &str) -> Result<std::net::SocketAddr, String> {
    listen_address(s).parse().map_err(|e| format!("{s:?}: {e}"))
}

/// A listen address: `host:port`, or `:port` (every interface, as Go's flags write it).
pub fn listen_address(s: &str) -> String {
    if s.starts_with(':') { format!("0.0.0.0{s}") } else { s.to_string() }
}

impl RuntimeArgs {
    /// The arguments a pool's agents get besides their own defaults: the disk budgets (`--pool-cache-max-bytes`,
    /// `--pool-stack-cache-max-bytes`) and the hollow agents' flag of a load test. Pure.
    pub fn pool_agent_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(b) = self.pool_cache_max_bytes {
            args.extend(["--cache-max-bytes".to_string(), b.to_string()]);
        }
        if let Some(b) = self.pool_stack_cache_max_bytes {
            args.extend(["--stack-cache-max-bytes".to_string(), b.to_string()]);
        }
        if let Some(s) = self.hollow_agents_seconds {
            args.extend(["--hollow-seconds".to_string(), s.to_string()]);
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn pool_agents_get_the_disk_budgets_only_when_set() {
        assert!(Cli::parse_from(["x"]).run.runtime.pool_agent_args().is_empty(), "the agent's own defaults");
        let a = Cli::parse_from(["x", "--pool-cache-max-bytes", "1000", "--pool-stack-cache-max-bytes=2000"]).run;
        assert_eq!(a.runtime.pool_agent_args(), ["--cache-max-bytes", "1000", "--stack-cache-max-bytes", "2000"]);
    }

    #[test]
    fn the_affinity_wait_is_seconds_never_negative() {
        let wait = |v: &str| Cli::try_parse_from(["x", "--pool-affinity-wait-seconds", v]).map(|c| c.run.runtime);
        assert_eq!(Cli::parse_from(["x"]).run.runtime.pool_affinity_wait_seconds, std::time::Duration::from_secs(6));
        assert_eq!(wait("2.5").unwrap().pool_affinity_wait_seconds, std::time::Duration::from_millis(2500));
        assert_eq!(wait("0").unwrap().pool_affinity_wait_seconds, std::time::Duration::ZERO);
        assert!(wait("-1").is_err());
        assert!(wait("soon").is_err());
    }

    /// PKO's install manifest (`operator/config/manager/manager.yaml`, v2.9) passes these to `/manager`.
    #[test]
    fn pko_manifest_flags_parse_and_mean_the_same() {
        let a = Cli::parse_from([
            "x",
            "--leader-elect",
            "--health-probe-bind-address=:8081",
            "--program-fs-adv-addr=pulumi-kubernetes-operator.ns:80",
            "--zap-log-level=info",
            "--zap-encoder=console",
            "--zap-time-encoding=iso8601",
            "--program-fs-addr=:9090",
            "--leader-election-lease-duration=30s",
            "--kube-api-timeout=1m0s",
        ])
        .run;
        assert!(a.manager.leader_elect);
        assert_eq!(a.manager.leader_election_lease_duration, std::time::Duration::from_secs(30));
        assert_eq!(a.manager.leader_election_renew_deadline, std::time::Duration::from_secs(45));
        assert_eq!(a.manager.kube_api_timeout, std::time::Duration::from_secs(60));
        assert_eq!(a.artifacts.program_fs_addr, "0.0.0.0:9090".parse().unwrap());
        assert_eq!((a.logging.log_format, a.logging.filter()), (LogFormat::Text, "info"));
        let a = Cli::parse_from(["x", "--zap-devel"]).run;
        assert_eq!(a.logging.filter(), "debug");
        for (zap, level) in [("debug", "debug"), ("error", "error"), ("panic", "error"), ("2", "trace"), ("1", "debug")]
        {
            assert_eq!(Cli::parse_from(["x", "--zap-log-level", zap]).run.logging.filter(), level, "{zap}");
        }
        assert!(!Cli::parse_from(["x"]).run.manager.leader_elect);
        assert!(Cli::try_parse_from(["x", "--leader-election-lease-duration", "sixty"]).is_err());
        assert!(Cli::try_parse_from(["x", "--agent-image-pull-policy", "Sometimes"]).is_err());
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    #[test]
    fn defaults_and_pko_spellings_parse() {
        let a = Cli::parse_from(["x"]).run;
        assert_eq!(
            (a.runtime.runtime, a.metrics.metrics_secure, a.logging.log_format),
            (RuntimeKind::Pod, true, LogFormat::Text)
        );
        let a = Cli::parse_from(["x", "--metrics-secure=false", "--zap-encoder", "json", "--namespaces", "a,b"]).run;
        assert!(!a.metrics.metrics_secure);
        assert_eq!(a.logging.log_format, LogFormat::Json);
        assert_eq!(a.operations.namespaces, ["a", "b"]);
        assert_eq!(listen_address(":8081"), "0.0.0.0:8081");
        assert!(Cli::try_parse_from(["x", "--zap-log-level", "loud"]).is_err());
        assert_eq!(listen_address("127.0.0.1:1"), "127.0.0.1:1");
    }
}
