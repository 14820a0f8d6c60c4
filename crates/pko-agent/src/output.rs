//! What Pulumi printed, on the agent's standard output: every line of an operation — the agent's own,
//! Pulumi's stdout and stderr, and its engine events rendered as Pulumi prints them (resource steps,
//! diagnostics, the summary) — with the operation's namespace, stack, update and type on each line, so
//! a cluster's log pipeline (and `kubectl logs` of a pool's pod) has it. Text by default; JSON with
//! `--log-format json` or PKO's `AGENT_JSON_LOG=true` (PKO PR #1306). Lines arrive masked (secrets as
//! `[secret]`): nothing here sees a secret value.

use std::io::Write;

use serde_json::{Value, json};

/// How operation lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// `<time> <stream> namespace=… stack=… update=… operation=… | <line>`.
    #[default]
    Text,
    /// One JSON object per line: `time`, `stream`, `namespace`, `stack`, `update`, `operation`, `msg`.
    Json,
}

impl Format {
    /// The format `flag` asks for, JSON when PKO's `AGENT_JSON_LOG` (`json_env`) is `true` or `1`.
    pub fn chosen(flag: Format, json_env: Option<&str>) -> Format {
        match json_env {
            Some(v) if v == "1" || v.eq_ignore_ascii_case("true") => Format::Json,
            _ => flag,
        }
    }
}

/// Whose operation a line belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    /// The Update's namespace (the first part of the operator's operation id `<ns>/<name>/<uid>`).
    pub namespace: String,
    /// The Update's name (or the whole operation id when it is not the operator's form).
    pub update: String,
    /// The Pulumi stack.
    pub stack: String,
    /// `preview`, `up`, `refresh`, `destroy` or `initialize`.
    pub operation: String,
    /// How lines are written.
    pub format: Format,
}

impl Context {
    /// The context of operation `id` (`<ns>/<name>/<uid>` from the operator) on `stack`, of type
    /// `operation`, written as `format`. Pure.
    pub fn of(id: &str, stack: &str, operation: &str, format: Format) -> Context {
        let parts: Vec<&str> = id.split('/').collect();
        let (namespace, update) = match parts.as_slice() {
            [ns, name, _] => (ns.to_string(), name.to_string()),
            _ => (String::new(), id.to_string()),
        };
        Context { namespace, update, stack: stack.to_string(), operation: operation.to_string(), format }
    }

    /// `text` of `stream` (`agent`, `stdout`, `stderr`, `engine`) as one output line at `time`
    /// (RFC 3339). Pure.
    pub fn line(&self, time: &str, stream: &str, text: &str) -> String {
        match self.format {
            Format::Text => format!("{time} {stream} namespace={} stack={} update={} operation={} | {}", self.namespace, self.stack, self.update, self.operation, text.trim_end()),
            Format::Json => json!({"time": time, "stream": stream, "namespace": self.namespace, "stack": self.stack, "update": self.update,
                                   "operation": self.operation, "msg": text.trim_end()})
            .to_string(),
        }
    }

    /// Writes `text` of `stream` to standard output, one line per line of `text`. A closed output
    /// (an adopted local agent whose operator is gone) is ignored.
    pub fn print(&self, stream: &str, text: &str) {
        let time = crate::convert::now().to_string();
        let mut out = std::io::stdout().lock();
        for l in text.lines().filter(|l| !l.trim().is_empty()) {
            let _ = writeln!(out, "{}", self.line(&time, stream, l));
        }
    }
}

/// An engine event as Pulumi prints it: a resource step (`+ command:local:Command hello creating`,
/// then `created`), a diagnostic of severity info, warning or error (`error: …`; debug ones are left
/// out), the summary (`Resources: 2 created, 1 unchanged; duration 3 s`); `None` for the rest. Pure.
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
        "replace" | "create-replacement" | "delete-replaced" => ("+-", "replacing", "replaced"),
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
    let changes = s["resourceChanges"].as_object().map(|m| m.iter().map(|(op, n)| format!("{} {}", n.as_i64().unwrap_or(0), done_word(op))).collect::<Vec<_>>().join(", "));
    let seconds = s["durationSeconds"].as_i64().map(|d| format!("; duration {d} s")).unwrap_or_default();
    format!("Resources: {}{seconds}", changes.filter(|c| !c.is_empty()).unwrap_or_else(|| "no changes".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_carry_whose_operation_they_are() {
        let ctx = Context::of("team-a/web-1a2b/uid-9", "dev", "up", Format::Text);
        assert_eq!((ctx.namespace.as_str(), ctx.update.as_str()), ("team-a", "web-1a2b"));
        assert_eq!(ctx.line("2026-11-26T08:00:00Z", "stdout", "hello\n"), "2026-11-26T08:00:00Z stdout namespace=team-a stack=dev update=web-1a2b operation=up | hello");
        let json: Value = serde_json::from_str(&Context { format: Format::Json, ..ctx }.line("t", "engine", "+ a b creating")).unwrap();
        assert_eq!(json, json!({"time": "t", "stream": "engine", "namespace": "team-a", "stack": "dev", "update": "web-1a2b", "operation": "up", "msg": "+ a b creating"}));
        assert_eq!(Context::of("plain-id", "s", "preview", Format::Text).update, "plain-id");
        assert_eq!(Format::chosen(Format::Text, Some("true")), Format::Json, "PKO's AGENT_JSON_LOG");
        assert_eq!(Format::chosen(Format::Text, Some("false")), Format::Text);
        assert_eq!(Format::chosen(Format::Json, None), Format::Json);
    }

    #[test]
    fn engine_events_read_as_pulumi_prints_them() {
        let pre = json!({"resourcePreEvent": {"metadata": {"op": "create", "urn": "urn:pulumi:dev::p::command:local:Command::hello", "type": "command:local:Command"}}});
        assert_eq!(render(pre.as_object().unwrap()).as_deref(), Some("+ command:local:Command hello creating"));
        let out = json!({"resOutputsEvent": {"metadata": {"op": "create", "urn": "urn:pulumi:dev::p::command:local:Command::hello", "type": "command:local:Command"}}});
        assert_eq!(render(out.as_object().unwrap()).as_deref(), Some("+ command:local:Command hello created"));
        let same = json!({"resourcePreEvent": {"metadata": {"op": "same", "urn": "u", "type": "t"}}});
        assert_eq!(render(same.as_object().unwrap()), None, "unchanged resources are not listed, as Pulumi's default view");
        let err = json!({"diagnosticEvent": {"severity": "error", "message": "command exited with 3\n"}});
        assert_eq!(render(err.as_object().unwrap()).as_deref(), Some("error: command exited with 3"));
        assert_eq!(render(json!({"diagnosticEvent": {"severity": "debug", "message": "Registering"}}).as_object().unwrap()), None);
        let sum = json!({"summaryEvent": {"resourceChanges": {"create": 2, "same": 1}, "durationSeconds": 3}});
        assert_eq!(render(sum.as_object().unwrap()).as_deref(), Some("Resources: 2 created, 1 unchanged; duration 3 s"));
        assert_eq!(render(json!({"prelude": {}}).as_object().unwrap()), None);
    }
}
