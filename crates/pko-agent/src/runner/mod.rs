//! Runs one operation: resolve values, prepare the source, select (or create) the stack, set its config, run the Pulumi
//! command streaming its engine events, then read outputs and build the result.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use pko_proto::v1::{
    ErrorInfo, ErrorReason, OperationRequest, OperationResult, OperationType, ProjectInfo, ResultStatus,
    operation_event::Event,
};

use crate::mask::Masker;
use crate::operation::Operation;
use crate::pulumi;
use crate::source::SourceCache;
use crate::values::ValueResolver;

mod caches;
mod config_file;
mod engine;
mod env;
mod hollow;
mod plan_file;
pub mod secrets_provider;
mod stack_config;
mod stack_select;
mod workspace_dir;

use engine::{Step, operate_through_locks, repair_sidecars};
use env::{is_secret_name, pin_home_backend, read_env_file};
use stack_config::*;
pub use stack_config::{
    ConfigCommand, MAX_CONFIG_ARG_BYTES, MAX_CONFIG_BATCH_BYTES, MAX_ENV_VAR_BYTES, PlannedConfig, config_commands,
    structured_config_unsupported,
};
use stack_select::select_stack;
use workspace_dir::{point_link, workspace_source};

/// What the runner needs from the agent.
#[derive(Debug, Clone)]
pub struct RunnerContext {
    /// The Pulumi CLI (under the agent's supervisor).
    pub pulumi: pulumi::Cli,
    /// Longest wait for a backend lock's holders still running on this host to end before an operation reports the
    /// conflict (`--lock-wait-seconds`).
    pub lock_wait: std::time::Duration,
    /// Per-operation directories ([`crate::sandbox`]); `None`: operations run in the cached source with the agent's own
    /// `HOME` and `PULUMI_HOME` (a Workspace's own agent, as PKO's pod).
    pub sandboxes: Option<crate::sandbox::Sandboxes>,
    /// Caches a Stack's own isolated operations keep between them ([`crate::stack_cache`]); `None` with no
    /// sandboxes (the agent's own `TMPDIR` lasts anyway).
    pub stack_caches: Option<Arc<crate::stack_cache::StackCaches>>,
    /// Environment added to every Pulumi process (e.g. PULUMI_HOME), below the operation's own.
    pub env: BTreeMap<String, String>,
    /// Source cache.
    pub sources: Arc<SourceCache>,
    /// Value resolver (Secrets/ConfigMaps of the agent's namespace).
    pub values: ValueResolver,
    /// Stacks known to exist (`<backend> <project dir> <stack>`): their `stack select` is skipped, which saves one
    /// Pulumi invocation per operation. A stack removed elsewhere is re-created on demand.
    pub known_stacks: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    /// Each stack's secrets provider settings as its last command left them in its stack config file, written back
    /// into a file without any ([`secrets_provider`]: saves Pulumi a second key derivation per command).
    pub secrets_providers: Arc<secrets_provider::SecretsProviders>,
    /// Pulumi log verbosity (`-v N --logtostderr --logflow`); 0 disables it (PKO `pulumiLogLevel`).
    pub log_level: u32,
    /// A dotenv file read before each operation (`--env-file`, PKO's `$PULUMI_ENV`); its variables win over the agent's
    /// and the request's.
    pub env_file: Option<PathBuf>,
    /// A symbolic link pointed at each operation's project directory (`--workspace-link`, PKO's `/share/workspace`).
    pub workspace_link: Option<PathBuf>,
    /// The Pulumi CLI's version (`pulumi version`), read once on first use.
    pub pulumi_version: Arc<tokio::sync::OnceCell<String>>,
    /// A *hollow agent* (kubemark-style, for control-plane load tests only — never a default, never in a functional
    /// test): every operation succeeds after this delay without running Pulumi or reading its source. `None`: a real
    /// agent.
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
        return hollow::hollow(&op, &req, delay).await;
    }
    let start = crate::convert::now();
    let mut masker = Masker::default();
    let mut result = OperationResult {
        start_time: Some(start),
        run_digest: pko_proto::digest::run_digest(&req),
        ..Default::default()
    };
    let mut held = Held::default();
    let started = std::time::Instant::now();
    let mut sandbox = None;
    let outcome = match ctx.sandboxes.as_ref().map(crate::sandbox::Sandboxes::create).transpose() {
        Ok(sb) => {
            sandbox = sb;
            execute(&ctx, &op, &req, sandbox.as_mut(), &mut masker, &mut result, &mut held).await
        }
        Err(e) => {
            Err(fail(ErrorReason::Internal, "", format!("an earlier operation's files could not be removed: {e}")))
        }
    };
    held.cache.close(ctx.stack_caches.as_deref(), &op);
    if let Some(key) = held.pinned {
        ctx.sources.release(&key);
    }
    if let Some(sb) = sandbox {
        finish_sandbox(&op, sb);
    }
    result.end_time = Some(crate::convert::now());
    let (setup_s, command_s, cleanup_s) = phases(started, held.command, std::time::Instant::now());
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
    tracing::info!(operation = %op.id, status = ?ResultStatus::try_from(result.status), setup_s, command_s, cleanup_s,
        "operation finished");
    op.publish(Event::Result(result));
}

