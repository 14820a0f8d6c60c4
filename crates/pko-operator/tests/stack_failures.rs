//! End to end on the test bed, failures as PKO v2 reports them:
//! - a failing program: Reconciling `RetryingAfterFailure` between attempts, then Stalled `UpdateFailed`
//!   once the retry limit is reached (no more Updates), until a sync request retries it;
//! - a stack locked by another `pulumi up`: the Update fails `UpdateConflict`, the Stack says so
//!   (lastUpdate message, `StackUpdateConflictDetected` event) and retries, and is Ready once the lock
//!   is gone — with no `pulumi cancel`.

mod common;

use std::time::Duration;

use common::*;
use kube::api::{Patch, PatchParams};
use pko_api::stack::StackUpdateStateMessage;
use pko_api::{Program, Stack, Update};
use pko_testbed::eventually;
use serde_json::json;

fn program(name: &str, create_cmd: &str) -> serde_json::Value {
    json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": name},
           "program": {"resources": {"c": {"type": "command:local:Command", "properties": {"create": create_cmd}}},
               "outputs": {"out": "${c.stdout}"}}})
}

fn stack(name: &str, backend: &str, max_backoff: i64) -> serde_json::Value {
    json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name},
           "spec": {"stack": "dev", "programRef": {"name": name}, "backend": backend,
               "retryMaxBackoffDurationSeconds": max_backoff}})
}

/// Events of `kind` with `reason` in the namespace: `(note, occurrences)` per Event object (an aggregated
/// series counts each occurrence).
async fn events_of(ns: &pko_testbed::TestNamespace, kind: &str, reason: &str) -> Vec<(String, i32)> {
    let events = ns.api::<k8s_openapi::api::events::v1::Event>().list(&Default::default()).await.unwrap();
    events
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some(kind) && e.reason.as_deref() == Some(reason)
        })
        .map(|e| (e.note.unwrap_or_default(), e.series.map(|s| s.count).unwrap_or(1)))
        .collect()
}

