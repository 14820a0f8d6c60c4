//! Whether a Stack is in sync, and what to do about it (PKO `isSynced`, the retry cooldown and the requeue computation,
//! `stack_controller.go` §3.2 step 7 and §3.3 of the inventory). Pure: the caller passes the current source revision
//! and the time.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use pko_api::Stack;
use pko_api::constants::stack_condition::{self as sc, MAX_UPDATE_FAILURES};
use pko_api::constants::{PUSH_REQUEST_PREFIX, RECONCILE_REQUEST_ANNOTATION};
use pko_api::stack::{DEFAULT_RETRY_MAX_BACKOFF_SECONDS, MIN_RESYNC_FREQUENCY_SECONDS, StackUpdateStateMessage};
use pko_api::update::UpdateType;

/// First retry delay after a failed update (PKO's).
pub const BASE_COOLDOWN: Duration = Duration::from_secs(10);

/// PKO's growth of the retry delay per failure.
pub const COOLDOWN_FACTOR: f64 = 3.0;

/// A Stack's retry budget and backoff (PKO's fixed numbers, made configurable as PKO PR #1322 and
/// #1294 ask): `maxUpdateFailures`, `retryBackoffBaseSeconds`, `retryBackoffFactor`,
/// `retryMaxBackoffDurationSeconds`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Retries before the Stack stalls (the failure count that stalls it).
    pub max_failures: i64,
    /// The first wait.
    pub base: Duration,
    /// The growth per failure (≥ 1).
    pub factor: f64,
    /// The longest wait.
    pub cap: Duration,
}

impl RetryPolicy {
    /// The policy of `spec`, PKO's defaults where unset (3 retries, 10 s × 3^failures, 24 h cap). Pure.
    pub fn of(spec: &pko_api::stack::StackSpec) -> RetryPolicy {
        RetryPolicy {
            max_failures: spec.max_update_failures.unwrap_or(MAX_UPDATE_FAILURES).max(1),
            base: spec
                .retry_backoff_base_seconds
                .filter(|b| *b >= 1)
                .map(|b| Duration::from_secs(b as u64))
                .unwrap_or(BASE_COOLDOWN),
            factor: spec.retry_backoff_factor.filter(|f| f.is_finite() && *f >= 1.0).unwrap_or(COOLDOWN_FACTOR),
            cap: Duration::from_secs(
                spec.retry_max_backoff_duration_seconds.unwrap_or(DEFAULT_RETRY_MAX_BACKOFF_SECONDS).max(0) as u64,
            ),
        }
    }

    /// The wait after `failures` failed attempts (0 on the first failure): base × factor^failures, capped. Pure.
    pub fn cooldown(&self, failures: i64) -> Duration {
        let secs = self.base.as_secs_f64() * self.factor.powi(failures.clamp(0, 1_000) as i32);
        if !secs.is_finite() || secs >= self.cap.as_secs_f64() { self.cap } else { Duration::from_secs_f64(secs) }
    }

    /// Whether `failures` failed attempts of an update of `kind` stall the Stack: at [`Self::max_failures`], one more
    /// for a preview (PKO #1294: a preview may fail once without stalling). Pure.
    pub fn stalls(&self, failures: i64, kind: Option<&UpdateType>) -> bool {
        let extra = i64::from(kind == Some(&UpdateType::Preview));
        failures >= self.max_failures + extra
    }
}

/// The condition message of a Stack whose update was canceled on `request` (`Stalled` `UpdateCanceled`). Pure.
pub fn canceled_message(request: &str) -> String {
    format!(
        "update canceled by request {request:?} (pulumi.com/cancel-request); not retrying until the spec or source \
            changes or a sync is requested"
    )
}

/// Resync and branch-poll period: `resyncFrequencySeconds`, at least 60 s (unset or 0 mean 60 s).
pub fn resync_period(stack: &Stack) -> Duration {
    Duration::from_secs(stack.spec.resync_frequency_seconds.unwrap_or(0).max(MIN_RESYNC_FREQUENCY_SECONDS) as u64)
}

