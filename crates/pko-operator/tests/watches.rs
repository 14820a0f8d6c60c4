//! Each kind is watched once: an operator running every controller over two namespaces opens one
//! WATCH per kind and namespace — never a cluster-wide one — and makes no periodic LIST (the reshape
//! issue; before it, Stacks and Programs were watched three times each and Workspaces were LISTed every
//! 5 s). Counted on the operator's own HTTP requests, through a tower layer on its client.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use pko_api::{Program, Stack};
use pko_testbed::{eventually, testbed};
use serde_json::json;

/// One request of the operator: method, path, query.
type Seen = Arc<Mutex<Vec<(String, String, String)>>>;

/// The collection requests in `seen` (from index `from`) of one verb, by `namespace/resource`
/// (`*/resource` for a cluster-wide one): `watch` for WATCHes, else LISTs.
fn collections(seen: &Seen, from: usize, watch: bool) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (method, path, query) in seen.lock().unwrap().iter().skip(from) {
        if method != "GET" || query.contains("watch=true") != watch {
            continue;
        }
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        // /api/v1/namespaces/N/R, /apis/G/V/namespaces/N/R, or /api/v1/R, /apis/G/V/R (cluster-wide)
        let rest = if parts.first() == Some(&"api") { &parts[2..] } else { &parts[3.min(parts.len())..] };
        let key = match rest {
            ["namespaces", ns, resource] => format!("{ns}/{resource}"),
            [resource] => format!("*/{resource}"),
            _ => continue, // a single object
        };
        *out.entry(key).or_insert(0) += 1;
    }
    out
}

#[tokio::test]
async fn every_kind_is_watched_once_per_namespace_and_nothing_lists_periodically() {
    let (admin, ns, env) = setup("watches").await;
    let other = testbed().namespace("watches-b").await.unwrap();
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        record.lock().unwrap().push((
            req.method().to_string(),
            req.uri().path().to_string(),
            req.uri().query().unwrap_or_default().to_string(),
        ));
        req
    });
    let client =
        kube::client::ClientBuilder::try_from(testbed().config().await.unwrap()).unwrap().with_layer(&layer).build();
    let _op = InProcessOperator::start(&client, &env, &format!("{},{}", ns.name(), other.name())).await;

    create(
        &ns.api::<Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "p"},
               "program": {"resources": {"hi": {"type": "command:local:Command",
                   "properties": {"create": "echo once"}}}}}),
    )
    .await;
    create(
        &ns.api::<Stack>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "s"},
               "spec": {"stack": "dev", "programRef": {"name": "p"}, "backend": env.backend_url(),
                        "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Literal",
                            "literal": {"value": pko_testbed::PulumiEnv::PASSPHRASE}}}}}),
    )
    .await;
    let stacks = kube::Api::<Stack>::namespaced(admin.clone(), ns.name());
    eventually("the Stack is Ready", 120, || async {
        stack_condition(&stacks.get("s").await.unwrap(), "Ready").is_some_and(|c| c.0 == "True")
    })
    .await;

    let watches = collections(&seen, 0, true);
    eprintln!("watches opened: {watches:?}");
    let mut expected = BTreeMap::new();
    for n in [ns.name(), other.name()] {
        // Secrets: the metadata-only watch of the Secret cache (`secret_cache`: versions, no data);
        // StackRollouts: every Stack's controller reads the one that governs it
        for r in ["stacks", "programs", "workspaces", "updates", "secrets", "stackrollouts"] {
            expected.insert(format!("{n}/{r}"), 1);
        }
    }
    assert_eq!(watches, expected, "one watch per kind and namespace, none cluster-wide");

    // at rest: no periodic LIST of any collection (the old Workspace sweeper listed every 5 s)
    let mark = seen.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(12)).await;
    let lists = collections(&seen, mark, false);
    assert!(lists.is_empty(), "collections listed at rest: {lists:?}");
    assert!(collections(&seen, mark, true).is_empty(), "watches reopened at rest");
}

