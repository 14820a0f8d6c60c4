//! The asynchronous Update controller on the test bed: Updates are dispatched to the Workspace's agent
//! without holding a reconcile, complete with PKO's conditions, and expire after `ttlAfterCompleted`.

mod common;

use std::sync::Arc;

use common::*;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Patch, PatchParams};
use pko_api::{Update, Workspace};
use pko_operator::agents::tokens::AgentTokens;
use pko_operator::context::Context;
use pko_operator::informer::Informers;
use pko_operator::ownership::Namespaces;
use pko_operator::update::controller::UpdateController;
use pko_testbed::{eventually, testbed};

/// Runs `controller` alone, watching `namespace`.
fn spawn_update_controller(
    client: &kube::Client,
    namespace: &str,
    controller: UpdateController,
) -> tokio::task::JoinHandle<()> {
    let mut informers = Informers::new(client.clone(), scoped(namespace));
    let run = controller.run(&mut informers);
    tokio::spawn(informers.drive(run))
}
use serde_json::json;

/// A Workspace running the program in `dir` for `stack` on the test's file:// backend.
fn local_workspace(name: &str, dir: &std::path::Path, env: &pko_testbed::PulumiEnv, stack: &str) -> serde_json::Value {
    json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Workspace", "metadata": {"name": name},
           "spec": {"local": {"dir": dir.display().to_string()},
                    "env": [{"name": "PULUMI_BACKEND_URL", "value": env.backend_url()},
                        {"name": "PULUMI_CONFIG_PASSPHRASE", "value": pko_testbed::PulumiEnv::PASSPHRASE}],
                    "stacks": [{"name": stack, "create": true}]}})
}

/// Points Workspace `name` at an agent started by the test, observed at its generation, as the
/// Workspace controller would (none runs here).
async fn set_agent_address(ns: &pko_testbed::TestNamespace, name: &str, address: &str) {
    let generation = ns.api::<Workspace>().get(name).await.unwrap().metadata.generation;
    let status = json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Workspace",
                        "status": {"address": address, "observedGeneration": generation}});
    ns.api::<Workspace>()
        .patch_status(name, &PatchParams::apply("tests").force(), &Patch::Apply(status))
        .await
        .unwrap();
}

#[tokio::test]
async fn updates_are_dispatched_completed_and_expired() {
    let bed = testbed();
    let client = bed.client().await.unwrap();
    pko_testbed::install_crds(&client, pko_api::crds()).await.unwrap();
    let ns = bed.namespace("updctl").await.unwrap();
    let env = bed.pulumi_env().unwrap();
    let agent = start_agent(&env, ns.name());
    let dir = project(
        &env,
        "ctl",
        "resources:\n  a:\n    type: command:local:Command\n    properties:\n      create: echo ok\noutputs:\n  out: \
            ${a.stdout}\n",
    );
    create(&ns.api::<Workspace>(), local_workspace("ws", &dir, &env, "dev")).await;
    let ctx = Arc::new(Context::new(client.clone(), String::new(), Arc::new(Namespaces::one(ns.name()))));
    let controller = spawn_update_controller(&client, ns.name(), UpdateController::new(ctx, 8));
    let updates = ns.api::<Update>();

    // no agent address yet: the Update waits
    create(
        &updates,
        owned_update(
            &ns.api::<Workspace>(),
            json!({"apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Update", "metadata": {"name": "u1"}, "spec": {"workspaceName": "ws", "stackName": "dev", "type": "up",
            "ttlAfterCompleted": "3s"}}),
        )
        .await,
    )
    .await;
    eventually("u1 waits for the workspace", 20, || async {
        condition(&updates.get("u1").await.unwrap(), "Progressing")
            == Some(("False".into(), "WorkspaceNotReady".into()))
    })
    .await;
    // the workspace becomes ready (by hand: this test runs no Workspace controller)
    set_agent_address(&ns, "ws", &agent.1).await;
    eventually("u1 completes", 60, || async {
        condition(&updates.get("u1").await.unwrap(), "Complete") == Some(("True".into(), "Updated".into()))
    })
    .await;
    assert_eq!(updates.get("u1").await.unwrap().status.unwrap().outputs.as_deref(), Some("u1-stack-outputs"));
    // ttlAfterCompleted: 3s
    eventually("u1 expires", 30, || async { updates.get_opt("u1").await.unwrap().is_none() }).await;

    // a missing workspace (its owner a Workspace that exists)
    let mut u2 = owned_update(
        &ns.api::<Workspace>(),
        json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update", "metadata": {"name": "u2"},
            "spec": {"workspaceName": "ws", "stackName": "dev", "type": "preview"}}),
    )
    .await;
    u2["spec"]["workspaceName"] = json!("nope");
    create(&updates, u2).await;
    // PKO's `isOrphaned`: an Update created by hand with no controller owner is canceled, never run
    create(
        &updates,
        json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update", "metadata": {"name": "orphan"},
            "spec": {"workspaceName": "ws", "stackName": "dev", "type": "up"}}),
    )
    .await;
    eventually("the orphan is canceled", 20, || async {
        let u = updates.get("orphan").await.unwrap();
        condition(&u, "Failed") == Some(("True".into(), "Canceled".into()))
            && condition(&u, "Complete") == Some(("True".into(), "Failed".into()))
    })
    .await;
    assert!(updates.get("orphan").await.unwrap().status.unwrap().start_time.is_none(), "never started");
    eventually("u2 waits", 20, || async {
        condition(&updates.get("u2").await.unwrap(), "Progressing")
            == Some(("False".into(), "WorkspaceNotFound".into()))
    })
    .await;
    controller.abort();
}

