//! Scheduled drift detection (PKO's proposed API, #1037 / branch `eron/drift-detection`): when a Stack's next check is
//! due, what a finished check means for the `DriftDetected` condition, and when drift is to be remediated. Pure: the
//! caller passes the time and does the I/O.
//!
//! The life of a check: on a cron tick of `spec.driftDetection.schedules[]`, a synced, Ready Stack gets an Update of
//! type `refresh` with `previewOnly: true` (`pulumi refresh --preview-only`: nothing is written to the stack's state).
//! Its result sets `DriftDetected` — True `Changes` naming the drifted resources, False `NoChanges`, Unknown
//! `CheckFailed` — and `status.driftDetection`. When the tick's schedule says `autoRemediate`, an `up --refresh`
//! follows while `DriftDetected` is True; its success sets `DriftDetected` False again.

use std::str::FromStr;

use k8s_openapi::jiff::Timestamp;
use pko_api::constants::stack_condition as sc;
use pko_api::stack::{DriftDetectionStatus, StackStatus, StackUpdateStateMessage};
use pko_api::update::ResourceChange;
use pko_api::{Stack, Update, UpdateType};

/// One parsed schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: croner::Cron,
    auto_remediate: bool,
}

impl FromStr for Schedule {
    type Err = String;

    /// A cron expression as [`pko_api::stack::DriftSchedule::cron`] documents it; the error is the parser's message.
    fn from_str(s: &str) -> Result<Self, String> {
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(s.trim())
            .map_err(|e| e.to_string())?;
        Ok(Schedule { cron, auto_remediate: false })
    }
}

/// The Stack's schedules, or the first that does not parse as `spec.driftDetection.schedules[i].cron: …`. Empty:
/// drift detection is off.
pub fn schedules(stack: &Stack) -> Result<Vec<Schedule>, String> {
    let list = stack.spec.drift_detection.as_ref().and_then(|d| d.schedules.clone()).unwrap_or_default();
    list.iter()
        .enumerate()
        .map(|(i, s)| {
            let parsed: Schedule = s.cron.parse().map_err(|e| {
                format!("spec.driftDetection.schedules[{i}].cron: invalid cron expression {:?}: {e}", s.cron)
            })?;
            Ok(Schedule { auto_remediate: s.auto_remediate == Some(true), ..parsed })
        })
        .collect()
}

fn to_chrono(t: Timestamp) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp(t.as_second(), t.subsec_nanosecond().max(0) as u32)
}

fn from_chrono(t: chrono::DateTime<chrono::Utc>) -> Option<Timestamp> {
    Timestamp::new(t.timestamp(), t.timestamp_subsec_nanos() as i32).ok()
}

/// The first tick of any schedule strictly after `after`, and whether a schedule ticking then remediates. None: no
/// schedule ticks again.
pub fn next_tick(schedules: &[Schedule], after: Timestamp) -> Option<(Timestamp, bool)> {
    let after = to_chrono(after)?;
    let ticks: Vec<(Timestamp, bool)> = schedules
        .iter()
        .filter_map(|s| Some((from_chrono(s.cron.find_next_occurrence(&after, false).ok()?)?, s.auto_remediate)))
        .collect();
    let first = ticks.iter().map(|(t, _)| *t).min()?;
    Some((first, ticks.iter().any(|(t, r)| *t == first && *r)))
}

/// What drift detection asks of a synced, Ready Stack now.
#[derive(Debug, Clone, PartialEq)]
pub enum Due {
    /// No schedules (or none ticks again).
    Off,
    /// A schedule does not parse: the message names it; no checks run until the spec changes.
    Invalid(String),
    /// A check is due (the tick it is for, and whether its schedule remediates).
    Check {
        /// The tick being served (names the check's Update, so a retried pass creates the same one).
        tick: Timestamp,
        /// Run `up --refresh` if the check finds drift.
        auto_remediate: bool,
    },
    /// The next check is at this time.
    At(Timestamp),
}

/// The shortest time between two drift checks of one Stack by default (`--min-drift-check-interval- seconds`; PKO's
/// resync floor): a schedule that ticks more often (`* * * * * *`) is checked at this pace, so it cannot hold an agent
/// and the fleet's drift slot back to back.
pub const MIN_CHECK_INTERVAL: std::time::Duration = crate::context::DEFAULT_DRIFT_MIN_INTERVAL;

