//! Runs one operation: resolve values, prepare the source, select (or create) the stack, set its config,
//! run the Pulumi command streaming its engine events, then read outputs and build the result.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use pko_proto::v1::{
    ConfigItem, ErrorInfo, ErrorReason, LogLine, OperationRequest, OperationResult, OperationType, OutputValue, ProjectInfo, ResultStatus, config_item, log_line,
    operation_event::Event,
};
use pko_proto::{MIN_PULUMI_FOR_STRUCTURED_CONFIG, parse_pulumi_version};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::mask::Masker;
use crate::operation::Operation;
use crate::pulumi;
use crate::source::SourceCache;
use crate::values::ValueResolver;

/// What the runner needs from the agent.
#[derive(Debug, Clone)]
pub struct RunnerContext {
    /// The Pulumi CLI (under the agent's supervisor).
    pub pulumi: pulumi::Cli,
    /// Longest wait for a backend lock's holders still running on this host to end before an operation
    /// reports the conflict (`--lock-wait-seconds`).
    pub lock_wait: std::time::Duration,
    /// Per-operation directories ([`crate::sandbox`]); `None`: operations run in the cached source with
    /// the agent's own `HOME` and `PULUMI_HOME` (a Workspace's own agent, as PKO's pod).
    pub sandboxes: Option<crate::sandbox::Sandboxes>,
    /// Environment added to every Pulumi process (e.g. PULUMI_HOME), below the operation's own.
    pub env: BTreeMap<String, String>,
    /// Source cache.
    pub sources: Arc<SourceCache>,
    /// Value resolver (Secrets/ConfigMaps of the agent's namespace).
    pub values: ValueResolver,
    /// Stacks known to exist (`<backend> <project dir> <stack>`): their `stack select` is skipped, which
    /// saves one Pulumi invocation per operation. A stack removed elsewhere is re-created on demand.
    pub known_stacks: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    /// Pulumi log verbosity (`-v N --logtostderr --logflow`); 0 disables it (PKO `pulumiLogLevel`).
    pub log_level: u32,
    /// A dotenv file read before each operation (`--env-file`, PKO's `$PULUMI_ENV`); its variables win
    /// over the agent's and the request's.
    pub env_file: Option<PathBuf>,
    /// A symbolic link pointed at each operation's project directory (`--workspace-link`, PKO's
    /// `/share/workspace`).
    pub workspace_link: Option<PathBuf>,
    /// The Pulumi CLI's version (`pulumi version`), read once on first use.
    pub pulumi_version: Arc<tokio::sync::OnceCell<String>>,
    /// A *hollow agent* (kubemark-style, for control-plane load tests only — never a default, never in a
    /// functional test): every operation succeeds after this delay without running Pulumi or reading
    /// its source. `None`: a real agent.
    pub hollow: Option<std::time::Duration>,
}

/// A failure before or around the Pulumi command.
struct Failure {
    reason: ErrorReason,
    message: String,
    field: String,
    /// An `UpdateConflict` whose every lock holder is known dead: those holders, and why.
    stale: Vec<(crate::locks::Holder, &'static str)>,
    /// An `UpdateConflict` whose holders still run on this host (none elsewhere): worth waiting for.
    live: Vec<crate::locks::Holder>,
}

fn fail(reason: ErrorReason, field: &str, message: impl Into<String>) -> Failure {
    Failure { reason, message: message.into(), field: field.to_string(), stale: Vec::new(), live: Vec::new() }
}

/// Runs `req` to completion and publishes its events and its result on `op`.
pub async fn run(ctx: RunnerContext, op: Arc<Operation>, req: OperationRequest) {
    if let Some(delay) = ctx.hollow {
        return hollow(&op, &req, delay).await;
    }
    let start = crate::convert::now();
    let mut masker = Masker::default();
    let mut result = OperationResult { start_time: Some(start), ..Default::default() };
    let mut pinned = None;
    let mut sandbox = None;
    let outcome = match ctx.sandboxes.as_ref().map(crate::sandbox::Sandboxes::create).transpose() {
        Ok(sb) => {
            sandbox = sb;
            execute(&ctx, &op, &req, sandbox.as_mut(), &mut masker, &mut result, &mut pinned).await
        }
        Err(e) => Err(fail(ErrorReason::Internal, "", format!("an earlier operation's files could not be removed: {e}"))),
    };
    if let Some(key) = pinned {
        ctx.sources.release(&key);
    }
    if let Some(sb) = sandbox {
        finish_sandbox(&op, sb);
    }
    result.end_time = Some(crate::convert::now());
    match outcome {
        Ok(()) => {
            result.status = ResultStatus::Succeeded as i32;
            if result.message.is_empty() {
                result.message = format!("{} succeeded", verb(&req));
            }
        }
        Err(f) => {
            let (status, reason) = if op.interrupted.load(Ordering::SeqCst) {
                (ResultStatus::Interrupted, ErrorReason::Interrupted)
            } else if op.cancelled.load(Ordering::SeqCst) {
                (ResultStatus::Cancelled, ErrorReason::Cancelled)
            } else {
                (ResultStatus::Failed, f.reason)
            };
            let message = masker.mask(&match status {
                ResultStatus::Interrupted => format!("interrupted by agent shutdown: {}", f.message),
                ResultStatus::Cancelled => format!("cancelled: {}", f.message),
                _ => f.message,
            });
            result.status = status as i32;
            result.message = message.clone();
            result.error = Some(ErrorInfo { reason: reason as i32, message, field: f.field });
        }
    }
    tracing::info!(operation = %op.id, status = ?ResultStatus::try_from(result.status), "operation finished");
    op.publish(Event::Result(result));
}

/// Removes the operation's directories and the plugins it added to or changed in the shared cache,
/// logging what was removed; a failure is logged (the next operation sweeps again, and refuses to
/// start while it cannot).
fn finish_sandbox(op: &Arc<Operation>, sb: crate::sandbox::Sandbox) {
    match sb.finish() {
        Ok(f) if f.plugins_removed.is_empty() => {}
        Ok(f) => {
            tracing::warn!(operation = %op.id, plugins = ?f.plugins_removed, "the operation added or changed plugins in the shared cache: removed");
            op.log(format!("removed plugins this operation added to or changed in the agent's shared cache (never run by another operation): {}", f.plugins_removed.join(", ")));
        }
        Err(e) => {
            tracing::warn!(operation = %op.id, error = %e, "removing the operation's directories");
            op.log(format!("removing the operation's directories: {e}"));
        }
    }
}

/// The hollow agent's operation: waits `delay` (ending early, `INTERRUPTED` or `CANCELLED`, on shutdown
/// or Cancel), then succeeds with no outputs. Its log line and result message say it was simulated.
async fn hollow(op: &Arc<Operation>, req: &OperationRequest, delay: std::time::Duration) {
    let start = crate::convert::now();
    op.log("hollow agent: simulated operation, no Pulumi runs (load tests only)");
    let end = tokio::time::Instant::now() + delay;
    let status = loop {
        if op.interrupted.load(Ordering::SeqCst) {
            break ResultStatus::Interrupted;
        }
        if op.cancelled.load(Ordering::SeqCst) {
            break ResultStatus::Cancelled;
        }
        let now = tokio::time::Instant::now();
        if now >= end {
            break ResultStatus::Succeeded;
        }
        tokio::time::sleep((end - now).min(std::time::Duration::from_millis(100))).await;
    };
    let message = match status {
        ResultStatus::Succeeded => format!("hollow agent: {} simulated", verb(req)),
        _ => "hollow agent: simulated operation stopped".to_string(),
    };
    let error = (status != ResultStatus::Succeeded).then(|| ErrorInfo {
        reason: if status == ResultStatus::Interrupted { ErrorReason::Interrupted } else { ErrorReason::Cancelled } as i32,
        message: message.clone(),
        field: String::new(),
    });
    let result = OperationResult { status: status as i32, message, error, start_time: Some(start), end_time: Some(crate::convert::now()), ..Default::default() };
    tracing::info!(operation = %op.id, status = ?status, "operation finished (hollow)");
    op.publish(Event::Result(result));
}

fn verb(req: &OperationRequest) -> &'static str {
    match OperationType::try_from(req.r#type).unwrap_or(OperationType::Unspecified) {
        OperationType::Preview => "preview",
        OperationType::Up => "update",
        OperationType::Refresh => "refresh",
        OperationType::Destroy => "destroy",
        OperationType::Unspecified => "operation",
    }
}

