//! A replica SIGKILLed the moment its pool agent has accepted an operation (two `pko-operator`
//! processes in one fleet over the bed's redis-server, `--agent-pools`): the Update was marked started
//! before the agent had it, so the shard's next holder looks for the agent that runs it — one of the
//! dead replica's — and follows it there instead of starting a second `up` on an agent of its own
//! (which would meet the backend lock and fail the Update `UpdateConflict`). Asserted from the agents'
//! own answers and records, the program's own trace and the survivor's log. (The kill lands a few
//! milliseconds after the agent took the operation, usually after the Update's status write too; that
//! the mark is written before `Run` is sent at all is asserted deterministically in `tests/update.rs`.)

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::Api;
use pko_api::{Stack, Update};
use pko_fleet::ring::{BoundedRing, Ring};
use pko_proto::v1::agent_client::AgentClient;
use pko_proto::v1::{StatusRequest, status_response::State};
use pko_testbed::{eventually, testbed};
use serde_json::json;

const SHARDS: u32 = 64;
const FLEET: &str = "crash";

/// The addresses recorded by `replica`'s pool agents: `<agents>/pools/<ns>/<class>/<replica>/<n>/agent.json`.
fn recorded_agents(pools: &Path, replica: &str) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let classes = std::fs::read_dir(pools)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|ns| std::fs::read_dir(ns.path()).into_iter().flatten().flatten());
    for class in classes {
        for slot in std::fs::read_dir(class.path().join(replica)).into_iter().flatten().flatten() {
            let Ok(bytes) = std::fs::read(slot.path().join("agent.json")) else { continue };
            if let Some(address) = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v["address"].as_str().map(str::to_string))
            {
                out.push((slot.path(), address));
            }
        }
    }
    out
}

/// The operation the agent at `address` runs, when it is busy.
async fn running_on(address: &str) -> Option<String> {
    let mut c = AgentClient::connect(format!("http://{address}")).await.ok()?;
    let s = c.status(StatusRequest {}).await.ok()?.into_inner();
    (s.state == State::Busy as i32 && !s.current_operation_id.is_empty()).then_some(s.current_operation_id)
}

