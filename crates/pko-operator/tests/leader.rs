//! PKO's `--leader-elect` on the bed's API server: two operator processes started with PKO's
//! leader-election flags; the one holding the Lease `operator.pulumi.com` deploys Stacks, the other
//! waits; SIGTERM on the leader releases the Lease and the other takes over at once and deploys.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use pko_api::Stack;
use pko_testbed::{eventually, testbed};
use serde_json::json;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Replica `name` with PKO's leader-election flags and environment (a short Lease for the test).
fn start(env: &pko_testbed::PulumiEnv, ns: &str, name: &str) -> KillOnDrop {
    let log = |s: &str| std::fs::File::create(env.dir().join(format!("{name}.{s}.log"))).unwrap();
    let child = operator_command(env, ns, free_port())
        .args(["--leader-elect", "--zap-log-level=info", "--zap-encoder=console", "--zap-time-encoding=iso8601"])
        .env("LEADER_ELECTION_LEASE_DURATION", "20s")
        .env("LEADER_ELECTION_RENEW_DEADLINE", "15s")
        .env("LEADER_ELECTION_RETRY_PERIOD", "1s")
        .env("KUBE_API_TIMEOUT", "30s")
        .env("POD_NAMESPACE", ns)
        .env("POD_NAME", name)
        .env("KUBECONFIG", testbed().kubeconfig())
        .stdout(Stdio::from(log("out")))
        .stderr(Stdio::from(log("err")))
        .spawn()
        .unwrap();
    KillOnDrop(child)
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases.get_opt("operator.pulumi.com").await.unwrap()?.spec?.holder_identity
}

async fn stack(ns: &pko_testbed::TestNamespace, env: &pko_testbed::PulumiEnv, name: &str) {
    prog_stack(ns, env, name, json!({})).await;
}

#[tokio::test]
async fn one_replica_leads_and_the_other_takes_over_when_it_stops() {
    let (_client, ns, env) = setup("leader").await;
    passphrase_and_program(&ns, json!({"resources": {"c": {"type": "command:local:Command", "properties": {"create": "echo led"}}}})).await;
    let leases: Api<Lease> = ns.api();
    let mut a = start(&env, ns.name(), "a");
    eventually("replica a holds the Lease", 60, || async { holder(&leases).await.is_some_and(|h| h.starts_with("a_")) }).await;
    // a has renewed once at least, so an unreleased Lease would outlast a's exit by several seconds
    tokio::time::sleep(Duration::from_secs(16)).await;
    let _b = start(&env, ns.name(), "b");
    stack(&ns, &env, "first").await;
    let stacks = ns.api::<Stack>();
    eventually("the leader deploys", 120, || async { ready(&stacks.get("first").await.unwrap()) }).await;
    assert!(holder(&leases).await.unwrap().starts_with("a_"), "b waits while a renews");
    let b_log = std::fs::read_to_string(env.dir().join("b.out.log")).unwrap_or_default();
    assert!(b_log.contains("waiting for leadership") && !b_log.contains("operator starting"), "b must not act:\n{b_log}");

    // the leader stops (SIGTERM): it releases the Lease, b takes it at once and acts
    let t = std::time::Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(a.0.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let _ = tokio::task::spawn_blocking(move || a.0.wait()).await;
    eventually("replica b holds the Lease", 60, || async { holder(&leases).await.is_some_and(|h| h.starts_with("b_")) }).await;
    eprintln!("takeover after the leader's SIGTERM: {:?} (Lease duration 20 s, renewed every 15 s)", t.elapsed());
    let logs = |n: &str| std::fs::read_to_string(env.dir().join(format!("{n}.out.log"))).unwrap_or_default();
    assert!(t.elapsed() < Duration::from_secs(12), "a released Lease is taken before it would have run out\n--- a ---\n{}\n--- b ---\n{}", logs("a"), logs("b"));
    stack(&ns, &env, "second").await;
    eventually("the new leader deploys", 120, || async { ready(&stacks.get("second").await.unwrap()) }).await;
}
