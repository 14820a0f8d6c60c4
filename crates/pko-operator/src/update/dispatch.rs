//! One Update run on an agent lent to it, in named steps, each with its own error variant (a metric label,
//! [`DispatchError::step`]):
//!
//! 1. **prepare** — the agent request, its Secret and ConfigMap references, `envFrom` and GitHub App credentials
//!    resolved ([`request_for`]); a user's mistake fails the Update with it;
//! 2. **connect** — the agent's gRPC client ([`crate::agents::client::streaming`]);
//! 3. **mark started** — the Update `Progressing` with its start time, before any agent can have it;
//! 4. **call** — `Run`, with the fence's deadline and the agent's token;
//! 5. **follow** — the event stream, until the result;
//! 6. **record** — the outputs Secret, then one status write from the pure [`super::status::finished`]; then the
//!    effects: the event, the Workspace's Stalled verdict ([`crate::stalled`], the shared contract) and
//!    `pulumiVersion`.
//!
//! The operation id is derived from the Update (`<namespace>/<name>/<uid>`), so running it again after an operator
//! restart re-attaches to the running operation instead of starting a second one (the agent follows a known id), and
//! nothing is marked Aborted. Every write stands behind the fence.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};
use pko_api::constants::{event_reason, field_manager, update_condition as uc};
use pko_api::update::UpdateStatus;
use pko_api::{Update, Workspace};
use pko_proto::v1::{CancelRequest, OperationRequest, OperationResult, ResultStatus, operation_event::Event};
use tokio::time::Instant;

use super::capture::Capture;
use super::fence::{Fence, Fenced};
use super::limits::{self, Limit, Limits};
use super::status::{self, Phase};
use crate::agents::Lent;
use crate::agents::client::{self, Client};
use crate::agents::request::{self, Incomplete};
use crate::outputs;

/// Why an Update could not be run to a result, by step.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// prepare: the API server did not answer a read of the operation's Secrets and ConfigMaps (retried later).
    #[error("reading the operation's Secrets and ConfigMaps: {0}")]
    Values(String),
    /// connect, call or follow: the agent could not be reached or refused the call (retried later: `TransientFailure`).
    #[error("agent {0}: {1}")]
    Agent(String, String),
    /// call: the agent refused to start the operation because it runs another one or is shutting down (`UNAVAILABLE`):
    /// nothing ran; a pool lends another agent later.
    #[error("agent {0}: {1}")]
    Busy(String, String),
    /// call: the agent refused the request as invalid (`INVALID_ARGUMENT`, its details naming the field): nothing ran,
    /// and the same request would be refused again — the Update fails with it.
    #[error("agent {0} refused the request: {1}")]
    Refused(String, String),
    /// follow: the stream ended without a result (the agent went away): the Update is dispatched again.
    #[error("the operation stream ended without a result")]
    NoResult,
    /// mark started or record: writing status or the outputs Secret failed.
    #[error("writing update status: {0}")]
    Kube(#[from] kube::Error),
    /// mark started, or a refusal before it: the Update claimed from the cache had changed since (409 on the write
    /// pinned to its `resourceVersion`) and, read fresh, is no longer one to start here (started or complete elsewhere,
    /// or being deleted): nothing ran, nothing was written.
    #[error("the Update changed since it was claimed; not started here")]
    Stale,
    /// any step: the shard moved to another replica (or this one stopped holding anything): nothing more is written;
    /// the shard's new holder follows the operation.
    #[error("{0}")]
    Fenced(#[from] Fenced),
}

impl DispatchError {
    /// The step that failed, as the `step` label of `pko_dispatch_errors_total`.
    pub fn step(&self) -> &'static str {
        match self {
            DispatchError::Values(_) => "prepare",
            DispatchError::Agent(..) => "connect",
            DispatchError::Busy(..) => "busy",
            DispatchError::Refused(..) => "refused",
            DispatchError::NoResult => "follow",
            DispatchError::Kube(_) => "record",
            DispatchError::Stale => "claim",
            DispatchError::Fenced(_) => "fenced",
        }
    }
}

