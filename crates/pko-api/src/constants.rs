//! Names that form part of the PKO v2 API contract: condition types and reasons, finalizers, annotations, labels and
//! field managers. Tools such as Argo CD health checks key on these strings, so they are kept byte-for-byte identical
//! to PKO v2.9 (`operator/api/pulumi/v1/stack_types.go`, `operator/api/auto/v1alpha1/*`).

/// API group of Stack and Program.
pub const PULUMI_GROUP: &str = "pulumi.com";
/// API group of Workspace and Update.
pub const AUTO_GROUP: &str = "auto.pulumi.com";
/// The category every CRD of the operator belongs to (`kubectl get pulumi`).
pub const CATEGORY: &str = "pulumi";

/// Finalizer the Stack controller puts on Stacks and on the Updates it creates (PKO `finalizer.stack.pulumi.com`).
pub const STACK_FINALIZER: &str = "finalizer.stack.pulumi.com";

/// Annotation whose every new value requests a sync of the Stack (Flux-style protocol); its last seen value is echoed
/// to `status.observedReconcileRequest`.
pub const RECONCILE_REQUEST_ANNOTATION: &str = "pulumi.com/reconciliation-request";
/// Prefix of a [`RECONCILE_REQUEST_ANNOTATION`] value that asks for one commit: `push-<revision>` (ours; what a
/// Receiver writes for a push naming its revision). Written by the Receiver's hook, read by the Stack controller: such
/// a request is met by a successful update at that revision, whichever pass started it.
pub const PUSH_REQUEST_PREFIX: &str = "push-";
/// Annotation whose every new value on a Stack cancels its running operation (ours; `kubectl pko cancel`): Ctrl-C on
/// its agent, a hard stop after a grace period, the Update `Failed` `Canceled`, the Stack Stalled `UpdateCanceled`
/// until its spec, source or a reconcile request changes. Copied onto the Update; echoed to
/// `status.observedCancelRequest`.
pub const CANCEL_REQUEST_ANNOTATION: &str = "pulumi.com/cancel-request";
/// Annotation whose every new value on a Stack asks to release the backend locks its last Update failed on (ours;
/// `kubectl pko unlock`): granted only when every holder named is known dead, else refused with a `StackUnlockRefused`
/// event; the next Update then carries the holders in [`RELEASE_LOCKS_ANNOTATION`] for `pulumi cancel`. Judged once no
/// Update runs; echoed to `status.observedUnlockRequest`.
pub const UNLOCK_REQUEST_ANNOTATION: &str = "pulumi.com/unlock-request";
/// Annotation on an Update (ours, written by the Stack controller on an accepted unlock request): the backend lock
/// holders its agent may release, one per line as `lock: created by <user@host> (pid <pid>) at <time>`
/// (`pko_proto::locks::describe`); passed to the agent as `release_locks`.
pub const RELEASE_LOCKS_ANNOTATION: &str = "pulumi.com/release-locks";
/// Annotation on an outputs Secret: JSON list of the output names that are secret.
pub const SECRET_OUTPUTS_ANNOTATION: &str = "pulumi.com/secrets";
/// Annotation on a workspace pod: hash of the Workspace generation and source (PKO `auto.pulumi.com/revision-hash`).
pub const REVISION_HASH_ANNOTATION: &str = "auto.pulumi.com/revision-hash";
/// Annotation on a workspace pod once the agent initialised it (PKO `auto.pulumi.com/initialized`).
pub const INITIALIZED_ANNOTATION: &str = "auto.pulumi.com/initialized";

