//! Real programs with the real Kubernetes provider (`pulumi-resource-kubernetes` built in the bed), in
//! each language a PKO user writes (`scripts/testbed/programs/<language>-kubernetes`: a ConfigMap, a
//! Deployment reading it and a Service, in a fresh namespace of the bed's API server, the ConfigMap's
//! data from config that changes every run), the agent against a bare `pulumi up` of the same program
//! side by side (`cargo bench -p pko-agent --bench real_kubernetes`; `LANGUAGES=go,yaml` for a subset).
//! Per language it prints:
//! - the first `Run(up)` of a fresh agent, from a Flux-style artifact: `pulumi install` included (npm
//!   install, `go mod download`; provider plugin cold);
//! - the median of the next [`RUNS`] `Run(up)`s (the installed revision reused) of that agent, each
//!   operation in its own directories (the agent's default, a pool's: the source copied per
//!   operation), and of an agent with `--isolate-operations=false` (a Workspace's own agent, PKO's pod:
//!   operations in the cached source), interleaved with as many bare `pulumi up`s of a copy of the
//!   program whose `pulumi install` ran beforehand (timed on its own);
//! - the peak resident memory of the agent's process tree during its operations (agent, `pulumi`,
//!   language host and program, provider plugin: what a workspace pod holds) and of the bare `pulumi`'s
//!   tree, sampled every 50 ms from `/proc`;
//! - a second revision (the main file edited, dependencies not): its first `Run(up)` on the warm agent (seeded), on
//!   an agent that installs every revision from nothing, and the bare `up` after the same edit of its copy.
//!
//! `GO_CACHES=stack`: the isolating agent runs Go with no shared build or module cache (the Stack's own caches,
//! `pko_agent::stack_cache`; modules from a `file://` proxy of the bed's module cache), so its first `Run(up)` is
//! a cold build (what every isolated Go operation paid before a Stack kept its caches) and the median the warm ones.
//!
//! Offline: npm from its cache, Go with the module proxy switched off (the bed's Go caches), Python from
//! the bed's virtualenv, the plugin versions the SDKs name from a loopback plugin server. Real provider,
//! real API server; no hollow agent.

#[path = "../crates/pko-agent/tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use pko_proto::v1::{ArtifactSource, OperationType, ResultStatus, Source, source};

const RUNS: usize = 5;

/// A program of `scripts/testbed/programs/<dir>` (its files, the main one last: a new revision edits it), the plugin
/// version its SDK names, and the environment its language needs offline.
struct Language {
    name: &'static str,
    dir: &'static str,
    files: &'static [&'static str],
    plugin_version: &'static str,
    env: Vec<(&'static str, String)>,
}

fn languages() -> Vec<Language> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    vec![
        Language {
            name: "yaml",
            dir: "yaml-kubernetes",
            files: &["Pulumi.yaml"],
            plugin_version: "4.24.0",
            env: vec![],
        },
        Language {
            name: "python",
            dir: "python-kubernetes",
            files: &["Pulumi.yaml", "requirements.txt", "__main__.py"],
            plugin_version: "4.24.0",
            env: vec![],
        },
        Language {
            name: "typescript",
            dir: "typescript-kubernetes",
            files: &["Pulumi.yaml", "package.json", "package-lock.json", "index.ts"],
            plugin_version: "4.24.1",
            env: vec![("npm_config_cache", format!("{home}/.npm"))],
        },
        Language {
            name: "go",
            dir: "go-kubernetes",
            files: &["Pulumi.yaml", "go.mod", "go.sum", "main.go"],
            plugin_version: "4.24.0",
            env: pko_testbed::offline_go_env().to_vec(),
        },
    ]
}

