//! An operation's events as the lines Pulumi prints: its engine events rendered (resource steps, diagnostics, the
//! summary), its log lines (`stdout`, `stderr`, `agent`) and its result. The agent writes them to its standard output;
//! the operator keeps them for `kubectl pko logs`. Pure.

use serde_json::Value;

use crate::v1::{LogLine, OperationEvent, ResultStatus, log_line, operation_event::Event};

/// The stream name of log line stream `stream`: `stdout`, `stderr` or `agent`.
pub fn stream_name(stream: i32) -> &'static str {
    match log_line::Stream::try_from(stream).unwrap_or(log_line::Stream::Unspecified) {
        log_line::Stream::Stdout => "stdout",
        log_line::Stream::Stderr => "stderr",
        log_line::Stream::Agent | log_line::Stream::Unspecified => "agent",
    }
}

/// The `(stream, text)` an event reads as: a log line as it is, an engine event rendered ([`render`], stream `engine`),
/// the result (`result`: its status and message); `None` for engine events Pulumi prints nothing for.
pub fn line_of(event: &OperationEvent) -> Option<(&'static str, String)> {
    match event.event.as_ref()? {
        Event::Log(LogLine { stream, text }) => Some((stream_name(*stream), text.clone())),
        Event::EngineEvent(s) => match crate::json::from_struct(s) {
            Value::Object(m) => render(&m).map(|l| ("engine", l)),
            _ => None,
        },
        Event::Result(r) => {
            let status = ResultStatus::try_from(r.status)
                .map(|s| s.as_str_name().trim_start_matches("RESULT_STATUS_").to_lowercase())
                .unwrap_or_default();
            Some(("result", if r.message.is_empty() { status } else { format!("{status}: {}", r.message) }))
        }
    }
}

/// An engine event as Pulumi prints it: a resource step (`+ command:local:Command hello creating`, then `created`), a
/// diagnostic of severity info, warning or error (`error: …`; debug ones are left out), the summary (`Resources: 2
/// created, 1 unchanged; duration 3 s`); `None` for the rest. Pure.
pub fn render(event: &serde_json::Map<String, Value>) -> Option<String> {
    if let Some(m) = event.get("resourcePreEvent").map(|e| &e["metadata"]) {
        return step(m, false);
    }
    if let Some(m) = event.get("resOutputsEvent").map(|e| &e["metadata"]) {
        return step(m, true);
    }
    if let Some(d) = event.get("diagnosticEvent") {
        let severity = d["severity"].as_str().unwrap_or_default();
        let message = d["message"].as_str().unwrap_or_default().trim_end();
        return match severity {
            "error" | "warning" => Some(format!("{severity}: {message}")),
            "info" | "info#err" if !message.is_empty() => Some(message.to_string()),
            _ => None,
        };
    }
    event.get("summaryEvent").map(summary)
}

/// The line of a resource step `m` (an engine event's `metadata`), `done` once its outputs came. Pure.
fn step(m: &Value, done: bool) -> Option<String> {
    let op = m["op"].as_str()?;
    let urn = m["urn"].as_str().unwrap_or_default();
    let ty = m["type"].as_str().unwrap_or_default();
    if op == "same" || ty == "pulumi:pulumi:Stack" {
        return None;
    }
    let name = urn.rsplit("::").next().unwrap_or(urn);
    let (symbol, doing, did) = match op {
        "create" => ("+", "creating", "created"),
        "update" => ("~", "updating", "updated"),
        "delete" => ("-", "deleting", "deleted"),
        "replace" => ("+-", "replacing", "replaced"),
        "create-replacement" => ("++", "creating replacement", "created replacement"),
        "delete-replaced" => ("--", "deleting original", "deleted original"),
        "refresh" => ("~", "refreshing", "refreshed"),
        "read" => (">", "reading", "read"),
        other => ("*", other, other),
    };
    Some(format!("{symbol} {ty} {name} {}", if done { did } else { doing }))
}

