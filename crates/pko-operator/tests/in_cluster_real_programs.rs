//! A real program in a workspace pod on the bed's node (issue "Real programs, as PKO users write
//! them"): the operator installed with Helm, a Program (Pulumi YAML) of a ConfigMap, a Deployment and a
//! Service run by the real Kubernetes provider from the workspace image (an ambient plugin there), with
//! the in-cluster config a PKO user gets from the workspace's service account — no kubeconfig, no
//! token of ours. The provider waits for the Deployment's pod (no `skipAwait`), which starts on the node
//! from a locally built image (the bed's sandbox image, tagged `nginx:1.27-alpine`; it runs the pause
//! program). Prints the workspace container's peak memory usage during the operations (cgroup v1
//! `memory.max_usage_in_bytes`: agent, `pulumi`, language host and provider together, with the page
//! cache of what they wrote). A Go program from git builds and deploys in a workspace pod too.

mod common;

use std::time::Instant;

use common::cluster::{helm, kubectl, node_test, operator_logs, stack_spec, wait_for};
use common::{create, ready};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{DeleteParams, ListParams};
use pko_api::{Program, Stack};
use pko_testbed::{repo_root, testbed};
use serde_json::json;

const IMAGE: &str = "docker.io/library/nginx:1.27-alpine";

fn program() -> serde_json::Value {
    json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "web"}, "program": {
        "configuration": {"ns": {"type": "String"}, "greeting": {"type": "String"}},
        "resources": {
            "config": {"type": "kubernetes:core/v1:ConfigMap", "properties": {"metadata": {"name": "web-config",
                "namespace": "${ns}"}, "data": {"greeting": "${greeting}"}}},
            "app": {"type": "kubernetes:apps/v1:Deployment", "properties": {
                "metadata": {"name": "web", "namespace": "${ns}"},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                         "template": {"metadata": {"labels": {"app": "web"}},
                                      "spec": {"containers": [{"name": "web", "image": "nginx:1.27-alpine",
                                          "envFrom": [{"configMapRef": {"name": "${config.metadata.name}"}}]}]}}}}},
            "svc": {"type": "kubernetes:core/v1:Service", "properties": {
                "metadata": {"name": "web", "namespace": "${ns}"}, "spec": {"selector": {"app": "web"},
                    "ports": [{"port": 80}]}}}
        },
        "outputs": {"deployment": "${app.metadata.name}", "clusterIP": "${svc.spec.clusterIP}"}
    }})
}

/// The operator installed with Helm on the node, watching a fresh namespace whose `default` service
/// account (the workspaces') passes PKO's connection check and may `edit` the namespace, and the
/// passphrase Secret. Returns the test's setup and the images' tag.
async fn operator_on_the_node(prefix: &str) -> (common::cluster::NodeTest, &'static str) {
    let bed = testbed();
    bed.node().tag_image("localhost/pause:local", IMAGE);
    let bin_dir = common::agent_bin().parent().unwrap().to_path_buf();
    let tag = bed.images(&bin_dir);
    let client = bed.client().await.unwrap();
    pko_testbed::install_crds(&client, pko_api::crds()).await.unwrap();
    let t = node_test(&client, prefix, "pko").await;
    let (ns, op_ns, release) = (&t.ns, &t.op_ns, &t.release);
    let chart = repo_root().join("deploy/helm/pko").display().to_string();
    let watch = format!("namespace.watch={{{}}}", ns.name());
    let (ok, _, err) = helm(&[
        "install",
        release,
        &chart,
        "--namespace",
        op_ns,
        "--wait",
        "--timeout",
        "180s",
        "--set",
        &watch,
        // the logs APIService is cluster-wide: in_cluster.rs installs and checks it
        "--set",
        "logsApi.enabled=false",
        "--set",
        "fullnameOverride=pko-operator",
    ]);
    assert!(ok, "helm install: {err}\n{}", operator_logs(op_ns));
    kubectl(&[
        "create",
        "clusterrolebinding",
        &format!("{release}-ws-auth"),
        "--clusterrole=system:auth-delegator",
        &format!("--serviceaccount={}:default", ns.name()),
    ]);
    kubectl(&[
        "create",
        "rolebinding",
        "deployer",
        "-n",
        ns.name(),
        "--clusterrole=edit",
        &format!("--serviceaccount={}:default", ns.name()),
    ]);
    common::passphrase_secret(ns).await;
    (t, tag)
}

