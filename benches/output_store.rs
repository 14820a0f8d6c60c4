//! What keeping operations' output costs, against the real test bed (`cargo bench -p pko-operator
//! --bench output_store`): a real agent runs `up`s of a small program (two command resources, a replace
//! each time: the demo's shape) through the dispatcher's own steps. Prints:
//! - the added latency per operation: the median of 20 `up`s with the output kept in the bed's Redis
//!   (the fleet's store) against 20 with a store that drops everything, interleaved;
//! - bytes stored per operation (mean, max over the Redis runs);
//! - the delay from a line's time on the agent to the line readable in the store (median, max), polled
//!   every 20 ms; `kubectl pko logs -f` adds its own poll (1 s) to this;
//! - the Redis memory of 1,000 Stacks × 5 operations of those lines (`INFO memory` before and after).

#[path = "../crates/pko-operator/tests/common/mod.rs"]
mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use pko_api::{Update, Workspace};
use pko_operator::queue::QueueError;
use pko_operator::queue::output::{Limits, Line, OperationInfo, Output, OutputStore};
use serde_json::json;

const RUNS: usize = 20;

/// A store that keeps nothing: the dispatcher as it was before output was kept.
#[derive(Debug)]
struct Dropped;

impl OutputStore for Dropped {
    fn append<'a>(&'a self, _: &'a str, _: &'a OperationInfo, _: &'a [Line]) -> BoxFuture<'a, Result<(), QueueError>> {
        Box::pin(async { Ok(()) })
    }
    fn operations<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<OperationInfo>, QueueError>> {
        Box::pin(async { Ok(vec![]) })
    }
    fn read<'a>(&'a self, _: &'a str, _: &'a str, _: Option<u64>) -> BoxFuture<'a, Result<Option<Output>, QueueError>> {
        Box::pin(async { Ok(None) })
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn redis_cli(args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .arg("-u")
        .arg(pko_testbed::testbed().redis_url())
        .args(args)
        .output()
        .expect("redis-cli on PATH (the bed's)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn used_memory() -> i64 {
    redis_cli(&["info", "memory"])
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn delete_keys(pattern: &str) {
    let keys = redis_cli(&["--scan", "--pattern", pattern]);
    for chunk in keys.lines().collect::<Vec<_>>().chunks(500) {
        let mut args = vec!["del"];
        args.extend(chunk);
        redis_cli(&args);
    }
}

/// Polls `store` for the lines of `stack`/`update` every 20 ms until `done`, recording each line's
/// delay from its time on the agent.
async fn watch(
    store: Arc<dyn OutputStore>,
    stack: String,
    update: String,
    done: Arc<std::sync::atomic::AtomicBool>,
    delays: Arc<Mutex<Vec<Duration>>>,
) {
    let mut after = None;
    loop {
        let finished = done.load(std::sync::atomic::Ordering::SeqCst);
        if let Ok(Some(out)) = store.read(&stack, &update, after).await {
            let now = k8s_openapi::jiff::Timestamp::now();
            for l in &out.lines {
                if let Ok(t) = l.time.parse::<k8s_openapi::jiff::Timestamp>() {
                    let d = now.duration_since(t);
                    delays.lock().unwrap().push(Duration::from_secs_f64(d.as_secs_f64().max(0.0)));
                }
            }
            after = out.lines.last().map(|l| l.seq).or(after);
        }
        if finished {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bed = pko_testbed::testbed();
    let client = bed.client().await.unwrap();
    pko_testbed::install_crds(&client, pko_api::crds()).await.unwrap();
    let ns = bed.namespace("bench-output").await.unwrap();
    let env = bed.pulumi_env().unwrap();
    let agent = start_agent(&env, ns.name());
    create(
        &ns.api::<Secret>(),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "passphrase"},
        "stringData": {"value": pko_testbed::PulumiEnv::PASSPHRASE}}),
    )
    .await;
    let dir = project(
        &env,
        "out",
        "config:\n  n:\n    type: string\nresources:\n  a:\n    type: command:local:Command\n    properties:\n      \
            create: echo ${n}\n      triggers: [\"${n}\"]\n  b:\n    type: command:local:Command\n    \
                properties:\n      create: echo steady\noutputs:\n  a: ${a.stdout}\n",
    );
    let prefix = bed.redis_prefix("bench-output");
    let redis_queue = pko_operator::queue::redis::RedisQueue::new(
        bed.redis_url(),
        &prefix,
        "bench",
        pko_queue::NamespaceLimits::NONE,
    )
    .unwrap();
    let kept: Arc<dyn OutputStore> = Arc::new(redis_queue.output(Limits::default()));
    let dropped: Arc<dyn OutputStore> = Arc::new(Dropped);
    let (mut with, mut without, mut bytes) = (Vec::new(), Vec::new(), Vec::new());
    let delays = Arc::new(Mutex::new(Vec::new()));
    eprintln!("{} interleaved `up`s (a replace each) with the output kept in Redis and dropped …", 2 * RUNS);
    for i in 0..2 * RUNS + 1 {
        let keep = i % 2 == 1;
        let ws_name = format!("w{i}");
        let workspace: Workspace = create(
            &ns.api::<Workspace>(),
            json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Workspace", "metadata": {"name": ws_name},
                   "spec": {"local": {"dir": dir.display().to_string()},
                            "env": [{"name": "PULUMI_BACKEND_URL", "value": env.backend_url()},
                                    {"name": "PULUMI_CONFIG_PASSPHRASE",
                                        "valueFrom": {"secretKeyRef": {"name": "passphrase", "key": "value"}}}],
                            "stacks": [{"name": "dev", "create": true, "config": [{"key": "n",
                                "value": format!("{i}")}]}]}}),
        )
        .await;
        let update: Update = create(
            &ns.api::<Update>(),
            owned_update(
                &ns.api::<Workspace>(),
                json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update",
                "metadata": {"name": format!("u{i}")}, "spec": {"workspaceName": ws_name, "stackName": "dev",
                    "type": "up"}}),
            )
            .await,
        )
        .await;
        let store = if keep { kept.clone() } else { dropped.clone() };
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stack = format!("{}/{ws_name}", ns.name());
        let watcher = keep
            .then(|| tokio::spawn(watch(kept.clone(), stack.clone(), format!("u{i}"), done.clone(), delays.clone())));
        let t = Instant::now();
        let r = dispatch_into(&client, &agent.1, &update, &workspace, &held(), store.as_ref()).await.unwrap();
        let took = t.elapsed();
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(w) = watcher {
            let _ = w.await;
        }
        assert_eq!(r.status, pko_proto::v1::ResultStatus::Succeeded as i32, "{}", r.message);
        if i == 0 {
            continue; // the stack's first up: a cold cache, counted in neither
        }
        if keep {
            with.push(took);
            let out = kept.read(&stack, &format!("u{i}"), None).await.unwrap().unwrap();
            bytes.push(out.lines.iter().map(|l| serde_json::to_string(l).unwrap().len()).sum::<usize>());
        } else {
            without.push(took);
        }
    }
    let (mw, mo) = (median(with), median(without));
    println!(
        "added latency per operation (median of {RUNS} `up`s each, interleaved): kept in Redis {:.3} s, dropped {:.3} \
            s, difference {:+.1} ms",
        mw.as_secs_f64(),
        mo.as_secs_f64(),
        (mw.as_secs_f64() - mo.as_secs_f64()) * 1000.0
    );
    let mean = bytes.iter().sum::<usize>() as f64 / bytes.len() as f64;
    println!("bytes stored per operation (line JSON): mean {mean:.0}, max {}", bytes.iter().max().unwrap());
    let mut d = delays.lock().unwrap().clone();
    d.sort();
    println!(
        "line on the agent -> readable in the store: median {:.0} ms, max {:.0} ms over {} lines (kubectl pko logs -f \
            polls every 1 s on top)",
        d[d.len() / 2].as_secs_f64() * 1000.0,
        d[d.len() - 1].as_secs_f64() * 1000.0,
        d.len()
    );

    // 1,000 Stacks × 5 operations of the lines of a real operation
    let template = kept.read(&format!("{}/w1", ns.name()), "u1", None).await.unwrap().unwrap().lines;
    let before = used_memory();
    let fleet_prefix = format!("{prefix}-mem");
    let store = pko_operator::queue::redis::RedisQueue::new(
        bed.redis_url(),
        &fleet_prefix,
        "bench",
        pko_queue::NamespaceLimits::NONE,
    )
    .unwrap()
    .output(Limits::default());
    eprintln!("storing 1,000 Stacks × 5 operations of {} lines …", template.len());
    for s in 0..1000 {
        for o in 0..5 {
            let info = OperationInfo { update: format!("stack-{s}-{o:08x}"), operation: "up".into(), started_ms: o };
            store.append(&format!("team-{}/stack-{s}", s % 20), &info, &template).await.unwrap();
        }
    }
    let after = used_memory();
    println!(
        "Redis memory of 1,000 Stacks × 5 operations ({} lines each): {:.1} MiB ({:.0} bytes per operation)",
        template.len(),
        (after - before) as f64 / (1 << 20) as f64,
        (after - before) as f64 / 5000.0
    );
    delete_keys(&format!("{fleet_prefix}:*"));
    delete_keys(&format!("{prefix}:*"));
}
