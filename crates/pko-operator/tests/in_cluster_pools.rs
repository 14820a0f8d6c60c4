//! Pools of workspace pods on the bed's real node (`helm install … --set pools.enabled=true`): the
//! Workspaces of three Stacks that differ only in their stack, config and program share one class, so
//! their operations run on one StatefulSet of workspace pods the operator scales — never above
//! `pools.maxAgents`, down to zero pods once they have been idle for `pools.idleTimeoutSeconds`, and up
//! again from zero for the next change. A pool pod deleted during a slow `up` (SIGTERM → CTRL-C) hands
//! the same Update to the pod that replaces it, which completes it with no Pulumi lock left.

mod common;

use std::collections::BTreeSet;
use std::time::Instant;

use common::cluster::{helm, kubectl, node_test, operator_logs, stack_spec, updates_of, wait_for};
use common::{create, ready};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use pko_api::{Stack, Update, Workspace};
use pko_testbed::{repo_root, testbed};
use serde_json::json;

fn said(s: &Stack) -> Option<String> {
    s.status.as_ref()?.outputs.as_ref()?.get("said")?.as_str().map(str::to_string)
}

/// The pool StatefulSets of namespace `ns` (label `auto.pulumi.com/pool`).
async fn pools(sets: &Api<StatefulSet>) -> Vec<StatefulSet> {
    sets.list(&ListParams::default().labels("auto.pulumi.com/pool")).await.unwrap().items
}

/// The live pods of pool StatefulSet `sts`.
async fn pool_pods(pods: &Api<Pod>, sts: &str) -> Vec<Pod> {
    let pool = sts.trim_end_matches("-workspace");
    let lp = ListParams::default().labels(&format!("auto.pulumi.com/workspace-name={pool}"));
    pods.list(&lp).await.unwrap().items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect()
}