/// The seconds an operation that started at `start` and ended at `end` spent before its Pulumi command, in it, and
/// after it (`command`: its start and end; an operation that failed before the command spent it all in setup).
fn phases(
    start: std::time::Instant,
    command: (Option<std::time::Instant>, Option<std::time::Instant>),
    end: std::time::Instant,
) -> (f64, f64, f64) {
    let began = command.0.unwrap_or(end);
    let ended = command.1.unwrap_or(end).max(began);
    let secs = |a: std::time::Instant, b: std::time::Instant| b.saturating_duration_since(a).as_secs_f64();
    (secs(start, began), secs(began, ended), secs(ended, end))
}

/// Removes the operation's directories and the plugins it added to or changed in the shared cache, logging what was
/// removed; a failure is logged (the next operation sweeps again, and refuses to start while it cannot).
fn finish_sandbox(op: &Arc<Operation>, sb: crate::sandbox::Sandbox) {
    match sb.finish() {
        Ok(f) if f.plugins_removed.is_empty() => {}
        Ok(f) => {
            tracing::warn!(operation = %op.id, plugins = ?f.plugins_removed,
                "the operation added or changed plugins in the shared cache: removed");
            op.log(format!(
                "removed plugins this operation added to or changed in the agent's shared cache (never run \
                by another operation): {}",
                f.plugins_removed.join(", ")
            ));
        }
        Err(e) => {
            tracing::warn!(operation = %op.id, error = %e, "removing the operation's directories");
            op.log(format!("removing the operation's directories: {e}"));
        }
    }
}

/// The operation's type as its output lines name it: `preview`, `up`, `refresh`, `destroy`, `initialize`.
pub fn kind_name(req: &OperationRequest) -> &'static str {
    match OperationType::try_from(req.r#type).unwrap_or(OperationType::Unspecified) {
        OperationType::Up => "up",
        OperationType::Initialize => "initialize",
        _ => verb(req),
    }
}

fn verb(req: &OperationRequest) -> &'static str {
    match OperationType::try_from(req.r#type).unwrap_or(OperationType::Unspecified) {
        OperationType::Preview => "preview",
        OperationType::Up => "update",
        OperationType::Refresh => "refresh",
        OperationType::Destroy => "destroy",
        OperationType::Initialize => "initialization",
        OperationType::Unspecified => "operation",
    }
}

fn check_stop(op: &Operation) -> Result<(), Failure> {
    if op.interrupted.load(Ordering::SeqCst) || op.cancelled.load(Ordering::SeqCst) {
        return Err(fail(ErrorReason::Cancelled, "", "stopped before Pulumi ran"));
    }
    Ok(())
}

/// What an operation holds until it ends, whatever its outcome: its source revision's key in the source cache (pinned,
/// never evicted meanwhile) and its Stack's own cache.
#[derive(Default)]
struct Held {
    pinned: Option<String>,
    cache: caches::CacheSlot,
    /// When the Pulumi command started and ended: the operation's setup, command and cleanup seconds in its log.
    command: (Option<std::time::Instant>, Option<std::time::Instant>),
}