/// The peak memory usage of the `pulumi` container of workspace pod `pod` (cgroup v1
/// `memory.max_usage_in_bytes`: the page cache of the files it wrote included), in bytes.
fn workspace_peak_memory(ns: &str, pod: &str) -> u64 {
    kubectl(&["exec", "-n", ns, pod, "-c", "pulumi", "--", "cat", "/sys/fs/cgroup/memory/memory.max_usage_in_bytes"])
        .trim()
        .parse()
        .unwrap()
}

/// One operator release for both programs: the chart's ClusterRoles are named by its
/// `fullnameOverride`, so two releases of this binary at once would collide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_programs_deploy_from_workspace_pods() {
    let (t, tag) = operator_on_the_node("real-pod").await;
    a_program_of_kubernetes_resources_deploys_from_a_workspace_pod_with_its_service_account(&t, tag).await;
    a_go_program_builds_and_deploys_in_a_workspace_pod(&t, tag).await;
}

async fn a_program_of_kubernetes_resources_deploys_from_a_workspace_pod_with_its_service_account(
    t: &common::cluster::NodeTest,
    tag: &str,
) {
    let node = testbed().node();
    let (ns, op_ns, state_dir) = (&t.ns, &t.op_ns, &t.state_dir);
    create(&ns.api::<Program>(), program()).await;

    let stacks = ns.api::<Stack>();
    let started = Instant::now();
    let mut stack = stack_spec(
        "web",
        tag,
        state_dir,
        json!({"programRef": {"name": "web"}, "config": {"ns": ns.name(), "greeting": "hello"},
            "destroyOnFinalize": true}),
    );
    stack["spec"]["workspaceTemplate"]["spec"]["resources"] = json!({"limits": {"memory": "2Gi"}});
    create(&stacks, stack).await;
    wait_for(
        "the Stack Ready (cold workspace pod, the provider waits for the Deployment)",
        300,
        ns.name(),
        op_ns,
        || async { stacks.get("web").await.is_ok_and(|s| ready(&s)) },
    )
    .await;
    eprintln!("real program in a workspace pod: apply → Ready {:.1} s (cold pod)", started.elapsed().as_secs_f64());

    let d = ns.api::<Deployment>().get("web").await.unwrap();
    assert_eq!(d.status.and_then(|s| s.ready_replicas), Some(1), "the provider waited for the Deployment's pod");
    let app_pods = ns.api::<Pod>().list(&ListParams::default().labels("app=web")).await.unwrap().items;
    let app_pod = app_pods.first().expect("the Deployment's pod");
    assert_eq!(
        app_pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node.name.as_str()),
        "the pod runs on the bed's node"
    );
    let image = app_pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| c.image.clone());
    assert_eq!(image.as_deref(), Some(IMAGE), "from the locally built image");
    let ip = ns.api::<Service>().get("web").await.unwrap().spec.and_then(|s| s.cluster_ip);
    let outputs = stacks.get("web").await.unwrap().status.and_then(|s| s.outputs).unwrap();
    assert_eq!(
        (outputs.get("deployment"), outputs.get("clusterIP")),
        (Some(&json!("web")), ip.map(|ip| json!(ip)).as_ref())
    );
    // applied by the provider (its field manager) from the pod, whose only credentials are the
    // workspace service account's (the RoleBinding above is what lets it write)
    let cm = ns.api::<ConfigMap>().get("web-config").await.unwrap();
    let managers: Vec<String> =
        cm.metadata.managed_fields.unwrap_or_default().into_iter().filter_map(|m| m.manager).collect();
    assert!(managers.iter().any(|m| m.starts_with("pulumi-kubernetes")), "applied by the provider: {managers:?}");

    let peak = workspace_peak_memory(ns.name(), "web-workspace-0");
    eprintln!(
        "workspace container peak memory usage during up (agent, pulumi, YAML host, kubernetes provider; page cache \
            included): {} MiB",
        peak >> 20
    );
    assert!(peak < 2 << 30, "within the 2 GiB limit");

    // destroyOnFinalize from the pod
    stacks.delete("web", &DeleteParams::background()).await.unwrap();
    wait_for("the Stack finalized (destroy in the workspace pod)", 180, ns.name(), op_ns, || async {
        stacks.get_opt("web").await.unwrap().is_none()
    })
    .await;
    assert!(ns.api::<Deployment>().get_opt("web").await.unwrap().is_none(), "the Deployment was destroyed");
    assert!(ns.api::<ConfigMap>().get_opt("web-config").await.unwrap().is_none(), "the ConfigMap was destroyed");
}

