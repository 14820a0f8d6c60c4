//! One Pulumi command of an operation and what it prints: the command started under the supervisor, its engine events
//! read (diagnostics, the summary, the stack's outputs, a drift check's changes) and published masked, its failure
//! classified (a lock held by a dead process released, one held by a live process on this host waited for), and the
//! outputs of an `up` read back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use pko_proto::v1::{
    ErrorReason, LogLine, OperationResult, OperationType, OutputValue, log_line, operation_event::Event,
};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::{Failure, RunnerContext, check_stop, fail};
use crate::mask::Masker;
use crate::operation::Operation;
use crate::pulumi;

/// What [`operate`] runs: the operation's kind on `stack` in the project `dir`.
pub(super) struct Step<'a> {
    pub(super) kind: OperationType,
    pub(super) stack: &'a str,
    pub(super) dir: &'a Path,
    pub(super) env: &'a BTreeMap<String, String>,
    pub(super) options: &'a pko_proto::v1::OperationOptions,
    /// The stack's key in [`RunnerContext::known_stacks`].
    pub(super) known_key: &'a str,
    /// Lock holders the operator judged dead on an unlock request (`OperationRequest.release_locks`).
    pub(super) released: &'a [pko_proto::v1::LockHolder],
    /// The operation's saved plan file, when it saves or runs one ([`super::plan_file`]).
    pub(super) plan: Option<&'a super::plan_file::PlanFile>,
}

/// Most resources a drift check's result names (the change summary counts them all).
pub(super) const MAX_CHANGES: usize = 100;

/// What the Pulumi command printed, as [`Reading::line`] reads it.
#[derive(Default)]
struct Reading {
    /// Error diagnostics.
    errors: String,
    /// Error diagnostics of resources, `(urn, message)`, in the engine's order.
    resource_errors: Vec<(String, String)>,
    /// Program errors language hosts (Pulumi YAML among them) report as `info#err`.
    stderr_diagnostics: String,
    /// The engine's summary event.
    summary: Option<Value>,
    /// The stack's outputs (`pulumi:pulumi:Stack`'s `resOutputsEvent`).
    stack_outputs: Option<serde_json::Map<String, Value>>,
    /// A preview's whole JSON document (`--json` prints one at the end, not events).
    preview_doc: String,
}

impl Reading {
    /// Reads one stdout `line` (already masked) of `step`: a preview's document is collected; an engine event is read
    /// for diagnostics, the summary, outputs and (drift check) changes, and published; any other line is published as a
    /// log line.
    fn line(&mut self, op: &Operation, step: &Step<'_>, line: String, result: &mut OperationResult) {
        if step.kind == OperationType::Preview {
            self.preview_doc.push_str(&line);
            self.preview_doc.push('\n');
            return;
        }
        let Ok(Value::Object(ev)) = serde_json::from_str::<Value>(&line) else {
            op.publish(Event::Log(LogLine { stream: log_line::Stream::Stdout as i32, text: line }));
            return;
        };
        if let Some(d) = ev.get("diagnosticEvent") {
            let text = d["message"].as_str().unwrap_or_default();
            match d["severity"].as_str() {
                Some("error") => self.error(d["urn"].as_str().unwrap_or_default(), text),
                Some("info#err") => self.stderr_diagnostics.push_str(text),
                _ => {}
            }
        }
        op.print_engine(&ev);
        let drift_check = step.kind == OperationType::Refresh && step.options.preview_only;
        if drift_check
            && result.changes.len() < MAX_CHANGES
            && let Some((urn, op, properties)) = pulumi::event_change(&Value::Object(ev.clone()))
        {
            result.changes.push(pko_proto::v1::ResourceChange { urn, op, properties });
        }
        if let Some(s) = ev.get("summaryEvent") {
            self.summary = Some(s.clone());
        }
        if let Some(m) =
            ev.get("resOutputsEvent").map(|e| &e["metadata"]).filter(|m| m["type"] == "pulumi:pulumi:Stack")
        {
            self.stack_outputs = m["new"]["outputs"].as_object().cloned();
        }
        op.publish(Event::EngineEvent(crate::convert::to_struct(&ev)));
    }

