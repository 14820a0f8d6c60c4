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
    start_with_probes(env, ns, name, 0)
}

/// [`start`], with its probes on 127.0.0.1:`probe_port` (0: none).
fn start_with_probes(env: &pko_testbed::PulumiEnv, ns: &str, name: &str, probe_port: u16) -> KillOnDrop {
    let log = |s: &str| std::fs::File::create(env.dir().join(format!("{name}.{s}.log"))).unwrap();
    let probes = if probe_port == 0 { "0".to_string() } else { format!("127.0.0.1:{probe_port}") };
    let child = operator_command(env, ns, free_port())
        .env("HEALTH_PROBE_BIND_ADDRESS", probes)
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
    passphrase_and_program(
        &ns,
        json!({"resources": {"c": {"type": "command:local:Command", "properties": {"create": "echo led"}}}}),
    )
    .await;
    let leases: Api<Lease> = ns.api();
    let mut a = start(&env, ns.name(), "a");
    eventually("replica a holds the Lease", 60, || async {
        holder(&leases).await.is_some_and(|h| h.starts_with("a_"))
    })
    .await;
    // a has renewed once at least, so an unreleased Lease would outlast a's exit by several seconds
    tokio::time::sleep(Duration::from_secs(16)).await;
    let _b = start(&env, ns.name(), "b");
    stack(&ns, &env, "first").await;
    let stacks = ns.api::<Stack>();
    eventually("the leader deploys", 120, || async { ready(&stacks.get("first").await.unwrap()) }).await;
    assert!(holder(&leases).await.unwrap().starts_with("a_"), "b waits while a renews");
    let b_log = std::fs::read_to_string(env.dir().join("b.out.log")).unwrap_or_default();
    assert!(
        b_log.contains("waiting for leadership") && !b_log.contains("operator starting"),
        "b must not act:\n{b_log}"
    );

    // the leader stops (SIGTERM): it releases the Lease, b takes it at once and acts
    let t = std::time::Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(a.0.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let _ = tokio::task::spawn_blocking(move || a.0.wait()).await;
    eventually("replica b holds the Lease", 60, || async {
        holder(&leases).await.is_some_and(|h| h.starts_with("b_"))
    })
    .await;
    eprintln!("takeover after the leader's SIGTERM: {:?} (Lease duration 20 s, renewed every 15 s)", t.elapsed());
    let logs = |n: &str| std::fs::read_to_string(env.dir().join(format!("{n}.out.log"))).unwrap_or_default();
    assert!(
        t.elapsed() < Duration::from_secs(12),
        "a released Lease is taken before it would have run out\n--- a ---\n{}\n--- b ---\n{}",
        logs("a"),
        logs("b")
    );
    stack(&ns, &env, "second").await;
    eventually("the new leader deploys", 120, || async { ready(&stacks.get("second").await.unwrap()) }).await;
}

/// `GET http://127.0.0.1:port/path`: the status code and body (None: nothing listens).
async fn probe(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await.ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    let code = out.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string()))
}

/// A rolling update of a single-replica install (the chart passes `--leader-elect`): the new replica
/// answers its probes on standby while the old one leads (so a Deployment sees it Ready and stops the
/// old one), and acts only once the old one has stopped; an `up` running during the rollout is never
/// run by two operators at once (checked by the program itself with a per-Stack `flock`), and ends
/// with the Stack Ready.
#[tokio::test]
async fn a_rollout_during_a_running_up_has_one_dispatcher_at_a_time() {
    let (_client, ns, env) = setup("rollout").await;
    let trace = env.dir().join("trace.txt");
    let lock = env.dir().join("run.lock");
    let create = format!(
        "exec 9>>{lock}; flock -n 9 || echo overlap >> {trace}; flock 9; echo start >> {trace}; sleep 8; echo end >> \
            {trace}",
        lock = lock.display(),
        trace = trace.display()
    );
    passphrase_and_program(
        &ns,
        json!({"resources": {"c": {"type": "command:local:Command", "properties": {"create": create}}}}),
    )
    .await;
    let leases: Api<Lease> = ns.api();
    let (pa, pb) = (free_port(), free_port());
    let mut a = start_with_probes(&env, ns.name(), "a", pa);
    eventually("replica a leads and is ready", 60, || async {
        holder(&leases).await.is_some_and(|h| h.starts_with("a_"))
            && probe(pa, "/readyz").await.is_some_and(|(c, _)| c == 200)
    })
    .await;
    stack(&ns, &env, "rolled").await;
    eventually("the up runs", 90, || async { std::fs::read_to_string(&trace).unwrap_or_default().contains("start") })
        .await;

    // the new pod of the rollout: Ready on standby while a leads
    let _b = start_with_probes(&env, ns.name(), "b", pb);
    eventually("b answers its probes on standby", 30, || async {
        probe(pb, "/readyz").await.is_some_and(|(c, body)| c == 200 && body.contains("standby"))
            && probe(pb, "/healthz").await.is_some_and(|(c, _)| c == 200)
    })
    .await;
    assert!(holder(&leases).await.unwrap().starts_with("a_"), "a still leads");
    // the Deployment stops the old pod once the new one is Ready
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(a.0.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let stopped = tokio::task::spawn_blocking(move || {
        let _ = a.0.wait();
        std::time::SystemTime::now()
    })
    .await
    .unwrap();
    eventually("b leads", 60, || async { holder(&leases).await.is_some_and(|h| h.starts_with("b_")) }).await;
    let stacks = ns.api::<Stack>();
    eventually("the Stack is Ready after the rollout", 180, || async { ready(&stacks.get("rolled").await.unwrap()) })
        .await;
    // b acted only after a had stopped: its "operator starting" line comes after a's exit
    let b_log = std::fs::read_to_string(env.dir().join("b.out.log")).unwrap_or_default();
    let started = b_log
        .lines()
        .find(|l| l.contains("operator starting"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok());
    let started = std::time::SystemTime::from(started.unwrap_or_else(|| panic!("b never started acting:\n{b_log}")));
    assert!(started >= stopped - Duration::from_secs(1), "b acted before a stopped");
    let t = std::fs::read_to_string(&trace).unwrap();
    assert!(!t.contains("overlap"), "two runs of the Stack overlapped:\n{t}");
    assert!(t.matches("end").count() >= 1, "the up completed:\n{t}");
    eprintln!(
        "runs of the up across the rollout: {} started, {} completed",
        t.matches("start").count(),
        t.matches("end").count()
    );
}