/// The bed's Go program (`scripts/testbed/programs/go-kubernetes`) from a git repository, built in a
/// workspace pod by the image's Go language host and Go toolchain, deployed with the real provider. The
/// pod reaches nothing outside the machine: its modules come from the bed's Go module cache, mounted
/// read-only (`GOPROXY=off`), the plugin version its SDK names from a plugin server on the node's
/// address. Prints the workspace container's peak memory (the Go build of the kubernetes SDK's packages
/// in a cold build cache: PKO's anchor, #1308, is 1.3–2.4 GiB per workspace pod).
async fn a_go_program_builds_and_deploys_in_a_workspace_pod(t: &common::cluster::NodeTest, tag: &str) {
    let node = testbed().node();
    let (ns, op_ns, state_dir) = (&t.ns, &t.op_ns, &t.state_dir);
    let root = t.env.dir().join("git-root");
    std::fs::create_dir_all(&root).unwrap();
    let program = repo_root().join("scripts/testbed/programs/go-kubernetes");
    let files =
        ["Pulumi.yaml", "go.mod", "go.sum", "main.go"].map(|f| (f, std::fs::read_to_string(program.join(f)).unwrap()));
    let files: Vec<(&str, &str)> = files.iter().map(|(f, c)| (*f, c.as_str())).collect();
    pko_testbed::git::bare_repo_with(&root, "goapp.git", &files);
    let git = pko_testbed::git::GitHttpServer::start(&root, &format!("{}:0", node.ip), None).await.unwrap();
    let plugins = pko_testbed::plugins::PluginServer::kubernetes_on(&node.ip, &["4.24.0"], Default::default()).await;
    let [_, (_, mod_cache), _] = pko_testbed::offline_go_env();

    let stacks = ns.api::<Stack>();
    let mut stack = stack_spec(
        "goapp",
        tag,
        state_dir,
        json!({"projectRepo": git.url("goapp.git"), "branch": "main", "config": {"ns": ns.name(), "greeting": "hej"},
            "destroyOnFinalize": true}),
    );
    let ws = &mut stack["spec"]["workspaceTemplate"]["spec"];
    ws["resources"] = json!({"limits": {"memory": "3Gi"}});
    let env = ws["env"].as_array_mut().unwrap();
    env.extend([
        json!({"name": "GOPROXY", "value": "off"}),
        json!({"name": "GOMODCACHE", "value": "/go-mod"}),
        json!({"name": "PULUMI_PLUGIN_DOWNLOAD_URL_OVERRIDES", "value": plugins.overrides()}),
    ]);
    let pod = &mut ws["podTemplate"]["spec"];
    pod["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "go-mod", "hostPath": {"path": mod_cache, "type": "Directory"}}));
    pod["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "go-mod", "mountPath": "/go-mod", "readOnly": true}));
    let started = Instant::now();
    create(&stacks, stack).await;
    wait_for("the Go Stack Ready (cold workspace pod, cold Go build cache)", 900, ns.name(), op_ns, || async {
        stacks.get("goapp").await.is_ok_and(|s| ready(&s))
    })
    .await;
    eprintln!(
        "Go program in a workspace pod: apply → Ready {:.1} s (cold pod, cold Go build cache)",
        started.elapsed().as_secs_f64()
    );
    let outputs = stacks.get("goapp").await.unwrap().status.and_then(|s| s.outputs).unwrap();
    assert_eq!(
        (outputs.get("configMap"), outputs.get("deployment")),
        (Some(&json!("go-config")), Some(&json!("go-app")))
    );
    let cm = ns.api::<ConfigMap>().get("go-config").await.unwrap();
    assert_eq!(cm.data.unwrap().get("greeting").map(String::as_str), Some("hej"));
    let peak = workspace_peak_memory(ns.name(), "goapp-workspace-0");
    // the Go build cache it writes fills the page cache up to the limit: usage, not the build's RSS
    // (1.3 GiB for the agent's tree on the host, benches/real_kubernetes.rs)
    eprintln!(
        "workspace container peak memory usage, Go program (go build of the SDK, page cache included; limit 3 GiB): {} \
            MiB",
        peak >> 20
    );

    stacks.delete("goapp", &DeleteParams::background()).await.unwrap();
    wait_for("the Go Stack finalized", 300, ns.name(), op_ns, || async {
        stacks.get_opt("goapp").await.unwrap().is_none()
    })
    .await;
    assert!(ns.api::<ConfigMap>().get_opt("go-config").await.unwrap().is_none(), "the ConfigMap was destroyed");
}
