//! The Workspace controller's local runtime with the Update controller: an agent process per Workspace,
//! identified to the API server by a TokenRequest for the Workspace's service account (so its reads of
//! Secrets go through RBAC), Ready with an address; Updates run on it.

mod common;

use std::sync::Arc;

use common::*;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use pko_api::{Update, Workspace};
use pko_operator::agents::Agents;
use pko_operator::agents::local::LocalRuntime;
use pko_operator::context::Context;
use pko_operator::ownership::Namespaces;
use pko_operator::update::controller::UpdateController;
use pko_operator::workspace::controller::WorkspaceController;
use pko_testbed::{eventually, testbed};
use serde_json::json;

fn workspace(name: &str, sa: &str, dir: &std::path::Path, backend: &str) -> serde_json::Value {
    json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Workspace", "metadata": {"name": name},
           "spec": {"serviceAccountName": sa, "local": {"dir": dir.display().to_string()},
                    "env": [{"name": "PULUMI_BACKEND_URL", "value": backend},
                            {"name": "PULUMI_CONFIG_PASSPHRASE", "valueFrom": {"secretKeyRef": {"name": "passphrase",
                                "key": "value"}}}],
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
        create(
            &ns.api::<ServiceAccount>(),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}}),
        )
        .await;
    }
    create(
        &ns.api::<Secret>(),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "passphrase"},
        "stringData": {"value": pko_testbed::PulumiEnv::PASSPHRASE}}),
    )
    .await;
    // no Role for either account: Secret references are resolved by the operator (PKO's RBAC)
    for sa in ["runner", "nobody"] {
        let out = bed
            .kubectl()
            .args([
                "auth",
                "can-i",
                "get",
                "secrets",
                "-n",
                ns.name(),
                "--as",
                &format!("system:serviceaccount:{}:{sa}", ns.name()),
            ])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no", "{sa} may not get secrets");
    }

    let dir = project(
        &env,
        "local",
        "resources:\n  a:\n    type: command:local:Command\n    properties:\n      create: echo local\noutputs:\n  \
            out: ${a.stdout}\n",
    );
    let agent_bin = agent_bin();
    let ctx = Arc::new(Context::new(client.clone(), String::new(), Arc::new(Namespaces::one(ns.name()))));
    let local = LocalRuntime::new(agent_bin, env.dir().join("agents"), bed.api_server_url(), bed.ca_file(), env.vars());
    let mut informers = pko_operator::informer::Informers::new(client.clone(), scoped(ns.name()));
    let agents = Arc::new(Agents::own_processes(client.clone(), local));
    let controllers = futures::future::join(
        WorkspaceController::new(ctx.clone(), agents.clone()).run(&mut informers),
        UpdateController::new(ctx, 4).with_agents(agents).run(&mut informers),
    );
    let controllers = tokio::spawn(informers.drive(async move {
        controllers.await;
    }));

    create(&ns.api::<Workspace>(), workspace("allowed", "runner", &dir, &env.backend_url())).await;
    let wss = ns.api::<Workspace>();
    eventually("workspace Ready with an address", 60, || async {
        let w = wss.get("allowed").await.unwrap();
        let st = w.status.unwrap_or_default();
        st.address.is_some()
            && st
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True" && c.reason == "Succeeded")
    })
    .await;
    // the second Workspace after the first is initialized: both select stack `dev` of one backend from one local
    // directory, and this test is about each agent's identity, not about two initializations racing there
    create(&ns.api::<Workspace>(), workspace("denied", "nobody", &dir, &env.backend_url())).await;

    let updates = ns.api::<Update>();
    for (u, w, stack) in [("ok", "allowed", "dev"), ("other", "denied", "other")] {
        create(
            &updates,
            owned_update(
                &ns.api::<pko_api::Workspace>(),
                json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update", "metadata": {"name": u},
                    "spec": {"workspaceName": w, "stackName": stack, "type": "up"}}),
            )
            .await,
        )
        .await;
    }
    for u in ["ok", "other"] {
        eventually(&format!("update {u} completes without any Role for its workspace's account"), 90, || async {
            condition(&updates.get(u).await.unwrap(), "Complete") == Some(("True".into(), "Updated".into()))
        })
        .await;
    }
    // each workspace's agent runs with that workspace's service account: its token says so
    for (w, sa) in [("allowed", "runner"), ("denied", "nobody")] {
        let token = std::fs::read_to_string(env.dir().join("agents").join(ns.name()).join(w).join("token")).unwrap();
        let review: k8s_openapi::api::authentication::v1::TokenReview = kube::Api::all(client.clone())
            .create(
                &Default::default(),
                &serde_json::from_value(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                    "spec": {"token": token.trim()}}))
                .unwrap(),
            )
            .await
            .unwrap();
        let user = review.status.and_then(|s| s.user).and_then(|u| u.username).unwrap_or_default();
        assert_eq!(user, format!("system:serviceaccount:{}:{sa}", ns.name()), "the identity of workspace {w}'s agent");
    }

    // the agent dies: the runtime notices within its check period, starts a new one (a new address), and
    // the next Update runs there
    let address = wss.get("allowed").await.unwrap().status.unwrap().address.unwrap();
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(env.dir().join("agents").join(ns.name()).join("allowed").join("agent.json")).unwrap(),
    )
    .unwrap();
    assert!(std::process::Command::new("kill").args(["-KILL", &record["pid"].to_string()]).status().unwrap().success());
    eventually("a new agent replaces the dead one", 60, || async {
        wss.get("allowed").await.unwrap().status.unwrap().address.is_some_and(|a| a != address)
    })
    .await;
    create(
        &updates,
        owned_update(
            &ns.api::<pko_api::Workspace>(),
            json!({"apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Update", "metadata": {"name": "after-restart"}, "spec": {"workspaceName": "allowed",
            "stackName": "dev", "type": "up"}}),
        )
        .await,
    )
    .await;
    eventually("the next update completes on the new agent", 90, || async {
        condition(&updates.get("after-restart").await.unwrap(), "Complete") == Some(("True".into(), "Updated".into()))
    })
    .await;

    controllers.abort();
}
