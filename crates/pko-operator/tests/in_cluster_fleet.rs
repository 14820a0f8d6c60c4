//! The fleet as users install it, on the bed's real node: `helm install` with `replicaCount=3` and a
//! Redis URL makes three operator pods that split the shards between them through Leases; Stacks
//! converge with their workspaces in pods. The pod holding a Stack's shard is deleted with `--force
//! --grace-period=0` (the kubelet gives it 2 s: it releases its Leases), another replica takes the shard
//! over, and the Stack's next change runs exactly once. Then the operator container holding another
//! Stack's shard is SIGKILLed through containerd (a crash: nothing released, its Leases lapse; the
//! kubelet restarts it), and that Stack's next change also runs exactly once. Redis is a real
//! redis-server on the node's address (pods reach it there). The workspaces run on one pool of pods
//! (`pools.enabled`) that the three replicas share: each lends its pods, the holder of the pool's
//! shard scales it.

mod common;

use std::collections::BTreeSet;

use common::cluster::{helm, kubectl, node_test, stack_spec, wait_for};
use common::{KillOnDrop, create, ready, shard_holders};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use pko_api::{Stack, Update};
use pko_testbed::{repo_root, testbed};
use serde_json::json;

fn said(s: &Stack) -> Option<String> {
    s.status.as_ref()?.outputs.as_ref()?.get("said")?.as_str().map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_operator_pods_split_the_stacks_and_survive_a_killed_one() {
    let bed = testbed();
    let node = bed.node();
    let tag = bed.images(common::agent_bin().parent().unwrap());
    let client = bed.client().await.unwrap();
    pko_testbed::install_crds(&client, pko_api::crds()).await.unwrap();
    let t = node_test(&client, "in-cluster-fleet", "pkof").await;
    let (ns, op_ns, release, env, state_dir) = (&t.ns, &t.op_ns, &t.release, &t.env, &t.state_dir);
    // the work queue: a redis-server of its own on the node's address
    let port = std::net::TcpListener::bind((node.ip.as_str(), 0)).unwrap().local_addr().unwrap().port();
    let _redis = KillOnDrop(
        std::process::Command::new("redis-server")
            .args([
                "--bind",
                &node.ip,
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ])
            .current_dir(env.dir())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (make testbed installs it)"),
    );

    let chart = repo_root().join("deploy/helm/pko").display().to_string();
    let (watch, redis) =
        (format!("namespace.watch={{{}}}", ns.name()), format!("redis.url=redis://{}:{port}", node.ip));
    let sets = [
        "--set",
        &watch,
        // the logs APIService is cluster-wide: in_cluster.rs installs and checks it
        "--set",
        "logsApi.enabled=false",
        "--set",
        "fullnameOverride=pko-operator",
        "--set",
        "replicaCount=3",
        "--set",
        &redis,
        "--set",
        "fleet.shards=64",
        "--set",
        "fleet.leaseDurationSeconds=6",
        "--set",
        "fleet.renewIntervalSeconds=2",
        "--set",
        "fleet.renewDeadlineSeconds=4",
        "--set",
        "terminationGracePeriodSeconds=30",
        "--set",
        "pools.enabled=true",
        "--set",
        "pools.maxAgents=2",
    ];
    let mut args =
        vec!["install", release.as_str(), chart.as_str(), "--namespace", op_ns.as_str(), "--wait", "--timeout", "180s"];
    args.extend(sets);
    let (ok, _, err) = helm(&args);
    assert!(ok, "helm install: {err}");
    let op_pods: Api<Pod> = Api::namespaced(client.clone(), op_ns);
    let running = || async {
        op_pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=pko-operator"))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| p.name_any())
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(running().await.len(), 3);
    // the three replicas hold every shard between them
    let leases: Api<Lease> = Api::namespaced(client.clone(), op_ns);
    wait_for("the 64 shards held by the three pods", 120, ns.name(), op_ns, || async {
        let holders = shard_holders(&leases, "pko").await;
        holders.len() == 64 && holders.values().cloned().collect::<BTreeSet<_>>() == running().await
    })
    .await;

    kubectl(&[
        "create",
        "clusterrolebinding",
        &format!("{release}-ws-auth"),
        "--clusterrole=system:auth-delegator",
        &format!("--serviceaccount={}:default", ns.name()),
    ]);
    common::passphrase_secret(ns).await;
    create(
        &ns.api::<pko_api::Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "prog"}, "program": {
            "configuration": {"greeting": {"type": "String"}},
            "resources": {"hello": {"type": "command:local:Command", "properties": {"create": "echo ${greeting}"}}},
            "outputs": {"said": "${hello.stdout}"}
        }}),
    )
    .await;
    let stacks = ns.api::<Stack>();
    for name in ["alpha", "beta", "gamma"] {
        create(
            &stacks,
            stack_spec(
                name,
                tag,
                state_dir,
                json!({"programRef": {"name": "prog"}, "config": {"greeting": format!("hello {name}")}}),
            ),
        )
        .await;
    }
    for name in ["alpha", "beta", "gamma"] {
        wait_for(&format!("Stack {name} Ready"), 240, ns.name(), op_ns, || async {
            stacks.get(name).await.is_ok_and(|s| ready(&s))
        })
        .await;
    }

    // one pool of pods for the three Workspaces, lent by the three replicas
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(client.clone(), ns.name());
    let names: Vec<String> =
        sets.list(&ListParams::default()).await.unwrap().items.iter().map(ResourceExt::name_any).collect();
    assert!(
        names.len() == 1 && names[0].starts_with("pko-pool-"),
        "one pool StatefulSet, none per Workspace: {names:?}"
    );

    // kill the pod holding alpha's shard, with no grace: its Leases lapse and another replica takes over
    let alpha = stacks.get("alpha").await.unwrap();
    let shard: u32 = alpha.labels().get("pulumi.com/shard").expect("a Stack carries its shard").parse().unwrap();
    let victim = shard_holders(&leases, "pko").await.get(&shard).cloned().expect("alpha's shard is held");
    let t = std::time::Instant::now();
    kubectl(&["delete", "pod", "-n", op_ns, &victim, "--force", "--grace-period=0"]);
    wait_for("alpha's shard held by another replica", 120, ns.name(), op_ns, || async {
        shard_holders(&leases, "pko").await.get(&shard).is_some_and(|h| *h != victim)
    })
    .await;
    eprintln!(
        "operator pod {victim} killed: shard {shard} taken over after {:.1} s (membership Lease 6 s)",
        t.elapsed().as_secs_f64()
    );

    let updates = ns.api::<Update>();
    let of_alpha = || async {
        updates
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|u| u.metadata.owner_references.iter().flatten().any(|o| o.name == "alpha"))
            .count()
    };
    let before = of_alpha().await;
    stacks
        .patch(
            "alpha",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"config": {"greeting": "after the kill"}}})),
        )
        .await
        .unwrap();
    wait_for("alpha's change converges on the new holder", 180, ns.name(), op_ns, || async {
        stacks.get("alpha").await.is_ok_and(|s| ready(&s) && said(&s).as_deref() == Some("after the kill"))
    })
    .await;
    assert_eq!(of_alpha().await, before + 1, "the change ran exactly once");
    for name in ["beta", "gamma"] {
        assert!(ready(&stacks.get(name).await.unwrap()), "{name} stays Ready");
    }

    // a crash: SIGKILL of the operator container holding beta's shard (containerd's task, as the OOM
    // killer would); the kubelet restarts it under the same pod name
    let beta = stacks.get("beta").await.unwrap();
    let shard: u32 = beta.labels().get("pulumi.com/shard").expect("a Stack carries its shard").parse().unwrap();
    let holder = shard_holders(&leases, "pko").await.get(&shard).cloned().expect("beta's shard is held");
    let pod = op_pods.get(&holder).await.unwrap();
    let cid = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs[0].container_id.clone())
        .expect("a running container");
    let cid = cid.trim_start_matches("containerd://").to_string();
    let restarts = |p: &Pod| {
        p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).map(|cs| cs[0].restart_count).unwrap_or(0)
    };
    let before_restarts = restarts(&pod);
    let out = std::process::Command::new("ctr")
        .args(["-a", bed.var("PKO_TESTBED_CONTAINERD"), "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", &cid])
        .output()
        .unwrap();
    assert!(out.status.success(), "ctr tasks kill: {}", String::from_utf8_lossy(&out.stderr));
    let t = std::time::Instant::now();
    wait_for("the killed operator container restarted by the kubelet", 120, ns.name(), op_ns, || async {
        op_pods.get(&holder).await.is_ok_and(|p| restarts(&p) > before_restarts)
    })
    .await;
    let of_beta = || async {
        updates
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|u| u.metadata.owner_references.iter().flatten().any(|o| o.name == "beta"))
            .count()
    };
    let before = of_beta().await;
    stacks
        .patch(
            "beta",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"config": {"greeting": "after the crash"}}})),
        )
        .await
        .unwrap();
    wait_for("beta's change converges after the crash", 180, ns.name(), op_ns, || async {
        stacks.get("beta").await.is_ok_and(|s| ready(&s) && said(&s).as_deref() == Some("after the crash"))
    })
    .await;
    assert_eq!(of_beta().await, before + 1, "the change ran exactly once");
    eprintln!(
        "operator container of {holder} SIGKILLed: beta's change Ready {:.1} s after the kill (shard {shard} now held \
            by {:?})",
        t.elapsed().as_secs_f64(),
        shard_holders(&leases, "pko").await.get(&shard)
    );
    wait_for("every shard held again", 60, ns.name(), op_ns, || async {
        shard_holders(&leases, "pko").await.len() == 64
    })
    .await;

    for name in ["alpha", "beta", "gamma"] {
        stacks.delete(name, &DeleteParams::default()).await.unwrap();
    }
    wait_for("the Stacks gone", 180, ns.name(), op_ns, || async {
        stacks.list(&ListParams::default()).await.unwrap().items.is_empty()
    })
    .await;
}
