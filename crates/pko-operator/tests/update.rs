//! An Update runs on a real agent (the `pko-agent` binary) against the test bed, its status and outputs
//! Secret are written as PKO does, and a dispatcher that dies mid-operation re-attaches instead of
//! aborting. The Update is marked started before `Run` is sent, and `Run` carries the fence deadline
//! the agent enforces.

mod common;

use std::time::Duration;

use common::*;

use k8s_openapi::api::core::v1::Secret;
use pko_api::{Update, Workspace};
use pko_operator::outputs;
use pko_operator::update::dispatch;
use pko_proto::v1::ResultStatus;
use pko_testbed::testbed;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_runs_on_an_agent_and_reattaches_after_a_dispatcher_crash() {
    let bed = testbed();
    let client = bed.client().await.unwrap();
    pko_testbed::install_crds(&client, pko_api::crds()).await.unwrap();
    let ns = bed.namespace("update").await.unwrap();
    let env = bed.pulumi_env().unwrap();
    let agent = start_agent(&env, ns.name());
    create(
        &ns.api::<Secret>(),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "passphrase"},
        "stringData": {"value": pko_testbed::PulumiEnv::PASSPHRASE}}),
    )
    .await;

    let marker = env.dir().join("runs.txt");
    let dir = project(
        &env,
        "upd",
        &format!(
            "config:\n  greeting:\n    type: string\n  pw:\n    type: string\n    secret: true\nresources:\n  a:\n    \
                type: command:local:Command\n    properties:\n      create: sleep 3; echo run >> {}; echo \
                ${{greeting}}\n  s:\n    type: command:local:Command\n    properties:\n      create: echo \
                ${{pw}}\noutputs:\n  greeting: ${{a.stdout}}\n  password: ${{s.stdout}}\n",
            marker.display()
        ),
    );
    let workspace: Workspace = create(
        &ns.api::<Workspace>(),
        json!({
            "apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Workspace", "metadata": {"name": "ws"},
            "spec": {
                "local": {"dir": dir.display().to_string()},
                "env": [
                    {"name": "PULUMI_BACKEND_URL", "value": env.backend_url()},
                    {"name": "PULUMI_CONFIG_PASSPHRASE", "valueFrom": {"secretKeyRef": {"name": "passphrase",
                        "key": "value"}}}
                ],
                "stacks": [{"name": "dev", "create": true, "config": [{"key": "greeting", "value": "hello"},
                    {"key": "pw", "value": "pa55-word", "secret": true}]}]
            }
        }),
    )
    .await;
    let updates = ns.api::<Update>();
    let update: Update = create(
        &updates,
        owned_update(
            &ns.api::<pko_api::Workspace>(),
            json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update", "metadata": {"name": "u1"},
                "spec": {"workspaceName": "ws", "stackName": "dev", "type": "up"}}),
        )
        .await,
    )
    .await;

    // The dispatcher dies while the operation runs (the operator is killed) ...
    let task = {
        let (client, agent, update, workspace) = (client.clone(), agent.1.clone(), update.clone(), workspace.clone());
        tokio::spawn(async move { dispatch_on(&client, &agent, &update, &workspace, &held()).await })
    };
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if condition(&updates.get("u1").await.unwrap(), "Progressing") == Some(("True".into(), "Progressing".into())) {
            break;
        }
        assert!(tokio::time::Instant::now() < end, "never Progressing");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    task.abort();
    // ... and a new one re-attaches to the same operation.
    let current = updates.get("u1").await.unwrap();
    let result = dispatch_on(&client, &agent.1, &current, &workspace, &held()).await.unwrap();
    assert_eq!(result.status, ResultStatus::Succeeded as i32, "{}", result.message);
    assert_eq!(std::fs::read_to_string(&marker).unwrap().lines().count(), 1, "the program ran once");

    let done = updates.get("u1").await.unwrap();
    assert_eq!(condition(&done, "Complete"), Some(("True".into(), "Updated".into())));
    assert_eq!(condition(&done, "Failed"), Some(("False".into(), "UpdateSucceeded".into())), "not Aborted");
    assert_eq!(condition(&done, "Progressing"), Some(("False".into(), "Complete".into())));
    let st = done.status.clone().unwrap();
    assert!(st.start_time.is_some() && st.end_time.is_some());
    assert_eq!(st.project_info.unwrap().name.as_deref(), Some("upd"));
    assert_eq!(st.outputs.as_deref(), Some("u1-stack-outputs"));

    let secret = ns.api::<Secret>().get("u1-stack-outputs").await.unwrap();
    assert_eq!(secret.immutable, Some(true));
    assert_eq!(secret.metadata.owner_references.as_ref().unwrap()[0].name, "u1");
    let shown = outputs::stack_outputs(&secret);
    assert_eq!(shown["greeting"], json!("hello"));
    assert_eq!(shown["password"], json!("[secret]"));
    assert!(!serde_json::to_string(&done).unwrap().contains("pa55-word"), "no secret in the Update");

    // a failing program: Failed=True with the engine's reason
    let bad = project(
        &env,
        "bad",
        "resources:\n  f:\n    type: command:local:Command\n    properties:\n      create: exit 3\n",
    );
    let mut ws2 = workspace.clone();
    ws2.spec.local = Some(pko_api::workspace::LocalSource { dir: Some(bad.display().to_string()) });
    let u2: Update = create(
        &updates,
        owned_update(
            &ns.api::<pko_api::Workspace>(),
            json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update", "metadata": {"name": "u2"},
                "spec": {"workspaceName": "ws", "stackName": "dev2", "type": "up"}}),
        )
        .await,
    )
    .await;
    let r = dispatch_on(&client, &agent.1, &u2, &ws2, &held()).await.unwrap();
    assert_eq!(r.status, ResultStatus::Failed as i32);
    let u2 = updates.get("u2").await.unwrap();
    assert_eq!(condition(&u2, "Failed"), Some(("True".into(), "Unknown".into())), "PKO's reason for an engine failure");
    let message = u2.status.unwrap().message.unwrap();
    assert!(
        message.starts_with("up failed: ") && message.contains("exit"),
        "the error reaches the Update as PKO words it: {message}"
    );

    // marked started before any agent has it: at the moment `Run` is sent (its fence deadline is
    // asked then), the Update in the API server is already Progressing with a start time — so a
    // dispatcher killed right after the call leaves an Update its successor knows to look for
    let u4: Update = create(
        &updates,
        owned_update(
            &ns.api::<pko_api::Workspace>(),
            json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update",
            "metadata": {"name": "u4"}, "spec": {"workspaceName": "ws", "stackName": "dev4",
                "type": "preview"}}),
        )
        .await,
    )
    .await;
    let at_run = std::sync::Arc::new(std::sync::Mutex::new(None));
    let probe = {
        let (at_run, updates) = (at_run.clone(), updates.clone());
        move || {
            let u =
                tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(updates.get("u4"))).unwrap();
            *at_run.lock().unwrap() = Some((u.was_started(), condition(&u, "Progressing")));
            None
        }
    };
    // (its stack lacks the project's config: the preview fails, which does not matter here)
    dispatch_on(&client, &agent.1, &u4, &workspace, &TestHold { fenced: false, not_after: probe }).await.unwrap();
    assert_eq!(
        at_run.lock().unwrap().clone(),
        Some((true, Some(("True".into(), "Progressing".into())))),
        "the Update as it was when Run was sent"
    );

    // the deadline reaches the agent: a Run sent past it (its sender frozen right after its last
    // check) is refused and starts nothing
    let u5: Update = create(
        &updates,
        owned_update(
            &ns.api::<pko_api::Workspace>(),
            json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update",
            "metadata": {"name": "u5"}, "spec": {"workspaceName": "ws", "stackName": "dev5",
                "type": "preview"}}),
        )
        .await,
    )
    .await;
    let past = || Some(std::time::SystemTime::now() - Duration::from_secs(1));
    let r = dispatch_on(&client, &agent.1, &u5, &workspace, &TestHold { fenced: false, not_after: past }).await;
    assert!(matches!(&r, Err(dispatch::DispatchError::Agent(_, m)) if m.contains("hold on the shard lapsed")), "{r:?}");

    // fenced from the start (the shard moved, or this replica was frozen past its deadline): nothing
    // runs, and nothing is written to the Update
    let u3: Update = create(
        &updates,
        owned_update(
            &ns.api::<pko_api::Workspace>(),
            json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update",
            "metadata": {"name": "u3"}, "spec": {"workspaceName": "ws", "stackName": "dev3",
                "type": "preview"}}),
        )
        .await,
    )
    .await;
    let r = dispatch_on(&client, &agent.1, &u3, &workspace, &TestHold { fenced: true, not_after: || None }).await;
    assert!(matches!(r, Err(dispatch::DispatchError::Fenced(_))), "{r:?}");
    assert!(updates.get("u3").await.unwrap().status.is_none(), "a fenced dispatcher writes nothing");
}