    /// Records an error diagnostic `text`, of the resource `urn` when not empty.
    fn error(&mut self, urn: &str, text: &str) {
        self.errors.push_str(text);
        if !urn.is_empty() {
            self.resource_errors.push((urn.to_string(), text.to_string()));
        }
    }

    /// A preview's document, read once the command ended: its error diagnostics and change summary, published as one
    /// engine event (or as a log line when it is not JSON).
    fn preview_done(&mut self, op: &Operation) {
        if let Ok(Value::Object(doc)) = serde_json::from_str::<Value>(&self.preview_doc) {
            for d in doc.get("diagnostics").and_then(Value::as_array).into_iter().flatten() {
                if d["severity"] == "error" {
                    self.error(d["urn"].as_str().unwrap_or_default(), d["message"].as_str().unwrap_or_default());
                }
            }
            self.summary = doc.get("changeSummary").map(|c| json!({ "resourceChanges": c }));
            if let Some(Value::Object(s)) = self.summary.as_ref().map(|s| json!({ "summaryEvent": s })) {
                op.print_engine(&s);
            }
            op.publish(Event::EngineEvent(crate::convert::to_struct(&doc)));
        } else if !self.preview_doc.trim().is_empty() {
            op.publish(Event::Log(LogLine { stream: log_line::Stream::Stdout as i32, text: self.preview_doc.clone() }));
        }
    }
}

/// Starts the Pulumi command of `step` under the supervisor (`-v N` with a log level); a stop requested while it was
/// starting still reaches it. Returns the child and its arguments.
fn start(
    ctx: &RunnerContext,
    op: &Arc<Operation>,
    step: &Step<'_>,
) -> Result<(tokio::process::Child, Vec<String>), Failure> {
    let mut args = pulumi::operation_args(step.kind, step.stack, step.options);
    args.extend(step.plan.map(super::plan_file::PlanFile::args).unwrap_or_default());
    if ctx.log_level > 0 {
        args.extend(["-v".into(), ctx.log_level.to_string(), "--logtostderr".into(), "--logflow".into()]);
    }
    op.log(format!("running pulumi {}", args.join(" ")));
    let child = ctx
        .pulumi
        .command(step.dir, step.env, &args)
        .envs(pulumi::operation_env(step.kind, step.options))
        .spawn()
        .map_err(|e| fail(ErrorReason::Internal, "", format!("starting pulumi: {e}")))?;
    op.set_process(child.id().unwrap_or(0), ctx.pulumi.hard_stop());
    if op.interrupted.load(Ordering::SeqCst) || op.cancelled.load(Ordering::SeqCst) {
        op.signal(nix::sys::signal::Signal::SIGINT);
    }
    Ok((child, args))
}

/// Reads `stderr` to its end: each line masked and published; the whole text returned.
fn read_stderr(
    stderr: tokio::process::ChildStderr,
    masker: Masker,
    op: Arc<Operation>,
) -> tokio::task::JoinHandle<String> {
    tokio::spawn(async move {
        let mut text = String::new();
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(l)) = lines.next_line().await {
            let l = masker.mask(&l);
            op.publish(Event::Log(LogLine { stream: log_line::Stream::Stderr as i32, text: l.clone() }));
            text.push_str(&l);
            text.push('\n');
        }
        text
    })
}