fn check_stop(op: &Operation) -> Result<(), Failure> {
    if op.interrupted.load(Ordering::SeqCst) || op.cancelled.load(Ordering::SeqCst) {
        return Err(fail(ErrorReason::Cancelled, "", "stopped before Pulumi ran"));
    }
    Ok(())
}

/// Runs the operation `req` step by step (each step is a function below): its environment, its
/// source, its stack and config, then the Pulumi command.
async fn execute(
    ctx: &RunnerContext,
    op: &Arc<Operation>,
    req: &OperationRequest,
    mut sandbox: Option<&mut crate::sandbox::Sandbox>,
    masker: &mut Masker,
    result: &mut OperationResult,
    pinned: &mut Option<String>,
) -> Result<(), Failure> {
    let kind = OperationType::try_from(req.r#type).unwrap_or(OperationType::Unspecified);
    if kind == OperationType::Unspecified {
        return Err(fail(ErrorReason::InvalidRequest, "type", "operation type is required (preview, up, refresh or destroy)"));
    }
    let stack = req.stack.clone().unwrap_or_default();
    if stack.name.is_empty() {
        return Err(fail(ErrorReason::InvalidRequest, "stack.name", "stack name is required"));
    }
    let env = environment(ctx, req, sandbox.as_deref(), masker).await?;
    check_stop(op)?;
    let (dir, project) = project(ctx, op, req, sandbox.as_deref_mut(), &env, result, pinned).await?;
    check_stop(op)?;
    check_cli(ctx, req, result).await?;
    let known_key = prepare_stack(ctx, op, req, sandbox.is_some(), (&dir, &project), &env, masker).await?;
    check_stop(op)?;
    let options = req.options.clone().unwrap_or_default();
    let step = Step { kind, stack: &stack.name, dir: &dir, env: &env, options: &options, known_key: &known_key };
    operate_through_locks(ctx, op, &step, masker, result).await
}

/// Step 1: the environment of the Pulumi process — the agent's (the workspace class's), the
/// operation's own directories, the request's (references resolved, secrets masked), the env file's.
async fn environment(ctx: &RunnerContext, req: &OperationRequest, sandbox: Option<&crate::sandbox::Sandbox>, masker: &mut Masker) -> Result<BTreeMap<String, String>, Failure> {
    let mut env = pulumi::base_env();
    env.extend(ctx.env.clone());
    if let Some(sb) = sandbox {
        env.extend(sb.env());
    }
    for (i, e) in req.env.iter().enumerate() {
        let Some(r) = &e.value else { return Err(fail(ErrorReason::InvalidRequest, &format!("env[{i}].value"), format!("env {} has no value", e.name))) };
        let v = ctx.values.resolve(r).await.map_err(|m| fail(ErrorReason::InvalidConfig, &format!("env[{i}]"), format!("env {}: {m}", e.name)))?;
        if e.secret || is_secret_name(&e.name) {
            masker.add(&v);
        }
        env.insert(e.name.clone(), v);
    }
    if let Some(path) = &ctx.env_file {
        for (name, v) in read_env_file(path).map_err(|m| fail(ErrorReason::InvalidConfig, "env", m))? {
            if is_secret_name(&name) {
                masker.add(&v);
            }
            env.insert(name, v);
        }
    }
    if let Some((name, v)) = env.iter().find(|(k, v)| k.len() + v.len() + 2 > MAX_ENV_VAR_BYTES) {
        let msg = format!("env {name}: the value is {} bytes; Linux allows at most {MAX_ENV_VAR_BYTES} bytes in one environment variable", v.len());
        return Err(fail(ErrorReason::InvalidConfig, "env", msg));
    }
    if sandbox.is_some() {
        pin_home_backend(&mut env, std::env::var("PULUMI_BACKEND_URL").ok(), std::env::var("HOME").ok());
    }
    Ok(env)
}

/// Step 2: the source, prepared (or cached) and pinned, copied into the operation's directory when it
/// is isolated; returns the project directory and the project's name.
async fn project(
    ctx: &RunnerContext,
    op: &Arc<Operation>,
    req: &OperationRequest,
    sandbox: Option<&mut crate::sandbox::Sandbox>,
    env: &BTreeMap<String, String>,
    result: &mut OperationResult,
    pinned: &mut Option<String>,
) -> Result<(PathBuf, String), Failure> {
    op.log("preparing source");
    let source = req.source.clone().unwrap_or_default();
    let prepared = ctx.sources.prepare(&source, &ctx.values, env).await.map_err(|e| {
        let reason = if e.install { ErrorReason::InstallationFailed } else { ErrorReason::InvalidSource };
        fail(reason, "source", e.message)
    })?;
    *pinned = Some(prepared.key.clone());
    result.revision = prepared.revision.clone();
    let dir = match sandbox {
        Some(sb) => {
            sb.watch_plugins();
            sb.copy_source(&prepared.root, &prepared.project_dir).map_err(|e| fail(ErrorReason::Internal, "", format!("copying the source for the operation: {e}")))?
        }
        None => prepared.project_dir.clone(),
    };
    if let Some(link) = &ctx.workspace_link {
        // for sidecars only: a failure is logged, never fails the operation
        if let Err(e) = point_link(link, &dir) {
            op.log(format!("pointing {} at the project: {e}", link.display()));
        }
    }
    let (project, runtime) = pulumi::project_info(&dir).ok_or_else(|| fail(ErrorReason::InvalidSource, "source", "Pulumi.yaml has no name or runtime"))?;
    result.project_info = Some(ProjectInfo { name: project.clone(), runtime });
    Ok((dir, project))
}

/// Step 3: the CLI can run the request — structured config needs one that reads it (PKO's
/// `IncompatibleConfiguration`); its version (read once per agent) is reported for the Workspace's
/// `status.pulumiVersion`.
async fn check_cli(ctx: &RunnerContext, req: &OperationRequest, result: &mut OperationResult) -> Result<(), Failure> {
    let version = ctx.pulumi_version.get_or_try_init(|| pulumi::version(&ctx.pulumi)).await.map_err(|e| fail(ErrorReason::Internal, "", format!("pulumi version: {e}")))?;
    result.pulumi_version = version.clone();
    if let Some(message) = structured_config_unsupported(version).filter(|_| uses_structured_config(&req.config)) {
        return Err(fail(ErrorReason::IncompatibleConfiguration, "config", message));
    }
    Ok(())
}

/// Step 4: the stack selected (or created) once per backend, its config and environments set.
/// Returns the stack's key in [`RunnerContext::known_stacks`].
async fn prepare_stack(
    ctx: &RunnerContext,
    op: &Arc<Operation>,
    req: &OperationRequest,
    isolated: bool,
    (dir, project): (&Path, &str),
    env: &BTreeMap<String, String>,
    masker: &mut Masker,
) -> Result<String, Failure> {
    let stack = req.stack.clone().unwrap_or_default();
    repair_sidecars(op, env, dir, project, &stack.name);
    if !isolated {
        reset_stack_config(dir, &stack.name).map_err(|e| fail(ErrorReason::Internal, "", format!("resetting stack config: {e}")))?;
    }
    // every command names its stack (`--stack`), so a stack known to exist in the backend needs no
    // `stack select` in whichever directory the operation runs
    let known_key = format!("{} {} {}", env.get("PULUMI_BACKEND_URL").map(String::as_str).unwrap_or(""), project, stack.name);
    if !ctx.known_stacks.lock().unwrap().contains(&known_key) {
        select_stack(ctx, dir, env, &stack, masker).await?;
        ctx.known_stacks.lock().unwrap().insert(known_key.clone());
    }
    // a stack removed elsewhere since we last saw it is selected/created again, once
    if let Err(f) = set_config(ctx, dir, env, &stack.name, project, &req.config, masker).await {
        if !f.message.contains("no stack named") {
            return Err(f);
        }
        ctx.known_stacks.lock().unwrap().remove(&known_key);
        select_stack(ctx, dir, env, &stack, masker).await?;
        ctx.known_stacks.lock().unwrap().insert(known_key.clone());
        set_config(ctx, dir, env, &stack.name, project, &req.config, masker).await?;
    }
    add_environments(ctx, dir, env, &stack, masker).await?;
    Ok(known_key)
}

/// Step 5: the operation. A conflict with holders still running on this host waits for them (the
/// `pulumi` of a killed agent, stopped by its supervisor; another operation ending) and tries again;
/// a conflict whose every lock holder is known dead (an agent SIGKILLed mid-`up`) releases those
/// locks and runs once more.
async fn operate_through_locks(ctx: &RunnerContext, op: &Arc<Operation>, step: &Step<'_>, masker: &mut Masker, result: &mut OperationResult) -> Result<(), Failure> {
    let mut outcome = operate(ctx, op, step, masker, result).await;
    if let Err(f) = &outcome
        && !f.live.is_empty()
        && wait_for_holders(op, &f.live, ctx.lock_wait).await
    {
        outcome = operate(ctx, op, step, masker, result).await;
    }
    match outcome {
        Err(f) if !f.stale.is_empty() => {
            check_stop(op)?;
            release_stale_locks(ctx, op, step, &f.stale, masker).await?;
            check_stop(op)?;
            operate(ctx, op, step, masker, result).await
        }
        other => other,
    }
}

/// A `file://~` backend (Pulumi expands `~` with `HOME`) names the agent's home, not the operation's
/// fresh one: the URL of the operation's environment, else the agent's (`inherited`), is rewritten with
/// the agent's `home`. Otherwise every operation would find an empty backend in its own home.
fn pin_home_backend(env: &mut BTreeMap<String, String>, inherited: Option<String>, home: Option<String>) {
    let Some(url) = env.get("PULUMI_BACKEND_URL").cloned().or(inherited) else { return };
    let (Some(rest), Some(home)) = (url.strip_prefix("file://~"), home) else { return };
    if rest.is_empty() || rest.starts_with('/') {
        env.insert("PULUMI_BACKEND_URL".into(), format!("file://{}{rest}", home.trim_end_matches('/')));
    }
}

/// Points the symbolic link `link` at `target`, atomically (a new link renamed over the old one).
fn point_link(link: &Path, target: &Path) -> std::io::Result<()> {
    let tmp = link.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    std::fs::rename(&tmp, link).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Whether an environment variable's name says it holds a secret (masked in every log line).
fn is_secret_name(name: &str) -> bool {
    ["PASSPHRASE", "TOKEN", "SECRET", "PASSWORD"].iter().any(|s| name.contains(s))
}

/// The variables of the dotenv file `path` (dotenv syntax: `NAME=value`, quotes, `export`, comments),
/// none when it does not exist. Errors: the file named with what is wrong in it.
fn read_env_file(path: &Path) -> Result<Vec<(String, String)>, String> {
    let iter = match dotenvy::from_path_iter(path) {
        Ok(i) => i,
        Err(dotenvy::Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("env file {}: {e}", path.display())),
    };
    let mut vars = Vec::new();
    for r in iter {
        match r {
            Ok(v) => vars.push(v),
            // the line itself may hold a secret: it is not repeated
            Err(dotenvy::Error::LineParse(_, at)) => {
                return Err(format!("env file {}: entry {} is not NAME=value (a parse error at character {at} of it)", path.display(), vars.len() + 1));
            }
            Err(e) => return Err(format!("env file {}: {e}", path.display())),
        }
    }
    Ok(vars)
}

/// What [`operate`] runs: the operation's kind on `stack` in the project `dir`.
struct Step<'a> {
    kind: OperationType,
    stack: &'a str,
    dir: &'a Path,
    env: &'a BTreeMap<String, String>,
    options: &'a pko_proto::v1::OperationOptions,
    /// The stack's key in [`RunnerContext::known_stacks`].
    known_key: &'a str,
}

/// Runs the Pulumi command of `step` and, for `up`, reads the outputs into `result`. A conflict whose
/// every lock holder is known dead on this host carries them in [`Failure::stale`].
/// Most resources a drift check's result names (the change summary counts them all).
const MAX_CHANGES: usize = 100;

async fn operate(ctx: &RunnerContext, op: &Arc<Operation>, step: &Step<'_>, masker: &mut Masker, result: &mut OperationResult) -> Result<(), Failure> {
    let (kind, dir, env, known_key) = (step.kind, step.dir, step.env, step.known_key);
    let mut args = pulumi::operation_args(kind, step.stack, step.options);
    if ctx.log_level > 0 {
        args.extend(["-v".into(), ctx.log_level.to_string(), "--logtostderr".into(), "--logflow".into()]);
    }
    op.log(format!("running pulumi {}", args.join(" ")));
    let mut child = ctx
        .pulumi
        .command(dir, env, &args)
        .envs(pulumi::operation_env(kind, step.options))
        .spawn()
        .map_err(|e| fail(ErrorReason::Internal, "", format!("starting pulumi: {e}")))?;
    let mut guard = ctx.pulumi.stop_on_drop(&child);
    op.set_process(child.id().unwrap_or(0), ctx.pulumi.hard_stop());
    // A stop requested while the process was starting still reaches it.
    if op.interrupted.load(Ordering::SeqCst) || op.cancelled.load(Ordering::SeqCst) {
        op.signal(nix::sys::signal::Signal::SIGINT);
    }
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    let err_masker = masker.clone();
    let op_err = op.clone();
    let stderr_task = tokio::spawn(async move {
        let mut text = String::new();
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(l)) = lines.next_line().await {
            let l = err_masker.mask(&l);
            op_err.publish(Event::Log(LogLine { stream: log_line::Stream::Stderr as i32, text: l.clone() }));
            text.push_str(&l);
            text.push('\n');
        }
        text
    });
    let mut errors = String::new();
    let mut stderr_diagnostics = String::new();
    let mut summary: Option<Value> = None;
    let mut stack_outputs: Option<serde_json::Map<String, Value>> = None;
    let mut preview_doc = String::new();
    let digest = kind == OperationType::Preview;
    let drift_check = kind == OperationType::Refresh && step.options.preview_only;
    let mut lines = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line = masker.mask(&line);
        if digest {
            preview_doc.push_str(&line);
            preview_doc.push('\n');
            continue;
        }
        match serde_json::from_str::<Value>(&line) {
            Ok(Value::Object(ev)) => {
                if let Some(d) = ev.get("diagnosticEvent") {
                    let text = d["message"].as_str().unwrap_or_default();
                    match d["severity"].as_str() {
                        Some("error") => errors.push_str(text),
                        // language hosts (Pulumi YAML among them) report program errors as info on stderr
                        Some("info#err") => stderr_diagnostics.push_str(text),
                        _ => {}
                    }
                }
                if drift_check
                    && result.changes.len() < MAX_CHANGES
                    && let Some((urn, op, properties)) = pulumi::event_change(&Value::Object(ev.clone()))
                {
                    result.changes.push(pko_proto::v1::ResourceChange { urn, op, properties });
                }
                if let Some(s) = ev.get("summaryEvent") {
                    summary = Some(s.clone());
                }
                if let Some(m) = ev.get("resOutputsEvent").map(|e| &e["metadata"]).filter(|m| m["type"] == "pulumi:pulumi:Stack") {
                    stack_outputs = m["new"]["outputs"].as_object().cloned();
                }
                op.publish(Event::EngineEvent(crate::convert::to_struct(&ev)));
            }
            _ => op.publish(Event::Log(LogLine { stream: log_line::Stream::Stdout as i32, text: line })),
        }
    }
    let status = child.wait().await.map_err(|e| fail(ErrorReason::Internal, "", format!("waiting for pulumi: {e}")))?;
    guard.disarm();
    op.set_pid(0);
    let stderr_text = stderr_task.await.unwrap_or_default();
    if digest {
        if let Ok(Value::Object(doc)) = serde_json::from_str::<Value>(&preview_doc) {
            for d in doc.get("diagnostics").and_then(Value::as_array).into_iter().flatten() {
                if d["severity"] == "error" {
                    errors.push_str(d["message"].as_str().unwrap_or_default());
                }
            }
            summary = doc.get("changeSummary").map(|c| json!({ "resourceChanges": c }));
            op.publish(Event::EngineEvent(crate::convert::to_struct(&doc)));
        } else if !preview_doc.trim().is_empty() {
            op.publish(Event::Log(LogLine { stream: log_line::Stream::Stdout as i32, text: preview_doc.clone() }));
        }
    }
    if let Some(changes) = summary.as_ref().and_then(|s| s.get("resourceChanges")).and_then(Value::as_object) {
        result.change_summary = changes.iter().map(|(k, v)| (k.clone(), v.as_i64().unwrap_or(0) as i32)).collect();
    }
    result.permalink = find_permalink(&format!("{stderr_text}\n{preview_doc}")).unwrap_or_default();
    if !status.success() {
        let text = format!("{errors}\n{stderr_diagnostics}\n{stderr_text}");
        if text.contains("no stack named") {
            ctx.known_stacks.lock().unwrap().remove(known_key);
        }
        let reason = pulumi::classify_failure(&text);
        let msg = first_error_line(&text).unwrap_or_else(|| format!("pulumi {} exited with {status}", args[0]));
        let mut failure = fail(reason, "", msg);
        if reason == ErrorReason::UpdateConflict {
            match crate::locks::judge(&text, &crate::locks::hostname(), |pid| crate::locks::process_info(Path::new("/proc"), pid)) {
                crate::locks::Judgement::Release(dead) => failure.stale = dead,
                crate::locks::Judgement::WaitFor(alive) => failure.live = alive,
                crate::locks::Judgement::Keep => {}
            }
        }
        return Err(failure);
    }

    // 6. outputs (up)
    if kind == OperationType::Up {
        result.outputs = outputs(ctx, dir, env, step.stack, stack_outputs, masker).await?;
    }
    Ok(())
}

