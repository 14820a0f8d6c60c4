//! Plan approval end to end on the test bed (issue 52: `spec.approval.mode: manual`), with the real `pulumi` CLI
//! through the operator and a real agent: a change runs `pulumi preview --save-plan` and waits `AwaitingApproval`;
//! an approval of another plan is refused; `kubectl pko approve` of the pending plan runs `pulumi up --plan` with
//! exactly it; a new config supersedes a pending plan (its id approves nothing, the plugin refuses it too); a program
//! changed on disk between preview and approval fails the constrained `up` with Pulumi's message and the Stack waits
//! for a new plan instead of retrying.

mod common;

use std::time::{Duration, Instant};

use common::*;
use kube::api::{Patch, PatchParams};
use pko_api::approval::PlanState;
use pko_api::{Stack, Update, UpdateType};
use pko_testbed::eventually;
use serde_json::json;

/// The program: one command whose `create` text is the resource's input, so editing it changes what an `up` does.
fn program(text: &str) -> String {
    format!(
        "config:\n  greeting:\n    type: string\nresources:\n  c:\n    type: command:local:Command\n    \
         properties:\n      create: echo {text} ${{greeting}}\noutputs:\n  said: ${{c.stdout}}\n"
    )
}

/// The Stack's plan, when it has one in `state`.
fn plan_in(s: &Stack, state: PlanState) -> Option<pko_api::approval::StackPlan> {
    s.status.as_ref()?.plan.clone().filter(|p| p.state == state)
}

fn awaiting(s: &Stack) -> bool {
    reconciling(s).is_some_and(|(reason, _)| reason == "AwaitingApproval")
}

async fn events_with(ns: &pko_testbed::TestNamespace, reason: &str) -> Vec<String> {
    let api = ns.api::<k8s_openapi::api::events::v1::Event>();
    let events = api.list(&Default::default()).await.unwrap().items;
    events.into_iter().filter(|e| e.reason.as_deref() == Some(reason)).filter_map(|e| e.note).collect()
}

/// Approves `id` with the plugin; its output.
fn approve(ns: &str, id: &str) -> std::process::Output {
    kubectl_pko(&["approve", "stack/gated", "-n", ns, "--plan", id])
}

