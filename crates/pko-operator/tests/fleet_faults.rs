//! The fleet under faults, asserted from the programs' own traces (one line per `up` that ran) and the
//! objects: redis-server restarted without persistence mid-run loses nothing; scaling 1 → 3 → 1 keeps
//! one owner per Stack and one Update per change; a namespace alone uses every worker and a waiting one gets the next.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use kube::ResourceExt;
use pko_api::{Stack, Update};
use pko_testbed::eventually;
use serde_json::json;

/// A program whose every `up` of a changed `n` sleeps `secs` and appends `<stack> <n>` to `trace`.
fn traced_program(trace: &Path, secs: u32) -> serde_json::Value {
    json!({"configuration": {"n": {"type": "String", "default": "0"}},
           "resources": {"r": {"type": "command:local:Command",
                               "properties": {"create": format!("sleep {secs}; echo ${{pulumi.stack}} ${{n}} >> {}",
                                   trace.display()),
                                              "triggers": ["${n}"]}}}})
}

/// The trace's lines per stack.
fn runs(trace: &Path) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in std::fs::read_to_string(trace).unwrap_or_default().lines() {
        if let Some((s, n)) = l.split_once(' ') {
            m.entry(s.to_string()).or_default().push(n.to_string());
        }
    }
    m
}

async fn ready_at(stacks: &kube::Api<Stack>, n: &str) -> usize {
    stacks
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|s| {
            ready(s)
                && s.status.as_ref().and_then(|st| st.last_update.as_ref()).is_some()
                && s.spec.config.as_ref().and_then(|c| c.get("n")).is_some_and(|v| v == n)
        })
        .filter(|s| s.status.as_ref().and_then(|st| st.observed_generation) == s.metadata.generation)
        .count()
}

async fn converge(stacks: &kube::Api<Stack>, n: &str, count: usize, secs: u64) {
    let what = format!("{count} Stacks Ready with n={n}");
    eventually(&what, secs, || async { ready_at(stacks, n).await == count }).await;
}

async fn set_n(stacks: &kube::Api<Stack>, count: usize, n: &str) {
    for i in 0..count {
        stacks
            .patch(
                &format!("s{i}"),
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"config": {"n": n}}})),
            )
            .await
            .unwrap();
    }
}

/// How many shards the table of fleet `pko` in `ns` gives `replica`.
async fn held_by(ns: &pko_testbed::TestNamespace, replica: &str) -> usize {
    shard_holders(&ns.api(), "pko").await.values().filter(|h| *h == replica).count()
}

fn no_lock_left(env: &pko_testbed::PulumiEnv) {
    let locks = files_under(&env.dir().join("state/.pulumi/locks"));
    assert!(locks.is_empty(), "no backend lock is left: {locks:?}");
}

/// A private redis-server without persistence on a free loopback port.
struct Redis {
    child: std::process::Child,
    port: u16,
}

