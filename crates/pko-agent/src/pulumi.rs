//! The Pulumi CLI: command lines for each operation (pure), classification of its failures (pure), and small helpers
//! that run it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::sys::signal::Signal;

use pko_proto::v1::{ErrorReason, OperationOptions, OperationType};
use tokio::process::Command;

use crate::supervise::Supervisor;

/// Whether the operation only previews: `preview`, and a preview-only `refresh` (a drift check). Pulumi refuses `--yes`
/// and `--skip-preview` next to `--preview-only`.
pub fn previews(kind: OperationType, o: &OperationOptions) -> bool {
    kind == OperationType::Preview || (kind == OperationType::Refresh && o.preview_only)
}

/// Environment of the Pulumi process for the operation over [`base_env`] and the operation's own: a preview-only
/// refresh streams engine events as `up` does (`PULUMI_ENABLE_STREAMING_JSON_PREVIEW`), because Pulumi's preview digest
/// lists a resource that drifted without `detailedDiff` as an unchanged `refresh`; and it turns
/// `PULUMI_SKIP_CONFIRMATIONS` off, which Pulumi reads as `--yes` ("--yes and --preview-only cannot be used together").
pub fn operation_env(kind: OperationType, o: &OperationOptions) -> Vec<(&'static str, &'static str)> {
    if kind == OperationType::Refresh && o.preview_only {
        vec![("PULUMI_ENABLE_STREAMING_JSON_PREVIEW", "true"), ("PULUMI_SKIP_CONFIRMATIONS", "false")]
    } else {
        Vec::new()
    }
}

/// Arguments of the Pulumi command for an operation on `stack`. `up`, `refresh` (preview-only too, with
/// [`operation_env`]) and `destroy` stream engine events as JSON lines on stdout (`--json`); `preview --json` prints
/// one JSON document at the end (Pulumi's preview digest).
pub fn operation_args(kind: OperationType, stack: &str, o: &OperationOptions) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let verb = match kind {
        OperationType::Preview => "preview",
        OperationType::Up => "up",
        OperationType::Refresh => "refresh",
        OperationType::Destroy => "destroy",
        OperationType::Unspecified | OperationType::Initialize => "preview",
    };
    a.push(verb.into());
    if !previews(kind, o) {
        a.extend(["--yes".into(), "--skip-preview".into()]);
    }
    a.extend([
        "--json".into(),
        "--non-interactive".into(),
        "--color".into(),
        "never".into(),
        "--stack".into(),
        stack.into(),
    ]);
    if o.parallel > 0 {
        a.extend(["--parallel".into(), o.parallel.to_string()]);
    }
    if !o.message.is_empty() {
        a.extend(["--message".into(), o.message.clone()]);
    }
    if o.expect_no_changes {
        a.push("--expect-no-changes".into());
    }
    let targets =
        matches!(kind, OperationType::Preview | OperationType::Up | OperationType::Refresh | OperationType::Destroy);
    if targets {
        for t in &o.target {
            a.extend(["--target".into(), t.clone()]);
        }
        if o.target_dependents && kind != OperationType::Refresh {
            a.push("--target-dependents".into());
        }
    }
    if matches!(kind, OperationType::Preview | OperationType::Up) {
        for r in &o.replace {
            a.extend(["--replace".into(), r.clone()]);
        }
    }
    if o.refresh && matches!(kind, OperationType::Preview | OperationType::Up | OperationType::Destroy) {
        a.push("--refresh".into());
    }
    if o.continue_on_error && matches!(kind, OperationType::Up | OperationType::Destroy) {
        a.push("--continue-on-error".into());
    }
    if o.remove && kind == OperationType::Destroy {
        a.push("--remove".into());
    }
    if o.run_program && matches!(kind, OperationType::Destroy | OperationType::Refresh) {
        a.push("--run-program".into());
    }
    if o.preview_only && kind == OperationType::Refresh {
        a.push("--preview-only".into());
    }
    a
}