/// With `GO_CACHES=stack`, the isolating agent's Go environment: no `GOCACHE` or `GOMODCACHE` (each Stack's own caches
/// of `pko_agent::stack_cache` are used), the modules served from the bed's module cache as a `file://` proxy (what a
/// module proxy is to a cluster). The shared agent and the bare loop keep the bed's warm caches.
fn own_go_caches(lang: &Language) -> Option<Vec<(&'static str, String)>> {
    if lang.name != "go" || std::env::var("GO_CACHES").as_deref() != Ok("stack") {
        return None;
    }
    let mods = lang.env.iter().find(|(k, _)| *k == "GOMODCACHE").map(|(_, v)| v.clone()).unwrap_or_default();
    Some(vec![("GOPROXY", format!("file://{mods}/cache/download")), ("GOSUMDB", "off".into())])
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Resident memory (KiB) of the process tree rooted at `root`, from `/proc`.
fn tree_rss(root: u32) -> u64 {
    let mut parent = HashMap::new();
    let mut rss = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        };
        parent.insert(pid, field("PPid:").unwrap_or(0) as u32);
        rss.insert(pid, field("VmRSS:").unwrap_or(0));
    }
    let in_tree = |mut p: u32| loop {
        if p == root {
            return true;
        }
        match parent.get(&p) {
            Some(&pp) if pp != 0 && pp != p => p = pp,
            _ => return false,
        }
    };
    rss.iter().filter(|(p, _)| in_tree(**p)).map(|(_, k)| k).sum()
}

