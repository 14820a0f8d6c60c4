//! `kubectl pko status [STACK] [-n NS | -A] [-o json|yaml]`: per Stack, what a platform team asks first — is it
//! Ready, and if not why (the Stack's own `Ready`/`Reconciling`/`Stalled` reason and message, the queue's `Queued`
//! reason of its running Update), its revision, its last and current operation, its shard and the replica holding that
//! shard (the shard Lease), the pool its Workspace runs on, a queued Update's place in its namespace's queue (`Queued
//! #n`: the namespace's queued Updates, oldest first, as each replica starts them; its Update's message says why: the
//! namespace's share or the workspace class's limit) and the agent running it (`-o wide`: the Update's `Progressing`
//! message, `running on agent <address>`), and its drift detection (`-o wide`: `DriftDetected`, which says when a due
//! check waits for a fleet-wide slot). Read with the caller's own kubeconfig and rights (`list` Stacks, Updates,
//! Workspaces, Leases).

use serde::Serialize;
use serde_json::Value;

/// One Stack's line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `True`, `False` or `Unknown` (the `Ready` condition).
    pub ready: String,
    /// The reason that says why: `Stalled`'s when stalled, else `Reconciling`'s, else `Ready`'s.
    pub reason: String,
    /// Its message.
    pub message: String,
    /// The last successful commit (or the one being applied), shortened to 12 characters.
    pub revision: String,
    /// The last finished Update and its state: `<name> (succeeded)`.
    pub last: String,
    /// The running Update and where it is: `<name> (Progressing)`, `<name> (Queued)`.
    pub current: String,
    /// The shard (label `pulumi.com/shard`), empty outside a fleet.
    pub shard: String,
    /// The replica holding that shard (its Lease's holder).
    pub owner: String,
    /// The agent pool of its Workspace (`status.pool`), empty for a Workspace's own agent.
    pub pool: String,
    /// The agent running its current Update (its gRPC address), empty when none runs.
    pub agent: String,
    /// Its scheduled drift detection: the `DriftDetected` condition as `<reason>: <message>` (a check waiting for a
    /// fleet-wide slot says so), empty without one.
    pub drift: String,
}

/// Whether Update `u` (JSON) waits in the queue (`Progressing=False`, reason `Queued`).
fn queued(u: &Value) -> bool {
    condition(u, "Progressing").is_some_and(|c| c["status"] == "False" && c["reason"] == "Queued")
}

