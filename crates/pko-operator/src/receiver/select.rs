//! Which Stacks a delivery wakes, and whether each still needs asking. A Stack is woken when the Receiver selects it
//! (`spec.resources`: the Stack by name or labels, or its Program by name, in the Receiver's namespace only) and, for a
//! push, it tracks the pushed branch of the pushed repository and is not already at (or running) the pushed commit;
//! a generic delivery wakes every selected Stack. The request is PKO's `pulumi.com/reconciliation-request`, valued by
//! the revision (or the delivery time), and not made again when the Stack carries that value ([`needs_request`]): a
//! flood of deliveries of one push costs one sync per Stack, while a newer push is asked for even when the older one's
//! request is still unseen. Pure.

use pko_api::Stack;
use pko_api::constants::{PUSH_REQUEST_PREFIX, RECONCILE_REQUEST_ANNOTATION};
use pko_api::receiver::{Receiver, ReceiverResource};

use super::payload::{Push, moves};

/// The Receiver's resource list refused (Stalled), or `None` when every entry can be served.
pub fn refused_resource(receiver: &Receiver) -> Option<String> {
    let ns = receiver.metadata.namespace.as_deref().unwrap_or_default();
    receiver.spec.resources.iter().enumerate().find_map(|(i, r)| {
        if !matches!(r.kind.as_str(), "Stack" | "Program") {
            return Some(format!("spec.resources[{i}].kind: {:?} is not Stack or Program", r.kind));
        }
        if r.namespace.as_deref().is_some_and(|n| n != ns) {
            return Some(format!(
                "spec.resources[{i}].namespace: a Receiver wakes only Stacks of its own namespace {ns}"
            ));
        }
        if r.name.is_none() && r.match_labels.is_none() {
            return Some(format!("spec.resources[{i}]: name or matchLabels is required"));
        }
        None
    })
}

/// Whether entry `r` names `stack` (through its Program for `kind: Program`).
fn names(r: &ReceiverResource, stack: &Stack) -> bool {
    let labels_match = r.match_labels.as_ref().is_none_or(|want| {
        let have = stack.metadata.labels.as_ref();
        want.iter().all(|(k, v)| have.and_then(|l| l.get(k)) == Some(v))
    });
    let name_matches = |name: &str| r.name.as_deref().is_none_or(|n| n == "*" || n == name);
    match r.kind.as_str() {
        "Stack" => name_matches(stack.metadata.name.as_deref().unwrap_or_default()) && labels_match,
        "Program" => stack.spec.program_ref.as_ref().is_some_and(|p| name_matches(&p.name)) && r.match_labels.is_none(),
        _ => false,
    }
}

/// Whether `receiver` selects `stack` and `push` (none: a generic delivery) concerns it. Stacks of another namespace
/// never.
pub fn wakes(receiver: &Receiver, stack: &Stack, push: Option<&Push>) -> bool {
    if stack.metadata.namespace != receiver.metadata.namespace
        || !receiver.spec.resources.iter().any(|r| names(r, stack))
    {
        return false;
    }
    let Some(push) = push else { return true };
    let (Some(repo), Some(branch)) = (stack.spec.project_repo.as_deref(), stack.spec.branch.as_deref()) else {
        return false;
    };
    moves(push, repo, branch) && !already_at(stack, push.revision.as_deref())
}

/// Whether `stack` ran, or runs, `revision` already.
fn already_at(stack: &Stack, revision: Option<&str>) -> bool {
    let Some(rev) = revision else { return false };
    let status = stack.status.as_ref();
    let last = status.and_then(|s| s.last_update.as_ref()).and_then(|u| u.last_successful_commit.as_deref());
    let current = status.and_then(|s| s.current_update.as_ref()).and_then(|u| u.commit.as_deref());
    last == Some(rev) || current == Some(rev)
}

/// Whether `stack` carries a sync request it has not seen yet.
fn pending(stack: &Stack) -> bool {
    let asked = stack.metadata.annotations.as_ref().and_then(|a| a.get(RECONCILE_REQUEST_ANNOTATION));
    let seen = stack.status.as_ref().and_then(|s| s.observed_reconcile_request.as_ref());
    asked.is_some() && asked != seen
}

/// Whether `stack` must be asked to sync with request `value`: not when it carries `value` already (a flood of one
/// push's deliveries is one request); a revision-valued request (`push-<revision>`) always otherwise — a pending
/// request for an older commit may be in a pass that listed the branch before this push, so it cannot stand for
/// this one; a generic delivery's (`hook-<ms>`) not while the Stack has an earlier request still unseen (it lists
/// the branch head when it sees it).
pub fn needs_request(stack: &Stack, value: &str) -> bool {
    let current = stack.metadata.annotations.as_ref().and_then(|a| a.get(RECONCILE_REQUEST_ANNOTATION));
    current.map(String::as_str) != Some(value) && (value.starts_with(PUSH_REQUEST_PREFIX) || !pending(stack))
}

