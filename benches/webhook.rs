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

/// When each of a set of Stacks showed the sync request and, later, an Update of the pushed commit.
#[derive(Default)]
struct Seen {
    asked: std::collections::BTreeMap<String, Instant>,
    updated: std::collections::BTreeMap<String, Instant>,
}

/// Watches Stacks from now on and records the instant each of `names` first carries the request `push-<sha>` and the
/// instant it first shows an Update of `sha` (`status.currentUpdate` or `lastUpdate` at it), as the watch delivers
/// the change (limit 120 s).
async fn update_instants(api: kube::Api<Stack>, names: Vec<String>, sha: String) -> Seen {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let mut seen = Seen::default();
    let request = format!("push-{sha}");
    let stream = watcher(api, watcher::Config::default()).applied_objects();
    futures::pin_mut!(stream);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while seen.updated.len() < names.len() {
        let Ok(Some(Ok(s))) = tokio::time::timeout_at(deadline, stream.next()).await else { break };
        let name = s.metadata.name.clone().unwrap_or_default();
        if !names.contains(&name) {
            continue;
        }
        if !woken(std::slice::from_ref(&s), &request).is_empty() {
            seen.asked.entry(name.clone()).or_insert_with(Instant::now);
        }
        let status = s.status.as_ref();
        let current = status.and_then(|s| s.current_update.as_ref()).and_then(|u| u.commit.as_deref());
        let last = status.and_then(|s| s.last_update.as_ref()).and_then(|u| u.last_attempted_commit.as_deref());
        if current == Some(sha.as_str()) || last == Some(sha.as_str()) {
            seen.updated.entry(name).or_insert_with(Instant::now);
        }
    }
    seen
}

/// Delivers with `deliver` while a watch (started first) records when each of `names` gets an Update of `sha`: the
/// answer's status, the seconds to the answer, each Stack's seconds from the delivery to its Update, and the median
/// seconds from the delivery to the request on a Stack.
async fn timed<F: std::future::Future<Output = u16>>(
    api: &kube::Api<Stack>,
    names: Vec<String>,
    sha: &str,
    deliver: F,
) -> (u16, f64, Vec<f64>, f64) {
    let watch = tokio::spawn(update_instants(api.clone(), names.clone(), sha.to_string()));
    tokio::time::sleep(Duration::from_secs(2)).await; // the watch's initial list of every Stack
    let t0 = Instant::now();
    let code = deliver.await;
    let answered = t0.elapsed().as_secs_f64();
    let seen = watch.await.unwrap();
    let secs = |i: Option<&Instant>| i.map_or(f64::NAN, |i| i.duration_since(t0).as_secs_f64());
    let times = names.iter().map(|n| secs(seen.updated.get(n))).collect();
    let asked: Vec<f64> = seen.asked.values().map(|i| secs(Some(i))).collect();
    (code, answered, times, median_max(&asked).0)
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s.get(((s.len() as f64 * q) as usize).min(s.len().saturating_sub(1))).copied().unwrap_or(f64::NAN)
}

fn median_max(v: &[f64]) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    (s.get(s.len() / 2).copied().unwrap_or(f64::NAN), s.last().copied().unwrap_or(f64::NAN))
}

/// `pko_git_listings_total` in a Prometheus text exposition (0 when absent).
fn listings(metrics: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with("pko_git_listings_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
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
    if std::env::var("RUST_LOG").is_ok() {
        tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
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
    let reconciles = std::env::var("RECONCILES").ok();
    let mut args: Vec<&str> = args.to_vec();
    if let Some(r) = reconciles.as_deref() {
        args.extend(["--max-concurrent-reconciles", r]);
    }
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
    let push3 = body(&git.url("r3.git"), &sha);
    let listings = || async { listings(&op.metrics().await) };
    let listed_before = listings().await;
    let (code, hook_s, times, asked) = timed(&stacks, of_repo(3), &sha, deliver(&http, &url, &push3, TOKEN)).await;
    assert_eq!(code, 200);
    let listed = listings().await - listed_before;
    let list = stacks.list(&Default::default()).await.unwrap().items;
    let mut woke = woken(&list, &format!("push-{sha}"));
    woke.sort();
    let mut want = of_repo(3);
    want.sort();
    let (med, max) = median_max(&times);
    let p90 = quantile(&times, 0.9);
    println!(
        "| HOLLOW AGENTS | {n} Stacks, {repos} repositories | one signed push hook | answered in {hook_s:.2} s | \
        woke {} Stacks ({} expected, exactly them: {}) | push -> Update median {med:.2} s, p90 {p90:.2} s, \
        max {max:.2} s (request on the Stack: median {asked:.2} s) | git ls-remote listings for them: {listed} |",
        woke.len(),
        want.len(),
        woke == want
    );

    // a flood of forged deliveries beside a second push: the push is delivered 100 ms into the flood
    let sha5 = push_commit(&root, "r5.git", "two");
    let forged = Arc::new(body(&git.url("r5.git"), &sha5));
    let (url2, http2) = (Arc::new(url.clone()), http.clone());
    let flooding = std::sync::Mutex::new(None);
    let push5 = body(&git.url("r5.git"), &sha5);
    let (code, _, times5, _) = timed(&stacks, of_repo(5), &sha5, async {
        *flooding.lock().unwrap() = Some(tokio::spawn(flood_of(url2, http2, forged, flood)));
        tokio::time::sleep(Duration::from_millis(100)).await;
        deliver(&http, &url, &push5, TOKEN).await
    })
    .await;
    assert_eq!(code, 200);
    let handle = flooding.lock().unwrap().take().unwrap();
    let (refused, secs) = handle.await.unwrap();
    let (med5, max5) = median_max(&times5);
    println!(
        "| HOLLOW AGENTS | flood of {flood} forged deliveries, 32 at a time | {refused} refused (401) in {secs:.1} s = \
        {:.0}/s | a push during it: Update median {med5:.2} s, max {max5:.2} s (without the flood: {med:.2} / \
        {max:.2}) |",
        refused as f64 / secs
    );
    let _ = testbed_namespace_cleanup(&ns);
}

/// `n` deliveries of `body` signed with a wrong key, 32 at a time: how many were refused (401), in how many seconds.
async fn flood_of(url: Arc<String>, http: reqwest::Client, body: Arc<Vec<u8>>, n: usize) -> (usize, f64) {
    let (sem, t) = (Arc::new(tokio::sync::Semaphore::new(32)), Instant::now());
    let mut tasks = Vec::new();
    for _ in 0..n {
        let permit = sem.clone().acquire_owned().await.unwrap();
        let (u, h, b) = (url.clone(), http.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let code = deliver(&h, &u, &b, "not-the-token").await;
            drop(permit);
            code
        }));
    }
    let mut refused = 0;
    for task in tasks {
        refused += usize::from(task.await.unwrap() == 401);
    }
    (refused, t.elapsed().as_secs_f64())
}

fn testbed_namespace_cleanup(ns: &pko_testbed::TestNamespace) -> std::process::Output {
    pko_testbed::testbed().kubectl().args(["delete", "namespace", ns.name(), "--wait=false"]).output().unwrap()
}
