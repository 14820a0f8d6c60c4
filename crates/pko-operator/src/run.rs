//! The operator assembly: one function wires the controllers (Program, Stack, Workspace, Update), the artifact server,
//! the metrics and probe endpoints and the agent runtime, under one shutdown token. `main`, the integration tests and
//! the benches all start the operator here, so a test can run two or more replicas in one process against one API
//! server.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::agents::local::LocalRuntime;
use crate::agents::pod::PodRuntimeConfig;
use crate::agents::pool::pods::PodPools;
use crate::agents::pool::processes::LocalPools;
use crate::agents::tokens::AgentTokens;
use crate::agents::{Agents, PoolConfig};
use crate::args::{RunArgs, RuntimeKind, listen_address};
use crate::context::Context;
use crate::informer::{Informers, Synced, WatchScope};
use crate::ownership::{Namespaces, Ownership, SingleReplica};
use crate::update::controller::UpdateController;
use crate::workspace::controller::WorkspaceController;

/// Binds the address of `flag` (`0` turns it off; `:port` is every interface). Errors name the flag.
async fn bind(flag: &str, value: &str) -> anyhow::Result<Option<(tokio::net::TcpListener, SocketAddr)>> {
    if value == "0" {
        return Ok(None);
    }
    let addr = listen_address(value);
    let l = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("binding {flag} {addr}"))?;
    let bound = l.local_addr()?;
    Ok(Some((l, bound)))
}

/// An operator to start: an API client, its flags, and (local runtime) the environment its agents get.
pub struct Operator {
    client: kube::Client,
    watch_client: Option<kube::Client>,
    args: RunArgs,
    local_agent_env: Vec<(String, String)>,
}

/// A started operator: where it listens, its context, and its task.
pub struct Running {
    /// Bound address of the artifact server.
    pub artifacts_addr: SocketAddr,
    /// Bound address of `/metrics`, unless turned off.
    pub metrics_addr: Option<SocketAddr>,
    /// Bound address of the probes, unless turned off.
    pub probes_addr: Option<SocketAddr>,
    /// Bound address of the aggregated API `logs.pulumi.com`, unless turned off.
    pub logs_api_addr: Option<SocketAddr>,
    /// Bound address of the Receivers' hook endpoint, unless turned off.
    pub webhook_addr: Option<SocketAddr>,
    /// The controllers' shared context.
    pub ctx: Arc<Context>,
    task: tokio::task::JoinHandle<()>,
}

/// What [`Operator::start`] sets up before the context and hands to it.
/// What the replicas share beside the queue: the drift-check slots, the operations' output, the saved plans (in Redis
/// with `--redis-url`, else in this replica's memory).
struct Stores {
    drift_slots: Arc<dyn pko_queue::slots::Slots>,
    output: Arc<dyn pko_queue::output::OutputStore>,
    plans: Arc<dyn pko_queue::plans::PlanStore>,
}

struct ContextParts {
    stores: Stores,
    secrets: crate::secret_cache::SecretCache,
    gained: Option<tokio::sync::watch::Receiver<u64>>,
}

impl Running {
    /// Waits until the operator has shut down (its token was cancelled and the controllers ended).
    pub async fn wait(self) {
        let _ = self.task.await;
    }

    /// Cancels the shutdown token and waits for the controllers to end.
    pub async fn stop(self) {
        self.ctx.shutdown.cancel();
        self.wait().await;
    }
}

impl Operator {
    /// An operator with `args`, talking to the API server through `client`.
    pub fn new(client: kube::Client, args: RunArgs) -> Self {
        Self { client, watch_client: None, args, local_agent_env: Vec::new() }
    }

    /// The client watches go through (default: the request client). `main` gives one without `--kube-api-timeout`'s
    /// read timeout, which would cut every quiet watch.
    pub fn watch_client(mut self, client: kube::Client) -> Self {
        self.watch_client = Some(client);
        self
    }

    /// The environment local agents start with ([`crate::agents::local::local_agent_env`] of the operator's own, in
    /// `main`).
    pub fn local_agent_env(mut self, env: Vec<(String, String)>) -> Self {
        self.local_agent_env = env;
        self
    }