/// Stacks `isoa` then `isob` of the pool's class run [`pko_testbed::probe::ISOLATION_PROBE`] one after
/// the other on one pool pod (the lowest idle one): neither finds anything of the other's operation,
/// and nothing of either still runs afterwards.
async fn isolation_turns(ns: &pko_testbed::TestNamespace, op_ns: &str, tag: &str, state_dir: &str) {
    create(
        &ns.api::<pko_api::Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "probe"}, "program": {
            "resources": {
                "probe": {"type": "command:local:Command", "properties": {"dir": "${pulumi.cwd}",
                    "environment": {"STACK": "${pulumi.stack}"}, "create": pko_testbed::probe::ISOLATION_PROBE}},
                "host": {"type": "command:local:Command", "properties": {"create": "hostname"}}},
            "outputs": {"report": "${probe.stdout}", "host": "${host.stdout}"}
        }}),
    )
    .await;
    let stacks = ns.api::<Stack>();
    let mut hosts = BTreeSet::new();
    for name in ["isoa", "isob"] {
        // (the same env for both: a pod pool's class includes the Workspace's env, which shapes the pod)
        create(&stacks, stack_spec(name, tag, state_dir, json!({"programRef": {"name": "probe"}}))).await;
        wait_for(&format!("{name} Ready on the pool"), 180, ns.name(), op_ns, || async {
            stacks.get(name).await.is_ok_and(|s| ready(&s))
        })
        .await;
        let outputs = stacks.get(name).await.unwrap().status.and_then(|s| s.outputs).unwrap_or_default();
        assert_eq!(
            outputs.get("report"),
            Some(&json!("found:")),
            "{name} found what the operation before it left on the pod"
        );
        hosts.insert(outputs.get("host").map(|h| h.to_string()));
        assert!(
            pko_testbed::probe::probe_daemons().is_empty(),
            "nothing of {name}'s operation still runs: {:?}",
            pko_testbed::probe::probe_daemons()
        );
    }
    assert_eq!(hosts.len(), 1, "both turns ran on one pool pod: {hosts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspaces_of_one_class_share_a_pool_of_pods_that_scales_to_zero_and_back() {
    let bed = testbed();
    bed.node();
    let tag = bed.images(common::agent_bin().parent().unwrap());
    let client = bed.client().await.unwrap();
    pko_testbed::install_crds(&client, pko_api::crds()).await.unwrap();
    let t = node_test(&client, "in-cluster-pools", "pkop").await;
    let (ns, op_ns, release, state_dir) = (&t.ns, &t.op_ns, &t.release, &t.state_dir);

    let chart = repo_root().join("deploy/helm/pko").display().to_string();
    let watch = format!("namespace.watch={{{}}}", ns.name());
    let mut args =
        vec!["install", release.as_str(), chart.as_str(), "--namespace", op_ns.as_str(), "--wait", "--timeout", "180s"];
    args.extend([
        "--set",
        &watch,
        // the logs APIService is cluster-wide: in_cluster.rs installs and checks it
        "--set",
        "logsApi.enabled=false",
        "--set",
        "fullnameOverride=pko-operator",
        "--set",
        "terminationGracePeriodSeconds=30",
    ]);
    args.extend(["--set", "pools.enabled=true", "--set", "pools.maxAgents=2", "--set", "pools.idleTimeoutSeconds=10"]);
    let (ok, _, err) = helm(&args);
    assert!(ok, "helm install: {err}\n{}", operator_logs(op_ns));

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
            "configuration": {"greeting": {"type": "String"}, "pause": {"type": "String", "default": "0"}},
            "resources": {"hello": {"type": "command:local:Command",
                "properties": {"create": "sleep ${pause}; echo ${greeting} from $(hostname)"}}},
            "outputs": {"said": "${hello.stdout}"}
        }}),
    )
    .await;

    // -- three Stacks of one class: one pool, never more than pools.maxAgents pods --
    let stacks = ns.api::<Stack>();
    let names = ["alpha", "beta", "gamma"];
    let applied = Instant::now();
    for name in names {
        create(
            &stacks,
            stack_spec(
                name,
                tag,
                state_dir,
                json!({"programRef": {"name": "prog"}, "config": {"greeting": format!("hello {name}"), "pause": "3"}}),
            ),
        )
        .await;
    }
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    let most = std::cell::Cell::new(0);
    wait_for("the three Stacks Ready on the pool", 300, ns.name(), op_ns, || {
        let (stacks, sets, pods, most) = (stacks.clone(), sets.clone(), pods.clone(), &most);
        async move {
            for p in pools(&sets).await {
                most.set(most.get().max(pool_pods(&pods, &p.name_any()).await.len()));
            }
            let mut all = true;
            for name in names {
                all &= stacks.get(name).await.is_ok_and(|s| ready(&s));
            }
            all
        }
    })
    .await;
    let most = most.get();
    let converged = applied.elapsed().as_secs_f64();
    let all_ready = Instant::now();
    let found = pools(&sets).await;
    assert_eq!(
        found.len(),
        1,
        "one pool for the class: {:?}",
        found.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );
    let pool = found[0].name_any();
    assert!(pool.starts_with("pko-pool-"), "{pool}");
    assert!(most <= 2, "never more pods than pools.maxAgents: saw {most}");
    let all_sets: BTreeSet<String> =
        sets.list(&ListParams::default()).await.unwrap().items.iter().map(ResourceExt::name_any).collect();
    assert_eq!(all_sets, BTreeSet::from([pool.clone()]), "no StatefulSet per Workspace");
    let workspaces = ns.api::<Workspace>();
    let mut classes = BTreeSet::new();
    for name in names {
        let ws = workspaces.get(name).await.unwrap();
        let st = ws.status.unwrap_or_default();
        assert_eq!(st.address, None, "a pooled Workspace has no agent of its own");
        classes.insert(st.pool.expect("the Workspace reports its pool"));
        let s = said(&stacks.get(name).await.unwrap()).unwrap_or_default();
        assert!(s.starts_with(&format!("hello {name} from {pool}-")), "{name} ran in a pod of the pool: {s:?}");
    }
    assert_eq!(classes.len(), 1, "one class: {classes:?}");
    eprintln!("3 Stacks on a pool of at most 2 pods: Ready {converged:.1} s after apply; at most {most} pods at once");

    // -- idle: scaled to zero pods --
    wait_for("the pool scaled to zero after its idle timeout", 120, ns.name(), op_ns, || async {
        let replicas = sets.get(&pool).await.ok().and_then(|s| s.spec).and_then(|s| s.replicas);
        replicas == Some(0) && pool_pods(&pods, &pool).await.is_empty()
    })
    .await;
    eprintln!(
        "pool at 0 pods {:.1} s after the last Stack was Ready (idle timeout 10 s)",
        all_ready.elapsed().as_secs_f64()
    );

    // -- a change from zero: the pool grows again, the change runs once --
    let updates = ns.api::<Update>();
    let before = updates_of(&updates, "alpha").await.len();
    let t = Instant::now();
    stacks
        .patch(
            "alpha",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"config": {"greeting": "again", "pause": "0"}}})),
        )
        .await
        .unwrap();
    wait_for("alpha's change Ready from a pool of zero pods", 240, ns.name(), op_ns, || async {
        stacks.get("alpha").await.is_ok_and(|s| ready(&s) && said(&s).is_some_and(|v| v.starts_with("again from")))
    })
    .await;
    eprintln!("change → Ready from 0 pods (a pod started): {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(updates_of(&updates, "alpha").await.len(), before + 1, "the change ran exactly once");

    // -- two Stacks of the class taking turns on one pool pod see nothing of each other --
    isolation_turns(ns, op_ns, tag, state_dir).await;

    // -- a pool pod deleted during a slow up: the same Update completes on its replacement --
    let before = updates_of(&updates, "beta").await.len();
    stacks
        .patch(
            "beta",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"config": {"pause": "40", "greeting": "slow"}}})),
        )
        .await
        .unwrap();
    let busy = std::cell::RefCell::new(String::new());
    wait_for("beta's slow up running in a pool pod", 180, ns.name(), op_ns, || {
        let (pods, pool, busy) = (pods.clone(), pool.clone(), &busy);
        async move {
            for p in pool_pods(&pods, &pool).await {
                let out = testbed()
                    .kubectl()
                    .args([
                        "exec",
                        "-n",
                        ns.name(),
                        &p.name_any(),
                        "-c",
                        "pulumi",
                        "--",
                        "sh",
                        "-c",
                        "cat /proc/[0-9]*/cmdline | tr '\\0' ' '",
                    ])
                    .output()
                    .unwrap();
                if String::from_utf8_lossy(&out.stdout).contains("sleep 40") {
                    *busy.borrow_mut() = p.name_any();
                    return true;
                }
            }
            false
        }
    })
    .await;
    let busy = busy.into_inner();
    common::cluster::delete_pod_mid_up(&updates, ns.name(), op_ns, &busy, "beta", before).await;
    wait_for("beta converges after the interruption", 120, ns.name(), op_ns, || async {
        stacks.get("beta").await.is_ok_and(|s| ready(&s) && said(&s).is_some_and(|v| v.starts_with("slow from")))
    })
    .await;
    let locks = common::files_under(&std::path::Path::new(state_dir).join(".pulumi/locks"));
    assert!(locks.is_empty(), "no Pulumi lock left: {locks:?}");
    assert!(operator_logs(op_ns).contains("agent pool grows"), "the operator scaled the pool");
}