/// The change an engine event reports, when it is a `resOutputsEvent` of a resource (not the root stack) whose step
/// changes something (not `same`, `read` or `refresh`): URN, step kind and the properties that differ (`diffs`,
/// `detailedDiff`, else the outputs that differ between the old and the new state — a refresh of a provider without
/// detailed diffs names none). Pure.
pub fn event_change(ev: &serde_json::Value) -> Option<(String, String, Vec<String>)> {
    let m = ev.get("resOutputsEvent")?.get("metadata")?;
    let (urn, op) = (m.get("urn")?.as_str()?, m.get("op")?.as_str()?);
    if matches!(op, "same" | "read" | "refresh") || urn.contains("::pulumi:pulumi:Stack::") {
        return None;
    }
    let mut props: Vec<String> = m
        .get("diffs")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|k| k.as_str().map(str::to_string))
        .collect();
    if props.is_empty() {
        props = m
            .get("detailedDiff")
            .and_then(serde_json::Value::as_object)
            .map(|d| d.keys().cloned().collect())
            .unwrap_or_default();
    }
    if props.is_empty()
        && let (Some(old), Some(new)) = (m["old"]["outputs"].as_object(), m["new"]["outputs"].as_object())
    {
        let keys: std::collections::BTreeSet<&String> =
            old.keys().chain(new.keys()).filter(|k| !k.starts_with("__")).collect();
        props = keys.into_iter().filter(|k| old.get(*k) != new.get(*k)).cloned().collect();
    }
    Some((urn.to_string(), op.to_string(), props))
}

/// Maps a failed Pulumi command's error text to an [`ErrorReason`] (PKO maps the same messages).
pub fn classify_failure(text: &str) -> ErrorReason {
    let t = text.to_ascii_lowercase();
    if t.contains("the stack is currently locked")
        || t.contains("another update is currently in progress")
        || t.contains("[409] conflict")
    {
        ErrorReason::UpdateConflict
    } else if t.contains("invalid access token") || t.contains("[401]") {
        ErrorReason::InvalidAccessToken
    } else if t.contains("no stack named") || (t.contains("stack") && t.contains("not found")) {
        ErrorReason::StackNotFound
    } else if t.contains("no pulumi.yaml project file found") || t.contains("no project file found") {
        ErrorReason::InvalidSource
    } else {
        ErrorReason::UpdateFailed
    }
}

