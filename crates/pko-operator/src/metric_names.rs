//! The names of the operator's metrics (Prometheus), written once: a leaf module every other module may name —
//! [`crate::metrics`] serves them, [`crate::k8s`] and the controllers record them.

/// Gauge: Stacks this replica owns (PKO).
pub const STACKS_ACTIVE: &str = "stacks_active";
/// Gauge per Stack, labels `namespace`, `name`: 1 when its last update failed (PKO).
pub const STACKS_FAILING: &str = "stacks_failing";
/// Gauge: Programs this replica owns (PKO).
pub const PROGRAMS_ACTIVE: &str = "programs_active";
/// Counter, labels `type` (up, preview, refresh, destroy) and `result` (succeeded, failed, interrupted).
pub const OPERATIONS_TOTAL: &str = "pko_update_operations_total";
/// Histogram in seconds, label `type`: how long an operation took on its agent.
pub const OPERATION_DURATION_SECONDS: &str = "pko_update_operation_duration_seconds";
/// Counter, label `result` (`changes`, `no_changes`, `failed`): drift checks that ended (`spec.driftDetection`).
pub const DRIFT_CHECKS_TOTAL: &str = "pko_drift_checks_total";
/// Counter: drift checks put off because `--max-concurrent-drift-checks` were running fleet-wide.
pub const DRIFT_CHECKS_DEFERRED_TOTAL: &str = "pko_drift_checks_deferred_total";
/// Counter, label `controller`: passes that ran on a cached object the API server had already moved past (their pinned
/// write got 409, or the read before their effects showed a newer version); nothing was written, the newer version is
/// reconciled.
pub const STALE_PASSES_TOTAL: &str = "pko_stale_passes_total";
/// Counter, label `source` (`cache`, `api`): Secrets read for operation requests, from the contents this replica holds
/// at their current version or from the API server ([`crate::secret_cache`]).
pub const SECRET_READS_TOTAL: &str = "pko_secret_reads_total";
/// Counter, label `source` (`handed_over`, `api`): outputs of finished `up` Updates absorbed into their Stacks'
/// `status.outputs`, handed over in memory by this replica's dispatcher ([`crate::outputs::Written`]) or read back from
/// the outputs Secret.
pub const OUTPUTS_READS_TOTAL: &str = "pko_outputs_reads_total";
/// Counter, label `result` (`synced`, `unchanged`, `ignored`, `unauthorized`, `not_found`, `too_large`, `failed`):
/// webhook deliveries to Receivers ([`crate::receiver::hook`]).
pub const WEBHOOK_DELIVERIES_TOTAL: &str = "pko_webhook_deliveries_total";
/// Counter: Stacks asked to sync by a webhook delivery.
pub const WEBHOOK_SYNCS_TOTAL: &str = "pko_webhook_syncs_total";
/// Counter: `git ls-remote` listings run to resolve Stacks' branches ([`crate::git_heads`]: one answers every Stack of
/// the remote that asked while the previous one ran).
pub const GIT_LISTINGS_TOTAL: &str = "pko_git_listings_total";
/// Gauge: bytes the pool agents of a class keep on disk between operations (their cached sources), by `class`.
pub const POOL_AGENT_DISK_BYTES: &str = "pko_pool_agent_disk_bytes";
/// Counter: drift remediations started (`autoRemediate`).
pub const DRIFT_REMEDIATIONS_TOTAL: &str = "pko_drift_remediations_total";
/// Counter: jobs put back because their workspace class was at its limit (`--max-operations-per-class`).
pub const OPERATIONS_DEFERRED_TOTAL: &str = "pko_update_operations_deferred_total";
/// Counter: agents lent by pools, by `affinity`: `warm` (the agent ran the Stack before: its caches are there), `cold`
/// (other agents did), `none` (no agent did).
pub const POOL_LENDS_TOTAL: &str = "pko_pool_lends_total";
/// Counter: jobs held for the busy pool agent that ran their Stack last (`--pool-affinity-wait-seconds`).
pub const OPERATIONS_HELD_TOTAL: &str = "pko_update_operations_held_total";
/// Gauge: operations waiting in this replica's work queue.
pub const OPERATIONS_QUEUED: &str = "pko_update_operations_queued";
/// Gauge: operations this replica's workers drive now.
pub const OPERATIONS_IN_FLIGHT: &str = "pko_update_operations_in_flight";
/// Histogram in seconds, label `namespace`: from an operation's first push to a worker taking it.
pub const DISPATCH_WAIT_SECONDS: &str = "pko_dispatch_wait_seconds";
/// Histogram in seconds, label `namespace`: from an operation's first push to its first event on an agent (Pulumi
/// started) — the dispatch latency.
pub const DISPATCH_LATENCY_SECONDS: &str = "pko_dispatch_latency_seconds";
/// Counter, label `step` (`prepare`, `connect`, `busy`, `follow`, `record`, `fenced`): operations whose run on an agent
/// ended without a result, by the step that failed.
pub const DISPATCH_ERRORS_TOTAL: &str = "pko_dispatch_errors_total";
/// Counter, label `kind`: objects listed or changed that do not decode as their kind's type (left out of the cache; a
/// Stack is marked Stalled `SpecInvalid` naming the field).
pub const UNDECODABLE_OBJECTS_TOTAL: &str = "pko_undecodable_objects_total";
/// Counter, label `check` (`dispatch`: the Workspace read for an Update would run another digest than its
/// `spec.runDigest`; `agent`: an agent refused a request or the stack config it wrote; `absorb`: a Stack found a
/// successful Update without the digest it was made for): runs refused because they were not what their Update names
/// (`RunMismatch`). Any count is worth a look.
pub const RUN_MISMATCHES_TOTAL: &str = "pko_run_mismatches_total";
/// Counter, label `reason` (`IdleTimeout`, `DeadlineExceeded`, `Canceled`): operations a limit or a cancel request
/// stopped on their agent (`update::limits`).
pub const OPERATIONS_STOPPED_TOTAL: &str = "pko_operations_stopped_total";
/// Summary in bytes: the size of each saved plan kept (`update::plans`, `spec.approval.mode: manual`).
pub const PLAN_BYTES: &str = "pko_plan_bytes";
/// Counter: operation output lines the output store did not take (`update::capture`).
pub const OUTPUT_LINES_LOST_TOTAL: &str = "pko_output_lines_lost_total";
/// Gauge, label `namespace`: operations waiting in this replica's queue.
pub const QUEUE_DEPTH: &str = "pko_queue_depth";
/// Gauge, label `class` (`<namespace>/<hash>`): operations of a workspace class this replica drives.
pub const OPERATIONS_RUNNING: &str = "pko_operations_running";
/// Gauge, labels `class` (`<namespace>/<hash>`) and `state` (`idle`, `busy`): agents of a pool.
pub const POOL_AGENTS: &str = "pko_pool_agents";
/// Counter: pool agents started (demand, or the minimum).
pub const POOL_AGENTS_STARTED_TOTAL: &str = "pko_pool_agents_started_total";
/// Counter: pool agents stopped after their idle timeout.
pub const POOL_AGENTS_STOPPED_TOTAL: &str = "pko_pool_agents_stopped_total";
/// Gauge: shards this replica holds (`--fleet`).
pub const SHARDS_HELD: &str = "pko_fleet_shards_held";
/// Counter, label `change` (`gained`, `lost`): shards this replica took or gave up.
pub const SHARD_TRANSITIONS_TOTAL: &str = "pko_fleet_shard_transitions_total";
/// Counter: times this replica's holding lapsed for a moment (its renewal came after the renew deadline without a lapse
/// between renewals) and every object of its shards was reconciled again.
pub const FLEET_HOLDING_GAPS_TOTAL: &str = "pko_fleet_holding_gaps_total";
/// Gauge: live members of the fleet as this replica sees them.
pub const FLEET_MEMBERS: &str = "pko_fleet_members";
/// Counter, label `controller`: reconciles run.
pub const RECONCILES_TOTAL: &str = "pko_reconciles_total";
/// Counter, labels `controller` and `step`: reconciles that failed, by the step that failed.
pub const RECONCILE_ERRORS_TOTAL: &str = "pko_reconcile_errors_total";
/// Histogram in seconds, label `controller`: how long a reconcile took.
pub const RECONCILE_DURATION_SECONDS: &str = "pko_reconcile_duration_seconds";
/// controller-runtime's series, beside ours so that PKO's alerts and dashboards keep working. Counter, labels
/// `controller` and `result` (`success`, `error`): reconciles run.
pub const CR_RECONCILE_TOTAL: &str = "controller_runtime_reconcile_total";
/// controller-runtime's counter, label `controller`: reconciles that failed.
pub const CR_RECONCILE_ERRORS_TOTAL: &str = "controller_runtime_reconcile_errors_total";
/// controller-runtime's histogram in seconds, label `controller`: how long a reconcile took.
pub const CR_RECONCILE_TIME_SECONDS: &str = "controller_runtime_reconcile_time_seconds";
/// client-go's workqueue histogram in seconds, label `name` (the controller): how long processing an item took (here: a
/// reconcile).
pub const WORKQUEUE_WORK_DURATION_SECONDS: &str = "workqueue_work_duration_seconds";
/// client-go's workqueue counter, label `name`: items taken for processing (here: reconciles started).
pub const WORKQUEUE_ADDS_TOTAL: &str = "workqueue_adds_total";
/// client-go's workqueue counter, label `name`: items put back to be retried (here: failed reconciles requeued by the
/// error policy).
pub const WORKQUEUE_RETRIES_TOTAL: &str = "workqueue_retries_total";
/// client-go's workqueue gauge, label `name`: items waiting. Only `name="update"`, this replica's operation queue
/// (kube-runtime keeps its reconcile queues' depth to itself).
pub const WORKQUEUE_DEPTH: &str = "workqueue_depth";
