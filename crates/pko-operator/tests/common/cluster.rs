//! The bed's node from a test: Helm, kubectl, Stacks whose workspaces run in pods of the workspace
//! image, waits that show the cluster's state when they fail, and the cleanup of a Helm release.

use std::process::Command;
use std::time::Instant;

use pko_testbed::{PulumiEnv, TestNamespace, testbed};
use serde_json::json;

/// What a test on the node starts from: its namespace `ns`; the operator's namespace `op_ns`
/// (`<ns>-op`, created); the Helm release name `release` (`<release_prefix>-<ns suffix>`), removed with
/// `op_ns` and its ClusterRoleBindings when this is dropped; a Pulumi environment `env` whose
/// directory, like `state_dir` in it (Pulumi's `file://` state, mounted into workspace pods), the
/// workspace image's user (1000) may write.
pub struct NodeTest {
    pub ns: TestNamespace,
    pub op_ns: String,
    pub release: String,
    pub env: PulumiEnv,
    pub state_dir: String,
    _cleanup: Cleanup,
}

/// A [`NodeTest`] for namespace prefix `prefix` and release prefix `release_prefix`.
pub async fn node_test(client: &kube::Client, prefix: &str, release_prefix: &str) -> NodeTest {
    use kube::api::{Api, PostParams};
    let ns = testbed().namespace(prefix).await.unwrap();
    let op_ns = format!("{}-op", ns.name());
    let release = format!("{release_prefix}-{}", &ns.name()[ns.name().len() - 6..]);
    let cleanup = Cleanup { release: release.clone(), op_ns: op_ns.clone() };
    let op: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": op_ns}})).unwrap();
    Api::all(client.clone()).create(&PostParams::default(), &op).await.unwrap();
    let env = testbed().pulumi_env().unwrap();
    let state = env.dir().join("node-state");
    std::fs::create_dir_all(&state).unwrap();
    for d in [env.dir(), state.as_path()] {
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    }
    let state_dir = state.display().to_string();
    NodeTest { ns, op_ns, release, env, state_dir, _cleanup: cleanup }
}