/// The environment every Pulumi process of the agent gets below the operation's own variables: no update check, no
/// interactive prompts. Plugin acquisition stays on, as in PKO's workspaces (a Workspace `env` or the agent's
/// environment may set `PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION`).
pub fn base_env() -> BTreeMap<String, String> {
    [
        ("PULUMI_SKIP_UPDATE_CHECK", "true"),
        ("PULUMI_SKIP_CONFIRMATIONS", "true"),
        ("PULUMI_DIY_BACKEND_NO_LEGACY_WARNING", "true"),
        ("PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Name of Pulumi's switch that turns automatic plugin downloads off (the air-gapped setting).
pub const DISABLE_PLUGIN_ACQUISITION: &str = "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION";

/// Whether a Pulumi process started with `env` on top of an environment where the variable is `inherited` (the agent's
/// own value, if any) sees plugin acquisition disabled. Pulumi's boolean syntax: `1` or `true` in any case; anything
/// else, or unset, is false.
pub fn plugin_acquisition_disabled(env: &BTreeMap<String, String>, inherited: Option<&str>) -> bool {
    env.get(DISABLE_PLUGIN_ACQUISITION)
        .map(String::as_str)
        .or(inherited)
        .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// The error lines of a failed `pulumi` command's standard error: without the `context canceled` line the CLI prints
/// after its own error, trimmed.
pub fn error_text(stderr: &str) -> String {
    stderr.lines().filter(|l| l.trim() != "context canceled").collect::<Vec<_>>().join("\n").trim().to_string()
}

/// Output of a short Pulumi command.
#[derive(Debug)]
pub struct Output {
    /// Exit status was 0.
    pub success: bool,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// The Pulumi CLI as the agent runs it: the binary, under the agent's [`Supervisor`] when one is set (always in
/// `pko-agent serve`; a library user may run it directly).
#[derive(Debug, Clone)]
pub struct Cli {
    /// The `pulumi` binary.
    pub bin: PathBuf,
    /// The supervisor every command runs under ([`crate::supervise`]).
    pub supervisor: Option<Supervisor>,
}

impl Cli {
    /// A `pulumi <args>` command in `dir` with `env` added to the agent's own environment, standard input closed,
    /// output piped. Supervised when the CLI has a supervisor; the process is not killed when its handle is dropped:
    /// hold a [`StopOnDrop`] for that.
    pub fn command(&self, dir: &Path, env: &BTreeMap<String, String>, args: &[impl AsRef<std::ffi::OsStr>]) -> Command {
        let mut c = match &self.supervisor {
            Some(s) => s.command(&self.bin),
            None => Command::new(&self.bin),
        };
        c.args(args).current_dir(dir).envs(env).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    }

    /// The signal that stops a process of [`Cli::command`] at once with everything it started: SIGTERM to a supervisor
    /// (which kills the tree), SIGKILL to an unsupervised `pulumi`.
    pub fn hard_stop(&self) -> Signal {
        if self.supervisor.is_some() { Signal::SIGTERM } else { Signal::SIGKILL }
    }

    /// A guard that stops the started `child` with [`Cli::hard_stop`] unless disarmed.
    pub fn stop_on_drop(&self, child: &tokio::process::Child) -> StopOnDrop {
        StopOnDrop { pid: child.id(), signal: self.hard_stop() }
    }
}

/// Stops a started process when dropped before [`StopOnDrop::disarm`] (an operation's future dropped mid-command): the
/// supervised tree goes with it.
#[derive(Debug)]
pub struct StopOnDrop {
    pid: Option<u32>,
    signal: Signal,
}

impl StopOnDrop {
    /// The process was waited for: nothing to stop.
    pub fn disarm(&mut self) {
        self.pid = None;
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.pid {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), self.signal);
        }
    }
}

/// Runs `pulumi <args>` in `dir` with `env` (added to the agent's own environment) and waits for it.
pub async fn run(cli: &Cli, dir: &Path, env: &BTreeMap<String, String>, args: &[&str]) -> std::io::Result<Output> {
    run_inner(cli, dir, env, args, None).await
}

/// Runs `pulumi <args>` like [`run`], writing `input` to its standard input (values too large for the command line).
pub async fn run_with_input(
    cli: &Cli,
    dir: &Path,
    env: &BTreeMap<String, String>,
    args: &[&str],
    input: &str,
) -> std::io::Result<Output> {
    run_inner(cli, dir, env, args, Some(input)).await
}

async fn run_inner(
    cli: &Cli,
    dir: &Path,
    env: &BTreeMap<String, String>,
    args: &[&str],
    input: Option<&str>,
) -> std::io::Result<Output> {
    use tokio::io::AsyncWriteExt;
    let mut cmd = cli.command(dir, env, args);
    if input.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn()?;
    let mut guard = cli.stop_on_drop(&child);
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(input.as_bytes()).await?;
    }
    let out = child.wait_with_output().await?;
    guard.disarm();
    Ok(Output {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// `pulumi version` (e.g. `v3.259.0`).
pub async fn version(cli: &Cli) -> std::io::Result<String> {
    let out = run(cli, Path::new("/"), &base_env(), &["version"]).await?;
    if !out.success {
        return Err(std::io::Error::other(out.stderr));
    }
    Ok(out.stdout.trim().to_string())
}

/// Name and runtime of the project in `dir` (from `Pulumi.yaml`/`Pulumi.yml`). `runtime` may be a string or `{name:
/// ...}`.
pub fn project_info(dir: &Path) -> Option<(String, String)> {
    let text = ["Pulumi.yaml", "Pulumi.yml"].iter().find_map(|f| std::fs::read_to_string(dir.join(f)).ok())?;
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let runtime = match v.get("runtime")? {
        serde_yaml_ng::Value::String(s) => s.clone(),
        other => other.get("name")?.as_str()?.to_string(),
    };
    Some((name, runtime))
}

/// Whether the project in `dir` runs a prebuilt program (`runtime: {name: go, options: {binary: …}}`, Pulumi's
/// `runtime.options.binary`): `pulumi install` would only try to build or fetch what the binary already holds (PKO
/// #1297, fixed in v2.9.1 by #1319).
pub fn prebuilt_binary(dir: &Path) -> bool {
    runtime_option(dir, "binary").is_some_and(|b| !b.trim().is_empty())
}

/// The runtime option `key` of the project in `dir` (`runtime.options.<key>` of its `Pulumi.yaml`, e.g. Python's
/// `virtualenv` and `toolchain`), when it is a string; `None` when absent, not a string, or the file does not parse.
pub fn runtime_option(dir: &Path, key: &str) -> Option<String> {
    let text = ["Pulumi.yaml", "Pulumi.yml"].iter().find_map(|f| std::fs::read_to_string(dir.join(f)).ok())?;
    let v = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(&text).ok()?;
    Some(v.get("runtime")?.get("options")?.get(key)?.as_str()?.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prebuilt_binary_is_found_in_the_runtime_options() {
        let dir = tempfile::tempdir().unwrap();
        let with = |yaml: &str| {
            std::fs::write(dir.path().join("Pulumi.yaml"), yaml).unwrap();
            prebuilt_binary(dir.path())
        };
        assert!(with("name: p\nruntime:\n  name: go\n  options:\n    binary: ./bin/p\n"));
        assert!(!with("name: p\nruntime: go\n"));
        assert!(!with("name: p\nruntime:\n  name: go\n  options:\n    buildTarget: x\n"));
        assert!(!with("name: p\nruntime:\n  name: go\n  options:\n    binary: \"\"\n"));
    }

    #[test]
    fn plugin_acquisition_follows_the_operation_then_the_agent() {
        let env = |v: &str| BTreeMap::from([(DISABLE_PLUGIN_ACQUISITION.to_string(), v.to_string())]);
        assert!(!plugin_acquisition_disabled(&BTreeMap::new(), None), "on by default, as in PKO");
        assert!(plugin_acquisition_disabled(&BTreeMap::new(), Some("true")));
        assert!(plugin_acquisition_disabled(&env("1"), None) && plugin_acquisition_disabled(&env("TRUE"), None));
        assert!(!plugin_acquisition_disabled(&env("false"), Some("true")), "the operation's value wins");
        assert!(!plugin_acquisition_disabled(&env("yes"), None), "Pulumi reads only 1 and true");
        assert!(!base_env().contains_key(DISABLE_PLUGIN_ACQUISITION));
    }

    #[test]
    fn error_text_drops_the_context_canceled_line() {
        assert_eq!(
            error_text("error: failed to download plugin: command-9.9.9: 404\ncontext canceled\n"),
            "error: failed to download plugin: command-9.9.9: 404"
        );
    }

    #[test]
    fn up_arguments_carry_every_option() {
        let o = OperationOptions {
            parallel: 4,
            message: "sync".into(),
            expect_no_changes: true,
            replace: vec!["urn:a".into()],
            target: vec!["urn:b".into()],
            target_dependents: true,
            refresh: true,
            continue_on_error: true,
            ..Default::default()
        };
        let a = operation_args(OperationType::Up, "dev", &o).join(" ");
        assert_eq!(
            a,
            "up --yes --skip-preview --json --non-interactive --color never --stack dev --parallel 4 --message sync \
                --expect-no-changes --target urn:b --target-dependents --replace urn:a --refresh --continue-on-error"
        );
    }

    #[test]
    fn destroy_and_refresh_take_their_own_options() {
        let o = OperationOptions {
            remove: true,
            run_program: true,
            replace: vec!["urn:x".into()],
            preview_only: true,
            ..Default::default()
        };
        let d = operation_args(OperationType::Destroy, "s", &o).join(" ");
        assert!(d.starts_with("destroy --yes --skip-preview --json"));
        assert!(
            d.contains("--remove")
                && d.contains("--run-program")
                && !d.contains("--replace")
                && !d.contains("--preview-only")
        );
        let r = operation_args(OperationType::Refresh, "s", &o).join(" ");
        assert!(
            r.starts_with("refresh --json") && r.contains("--preview-only") && !r.contains("--remove"),
            "Pulumi refuses --yes/--skip-preview with --preview-only: {r}"
        );
        assert_eq!(
            operation_env(OperationType::Refresh, &o),
            vec![("PULUMI_ENABLE_STREAMING_JSON_PREVIEW", "true"), ("PULUMI_SKIP_CONFIRMATIONS", "false")]
        );
        assert!(
            operation_env(OperationType::Refresh, &Default::default()).is_empty()
                && operation_env(OperationType::Preview, &o).is_empty()
        );
        let r = operation_args(OperationType::Refresh, "s", &Default::default()).join(" ");
        assert!(r.starts_with("refresh --yes --skip-preview --json") && !r.contains("--preview-only"));
        let p = operation_args(OperationType::Preview, "s", &Default::default()).join(" ");
        assert!(p.starts_with("preview --json") && !p.contains("--yes"));
    }

    #[test]
    fn engine_events_give_the_changed_resources() {
        let out = |op: &str, urn: &str, extra: serde_json::Value| {
            let mut m = serde_json::json!({"op": op, "urn": urn});
            m.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            serde_json::json!({"resOutputsEvent": {"metadata": m}})
        };
        let state =
            |content: &str| serde_json::json!({"outputs": {"__provider": "x", "content": content, "path": "/p"}});
        let drifted = out(
            "update",
            "urn:pulumi:dev::p::a:b:C::f",
            serde_json::json!({"old": state("desired"), "new": state("changed"), "detailedDiff": null}),
        );
        assert_eq!(
            event_change(&drifted),
            Some(("urn:pulumi:dev::p::a:b:C::f".into(), "update".into(), vec!["content".to_string()]))
        );
        let gone = out("delete", "urn:pulumi:dev::p::a:b:C::g", serde_json::json!({"old": state("desired")}));
        assert_eq!(event_change(&gone), Some(("urn:pulumi:dev::p::a:b:C::g".into(), "delete".into(), vec![])));
        let named =
            out("update", "urn:x::a:b:C::h", serde_json::json!({"diffs": ["size"], "detailedDiff": {"other": {}}}));
        assert_eq!(event_change(&named).unwrap().2, vec!["size".to_string()]);
        assert_eq!(event_change(&out("same", "urn:x::a:b:C::s", serde_json::json!({}))), None);
        assert_eq!(
            event_change(&out("update", "urn:pulumi:dev::p::pulumi:pulumi:Stack::p-dev", serde_json::json!({}))),
            None,
            "the root stack"
        );
        assert_eq!(
            event_change(
                &serde_json::json!({"resourcePreEvent": {"metadata": {"op": "update", "urn": "urn:x::a:b:C::f"}}})
            ),
            None
        );
    }

    #[test]
    fn failures_are_classified_like_pko() {
        assert_eq!(classify_failure("error: the stack is currently locked by 1 lock(s)."), ErrorReason::UpdateConflict);
        assert_eq!(
            classify_failure("[409] Conflict: Another update is currently in progress."),
            ErrorReason::UpdateConflict
        );
        assert_eq!(classify_failure("error: invalid access token"), ErrorReason::InvalidAccessToken);
        assert_eq!(classify_failure("error: no stack named 'dev' found"), ErrorReason::StackNotFound);
        assert_eq!(classify_failure("error: update failed"), ErrorReason::UpdateFailed);
    }

    #[test]
    fn project_info_reads_both_runtime_forms() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("Pulumi.yaml"), "name: p\nruntime:\n  name: nodejs\n").unwrap();
        assert_eq!(project_info(d.path()), Some(("p".into(), "nodejs".into())));
        std::fs::write(d.path().join("Pulumi.yaml"), "name: q\nruntime: yaml\n").unwrap();
        assert_eq!(project_info(d.path()), Some(("q".into(), "yaml".into())));
    }
}