/// When the next check of `stack` (with status `status`) is due, at `now`, at least `min_interval` after the last
/// check. Ticks count from the last check, else from the last update, else from the Stack's creation: ticks missed
/// while the operator was down give one check, not one per tick.
pub fn due(stack: &Stack, status: &StackStatus, now: Timestamp, min_interval: std::time::Duration) -> Due {
    let schedules = match schedules(stack) {
        Ok(s) if s.is_empty() => return Due::Off,
        Ok(s) => s,
        Err(e) => return Due::Invalid(e),
    };
    let last_check = status.drift_detection.as_ref().and_then(|d| d.last_check.as_ref()).map(|t| t.0);
    let last_update = status.last_update.as_ref().and_then(|l| l.last_resync_time.as_ref()).map(|t| t.0);
    let created = stack.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let mut anchor = last_check.or(last_update).or(created).unwrap_or(now);
    // the first tick at or after `last check + min_interval` (ticks are whole seconds)
    if let Some(floor) = last_check
        .and_then(|c| c.checked_add(min_interval).ok())
        .and_then(|f| f.checked_sub(std::time::Duration::from_secs(1)).ok())
    {
        anchor = anchor.max(floor);
    }
    match next_tick(&schedules, anchor) {
        None => Due::Off,
        Some((tick, auto_remediate)) if tick <= now => Due::Check { tick, auto_remediate },
        Some((tick, _)) => Due::At(tick),
    }
}

/// What a Stack's `DriftDetected` message says while a due check waits for a fleet-wide slot
/// (`--max-concurrent-drift-checks`).
pub const DEFERRED_NOTE: &str = "a check is due and waits for a drift-check slot: the fleet runs its maximum at once \
    (--max-concurrent-drift-checks)";

/// The `DriftDetected` condition `(status, reason, message)` while a due check waits for a slot, given the current one
/// (`None`: no check ran yet): its status and reason kept, [`DEFERRED_NOTE`] added to its message once; `None` when it
/// says so already. Pure.
pub fn deferred(current: Option<(&str, &str, &str)>) -> Option<(String, String, String)> {
    match current {
        Some((_, _, message)) if message.contains(DEFERRED_NOTE) => None,
        Some((status, reason, "")) => Some((status.into(), reason.into(), DEFERRED_NOTE.into())),
        Some((status, reason, message)) => Some((status.into(), reason.into(), format!("{message} ({DEFERRED_NOTE})"))),
        None => Some(("Unknown".into(), sc::DRIFT_CHECK_DEFERRED.into(), DEFERRED_NOTE.into())),
    }
}

/// Names every schedule that ticks more often than every `min_interval` (two consecutive ticks after `now` closer than
/// that): checks of such a schedule are spaced by `min_interval`. `None`: none does.
pub fn tightened(stack: &Stack, now: Timestamp, min_interval: std::time::Duration) -> Option<String> {
    let list = stack.spec.drift_detection.as_ref().and_then(|d| d.schedules.clone()).unwrap_or_default();
    let fast: Vec<String> = list
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            let Ok(parsed) = s.cron.parse::<Schedule>() else { return false };
            let first = next_tick(std::slice::from_ref(&parsed), now).map(|(t, _)| t);
            let second = first.and_then(|f| next_tick(std::slice::from_ref(&parsed), f)).map(|(t, _)| t);
            matches!((first, second), (Some(a), Some(b)) if b.duration_since(a).unsigned_abs() < min_interval)
        })
        .map(|(i, _)| format!("spec.driftDetection.schedules[{i}].cron"))
        .collect();
    (!fast.is_empty()).then(|| {
        format!(
            "{} tick(s) more often than every {} s: checks run at most once every {} s",
            fast.join(", "),
            min_interval.as_secs(),
            min_interval.as_secs()
        )
    })
}

/// Name of the check's Update for `tick`: `<stack>-drift-<8 hex>` (deterministic: a pass that ends after creating it
/// follows the same Update next time).
pub fn check_name(stack: &str, tick: Timestamp) -> String {
    format!("{stack}-drift-{}", pko_api::hash::sha256_hex(format!("{stack}\n{}", tick.as_second()), 4))
}

/// Whether `update` is a drift check: a preview-only refresh (as PKO's proposal marks them).
pub fn is_check(update: &Update) -> bool {
    update.spec.update_type == Some(UpdateType::Refresh) && update.spec.preview_only == Some(true)
}