/// The request's value: `push-<revision>` for a push naming one, else `hook-<delivery time in ms>`.
pub fn request_value(push: Option<&Push>, now_ms: u128) -> String {
    match push.and_then(|p| p.revision.as_deref()) {
        Some(rev) => format!("{PUSH_REQUEST_PREFIX}{rev}"),
        None => format!("hook-{now_ms}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn receiver(resources: serde_json::Value) -> Receiver {
        serde_json::from_value(json!({"apiVersion": "pulumi.com/v1alpha1", "kind": "Receiver",
            "metadata": {"name": "r", "namespace": "team"},
            "spec": {"type": "github", "secretRef": {"name": "s"}, "resources": resources}}))
        .unwrap()
    }

    fn stack(name: &str, ns: &str, spec: serde_json::Value, status: serde_json::Value) -> Stack {
        serde_json::from_value(json!({"apiVersion": "pulumi.com/v1", "kind": "Stack",
            "metadata": {"name": name, "namespace": ns, "labels": {"tier": "web"}},
            "spec": spec, "status": status}))
        .unwrap()
    }

    fn main_push(rev: &str) -> Push {
        Push {
            urls: vec!["https://git.example/a/app.git".into()],
            branch: Some("main".into()),
            revision: Some(rev.into()),
        }
    }

    #[test]
    fn a_push_wakes_the_selected_stacks_of_its_repository_and_branch_in_the_receiver_s_namespace_only() {
        let r = receiver(json!([{"kind": "Stack", "name": "*", "matchLabels": {"tier": "web"}}]));
        let git = json!({"stack": "dev", "projectRepo": "git@git.example:a/app", "branch": "main"});
        let push = main_push("c2");
        assert!(wakes(&r, &stack("a", "team", git.clone(), json!({})), Some(&push)));
        assert!(!wakes(&r, &stack("a", "other", git.clone(), json!({})), Some(&push)), "another namespace");
        let dev = json!({"stack": "dev", "projectRepo": "https://git.example/a/app", "branch": "dev"});
        assert!(!wakes(&r, &stack("b", "team", dev, json!({})), Some(&push)), "another branch");
        let at = json!({"lastUpdate": {"lastSuccessfulCommit": "c2"}});
        assert!(!wakes(&r, &stack("c", "team", git.clone(), at), Some(&push)), "already at the pushed commit");
        let prog = json!({"stack": "dev", "programRef": {"name": "p"}});
        assert!(!wakes(&r, &stack("d", "team", prog.clone(), json!({})), Some(&push)), "a push moves no Program");
        assert!(wakes(&r, &stack("d", "team", prog.clone(), json!({})), None), "a generic delivery wakes it");
        let by_program = receiver(json!([{"kind": "Program", "name": "p"}]));
        assert!(wakes(&by_program, &stack("d", "team", prog, json!({})), None));
        assert!(!wakes(&by_program, &stack("a", "team", git, json!({})), None), "not selected");
    }

    #[test]
    fn a_request_is_made_once_per_push_and_a_generic_one_not_while_another_is_pending() {
        let mut s = stack("a", "team", json!({"stack": "dev"}), json!({"observedReconcileRequest": "push-c1"}));
        assert!(!pending(&s));
        assert!(needs_request(&s, "hook-9"));
        s.metadata.annotations = Some([(RECONCILE_REQUEST_ANNOTATION.to_string(), "push-c2".into())].into());
        assert!(pending(&s));
        assert!(!needs_request(&s, "push-c2"), "the same push again");
        assert!(needs_request(&s, "push-c3"), "a newer push while c2 is pending");
        assert!(!needs_request(&s, "hook-9"), "a generic delivery while c2 is pending");
        assert_eq!(request_value(Some(&main_push("c3")), 5), "push-c3");
        assert_eq!(request_value(None, 5), "hook-5");
        let r = receiver(json!([{"kind": "Stack", "name": "a", "namespace": "elsewhere"}]));
        assert!(refused_resource(&r).unwrap().contains("own namespace team"));
        assert!(refused_resource(&receiver(json!([{"kind": "Pod", "name": "a"}]))).unwrap().contains("kind"));
        assert_eq!(refused_resource(&receiver(json!([{"kind": "Stack", "name": "a"}]))), None);
    }
}