/// Annotation on a drift check's Update (ours): `"true"` when its schedule remediates (`autoRemediate`), so the check's
/// result knows whether an `up --refresh` follows.
pub const DRIFT_AUTO_REMEDIATE_ANNOTATION: &str = "pulumi.com/drift-auto-remediate";
/// Label on objects generated for a Stack: `pulumi.com/component=stack`.
pub const STACK_COMPONENT_LABEL: &str = "pulumi.com/component";
/// Label carrying the Stack name on objects generated for it.
pub const STACK_NAME_LABEL: &str = "pulumi.com/stack-name";
/// Label on workspace objects (`auto.pulumi.com/component=workspace`) and outputs Secrets (`=update`).
pub const AUTO_COMPONENT_LABEL: &str = "auto.pulumi.com/component";
/// Label carrying the Workspace name on its generated Service and StatefulSet.
pub const WORKSPACE_NAME_LABEL: &str = "auto.pulumi.com/workspace-name";
/// Label carrying the virtual shard of a Stack and of everything made for it (our fleet's; see [`crate::shard`]).
pub const SHARD_LABEL: &str = "pulumi.com/shard";
/// Label carrying the number of virtual shards [`SHARD_LABEL`] was computed for (ours: the fleet's `--shards`,
/// decimal). The labeller rewrites both labels of an object whose count is not the fleet's, so a change of `--shards`
/// moves every object to its new shard.
pub const SHARDS_LABEL: &str = "pulumi.com/shards";
/// Label carrying the Update name on its outputs Secret.
pub const UPDATE_NAME_LABEL: &str = "auto.pulumi.com/update-name";

/// Field managers used for server-side apply (PKO 2.6+ writes every status with SSA).
pub mod field_manager {
    /// Objects the operator generates (Workspace, Service, StatefulSet) and the Stack finalizer.
    pub const OPERATOR: &str = "pulumi-kubernetes-operator";
    /// Stack status.
    pub const STACK_STATUS: &str = "pulumi-kubernetes-operator/stack-status";
    /// The Stack controller's finalizer on Updates.
    pub const STACK_FINALIZER: &str = "pulumi-kubernetes-operator/stack-finalizer";
    /// The reconcile-request annotation the operator writes on prerequisite Stacks.
    pub const PREREQUISITE_REQUEST: &str = "pulumi-kubernetes-operator/prerequisite-request";
    /// Workspace status.
    pub const WORKSPACE_STATUS: &str = "pulumi-kubernetes-operator/workspace-status";
    /// The Workspace's `status.pulumiVersion`, written by the Update dispatcher from the agent that ran an operation
    /// (agents of a pool start on demand, so only an operation meets one).
    pub const WORKSPACE_PULUMI_VERSION: &str = "pulumi-kubernetes-operator/workspace-pulumi-version";
    /// The Workspace's `Stalled` condition: written by the Update dispatcher from an operation's result (the workspace
    /// could not be installed or initialised) and by the Workspace controller (a spec it cannot run, a stall left from
    /// an earlier generation); each clears it by applying none.
    pub const WORKSPACE_STALLED: &str = "pulumi-kubernetes-operator/workspace-stalled";
    /// Update status.
    pub const UPDATE_STATUS: &str = "pulumi-kubernetes-operator/update-status";
}

/// Condition types and reasons of a Stack: the kstatus "ready protocol".
///
/// Ready=True stands alone; Ready=False always comes with exactly one of Reconciling=True or Stalled=True.
pub mod stack_condition {
    /// Condition type `Ready`.
    pub const READY: &str = "Ready";
    /// Condition type `Stalled`: did not run to completion and will not be retried until the spec changes.
    pub const STALLED: &str = "Stalled";
    /// Condition type `Reconciling`: being processed.
    pub const RECONCILING: &str = "Reconciling";

    /// Ready=False reason while reconciling.
    pub const NOT_READY_IN_PROGRESS: &str = "NotReadyInProgress";
    /// Ready=False message while reconciling.
    pub const NOT_READY_IN_PROGRESS_MESSAGE: &str = "reconciliation is in progress";
    /// Ready=False reason while stalled.
    pub const NOT_READY_STALLED: &str = "NotReadyStalled";
    /// Ready=False message while stalled.
    pub const NOT_READY_STALLED_MESSAGE: &str = "reconciliation is stalled";
    /// Ready=True reason.
    pub const PROCESSING_COMPLETED: &str = "ProcessingCompleted";
    /// Ready=True message.
    pub const PROCESSING_COMPLETED_MESSAGE: &str = "the stack has been processed and is up to date";