#[tokio::test]
async fn a_manual_stack_runs_only_the_plan_that_was_approved() {
    let (client, ns, env) = setup("approval").await;
    let dir = project(&env, "gated", &program("one"));
    passphrase_secret(&ns).await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    let stacks = ns.api::<Stack>();
    let updates = ns.api::<Update>();
    create(
        &stacks,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "gated"},
               "spec": {"stack": "dev", "backend": env.backend_url(), "envRefs": passphrase_env_refs(),
                        "config": {"greeting": "hello"}, "approval": {"mode": "manual"},
                        "retryBackoffBaseSeconds": 1, "retryBackoffFactor": 1.0,
                        "workspaceTemplate": {"spec": {"local": {"dir": dir.display().to_string()}}}}}),
    )
    .await;

    // the first change: a preview that saves a plan, and a wait
    eventually("the Stack awaits approval of its first plan", 180, || async {
        let s = stacks.get("gated").await.unwrap();
        awaiting(&s) && plan_in(&s, PlanState::Pending).is_some()
    })
    .await;
    let s = stacks.get("gated").await.unwrap();
    let first = plan_in(&s, PlanState::Pending).unwrap();
    assert!(!ready(&s), "a preview is not a sync");
    assert_eq!(first.change_summary.as_ref().and_then(|c| c.get("create")), Some(&2), "{first:?}");
    let (_, message) = reconciling(&s).unwrap();
    assert!(message.contains(&format!("kubectl pko approve stack/gated --plan {}", first.id)), "{message}");
    let preview = updates.get(&first.update).await.unwrap();
    assert_eq!((preview.spec.update_type, preview.spec.save_plan), (Some(UpdateType::Preview), Some(true)));
    assert_eq!(preview.status.unwrap().plan.as_deref(), Some(first.id.as_str()));
    let out = kubectl_pko(&["plan", "stack/gated", "-n", ns.name(), "--summary"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains(&format!("Plan:       {}", first.id)), "{text}{out:?}");
    assert!(text.contains("State:      Pending") && text.contains("create 2"), "{text}");
    eventually("an event says how to approve it", 30, || async {
        events_with(&ns, "StackApprovalRequired").await.iter().any(|n| n.contains(&first.id))
    })
    .await;

    // an approval naming another plan: refused by the plugin, and by the operator when written directly
    let out = approve(ns.name(), "0123456789abcdef");
    assert!(!out.status.success(), "the plugin refuses another plan");
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("that is plan {}", first.id)));
    let annotate = |id: &str| json!({"metadata": {"annotations": {"pulumi.com/approve-plan": id}}});
    stacks.patch("gated", &PatchParams::default(), &Patch::Merge(annotate("0123456789abcdef"))).await.unwrap();
    eventually("the operator refuses it", 30, || async {
        events_with(&ns, "StackApprovalRefused").await.iter().any(|n| n.contains("0123456789abcdef"))
    })
    .await;
    assert!(awaiting(&stacks.get("gated").await.unwrap()), "still waiting: nothing ran");

    // the approval of the pending plan: the constrained up, at once
    let approved_at = Instant::now();
    let out = approve(ns.name(), &first.id);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let started = loop {
        let list = updates.list(&Default::default()).await.unwrap().items;
        if list.iter().any(|u| u.spec.plan.as_deref() == Some(first.id.as_str())) {
            break approved_at.elapsed();
        }
        assert!(approved_at.elapsed() < Duration::from_secs(30), "no constrained up 30 s after the approval");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!("approval → Update created: {:.2} s", started.as_secs_f64());
    eventually("the approved plan is applied", 120, || async {
        let s = stacks.get("gated").await.unwrap();
        ready(&s) && plan_in(&s, PlanState::Applied).is_some()
    })
    .await;
    let s = stacks.get("gated").await.unwrap();
    let last = s.status.clone().unwrap().last_update.unwrap();
    assert_eq!(last.update_type, Some(UpdateType::Up));
    assert_eq!(s.status.unwrap().outputs.unwrap()["said"], json!("one hello"));

    // a new config supersedes the pending plan: its id approves nothing
    let config = |g: &str| json!({"spec": {"config": {"greeting": g}}});
    stacks.patch("gated", &PatchParams::default(), &Patch::Merge(config("bonjour"))).await.unwrap();
    let second = wait_for_new_plan(&stacks, &first.id).await;
    stacks.patch("gated", &PatchParams::default(), &Patch::Merge(config("hallo"))).await.unwrap();
    let third = wait_for_new_plan(&stacks, &second).await;
    let out = approve(ns.name(), &second);
    assert!(!out.status.success(), "a superseded plan is refused by the plugin");
    stacks.patch("gated", &PatchParams::default(), &Patch::Merge(annotate(&second))).await.unwrap();
    eventually("and by the operator", 30, || async {
        events_with(&ns, "StackApprovalRefused").await.iter().any(|n| n.contains(&second))
    })
    .await;
    assert!(events_with(&ns, "StackPlanSuperseded").await.iter().any(|n| n.contains(&second)));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = stacks.get("gated").await.unwrap();
    assert!(awaiting(&s) && plan_in(&s, PlanState::Pending).is_some_and(|p| p.id == third), "nothing ran");

    // the program changes between preview and approval: the constrained up fails, no retry loop
    std::fs::write(dir.join("Pulumi.yaml"), format!("name: gated\nruntime: yaml\n{}", program("two"))).unwrap();
    let out = approve(ns.name(), &third);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eventually("the constrained up fails on the changed program", 120, || async {
        plan_in(&stacks.get("gated").await.unwrap(), PlanState::Failed).is_some()
    })
    .await;
    let s = stacks.get("gated").await.unwrap();
    let failed = plan_in(&s, PlanState::Failed).unwrap();
    let message = failed.message.clone().unwrap_or_default();
    assert!(message.contains("violates plan"), "Pulumi's message: {message}");
    let up = updates.get(failed.applied_by.as_deref().unwrap()).await.unwrap();
    assert!(up.status.unwrap().message.unwrap_or_default().contains("violates plan"));
    let fourth = wait_for_new_plan(&stacks, &third).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let s = stacks.get("gated").await.unwrap();
    assert!(awaiting(&s), "a new plan waits for approval: the refused up is not retried");
    assert_eq!(plan_in(&s, PlanState::Pending).map(|p| p.id), Some(fourth.clone()));
    let ups = updates.list(&Default::default()).await.unwrap().items;
    let ups = ups.iter().filter(|u| u.spec.update_type == Some(UpdateType::Up)).count();
    assert_eq!(ups, 2, "one up per approval");

    // its new plan, approved, runs the changed program
    assert!(approve(ns.name(), &fourth).status.success());
    eventually("the new plan is applied", 120, || async {
        let s = stacks.get("gated").await.unwrap();
        ready(&s) && plan_in(&s, PlanState::Applied).is_some_and(|p| p.id == fourth)
    })
    .await;
    let s = stacks.get("gated").await.unwrap();
    assert_eq!(s.status.unwrap().outputs.unwrap()["said"], json!("two hallo"));
}

/// Waits until the Stack awaits approval of a plan other than `old`; its id.
async fn wait_for_new_plan(stacks: &kube::Api<Stack>, old: &str) -> String {
    let pending = |s: &Stack| plan_in(s, PlanState::Pending).filter(|p| p.id != old && awaiting(s)).map(|p| p.id);
    eventually("a new plan awaits approval", 120, || async { pending(&stacks.get("gated").await.unwrap()).is_some() })
        .await;
    pending(&stacks.get("gated").await.unwrap()).unwrap_or_default()
}