/// One operation: the Update, its Workspace, the agent lent to it and the fence it runs behind.
pub struct Operation<'a> {
    /// Client of the API server.
    pub client: &'a kube::Client,
    /// The Update controller's event recorders.
    pub events: &'a crate::k8s::Events,
    /// Where GitHub App git credentials are exchanged for an installation token (`--github-api-url`).
    pub github_api_url: &'a str,
    /// This replica's artifact server as agents reach it (host:port, `--program-fs-adv-addr`): a mirror of a Program
    /// artifact another replica published ([`request::mirror_artifact`]).
    pub artifact_addr: &'a str,
    /// The Update, as read when its job was claimed.
    pub update: &'a Update,
    /// Its Workspace.
    pub workspace: &'a Workspace,
    /// The agent (address and token).
    pub agent: &'a Lent,
    /// The job's fence.
    pub fence: &'a Fence<'a>,
    /// Called once, at the first event of the operation on its agent (Pulumi started, or a re-attach).
    pub started: &'a (dyn Fn() + Send + Sync),
    /// Where the lines the operation prints are kept ([`super::capture`]).
    pub output: &'a dyn pko_queue::output::OutputStore,
    /// Where saved plans are kept ([`super::plans`]).
    pub plans: &'a dyn pko_queue::plans::PlanStore,
    /// Where the outputs it writes are handed to this replica's Stack controller.
    pub outputs: &'a crate::outputs::Written,
    /// The Secrets its request names, read only when changed.
    pub secrets: &'a crate::secret_cache::SecretCache,
    /// The operator's default limits ([`super::limits`]), for an Update that sets none.
    pub limits: Limits,
    /// The cancel request of this operation, if one came ([`super::cancel`]).
    pub cancel: &'a (dyn Fn() -> Option<String> + Send + Sync),
}

impl Operation<'_> {
    fn api(&self) -> Api<Update> {
        Api::namespaced(self.client.clone(), &self.update.namespace().unwrap_or_default())
    }

    fn agent_error(&self, e: impl std::fmt::Display) -> DispatchError {
        DispatchError::Agent(self.agent.address.clone(), e.to_string())
    }
}

/// Runs `op` to its result and records it on the Update. An `INTERRUPTED` result (the agent shuts down) is returned
/// without marking the Update failed, so the caller runs it again; a request the user must fix ends the Update `Failed`
/// with it and is returned as a failed result.
///
/// Errors: [`DispatchError`], by step; once fenced nothing more is written — a replica that was frozen and wakes up
/// with a result in its buffers does not write it.
pub async fn run(op: &Operation<'_>) -> Result<OperationResult, DispatchError> {
    let mut st = op.update.status.clone().unwrap_or_default();
    st.observed_generation = op.update.meta().generation;
    let limits = match limits::of(&op.update.spec, op.limits.idle, op.limits.overall) {
        Ok(l) => l,
        Err(message) => return refuse(op, st, uc::UNKNOWN, message, Pin::AsClaimed).await,
    };
    let req = match request_for(op).await? {
        Ok(r) => r,
        Err(message) => return refuse(op, st, uc::UNKNOWN, message, Pin::AsClaimed).await,
    };
    if let Err(message) = check_run(op.update, op.workspace, &req) {
        tracing::warn!(%message, "not started: not what the Update names");
        metrics::counter!(crate::metric_names::RUN_MISMATCHES_TOTAL, "check" => "dispatch").increment(1);
        return refuse(op, st, uc::RUN_MISMATCH, message, Pin::AsClaimed).await;
    }
    if let Some(request) = (op.cancel)().filter(|_| !op.update.was_started()) {
        return refuse(op, st, uc::CANCELED, super::cancel::message(&request), Pin::AsClaimed).await;
    }
    let mut agent = client::streaming(&op.agent.address).await.map_err(|e| op.agent_error(e))?;
    mark_started(op, &mut st).await?;
    let stream = match call(op, &mut agent, req).await {
        Err(e @ DispatchError::Refused(..)) => return refuse(op, st, uc::UNKNOWN, e.to_string(), Pin::No).await,
        called => called?,
    };
    let started = instant_of(st.start_time.as_ref());
    let followed = follow(op, stream, &limits, started).await?;
    if followed.result.status != ResultStatus::Interrupted as i32 {
        record(op, st, &followed.result, followed.limit).await?;
    }
    Ok(followed.result)
}