/// Ownership that a test turns on and off: a replica's holding of a shard that is lost and taken again
/// between two published holdings, which no re-list follows.
#[derive(Debug, Default)]
struct Toggle(std::sync::atomic::AtomicBool);

impl pko_operator::ownership::Ownership for Toggle {
    fn owns(&self, _namespace: &str, _name: &str) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn epoch(&self, _namespace: &str, _name: &str) -> i64 {
        1
    }
}

/// A Stack the controller skipped while its replica did not own it is reconciled once the replica
/// owns it again, with nothing changed on the Stack and no re-list: the controller looks again by
/// itself. Before, the skip waited for a change that never came (a fleet test left Stacks labelled
/// and never reconciled when the held shards flapped). Shown by the finalizer, the first write a
/// reconcile of a new Stack makes.
#[tokio::test]
async fn a_stack_skipped_while_not_owned_is_reconciled_once_owned_again_without_any_change() {
    use pko_api::constants::STACK_FINALIZER;
    let (client, ns, _env) = setup("flap").await;
    let toggle = Arc::new(Toggle::default());
    let ctx = Arc::new(pko_operator::context::Context::new(client.clone(), String::new(), toggle.clone()));
    let mut informers = pko_operator::informer::Informers::new(client.clone(), scoped(ns.name()));
    let (_, controller) = pko_operator::stack::controller::controller(ctx, &mut informers);
    let run = tokio::spawn(informers.drive(controller));
    create(
        &ns.api::<Stack>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "s"}, "spec": {"stack": "dev",
            "projectRepo": "https://example.invalid/r.git", "branch": "main"}}),
    )
    .await;
    let stacks = ns.api::<Stack>();
    let has_finalizer = || async {
        stacks.get("s").await.unwrap().metadata.finalizers.unwrap_or_default().iter().any(|f| f == STACK_FINALIZER)
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!has_finalizer().await, "not owned: the reconcile skipped the Stack");
    toggle.0.store(true, std::sync::atomic::Ordering::SeqCst);
    let since = std::time::Instant::now();
    eventually("the Stack is reconciled once owned", 20, || async { has_finalizer().await }).await;
    eprintln!("reconciled {:.1} s after ownership came back", since.elapsed().as_secs_f64());
    run.abort();
}

/// Programs are watched whole and reconciled by whoever owns them: one skipped while not owned is
/// reconciled again when the replica's holding gains shards (or takes one again at a new epoch, or
/// comes back after a gap) — the fleet's `gained` count, which the Program controller reconciles
/// everything on — with nothing changed on the Program and no re-list. Without that bump it stays
/// skipped. Shown by its artifact, the first status a reconcile writes.
#[tokio::test]
async fn a_program_skipped_while_not_owned_is_reconciled_again_when_shards_are_gained() {
    let (client, ns, _env) = setup("program-gain").await;
    let toggle = Arc::new(Toggle::default());
    let (gained_tx, gained) = tokio::sync::watch::channel(0u64);
    let mut ctx = pko_operator::context::Context::new(client.clone(), String::new(), toggle.clone());
    ctx.shards_gained = Some(gained);
    let mut informers = pko_operator::informer::Informers::new(client.clone(), scoped(ns.name()));
    let (_, controller) = pko_operator::program::program_controller(Arc::new(ctx), &mut informers);
    let run = tokio::spawn(informers.drive(controller));
    create(
        &ns.api::<Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "p"},
            "program": {"resources": {"r": {"type": "random:RandomPet"}}}}),
    )
    .await;
    let programs = ns.api::<Program>();
    let published = || async { programs.get("p").await.unwrap().status.and_then(|s| s.artifact).is_some() };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!published().await, "not owned: the reconcile skipped the Program");
    toggle.0.store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!published().await, "owned now, but nothing changed and nothing said shards were gained");
    gained_tx.send_modify(|n| *n += 1);
    eventually("the Program is reconciled once shards are gained", 20, || async { published().await }).await;
    run.abort();
}

