//! Fencing, proven on real processes: three `pko-operator` replicas in one fleet over the bed's
//! redis-server, each running as its own service account, so the API server's audit log (the bed logs
//! every write of the namespace `pko-audit`'s service accounts) attributes every write to a replica.
//! One replica is frozen with SIGSTOP while it drives operations, until every shard it held has moved
//! and the new holders have followed those operations to their end; then it runs again (SIGCONT), with
//! the results in its own streams' buffers. Asserted afterwards:
//! - from the audit log: the frozen replica writes nothing to an object of a shard it held — Stack,
//!   Workspace, Update, outputs Secret, Event, Program — unless it first took that shard again
//!   (a new epoch, through its Lease);
//! - from the agents' own logs: no agent served a call (Run, Attach, Cancel) with an epoch older than
//!   one already seen for its operation; the only calls refused after the freeze are those the frozen
//!   replica checked and sent right before it froze, refused for arriving past their fence deadline
//!   (`OperationRequest.not_after`); no operation was started on two agents;
//! - from the programs' own trace: each Stack's `up` ran exactly once; every Stack is Ready, no Update
//!   is left Progressing and no backend lock is left.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use pko_api::{Stack, Update};
use pko_testbed::{eventually, testbed};
use serde_json::json;

const AUDIT_NS: &str = "pko-audit";
const SHARDS: u32 = 64;
const STACKS: usize = 6;
const FLEET: &str = "pko";

/// A kubeconfig for service account `pko-audit/<name>`, bound to cluster-admin.
async fn replica_identity(client: &kube::Client, dir: &Path, name: &str) -> PathBuf {
    let created = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": AUDIT_NS}})).unwrap())
        .await;
    assert!(created.is_ok() || matches!(&created, Err(kube::Error::Api(e)) if e.code == 409), "{created:?}");
    let sas = Api::<ServiceAccount>::namespaced(client.clone(), AUDIT_NS);
    sas.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap())
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": format!("pko-audit-{name}")},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": AUDIT_NS}]}))
            .unwrap(),
        )
        .await
        .unwrap();
    let tr = k8s_openapi::api::authentication::v1::TokenRequest {
        spec: k8s_openapi::api::authentication::v1::TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = sas.create_token_request(name, &PostParams::default(), &tr).await.unwrap().status.unwrap().token;
    let bed = testbed();
    let path = dir.join(format!("{name}.kubeconfig"));
    let kc = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: bed\n  cluster: {{server: \"{}\", certificate-authority: \
            \"{}\"}}\nusers:\n- name: r\n  user: {{token: \"{token}\"}}\ncontexts:\n- name: c\n  context: {{cluster: \
                bed, user: r}}\ncurrent-context: c\n",
        bed.api_server_url(),
        bed.ca_file().display()
    );
    std::fs::write(&path, kc).unwrap();
    path
}

fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
}

async fn holders(leases: &Api<Lease>) -> BTreeMap<u32, String> {
    shard_holders(leases, FLEET).await
}

/// One write of the audit log: when, by whom, on what.
#[derive(Debug)]
struct Write {
    at: Timestamp,
    user: String,
    #[allow(dead_code)] // printed when an assertion fails
    verb: String,
    resource: String,
    #[allow(dead_code)] // printed when an assertion fails
    subresource: String,
    namespace: String,
    name: String,
    code: i64,
}

fn audit_writes(since: Timestamp) -> Vec<Write> {
    let path = PathBuf::from(testbed().var("PKO_TESTBED_RUN")).join("logs").join("audit.log");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (the bed must run with its audit policy)", path.display()));
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|e| {
            let at: Timestamp = e["requestReceivedTimestamp"].as_str()?.parse().ok()?;
            (at >= since).then(|| Write {
                at,
                user: e["user"]["username"].as_str().unwrap_or_default().to_string(),
                verb: e["verb"].as_str().unwrap_or_default().to_string(),
                resource: e["objectRef"]["resource"].as_str().unwrap_or_default().to_string(),
                subresource: e["objectRef"]["subresource"].as_str().unwrap_or_default().to_string(),
                namespace: e["objectRef"]["namespace"].as_str().unwrap_or_default().to_string(),
                name: e["objectRef"]["name"].as_str().unwrap_or_default().to_string(),
                code: e["responseStatus"]["code"].as_i64().unwrap_or_default(),
            })
        })
        .collect()
}

