//! An operation's limits against the real API server, agent and `pulumi` (issue "Operate it"): PKO's
//! idle timeout (`--update-idle-timeout`, `Update.spec.idleTimeout`, PKO PR #1296) and our overall
//! deadline (`Stack.spec.operationTimeoutSeconds` → `Update.spec.timeout`). A limit reached stops the
//! operation on its agent (Ctrl-C) and ends the Update `Failed` with the limit's reason and message;
//! the Stack records the failure; no backend lock is left.

mod common;

use std::time::{Duration, Instant};

use common::*;
use pko_api::{Stack, Update};
use pko_testbed::eventually;
use serde_json::json;

/// Waits for the first Update of Stack `stack` to fail; returns it and how long it ran.
async fn failed_update(updates: &kube::Api<Update>, stack: &str) -> Update {
    let found = std::sync::Arc::new(std::sync::Mutex::new(None));
    eventually(&format!("an Update of {stack} failed"), 120, || async {
        let all = updates.list(&Default::default()).await.unwrap().items;
        let u = all.into_iter().find(|u| {
            u.spec.workspace_name.as_deref() == Some(stack) && condition(u, "Failed").is_some_and(|c| c.0 == "True")
        });
        let done = u.is_some();
        *found.lock().unwrap() = u;
        done
    })
    .await;
    found.lock().unwrap().take().unwrap()
}

/// Stack `name` (also its stack name) of Program `prog` ([`passphrase_and_program`]) with `extra` spec fields.
async fn stack_of(ns: &pko_testbed::TestNamespace, env: &pko_testbed::PulumiEnv, name: &str, extra: serde_json::Value) {
    let mut spec = json!({"stack": name, "programRef": {"name": "prog"}, "backend": env.backend_url(),
        "envRefs": passphrase_env_refs()});
    spec.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    create(
        &ns.api::<Stack>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name}, "spec": spec}),
    )
    .await;
}

fn ran_for(u: &Update) -> Duration {
    let st = u.status.as_ref().unwrap();
    let (start, end) = (st.start_time.as_ref().unwrap().0, st.end_time.as_ref().unwrap().0);
    Duration::try_from(end.duration_since(start)).unwrap()
}

#[tokio::test]
async fn a_silent_operation_past_its_idle_timeout_and_a_long_one_past_its_deadline_are_stopped() {
    let (client, ns, env) = setup("limits").await;
    // a program that prints nothing for 120 s
    passphrase_and_program(
        &ns,
        json!({"resources": {"wait": {"type": "command:local:Command", "properties": {"create": "sleep 120"}}}}),
    )
    .await;
    let op =
        InProcessOperator::start_with(&client, &env, run_args_with(&env, ns.name(), &["--update-idle-timeout", "6s"]))
            .await;
    let t0 = Instant::now();
    // the operator's idle timeout (6 s); the second one's deadline (8 s) with its idle timeout off
    stack_of(&ns, &env, "idle", json!({})).await;
    stack_of(
        &ns,
        &env,
        "deadline",
        json!({"operationTimeoutSeconds": 8, "updateTemplate": {"spec": {"idleTimeout": "0s"}}}),
    )
    .await;

    let updates = ns.api::<Update>();
    let idle = failed_update(&updates, "idle").await;
    let deadline = failed_update(&updates, "deadline").await;
    eprintln!(
        "stopped after {:?} (idle 6 s) and {:?} (deadline 8 s); both failed {:?} after the start",
        ran_for(&idle),
        ran_for(&deadline),
        t0.elapsed()
    );
    let failed = |u: &Update| {
        u.status.as_ref().unwrap().conditions.as_ref().unwrap().iter().find(|c| c.type_ == "Failed").cloned().unwrap()
    };
    assert_eq!(failed(&idle).reason, "IdleTimeout");
    assert_eq!(
        idle.status.as_ref().unwrap().message.as_deref(),
        Some("The update produced no output for 6s and was stopped (CTRL-C on its agent).")
    );
    assert_eq!(failed(&deadline).reason, "DeadlineExceeded");
    assert_eq!(deadline.spec.timeout.as_deref(), Some("8s"));
    assert!(deadline.status.as_ref().unwrap().message.as_deref().unwrap().contains("longer than its timeout of 8s"));
    for u in [&idle, &deadline] {
        assert!(
            ran_for(u) < Duration::from_secs(60),
            "stopped, not waited out (the program sleeps 120 s): {:?}",
            ran_for(u)
        );
    }
    // the stopped `pulumi` left no lock (checked before a retry, 10 s after a failure, takes one)
    let locks = files_under(&env.dir().join("state").join(".pulumi").join("locks"));
    assert!(locks.is_empty(), "no lock is left: {locks:?}");
    // the Stacks record the failure
    let stacks = ns.api::<Stack>();
    eventually("both Stacks record the failed update", 60, || async {
        let all = stacks.list(&Default::default()).await.unwrap().items;
        all.iter().all(|s| {
            s.status.as_ref().and_then(|st| st.last_update.as_ref()).and_then(|l| l.state)
                == Some(pko_api::stack::StackUpdateStateMessage::Failed)
        })
    })
    .await;
    for s in ["idle", "deadline"] {
        let _ = stacks.delete(s, &Default::default()).await;
    }
    eventually("the Stacks are gone", 120, || async {
        stacks.list(&Default::default()).await.unwrap().items.is_empty()
    })
    .await;
    op.stop().await;
}

