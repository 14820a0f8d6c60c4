//! The real Kubernetes provider (issue "Real programs, as PKO users write them"): a Program (Pulumi
//! YAML, as a PKO user writes one) whose resources are `kubernetes:` resources, run by the operator on
//! the local runtime with `pulumi-resource-kubernetes` built in the bed from the Go module proxy — not
//! the stand-in `command` provider. It deploys a ConfigMap, a Deployment and a Service into the bed's
//! own API server, the Stack's outputs name them, a config change reaches the ConfigMap, a change made
//! with `kubectl` behind Pulumi's back is reported by a scheduled drift check naming the ConfigMap's
//! URN and put back by `autoRemediate`, and deleting the Stack with `destroyOnFinalize` deletes them.
//! The same three objects from a Python program (`pulumi_kubernetes` from PyPI, in the bed's virtualenv)
//! in a local workspace directory.

mod common;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{DeleteParams, Patch, PatchParams};
use pko_api::{Program, Stack};
use pko_testbed::{eventually, testbed};
use serde_json::json;

/// The Program: a ConfigMap with the greeting of the Stack's config, a Deployment of no replicas (the
/// bed's node pulls no image) and a Service selecting it, in the namespace of config `ns`; outputs
/// their names and the Service's cluster IP.
fn program() -> serde_json::Value {
    let skip_await = json!({"pulumi.com/skipAwait": "true"});
    json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "app"},
    "program": {
        "configuration": {"ns": {"type": "String"}, "greeting": {"type": "String"}},
        "resources": {
            "config": {"type": "kubernetes:core/v1:ConfigMap",
                       "properties": {"metadata": {"name": "app-config", "namespace": "${ns}"}, "data": {"greeting": "${greeting}"}}},
            "app": {"type": "kubernetes:apps/v1:Deployment",
                    "properties": {"metadata": {"name": "app", "namespace": "${ns}", "annotations": skip_await},
                                   "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "app"}},
                                            "template": {"metadata": {"labels": {"app": "app"}},
                                                         "spec": {"containers": [{"name": "app", "image": "pko.local/app:1",
                                                                                  "envFrom": [{"configMapRef": {"name": "${config.metadata.name}"}}]}]}}}}},
            "web": {"type": "kubernetes:core/v1:Service",
                    "properties": {"metadata": {"name": "web", "namespace": "${ns}", "annotations": skip_await},
                                   "spec": {"selector": {"app": "app"}, "ports": [{"port": 80, "targetPort": 8080}]}}}
        },
        "outputs": {"configMap": "${config.metadata.name}", "deployment": "${app.metadata.name}", "clusterIP": "${web.spec.clusterIP}"}
    }})
}

fn drift(s: &Stack) -> Option<(String, String, String)> {
    stack_condition(s, "DriftDetected")
}

async fn greeting(config_maps: &kube::Api<ConfigMap>) -> Option<String> {
    config_maps.get_opt("app-config").await.unwrap().and_then(|c| c.data).and_then(|d| d.get("greeting").cloned())
}

/// The passphrase and the provider's cluster — the bed's API server (in a pod: the workspace's service
/// account) — as a Stack's `envRefs`.
fn env_refs() -> serde_json::Value {
    let mut refs = passphrase_env_refs();
    refs["KUBECONFIG"] = json!({"type": "Literal", "literal": {"value": testbed().kubeconfig().display().to_string()}});
    refs
}

/// Deletes Stack `name` (`destroyOnFinalize`) and checks that the ConfigMap, Deployment and Service
/// of its program are gone from the bed's API server.
async fn delete_and_check_destroyed(ns: &pko_testbed::TestNamespace, name: &str, objects: [&str; 3]) {
    let stacks = ns.api::<Stack>();
    stacks.delete(name, &DeleteParams::background()).await.unwrap();
    eventually("the Stack is finalized and gone", 180, || async { stacks.get_opt(name).await.unwrap().is_none() }).await;
    assert!(ns.api::<ConfigMap>().get_opt(objects[0]).await.unwrap().is_none(), "the ConfigMap was destroyed");
    assert!(ns.api::<Deployment>().get_opt(objects[1]).await.unwrap().is_none(), "the Deployment was destroyed");
    assert!(ns.api::<Service>().get_opt(objects[2]).await.unwrap().is_none(), "the Service was destroyed");
}

