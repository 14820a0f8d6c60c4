//! End to end on the test bed: `spec.prerequisites` (a Stack waits, Reconciling
//! `PrerequisiteNotSatisfied`, until the Stacks it names have succeeded; a stale one is asked to resync
//! through the reconcile-request annotation) and `workspaceReclaimPolicy: Delete` (the Workspace and its
//! agent go after a successful sync, event `WorkspaceDeleted`, and come back for the next one).

mod common;

use std::time::Duration;

use common::*;
use kube::api::{Patch, PatchParams};
use pko_api::{Program, Stack, Workspace};
use pko_testbed::eventually;
use serde_json::json;

#[tokio::test]
async fn prerequisites_gate_updates_and_reclaimed_workspaces_come_back() {
    let (client, ns, env) = setup("prereq").await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    create(
        &ns.api::<Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "p"},
        "program": {"resources": {"c": {"type": "command:local:Command",
            "properties": {"create": "echo ${pulumi.stack}"}}}, "outputs": {"out": "${c.stdout}"}}}),
    )
    .await;
    let stacks = ns.api::<Stack>();
    let workspaces = ns.api::<Workspace>();
    let ready = |name: &'static str| {
        let stacks = stacks.clone();
        async move { stack_condition(&stacks.get(name).await.unwrap(), "Ready").is_some_and(|(s, _, _)| s == "True") }
    };

    // app depends on db, which does not exist yet
    create(
        &stacks,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "app"},
        "spec": {"stack": "app", "programRef": {"name": "p"}, "backend": env.backend_url(),
            "prerequisites": [{"name": "db"}]}}),
    )
    .await;
    eventually("app waits for its missing prerequisite", 60, || async {
        stack_condition(&stacks.get("app").await.unwrap(), "Reconciling").is_some_and(|(s, r, m)| {
            s == "True"
                && r == "PrerequisiteNotSatisfied"
                && m.contains(r#"unable to fetch prerequisite "db": stacks.pulumi.com "db" not found"#)
        })
    })
    .await;
    assert!(
        ns.api::<pko_api::Update>().list(&Default::default()).await.unwrap().items.is_empty(),
        "no update runs before the prerequisite"
    );

    // db appears (and gives its Workspace back after each successful sync); app follows it
    create(
        &stacks,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "db"},
        "spec": {"stack": "db", "programRef": {"name": "p"}, "backend": env.backend_url(),
            "workspaceReclaimPolicy": "Delete"}}),
    )
    .await;
    eventually("db is Ready", 90, || ready("db")).await;
    eventually("app is Ready after db", 90, || ready("app")).await;
    eventually("db's Workspace is reclaimed", 30, || async { workspaces.get_opt("db").await.unwrap().is_none() }).await;
    assert!(workspaces.get_opt("app").await.unwrap().is_some(), "Retain (the default) keeps app's Workspace");
    eventually("the WorkspaceDeleted event (it follows the delete)", 30, || async {
        ns.api::<k8s_openapi::api::events::v1::Event>()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("WorkspaceDeleted"))
    })
    .await;

    // app now wants db to have succeeded within 5 s: db is stale, gets a sync request, runs again (its
    // Workspace recreated), and app proceeds
    tokio::time::sleep(Duration::from_secs(6)).await;
    let db_update = stacks.get("db").await.unwrap().status.unwrap().last_update.unwrap().name.unwrap();
    let patch = json!({"spec": {"prerequisites": [{"name": "db", "requirement": {"succeededWithinDuration": "5s"}}]}});
    let app = stacks.patch("app", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let generation = app.metadata.generation;
    eventually("db is asked to resync", 60, || async {
        stacks
            .get("db")
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default()
            .get("pulumi.com/reconciliation-request")
            == Some(&format!("after-{db_update}"))
    })
    .await;
    eventually("db ran again and app caught up", 120, || async {
        let db = stacks.get("db").await.unwrap().status.unwrap().last_update.unwrap();
        let app = stacks.get("app").await.unwrap();
        db.name.as_deref() != Some(db_update.as_str())
            && db.reconcile_request.as_deref() == Some(&format!("after-{db_update}"))
            && app.status.as_ref().and_then(|s| s.last_update.as_ref()).and_then(|l| l.generation) == generation
            && stack_condition(&app, "Ready").is_some_and(|(s, _, _)| s == "True")
    })
    .await;
}
