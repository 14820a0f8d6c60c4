//! Agent pools (`--agent-pools`, local runtime): Stacks of one workspace class share a pool of agents
//! that grows with demand up to its maximum and shrinks to zero processes when idle; an agent SIGTERMed
//! mid-`up` Ctrl-Cs Pulumi and its operation completes on another agent of the pool, with no lock left.
//! Asserted from the agents' own records (their slot directories and processes) and the program's own
//! trace, not only from status.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use pko_api::{Stack, Update, Workspace};
use pko_testbed::eventually;
use serde_json::json;

/// The pids of the `pko-agent` agents this test process started whose command line names `dir`. Only
/// children of this process count: a child the agent has forked but not yet replaced by its program
/// (a supervisor of a `pulumi` command) still shows the agent's command line for a moment.
fn agents_under(dir: &Path) -> Vec<u32> {
    let needle = dir.display().to_string();
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| parent_of(*pid) == Some(me))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("pko-agent") && c.contains(&needle)
            })
        })
        .collect()
}

/// The parent pid of `pid` (`/proc/<pid>/stat`, the field after the command name), if it still runs.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// Processes whose working directory is under `dir`, with their command names.
fn processes_under(dir: &Path) -> Vec<(u32, String)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            std::fs::read_link(e.path().join("cwd"))
                .ok()?
                .starts_with(dir)
                .then(|| (pid, std::fs::read_to_string(e.path().join("comm")).unwrap_or_default().trim().to_string()))
        })
        .collect()
}

/// The slot directories of this replica's pools: `<agents>/pools/<ns>/<class>/operator/<n>`.
fn slots(pools: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let classes = std::fs::read_dir(pools)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|ns| std::fs::read_dir(ns.path()).into_iter().flatten().flatten());
    for class in classes {
        for slot in std::fs::read_dir(class.path().join("operator")).into_iter().flatten().flatten() {
            if slot.file_name().to_str().is_some_and(|n| n.parse::<usize>().is_ok()) {
                out.push(slot.path());
            }
        }
    }
    out.sort();
    out
}

async fn stack(ns: &pko_testbed::TestNamespace, env: &pko_testbed::PulumiEnv, name: &str) {
    prog_stack(ns, env, name, json!({})).await;
}