/// The instant of `start` (the Update's `status.startTime`, written before the operation could start), so an overall
/// deadline counts from the operation's start across a handoff; now when unset.
fn instant_of(start: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Instant {
    let now = Instant::now();
    let age =
        start.and_then(|t| std::time::Duration::try_from(k8s_openapi::jiff::Timestamp::now().duration_since(t.0)).ok());
    age.and_then(|a| now.checked_sub(a)).unwrap_or(now)
}

/// Step **prepare**: the agent request for the Update at the job's epoch, with its Secret and ConfigMap references and
/// the Workspace's `envFrom` resolved with the operator's identity in the Update's namespace (a workspace's service
/// account needs no RBAC beyond PKO's) and GitHub App credentials exchanged. `Ok(Err(message))`: the user's to fix (the
/// Update fails with it).
///
/// Errors: [`DispatchError::Values`], transient.
async fn request_for(op: &Operation<'_>) -> Result<Result<OperationRequest, String>, DispatchError> {
    let ns = op.update.namespace().unwrap_or_default();
    let mut r =
        match request::build(&op.update.operation_id(), op.fence.job().epoch, &ns, &op.workspace.spec, &op.update.spec)
        {
            Ok(r) => r,
            Err(e) => return Ok(Err(e.to_string())),
        };
    request::mirror_artifact(&mut r, &ns, op.artifact_addr);
    r.run_digest = op.update.spec.run_digest.clone().unwrap_or_default();
    r.release_locks = request::release_locks(
        op.update.annotations().get(pko_api::constants::RELEASE_LOCKS_ANNOTATION).map(String::as_str),
    );
    if let Err(message) = super::plans::attach(op.plans, op.update, &mut r).await.map_err(DispatchError::Values)? {
        return Ok(Err(message));
    }
    match request::complete(
        op.client,
        op.secrets,
        &ns,
        op.workspace.spec.env_from.as_deref().unwrap_or_default(),
        op.github_api_url,
        r,
    )
    .await
    {
        Ok(r) => Ok(Ok(r)),
        Err(Incomplete::User(message)) => Ok(Err(message)),
        Err(Incomplete::Transient(message)) => Err(DispatchError::Values(message)),
    }
}

/// Whether `req`, built from `workspace`, is what `update` names (its `spec.runDigest`), checked before the operation
/// first starts. A started one is not refused here: its agent re-attaches to what it runs, or checks the request itself
/// (`OperationRequest.run_digest`). `Err`: the Update's message. Pure.
pub fn check_run(update: &Update, workspace: &Workspace, req: &OperationRequest) -> Result<(), String> {
    let Some(expected) = update.spec.run_digest.as_deref().filter(|_| !update.was_started()) else { return Ok(()) };
    let found = pko_proto::digest::run_digest(req);
    if found == expected {
        return Ok(());
    }
    let (want, have) = (update.spec.workspace_generation, workspace.metadata.generation);
    Err(format!(
        "not run: the Update was made for Workspace {} at generation {} (run digest {expected}); the Workspace is at \
            generation {} now \
         (run digest {found}); its Stack makes a new Update for what it asks now",
        workspace.name_any(),
        want.map_or("?".into(), |g| g.to_string()),
        have.map_or("?".into(), |g| g.to_string()),
    ))
}

/// Whether a status write is pinned to the `resourceVersion` the Update was claimed at: the first write of a dispatch
/// is (the claim may come from the cache), later ones follow this dispatch's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pin {
    /// Pinned: refused with 409 when the Update changed since the claim.
    AsClaimed,
    /// Not pinned.
    No,
}