    /// Reconciling reason while the stack is processed.
    pub const STACK_PROCESSING: &str = "StackProcessing";
    /// Reconciling message while waiting for the workspace.
    pub const WAITING_FOR_WORKSPACE_MESSAGE: &str = "waiting for workspace readiness";
    /// Reconciling message while an update runs.
    pub const STACK_BEING_PROCESSED_MESSAGE: &str = "stack is being processed";
    /// Reconciling reason after a failed update that will be retried.
    pub const RETRYING_AFTER_FAILURE: &str = "RetryingAfterFailure";
    /// Reconciling reason after a failed preview (preview mode).
    pub const PREVIEW_FAILED: &str = "PreviewFailed";
    /// Reconciling reason (ours, `spec.approval.mode: manual`): a saved plan waits for its approval
    /// (`pulumi.com/approve-plan`).
    pub const AWAITING_APPROVAL: &str = "AwaitingApproval";
    /// Reconciling reason (ours): a StackRollout holds the Stack's new revision (`status.rollout` says why).
    pub const ROLLOUT_HELD: &str = "RolloutHeld";
    /// Reconciling reason while a prerequisite Stack is not satisfied.
    pub const PREREQUISITE_NOT_SATISFIED: &str = "PrerequisiteNotSatisfied";

    /// Stalled reason: the spec cannot be processed as it is.
    pub const SPEC_INVALID: &str = "SpecInvalid";
    /// Stalled reason: the source cannot be fetched.
    pub const SOURCE_UNAVAILABLE: &str = "SourceUnavailable";
    /// Stalled reason: the workspace's Pulumi CLI is too old for the spec (structured config needs ≥ 3.202.0).
    pub const PULUMI_VERSION_TOO_LOW: &str = "PulumiVersionTooLow";
    /// Stalled reason: the workspace failed (installation or initialisation).
    pub const WORKSPACE_FAILED: &str = "WorkspaceFailed";
    /// Stalled reason: the update failed [`MAX_UPDATE_FAILURES`] times.
    pub const UPDATE_FAILED: &str = "UpdateFailed";
    /// Stalled reason: its update was canceled on request (`pulumi.com/cancel-request`; ours).
    pub const UPDATE_CANCELED: &str = "UpdateCanceled";
    /// Stalled reason: the namespace is terminating while the Stack still needs its finalizer.
    pub const NAMESPACE_TERMINATING: &str = "NamespaceTerminating";
    /// Stalled reason: a conflicting update holds the stack lock (defined by PKO; ours sets it).
    pub const UPDATE_CONFLICT: &str = "UpdateConflict";

    /// Condition type of scheduled drift detection (PKO's proposed API, #1037): True when the last check found drift,
    /// False when it found none (or the drift was remediated), Unknown when it failed.
    pub const DRIFT_DETECTED: &str = "DriftDetected";
    /// `DriftDetected` reason: the last check found drifted resources (PKO's proposal).
    pub const DRIFT_CHANGES: &str = "Changes";
    /// `DriftDetected` reason: no drift (PKO's proposal), or it was remediated.
    pub const DRIFT_NO_CHANGES: &str = "NoChanges";
    /// `DriftDetected` reason (ours): the check itself failed; the next tick tries again.
    pub const DRIFT_CHECK_FAILED: &str = "CheckFailed";
    /// `DriftDetected` reason (ours): a schedule's cron does not parse; no checks run.
    pub const DRIFT_INVALID_SCHEDULE: &str = "InvalidSchedule";
    /// `DriftDetected` reason (ours), Unknown: the first check is due and waits for a fleet-wide slot
    /// (`--max-concurrent-drift-checks`); a later deferral keeps the last check's reason and says so in the message.
    pub const DRIFT_CHECK_DEFERRED: &str = "CheckDeferred";

    /// Number of failed attempts after which a Stack is Stalled `UpdateFailed` (PKO 2.8 `maxUpdateFailures`).
    pub const MAX_UPDATE_FAILURES: i64 = 3;
}

