//! The limits an operation runs under (issue "Operate it"): PKO's idle timeout (`Update.spec.idleTimeout`, PKO PR
//! #1296: no event from the operation for that long; default `--update-idle-timeout`, 30 min) and an overall deadline
//! (ours: `Update.spec.timeout`, set from `Stack.spec.operationTimeoutSeconds`; default `--operation-timeout`, none). A
//! limit reached stops the operation on its agent (CTRL-C, a hard stop after the agent's grace period) and ends the
//! Update `Failed` with a reason naming the limit — where PKO abandons the stream and leaves Pulumi running. Pure.

use std::time::Duration;

use pko_api::constants::update_condition as uc;
use tokio::time::Instant;

/// What stopped an operation: a limit, or a cancel request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limit {
    /// No event for this long (`IdleTimeout`, PKO's reason).
    Idle(Duration),
    /// Running this long in all (`DeadlineExceeded`).
    Overall(Duration),
    /// A `pulumi.com/cancel-request` of this value (`Canceled`, [`super::cancel`]).
    Requested(String),
}

impl Limit {
    /// The `Failed` condition's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Limit::Idle(_) => uc::IDLE_TIMEOUT,
            Limit::Overall(_) => uc::DEADLINE_EXCEEDED,
            Limit::Requested(_) => uc::CANCELED,
        }
    }

    /// The Update's `status.message` (PKO's words for the idle timeout, then what we did instead of abandoning the
    /// operation).
    pub fn message(&self) -> String {
        match self {
            Limit::Idle(d) => format!(
                "The update produced no output for {} and was stopped (CTRL-C on its agent).",
                pko_api::duration::format_go_duration(*d)
            ),
            Limit::Overall(d) => format!(
                "The update ran longer than its timeout of {} and was stopped (CTRL-C on its agent).",
                pko_api::duration::format_go_duration(*d)
            ),
            Limit::Requested(r) => super::cancel::message(r),
        }
    }
}

/// The limits of one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// No event for this long stops it; `None`: no idle timeout.
    pub idle: Option<Duration>,
    /// Running this long stops it; `None`: no deadline.
    pub overall: Option<Duration>,
}

/// The grace Pulumi gets after Ctrl-C when a limit stops it (`CancelRequest.grace_seconds`), in seconds; then the agent
/// kills it.
pub const STOP_GRACE_SECONDS: u32 = 30;

/// How often a running operation looks for a cancel request.
pub const CANCEL_POLL: Duration = Duration::from_secs(1);

/// How long an agent may take to end an operation after it was asked to stop ([`STOP_GRACE_SECONDS`], the hard stop,
/// the result) before the Update is recorded failed without the agent's result.
pub const STOP_WAIT: Duration = Duration::from_secs(STOP_GRACE_SECONDS as u64 + 15);

/// The limits of an Update: its `spec.idleTimeout` (a zero disables it; unset: `default_idle`) and its `spec.timeout`
/// (a zero disables it; unset: `default_overall`), Go durations.
///
/// Errors: a malformed duration, naming the field (the Update fails with it before it runs).
pub fn of(
    spec: &pko_api::update::UpdateSpec,
    default_idle: Option<Duration>,
    default_overall: Option<Duration>,
) -> Result<Limits, String> {
    let read = |field: &str, v: Option<&String>, default: Option<Duration>| -> Result<Option<Duration>, String> {
        match v {
            None => Ok(default),
            Some(s) => pko_api::duration::parse_go_duration_or_zero(s)
                .map(|d| Some(d).filter(|d| !d.is_zero()))
                .map_err(|e| format!("spec.{field}: {s:?}: {e}")),
        }
    };
    Ok(Limits {
        idle: read("idleTimeout", spec.idle_timeout.as_ref(), default_idle)?,
        overall: read("timeout", spec.timeout.as_ref(), default_overall)?,
    })
}

impl Limits {
    /// The next moment a limit is reached, for an operation that started at `started` and last sent an event at
    /// `last_event`, and which limit; `None` without limits.
    pub fn next(&self, started: Instant, last_event: Instant) -> Option<(Instant, Limit)> {
        let idle = self.idle.map(|d| (last_event + d, Limit::Idle(d)));
        let overall = self.overall.map(|d| (started + d, Limit::Overall(d)));
        [idle, overall].into_iter().flatten().min_by_key(|(at, _)| *at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_come_from_the_update_else_the_operator() {
        let spec = |idle: Option<&str>, timeout: Option<&str>| pko_api::update::UpdateSpec {
            idle_timeout: idle.map(str::to_string),
            timeout: timeout.map(str::to_string),
            ..Default::default()
        };
        let m = Duration::from_secs(60);
        assert_eq!(of(&spec(None, None), Some(30 * m), None), Ok(Limits { idle: Some(30 * m), overall: None }));
        assert_eq!(
            of(&spec(Some("5s"), Some("1h")), Some(30 * m), None),
            Ok(Limits { idle: Some(Duration::from_secs(5)), overall: Some(60 * m) })
        );
        assert_eq!(
            of(&spec(Some("0s"), None), Some(30 * m), Some(m)),
            Ok(Limits { idle: None, overall: Some(m) }),
            "a zero disables it"
        );
        assert!(of(&spec(Some("soon"), None), None, None).unwrap_err().starts_with("spec.idleTimeout: \"soon\""));
    }

    #[test]
    fn the_nearest_limit_is_next() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let l = Limits { idle: Some(10 * s), overall: Some(25 * s) };
        assert_eq!(l.next(t0, t0), Some((t0 + 10 * s, Limit::Idle(10 * s))));
        assert_eq!(
            l.next(t0, t0 + 20 * s),
            Some((t0 + 25 * s, Limit::Overall(25 * s))),
            "events keep the idle limit away, not the deadline"
        );
        assert_eq!(Limits::default().next(t0, t0), None);
        assert_eq!(
            Limit::Idle(30 * 60 * s).message(),
            "The update produced no output for 30m0s and was stopped (CTRL-C on its agent)."
        );
        assert_eq!((Limit::Idle(s).reason(), Limit::Overall(s).reason()), ("IdleTimeout", "DeadlineExceeded"));
    }
}