/// `--max-operations-per-class 1`: two Workspaces of one class (same namespace, service account, image,
/// pod template), each with its own agent — their Updates run one after the other, and both complete.
#[tokio::test]
async fn a_workspace_class_limit_serialises_its_operations() {
    let (client, ns, env) = setup("class").await;
    let dir = project(
        &env,
        "cls",
        "resources:\n  a:\n    type: command:local:Command\n    properties:\n      create: sleep 3\n",
    );
    let ctx = Arc::new(Context::new(client.clone(), String::new(), Arc::new(Namespaces::one(ns.name()))));
    let controller = spawn_update_controller(&client, ns.name(), UpdateController::new(ctx, 8).with_class_limit(1));
    let agents = [start_agent(&env, ns.name()), start_agent(&env, ns.name())];
    for (ws, agent) in ["a", "b"].iter().zip(&agents) {
        create(&ns.api::<Workspace>(), local_workspace(ws, &dir, &env, &format!("s-{ws}"))).await;
        set_agent_address(&ns, ws, &agent.1).await;
    }
    let updates = ns.api::<Update>();
    // the one waiting says why, on its own status (what `kubectl pko status` shows)
    let said = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (updates, said) = (updates.clone(), said.clone());
        tokio::spawn(async move {
            for _ in 0..600 {
                for u in updates.list(&Default::default()).await.map(|l| l.items).unwrap_or_default() {
                    if u.queued_message().is_some_and(|m| m.contains("workspace class") && m.contains("its limit is 1"))
                    {
                        said.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        })
    };
    for ws in ["a", "b"] {
        let update = json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update", "metadata": {"name": ws},
            "spec": {"workspaceName": ws, "stackName": format!("s-{ws}"), "type": "up"}});
        create(&updates, owned_update(&ns.api::<Workspace>(), update).await).await;
    }
    eventually("both Updates complete", 120, || async {
        let mut done = 0;
        for ws in ["a", "b"] {
            if condition(&updates.get(ws).await.unwrap(), "Complete") == Some(("True".into(), "Updated".into())) {
                done += 1;
            }
        }
        done == 2
    })
    .await;
    let span = |u: Update| {
        let st = u.status.unwrap();
        (st.start_time.unwrap().0, st.end_time.unwrap().0)
    };
    let (a, b) = (span(updates.get("a").await.unwrap()), span(updates.get("b").await.unwrap()));
    assert!(b.0 >= a.1 || a.0 >= b.1, "the two operations overlapped: a {a:?}, b {b:?}");
    watcher.abort();
    assert!(
        said.load(std::sync::atomic::Ordering::SeqCst),
        "the Update waiting for its class said so (Progressing=False Queued)"
    );
    controller.abort();
}

