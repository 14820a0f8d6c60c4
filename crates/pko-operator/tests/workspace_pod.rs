//! The `pod` runtime's objects on the real API server: the Service and StatefulSet apply cleanly (server
//! side), the StatefulSet controller of kube-controller-manager creates the pod from our template, and
//! the owner references let the garbage collector remove everything with the Workspace.

mod common;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{DeleteParams, Patch, PatchParams};
use pko_api::Workspace;
use pko_operator::agents::pod::{self, PodRuntimeConfig};
use pko_testbed::{eventually, testbed};
use serde_json::json;

#[tokio::test]
async fn pod_runtime_objects_are_accepted_and_collected() {
    let bed = testbed();
    let client = bed.client().await.unwrap();
    pko_testbed::install_crds(&client, pko_api::crds()).await.unwrap();
    let ns = bed.namespace("wspod").await.unwrap();
    let ws: Workspace = common::create(
        &ns.api::<Workspace>(),
        json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Workspace", "metadata": {"name": "w"},
               "spec": {"git": {"url": "https://git.example.invalid/r.git", "ref": "main"}, "pulumiLogLevel": 3,
                        "podTemplate": {"spec": {"containers": [{"name": "pulumi", "env": [{"name": "A",
                            "value": "b"}]}]}}}}),
    )
    .await;
    let pp = PatchParams::apply(pko_api::constants::field_manager::OPERATOR).force();
    ns.api::<Service>().patch("w-workspace", &pp, &Patch::Apply(pod::service(&ws))).await.unwrap();
    let sts = pod::stateful_set(
        &ws,
        &PodRuntimeConfig {
            agent_image: "pko-agent:test".into(),
            agent_image_pull_policy: None,
            flux_max_untar_size_bytes: None,
        },
    );
    ns.api::<StatefulSet>().patch("w-workspace", &pp, &Patch::Apply(&sts)).await.unwrap();
    // re-applying the same objects is a no-op (no field conflicts, no spec churn)
    let before = ns.api::<StatefulSet>().get("w-workspace").await.unwrap().metadata.generation;
    ns.api::<StatefulSet>().patch("w-workspace", &pp, &Patch::Apply(&sts)).await.unwrap();
    assert_eq!(ns.api::<StatefulSet>().get("w-workspace").await.unwrap().metadata.generation, before);

    let pods = ns.api::<Pod>();
    eventually("the StatefulSet controller creates w-workspace-0", 60, || async {
        pods.get_opt("w-workspace-0").await.unwrap().is_some()
    })
    .await;
    let p = pods.get("w-workspace-0").await.unwrap();
    let spec = p.spec.unwrap();
    assert_eq!(spec.termination_grace_period_seconds, Some(600));
    let c = spec.containers.iter().find(|c| c.name == "pulumi").unwrap();
    assert!(c.args.as_ref().unwrap().windows(2).any(|w| w[0] == "--pulumi-log-level" && w[1] == "3"));
    assert!(c.env.as_ref().unwrap().iter().any(|e| e.name == "A"));
    assert!(p.metadata.annotations.unwrap().contains_key(pko_api::constants::REVISION_HASH_ANNOTATION));

    // deleting the Workspace garbage-collects Service, StatefulSet and pod
    ns.api::<Workspace>().delete("w", &DeleteParams::background()).await.unwrap();
    eventually("the StatefulSet is collected", 60, || async {
        ns.api::<StatefulSet>().get_opt("w-workspace").await.unwrap().is_none()
    })
    .await;
    eventually("the Service is collected", 60, || async {
        ns.api::<Service>().get_opt("w-workspace").await.unwrap().is_none()
    })
    .await;
}
