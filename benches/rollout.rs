//! A StackRollout at scale (`cargo bench -p pko-operator --bench rollout`; `STACKS=200`, `FAILING=2`, `BUDGET=1`).
//!
//! HOLLOW AGENTS (`--hollow-agents-seconds 1`: the real agent binary simulating operations; the control plane is what
//! is measured): STACKS Stacks of one Program in four waves of equal size (labels `wave: w0..w3`), one operator in
//! this process with a pool of 16 agents; a StackRollout with four steps — `w0` 5 at a time, `w1` 20 % at a time,
//! `w2` and `w3` all at once — and a failure budget of BUDGET. FAILING Stacks of `w2` simulate a program that fails
//! from the Program's second generation on (`PKO_HOLLOW_FAIL=/2/`, their request's artifact URL names it). Once all
//! are Ready, the Program changes; prints each step's timeline (started, all its Stacks at the new revision, or the
//! halt), how many Stacks run the new revision and how many the rollout holds, and how many Updates ran.
//!
//! `REPLICAS=2`: two replicas of a fleet (Redis); when the second step starts, the replica holding the rollout's shard
//! is stopped (as on SIGTERM) and its peer takes the rollout over: the steps' records and one Update per admitted
//! Stack show that no step was skipped or repeated.

#[path = "../crates/pko-operator/tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use kube::api::{Patch, PatchParams};
use pko_api::rollout::RolloutPhase;
use pko_api::{Program, Stack, StackRollout};
use pko_testbed::eventually;
use serde_json::json;

