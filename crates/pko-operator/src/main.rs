//! `pko-operator`: the operator binary.
//!
//! Subcommands:
//! - `crds [--out DIR]`: writes the CustomResourceDefinitions (`<group>_<plural>.yaml`) to `DIR`
//!   (default `deploy/crds`), or prints them as one multi-document YAML stream with `--out -`;
//! - `api-docs`: prints the API reference (`docs/api.md`) generated from the types;
//! - `run`: the controllers (Program, Stack, Workspace, Update), the artifact server and the metrics and
//!   probe endpoint.
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
    let cli = Cli::parse();
    let format = match &cli.command {
        Command::Run(a) => a.logging.log_format,
        _ => LogFormat::Text,
    };
    init_logging(format);
    match cli.command {
        Command::Crds { out } => write_crds(&out)?,
        Command::ApiDocs => print!("{}", pko_api::reference::api_reference_markdown()),
        Command::Run(args) => {
            let client = kube::Client::try_default().await.context("connecting to the API server")?;
            let shutdown = CancellationToken::new();
            let running = pko_operator::run::Operator::new(client, *args)
                .local_agent_env(pko_operator::workspace::controller::local_agent_env(std::env::vars()))
                .start(shutdown.clone())
                .await?;
            tokio::spawn(async move {
                let (mut term, mut int) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
                    (Ok(t), Ok(i)) => (t, i),
                    _ => return,
                };
                tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
                tracing::info!("signal received: shutting down");
                shutdown.cancel();
            });
            running.wait().await;
        }
    }
    Ok(())
}

/// Logs to standard output (as PKO) in `format`; ANSI colours only when standard output is a terminal.
/// `RUST_LOG` filters (default `info`).
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
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