impl Redis {
    fn start_on(port: u16) -> Redis {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (the bed's Debian package)");
        let end = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < end, "redis-server did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Redis { child, port }
    }

    fn start() -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        Self::start_on(port)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// SIGKILL, then a fresh, empty server on the same port.
    fn restart_empty(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        *self = Redis::start_on(self.port);
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_redis_restarted_without_persistence_mid_run_loses_no_operation() {
    const STACKS: usize = 8;
    let (client, ns, env) = setup("redis-restart").await;
    let trace = env.dir().join("trace.txt");
    passphrase_and_program(&ns, traced_program(&trace, 3)).await;
    let mut redis = Redis::start();
    let url = redis.url();
    let flags = ["--redis-url", url.as_str(), "--max-operations", "2"];
    let mut replicas = Vec::new();
    for r in ["r0", "r1"] {
        replicas.push(
            InProcessOperator::start_with(
                &client,
                &env,
                run_args_with(&env, ns.name(), &fleet_args(ns.name(), r, &flags)),
            )
            .await,
        );
    }
    for i in 0..STACKS {
        prog_stack(&ns, &env, &format!("s{i}"), json!({"n": "1"})).await;
    }
    let stacks = ns.api::<Stack>();
    // mid-run: some done, some running, the rest queued — then Redis forgets everything
    eventually("two Stacks Ready", 120, || async { ready_at(&stacks, "1").await >= 2 }).await;
    let before = ready_at(&stacks, "1").await;
    assert!(before < STACKS, "the restart must come mid-run ({before} Ready)");
    redis.restart_empty();
    let t = Instant::now();
    eprintln!("redis-server restarted empty with {before}/{STACKS} Stacks Ready");
    converge(&stacks, "1", STACKS, 240).await;
    eprintln!("all {STACKS} Ready {:.1} s after the restart", t.elapsed().as_secs_f64());

    let runs = runs(&trace);
    for i in 0..STACKS {
        assert_eq!(
            runs.get(&format!("s{i}")).map(Vec::as_slice),
            Some(&["1".to_string()][..]),
            "s{i}'s up ran exactly once: {runs:?}"
        );
    }
    let updates = ns.api::<Update>().list(&Default::default()).await.unwrap().items;
    assert_eq!(
        updates.len(),
        STACKS,
        "one Update per Stack: {:?}",
        updates.iter().map(|u| u.name_any()).collect::<Vec<_>>()
    );
    assert!(
        updates.iter().all(|u| condition(u, "Failed") == Some(("False".into(), "UpdateSucceeded".into()))),
        "every Update succeeded"
    );
    no_lock_left(&env);
    for r in replicas {
        r.stop().await;
    }
}

#[tokio::test]
async fn scaling_one_to_three_to_one_replicas_keeps_one_owner_and_one_update_per_change() {
    const STACKS: usize = 6;
    let (client, ns, env) = setup("scale").await;
    let trace = env.dir().join("trace.txt");
    passphrase_and_program(&ns, traced_program(&trace, 1)).await;
    let prefix = pko_testbed::testbed().redis_prefix("scale");
    let redis = ["--redis-url", pko_testbed::testbed().redis_url(), "--redis-prefix", &prefix];
    let start = |r: &'static str| {
        let args = run_args_with(&env, ns.name(), &fleet_args(ns.name(), r, &redis));
        InProcessOperator::start_with(&client, &env, args)
    };
    let stacks = ns.api::<Stack>();
    let owners = |replicas: &[&InProcessOperator], name: &str| {
        replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| r.running.as_ref().is_some_and(|x| x.ctx.ownership.owns(ns.name(), name)))
            .map(|(i, _)| i)
            .collect::<Vec<_>>()
    };

    // one replica
    let r0 = start("r0").await;
    for i in 0..STACKS {
        prog_stack(&ns, &env, &format!("s{i}"), json!({"n": "1"})).await;
    }
    converge(&stacks, "1", STACKS, 120).await;

    // three: the newcomers take shards, every Stack still has one owner
    let (r1, r2) = (start("r1").await, start("r2").await);
    let t = Instant::now();
    eventually("r1 and r2 hold shards", 60, || async { held_by(&ns, "r1").await > 0 && held_by(&ns, "r2").await > 0 })
        .await;
    eprintln!("scaled 1 -> 3: newcomers hold shards {:.1} s after start", t.elapsed().as_secs_f64());
    set_n(&stacks, STACKS, "2").await;
    converge(&stacks, "2", STACKS, 180).await;
    let mut by_owner = BTreeMap::<usize, usize>::new();
    for i in 0..STACKS {
        let o = owners(&[&r0, &r1, &r2], &format!("s{i}"));
        assert_eq!(o.len(), 1, "s{i} has one owner among three: {o:?}");
        *by_owner.entry(o[0]).or_default() += 1;
    }
    eprintln!("three replicas: Stacks per replica {by_owner:?}");

    // back to one: r0 owns everything again
    let t = Instant::now();
    r1.stop().await;
    r2.stop().await;
    eventually("r0 holds every shard", 60, || async { held_by(&ns, "r0").await == 64 }).await;
    eprintln!("scaled 3 -> 1: r0 holds all 64 shards {:.1} s after the stop", t.elapsed().as_secs_f64());
    set_n(&stacks, STACKS, "3").await;
    converge(&stacks, "3", STACKS, 180).await;

    let runs = runs(&trace);
    for i in 0..STACKS {
        assert_eq!(
            runs.get(&format!("s{i}")).map(Vec::as_slice),
            Some(&["1".to_string(), "2".into(), "3".into()][..]),
            "s{i}: one up per change, in order: {runs:?}"
        );
    }
    let updates = ns.api::<Update>().list(&Default::default()).await.unwrap().items;
    assert_eq!(updates.len(), 3 * STACKS, "one Update per Stack and change");
    no_lock_left(&env);
    r0.stop().await;
}

/// A program like [`traced_program`] whose `up` sleeps for the Stack's config `secs`.
fn timed_program(trace: &Path) -> serde_json::Value {
    json!({"configuration": {"n": {"type": "String", "default": "0"}, "secs": {"type": "String", "default": "1"}},
           "resources": {"r": {"type": "command:local:Command",
                               "properties": {"create": format!("sleep ${{secs}}; echo ${{pulumi.stack}} ${{n}} >> {}",
                                   trace.display()),
                                              "triggers": ["${n}"]}}}})
}

/// The namespace share is work-conserving. With two workers the default share (`--namespace-share-percent` 50) is
/// one: a noisy namespace alone runs two operations at once (a long one and a 30 s one; no worker idle); a third
/// waits, and once a quiet namespace's Update waits too, the noisy one says why (`Queued`, "runs 2 operation(s), its
/// share … is 1"). The worker the 30 s operation frees goes to the quiet Stack, and the third noisy operation starts
/// only after it — with the worker given to the noisy namespace instead, the quiet Stack would wait for the third's
/// run on top. (The quiet Stack is deployed once first, so its change is queued within seconds, after the third noisy
/// one: a turn alone would go to the noisy namespace.)
#[tokio::test]
async fn a_namespace_alone_uses_every_worker_and_a_waiting_one_gets_the_next() {
    let (client, noisy, env) = setup("noisy").await;
    let quiet = pko_testbed::testbed().namespace("quiet").await.unwrap();
    let trace = env.dir().join("trace.txt");
    passphrase_and_program(&noisy, timed_program(&trace)).await;
    passphrase_and_program(&quiet, traced_program(&trace, 1)).await;
    let scope = format!("{},{}", noisy.name(), quiet.name());
    let operator =
        InProcessOperator::start_with(&client, &env, run_args_with(&env, &scope, &["--max-operations", "2"])).await;
    let quiet_stacks = quiet.api::<Stack>();
    prog_stack(&quiet, &env, "q", json!({"n": "1"})).await;
    converge(&quiet_stacks, "1", 1, 180).await;
    let noisy_updates = noisy.api::<Update>();
    let running =
        |all: &[Update]| all.iter().filter(|u| condition(u, "Progressing").is_some_and(|c| c.0 == "True")).count();
    for (i, secs) in ["150", "30"].into_iter().enumerate() {
        prog_stack(&noisy, &env, &format!("s{i}"), json!({"n": "1", "secs": secs})).await;
        eventually(&format!("alone, the noisy namespace runs {} operation(s)", i + 1), 120, || async {
            running(&noisy_updates.list(&Default::default()).await.unwrap().items) == i + 1
        })
        .await;
    }
    prog_stack(&noisy, &env, "s2", json!({"n": "1", "secs": "5"})).await;
    // queued before the quiet one, so a turn alone would give the next worker to it
    eventually("the third noisy Update exists", 120, || async {
        noisy_updates.list(&Default::default()).await.unwrap().items.iter().any(|u| u.name_any().starts_with("s2-"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    quiet_stacks
        .patch(
            "q",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"config": {"n": "2"}}})),
        )
        .await
        .unwrap();
    let share = format!(
        "waiting for an operation slot: namespace {} runs 2 operation(s), its share of this replica's workers is 1",
        noisy.name()
    );
    eventually("with the quiet Update waiting, the held-back noisy Update says why", 60, || async {
        noisy_updates.list(&Default::default()).await.unwrap().items.iter().any(|u| u.queued_message() == Some(&share))
    })
    .await;
    let noisy_stacks = noisy.api::<Stack>();
    assert!(
        noisy_stacks
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|s| stack_condition(s, "Reconciling").is_none_or(|(_, _, m)| !m.contains("operation slot"))),
        "the wait is not mirrored onto the Stack"
    );
    converge(&quiet_stacks, "2", 1, 180).await;
    converge(&noisy_stacks, "1", 3, 300).await;
    let started = |u: &Update| u.status.as_ref().and_then(|s| s.start_time.clone()).map(|t| t.0);
    let start_of = |all: &[Update], stack: &str| {
        all.iter().filter(|u| u.name_any().starts_with(&format!("{stack}-"))).find_map(started)
    };
    let quiet_all = quiet.api::<Update>().list(&Default::default()).await.unwrap().items;
    let noisy_all = noisy_updates.list(&Default::default()).await.unwrap().items;
    let q = quiet_all.iter().filter_map(started).max();
    let s2 = start_of(&noisy_all, "s2");
    eprintln!("the quiet Update started {q:?}; the third noisy one {s2:?}");
    let (q, s2) = (q.expect("the quiet Update started"), s2.expect("s2's Update started"));
    assert!(q <= s2, "the worker freed first went to the waiting quiet namespace, not to a third noisy operation");
    no_lock_left(&env);
    operator.stop().await;
}