/// Waits up to `limit` for every holder in `live` (running on this host) to end, logging whom it waits
/// for. Returns whether they all ended (false: time is up, or the operation is being stopped).
async fn wait_for_holders(op: &Arc<Operation>, live: &[crate::locks::Holder], limit: std::time::Duration) -> bool {
    let names: Vec<String> = live.iter().map(|h| format!("{} pid {}", h.who, h.pid)).collect();
    tracing::info!(operation = %op.id, holders = ?names, limit_s = limit.as_secs(), "stack locked by a process on this host: waiting for it to end");
    op.log(format!("the stack is locked by {} process(es) still running on this host; waiting up to {} s for them to end: {}", live.len(), limit.as_secs(), names.join("; ")));
    let end = tokio::time::Instant::now() + limit;
    loop {
        let host = crate::locks::hostname();
        let running = live.iter().any(|h| crate::locks::verdict(h, &host, |pid| crate::locks::process_info(Path::new("/proc"), pid)) == crate::locks::Verdict::Alive);
        if !running {
            op.log("the lock holders ended; trying again");
            return true;
        }
        if check_stop(op).is_err() || tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// Releases the locks of `stale` holders (all known dead: [`crate::locks`]) with `pulumi cancel`, which
/// deletes the stack's lock files of a DIY backend; logged on the operation and the agent.
async fn release_stale_locks(ctx: &RunnerContext, op: &Arc<Operation>, step: &Step<'_>, stale: &[(crate::locks::Holder, &'static str)], masker: &Masker) -> Result<(), Failure> {
    let holders: Vec<String> = stale.iter().map(|(h, why)| format!("{} pid {} ({why})", h.who, h.pid)).collect();
    tracing::warn!(operation = %op.id, epoch = op.epoch(), holders = ?holders, "releasing backend locks whose holders are known dead");
    op.log(format!("releasing {} stale lock(s) whose holder is known dead: {}", stale.len(), holders.join("; ")));
    let out = pulumi::run(&ctx.pulumi, step.dir, step.env, &["cancel", "--yes", "--non-interactive", "--stack", step.stack])
        .await
        .map_err(|e| fail(ErrorReason::Internal, "", format!("running pulumi cancel: {e}")))?;
    if !out.success {
        let text = masker.mask(&out.stderr);
        return Err(fail(ErrorReason::UpdateConflict, "", format!("releasing stale locks failed: {}", first_error_line(&text).unwrap_or_else(|| text.trim().to_string()))));
    }
    Ok(())
}

