//! End to end on real programs, side by side with a bare `pulumi` loop (`cargo bench -p pko-operator --bench
//! real_stacks`; `LANGUAGE=typescript|python|go`, `STACKS=50`, `CONCURRENCY=2`, `ROUNDS=2`).
//!
//! STACKS Stacks of the bed's Kubernetes program in one language (`scripts/testbed/programs/<language>-kubernetes`: a
//! ConfigMap, a Deployment, a Service, with the real Kubernetes provider), each deploying into a namespace of its own,
//! from one git repository, on one operator in this process with a pool of at most CONCURRENCY agents and
//! `--max-operations CONCURRENCY`. Every Stack is applied and becomes Ready once (the pool's agents install the
//! revision: untimed), then ROUNDS times a config change of every Stack is applied and the time to all Ready at the new
//! generation is taken (the first round finds a Stack's own caches only on the agent that ran its first deploy; a
//! later one on every agent it ran on). Side by side, in the same run: the same programs as STACKS bare checkouts (the
//! dependency tree installed once and linked into each, as a developer's machine would share it), deployed once, then
//! per round `pulumi config set` + `pulumi up` of the same change over all of them, CONCURRENCY at a time, timed.
//! Prints both and their ratio per round, and the CPU seconds each round spent (the machine, this process, the pool's
//! agents, the bed's control plane) and the API server's requests by verb and resource. `STACK_ENV="K=V K2=V2"` adds
//! variables to both sides (e.g. `GOFLAGS=-buildvcs=false`, to measure what Go's VCS stamping of a git checkout
//! costs).
//! `AFFINITY_WAIT=<seconds>` sets the operator's `--pool-affinity-wait-seconds` (default 6, the operator's; 0: an
//! operation never waits for the agent that ran its Stack last, the behaviour before that flag).

#[path = "../crates/pko-operator/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use kube::api::{Patch, PatchParams};
use pko_api::Stack;
use pko_testbed::api_load::Requests;
use pko_testbed::cpu::{CpuMeter, CpuUse};
use pko_testbed::testbed;
use serde_json::json;

/// A language's program: its directory under `scripts/testbed/programs`, its files, the Kubernetes provider version
/// its SDK asks for, and the variables its tools need on this offline bed.
struct Language {
    dir: &'static str,
    files: &'static [&'static str],
    plugin_version: &'static str,
    env: Vec<(&'static str, String)>,
    /// The dependency tree `pulumi install` makes, linked into each bare checkout (none: nothing to share).
    tree: Option<&'static str>,
}

fn language(name: &str) -> Language {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    match name {
        "python" => Language {
            dir: "python-kubernetes",
            files: &["Pulumi.yaml", "__main__.py", "requirements.txt"],
            plugin_version: "4.24.0",
            env: vec![],
            tree: None,
        },
        "go" => Language {
            dir: "go-kubernetes",
            files: &["Pulumi.yaml", "go.mod", "go.sum", "main.go"],
            plugin_version: "4.24.0",
            env: pko_testbed::offline_go_env().to_vec(),
            tree: None,
        },
        _ => Language {
            dir: "typescript-kubernetes",
            files: &["Pulumi.yaml", "package.json", "index.ts"],
            plugin_version: "4.24.1",
            env: vec![("npm_config_cache", format!("{home}/.npm"))],
            tree: Some("node_modules"),
        },
    }
}

/// The variables `STACK_ENV` names (`K=V` separated by spaces), added to the language's.
fn extra_env() -> Vec<(&'static str, String)> {
    let text = std::env::var("STACK_ENV").unwrap_or_default();
    text.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (&*Box::leak(k.to_string().into_boxed_str()), v.to_string()))
        .collect()
}