fn var(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn body(word: &str) -> serde_json::Value {
    json!({"outputs": {"word": word}})
}

/// Seconds from `t0` to `t` (an API time), to the tenth.
fn secs(t0: k8s_openapi::jiff::Timestamp, t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> String {
    t.map_or("-".into(), |t| format!("{:.0}", t.0.duration_since(t0).as_secs_f64().max(0.0)))
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let (n, failing, budget, replicas) = (var("STACKS", 200), var("FAILING", 2), var("BUDGET", 1), var("REPLICAS", 1));
    let (client, ns, env) = setup("rollouts").await;
    passphrase_secret(&ns).await;
    let programs = ns.api::<Program>();
    create(
        &programs,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "prog"}, "program": body("one")}),
    )
    .await;
    let args = ["--hollow-agents-seconds", "1", "--agent-pools", "--pool-max-agents", "16", "--max-operations", "32"];
    let prefix = pko_testbed::testbed().redis_prefix("rollouts");
    let redis = ["--redis-url", pko_testbed::testbed().redis_url(), "--redis-prefix", &prefix];
    let mut ops: Vec<(String, Option<InProcessOperator>)> = Vec::new();
    for r in 0..replicas {
        let id = format!("r{r}");
        let mut all: Vec<&str> = args.to_vec();
        if replicas > 1 {
            all.extend(fleet_args(ns.name(), &id, &redis));
        }
        let op = InProcessOperator::start_with(&client, &env, run_args_with(&env, ns.name(), &all)).await;
        ops.push((id.clone(), Some(op)));
    }
    let stacks = ns.api::<Stack>();
    let t = Instant::now();
    let per_wave = n / 4;
    for i in 0..n {
        let wave = (i / per_wave).min(3);
        let fails = wave == 2 && i % per_wave < failing;
        let mut env_refs = passphrase_env_refs();
        if fails {
            env_refs["PKO_HOLLOW_FAIL"] = json!({"type": "Literal", "literal": {"value": "/2/"}});
        }
        create(
            &stacks,
            json!({"apiVersion": "pulumi.com/v1", "kind": "Stack",
                   "metadata": {"name": format!("s{i:03}"), "labels": {"app": "web", "wave": format!("w{wave}")}},
                   "spec": {"stack": format!("s{i:03}"), "programRef": {"name": "prog"}, "backend": env.backend_url(),
                            "envRefs": env_refs, "maxUpdateFailures": 1, "retryBackoffBaseSeconds": 3600}}),
        )
        .await;
    }
    eventually("every Stack Ready", 1800, || async {
        stacks.list(&Default::default()).await.unwrap().items.iter().filter(|s| ready(s)).count() == n
    })
    .await;
    eprintln!("{n} Stacks Ready (HOLLOW AGENTS) in {:.0} s", t.elapsed().as_secs_f64());
    let rollouts = ns.api::<StackRollout>();
    let step = |w: &str, max: serde_json::Value| json!({"matchLabels": {"wave": w}, "maxUpdate": max});
    create(
        &rollouts,
        json!({"apiVersion": "pulumi.com/v1alpha1", "kind": "StackRollout", "metadata": {"name": "waves"},
               "spec": {"selector": {"matchLabels": {"app": "web"}},
                        "steps": [step("w0", json!(5)), step("w1", json!("20%")), step("w2", json!("100%"))],
                        "failureBudget": budget, "stepDeadlineSeconds": 900}}),
    )
    .await;
    eventually("the rollout is observed", 60, || async {
        rollouts.get("waves").await.unwrap().status.is_some_and(|s| s.observed_generation.is_some())
    })
    .await;
    let updates_before = ns.api::<pko_api::Update>().list(&Default::default()).await.unwrap().items.len();
    let t0 = k8s_openapi::jiff::Timestamp::now();
    let started = Instant::now();
    programs.patch("prog", &PatchParams::default(), &Patch::Merge(json!({"program": body("two")}))).await.unwrap();
    if replicas > 1 {
        eventually("the second step starts", 600, || async {
            rollouts.get("waves").await.unwrap().status.is_some_and(|s| s.step >= 1)
        })
        .await;
        let leases = ns.api::<k8s_openapi::api::coordination::v1::Lease>();
        let shard = pko_fleet::ring::shard_of(&format!("{}/waves", ns.name()), 64);
        let holder = shard_holders(&leases, "pko").await.get(&shard).cloned().unwrap_or_default();
        let t = started.elapsed().as_secs_f64();
        if let Some((_, op)) = ops.iter_mut().find(|(id, _)| *id == holder) {
            op.take().unwrap().stop().await;
        }
        eprintln!("stopped {holder}, the holder of the rollout's shard {shard}, {t:.0} s into the rollout");
    }
    let end =
        |s: &pko_api::rollout::StackRolloutStatus| matches!(s.phase, RolloutPhase::Halted | RolloutPhase::Completed);
    eventually("the rollout halts or completes", 1800, || async {
        rollouts.get("waves").await.unwrap().status.is_some_and(|s| end(&s))
    })
    .await;
    let took = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let r = rollouts.get("waves").await.unwrap().status.unwrap();
    let list = stacks.list(&Default::default()).await.unwrap().items;
    let revision = r.revision.clone().unwrap_or_default();
    let on_new = list
        .iter()
        .filter(|s| {
            s.status.as_ref().and_then(|st| st.last_update.as_ref()).and_then(|l| l.last_successful_commit.as_deref())
                == Some(revision.as_str())
        })
        .count();
    let held = list
        .iter()
        .filter(|s| s.status.as_ref().and_then(|st| st.rollout.as_ref()).is_some_and(|h| !h.admitted))
        .count();
    let updates = ns.api::<pko_api::Update>().list(&Default::default()).await.unwrap().items.len() - updates_before;
    println!("| step | Stacks | started (s) | all at the new revision (s) | failed | halted |");
    println!("|---|---|---|---|---|---|");
    for (i, s) in r.steps.iter().enumerate() {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            i + 1,
            s.stacks,
            secs(t0, s.started_at.as_ref()),
            secs(t0, s.done_at.as_ref()),
            s.failed,
            s.halted.as_deref().unwrap_or("-")
        );
    }
    println!(
        "| HOLLOW AGENTS | {n} Stacks, 4 steps, budget {budget}, {failing} failing in step 3 | {:?} after {took:.0} s \
        at step {} | {on_new} Stacks run the new revision, {held} held at the old one | {updates} Updates |",
        r.phase,
        r.step + 1
    );
    let _ = pko_testbed::testbed().kubectl().args(["delete", "namespace", ns.name(), "--wait=false"]).output();
}