/// The `DriftDetected` condition a finished check gives, and the event that goes with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    /// `Changes`, `NoChanges` or `CheckFailed`.
    pub reason: &'static str,
    /// Names the drifted resources (at most [`LISTED`], then how many more), or the failure.
    pub message: String,
    /// The drifted resources (as many as the Update lists).
    pub drifted: Vec<ResourceChange>,
}

/// Resources a `DriftDetected` message lists by URN.
pub const LISTED: usize = 10;

/// What the finished drift check `update` found. Drift is any step that is not `same` (the change summary counts what
/// the listed resources leave out).
pub fn outcome(update: &Update) -> Outcome {
    let st = update.status.clone().unwrap_or_default();
    if !update.succeeded() {
        let why = st.message.unwrap_or_else(|| "no message".into());
        return Outcome {
            status: "Unknown",
            reason: sc::DRIFT_CHECK_FAILED,
            message: format!("drift check failed: {why}"),
            drifted: Vec::new(),
        };
    }
    let drifted = st.resource_changes.unwrap_or_default();
    let counted: i64 = st
        .change_summary
        .unwrap_or_default()
        .iter()
        .filter(|(op, _)| op.as_str() != "same")
        .map(|(_, n)| i64::from(*n))
        .sum();
    let total = counted.max(drifted.len() as i64);
    if total == 0 {
        return Outcome { status: "False", reason: sc::DRIFT_NO_CHANGES, message: "no drift detected".into(), drifted };
    }
    let mut listed: Vec<String> = drifted
        .iter()
        .take(LISTED)
        .map(|c| match c.properties.as_deref() {
            Some(p) if !p.is_empty() => format!("{} ({}: {})", c.urn, c.op, p.join(", ")),
            _ => format!("{} ({})", c.urn, c.op),
        })
        .collect();
    let more = total - listed.len() as i64;
    if more > 0 {
        listed.push(format!("and {more} more"));
    }
    Outcome {
        status: "True",
        reason: sc::DRIFT_CHANGES,
        message: format!("{total} resource(s) drifted: {}", listed.join("; ")),
        drifted,
    }
}

/// Whether drift found by an `autoRemediate` schedule is still to be remediated: `DriftDetected` is True and the last
/// check's schedule remediates. An `up` built meanwhile refreshes first.
pub fn remediating(status: &StackStatus) -> bool {
    drift_condition(status) == Some("True")
        && status.drift_detection.as_ref().and_then(|d| d.auto_remediate) == Some(true)
}

fn drift_condition(status: &StackStatus) -> Option<&str> {
    status.conditions.as_ref()?.iter().find(|c| c.type_ == sc::DRIFT_DETECTED).map(|c| c.status.as_str())
}

fn last_check(status: &StackStatus) -> Option<Timestamp> {
    status.drift_detection.as_ref()?.last_check.as_ref().map(|t| t.0)
}

/// What remediation needs now, for a Stack that is otherwise in sync.
#[derive(Debug, Clone, PartialEq)]
pub enum Remediation {
    /// Nothing (no drift, or no `autoRemediate`).
    None,
    /// Run `up --refresh` with this reason (the Update's message and the sync event).
    Run(String),
    /// An `up` after the check succeeded: set `DriftDetected` False with this message.
    Done(String),
}

/// Whether the drift the last check found is to be remediated (no update since the check), or was (an `up` succeeded
/// after it).
pub fn remediation(status: &StackStatus) -> Remediation {
    if !remediating(status) {
        return Remediation::None;
    }
    let Some(checked) = last_check(status) else { return Remediation::None };
    let last = status.last_update.as_ref();
    let since = last.and_then(|l| l.last_resync_time.as_ref()).map(|t| t.0).filter(|t| *t >= checked);
    match (since, last) {
        (Some(_), Some(l))
            if l.state == Some(StackUpdateStateMessage::Succeeded) && l.update_type == Some(UpdateType::Up) =>
        {
            Remediation::Done(format!("drift remediated by update {}", l.name.as_deref().unwrap_or_default()))
        }
        // an update ran since the check and failed: the failure's backoff retries it (refreshing first)
        (Some(_), _) => Remediation::None,
        (None, _) => {
            let n =
                status.drift_detection.as_ref().and_then(|d| d.drifted_resources.as_ref()).map(Vec::len).unwrap_or(0);
            Remediation::Run(if n > 0 {
                format!("Drift detected: {n} resource(s) drifted")
            } else {
                "Drift detected".into()
            })
        }
    }
}