fn var(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Waits until every Stack in `stacks` is Ready at a generation at least `generations[i]`, printing progress every
/// 10 s; from a watch of the Stacks (polling lists of every Stack would cost the API server more than the operator
/// does: 50 Stacks listed every 250 ms was 10 CPU-s a round). Panics after `limit`.
async fn all_ready(api: &kube::Api<Stack>, names: &[String], generations: &[i64], what: &str, limit: Duration) {
    use futures::TryStreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let wanted: std::collections::HashMap<&str, i64> =
        names.iter().map(String::as_str).zip(generations.iter().copied()).collect();
    let mut done = std::collections::HashSet::new();
    let start = Instant::now();
    let mut stream =
        std::pin::pin!(watcher(api.clone(), watcher::Config::default()).default_backoff().applied_objects());
    while done.len() < names.len() {
        let left = limit.saturating_sub(start.elapsed());
        let next = tokio::time::timeout(left.min(Duration::from_secs(10)), stream.try_next()).await;
        match next {
            Ok(Ok(Some(s))) => {
                let name = s.metadata.name.clone().unwrap_or_default();
                let Some(g) = wanted.get(name.as_str()) else { continue };
                let at = s.status.as_ref().and_then(|st| st.last_update.as_ref()).and_then(|l| l.generation);
                if ready(&s) && at >= Some(*g) {
                    done.insert(name);
                } else {
                    done.remove(&name);
                }
            }
            Ok(Ok(None)) => panic!("{what}: the watch of the Stacks ended"),
            Ok(Err(e)) => panic!("{what}: watching the Stacks: {e}"),
            Err(_) => {
                eprintln!("  {what}: {}/{} Ready after {:.0} s", done.len(), names.len(), start.elapsed().as_secs_f64())
            }
        }
        assert!(start.elapsed() < limit, "{what}: {}/{} Ready after {limit:?}", done.len(), names.len());
    }
}

/// Runs `pulumi args` in `dir` with the bed's settings and `vars`. Panics when it fails.
fn pulumi(env: &pko_testbed::PulumiEnv, dir: &Path, vars: &[(String, String)], args: &[&str]) {
    let out = env.pulumi(dir).envs(vars.iter().map(|(k, v)| (k, v))).args(args).output().unwrap();
    assert!(out.status.success(), "pulumi {args:?} in {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
}

/// Runs `step(i)` for every checkout, `c` at a time; returns the wall time.
async fn bare_round(n: usize, c: usize, step: impl Fn(usize) + Send + Sync + 'static) -> Duration {
    let (step, sem, t) = (Arc::new(step), Arc::new(tokio::sync::Semaphore::new(c)), Instant::now());
    let mut tasks = Vec::new();
    for i in 0..n {
        let (step, permit) = (step.clone(), sem.clone().acquire_owned().await.unwrap());
        tasks.push(tokio::task::spawn_blocking(move || {
            step(i);
            drop(permit);
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    t.elapsed()
}

/// Creates the namespaces `names` and, in each, binds `edit` to `subject` (when given), in two kubectl calls.
fn namespaces(names: &[String], subject: Option<&str>) {
    let mut docs = String::new();
    for n in names {
        docs.push_str(&format!("---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: {n}}}\n"));
        if let Some((sa_ns, sa)) = subject.and_then(|s| s.split_once(':')) {
            docs.push_str(&format!(
                "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: deployer, \
                 namespace: {n}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}}\n\
                 subjects: [{{kind: ServiceAccount, name: {sa}, namespace: {sa_ns}}}]\n"
            ));
        }
    }
    let file = std::env::temp_dir().join(format!("real-stacks-{}.yaml", std::process::id()));
    std::fs::write(&file, docs).unwrap();
    let out = testbed().kubectl().args(["apply", "-f"]).arg(&file).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The bare checkouts: the program's files in `root/<i>`, the dependency tree installed once (in `root/0`) and
/// linked into the others; each stack initialised with its namespace.
fn checkouts(env: &pko_testbed::PulumiEnv, lang: &Language, vars: &[(String, String)], root: &Path, ns: &[String]) {
    let src = pko_testbed::repo_root().join("scripts/testbed/programs").join(lang.dir);
    for (i, ns) in ns.iter().enumerate() {
        let dir = root.join(i.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        for f in lang.files {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        if i == 0 && lang.tree.is_some() {
            pulumi(env, &dir, vars, &["install"]);
        } else if let Some(tree) = lang.tree {
            std::os::unix::fs::symlink(root.join("0").join(tree), dir.join(tree)).unwrap();
        }
        pulumi(env, &dir, vars, &["stack", "init", &format!("bare-{i}"), "--non-interactive"]);
        pulumi(env, &dir, vars, &["config", "set", "ns", ns, "--stack", &format!("bare-{i}")]);
    }
}

/// `pulumi config set greeting <greeting>` + `pulumi up` in checkout `i`; prints each one's seconds (stderr).
fn bare_up(env: &pko_testbed::PulumiEnv, vars: &[(String, String)], root: &Path, i: usize, greeting: &str) {
    let (dir, stack) = (root.join(i.to_string()), format!("bare-{i}"));
    let t = Instant::now();
    pulumi(env, &dir, vars, &["config", "set", "greeting", greeting, "--stack", &stack]);
    let set = t.elapsed();
    pulumi(env, &dir, vars, &["up", "--yes", "--skip-preview", "--non-interactive", "--stack", &stack]);
    eprintln!(
        "  bare {i} {greeting}: config_set_s={:.2} up_s={:.2}",
        set.as_secs_f64(),
        (t.elapsed() - set).as_secs_f64()
    );
}

/// The git repository of the program (served over HTTP) and the plugin server its agents download from.
async fn sources(
    env: &pko_testbed::PulumiEnv,
    lang: &Language,
) -> (pko_testbed::git::GitHttpServer, pko_testbed::plugins::PluginServer) {
    let src = pko_testbed::repo_root().join("scripts/testbed/programs").join(lang.dir);
    let files: Vec<(&str, String)> =
        lang.files.iter().map(|f| (*f, std::fs::read_to_string(src.join(f)).unwrap())).collect();
    let files: Vec<(&str, &str)> = files.iter().map(|(f, text)| (*f, text.as_str())).collect();
    let repos = env.dir().join("repos");
    std::fs::create_dir_all(&repos).unwrap();
    pko_testbed::git::bare_repo_with(&repos, "app.git", &files);
    let git = pko_testbed::git::GitHttpServer::start(&repos, "127.0.0.1:0", None).await.unwrap();
    let plugins = pko_testbed::plugins::PluginServer::kubernetes(&[lang.plugin_version], Default::default()).await;
    (git, plugins)
}

/// What a round spent: its CPU ([`CpuUse`]) and the API server's requests by verb and resource.
struct Spent {
    cpu: CpuUse,
    requests: Vec<(String, f64)>,
}

/// Starts measuring a round; the closure it returns gives what the round spent.
fn meter() -> impl FnOnce() -> Spent {
    let (cpu, requests) = (CpuMeter::start(&measured()), Requests::now(testbed()));
    move || Spent { cpu: cpu.spent(), requests: Requests::now(testbed()).since(&requests) }
}

/// The processes whose CPU a round reports: this process (the operator, in the operator's rounds), the pool's agents
/// running when the round starts (their own time, not their `pulumi`'s) and the bed's control plane.
fn measured() -> Vec<(String, i32)> {
    let run = PathBuf::from(testbed().var("PKO_TESTBED_RUN"));
    let mut all = vec![("this process".to_string(), std::process::id() as i32)];
    all.extend(pko_testbed::cpu::named("pko-agent"));
    all.extend(pko_testbed::cpu::control_plane(&run));
    all
}

/// Creates the Stacks `names` (Stack i deploys into `target[i]`) and waits until all are Ready; then, `rounds` times,
/// changes every Stack's config and waits until all are Ready at the new generation. Returns the first apply's time
/// and each round's, with what it spent ([`Spent`]).
async fn operator_rounds(
    stacks: &kube::Api<Stack>,
    names: &[String],
    specs: Vec<serde_json::Value>,
    rounds: usize,
) -> (Duration, Vec<(Duration, Spent)>) {
    let t = Instant::now();
    for (name, spec) in names.iter().zip(specs) {
        let stack = json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name}, "spec": spec});
        create(stacks, stack).await;
    }
    all_ready(stacks, names, &vec![1; names.len()], "first apply", Duration::from_secs(3600)).await;
    let first = t.elapsed();
    let mut times = Vec::new();
    for round in 1..=rounds {
        let (t, spent) = (Instant::now(), meter());
        let mut generations = Vec::new();
        for name in names {
            let patch = json!({"spec": {"config": {"greeting": format!("v{round}")}}});
            let s = stacks.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
            generations.push(s.metadata.generation.unwrap_or(1));
        }
        all_ready(stacks, names, &generations, &format!("config change {round}"), Duration::from_secs(3600)).await;
        times.push((t.elapsed(), spent()));
    }
    (first, times)
}

/// The bare loop: checkouts made, deployed once, then `rounds` rounds of the config change, `c` at a time. Returns the
/// first deploy's time and each round's, with what it spent ([`Spent`]).
async fn bare_rounds(
    env: pko_testbed::PulumiEnv,
    lang: &Language,
    vars: Vec<(String, String)>,
    targets: &[String],
    (c, rounds): (usize, usize),
) -> (Duration, Vec<(Duration, Spent)>) {
    let n = targets.len();
    let root: PathBuf = env.dir().join("bare");
    checkouts(&env, lang, &vars, &root, targets);
    let (env, vars, root) = (Arc::new(env), Arc::new(vars), Arc::new(root));
    let mut times = Vec::new();
    for round in 0..=rounds {
        let (e, v, r) = (env.clone(), vars.clone(), root.clone());
        let spent = meter();
        let time = bare_round(n, c, move |i| bare_up(&e, &v, &r, i, &format!("v{round}"))).await;
        times.push((time, spent()));
    }
    let (first, _) = times.remove(0);
    (first, times)
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("real_stacks: run with `cargo bench` (it times real Pulumi operations)");
        return;
    }
    // the bare `pulumi` must not inherit an ignored SIGINT
    pko_testbed::exit_on_interrupt();
    let name = std::env::var("LANGUAGE").unwrap_or_else(|_| "typescript".into());
    let (n, c, rounds) = (var("STACKS", 50), var("CONCURRENCY", 2), var("ROUNDS", 2));
    let mut lang = language(&name);
    lang.env.extend(extra_env());
    let (client, ns, env) = setup("e2e").await;
    let (git, plugins) = sources(&env, &lang).await;
    passphrase_secret(&ns).await;
    let op_ns: Vec<String> = (0..n).map(|i| format!("{}-op-{i}", ns.name())).collect();
    let bare_ns: Vec<String> = (0..n).map(|i| format!("{}-bare-{i}", ns.name())).collect();
    namespaces(&op_ns, Some(&format!("{}:default", ns.name())));
    namespaces(&bare_ns, None);
    let c_arg = c.to_string();
    let wait = std::env::var("AFFINITY_WAIT").unwrap_or_else(|_| "6".into());
    let args = [
        "--agent-pools",
        "--max-operations",
        &c_arg,
        "--pool-max-agents",
        &c_arg,
        "--pool-affinity-wait-seconds",
        &wait,
    ];
    let op = InProcessOperator::start_with(&client, &env, run_args_with(&env, ns.name(), &args)).await;
    let literal = |v: &str| json!({"type": "Literal", "literal": {"value": v}});
    let mut env_refs = passphrase_env_refs();
    env_refs["PULUMI_PLUGIN_DOWNLOAD_URL_OVERRIDES"] = literal(&plugins.overrides());
    for (k, v) in &lang.env {
        env_refs[*k] = literal(v);
    }
    let names: Vec<String> = (0..n).map(|i| format!("s-{i}")).collect();
    let specs = op_ns
        .iter()
        .zip(&names)
        .map(|(target, name)| {
            json!({"stack": name, "backend": env.backend_url(), "envRefs": env_refs,
                "projectRepo": git.url("app.git"), "branch": "main", "config": {"ns": target, "greeting": "v0"}})
        })
        .collect();
    let (first, operator) = operator_rounds(&ns.api::<Stack>(), &names, specs, rounds).await;
    let dispatch: Vec<String> = op
        .metrics()
        .await
        .lines()
        .filter(|l| l.starts_with("pko_pool_lends_total") || l.starts_with("pko_update_operations_held_total"))
        .map(str::to_string)
        .collect();

    let mut vars: Vec<(String, String)> = lang.env.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    vars.push(("KUBECONFIG".into(), testbed().kubeconfig().display().to_string()));
    vars.push(("PULUMI_PLUGIN_DOWNLOAD_URL_OVERRIDES".into(), plugins.overrides()));
    let (bare_first, bare) = bare_rounds(env, &lang, vars, &bare_ns, (c, rounds)).await;

    println!(
        "{name}: {n} Stacks, {c} at a time (real Kubernetes provider), affinity wait {wait} s. First apply -> all \
         Ready (installs included): {:.1} s; bare first deploy: {:.1} s",
        first.as_secs_f64(),
        bare_first.as_secs_f64()
    );
    println!(
        "| language | Stacks | at once | round | config change -> all Ready (operator) | bare config set + up loop | \
         operator / bare |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (round, ((o, _), (b, _))) in operator.iter().zip(&bare).enumerate() {
        let (o, b) = (o.as_secs_f64(), b.as_secs_f64());
        println!("| {name} | {n} | {c} | {} | {o:.1} s | {b:.1} s | {:.2} |", round + 1, o / b);
    }
    for (round, ((_, o), (_, b))) in operator.iter().zip(&bare).enumerate() {
        println!("cpu, round {}: operator's {}; bare loop's {}", round + 1, o.cpu, b.cpu);
        let top = |r: &[(String, f64)]| r.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ");
        let total = |r: &[(String, f64)]| r.iter().map(|(_, v)| v).sum::<f64>();
        println!(
            "api requests, round {}: operator's {} ({}); bare loop's {} ({})",
            round + 1,
            total(&o.requests),
            top(&o.requests),
            total(&b.requests),
            top(&b.requests)
        );
    }
    println!("dispatch (every phase): {}", dispatch.join("; "));
    let all: Vec<String> = op_ns.iter().chain(&bare_ns).cloned().collect();
    let _ = testbed().kubectl().arg("delete").arg("namespace").args(&all).arg("--wait=false").output();
}
