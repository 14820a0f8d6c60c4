//! The tonic service: Run, Attach, Cancel, Status, PulumiVersion, WhoAmI; and the agent's shutdown.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::Stream;
use pko_proto::v1::agent_server::Agent;
use pko_proto::v1::{
    AttachRequest, CachedSource, CancelRequest, CancelResponse, ErrorInfo, ErrorReason, OperationEvent,
    OperationRequest, PulumiVersionRequest, PulumiVersionResponse, StatusRequest, StatusResponse, WhoAmIRequest,
    WhoAmIResponse, status_response,
};
use prost::Message;
use tonic::{Request, Response, Status};

use crate::auth::Auth;
use crate::operation::Registry;
use crate::runner::{self, RunnerContext};

/// Agent settings.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Operations run at once (default 1).
    pub capacity: usize,
    /// Grace between Ctrl-C and SIGKILL, for Cancel and for shutdown.
    pub grace: Duration,
    /// How each operation's lines are written to standard output ([`crate::output`]).
    pub log_format: crate::output::Format,
}

/// The agent service.
#[derive(Debug, Clone)]
pub struct AgentService {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cfg: AgentConfig,
    ctx: RunnerContext,
    ops: Registry,
    auth: Auth,
    draining: AtomicBool,
    /// When a call last arrived or an operation was last seen running.
    last_active: std::sync::Mutex<std::time::Instant>,
}

type EventStream = Pin<Box<dyn Stream<Item = Result<OperationEvent, Status>> + Send>>;

/// `INVALID_ARGUMENT` with an [`ErrorInfo`] detail naming the field.
pub fn invalid(field: &str, message: impl Into<String>) -> Status {
    let message = message.into();
    let info = ErrorInfo { reason: ErrorReason::InvalidRequest as i32, message: message.clone(), field: field.into() };
    Status::with_details(tonic::Code::InvalidArgument, format!("{field}: {message}"), info.encode_to_vec().into())
}

/// The grace Pulumi gets after a `Cancel` asking for `asked` seconds (0: none asked) from an agent whose own is `own`:
/// the shorter. Pure.
pub fn cancel_grace(asked: u32, own: std::time::Duration) -> std::time::Duration {
    if asked == 0 { own } else { own.min(std::time::Duration::from_secs(asked.into())) }
}

/// How late a request arrived at `now` past its sender's `not_after` (the renew deadline of the sender's hold on the
/// shard, `OperationRequest.not_after`); `None`: in time, or no deadline given. A malformed timestamp counts as already
/// past (it cannot prove the sender still holds its shard).
pub fn late_by(not_after: Option<&prost_types::Timestamp>, now: std::time::SystemTime) -> Option<std::time::Duration> {
    let t = not_after?;
    let deadline = u64::try_from(t.seconds)
        .ok()
        .zip(u32::try_from(t.nanos).ok().filter(|n| *n < 1_000_000_000))
        .map(|(s, n)| std::time::UNIX_EPOCH + std::time::Duration::new(s, n))
        .unwrap_or(std::time::UNIX_EPOCH);
    now.duration_since(deadline).ok()
}