/// `status.driftDetection` after the check `update` ended at `now` on a schedule with `auto_remediate`.
pub fn checked(
    prev: Option<&DriftDetectionStatus>,
    update: &Update,
    outcome: &Outcome,
    now: Timestamp,
    auto_remediate: bool,
) -> DriftDetectionStatus {
    DriftDetectionStatus {
        last_check: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
        last_check_update: update.metadata.name.clone(),
        drifted_resources: Some(outcome.drifted.clone()).filter(|d| !d.is_empty()),
        auto_remediate: Some(auto_remediate),
        next_check: prev.and_then(|p| p.next_check.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use pko_api::StackSpec;
    use pko_api::stack::{DriftDetection, DriftSchedule, StackUpdateState};
    use pko_api::update::{UpdateSpec, UpdateStatus};

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn stack(schedules: &[(&str, bool)]) -> Stack {
        let drift = DriftDetection {
            schedules: Some(
                schedules
                    .iter()
                    .map(|(c, r)| DriftSchedule { cron: c.to_string(), auto_remediate: Some(*r) })
                    .collect(),
            ),
        };
        let mut s =
            Stack::new("s", StackSpec { stack: "dev".into(), drift_detection: Some(drift), ..Default::default() });
        s.metadata.creation_timestamp = Some(Time(t("2026-11-24T10:00:00Z")));
        s
    }

    fn status(last_check: Option<&str>, last_update: Option<&str>) -> StackStatus {
        StackStatus {
            drift_detection: last_check
                .map(|c| DriftDetectionStatus { last_check: Some(Time(t(c))), ..Default::default() }),
            last_update: last_update
                .map(|u| StackUpdateState { last_resync_time: Some(Time(t(u))), ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn crons_parse_as_cronjobs_do_and_bad_ones_name_their_field() {
        for ok in ["*/15 * * * *", "0 3 * * MON-FRI", "@hourly", "@daily", "*/5 * * * * *"] {
            assert!(ok.parse::<Schedule>().is_ok(), "{ok}");
        }
        let e = schedules(&stack(&[("@hourly", false), ("61 * * * *", false)])).unwrap_err();
        assert!(e.starts_with("spec.driftDetection.schedules[1].cron: invalid cron expression \"61 * * * *\""), "{e}");
        assert_eq!(due(&stack(&[]), &StackStatus::default(), t("2026-11-24T10:00:00Z"), MIN_CHECK_INTERVAL), Due::Off);
        assert!(matches!(
            due(&stack(&[("nope", false)]), &StackStatus::default(), t("2026-11-24T10:00:00Z"), MIN_CHECK_INTERVAL),
            Due::Invalid(_)
        ));
    }

    #[test]
    fn ticks_count_from_the_last_check_then_the_last_update_then_creation() {
        let s = stack(&[("*/15 * * * *", false)]);
        // never ran: from creation (10:00) the first tick is 10:15
        assert_eq!(
            due(&s, &StackStatus::default(), t("2026-11-24T10:14:00Z"), MIN_CHECK_INTERVAL),
            Due::At(t("2026-11-24T10:15:00Z"))
        );
        assert_eq!(
            due(&s, &StackStatus::default(), t("2026-11-24T10:15:00Z"), MIN_CHECK_INTERVAL),
            Due::Check { tick: t("2026-11-24T10:15:00Z"), auto_remediate: false }
        );
        // the last update at 10:20: the next tick is 10:30
        assert_eq!(
            due(&s, &status(None, Some("2026-11-24T10:20:00Z")), t("2026-11-24T10:29:59Z"), MIN_CHECK_INTERVAL),
            Due::At(t("2026-11-24T10:30:00Z"))
        );
        // checked at 10:30:05: 10:45 next
        assert_eq!(
            due(
                &s,
                &status(Some("2026-11-24T10:30:05Z"), Some("2026-11-24T10:20:00Z")),
                t("2026-11-24T10:31:00Z"),
                MIN_CHECK_INTERVAL
            ),
            Due::At(t("2026-11-24T10:45:00Z"))
        );
        // a day down: one check (for the first missed tick), not 96
        let d = due(&s, &status(Some("2026-11-24T10:30:05Z"), None), t("2026-11-25T10:31:00Z"), MIN_CHECK_INTERVAL);
        assert_eq!(d, Due::Check { tick: t("2026-11-24T10:45:00Z"), auto_remediate: false });
    }

    #[test]
    fn a_schedule_faster_than_the_floor_is_checked_at_the_floors_pace_and_named() {
        let s = stack(&[("@hourly", false), ("* * * * * *", false)]);
        // checked at 10:30:05: every second ticks, but the next check is 60 s later
        assert_eq!(
            due(&s, &status(Some("2026-11-24T10:30:05Z"), None), t("2026-11-24T10:30:30Z"), MIN_CHECK_INTERVAL),
            Due::At(t("2026-11-24T10:31:05Z"))
        );
        assert!(matches!(
            due(&s, &status(Some("2026-11-24T10:30:05Z"), None), t("2026-11-24T10:31:05Z"), MIN_CHECK_INTERVAL),
            Due::Check { .. }
        ));
        let short = std::time::Duration::from_secs(5);
        assert_eq!(
            due(&s, &status(Some("2026-11-24T10:30:05Z"), None), t("2026-11-24T10:30:06Z"), short),
            Due::At(t("2026-11-24T10:30:10Z")),
            "the floor is a setting"
        );
        let note = tightened(&s, t("2026-11-24T10:00:00Z"), MIN_CHECK_INTERVAL).unwrap();
        assert_eq!(
            note,
            "spec.driftDetection.schedules[1].cron tick(s) more often than every 60 s: checks run at most once every \
                60 s"
        );
        assert_eq!(
            tightened(&stack(&[("* * * * *", false)]), t("2026-11-24T10:00:00Z"), MIN_CHECK_INTERVAL),
            None,
            "once a minute is not tightened"
        );
    }

    #[test]
    fn the_earliest_schedule_wins_and_brings_its_remediation() {
        let s = stack(&[("0 * * * *", false), ("30 * * * *", true)]);
        assert_eq!(
            next_tick(&schedules(&s).unwrap(), t("2026-11-24T10:10:00Z")),
            Some((t("2026-11-24T10:30:00Z"), true))
        );
        assert_eq!(
            next_tick(&schedules(&s).unwrap(), t("2026-11-24T10:40:00Z")),
            Some((t("2026-11-24T11:00:00Z"), false))
        );
        let both = stack(&[("0 * * * *", false), ("@hourly", true)]);
        assert_eq!(
            next_tick(&schedules(&both).unwrap(), t("2026-11-24T10:40:00Z")),
            Some((t("2026-11-24T11:00:00Z"), true)),
            "one of the two ticking then remediates"
        );
    }

    #[test]
    fn check_names_are_per_tick_and_valid() {
        let a = check_name("web", t("2026-11-24T10:15:00Z"));
        assert!(a.starts_with("web-drift-") && a.len() == "web-drift-".len() + 8, "{a}");
        assert_eq!(a, check_name("web", t("2026-11-24T10:15:00Z")));
        assert_ne!(a, check_name("web", t("2026-11-24T10:30:00Z")));
    }

    fn finished(ok: bool, changes: Vec<ResourceChange>, summary: &[(&str, i32)], message: Option<&str>) -> Update {
        let cond = |type_: &str, status: &str| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "x".into(),
            message: String::new(),
            last_transition_time: Time(t("2026-11-24T10:00:00Z")),
            observed_generation: None,
        };
        let conditions = vec![cond("Complete", "True"), cond("Failed", if ok { "False" } else { "True" })];
        Update {
            metadata: kube::api::ObjectMeta { name: Some("s-drift-00000000".into()), ..Default::default() },
            spec: UpdateSpec { update_type: Some(UpdateType::Refresh), preview_only: Some(true), ..Default::default() },
            status: Some(UpdateStatus {
                conditions: Some(conditions),
                resource_changes: Some(changes).filter(|c| !c.is_empty()),
                change_summary: Some(summary.iter().map(|(k, v)| (k.to_string(), *v)).collect()),
                message: message.map(str::to_string),
                ..Default::default()
            }),
        }
    }

    fn change(urn: &str, op: &str, props: &[&str]) -> ResourceChange {
        ResourceChange {
            urn: urn.into(),
            op: op.into(),
            properties: Some(props.iter().map(|p| p.to_string()).collect()).filter(|p: &Vec<String>| !p.is_empty()),
        }
    }

    #[test]
    fn a_check_reports_drift_no_drift_or_its_failure() {
        let u = finished(
            true,
            vec![change("urn:a", "update", &["content"]), change("urn:b", "delete", &[])],
            &[("same", 3), ("update", 1), ("delete", 1)],
            None,
        );
        assert!(is_check(&u));
        let o = outcome(&u);
        assert_eq!((o.status, o.reason), ("True", sc::DRIFT_CHANGES));
        assert_eq!(o.message, "2 resource(s) drifted: urn:a (update: content); urn:b (delete)");
        let o = outcome(&finished(true, vec![], &[("same", 3)], None));
        assert_eq!((o.status, o.reason, o.message.as_str()), ("False", sc::DRIFT_NO_CHANGES, "no drift detected"));
        let o = outcome(&finished(false, vec![], &[], Some("refresh failed: boom")));
        assert_eq!(
            (o.status, o.reason, o.message.as_str()),
            ("Unknown", sc::DRIFT_CHECK_FAILED, "drift check failed: refresh failed: boom")
        );
        // more than listed: counted from the summary
        let many: Vec<ResourceChange> = (0..12).map(|i| change(&format!("urn:{i}"), "update", &[])).collect();
        let o = outcome(&finished(true, many, &[("update", 150)], None));
        assert!(
            o.message.starts_with("150 resource(s) drifted: urn:0 (update);") && o.message.ends_with("; and 140 more"),
            "{}",
            o.message
        );
        let mut up = u.clone();
        up.spec.preview_only = None;
        assert!(!is_check(&up), "a plain refresh is not a drift check");
    }

    fn drifted(auto: bool, checked_at: &str, last: Option<(&str, UpdateType, StackUpdateStateMessage)>) -> StackStatus {
        let cond = Condition {
            type_: sc::DRIFT_DETECTED.into(),
            status: "True".into(),
            reason: sc::DRIFT_CHANGES.into(),
            message: String::new(),
            last_transition_time: Time(t(checked_at)),
            observed_generation: None,
        };
        StackStatus {
            conditions: Some(vec![cond]),
            drift_detection: Some(DriftDetectionStatus {
                last_check: Some(Time(t(checked_at))),
                auto_remediate: Some(auto),
                drifted_resources: Some(vec![change("urn:a", "update", &[])]),
                ..Default::default()
            }),
            last_update: last.map(|(at, ty, state)| StackUpdateState {
                name: Some("s-1".into()),
                last_resync_time: Some(Time(t(at))),
                update_type: Some(ty),
                state: Some(state),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn remediation_runs_once_after_a_drifted_check_and_ends_with_a_successful_up() {
        use StackUpdateStateMessage::*;
        assert_eq!(remediation(&drifted(false, "2026-11-24T10:15:00Z", None)), Remediation::None, "report only");
        let before = Some(("2026-11-24T10:00:00Z", UpdateType::Up, Succeeded));
        assert_eq!(
            remediation(&drifted(true, "2026-11-24T10:15:00Z", before)),
            Remediation::Run("Drift detected: 1 resource(s) drifted".into())
        );
        let after = Some(("2026-11-24T10:16:00Z", UpdateType::Up, Succeeded));
        assert_eq!(
            remediation(&drifted(true, "2026-11-24T10:15:00Z", after)),
            Remediation::Done("drift remediated by update s-1".into())
        );
        let failed = Some(("2026-11-24T10:16:00Z", UpdateType::Up, Failed));
        assert_eq!(
            remediation(&drifted(true, "2026-11-24T10:15:00Z", failed.clone())),
            Remediation::None,
            "the failure's backoff retries"
        );
        assert!(remediating(&drifted(true, "2026-11-24T10:15:00Z", failed)), "and the retry refreshes first");
    }

    #[test]
    fn a_deferred_check_is_said_once_keeping_the_last_result() {
        let (status, reason, message) = deferred(Some(("False", sc::DRIFT_NO_CHANGES, "no drift"))).unwrap();
        assert_eq!((status.as_str(), reason.as_str()), ("False", sc::DRIFT_NO_CHANGES));
        assert_eq!(message, format!("no drift ({DEFERRED_NOTE})"));
        assert_eq!(deferred(Some(("False", sc::DRIFT_NO_CHANGES, &message))), None, "said once");
        assert_eq!(deferred(None).map(|d| d.1), Some(sc::DRIFT_CHECK_DEFERRED.to_string()));
        assert_eq!(deferred(Some(("True", sc::DRIFT_CHANGES, ""))).map(|d| d.2), Some(DEFERRED_NOTE.to_string()));
    }
}
