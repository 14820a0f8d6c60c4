//! Three operator replicas in one fleet (`--fleet`) against one API server: every Stack is labelled
//! with its shard, owned by exactly one replica, and runs exactly one Update; when a replica stops
//! gracefully, the others take its shards and its Stacks keep converging, the Program's artifact
//! still reachable although its URL names the stopped replica.

mod common;

use std::collections::BTreeMap;

use std::time::Duration;

use common::*;
use kube::ResourceExt;
use pko_api::{Program, Stack, Update};
use pko_testbed::eventually;
use serde_json::json;

const STACKS: usize = 9;

async fn ready_count(stacks: &kube::Api<Stack>) -> usize {
    stacks
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|s| stack_condition(s, "Ready").is_some_and(|c| c.0 == "True"))
        .count()
}

#[tokio::test]
async fn three_replicas_split_the_stacks_and_take_over_a_stopped_one() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let (client, ns, env) = setup("fleet").await;
    let prefix = pko_testbed::testbed().redis_prefix("fleet");
    let redis = ["--redis-url", pko_testbed::testbed().redis_url(), "--redis-prefix", &prefix];
    let mut replicas = Vec::new();
    for r in ["r0", "r1", "r2"] {
        replicas.push(Some(
            InProcessOperator::start_with(
                &client,
                &env,
                run_args_with(&env, ns.name(), &fleet_args(ns.name(), r, &redis)),
            )
            .await,
        ));
    }
    create(
        &ns.api::<Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "p"},
               "configuration": {"n": {"type": "String", "default": "0"}},
               "program": {"resources": {"r": {"type": "command:local:Command", "properties": {"create": "echo ${n}"}}},
                   "outputs": {"out": "${r.stdout}"}}}),
    )
    .await;
    let stack = |i: usize, n: &str| {
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": format!("s{i}")},
               "spec": {"stack": format!("s{i}"), "programRef": {"name": "p"}, "backend": env.backend_url(),
                   "config": {"n": n},
                        "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Literal",
                            "literal": {"value": pko_testbed::PulumiEnv::PASSPHRASE}}}}})
    };
    for i in 0..STACKS {
        create(&ns.api::<Stack>(), stack(i, "0")).await;
    }
    let stacks = ns.api::<Stack>();
    let ready = tokio::time::timeout(Duration::from_secs(180), async {
        while ready_count(&stacks).await < STACKS {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
    if ready.is_err() {
        for s in stacks.list(&Default::default()).await.unwrap() {
            eprintln!(
                "{} labels={:?} conditions={:?}",
                s.name_any(),
                s.labels(),
                s.status.as_ref().and_then(|x| x.conditions.clone())
            );
        }
        panic!("not every Stack Ready within 180 s");
    }

    // labelled, owned by exactly one replica, one Update each
    let owners = |replicas: &Vec<Option<InProcessOperator>>, s: &Stack| {
        replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                r.as_ref()
                    .is_some_and(|r| r.running.as_ref().is_some_and(|x| x.ctx.ownership.owns(ns.name(), &s.name_any())))
            })
            .map(|(i, _)| i)
            .collect::<Vec<_>>()
    };
    let mut by_owner: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for s in stacks.list(&Default::default()).await.unwrap() {
        let shard = s.labels().get("pulumi.com/shard").cloned();
        assert_eq!(
            shard,
            Some(pko_fleet::ring::shard_of(&format!("{}/{}", ns.name(), s.name_any()), 64).to_string()),
            "{} labelled with its shard",
            s.name_any()
        );
        let o = owners(&replicas, &s);
        assert_eq!(o.len(), 1, "{} owned by {o:?}", s.name_any());
        by_owner.entry(o[0]).or_default().push(s.name_any());
    }
    eprintln!("stacks by replica: {by_owner:?}");
    let updates = ns.api::<Update>().list(&Default::default()).await.unwrap().items;
    assert_eq!(
        updates.len(),
        STACKS,
        "one Update per Stack: {:?}",
        updates.iter().map(|u| u.name_any()).collect::<Vec<_>>()
    );
    assert!(updates.iter().all(|u| u.labels().contains_key("pulumi.com/shard")), "Updates carry the shard label");

    // stop the replica whose address the Program's published URL names (its Stacks move, and an agent
    // without the artifact downloads it from its dispatching replica, the URL's mirror, until the
    // Program's new holder republishes); change every Stack: all converge on the other two
    let url =
        ns.api::<Program>().get("p").await.unwrap().status.and_then(|s| s.artifact).map(|a| a.url).unwrap_or_default();
    let gone = replicas.iter().position(|r| {
        r.as_ref()
            .and_then(|r| r.running.as_ref())
            .is_some_and(|x| url.contains(&format!("//{}/", x.ctx.advertised_addr)))
    });
    let gone = gone.unwrap_or_else(|| panic!("the Program's URL {url:?} names a replica"));
    let moved = by_owner.get(&gone).cloned().unwrap_or_default();
    let t = std::time::Instant::now();
    if let Some(op) = replicas[gone].take() {
        op.stop().await;
    }
    eprintln!("replica r{gone} stopped ({} Stacks) in {:.1} s", moved.len(), t.elapsed().as_secs_f64());
    for i in 0..STACKS {
        stacks
            .patch(
                &format!("s{i}"),
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"config": {"n": "1"}}})),
            )
            .await
            .unwrap();
    }
    let converged = tokio::time::timeout(Duration::from_secs(180), async {
        loop {
            let items = stacks.list(&Default::default()).await.unwrap().items;
            let done = items.iter().filter(|s| {
                s.status.as_ref().and_then(|st| st.outputs.as_ref()).is_some_and(|o| o["out"] == json!("1"))
                    && stack_condition(s, "Ready").is_some_and(|c| c.0 == "True")
            });
            if done.count() == STACKS {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    if converged.is_err() {
        dump_stacks_and_updates(&ns).await;
        for (i, r) in replicas.iter().enumerate() {
            let held = r
                .as_ref()
                .and_then(|r| r.running.as_ref())
                .map(|x| (0..64u32).filter(|s| x.ctx.ownership.owns(ns.name(), &format!("probe-{s}"))).count());
            eprintln!("replica r{i}: {held:?} of 64 probe names owned");
        }
        panic!("every Stack converges on the second generation: not within 180 s");
    }
    eprintln!("all Stacks converged {:.1} s after the stop", t.elapsed().as_secs_f64());
    for s in stacks.list(&Default::default()).await.unwrap() {
        let o = owners(&replicas, &s);
        assert_eq!(o.len(), 1, "{} owned by {o:?} after the stop", s.name_any());
        assert_ne!(o[0], gone);
    }
    let updates = ns.api::<Update>().list(&Default::default()).await.unwrap().items;
    if updates.len() != 2 * STACKS {
        dump_stacks_and_updates(&ns).await;
    }
    assert_eq!(updates.len(), 2 * STACKS, "one more Update per Stack, none doubled, none failed");
}

/// Labels are an index, never the truth of ownership: a Stack applied with another Stack's shard labels
/// (`kubectl get -o yaml`, renamed), with a shard label that is no shard, or with one out of range, is
/// relabelled and reconciled once, on three replicas.
#[tokio::test]
async fn stacks_with_copied_forged_or_garbage_shard_labels_are_relabelled_and_reconciled_once() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let (client, ns, env) = setup("fleet-labels").await;
    let prefix = pko_testbed::testbed().redis_prefix("fleet-labels");
    let redis = ["--redis-url", pko_testbed::testbed().redis_url(), "--redis-prefix", &prefix];
    let mut replicas = Vec::new();
    for r in ["r0", "r1", "r2"] {
        replicas.push(
            InProcessOperator::start_with(
                &client,
                &env,
                run_args_with(&env, ns.name(), &fleet_args(ns.name(), r, &redis)),
            )
            .await,
        );
    }
    create(
        &ns.api::<Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "p"},
               "program": {"resources": {"r": {"type": "command:local:Command", "properties": {"create": "echo hi"}}},
                   "outputs": {"out": "${r.stdout}"}}}),
    )
    .await;
    let shard = |name: &str| pko_fleet::ring::shard_of(&format!("{}/{name}", ns.name()), 64);
    // the labels of another Stack: a shard that is not the copy's own (and held by some replica)
    let original = "original";
    let copied = (0..).map(|i| format!("copy-{i}")).find(|n| shard(n) != shard(original)).unwrap();
    let cases = [
        (copied.as_str(), shard(original).to_string()),
        ("garbage", "not-a-shard".to_string()),
        ("out-of-range", "9999".to_string()),
    ];
    for (name, label) in &cases {
        create(
            &ns.api::<Stack>(),
            json!({"apiVersion": "pulumi.com/v1", "kind": "Stack",
                   "metadata": {"name": name, "labels": {"pulumi.com/shard": label, "pulumi.com/shards": "64"}},
                   "spec": {"stack": name, "programRef": {"name": "p"}, "backend": env.backend_url(),
                            "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Literal",
                                "literal": {"value": pko_testbed::PulumiEnv::PASSPHRASE}}}}}),
        )
        .await;
    }
    let stacks = ns.api::<Stack>();
    let t = std::time::Instant::now();
    eventually("every mislabelled Stack is relabelled and Ready", 120, || async {
        ready_count(&stacks).await == cases.len()
    })
    .await;
    eprintln!(
        "all {} mislabelled Stacks Ready {:.1} s after they were applied",
        cases.len(),
        t.elapsed().as_secs_f64()
    );
    for (name, _) in &cases {
        let s = stacks.get(name).await.unwrap();
        assert_eq!(
            s.labels().get("pulumi.com/shard"),
            Some(&shard(name).to_string()),
            "{name} carries its own shard now"
        );
        let updates: Vec<_> = ns
            .api::<Update>()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|u| u.labels().get("pulumi.com/stack-name").map(String::as_str) == Some(name))
            .collect();
        assert_eq!(updates.len(), 1, "{name}: one Update, none doubled");
        let owners = replicas
            .iter()
            .filter(|r| r.running.as_ref().is_some_and(|x| x.ctx.ownership.owns(ns.name(), name)))
            .count();
        assert_eq!(owners, 1, "{name} owned by one replica");
    }
}