/// One agent call seen in an agent's log: when, which operation, which epoch, refused or not, and
/// whether it was refused for arriving after its sender's fence deadline (`late`), or started the
/// operation on that agent (`accepted`).
#[derive(Debug)]
struct Call {
    at: Timestamp,
    operation: String,
    epoch: i64,
    refused: bool,
    late: bool,
    accepted: bool,
}

fn agent_calls(dir: &Path) -> Vec<Call> {
    let mut calls = Vec::new();
    for f in std::fs::read_dir(dir).unwrap().flatten().filter(|f| f.file_name().to_string_lossy().ends_with(".log")) {
        for line in std::fs::read_to_string(f.path()).unwrap_or_default().lines() {
            if !line.contains("agent call") {
                continue;
            }
            let field = |k: &str| line.split_whitespace().find_map(|t| t.strip_prefix(k)).map(str::to_string);
            let (Some(at), Some(operation), Some(epoch)) = (
                line.split_whitespace().next().and_then(|t| t.parse().ok()),
                field("operation="),
                field("epoch=").and_then(|e| e.parse().ok()),
            ) else {
                continue;
            };
            calls.push(Call {
                at,
                operation,
                epoch,
                refused: line.contains("refused"),
                late: line.contains("fence deadline"),
                accepted: line.contains("operation accepted"),
            });
        }
    }
    calls.sort_by_key(|c| c.at);
    calls
}

/// Prints, for each Update still Progressing, its shard's holder, its status and the last lines of
/// every replica's and agent's log that name it: a failure in CI explains itself.
fn explain_stuck(dir: &Path, stuck: &[Update], held: &BTreeMap<u32, String>) {
    for u in stuck {
        let name = u.name_any();
        let shard = u.labels().get("pulumi.com/shard").and_then(|s| s.parse::<u32>().ok());
        eprintln!(
            "--- Update {name} (shard {shard:?}, held by {:?}) status: {}",
            shard.and_then(|s| held.get(&s)),
            serde_json::to_string(&u.status).unwrap_or_default()
        );
        for f in std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|f| f.file_name().to_string_lossy().ends_with(".log"))
        {
            let text = std::fs::read_to_string(f.path()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().filter(|l| l.contains(&name)).collect();
            for l in &lines[lines.len().saturating_sub(25)..] {
                eprintln!("{}: {}", f.file_name().to_string_lossy(), l.chars().take(400).collect::<String>());
            }
        }
    }
}

/// Keeps the replicas' logs (and their agents') when the test fails: copied to `<tmp>/<namespace>-logs`.
struct KeepLogsOnPanic(PathBuf, String);

impl Drop for KeepLogsOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let to = std::env::temp_dir().join(format!("{}-logs", self.1));
            let _ = std::fs::create_dir_all(&to);
            for f in std::fs::read_dir(&self.0)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|f| f.file_name().to_string_lossy().ends_with(".log"))
            {
                let _ = std::fs::copy(f.path(), to.join(f.file_name()));
            }
            eprintln!("replica logs kept in {}", to.display());
        }
    }
}