/// The value of the first sample of `name` in a Prometheus text exposition (0 when absent).
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn stacks_share_a_pool_that_grows_to_its_maximum_and_empties_when_idle() {
    let (client, ns, env) = setup("pools").await;
    let runs = env.dir().join("runs.txt");
    passphrase_and_program(
        &ns,
        json!({"resources": {"r": {"type": "command:local:Command",
            "properties": {"create": format!("sleep 2; echo ${{pulumi.stack}} >> {}", runs.display())}}}}),
    )
    .await;
    let args = run_args_with(
        &env,
        ns.name(),
        &["--agent-pools", "--pool-max-agents", "2", "--pool-idle-timeout-seconds", "3"],
    );
    let operator = InProcessOperator::start_with(&client, &env, args).await;
    let names = ["pool-a", "pool-b", "pool-c", "pool-d"];
    for n in names {
        stack(&ns, &env, n).await;
    }
    let stacks = ns.api::<Stack>();
    let pools_dir = env.dir().join("agents").join("pools");
    let most = std::sync::atomic::AtomicUsize::new(0);
    let t0 = std::time::Instant::now();
    eventually("the four Stacks are Ready", 180, || async {
        most.fetch_max(agents_under(&pools_dir).len(), std::sync::atomic::Ordering::SeqCst);
        let all = stacks.list(&Default::default()).await.unwrap().items;
        all.len() == 4 && all.iter().all(ready)
    })
    .await;
    let most = most.into_inner();
    eprintln!("4 Stacks Ready in {:?} on a pool of at most 2 agents (seen {most} at once)", t0.elapsed());

    // every Workspace reports the one pool of its class, and has no agent of its own
    let workspaces = ns.api::<Workspace>().list(&Default::default()).await.unwrap().items;
    assert_eq!(workspaces.len(), 4);
    let pools: std::collections::BTreeSet<_> =
        workspaces.iter().map(|w| w.status.as_ref().and_then(|s| s.pool.clone())).collect();
    assert_eq!(pools.len(), 1, "one class, one pool: {pools:?}");
    let pool = pools.into_iter().next().flatten().expect("status.pool is set");
    assert!(pool.starts_with(&format!("{}/", ns.name())), "{pool}");
    assert!(
        workspaces.iter().all(|w| w.status.as_ref().is_some_and(|s| s.address.is_none())),
        "no Workspace has an agent of its own"
    );

    // the pool's own records: at most two slots ever existed, and each program ran once
    let used = slots(&pools_dir);
    assert!(!used.is_empty() && used.len() <= 2, "slots used: {used:?}");
    assert!(most <= 2, "{most} agents ran at once; the maximum is 2");
    let mut trace: Vec<String> = std::fs::read_to_string(&runs).unwrap().lines().map(str::to_string).collect();
    trace.sort();
    assert_eq!(trace, names, "each Stack's program ran exactly once");

    // idle: the pool shrinks to zero processes
    let t_idle = std::time::Instant::now();
    eventually("no pool agent runs once the pool is idle", 60, || async { agents_under(&pools_dir).is_empty() }).await;
    eprintln!("pool empty {:?} after the last Stack was Ready (idle timeout 3 s)", t_idle.elapsed());
    // (the metrics recorder is shared by the tests of this binary: only presence is asserted)
    let metrics = operator.metrics().await;
    assert!(sample(&metrics, "pko_pool_agents_stopped_total") >= 1.0, "{metrics}");
    // capacity metrics: dispatch latency (push → Pulumi started) per namespace, operations per class
    let latency = format!("pko_dispatch_latency_seconds_count{{namespace=\"{}\"}}", ns.name());
    assert!(sample(&metrics, &latency) >= 4.0, "{latency} in {metrics}");
    assert!(metrics.contains(&format!("pko_operations_running{{class=\"{pool}\"}}")), "{metrics}");

    // work again: the pool starts from zero and runs it
    let updates_before = ns.api::<Update>().list(&Default::default()).await.unwrap().items.len();
    stacks
        .patch(
            "pool-a",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {"pulumi.com/reconciliation-request": "again"}}}),
            ),
        )
        .await
        .unwrap();
    let updates = ns.api::<Update>();
    eventually("a new Update succeeds on a pool started from zero", 120, || async {
        let all = updates.list(&Default::default()).await.unwrap().items;
        all.len() > updates_before && all.iter().filter(|u| u.is_complete()).count() == all.len()
    })
    .await;
    assert!(
        updates.list(&Default::default()).await.unwrap().items.iter().all(|u| u.succeeded()),
        "every Update succeeded"
    );
    operator.stop().await;
}

/// Two Stacks of one class take turns on one pooled agent (A, B, then A again): each operation's probe
/// ([`pko_testbed::probe::ISOLATION_PROBE`]) finds nothing the one before left — files, stack settings,
/// env, a daemon, plugins — although all three ran on the same agent process.
#[tokio::test]
async fn stacks_taking_turns_on_one_pooled_agent_see_nothing_of_each_other() {
    let (client, ns, env) = setup("pool-iso").await;
    passphrase_secret(&ns).await;
    create(
        &ns.api::<pko_api::Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "probe"},
               "configuration": {"n": {"type": "String", "default": "0"}},
               "program": {"resources": {"probe": {"type": "command:local:Command", "properties": {
                   "dir": "${pulumi.cwd}", "environment": {"STACK": "${pulumi.stack}", "N": "${n}"},
                       "create": pko_testbed::probe::ISOLATION_PROBE}}},
                 "outputs": {"report": "${probe.stdout}"}}}),
    )
    .await;
    let args = run_args_with(
        &env,
        ns.name(),
        &["--agent-pools", "--pool-max-agents", "1", "--pool-idle-timeout-seconds", "60"],
    );
    let operator = InProcessOperator::start_with(&client, &env, args).await;
    let stacks = ns.api::<Stack>();
    let pools_dir = env.dir().join("agents").join("pools");
    let agent_pids = std::sync::Mutex::new(std::collections::BTreeSet::new());
    for (turn, name) in ["isoa", "isob", "isoa"].iter().enumerate() {
        let mut refs = passphrase_env_refs();
        refs[format!("ONLY_{name}")] = json!({"type": "Literal", "literal": {"value": "1"}});
        refs["OP_SECRET"] = json!({"type": "Literal", "literal": {"value": format!("secret-of-{name}")}});
        let spec = json!({"stack": name, "programRef": {"name": "probe"}, "backend": env.backend_url(),
            "config": {"n": turn.to_string()}, "envRefs": refs});
        if turn < 2 {
            create(
                &stacks,
                json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name}, "spec": spec}),
            )
            .await;
        } else {
            stacks
                .patch(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(json!({"spec": spec})))
                .await
                .unwrap();
        }
        let generation = if turn < 2 { 1 } else { 2 };
        eventually(&format!("turn {turn}: {name} Ready with its report"), 120, || async {
            let s = stacks.get(name).await.unwrap();
            agent_pids.lock().unwrap().extend(agents_under(&pools_dir));
            let status = s.status.as_ref();
            ready(&s)
                && status.and_then(|st| st.last_update.as_ref()).is_some_and(|l| l.generation == Some(generation))
                && status.and_then(|st| st.outputs.as_ref()).is_some_and(|o| o.get("report").is_some())
        })
        .await;
        let s = stacks.get(name).await.unwrap();
        let report = s.status.and_then(|st| st.outputs).map(|o| o["report"].clone());
        assert_eq!(report, Some(json!("found:")), "turn {turn} ({name}) found what an earlier operation left");
        assert!(
            pko_testbed::probe::probe_daemons().is_empty(),
            "nothing of turn {turn} still runs: {:?}",
            pko_testbed::probe::probe_daemons()
        );
    }
    assert_eq!(slots(&pools_dir).len(), 1, "all three turns on the one slot of the pool");
    let pids = agent_pids.into_inner().unwrap();
    assert_eq!(pids.len(), 1, "all three turns on one agent process: {pids:?}");
    // the agent's disk (the Program's prepared source) is reported for kubectl pko fleet and as a gauge
    let ws = ns.api::<Workspace>().get("isoa").await.unwrap();
    let pool = ws.status.and_then(|s| s.pool).expect("status.pool");
    eventually("the pool reports its agent's disk", 30, || async {
        let disk = pko_operator::load::snapshot().agents.get(&pool).map_or(0, |a| a.disk_bytes);
        let gauge = format!("pko_pool_agent_disk_bytes{{class=\"{pool}\"}}");
        disk > 0 && sample(&operator.metrics().await, &gauge) == disk as f64
    })
    .await;
    operator.stop().await;
    let _ = std::process::Command::new("pkill").args(["-f", &pools_dir.display().to_string()]).status();
}

