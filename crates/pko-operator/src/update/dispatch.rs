//! Runs one Update on an agent and writes its progress and result to the Update's status (and the
//! outputs Secret). The operation id is derived from the Update (`<namespace>/<name>/<uid>`), so calling
//! [`run_on_agent`] again after an operator restart re-attaches to the running operation instead of
//! starting a second one (the agent follows a known id), and nothing is marked Aborted.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};
use pko_api::constants::field_manager;
use pko_api::update::UpdateStatus;
use pko_api::workspace::ProjectInfo;
use pko_api::{Update, Workspace};
use pko_proto::v1::agent_client::AgentClient;
use pko_proto::v1::{ErrorReason, OperationResult, ResultStatus, operation_event::Event};

use super::status::{self, Phase, pko_proto_reason::Reason};
use super::{request, values};
use crate::outputs;

/// Why an Update could not be run to a result.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The agent could not be reached or refused the call (retried later: `TransientFailure`).
    #[error("agent {0}: {1}")]
    Agent(String, String),
    /// The agent refused to start the operation because it runs another one or is shutting down
    /// (`UNAVAILABLE`): nothing ran; a pool lends another agent later.
    #[error("agent {0}: {1}")]
    Busy(String, String),
    /// The stream ended without a result (the agent went away): the Update is dispatched again.
    #[error("the operation stream ended without a result")]
    NoResult,
    /// Writing status or the outputs Secret failed.
    #[error("writing update status: {0}")]
    Kube(#[from] kube::Error),
    /// The shard moved to another replica (or this one stopped holding anything): nothing more is
    /// written; the shard's new holder follows the operation.
    #[error("fenced: the shard is no longer held at this epoch")]
    Fenced,
    /// The API server did not answer a read of the operation's Secrets or ConfigMaps (retried later).
    #[error("reading the operation's Secrets and ConfigMaps: {0}")]
    Values(String),
}

/// What [`run_on_agent`] asks and tells its caller while the operation runs.
pub struct Hooks<'a> {
    /// Asked right before every write and before `Run`: `true` once the shard is no longer held at the
    /// operation's epoch.
    pub fenced: &'a (dyn Fn() -> bool + Send + Sync),
    /// Called once, at the first event of the operation on its agent (Pulumi started, or a re-attach).
    pub started: &'a (dyn Fn() + Send + Sync),
    /// Asked right before `Run`: until when (wall clock) the shard is held at the operation's epoch
    /// ([`pko_fleet::Ownership::not_after`]), sent as `OperationRequest.not_after` so that the agent
    /// refuses the call if it arrives later; `None`: no deadline.
    pub not_after: &'a (dyn Fn() -> Option<std::time::SystemTime> + Send + Sync),
    /// Where GitHub App git credentials are exchanged for an installation token (`--github-api-url`).
    pub github_api_url: &'a str,
}

/// The Pulumi CLI's version as PKO reports it (the automation API's semver: `3.259.0` for `pulumi
/// version`'s `v3.259.0`). Pure.
pub fn pulumi_version(cli: &str) -> String {
    cli.trim().trim_start_matches('v').to_string()
}

fn never() -> bool {
    false
}

fn nothing() {}

fn no_deadline() -> Option<std::time::SystemTime> {
    None
}

impl Hooks<'static> {
    /// Never fenced, no deadline, nothing told (tests, a single replica's tools).
    pub fn none() -> Self {
        Hooks { fenced: &never, started: &nothing, not_after: &no_deadline, github_api_url: pko_git::github_app::DEFAULT_API_URL }
    }
}

/// Largest message the operator accepts from an agent: 400 MiB, PKO's limit since 2.6.0 (#1154) — a
/// result with large outputs, or a large engine event, must not break the stream (tonic's default is
/// 4 MiB).
pub const MAX_AGENT_MESSAGE_BYTES: usize = 400 << 20;

/// A client of the agent at `channel` that accepts messages up to [`MAX_AGENT_MESSAGE_BYTES`].
pub fn agent_client(channel: tonic::transport::Channel) -> AgentClient<tonic::transport::Channel> {
    AgentClient::new(channel).max_decoding_message_size(MAX_AGENT_MESSAGE_BYTES)
}