/// A fleet replica watches only through its watch client, never through the request client, whose
/// read timeout (`--kube-api-timeout`) cuts any watch quiet for longer: the labeller's watches of
/// unlabelled objects and the Lease watch went through it, and at 10,000 Stacks were cut every 30 s,
/// each cut resumed or listed again (a `!pulumi.com/shard` list from etcd scanned every object of the
/// kind). Here the request client times out reads after 2 s; over 12 s at rest no watch is reopened.
#[tokio::test]
async fn a_fleet_replica_watches_only_through_its_watch_client_and_reopens_nothing_at_rest() {
    let (_admin, ns, env) = setup("fleet-watch").await;
    let record = |seen: Seen| {
        tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
            seen.lock().unwrap().push((
                req.method().to_string(),
                req.uri().path().to_string(),
                req.uri().query().unwrap_or_default().to_string(),
            ));
            req
        })
    };
    let (requests, watches): (Seen, Seen) = (Arc::default(), Arc::default());
    let mut config = testbed().config().await.unwrap();
    let watch_client =
        kube::client::ClientBuilder::try_from(config.clone()).unwrap().with_layer(&record(watches.clone())).build();
    config.read_timeout = Some(Duration::from_secs(2));
    let client = kube::client::ClientBuilder::try_from(config).unwrap().with_layer(&record(requests.clone())).build();
    let args = run_args_with(
        &env,
        ns.name(),
        &["--fleet", "--fleet-namespace", ns.name(), "--replica-id", "r0", "--shards", "16"],
    );
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = pko_operator::run::Operator::new(client.clone(), args)
        .watch_client(watch_client)
        .local_agent_env(env.vars())
        .start(shutdown.clone())
        .await
        .unwrap();
    let leases = kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), ns.name());
    eventually("the replica holds every shard", 60, || async {
        shard_holders(&leases, "pko").await.values().filter(|h| *h == "r0").count() == 16
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mark = watches.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(12)).await;
    let through_requests = collections(&requests, 0, true);
    assert!(through_requests.is_empty(), "watches through the client with a read timeout: {through_requests:?}");
    let opened = collections(&watches, 0, true);
    eprintln!("watches opened: {opened:?}");
    for kind in ["leases", "stacks", "workspaces", "updates"] {
        assert!(opened.contains_key(&format!("{}/{kind}", ns.name())), "no watch of {kind}: {opened:?}");
    }
    let reopened = collections(&watches, mark, true);
    assert!(reopened.is_empty(), "watches reopened at rest: {reopened:?}");
    shutdown.cancel();
    running.wait().await;
}

/// The selectors of the collection requests in `seen` from index `from`, decoded (`pulumi.com/shard in (2)`).
fn selectors(seen: &Seen, from: usize) -> Vec<String> {
    let decode = |q: &str| {
        q.replace("%2F", "/")
            .replace("%28", "(")
            .replace("%29", ")")
            .replace("%2C", ",")
            .replace("%3D", "=")
            .replace("%21", "!")
            .replace('+', " ")
    };
    seen.lock()
        .unwrap()
        .iter()
        .skip(from)
        .filter(|(m, _, _)| m == "GET")
        .filter_map(|(_, _, q)| q.split('&').find_map(|p| p.strip_prefix("labelSelector=")).map(decode))
        .collect()
}

