//! Operator latency against the real test bed (`cargo bench -p pko-operator --bench stack_latency`):
//! the whole operator runs in this process (local runtime), a Program + Stack is applied and becomes
//! Ready (cold: a new agent), then the Stack's config is changed 10 times (each a new generation, warm
//! agent). Prints the median apply → Ready time, the median bare `pulumi up` of the same program with
//! the same config change, and their difference: what the operator adds to a Pulumi run.

#[path = "../crates/pko-operator/tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use kube::api::{Patch, PatchParams};
use pko_api::{Program, Stack};

use serde_json::json;

const RUNS: usize = 10;
const PROGRAM: &str = "configuration:\n  greeting:\n    type: String\nresources:\n  greet:\n    type: \
    command:local:Command\n    properties:\n      create: echo ${greeting}\noutputs:\n  message: ${greet.stdout}\n";

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn wait_ready(stacks: &kube::Api<Stack>, generation: i64) {
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let s = stacks.get("bench").await.unwrap();
        let ready = stack_condition(&s, "Ready").is_some_and(|(st, _, _)| st == "True");
        let observed =
            s.status.as_ref().and_then(|st| st.last_update.as_ref()).and_then(|l| l.generation) == Some(generation);
        if ready && observed {
            return;
        }
        assert!(Instant::now() < end, "the Stack is not Ready for generation {generation} after 120 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("stack_latency: run with `cargo bench` (it times real Pulumi operations)");
        return;
    }
    let (client, ns, env) = setup("bench").await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    let program: serde_json::Value = serde_yaml_ng::from_str(PROGRAM).unwrap();
    create(
        &ns.api::<Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "bench"}, "program": program}),
    )
    .await;
    let stacks = ns.api::<Stack>();
    let t = Instant::now();
    create(
        &stacks,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "bench"},
        "spec": {"stack": "dev", "programRef": {"name": "bench"}, "backend": env.backend_url(),
            "config": {"greeting": "v0"}}}),
    )
    .await;
    wait_ready(&stacks, 1).await;
    let cold = t.elapsed();

    let dir = project(&env, "bare", PROGRAM);
    let init = env.pulumi(&dir).args(["stack", "init", "bare"]).output().unwrap();
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    let mut operator_times = Vec::new();
    let mut bare_times = Vec::new();
    for i in 1..=RUNS {
        let t = Instant::now();
        let patch = json!({"spec": {"config": {"greeting": format!("v{i}")}}});
        let s = stacks.patch("bench", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        wait_ready(&stacks, s.metadata.generation.unwrap()).await;
        operator_times.push(t.elapsed());

        let t = Instant::now();
        let out = env
            .pulumi(&dir)
            .args([
                "up",
                "--yes",
                "--skip-preview",
                "--non-interactive",
                "--stack",
                "bare",
                "--config",
                &format!("greeting=v{i}"),
            ])
            .output()
            .unwrap();
        bare_times.push(t.elapsed());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let (o, b) = (median(operator_times), median(bare_times));
    println!("first apply -> Ready (new agent): {cold:?}");
    println!(
        "apply -> Ready median {o:?}, bare pulumi up median {b:?}, operator overhead {:?} ({RUNS} runs each, warm \
            agent)",
        o.saturating_sub(b)
    );
}
