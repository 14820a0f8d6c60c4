//! A real program with the real Kubernetes provider (`pulumi-resource-kubernetes` built in the bed), the
//! agent against a bare `pulumi up` of the same program side by side (`cargo bench -p pko-agent --bench
//! real_kubernetes`). A Pulumi YAML program of one ConfigMap in a fresh namespace of the bed's API
//! server, its data set from config that changes every run (so each `up` replaces it). Prints:
//! - the first `Run(up)` of a fresh agent (the provider plugin started cold) and the median of the next
//!   [`RUNS`], interleaved with as many bare `pulumi up`s of the same program (config set beforehand,
//!   outside the timing);
//! - the peak resident memory seen of the `pulumi` CLI and of the provider plugin over all runs
//!   (sampled every 50 ms from `/proc`).
//!
//! Real provider, real API server; no hollow agent.

#[path = "../crates/pko-agent/tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use pko_proto::v1::{OperationType, ResultStatus};

const PROGRAM: &str = "config:\n  ns: {type: string}\n  greeting: {type: string}\nresources:\n  cm:\n    type: kubernetes:core/v1:ConfigMap\n    properties:\n      metadata:\n        name: cm-${pulumi.stack}\n        namespace: ${ns}\n      data:\n        greeting: ${greeting}\noutputs:\n  name: ${cm.metadata.name}\n";
const RUNS: usize = 10;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The largest `VmRSS` (KiB) seen per process name (`comm`, 15 characters) until `stop`.
fn sample_peaks(stop: Arc<AtomicBool>, peaks: Arc<Mutex<HashMap<String, u64>>>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
                let name = status.lines().find_map(|l| l.strip_prefix("Name:")).map(|n| n.trim().to_string()).unwrap_or_default();
                if name != "pulumi" && !name.starts_with("pulumi-resource") {
                    continue;
                }
                let rss: u64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()).unwrap_or(0);
                let mut p = peaks.lock().unwrap();
                let e = p.entry(name).or_default();
                *e = (*e).max(rss);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("real_kubernetes: run with `cargo bench` (it times real Pulumi operations against the bed's API server)");
        return;
    }
    let env = pulumi_env();
    let bed = pko_testbed::testbed();
    let kubeconfig = bed.kubeconfig().display().to_string();
    let ns = format!("bench-k8s-{}", rand_suffix());
    let made = bed.kubectl().args(["create", "namespace", &ns]).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let dir = project(&env, "realk8s", PROGRAM);
    let agent = Agent::start(&env, &["--auth", "none"], &[("KUBECONFIG", kubeconfig.as_str())]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut c = agent.client().await;
    let (stop, peaks) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(HashMap::new())));
    let sampler = sample_peaks(stop.clone(), peaks.clone());
    let up = |i: usize| {
        let mut r = request(&env, &format!("up-{i}"), &dir, "agent", OperationType::Up);
        r.config = vec![config("ns", serde_json::json!(ns), false), config("greeting", serde_json::json!(format!("v{i}")), false)];
        r
    };
    let t = Instant::now();
    let first = result(&run(&mut c, up(0)).await);
    let cold = t.elapsed();
    assert_eq!(first.status, ResultStatus::Succeeded as i32, "{}", first.message);

    let bare = |args: &[&str]| {
        let out = env.pulumi(&dir).env("KUBECONFIG", &kubeconfig).args(args).output().unwrap();
        assert!(out.status.success(), "pulumi {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    bare(&["stack", "init", "bare", "--non-interactive"]);
    bare(&["config", "set", "ns", &ns, "--stack", "bare"]);
    let (mut agent_times, mut bare_times) = (Vec::new(), Vec::new());
    for i in 1..=RUNS {
        let t = Instant::now();
        let r = result(&run(&mut c, up(i)).await);
        agent_times.push(t.elapsed());
        assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
        bare(&["config", "set", "greeting", &format!("v{i}"), "--stack", "bare"]);
        let t = Instant::now();
        bare(&["up", "--yes", "--skip-preview", "--stack", "bare", "--non-interactive"]);
        bare_times.push(t.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let (a, b) = (median(agent_times), median(bare_times));
    println!("real Kubernetes provider, one ConfigMap replaced per up, {RUNS} interleaved runs each:");
    println!("  first Run(up) of a fresh agent (plugin cold): {cold:.2?}");
    println!("  Run(up) median {a:.2?}, bare pulumi up median {b:.2?}, ratio {:.2}", a.as_secs_f64() / b.as_secs_f64());
    let peaks = peaks.lock().unwrap();
    for (name, kib) in peaks.iter() {
        println!("  peak RSS {name}: {:.0} MiB", *kib as f64 / 1024.0);
    }
    let _ = bed.kubectl().args(["delete", "namespace", &ns, "--wait=false"]).output();
}