/// A two-resource `up` in flight on a pool of at most two agents: `a` (sleeps 6 s, then appends `a` to
/// the returned trace) is being created, `b` waits for it. Returns the operator, the trace file, the
/// pools directory and the PID of the agent running the operation.
async fn two_step_up_in_flight(
    client: &kube::Client,
    ns: &pko_testbed::TestNamespace,
    env: &pko_testbed::PulumiEnv,
    stack_name: &str,
) -> (InProcessOperator, PathBuf, PathBuf, i32) {
    let runs = env.dir().join("runs.txt");
    passphrase_and_program(
        ns,
        json!({"resources": {
            "a": {"type": "command:local:Command", "properties": {"create": format!("sleep 6; echo a >> {}",
                runs.display())}},
            "b": {"type": "command:local:Command", "properties": {"create": format!("echo b >> {}", runs.display())},
                "options": {"dependsOn": ["${a}"]}}}}),
    )
    .await;
    let args = run_args_with(
        env,
        ns.name(),
        &["--agent-pools", "--pool-max-agents", "2", "--pool-idle-timeout-seconds", "30"],
    );
    let operator = InProcessOperator::start_with(client, env, args).await;
    stack(ns, env, stack_name).await;
    let updates = ns.api::<Update>();
    eventually("the Update is Progressing", 60, || async {
        updates
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|u| condition(u, "Progressing") == Some(("True".into(), "Progressing".into())))
    })
    .await;
    let pools_dir = env.dir().join("agents").join("pools");
    let first = slots(&pools_dir).into_iter().next().expect("a slot");
    let pid =
        serde_json::from_slice::<serde_json::Value>(&std::fs::read(first.join("agent.json")).unwrap()).unwrap()["pid"]
            .as_u64()
            .unwrap() as i32;
    (operator, runs, pools_dir, pid)
}