/// An operation that does not run — a request the user must fix (`Unknown`), a cancel request that came first
/// (`Canceled`): the Update ends `Failed` with `reason` and `message`, returned as a failed result. Before *mark
/// started* the write is pinned ([`Pin`]): on a conflict nothing is written ([`DispatchError::Stale`]) and the Update's
/// next reconcile decides again on what is stored.
async fn refuse(
    op: &Operation<'_>,
    mut st: UpdateStatus,
    reason: &str,
    message: String,
    pin: Pin,
) -> Result<OperationResult, DispatchError> {
    let now = pko_api::conditions::now();
    let phase = Phase::Failed { reason: reason.into(), message: message.clone() };
    st.conditions =
        Some(status::conditions(&phase, st.observed_generation, &now, st.conditions.as_deref().unwrap_or_default()));
    st.message = Some(message.clone());
    st.end_time = Some(now);
    op.fence.check()?;
    match write_status_at(&op.api(), op.update, &st, pin).await {
        Err(e) if crate::k8s::is_conflict(&e) && pin == Pin::AsClaimed => return Err(DispatchError::Stale),
        written => written?,
    }
    Ok(OperationResult { status: ResultStatus::Failed as i32, message, ..Default::default() })
}

/// Step **mark started**: the Update `Progressing` with its start time before any agent can have it (PKO marks it
/// before it connects), so whoever dispatches it next looks for the agent that may run it ([`Update::was_started`]).
/// Written once, pinned to the claimed `resourceVersion` ([`Pin`]); when the Update changed since, it is read fresh and
/// started only if it still may be ([`super::controller::claimable_as_cached`]), else [`DispatchError::Stale`].
async fn mark_started(op: &Operation<'_>, st: &mut UpdateStatus) -> Result<(), DispatchError> {
    let old = st.conditions.clone().unwrap_or_default();
    if st.start_time.is_some() && old.iter().any(|c| c.type_ == uc::PROGRESSING && c.status == "True") {
        return Ok(());
    }
    st.start_time.get_or_insert_with(pko_api::conditions::now);
    let mut conditions =
        status::conditions(&Phase::Progressing, st.observed_generation, &pko_api::conditions::now(), &old);
    status::name_agent(&mut conditions, &op.agent.address);
    st.conditions = Some(conditions);
    op.fence.check()?;
    match write_status_at(&op.api(), op.update, st, Pin::AsClaimed).await {
        Err(e) if crate::k8s::is_conflict(&e) => {
            let fresh = op.api().get_opt(&op.update.name_any()).await?;
            if !fresh.as_ref().is_some_and(super::controller::claimable_as_cached) {
                return Err(DispatchError::Stale);
            }
            op.fence.check()?;
            write_status(&op.api(), op.update, st).await?;
        }
        written => written?,
    }
    Ok(())
}

/// Step **call**: `Run` on the agent, the last moment before the operation can start. This replica may still be frozen
/// right after the fence's check; the agent then refuses the call by the deadline it carries (the shard's new holder
/// may run the operation on another agent meanwhile).
async fn call(
    op: &Operation<'_>,
    agent: &mut Client,
    mut req: OperationRequest,
) -> Result<tonic::Streaming<pko_proto::v1::OperationEvent>, DispatchError> {
    op.fence.check()?;
    req.not_after = op.fence.not_after().map(timestamp);
    let call = client::authorized(req, op.agent.token.as_deref()).map_err(|e| op.agent_error(e))?;
    let stream = agent.run(call).await.map_err(|s| match s.code() {
        tonic::Code::Unavailable => {
            DispatchError::Busy(op.agent.address.clone(), format!("{}: {}", s.code(), s.message()))
        }
        tonic::Code::InvalidArgument => DispatchError::Refused(op.agent.address.clone(), s.message().to_string()),
        _ => op.agent_error(format!("{}: {}", s.code(), s.message())),
    })?;
    Ok(stream.into_inner())
}