/// Runs the Pulumi command of `step` and, for `up`, reads the outputs into `result`. A conflict whose every lock holder
/// is known dead on this host carries them in [`Failure::stale`].
pub(super) async fn operate(
    ctx: &RunnerContext,
    op: &Arc<Operation>,
    step: &Step<'_>,
    masker: &mut Masker,
    result: &mut OperationResult,
) -> Result<(), Failure> {
    let (mut child, args) = start(ctx, op, step)?;
    let mut guard = ctx.pulumi.stop_on_drop(&child);
    let piped = |what: &str| fail(ErrorReason::Internal, "", format!("pulumi's {what} is not piped"));
    let stdout = child.stdout.take().ok_or_else(|| piped("stdout"))?;
    let stderr_task = read_stderr(child.stderr.take().ok_or_else(|| piped("stderr"))?, masker.clone(), op.clone());
    let mut reading = Reading::default();
    let mut lines = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        reading.line(op, step, masker.mask(&line), result);
    }
    let status = child.wait().await.map_err(|e| fail(ErrorReason::Internal, "", format!("waiting for pulumi: {e}")))?;
    guard.disarm();
    op.set_pid(0);
    let stderr_text = stderr_task.await.unwrap_or_default();
    if step.kind == OperationType::Preview {
        reading.preview_done(op);
    }
    if let Some(changes) = reading.summary.as_ref().and_then(|s| s.get("resourceChanges")).and_then(Value::as_object) {
        result.change_summary = changes.iter().map(|(k, v)| (k.clone(), v.as_i64().unwrap_or(0) as i32)).collect();
    }
    result.permalink = find_permalink(&format!("{stderr_text}\n{}", reading.preview_doc)).unwrap_or_default();
    if !status.success() {
        let text = format!("{}\n{}\n{stderr_text}", reading.errors, reading.stderr_diagnostics);
        let message = failure_message(&reading.resource_errors, &text)
            .unwrap_or_else(|| format!("pulumi {} exited with {status}", args[0]));
        return Err(failed(ctx, step, &text, message));
    }
    if step.kind == OperationType::Up {
        result.outputs = outputs(ctx, step.dir, step.env, step.stack, reading.stack_outputs, masker).await?;
    }
    Ok(())
}

/// The failure of a Pulumi command that printed `text`, said as `message`: classified, a lock conflict's holders judged
/// (dead ones to release, live ones on this host to wait for); a stack the backend no longer has is forgotten.
fn failed(ctx: &RunnerContext, step: &Step<'_>, text: &str, message: String) -> Failure {
    if text.contains("no stack named") {
        ctx.known_stacks.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(step.known_key);
    }
    let reason = pulumi::classify_failure(text);
    let holders = crate::locks::holders(text);
    let message = if reason == ErrorReason::UpdateConflict && !holders.is_empty() {
        format!("{message}\n{}", crate::locks::describe(&holders))
    } else {
        message
    };
    let mut failure = fail(reason, "", message);
    if reason == ErrorReason::UpdateConflict {
        let released: Vec<(String, i32)> = step.released.iter().map(|h| (h.who.clone(), h.pid)).collect();
        match crate::locks::judge(text, &crate::locks::hostname(), &released, |pid| {
            crate::locks::process_info(Path::new("/proc"), pid)
        }) {
            crate::locks::Judgement::Release(dead) => failure.stale = dead,
            crate::locks::Judgement::WaitFor(alive) => failure.live = alive,
            crate::locks::Judgement::Keep => {}
        }
    }
    failure
}