/// `s` quoted as Go's `%q` prints it (PKO's sync texts quote commits and requests; they end up in Pulumi's update
/// history): double quotes, with `"`, `\\` and control characters escaped. Pure.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `d` as Go's `time.Duration` prints it (PKO's texts: `10s`, `1m0s`, `24h0m0s`). Pure.
pub fn go_duration(d: Duration) -> String {
    pko_api::duration::format_go_duration(d)
}

/// The outcome of the sync check.
#[derive(Debug, Clone, PartialEq)]
pub enum Sync {
    /// An update must run; `reason` is PKO's `StackUpdateDetected` event text, also the update message.
    NeedsUpdate {
        /// e.g. `New commit detected: abc`.
        reason: String,
    },
    /// In sync (or given up): set `conditions`, come back after `requeue_after` (none: on change only).
    Synced {
        /// What the conditions should say.
        conditions: Conditions,
        /// When to look again.
        requeue_after: Option<Duration>,
    },
}

/// Condition state of a synced Stack.
#[derive(Debug, Clone, PartialEq)]
pub enum Conditions {
    /// Ready=True.
    Ready,
    /// Reconciling=True with a reason and message.
    Reconciling(&'static str, String),
    /// Stalled=True with a reason and message.
    Stalled(&'static str, String),
}

/// Decides whether `stack` is in sync with the source at `commit` (the resolved revision: commit SHA, artifact revision
/// or Program generation) at time `now`. `branch_tracking` adds the poll period to the requeue. `deleting`: the Stack
/// is being finalized and needs a destroy.
pub fn decide(stack: &Stack, commit: &str, now: Timestamp, branch_tracking: bool, deleting: bool) -> Sync {
    decide_with_workspace(stack, commit, now, branch_tracking, deleting, None)
}

/// Whether the sync request `request` is met by `last` at the branch head `commit` although `last` did not see it: a
/// request for one commit ([`PUSH_REQUEST_PREFIX`], a Receiver's) that arrived while the Stack's own pass was already
/// running that commit, and that update succeeded. Another sync of the same commit would change nothing the request
/// asked for. Pure.
fn request_met(request: &str, last: &pko_api::stack::StackUpdateState, commit: &str) -> bool {
    request.strip_prefix(PUSH_REQUEST_PREFIX) == Some(commit)
        && last.state == Some(StackUpdateStateMessage::Succeeded)
        && last.last_successful_commit.as_deref() == Some(commit)
}

/// [`decide`], knowing whether the Stack's Workspace is Stalled (`workspace_stall`: its reason and message). A failed
/// update whose Workspace stalled is not retried (PKO): the Stack is Stalled `WorkspaceFailed` —
/// `PulumiVersionTooLow` for `IncompatibleConfiguration` — with `"<reason>: <message>"`, until the spec, the source
/// or the sync request changes.
pub fn decide_with_workspace(
    stack: &Stack,
    commit: &str,
    now: Timestamp,
    branch_tracking: bool,
    deleting: bool,
    workspace_stall: Option<(&str, &str)>,
) -> Sync {
    let status = stack.status.clone().unwrap_or_default();
    let Some(last) = status.last_update else {
        return Sync::NeedsUpdate {
            reason: if deleting { "Stack marked for deletion".into() } else { "Initial stack update".into() },
        };
    };
    let generation = stack.metadata.generation.unwrap_or(0);
    let request = stack
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RECONCILE_REQUEST_ANNOTATION))
        .cloned()
        .unwrap_or_default();
    if deleting && last.update_type != Some(UpdateType::Destroy) {
        return Sync::NeedsUpdate { reason: "Stack marked for deletion".into() };
    }
    if !deleting {
        if last.generation.unwrap_or(0) != generation {
            return Sync::NeedsUpdate { reason: format!("New stack generation: {generation}") };
        }
        if last.reconcile_request.clone().unwrap_or_default() != request && !request_met(&request, &last, commit) {
            return Sync::NeedsUpdate { reason: format!("Sync request: {}", go_quote(&request)) };
        }
    }
    let since_resync =
        last.last_resync_time.as_ref().map(|t| now.duration_since(t.0).unsigned_abs()).unwrap_or(Duration::MAX);
    let period = resync_period(stack);
    let mut requeue: Vec<Duration> = Vec::new();
    if branch_tracking {
        requeue.push(period);
    }
    let seen = Seen { stack, last: &last, commit, deleting, since_resync };
    let conditions = match last.state {
        Some(StackUpdateStateMessage::Succeeded) => seen.after_success(period, &mut requeue),
        Some(StackUpdateStateMessage::Failed) | None => seen.after_failure(workspace_stall, &mut requeue),
    };
    match conditions {
        Ok(conditions) => {
            Sync::Synced { conditions, requeue_after: requeue.into_iter().min().map(|d| d.max(Duration::from_secs(1))) }
        }
        Err(needs_update) => needs_update,
    }
}

