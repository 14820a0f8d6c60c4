//! Receivers at scale (`cargo bench -p pko-operator --bench webhook`; `STACKS=1000`, `REPOS=10`, `FLOOD=2000`).
//!
//! HOLLOW AGENTS (`--hollow-agents-seconds 1`: the real agent binary simulating operations; the control plane is what
//! is measured): STACKS Stacks tracking `main` of REPOS git repositories (served over HTTP on loopback), one operator
//! in this process with a pool, `resyncFrequencySeconds: 3600` so no poll interferes. Once all are Ready: a commit is
//! pushed to repository 3 and delivered as one signed GitHub hook; prints how many Stacks it woke (exactly those of
//! repository 3, each once) and the time from the delivery to each one's new Update (`status.currentUpdate` at the
//! pushed commit): median and max. Then FLOOD deliveries with a bad signature, 32 at a time, while a second push (to
//! repository 5) is delivered: rejected requests per second, and that push's times beside the first's.

#[path = "../crates/pko-operator/tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::Secret;
use pko_api::{Receiver, Stack};
use pko_testbed::eventually;
use serde_json::json;

const TOKEN: &str = "bench-hook-token";

fn var(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn program(word: &str) -> String {
    format!("name: app\nruntime: yaml\noutputs:\n  word: {word}\n")
}

fn push_commit(root: &std::path::Path, name: &str, word: &str) -> String {
    let work = root.join(format!(".work-{name}"));
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git").args(args).current_dir(&work).output().unwrap();
        assert!(out.status.success(), "git {args:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    std::fs::write(work.join("Pulumi.yaml"), program(word)).unwrap();
    git(&["-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q", "-am", word]);
    git(&["push", "-q", root.join(name).to_str().unwrap(), "main"]);
    git(&["rev-parse", "HEAD"])
}

fn body(repo_url: &str, sha: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"ref": "refs/heads/main", "after": sha, "repository": {"clone_url": repo_url}})).unwrap()
}

async fn deliver(http: &reqwest::Client, url: &str, body: &[u8], key: &str) -> u16 {
    let sig = pko_operator::receiver::verify::sign(key.as_bytes(), body);
    let req = http.post(url).header("X-GitHub-Event", "push").header("X-Hub-Signature-256", format!("sha256={sig}"));
    req.body(body.to_vec()).send().await.map(|r| r.status().as_u16()).unwrap_or(0)
}

