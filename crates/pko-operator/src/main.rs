//! `pko-operator`: the operator binary.
//!
//! Subcommands:
//! - `crds [--out DIR]`: writes the CustomResourceDefinitions (`<group>_<plural>.yaml`) to `DIR`
//!   (default `deploy/crds`), or prints them as one multi-document YAML stream with `--out -`;
//! - `api-docs`: prints the API reference (`docs/api.md`) generated from the types;
//! - `run`: the controllers (Program, Stack, Workspace, Update), the artifact server and the metrics and
//!   probe endpoint.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// Command line of `pko-operator`.
#[derive(Parser, Debug)]
#[command(name = "pko-operator", version, about = "Kubernetes operator for Pulumi stacks (PKO v2-compatible)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Write the CustomResourceDefinitions of Stack, Program, Workspace and Update.
    Crds {
        /// Directory to write `<group>_<plural>.yaml` files to, or `-` for standard output.
        #[arg(long, default_value = "deploy/crds")]
        out: PathBuf,
    },
    /// Print the API reference (docs/api.md) generated from the types.
    ApiDocs,
    /// Run the controllers (Program, Stack, Workspace, Update) and the artifact server.
    Run(Box<RunArgs>),
}

/// Flags of `pko-operator run`.
#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Address of the artifact server (PKO `PROGRAM_FS_ADDR`).
    #[arg(long, default_value = "0.0.0.0:9090", env = "PROGRAM_FS_ADDR")]
    program_fs_addr: std::net::SocketAddr,
    /// `host:port` under which agents reach the artifact server (PKO `PROGRAM_FS_ADV_ADDR`); default: the
    /// listen address.
    #[arg(long, env = "PROGRAM_FS_ADV_ADDR")]
    program_fs_adv_addr: Option<String>,
    /// Where workspace agents run: `pod` (StatefulSets) or `local` (processes on this machine).
    #[arg(long, value_enum, default_value_t = RuntimeKind::Pod)]
    runtime: RuntimeKind,
    /// Image holding `/pko-agent` for the pod runtime.
    #[arg(long, default_value = "pko-agent:latest", env = "AGENT_IMAGE")]
    agent_image: String,
    /// The `pko-agent` binary for the local runtime.
    #[arg(long, default_value = "pko-agent")]
    agent_bin: PathBuf,
    /// Work directory of local agents.
    #[arg(long, default_value = "/tmp/pko-operator/agents")]
    local_work_dir: PathBuf,
    /// API server URL the local agents use.
    #[arg(long)]
    local_api_server: Option<String>,
    /// CA bundle of the API server for the local agents.
    #[arg(long)]
    local_ca_file: Option<PathBuf>,
    /// Reconciles each controller runs at once (PKO `MAX_CONCURRENT_RECONCILES`).
    #[arg(long, default_value_t = pko_operator::context::DEFAULT_RECONCILE_CONCURRENCY, env = "MAX_CONCURRENT_RECONCILES")]
    max_concurrent_reconciles: u16,
    /// Operations this replica drives at once.
    #[arg(long, default_value_t = 256)]
    max_operations: usize,
    /// Operations at once per workspace class (namespace, service account, image, pod template);
    /// 0: no limit beyond `--max-operations`.
    #[arg(long, default_value_t = 0)]
    max_operations_per_class: usize,
    /// The operator's own service account as `namespace/name`: agents in pods authenticate the operator
    /// with TokenRequest tokens of it (PKO: `serviceaccounts/token create` on itself). Required by the
    /// pod runtime; the install manifest sets it from the Downward API.
    #[arg(long, env = "OPERATOR_SERVICE_ACCOUNT")]
    service_account: Option<String>,
    /// Act only on objects of these namespaces (comma-separated; default: every namespace). An extension
    /// of ours: several operators can share a cluster by namespace.
    #[arg(long, value_delimiter = ',', env = "WATCH_NAMESPACES")]
    namespaces: Vec<String>,
    /// Address of the metrics and probe endpoint (`/metrics`, `/healthz`, `/readyz`); `0` turns it off
    /// (PKO `--metrics-bind-address`; its Helm chart uses port 8383).
    #[arg(long, default_value = "0.0.0.0:8383", env = "METRICS_BIND_ADDRESS")]
    metrics_bind_address: String,
    /// Serve `/metrics` over HTTPS to callers allowed `get` on the non-resource URL `/metrics`
    /// (TokenReview + SubjectAccessReview), as PKO does by default; `--metrics-secure=false` serves plain
    /// HTTP to anyone.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    metrics_secure: bool,
    /// Directory with `tls.crt` and `tls.key` for the secure metrics endpoint (controller-runtime's
    /// `CertDir`); default: a self-signed certificate made at start.
    #[arg(long)]
    metrics_cert_dir: Option<PathBuf>,
    /// Address of the probe endpoint (`/healthz`, `/readyz`; PKO `--health-probe-bind-address`); `0`
    /// turns it off.
    #[arg(long, default_value = "0.0.0.0:8081", env = "HEALTH_PROBE_BIND_ADDRESS")]
    health_probe_bind_address: String,
}

/// A listen address: `host:port`, or `:port` (every interface, as Go's flags write it).
fn listen_address(s: &str) -> String {
    if s.starts_with(':') { format!("0.0.0.0{s}") } else { s.to_string() }
}