/// What the sync decision reads of a Stack whose last update is known.
struct Seen<'a> {
    stack: &'a Stack,
    last: &'a pko_api::stack::StackUpdateState,
    commit: &'a str,
    deleting: bool,
    since_resync: Duration,
}

impl Seen<'_> {
    /// After a successful update: a new commit, or a resync due (`continueResyncOnCommitMatch`, every `period`), needs
    /// an update (`Err`); else Ready, looked at again when the resync is due.
    fn after_success(&self, period: Duration, requeue: &mut Vec<Duration>) -> Result<Conditions, Sync> {
        if !self.deleting && self.last.last_successful_commit.as_deref() != Some(self.commit) {
            return Err(Sync::NeedsUpdate { reason: format!("New commit detected: {}", go_quote(self.commit)) });
        }
        if !self.deleting && self.stack.spec.continue_resync_on_commit_match == Some(true) {
            if self.since_resync >= period {
                return Err(Sync::NeedsUpdate { reason: format!("Resync time elapsed: {}", go_duration(period)) });
            }
            requeue.push(period - self.since_resync);
        }
        Ok(Conditions::Ready)
    }

    /// After a failed update: a new commit, or the backoff elapsed, needs an update (`Err`); a cancel request, a
    /// stalled Workspace or the retry budget spent stall the Stack; else it is Reconciling, looked at again when the
    /// backoff ends.
    fn after_failure(
        &self,
        workspace_stall: Option<(&str, &str)>,
        requeue: &mut Vec<Duration>,
    ) -> Result<Conditions, Sync> {
        let (last, deleting) = (self.last, self.deleting);
        if !deleting && last.last_attempted_commit.as_deref() != Some(self.commit) {
            return Err(Sync::NeedsUpdate { reason: format!("New commit detected: {}", go_quote(self.commit)) });
        }
        let failures = last.failures.unwrap_or(0);
        let kind = last.update_type.as_ref().map(UpdateType::as_str).unwrap_or("update");
        let policy = RetryPolicy::of(&self.stack.spec);
        if let Some(request) = last.cancel_request.as_deref().filter(|_| !deleting) {
            return Ok(Conditions::Stalled(sc::UPDATE_CANCELED, canceled_message(request)));
        }
        if let Some((reason, message)) = workspace_stall {
            let incompatible = reason == pko_api::constants::workspace_condition::INCOMPATIBLE_CONFIGURATION;
            let stall = if incompatible { sc::PULUMI_VERSION_TOO_LOW } else { sc::WORKSPACE_FAILED };
            return Ok(Conditions::Stalled(stall, format!("{reason}: {message}")));
        }
        if policy.stalls(failures, last.update_type.as_ref()) && !deleting {
            let text = format!("{kind} failed {failures} times; not retrying until the spec or source changes");
            return Ok(Conditions::Stalled(sc::UPDATE_FAILED, with_last_error(text, last.message.as_deref())));
        }
        let wait = policy.cooldown(failures);
        if self.since_resync >= wait {
            return Err(Sync::NeedsUpdate { reason: format!("Backoff time elapsed: {}", go_duration(wait)) });
        }
        requeue.push(wait - self.since_resync);
        Ok(if last.update_type == Some(UpdateType::Preview) {
            let text = format!("preview failed ({failures} attempt(s))");
            Conditions::Reconciling(sc::PREVIEW_FAILED, with_last_error(text, last.message.as_deref()))
        } else {
            let text = format!("{failures} update failure(s)");
            Conditions::Reconciling(sc::RETRYING_AFTER_FAILURE, with_last_error(text, last.message.as_deref()))
        })
    }
}