/// `t` as a protobuf timestamp (seconds and nanoseconds since the Unix epoch; times before it as 0).
fn timestamp(t: std::time::SystemTime) -> prost_types::Timestamp {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp { seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nanos: d.subsec_nanos() as i32 }
}

async fn write_status(api: &Api<Update>, update: &Update, st: &UpdateStatus) -> Result<(), kube::Error> {
    crate::k8s::apply_status(api, &update.name_any(), field_manager::UPDATE_STATUS, st).await
}

fn reason_of(r: &OperationResult) -> Reason {
    match r.error.as_ref().map(|e| ErrorReason::try_from(e.reason).unwrap_or(ErrorReason::Unspecified)) {
        Some(ErrorReason::UpdateConflict) => Reason::UpdateConflict,
        Some(ErrorReason::InvalidAccessToken) => Reason::InvalidAccessToken,
        Some(ErrorReason::UpdateFailed) => Reason::UpdateFailed,
        Some(ErrorReason::Cancelled) => Reason::Cancelled,
        _ => Reason::Other,
    }
}

fn ts(t: &Option<prost_types::Timestamp>) -> Option<Time> {
    let t = t.as_ref()?;
    k8s_openapi::jiff::Timestamp::new(t.seconds, t.nanos).ok().map(Time)
}

/// The agent request for `update` at `epoch`, with its Secret and ConfigMap references and the
/// Workspace's `envFrom` resolved with the operator's identity in the Update's namespace `ns` (a
/// workspace's service account needs no RBAC beyond PKO's) and GitHub App credentials exchanged.
/// `Ok(Err(message))`: the user's to fix (the Update fails with it); `Err`: transient, try again.
async fn request_for(
    client: &kube::Client,
    ns: &str,
    epoch: i64,
    update: &Update,
    workspace: &Workspace,
    hooks: &Hooks<'_>,
) -> Result<Result<pko_proto::v1::OperationRequest, String>, DispatchError> {
    let transient = |e: String| DispatchError::Values(e);
    let mut r = match request::build(&update.operation_id(), epoch, ns, &workspace.spec, &update.spec) {
        Ok(r) => r,
        Err(e) => return Ok(Err(e.to_string())),
    };
    match values::resolve(client, ns, &mut r).await {
        Err(e) if e.is_transient() => return Err(transient(e.to_string())),
        Err(e) => return Ok(Err(e.to_string())),
        Ok(_) => {}
    }
    match values::expand_env_from(client, ns, workspace.spec.env_from.as_deref().unwrap_or_default(), &mut r).await {
        Err(e) if e.is_transient() => return Err(transient(e.to_string())),
        Err(e) => return Ok(Err(e.to_string())),
        Ok(skipped) if !skipped.is_empty() => tracing::info!(update = %update.name_any(), ?skipped, "envFrom keys skipped: not environment variable names (as the kubelet does)"),
        Ok(_) => {}
    }
    match values::exchange_github_app(&mut r, hooks.github_api_url).await {
        Err(e) if e.is_transient() => Err(transient(e.to_string())),
        Err(e) => Ok(Err(e.to_string())),
        Ok(()) => Ok(Ok(r)),
    }
}

