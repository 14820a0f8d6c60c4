//! `pko-agent serve`: the workspace agent. See the crate documentation of `pko_agent`.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use pko_agent::auth::{Auth, KubeAuth};
use pko_agent::runner::RunnerContext;
use pko_agent::sandbox::Sandboxes;
use pko_agent::service::{AgentConfig, AgentService};
use pko_agent::source::{CacheConfig, DownloadConfig, SourceCache};
use pko_agent::stack_cache::{Limits, StackCaches};
use pko_agent::supervise::Supervisor;
use pko_agent::values::ValueResolver;
use pko_proto::v1::agent_server::AgentServer;
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser, Debug)]
#[command(name = "pko-agent", version, about = "Workspace agent: runs Pulumi operations sent over gRPC")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve the agent API.
    Serve(Box<Serve>),
    /// Prepare a workspace pod's shared volume (the `fetch` init container, after PKO's): the dynamic environment file
    /// (`$PULUMI_ENV`) and the work directory. Sources are fetched per operation by `serve`, so there is nothing to
    /// clone here.
    Init(Init),
    /// Internal: runs one command of an operation so that every process it starts ends with it and with the agent
    /// (`pko_agent::supervise`).
    #[command(hide = true)]
    Supervise(Supervise),
}

/// `pko-agent supervise`.
#[derive(Parser, Debug)]
struct Supervise {
    /// The agent's pid: the supervisor starts nothing once its parent is no longer this process.
    #[arg(long)]
    parent: i32,
    /// The program and its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    command: Vec<std::ffi::OsString>,
}

/// `pko-agent init`.
#[derive(Parser, Debug)]
struct Init {
    /// The shared volume (PKO's `/share`).
    #[arg(long, default_value = "/share")]
    share: PathBuf,
}

/// Creates `<share>/.env` (empty when absent; an init container may have written it already) and `<share>/work`.
/// Errors: the path that could not be created.
fn init(a: &Init) -> anyhow::Result<()> {
    let env_file = a.share.join(".env");
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&env_file)
        .with_context(|| format!("creating {}", env_file.display()))?;
    let work = a.share.join("work");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    tracing::info!(share = %a.share.display(), "workspace volume prepared");
    Ok(())
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq)]
enum AuthMode {
    /// No authentication; only allowed on a loopback address.
    None,
    /// TokenReview + SubjectAccessReview (`use` on `workspaces/rpc`).
    Kube,
}