/// A Workspace whose Program artifact URL names a replica that is gone (a shard moved, the Program's
/// new holder has not republished yet; here a closed port) still initializes and runs its Update: the
/// dispatching replica gives its own artifact server as the URL's mirror, and the agent verifies the
/// digest of what it answered.
#[tokio::test]
async fn a_program_url_naming_a_gone_replica_is_served_by_the_dispatching_one() {
    let (client, ns, env) = setup("fleet-mirror").await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    create(
        &ns.api::<Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "p"},
               "program": {"resources": {"r": {"type": "command:local:Command",
                   "properties": {"create": "echo mirrored"}}}, "outputs": {"out": "${r.stdout}"}}}),
    )
    .await;
    let programs = ns.api::<Program>();
    eventually("the Program is published", 60, || async {
        programs.get("p").await.unwrap().status.and_then(|s| s.artifact).is_some()
    })
    .await;
    let artifact = programs.get("p").await.unwrap().status.and_then(|s| s.artifact).unwrap();
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let url = format!("http://{gone}/{}", artifact.path);
    create(
        &ns.api::<pko_api::Workspace>(),
        json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Workspace", "metadata": {"name": "w"},
               "spec": {"flux": {"url": url, "digest": artifact.digest},
                        "env": [{"name": "PULUMI_BACKEND_URL", "value": env.backend_url()},
                            {"name": "PULUMI_CONFIG_PASSPHRASE", "value": pko_testbed::PulumiEnv::PASSPHRASE}],
                        "stacks": [{"name": "dev", "create": true}]}}),
    )
    .await;
    let update = json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update", "metadata": {"name": "u"},
        "spec": {"workspaceName": "w", "stackName": "dev", "type": "up"}});
    create(&ns.api::<Update>(), owned_update(&ns.api::<pko_api::Workspace>(), update).await).await;
    let updates = ns.api::<Update>();
    eventually("the Update completes from the mirror", 120, || async {
        let u = updates.get("u").await.unwrap();
        let failed = u
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Failed" && c.status == "True"));
        assert!(!failed, "the Update failed: {:?}", u.status.and_then(|s| s.message));
        condition(&u, "Complete") == Some(("True".into(), "Updated".into()))
    })
    .await;
    assert_eq!(
        ns.api::<pko_api::Workspace>().get("w").await.unwrap().spec.flux.and_then(|f| f.url),
        Some(url),
        "the Workspace keeps the URL it was given"
    );
}