/// What following an operation gave: its result, and the limit that stopped it, if one did.
struct Followed {
    result: OperationResult,
    limit: Option<Limit>,
}

/// Step **follow**: the operation's events until its result; [`Operation::started`] at the first; the lines they read
/// as kept in the output store as they come ([`Capture`]); a limit reached stops it ([`limit`]).
async fn follow(
    op: &Operation<'_>,
    mut stream: tonic::Streaming<pko_proto::v1::OperationEvent>,
    limits: &Limits,
    started: Instant,
) -> Result<Followed, DispatchError> {
    let ns = op.update.namespace().unwrap_or_default();
    let kind = op.update.spec.update_type.as_ref().map(pko_api::UpdateType::label).unwrap_or("up");
    let mut capture = Capture::new(op.output, &ns, op.workspace.name_any().as_str(), &op.update.name_any(), kind);
    let (mut first, mut last_event, mut stopping) = (true, Instant::now(), None);
    loop {
        let limit_at = match stopping {
            Some((_, give_up)) => Some(give_up),
            None => limits.next(started, last_event).map(|(at, _)| at),
        };
        let poll = Some(Instant::now() + limits::CANCEL_POLL).filter(|_| stopping.is_none());
        let next = match [capture.deadline(), limit_at, poll].into_iter().flatten().min() {
            Some(at) => tokio::time::timeout_at(at, stream.next()).await,
            None => Ok(stream.next().await),
        };
        let Ok(next) = next else {
            capture.flush().await;
            if let Some(given_up) = limit(op, limits, started, last_event, &mut stopping).await? {
                return Ok(given_up);
            }
            continue;
        };
        let Some(ev) = next else { break };
        let ev = ev.map_err(|s| op.agent_error(s.message()))?;
        last_event = Instant::now();
        if std::mem::take(&mut first) {
            (op.started)();
        }
        capture.take(&ev).await;
        if let Some(Event::Result(result)) = ev.event {
            return Ok(Followed { result, limit: stopping.map(|(l, _)| l) });
        }
    }
    capture.flush().await;
    Err(DispatchError::NoResult)
}

/// Step **limit** (on a timer while following): a limit reached stops the operation on its agent ([`stop`]); one asked
/// to stop that has not ended after [`limits::STOP_WAIT`] is given up — the Update is recorded failed by the limit
/// without the agent's result.
async fn limit(
    op: &Operation<'_>,
    limits: &Limits,
    started: Instant,
    last_event: Instant,
    stopping: &mut Option<(Limit, Instant)>,
) -> Result<Option<Followed>, DispatchError> {
    let now = Instant::now();
    if let Some((limit, give_up)) = stopping.as_ref() {
        if now < *give_up {
            return Ok(None);
        }
        let message = format!(
            "the agent did not end the operation within {} s of being asked to stop",
            limits::STOP_WAIT.as_secs()
        );
        return Ok(Some(Followed {
            result: OperationResult { status: ResultStatus::Failed as i32, message, ..Default::default() },
            limit: Some(limit.clone()),
        }));
    }
    let reached = match (op.cancel)() {
        Some(request) => Some(Limit::Requested(request)),
        None => limits.next(started, last_event).filter(|(at, _)| now >= *at).map(|(_, l)| l),
    };
    if let Some(limit) = reached {
        tracing::info!(update = %op.update.name_any(), reason = limit.reason(), "{}", limit.message());
        stop(op).await?;
        metrics::counter!(crate::metric_names::OPERATIONS_STOPPED_TOTAL, "reason" => limit.reason()).increment(1);
        *stopping = Some((limit, now + limits::STOP_WAIT));
    }
    Ok(None)
}

