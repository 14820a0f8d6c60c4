//! A real program in a workspace pod on the bed's node (issue "Real programs, as PKO users write
//! them"): the operator installed with Helm, a Program (Pulumi YAML) of a ConfigMap, a Deployment and a
//! Service run by the real Kubernetes provider from the workspace image (an ambient plugin there), with
//! the in-cluster config a PKO user gets from the workspace's service account — no kubeconfig, no
//! token of ours. The provider waits for the Deployment's pod (no `skipAwait`), which starts on the node
//! from a locally built image (the bed's sandbox image, tagged `nginx:1.27-alpine`; it runs the pause
//! program). Prints the workspace container's peak memory during the operations (cgroup v1
//! `memory.max_usage_in_bytes`: agent, `pulumi`, language host and provider together).

mod common;

use std::time::Instant;

use common::cluster::{helm, kubectl, node_test, operator_logs, stack_spec, wait_for};
use common::{create, ready};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{Api, DeleteParams, ListParams};
use pko_api::{Program, Stack};
use pko_testbed::{repo_root, testbed};
use serde_json::json;

const IMAGE: &str = "docker.io/library/nginx:1.27-alpine";

fn program() -> serde_json::Value {
    json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "web"}, "program": {
        "configuration": {"ns": {"type": "String"}, "greeting": {"type": "String"}},
        "resources": {
            "config": {"type": "kubernetes:core/v1:ConfigMap", "properties": {"metadata": {"name": "web-config", "namespace": "${ns}"}, "data": {"greeting": "${greeting}"}}},
            "app": {"type": "kubernetes:apps/v1:Deployment", "properties": {
                "metadata": {"name": "web", "namespace": "${ns}"},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                         "template": {"metadata": {"labels": {"app": "web"}},
                                      "spec": {"containers": [{"name": "web", "image": "nginx:1.27-alpine", "envFrom": [{"configMapRef": {"name": "${config.metadata.name}"}}]}]}}}}},
            "svc": {"type": "kubernetes:core/v1:Service", "properties": {
                "metadata": {"name": "web", "namespace": "${ns}"}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}}}
        },
        "outputs": {"deployment": "${app.metadata.name}", "clusterIP": "${svc.spec.clusterIP}"}
    }})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_of_kubernetes_resources_deploys_from_a_workspace_pod_with_its_service_account() {
    let bed = testbed();
    let node = bed.node();
    node.tag_image("localhost/pause:local", IMAGE);
    let bin_dir = common::agent_bin().parent().unwrap().to_path_buf();
    let tag = bed.images(&bin_dir);
    let client = bed.client().await.unwrap();
    pko_testbed::install_crds(&client, pko_api::crds()).await.unwrap();
    let t = node_test(&client, "real-pod", "pko").await;
    let (ns, op_ns, release, state_dir) = (&t.ns, &t.op_ns, &t.release, &t.state_dir);
    let chart = repo_root().join("deploy/helm/pko").display().to_string();
    let watch = format!("namespace.watch={{{}}}", ns.name());
    let (ok, _, err) = helm(&["install", release, &chart, "--namespace", op_ns, "--wait", "--timeout", "180s", "--set", &watch, "--set", "fullnameOverride=pko-operator"]);
    assert!(ok, "helm install: {err}\n{}", operator_logs(op_ns));
    // the workspace's service account: PKO's connection check, and `edit` in its namespace for the program
    kubectl(&["create", "clusterrolebinding", &format!("{release}-ws-auth"), "--clusterrole=system:auth-delegator", &format!("--serviceaccount={}:default", ns.name())]);
    kubectl(&["create", "rolebinding", "deployer", "-n", ns.name(), "--clusterrole=edit", &format!("--serviceaccount={}:default", ns.name())]);
    common::passphrase_secret(ns).await;
    create(&ns.api::<Program>(), program()).await;

    let stacks = ns.api::<Stack>();
    let started = Instant::now();
    let mut stack = stack_spec("web", tag, state_dir, json!({"programRef": {"name": "web"}, "config": {"ns": ns.name(), "greeting": "hello"}, "destroyOnFinalize": true}));
    stack["spec"]["workspaceTemplate"]["spec"]["resources"] = json!({"limits": {"memory": "2Gi"}});
    create(&stacks, stack).await;
    wait_for("the Stack Ready (cold workspace pod, the provider waits for the Deployment)", 300, ns.name(), op_ns, || async { stacks.get("web").await.is_ok_and(|s| ready(&s)) }).await;
    eprintln!("real program in a workspace pod: apply → Ready {:.1} s (cold pod)", started.elapsed().as_secs_f64());

    let d = ns.api::<Deployment>().get("web").await.unwrap();
    assert_eq!(d.status.and_then(|s| s.ready_replicas), Some(1), "the provider waited for the Deployment's pod");
    let app_pods = ns.api::<Pod>().list(&ListParams::default().labels("app=web")).await.unwrap().items;
    let app_pod = app_pods.first().expect("the Deployment's pod");
    assert_eq!(app_pod.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(node.name.as_str()), "the pod runs on the bed's node");
    let image = app_pod.status.as_ref().and_then(|s| s.container_statuses.as_ref()).and_then(|c| c.first()).map(|c| c.image.clone());
    assert_eq!(image.as_deref(), Some(IMAGE), "from the locally built image");
    let ip = ns.api::<Service>().get("web").await.unwrap().spec.and_then(|s| s.cluster_ip);
    let outputs = stacks.get("web").await.unwrap().status.and_then(|s| s.outputs).unwrap();
    assert_eq!((outputs.get("deployment"), outputs.get("clusterIP")), (Some(&json!("web")), ip.map(|ip| json!(ip)).as_ref()));
    // applied by the provider (its field manager) from the pod, whose only credentials are the
    // workspace service account's (the RoleBinding above is what lets it write)
    let cm = ns.api::<ConfigMap>().get("web-config").await.unwrap();
    let managers: Vec<String> = cm.metadata.managed_fields.unwrap_or_default().into_iter().filter_map(|m| m.manager).collect();
    assert!(managers.iter().any(|m| m.starts_with("pulumi-kubernetes")), "applied by the provider: {managers:?}");

    let peak = kubectl(&["exec", "-n", ns.name(), "web-workspace-0", "-c", "pulumi", "--", "cat", "/sys/fs/cgroup/memory/memory.max_usage_in_bytes"]);
    let peak: u64 = peak.trim().parse().unwrap();
    eprintln!("workspace container peak memory during up (agent, pulumi, YAML host, kubernetes provider): {} MiB", peak >> 20);
    assert!(peak < 2 << 30, "within the 2 GiB limit");

    // destroyOnFinalize from the pod
    stacks.delete("web", &DeleteParams::background()).await.unwrap();
    wait_for("the Stack finalized (destroy in the workspace pod)", 180, ns.name(), op_ns, || async { stacks.get_opt("web").await.unwrap().is_none() }).await;
    assert!(ns.api::<Deployment>().get_opt("web").await.unwrap().is_none(), "the Deployment was destroyed");
    assert!(ns.api::<ConfigMap>().get_opt("web-config").await.unwrap().is_none(), "the ConfigMap was destroyed");
}
