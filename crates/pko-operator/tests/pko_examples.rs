//! PKO's own examples and e2e testdata (issue "Real programs, as PKO users write them"), applied with
//! `kubectl apply` as PKO's e2e suite does, from copies of PKO's files (`fixtures/pko-examples/`, PKO
//! v2.9.1 at commit 475dbc6c, Apache-2.0). What this bed changes, and nothing else:
//! - the **namespace**: every object in the test's own namespace (PKO's `Namespace` documents left out)
//!   and the cluster-scoped ClusterRoleBindings named and labelled with it (deleted after the test),
//!   since tests share one cluster;
//! - the **backend**: each Stack's `spec.backend` is the test's `file://` backend (PKO's examples use
//!   Pulumi Cloud, its e2e a volume at `file:///state/`: that `PULUMI_BACKEND_URL` env ref is dropped),
//!   with a `PULUMI_CONFIG_PASSPHRASE` env ref where the Stack has none.
//!
//! Run on the local runtime, whose agents give Pulumi the Workspace's service account (the kubeconfig
//! of its token) as a workspace pod's in-cluster config would: the Kubernetes provider deploys as that
//! account, with the RBAC the example grants it. Which of PKO's examples cannot run here, and why:
//! `docs/pko-examples.md`.

mod common;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use pko_api::Stack;
use pko_testbed::{eventually, testbed};
use serde_json::json;

/// PKO's manifests in `fixtures/pko-examples/<file>` with the namespace `ns` and the backend `backend`
/// changed as the module says, as one YAML stream for `kubectl apply`.
fn pko_manifests(file: &str, ns: &str, backend: &str) -> String {
    pko_manifests_without(file, ns, backend, &[])
}

/// [`pko_manifests`] without the documents of kinds `left_out`.
fn pko_manifests_without(file: &str, ns: &str, backend: &str, left_out: &[&str]) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pko-examples").join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let mut v: serde_json::Value = serde::Deserialize::deserialize(doc).unwrap();
        if v.is_null() || v["kind"] == "Namespace" || left_out.iter().any(|k| v["kind"] == *k) {
            continue;
        }
        if v["metadata"].get("namespace").is_some() {
            v["metadata"]["namespace"] = json!(ns);
        }
        if v["kind"] == "ClusterRoleBinding" {
            v["metadata"]["name"] = json!(format!("{ns}-{}", v["metadata"]["name"].as_str().unwrap()));
            v["metadata"]["labels"] = json!({TEST_NAMESPACE_LABEL: ns});
        }
        for subject in v.get_mut("subjects").and_then(|s| s.as_array_mut()).into_iter().flatten() {
            subject["namespace"] = json!(ns);
        }
        if v["kind"] == "Stack" {
            v["spec"]["backend"] = json!(backend);
            let refs = v["spec"]["envRefs"].as_object_mut().unwrap();
            refs.remove("PULUMI_BACKEND_URL");
            refs.entry("PULUMI_CONFIG_PASSPHRASE").or_insert(passphrase_env_refs()["PULUMI_CONFIG_PASSPHRASE"].clone());
        }
        docs.push(serde_yaml_ng::to_string(&v).unwrap());
    }
    docs.join("---\n")
}

/// Labels the cluster-scoped objects of a test's namespace, which its namespace's deletion leaves.
const TEST_NAMESPACE_LABEL: &str = "pko-test-namespace";

/// Deletes the ClusterRoleBindings of namespace `.0` (labelled [`TEST_NAMESPACE_LABEL`]) when dropped.
struct ClusterBindings(String);

impl Drop for ClusterBindings {
    fn drop(&mut self) {
        let _ = testbed()
            .kubectl()
            .args(["delete", "clusterrolebinding", "-l", &format!("{TEST_NAMESPACE_LABEL}={}", self.0)])
            .output();
    }
}

/// `kubectl apply -f -` of `manifests`, as PKO's e2e suite applies its testdata; the cluster-scoped
/// objects it makes are deleted when the returned guard is dropped.
#[must_use]
fn kubectl_apply_in(ns: &str, manifests: &str) -> ClusterBindings {
    kubectl_apply(manifests);
    ClusterBindings(ns.to_string())
}

/// `kubectl apply -f -` of `manifests`, as PKO's e2e suite applies its testdata.
fn kubectl_apply(manifests: &str) {
    use std::io::Write as _;
    let mut child = testbed()
        .kubectl()
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(manifests.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "kubectl apply: {}\n{manifests}", String::from_utf8_lossy(&out.stderr));
}

/// The passphrase Secret, and the `pulumi-api-secret` PKO's examples read a Pulumi Cloud token from
/// (a file backend does not use it).
async fn example_secrets(ns: &pko_testbed::TestNamespace) {
    passphrase_secret(ns).await;
    create(
        &ns.api::<k8s_openapi::api::core::v1::Secret>(),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pulumi-api-secret"},
            "stringData": {"accessToken": "unused-with-a-file-backend"}}),
    )
    .await;
}