#[tokio::test]
async fn failing_program_retries_then_stalls_until_a_sync_request() {
    let (client, ns, env) = setup("fail").await;
    let op = InProcessOperator::start(&client, &env, ns.name()).await;
    create(&ns.api::<Program>(), program("boom", "echo boom >&2; exit 3")).await;
    // a 4 s backoff cap keeps the test short; the retry count and the stall are PKO's
    create(&ns.api::<Stack>(), stack("boom", &env.backend_url(), 4)).await;
    let stacks = ns.api::<Stack>();
    let updates = ns.api::<Update>();

    eventually("the Stack retries after a failure", 90, || async {
        let s = stacks.get("boom").await.unwrap();
        stack_condition(&s, "Reconciling").is_some_and(|(st, r, m)| {
            st == "True" && r == "RetryingAfterFailure" && m.starts_with("0 update failure(s): ")
        }) && stack_condition(&s, "Ready").is_some_and(|(st, r, _)| st == "False" && r == "NotReadyInProgress")
    })
    .await;
    eventually("the Stack stalls with UpdateFailed", 180, || async {
        stack_condition(&stacks.get("boom").await.unwrap(), "Stalled")
            .is_some_and(|(st, r, _)| st == "True" && r == "UpdateFailed")
    })
    .await;
    let s = stacks.get("boom").await.unwrap();
    let (_, _, message) = stack_condition(&s, "Stalled").unwrap();
    let pko = "up failed 3 times; not retrying until the spec or source changes: ";
    assert!(message.starts_with(pko) && message.contains("exit"), "PKO's text, then the last error: {message}");
    assert_eq!(stack_condition(&s, "Ready").map(|c| (c.0, c.1)), Some(("False".into(), "NotReadyStalled".into())));
    let last = s.status.as_ref().and_then(|st| st.last_update.clone()).unwrap();
    assert_eq!((last.state, last.failures), (Some(StackUpdateStateMessage::Failed), Some(3)));
    assert!(
        last.message.as_deref().unwrap_or_default().contains("exit"),
        "the program's error reaches the Stack: {last:?}"
    );
    let failed: Vec<Update> = updates.list(&Default::default()).await.unwrap().items;
    assert_eq!(failed.len(), 4, "one first attempt and three retries");
    assert!(
        failed.iter().all(|u| condition(u, "Failed") == Some(("True".into(), "Unknown".into()))),
        "PKO's reason for an engine failure"
    );
    assert!(
        failed.iter().all(|u| u
            .status
            .as_ref()
            .and_then(|s| s.message.as_deref())
            .is_some_and(|m| m.starts_with("up failed: "))),
        "PKO's message"
    );
    // four failures with the same note: one recorder per controller aggregates them into a series,
    // written as client-go writes series — the second occurrence at once, later ones counted and
    // written at most every 5 minutes (crate::events)
    eventually("StackUpdateFailure became a series (events follow the status write)", 30, || async {
        events_of(&ns, "Stack", "StackUpdateFailure").await.iter().any(|(_, n)| *n >= 2)
    })
    .await;
    let failures = events_of(&ns, "Stack", "StackUpdateFailure").await;
    assert!(failures.len() < 4, "repeated events are aggregated, not one object each: {failures:?}");
    assert!(
        failures.iter().all(|(_, n)| *n <= 2),
        "a third occurrence within 5 minutes is counted, not written: {failures:?}"
    );

    // PKO's metrics say so too, and ours count the failed operations
    let text = op.metrics().await;
    assert!(text.contains(&format!("stacks_failing{{namespace=\"{}\",name=\"boom\"}} 1\n", ns.name())), "{text}");
    assert!(text.contains("\nstacks_active 1\n") && text.contains("\nprograms_active 1\n"), "{text}");
    let failed_ups: f64 = text
        .lines()
        .find(|l| {
            l.starts_with("pko_update_operations_total") && l.contains("result=\"failed\"") && l.contains("type=\"up\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(failed_ups >= 4.0, "{text}");
    assert!(text.contains("pko_update_operation_duration_seconds"), "{text}");
    // controller-runtime's and client-go's series, so PKO's alerts keep working
    for series in [
        "controller_runtime_reconcile_total{controller=\"stack\",result=\"success\"}",
        "controller_runtime_reconcile_time_seconds_count{controller=\"stack\"}",
        "workqueue_work_duration_seconds_count{name=\"stack\"}",
        "workqueue_adds_total{name=\"update\"}",
        "workqueue_depth{name=\"update\"}",
    ] {
        assert!(text.contains(series), "{series} missing:\n{text}");
    }

    // Stalled means no further attempts
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        updates.list(&Default::default()).await.unwrap().items.len(),
        4,
        "a stalled Stack does not retry by itself"
    );

    // a sync request (PKO's reconciliation-request annotation) tries again
    let patch = json!({"metadata": {"annotations": {"pulumi.com/reconciliation-request": "retry-1"}}});
    stacks.patch("boom", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    eventually("a sync request starts a fifth Update", 60, || async {
        updates.list(&Default::default()).await.unwrap().items.len() == 5
    })
    .await;
    eventually("the Stack records the request", 60, || async {
        stacks
            .get("boom")
            .await
            .unwrap()
            .status
            .and_then(|s| s.last_update)
            .and_then(|l| l.reconcile_request)
            .as_deref()
            == Some("retry-1")
    })
    .await;
}

#[tokio::test]
async fn locked_stack_reports_update_conflict_and_recovers_when_the_lock_is_gone() {
    let (client, ns, env) = setup("lock").await;

    // another `pulumi up` of the same project and stack holds the backend lock for ~45 s: longer than the
    // agent waits for a holder on its own host (`--lock-wait-seconds`, 30), so the conflict is reported
    // (retries come after 10 s)
    let dir = env.dir().join("outside");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("Pulumi.yaml"),
        "name: locked\nruntime: yaml\nresources:\n  held:\n    type: command:local:Command\n    properties:\n      \
            create: sleep 45\n",
    )
    .unwrap();
    let init = env.pulumi(&dir).args(["stack", "init", "dev"]).output().unwrap();
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    let mut outside = env
        .pulumi(&dir)
        .args(["up", "--yes", "--skip-preview", "--non-interactive"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let locks = env.dir().join("state").join(".pulumi").join("locks");
    eventually("the outside update holds the lock", 30, || async { !files_under(&locks).is_empty() }).await;

    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    create(&ns.api::<Program>(), program("locked", "echo mine")).await;
    create(&ns.api::<Stack>(), stack("locked", &env.backend_url(), 10)).await;
    let stacks = ns.api::<Stack>();
    let updates = ns.api::<Update>();

    eventually("an Update fails with UpdateConflict after the agent's wait", 90, || async {
        updates
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|u| condition(u, "Failed") == Some(("True".into(), "UpdateConflict".into())))
    })
    .await;
    eventually("the Stack reports the conflict and retries", 30, || async {
        let s = stacks.get("locked").await.unwrap();
        let msg = s
            .status
            .as_ref()
            .and_then(|st| st.last_update.as_ref())
            .and_then(|l| l.message.clone())
            .unwrap_or_default();
        msg.contains("locked")
            && stack_condition(&s, "Reconciling").is_some_and(|(st, r, _)| st == "True" && r == "RetryingAfterFailure")
    })
    .await;
    // the event follows the status write (a pass's effects come after its one write)
    eventually("the StackUpdateConflictDetected event names the lock and the retry", 30, || async {
        events_of(&ns, "Stack", "StackUpdateConflictDetected")
            .await
            .iter()
            .any(|(n, _)| n.contains("holds the stack lock") && n.contains("retrying in 10 s"))
    })
    .await;

    assert!(outside.wait().unwrap().success(), "the outside update finishes");
    eventually("the Stack is Ready once the lock is gone", 120, || async {
        stack_condition(&stacks.get("locked").await.unwrap(), "Ready").is_some_and(|(st, _, _)| st == "True")
    })
    .await;
    let s = stacks.get("locked").await.unwrap().status.unwrap();
    assert_eq!(s.outputs.unwrap()["out"], json!("mine"));
    assert!(files_under(&locks).is_empty(), "no lock is left");
}

/// A Stack with `destroyOnFinalize` in a namespace being deleted: the destroy cannot run there (no
/// Workspace or Update can be created), so the Stack is Stalled `NamespaceTerminating`, keeps its
/// finalizer and says how to let it go.
#[tokio::test]
async fn stack_in_a_terminating_namespace_stalls_with_instructions() {
    let (client, ns, env) = setup("nsterm").await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    create(&ns.api::<Program>(), program("web", "echo up")).await;
    let mut s = stack("web", &env.backend_url(), 10);
    s["spec"]["destroyOnFinalize"] = json!(true);
    create(&ns.api::<Stack>(), s).await;
    let stacks = ns.api::<Stack>();
    eventually("web is Ready", 90, || async {
        stack_condition(&stacks.get("web").await.unwrap(), "Ready").is_some_and(|(s, _, _)| s == "True")
    })
    .await;

    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .delete(ns.name(), &Default::default())
        .await
        .unwrap();
    eventually("web is Stalled NamespaceTerminating", 60, || async {
        stack_condition(&stacks.get("web").await.unwrap(), "Stalled")
            .is_some_and(|(s, r, m)| s == "True" && r == "NamespaceTerminating" && m.contains("remove the finalizer"))
    })
    .await;
    let web = stacks.get("web").await.unwrap();
    assert!(web.metadata.deletion_timestamp.is_some());
    assert!(
        web.metadata.finalizers.unwrap_or_default().iter().any(|f| f == pko_api::constants::STACK_FINALIZER),
        "the finalizer is kept"
    );
    // let it go, as the message says
    stacks
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([{"op": "remove", "path": "/metadata/finalizers"}])).unwrap(),
            ),
        )
        .await
        .unwrap();
    eventually("web is gone", 60, || async { stacks.get_opt("web").await.unwrap().is_none() }).await;
}

