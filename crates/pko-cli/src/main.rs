//! `kubectl-pko`: installed on `PATH`, kubectl runs it as `kubectl pko …`.

use clap::{Parser, Subcommand};
use pko_cli::logs::{self, Endpoint};

/// The operator's kubectl plugin.
#[derive(Parser, Debug)]
#[command(name = "kubectl-pko", version, about = "Operate the Pulumi Kubernetes Operator (pko-rs) from kubectl")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print what Pulumi printed for a Stack's operations (the newest unless --update or --all).
    Logs(LogsArgs),
    /// Request a sync of a Stack now (PKO's pulumi.com/reconciliation-request annotation).
    Sync(AnnotateArgs),
    /// Cancel a Stack's running operation (pulumi.com/cancel-request): Ctrl-C on its agent, a hard stop
    /// after 30 s; the Stack then waits until its spec or source changes or `kubectl pko sync`.
    Cancel(AnnotateArgs),
}

#[derive(clap::Args, Debug)]
struct AnnotateArgs {
    /// The Stack: stack/<name> (or <name>).
    target: String,
    /// The Stack's namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
}

#[derive(clap::Args, Debug)]
struct LogsArgs {
    /// The Stack: stack/<name> (or <name>).
    target: String,
    /// The Stack's namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// Follow the operation until it ends (waiting for one when none is kept yet).
    #[arg(short = 'f', long)]
    follow: bool,
    /// The Update whose output to print (default: the newest operation).
    #[arg(long)]
    update: Option<String>,
    /// Print every kept operation, oldest first.
    #[arg(long, conflicts_with_all = ["update", "follow"])]
    all: bool,
    /// Prefix each line with its time (RFC 3339).
    #[arg(long)]
    timestamps: bool,
    /// The operator's metrics endpoint, e.g. https://localhost:8383 after
    /// `kubectl -n pulumi-kubernetes-operator port-forward deploy/<release>-controller-manager 8383`.
    #[arg(long, env = "PKO_ENDPOINT", default_value = "https://localhost:8383")]
    endpoint: String,
    /// Bearer token (default: the kubeconfig user's token).
    #[arg(long, env = "PKO_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// PEM file of the CA that signed the operator's metrics certificate.
    #[arg(long)]
    certificate_authority: Option<std::path::PathBuf>,
    /// Do not check the operator's certificate (its default one is self-signed).
    #[arg(long)]
    insecure_skip_tls_verify: bool,
}

fn main() -> std::process::ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let run = async {
        match cli.command {
            Command::Logs(a) => logs_command(a).await,
            Command::Sync(a) => annotate_command(a, pko_cli::annotate::SYNC, "sync requested").await,
            Command::Cancel(a) => annotate_command(a, pko_cli::annotate::CANCEL, "cancel requested").await,
        }
    };
    let result = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(anyhow::Error::from).and_then(|rt| rt.block_on(run));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The namespace and token the kubeconfig gives (either may be missing: no kubeconfig).
async fn kubeconfig() -> (Option<String>, Option<String>) {
    match kube::Config::infer().await {
        Ok(c) => {
            use kube::config::AuthInfo;
            let AuthInfo { token, token_file, .. } = c.auth_info;
            let token = token.map(|t| secrecy_expose(&t)).or_else(|| token_file.and_then(|f| std::fs::read_to_string(f).ok()).map(|t| t.trim().to_string()));
            (Some(c.default_namespace), token)
        }
        Err(_) => (None, None),
    }
}

fn secrecy_expose(t: &secrecy::SecretString) -> String {
    use secrecy::ExposeSecret;
    t.expose_secret().to_string()
}

async fn logs_command(a: LogsArgs) -> anyhow::Result<()> {
    let stack = logs::target(&a.target).map_err(anyhow::Error::msg)?;
    let (ctx_ns, ctx_token) = kubeconfig().await;
    let ns = a.namespace.or(ctx_ns).unwrap_or_else(|| "default".into());
    let endpoint = Endpoint::new(&a.endpoint, a.token.or(ctx_token), a.certificate_authority.as_deref(), a.insecure_skip_tls_verify)?;
    if a.all {
        let mut ops = endpoint.operations(&ns, &stack).await?;
        ops.reverse();
        for info in ops {
            println!("{}", logs::header(&info));
            if let Some(out) = endpoint.read(&ns, &stack, &info.update, None).await? {
                print(&out.lines, a.timestamps);
            }
        }
        return Ok(());
    }
    let info = loop {
        let ops = endpoint.operations(&ns, &stack).await?;
        match logs::choose(&ops, a.update.as_deref()).map_err(anyhow::Error::msg)? {
            Some(info) => break info,
            None if a.follow => tokio::time::sleep(logs::POLL).await,
            None => anyhow::bail!("no output of stack {ns}/{stack} is kept (no operation since it was stored, or it was given up: --output-operations)"),
        }
    };
    let mut after = None;
    loop {
        let Some(out) = endpoint.read(&ns, &stack, &info.update, after).await? else {
            anyhow::bail!("the output of update {} is no longer kept", info.update);
        };
        if after.is_none() && out.truncated {
            eprintln!("(earlier lines of update {} are not kept)", info.update);
        }
        print(&out.lines, a.timestamps);
        after = out.lines.last().map(|l| l.seq).or(after);
        if !a.follow || logs::finished(&out.lines) {
            return Ok(());
        }
        tokio::time::sleep(logs::POLL).await;
    }
}

fn print(lines: &[pko_queue::output::Line], timestamps: bool) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    for l in lines {
        let _ = writeln!(out, "{}", logs::render(l, timestamps));
    }
}

/// Sets `annotation` of the Stack to the current time, with the kubeconfig's identity.
async fn annotate_command(a: AnnotateArgs, annotation: &str, done: &str) -> anyhow::Result<()> {
    let stack = logs::target(&a.target).map_err(anyhow::Error::msg)?;
    let config = kube::Config::infer().await.map_err(|e| anyhow::anyhow!("kubeconfig: {e}"))?;
    let ns = a.namespace.unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config)?;
    let value = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos().to_string()).unwrap_or_default();
    pko_cli::annotate::annotate(client, &ns, &stack, annotation, &value).await?;
    println!("stack.pulumi.com/{stack} {done} ({annotation}={value})");
    Ok(())
}
