//! State shared by the controllers.

use std::sync::Arc;

use crate::ownership::Ownership;

/// What every reconcile gets.
#[derive(Clone)]
pub struct Context {
    /// Client of the API server.
    pub client: kube::Client,
    /// `host:port` under which the artifact server is reachable by agents (PKO `--program-fs-adv-addr`).
    pub advertised_addr: String,
    /// Which objects this replica may act on.
    pub ownership: Arc<dyn Ownership>,
    /// Reconciles each controller runs at once (PKO `MAX_CONCURRENT_RECONCILES`, default 25). A reconcile never waits
    /// for a Pulumi operation, so this bounds API-server load, not operations.
    pub reconcile_concurrency: u16,
    /// One event recorder per controller, for the process's life (event aggregation).
    pub events: crate::k8s::Events,
    /// Changes each time this replica gains shards, takes one again at a new epoch, or its holding comes back after
    /// lapsing (`--fleet`): controllers of kinds watched whole (Programs) reconcile everything again then (kube's
    /// `reconcile_all_on`); sharded kinds re-list what they gain, and look again by themselves at what they skipped
    /// while not owning it ([`crate::k8s::unowned`]).
    pub shards_gained: Option<tokio::sync::watch::Receiver<u64>>,
    /// Cancelled to shut the operator down: every controller stops taking work (kube's `graceful_shutdown_on`) and the
    /// servers end after them.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// The fleet-wide cap on concurrent drift checks (`--max-concurrent-drift-checks`): in Redis with `--redis-url`,
    /// else this replica's.
    pub drift_slots: Arc<dyn pko_queue::slots::Slots>,
    /// The shortest time between two drift checks of one Stack (`--min-drift-check-interval-seconds`, default
    /// [`DEFAULT_DRIFT_MIN_INTERVAL`]).
    pub drift_min_interval: std::time::Duration,
    /// Base URL of the GitHub API for GitHub App git credentials (`--github-api-url`; default `https://api.github.com`,
    /// PKO's fixed URL).
    pub github_api_url: String,
    /// Where operations' output is kept (`pko_queue::output`): the fleet's Redis with `--redis-url`, else this
    /// replica's memory.
    pub output: Arc<dyn pko_queue::output::OutputStore>,
    /// Where Stacks' saved plans are kept between their preview and their approved `up` (`pko_queue::plans`): the
    /// fleet's Redis with `--redis-url`, else this replica's memory.
    pub plans: Arc<dyn pko_queue::plans::PlanStore>,
    /// The idle timeout of an operation whose Update sets none (`--update-idle-timeout`, PKO's 30 min default); `None`:
    /// none.
    pub update_idle_timeout: Option<std::time::Duration>,
    /// The overall timeout of an operation whose Update sets none (`--operation-timeout`); `None`: none.
    pub operation_timeout: Option<std::time::Duration>,
    /// Where this replica runs, which an unlock request judges lock holders' hosts against.
    pub placement: Placement,
    /// The outputs this replica's dispatcher wrote lately, for its Stack controller ([`crate::outputs::Written`]).
    pub outputs: crate::outputs::Written,
    /// The Secrets operation requests name, read only when changed ([`crate::secret_cache`]); by default without a
    /// watch (every use reads).
    pub secrets: crate::secret_cache::SecretCache,
    /// Branch heads of git remotes, one `ls-remote` shared by the Stacks that ask at once ([`crate::git_heads`]).
    pub git_heads: crate::git_heads::GitHeads,
}

/// Where this replica runs: its host, and where the fleet's membership Leases are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// This replica's host name (`gethostname`; its pod's name in a cluster).
    pub hostname: String,
    /// The operator's namespace (`--fleet-namespace`, `POD_NAMESPACE`): its replicas' and membership Leases'; `None`
    /// outside a cluster.
    pub namespace: Option<String>,
    /// The fleet's name (`--fleet-name`) when it runs as a fleet (`--fleet`).
    pub fleet: Option<String>,
}

impl Placement {
    /// This host, with `namespace` and `fleet`.
    pub fn here(namespace: Option<String>, fleet: Option<String>) -> Self {
        let hostname = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default();
        Placement { hostname, namespace: namespace.filter(|n| !n.is_empty()), fleet }
    }
}

/// Default of `--max-concurrent-drift-checks`.
pub const DEFAULT_MAX_DRIFT_CHECKS: usize = 10;

/// The shortest time between two drift checks of one Stack by default (`--min-drift-check-interval-seconds`): 60 s.
pub const DEFAULT_DRIFT_MIN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// PKO's default idle timeout of an operation (`DefaultUpdateIdleTimeout`, PR #1296): 30 minutes.
pub const DEFAULT_UPDATE_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// PKO's default number of concurrent reconciles per controller.
pub const DEFAULT_RECONCILE_CONCURRENCY: u16 = 25;

impl Context {
    /// A context with PKO's default reconcile concurrency and this replica's own drift-check slots.
    pub fn new(client: kube::Client, advertised_addr: impl Into<String>, ownership: Arc<dyn Ownership>) -> Self {
        let events = crate::k8s::Events::new(&client);
        let shutdown = tokio_util::sync::CancellationToken::new();
        let drift_slots = Arc::new(pko_queue::slots::MemorySlots::new(DEFAULT_MAX_DRIFT_CHECKS));
        Self {
            client,
            advertised_addr: advertised_addr.into(),
            ownership,
            reconcile_concurrency: DEFAULT_RECONCILE_CONCURRENCY,
            events,
            shards_gained: None,
            shutdown,
            drift_slots,
            drift_min_interval: DEFAULT_DRIFT_MIN_INTERVAL,
            github_api_url: pko_git::github_app::DEFAULT_API_URL.into(),
            output: Arc::new(pko_queue::output::MemoryOutput::new(pko_queue::output::Limits::default())),
            plans: Arc::new(pko_queue::plans::MemoryPlans::default()),
            update_idle_timeout: Some(DEFAULT_UPDATE_IDLE_TIMEOUT),
            operation_timeout: None,
            placement: Placement::here(None, None),
            outputs: crate::outputs::Written::default(),
            secrets: crate::secret_cache::SecretCache::default(),
            git_heads: crate::git_heads::GitHeads::default(),
        }
    }

    /// The `kube` controller configuration of every controller: [`Self::reconcile_concurrency`].
    pub fn controller_config(&self) -> kube::runtime::controller::Config {
        kube::runtime::controller::Config::default().concurrency(self.reconcile_concurrency)
    }

    /// A tick each time this replica gains shards (none outside a fleet): what a controller of a kind watched whole
    /// (Programs, Receivers) reconciles everything on, since an object that was not its own may be now.
    pub fn shards_gained_ticks(&self) -> Option<impl futures::Stream<Item = ()> + Send + 'static> {
        self.shards_gained.clone().map(|gained| {
            futures::stream::unfold(gained, |mut rx| async move {
                rx.changed().await.ok()?;
                Some(((), rx))
            })
        })
    }

    /// How each controller runs: [`Self::controller_config`] until [`Self::shutdown`].
    pub fn running(&self) -> crate::k8s::Running {
        crate::k8s::Running { config: self.controller_config(), shutdown: self.shutdown.clone() }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("advertised_addr", &self.advertised_addr)
            .field("ownership", &self.ownership)
            .finish()
    }
}
