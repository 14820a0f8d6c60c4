//! `kubectl-pko`: installed on `PATH`, kubectl runs it as `kubectl pko …`.

use clap::{Parser, Subcommand};
use pko_cli::logs::{self, Endpoint};
use pko_queue::tail;

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
    /// Per Stack: Ready or why not, revision, last and current operation, shard, owning replica, pool.
    Status(StatusArgs),
    /// The fleet's replicas: live or not, shards held and their epochs, from the fleet's Leases.
    Fleet(FleetArgs),
    /// Receivers (push webhooks): path, readiness, the last delivery and the Stacks it woke.
    Receivers(ReceiversArgs),
    /// Request a sync of a Stack now (PKO's pulumi.com/reconciliation-request annotation).
    Sync(AnnotateArgs),
    /// Cancel a Stack's running operation (pulumi.com/cancel-request): Ctrl-C on its agent, a hard stop after 30 s; the
    /// Stack then waits until its spec or source changes or `kubectl pko sync`.
    Cancel(AnnotateArgs),
    /// Approve the plan a Stack waits on (spec.approval.mode: manual): sets pulumi.com/approve-plan to its id, which
    /// runs `pulumi up --plan` with exactly that plan. Refused unless it is the pending plan.
    Approve(ApproveArgs),
    /// A StackRollout: `status` (phase, revision, steps), `pause`, `resume` (also a halted one) or `abort`.
    Rollout(RolloutArgs),
    /// Show a Stack's saved plan (id, state, changes, what it was made from) and the preview that saved it.
    Plan(PlanArgs),
    /// Release the Pulumi backend locks a Stack's last update failed on (pulumi.com/unlock-request), when the operator
    /// finds every holder dead; prints its verdict, exits 1 when refused.
    Unlock(UnlockArgs),
}

#[derive(clap::Args, Debug)]
struct ReceiversArgs {
    /// The namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    all_namespaces: bool,
}

#[derive(clap::Args, Debug)]
struct ApproveArgs {
    #[command(flatten)]
    stack: AnnotateArgs,
    /// The plan's id (`status.plan.id`, printed by `kubectl pko plan` and in the AwaitingApproval condition).
    #[arg(long)]
    plan: String,
}

#[derive(clap::Args, Debug)]
struct RolloutArgs {
    /// `status`, `pause`, `resume` or `abort`.
    #[arg(value_parser = ["status", "pause", "resume", "abort"])]
    verb: String,
    /// The StackRollout: stackrollout/<name> (or <name>).
    target: String,
    /// Its namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
}

#[derive(clap::Args, Debug)]
struct PlanArgs {
    #[command(flatten)]
    stack: AnnotateArgs,
    /// Only the plan's summary, not the preview's output.
    #[arg(long)]
    summary: bool,
}

#[derive(clap::Args, Debug)]
struct UnlockArgs {
    #[command(flatten)]
    stack: AnnotateArgs,
    /// How long to wait for the operator's verdict (seconds).
    #[arg(long, default_value_t = 60)]
    timeout: u64,
}

#[derive(clap::Args, Debug)]
struct StatusArgs {
    /// One Stack: stack/<name> (or <name>); all of the namespace without it.
    target: Option<String>,
    /// The namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    all_namespaces: bool,
    /// Output: a table (default), `wide` (with the message), `json` or `yaml`.
    #[arg(short = 'o', long, value_parser = ["wide", "json", "yaml"])]
    output: Option<String>,
    /// Namespace of the fleet's Leases (the operator's `--fleet-namespace`); default: the one fleet found in the
    /// namespaces you may list, else `pko-system`.
    #[arg(long, env = "PKO_FLEET_NAMESPACE")]
    fleet_namespace: Option<String>,
    /// The fleet's name (the operator's `--fleet-name`); default: the one fleet found, else `pko`.
    #[arg(long, env = "PKO_FLEET_NAME")]
    fleet_name: Option<String>,
}