/// Runs the operation `req` step by step (each step is a function below): its environment, its source, its stack and
/// config, then the Pulumi command.
async fn execute(
    ctx: &RunnerContext,
    op: &Arc<Operation>,
    req: &OperationRequest,
    mut sandbox: Option<&mut crate::sandbox::Sandbox>,
    masker: &mut Masker,
    result: &mut OperationResult,
    held: &mut Held,
) -> Result<(), Failure> {
    check_digest(req, &result.run_digest)?;
    let kind = OperationType::try_from(req.r#type).unwrap_or(OperationType::Unspecified);
    if kind == OperationType::Unspecified {
        return Err(fail(
            ErrorReason::InvalidRequest,
            "type",
            "operation type is required (preview, up, refresh, destroy or initialize)",
        ));
    }
    let stack = req.stack.clone().unwrap_or_default();
    if stack.name.is_empty() {
        return Err(fail(ErrorReason::InvalidRequest, "stack.name", "stack name is required"));
    }
    let mut env = environment(ctx, req, sandbox.as_deref(), masker).await?;
    check_stop(op)?;
    let (dir, project) = project(ctx, op, req, sandbox.as_deref_mut(), &env, result, held).await?;
    check_stop(op)?;
    check_cli(ctx, req, result).await?;
    let known_key = caches::stack_key(&env, &project, &stack.name);
    let prepared = prepare_stack(ctx, op, req, sandbox.is_some(), (&dir, &project, &known_key), &env, masker).await;
    if let Err(f) = &prepared {
        remember_secrets_provider(ctx, (&dir, &stack), &env, &known_key, Some(f));
    }
    prepared?;
    if kind == OperationType::Initialize {
        // PKO's workspace initialization ends here: the stack is selected and configured
        result.message = format!("stack {} initialized", stack.name);
        return Ok(());
    }
    check_stop(op)?;
    let options = req.options.clone().unwrap_or_default();
    let cache_vars = held.cache.vars(ctx.stack_caches.as_deref(), op, &known_key, &env);
    env.extend(cache_vars);
    let plan = plan_file::prepare(kind, &options, &env)?;
    let step = Step {
        kind,
        stack: &stack.name,
        dir: &dir,
        env: &env,
        options: &options,
        known_key: &known_key,
        released: &req.release_locks,
        plan: plan.as_ref(),
    };
    held.command.0 = Some(std::time::Instant::now());
    let mut outcome = operate_through_locks(ctx, op, &step, masker, result).await;
    held.command.1 = Some(std::time::Instant::now());
    remember_secrets_provider(ctx, (&dir, &stack), &env, &known_key, outcome.as_ref().err());
    if let (Ok(()), Some(p)) = (&outcome, &plan) {
        outcome = p.collect(result);
    }
    outcome
}

/// After a command, or a preparation of the stack that failed: what the stack config file in `dir` holds of the stack's
/// secrets provider is remembered for the stack's next operation on this agent; a remembered salt Pulumi refused
/// (`failure`: `incorrect passphrase`, by `config set-all` or the command) is forgotten.
fn remember_secrets_provider(
    ctx: &RunnerContext,
    (dir, stack): (&Path, &pko_proto::v1::StackSettings),
    env: &BTreeMap<String, String>,
    known_key: &str,
    failure: Option<&Failure>,
) {
    let key = secrets_provider::SecretsProviders::key(known_key, env, &stack.secrets_provider);
    if failure.is_some_and(|f| f.message.contains("incorrect passphrase")) {
        ctx.secrets_providers.forget(&key);
        return;
    }
    let short = stack.name.rsplit('/').next().unwrap_or(&stack.name);
    if let Ok(text) = std::fs::read_to_string(dir.join(format!("Pulumi.{short}.yaml"))) {
        ctx.secrets_providers.remember(&key, &text);
    }
}

/// Step 0: the request is what its Update names: its run digest (`computed`, over the request as received) is the one
/// the operator sent (`run_digest`; none: not checked). Nothing runs otherwise.
fn check_digest(req: &OperationRequest, computed: &str) -> Result<(), Failure> {
    if req.run_digest.is_empty() || req.run_digest == computed {
        return Ok(());
    }
    let message = format!(
        "the request is not what its Update names: its run digest is {computed}, the Update's {}",
        req.run_digest
    );
    Err(fail(ErrorReason::RunMismatch, "run_digest", message))
}

/// Step 1: the environment of the Pulumi process — the agent's (the workspace class's), the operation's own
/// directories, the request's (references resolved, secrets masked), the env file's.
async fn environment(
    ctx: &RunnerContext,
    req: &OperationRequest,
    sandbox: Option<&crate::sandbox::Sandbox>,
    masker: &mut Masker,
) -> Result<BTreeMap<String, String>, Failure> {
    let mut env = pulumi::base_env();
    env.extend(ctx.env.clone());
    if let Some(sb) = sandbox {
        env.extend(sb.env());
    }
    for (i, e) in req.env.iter().enumerate() {
        let Some(r) = &e.value else {
            return Err(fail(
                ErrorReason::InvalidRequest,
                &format!("env[{i}].value"),
                format!("env {} has no value", e.name),
            ));
        };
        let v = ctx
            .values
            .resolve(r)
            .await
            .map_err(|m| fail(ErrorReason::InvalidConfig, &format!("env[{i}]"), format!("env {}: {m}", e.name)))?;
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
        let msg = format!(
            "env {name}: the value is {} bytes; Linux allows at most {MAX_ENV_VAR_BYTES} bytes in one environment \
                variable",
            v.len()
        );
        return Err(fail(ErrorReason::InvalidConfig, "env", msg));
    }
    if sandbox.is_some() {
        pin_home_backend(&mut env, std::env::var("PULUMI_BACKEND_URL").ok(), std::env::var("HOME").ok());
    }
    Ok(env)
}

/// Step 2: the source, prepared (or cached) and pinned, copied into the operation's directory when it is isolated;
/// returns the project directory and the project's name.
async fn project(
    ctx: &RunnerContext,
    op: &Arc<Operation>,
    req: &OperationRequest,
    sandbox: Option<&mut crate::sandbox::Sandbox>,
    env: &BTreeMap<String, String>,
    result: &mut OperationResult,
    held: &mut Held,
) -> Result<(PathBuf, String), Failure> {
    op.log("preparing source");
    let given = req.source.clone().filter(|s| s.kind.is_some());
    let source = match &given {
        Some(s) => s.clone(),
        None => workspace_source(ctx.workspace_link.as_deref())
            .map_err(|m| fail(ErrorReason::InvalidSource, "source", m))?,
    };
    let stack = req.stack.as_ref().map(|s| s.name.as_str()).unwrap_or_default();
    let cache = &held.cache;
    let install_vars = |dir: &Path| cache.install_vars(ctx.stack_caches.as_deref(), op, (dir, stack), env);
    let mut prepared = prepare_source(ctx, &source, env, req, &install_vars).await?;
    held.pinned = Some(prepared.key.clone());
    let dir = match sandbox {
        Some(sb) => {
            sb.watch_plugins();
            match copy_project(op, sb, &prepared)? {
                Some(dir) => dir,
                None => {
                    // a shared dependency tree changed since it was sealed: never used again
                    ctx.sources.release(&prepared.key);
                    ctx.sources
                        .discard(&prepared.key)
                        .map_err(|e| fail(ErrorReason::Internal, "", format!("discarding a changed revision: {e}")))?;
                    prepared = prepare_source(ctx, &source, env, req, &install_vars).await?;
                    held.pinned = Some(prepared.key.clone());
                    copy_project(op, sb, &prepared)?.ok_or_else(|| {
                        fail(ErrorReason::Internal, "", "a revision prepared anew changed before its first use")
                    })?
                }
            }
        }
        None => prepared.project_dir.clone(),
    };
    result.revision = prepared.revision.clone();
    if let Some(link) = ctx.workspace_link.as_ref().filter(|_| given.is_some()) {
        // for sidecars only: a failure is logged, never fails the operation
        if let Err(e) = point_link(link, &dir) {
            op.log(format!("pointing {} at the project: {e}", link.display()));
        }
    }
    let (project, runtime) = pulumi::project_info(&dir)
        .ok_or_else(|| fail(ErrorReason::InvalidSource, "source", "Pulumi.yaml has no name or runtime"))?;
    result.project_info = Some(ProjectInfo { name: project.clone(), runtime });
    Ok((dir, project))
}

/// The request's source prepared (or cached) and pinned by the agent's source cache; a revision it installs gets
/// `install_vars` of its project directory (the Stack's own caches) on top of `env`.
async fn prepare_source(
    ctx: &RunnerContext,
    source: &pko_proto::v1::Source,
    env: &BTreeMap<String, String>,
    req: &OperationRequest,
    install_vars: &crate::source::InstallVars<'_>,
) -> Result<crate::source::Prepared, Failure> {
    ctx.sources.prepare(source, &ctx.values, (env, install_vars), !req.skip_install).await.map_err(|e| {
        let reason = if e.install { ErrorReason::InstallationFailed } else { ErrorReason::InvalidSource };
        fail(reason, "source", e.message)
    })
}

/// The prepared project copied into the operation's directory, its dependency trees shared (fetched sources only);
/// `None` when a shared tree changed since it was sealed (named on the operation's log): the revision must be prepared
/// anew.
fn copy_project(
    op: &Operation,
    sb: &crate::sandbox::Sandbox,
    prepared: &crate::source::Prepared,
) -> Result<Option<PathBuf>, Failure> {
    let t = std::time::Instant::now();
    match sb.copy_source(&prepared.root, &prepared.project_dir, prepared.fetched) {
        Ok((dir, c)) => {
            op.log(format!(
                "copied the project ({} files, {} bytes) and linked {} shared dependency tree(s) in {} ms",
                c.files,
                c.bytes,
                c.trees,
                t.elapsed().as_millis()
            ));
            Ok(Some(dir))
        }
        Err(e @ crate::trees::ShareError::Changed { .. }) => {
            op.log(format!("{e}: the revision is discarded and prepared again"));
            Ok(None)
        }
        Err(e) => Err(fail(ErrorReason::Internal, "", format!("copying the source for the operation: {e}"))),
    }
}

/// Step 3: the CLI can run the request — structured config needs one that reads it (PKO's
/// `IncompatibleConfiguration`); its version (read once per agent) is reported for the Workspace's
/// `status.pulumiVersion`.
async fn check_cli(ctx: &RunnerContext, req: &OperationRequest, result: &mut OperationResult) -> Result<(), Failure> {
    let version = ctx
        .pulumi_version
        .get_or_try_init(|| pulumi::version(&ctx.pulumi))
        .await
        .map_err(|e| fail(ErrorReason::Internal, "", format!("pulumi version: {e}")))?;
    result.pulumi_version = version.clone();
    if let Some(message) = structured_config_unsupported(version).filter(|_| uses_structured_config(&req.config)) {
        return Err(fail(ErrorReason::IncompatibleConfiguration, "config", message));
    }
    Ok(())
}

/// Step 4: the stack selected (or created) once per backend, its config and environments set; `known_key` is the
/// stack's key in [`RunnerContext::known_stacks`] ([`caches::stack_key`]).
async fn prepare_stack(
    ctx: &RunnerContext,
    op: &Arc<Operation>,
    req: &OperationRequest,
    isolated: bool,
    (dir, project, known_key): (&Path, &str, &str),
    env: &BTreeMap<String, String>,
    masker: &mut Masker,
) -> Result<(), Failure> {
    let stack = req.stack.clone().unwrap_or_default();
    repair_sidecars(op, env, dir, project, &stack.name);
    if !isolated {
        reset_stack_config(dir, &stack.name)
            .map_err(|e| fail(ErrorReason::Internal, "", format!("resetting stack config: {e}")))?;
    }
    // every command names its stack (`--stack`), so a stack known to exist in the backend needs no
    // `stack select` in whichever directory the operation runs
    if !ctx.known_stacks.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(known_key) {
        select_stack(ctx, dir, env, &stack, masker).await?;
        ctx.known_stacks.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(known_key.to_string());
    }
    let key = secrets_provider::SecretsProviders::key(known_key, env, &stack.secrets_provider);
    let remembered = ctx.secrets_providers.recall(&key);
    restore_secrets_provider(dir, &stack.name, remembered.as_deref())
        .map_err(|e| fail(ErrorReason::Internal, "", format!("writing the stack's secrets provider settings: {e}")))?;
    // a stack removed elsewhere since we last saw it is selected/created again, once
    if let Err(f) = set_config(ctx, dir, env, (&stack.name, project), &req.config, masker).await {
        if !f.message.contains("no stack named") {
            return Err(f);
        }
        ctx.known_stacks.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(known_key);
        select_stack(ctx, dir, env, &stack, masker).await?;
        ctx.known_stacks.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(known_key.to_string());
        set_config(ctx, dir, env, (&stack.name, project), &req.config, masker).await?;
    }
    add_environments(ctx, dir, env, &stack, masker).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn an_operations_seconds_split_into_setup_command_and_cleanup() {
        let t = Instant::now();
        let at = |ms| t + Duration::from_millis(ms);
        assert_eq!(phases(t, (Some(at(200)), Some(at(1700))), at(1900)), (0.2, 1.5, 0.2));
        assert_eq!(phases(t, (None, None), at(300)), (0.3, 0.0, 0.0), "failed before the command: all setup");
        assert_eq!(phases(t, (Some(at(100)), None), at(400)), (0.1, 0.3, 0.0), "the command ended the operation");
    }
}