#[derive(Parser, Debug)]
struct Serve {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:50051", env = "PKO_AGENT_LISTEN")]
    listen: SocketAddr,
    /// Directory for cached sources.
    #[arg(long, default_value = "/tmp/pko-agent", env = "PKO_AGENT_WORK_DIR")]
    work_dir: PathBuf,
    /// The `pulumi` binary (default: `pulumi` on PATH).
    #[arg(long, default_value = "pulumi", env = "PKO_AGENT_PULUMI")]
    pulumi: PathBuf,
    /// Operations run at once.
    #[arg(long, default_value_t = 1)]
    capacity: usize,
    /// Seconds Pulumi gets to wind down after Ctrl-C (shutdown and Cancel) before it is killed.
    #[arg(long, default_value_t = 600)]
    grace_seconds: u64,
    /// Seconds a finished operation stays attachable.
    #[arg(long, default_value_t = 600)]
    retention_seconds: u64,
    /// Events buffered per operation.
    #[arg(long, default_value_t = 20_000)]
    max_events: usize,
    /// Size of the source cache in bytes.
    #[arg(long, default_value_t = 2 << 30)]
    cache_max_bytes: u64,
    /// Largest uncompressed artifact in bytes (PKO: FLUX_MAX_UNTAR_SIZE_BYTES, default 100 MiB; a negative value, PKO's
    /// −1, means no limit).
    #[arg(long, default_value_t = 100 << 20, env = "FLUX_MAX_UNTAR_SIZE_BYTES", allow_negative_numbers = true)]
    max_artifact_bytes: i64,
    /// Seconds to establish an artifact download's connection.
    #[arg(long, default_value_t = 10)]
    artifact_connect_timeout_seconds: u64,
    /// Seconds an artifact server may stay silent (waiting for the response or its next bytes).
    #[arg(long, default_value_t = 30)]
    artifact_read_timeout_seconds: u64,
    /// Seconds an artifact download may take in all: every attempt, and the waits between them.
    #[arg(long, default_value_t = 300)]
    artifact_timeout_seconds: u64,
    /// Retries of a failed artifact download (connection errors, timeouts, HTTP 429/5xx; PKO: 3).
    #[arg(long, default_value_t = 3)]
    artifact_retries: u32,
    /// Pulumi log verbosity for operations (PKO `pulumiLogLevel`); 0 disables verbose logging.
    #[arg(long, default_value_t = 0)]
    pulumi_log_level: u32,
    /// A dotenv file (`NAME=value` lines) read before each operation; its variables reach Pulumi over the agent's own
    /// and the Workspace's `env` (PKO's `--env-file /share/.env`, 2.2 dynamic environment variables: containers of the
    /// workspace pod append to `$PULUMI_ENV`). A missing file adds nothing; a malformed one fails the operation naming
    /// the file.
    #[arg(long)]
    env_file: Option<PathBuf>,
    /// A symbolic link pointed at the project directory of each operation before Pulumi runs (PKO's `/share/workspace`,
    /// for sidecars that read the program); with operations at once, the latest's.
    #[arg(long)]
    workspace_link: Option<PathBuf>,
    /// Each operation in directories of its own (a copy of the source, `HOME`, `PULUMI_HOME`, `TMPDIR`), removed when
    /// it ends, so nothing of one Stack's operation reaches the next on a pooled agent (`pko_agent::sandbox`). `false`:
    /// operations run in the cached source with the agent's `HOME` (a Workspace's own agent, as PKO's pod, which keeps
    /// language caches across its operations).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    isolate_operations: bool,
    /// Bytes the caches a Stack's isolated operations keep between them (`pko_agent::stack_cache`: TypeScript's
    /// compile cache, Go's build and module caches) may hold together on this agent; the least recently used Stacks'
    /// go first.
    #[arg(long, default_value_t = pko_agent::stack_cache::MAX_BYTES)]
    stack_cache_max_bytes: u64,
    /// A new revision's `node_modules` starts as a copy of an earlier prepared revision's when their package
    /// manifests and lockfiles are byte-identical (its seal verified first), so `pulumi install` only checks it
    /// (`pko_agent::seed`). `false`: every revision installs from nothing.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    seed_dependency_trees: bool,
    /// Seconds an operation waits for the holders of its stack's backend lock that still run on this host (a killed
    /// agent's `pulumi` being stopped, another operation ending) before it reports `UPDATE_CONFLICT`. Holders on other
    /// hosts are never waited for.
    #[arg(long, default_value_t = 30)]
    lock_wait_seconds: u64,
    /// How each operation's lines (Pulumi's output, its engine events as Pulumi prints them, the agent's own) are
    /// written to standard output, each with the operation's namespace, stack, update and type: `text` or `json` (one
    /// object per line). PKO's `AGENT_JSON_LOG=true` means `json`.
    #[arg(long, value_enum, default_value_t = pko_agent::output::Format::Text)]
    log_format: pko_agent::output::Format,
    /// Caller authentication.
    #[arg(long, value_enum, default_value_t = AuthMode::Kube)]
    auth: AuthMode,
    /// Token audience for `--auth kube` (PKO: `<workspace>.<namespace>`).
    #[arg(long)]
    kube_audience: Option<String>,
    /// Namespace of the workspace; also where Secret and ConfigMap references are read.
    #[arg(long, env = "POD_NAMESPACE")]
    kube_workspace_namespace: Option<String>,
    /// Name of the workspace (for the SubjectAccessReview).
    #[arg(long)]
    kube_workspace_name: Option<String>,
    /// Kubeconfig of the agent's own identity (the local runtime passes one). Without it: the pod's service account in
    /// a pod, else the usual `KUBECONFIG`/`~/.kube/config` inference. Never taken from the environment in a pod, so a
    /// Workspace's `env` cannot redirect the agent's identity.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Shut down after this many seconds without an operation or a Run/Attach/Cancel call (0: never). A pooled agent's
    /// backstop: its operator stops it when idle, but an agent whose operator died must not stay forever.
    #[arg(long, default_value_t = 0)]
    exit_when_idle_seconds: u64,
    /// HOLLOW AGENT, for control-plane load tests only (kubemark-style): every operation succeeds after this many
    /// seconds without running Pulumi. Never a default; never used by a functional test.
    #[arg(long)]
    hollow_seconds: Option<f64>,
    /// PEM certificate for TLS (with --tls-key).
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// PEM private key for TLS.
    #[arg(long)]
    tls_key: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // the supervisor blocks signals and waits for them: it must run before any runtime thread exists
    if let Cmd::Supervise(s) = &cli.command {
        std::process::exit(pko_agent::supervise::run(s.parent, &s.command));
    }
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Cmd::Serve(args) => serve(*args).await,
        Cmd::Init(args) => init(&args),
        Cmd::Supervise(_) => unreachable!("handled before the runtime starts"),
    }
}