/// Where workspace agents run.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
enum RuntimeKind {
    /// StatefulSet per Workspace.
    Pod,
    /// Agent processes on this machine (development, tests, `make demo`).
    Local,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into())).with_writer(std::io::stderr).init();
    let cli = Cli::parse();
    match cli.command {
        Command::Crds { out } => {
            let crds = pko_api::crds();
            if out.as_os_str() == "-" {
                for crd in &crds {
                    print!("---\n{}", pko_api::crd_yaml(crd));
                }
            } else {
                std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
                for crd in &crds {
                    let path = out.join(pko_api::crd_file_name(crd));
                    std::fs::write(&path, pko_api::crd_yaml(crd)).with_context(|| format!("writing {}", path.display()))?;
                    eprintln!("wrote {}", path.display());
                }
            }
        }
        Command::ApiDocs => print!("{}", pko_api::reference::api_reference_markdown()),
        Command::Run(a) => {
            use pko_operator::workspace::controller::{LocalRuntime, Runtime, WorkspaceController};
            let client = kube::Client::try_default().await.context("connecting to the API server")?;
            let listener = tokio::net::TcpListener::bind(a.program_fs_addr).await.with_context(|| format!("binding {}", a.program_fs_addr))?;
            let advertised_addr = a.program_fs_adv_addr.clone().unwrap_or_else(|| listener.local_addr().map(|x| x.to_string()).unwrap_or_default());
            let ownership: Arc<dyn pko_operator::ownership::Ownership> = if a.namespaces.is_empty() {
                Arc::new(pko_operator::ownership::SingleReplica)
            } else {
                Arc::new(pko_operator::ownership::Namespaces(a.namespaces.iter().cloned().collect()))
            };
            let ctx = Arc::new(pko_operator::context::Context {
                reconcile_concurrency: a.max_concurrent_reconciles,
                ..pko_operator::context::Context::new(client.clone(), advertised_addr, ownership)
            });
            let runtime = match a.runtime {
                RuntimeKind::Pod => Runtime::Pod(pko_operator::workspace::pod::PodRuntimeConfig { agent_image: a.agent_image.clone() }),
                RuntimeKind::Local => Runtime::Local(LocalRuntime::new(
                    a.agent_bin.clone(),
                    a.local_work_dir.clone(),
                    a.local_api_server.clone().context("--runtime local needs --local-api-server")?,
                    a.local_ca_file.clone().context("--runtime local needs --local-ca-file")?,
                    pko_operator::workspace::controller::local_agent_env(std::env::vars()),
                )),
            };
            tracing::info!(artifacts = %a.program_fs_addr, advertised = %ctx.advertised_addr, runtime = ?a.runtime, "operator starting");
            let agent_tokens = match (&a.service_account, a.runtime) {
                (Some(sa), _) => Some(sa.split_once('/').map(|(n, s)| (n.to_string(), s.to_string())).context("--service-account must be namespace/name")?),
                (None, RuntimeKind::Pod) => {
                    anyhow::bail!("--runtime pod needs --service-account namespace/name (env OPERATOR_SERVICE_ACCOUNT): agents in pods authenticate the operator with its tokens")
                }
                (None, RuntimeKind::Local) => None,
            };
            let handle = pko_operator::metrics::install_recorder();
            let metrics_server = if a.metrics_bind_address != "0" {
                let addr = listen_address(&a.metrics_bind_address);
                let l = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("binding --metrics-bind-address {addr}"))?;
                let security = if a.metrics_secure {
                    let tls = match &a.metrics_cert_dir {
                        Some(d) => axum_server::tls_rustls::RustlsConfig::from_pem_file(d.join("tls.crt"), d.join("tls.key"))
                            .await
                            .with_context(|| format!("reading {}/tls.crt and tls.key", d.display()))?,
                        None => pko_operator::metrics::self_signed_tls(std::env::var("POD_NAME").into_iter().collect()).await.context("making the metrics certificate")?,
                    };
                    pko_operator::metrics::Security::Secure { tls }
                } else {
                    pko_operator::metrics::Security::Insecure
                };
                tracing::info!(metrics = %l.local_addr()?, secure = a.metrics_secure, "metrics serving");
                Some(tokio::spawn(pko_operator::metrics::serve(l, client.clone(), ctx.ownership.clone(), handle, security)))
            } else {
                None
            };
            let probe_server = if a.health_probe_bind_address != "0" {
                let addr = listen_address(&a.health_probe_bind_address);
                let l = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("binding --health-probe-bind-address {addr}"))?;
                Some(tokio::spawn(pko_operator::metrics::serve_probes(l)))
            } else {
                None
            };
            let (programs, program_controller) = pko_operator::program_controller(ctx.clone());
            let artifacts = pko_operator::artifacts::ArtifactState { programs, ownership: ctx.ownership.clone() };
            let server = tokio::spawn(pko_operator::artifacts::serve(listener, artifacts));
            tokio::join!(program_controller, pko_operator::stack::controller::run(ctx.clone()), WorkspaceController::new(ctx.clone(), runtime).run(), {
                let updates = pko_operator::update::controller::UpdateController::new(ctx.clone(), a.max_operations);
                let updates = if a.max_operations_per_class > 0 { updates.with_class_limit(a.max_operations_per_class) } else { updates };
                let updates = match &agent_tokens {
                    Some((ns, sa)) => updates.with_agent_tokens(pko_operator::update::tokens::AgentTokens::new(client.clone(), ns.clone(), sa.clone())),
                    None => updates,
                };
                updates.run()
            },);
            server.abort();
            for server in metrics_server.into_iter().chain(probe_server) {
                server.abort();
            }
        }
    }
    Ok(())
}