#[tokio::test]
async fn an_agent_sigtermed_mid_up_hands_its_operation_to_another_agent() {
    let (client, ns, env) = setup("handoff").await;
    // `a` is in flight when the agent gets SIGTERM; Ctrl-C lets it finish and be recorded; `b` runs on
    // the next agent
    let (operator, runs, pools_dir, pid) = two_step_up_in_flight(&client, &ns, &env, "handoff").await;
    let updates = ns.api::<Update>();
    // `a` has started (its sleep runs): SIGTERM the agent
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let t0 = std::time::Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM).unwrap();

    let stacks = ns.api::<Stack>();
    eventually("the Stack is Ready after the handoff", 120, || async { ready(&stacks.get("handoff").await.unwrap()) })
        .await;
    eprintln!("handoff: Stack Ready {:?} after the agent's SIGTERM", t0.elapsed());
    let all = updates.list(&Default::default()).await.unwrap().items;
    assert_eq!(all.len(), 1, "the same Update completed on another agent");
    assert_eq!(condition(&all[0], "Failed"), Some(("False".into(), "UpdateSucceeded".into())));
    let trace = std::fs::read_to_string(&runs).unwrap();
    assert_eq!(trace.lines().collect::<Vec<_>>(), ["a", "b"], "each resource was created once, b after the handoff");
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "the SIGTERMed agent exited");
    assert!(agents_under(&pools_dir).iter().all(|p| *p as i32 != pid));
    let metrics = operator.metrics().await;
    assert!(sample(&metrics, "pko_pool_agents_started_total") >= 2.0, "a second agent ran it: {metrics}");
    assert!(files_under(&env.dir().join("state").join(".pulumi").join("locks")).is_empty(), "no lock is left");
    operator.stop().await;
    let _ = std::process::Command::new("pkill").args(["-f", &pools_dir.display().to_string()]).status();
}

#[tokio::test]
async fn an_agent_sigkilled_mid_up_leaves_a_lock_that_is_released_once_its_holder_is_dead() {
    let (client, ns, env) = setup("killed").await;
    // `a` is in flight when its agent alone is SIGKILLed: its supervisor stops the pulumi and plugins at
    // once; the lock stays, with a dead holder; the retry on the next agent releases it and completes
    // the update
    let (operator, runs, pools_dir, pid) = two_step_up_in_flight(&client, &ns, &env, "killed").await;
    let updates = ns.api::<Update>();
    let locks = env.dir().join("state").join(".pulumi").join("locks");
    // the `up`'s lock, held while `a` sleeps (read again until it is the same for a second)
    let lock_holder = || {
        let held: Vec<_> =
            files_under(&locks).into_iter().filter(|f| f.extension().is_some_and(|x| x == "json")).collect();
        let pid = held
            .first()
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["pid"].as_i64());
        pid.map(|p| (held, p as i32))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let (held, holder) = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no lock held for a second within 60 s: {:?}",
            files_under(&locks)
        );
        if let Some(h) = lock_holder() {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            if lock_holder() == Some(h.clone()) {
                break h;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    // what the operation runs: pulumi, its language host, the provider, the command's shell and sleep
    let ops = slots(&pools_dir).into_iter().next().expect("the agent's slot").join("work").join("ops");
    let before: Vec<u32> = processes_under(&ops).into_iter().map(|(pid, _)| pid).collect();
    assert!(
        before.len() >= 3,
        "pulumi and its plugins run under the operation's directory: {:?}",
        processes_under(&ops)
    );
    let t0 = std::time::Instant::now();
    // the agent alone (not its process group)
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    // (exited: gone, or a zombie not yet reaped)
    let running = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, f)| !f.trim_start().starts_with('Z')))
    };
    // the agent's supervisor stops its pulumi, the language host, the provider and the command at once
    eventually("nothing of the dead agent's operation still runs", 5, || async {
        !running(holder) && before.iter().all(|p| !running(*p as i32))
    })
    .await;
    eprintln!("SIGKILLed agent: its pulumi and every plugin gone {:?} after the kill", t0.elapsed());

    let stacks = ns.api::<Stack>();
    eventually("the Stack is Ready after the retry", 120, || async { ready(&stacks.get("killed").await.unwrap()) })
        .await;
    eprintln!("SIGKILLed agent: Stack Ready {:?} after the kill", t0.elapsed());
    let all = updates.list(&Default::default()).await.unwrap().items;
    assert_eq!(all.len(), 1, "the same Update completed on another agent");
    assert_eq!(condition(&all[0], "Failed"), Some(("False".into(), "UpdateSucceeded".into())));
    let trace = std::fs::read_to_string(&runs).unwrap();
    assert_eq!(trace.lines().filter(|l| *l == "b").count(), 1, "b created once, after the retry: {trace}");
    assert!(trace.lines().next() == Some("a"), "a completed before b (the killed a never echoed): {trace}");
    assert!(files_under(&locks).is_empty(), "no lock is left: the dead holder's {held:?} was released");
    operator.stop().await;
    let _ = std::process::Command::new("pkill").args(["-f", &pools_dir.display().to_string()]).status();
}

/// The slot (`…/operator/<n>/…`) in a trace line that ends with the operation's working directory.
fn slot_of(line: &str) -> Option<usize> {
    let rest = &line[line.find("/operator/")? + "/operator/".len()..];
    rest.split('/').next()?.parse().ok()
}