/// `helm` of the bed with private cache/config dirs; (success, stdout, stderr).
pub fn helm(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(testbed().bin_dir().join("helm"))
        .args(args)
        .env("HELM_CACHE_HOME", std::env::temp_dir().join("pko-helm-cache"))
        .env("HELM_CONFIG_HOME", std::env::temp_dir().join("pko-helm-config"))
        .env("HELM_DATA_HOME", std::env::temp_dir().join("pko-helm-data"))
        .env("KUBECONFIG", testbed().kubeconfig())
        .output()
        .expect("the bed's helm (make testbed)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

pub fn kubectl(args: &[&str]) -> String {
    let out = testbed().kubectl().args(args).output().unwrap();
    assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The operator's logs (for a failing assertion's message).
pub fn operator_logs(ns: &str) -> String {
    let out = testbed()
        .kubectl()
        .args(["logs", "-n", ns, "-l", "app.kubernetes.io/name=pko-operator", "--prefix", "--tail", "-1"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// What the cluster shows of `ns` and the operator in `op_ns` (for a failing wait's message).
pub fn diagnostics(ns: &str, op_ns: &str) -> String {
    let run = |args: &[&str]| {
        let out = testbed().kubectl().args(args).output().unwrap();
        format!(
            "$ kubectl {}\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let mut s = String::new();
    s += &run(&["get", "stacks,workspaces,updates,statefulsets,pods,services", "-n", ns, "-o", "wide"]);
    s += &run(&[
        "get",
        "updates",
        "-n",
        ns,
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}: {.status}{\"\\n\"}{end}",
    ]);
    s += &run(&[
        "get",
        "stacks",
        "-n",
        ns,
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}: {.status.conditions}{\"\\n\"}{end}",
    ]);
    s += &run(&["get", "events", "-n", ns, "--sort-by=.lastTimestamp"]);
    s += &run(&[
        "logs",
        "-n",
        ns,
        "-l",
        "auto.pulumi.com/component=workspace",
        "--all-containers",
        "--prefix",
        "--tail",
        "40",
    ]);
    s += &run(&["logs", "-n", op_ns, "-l", "app.kubernetes.io/name=pko-operator", "--prefix", "--tail", "60"]);
    s
}

/// Polls `check` every 250 ms until it holds; panics after `secs` with `what` and the diagnostics.
pub async fn wait_for<F, Fut>(what: &str, secs: u64, ns: &str, op_ns: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + std::time::Duration::from_secs(secs);
    while !check().await {
        if Instant::now() > end {
            panic!("{what}: not within {secs} s\n{}", diagnostics(ns, op_ns));
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// The Updates of Stack `stack` (owned by it, or naming a Pulumi stack that ends with its name), oldest
/// first.
pub async fn updates_of(api: &kube::Api<pko_api::Update>, stack: &str) -> Vec<pko_api::Update> {
    let mut v: Vec<pko_api::Update> = api
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|u| {
            u.spec.stack_name.as_deref().is_some_and(|s| s.ends_with(stack))
                || u.metadata.owner_references.iter().flatten().any(|o| o.name == stack)
        })
        .collect();
    v.sort_by_key(|u| u.metadata.creation_timestamp.clone().map(|t| t.0));
    v
}

/// Deletes workspace pod `pod` of namespace `ns` while the newest Update of Stack `stack` runs in it,
/// and shows the operation handed over (PKO's wound: an interrupted `up` lost): the pod is gone within
/// 30 s (its agent sends CTRL-C to Pulumi on SIGTERM instead of running out the 600 s grace period),
/// and that same Update completes on another pod without failing, with no second Update
/// (`before`: the Stack's Updates before this one). Returns (the Update's name, seconds until the pod
/// was gone).
pub async fn delete_pod_mid_up(
    updates: &kube::Api<pko_api::Update>,
    ns: &str,
    op_ns: &str,
    pod: &str,
    stack: &str,
    before: usize,
) -> (String, f64) {
    use kube::ResourceExt as _;
    let running = updates_of(updates, stack).await.pop().expect("the running Update").name_any();
    let t = Instant::now();
    kubectl(&["delete", "pod", "-n", ns, pod, "--wait=true", "--timeout=90s"]);
    let gone = t.elapsed().as_secs_f64();
    eprintln!("workspace pod {pod} deleted mid-up: SIGTERM, CTRL-C, pod gone in {gone:.1} s (grace period 600 s)");
    assert!(gone < 30.0, "the agent stopped Pulumi on SIGTERM instead of running out the grace period ({gone:.1} s)");
    wait_for("the interrupted Update completed on another pod", 240, ns, op_ns, || async {
        updates.get(&running).await.is_ok_and(|u| super::condition(&u, "Complete").is_some_and(|c| c.0 == "True"))
    })
    .await;
    let u = updates.get(&running).await.unwrap();
    assert!(
        super::condition(&u, "Failed").is_none_or(|c| c.0 != "True"),
        "the interrupted Update completed without failing: {:?}",
        u.status
    );
    assert_eq!(
        updates_of(updates, stack).await.len(),
        before + 1,
        "no second Update: the interrupted one was handed over"
    );
    (running, gone)
}

/// Removes what the test made outside its namespace, also when it fails: the Helm release, the
/// operator's namespace, the ClusterRoleBinding.
pub struct Cleanup {
    pub release: String,
    pub op_ns: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = helm(&["uninstall", &self.release, "--namespace", &self.op_ns, "--ignore-not-found"]);
        let _ = testbed()
            .kubectl()
            .args(["delete", "namespace", &self.op_ns, "--wait=false", "--ignore-not-found"])
            .output();
        for binding in ["ws-auth", "deployer-auth"] {
            let _ = testbed()
                .kubectl()
                .args(["delete", "clusterrolebinding", &format!("{}-{binding}", self.release), "--ignore-not-found"])
                .output();
        }
    }
}

/// A Stack of Program `prog` whose workspace runs in a pod of the workspace image, with Pulumi's
/// `file://` state on the node's `state_dir` (mounted at /state) and the passphrase from Secret `p`.
pub fn stack_spec(name: &str, tag: &str, state_dir: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut spec = json!({
        "stack": name,
        "backend": "file:///state",
        "envRefs": super::passphrase_env_refs(),
        "workspaceTemplate": {"spec": {
            "image": format!("pko-workspace:{tag}"),
            "imagePullPolicy": "IfNotPresent",
            // the bed is offline: the image's plugins only (PKO users' pods download them)
            "env": [{"name": "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION", "value": "true"},
                {"name": "PULUMI_DISABLE_REGISTRY_RESOLVE", "value": "true"}],
            "podTemplate": {"spec": {
                "volumes": [{"name": "state", "hostPath": {"path": state_dir, "type": "Directory"}}],
                "containers": [{"name": "pulumi", "volumeMounts": [{"name": "state", "mountPath": "/state"}]}]
            }}
        }}
    });
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name}, "spec": spec})
}
