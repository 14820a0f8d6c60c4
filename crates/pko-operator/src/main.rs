//! `pko-operator`: the operator binary.
//!
//! Subcommands:
//! - `crds [--out DIR]`: writes the CustomResourceDefinitions (`<group>_<plural>.yaml`) to `DIR` (default
//!   `deploy/crds`), or prints them as one multi-document YAML stream with `--out -`;
//! - `api-docs`: prints the API reference (`docs/api.md`) generated from the types;
//! - `run`: the controllers (Program, Stack, Workspace, Update), the artifact server and the metrics and probe
//!   endpoint. `run` is also what PKO's deployment calls: flags alone (`pko-operator --leader-elect …`), or
//!   `/manager` first as PKO's manifest passes it, mean `run`.
#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use pko_operator::args::LogFormat;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

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
    Run(Box<pko_operator::args::RunArgs>),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse_from(pko_style(std::env::args_os().collect()));
    let (format, level) = match &cli.command {
        Command::Run(a) => (a.logging.log_format, a.logging.filter().to_string()),
        _ => (LogFormat::Text, "info".into()),
    };
    init_logging(format, &level);
    match cli.command {
        Command::Crds { out } => write_crds(&out)?,
        Command::ApiDocs => print!("{}", pko_api::reference::api_reference_markdown()),
        Command::Run(args) => {
            // requests time out after --kube-api-timeout (PKO's KUBE_API_TIMEOUT); watches do not
            let mut config = kube::Config::infer().await.context("reading the API server's configuration")?;
            let timeout = Some(args.manager.kube_api_timeout);
            (config.connect_timeout, config.write_timeout) = (timeout, timeout);
            let watch_client = kube::Client::try_from(config.clone()).context("connecting to the API server")?;
            config.read_timeout = timeout;
            let client = kube::Client::try_from(config).context("connecting to the API server")?;
            let shutdown = CancellationToken::new();
            let leadership = leader_election(&client, &args, &shutdown).await?;
            if shutdown.is_cancelled() {
                return Ok(());
            }
            let running = pko_operator::run::Operator::new(client, *args)
                .watch_client(watch_client)
                .local_agent_env(pko_operator::agents::local::local_agent_env(std::env::vars()))
                .start(shutdown.clone())
                .await?;
            let lost = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let mut holding = None;
            if let Some(mut l) = leadership {
                let (shutdown, lost) = (shutdown.clone(), lost.clone());
                holding = Some(tokio::spawn(async move {
                    tokio::select! {
                        _ = l.lost() => {
                            // as controller-runtime: a replica that lost the Lease stops acting at once
                            tracing::error!("leader election lost: stopping");
                            lost.store(true, std::sync::atomic::Ordering::SeqCst);
                            shutdown.cancel();
                        }
                        _ = shutdown.cancelled() => l.release().await,
                    }
                }));
            }
            let stop = shutdown.clone();
            tokio::spawn(async move {
                let (mut term, mut int) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
                    (Ok(t), Ok(i)) => (t, i),
                    _ => return,
                };
                tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
                tracing::info!("signal received: shutting down");
                stop.cancel();
            });
            running.wait().await;
            // the Lease is released after the controllers stopped (the successor starts clean)
            if let Some(h) = holding {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(10), h).await;
            }
            if lost.load(std::sync::atomic::Ordering::SeqCst) {
                anyhow::bail!("leader election lost");
            }
        }
    }
    Ok(())
}

/// PKO's deployment runs the manager with flags only, `/manager` first (`args: [/manager, --leader-elect, …]`): both
/// mean `run`. Anything else is left as it is. Pure.
fn pko_style(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let is_manager = |a: &std::ffi::OsString| std::path::Path::new(a).file_name().is_some_and(|n| n == "manager");
    if args.get(1).is_some_and(is_manager) {
        args[1] = "run".into();
    } else if args.get(1).is_some_and(|a| a.to_string_lossy().starts_with("--") && a != "--help" && a != "--version")
        || args.first().is_some_and(is_manager)
    {
        args.insert(1, "run".into());
    }
    args
}