/// Runs `update` against `workspace` on the agent at `agent` (e.g. `http://127.0.0.1:50051`), with
/// `token` as bearer token when set, and records progress and result on the Update. Returns the final
/// result; an `INTERRUPTED` result (agent shutdown) is returned without marking the Update failed, so the
/// caller dispatches it again.
///
/// `hooks.fenced` is asked right before every write (status, outputs Secret, event): once it says true
/// (the shard's epoch is no longer held), nothing more is written and [`DispatchError::Fenced`] returned
/// — a replica that was frozen and wakes up with a result in its buffers does not write it.
#[allow(clippy::too_many_arguments)]
pub async fn run_on_agent(
    client: &kube::Client,
    events: &crate::k8s::Events,
    agent: &str,
    token: Option<&str>,
    epoch: i64,
    update: &Update,
    workspace: &Workspace,
    hooks: &Hooks<'_>,
) -> Result<OperationResult, DispatchError> {
    let check = || if (hooks.fenced)() { Err(DispatchError::Fenced) } else { Ok(()) };
    let ns = update.namespace().unwrap_or_default();
    let api: Api<Update> = Api::namespaced(client.clone(), &ns);
    let generation = update.meta().generation;
    let mut st = update.status.clone().unwrap_or_default();
    st.observed_generation = generation;
    let old_conditions = st.conditions.clone().unwrap_or_default();

    let built = request_for(client, &ns, epoch, update, workspace, hooks).await?;
    let req = match built {
        Ok(r) => r,
        Err(message) => {
            let phase = Phase::Failed { reason: pko_api::constants::update_condition::UNKNOWN.into(), message: message.clone() };
            st.conditions = Some(status::conditions(&phase, generation, &pko_api::conditions::now(), &old_conditions));
            st.message = Some(message.clone());
            st.end_time = Some(pko_api::conditions::now());
            check()?;
            write_status(&api, update, &st).await?;
            return Ok(OperationResult { status: ResultStatus::Failed as i32, message, ..Default::default() });
        }
    };
    let channel = tonic::transport::Endpoint::from_shared(agent.to_string()).map_err(|e| DispatchError::Agent(agent.into(), e.to_string()))?;
    let mut agent_client = agent_client(channel.connect().await.map_err(|e| DispatchError::Agent(agent.into(), e.to_string()))?);
    // Marked Progressing, with its start time, before any agent can have it (PKO marks it before it
    // connects): whoever dispatches this Update next — after a restart, a crash or a shard move — then
    // knows an agent may run it ([`Update::was_started`]) and looks for that agent before starting it
    // anywhere else. Marked after the first event instead, a dispatcher killed in between left an
    // Update that looked never started while an agent ran it.
    let marked = st.start_time.is_some() && old_conditions.iter().any(|c| c.type_ == "Progressing" && c.status == "True");
    if !marked {
        st.start_time.get_or_insert_with(pko_api::conditions::now);
        st.conditions = Some(status::conditions(&Phase::Progressing, generation, &pko_api::conditions::now(), &old_conditions));
        check()?;
        write_status(&api, update, &st).await?;
    }
    // the last moment before the operation can start: connecting and marking may have taken a while.
    // This replica may still be frozen right after this check; the agent then refuses the call by the
    // deadline it carries (the shard's new holder may run the operation on another agent meanwhile).
    check()?;
    let mut req = req;
    req.not_after = (hooks.not_after)().map(timestamp);
    let mut call = tonic::Request::new(req);
    if let Some(t) = token {
        call.metadata_mut().insert("authorization", format!("Bearer {t}").parse().map_err(|_| DispatchError::Agent(agent.into(), "token is not a valid header".into()))?);
    }
    let mut stream = agent_client
        .run(call)
        .await
        .map_err(|s| match s.code() {
            tonic::Code::Unavailable => DispatchError::Busy(agent.into(), format!("{}: {}", s.code(), s.message())),
            _ => DispatchError::Agent(agent.into(), format!("{}: {}", s.code(), s.message())),
        })?
        .into_inner();

    let mut first = true;
    while let Some(ev) = stream.next().await {
        let ev = ev.map_err(|s| DispatchError::Agent(agent.into(), s.message().to_string()))?;
        if std::mem::take(&mut first) {
            (hooks.started)();
        }
        let Some(Event::Result(result)) = ev.event else { continue };
        if result.status == ResultStatus::Interrupted as i32 {
            return Ok(result);
        }
        // PKO: a success's message is Pulumi's update summary message (the Update's own message); a
        // failure's is the agent's error as PKO words it
        let update_type = update.spec.update_type.as_ref().map(pko_api::UpdateType::as_str).unwrap_or("up");
        let (phase, message) = if result.status == ResultStatus::Succeeded as i32 {
            (Phase::Succeeded, update.spec.message.clone().unwrap_or_default())
        } else {
            let (reason, message) = status::failure(reason_of(&result), update_type, &result.message);
            (Phase::Failed { reason: reason.into(), message: message.clone() }, message)
        };
        if phase == Phase::Succeeded && update.spec.update_type == Some(pko_api::UpdateType::Up) {
            let values: BTreeMap<String, (serde_json::Value, bool)> =
                result.outputs.iter().map(|(k, v)| (k.clone(), (serde_json::from_slice(&v.value).unwrap_or(serde_json::Value::Null), v.secret))).collect();
            let owner = update.controller_owner_ref(&()).map(|mut o| {
                o.controller = Some(false);
                o
            });
            if let Some(owner) = owner {
                let secret = outputs::secret(&update.name_any(), &ns, owner, &values);
                check()?;
                match Api::<Secret>::namespaced(client.clone(), &ns).create(&PostParams::default(), &secret).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 409 => {} // written before a restart; immutable
                    Err(e) => return Err(e.into()),
                }
                st.outputs = Some(outputs::secret_name(&update.name_any()));
            }
        }
        st.start_time = st.start_time.clone().or_else(|| ts(&result.start_time));
        st.end_time = ts(&result.end_time).or_else(|| Some(pko_api::conditions::now()));
        st.message = Some(message).filter(|m| !m.is_empty());
        st.permalink = Some(result.permalink.clone()).filter(|p| !p.is_empty());
        st.project_info = result.project_info.as_ref().map(|p| ProjectInfo { name: Some(p.name.clone()), runtime: Some(p.runtime.clone()) });
        st.change_summary = Some(result.change_summary.iter().map(|(k, v)| (k.clone(), *v)).collect()).filter(|m: &BTreeMap<String, i32>| !m.is_empty());
        st.resource_changes = (!result.changes.is_empty()).then(|| {
            let changes = result.changes.iter().take(pko_api::update::MAX_RESOURCE_CHANGES);
            changes.map(|c| pko_api::update::ResourceChange { urn: c.urn.clone(), op: c.op.clone(), properties: Some(c.properties.clone()).filter(|p| !p.is_empty()) }).collect()
        });
        let current = st.conditions.clone().unwrap_or_default();
        st.conditions = Some(status::conditions(&phase, generation, &pko_api::conditions::now(), &current));
        check()?;
        write_status(&api, update, &st).await?;
        let (severity, reason) = if phase == Phase::Succeeded {
            (crate::k8s::Severity::Normal, pko_api::constants::event_reason::UPDATE_SUCCEEDED)
        } else {
            (crate::k8s::Severity::Warning, pko_api::constants::event_reason::UPDATE_FAILED)
        };
        check()?;
        let note = status::event_note(update.spec.update_type.as_ref(), update.spec.stack_name.as_deref().unwrap_or_default(), phase == Phase::Succeeded, &result.message);
        crate::k8s::publish(&events.update, update, severity, reason, note).await;
        // PKO's Workspace lifecycle: an operation that could not prepare its workspace stalls it (Ready
        // False with the stall's reason, the Stack Stalled WorkspaceFailed), one that could clears it
        check()?;
        crate::workspace::stalled::record(client, events, workspace, &crate::workspace::stalled::verdict(&result), update.spec.stack_name.as_deref().unwrap_or_default()).await;
        // PKO's Workspace `status.pulumiVersion`: the CLI of the agent that ran this operation
        let version = pulumi_version(&result.pulumi_version);
        if !version.is_empty() && workspace.status.as_ref().and_then(|w| w.pulumi_version.as_deref()) != Some(version.as_str()) {
            check()?;
            let api: Api<Workspace> = Api::namespaced(client.clone(), &ns);
            let st = serde_json::json!({ "pulumiVersion": version });
            if let Err(e) = crate::k8s::apply_status(&api, &workspace.name_any(), field_manager::WORKSPACE_PULUMI_VERSION, &st).await {
                tracing::warn!(error = %e, "writing the workspace's pulumiVersion");
            }
        }
        return Ok(result);
    }
    Err(DispatchError::NoResult)
}
