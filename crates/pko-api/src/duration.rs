//! Go durations (`24h`, `1h30m`, `1.5s`, `500ms`): the format of PKO's `metav1.Duration` fields (`ttlAfterCompleted`,
//! `prerequisites[].requirement.succeededWithinDuration`). Parsed with `go-parse-duration`, a port of Go's
//! `time.ParseDuration`, so what PKO accepts is what we accept.

use std::time::Duration;

/// What Go's `time.ParseDuration` reads, as a regular expression (RE2, as the API server's `pattern`): an optional
/// sign, then `0` or one or more decimal numbers each with a unit (`ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`, `h`).
pub const GO_DURATION_PATTERN: &str = "^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$";

/// A duration string that is not a non-negative Go duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a Go duration such as 24h, 1h30m or 500ms{why}")]
pub struct DurationError {
    /// The text as given.
    pub value: String,
    /// `": negative"` for a negative duration, else empty.
    why: &'static str,
}

/// Parses a non-negative Go duration. Errors: [`DurationError`] for anything Go's `time.ParseDuration` refuses (a bare
/// number other than `0`, unknown units such as `3d`, an empty string) or a negative value.
pub fn parse_go_duration(s: &str) -> Result<Duration, DurationError> {
    // the library indexes bytes as characters and panics on a multi-byte unit: `µs`/`μs` are Go's
    // spellings of `us`, so they are read as that
    let ascii = s.trim().replace(['µ', 'μ'], "u");
    if !ascii.is_ascii() {
        return Err(DurationError { value: s.to_string(), why: "" });
    }
    let nanos =
        go_parse_duration::parse_duration(&ascii).map_err(|_| DurationError { value: s.to_string(), why: "" })?;
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| DurationError { value: s.to_string(), why: ": negative" })
}

/// Parses a Go duration as PKO compares it: a negative one (which Go reads) counts as zero — a TTL of `-5m` expires
/// at once, a `succeededWithinDuration` of `-1h` is never met. Errors: [`DurationError`] for what Go's
/// `time.ParseDuration` refuses.
pub fn parse_go_duration_or_zero(s: &str) -> Result<Duration, DurationError> {
    match parse_go_duration(s) {
        Err(e) if !e.why.is_empty() => Ok(Duration::ZERO),
        other => other,
    }
}

/// Formats `d` as Go's `Duration.String` does for whole seconds and above (`1m0s`, `1h30m0s`, `45s`); below a second,
/// milliseconds (`500ms`). PKO's messages carry durations in this form.
pub fn format_go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return if d.is_zero() { "0s".into() } else { format!("{}ms", d.as_millis()) };
    }
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let frac = d.subsec_millis();
    let s = if frac > 0 { format!("{s}.{frac:03}").trim_end_matches('0').to_string() } else { s.to_string() };
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_as_go_parses_them() {
        assert_eq!(parse_go_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_go_duration("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_go_duration("1.5s"), Ok(Duration::from_millis(1_500)));
        assert_eq!(parse_go_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        for bad in ["5", "", "3d", "h", "1x"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?}");
        }
        let e = parse_go_duration("-1h").unwrap_err();
        assert!(e.to_string().contains("negative"), "{e}");
        assert_eq!(parse_go_duration_or_zero("-1h"), Ok(Duration::ZERO));
        assert_eq!(parse_go_duration_or_zero("90s"), Ok(Duration::from_secs(90)));
        assert!(parse_go_duration_or_zero("3d").is_err());
    }

    #[test]
    fn the_admission_pattern_admits_what_go_parses() {
        let re = regex::Regex::new(GO_DURATION_PATTERN).unwrap();
        for s in ["24h", "1h30m", "1.5s", "250ms", "0", "-5m", "+1h", ".5s", "1.h", "3µs", "3μs", "7us", "9ns"] {
            assert!(re.is_match(s), "{s:?} is admitted");
            assert!(parse_go_duration_or_zero(s).is_ok(), "Go reads {s:?}");
        }
        for s in ["5", "", "3d", "h", "1x", "1h\t2m", "--1h", ".", "1é"] {
            assert!(!re.is_match(s), "{s:?} is refused");
            assert!(parse_go_duration(s).is_err(), "Go refuses {s:?}");
        }
    }

    #[test]
    fn durations_format_as_go_prints_them() {
        assert_eq!(format_go_duration(Duration::from_secs(60)), "1m0s");
        assert_eq!(format_go_duration(Duration::from_secs(5_400)), "1h30m0s");
        assert_eq!(format_go_duration(Duration::from_secs(45)), "45s");
        assert_eq!(format_go_duration(Duration::from_millis(1_500)), "1.5s");
        assert_eq!(format_go_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(format_go_duration(Duration::ZERO), "0s");
    }
}