/// The 1-based place of Update `current` among the queued Updates of its namespace in `updates`, oldest first (creation
/// time, then name); `None` when it is not queued. Pure.
pub fn queue_position(updates: &[Value], current: &Value) -> Option<usize> {
    if !queued(current) {
        return None;
    }
    let key = |u: &Value| (s(&u["metadata"]["creationTimestamp"]), s(&u["metadata"]["name"]));
    let ns = &current["metadata"]["namespace"];
    Some(1 + updates.iter().filter(|u| u["metadata"]["namespace"] == *ns && queued(u) && key(u) < key(current)).count())
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// The condition `type_` of object `o`.
fn condition<'a>(o: &'a Value, type_: &str) -> Option<&'a Value> {
    o["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

/// The line of Stack `stack` (JSON), with its running Update `current` (if any) and its place in the queue (`position`,
/// [`queue_position`]), the holder of its shard `owner` and its Workspace's pool `pool`. Pure.
pub fn row(
    stack: &Value,
    current: Option<&Value>,
    position: Option<usize>,
    owner: Option<&str>,
    pool: Option<&str>,
) -> Row {
    let ready = condition(stack, "Ready");
    let why =
        ["Stalled", "Reconciling"].iter().filter_map(|t| condition(stack, t)).find(|c| c["status"] == "True").or(ready);
    let last = &stack["status"]["lastUpdate"];
    let revision =
        [&last["lastSuccessfulCommit"], &stack["status"]["currentUpdate"]["commit"], &last["lastAttemptedCommit"]]
            .into_iter()
            .map(s)
            .find(|c| !c.is_empty())
            .unwrap_or_default();
    let agent = current
        .and_then(|u| condition(u, "Progressing"))
        .filter(|c| c["status"] == "True")
        .and_then(|c| c["message"].as_str()?.strip_prefix("running on agent ").map(str::to_string))
        .unwrap_or_default();
    let current = current.map(|u| {
        let state = ["Complete", "Progressing"]
            .iter()
            .filter_map(|t| condition(u, t))
            .find(|c| c["status"] == "True")
            .map(|c| s(&c["type"]));
        let state =
            state.or_else(|| condition(u, "Progressing").map(|c| s(&c["reason"]))).unwrap_or_else(|| "Pending".into());
        let place = position.map(|p| format!(" #{p}")).unwrap_or_default();
        format!("{} ({state}{place})", s(&u["metadata"]["name"]))
    });
    Row {
        namespace: s(&stack["metadata"]["namespace"]),
        name: s(&stack["metadata"]["name"]),
        ready: ready.map(|c| s(&c["status"])).unwrap_or_else(|| "Unknown".into()),
        reason: why.map(|c| s(&c["reason"])).unwrap_or_default(),
        message: why.map(|c| s(&c["message"])).unwrap_or_default(),
        revision: revision.chars().take(12).collect(),
        last: if last.is_null() { String::new() } else { format!("{} ({})", s(&last["name"]), s(&last["state"])) },
        current: current.unwrap_or_default(),
        shard: s(&stack["metadata"]["labels"]["pulumi.com/shard"]),
        owner: owner.unwrap_or_default().to_string(),
        pool: pool.unwrap_or_default().to_string(),
        agent,
        drift: condition(stack, "DriftDetected")
            .map(|c| format!("{}: {}", s(&c["reason"]), s(&c["message"])))
            .unwrap_or_default(),
    }
}

/// `rows` as kubectl prints a table: upper-case headers, columns padded by three spaces, `<none>` for an empty cell;
/// `all_namespaces` adds NAMESPACE first; `wide` adds MESSAGE last. Pure.
pub fn table(rows: &[Row], all_namespaces: bool, wide: bool) -> String {
    let mut header = vec!["NAME", "READY", "REASON", "REVISION", "LAST", "CURRENT", "SHARD", "OWNER", "POOL"];
    if all_namespaces {
        header.insert(0, "NAMESPACE");
    }
    if wide {
        header.extend(["AGENT", "DRIFT", "MESSAGE"]);
    }
    let cells = |r: &Row| {
        let mut c = vec![&r.name, &r.ready, &r.reason, &r.revision, &r.last, &r.current, &r.shard, &r.owner, &r.pool];
        if all_namespaces {
            c.insert(0, &r.namespace);
        }
        if wide {
            c.extend([&r.agent, &r.drift, &r.message]);
        }
        c.into_iter().map(|v| if v.is_empty() { "<none>".to_string() } else { v.clone() }).collect::<Vec<_>>()
    };
    let lines: Vec<Vec<String>> =
        std::iter::once(header.iter().map(|h| h.to_string()).collect()).chain(rows.iter().map(cells)).collect();
    let widths: Vec<usize> =
        (0..header.len()).map(|i| lines.iter().map(|l| l[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for l in &lines {
        let cols: Vec<String> = l
            .iter()
            .enumerate()
            .map(|(i, c)| if i + 1 == l.len() { c.clone() } else { format!("{c:<w$}", w = widths[i]) })
            .collect();
        out.push_str(cols.join("   ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stack() -> Value {
        json!({"metadata": {"namespace": "team-a", "name": "web", "labels": {"pulumi.com/shard": "7"}},
               "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "NotReady", "message": ""},
                                          {"type": "Stalled", "status": "True", "reason": "UpdateCanceled",
                                              "message": "update canceled by request"},
                                          {"type": "Reconciling", "status": "False", "reason": "x", "message": ""}],
                          "lastUpdate": {"name": "web-1", "state": "failed",
                              "lastSuccessfulCommit": "0123456789abcdef"}}})
    }

    #[test]
    fn a_row_says_why_and_where() {
        let queued = |name: &str, ns: &str, t: &str| {
            json!({"metadata": {"name": name, "namespace": ns,
            "creationTimestamp": t}, "status": {"conditions": [{"type": "Progressing", "status": "False",
                "reason": "Queued"}]}})
        };
        let u = queued("web-2", "team-a", "2026-11-26T10:00:05Z");
        let all = [
            queued("a", "team-a", "2026-11-26T10:00:01Z"),
            queued("b", "team-b", "2026-11-26T10:00:00Z"),
            u.clone(),
            queued("z", "team-a", "2026-11-26T10:00:09Z"),
        ];
        assert_eq!(queue_position(&all, &u), Some(2), "one older queued Update in its namespace");
        let r = row(&stack(), Some(&u), queue_position(&all, &u), Some("replica-1"), Some("pool-abc"));
        assert_eq!(
            (r.ready.as_str(), r.reason.as_str(), r.message.as_str()),
            ("False", "UpdateCanceled", "update canceled by request")
        );
        assert_eq!(
            (r.revision.as_str(), r.last.as_str(), r.current.as_str()),
            ("0123456789ab", "web-1 (failed)", "web-2 (Queued #2)")
        );
        assert_eq!((r.shard.as_str(), r.owner.as_str(), r.pool.as_str()), ("7", "replica-1", "pool-abc"));
        let running = json!({"metadata": {"name": "web-3"}, "status": {"conditions": [{"type": "Progressing",
            "status": "True", "reason": "Progressing", "message": "running on agent 127.0.0.1:4000"}]}});
        assert_eq!(queue_position(&all, &running), None);
        let r = row(&stack(), Some(&running), None, None, None);
        assert_eq!((r.current.as_str(), r.agent.as_str()), ("web-3 (Progressing)", "127.0.0.1:4000"));
        assert!(table(&[r], false, true).lines().nth(1).is_some_and(|l| l.contains("127.0.0.1:4000")));
        let mut drifting = stack();
        drifting["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "DriftDetected", "status": "False", "reason": "NoChanges",
                "message": "no drift (a check is due and waits for a drift-check slot)"}));
        assert_eq!(
            row(&drifting, None, None, None, None).drift,
            "NoChanges: no drift (a check is due and waits for a drift-check slot)"
        );
        let bare = row(&json!({"metadata": {"name": "new"}}), None, None, None, None);
        assert_eq!(
            (bare.ready.as_str(), bare.last.as_str(), bare.current.as_str(), bare.drift.as_str()),
            ("Unknown", "", "", "")
        );
    }

    #[test]
    fn the_table_is_printed_as_kubectl_prints_one() {
        let r = row(&stack(), None, None, Some("replica-1"), None);
        let t = table(&[r], true, false);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("NAMESPACE   NAME   READY   REASON"), "{t}");
        assert!(lines[1].starts_with("team-a      web    False   UpdateCanceled"), "{t}");
        assert!(lines[1].ends_with("<none>"), "an empty cell: {t}");
    }
}