#[tokio::test]
async fn a_program_of_kubernetes_resources_deploys_drifts_is_remediated_and_is_destroyed_with_the_real_provider() {
    let (client, ns, env) = setup("k8s-provider").await;
    passphrase_secret(&ns).await;
    create(&ns.api::<Program>(), program()).await;
    let op = InProcessOperator::start(&client, &env, ns.name()).await;
    let stacks = ns.api::<Stack>();
    create(
        &stacks,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "app"},
               "spec": {"stack": "dev", "programRef": {"name": "app"}, "backend": env.backend_url(), "destroyOnFinalize": true,
                        "envRefs": env_refs(), "config": {"ns": ns.name(), "greeting": "hello"}}}),
    )
    .await;
    eventually("the Stack is Ready", 240, || async { ready(&stacks.get("app").await.unwrap()) }).await;
    let config_maps = ns.api::<ConfigMap>();
    assert_eq!(greeting(&config_maps).await.as_deref(), Some("hello"), "the ConfigMap is in the bed's API server");
    let deployment = ns.api::<Deployment>().get("app").await.unwrap();
    assert_eq!(deployment.spec.and_then(|s| s.replicas), Some(0));
    let service = ns.api::<Service>().get("web").await.unwrap();
    let cluster_ip = service.spec.and_then(|s| s.cluster_ip).unwrap();
    let outputs = stacks.get("app").await.unwrap().status.unwrap().outputs.unwrap();
    assert_eq!((&outputs["configMap"], &outputs["deployment"], &outputs["clusterIP"]), (&json!("app-config"), &json!("app"), &json!(cluster_ip)));

    // a config change reaches the object
    stacks.patch("app", &PatchParams::default(), &Patch::Merge(json!({"spec": {"config": {"greeting": "bonjour"}}}))).await.unwrap();
    eventually("the new greeting is deployed", 180, || async {
        let s = stacks.get("app").await.unwrap();
        ready(&s) && s.status.as_ref().and_then(|st| st.observed_generation) == s.metadata.generation && greeting(&config_maps).await.as_deref() == Some("bonjour")
    })
    .await;

    // changed with kubectl behind Pulumi's back: a drift check (every 2 s, report only) names it
    let patch = json!({"spec": {"driftDetection": {"schedules": [{"cron": "*/2 * * * * *"}]}}});
    stacks.patch("app", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    eventually("a check finds no drift", 120, || async { drift(&stacks.get("app").await.unwrap()).is_some_and(|(s, r, _)| s == "False" && r == "NoChanges") }).await;
    let edited = testbed().kubectl().args(["-n", ns.name(), "patch", "configmap", "app-config", "--type", "merge", "-p", r#"{"data":{"greeting":"edited"}}"#]).output().unwrap();
    assert!(edited.status.success(), "kubectl patch: {}", String::from_utf8_lossy(&edited.stderr));
    eventually("the drift is reported", 120, || async { drift(&stacks.get("app").await.unwrap()).is_some_and(|(s, r, _)| s == "True" && r == "Changes") }).await;
    let (_, _, message) = drift(&stacks.get("app").await.unwrap()).unwrap();
    assert!(message.contains("urn:pulumi:dev::app::kubernetes:core/v1:ConfigMap::config"), "the drift names the ConfigMap's URN: {message}");
    assert_eq!(greeting(&config_maps).await.as_deref(), Some("edited"), "a report-only check changes nothing");

    // autoRemediate: an up --refresh puts the desired greeting back
    let patch = json!({"spec": {"driftDetection": {"schedules": [{"cron": "*/2 * * * * *", "autoRemediate": true}]}}});
    stacks.patch("app", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    eventually("the drift is remediated", 180, || async {
        greeting(&config_maps).await.as_deref() == Some("bonjour") && drift(&stacks.get("app").await.unwrap()).is_some_and(|(s, r, _)| s == "False" && r == "NoChanges")
    })
    .await;

    // destroyOnFinalize: the provider deletes what it created
    delete_and_check_destroyed(&ns, "app", ["app-config", "app", "web"]).await;
    drop(op);
}

/// The Python program: the same ConfigMap, Deployment and Service with `pulumi_kubernetes`.
const PYTHON_PROGRAM: &str = r#"import pulumi
import pulumi_kubernetes as k8s

cfg = pulumi.Config()
ns = cfg.require("ns")
skip_await = {"pulumi.com/skipAwait": "true"}
config = k8s.core.v1.ConfigMap("config", metadata={"name": "py-config", "namespace": ns}, data={"greeting": cfg.require("greeting")})
app = k8s.apps.v1.Deployment(
    "app",
    metadata={"name": "py-app", "namespace": ns, "annotations": skip_await},
    spec={
        "replicas": 0,
        "selector": {"match_labels": {"app": "py-app"}},
        "template": {
            "metadata": {"labels": {"app": "py-app"}},
            "spec": {"containers": [{"name": "app", "image": "pko.local/app:1", "env_from": [{"config_map_ref": {"name": config.metadata.name}}]}]},
        },
    },
)
web = k8s.core.v1.Service(
    "web",
    metadata={"name": "py-web", "namespace": ns, "annotations": skip_await},
    spec={"selector": {"app": "py-app"}, "ports": [{"port": 80, "target_port": 8080}]},
)
pulumi.export("configMap", config.metadata.name)
pulumi.export("deployment", app.metadata.name)
pulumi.export("clusterIP", web.spec.cluster_ip)
"#;

#[tokio::test]
async fn a_python_program_of_kubernetes_resources_deploys_and_is_destroyed_with_the_real_provider() {
    let (client, ns, env) = setup("k8s-provider-py").await;
    let dir = env.dir().join("pyapp");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("Pulumi.yaml"), "name: pyapp\nruntime: python\n").unwrap();
    std::fs::write(dir.join("__main__.py"), PYTHON_PROGRAM).unwrap();
    passphrase_secret(&ns).await;
    let op = InProcessOperator::start(&client, &env, ns.name()).await;
    let stacks = ns.api::<Stack>();
    create(
        &stacks,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "pyapp"},
               "spec": {"stack": "dev", "backend": env.backend_url(), "destroyOnFinalize": true, "envRefs": env_refs(),
                        "config": {"ns": ns.name(), "greeting": "hallo"},
                        "workspaceTemplate": {"spec": {"local": {"dir": dir.display().to_string()}}}}}),
    )
    .await;
    eventually("the Stack is Ready", 240, || async { ready(&stacks.get("pyapp").await.unwrap()) }).await;
    let config_maps = ns.api::<ConfigMap>();
    let data = config_maps.get("py-config").await.unwrap().data.unwrap();
    assert_eq!(data.get("greeting").map(String::as_str), Some("hallo"));
    let cluster_ip = ns.api::<Service>().get("py-web").await.unwrap().spec.and_then(|s| s.cluster_ip).unwrap();
    assert_eq!(ns.api::<Deployment>().get("py-app").await.unwrap().spec.and_then(|s| s.replicas), Some(0));
    let outputs = stacks.get("pyapp").await.unwrap().status.unwrap().outputs.unwrap();
    assert_eq!((&outputs["configMap"], &outputs["deployment"], &outputs["clusterIP"]), (&json!("py-config"), &json!("py-app"), &json!(cluster_ip)));

    delete_and_check_destroyed(&ns, "pyapp", ["py-config", "py-app", "py-web"]).await;
    drop(op);
}