#[derive(clap::Args, Debug)]
struct FleetArgs {
    /// Namespace of the fleet's Leases (the operator's `--fleet-namespace`); default: the one fleet found in the
    /// namespaces you may list, else `pko-system`.
    #[arg(long, env = "PKO_FLEET_NAMESPACE")]
    fleet_namespace: Option<String>,
    /// The fleet's name (the operator's `--fleet-name`); default: the one fleet found, else `pko`.
    #[arg(long, env = "PKO_FLEET_NAME")]
    fleet_name: Option<String>,
    /// Output: a table (default), `json` or `yaml`.
    #[arg(short = 'o', long, value_parser = ["json", "yaml"])]
    output: Option<String>,
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
    /// Read the operator's metrics port instead of its aggregated API (clusters without the chart's APIService), e.g.
    /// https://localhost:8383 after `kubectl -n pko-system port-forward deploy/<release> 8383`.
    #[arg(long, env = "PKO_ENDPOINT")]
    endpoint: Option<String>,
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
            Command::Status(a) => status_command(a).await,
            Command::Fleet(a) => fleet_command(a).await,
            Command::Receivers(a) => receivers_command(a).await,
            Command::Sync(a) => annotate_command(a, pko_cli::annotate::SYNC, "sync requested").await,
            Command::Cancel(a) => annotate_command(a, pko_cli::annotate::CANCEL, "cancel requested").await,
            Command::Unlock(a) => unlock_command(a).await,
            Command::Approve(a) => approve_command(a).await,
            Command::Plan(a) => plan_command(a).await,
            Command::Rollout(a) => rollout_command(a).await,
        }
    };
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(run));
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
            let token = token
                .map(|t| secrecy_expose(&t))
                .or_else(|| token_file.and_then(|f| std::fs::read_to_string(f).ok()).map(|t| t.trim().to_string()));
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
    let req = tail::Request {
        stack: format!("{ns}/{stack}"),
        update: a.update,
        follow: a.follow,
        all: a.all,
        timestamps: a.timestamps,
    };
    let Some(endpoint) = a.endpoint else {
        let mut config = kube::Config::infer().await?;
        // a follower waits as long as the operation is quiet
        config.read_timeout = None;
        return logs::stream_via_api(&kube::Client::try_from(config)?, &ns, &stack, &req).await;
    };
    let endpoint = Endpoint::new(
        &endpoint,
        a.token.or(ctx_token),
        a.certificate_authority.as_deref(),
        a.insecure_skip_tls_verify,
    )?;
    let ops = tail::chosen(&endpoint, &req).await?;
    let mut stdout = |text: String| {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{text}").and_then(|()| out.flush()).is_ok()
    };
    Ok(tail::show(&endpoint, &req, ops, &mut stdout).await?)
}

/// A client with the kubeconfig's identity, and the namespace to use: `namespace`, else the context's.
///
/// Errors: no kubeconfig to be had.
async fn connect(namespace: Option<String>) -> anyhow::Result<(kube::Client, String)> {
    let config = kube::Config::infer().await.map_err(|e| anyhow::anyhow!("kubeconfig: {e}"))?;
    let ns = namespace.unwrap_or_else(|| config.default_namespace.clone());
    Ok((kube::Client::try_from(config)?, ns))
}

/// Sets `annotation` of the Stack to the current time, with the kubeconfig's identity.
async fn annotate_command(a: AnnotateArgs, annotation: &str, done: &str) -> anyhow::Result<()> {
    let stack = logs::target(&a.target).map_err(anyhow::Error::msg)?;
    let (client, ns) = connect(a.namespace).await?;
    let value = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos().to_string())
        .unwrap_or_default();
    pko_cli::annotate::annotate(client, &ns, &stack, annotation, &value).await?;
    println!("stack.pulumi.com/{stack} {done} ({annotation}={value})");
    Ok(())
}