/// Removes the truncated attribute sidecars a `pulumi` killed mid-write left beside the stack's state in
/// a `file://` backend ([`crate::sidecars`]), logged on the operation and the agent; a failure is logged
/// and the operation goes on (Pulumi then reports what it cannot read).
fn repair_sidecars(op: &Arc<Operation>, env: &BTreeMap<String, String>, dir: &Path, project: &str, stack: &str) {
    let home = env.get("HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(PathBuf::from));
    // the operation's variables, else the agent's own environment that `pulumi` inherits
    let url = env.get("PULUMI_BACKEND_URL").cloned().or_else(|| std::env::var("PULUMI_BACKEND_URL").ok());
    let Some(root) = url.and_then(|url| crate::sidecars::backend_root(&url, home.as_deref(), dir)) else {
        return;
    };
    match crate::sidecars::repair(&root, project, stack) {
        Ok(removed) if removed.is_empty() => {}
        Ok(removed) => {
            let names: Vec<String> = removed.iter().map(|p| p.strip_prefix(&root).unwrap_or(p).display().to_string()).collect();
            tracing::warn!(operation = %op.id, files = ?names, "removed truncated backend attribute sidecars left by a killed pulumi");
            op.log(format!("removed {} truncated attribute sidecar(s) a pulumi killed mid-write left in the backend: {}", names.len(), names.join(", ")));
        }
        Err(e) => {
            tracing::warn!(operation = %op.id, error = %e, "checking the backend's attribute sidecars");
            op.log(format!("checking the backend's attribute sidecars: {e}"));
        }
    }
}

/// Restores the stack's config file to what the source holds (or removes it), so config set by an
/// earlier operation on this cached directory never leaks into the next.
fn reset_stack_config(dir: &Path, stack: &str) -> std::io::Result<()> {
    let short = stack.rsplit('/').next().unwrap_or(stack);
    let file = dir.join(format!("Pulumi.{short}.yaml"));
    let pristine = dir.join(".pko-pristine").join(format!("Pulumi.{short}.yaml"));
    if !dir.join(".pko-pristine").exists() {
        std::fs::create_dir_all(dir.join(".pko-pristine"))?;
        for e in std::fs::read_dir(dir)?.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("Pulumi.") && n != "Pulumi.yaml" && n != "Pulumi.yml" && (n.ends_with(".yaml") || n.ends_with(".yml")) {
                std::fs::copy(e.path(), dir.join(".pko-pristine").join(&n))?;
            }
        }
    }
    if pristine.exists() {
        std::fs::copy(&pristine, &file)?;
    } else if file.exists() {
        std::fs::remove_file(&file)?;
    }
    Ok(())
}

