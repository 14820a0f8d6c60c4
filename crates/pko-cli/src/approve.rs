//! `kubectl pko approve stack/<name> --plan <id>` and `kubectl pko plan stack/<name>`: plan approval
//! (`spec.approval.mode: manual`). `approve` sets the annotation `pulumi.com/approve-plan` to the id, with the caller's
//! own rights (`patch` on `stacks.pulumi.com`), only when that plan is the one the Stack waits on; `plan` shows the
//! Stack's plan (`status.plan`) and the preview that saved it.

/// The annotation whose value approves the Stack's pending plan (the operator's `APPROVE_PLAN_ANNOTATION`).
pub const APPROVE_PLAN: &str = "pulumi.com/approve-plan";

/// Whether `id` may approve the plan of `stack` (a Stack as JSON): it is the pending plan's id. `Err`: why not, with
/// what the Stack waits on. Pure.
pub fn check(stack: &serde_json::Value, id: &str) -> Result<(), String> {
    let name = stack["metadata"]["name"].as_str().unwrap_or_default();
    let plan = &stack["status"]["plan"];
    let (pending, state) = (plan["id"].as_str(), plan["state"].as_str().unwrap_or_default());
    match (pending, state) {
        (Some(p), "Pending") if p == id => Ok(()),
        (Some(p), "Pending") => Err(format!("plan {id} is not the plan stack/{name} waits on: that is plan {p}")),
        (Some(p), _) if p == id => {
            Err(format!("plan {id} of stack/{name} is {state}, not pending: nothing to approve"))
        }
        _ if stack["spec"]["approval"]["mode"] != "manual" => {
            Err(format!("stack/{name} does not wait for approvals (spec.approval.mode is not manual)"))
        }
        _ => Err(format!("no plan of stack/{name} waits for approval (plan {id} is superseded or unknown)")),
    }
}

/// The Stack's plan (`status.plan` of `stack`, as JSON) in a few lines: id, state, what it changes, what it was made
/// from, the Update that saved it; `None` when the Stack has none. Pure.
pub fn describe(stack: &serde_json::Value) -> Option<String> {
    let plan = stack["status"].get("plan").filter(|p| p.is_object())?;
    let s = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_string();
    let changes: Vec<String> = plan["changeSummary"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(op, n)| op.as_str() != "same" && n.as_i64().unwrap_or(0) > 0)
        .map(|(op, n)| format!("{op} {n}"))
        .collect();
    let mut out = vec![
        format!("Plan:       {}", s(&plan["id"])),
        format!("State:      {}", s(&plan["state"])),
        format!("Changes:    {}", if changes.is_empty() { "none".to_string() } else { changes.join(", ") }),
        format!("Saved:      {} by Update {}", s(&plan["createdAt"]), s(&plan["update"])),
        format!("Made for:   generation {}, revision {}", plan["generation"], s(&plan["commit"])),
    ];
    if let Some(m) = plan["message"].as_str() {
        out.push(format!("Message:    {m}"));
    }
    if let Some(u) = plan["appliedBy"].as_str() {
        out.push(format!("Applied by: Update {u}"));
    }
    if plan["state"] == "Pending" {
        let name = s(&stack["metadata"]["name"]);
        out.push(format!("Approve:    kubectl pko approve stack/{name} --plan {}", s(&plan["id"])));
    }
    Some(out.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stack(state: &str, id: &str) -> serde_json::Value {
        json!({"metadata": {"name": "web"}, "spec": {"approval": {"mode": "manual"}},
               "status": {"plan": {"id": id, "state": state, "update": "web-1a", "generation": 2, "commit": "abc",
                                   "changeSummary": {"create": 1, "same": 3}}}})
    }

    #[test]
    fn only_the_pending_plan_is_approved() {
        assert!(check(&stack("Pending", "aaaa"), "aaaa").is_ok());
        let other = check(&stack("Pending", "bbbb"), "aaaa").unwrap_err();
        assert!(other.contains("that is plan bbbb"), "{other}");
        let done = check(&stack("Applied", "aaaa"), "aaaa").unwrap_err();
        assert!(done.contains("is Applied, not pending"), "{done}");
        let auto = check(&json!({"metadata": {"name": "web"}, "spec": {}}), "aaaa").unwrap_err();
        assert!(auto.contains("does not wait for approvals"), "{auto}");
        assert!(check(&stack("Superseded", "bbbb"), "aaaa").unwrap_err().contains("superseded or unknown"));
    }

    #[test]
    fn the_plan_is_described_with_how_to_approve_it() {
        let text = describe(&stack("Pending", "aaaa")).unwrap();
        assert!(text.contains("Changes:    create 1"), "{text}");
        assert!(text.contains("kubectl pko approve stack/web --plan aaaa"), "{text}");
        assert!(!describe(&stack("Applied", "aaaa")).unwrap().contains("Approve:"));
        assert_eq!(describe(&json!({"metadata": {"name": "web"}, "status": {}})), None);
    }
}