/// Step 5: the operation. A conflict with holders still running on this host waits for them (the `pulumi` of a killed
/// agent, stopped by its supervisor; another operation ending) and tries again; a conflict whose every lock holder is
/// known dead (an agent SIGKILLed mid-`up`) releases those locks and runs once more.
pub(super) async fn operate_through_locks(
    ctx: &RunnerContext,
    op: &Arc<Operation>,
    step: &Step<'_>,
    masker: &mut Masker,
    result: &mut OperationResult,
) -> Result<(), Failure> {
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

/// Waits up to `limit` for every holder in `live` (running on this host) to end, logging whom it waits for. Returns
/// whether they all ended (false: time is up, or the operation is being stopped).
pub(super) async fn wait_for_holders(
    op: &Arc<Operation>,
    live: &[crate::locks::Holder],
    limit: std::time::Duration,
) -> bool {
    let names: Vec<String> = live.iter().map(|h| format!("{} pid {}", h.who, h.pid)).collect();
    tracing::info!(operation = %op.id, holders = ?names, limit_s = limit.as_secs(),
        "stack locked by a process on this host: waiting for it to end");
    op.log(format!(
        "the stack is locked by {} process(es) still running on this host; waiting up to {} s for them to end: {}",
        live.len(),
        limit.as_secs(),
        names.join("; ")
    ));
    let end = tokio::time::Instant::now() + limit;
    loop {
        let host = crate::locks::hostname();
        let running = live.iter().any(|h| {
            crate::locks::verdict(h, &host, |pid| crate::locks::process_info(Path::new("/proc"), pid))
                == crate::locks::Verdict::Alive
        });
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

/// Releases the locks of `stale` holders (all known dead: [`crate::locks`]) with `pulumi cancel`, which deletes the
/// stack's lock files of a DIY backend; logged on the operation and the agent.
pub(super) async fn release_stale_locks(
    ctx: &RunnerContext,
    op: &Arc<Operation>,
    step: &Step<'_>,
    stale: &[(crate::locks::Holder, &'static str)],
    masker: &Masker,
) -> Result<(), Failure> {
    let holders: Vec<String> = stale.iter().map(|(h, why)| format!("{} pid {} ({why})", h.who, h.pid)).collect();
    tracing::warn!(operation = %op.id, epoch = op.epoch(), holders = ?holders,
        "releasing backend locks whose holders are known dead");
    op.log(format!("releasing {} stale lock(s) whose holder is known dead: {}", stale.len(), holders.join("; ")));
    let out =
        pulumi::run(&ctx.pulumi, step.dir, step.env, &["cancel", "--yes", "--non-interactive", "--stack", step.stack])
            .await
            .map_err(|e| fail(ErrorReason::Internal, "", format!("running pulumi cancel: {e}")))?;
    if !out.success {
        let text = masker.mask(&out.stderr);
        return Err(fail(
            ErrorReason::UpdateConflict,
            "",
            format!(
                "releasing stale locks failed: {}",
                first_error_line(&text).unwrap_or_else(|| text.trim().to_string())
            ),
        ));
    }
    Ok(())
}

/// Removes the truncated attribute sidecars a `pulumi` killed mid-write left beside the stack's state in a `file://`
/// backend ([`crate::sidecars`]), logged on the operation and the agent; a failure is logged and the operation goes on
/// (Pulumi then reports what it cannot read).
pub(super) fn repair_sidecars(
    op: &Arc<Operation>,
    env: &BTreeMap<String, String>,
    dir: &Path,
    project: &str,
    stack: &str,
) {
    let home = env.get("HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(PathBuf::from));
    // the operation's variables, else the agent's own environment that `pulumi` inherits
    let url = env.get("PULUMI_BACKEND_URL").cloned().or_else(|| std::env::var("PULUMI_BACKEND_URL").ok());
    let Some(root) = url.and_then(|url| crate::sidecars::backend_root(&url, home.as_deref(), dir)) else {
        return;
    };
    match crate::sidecars::repair(&root, project, stack) {
        Ok(removed) if removed.is_empty() => {}
        Ok(removed) => {
            let names: Vec<String> =
                removed.iter().map(|p| p.strip_prefix(&root).unwrap_or(p).display().to_string()).collect();
            tracing::warn!(operation = %op.id, files = ?names,
                "removed truncated backend attribute sidecars left by a killed pulumi");
            op.log(format!(
                "removed {} truncated attribute sidecar(s) a pulumi killed mid-write left in the backend: {}",
                names.len(),
                names.join(", ")
            ));
        }
        Err(e) => {
            tracing::warn!(operation = %op.id, error = %e, "checking the backend's attribute sidecars");
            op.log(format!("checking the backend's attribute sidecars: {e}"));
        }
    }
}

/// Whether a value from an engine event is Pulumi's secret signature (`{"4dabf18193072939515e22adb298388d":
/// "1b47061264138c4ac30d75fd1eb44270", ...}`).
pub(super) fn is_secret_sig(v: &Value) -> bool {
    v.get("4dabf18193072939515e22adb298388d").and_then(Value::as_str) == Some("1b47061264138c4ac30d75fd1eb44270")
}

/// Stack outputs: taken from the stack resource's outputs event of the update; only when a secret output is among them,
/// `pulumi stack output --show-secrets` is asked for their values.
pub(super) async fn outputs(
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
            let masked = pulumi::run(&ctx.pulumi, dir, env, &["stack", "output", "--json", "--stack", stack])
                .await
                .map_err(|e| fail(ErrorReason::Internal, "", e.to_string()))?;
            serde_json::from_str::<serde_json::Map<String, Value>>(&masked.stdout)
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| {
                    if v == "[secret]" {
                        (k, json!({"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270"}))
                    } else {
                        (k, v)
                    }
                })
                .collect()
        }
    };
    let mut shown = serde_json::Map::new();
    if event_outputs.values().any(is_secret_sig) {
        let out =
            pulumi::run(&ctx.pulumi, dir, env, &["stack", "output", "--json", "--show-secrets", "--stack", stack])
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

pub(super) fn find_permalink(text: &str) -> Option<String> {
    let re = regex::Regex::new(r"https?://[^\s]+/(updates|previews)/\d+").ok()?;
    re.find(text).map(|m| m.as_str().to_string())
}

/// Most bytes of an operation's failure message (the Update's `status.message`): every error is listed up to this, then
/// how much was left out.
pub(super) const MAX_FAILURE_MESSAGE_BYTES: usize = 4096;

/// The failure message of an operation whose engine reported `resource_errors` (`(urn, message)`) and printed `text`:
/// each resource's error as `<type> (<name>): <message>`, then every other `error:` line of `text`, within
/// [`MAX_FAILURE_MESSAGE_BYTES`]; else the first five lines of `text`; `None` when it is empty. Pure.
pub(super) fn failure_message(resource_errors: &[(String, String)], text: &str) -> Option<String> {
    let mut errors: Vec<String> = resource_errors
        .iter()
        .map(|(urn, message)| {
            let lines: Vec<&str> = message.lines().map(str::trim_end).filter(|l| !l.trim().is_empty()).collect();
            format!("{} ({}): {}", urn_type(urn), urn.rsplit("::").next().unwrap_or(urn), lines.join("\n  "))
        })
        .collect();
    let closing = ["update failed", "preview failed", "refresh failed", "destroy failed"];
    for line in error_lines(text) {
        let said = errors.iter().any(|e| e.contains(&line)) || (!errors.is_empty() && closing.contains(&line.as_str()));
        if !said {
            errors.push(line);
        }
    }
    let all = if errors.is_empty() { first_error_line(text)? } else { errors.join("\n") };
    Some(bounded(all, MAX_FAILURE_MESSAGE_BYTES))
}

/// The type of the resource `urn` (`urn:pulumi:dev::proj::parent$command:local:Command::name` →
/// `command:local:Command`). Pure.
fn urn_type(urn: &str) -> &str {
    let parts: Vec<&str> = urn.split("::").collect();
    let ty = if parts.len() >= 2 { parts[parts.len() - 2] } else { urn };
    ty.rsplit('$').next().unwrap_or(ty)
}

/// `text` cut to at most `max` bytes at a character boundary, saying how many bytes were left out. Pure.
fn bounded(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max.saturating_sub(40);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n… ({} more bytes)", &text[..end], text.len() - end)
}

/// Every `error:`/`Error:` line of Pulumi's output without its prefix, each followed by the location line Pulumi YAML
/// prints after it (`… (on Pulumi.yaml line 7)`), in order, without repeats. Pure.
fn error_lines(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let mut found: Vec<String> = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if !l.get(..6).is_some_and(|p| p.eq_ignore_ascii_case("error:")) {
            continue;
        }
        let mut msg = l[6..].trim().to_string();
        if let Some(loc) = lines.get(i + 1).filter(|l| l.starts_with("on ")) {
            msg.push_str(&format!(" ({})", loc.trim_end_matches(':')));
        }
        if !found.contains(&msg) {
            found.push(msg);
        }
    }
    found
}

/// The first `error:`/`Error:` line of Pulumi's output without its prefix, followed by the location line Pulumi YAML
/// prints after it (`… (on Pulumi.yaml line 7)`); else the first five lines.
pub(super) fn first_error_line(text: &str) -> Option<String> {
    if let Some(first) = error_lines(text).into_iter().next() {
        return Some(first);
    }
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    (!lines.is_empty()).then(|| lines.iter().take(5).copied().collect::<Vec<_>>().join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permalinks_and_errors_are_found() {
        assert_eq!(
            find_permalink("View Live: https://app.pulumi.com/o/p/s/updates/12\n").as_deref(),
            Some("https://app.pulumi.com/o/p/s/updates/12")
        );
        assert_eq!(find_permalink("no link"), None);
        assert_eq!(first_error_line("warn\nerror: the stack is locked\n").as_deref(), Some("the stack is locked"));
        // Pulumi YAML's info#err diagnostics
        let yaml = "\nError: resource, variable, or config value \"missing\" not found\n\n  on Pulumi.yaml line \
            7:\n\n   7:       create: ${missing.value}\n";
        assert_eq!(
            first_error_line(yaml).as_deref(),
            Some("resource, variable, or config value \"missing\" not found (on Pulumi.yaml line 7)")
        );
    }

    #[test]
    fn a_failure_message_lists_every_error_bounded() {
        let urn = |name: &str| format!("urn:pulumi:dev::three::command:local:Command::{name}");
        let resources = vec![
            (urn("b"), "command exited with 4: 'exit 4'\nstdout: \nstderr: second failure\n\n".to_string()),
            (urn("a"), "command exited with 3\n".to_string()),
            (urn("c"), "command exited with 5\n".to_string()),
        ];
        let text = "command exited with 4\nupdate failed\nerror: update failed\nerror: another thing\n";
        let m = failure_message(&resources, text).unwrap();
        assert_eq!(
            m,
            "command:local:Command (b): command exited with 4: 'exit 4'\n  stdout:\n  stderr: second \
                failure\ncommand:local:Command (a): command exited with 3\ncommand:local:Command (c): command exited \
                with 5\nanother thing"
        );
        assert_eq!(
            urn_type("urn:pulumi:dev::p::my:comp:Parent$random:index/randomPet:RandomPet::pet"),
            "random:index/randomPet:RandomPet"
        );
        // no resource errors: every error line, Pulumi YAML's locations kept
        let yaml = "Error: a not found\n  on Pulumi.yaml line 7:\nError: b not found\nerror: update failed\n";
        assert_eq!(
            failure_message(&[], yaml).unwrap(),
            "a not found (on Pulumi.yaml line 7)\nb not found",
            "the closing `update failed` adds nothing"
        );
        assert_eq!(
            failure_message(&[], "error: update failed\n").unwrap(),
            "update failed",
            "unless it is all there is"
        );
        assert_eq!(failure_message(&[], "").as_deref(), None);
        // bounded, at a character boundary, saying how much is left out
        let many: Vec<(String, String)> =
            (0..200).map(|i| (urn(&format!("r{i}")), format!("failé {i} {}", "x".repeat(40)))).collect();
        let m = failure_message(&many, "").unwrap();
        assert!(
            m.len() <= MAX_FAILURE_MESSAGE_BYTES
                && m.ends_with("more bytes)")
                && m.starts_with("command:local:Command (r0)"),
            "{} bytes",
            m.len()
        );
    }
}