#[tokio::test]
async fn a_second_replica_without_redis_is_refused() {
    let (client, ns, env) = setup("fleet-noredis").await;
    let _first =
        InProcessOperator::start_with(&client, &env, run_args_with(&env, ns.name(), &fleet_args(ns.name(), "r0", &[])))
            .await;
    eventually("r0's membership is written", 30, || async {
        ns.api::<k8s_openapi::api::coordination::v1::Lease>()
            .get_opt(&pko_fleet::lease::replica_name("pko", "r0"))
            .await
            .unwrap()
            .is_some()
    })
    .await;
    let second = pko_operator::run::Operator::new(
        client.clone(),
        run_args_with(&env, ns.name(), &fleet_args(ns.name(), "r1", &[])),
    )
    .start(tokio_util::sync::CancellationToken::new())
    .await;
    let err = second.err().expect("a second replica without Redis is refused").to_string();
    assert!(err.contains("replica r0 is live") && err.contains("--redis-url"), "{err}");

    // the labeller: a Workspace and an Update made by hand (PKO's auto.pulumi.com API, no Stack) get
    // the shard of the Workspace, so one replica owns both
    create(
        &ns.api::<pko_api::Workspace>(),
        json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Workspace",
        "metadata": {"name": "hand"}, "spec": {}}),
    )
    .await;
    create(
        &ns.api::<Update>(),
        json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update", "metadata": {"name": "hand-1"},
            "spec": {"workspaceName": "hand", "stackName": "dev", "type": "up"}}),
    )
    .await;
    let want = pko_fleet::ring::shard_of(&format!("{}/hand", ns.name()), 64).to_string();
    eventually("the hand-made Workspace and Update are labelled with the Workspace's shard", 30, || async {
        let w = ns.api::<pko_api::Workspace>().get("hand").await.unwrap();
        let u = ns.api::<Update>().get("hand-1").await.unwrap();
        w.labels().get("pulumi.com/shard") == Some(&want) && u.labels().get("pulumi.com/shard") == Some(&want)
    })
    .await;
}