    /// Binds the listeners, starts every controller and server, and returns at once. Cancelling `shutdown` stops the
    /// controllers (each finishes its running reconciles) and then the servers.
    ///
    /// Errors: a flag combination that cannot work (named in the message), a listener that cannot bind, or the metrics
    /// certificate.
    pub async fn start(self, shutdown: CancellationToken) -> anyhow::Result<Running> {
        let Operator { client, watch_client, args, local_agent_env } = self;
        let RunArgs { artifacts, runtime, operations, metrics, logging: _, fleet, manager: _ } = args;
        let listener = tokio::net::TcpListener::bind(artifacts.program_fs_addr)
            .await
            .with_context(|| format!("binding --program-fs-addr {}", artifacts.program_fs_addr))?;
        let artifacts_addr = listener.local_addr()?;
        let advertised = artifacts.program_fs_adv_addr.clone().unwrap_or_else(|| artifacts_addr.to_string());
        let scope = WatchScope::from_namespaces(&operations.namespaces);
        let mut servers = Vec::new();
        let mut membership = Vec::new();
        // the recorder first: the fleet publishes its first holding (and sets `pko_fleet_shards_held`)
        // within milliseconds of joining, before the metrics endpoint starts; a metric recorded before
        // the recorder exists is lost (a lone replica's gauge stayed absent for good)
        let recorder = crate::metrics::install_recorder();
        // the fleet: held shards decide what this replica owns and which objects its informers watch
        let replica = Self::replica(&client, &fleet, &operations).await?;
        let (queue, redis) = Self::queue(&operations, replica.as_deref()).await?;
        let stores = Self::stores(redis.as_deref(), &operations);
        // watches go through a client without the request read timeout (a quiet watch would be cut)
        let watch_client = watch_client.unwrap_or_else(|| client.clone());
        let (secrets, secret_watch) =
            crate::secret_cache::SecretCache::watched(&watch_client, &scope, shutdown.clone());
        servers.push(tokio::spawn(secret_watch));
        let member = match &replica {
            Some(r) => Some(crate::fleet::join(&client, &watch_client, &fleet, r, &operations.namespaces, &shutdown)?),
            None => None,
        };
        if let Some(m) = &member {
            membership.push(tokio::spawn(crate::fleet::follow_shards(m.ownership.clone(), queue.clone())));
        }
        let ownership: Arc<dyn Ownership> = match &member {
            Some(m) => m.ownership.clone(),
            None => Self::single_ownership(&operations.namespaces),
        };
        let parts = ContextParts { stores, secrets, gained: member.as_ref().map(|m| m.gained.clone()) };
        let ctx = Self::context(&client, advertised, ownership, &operations, &fleet, parts, &shutdown);
        // with --namespaces every watch is namespaced: namespace-scoped installs need no cluster RBAC
        let mut informers = Informers::new(watch_client.clone(), scope.clone());
        if let Some(m) = member {
            informers = informers.with_shards(m.held.clone());
            membership.extend(m.tasks);
            let labellers =
                Self::labellers(&client, &watch_client, scope, fleet.shards, &m.ownership, &mut informers, &shutdown);
            servers.extend(labellers);
        }
        let agents = Arc::new(Self::agents(
            &client,
            &runtime,
            &fleet,
            replica.as_deref(),
            local_agent_env,
            ctx.ownership.clone(),
        )?);
        let (programs, stacks, controllers) = Self::controllers(&ctx, agents, queue, &operations, &mut informers);
        let webhook_addr = Self::serve_webhook(&ctx, &metrics, &mut informers, &mut servers).await?;
        // every kind is watched once, by its informer; ready once every cache has synced
        let (ready, watches) = informers.run(shutdown.clone());
        servers.push(tokio::spawn(watches));
        let sources = crate::metrics::Sources {
            stacks,
            programs: programs.clone(),
            ownership: ctx.ownership.clone(),
            handle: recorder,
        };
        let (metrics_addr, probes_addr, logs_api_addr) = (
            Self::serve_metrics(&ctx, &metrics, sources, &mut servers).await?,
            Self::serve_probes(&metrics, ready, &mut servers).await?,
            Self::serve_logs_api(&ctx, &metrics, &mut servers).await?,
        );
        servers.push(tokio::spawn(async move {
            let _ = crate::artifacts::serve(listener, crate::artifacts::ArtifactState::new(programs)).await;
        }));
        tracing::info!(artifacts = %artifacts_addr, advertised = %ctx.advertised_addr, runtime = ?runtime.runtime,
            "operator starting");
        let task = tokio::spawn(Self::until_stopped(controllers, membership, servers));
        Ok(Running { artifacts_addr, metrics_addr, probes_addr, logs_api_addr, webhook_addr, ctx, task })
    }