async fn set_config(ctx: &RunnerContext, dir: &Path, env: &BTreeMap<String, String>, stack: &str, project: &str, items: &[ConfigItem], masker: &mut Masker) -> Result<(), Failure> {
    if items.is_empty() {
        return Ok(());
    }
    let mut planned = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let field = format!("config[{i}]");
        if item.key.is_empty() {
            return Err(fail(ErrorReason::InvalidConfig, &field, "config key is empty"));
        }
        let value: Value = match &item.value {
            Some(config_item::Value::Literal(v)) => crate::convert::from_value(v),
            Some(config_item::Value::ValueFrom(r)) => {
                // `env` names a variable of the Pulumi process: the operation's own environment first
                // (e.g. a Secret reference resolved above), then the agent's.
                let from_op_env = match &r.kind {
                    Some(pko_proto::v1::value_ref::Kind::Env(name)) => env.get(name).cloned(),
                    _ => None,
                };
                let s = match from_op_env {
                    Some(v) => v,
                    None => ctx.values.resolve(r).await.map_err(|m| fail(ErrorReason::InvalidConfig, &field, format!("config {}: {m}", item.key)))?,
                };
                if item.json {
                    serde_json::from_str(&s).map_err(|e| fail(ErrorReason::InvalidConfig, &field, format!("config {}: value is not JSON: {e}", item.key)))?
                } else {
                    Value::String(s)
                }
            }
            None => return Err(fail(ErrorReason::InvalidConfig, &field, format!("config {} has no value", item.key))),
        };
        let text = match &value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if item.secret {
            masker.add(&text);
        }
        let key = if item.key.contains(':') { item.key.clone() } else { format!("{project}:{}", item.key) };
        planned.push(PlannedConfig { key, text, secret: item.secret, path: item.path, object: (!value.is_string()).then_some(value) });
    }
    for c in config_commands(stack, &planned) {
        let refs: Vec<&str> = c.args.iter().map(String::as_str).collect();
        let out = match &c.stdin {
            None => pulumi::run(&ctx.pulumi, dir, env, &refs).await,
            Some(input) => pulumi::run_with_input(&ctx.pulumi, dir, env, &refs, input).await,
        }
        .map_err(|e| fail(ErrorReason::Internal, "config", e.to_string()))?;
        if !out.success {
            return Err(fail(ErrorReason::InitializationFailed, "config", masker.mask(out.stderr.trim())));
        }
    }
    Ok(())
}