/// The agent's own `PULUMI_HOME` (else `$HOME/.pulumi`, Pulumi's default), whose plugin cache isolated operations
/// share.
///
/// Errors: neither `PULUMI_HOME` nor `HOME` is set.
fn shared_pulumi_home() -> anyhow::Result<PathBuf> {
    if let Some(h) = std::env::var_os("PULUMI_HOME").filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(h));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .context("isolated operations need PULUMI_HOME or HOME for the shared plugin cache")?;
    Ok(PathBuf::from(home).join(".pulumi"))
}

/// The agent's Kubernetes client: from `kubeconfig` when given, in-cluster in a pod, else inferred.
async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .with_context(|| format!("reading --kubeconfig {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => kube::Config::incluster()?,
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(config)?)
}

/// What the runner needs, from the flags: the supervised Pulumi CLI, the source cache, the per-operation directories
/// (`--isolate-operations`), the value resolver of `namespace`.
///
/// Errors: the agent's own executable, the work directory or the shared plugin cache cannot be had.
fn runner_context(a: &Serve, kube: Option<kube::Client>, namespace: String) -> anyhow::Result<RunnerContext> {
    let download = DownloadConfig {
        connect_timeout: Duration::from_secs(a.artifact_connect_timeout_seconds),
        read_timeout: Duration::from_secs(a.artifact_read_timeout_seconds),
        total_timeout: Duration::from_secs(a.artifact_timeout_seconds),
        retries: a.artifact_retries,
    };
    let pulumi = pko_agent::pulumi::Cli {
        bin: a.pulumi.clone(),
        supervisor: Some(Supervisor::current().context("the agent's own executable (the supervisor)")?),
    };
    let cache = CacheConfig {
        root: a.work_dir.join("sources"),
        max_bytes: a.cache_max_bytes,
        max_artifact_bytes: u64::try_from(a.max_artifact_bytes).unwrap_or(u64::MAX),
        download,
        pulumi: pulumi.clone(),
        seed_dependency_trees: a.seed_dependency_trees,
    };
    let sources = SourceCache::new(cache).with_context(|| format!("creating {}", a.work_dir.display()))?;
    let sandboxes = if a.isolate_operations {
        let root = a.work_dir.join("ops");
        let sb = Sandboxes::new(root.clone(), &shared_pulumi_home()?)
            .with_context(|| format!("preparing {}", root.display()))?;
        Some(sb)
    } else {
        None
    };
    let stack_caches = match &sandboxes {
        Some(_) => {
            let root = a.work_dir.join("stacks");
            let limits = Limits { bytes: a.stack_cache_max_bytes, ..Limits::default() };
            let c = StackCaches::new(root.clone(), limits).with_context(|| format!("preparing {}", root.display()))?;
            Some(Arc::new(c))
        }
        None => None,
    };
    Ok(RunnerContext {
        pulumi,
        sandboxes,
        stack_caches,
        lock_wait: Duration::from_secs(a.lock_wait_seconds),
        env: Default::default(),
        sources: Arc::new(sources),
        values: ValueResolver::new(kube, namespace),
        known_stacks: Default::default(),
        secrets_providers: Default::default(),
        log_level: a.pulumi_log_level,
        env_file: a.env_file.clone(),
        workspace_link: a.workspace_link.clone(),
        pulumi_version: Default::default(),
        hollow: a.hollow_seconds.map(|s| Duration::from_secs_f64(s.max(0.0))),
    })
}