/// Condition types and reasons of a Workspace.
pub mod workspace_condition {
    /// Condition type `Ready`.
    pub const READY: &str = "Ready";
    /// Condition type `Stalled`.
    pub const STALLED: &str = "Stalled";
    /// Ready=False: the Workspace is being deleted.
    pub const DELETING: &str = "Deleting";
    /// Ready=False: the workspace pods are being rolled out.
    pub const ROLLING_UPDATE: &str = "RollingUpdate";
    /// Ready=False: waiting for workspace replicas.
    pub const WAITING_FOR_REPLICAS: &str = "WaitingForReplicas";
    /// Ready=False: the agent cannot be reached.
    pub const CONNECTION_FAILED: &str = "ConnectionFailed";
    /// Ready=False: `pulumi install` is running.
    pub const INSTALLING: &str = "Installing";
    /// Ready=False: stacks are being selected and configured.
    pub const INITIALIZING: &str = "Initializing";
    /// Ready=False and Stalled: `pulumi install` failed.
    pub const INSTALLATION_FAILED: &str = "InstallationFailed";
    /// Ready=False and Stalled: stack selection or configuration failed.
    pub const INITIALIZATION_FAILED: &str = "InitializationFailed";
    /// Ready=False and Stalled: the spec needs a newer Pulumi CLI.
    pub const INCOMPATIBLE_CONFIGURATION: &str = "IncompatibleConfiguration";
    /// Ready=False and Stalled: a field holds a value this version cannot run with (e.g. an unknown `securityProfile`;
    /// PKO's schema admits any string). Ours; PKO has no such reason.
    pub const SPEC_INVALID: &str = "SpecInvalid";
    /// Ready=True.
    pub const SUCCEEDED: &str = "Succeeded";
    /// Ready=False: the Workspace has no source and the operator's runtime runs no workspace pod whose init container
    /// could bring the program (`--runtime local`). Ours; PKO always runs pods.
    pub const NO_SOURCE: &str = "NoSource";

    /// Stalled reasons an operation's result sets (the workspace could not be prepared for it); an Update may still run
    /// on such a Workspace — that is how it recovers.
    pub const OPERATION_STALLS: &[&str] = &[INSTALLATION_FAILED, INITIALIZATION_FAILED, INCOMPATIBLE_CONFIGURATION];
}

/// Condition types and reasons of an Update.
pub mod update_condition {
    /// Condition type `Progressing`.
    pub const PROGRESSING: &str = "Progressing";
    /// Condition type `Complete`.
    pub const COMPLETE: &str = "Complete";
    /// Condition type `Failed`.
    pub const FAILED: &str = "Failed";

    /// Progressing reason while running.
    pub const REASON_PROGRESSING: &str = "Progressing";
    /// Progressing=False reason once complete.
    pub const REASON_COMPLETE: &str = "Complete";
    /// Progressing=False / Complete reason when the update failed.
    pub const REASON_FAILED: &str = "Failed";
    /// Progressing=False: the Workspace does not exist.
    pub const WORKSPACE_NOT_FOUND: &str = "WorkspaceNotFound";
    /// Progressing=False: the Workspace is not Ready.
    pub const WORKSPACE_NOT_READY: &str = "WorkspaceNotReady";
    /// Progressing=False: a transient error (e.g. the agent was unreachable); retried.
    pub const TRANSIENT_FAILURE: &str = "TransientFailure";
    /// Progressing=False: queued, not started, and why (its namespace runs all the operations its share of the workers
    /// allows). Ours; PKO starts every Update at once.
    pub const QUEUED: &str = "Queued";
    /// Complete=True reason.
    pub const UPDATED: &str = "Updated";
    /// Failed=False reason on success.
    pub const UPDATE_SUCCEEDED: &str = "UpdateSucceeded";
    /// Failed=True: the engine summary says the operation did not succeed.
    pub const UPDATE_FAILED: &str = "UpdateFailed";
    /// Failed=True: an unexpected (gRPC `Unknown`) error.
    pub const UNKNOWN: &str = "Unknown";
    /// Failed=True: PKO marks a Progressing update Aborted after an operator restart (ours re-attaches instead).
    pub const ABORTED: &str = "Aborted";
    /// Failed=True: the update was deleted or orphaned before it ran.
    pub const CANCELED: &str = "Canceled";
    /// Failed=True: the operation sent no event for its idle timeout and was stopped (PKO PR #1296).
    pub const IDLE_TIMEOUT: &str = "IdleTimeout";
    /// Failed=True: the operation ran past its timeout and was stopped (ours).
    pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
    /// Failed=True: another update holds the stack lock (agent `PulumiErrorInfo.reason`).
    pub const UPDATE_CONFLICT: &str = "UpdateConflict";
    /// Failed=True: the backend refused the access token.
    pub const INVALID_ACCESS_TOKEN: &str = "InvalidAccessToken";
    /// Failed=True (ours): what would run is not what the Update names in `spec.runDigest` — its Workspace changed
    /// since the Update was made, or the agent found the request or the stack config it wrote to differ. Nothing ran;
    /// the Stack makes a new Update for what it asks now.
    pub const RUN_MISMATCH: &str = "RunMismatch";
}