/// Step **stop**: `Cancel` on the agent at the job's epoch, fenced like every agent call — CTRL-C to Pulumi, a hard
/// stop after the agent's grace period.
///
/// Errors: [`DispatchError::Fenced`]; [`DispatchError::Agent`] when the agent did not take it (the dispatch is retried,
/// and the limit fires again on the re-attached operation).
async fn stop(op: &Operation<'_>) -> Result<(), DispatchError> {
    op.fence.check()?;
    let mut agent = client::control(&op.agent.address).await.map_err(|e| op.agent_error(e))?;
    let req = CancelRequest {
        operation_id: op.update.operation_id(),
        epoch: op.fence.job().epoch,
        grace_seconds: limits::STOP_GRACE_SECONDS,
    };
    let call = client::authorized(req, op.agent.token.as_deref()).map_err(|e| op.agent_error(e))?;
    agent.cancel(call).await.map_err(|s| op.agent_error(format!("cancel: {}: {}", s.code(), s.message())))?;
    Ok(())
}

/// Step **record**: the outputs Secret of a succeeded `up`, the Update's status in one write, then the effects (event,
/// the Workspace's Stalled verdict and `pulumiVersion`).
async fn record(
    op: &Operation<'_>,
    st: UpdateStatus,
    result: &OperationResult,
    limit: Option<Limit>,
) -> Result<(), DispatchError> {
    let (mut phase, mut message) = match &limit {
        Some(l) => (Phase::Failed { reason: l.reason().into(), message: l.message() }, l.message()),
        None => status::phase_of(&op.update.spec, result),
    };
    // a preview's plan is kept before the Update says it succeeded: nothing waits on a plan not kept
    let plan = super::plans::keep(op.plans, op.update, result).await.unwrap_or_else(|why| {
        (phase, message) = (Phase::Failed { reason: uc::UNKNOWN.into(), message: why.clone() }, why);
        None
    });
    let outputs = if phase == Phase::Succeeded && op.update.spec.update_type == Some(pko_api::UpdateType::Up) {
        write_outputs(op, result).await?
    } else {
        None
    };
    let st = status::finished(
        st,
        (&phase, message),
        result,
        op.update.meta().generation,
        outputs,
        &pko_api::conditions::now(),
    );
    let st = UpdateStatus { plan, ..st };
    op.fence.check()?;
    write_status(&op.api(), op.update, &st).await?;
    op.fence.check()?;
    let succeeded = phase == Phase::Succeeded;
    let (severity, reason) = if succeeded {
        (crate::k8s::Severity::Normal, event_reason::UPDATE_SUCCEEDED)
    } else {
        (crate::k8s::Severity::Warning, event_reason::UPDATE_FAILED)
    };
    let stack = op.update.spec.stack_name.as_deref().unwrap_or_default();
    // the first error, as today: the Update's message carries all of them
    let first = limit
        .as_ref()
        .map(Limit::message)
        .unwrap_or_else(|| result.message.lines().next().unwrap_or_default().to_string());
    let note = status::event_note(op.update.spec.update_type.as_ref(), stack, succeeded, &first);
    crate::k8s::publish(&op.events.update, op.update, severity, reason, note).await;
    // PKO's Workspace lifecycle: an operation that could not prepare its workspace stalls it (Ready
    // False with the stall's reason, the Stack Stalled WorkspaceFailed), one that could clears it
    op.fence.check()?;
    crate::stalled::record(op.client, op.events, op.workspace, &crate::stalled::verdict(result), stack).await;
    op.fence.check()?;
    crate::stalled::record_pulumi_version(op.client, op.workspace, &result.pulumi_version).await;
    Ok(())
}