/// A sharded informer follows the held shards without stopping the watch of the shards it keeps: a
/// gain lists only the gained shards' objects (a takeover at 10,000 Stacks re-listed everything held,
/// twice, and every operation of the survivors halted ~30 s meanwhile), changes of the kept shards go
/// on arriving, and a loss drops the lost shards' objects from the store without any request.
#[tokio::test]
async fn a_gain_lists_only_the_gained_shards_and_a_loss_lists_nothing() {
    use pko_api::constants::SHARD_LABEL;
    use pko_operator::informer::{HeldShards, Informer, list_config};
    let (_client, ns, _env) = setup("groups").await;
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let config = testbed().config().await.unwrap();
    let watch_client = kube::client::ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
            record.lock().unwrap().push((
                req.method().to_string(),
                req.uri().path().to_string(),
                req.uri().query().unwrap_or_default().to_string(),
            ));
            req
        }))
        .build();
    for (name, shard) in [("a", 1), ("b", 2)] {
        create(
            &ns.api::<Stack>(),
            json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name,
                "labels": {SHARD_LABEL: shard.to_string()}}, "spec": {"stack": "dev",
                    "projectRepo": "https://example.invalid/r.git", "branch": "main"}}),
        )
        .await;
    }
    let held = |v: &[u32]| HeldShards { shards: v.iter().copied().collect(), total: 16 };
    let (tx, rx) = tokio::sync::watch::channel(held(&[1]));
    let informer = Informer::<Stack>::new(&watch_client, &scoped(ns.name()), list_config()).with_held_shards(rx);
    let store = informer.store();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(informer.run(shutdown.clone()));
    let names = || {
        let mut v: Vec<String> = store.state().iter().map(|s| kube::ResourceExt::name_any(&**s)).collect();
        v.sort();
        v
    };
    eventually("shard 1's Stack is stored", 20, || async { names() == ["a"] }).await;
    assert_eq!(selectors(&seen, 0), ["pulumi.com/shard in (1)"; 2], "one list and one watch of shard 1");

    let mark = seen.lock().unwrap().len();
    tx.send_replace(held(&[1, 2]));
    eventually("shard 2's Stack is stored too", 20, || async { names() == ["a", "b"] }).await;
    assert_eq!(selectors(&seen, mark), ["pulumi.com/shard in (2)"; 2], "only the gained shard is listed and watched");
    let stacks = ns.api::<Stack>();
    stacks
        .patch(
            "a",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {"seen": "yes"}}})),
        )
        .await
        .unwrap();
    eventually("a change of shard 1 still arrives", 20, || async {
        store.state().iter().any(|s| kube::ResourceExt::annotations(&**s).contains_key("seen"))
    })
    .await;

    let mark = seen.lock().unwrap().len();
    tx.send_replace(held(&[1]));
    eventually("shard 2's Stack leaves the store", 20, || async { names() == ["a"] }).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(selectors(&seen, mark), Vec::<String>::new(), "a loss sends no list or watch");
    // every list asks for what the watch cache holds: without `resourceVersion=0` (kube leaves it out
    // of a paged list) a list is a consistent read, from etcd on etcd before 3.4.31 / 3.5.13, which
    // fetches every object of the kind to answer a selector of a few shards
    let lists: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(m, _, q)| m == "GET" && !q.contains("watch=true"))
        .map(|(_, _, q)| q.clone())
        .collect();
    assert!(
        !lists.is_empty() && lists.iter().all(|q| q.split('&').any(|p| p == "resourceVersion=0")),
        "every list is served from the watch cache: {lists:?}"
    );
    shutdown.cancel();
    let _ = run.await;
}