/// The lines of `trace` that start with `prefix`.
fn traced<'a>(trace: &'a str, prefix: &str) -> Vec<(usize, &'a str)> {
    trace.lines().enumerate().filter(|(_, l)| l.starts_with(prefix)).collect()
}

/// A Stack's operation waits for the busy agent that ran the Stack (`--pool-affinity-wait-seconds`), although the
/// pool could start another: `hold-a` and `hold-c` both ran on one agent; `hold-a`'s second `up` sleeps 8 s on it,
/// and `hold-c`'s change, queued meanwhile, runs on that same agent once `hold-a`'s is done — not on a new agent at
/// once (what the pool did before the hold). Asserted from the program's trace (its working directory names the
/// agent's slot) and the counters.
#[tokio::test]
async fn an_operation_waits_for_the_busy_agent_that_ran_its_stack() {
    let (client, ns, env) = setup("hold").await;
    let trace = env.dir().join("trace.txt");
    let cmd = format!(
        "echo ${{pulumi.stack}} ${{n}} start $(pwd) >> {t}; sleep ${{secs}}; echo ${{pulumi.stack}} ${{n}} end >> {t}",
        t = trace.display()
    );
    passphrase_and_program(
        &ns,
        json!({"configuration": {"n": {"type": "String", "default": "0"}, "secs": {"type": "String", "default": "0"}},
               "resources": {"r": {"type": "command:local:Command",
                                   "properties": {"create": cmd, "triggers": ["${n}"]}}}}),
    )
    .await;
    let extra = ["--agent-pools", "--pool-max-agents", "2", "--pool-affinity-wait-seconds", "60"];
    let operator = InProcessOperator::start_with(&client, &env, run_args_with(&env, ns.name(), &extra)).await;
    let stacks = ns.api::<Stack>();
    let all_ready = |names: &'static [&'static str]| {
        let stacks = stacks.clone();
        async move {
            let all = stacks.list(&Default::default()).await.unwrap().items;
            names.iter().all(|n| {
                all.iter().any(|s| {
                    s.metadata.name.as_deref() == Some(*n)
                        && ready(s)
                        && s.status.as_ref().and_then(|st| st.observed_generation) == s.metadata.generation
                })
            })
        }
    };
    prog_stack(&ns, &env, "hold-a", json!({"n": "1"})).await;
    eventually("hold-a is Ready", 180, || all_ready(&["hold-a"])).await;
    prog_stack(&ns, &env, "hold-c", json!({"n": "1"})).await;
    eventually("hold-c is Ready", 180, || all_ready(&["hold-a", "hold-c"])).await;
    let patch = |name: &'static str, config: serde_json::Value| {
        let stacks = stacks.clone();
        async move {
            let p = json!({"spec": {"config": config}});
            stacks.patch(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&p)).await.unwrap();
        }
    };
    patch("hold-a", json!({"n": "2", "secs": "8"})).await;
    eventually("hold-a's second up runs", 120, || async {
        std::fs::read_to_string(&trace).unwrap_or_default().contains("hold-a 2 start")
    })
    .await;
    patch("hold-c", json!({"n": "2"})).await;
    eventually("both changes are done", 180, || all_ready(&["hold-a", "hold-c"])).await;

    let text = std::fs::read_to_string(&trace).unwrap();
    let (a1, c1) = (traced(&text, "hold-a 1 start"), traced(&text, "hold-c 1 start"));
    let (a2_end, c2) = (traced(&text, "hold-a 2 end"), traced(&text, "hold-c 2 start"));
    assert_eq!((a1.len(), c1.len(), a2_end.len(), c2.len()), (1, 1, 1, 1), "{text}");
    assert!(slot_of(a1[0].1).is_some(), "the trace names the agent's slot\n{text}");
    assert_eq!(slot_of(a1[0].1), slot_of(c1[0].1), "premise: both Stacks first ran on one agent\n{text}");
    assert_eq!(slot_of(c2[0].1), slot_of(c1[0].1), "hold-c's change ran on the agent that ran it\n{text}");
    assert!(a2_end[0].0 < c2[0].0, "and only once hold-a's up there was done\n{text}");
    let metrics = operator.metrics().await;
    assert!(sample(&metrics, "pko_update_operations_held_total") >= 1.0, "{metrics}");
    assert!(sample(&metrics, "pko_pool_lends_total{affinity=\"warm\"}") >= 2.0, "{metrics}");
    operator.stop().await;
}