/// Longest `NAME=value` environment entry, in bytes (Linux `MAX_ARG_STRLEN`).
pub const MAX_ENV_VAR_BYTES: usize = 128 << 10;

/// Longest single command-line argument the agent passes to Pulumi, in bytes: half of Linux's
/// `MAX_ARG_STRLEN` (128 KiB), leaving room for the key.
pub const MAX_CONFIG_ARG_BYTES: usize = 64 << 10;
/// Bytes of `--path` config values one `pulumi config set-all` carries (Linux allows 2 MiB of arguments
/// and environment together); a `--json` batch is one argument and stays within
/// [`MAX_CONFIG_ARG_BYTES`].
pub const MAX_CONFIG_BATCH_BYTES: usize = 256 << 10;

/// One config value, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedConfig {
    /// Fully qualified key (`project:key`).
    pub key: String,
    /// The value as text (JSON text for structured values).
    pub text: String,
    /// Encrypted by the stack's secrets provider.
    pub secret: bool,
    /// `key` is a property path (`--path`).
    pub path: bool,
    /// The structured value, when it is not a string.
    pub object: Option<Value>,
}

/// One Pulumi command that sets config: its arguments and, for a value too large for the command line,
/// the value on standard input (`pulumi config set <key>` reads it there, trimming one final newline).
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigCommand {
    /// Arguments after `pulumi`.
    pub args: Vec<String>,
    /// Standard input.
    pub stdin: Option<String>,
}

/// The commands that set `items` on `stack` with no argument over [`MAX_CONFIG_ARG_BYTES`] and no
/// command over [`MAX_CONFIG_BATCH_BYTES`] of values: `config set-all --json` batches for plain keys,
/// `config set-all --path` batches for paths, and `config set <key>` with the value on standard input
/// for a value too large for one argument. Pure.
pub fn config_commands(stack: &str, items: &[PlannedConfig]) -> Vec<ConfigCommand> {
    let mut out = Vec::new();
    let mut json_batch = serde_json::Map::new();
    let mut json_bytes = 0usize;
    let mut path_batch: Vec<String> = Vec::new();
    let mut path_bytes = 0usize;
    let flag = |secret: bool| if secret { "--secret" } else { "--plaintext" }.to_string();
    let flush_json = |batch: &mut serde_json::Map<String, Value>, bytes: &mut usize, out: &mut Vec<ConfigCommand>| {
        if !batch.is_empty() {
            let doc = Value::Object(std::mem::take(batch)).to_string();
            out.push(ConfigCommand { args: vec!["config".into(), "set-all".into(), "--stack".into(), stack.into(), "--json".into(), doc], stdin: None });
            *bytes = 0;
        }
    };
    let flush_path = |batch: &mut Vec<String>, bytes: &mut usize, out: &mut Vec<ConfigCommand>| {
        if !batch.is_empty() {
            let mut args = vec!["config".into(), "set-all".into(), "--stack".into(), stack.into(), "--path".into()];
            args.append(batch);
            out.push(ConfigCommand { args, stdin: None });
            *bytes = 0;
        }
    };
    for item in items {
        let mut entry = json!({ "value": item.text, "secret": item.secret });
        if let Some(o) = &item.object {
            entry["objectValue"] = o.clone();
        }
        let size = item.key.len() + if item.path { item.text.len() } else { entry.to_string().len() };
        if size > MAX_CONFIG_ARG_BYTES {
            let mut args = vec!["config".into(), "set".into(), "--stack".into(), stack.into(), flag(item.secret)];
            if item.path {
                args.push("--path".into());
            }
            if item.object.is_some() {
                args.extend(["--type".into(), "json".into()]);
            }
            args.extend(["--".into(), item.key.clone()]);
            out.push(ConfigCommand { args, stdin: Some(format!("{}\n", item.text)) });
        } else if item.path {
            if path_bytes + size > MAX_CONFIG_BATCH_BYTES {
                flush_path(&mut path_batch, &mut path_bytes, &mut out);
            }
            path_batch.push(flag(item.secret));
            path_batch.push(format!("{}={}", item.key, item.text));
            path_bytes += size;
        } else {
            // the JSON document is one argument: it stays within the per-argument limit
            let size = size + 8;
            if json_bytes + size > MAX_CONFIG_ARG_BYTES {
                flush_json(&mut json_batch, &mut json_bytes, &mut out);
            }
            json_batch.insert(item.key.clone(), entry);
            json_bytes += size;
        }
    }
    flush_json(&mut json_batch, &mut json_bytes, &mut out);
    flush_path(&mut path_batch, &mut path_bytes, &mut out);
    out
}

/// Imports the stack's ESC environments (`pulumi config env add`, PKO's `AddEnvironments`) into the
/// stack's config file, which every operation restores from the source first. Errors: Pulumi's
/// message (e.g. a backend without ESC) as `INITIALIZATION_FAILED` on `stack.environments` (PKO: a
/// Workspace `InitializationFailed`).
async fn add_environments(ctx: &RunnerContext, dir: &Path, env: &BTreeMap<String, String>, stack: &pko_proto::v1::StackSettings, masker: &Masker) -> Result<(), Failure> {
    if stack.environments.is_empty() {
        return Ok(());
    }
    let mut args = vec!["config", "env", "add", "--yes", "--non-interactive", "--stack", stack.name.as_str()];
    args.extend(stack.environments.iter().map(String::as_str));
    let out = pulumi::run(&ctx.pulumi, dir, env, &args).await.map_err(|e| fail(ErrorReason::Internal, "", e.to_string()))?;
    if !out.success {
        let text = masker.mask(&pulumi::error_text(&out.stderr));
        return Err(fail(ErrorReason::InitializationFailed, "stack.environments", format!("adding ESC environments {}: {text}", stack.environments.join(", "))));
    }
    Ok(())
}

