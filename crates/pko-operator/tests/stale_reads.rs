//! Deploy exactly what was asked: an Update that succeeds ran its own generation's configuration,
//! whatever the caches of the replica that runs it show. A shard moves to a replica whose watch of
//! the moved Workspaces trails the API server (as a new holder's does while its watch replays what it
//! missed, or while a loaded API server's watch cache trails etcd), and every Stack is changed right
//! after: each must become Ready at its new generation only with the new configuration deployed.

mod common;

use std::time::Duration;

use common::*;
use kube::ResourceExt;
use pko_api::{Program, Stack};
use serde_json::json;

const STACKS: usize = 8;

/// Ready at its current generation, from an Update of that generation.
fn ready_at_generation(s: &Stack) -> bool {
    let st = s.status.as_ref();
    let generation = s.metadata.generation;
    stack_condition(s, "Ready").is_some_and(|c| c.0 == "True")
        && st.and_then(|x| x.observed_generation) == generation
        && st.and_then(|x| x.last_update.as_ref()).and_then(|u| u.generation) == generation
}

fn out(s: &Stack) -> Option<serde_json::Value> {
    s.status.as_ref()?.outputs.as_ref()?.get("out").cloned()
}

#[tokio::test]
async fn a_moved_stack_changed_right_after_deploys_its_new_config_on_a_lagging_cache() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let (client, ns, env) = setup("stale").await;
    let prefix = pko_testbed::testbed().redis_prefix("stale");
    let redis = ["--redis-url", pko_testbed::testbed().redis_url(), "--redis-prefix", &prefix];
    let lag = lag::Lag::default();
    let lagging = lag::lagging_client("workspaces", Duration::from_secs(20), lag.clone()).await;
    let r0 = InProcessOperator::start_with(
        &client,
        &env,
        run_args_with(&env, ns.name(), &fleet_args(ns.name(), "r0", &redis)),
    )
    .await;
    let r1 = InProcessOperator::start_with(
        &lagging,
        &env,
        run_args_with(&env, ns.name(), &fleet_args(ns.name(), "r1", &redis)),
    )
    .await;
    create(
        &ns.api::<Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "p"},
               "configuration": {"n": {"type": "String", "default": "0"}},
               "program": {"resources": {"r": {"type": "command:local:Command", "properties": {"create": "echo ${n}"}}},
                           "outputs": {"out": "${r.stdout}"}}}),
    )
    .await;
    for i in 0..STACKS {
        let passphrase = json!({"type": "Literal", "literal": {"value": pko_testbed::PulumiEnv::PASSPHRASE}});
        create(
            &ns.api::<Stack>(),
            json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": format!("s{i}")},
                   "spec": {"stack": format!("s{i}"), "programRef": {"name": "p"}, "backend": env.backend_url(),
                            "config": {"n": "0"}, "envRefs": {"PULUMI_CONFIG_PASSPHRASE": passphrase}}}),
        )
        .await;
    }
    let stacks = ns.api::<Stack>();
    let all_at_generation = || async {
        let items = stacks.list(&Default::default()).await.unwrap().items;
        items.iter().all(ready_at_generation).then_some(items)
    };
    pko_testbed::eventually("every Stack Ready", 180, || async { all_at_generation().await.is_some() }).await;
    let owned_by =
        |op: &InProcessOperator, name: &str| op.running.as_ref().is_some_and(|r| r.ctx.ownership.owns(ns.name(), name));
    let moved: Vec<String> = (0..STACKS).map(|i| format!("s{i}")).filter(|s| owned_by(&r0, s)).collect();
    assert!(!moved.is_empty(), "r0 holds some of the {STACKS} Stacks");

    // the new holder's watches of the Workspaces it gains trail the API server from here on
    lag.on();
    r0.stop().await;
    pko_testbed::eventually("r1 holds every Stack", 60, || async {
        (0..STACKS).all(|i| owned_by(&r1, &format!("s{i}")))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for i in 0..STACKS {
        let patch = kube::api::Patch::Merge(json!({"spec": {"config": {"n": "1"}}}));
        stacks.patch(&format!("s{i}"), &kube::api::PatchParams::default(), &patch).await.unwrap();
    }
    let converged = tokio::time::timeout(Duration::from_secs(180), async {
        loop {
            if let Some(items) = all_at_generation().await {
                return items;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    let Ok(items) = converged else {
        dump_stacks_and_updates(&ns).await;
        panic!("every Stack Ready at its new generation: not within 180 s");
    };
    let wrong: Vec<String> = items
        .iter()
        .filter(|s| out(s) != Some(json!("1")))
        .map(|s| {
            format!(
                "{} (moved: {}) Ready at generation {:?} with out={:?}",
                s.name_any(),
                moved.contains(&s.name_any()),
                s.metadata.generation,
                out(s)
            )
        })
        .collect();
    if !wrong.is_empty() {
        dump_stacks_and_updates(&ns).await;
    }
    assert!(wrong.is_empty(), "Ready at the new generation with the previous configuration deployed: {wrong:?}");
    // read at the generation each Update names, not refused after the fact: none failed
    let failed: Vec<String> = ns
        .api::<pko_api::Update>()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|u| condition(u, "Failed").is_none_or(|c| c.0 != "False"))
        .map(|u| {
            format!(
                "{}: {:?} {:?}",
                u.name_any(),
                condition(u, "Failed"),
                u.status.as_ref().and_then(|s| s.message.clone())
            )
        })
        .collect();
    assert!(failed.is_empty(), "every Update succeeded the first time: {failed:?}");
    let ran = |u: &pko_api::Update| u.status.as_ref().and_then(|s| s.run_digest.clone());
    for u in ns.api::<pko_api::Update>().list(&Default::default()).await.unwrap() {
        assert!(
            u.spec.run_digest.is_some() && ran(&u) == u.spec.run_digest,
            "{} ran what it names: {:?} {:?}",
            u.name_any(),
            u.spec.run_digest,
            ran(&u)
        );
    }
    drop(r1);
}
