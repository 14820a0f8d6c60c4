//! `kubectl pko receivers [-A]`: each Receiver's webhook path, readiness, and its last accepted delivery — when, the
//! result, the revision and the Stacks it woke — from the Receivers' status (one LIST).

use serde_json::Value;

/// One row per Receiver: namespace (with `all`), name, ready, path, last delivery's time, result, revision (12
/// characters) and woken Stacks (comma-separated). Pure.
pub fn table(receivers: &[Value], all: bool) -> String {
    let mut rows =
        vec![["NAMESPACE", "NAME", "READY", "PATH", "LAST DELIVERY", "RESULT", "REVISION", "STACKS"].map(String::from)];
    for r in receivers {
        let text = |p: &str| r.pointer(p).and_then(Value::as_str).unwrap_or("<none>").to_string();
        let ready = r
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
            .map_or("Unknown".to_string(), |c| {
                let reason = c["reason"].as_str().unwrap_or_default();
                if c["status"] == "True" { "True".into() } else { format!("False ({reason})") }
            });
        let stacks: Vec<&str> = r
            .pointer("/status/lastDelivery/stacks")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let revision: String = text("/status/lastDelivery/revision").chars().take(12).collect();
        rows.push([
            text("/metadata/namespace"),
            text("/metadata/name"),
            ready,
            text("/status/webhookPath"),
            text("/status/lastDelivery/time"),
            text("/status/lastDelivery/result"),
            revision,
            if stacks.is_empty() { "<none>".into() } else { stacks.join(",") },
        ]);
    }
    let skip = usize::from(!all);
    let widths: Vec<usize> = (0..8).map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0)).collect();
    rows.iter()
        .map(|r| (skip..8).map(|i| format!("{:w$}", r[i], w = widths[i])).collect::<Vec<_>>().join("   "))
        .map(|l| l.trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_receiver_shows_its_path_and_last_delivery() {
        let r = json!({"metadata": {"name": "pushes", "namespace": "team"},
            "status": {"webhookPath": "/hook/abc", "conditions": [{"type": "Ready", "status": "True"}],
                "lastDelivery": {"time": "T", "result": "synced", "revision": "0123456789abcdef",
                    "stacks": ["a", "b"]}}});
        let stalled = json!({"metadata": {"name": "broken", "namespace": "team"},
            "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "SecretNotFound"}]}});
        let t = table(&[r, stalled], false);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("NAME") && lines[1].contains("/hook/abc") && lines[1].contains("0123456789ab "));
        assert!(lines[1].contains("synced") && lines[1].ends_with("a,b"), "{t}");
        assert!(lines[2].contains("False (SecretNotFound)") && lines[2].contains("<none>"), "{t}");
        assert!(table(&[], true).starts_with("NAMESPACE"));
    }
}