/// A Workspace that cannot get an agent (its service account does not exist): the Stack waits, and its
/// Reconciling message says why instead of waiting silently.
#[tokio::test]
async fn a_stack_waiting_for_its_workspace_says_why() {
    let (client, ns, env) = setup("wsfail").await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    create(&ns.api::<Program>(), program("nosa", "echo hi")).await;
    let mut s = stack("nosa", &env.backend_url(), 10);
    s["spec"]["serviceAccountName"] = json!("deployer");
    create(&ns.api::<Stack>(), s).await;
    let stacks = ns.api::<Stack>();
    eventually("the Stack says why its Workspace is not ready", 60, || async {
        stack_condition(&stacks.get("nosa").await.unwrap(), "Reconciling").is_some_and(|(st, r, m)| {
            st == "True"
                && r == "StackProcessing"
                && m.starts_with("waiting for workspace readiness: ConnectionFailed:")
                && m.contains("deployer")
        })
    })
    .await;
    assert!(ns.api::<Update>().list(&Default::default()).await.unwrap().items.is_empty(), "no Update without an agent");
}

/// PKO's Workspace lifecycle, two ways a Workspace stalls and stalls its Stack (`WorkspaceFailed`)
/// without retrying:
/// - a spec this version cannot run (PKO's schema admits any `securityProfile`): Stalled `SpecInvalid`
///   before any Update; mending the spec deploys;
/// - `useLocalStackOnly` on a stack that does not exist: PKO's `SelectStack` fails, the Workspace is
///   Stalled `InitializationFailed` (with PKO's `StackInitializationFailure` event) by the Workspace
///   controller's initialization, before any Update — none at all, as in PKO; deleting it lets go.
#[tokio::test]
async fn a_stalled_workspace_stalls_its_stack_without_retries() {
    let (client, ns, env) = setup("wsstall").await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    let stacks = ns.api::<Stack>();
    let workspaces = ns.api::<pko_api::Workspace>();
    create(&ns.api::<Program>(), program("odd", "echo hi")).await;
    let mut s = stack("odd", &env.backend_url(), 4);
    s["spec"]["envRefs"] = passphrase_env_refs();
    s["spec"]["workspaceTemplate"] = json!({"spec": {"securityProfile": "privileged"}});
    passphrase_secret(&ns).await;
    create(&stacks, s).await;
    eventually("the Stack is Stalled WorkspaceFailed: SpecInvalid", 60, || async {
        stalled(&stacks.get("odd").await.unwrap()).is_some_and(|(r, m)| {
            let want = r#"SpecInvalid: spec.securityProfile: unsupported value "privileged"; "#;
            r == "WorkspaceFailed" && m == format!(r#"{want}one of "baseline" or "restricted""#)
        })
    })
    .await;
    let ws = workspaces.get("odd").await.unwrap();
    assert_eq!(
        ws.not_ready_reason().map(|c| c.reason.as_str()),
        Some("SpecInvalid"),
        "Ready False with the stall's reason"
    );
    assert!(
        ns.api::<Update>().list(&Default::default()).await.unwrap().items.is_empty(),
        "no Update for a spec that cannot run"
    );
    let mend = json!({"spec": {"workspaceTemplate": {"spec": {"securityProfile": "baseline"}}}});
    stacks.patch("odd", &PatchParams::default(), &Patch::Merge(&mend)).await.unwrap();
    eventually("the mended Stack deploys", 120, || async { ready(&stacks.get("odd").await.unwrap()) }).await;
    assert!(workspaces.get("odd").await.unwrap().stalled().is_none(), "the stall is cleared");

    create(&ns.api::<Program>(), program("local-only", "echo hi")).await;
    let mut s = stack("local-only", &env.backend_url(), 4);
    s["spec"]["envRefs"] = passphrase_env_refs();
    s["spec"]["stack"] = json!("never-created");
    s["spec"]["useLocalStackOnly"] = json!(true);
    create(&stacks, s).await;
    eventually("the Stack is Stalled WorkspaceFailed: InitializationFailed", 120, || async {
        stalled(&stacks.get("local-only").await.unwrap()).is_some_and(|(r, m)| {
            r == "WorkspaceFailed" && m.starts_with("InitializationFailed: ") && m.contains("never-created")
        })
    })
    .await;
    let ws = workspaces.get("local-only").await.unwrap();
    assert_eq!(ws.stalled().map(|c| c.reason.as_str()), Some("InitializationFailed"));
    let init = events_of(&ns, "Workspace", "StackInitializationFailure").await;
    assert!(
        init.iter().any(|(note, _)| note.starts_with(r#"Failed to initialize stack "never-created": "#)),
        "PKO's StackInitializationFailure event: {init:?}"
    );
    // the stall is recorded (PKO's event, `Stalled`) before the pass writes `Ready` False: the same pass, two writes
    eventually("the Workspace is Ready False with the stall's reason", 10, || async {
        let ws = workspaces.get("local-only").await.unwrap();
        ws.not_ready_reason().is_some_and(|c| c.reason == "InitializationFailed")
    })
    .await;
    // a 4 s backoff cap: without the stall a retry would have come by now
    tokio::time::sleep(Duration::from_secs(10)).await;
    let tried = ns
        .api::<Update>()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|u| u.spec.stack_name.as_deref() == Some("never-created"))
        .count();
    assert_eq!(tried, 0, "no Update against a Workspace that cannot select its stack (PKO)");
    // nothing ever ran: deleting it does not wait for a destroy
    stacks
        .patch("local-only", &PatchParams::default(), &Patch::Merge(json!({"spec": {"destroyOnFinalize": true}})))
        .await
        .unwrap();
    stacks.delete("local-only", &Default::default()).await.unwrap();
    eventually("the Stack is gone", 60, || async { stacks.get_opt("local-only").await.unwrap().is_none() }).await;
}

/// A program with three failing resources: every error reaches the Update's message (not just the
/// first), the event keeps the first; once mended, the Update's and the Stack's `lastUpdate` change
/// counts say what was created (the `command` stand-in provider).
#[tokio::test]
async fn every_error_of_a_failing_program_reaches_the_update_and_counts_reach_the_stack() {
    let (client, ns, env) = setup("errors").await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    // Pulumi starts no new step after the first failure: each command waits 2 s before failing so that all
    // three have started by then, whatever order the engine registers them in.
    let failing = |i: u32| {
        json!({"type": "command:local:Command",
        "properties": {"create": format!("sleep 2; echo failure-{i} >&2; exit {i}")}})
    };
    let programs = ns.api::<Program>();
    create(
        &programs,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "three"},
        "program": {"resources": {"a": failing(3), "b": failing(4), "c": failing(5),
            "ok": {"type": "command:local:Command", "properties": {"create": "echo fine"}}}}}),
    )
    .await;
    let stacks = ns.api::<Stack>();
    create(&stacks, stack("three", &env.backend_url(), 4)).await;
    eventually("the first Update fails", 120, || async {
        stacks
            .get("three")
            .await
            .unwrap()
            .status
            .and_then(|s| s.last_update)
            .is_some_and(|l| l.state == Some(StackUpdateStateMessage::Failed))
    })
    .await;
    let last = stacks.get("three").await.unwrap().status.unwrap().last_update.unwrap();
    let update = ns.api::<Update>().get(last.name.as_deref().unwrap()).await.unwrap();
    let message = update.status.as_ref().and_then(|s| s.message.clone()).unwrap_or_default();
    for i in 3..=5 {
        assert!(
            message.contains(&format!("failure-{i}")) && message.contains(&format!("exited with {i}")),
            "error {i} in the Update's message: {message}"
        );
    }
    assert!(message.starts_with("up failed: command:local:Command ("), "each error names its resource: {message}");
    assert!(message.len() <= 4096 + 20, "bounded");
    assert_eq!(last.message.as_deref(), Some(message.as_str()), "the Stack's lastUpdate has the same");
    let note = events_of(&ns, "Update", "UpdateFailed").await.into_iter().map(|(n, _)| n).next().unwrap_or_default();
    assert!(
        note.starts_with(r#"Failed to update stack "dev": command:local:Command ("#) && !note.contains('\n'),
        "the event keeps the first error: {note}"
    );

    // a merge patch: b and c removed, a mended
    let mended = json!({"program": {"resources": {"a": {"properties": {"create": "echo a"}}, "b": null, "c": null}}});
    programs.patch("three", &PatchParams::default(), &Patch::Merge(&mended)).await.unwrap();
    eventually("the mended Stack is Ready", 120, || async { ready(&stacks.get("three").await.unwrap()) }).await;
    let last = stacks.get("three").await.unwrap().status.unwrap().last_update.unwrap();
    let counts = last.change_summary.clone().unwrap_or_default();
    assert!(
        counts.get("create").is_some_and(|n| *n >= 1) && counts.get("same").is_some_and(|n| *n >= 1),
        "a created, ok kept, as Pulumi counts them: {counts:?}"
    );
    let update = ns.api::<Update>().get(last.name.as_deref().unwrap()).await.unwrap();
    assert_eq!(update.status.and_then(|s| s.change_summary), Some(counts), "as its Update's status.changeSummary");
}