/// Longest part of the last failure's message a Stack condition repeats, in bytes.
pub const LAST_ERROR_BYTES: usize = 300;

/// PKO's condition `text`, then the first line of the last failure's `message` (at most [`LAST_ERROR_BYTES`]): what
/// failed is on the Stack itself, not only in `status.lastUpdate`. Pure.
pub fn with_last_error(text: String, message: Option<&str>) -> String {
    let Some(line) = message.and_then(|m| m.lines().map(str::trim).find(|l| !l.is_empty())) else { return text };
    let mut end = line.len().min(LAST_ERROR_BYTES);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    let more = if end < line.len() { "…" } else { "" };
    format!("{text}: {}{more}", &line[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use pko_api::StackSpec;
    use pko_api::stack::{StackStatus, StackUpdateState};
    use std::collections::BTreeMap;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn stack(generation: i64, last: Option<StackUpdateState>) -> Stack {
        let mut s = Stack::new("s", StackSpec { stack: "dev".into(), ..Default::default() });
        s.metadata.generation = Some(generation);
        s.status = Some(StackStatus { last_update: last, ..Default::default() });
        s
    }

    fn done(state: StackUpdateStateMessage, failures: i64, commit: &str, at_s: i64) -> StackUpdateState {
        StackUpdateState {
            generation: Some(1),
            update_type: Some(UpdateType::Up),
            state: Some(state),
            last_attempted_commit: Some(commit.into()),
            last_successful_commit: (state == StackUpdateStateMessage::Succeeded).then(|| commit.to_string()),
            last_resync_time: Some(Time(at(at_s))),
            failures: Some(failures),
            ..Default::default()
        }
    }

    fn needs(s: Sync) -> String {
        match s {
            Sync::NeedsUpdate { reason } => reason,
            other => panic!("expected an update, got {other:?}"),
        }
    }

    #[test]
    fn texts_quote_and_format_durations_as_go_does() {
        assert_eq!(go_quote("abc"), "\"abc\"");
        assert_eq!(go_quote("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\x01\"");
        assert_eq!(go_quote("main@sha1:0f"), "\"main@sha1:0f\"");
        for (secs, go) in [
            (0, "0s"),
            (10, "10s"),
            (60, "1m0s"),
            (90, "1m30s"),
            (270, "4m30s"),
            (3600, "1h0m0s"),
            (86_400, "24h0m0s"),
            (3723, "1h2m3s"),
        ] {
            assert_eq!(go_duration(Duration::from_secs(secs)), go, "{secs} s");
        }
    }

    #[test]
    fn cooldown_grows_tenfold_by_three_and_is_capped() {
        let pko = RetryPolicy::of(&stack(1, None).spec);
        assert_eq!(
            (pko.cooldown(0), pko.cooldown(1), pko.cooldown(2)),
            (Duration::from_secs(10), Duration::from_secs(30), Duration::from_secs(90))
        );
        assert_eq!(pko.cooldown(30), Duration::from_secs(86_400));
        assert_eq!(pko.cooldown(5_000), Duration::from_secs(86_400), "no overflow");
        let mut s = stack(1, None).spec;
        s.retry_max_backoff_duration_seconds = Some(600);
        assert_eq!(RetryPolicy::of(&s).cooldown(5), Duration::from_secs(600));
        s.retry_backoff_base_seconds = Some(2);
        s.retry_backoff_factor = Some(1.5);
        let p = RetryPolicy::of(&s);
        assert_eq!((p.cooldown(0), p.cooldown(2)), (Duration::from_secs(2), Duration::from_secs_f64(4.5)));
        s.retry_backoff_factor = Some(0.5);
        assert_eq!(RetryPolicy::of(&s).factor, 3.0, "below 1 (the schema refuses it): PKO's");
    }

    #[test]
    fn the_retry_budget_stalls_at_max_update_failures_a_preview_one_later() {
        let mut s = stack(1, None).spec;
        let pko = RetryPolicy::of(&s);
        assert!(
            !pko.stalls(2, Some(&UpdateType::Up)) && pko.stalls(3, Some(&UpdateType::Up)),
            "PKO: the 4th failed attempt stalls"
        );
        assert!(!pko.stalls(3, Some(&UpdateType::Preview)) && pko.stalls(4, Some(&UpdateType::Preview)));
        s.max_update_failures = Some(1);
        let one = RetryPolicy::of(&s);
        assert!(
            !one.stalls(0, Some(&UpdateType::Up)) && one.stalls(1, Some(&UpdateType::Up)),
            "one retry, then stalled"
        );
        s.max_update_failures = Some(0);
        assert_eq!(RetryPolicy::of(&s).max_failures, 1, "minimum 1, as PR #1322");
    }

    #[test]
    fn resync_is_at_least_sixty_seconds() {
        let mut s = stack(1, None);
        assert_eq!(resync_period(&s), Duration::from_secs(60));
        s.spec.resync_frequency_seconds = Some(5);
        assert_eq!(resync_period(&s), Duration::from_secs(60));
        s.spec.resync_frequency_seconds = Some(300);
        assert_eq!(resync_period(&s), Duration::from_secs(300));
    }

    #[test]
    fn triggers_in_pko_order() {
        assert_eq!(needs(decide(&stack(1, None), "c1", at(0), false, false)), "Initial stack update");
        let ok = done(StackUpdateStateMessage::Succeeded, 0, "c1", 0);
        assert_eq!(needs(decide(&stack(2, Some(ok.clone())), "c1", at(1), false, false)), "New stack generation: 2");
        let mut s = stack(1, Some(ok.clone()));
        s.metadata.annotations = Some(BTreeMap::from([(RECONCILE_REQUEST_ANNOTATION.to_string(), "now".to_string())]));
        assert_eq!(needs(decide(&s, "c1", at(1), false, false)), "Sync request: \"now\"", "Go-quoted, as PKO");
        assert_eq!(
            needs(decide(&stack(1, Some(ok.clone())), "c2", at(1), false, false)),
            "New commit detected: \"c2\""
        );
        assert_eq!(needs(decide(&stack(1, Some(ok)), "c1", at(1), false, true)), "Stack marked for deletion");
    }

    #[test]
    fn a_push_request_met_by_an_update_already_at_its_commit_runs_no_other() {
        let ok = done(StackUpdateStateMessage::Succeeded, 0, "c2", 0);
        let mut s = stack(1, Some(ok));
        s.metadata.annotations =
            Some(BTreeMap::from([(RECONCILE_REQUEST_ANNOTATION.to_string(), format!("{PUSH_REQUEST_PREFIX}c2"))]));
        assert!(matches!(decide(&s, "c2", at(1), true, false), Sync::Synced { .. }), "the push's commit ran");
        assert_eq!(needs(decide(&s, "c3", at(1), true, false)), "Sync request: \"push-c2\"", "the head moved on");
        let failed = done(StackUpdateStateMessage::Failed, 0, "c2", 0);
        let mut f = stack(1, Some(failed));
        f.metadata.annotations = s.metadata.annotations.clone();
        assert_eq!(needs(decide(&f, "c2", at(1), true, false)), "Sync request: \"push-c2\"", "a failed one is retried");
        s.metadata.annotations = Some(BTreeMap::from([(RECONCILE_REQUEST_ANNOTATION.to_string(), "c2".to_string())]));
        assert_eq!(needs(decide(&s, "c2", at(1), true, false)), "Sync request: \"c2\"", "any other value: PKO's");
    }

    #[test]
    fn a_synced_stack_is_ready_and_polls_its_branch() {
        let s = stack(1, Some(done(StackUpdateStateMessage::Succeeded, 0, "c1", 0)));
        assert_eq!(
            decide(&s, "c1", at(5), false, false),
            Sync::Synced { conditions: Conditions::Ready, requeue_after: None }
        );
        assert_eq!(
            decide(&s, "c1", at(5), true, false),
            Sync::Synced { conditions: Conditions::Ready, requeue_after: Some(Duration::from_secs(60)) }
        );
    }

    #[test]
    fn continue_resync_reruns_after_the_period() {
        let mut s = stack(1, Some(done(StackUpdateStateMessage::Succeeded, 0, "c1", 0)));
        s.spec.continue_resync_on_commit_match = Some(true);
        assert_eq!(
            decide(&s, "c1", at(20), false, false),
            Sync::Synced { conditions: Conditions::Ready, requeue_after: Some(Duration::from_secs(40)) }
        );
        assert_eq!(needs(decide(&s, "c1", at(60), false, false)), "Resync time elapsed: 1m0s", "a Go duration, as PKO");
    }

    #[test]
    fn the_last_error_follows_pkos_text() {
        assert_eq!(with_last_error("0 update failure(s)".into(), None), "0 update failure(s)");
        assert_eq!(
            with_last_error("0 update failure(s)".into(), Some("\n  downloading http://a:1/x: timed out\nmore")),
            "0 update failure(s): downloading http://a:1/x: timed out"
        );
        let long = "é".repeat(400);
        let m = with_last_error("t".into(), Some(&long));
        assert!(m.len() <= 3 + LAST_ERROR_BYTES + "…".len() && m.ends_with('…'), "{m}");
        let mut s = stack(1, Some(done(StackUpdateStateMessage::Failed, 0, "c1", 0)));
        s.status.as_mut().unwrap().last_update.as_mut().unwrap().message = Some("boom".into());
        assert!(
            matches!(decide(&s, "c1", at(4), false, false), Sync::Synced { conditions: Conditions::Reconciling(_, m),
                .. } if m == "0 update failure(s): boom")
        );
    }

    #[test]
    fn failures_back_off_then_stall() {
        let s = stack(1, Some(done(StackUpdateStateMessage::Failed, 0, "c1", 0)));
        match decide(&s, "c1", at(4), false, false) {
            Sync::Synced { conditions: Conditions::Reconciling(reason, msg), requeue_after } => {
                assert_eq!(reason, sc::RETRYING_AFTER_FAILURE);
                assert_eq!(msg, "0 update failure(s)", "PKO counts the failures before this one");
                assert_eq!(requeue_after, Some(Duration::from_secs(6)));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(needs(decide(&s, "c1", at(10), false, false)), "Backoff time elapsed: 10s");
        let s = stack(1, Some(done(StackUpdateStateMessage::Failed, 2, "c1", 0)));
        assert!(matches!(decide(&s, "c1", at(89), false, false), Sync::Synced { requeue_after: Some(d),
                .. } if d == Duration::from_secs(1)));
        let s = stack(1, Some(done(StackUpdateStateMessage::Failed, 3, "c1", 0)));
        match decide(&s, "c1", at(100_000), false, false) {
            Sync::Synced { conditions: Conditions::Stalled(reason, msg), requeue_after: None } => {
                assert_eq!(reason, sc::UPDATE_FAILED);
                assert_eq!(msg, "up failed 3 times; not retrying until the spec or source changes");
            }
            other => panic!("{other:?}"),
        }
        // a new commit retries even a stalled stack
        assert_eq!(needs(decide(&s, "c2", at(1), false, false)), "New commit detected: \"c2\"");
    }

    #[test]
    fn a_failure_that_stalled_the_workspace_is_not_retried() {
        let s = stack(1, Some(done(StackUpdateStateMessage::Failed, 0, "c1", 0)));
        let stall = Some(("InstallationFailed", "pulumi install failed: no plugin"));
        match decide_with_workspace(&s, "c1", at(100_000), false, false, stall) {
            Sync::Synced { conditions: Conditions::Stalled(reason, msg), requeue_after: None } => {
                assert_eq!(
                    (reason, msg.as_str()),
                    (sc::WORKSPACE_FAILED, "InstallationFailed: pulumi install failed: no plugin"),
                    "PKO's text: reason, then message"
                );
            }
            other => panic!("{other:?}"),
        }
        let old_cli = Some((
            "IncompatibleConfiguration",
            "Pulumi CLI version v3.180.0 does not support JSON configuration, require >= v3.202.0",
        ));
        assert!(matches!(
            decide_with_workspace(&s, "c1", at(1), false, false, old_cli),
            Sync::Synced { conditions: Conditions::Stalled(sc::PULUMI_VERSION_TOO_LOW, _), .. }
        ));
        // a new commit, generation or sync request tries again
        assert_eq!(needs(decide_with_workspace(&s, "c2", at(1), false, false, stall)), "New commit detected: \"c2\"");
        assert_eq!(
            needs(decide_with_workspace(
                &stack(2, s.status.clone().unwrap().last_update),
                "c1",
                at(1),
                false,
                false,
                stall
            )),
            "New stack generation: 2"
        );
        // a succeeded stack does not care
        let ok = stack(1, Some(done(StackUpdateStateMessage::Succeeded, 0, "c1", 0)));
        assert_eq!(
            decide_with_workspace(&ok, "c1", at(1), false, false, stall),
            Sync::Synced { conditions: Conditions::Ready, requeue_after: None }
        );
    }

    #[test]
    fn a_failed_preview_is_reported_as_such() {
        let mut last = done(StackUpdateStateMessage::Failed, 0, "c1", 0);
        last.update_type = Some(UpdateType::Preview);
        last.message = Some("preview failed: x".into());
        let s = stack(1, Some(last));
        assert_eq!(
            decide(&s, "c1", at(1), false, false),
            Sync::Synced {
                conditions: Conditions::Reconciling(
                    sc::PREVIEW_FAILED,
                    "preview failed (0 attempt(s)): preview failed: x".into()
                ),
                requeue_after: Some(Duration::from_secs(9))
            }
        );
    }

    #[test]
    fn deleting_waits_for_a_successful_destroy() {
        let mut destroyed = done(StackUpdateStateMessage::Succeeded, 0, "c1", 0);
        destroyed.update_type = Some(UpdateType::Destroy);
        assert!(matches!(
            decide(&stack(1, Some(destroyed)), "c1", at(1), false, true),
            Sync::Synced { conditions: Conditions::Ready, .. }
        ));
        let mut failed = done(StackUpdateStateMessage::Failed, 0, "c1", 0);
        failed.update_type = Some(UpdateType::Destroy);
        assert_eq!(needs(decide(&stack(1, Some(failed)), "c1", at(11), false, true)), "Backoff time elapsed: 10s");
    }
}