/// How the agent authenticates its callers (`--auth`), with the Kubernetes client when it has one.
///
/// Errors: `--auth kube` without Kubernetes access or `--kube-workspace-name`; `--auth none` off loopback.
async fn authentication(a: &Serve, namespace: &str) -> anyhow::Result<(Auth, Option<kube::Client>)> {
    let kube = match kube_client(a.kubeconfig.as_deref()).await {
        Ok(c) => Some(c),
        Err(e) if a.auth == AuthMode::None => {
            tracing::warn!("no Kubernetes access ({e}); Secret and ConfigMap references will fail");
            None
        }
        Err(e) => return Err(e).context("--auth kube needs Kubernetes access"),
    };
    let auth = match (a.auth, &kube) {
        (AuthMode::None, _) if !a.listen.ip().is_loopback() => {
            bail!("--auth none is only allowed on a loopback address, not {}", a.listen)
        }
        (AuthMode::None, _) => Auth::None,
        (AuthMode::Kube, Some(client)) => {
            let ws = a.kube_workspace_name.clone().context("--auth kube needs --kube-workspace-name")?;
            let audience = a.kube_audience.clone().unwrap_or_else(|| pko_proto::workspace_audience(namespace, &ws));
            Auth::Kube(Arc::new(KubeAuth::new(client.clone(), audience, namespace.to_string(), ws)))
        }
        (AuthMode::Kube, None) => bail!("--auth kube needs Kubernetes access"),
    };
    Ok((auth, kube))
}

/// On SIGTERM or SIGINT: drain (a running Pulumi gets Ctrl-C); on a second: kill Pulumi.
fn on_signals(service: AgentService) -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::info!("signal received: draining (a second signal kills pulumi)");
        service.begin_shutdown();
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::warn!("second signal: killing pulumi");
        service.kill_all();
    });
    Ok(())
}

/// Drains the agent once it has been idle for `limit` (`--exit-when-idle-seconds`).
fn exit_when_idle(service: AgentService, limit: Duration) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if service.idle_for() >= limit {
                tracing::info!(seconds = limit.as_secs(), "idle: shutting down (--exit-when-idle-seconds)");
                service.begin_shutdown();
                return;
            }
        }
    });
}

async fn serve(a: Serve) -> anyhow::Result<()> {
    let namespace = a.kube_workspace_namespace.clone().unwrap_or_else(|| "default".into());
    let (auth, kube) = authentication(&a, &namespace).await?;
    let ctx = runner_context(&a, kube, namespace)?;
    if let Some(s) = a.hollow_seconds {
        tracing::warn!(seconds = s, "HOLLOW AGENT: operations are simulated, no Pulumi runs (load tests only)");
    }
    let service = AgentService::new(
        AgentConfig {
            capacity: a.capacity.max(1),
            grace: Duration::from_secs(a.grace_seconds),
            log_format: pko_agent::output::Format::chosen(
                a.log_format,
                std::env::var("AGENT_JSON_LOG").ok().as_deref(),
            ),
        },
        ctx,
        auth,
        Duration::from_secs(a.retention_seconds),
        a.max_events,
    );

    on_signals(service.clone())?;
    if a.exit_when_idle_seconds > 0 {
        exit_when_idle(service.clone(), Duration::from_secs(a.exit_when_idle_seconds));
    }

    let mut builder = tonic::transport::Server::builder();
    if let (Some(cert), Some(key)) = (&a.tls_cert, &a.tls_key) {
        let identity = tonic::transport::Identity::from_pem(std::fs::read(cert)?, std::fs::read(key)?);
        builder = builder.tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))?;
    }
    let listener = tokio::net::TcpListener::bind(a.listen).await.with_context(|| format!("binding {}", a.listen))?;
    let local = listener.local_addr()?;
    // The first line on stdout is the address (tests and the local runtime read it, as Pulumi plugins do).
    println!("{}{local}", pko_proto::LISTENING_ON);
    tracing::info!(%local, auth = ?a.auth, capacity = a.capacity, "agent serving");
    let drained = service.clone();
    let deadline = service.clone();
    let server = builder
        .add_service(
            AgentServer::new(service)
                .max_decoding_message_size(pko_proto::MAX_REQUEST_MESSAGE_BYTES)
                .max_encoding_message_size(pko_proto::MAX_AGENT_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), async move {
            drained.drained().await
        });
    tokio::select! {
        r = server => r?,
        // Clients that keep idle connections open must not hold the pod past its drain.
        _ = async move { deadline.drained().await; tokio::time::sleep(Duration::from_secs(3)).await } => {
            tracing::info!("drained; closing remaining connections");
        }
    }
    tracing::info!("agent stopped");
    Ok(())
}