/// The labeller writes nothing while its replica stands by (another `--shards` prevails in the fleet),
/// and once its count prevails it labels with `pulumi.com/shard` and `pulumi.com/shards` every Stack
/// that lacks them, was labelled before the count was recorded, or was labelled for another count (a
/// change of `--shards`: before, such a Stack sat in the wrong replica's store for good). Once
/// labelled, a Stack is left alone.
#[tokio::test]
async fn the_labeller_relabels_stacks_of_another_shard_count_only_while_its_count_prevails() {
    use pko_api::constants::{SHARD_LABEL, SHARDS_LABEL};
    use pko_fleet::planning::Standing;
    use pko_operator::fleet::{label_unsharded, shard_labels};
    let (client, ns, _env) = setup("relabel").await;
    let stack = |name: &str, labels: serde_json::Value| {
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack",
        "metadata": {"name": name, "labels": labels}, "spec": {"stack": "dev",
            "projectRepo": "https://example.invalid/r.git", "branch": "main"}})
    };
    let stacks = ns.api::<Stack>();
    create(&stacks, stack("fresh", json!({}))).await;
    create(&stacks, stack("legacy", json!({SHARD_LABEL: "5"}))).await;
    create(&stacks, stack("moved", json!({SHARD_LABEL: "3", SHARDS_LABEL: "8"}))).await;
    let labels_of = |name: &'static str| {
        let stacks = stacks.clone();
        async move {
            stacks
                .get(name)
                .await
                .unwrap()
                .metadata
                .labels
                .unwrap_or_default()
                .into_iter()
                .filter(|(k, _)| k == SHARD_LABEL || k == SHARDS_LABEL)
                .collect::<BTreeMap<_, _>>()
        }
    };
    let want = |name: &str| shard_labels(ns.name(), name, 16);

    let (standing, rx) = tokio::sync::watch::channel(Standing::StandingBy { prevailing: 8, eldest: "old".into() });
    let owns_all = Arc::new(Toggle(std::sync::atomic::AtomicBool::new(true)));
    let shutdown = tokio_util::sync::CancellationToken::new();
    let labeller = tokio::spawn(label_unsharded(
        client.clone(),
        client.clone(),
        scoped(ns.name()),
        16,
        owns_all,
        rx,
        shutdown.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(labels_of("fresh").await.is_empty(), "standing by: nothing labelled");
    assert_eq!(labels_of("moved").await[SHARDS_LABEL], "8", "standing by: nothing relabelled");

    standing.send_replace(Standing::Active);
    for name in ["fresh", "legacy", "moved"] {
        eventually(&format!("{name} labelled for 16 shards"), 20, || async { labels_of(name).await == want(name) })
            .await;
    }
    let labelled_rv = stacks.get("moved").await.unwrap().metadata.resource_version;

    standing.send_replace(Standing::StandingBy { prevailing: 32, eldest: "new".into() });
    tokio::time::sleep(Duration::from_secs(1)).await;
    create(&stacks, stack("late", json!({}))).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(labels_of("late").await.is_empty(), "standing by again: the labeller stopped");
    standing.send_replace(Standing::Active);
    eventually("late labelled once its count prevails again", 20, || async { labels_of("late").await == want("late") })
        .await;
    assert_eq!(
        stacks.get("moved").await.unwrap().metadata.resource_version,
        labelled_rv,
        "a labelled Stack is not written again"
    );
    shutdown.cancel();
    let _ = labeller.await;
}

/// The holder of a new Stack's shard writes its shard labels and the Stack finalizer in one request
/// (the Stack controller's own finalizer write, right after the label's, was one request per new
/// Stack); a Stack being deleted gets its labels and no finalizer (the API refuses new ones); a Stack
/// whose shard this replica does not hold is labelled by its fallback without one (it may be no
/// replica's).
#[tokio::test]
async fn a_new_stack_gets_its_labels_and_finalizer_in_one_write_from_its_holder_only() {
    use futures::StreamExt;
    use kube::api::{DeleteParams, WatchEvent, WatchParams};
    use pko_api::constants::{SHARDS_LABEL, STACK_FINALIZER};
    use pko_fleet::planning::Standing;
    use pko_operator::fleet::label_unsharded;
    let (client, ns, _env) = setup("label-final").await;
    let stack = |name: &str, finalizers: serde_json::Value| {
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack",
        "metadata": {"name": name, "finalizers": finalizers}, "spec": {"stack": "dev",
            "projectRepo": "https://example.invalid/r.git", "branch": "main"}})
    };
    let stacks = ns.api::<Stack>();
    create(&stacks, stack("leaving", json!(["example.com/hold"]))).await;
    stacks.delete("leaving", &DeleteParams::default()).await.unwrap();
    let created =
        stacks.create(&Default::default(), &serde_json::from_value(stack("fresh", json!([]))).unwrap()).await.unwrap();
    let mut events = stacks
        .watch(
            &WatchParams::default().fields("metadata.name=fresh"),
            &created.metadata.resource_version.clone().unwrap(),
        )
        .await
        .unwrap()
        .boxed();

    let (_standing, rx) = tokio::sync::watch::channel(Standing::Active);
    let owns = Arc::new(Toggle(std::sync::atomic::AtomicBool::new(true)));
    let shutdown = tokio_util::sync::CancellationToken::new();
    let labeller = tokio::spawn(label_unsharded(
        client.clone(),
        client.clone(),
        scoped(ns.name()),
        16,
        owns.clone(),
        rx,
        shutdown.clone(),
    ));
    let labelled =
        |s: &Stack| s.metadata.labels.as_ref().is_some_and(|l| l.get(SHARDS_LABEL).is_some_and(|v| v == "16"));
    let mut writes = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(Ok(WatchEvent::Modified(s))) = events.next().await {
            let done = labelled(&s);
            writes.push(s);
            if done {
                break;
            }
        }
    })
    .await;
    let last = writes.last().expect("fresh written");
    assert!(labelled(last), "fresh labelled within 20 s");
    assert_eq!(writes.len(), 1, "one write: {writes:?}");
    assert_eq!(last.metadata.finalizers, Some(vec![STACK_FINALIZER.to_string()]), "the finalizer came with the labels");
    eventually("leaving labelled", 20, || async { labelled(&stacks.get("leaving").await.unwrap()) }).await;
    assert_eq!(
        stacks.get("leaving").await.unwrap().metadata.finalizers,
        Some(vec!["example.com/hold".to_string()]),
        "no finalizer added to a deleting Stack"
    );

    owns.0.store(false, std::sync::atomic::Ordering::SeqCst);
    create(&stacks, stack("elsewhere", json!([]))).await;
    eventually("elsewhere labelled by the fallback", 30, || async {
        labelled(&stacks.get("elsewhere").await.unwrap())
    })
    .await;
    assert_eq!(stacks.get("elsewhere").await.unwrap().metadata.finalizers, None, "not this replica's: no finalizer");
    shutdown.cancel();
    let _ = labeller.await;
}