/// Kubernetes event reasons PKO emits, by object kind.
pub mod event_reason {
    /// Stack: a sync was started (Normal).
    pub const STACK_UPDATE_DETECTED: &str = "StackUpdateDetected";
    /// Stack: the spec is invalid (Warning).
    pub const STACK_CONFIG_INVALID: &str = "StackConfigInvalid";
    /// Stack: an update failed (Warning).
    pub const STACK_UPDATE_FAILURE: &str = "StackUpdateFailure";
    /// Stack: an update succeeded (Normal, "Successfully updated stack").
    pub const STACK_CREATED: &str = "StackCreated";
    /// Stack: an update failed because another update holds the stack's backend lock (Warning). PKO declares it but
    /// never emits it (PKO #736); ours does, naming the lock and how the Stack proceeds.
    pub const STACK_UPDATE_CONFLICT_DETECTED: &str = "StackUpdateConflictDetected";
    /// Stack (ours): an unlock request was accepted — every lock holder is known dead; the next Update releases the
    /// locks (Normal, naming each holder and why it is dead).
    pub const STACK_UNLOCK_ACCEPTED: &str = "StackUnlockAccepted";
    /// Stack (ours): an unlock request was refused — a holder may still be alive, or no holder is known (Warning,
    /// naming the holder).
    pub const STACK_UNLOCK_REFUSED: &str = "StackUnlockRefused";
    /// Stack: a drift check found drifted resources (Warning here; PKO's proposal: Normal); the note names them.
    pub const STACK_DRIFT_DETECTED: &str = "StackDriftDetected";
    /// Stack (ours): a drift check failed (Warning).
    pub const STACK_DRIFT_CHECK_FAILED: &str = "StackDriftCheckFailed";
    /// Stack (ours, `spec.approval.mode: manual`): a preview saved a plan that awaits approval (Normal, naming the
    /// plan, its change summary and how to approve it).
    pub const STACK_APPROVAL_REQUIRED: &str = "StackApprovalRequired";
    /// Stack (ours): the pending plan was approved; its constrained `up` was made (Normal).
    pub const STACK_PLAN_APPROVED: &str = "StackPlanApproved";
    /// Stack (ours): a `pulumi.com/approve-plan` value that names no pending plan (superseded, applied, never saved)
    /// was refused (Warning, naming the pending plan if any).
    pub const STACK_APPROVAL_REFUSED: &str = "StackApprovalRefused";
    /// Stack (ours): a pending plan was superseded by a new revision, config or sync request before its approval
    /// (Normal).
    pub const STACK_PLAN_SUPERSEDED: &str = "StackPlanSuperseded";
    /// Stack: its Workspace was deleted by `workspaceReclaimPolicy: Delete` (Normal).
    pub const WORKSPACE_DELETED: &str = "WorkspaceDeleted";
    /// Workspace: the StatefulSet was recreated (Warning).
    pub const MIGRATED: &str = "Migrated";
    /// Workspace: the agent could not be reached (Warning).
    pub const CONNECTION_FAILURE: &str = "ConnectionFailure";
    /// Workspace: `pulumi install` failed (Warning).
    pub const INSTALLATION_FAILURE: &str = "InstallationFailure";
    /// Workspace: stack initialisation failed (Warning).
    pub const STACK_INITIALIZATION_FAILURE: &str = "StackInitializationFailure";
    /// Workspace: initialised (Normal).
    pub const INITIALIZED: &str = "Initialized";
    /// Update: failed (Warning).
    pub const UPDATE_FAILED: &str = "UpdateFailed";
    /// Update: succeeded (Normal).
    pub const UPDATE_SUCCEEDED: &str = "UpdateSucceeded";
    /// Update: deleted after `ttlAfterCompleted` (Normal).
    pub const UPDATE_EXPIRED: &str = "UpdateExpired";
}

/// Value of secret outputs in `Stack.status.outputs` (PKO masks secret outputs with this string).
pub const SECRET_MASK: &str = "[secret]";
