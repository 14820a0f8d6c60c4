//! The asynchronous Update controller on the test bed: Updates are dispatched to the Workspace's agent
//! without holding a reconcile, complete with PKO's conditions, and expire after `ttlAfterCompleted`.

mod common;

use std::sync::Arc;

use common::*;
use kube::api::{Patch, PatchParams};
use pko_api::{Update, Workspace};
use pko_operator::context::Context;
use pko_operator::ownership::Namespaces;
use pko_operator::update::controller::UpdateController;
use pko_testbed::{eventually, testbed};
use serde_json::json;


#[tokio::test]
async fn updates_are_dispatched_completed_and_expired() {
    let bed = testbed();
    let client = bed.client().await.unwrap();
    pko_testbed::install_crds(&client, pko_api::crds()).await.unwrap();
    let ns = bed.namespace("updctl").await.unwrap();
    let env = bed.pulumi_env().unwrap();
    let agent = start_agent(&env, ns.name());
    let dir = project(&env, "ctl", "resources:\n  a:\n    type: command:local:Command\n    properties:\n      create: echo ok\noutputs:\n  out: ${a.stdout}\n");
    create(
        &ns.api::<Workspace>(),
        json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Workspace", "metadata": {"name": "ws"},
               "spec": {"local": {"dir": dir.display().to_string()},
                        "env": [{"name": "PULUMI_BACKEND_URL", "value": env.backend_url()}, {"name": "PULUMI_CONFIG_PASSPHRASE", "value": pko_testbed::PulumiEnv::PASSPHRASE}],
                        "stacks": [{"name": "dev", "create": true}]}}),
    )
    .await;
    let ctx = Arc::new(Context { client: client.clone(), advertised_addr: String::new(), ownership: Arc::new(Namespaces::one(ns.name())) });
    let controller = tokio::spawn(UpdateController::new(ctx, 8, None).run());
    let updates = ns.api::<Update>();

    // no agent address yet: the Update waits
    create(&updates, json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update", "metadata": {"name": "u1"}, "spec": {"workspaceName": "ws", "stackName": "dev", "type": "up", "ttlAfterCompleted": "3s"}})).await;
    eventually("u1 waits for the workspace", 20, || async {
        condition(&updates.get("u1").await.unwrap(), "Progressing") == Some(("False".into(), "WorkspaceNotReady".into()))
    })
    .await;
    // the workspace becomes ready (here by hand: the Workspace controller is not built yet)
    ns.api::<Workspace>()
        .patch_status("ws", &PatchParams::apply("tests").force(), &Patch::Apply(json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Workspace", "status": {"address": agent.1}})))
        .await
        .unwrap();
    eventually("u1 completes", 60, || async { condition(&updates.get("u1").await.unwrap(), "Complete") == Some(("True".into(), "Updated".into())) }).await;
    assert_eq!(updates.get("u1").await.unwrap().status.unwrap().outputs.as_deref(), Some("u1-stack-outputs"));
    // ttlAfterCompleted: 3s
    eventually("u1 expires", 30, || async { updates.get_opt("u1").await.unwrap().is_none() }).await;

    // a missing workspace
    create(&updates, json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update", "metadata": {"name": "u2"}, "spec": {"workspaceName": "nope", "stackName": "dev", "type": "preview"}})).await;
    eventually("u2 waits", 20, || async { condition(&updates.get("u2").await.unwrap(), "Progressing") == Some(("False".into(), "WorkspaceNotFound".into())) }).await;
    controller.abort();
}