/// The retry budget (PKO PR #1322 `maxUpdateFailures`, our backoff base and factor): with
/// `maxUpdateFailures: 1` and a 1 s constant backoff, a failing program is retried once, then the
/// Stack is Stalled `UpdateFailed` and no further Update is made.
#[tokio::test]
async fn max_update_failures_one_stalls_after_one_retry() {
    let (client, ns, env) = setup("retry-budget").await;
    passphrase_and_program(
        &ns,
        json!({"resources": {"boom": {"type": "command:local:Command", "properties": {"create": "exit 3"}}}}),
    )
    .await;
    let op = InProcessOperator::start(&client, &env, ns.name()).await;
    stack_of(
        &ns,
        &env,
        "broken",
        json!({"maxUpdateFailures": 1, "retryBackoffBaseSeconds": 1, "retryBackoffFactor": 1.0}),
    )
    .await;
    let stacks = ns.api::<Stack>();
    let t0 = Instant::now();
    eventually("the Stack is Stalled UpdateFailed", 120, || async {
        stacks.get("broken").await.ok().and_then(|s| stalled(&s)).is_some_and(|(reason, _)| reason == "UpdateFailed")
    })
    .await;
    eprintln!("stalled {:?} after the Stack was created", t0.elapsed());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let updates: Vec<Update> = ns.api::<Update>().list(&Default::default()).await.unwrap().items;
    assert_eq!(
        updates.len(),
        2,
        "the first attempt and one retry, then nothing: {:?}",
        updates.iter().map(|u| u.metadata.name.clone()).collect::<Vec<_>>()
    );
    let s = stacks.get("broken").await.unwrap();
    assert_eq!(s.status.as_ref().and_then(|st| st.last_update.as_ref()).and_then(|l| l.failures), Some(1));
    op.stop().await;
}

/// `kubectl pko cancel` of a running 120 s `up`: Ctrl-C on its agent, the Update `Failed` `Canceled`
/// within the grace period, no lock left, the Stack `Stalled` `UpdateCanceled` and no retry; `kubectl
/// pko sync` runs it again.
#[tokio::test]
async fn kubectl_pko_cancel_stops_a_running_up_and_sync_runs_it_again() {
    let (client, ns, env) = setup("cancel").await;
    passphrase_and_program(
        &ns,
        json!({"resources": {"wait": {"type": "command:local:Command", "properties": {"create": "sleep 120"}}}}),
    )
    .await;
    let op = InProcessOperator::start(&client, &env, ns.name()).await;
    stack_of(&ns, &env, "long", json!({})).await;
    let updates = ns.api::<Update>();
    eventually("the up runs", 120, || async {
        updates
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|u| condition(u, "Progressing").is_some_and(|c| c.0 == "True"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // kubectl pko status names the agent running it
    let rows: serde_json::Value =
        serde_json::from_slice(&kubectl_pko(&["status", "stack/long", "-n", ns.name(), "-o", "json"]).stdout).unwrap();
    assert!(
        rows[0]["agent"].as_str().is_some_and(|a| a.starts_with("127.0.0.1:"))
            && rows[0]["current"].as_str().unwrap().ends_with("(Progressing)"),
        "{rows}"
    );
    let asked = Instant::now();
    let out = kubectl_pko(&["cancel", "stack/long", "-n", ns.name()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("stack.pulumi.com/long cancel requested"));
    let canceled = failed_update(&updates, "long").await;
    let took = asked.elapsed();
    eprintln!("cancel → Update Failed in {took:?}");
    let failed = canceled
        .status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "Failed")
        .cloned()
        .unwrap();
    assert_eq!(failed.reason, "Canceled");
    assert!(canceled.status.as_ref().unwrap().message.as_deref().unwrap().starts_with("canceled by request"));
    assert!(took < Duration::from_secs(31 + 15), "within the 30 s grace: {took:?}");
    let locks = files_under(&env.dir().join("state").join(".pulumi").join("locks"));
    assert!(locks.is_empty(), "no lock is left: {locks:?}");
    let stacks = ns.api::<Stack>();
    eventually("the Stack waits: Stalled UpdateCanceled", 60, || async {
        stacks.get("long").await.ok().and_then(|s| stalled(&s)).is_some_and(|(r, _)| r == "UpdateCanceled")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(
        updates.list(&Default::default()).await.unwrap().items.len(),
        1,
        "no retry after a cancel (the first backoff is 10 s)"
    );
    // kubectl pko status says why, as a table and as JSON
    let table = String::from_utf8_lossy(&kubectl_pko(&["status", "-n", ns.name()]).stdout).into_owned();
    let line = table.lines().find(|l| l.starts_with("long ")).unwrap_or_else(|| panic!("{table}"));
    assert!(
        table.starts_with("NAME ")
            && line.contains(" False ")
            && line.contains("UpdateCanceled")
            && line.contains("(failed)"),
        "{table}"
    );
    let rows: serde_json::Value =
        serde_json::from_slice(&kubectl_pko(&["status", "stack/long", "-n", ns.name(), "-o", "json"]).stdout).unwrap();
    assert_eq!(
        (rows[0]["name"].as_str(), rows[0]["reason"].as_str(), rows[0]["current"].as_str()),
        (Some("long"), Some("UpdateCanceled"), Some("")),
        "{rows}"
    );
    assert!(rows[0]["message"].as_str().unwrap().starts_with("update canceled by request"), "{rows}");

    let out = kubectl_pko(&["sync", "long", "-n", ns.name()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eventually("sync runs it again", 60, || async {
        updates.list(&Default::default()).await.unwrap().items.len() == 2
    })
    .await;
    let missing = kubectl_pko(&["cancel", "stack/nope", "-n", ns.name()]);
    assert!(!missing.status.success() && String::from_utf8_lossy(&missing.stderr).contains("not found"));
    let _ = stacks.delete("long", &Default::default()).await;
    op.stop().await;
}