/// Pulumi's word for resources that went through step `op` (`created`, `unchanged`, …). Pure.
fn done_word(op: &str) -> &str {
    match op {
        "create" => "created",
        "update" => "updated",
        "delete" => "deleted",
        "replace" => "replaced",
        "same" => "unchanged",
        other => other,
    }
}

/// The summary line of a `summaryEvent`. Pure.
fn summary(s: &Value) -> String {
    let changes = s["resourceChanges"].as_object().map(|m| {
        m.iter().map(|(op, n)| format!("{} {}", n.as_i64().unwrap_or(0), done_word(op))).collect::<Vec<_>>().join(", ")
    });
    let seconds = s["durationSeconds"].as_i64().map(|d| format!("; duration {d} s")).unwrap_or_default();
    format!("Resources: {}{seconds}", changes.filter(|c| !c.is_empty()).unwrap_or_else(|| "no changes".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn engine_events_read_as_pulumi_prints_them() {
        let pre = json!({"resourcePreEvent": {"metadata": {"op": "create",
            "urn": "urn:pulumi:dev::p::command:local:Command::hello", "type": "command:local:Command"}}});
        assert_eq!(render(pre.as_object().unwrap()).as_deref(), Some("+ command:local:Command hello creating"));
        let out = json!({"resOutputsEvent": {"metadata": {"op": "create",
            "urn": "urn:pulumi:dev::p::command:local:Command::hello", "type": "command:local:Command"}}});
        assert_eq!(render(out.as_object().unwrap()).as_deref(), Some("+ command:local:Command hello created"));
        let same = json!({"resourcePreEvent": {"metadata": {"op": "same", "urn": "u", "type": "t"}}});
        assert_eq!(
            render(same.as_object().unwrap()),
            None,
            "unchanged resources are not listed, as Pulumi's default view"
        );
        let err = json!({"diagnosticEvent": {"severity": "error", "message": "command exited with 3\n"}});
        assert_eq!(render(err.as_object().unwrap()).as_deref(), Some("error: command exited with 3"));
        assert_eq!(
            render(json!({"diagnosticEvent": {"severity": "debug", "message": "Registering"}}).as_object().unwrap()),
            None
        );
        let sum = json!({"summaryEvent": {"resourceChanges": {"create": 2, "same": 1}, "durationSeconds": 3}});
        assert_eq!(
            render(sum.as_object().unwrap()).as_deref(),
            Some("Resources: 2 created, 1 unchanged; duration 3 s")
        );
        assert_eq!(render(json!({"prelude": {}}).as_object().unwrap()), None);
    }

    #[test]
    fn a_replacement_reads_as_its_three_steps() {
        let step = |op: &str, done: bool| {
            let m = json!({"op": op, "urn": "urn:pulumi:dev::p::t::r", "type": "t"});
            super::step(&m, done)
        };
        assert_eq!(step("create-replacement", false).as_deref(), Some("++ t r creating replacement"));
        assert_eq!(step("replace", true).as_deref(), Some("+- t r replaced"));
        assert_eq!(step("delete-replaced", true).as_deref(), Some("-- t r deleted original"));
    }

    #[test]
    fn events_read_as_lines() {
        let ev = |e| OperationEvent { event: Some(e), ..Default::default() };
        let log = ev(Event::Log(LogLine { stream: log_line::Stream::Stderr as i32, text: "oops".into() }));
        assert_eq!(line_of(&log), Some(("stderr", "oops".into())));
        let step =
            json!({"resourcePreEvent": {"metadata": {"op": "create", "urn": "urn:pulumi:dev::p::t::x", "type": "t"}}});
        let Value::Object(m) = step else { unreachable!() };
        assert_eq!(
            line_of(&ev(Event::EngineEvent(crate::json::to_struct(&m)))),
            Some(("engine", "+ t x creating".into()))
        );
        let result = ev(Event::Result(crate::v1::OperationResult {
            status: ResultStatus::Failed as i32,
            message: "boom".into(),
            ..Default::default()
        }));
        assert_eq!(line_of(&result), Some(("result", "failed: boom".into())));
        assert_eq!(line_of(&OperationEvent::default()), None);
    }
}