/// PKO's e2e `structured-config` (objects, arrays, numbers and booleans inline and from a ConfigMap as
/// JSON): the Stack is Ready with exactly the outputs PKO's e2e test asserts.
#[tokio::test]
async fn pko_e2e_structured_config_converges_with_the_outputs_pko_asserts() {
    let (client, ns, env) = setup("pko-structured").await;
    passphrase_secret(&ns).await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    let _bindings =
        kubectl_apply_in(ns.name(), &pko_manifests("structured-config.yaml", ns.name(), &env.backend_url()));
    let stacks = ns.api::<Stack>();
    eventually("the Stack is Ready", 300, || async { ready(&stacks.get("structured-config").await.unwrap()) }).await;
    let out = stacks.get("structured-config").await.unwrap().status.unwrap().outputs.unwrap();
    assert_eq!(out["simpleString"], json!("hello-world"));
    assert_eq!(
        out["databaseConfig"],
        json!({"host": "db.example.com", "port": 5432, "database": "myapp", "ssl": true, "maxConnections": 100})
    );
    assert_eq!(out["allowedRegions"], json!(["us-west-2", "us-east-1", "eu-west-1"]));
    assert_eq!(
        (&out["maxRetries"], &out["timeout"], &out["enableCaching"], &out["debugMode"]),
        (&json!(3), &json!(30.5), &json!(true), &json!(false))
    );
    assert_eq!(out["oauth"]["clientId"], json!("my-client-id"));
    assert_eq!(out["oauth"]["scopes"], json!(["read", "write"]));
    assert_eq!(
        out["oauth"]["endpoints"],
        json!({"token": "https://auth.example.com/token", "authorize": "https://auth.example.com/authorize"})
    );
    let settings = &out["appSettings"];
    assert_eq!(
        (&settings["apiEndpoint"], &settings["timeout"], &settings["retryEnabled"]),
        (&json!("https://api.example.com"), &json!(30), &json!(true))
    );
    assert_eq!(settings["features"], json!({"authentication": true, "rateLimit": 1000}));
    assert_eq!(settings["regions"], json!(["us-west-1", "us-east-1"]));
    assert_eq!(out["appVersion"], json!("v1.2.3"));
}

/// PKO's `examples/preview-demo`: a Program of an nginx Deployment (the real Kubernetes provider, no
/// `skipAwait`: the provider waits for its two pods), a Stack deploying it and a `preview: true` Stack
/// of the same Pulumi stack with 3 replicas that waits for the first (`prerequisites`). The node has no
/// registry: the bed's own sandbox image is given the name `nginx:1.27-alpine`, so the pods start on
/// the node from a locally built image (it runs the sandbox's pause program, not nginx).
#[tokio::test]
async fn pko_example_preview_demo_deploys_nginx_and_previews_the_change_without_applying_it() {
    let (client, ns, env) = setup("pko-preview").await;
    testbed().node().tag_image("localhost/pause:local", "docker.io/library/nginx:1.27-alpine");
    example_secrets(&ns).await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    let t = std::time::Instant::now();
    let _bindings =
        kubectl_apply_in(ns.name(), &pko_manifests("preview-demo/stack.yaml", ns.name(), &env.backend_url()));
    let (stacks, deployments) = (ns.api::<Stack>(), ns.api::<Deployment>());
    eventually("nginx-current is Ready with two nginx pods", 420, || async {
        let ready_pods =
            deployments.get_opt("nginx").await.unwrap().and_then(|d| d.status).and_then(|s| s.ready_replicas);
        ready(&stacks.get("nginx-current").await.unwrap()) && ready_pods == Some(2)
    })
    .await;
    eprintln!("preview-demo: nginx-current Ready with 2 pods {:?} after kubectl apply", t.elapsed());
    eventually("nginx-next is Ready after its preview", 300, || async {
        ready(&stacks.get("nginx-next").await.unwrap())
    })
    .await;
    let next = stacks.get("nginx-next").await.unwrap().status.unwrap().last_update.unwrap();
    assert_eq!(next.update_type, Some(pko_api::UpdateType::Preview), "nginx-next runs previews only: {next:?}");
    let d = deployments.get("nginx").await.unwrap();
    assert_eq!(d.spec.and_then(|s| s.replicas), Some(2), "the preview of 3 replicas changed nothing");
}

/// The provider deploys as the Workspace's service account, not as the operator: without the
/// example's RoleBinding (`admin` in the namespace) the API server refuses the Deployment to
/// `system:serviceaccount:<ns>:nginx-preview-demo`, and the Stack says so.
#[tokio::test]
async fn pko_example_preview_demo_without_its_rolebinding_is_refused_to_the_workspace_service_account() {
    let (client, ns, env) = setup("pko-preview-rbac").await;
    example_secrets(&ns).await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    let _bindings = kubectl_apply_in(
        ns.name(),
        &pko_manifests_without("preview-demo/stack.yaml", ns.name(), &env.backend_url(), &["RoleBinding"]),
    );
    let stacks = ns.api::<Stack>();
    let account = format!("system:serviceaccount:{}:nginx-preview-demo", ns.name());
    eventually("nginx-current fails, refused to the service account", 300, || async {
        let s = stacks.get("nginx-current").await.unwrap();
        let message = s.status.and_then(|st| st.last_update).and_then(|u| u.message).unwrap_or_default();
        message.contains(&account) && message.contains("forbidden")
    })
    .await;
    assert!(ns.api::<Deployment>().get_opt("nginx").await.unwrap().is_none(), "nothing was deployed as the operator");
}
