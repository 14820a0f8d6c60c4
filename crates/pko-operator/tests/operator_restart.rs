//! The operator binary killed with SIGKILL during an `up` and started again: the running operation is
//! re-attached (its agent adopted), the Update completes, nothing is Aborted, and no lock is left.

mod common;

use std::process::{Command, Stdio};

use common::*;
use pko_api::{Program, Stack, Update};
use pko_testbed::{eventually, testbed};
use serde_json::json;

fn start_operator(env: &pko_testbed::PulumiEnv, namespace: &str, port: u16, extra: &[&str]) -> std::process::Child {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(env.dir().join("operator.log")).unwrap();
    operator_command(env, namespace, port)
        .args(extra)
        .env("KUBECONFIG", testbed().kubeconfig())
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap()
}

/// Prints the operators' log when the test fails.
struct DumpOnPanic(std::path::PathBuf);

impl Drop for DumpOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.0).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(80).collect();
            eprintln!(
                "--- {} (last 80 lines) ---\n{}",
                self.0.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
}

/// A loopback port free now (the artifact server keeps it across the restart: agents download from it).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test]
async fn sigkilled_operator_reattaches_after_restart() {
    sigkilled_operator_reattaches(&["--agent-pools=false"], |env, ns| {
        env.dir().join("agents").join(ns).join("slow").join("agent.json")
    })
    .await;
}

/// The same with agent pools: the restarted operator adopts its pool's agent (slot 0 of the class) and
/// follows the operation there.
#[tokio::test]
async fn sigkilled_operator_reattaches_to_its_pooled_agent_after_restart() {
    sigkilled_operator_reattaches(&["--agent-pools", "--pool-idle-timeout-seconds", "5"], |env, ns| {
        let classes = env.dir().join("agents").join("pools").join(ns);
        let class = std::fs::read_dir(&classes).unwrap().flatten().next().unwrap().path();
        class.join("operator").join("0").join("agent.json")
    })
    .await;
}

async fn sigkilled_operator_reattaches(
    extra: &[&str],
    record: impl Fn(&pko_testbed::PulumiEnv, &str) -> std::path::PathBuf,
) {
    let (_client, ns, env) = setup("restart").await;
    let runs = env.dir().join("runs.txt");
    passphrase_secret(&ns).await;
    create(
        &ns.api::<Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "slow"},
        "program": {"resources": {"s": {"type": "command:local:Command",
            "properties": {"create": format!("sleep 8; echo run >> {}", runs.display())}}}}}),
    )
    .await;
    create(
        &ns.api::<Stack>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "slow"},
        "spec": {"stack": "dev", "programRef": {"name": "slow"}, "backend": env.backend_url(),
                 "envRefs": passphrase_env_refs()}}),
    )
    .await;

    let port = free_port();
    let _dump = DumpOnPanic(env.dir().join("operator.log"));
    let mut op = start_operator(&env, ns.name(), port, extra);
    let updates = ns.api::<Update>();
    eventually("an Update is Progressing", 60, || async {
        updates
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|u| condition(u, "Progressing") == Some(("True".into(), "Progressing".into())))
    })
    .await;
    let record = record(&env, ns.name());
    let agent_pid = |p: &std::path::Path| {
        serde_json::from_slice::<serde_json::Value>(&std::fs::read(p).unwrap()).unwrap()["pid"].as_u64().unwrap()
    };
    let before = agent_pid(&record);
    op.kill().unwrap(); // SIGKILL
    op.wait().unwrap();
    let mut op = start_operator(&env, ns.name(), port, extra);

    let stacks = ns.api::<Stack>();
    eventually("the Stack is Ready after the restart", 120, || async {
        stacks
            .get("slow")
            .await
            .unwrap()
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
    .await;
    let all = updates.list(&Default::default()).await.unwrap().items;
    let summary: Vec<String> = all
        .iter()
        .map(|u| {
            format!(
                "{}: {:?} {:?}",
                u.metadata.name.clone().unwrap_or_default(),
                condition(u, "Failed"),
                u.status.as_ref().and_then(|s| s.message.clone())
            )
        })
        .collect();
    assert_eq!(all.len(), 1, "the same Update completed; no second one was needed: {summary:#?}");
    assert_eq!(condition(&all[0], "Failed"), Some(("False".into(), "UpdateSucceeded".into())), "not Aborted");
    assert_eq!(std::fs::read_to_string(&runs).unwrap().lines().count(), 1, "the program ran once");
    assert_eq!(agent_pid(&record), before, "the running agent was adopted, not replaced");
    assert!(files_under(&env.dir().join("state").join(".pulumi").join("locks")).is_empty(), "no lock is left");
    op.kill().unwrap();
    op.wait().unwrap();
    // the adopted agent belongs to no process of this test any more: stop it
    let _ = Command::new("pkill").args(["-f", &env.dir().join("agents").display().to_string()]).status();
}