    /// Runs the controllers until shutdown, then lets the membership end — it releases its Lease, so its successors
    /// take the shards at once (5 s at most) — and stops the servers.
    async fn until_stopped(
        controllers: futures::future::BoxFuture<'static, ()>,
        membership: Vec<tokio::task::JoinHandle<()>>,
        servers: Vec<tokio::task::JoinHandle<()>>,
    ) {
        controllers.await;
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), futures::future::join_all(membership)).await;
        servers.iter().for_each(tokio::task::JoinHandle::abort);
        tracing::info!("operator stopped");
    }

    /// The context every reconcile gets, from the flags and what `start` set up before it.
    fn context(
        client: &kube::Client,
        advertised: String,
        ownership: Arc<dyn Ownership>,
        operations: &crate::args::OperationArgs,
        fleet: &crate::args::FleetArgs,
        parts: ContextParts,
        shutdown: &CancellationToken,
    ) -> Arc<Context> {
        let ContextParts { stores: Stores { drift_slots, output, plans }, secrets, gained } = parts;
        Arc::new(Context {
            reconcile_concurrency: operations.max_concurrent_reconciles,
            shutdown: shutdown.clone(),
            shards_gained: gained,
            drift_slots,
            drift_min_interval: std::time::Duration::from_secs(operations.min_drift_check_interval_seconds),
            github_api_url: operations.github_api_url.clone(),
            output,
            plans,
            update_idle_timeout: Some(operations.update_idle_timeout).filter(|d| !d.is_zero()),
            operation_timeout: Some(operations.operation_timeout).filter(|d| !d.is_zero()),
            placement: fleet.placement(),
            secrets,
            ..Context::new(client.clone(), advertised, ownership)
        })
    }

    /// The four controllers, watching through `informers`: the Program and Stack caches (the metrics read them) and one
    /// future running every controller until shutdown.
    fn controllers(
        ctx: &Arc<Context>,
        agents: Arc<Agents>,
        queue: Arc<dyn crate::queue::WorkQueue>,
        operations: &crate::args::OperationArgs,
        informers: &mut Informers,
    ) -> (
        kube::runtime::reflector::Store<pko_api::Program>,
        kube::runtime::reflector::Store<pko_api::Stack>,
        futures::future::BoxFuture<'static, ()>,
    ) {
        use futures::FutureExt;
        let (programs, program_controller) = crate::program::program_controller(ctx.clone(), informers);
        let (stacks, stack_controller) = crate::stack::controller::controller(ctx.clone(), informers);
        let workspace_controller = WorkspaceController::new(ctx.clone(), agents.clone()).run(informers);
        let updates = UpdateController::with_queue(ctx.clone(), queue, operations.max_operations).with_agents(agents);
        let updates = match operations.max_operations_per_class {
            0 => updates,
            limit => updates.with_class_limit(limit),
        };
        let update_controller = updates.run(informers);
        let rollout_controller = crate::rollout::controller::controller(ctx.clone(), informers);
        let all = async move {
            tokio::join!(
                program_controller,
                stack_controller,
                workspace_controller,
                update_controller,
                rollout_controller
            );
        };
        (programs, stacks, all.boxed())
    }

    /// This replica's fleet id, once (the host name when not given); `None` outside a fleet. A fleet without Redis must
    /// be a single replica.
    ///
    /// Errors: no id to be had, or another replica of the fleet is found without Redis.
    async fn replica(
        client: &kube::Client,
        fleet: &crate::args::FleetArgs,
        operations: &crate::args::OperationArgs,
    ) -> anyhow::Result<Option<String>> {
        let replica = if fleet.fleet { Some(crate::fleet::replica_id(fleet)?) } else { None };
        if let Some(r) = &replica
            && operations.redis_url.as_deref().is_none_or(str::is_empty)
        {
            crate::fleet::check_single_without_redis(client, fleet, r).await?;
        }
        Ok(replica)
    }

    /// Where operations' output is kept: the fleet's Redis with `--redis-url`, else this replica's memory.
    fn output(
        redis: Option<&crate::queue::redis::RedisQueue>,
        operations: &crate::args::OperationArgs,
    ) -> Arc<dyn pko_queue::output::OutputStore> {
        let limits = pko_queue::output::Limits {
            lines: operations.output_lines as usize,
            operations: operations.output_operations as usize,
            ..Default::default()
        };
        match redis {
            Some(q) => Arc::new(q.output(limits)),
            None => Arc::new(pko_queue::output::MemoryOutput::new(limits)),
        }
    }

    /// The [`Stores`] of this replica.
    fn stores(redis: Option<&crate::queue::redis::RedisQueue>, operations: &crate::args::OperationArgs) -> Stores {
        Stores {
            drift_slots: Self::drift_slots(redis, operations.max_concurrent_drift_checks),
            output: Self::output(redis, operations),
            plans: Self::plans(redis),
        }
    }

    /// Where saved plans are kept: the fleet's Redis with `--redis-url`, else this replica's memory.
    fn plans(redis: Option<&crate::queue::redis::RedisQueue>) -> Arc<dyn pko_queue::plans::PlanStore> {
        match redis {
            Some(q) => Arc::new(q.plans()),
            None => Arc::new(pko_queue::plans::MemoryPlans::default()),
        }
    }

    /// The fleet-wide cap on concurrent drift checks: in Redis with `--redis-url`, else this replica's.
    fn drift_slots(redis: Option<&crate::queue::redis::RedisQueue>, max: usize) -> Arc<dyn pko_queue::slots::Slots> {
        match redis {
            Some(q) => Arc::new(q.slots("drift-checks", max)),
            None => Arc::new(pko_queue::slots::MemorySlots::new(max)),
        }
    }

    /// What a replica outside a fleet owns: everything, or the objects of `--namespaces`.
    fn single_ownership(namespaces: &[String]) -> Arc<dyn Ownership> {
        if namespaces.is_empty() {
            Arc::new(SingleReplica)
        } else {
            Arc::new(Namespaces(namespaces.iter().cloned().collect()))
        }
    }

    /// The fleet's labellers: unsharded objects get their shard labels, and objects filed under another shard count are
    /// relabelled.
    fn labellers(
        client: &kube::Client,
        watch_client: &kube::Client,
        scope: WatchScope,
        shards: u32,
        ownership: &Arc<crate::fleet::FleetOwnership>,
        informers: &mut Informers,
        shutdown: &CancellationToken,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = vec![tokio::spawn(crate::fleet::label_unsharded(
            client.clone(),
            watch_client.clone(),
            scope,
            shards,
            ownership.clone(),
            ownership.standing(),
            shutdown.clone(),
        ))];
        tasks.extend(crate::fleet::relabel_misfiled_kinds(informers, client, shards, &ownership.standing(), shutdown));
        tasks
    }

    /// Where agents run (`--runtime`, `--agent-pools`): `replica` is the fleet id under which local pools keep their
    /// records ("operator" outside a fleet); `ownership` says which pod pools this replica maintains. Agents in pods
    /// get the operator's tokens (`--service-account`, or PKO's `POD_NAMESPACE` + `POD_SA_NAME`) from one cache.
    ///
    /// Errors: a flag the runtime needs is missing; hollow agents without pools.
    fn agents(
        client: &kube::Client,
        runtime: &crate::args::RuntimeArgs,
        fleet: &crate::args::FleetArgs,
        replica: Option<&str>,
        local_agent_env: Vec<(String, String)>,
        ownership: Arc<dyn Ownership>,
    ) -> anyhow::Result<Agents> {
        let pooled = runtime.agent_pools.unwrap_or(runtime.runtime == RuntimeKind::Local);
        if !pooled && runtime.hollow_agents_seconds.is_some() {
            anyhow::bail!("--hollow-agents-seconds needs agent pools (--agent-pools)");
        }
        let client = client.clone();
        Ok(match runtime.runtime {
            RuntimeKind::Pod => {
                let service_account = runtime.service_account.clone().or_else(|| {
                    Some(format!("{}/{}", fleet.fleet_namespace.as_deref()?, runtime.pod_sa_name.as_deref()?))
                });
                let Some((ns, sa)) = service_account.as_deref().and_then(|s| s.split_once('/')) else {
                    anyhow::bail!(
                        "--runtime pod needs --service-account namespace/name (env OPERATOR_SERVICE_ACCOUNT): agents \
                            in pods authenticate the operator with its tokens"
                    )
                };
                let tokens = Arc::new(AgentTokens::new(client.clone(), ns, sa));
                let cfg = PodRuntimeConfig {
                    agent_image: runtime.agent_image.clone(),
                    agent_image_pull_policy: runtime.agent_image_pull_policy.clone(),
                    flux_max_untar_size_bytes: runtime.flux_max_untar_size_bytes,
                };
                if pooled {
                    Agents::pod_pools(
                        client.clone(),
                        PodPools::new(client, Self::pool_config(runtime), cfg, tokens.clone(), ownership),
                        tokens,
                    )
                } else {
                    Agents::own_pods(client, cfg, Some(tokens))
                }
            }
            RuntimeKind::Local => {
                let local = LocalRuntime::new(
                    runtime.agent_bin.clone(),
                    runtime.local_work_dir.clone(),
                    runtime.local_api_server.clone().context("--runtime local needs --local-api-server")?,
                    runtime.local_ca_file.clone().context("--runtime local needs --local-ca-file")?,
                    local_agent_env,
                );
                if pooled {
                    let replica = replica.unwrap_or("operator").to_string();
                    Agents::process_pools(
                        client.clone(),
                        LocalPools::new(local, client, replica, Self::pool_config(runtime)),
                    )
                } else {
                    Agents::own_processes(client, local)
                }
            }
        })
    }

    /// The pools' size and idleness (`--pool-*`), their agents' disk budgets, and the hollow agents' flag of a load
    /// test.
    fn pool_config(runtime: &crate::args::RuntimeArgs) -> PoolConfig {
        let agent_args = runtime.pool_agent_args();
        if let Some(s) = runtime.hollow_agents_seconds {
            tracing::warn!(seconds = s, "HOLLOW AGENTS: operations are simulated, no Pulumi runs (load tests only)");
        }
        crate::load::set_pool_bounds(runtime.pool_min_agents, runtime.pool_max_agents.max(1));
        PoolConfig {
            min: runtime.pool_min_agents,
            max: runtime.pool_max_agents.max(1),
            idle_timeout: std::time::Duration::from_secs(runtime.pool_idle_timeout_seconds),
            affinity_wait: runtime.pool_affinity_wait_seconds,
            agent_args,
        }
    }

    /// The work queue: Redis with `--redis-url` (returned twice: also as itself, the fleet's backlog), else in memory
    /// (a fleet of one: checked before). `replica`: this replica's fleet id.
    async fn queue(
        operations: &crate::args::OperationArgs,
        replica: Option<&str>,
    ) -> anyhow::Result<(Arc<dyn crate::queue::WorkQueue>, Option<Arc<crate::queue::redis::RedisQueue>>)> {
        let per_namespace = pko_queue::namespace_limit(
            operations.max_operations,
            operations.namespace_share_percent,
            operations.max_operations_per_namespace,
        );
        let Some(url) = operations.redis_url.as_deref().filter(|u| !u.is_empty()) else {
            return Ok((Arc::new(crate::queue::InMemoryQueue::new(per_namespace)), None));
        };
        let worker = replica.unwrap_or("single").to_string();
        let target = pko_queue::connect::Target::parse(url, operations.redis_sentinel_master.as_deref())
            .map_err(anyhow::Error::msg)?;
        let q = crate::queue::redis::RedisQueue::on(&target, &operations.redis_prefix, &worker, per_namespace)?;
        let via = if matches!(target, pko_queue::connect::Target::Sentinel { .. }) {
            "redis (through Sentinel)"
        } else {
            "redis"
        };
        match q.ping().await {
            Ok(()) => tracing::info!(prefix = %operations.redis_prefix, "work queue: {via}"),
            // Redis is an accelerator: the operator works without it and records jobs once it is back
            Err(e) => tracing::warn!(error = %e, "redis does not answer yet; jobs run from memory until it does"),
        }
        let q = Arc::new(q);
        Ok((q.clone(), Some(q)))
    }

    async fn serve_metrics(
        ctx: &Arc<Context>,
        m: &crate::args::MetricsArgs,
        sources: crate::metrics::Sources,
        servers: &mut Vec<tokio::task::JoinHandle<()>>,
    ) -> anyhow::Result<Option<SocketAddr>> {
        let Some((l, bound)) = bind("--metrics-bind-address", &m.metrics_bind_address).await? else { return Ok(None) };
        let security = if m.metrics_secure {
            let tls = match &m.metrics_cert_dir {
                Some(d) => axum_server::tls_rustls::RustlsConfig::from_pem_file(d.join("tls.crt"), d.join("tls.key"))
                    .await
                    .with_context(|| format!("reading {}/tls.crt and tls.key", d.display()))?,
                None => crate::metrics::self_signed_tls(std::env::var("POD_NAME").into_iter().collect())
                    .await
                    .context("making the metrics certificate")?,
            };
            crate::metrics::Security::Secure { tls }
        } else {
            crate::metrics::Security::Insecure
        };
        tracing::info!(metrics = %bound, secure = m.metrics_secure, "metrics serving");
        let (client, output) = (ctx.client.clone(), ctx.output.clone());
        servers.push(tokio::spawn(async move {
            if let Err(e) = crate::metrics::serve(l, client, sources, security, output).await {
                tracing::error!(error = %e, "metrics server stopped");
            }
        }));
        Ok(Some(bound))
    }

    async fn serve_logs_api(
        ctx: &Arc<Context>,
        m: &crate::args::MetricsArgs,
        servers: &mut Vec<tokio::task::JoinHandle<()>>,
    ) -> anyhow::Result<Option<SocketAddr>> {
        use crate::logs_api::{LogsApi, tls};
        let Some((l, bound)) = bind("--logs-api-bind-address", &m.logs_api_bind_address).await? else {
            return Ok(None);
        };
        let proxy = tls::front_proxy(&ctx.client).await;
        let (chain, key) =
            tls::serving_certificate(m.logs_api_cert_dir.as_deref(), std::env::var("POD_NAME").into_iter().collect())?;
        let config = tls::server_config(chain, key, proxy.as_ref())?;
        tracing::info!(logs_api = %bound, front_proxy = proxy.is_some(), "logs.pulumi.com serving");
        let api = LogsApi {
            output: ctx.output.clone(),
            authz: crate::authz::Authz::new(ctx.client.clone()),
            proxy: proxy.map(Arc::new),
            client: ctx.client.clone(),
        };
        servers.push(tokio::spawn(async move {
            if let Err(e) = crate::logs_api::serve(l, config, api).await {
                tracing::error!(error = %e, "logs API server stopped");
            }
        }));
        Ok(Some(bound))
    }

    /// With `--webhook-bind-address`: the Receiver controller and the hook endpoint (Receivers are not watched
    /// otherwise).
    async fn serve_webhook(
        ctx: &Arc<Context>,
        m: &crate::args::MetricsArgs,
        informers: &mut Informers,
        servers: &mut Vec<tokio::task::JoinHandle<()>>,
    ) -> anyhow::Result<Option<SocketAddr>> {
        let Some((l, bound)) = bind("--webhook-bind-address", &m.webhook_bind_address).await? else {
            return Ok(None);
        };
        let (receivers, controller) = crate::receiver::controller::controller(ctx.clone(), informers);
        servers.push(tokio::spawn(controller));
        let hooks =
            crate::receiver::hook::Hooks { receivers, client: ctx.client.clone(), secrets: ctx.secrets.clone() };
        tracing::info!(webhook = %bound, "receivers' hooks serving");
        servers.push(tokio::spawn(async move {
            if let Err(e) = crate::receiver::hook::serve(l, hooks).await {
                tracing::error!(error = %e, "webhook server stopped");
            }
        }));
        Ok(Some(bound))
    }

    async fn serve_probes(
        m: &crate::args::MetricsArgs,
        ready: Synced,
        servers: &mut Vec<tokio::task::JoinHandle<()>>,
    ) -> anyhow::Result<Option<SocketAddr>> {
        let Some((l, bound)) = bind("--health-probe-bind-address", &m.health_probe_bind_address).await? else {
            return Ok(None);
        };
        servers.push(tokio::spawn(async move {
            let _ = crate::metrics::serve_probes(l, ready).await;
        }));
        Ok(Some(bound))
    }
}