#[tokio::test]
async fn a_frozen_replica_makes_no_write_dispatch_or_agent_call_for_the_shards_it_lost() {
    let (client, ns, env) = setup("fencing").await;
    let runs = env.dir().join("runs.txt");
    let _logs = KeepLogsOnPanic(env.dir().to_path_buf(), ns.name().to_string());
    passphrase_secret(&ns).await;
    create(
        &ns.api::<pko_api::Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "prog"},
               "program": {"resources": {"r": {"type": "command:local:Command",
                   "properties": {"create": format!("sleep 12; echo ${{pulumi.stack}} >> {}", runs.display())}}}}}),
    )
    .await;
    let suffix = ns.name().rsplit('-').next().unwrap().to_string();
    let names: Vec<String> = (0..3).map(|i| format!("r{i}-{suffix}")).collect();
    let prefix = testbed().redis_prefix("fencing");
    let redis = ["--redis-url", testbed().redis_url(), "--redis-prefix", &prefix];
    let base = 17000 + (std::process::id() % 900) as u16;
    let mut replicas = BTreeMap::new();
    for (i, n) in names.iter().enumerate() {
        let kc = replica_identity(&client, env.dir(), n).await;
        replicas.insert(
            n.clone(),
            KillOnDrop(start_replica_process(&env, ns.name(), FLEET, n, &kc, base + i as u16, &redis)),
        );
    }
    let leases = ns.api::<Lease>();
    eventually("every shard is held", 60, || async { holders(&leases).await.len() == SHARDS as usize }).await;
    for i in 0..STACKS {
        create(
            &ns.api::<Stack>(),
            json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": format!("s{i}")},
                   "spec": {"stack": format!("s{i}"), "programRef": {"name": "prog"}, "backend": env.backend_url(),
                            "envRefs": passphrase_env_refs()}}),
        )
        .await;
    }

    // the victim: the holder of a shard with an operation running — not the Program's holder, whose
    // artifact server (named in the artifact URL) the agents download from: freezing it stalls every
    // download, a failure mode of its own (docs/architecture.md), not what this test is about
    let updates = ns.api::<Update>();
    let program_shard = pko_fleet::ring::shard_of(&format!("{}/prog", ns.name()), SHARDS);
    let victim = std::sync::Mutex::new(None);
    eventually("an Update is Progressing on a replica that does not serve the Program", 90, || async {
        let held = holders(&leases).await;
        let server = held.get(&program_shard).cloned();
        let candidate = updates
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|u| condition(u, "Progressing").is_some_and(|c| c.0 == "True"))
            .filter_map(|u| held.get(&u.labels().get("pulumi.com/shard")?.parse::<u32>().ok()?).cloned())
            .find(|h| Some(h) != server.as_ref());
        let found = candidate.is_some();
        *victim.lock().unwrap() = candidate;
        found
    })
    .await;
    let victim = victim.into_inner().unwrap().unwrap();
    let held: BTreeSet<u32> =
        holders(&leases).await.into_iter().filter(|(_, h)| *h == victim).map(|(s, _)| s).collect();
    signal(&replicas[&victim].0, nix::sys::signal::Signal::SIGSTOP);
    let t_stop = std::time::Instant::now();
    eventually("every shard of the frozen replica has moved", 60, || async {
        !holders(&leases).await.values().any(|h| *h == victim)
    })
    .await;
    let moved = t_stop.elapsed();
    // the new holders follow the operations to their end while it sleeps: when it wakes, its own
    // streams hold the results, which it must not write
    let progressing = || async {
        updates
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|u| condition(u, "Progressing").is_some_and(|c| c.0 == "True"))
            .collect::<Vec<_>>()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let left = progressing().await;
        if left.is_empty() {
            break;
        }
        if std::time::Instant::now() > deadline {
            explain_stuck(env.dir(), &left, &holders(&leases).await);
            panic!(
                "the operations the frozen replica drove are complete: not within 90 s ({} Progressing)",
                left.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (changes, recorder) = record_holders(leases.clone());
    tokio::time::sleep(Duration::from_secs(1)).await; // the recorder's first list is in
    let t_cont = Timestamp::now();
    signal(&replicas[&victim].0, nix::sys::signal::Signal::SIGCONT);
    eprintln!("froze {victim} holding {} shards; they moved in {moved:?}; it runs again at {t_cont}", held.len());

    let stacks = ns.api::<Stack>();
    eventually("every Stack is Ready", 240, || async {
        let all = stacks.list(&Default::default()).await.unwrap().items;
        all.len() == STACKS && all.iter().all(|s| stack_condition(s, "Ready").is_some_and(|c| c.0 == "True"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;

    // shard of every object name of the test namespace (Stacks and what is made for them; the Program)
    let mut shard_of: BTreeMap<String, u32> = BTreeMap::new();
    for s in stacks.list(&Default::default()).await.unwrap() {
        shard_of.insert(s.name_any(), s.labels()["pulumi.com/shard"].parse().unwrap());
    }
    for u in updates.list(&Default::default()).await.unwrap() {
        shard_of.insert(u.name_any(), u.labels()["pulumi.com/shard"].parse().unwrap());
    }
    shard_of.insert("prog".into(), pko_fleet::ring::shard_of(&format!("{}/prog", ns.name()), SHARDS));
    // an object's shard: the longest known name its name starts with (Events, outputs Secrets)
    let shard_for = |name: &str| {
        shard_of.iter().filter(|(n, _)| name.starts_with(n.as_str())).max_by_key(|(n, _)| n.len()).map(|(_, s)| *s)
    };

    let user = format!("system:serviceaccount:{AUDIT_NS}:{victim}");
    let writes: Vec<Write> = audit_writes(t_cont).into_iter().filter(|w| w.user == user).collect();
    recorder.abort();
    // a shard taken again: the victim's table write that the watch saw give it the shard (the last
    // of its table writes before the watch saw the change)
    let table_writes: Vec<Timestamp> = writes
        .iter()
        .filter(|w| {
            w.resource == "leases" && (200..300).contains(&w.code) && w.name.starts_with(&format!("{FLEET}-shards-"))
        })
        .map(|w| w.at)
        .collect();
    let retaken: BTreeMap<u32, Timestamp> = changes
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.wall >= t_cont && c.to.as_deref() == Some(victim.as_str()))
        .map(|c| (c.shard, table_writes.iter().copied().filter(|t| *t <= c.wall).max().unwrap_or(c.wall)))
        .fold(BTreeMap::new(), |mut m, (s, at)| {
            m.entry(s).or_insert(at);
            m
        });
    let stale: Vec<&Write> = writes
        .iter()
        .filter(|w| w.namespace == ns.name() && w.resource != "leases")
        .filter(|w| shard_for(&w.name).is_some_and(|s| held.contains(&s) && retaken.get(&s).is_none_or(|t| w.at < *t)))
        .collect();
    eprintln!(
        "{} writes by {victim} after SIGCONT; shards it took again: {:?}",
        writes.len(),
        retaken.keys().collect::<Vec<_>>()
    );
    // the residual window (docs/design/agents.md): a write checked right before the freeze is sent the moment the
    // process runs again — at most one per Stack's pass in flight, within the first 100 ms; nothing later
    let window = t_cont.checked_add(k8s_openapi::jiff::SignedDuration::from_millis(100)).unwrap();
    let (residual, violations): (Vec<&Write>, Vec<&Write>) = stale.into_iter().partition(|w| w.at <= window);
    eprintln!("writes in the residual window (checked before the freeze): {residual:?}");
    assert!(residual.len() <= STACKS, "more than one write per Stack's pass in flight on waking: {residual:#?}");
    assert!(violations.is_empty(), "writes by the frozen replica to shards it had lost: {violations:#?}");

    // agents: no call with a stale epoch was served after the freeze; the only refusals after it are
    // of calls the frozen replica had checked and sent right before it froze, which arrived after
    // its fence deadline; and no operation was started on two agents
    let calls = agent_calls(env.dir());
    assert!(!calls.is_empty(), "the agents log their calls");
    let mut newest: BTreeMap<&str, i64> = BTreeMap::new();
    for c in calls.iter().filter(|c| !c.refused) {
        let n = newest.entry(c.operation.as_str()).or_insert(c.epoch);
        assert!(
            c.epoch >= *n || c.at < t_cont,
            "a call with a stale epoch served after the freeze: {c:?} (newest {n})"
        );
        *n = (*n).max(c.epoch);
    }
    for c in calls.iter().filter(|c| c.refused && c.at >= t_cont) {
        assert!(c.late, "an agent refused a stale call after the freeze that its sender should not have made: {c:?}");
    }
    eprintln!(
        "calls in flight at the freeze, refused by their fence deadline: {}",
        calls.iter().filter(|c| c.late).count()
    );
    let mut accepted: BTreeMap<&str, usize> = BTreeMap::new();
    for c in calls.iter().filter(|c| c.accepted) {
        *accepted.entry(c.operation.as_str()).or_default() += 1;
    }
    assert!(accepted.values().all(|n| *n == 1), "an operation started on more than one agent: {accepted:?}");

    // the work itself: one `up` per Stack, nothing left running, no lock
    let mut trace: Vec<String> = std::fs::read_to_string(&runs).unwrap().lines().map(str::to_string).collect();
    trace.sort();
    assert_eq!(trace, (0..STACKS).map(|i| format!("s{i}")).collect::<Vec<_>>(), "each program ran exactly once");
    assert!(
        updates
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|u| condition(u, "Progressing").is_none_or(|c| c.0 != "True")),
        "no Update is left Progressing"
    );
    assert!(files_under(&env.dir().join("state").join(".pulumi").join("locks")).is_empty(), "no lock is left");

    // what each operation printed, in the fleet's output store: the lines of the operations the frozen
    // replica drove, stored by it before the freeze and by their new holders after, each line once and
    // ending with the result — readable from any replica
    use pko_operator::queue::output::OutputStore;
    let output = pko_operator::queue::redis::RedisQueue::new(
        testbed().redis_url(),
        &prefix,
        "reader",
        pko_queue::NamespaceLimits::NONE,
    )
    .unwrap()
    .output(Default::default());
    for u in updates.list(&Default::default()).await.unwrap() {
        let stack = format!("{}/{}", ns.name(), u.spec.workspace_name.clone().unwrap_or_default());
        let kept = output
            .read(&stack, &u.name_any(), None)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("no output kept for {stack} {}", u.name_any()));
        let seqs: Vec<u64> = kept.lines.iter().map(|l| l.seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "each line once, in order: {seqs:?}");
        assert_eq!(kept.lines.iter().filter(|l| l.stream == "result").count(), 1, "one result, last: {:?}", kept.lines);
        assert_eq!(kept.lines.last().map(|l| l.stream.as_str()), Some("result"));
        assert!(kept.lines.iter().any(|l| l.text.contains("command:local:Command r created")), "{:?}", kept.lines);
    }

    drop(replicas);
    let _ = Command::new("pkill").args(["-f", &env.dir().join("agents").display().to_string()]).status();
    for n in &names {
        let _ =
            Api::<ClusterRoleBinding>::all(client.clone()).delete(&format!("pko-audit-{n}"), &Default::default()).await;
        let _ = Api::<ServiceAccount>::namespaced(client.clone(), AUDIT_NS).delete(n, &Default::default()).await;
    }
}

/// One change of a shard's holder in the shard table as watched: when, which shard, from whom to whom.
#[derive(Debug, Clone)]
struct HolderChange {
    at: std::time::Instant,
    /// When the watch saw it, by the wall clock (the audit log's).
    wall: Timestamp,
    shard: u32,
    from: Option<String>,
    to: Option<String>,
}

/// Records every change of a shard's holder in the shard table of `ns` (fleet [`FLEET`]) until aborted.
fn record_holders(
    leases: Api<Lease>,
) -> (std::sync::Arc<std::sync::Mutex<Vec<HolderChange>>>, tokio::task::JoinHandle<()>) {
    use futures::StreamExt;
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let out = log.clone();
    let task = tokio::spawn(async move {
        let cfg = kube::runtime::watcher::Config::default()
            .labels(&format!("pulumi.com/fleet={FLEET},pulumi.com/lease=table"));
        let mut last: BTreeMap<u32, Option<String>> = BTreeMap::new();
        let mut events =
            std::pin::pin!(kube::runtime::WatchStreamExt::default_backoff(kube::runtime::watcher(leases, cfg)));
        while let Some(e) = events.next().await {
            let (kube::runtime::watcher::Event::Apply(l) | kube::runtime::watcher::Event::InitApply(l)) = (match e {
                Ok(e) => e,
                Err(_) => continue,
            }) else {
                continue;
            };
            let Ok(table) = pko_fleet::table::ShardTable::of(&l) else { continue };
            let (at, wall) = (std::time::Instant::now(), Timestamp::now());
            for (shard, entry) in table.0 {
                let before = last.insert(shard, entry.holder.clone());
                if let Some(from) = before.filter(|f| *f != entry.holder) {
                    out.lock().unwrap().push(HolderChange { at, wall, shard, from, to: entry.holder });
                }
            }
        }
    });
    (log, task)
}

/// A replica frozen past its lease while its agents run two operations, then resumed: the survivors
/// take its shards and follow its operations on its agents (no second `up`), and once it runs again
/// it takes no shard from a live replica — shards come back to it only through their holders' release
/// (a replica judges a member dead only after watching it go un-renewed for a full lease on its own
/// clock, which a process that was frozen has not done).
#[tokio::test]
async fn a_replica_resumed_after_a_freeze_takes_no_shard_from_a_live_replica_and_no_operation_runs_twice() {
    const N: usize = 10;
    let (_client, ns, env) = setup("freeze").await;
    let runs = env.dir().join("runs.txt");
    let _logs = KeepLogsOnPanic(env.dir().to_path_buf(), ns.name().to_string());
    passphrase_secret(&ns).await;
    create(
        &ns.api::<pko_api::Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "prog"},
               "program": {"resources": {"r": {"type": "command:local:Command",
                   "properties": {"create": format!("sleep 30; echo ${{pulumi.stack}} >> {}", runs.display())}}}}}),
    )
    .await;
    let suffix = ns.name().rsplit('-').next().unwrap().to_string();
    let names: Vec<String> = (0..3).map(|i| format!("f{i}-{suffix}")).collect();
    let prefix = testbed().redis_prefix("freeze");
    let redis = ["--redis-url", testbed().redis_url(), "--redis-prefix", &prefix];
    let base = 17900 + (std::process::id() % 90) as u16;
    let admin = std::path::PathBuf::from(testbed().var("KUBECONFIG"));
    let mut replicas = BTreeMap::new();
    for (i, n) in names.iter().enumerate() {
        replicas.insert(
            n.clone(),
            KillOnDrop(start_replica_process(&env, ns.name(), FLEET, n, &admin, base + i as u16, &redis)),
        );
    }
    let leases = ns.api::<Lease>();
    eventually("every shard is held", 60, || async { holders(&leases).await.len() == SHARDS as usize }).await;
    let (changes, recorder) = record_holders(leases.clone());
    for i in 0..N {
        create(
            &ns.api::<Stack>(),
            json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": format!("s{i}")},
                   "spec": {"stack": format!("s{i}"), "programRef": {"name": "prog"}, "backend": env.backend_url(),
                       "envRefs": passphrase_env_refs()}}),
        )
        .await;
    }
    // the victim: a replica running two operations that does not serve the Program's artifact
    let updates = ns.api::<Update>();
    let program_shard = pko_fleet::ring::shard_of(&format!("{}/prog", ns.name()), SHARDS);
    let victim = std::sync::Mutex::new(None);
    eventually("a replica not serving the Program runs two operations", 90, || async {
        let held = holders(&leases).await;
        let server = held.get(&program_shard).cloned();
        let mut running: BTreeMap<String, usize> = BTreeMap::new();
        for u in updates
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|u| condition(u, "Progressing").is_some_and(|c| c.0 == "True"))
        {
            if let Some(h) =
                u.labels().get("pulumi.com/shard").and_then(|s| s.parse::<u32>().ok()).and_then(|s| held.get(&s))
            {
                *running.entry(h.clone()).or_default() += 1;
            }
        }
        let found = running.into_iter().find(|(h, n)| *n >= 2 && Some(h) != server.as_ref()).map(|(h, _)| h);
        let ok = found.is_some();
        *victim.lock().unwrap() = found;
        ok
    })
    .await;
    let victim = victim.into_inner().unwrap().unwrap();
    // frozen past its lease (6 s) while its agents run on (their operations take 30 s)
    signal(&replicas[&victim].0, nix::sys::signal::Signal::SIGSTOP);
    let frozen_at = std::time::Instant::now();
    eventually("every shard of the frozen replica has moved", 60, || async {
        !holders(&leases).await.values().any(|h| *h == victim)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    signal(&replicas[&victim].0, nix::sys::signal::Signal::SIGCONT);
    let resumed_at = std::time::Instant::now();
    eprintln!("froze {victim} for {:.1} s", resumed_at.duration_since(frozen_at).as_secs_f64());

    let stacks = ns.api::<Stack>();
    eventually("every Stack is Ready", 240, || async {
        let all = stacks.list(&Default::default()).await.unwrap().items;
        all.len() == N && all.iter().all(|s| stack_condition(s, "Ready").is_some_and(|c| c.0 == "True"))
    })
    .await;
    // the resumed replica gets its shards back from the ring, by the holders' release
    eventually("the resumed replica holds shards again", 60, || async {
        holders(&leases).await.values().any(|h| *h == victim)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    recorder.abort();

    // no shard of a live holder taken over its head: after the resume, a holder only ever releases
    let taken_from_live: Vec<HolderChange> = changes
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.at >= resumed_at && c.from.as_ref().is_some_and(|f| *f != victim) && c.to.is_some())
        .cloned()
        .collect();
    let all_changes = changes.lock().unwrap().len();
    eprintln!(
        "{all_changes} holder changes recorded; taken from a live holder after the resume: {}",
        taken_from_live.len()
    );
    assert!(taken_from_live.is_empty(), "shards taken from a live replica without its release: {taken_from_live:#?}");
    // each operation started on one agent, ran once, succeeded
    let mut accepted: BTreeMap<String, usize> = BTreeMap::new();
    for c in agent_calls(env.dir()).iter().filter(|c| c.accepted) {
        *accepted.entry(c.operation.clone()).or_default() += 1;
    }
    assert!(accepted.values().all(|n| *n == 1), "an operation started on more than one agent: {accepted:?}");
    let mut trace: Vec<String> = std::fs::read_to_string(&runs).unwrap().lines().map(str::to_string).collect();
    trace.sort();
    assert_eq!(trace, (0..N).map(|i| format!("s{i}")).collect::<Vec<_>>(), "each program ran exactly once");
    let all = updates.list(&Default::default()).await.unwrap().items;
    assert_eq!(all.len(), N, "one Update per Stack");
    assert!(
        all.iter().all(|u| condition(u, "Failed") == Some(("False".into(), "UpdateSucceeded".into()))),
        "every Update succeeded"
    );
    assert!(files_under(&env.dir().join("state").join(".pulumi").join("locks")).is_empty(), "no lock is left");
    drop(replicas);
    let _ = Command::new("pkill").args(["-f", &env.dir().join("agents").display().to_string()]).status();
}