/// PKO #1292: a `status.currentUpdate` naming an Update that no longer exists must not wedge the Stack.
/// It is cleared, the Stack is Ready again, and no update runs for it.
#[tokio::test]
async fn a_dangling_current_update_heals() {
    let (client, ns, env) = setup("heal").await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    create(&ns.api::<Program>(), program("heal", "echo ok")).await;
    create(&ns.api::<Stack>(), stack("heal", &env.backend_url(), 10)).await;
    let stacks = ns.api::<Stack>();
    let ready =
        || async { stack_condition(&stacks.get("heal").await.unwrap(), "Ready").is_some_and(|(s, _, _)| s == "True") };
    eventually("heal is Ready", 90, ready).await;
    // as if the operator had written currentUpdate and died before creating the Update: its own field
    // manager writes the whole status with a reference to an Update that does not exist
    let mut status = serde_json::to_value(stacks.get("heal").await.unwrap().status.unwrap()).unwrap();
    status["currentUpdate"] = json!({"name": "heal-gone", "generation": 1, "commit": "1"});
    let patch = json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "status": status});
    // the write's own response: a read after it may already see the operator's repair (the status
    // change is an event of its own, and the controller may clear it within milliseconds)
    let written = stacks
        .patch_status(
            "heal",
            &PatchParams::apply(pko_api::constants::field_manager::STACK_STATUS).force(),
            &Patch::Apply(&patch),
        )
        .await
        .unwrap();
    assert!(written.status.unwrap().current_update.is_some());
    // wake the controller in case that event did not
    let poke = json!({"metadata": {"annotations": {"test/poke": "1"}}});
    stacks.patch("heal", &PatchParams::default(), &Patch::Merge(&poke)).await.unwrap();
    eventually("the dangling currentUpdate is cleared and heal is Ready", 60, || async {
        let s = stacks.get("heal").await.unwrap();
        s.status.as_ref().is_some_and(|st| st.current_update.is_none())
            && stack_condition(&s, "Ready").is_some_and(|(st, _, _)| st == "True")
    })
    .await;
    assert_eq!(
        ns.api::<Update>().list(&Default::default()).await.unwrap().items.len(),
        1,
        "only the first update ever ran"
    );
}