/// Agents that authenticate callers (`--auth kube`, as in pods): the Update controller presents a
/// TokenRequest token of its service account for the Workspace's audience. The account allowed to
/// `use` `workspaces/rpc` gets its Update run; one without that permission is refused and retried.
#[tokio::test]
async fn agents_with_kube_auth_accept_the_operators_service_account_token() {
    let (client, ns, env) = setup("tokens").await;
    let dir = project(
        &env,
        "tok",
        "resources:\n  a:\n    type: command:local:Command\n    properties:\n      create: echo \
            authenticated\noutputs:\n  out: ${a.stdout}\n",
    );
    for sa in ["operator", "stranger"] {
        create(
            &ns.api::<ServiceAccount>(),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}}),
        )
        .await;
    }
    create(
        &ns.api::<Role>(),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "workspace-rpc"},
        "rules": [{"apiGroups": ["auto.pulumi.com"], "resources": ["workspaces/rpc"], "verbs": ["use"]}]}),
    )
    .await;
    create(
        &ns.api::<RoleBinding>(),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "operator-rpc"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "workspace-rpc"},
        "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns.name()}]}),
    )
    .await;
    let audience = pko_proto::workspace_audience(ns.name(), "ws");
    let agent = start_agent_with(
        &env,
        &[
            "--auth",
            "kube",
            "--kube-audience",
            &audience,
            "--kube-workspace-namespace",
            ns.name(),
            "--kube-workspace-name",
            "ws",
        ],
    );
    create(&ns.api::<Workspace>(), local_workspace("ws", &dir, &env, "dev")).await;
    set_agent_address(&ns, "ws", &agent.1).await;
    let updates = ns.api::<Update>();

    // a service account without `use` on workspaces/rpc is refused
    let ctx = Arc::new(Context::new(client.clone(), String::new(), Arc::new(Namespaces::one(ns.name()))));
    let stranger = spawn_update_controller(
        &client,
        ns.name(),
        UpdateController::new(ctx.clone(), 2).with_agent_tokens(AgentTokens::new(
            client.clone(),
            ns.name(),
            "stranger",
        )),
    );
    create(
        &updates,
        owned_update(
            &ns.api::<Workspace>(),
            json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update", "metadata": {"name": "u"},
                "spec": {"workspaceName": "ws", "stackName": "dev", "type": "up"}}),
        )
        .await,
    )
    .await;
    eventually("the stranger's call is refused", 60, || async {
        let u = updates.get("u").await.unwrap();
        condition(&u, "Progressing").is_some_and(|(s, r)| s == "False" && r == "TransientFailure")
            && u.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.message.contains(":stranger may not use workspaces/rpc"))
    })
    .await;
    stranger.abort();

    // the operator's own account may: the same Update now runs
    let operator = spawn_update_controller(
        &client,
        ns.name(),
        UpdateController::new(ctx, 2).with_agent_tokens(AgentTokens::new(client.clone(), ns.name(), "operator")),
    );
    eventually("the Update completes with the operator's token", 90, || async {
        condition(&updates.get("u").await.unwrap(), "Complete") == Some(("True".into(), "Updated".into()))
    })
    .await;
    operator.abort();
}

/// The guard every write decided on a cached read relies on (`k8s::apply_status_versioned` with a
/// `resourceVersion`, used by the Stack controller's pinned status write and the worker's first write
/// of a claimed Update): against the real API server, a status apply pinned to a version the object has
/// moved past is refused with 409 and writes nothing; pinned to the current version it is written and
/// returns the new version; unpinned it always writes.
#[tokio::test]
async fn a_status_write_pinned_to_a_stale_version_is_refused_and_writes_nothing() {
    let (_client, ns, _env) = setup("pinned").await;
    let updates = ns.api::<Update>();
    create(
        &updates,
        json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update", "metadata": {"name": "u"},
            "spec": {"workspaceName": "w", "stackName": "dev", "type": "up"}}),
    )
    .await;
    let cached = updates.get("u").await.unwrap();
    let seen = cached.metadata.resource_version.clone();
    let manager = pko_api::constants::field_manager::UPDATE_STATUS;
    let status = |message: &str| pko_api::update::UpdateStatus { message: Some(message.into()), ..Default::default() };
    // someone else's write after our read moves the object on
    let moved = pko_operator::k8s::apply_status_versioned(&updates, "u", "someone-else", &status("theirs"), None)
        .await
        .unwrap();
    assert!(moved.is_some() && moved != seen, "an unpinned write always lands, with a new version");
    let stale = pko_operator::k8s::apply_status_versioned(
        &updates,
        "u",
        manager,
        &status("ours, decided on the cached read"),
        seen.as_deref(),
    )
    .await;
    assert!(
        stale.as_ref().is_err_and(pko_operator::k8s::is_conflict),
        "a write pinned to a stale version is refused with 409: {stale:?}"
    );
    let stored = updates.get("u").await.unwrap();
    assert_eq!(
        stored.status.as_ref().and_then(|s| s.message.as_deref()),
        Some("theirs"),
        "nothing of the refused write was stored"
    );
    assert_eq!(stored.metadata.resource_version, moved, "the refused write did not move the object");
    let current = pko_operator::k8s::apply_status_versioned(
        &updates,
        "u",
        manager,
        &status("ours, on the stored version"),
        moved.as_deref(),
    )
    .await
    .unwrap();
    let stored = updates.get("u").await.unwrap();
    assert_eq!(
        (stored.status.and_then(|s| s.message), stored.metadata.resource_version),
        (Some("ours, on the stored version".to_string()), current),
        "a write pinned to the current version lands"
    );
}