/// The Secret-versions watch, on the real API server, knows a user's Secret and not an outputs Secret
/// (`auto.pulumi.com/component=update`): the operator's own outputs Secrets, one per Update, are
/// neither held nor sent to every replica.
#[tokio::test]
async fn the_secret_versions_watch_leaves_out_outputs_secrets() {
    use k8s_openapi::api::core::v1::Secret;
    use pko_operator::secret_cache::SecretCache;
    let (client, ns, _env) = setup("secret-watch").await;
    let secrets = ns.api::<Secret>();
    create(
        &secrets,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "outputs",
        "labels": {"auto.pulumi.com/component": "update"}}, "stringData": {"o": "1"}}),
    )
    .await;
    create(
        &secrets,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "passphrase"}, "stringData": {"p": "x"}}),
    )
    .await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let (cache, run) = SecretCache::watched(&client, &scoped(ns.name()), shutdown.clone());
    let watch = tokio::spawn(run);
    eventually("the user's Secret is watched", 20, || async {
        cache.current_version(ns.name(), "passphrase").is_some()
    })
    .await;
    assert_eq!(
        cache.current_version(ns.name(), "outputs"),
        None,
        "listed in the same answer: left out by the selector"
    );
    shutdown.cancel();
    let _ = watch.await;
}