/// The Stack `a` names, as JSON, with the client and namespace it was read with.
async fn read_stack(a: &AnnotateArgs) -> anyhow::Result<(kube::Client, String, String, serde_json::Value)> {
    let stack = logs::target(&a.target).map_err(anyhow::Error::msg)?;
    let (client, ns) = connect(a.namespace.clone()).await?;
    let api: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(client.clone(), &ns, &pko_cli::annotate::stacks());
    let Some(found) = api.get_opt(&stack).await? else { anyhow::bail!("stack {ns}/{stack} not found") };
    Ok((client, ns, stack, serde_json::to_value(found)?))
}

/// Approves the Stack's pending plan when `--plan` names it.
async fn approve_command(a: ApproveArgs) -> anyhow::Result<()> {
    let (client, ns, stack, found) = read_stack(&a.stack).await?;
    pko_cli::approve::check(&found, &a.plan).map_err(anyhow::Error::msg)?;
    pko_cli::annotate::annotate(client, &ns, &stack, pko_cli::approve::APPROVE_PLAN, &a.plan).await?;
    println!("stack.pulumi.com/{stack} plan {} approved ({}={})", a.plan, pko_cli::approve::APPROVE_PLAN, a.plan);
    Ok(())
}

/// Prints the Stack's plan, then what the preview that saved it printed.
async fn plan_command(a: PlanArgs) -> anyhow::Result<()> {
    let (client, ns, stack, found) = read_stack(&a.stack).await?;
    let Some(text) = pko_cli::approve::describe(&found) else {
        anyhow::bail!("stack {ns}/{stack} has no saved plan (spec.approval.mode: manual saves one per change)")
    };
    println!("{text}");
    let update = found["status"]["plan"]["update"].as_str().map(str::to_string);
    if a.summary || update.is_none() {
        return Ok(());
    }
    println!();
    let req = tail::Request { stack: format!("{ns}/{stack}"), update, follow: false, all: false, timestamps: false };
    logs::stream_via_api(&client, &ns, &stack, &req).await
}

/// Prints a StackRollout, or pauses, resumes or aborts it.
async fn rollout_command(a: RolloutArgs) -> anyhow::Result<()> {
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    let name = a.target.strip_prefix("stackrollout/").unwrap_or(&a.target).to_string();
    let (client, ns) = connect(a.namespace.clone()).await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client, &ns, &pko_cli::rollout::rollouts());
    if a.verb != "status" {
        let value = k8s_openapi::jiff::Timestamp::now().as_nanosecond().to_string();
        let patch = pko_cli::rollout::control(&a.verb, &value).map_err(anyhow::Error::msg)?;
        let params = PatchParams { field_manager: Some("kubectl-pko".into()), ..Default::default() };
        match api.patch(&name, &params, &Patch::Merge(patch)).await {
            Ok(_) => println!("stackrollout.pulumi.com/{name}: {} requested", a.verb),
            Err(kube::Error::Api(e)) if e.code == 404 => anyhow::bail!("stackrollout {ns}/{name} not found"),
            Err(e) => return Err(e.into()),
        }
        return Ok(());
    }
    let Some(found) = api.get_opt(&name).await? else { anyhow::bail!("stackrollout {ns}/{name} not found") };
    println!("{}", pko_cli::rollout::describe(&serde_json::to_value(found)?));
    Ok(())
}