/// Checks a `Run` request before anything runs: the required fields, a git URL and revision that git cannot read as
/// options ([`pko_git::validate_url`], [`pko_git::validate_ref`]), and environment names and values a process can carry
/// (a name that is empty or holds `=` or NUL, a value with NUL).
///
/// Errors: `INVALID_ARGUMENT` with an [`ErrorInfo`] naming the field ([`invalid`]).
pub fn validate_request(req: &OperationRequest) -> Result<(), Status> {
    use pko_proto::v1::source::Kind;
    if req.operation_id.is_empty() {
        return Err(invalid("operation_id", "an operation id is required"));
    }
    // no source: the program in the agent's workspace directory (PKO's source-less Workspace)
    if let Some(Kind::Git(g)) = req.source.as_ref().and_then(|s| s.kind.as_ref()) {
        pko_git::validate_url(&g.url).map_err(|e| invalid("source.git.url", e))?;
        if !g.revision.is_empty() {
            pko_git::validate_ref("revision", &g.revision).map_err(|e| invalid("source.git.revision", e))?;
        }
    }
    if req.stack.as_ref().is_none_or(|s| s.name.is_empty()) {
        return Err(invalid("stack.name", "a stack name is required"));
    }
    if pko_proto::v1::OperationType::try_from(req.r#type).unwrap_or_default()
        == pko_proto::v1::OperationType::Unspecified
    {
        return Err(invalid("type", "operation type is required: preview, up, refresh, destroy or initialize"));
    }
    for (i, e) in req.env.iter().enumerate() {
        if e.name.is_empty() || e.name.contains(['=', '\0']) {
            return Err(invalid(
                &format!("env[{i}].name"),
                format!("{:?} is not an environment variable name", e.name),
            ));
        }
        if let Some(pko_proto::v1::value_ref::Kind::Literal(v)) = e.value.as_ref().and_then(|v| v.kind.as_ref())
            && v.contains('\0')
        {
            return Err(invalid(&format!("env[{i}].value"), format!("the value of {} contains a NUL byte", e.name)));
        }
    }
    for (i, c) in req.config.iter().enumerate() {
        if c.key.is_empty() || c.key.starts_with('-') || c.key.contains('\0') {
            return Err(invalid(&format!("config[{i}].key"), format!("{:?} is not a config key", c.key)));
        }
    }
    Ok(())
}

impl AgentService {
    /// A service running operations with `ctx`, retaining finished ones for `retention` with at most `max_events`
    /// buffered events each.
    pub fn new(cfg: AgentConfig, ctx: RunnerContext, auth: Auth, retention: Duration, max_events: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                cfg,
                ctx,
                ops: Registry::new(max_events, retention),
                auth,
                draining: AtomicBool::new(false),
                last_active: std::sync::Mutex::new(std::time::Instant::now()),
            }),
        }
    }

    /// Starts the shutdown: accept nothing new; Ctrl-C every running Pulumi process (SIGKILL after the grace). Their
    /// operations end with status `INTERRUPTED`.
    pub fn begin_shutdown(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
        for op in self.inner.ops.running() {
            op.interrupted.store(true, Ordering::SeqCst);
            tracing::info!(operation = %op.id, "shutting down: interrupting pulumi");
            op.interrupt_with_grace(self.inner.cfg.grace);
        }
    }

    /// Second signal: kill every running Pulumi process now.
    pub fn kill_all(&self) {
        for op in self.inner.ops.running() {
            op.interrupted.store(true, Ordering::SeqCst);
            op.stop_now();
        }
    }

    /// Marks the agent active now (a call arrived).
    fn touch(&self) {
        *self.inner.last_active.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = std::time::Instant::now();
    }

    /// How long the agent has been idle: no operation running and no call since, at the resolution of the calls to this
    /// function (an operation seen running counts as activity).
    pub fn idle_for(&self) -> Duration {
        if !self.inner.ops.running().is_empty() {
            self.touch();
            return Duration::ZERO;
        }
        self.inner.last_active.lock().unwrap_or_else(std::sync::PoisonError::into_inner).elapsed()
    }

    /// Resolves once the shutdown began and no operation runs any more.
    pub async fn drained(&self) {
        loop {
            if self.inner.draining.load(Ordering::SeqCst) && self.inner.ops.running().is_empty() {
                // let the final events reach the streams
                tokio::time::sleep(Duration::from_millis(300)).await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn stream_of(op: &Arc<crate::operation::Operation>) -> EventStream {
        use futures::StreamExt;
        Box::pin(op.follow().map(Ok))
    }
}

/// Refuses a caller whose epoch is older than the newest seen for `op` (`FAILED_PRECONDITION`). Every call on a known
/// operation is logged (`agent call`, with its epoch), refused ones as warnings: the agent's own record of who steered
/// an operation, and under which epoch.
fn admit(op: &crate::operation::Operation, epoch: i64, call: &str) -> Result<(), Status> {
    match op.admit(epoch) {
        Ok(()) => {
            tracing::info!(operation = %op.id, epoch, call, "agent call");
            Ok(())
        }
        Err(newest) => {
            tracing::warn!(operation = %op.id, epoch, newest, call, "agent call refused: stale epoch");
            Err(Status::failed_precondition(format!(
                "operation {}: epoch {epoch} is older than {newest}; its shard has a newer holder",
                op.id
            )))
        }
    }
}

#[tonic::async_trait]
impl Agent for AgentService {
    type RunStream = EventStream;
    type AttachStream = EventStream;

    async fn run(&self, request: Request<OperationRequest>) -> Result<Response<Self::RunStream>, Status> {
        self.touch();
        self.inner.auth.check(request.metadata()).await?;
        let req = request.into_inner();
        validate_request(&req)?;
        // fenced by time: the sender checked its hold on the shard before the call, but may have been
        // frozen since, and the shard's new holder may run this operation on another agent
        if let Some(late) = late_by(req.not_after.as_ref(), std::time::SystemTime::now()) {
            tracing::warn!(operation = %req.operation_id, epoch = req.epoch, call = "run", late_s = late.as_secs_f64(),
                "agent call refused: past its sender's fence deadline");
            return Err(Status::failed_precondition(format!(
                "operation {}: the request arrived {:.3} s after its sender's hold on the shard lapsed (not_after); \
                    the shard may have a newer holder",
                req.operation_id,
                late.as_secs_f64()
            )));
        }
        if let Some(op) = self.inner.ops.get(&req.operation_id) {
            // The same operation again (e.g. a retried call, or the shard's new holder): follow it
            // instead of running it twice — unless the caller's epoch is stale. Also while shutting
            // down: the caller sees it end (`INTERRUPTED`) and only then runs it elsewhere.
            admit(&op, req.epoch, "run")?;
            return Ok(Response::new(Self::stream_of(&op)));
        }
        if self.inner.draining.load(Ordering::SeqCst) {
            return Err(Status::unavailable("agent is shutting down"));
        }
        if self.inner.ops.running().len() >= self.inner.cfg.capacity {
            return Err(Status::unavailable(format!(
                "agent busy: {} operation(s) running, capacity {}",
                self.inner.ops.running().len(),
                self.inner.cfg.capacity
            )));
        }
        let op = self
            .inner
            .ops
            .insert(&req.operation_id, req.epoch)
            .ok_or_else(|| Status::already_exists("operation id in use"))?;
        let stack = req.stack.as_ref().map(|s| s.name.as_str()).unwrap_or("");
        tracing::info!(operation = %op.id, epoch = req.epoch, call = "run", stack = %stack,
            "agent call: operation accepted");
        op.print_to(crate::output::Context::of(&op.id, stack, runner::kind_name(&req), self.inner.cfg.log_format));
        op.log("operation accepted");
        tokio::spawn(runner::run(self.inner.ctx.clone(), op.clone(), req));
        Ok(Response::new(Self::stream_of(&op)))
    }

    async fn attach(&self, request: Request<AttachRequest>) -> Result<Response<Self::AttachStream>, Status> {
        self.touch();
        self.inner.auth.check(request.metadata()).await?;
        let AttachRequest { operation_id: id, epoch } = request.into_inner();
        let op = self
            .inner
            .ops
            .get(&id)
            .ok_or_else(|| Status::not_found(format!("operation {id:?} is not known to this agent")))?;
        admit(&op, epoch, "attach")?;
        Ok(Response::new(Self::stream_of(&op)))
    }

    async fn cancel(&self, request: Request<CancelRequest>) -> Result<Response<CancelResponse>, Status> {
        self.touch();
        self.inner.auth.check(request.metadata()).await?;
        let CancelRequest { operation_id: id, epoch, grace_seconds } = request.into_inner();
        let op = self
            .inner
            .ops
            .get(&id)
            .ok_or_else(|| Status::not_found(format!("operation {id:?} is not known to this agent")))?;
        admit(&op, epoch, "cancel")?;
        if op.finished() {
            return Ok(Response::new(CancelResponse { cancelled: false }));
        }
        op.cancelled.store(true, Ordering::SeqCst);
        op.log("cancel requested: interrupting pulumi");
        op.interrupt_with_grace(cancel_grace(grace_seconds, self.inner.cfg.grace));
        Ok(Response::new(CancelResponse { cancelled: true }))
    }

    async fn status(&self, request: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        self.inner.auth.check(request.metadata()).await?;
        let running = self.inner.ops.running();
        let state = if self.inner.draining.load(Ordering::SeqCst) {
            status_response::State::Draining
        } else if running.is_empty() {
            status_response::State::Idle
        } else {
            status_response::State::Busy
        };
        let cached_sources = self
            .inner
            .ctx
            .sources
            .entries()
            .into_iter()
            .map(|e| {
                let t = e.last_used.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                CachedSource {
                    key: e.key,
                    size_bytes: e.size_bytes as i64,
                    last_used: Some(prost_types::Timestamp { seconds: t.as_secs() as i64, nanos: 0 }),
                }
            })
            .collect();
        Ok(Response::new(StatusResponse {
            state: state as i32,
            current_operation_id: running.first().map(|o| o.id.clone()).unwrap_or_default(),
            pulumi_version: self.version().await.unwrap_or_default(),
            cached_sources,
            capacity: self.inner.cfg.capacity as i32,
            running: running.len() as i32,
            idle_seconds: self.idle_for().as_secs_f64(),
        }))
    }

    async fn pulumi_version(
        &self,
        request: Request<PulumiVersionRequest>,
    ) -> Result<Response<PulumiVersionResponse>, Status> {
        self.inner.auth.check(request.metadata()).await?;
        Ok(Response::new(PulumiVersionResponse { version: self.version().await? }))
    }

    async fn who_am_i(&self, request: Request<WhoAmIRequest>) -> Result<Response<WhoAmIResponse>, Status> {
        self.inner.auth.check(request.metadata()).await?;
        let req = request.into_inner();
        let mut env: BTreeMap<String, String> = crate::pulumi::base_env();
        env.extend(self.inner.ctx.env.clone());
        for (i, e) in req.env.iter().enumerate() {
            let r = e.value.as_ref().ok_or_else(|| invalid(&format!("env[{i}].value"), "missing value"))?;
            let v = self.inner.ctx.values.resolve(r).await.map_err(|m| invalid(&format!("env[{i}]"), m))?;
            env.insert(e.name.clone(), v);
        }
        let out = crate::pulumi::run(
            &self.inner.ctx.pulumi,
            std::path::Path::new("/"),
            &env,
            &["whoami", "--json", "--non-interactive"],
        )
        .await
        .map_err(|e| Status::internal(e.to_string()))?;
        if !out.success {
            return Err(Status::failed_precondition(out.stderr.trim().to_string()));
        }
        let v: serde_json::Value =
            serde_json::from_str(&out.stdout).map_err(|e| Status::internal(format!("pulumi whoami: {e}")))?;
        Ok(Response::new(WhoAmIResponse {
            user: v["user"].as_str().unwrap_or_default().into(),
            organizations: v["organizations"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|o| o.as_str().map(String::from))
                .collect(),
            url: v["url"].as_str().unwrap_or_default().into(),
        }))
    }
}

impl AgentService {
    async fn version(&self) -> Result<String, Status> {
        self.inner
            .ctx
            .pulumi_version
            .get_or_try_init(|| async {
                crate::pulumi::version(&self.inner.ctx.pulumi)
                    .await
                    .map_err(|e| Status::internal(format!("pulumi version: {e}")))
            })
            .await
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::{cancel_grace, late_by};
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn a_request_past_its_senders_fence_deadline_is_late_and_one_without_a_deadline_never_is() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000);
        let at = |seconds, nanos| prost_types::Timestamp { seconds, nanos };
        assert_eq!(late_by(None, now), None);
        assert_eq!(cancel_grace(0, Duration::from_secs(600)), Duration::from_secs(600));
        assert_eq!(cancel_grace(30, Duration::from_secs(600)), Duration::from_secs(30));
        assert_eq!(
            cancel_grace(900, Duration::from_secs(600)),
            Duration::from_secs(600),
            "never longer than the agent's own"
        );
        assert_eq!(late_by(Some(&at(1_001, 0)), now), None, "in time");
        assert_eq!(late_by(Some(&at(999, 500_000_000)), now), Some(Duration::from_millis(500)));
        assert_eq!(late_by(Some(&at(1_000, 0)), now), Some(Duration::ZERO), "at the deadline is too late");
        assert_eq!(
            late_by(Some(&at(-5, 0)), now),
            Some(Duration::from_secs(1_000)),
            "a malformed deadline counts as past"
        );
        assert_eq!(late_by(Some(&at(2_000, -1)), now), Some(Duration::from_secs(1_000)));
    }
}