/// `--leader-elect` outside a fleet: waits for the leader Lease (None when not asked, in a fleet, or shut down while
/// waiting).
async fn leader_election(
    client: &kube::Client,
    args: &pko_operator::args::RunArgs,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<pko_operator::leader::Leadership>> {
    if !args.manager.leader_elect {
        return Ok(None);
    }
    if args.fleet.fleet {
        tracing::info!("--leader-elect with --fleet: every replica is active; shard Leases decide what each acts on");
        return Ok(None);
    }
    let namespace = args.fleet.fleet_namespace.clone().unwrap_or_else(|| client.default_namespace().to_string());
    let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "pko".into());
    let identity = format!("{}_{}", args.fleet.replica_id.clone().unwrap_or(host), std::process::id());
    let timing = pko_operator::leader::Timing {
        lease_duration: args.manager.leader_election_lease_duration,
        renew_deadline: args.manager.leader_election_renew_deadline,
        retry_period: args.manager.leader_election_retry_period,
    };
    // probes answer while this replica waits (a rolling update needs the new pod Ready before the old
    // one stops and releases the Lease); the operator binds the address again once it leads
    let standby = CancellationToken::new();
    let probes = match args.metrics.health_probe_bind_address.as_str() {
        "0" => None,
        addr => {
            let l = tokio::net::TcpListener::bind(pko_operator::args::listen_address(addr))
                .await
                .with_context(|| format!("binding --health-probe-bind-address {addr}"))?;
            Some(tokio::spawn(pko_operator::metrics::serve_standby_probes(l, standby.clone())))
        }
    };
    let waiting = pko_operator::leader::acquire(client.clone(), &namespace, &identity, timing, shutdown);
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let led = tokio::select! {
        r = waiting => r.context("leader election (--leader-elect): the Lease operator.pulumi.com"),
        _ = tokio::signal::ctrl_c() => { shutdown.cancel(); Ok(None) }
        _ = term.recv() => { shutdown.cancel(); Ok(None) }
    };
    standby.cancel();
    if let Some(p) = probes {
        let _ = p.await;
    }
    led
}

/// Logs to standard output (as PKO) in `format` at `level` (a `tracing` filter); ANSI colours only when standard output
/// is a terminal. `RUST_LOG` overrides the level.
fn init_logging(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| level.into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stdout);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_ansi(std::io::stdout().is_terminal()).init(),
    }
}

/// `pko-operator crds --out DIR` (or `-` for standard output).
fn write_crds(out: &std::path::Path) -> anyhow::Result<()> {
    let crds = pko_api::crds();
    if out.as_os_str() == "-" {
        for crd in &crds {
            print!("---\n{}", pko_api::crd_yaml(crd));
        }
        return Ok(());
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for crd in &crds {
        let path = out.join(pko_api::crd_file_name(crd));
        std::fs::write(&path, pko_api::crd_yaml(crd)).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        pko_style(a.iter().map(std::ffi::OsString::from).collect())
            .into_iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn pko_deployments_invocations_mean_run() {
        assert_eq!(args(&["pko-operator", "/manager", "--leader-elect"]), ["pko-operator", "run", "--leader-elect"]);
        assert_eq!(args(&["/manager", "--leader-elect"]), ["/manager", "run", "--leader-elect"]);
        assert_eq!(args(&["pko-operator", "--leader-elect"]), ["pko-operator", "run", "--leader-elect"]);
        assert_eq!(args(&["pko-operator", "run", "--fleet"]), ["pko-operator", "run", "--fleet"]);
        assert_eq!(args(&["pko-operator", "crds", "--out", "-"]), ["pko-operator", "crds", "--out", "-"]);
        assert_eq!(args(&["pko-operator", "--help"]), ["pko-operator", "--help"]);
        assert!(
            Cli::try_parse_from(pko_style(
                ["/manager", "--leader-elect", "--zap-log-level=info"].iter().map(std::ffi::OsString::from).collect()
            ))
            .is_ok()
        );
    }
}