async fn select_stack(ctx: &RunnerContext, dir: &Path, env: &BTreeMap<String, String>, stack: &pko_proto::v1::StackSettings, masker: &Masker) -> Result<(), Failure> {
    let mut args = vec!["stack", "select", "--non-interactive", "--stack", stack.name.as_str()];
    if stack.create {
        args.push("--create");
        if !stack.secrets_provider.is_empty() {
            args.extend(["--secrets-provider", stack.secrets_provider.as_str()]);
        }
    }
    let out = pulumi::run(&ctx.pulumi, dir, env, &args).await.map_err(|e| fail(ErrorReason::Internal, "", e.to_string()))?;
    if !out.success {
        let text = masker.mask(out.stderr.trim());
        let reason = match pulumi::classify_failure(&text) {
            ErrorReason::UpdateFailed => ErrorReason::InitializationFailed,
            r => r,
        };
        return Err(fail(reason, "stack.name", text));
    }
    Ok(())
}

/// Whether `config` holds a structured value: a literal that is not a string, or a value parsed as
/// JSON.
fn uses_structured_config(config: &[ConfigItem]) -> bool {
    config.iter().any(|c| c.json || matches!(&c.value, Some(config_item::Value::Literal(v)) if !matches!(v.kind, Some(prost_types::value::Kind::StringValue(_)))))
}

/// PKO's message when the CLI `version` (`v3.180.0`) is older than
/// [`MIN_PULUMI_FOR_STRUCTURED_CONFIG`] (or not a version); `None` when it reads structured config.
pub fn structured_config_unsupported(version: &str) -> Option<String> {
    let (a, b, c) = MIN_PULUMI_FOR_STRUCTURED_CONFIG;
    match parse_pulumi_version(version) {
        Some(v) if v >= MIN_PULUMI_FOR_STRUCTURED_CONFIG => None,
        Some(_) => Some(format!("Pulumi CLI version {} does not support JSON configuration, require >= v{a}.{b}.{c}", version.trim())),
        None => Some(format!("Failed to parse Pulumi version {:?}", version.trim())),
    }
}

/// Whether a value from an engine event is Pulumi's secret signature (`{"4dabf18193072939515e22adb298388d":
/// "1b47061264138c4ac30d75fd1eb44270", ...}`).
fn is_secret_sig(v: &Value) -> bool {
    v.get("4dabf18193072939515e22adb298388d").and_then(Value::as_str) == Some("1b47061264138c4ac30d75fd1eb44270")
}

/// Stack outputs: taken from the stack resource's outputs event of the update; only when a secret output
/// is among them, `pulumi stack output --show-secrets` is asked for their values.
async fn outputs(
    ctx: &RunnerContext,
    dir: &Path,
    env: &BTreeMap<String, String>,
    stack: &str,
    from_events: Option<serde_json::Map<String, Value>>,
    masker: &mut Masker,
) -> Result<std::collections::HashMap<String, OutputValue>, Failure> {
    let event_outputs = match from_events {
        Some(m) => m,
        None => {
            let masked = pulumi::run(&ctx.pulumi, dir, env, &["stack", "output", "--json", "--stack", stack]).await.map_err(|e| fail(ErrorReason::Internal, "", e.to_string()))?;
            serde_json::from_str::<serde_json::Map<String, Value>>(&masked.stdout)
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| if v == "[secret]" { (k, json!({"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270"})) } else { (k, v) })
                .collect()
        }
    };
    let mut shown = serde_json::Map::new();
    if event_outputs.values().any(is_secret_sig) {
        let out = pulumi::run(&ctx.pulumi, dir, env, &["stack", "output", "--json", "--show-secrets", "--stack", stack])
            .await
            .map_err(|e| fail(ErrorReason::Internal, "", e.to_string()))?;
        if !out.success {
            return Err(fail(ErrorReason::Internal, "", format!("reading outputs: {}", masker.mask(&out.stderr))));
        }
        shown = serde_json::from_str(&out.stdout).unwrap_or_default();
    }
    let mut result = std::collections::HashMap::new();
    for (k, v) in event_outputs {
        let secret = is_secret_sig(&v);
        let value = if secret { shown.get(&k).cloned().unwrap_or(Value::Null) } else { v };
        if secret {
            masker.add(&match &value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
        }
        result.insert(k, OutputValue { value: value.to_string().into_bytes(), secret });
    }
    Ok(result)
}

fn find_permalink(text: &str) -> Option<String> {
    let re = regex::Regex::new(r"https?://[^\s]+/(updates|previews)/\d+").ok()?;
    re.find(text).map(|m| m.as_str().to_string())
}