/// Samples [`tree_rss`] of the pid in `root` (0: none) every 50 ms into `peak` until `stop`.
fn sample(root: Arc<AtomicU32>, peak: Arc<AtomicU64>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let pid = root.load(Ordering::Relaxed);
            if pid != 0 {
                peak.fetch_max(tree_rss(pid), Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
}

/// What one language measured.
struct Measured {
    first: Duration,
    agent: Duration,
    shared: Duration,
    bare: Duration,
    bare_install: Duration,
    agent_peak_kib: u64,
    bare_peak_kib: u64,
    new_revision: Duration,
    new_revision_unseeded: Duration,
    bare_edited: Duration,
}

async fn measure(lang: &Language) -> Measured {
    let env = pulumi_env();
    let bed = pko_testbed::testbed();
    let kubeconfig = bed.kubeconfig().display().to_string();
    let ns = format!("bench-k8s-{}-{}", lang.name, rand_suffix());
    let made = bed.kubectl().args(["create", "namespace", &ns]).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let src = pko_testbed::repo_root().join("scripts/testbed/programs").join(lang.dir);
    let contents: Vec<(&str, Vec<u8>)> = lang.files.iter().map(|f| (*f, std::fs::read(src.join(f)).unwrap())).collect();
    let files: Vec<(&str, &[u8])> = contents.iter().map(|(f, c)| (*f, c.as_slice())).collect();
    let tar = tarball(&files);
    // a second revision: the program's main file changed, its dependencies not
    let main_file = lang.files.last().copied().unwrap_or("Pulumi.yaml");
    let comment = if matches!(lang.name, "typescript" | "go") { "\n// revision 2\n" } else { "\n# revision 2\n" };
    let changed: Vec<(&str, Vec<u8>)> = contents
        .iter()
        .map(|(f, c)| (*f, if *f == main_file { [c.as_slice(), comment.as_bytes()].concat() } else { c.clone() }))
        .collect();
    let tar2 = tarball(&changed.iter().map(|(f, c)| (*f, c.as_slice())).collect::<Vec<_>>());
    let server = pko_testbed::plugins::PluginServer::kubernetes(
        &[lang.plugin_version],
        HashMap::from([("/app.tar.gz".to_string(), tar.clone()), ("/app2.tar.gz".to_string(), tar2.clone())]),
    )
    .await;
    let overrides = server.overrides();
    let mut agent_env: Vec<(&str, &str)> =
        vec![("KUBECONFIG", &kubeconfig), ("PULUMI_PLUGIN_DOWNLOAD_URL_OVERRIDES", &overrides)];
    agent_env.extend(lang.env.iter().map(|(k, v)| (*k, v.as_str())));
    let own = own_go_caches(lang);
    let isolated_env: Vec<(&str, &str)> = match &own {
        Some(vars) => {
            let own = vars.iter().map(|(k, v)| (*k, v.as_str()));
            agent_env.iter().filter(|(k, _)| !k.starts_with("GO")).copied().chain(own).collect()
        }
        None => agent_env.clone(),
    };
    let agent = Agent::start(&env, &["--auth", "none"], &isolated_env);
    let mut c = agent.client().await;
    // a Workspace's own agent (PKO's pod): operations in the cached source, the agent's HOME
    let shared_agent = Agent::start(&env, &["--auth", "none", "--isolate-operations=false"], &agent_env);
    let mut shared = shared_agent.client().await;
    let (root, peak, stop) =
        (Arc::new(AtomicU32::new(agent.child.id())), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let sampler = sample(root.clone(), peak.clone(), stop.clone());
    let up_of = |i: usize, stack: &str, revision: u8| {
        let mut r = request(&env, &format!("{}-{stack}-up-{i}", lang.name), env.dir(), stack, OperationType::Up);
        let (path, digest) = if revision == 2 { ("app2", sha256(&tar2)) } else { ("app", sha256(&tar)) };
        r.source = Some(Source {
            kind: Some(source::Kind::Artifact(ArtifactSource {
                url: format!("{}/{path}.tar.gz", server.http.base),
                digest,
                dir: String::new(),
                mirrors: vec![],
            })),
        });
        r.config = vec![
            config("ns", serde_json::json!(ns), false),
            config("greeting", serde_json::json!(format!("v{i}")), false),
        ];
        r
    };
    let up = |i: usize, stack: &str| up_of(i, stack, 1);
    let t = Instant::now();
    let first_result = result(&run(&mut c, up(0, "agent")).await);
    let first = t.elapsed();
    assert_eq!(first_result.status, ResultStatus::Succeeded as i32, "{}: {}", lang.name, first_result.message);
    let r = result(&run(&mut shared, up(0, "shared")).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}: {}", lang.name, r.message);

    let dir = env.dir().join(format!("bare-{}", lang.name));
    std::fs::create_dir_all(&dir).unwrap();
    for (f, c) in &files {
        std::fs::write(dir.join(f), c).unwrap();
    }
    let bare = |args: &[&str]| bare_pulumi(&env, &dir, &agent_env, args, None);
    // a YAML program names no SDK: nothing to install (the agent skips it too, plugin acquisition off)
    let t = Instant::now();
    if lang.name != "yaml" {
        bare(&["install"]);
    }
    let bare_install = t.elapsed();
    bare(&["stack", "init", "bare", "--non-interactive"]);
    bare(&["config", "set", "ns", &ns, "--stack", "bare"]);
    let (mut agent_times, mut shared_times, mut bare_times, bare_peak) =
        (Vec::new(), Vec::new(), Vec::new(), Arc::new(AtomicU64::new(0)));
    for i in 1..=RUNS {
        root.store(agent.child.id(), Ordering::Relaxed);
        let t = Instant::now();
        let r = result(&run(&mut c, up(i, "agent")).await);
        agent_times.push(t.elapsed());
        assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}: {}", lang.name, r.message);
        root.store(0, Ordering::Relaxed);
        let t = Instant::now();
        let r = result(&run(&mut shared, up(i, "shared")).await);
        shared_times.push(t.elapsed());
        assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}: {}", lang.name, r.message);
        bare(&["config", "set", "greeting", &format!("v{i}"), "--stack", "bare"]);
        let t = Instant::now();
        bare_pulumi(
            &env,
            &dir,
            &agent_env,
            &["up", "--yes", "--skip-preview", "--stack", "bare", "--non-interactive"],
            Some(&bare_peak),
        );
        bare_times.push(t.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    // the bare loop's own new revision: the same edit of the main file, then `up` (what a developer pays)
    let edited = changed.iter().find(|(f, _)| *f == main_file).map(|(_, c)| c.clone()).unwrap_or_default();
    std::fs::write(dir.join(main_file), edited).unwrap();
    bare(&["config", "set", "greeting", "edited", "--stack", "bare"]);
    let t = Instant::now();
    bare(&["up", "--yes", "--skip-preview", "--stack", "bare", "--non-interactive"]);
    let bare_edited = t.elapsed();
    let (new_revision, new_revision_unseeded) = new_revision(&mut c, &env, &agent_env, &up_of).await;
    // what the seeded revision's preparation did, from the agent's own log (the seed, pip's check, the install), and
    // each operation's seconds before, in and after its Pulumi command (isolated, then shared)
    let words = ["seed", "pip checked", "install --no-dependencies", "operation finished"];
    for log in [&agent.log, &shared_agent.log] {
        let log = std::fs::read_to_string(log).unwrap_or_default();
        for line in log.lines().filter(|l| words.iter().any(|w| l.contains(w))) {
            eprintln!("{}: {line}", lang.name);
        }
    }
    let _ = sampler.join();
    let _ = bed.kubectl().args(["delete", "namespace", &ns, "--wait=false"]).output();
    Measured {
        first,
        agent: median(agent_times),
        shared: median(shared_times),
        bare: median(bare_times),
        bare_install,
        agent_peak_kib: peak.load(Ordering::Relaxed),
        bare_peak_kib: bare_peak.load(Ordering::Relaxed),
        new_revision,
        new_revision_unseeded,
        bare_edited,
    }
}

/// The first `Run(up)` of a second revision (same dependencies) on the warm isolated agent `c` (its `node_modules`
/// seeded from the first revision's), and on an agent started with `--seed-dependency-trees=false` that ran the first
/// revision before (installs it from nothing).
async fn new_revision(
    c: &mut pko_proto::v1::agent_client::AgentClient<tonic::transport::Channel>,
    env: &pko_testbed::PulumiEnv,
    agent_env: &[(&str, &str)],
    up_of: &impl Fn(usize, &str, u8) -> pko_proto::v1::OperationRequest,
) -> (Duration, Duration) {
    let timed = |r: pko_proto::v1::OperationResult, t: Instant| {
        assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
        t.elapsed()
    };
    let t = Instant::now();
    let seeded = timed(result(&run(c, up_of(RUNS + 1, "agent", 2)).await), t);
    let unseeded = Agent::start(env, &["--auth", "none", "--seed-dependency-trees=false"], agent_env);
    let mut u = unseeded.client().await;
    let t = Instant::now();
    // its first up creates objects the others manage: with the value they hold now (a server-side apply conflict else)
    timed(result(&run(&mut u, up_of(RUNS + 1, "unseeded", 1)).await), t);
    let t = Instant::now();
    (seeded, timed(result(&run(&mut u, up_of(RUNS + 2, "unseeded", 2)).await), t))
}

/// Runs `pulumi args` in `dir` with the env's Pulumi settings and `vars`; with `peak`, samples its
/// process tree's resident memory into it. Panics when it fails.
fn bare_pulumi(
    env: &pko_testbed::PulumiEnv,
    dir: &Path,
    vars: &[(&str, &str)],
    args: &[&str],
    peak: Option<&Arc<AtomicU64>>,
) {
    let mut cmd = env.pulumi(dir);
    cmd.envs(vars.iter().copied()).args(args).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let child = cmd.spawn().unwrap();
    let (root, stop) = (Arc::new(AtomicU32::new(child.id())), Arc::new(AtomicBool::new(false)));
    let sampler = peak.map(|p| sample(root, p.clone(), stop.clone()));
    let out = child.wait_with_output().unwrap();
    stop.store(true, Ordering::Relaxed);
    if let Some(s) = sampler {
        let _ = s.join();
    }
    assert!(
        out.status.success(),
        "pulumi {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!(
            "real_kubernetes: run with `cargo bench` (it times real Pulumi operations against the bed's API server)"
        );
        return;
    }
    // the bare `pulumi` must not inherit an ignored SIGINT
    pko_testbed::exit_on_interrupt();
    let only = std::env::var("LANGUAGES").ok();
    println!(
        "real Kubernetes provider, a ConfigMap + Deployment + Service program per language, {RUNS} interleaved runs \
            each:"
    );
    println!(
        "| language | first Run(up), install included | Run(up) median, isolated | ratio to bare | Run(up) median, \
            shared | ratio to bare | bare pulumi up median | bare pulumi install | peak RSS agent tree | peak RSS bare \
            pulumi tree | new revision, seeded | ÷ isolated | new revision, unseeded | ÷ isolated \
            | bare up, main file edited |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for lang in languages().into_iter().filter(|l| only.as_deref().is_none_or(|o| o.split(',').any(|x| x == l.name))) {
        let m = measure(&lang).await;
        println!(
            "| {} | {:.2?} | {:.2?} | {:.2} | {:.2?} | {:.2} | {:.2?} | {:.2?} | {} MiB | {} MiB | {:.2?} | {:.2} \
             | {:.2?} | {:.2} | {:.2?} |",
            lang.name,
            m.first,
            m.agent,
            m.agent.as_secs_f64() / m.bare.as_secs_f64(),
            m.shared,
            m.shared.as_secs_f64() / m.bare.as_secs_f64(),
            m.bare,
            m.bare_install,
            m.agent_peak_kib >> 10,
            m.bare_peak_kib >> 10,
            m.new_revision,
            m.new_revision.as_secs_f64() / m.agent.as_secs_f64(),
            m.new_revision_unseeded,
            m.new_revision_unseeded.as_secs_f64() / m.agent.as_secs_f64(),
            m.bare_edited
        );
    }
}