/// Seconds from `t0` until each Stack of `names` shows an Update of `sha`, polled every 100 ms (limit 120 s).
async fn update_times(api: &kube::Api<Stack>, names: &[String], sha: &str, t0: Instant) -> Vec<f64> {
    let mut times = vec![None; names.len()];
    while times.iter().any(Option::is_none) && t0.elapsed() < Duration::from_secs(120) {
        let list = api.list(&Default::default()).await.unwrap().items;
        for (i, n) in names.iter().enumerate() {
            let s = list.iter().find(|s| s.metadata.name.as_deref() == Some(n));
            let status = s.and_then(|s| s.status.as_ref());
            let current = status.and_then(|s| s.current_update.as_ref()).and_then(|u| u.commit.as_deref());
            let last = status.and_then(|s| s.last_update.as_ref()).and_then(|u| u.last_attempted_commit.as_deref());
            if times[i].is_none() && (current == Some(sha) || last == Some(sha)) {
                times[i] = Some(t0.elapsed().as_secs_f64());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    times.into_iter().map(|t| t.unwrap_or(f64::NAN)).collect()
}

fn median_max(v: &[f64]) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    (s.get(s.len() / 2).copied().unwrap_or(f64::NAN), s.last().copied().unwrap_or(f64::NAN))
}

fn woken(list: &[Stack], value: &str) -> Vec<String> {
    let key = pko_api::constants::RECONCILE_REQUEST_ANNOTATION;
    list.iter()
        .filter(|s| s.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str) == Some(value))
        .filter_map(|s| s.metadata.name.clone())
        .collect()
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let (n, repos, flood) = (var("STACKS", 1000), var("REPOS", 10), var("FLOOD", 2000));
    let (client, ns, env) = setup("hooks").await;
    passphrase_secret(&ns).await;
    let root = env.dir().join("repos");
    std::fs::create_dir_all(&root).unwrap();
    for r in 0..repos {
        pko_testbed::git::bare_repo_with(&root, &format!("r{r}.git"), &[("Pulumi.yaml", &program("one"))]);
    }
    let git = pko_testbed::git::GitHttpServer::start(&root, "127.0.0.1:0", None).await.unwrap();
    let args = [
        "--webhook-bind-address",
        "127.0.0.1:0",
        "--hollow-agents-seconds",
        "1",
        "--agent-pools",
        "--pool-max-agents",
        "16",
        "--max-operations",
        "32",
    ];
    let op = InProcessOperator::start_with(&client, &env, run_args_with(&env, ns.name(), &args)).await;
    let hook = op.running.as_ref().unwrap().webhook_addr.unwrap();
    let secret =
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hook"}, "stringData": {"token": TOKEN}});
    create(&ns.api::<Secret>(), secret).await;
    create(
        &ns.api::<Receiver>(),
        json!({"apiVersion": "pulumi.com/v1alpha1", "kind": "Receiver",
        "metadata": {"name": "pushes"}, "spec": {"type": "github", "secretRef": {"name": "hook"},
            "resources": [{"kind": "Stack", "name": "*"}]}}),
    )
    .await;
    let stacks = ns.api::<Stack>();
    let names: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
    let t = Instant::now();
    for (i, name) in names.iter().enumerate() {
        create(
            &stacks,
            json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name},
            "spec": {"stack": name, "backend": env.backend_url(),
                "projectRepo": git.url(&format!("r{}.git", i % repos)),
                "branch": "main", "resyncFrequencySeconds": 3600, "envRefs": passphrase_env_refs()}}),
        )
        .await;
    }
    eventually("every Stack Ready", 1800, || async {
        stacks.list(&Default::default()).await.unwrap().items.iter().filter(|s| ready(s)).count() == n
    })
    .await;
    eprintln!("{n} Stacks Ready (HOLLOW AGENTS) in {:.0} s", t.elapsed().as_secs_f64());
    let receivers = ns.api::<Receiver>();
    let path = receivers.get("pushes").await.unwrap().status.and_then(|s| s.webhook_path).unwrap();
    let url = format!("http://{hook}{path}");
    let http = reqwest::Client::new();

    let of_repo = |r: usize| -> Vec<String> {
        names.iter().enumerate().filter(|(i, _)| i % repos == r).map(|(_, n)| n.clone()).collect()
    };
    let sha = push_commit(&root, "r3.git", "two");
    let t0 = Instant::now();
    assert_eq!(deliver(&http, &url, &body(&git.url("r3.git"), &sha), TOKEN).await, 200);
    let hook_s = t0.elapsed().as_secs_f64();
    let times = update_times(&stacks, &of_repo(3), &sha, t0).await;
    let list = stacks.list(&Default::default()).await.unwrap().items;
    let mut woke = woken(&list, &format!("push-{sha}"));
    woke.sort();
    let mut want = of_repo(3);
    want.sort();
    let (med, max) = median_max(&times);
    println!(
        "| HOLLOW AGENTS | {n} Stacks, {repos} repositories | one signed push hook | answered in {hook_s:.2} s | \
        woke {} Stacks ({} expected, exactly them: {}) | push -> Update median {med:.2} s, max {max:.2} s |",
        woke.len(),
        want.len(),
        woke == want
    );

    // a flood of forged deliveries beside a second push
    let sha5 = push_commit(&root, "r5.git", "two");
    let (url2, http2) = (Arc::new(url.clone()), http.clone());
    let forged = body(&git.url("r5.git"), &sha5);
    let t1 = Instant::now();
    let flooding = tokio::spawn(async move {
        let sem = Arc::new(tokio::sync::Semaphore::new(32));
        let mut tasks = Vec::new();
        for _ in 0..flood {
            let permit = sem.clone().acquire_owned().await.unwrap();
            let (u, h, b) = (url2.clone(), http2.clone(), forged.clone());
            tasks.push(tokio::spawn(async move {
                let code = deliver(&h, &u, &b, "not-the-token").await;
                drop(permit);
                code
            }));
        }
        let mut refused = 0;
        for t in tasks {
            refused += usize::from(t.await.unwrap() == 401);
        }
        (refused, t1.elapsed().as_secs_f64())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t2 = Instant::now();
    assert_eq!(deliver(&http, &url, &body(&git.url("r5.git"), &sha5), TOKEN).await, 200);
    let times5 = update_times(&stacks, &of_repo(5), &sha5, t2).await;
    let (refused, secs) = flooding.await.unwrap();
    let (med5, max5) = median_max(&times5);
    println!(
        "| HOLLOW AGENTS | flood of {flood} forged deliveries, 32 at a time | {refused} refused (401) in {secs:.1} s = \
        {:.0}/s | a push during it: Update median {med5:.2} s, max {max5:.2} s (without the flood: {med:.2} / \
        {max:.2}) |",
        refused as f64 / secs
    );
    let _ = testbed_namespace_cleanup(&ns);
}

fn testbed_namespace_cleanup(ns: &pko_testbed::TestNamespace) -> std::process::Output {
    pko_testbed::testbed().kubectl().args(["delete", "namespace", ns.name(), "--wait=false"]).output().unwrap()
}
