//! Agent overhead against the real Pulumi CLI of the test bed (`cargo bench -p pko-agent --bench
//! agent_overhead`). Prints:
//! - the median over 10 runs of `Run(up)` on a warm cache minus a bare `pulumi up` of the same program;
//! - the first operation on a cold cache (git clone) against the same operation warm;
//! - the resident memory of an idle agent;
//! - what per-operation isolation costs (`--isolate-operations`, the pools' default, against a
//!   Workspace's own agent that runs in the cached source): median of 20 `up`s each, interleaved, for a
//!   small YAML program and for the same program beside 100 MiB in 5,000 files (a `node_modules`), with
//!   the largest operation directory seen on disk.

#[path = "../crates/pko-agent/tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use pko_proto::v1::{GitSource, OperationType, ResultStatus, Source, source};

const PROGRAM: &str = "resources:\n  c:\n    type: command:local:Command\n    properties:\n      create: echo \
    hi\noutputs:\n  out: ${c.stdout}\n";
const RUNS: usize = 10;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("agent_overhead: run with `cargo bench` (it times real Pulumi operations)");
        return;
    }
    let env = pulumi_env();
    let dir = project(&env, "overhead", PROGRAM);
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = rss_kib(agent.child.id());
    let mut c = agent.client().await;
    let warm = result(&run(&mut c, request(&env, "warmup", &dir, "dev", OperationType::Up)).await);
    assert_eq!(warm.status, ResultStatus::Succeeded as i32, "{}", warm.message);

    let mut agent_times = Vec::new();
    let mut bare_times = Vec::new();
    for i in 0..RUNS {
        let t = Instant::now();
        let r = result(&run(&mut c, request(&env, &format!("up-{i}"), &dir, "dev", OperationType::Up)).await);
        agent_times.push(t.elapsed());
        assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
        let t = Instant::now();
        let out = env
            .pulumi(&dir)
            .args(["up", "--yes", "--skip-preview", "--stack", "dev", "--non-interactive"])
            .output()
            .unwrap();
        bare_times.push(t.elapsed());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let (a, b) = (median(agent_times.clone()), median(bare_times.clone()));
    println!(
        "Run(up) median {a:?}, bare pulumi up median {b:?}, agent overhead {:?} ({} runs each)",
        a.saturating_sub(b),
        RUNS
    );

    // cold vs warm first operation: a git source cloned on first use
    let repo = env.dir().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("Pulumi.yaml"), format!("name: coldwarm\nruntime: yaml\n{PROGRAM}")).unwrap();
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["add", "."],
        &["-c", "user.email=b@e", "-c", "user.name=b", "commit", "-q", "-m", "x"],
    ] {
        assert!(std::process::Command::new("git").args(args).current_dir(&repo).status().unwrap().success());
    }
    let fresh = Agent::start(&env, &["--auth", "none"], &[]);
    let mut f = fresh.client().await;
    let git = |id: &str| {
        let mut r = request(&env, id, &repo, "cold", OperationType::Up);
        r.source = Some(Source {
            kind: Some(source::Kind::Git(GitSource {
                url: format!("file://{}", repo.display()),
                revision: "main".into(),
                ..Default::default()
            })),
        });
        r
    };
    let t = Instant::now();
    assert_eq!(result(&run(&mut f, git("cold-1")).await).status, ResultStatus::Succeeded as i32);
    let cold = t.elapsed();
    let t = Instant::now();
    assert_eq!(result(&run(&mut f, git("cold-2")).await).status, ResultStatus::Succeeded as i32);
    let warm = t.elapsed();
    println!("first operation cold (clone + stack create) {cold:?}, same operation warm {warm:?}");
    println!(
        "idle agent resident memory {idle} KiB at start, {} KiB after {} operations",
        rss_kib(agent.child.id()),
        RUNS + 1
    );
    isolation_cost(&env).await;
}

/// Bytes of the regular files under `dir` (not following links).
fn du(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => total += du(&e.path()),
            Ok(t) if t.is_file() => total += e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => {}
        }
    }
    total
}

/// Isolated against shared operations, side by side: 20 `up`s each, interleaved, on two agents.
async fn isolation_cost(env: &pko_testbed::PulumiEnv) {
    const TURNS: usize = 20;
    let small = project(env, "iso-small", PROGRAM);
    let big = project(env, "iso-big", PROGRAM);
    for d in 0..50 {
        let sub = big.join("node_modules").join(format!("pkg{d}"));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..100 {
            std::fs::write(sub.join(format!("f{f}.js")), vec![b'x'; 20 * 1024 + f]).unwrap();
        }
    }
    let isolated = Agent::start(env, &["--auth", "none"], &[]);
    let shared = Agent::start(env, &["--auth", "none", "--isolate-operations=false"], &[]);
    let (mut ci, mut cs) = (isolated.client().await, shared.client().await);
    for (label, dir) in [("small YAML program", &small), ("beside 100 MiB in 5,000 files", &big)] {
        let ops = isolated.work.path().join("ops");
        let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let (peak, stop, ops) = (peak.clone(), stop.clone(), ops.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    peak.fetch_max(du(&ops), std::sync::atomic::Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let (mut ti, mut ts) = (Vec::new(), Vec::new());
        for i in 0..=TURNS {
            for (times, client, who) in [(&mut ti, &mut ci, "iso"), (&mut ts, &mut cs, "shared")] {
                let t = Instant::now();
                let r = result(
                    &run(
                        client,
                        request(
                            env,
                            &format!("{who}-{label}-{i}"),
                            dir,
                            &format!("{who}{}", label.len()),
                            OperationType::Up,
                        ),
                    )
                    .await,
                );
                assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
                if i > 0 {
                    times.push(t.elapsed()); // turn 0 warms the cache and creates the stack
                }
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        sampler.join().unwrap();
        let (mi, ms) = (median(ti), median(ts));
        println!(
            "isolation, {label}: isolated up median {mi:?}, shared {ms:?}, cost {:?} ({:.2}x); largest operation \
                directory {:.0} KiB ({TURNS} runs each)",
            mi.saturating_sub(ms),
            mi.as_secs_f64() / ms.as_secs_f64(),
            peak.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1024.0
        );
    }
}