/// Sets the Stack's unlock request, then waits for the operator's verdict (its event) and prints it.
async fn unlock_command(a: UnlockArgs) -> anyhow::Result<()> {
    let stack = logs::target(&a.stack.target).map_err(anyhow::Error::msg)?;
    let (client, ns) = connect(a.stack.namespace.clone()).await?;
    let now = k8s_openapi::jiff::Timestamp::now();
    let value = now.as_nanosecond().to_string();
    pko_cli::annotate::annotate(client.clone(), &ns, &stack, pko_cli::annotate::UNLOCK, &value).await?;
    println!(
        "stack.pulumi.com/{stack} unlock requested ({}={value}); waiting for the operator's verdict",
        pko_cli::annotate::UNLOCK
    );
    let events: kube::Api<k8s_openapi::api::core::v1::Event> = kube::Api::namespaced(client, &ns);
    let selector = format!("involvedObject.name={stack},involvedObject.kind=Stack");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(a.timeout);
    loop {
        let list = events.list(&kube::api::ListParams::default().fields(&selector)).await?;
        let json: Vec<serde_json::Value> =
            list.items.into_iter().filter_map(|e| serde_json::to_value(e).ok()).collect();
        match pko_cli::annotate::unlock_verdict(&json, &now.to_string()) {
            Some((true, note)) => {
                println!("accepted: {note}");
                return Ok(());
            }
            Some((false, note)) => anyhow::bail!("refused: {note}"),
            None if std::time::Instant::now() >= deadline => {
                anyhow::bail!(
                    "no verdict within {} s: is the operator running and does it own stack {ns}/{stack}? (`kubectl pko \
                        status {stack}`)",
                    a.timeout
                )
            }
            None => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
        }
    }
}

/// Objects of `kind` (`group`, `version`, `plural`) in `ns` (every namespace when `None`), as JSON.
/// The fleet to read ([`pko_cli::discover::choose`]): what the user named, else the one fleet whose Leases are in the
/// namespaces the user may list.
///
/// Errors: several fleets match and none was named (the message lists them).
async fn find_fleet(client: &kube::Client, name: Option<&str>, ns: Option<&str>) -> anyhow::Result<(String, String)> {
    let found = if name.is_some() && ns.is_some() {
        None
    } else {
        let leases = resource("coordination.k8s.io", "v1", "Lease", "leases");
        list(client, ns, &leases, "pulumi.com/fleet").await.ok().map(|l| pko_cli::discover::fleets(&l))
    };
    pko_cli::discover::choose(name, ns, found.as_deref()).map_err(anyhow::Error::msg)
}

async fn list(
    client: &kube::Client,
    ns: Option<&str>,
    ar: &kube::api::ApiResource,
    labels: &str,
) -> anyhow::Result<Vec<serde_json::Value>> {
    use kube::api::{Api, DynamicObject, ListParams};
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    };
    let items = api.list(&ListParams::default().labels(labels)).await?.items;
    Ok(items.into_iter().filter_map(|o| serde_json::to_value(o).ok()).collect())
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> kube::api::ApiResource {
    let api_version = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    kube::api::ApiResource {
        group: group.into(),
        version: version.into(),
        api_version,
        kind: kind.into(),
        plural: plural.into(),
    }
}

async fn receivers_command(a: ReceiversArgs) -> anyhow::Result<()> {
    let config = kube::Config::infer().await.map_err(|e| anyhow::anyhow!("kubeconfig: {e}"))?;
    let ns = (!a.all_namespaces).then(|| a.namespace.clone().unwrap_or_else(|| config.default_namespace.clone()));
    let client = kube::Client::try_from(config)?;
    let receivers =
        list(&client, ns.as_deref(), &resource("pulumi.com", "v1alpha1", "Receiver", "receivers"), "").await?;
    println!("{}", pko_cli::receivers::table(&receivers, a.all_namespaces));
    Ok(())
}