/// The outputs Secret of the Update (immutable; one written before a restart is kept), owned by the Update's owner; its
/// name, or `None` when the Update has no controller owner.
async fn write_outputs(op: &Operation<'_>, result: &OperationResult) -> Result<Option<String>, DispatchError> {
    let values: BTreeMap<String, (serde_json::Value, bool)> = result
        .outputs
        .iter()
        .map(|(k, v)| (k.clone(), (serde_json::from_slice(&v.value).unwrap_or(serde_json::Value::Null), v.secret)))
        .collect();
    let Some(mut owner) = op.update.controller_owner_ref(&()) else { return Ok(None) };
    owner.controller = Some(false);
    let ns = op.update.namespace().unwrap_or_default();
    let secret = outputs::secret(&op.update.name_any(), &ns, owner, &values);
    op.fence.check()?;
    match Api::<Secret>::namespaced(op.client.clone(), &ns).create(&PostParams::default(), &secret).await {
        Ok(_) => op.outputs.wrote(op.update.metadata.uid.as_deref().unwrap_or_default(), &secret).await,
        Err(kube::Error::Api(e)) if e.code == 409 => {} // written before a restart; immutable
        Err(e) => return Err(e.into()),
    }
    Ok(Some(outputs::secret_name(&op.update.name_any())))
}

async fn write_status(api: &Api<Update>, update: &Update, st: &UpdateStatus) -> Result<(), kube::Error> {
    write_status_at(api, update, st, Pin::No).await
}

async fn write_status_at(api: &Api<Update>, update: &Update, st: &UpdateStatus, pin: Pin) -> Result<(), kube::Error> {
    let at = if pin == Pin::AsClaimed { update.metadata.resource_version.as_deref() } else { None };
    crate::k8s::apply_status_versioned(api, &update.name_any(), field_manager::UPDATE_STATUS, st, at).await.map(|_| ())
}

/// `t` as a protobuf timestamp (seconds and nanoseconds since the Unix epoch; times before it as 0).
fn timestamp(t: std::time::SystemTime) -> prost_types::Timestamp {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp { seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nanos: d.subsec_nanos() as i32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dispatch_failure_names_its_step() {
        let steps: Vec<_> = [
            DispatchError::Values("x".into()),
            DispatchError::Agent("a".into(), "x".into()),
            DispatchError::Busy("a".into(), "x".into()),
            DispatchError::NoResult,
            DispatchError::Fenced(Fenced),
        ]
        .iter()
        .map(DispatchError::step)
        .collect();
        assert_eq!(steps, ["prepare", "connect", "busy", "follow", "fenced"]);
    }

    #[test]
    fn only_what_the_update_names_starts() {
        let ws = |generation: i64, n: &str| -> Workspace {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "w", "generation": generation},
                "spec": {"local": {"dir": "/p"}, "stacks": [{"name": "dev", "config": [{"key": "n", "value": n}]}]}}))
            .unwrap()
        };
        let mut u: Update = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "u"}, "spec": {"stackName": "dev", "type": "up"}}),
        )
        .unwrap();
        let spec = u.spec.clone();
        let req = |w: &Workspace| request::build("id", 1, "ns", &w.spec, &spec).unwrap();
        assert!(check_run(&u, &ws(1, "0"), &req(&ws(1, "0"))).is_ok(), "an Update that names no digest (made by hand)");
        u.spec.workspace_generation = Some(2);
        u.spec.run_digest = Some(request::run_digest("ns", &ws(2, "1").spec, &u.spec).unwrap());
        assert!(check_run(&u, &ws(2, "1"), &req(&ws(2, "1"))).is_ok(), "the Workspace it was made for");
        let stale = check_run(&u, &ws(1, "0"), &req(&ws(1, "0"))).unwrap_err();
        assert!(
            stale.contains("made for Workspace w at generation 2")
                && stale.contains("is at generation 1 now (run digest"),
            "{stale}"
        );
        u.status =
            Some(pko_api::update::UpdateStatus { start_time: Some(pko_api::conditions::now()), ..Default::default() });
        assert!(
            check_run(&u, &ws(1, "0"), &req(&ws(1, "0"))).is_ok(),
            "started: its agent re-attaches or checks the request itself"
        );
    }

    #[test]
    fn timestamps_are_seconds_and_nanos_since_the_epoch() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::new(5, 7);
        assert_eq!(timestamp(t), prost_types::Timestamp { seconds: 5, nanos: 7 });
        assert_eq!(timestamp(std::time::UNIX_EPOCH - std::time::Duration::from_secs(1)).seconds, 0);
    }
}