#[tokio::test]
async fn a_replica_killed_right_after_its_agent_took_an_operation_is_followed_there_by_its_successor() {
    let (_client, ns, env) = setup("crash").await;
    let trace = env.dir().join("runs.txt");
    passphrase_and_program(
        &ns,
        json!({"resources": {
            "a": {"type": "command:local:Command", "properties": {"create": format!("sleep 8; echo a >> {}",
                trace.display())}},
            "b": {"type": "command:local:Command", "properties": {"create": format!("echo b >> {}", trace.display())},
                "options": {"dependsOn": ["${a}"]}}}}),
    )
    .await;
    let prefix = testbed().redis_prefix("crash");
    let redis = ["--redis-url", testbed().redis_url(), "--redis-prefix", &prefix];
    let ports: Vec<u16> =
        (0..2).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()).collect();
    let extra =
        [&redis[..], &["--agent-pools", "--pool-max-agents", "2", "--pool-idle-timeout-seconds", "30"]].concat();
    let kubeconfig = testbed().kubeconfig();
    let mut replicas: Vec<Option<KillOnDrop>> = ["r0", "r1"]
        .iter()
        .zip(&ports)
        .map(|(r, p)| Some(KillOnDrop(start_replica_process(&env, ns.name(), FLEET, r, &kubeconfig, *p, &extra))))
        .collect();
    let leases: Api<Lease> = ns.api();
    // settled: every shard held by the replica the ring gives it to (while the second replica joins,
    // shards released by the first are without a holder for a moment)
    let desired = BoundedRing::default().assign(SHARDS, &["r0".to_string(), "r1".to_string()]);
    eventually("every shard held by its owner on the ring", 90, || async {
        let h = shard_holders(&leases, FLEET).await;
        h.len() == SHARDS as usize && h.iter().all(|(s, x)| desired[*s as usize] == *x)
    })
    .await;

    // kubectl pko fleet: both replicas live, every shard held; the fleet's name found from its Leases
    let fleet = |ns: String| async move {
        let out = kubectl_pko(&["fleet", "--fleet-namespace", &ns, "-o", "json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let f: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let held = |r: &str| {
            f["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["replica"] == r)
                .map(|x| (x["live"].as_bool().unwrap(), x["shards_held"].as_u64().unwrap()))
        };
        (held("r0"), held("r1"), f["unheld"].as_u64().unwrap())
    };
    let (r0, r1, unheld) = fleet(ns.name().to_string()).await;
    assert!(
        r0.is_some_and(|(live, n)| live && n > 0) && r1.is_some_and(|(live, n)| live && n > 0) && unheld == 0,
        "{r0:?} {r1:?} {unheld}"
    );
    assert_eq!(r0.unwrap().1 + r1.unwrap().1, SHARDS as u64);
    // each replica announces its load on its membership Lease: here, its pools' bounds
    eventually("kubectl pko fleet shows each replica's pools", 30, || async {
        let out = kubectl_pko(&["fleet", "--fleet-namespace", ns.name(), "--fleet-name", FLEET, "-o", "json"]);
        let f: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        f["replicas"].as_array().unwrap().iter().all(|r| r["load"]["poolBounds"] == json!([0, 2]))
            && f["total"]["inFlight"] == 0
    })
    .await;

    prog_stack(&ns, &env, "s", json!({})).await;
    let shard = pko_fleet::ring::shard_of(&format!("{}/s", ns.name()), SHARDS);
    let owner = desired[shard as usize].clone();
    let (victim, survivor) = if owner == "r0" { (0, "r1") } else { (1, "r0") };

    // kill the owner the moment one of its agents reports the operation as running
    let pools = env.dir().join("agents").join("pools");
    let deadline = Instant::now() + Duration::from_secs(120);
    let (slot, op) = loop {
        assert!(Instant::now() < deadline, "no agent of {owner} ran the operation within 120 s");
        let mut found = None;
        for (slot, address) in recorded_agents(&pools, &owner) {
            if let Some(op) = running_on(&address).await {
                found = Some((slot, op));
                break;
            }
        }
        if let Some(f) = found {
            break f;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let mut dead = replicas[victim].take().unwrap();
    dead.0.kill().unwrap();
    dead.0.wait().unwrap();
    let killed = Instant::now();
    eprintln!("{owner} SIGKILLed while its agent ({}) runs {op}", slot.display());

    let updates = ns.api::<Update>();
    let all = updates.list(&Default::default()).await.unwrap().items;
    assert_eq!(all.len(), 1);
    assert!(all[0].was_started(), "the Update was marked started before its agent had it: {:?}", all[0].status);

    let stacks = ns.api::<Stack>();
    eventually("the Stack is Ready on the survivor", 120, || async { ready(&stacks.get("s").await.unwrap()) }).await;
    // kubectl pko fleet shows the killed replica's shards moved to the survivor
    eventually("kubectl pko fleet shows every shard on the survivor", 60, || async {
        let (r0, r1, unheld) = fleet(ns.name().to_string()).await;
        let (dead, alive) = if survivor == "r0" { (r1, r0) } else { (r0, r1) };
        unheld == 0 && alive == Some((true, SHARDS as u64)) && dead.is_none_or(|(_, n)| n == 0)
    })
    .await;
    eprintln!("Stack Ready {:.1} s after the kill", killed.elapsed().as_secs_f64());
    let all = updates.list(&Default::default()).await.unwrap().items;
    assert_eq!(
        all.len(),
        1,
        "no second Update: {:?}",
        all.iter().map(|u| (u.name_any(), u.status.clone())).collect::<Vec<_>>()
    );
    assert_eq!(
        condition(&all[0], "Failed"),
        Some(("False".into(), "UpdateSucceeded".into())),
        "the Update succeeded (no lock conflict)"
    );
    assert_eq!(
        std::fs::read_to_string(&trace).unwrap().lines().collect::<Vec<_>>(),
        ["a", "b"],
        "each resource created once"
    );
    let log = std::fs::read_to_string(env.dir().join(format!("{survivor}.err.log"))).unwrap()
        + &std::fs::read_to_string(env.dir().join(format!("{survivor}.out.log"))).unwrap();
    assert!(
        log.contains("found the agent running the operation; following it"),
        "the survivor followed the dead replica's agent"
    );
    assert!(
        recorded_agents(&pools, survivor).is_empty(),
        "the survivor started no agent of its own for it: {:?}",
        recorded_agents(&pools, survivor)
    );
    assert!(files_under(&env.dir().join("state").join(".pulumi").join("locks")).is_empty(), "no lock is left");

    drop(replicas);
    let _ = Command::new("pkill").args(["-f", &pools.display().to_string()]).status();
}