async fn status_command(a: StatusArgs) -> anyhow::Result<()> {
    let config = kube::Config::infer().await.map_err(|e| anyhow::anyhow!("kubeconfig: {e}"))?;
    let ns = (!a.all_namespaces).then(|| a.namespace.clone().unwrap_or_else(|| config.default_namespace.clone()));
    let client = kube::Client::try_from(config)?;
    let only = a.target.as_deref().map(logs::target).transpose().map_err(anyhow::Error::msg)?;
    let mut stacks = list(&client, ns.as_deref(), &pko_cli::annotate::stacks(), "").await?;
    stacks.retain(|s| only.as_deref().is_none_or(|n| s["metadata"]["name"] == n));
    if let Some(n) = &only
        && stacks.is_empty()
    {
        anyhow::bail!("stack {n} not found");
    }
    let updates =
        list(&client, ns.as_deref(), &resource("auto.pulumi.com", "v1alpha1", "Update", "updates"), "").await?;
    let workspaces =
        list(&client, ns.as_deref(), &resource("auto.pulumi.com", "v1alpha1", "Workspace", "workspaces"), "")
            .await
            .unwrap_or_default();
    // who holds which shard: the fleet's shard table of the Stack's shard count (none outside a
    // fleet, or not readable: no owner shown)
    let leases = match find_fleet(&client, a.fleet_name.as_deref(), a.fleet_namespace.as_deref()).await {
        Ok((name, fleet_ns)) => {
            let selector = format!("pulumi.com/fleet={name},pulumi.com/lease=table");
            list(&client, Some(&fleet_ns), &resource("coordination.k8s.io", "v1", "Lease", "leases"), &selector)
                .await
                .unwrap_or_default()
        }
        // several fleets and none named: no owner shown
        Err(_) => Vec::new(),
    };
    let entries = pko_cli::fleet::table_entries(&leases);
    let holder = |labels: &serde_json::Value| {
        let number = |key: &str| labels[key].as_str().and_then(|v| v.parse::<u32>().ok());
        entries.get(&(number("pulumi.com/shards")?, number("pulumi.com/shard")?)).and_then(|e| e.holder.as_deref())
    };
    let same = |o: &serde_json::Value, s: &serde_json::Value, name: &serde_json::Value| {
        o["metadata"]["namespace"] == s["metadata"]["namespace"] && o["metadata"]["name"] == *name
    };
    let rows: Vec<pko_cli::status::Row> = stacks
        .iter()
        .map(|s| {
            let current = updates.iter().find(|u| same(u, s, &s["status"]["currentUpdate"]["name"]));
            let pool = workspaces
                .iter()
                .find(|w| same(w, s, &s["metadata"]["name"]))
                .and_then(|w| w["status"]["pool"].as_str());
            let position = current.and_then(|u| pko_cli::status::queue_position(&updates, u));
            pko_cli::status::row(s, current, position, holder(&s["metadata"]["labels"]), pool)
        })
        .collect();
    match a.output.as_deref() {
        Some("json") => println!("{}", serde_json::to_string_pretty(&rows)?),
        Some("yaml") => print!("{}", serde_yaml_ng::to_string(&rows)?),
        other => print!("{}", pko_cli::status::table(&rows, a.all_namespaces, other == Some("wide"))),
    }
    Ok(())
}

async fn fleet_command(a: FleetArgs) -> anyhow::Result<()> {
    let client = kube::Client::try_default().await.map_err(|e| anyhow::anyhow!("kubeconfig: {e}"))?;
    let (name, ns) = find_fleet(&client, a.fleet_name.as_deref(), a.fleet_namespace.as_deref()).await?;
    let leases = list(
        &client,
        Some(&ns),
        &resource("coordination.k8s.io", "v1", "Lease", "leases"),
        &format!("pulumi.com/fleet={name}"),
    )
    .await?;
    if leases.is_empty() {
        anyhow::bail!(
            "no Lease of fleet {name:?} in namespace {ns}, and no other fleet found in the namespaces you may list \
             (--fleet-name, --fleet-namespace)"
        );
    }
    let f = pko_cli::fleet::fleet(&leases, k8s_openapi::jiff::Timestamp::now());
    match a.output.as_deref() {
        Some("json") => println!("{}", serde_json::to_string_pretty(&f)?),
        Some("yaml") => print!("{}", serde_yaml_ng::to_string(&f)?),
        _ => print!("{}", pko_cli::fleet::table(&f)),
    }
    Ok(())
}
