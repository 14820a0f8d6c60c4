//! The Workspace controller's local runtime with the Update controller: an agent process per Workspace,
//! identified to the API server by a TokenRequest for the Workspace's service account (so its reads of
//! Secrets go through RBAC), Ready with an address; Updates run on it.

mod common;

use std::sync::Arc;

use common::*;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use pko_api::{Update, Workspace};
use pko_operator::context::Context;
use pko_operator::ownership::Namespaces;
use pko_operator::update::controller::UpdateController;
use pko_operator::workspace::controller::{LocalRuntime, Runtime, WorkspaceController};
use pko_testbed::{eventually, testbed};
use serde_json::json;

fn workspace(name: &str, sa: &str, dir: &std::path::Path, backend: &str) -> serde_json::Value {
    json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Workspace", "metadata": {"name": name},
           "spec": {"serviceAccountName": sa, "local": {"dir": dir.display().to_string()},
                    "env": [{"name": "PULUMI_BACKEND_URL", "value": backend},
                            {"name": "PULUMI_CONFIG_PASSPHRASE", "valueFrom": {"secretKeyRef": {"name": "passphrase", "key": "value"}}}],
                    "stacks": [{"name": "dev", "create": true}]}})
}

#[tokio::test]
async fn local_agents_run_updates_with_the_workspace_identity() {
    let bed = testbed();
    let client = bed.client().await.unwrap();
    pko_testbed::install_crds(&client, pko_api::crds()).await.unwrap();
    let ns = bed.namespace("local").await.unwrap();
    let env = bed.pulumi_env().unwrap();
    for sa in ["runner", "nobody"] {
        create(&ns.api::<ServiceAccount>(), json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}})).await;
    }
    create(&ns.api::<Secret>(), json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "passphrase"}, "stringData": {"value": pko_testbed::PulumiEnv::PASSPHRASE}}))
        .await;
    create(
        &ns.api::<Role>(),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "read-secrets"},
        "rules": [{"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["get"]}]}),
    )
    .await;
    create(
        &ns.api::<RoleBinding>(),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "runner"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-secrets"},
        "subjects": [{"kind": "ServiceAccount", "name": "runner", "namespace": ns.name()}]}),
    )
    .await;

    let dir = project(&env, "local", "resources:\n  a:\n    type: command:local:Command\n    properties:\n      create: echo local\noutputs:\n  out: ${a.stdout}\n");
    let agent_bin = agent_bin();
    let ctx = Arc::new(Context::new(client.clone(), String::new(), Arc::new(Namespaces::one(ns.name()))));
    let local = LocalRuntime::new(agent_bin, env.dir().join("agents"), bed.api_server_url(), bed.ca_file(), env.vars());
    let mut informers = pko_operator::informer::Informers::new(client.clone(), scoped(ns.name()));
    let controllers = futures::future::join(WorkspaceController::new(ctx.clone(), Runtime::Local(local)).run(&mut informers), UpdateController::new(ctx, 4).run(&mut informers));
    let controllers = tokio::spawn(informers.drive(async move {
        controllers.await;
    }));

    create(&ns.api::<Workspace>(), workspace("allowed", "runner", &dir, &env.backend_url())).await;
    create(&ns.api::<Workspace>(), workspace("denied", "nobody", &dir, &env.backend_url())).await;
    let wss = ns.api::<Workspace>();
    eventually("workspace Ready with an address", 60, || async {
        let w = wss.get("allowed").await.unwrap();
        let st = w.status.unwrap_or_default();
        st.address.is_some() && st.conditions.unwrap_or_default().iter().any(|c| c.type_ == "Ready" && c.status == "True" && c.reason == "Succeeded")
    })
    .await;

    let updates = ns.api::<Update>();
    for (u, w) in [("ok", "allowed"), ("forbidden", "denied")] {
        create(
            &updates,
            json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update", "metadata": {"name": u}, "spec": {"workspaceName": w, "stackName": "dev", "type": "up"}}),
        )
        .await;
    }
    eventually("the update on the allowed workspace completes", 90, || async {
        condition(&updates.get("ok").await.unwrap(), "Complete") == Some(("True".into(), "Updated".into()))
    })
    .await;
    eventually("the other one fails on RBAC", 90, || async { condition(&updates.get("forbidden").await.unwrap(), "Failed").map(|c| c.0) == Some("True".into()) }).await;
    let msg = updates.get("forbidden").await.unwrap().status.unwrap().message.unwrap_or_default();
    assert!(msg.contains("forbidden") || msg.contains("403"), "the agent read the Secret as the workspace's service account: {msg}");

    // the agent dies: the runtime notices within its check period, starts a new one (a new address), and
    // the next Update runs there
    let address = wss.get("allowed").await.unwrap().status.unwrap().address.unwrap();
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(env.dir().join("agents").join(ns.name()).join("allowed").join("agent.json")).unwrap()).unwrap();
    assert!(std::process::Command::new("kill").args(["-KILL", &record["pid"].to_string()]).status().unwrap().success());
    eventually("a new agent replaces the dead one", 60, || async { wss.get("allowed").await.unwrap().status.unwrap().address.is_some_and(|a| a != address) }).await;
    create(&updates, json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update", "metadata": {"name": "after-restart"}, "spec": {"workspaceName": "allowed", "stackName": "dev", "type": "up"}})).await;
    eventually("the next update completes on the new agent", 90, || async {
        condition(&updates.get("after-restart").await.unwrap(), "Complete") == Some(("True".into(), "Updated".into()))
    })
    .await;

    controllers.abort();
}