/// The first `error:`/`Error:` line of Pulumi's output without its prefix, followed by the location
/// line Pulumi YAML prints after it (`… (on Pulumi.yaml line 7)`); else the first five lines.
fn first_error_line(text: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if let Some(i) = lines.iter().position(|l| l.get(..6).is_some_and(|p| p.eq_ignore_ascii_case("error:"))) {
        let mut msg = lines[i][6..].trim().to_string();
        if let Some(loc) = lines.get(i + 1).filter(|l| l.starts_with("on ")) {
            msg.push_str(&format!(" ({})", loc.trim_end_matches(':')));
        }
        return Some(msg);
    }
    (!lines.is_empty()).then(|| lines.iter().take(5).copied().collect::<Vec<_>>().join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_in_the_home_stays_in_the_agents_home() {
        let pin = |url: Option<&str>, inherited: Option<&str>| {
            let mut env: BTreeMap<String, String> = url.map(|u| ("PULUMI_BACKEND_URL".to_string(), u.to_string())).into_iter().collect();
            pin_home_backend(&mut env, inherited.map(str::to_string), Some("/home/agent/".into()));
            env.get("PULUMI_BACKEND_URL").cloned()
        };
        assert_eq!(pin(Some("file://~"), None).as_deref(), Some("file:///home/agent"));
        assert_eq!(pin(Some("file://~/state"), None).as_deref(), Some("file:///home/agent/state"));
        assert_eq!(pin(None, Some("file://~/s")).as_deref(), Some("file:///home/agent/s"), "the agent's own URL, made explicit");
        assert_eq!(pin(Some("file:///abs"), Some("file://~")).as_deref(), Some("file:///abs"), "the request's wins");
        assert_eq!(pin(Some("file://~bob/x"), None).as_deref(), Some("file://~bob/x"), "another user's home is not ours");
        assert_eq!(pin(Some("s3://b"), None).as_deref(), Some("s3://b"));
        assert_eq!(pin(None, None), None);
    }

    #[test]
    fn stack_config_is_reset_to_the_source() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("Pulumi.yaml"), "name: p\nruntime: yaml\n").unwrap();
        std::fs::write(d.path().join("Pulumi.prod.yaml"), "config:\n  p:a: checked-in\n").unwrap();
        reset_stack_config(d.path(), "org/p/prod").unwrap();
        std::fs::write(d.path().join("Pulumi.prod.yaml"), "config:\n  p:a: changed\n").unwrap();
        std::fs::write(d.path().join("Pulumi.dev.yaml"), "config:\n  p:b: stale\n").unwrap();
        reset_stack_config(d.path(), "org/p/prod").unwrap();
        reset_stack_config(d.path(), "dev").unwrap();
        assert_eq!(std::fs::read_to_string(d.path().join("Pulumi.prod.yaml")).unwrap(), "config:\n  p:a: checked-in\n");
        assert!(!d.path().join("Pulumi.dev.yaml").exists());
    }

    fn item(key: &str, text: &str, secret: bool, path: bool) -> PlannedConfig {
        PlannedConfig { key: key.into(), text: text.into(), secret, path, object: None }
    }

    #[test]
    fn small_config_is_one_command_per_kind() {
        let cmds = config_commands("dev", &[item("p:a", "1", false, false), item("p:b", "2", true, false), item("p:c.d", "3", false, true)]);
        assert_eq!(cmds.len(), 2);
        assert_eq!(&cmds[0].args[..5], &["config", "set-all", "--stack", "dev", "--json"]);
        let doc: Value = serde_json::from_str(&cmds[0].args[5]).unwrap();
        assert_eq!(doc["p:b"], json!({"value": "2", "secret": true}));
        assert_eq!(cmds[1].args[4..], ["--path", "--plaintext", "p:c.d=3"]);
        assert!(cmds.iter().all(|c| c.stdin.is_none()));
    }

    #[test]
    fn no_argument_or_command_exceeds_the_kernel_limits() {
        let big = "x".repeat(300 << 10);
        let medium = "y".repeat(40 << 10);
        let mut items: Vec<PlannedConfig> = (0..20).map(|i| item(&format!("p:m{i}"), &medium, false, false)).collect();
        items.push(item("p:big", &big, true, false));
        items.push(item("p:bigpath.x", &big, false, true));
        let cmds = config_commands("dev", &items);
        for c in &cmds {
            assert!(c.args.iter().all(|a| a.len() <= MAX_CONFIG_ARG_BYTES + 1024), "an argument over the limit");
            assert!(c.args.iter().map(String::len).sum::<usize>() <= MAX_CONFIG_BATCH_BYTES + MAX_CONFIG_ARG_BYTES);
        }
        let stdin: Vec<&ConfigCommand> = cmds.iter().filter(|c| c.stdin.is_some()).collect();
        assert_eq!(stdin.len(), 2, "the two large values go on standard input");
        assert_eq!(stdin[0].args, ["config", "set", "--stack", "dev", "--secret", "--", "p:big"]);
        assert_eq!(stdin[0].stdin.as_deref().map(str::len), Some(big.len() + 1));
        assert!(stdin[1].args.contains(&"--path".to_string()));
        let set: usize = cmds.iter().filter(|c| c.stdin.is_none()).map(|c| serde_json::from_str::<serde_json::Map<String, Value>>(&c.args[5]).unwrap().len()).sum();
        assert_eq!(set, 20, "every medium value is set, in batches");
    }

    #[test]
    fn the_workspace_link_follows_the_latest_project() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, link) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("workspace"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        point_link(&link, &a).unwrap();
        assert_eq!(std::fs::read_link(&link).unwrap(), a);
        point_link(&link, &b).unwrap();
        assert_eq!(std::fs::read_link(&link).unwrap(), b, "replaced in place");
        let real_dir = dir.path().join("real");
        std::fs::create_dir_all(real_dir.join("x")).unwrap();
        assert!(point_link(&real_dir, &a).is_err(), "a directory in the way is not replaced");
        assert!(real_dir.join("x").is_dir());
    }

    #[test]
    fn env_files_are_read_as_dotenv_without_repeating_a_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".env");
        assert_eq!(read_env_file(&path), Ok(vec![]), "no file yet: nothing");
        std::fs::write(&path, "# written by an init container\nA=1\nexport B=\"two words\"\n").unwrap();
        assert_eq!(read_env_file(&path), Ok(vec![("A".into(), "1".into()), ("B".into(), "two words".into())]));
        std::fs::write(&path, "A=1\nPULUMI_CONFIG_PASSPHRASE=\"hunter2\n").unwrap();
        let e = read_env_file(&path).unwrap_err();
        assert!(e.contains("entry 2 is not NAME=value") && !e.contains("hunter2"), "{e}");
    }

    #[test]
    fn structured_config_needs_pulumi_3_202() {
        let string = ConfigItem {
            key: "a".into(),
            value: Some(config_item::Value::Literal(prost_types::Value { kind: Some(prost_types::value::Kind::StringValue("x".into())) })),
            ..Default::default()
        };
        let number = ConfigItem {
            key: "n".into(),
            value: Some(config_item::Value::Literal(prost_types::Value { kind: Some(prost_types::value::Kind::NumberValue(2.0)) })),
            ..Default::default()
        };
        let json_ref = ConfigItem { key: "j".into(), json: true, ..Default::default() };
        assert!(!uses_structured_config(std::slice::from_ref(&string)));
        assert!(uses_structured_config(&[string.clone(), number]));
        assert!(uses_structured_config(&[json_ref]));
        assert_eq!(structured_config_unsupported("v3.202.0"), None);
        assert_eq!(structured_config_unsupported("v3.259.0\n"), None);
        assert_eq!(structured_config_unsupported("v3.201.9").as_deref(), Some("Pulumi CLI version v3.201.9 does not support JSON configuration, require >= v3.202.0"));
        assert_eq!(structured_config_unsupported("dev").as_deref(), Some("Failed to parse Pulumi version \"dev\""));
    }

    #[test]
    fn permalinks_and_errors_are_found() {
        assert_eq!(find_permalink("View Live: https://app.pulumi.com/o/p/s/updates/12\n").as_deref(), Some("https://app.pulumi.com/o/p/s/updates/12"));
        assert_eq!(find_permalink("no link"), None);
        assert_eq!(first_error_line("warn\nerror: the stack is locked\n").as_deref(), Some("the stack is locked"));
        // Pulumi YAML's info#err diagnostics
        let yaml = "\nError: resource, variable, or config value \"missing\" not found\n\n  on Pulumi.yaml line 7:\n\n   7:       create: ${missing.value}\n";
        assert_eq!(first_error_line(yaml).as_deref(), Some("resource, variable, or config value \"missing\" not found (on Pulumi.yaml line 7)"));
    }
}
