//! End to end on the test bed: Program + Stack → the Program, Workspace (local runtime), Update and Stack
//! controllers run a real `pulumi up` through a real agent; the Stack becomes Ready with its outputs
//! (secrets masked); deleting it with `destroyOnFinalize` runs the program's delete.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::DeleteParams;
use pko_api::{Program, Stack};
use pko_testbed::{eventually, testbed};
use serde_json::json;

fn ready(s: &Stack) -> Option<(String, String)> {
    s.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.reason.clone()))
}

#[tokio::test]
async fn program_stack_becomes_ready_and_is_destroyed_on_delete() {
    let (client, ns, env) = setup("e2e").await;
    let marker = env.dir().join("destroyed.txt");

    let op = InProcessOperator::start(&client, &env, ns.name()).await;
    // PKO's RBAC only: the workspace's service account (`default`) has no Role, and may not read the
    // Stack's Secrets or ConfigMaps — the operator resolves every reference (envRefs, secretsRef,
    // Workspace env valueFrom) with its own identity, in the Stack's namespace
    for resource in ["secrets", "configmaps"] {
        let out = testbed()
            .kubectl()
            .args([
                "auth",
                "can-i",
                "get",
                resource,
                "-n",
                ns.name(),
                "--as",
                &format!("system:serviceaccount:{}:default", ns.name()),
            ])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "no",
            "the workspace's service account may not get {resource}"
        );
    }
    create(
        &ns.api::<k8s_openapi::api::core::v1::ConfigMap>(),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings"}, "data": {"region": "eu-west-9"}}),
    )
    .await;
    create(
        &ns.api::<k8s_openapi::api::core::v1::ConfigMap>(),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "zones"}, "data": {"zone": "z1",
            "region": "overridden", "1st": "skipped, as the kubelet does"}}),
    )
    .await;
    create(
        &ns.api::<Secret>(),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pulumi"},
            "stringData": {"passphrase": pko_testbed::PulumiEnv::PASSPHRASE, "apiKey": "k3y-Secret-val"}}),
    )
    .await;
    create(
        &ns.api::<Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "hello"},
        "program": {
            "configuration": {"greeting": {"type": "String"}, "apiKey": {"type": "String"}},
            "resources": {
                "greet": {"type": "command:local:Command", "properties": {"create": "echo ${greeting}",
                    "delete": format!("echo destroyed > {}", marker.display())}},
                "key": {"type": "command:local:Command", "properties": {"create": "echo ${apiKey}"}},
                // Workspace env (key refs, the downward API) and Stack envs/envSecrets (envFrom) reach the program
                "env": {"type": "command:local:Command", "properties": {"create": format!(
                    "test \"$FROM_SECRET\" = k3y-Secret-val && test \"$apiKey\" = k3y-Secret-val && test \"$zone\" = \
                        z1 && test \"$MY_NS\" = {} && test \"$MY_SA\" = default && test \"$region\" = overridden && \
                            echo \"$FROM_CM\"",
                    ns.name())}}
            },
            "outputs": {"message": "${greet.stdout}", "key": "${key.stdout}", "fromEnv": "${env.stdout}"}
        }}),
    )
    .await;
    create(
        &ns.api::<Stack>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "hello"},
               "spec": {"stack": "dev", "programRef": {"name": "hello"}, "backend": env.backend_url(),
                   "destroyOnFinalize": true,
                        "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret", "secret": {"name": "pulumi",
                            "key": "passphrase"}}},
                        "config": {"greeting": "bonjour"},
                        "envs": ["settings", "zones"],
                        "envSecrets": ["pulumi"],
                        "secretsRef": {"apiKey": {"type": "Secret", "secret": {"name": "pulumi", "key": "apiKey"}}},
                        "workspaceTemplate": {"spec": {"env": [
                            {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "settings",
                                "key": "region"}}},
                            {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "pulumi", "key": "apiKey"}}},
                            {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                            {"name": "MY_SA",
                                "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}}]}}}}),
    )
    .await;
    let stacks = ns.api::<Stack>();
    let t0 = std::time::Instant::now();
    let end = tokio::time::Instant::now() + Duration::from_secs(120);
    while ready(&stacks.get("hello").await.unwrap()) != Some(("True".into(), "ProcessingCompleted".into())) {
        if tokio::time::Instant::now() > end {
            let out = testbed()
                .kubectl()
                .args(["get", "stacks,workspaces,updates,programs", "-n", ns.name(), "-o", "yaml"])
                .output()
                .unwrap();
            panic!("the Stack is not Ready after 120 s:\n{}", String::from_utf8_lossy(&out.stdout));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    eprintln!("apply → Ready: {:?}", t0.elapsed());
    let s = stacks.get("hello").await.unwrap();
    let st = s.status.clone().unwrap();
    assert_eq!(st.outputs.as_ref().unwrap()["message"], json!("bonjour"));
    assert_eq!(st.outputs.as_ref().unwrap()["key"], json!("[secret]"), "secret outputs are masked");
    assert_eq!(
        st.outputs.as_ref().unwrap()["fromEnv"],
        json!("eu-west-9"),
        "Workspace env from a ConfigMap and a Secret"
    );
    let last = st.last_update.clone().unwrap();
    assert_eq!(last.message, None, "PKO leaves the message of a success empty");
    assert_eq!(
        (last.update_type, last.state, last.last_successful_commit.as_deref()),
        (Some(pko_api::UpdateType::Up), Some(pko_api::stack::StackUpdateStateMessage::Succeeded), Some("1"))
    );
    assert!(st.current_update.is_none());
    assert_eq!(st.project_info.unwrap().name.as_deref(), Some("hello"));
    assert!(s.finalizers().iter().any(|f| f == pko_api::constants::STACK_FINALIZER));
    assert!(!serde_json::to_string(&s).unwrap().contains("k3y-Secret-val"), "no secret value in the Stack");
    // PKO's Workspace status.pulumiVersion: the CLI that ran the operation, as semver
    let cli = std::process::Command::new("pulumi").arg("version").env_clear().envs(env.vars()).output().unwrap();
    let want = String::from_utf8_lossy(&cli.stdout).trim().trim_start_matches('v').to_string();
    assert!(want.starts_with("3."), "pulumi version: {want}");
    eventually("the Workspace reports its Pulumi version", 30, || async {
        ns.api::<pko_api::Workspace>().get("hello").await.unwrap().status.and_then(|w| w.pulumi_version).as_deref()
            == Some(want.as_str())
    })
    .await;
    // PKO's events on the Stack and its Update (published after the status writes they follow)
    let events = ns.api::<k8s_openapi::api::events::v1::Event>();
    let reasons = || async {
        let items = events.list(&Default::default()).await.unwrap().items;
        items
            .iter()
            .map(|e| {
                (
                    e.regarding.as_ref().and_then(|r| r.kind.clone()).unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                )
            })
            .collect::<Vec<(String, String)>>()
    };
    for want in [("Stack", "StackUpdateDetected"), ("Stack", "StackCreated"), ("Update", "UpdateSucceeded")] {
        eventually(&format!("event {want:?}"), 30, || async {
            reasons().await.iter().any(|(k, r)| k == want.0 && r == want.1)
        })
        .await;
    }
    // in PKO's words
    let notes: Vec<(String, String)> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect();
    for want in [("UpdateSucceeded", r#"Updated stack "dev""#), ("StackUpdateDetected", "Initial stack update")] {
        assert!(notes.iter().any(|(r, n)| r == want.0 && n == want.1), "{want:?} not among {notes:?}");
    }

    stacks.delete("hello", &DeleteParams::background()).await.unwrap();
    eventually("the Stack is finalized and gone", 120, || async { stacks.get_opt("hello").await.unwrap().is_none() })
        .await;
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap().trim(),
        "destroyed",
        "destroyOnFinalize ran the program's delete"
    );
    drop(op);
}

/// Bad sources and specs are reported as PKO does: Stalled `SourceUnavailable` / `SpecInvalid`, with a
/// message naming what is wrong, and Ready=False `NotReadyStalled`.
#[tokio::test]
async fn unavailable_sources_and_invalid_specs_stall_the_stack() {
    let (client, ns, _env) = setup("stall").await;
    let task = start_stack_controller(&client, ns.name());
    let stacks = ns.api::<Stack>();
    let stack = |name: &str, spec: serde_json::Value| {
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack",
        "metadata": {"name": name}, "spec": spec})
    };
    create(&stacks, stack("no-program", json!({"stack": "dev", "programRef": {"name": "missing"}}))).await;
    create(
        &stacks,
        stack("bad-repo", json!({"stack": "dev", "projectRepo": "git://127.0.0.1:1/nothing.git", "branch": "main"})),
    )
    .await;
    create(
        &stacks,
        stack(
            "env-ref",
            json!({"stack": "dev", "projectRepo": "https://git.example.invalid/r.git",
                "commit": "0123456789abcdef0123456789abcdef01234567",
                                "envRefs": {"TOKEN": {"type": "Env", "env": {"name": "HOME"}}}}),
        ),
    )
    .await;
    create(&stacks, stack("no-source", json!({"stack": "dev"}))).await;
    // accepted at admission as PKO's CRD does, judged by the controller in PKO's words
    create(&stacks, stack("no-ref", json!({"stack": "dev", "projectRepo": "https://git.example.invalid/r.git"}))).await;
    create(
        &stacks,
        stack(
            "both-refs",
            json!({"stack": "dev", "projectRepo": "https://git.example.invalid/r.git",
            "commit": "0123456789abcdef0123456789abcdef01234567", "branch": "main"}),
        ),
    )
    .await;
    create(
        &stacks,
        stack(
            "git-wins",
            json!({"stack": "dev", "projectRepo": "git://127.0.0.1:1/nothing.git",
        "branch": "main", "programRef": {"name": "missing"}}),
        ),
    )
    .await;
    // a service account name that cannot exist: judged before any request names it
    create(
        &stacks,
        stack(
            "bad-sa",
            json!({"stack": "dev", "projectRepo": "https://git.example.invalid/r.git",
                "commit": "0123456789abcdef0123456789abcdef01234567",
                               "workspaceTemplate": {"spec": {"serviceAccountName": "../x"}}}),
        ),
    )
    .await;
    // unusable git sources with a pinned commit (nothing to ls-remote): judged before any Workspace
    let pinned = "0123456789abcdef0123456789abcdef01234567";
    create(
        &stacks,
        stack("bad-url", json!({"stack": "dev", "projectRepo": "https:/github.com/o/r", "commit": pinned})),
    )
    .await;
    create(
        &stacks,
        stack(
            "no-secret",
            json!({"stack": "dev", "projectRepo": "https://git.example.invalid/r.git", "commit": pinned,
                   "gitAuth": {"accessToken": {"type": "Secret", "secret": {"name": "absent", "key": "token"}}}}),
        ),
    )
    .await;
    let want = [
        ("bad-url", "SpecInvalid", r#"parsing "https:/github.com/o/r": invalid Git URL"#),
        ("no-secret", "SpecInvalid", &format!(r#"unable to get secret {}/absent"#, ns.name())),
        ("no-program", "SourceUnavailable", "unable to retrieve program for stack (program missing not found)"),
        ("bad-repo", "SourceUnavailable", "resolving branch main"),
        ("env-ref", "SpecInvalid", "spec.envRefs.TOKEN"),
        ("no-ref", "SpecInvalid", r#"missing "commit" or "branch""#),
        ("both-refs", "SpecInvalid", r#"only one of "commit" or "branch" should be specified"#),
        ("git-wins", "SourceUnavailable", "resolving branch main"),
        (
            "bad-sa",
            "SpecInvalid",
            r#"spec.workspaceTemplate.spec.serviceAccountName: "../x" is not a valid service account name"#,
        ),
    ];
    for (name, reason, text) in want {
        eventually(&format!("{name} stalls with {reason}"), 60, || async {
            stalled(&stacks.get(name).await.unwrap()).is_some_and(|(r, m)| r == reason && m.contains(text))
        })
        .await;
        assert_eq!(ready(&stacks.get(name).await.unwrap()), Some(("False".into(), "NotReadyStalled".into())));
    }
    // PKO's "fetch the source yourself" Stack: a source-less Workspace is made and waited for, never
    // a stall (its pod's init container brings the program; no Workspace controller runs here)
    eventually("no-source waits for its Workspace", 60, || async {
        reconciling(&stacks.get("no-source").await.unwrap())
            .is_some_and(|(r, m)| r == "StackProcessing" && m.starts_with("waiting for workspace readiness"))
    })
    .await;
    assert!(
        !ns.api::<pko_api::Workspace>().get("no-source").await.unwrap().spec.has_source(),
        "a Workspace without a source"
    );
    for name in ["bad-sa", "bad-url", "no-secret", "no-ref", "both-refs"] {
        assert!(
            ns.api::<pko_api::Workspace>().get_opt(name).await.unwrap().is_none(),
            "no Workspace for a spec that cannot run: {name}"
        );
    }
    assert!(
        ns.api::<pko_api::Update>().list(&Default::default()).await.unwrap().items.is_empty(),
        "no Update for a spec that cannot run"
    );
    // PKO's Warning StackConfigInvalid, once per stall (the pass repeats every 30 s)
    let events = ns.api::<k8s_openapi::api::events::v1::Event>();
    for name in ["bad-url", "no-secret", "no-ref", "both-refs"] {
        eventually(&format!("a StackConfigInvalid event for {name}"), 30, || async {
            events.list(&Default::default()).await.unwrap().items.iter().any(|e| {
                e.reason.as_deref() == Some("StackConfigInvalid")
                    && e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
        })
        .await;
    }
    // a Stack that never ran has nothing to destroy: deleting it does not wait for its (missing) source
    create(
        &stacks,
        stack("never-ran", json!({"stack": "dev", "programRef": {"name": "missing"}, "destroyOnFinalize": true})),
    )
    .await;
    eventually("never-ran stalls", 60, || async { stalled(&stacks.get("never-ran").await.unwrap()).is_some() }).await;
    assert!(
        stacks.get("never-ran").await.unwrap().finalizers().iter().any(|f| f == pko_api::constants::STACK_FINALIZER)
    );
    stacks.delete("never-ran", &DeleteParams::background()).await.unwrap();
    eventually("never-ran is deleted", 30, || async { stacks.get_opt("never-ran").await.unwrap().is_none() }).await;
    task.abort();
}

/// PKO's `examples/custom-source`: a Stack with no source runs the program its Workspace template
/// names (`local.dir`, a program baked into the image; here a directory on the agent's machine), and
/// with nothing new to deploy it stays synced.
#[tokio::test]
async fn a_stack_without_a_source_runs_the_program_of_its_workspace_template() {
    let (client, ns, env) = setup("custom-source").await;
    let destroyed = env.dir().join("destroyed.txt");
    let body = format!(
        "resources:\n  hi:\n    type: command:local:Command\n    properties:\n      create: echo baked in\n      \
            delete: echo gone > {}\noutputs:\n  said: ${{hi.stdout}}\n",
        destroyed.display()
    );
    let dir = project(&env, "baked", &body);
    passphrase_secret(&ns).await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    let stacks = ns.api::<Stack>();
    create(
        &stacks,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "custom"},
               "spec": {"stack": "dev", "backend": env.backend_url(), "destroyOnFinalize": true,
                        "envRefs": passphrase_env_refs(),
                        "workspaceTemplate": {"spec": {"local": {"dir": dir.display().to_string()}}}}}),
    )
    .await;
    eventually("the Stack is Ready", 120, || async {
        ready(&stacks.get("custom").await.unwrap()) == Some(("True".into(), "ProcessingCompleted".into()))
    })
    .await;
    let st = stacks.get("custom").await.unwrap().status.unwrap();
    assert_eq!(st.outputs.unwrap()["said"], json!("baked in"));
    assert_eq!(st.last_update.unwrap().last_successful_commit.as_deref(), Some(""), "PKO's empty commit");
    // synced: no second Update
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(ns.api::<pko_api::Update>().list(&Default::default()).await.unwrap().items.len(), 1, "one Update");
    // deleted with destroyOnFinalize: destroyed from its cached project info, the template's local
    // source replacing it (one source; PKO #1300, fixed by #1327), and the finalizer goes
    stacks.delete("custom", &DeleteParams::background()).await.unwrap();
    eventually("the Stack is destroyed and gone", 120, || async { stacks.get_opt("custom").await.unwrap().is_none() })
        .await;
    assert_eq!(std::fs::read_to_string(&destroyed).unwrap().trim(), "gone", "the destroy ran the resource's delete");
    // no source at all (PKO's "fetch the source yourself"): only a workspace pod's init container can
    // bring the program, so on the local runtime the Workspace says why it is not Ready and the Stack
    // waits with that, never an Update
    create(
        &stacks,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "bare"},
        "spec": {"stack": "dev", "backend": env.backend_url()}}),
    )
    .await;
    eventually("the source-less Stack waits, saying why", 60, || async {
        reconciling(&stacks.get("bare").await.unwrap()).is_some_and(|(r, m)| {
            r == "StackProcessing"
                && m.starts_with("waiting for workspace readiness: NoSource: the Workspace has no source")
        })
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        ns.api::<pko_api::Update>().list(&Default::default()).await.unwrap().items.is_empty(),
        "no Update while the Workspace is not Ready"
    );
    assert!(stalled(&stacks.get("bare").await.unwrap()).is_none(), "never Stalled (PKO)");
}

/// PKO's `spec.environment` (ESC) reaches Pulumi through the operator and the agent
/// (`pulumi config env add`): on a file backend, which has no ESC, the Update fails with Pulumi's own
/// message, naming the environment.
#[tokio::test]
async fn esc_environments_reach_pulumi_and_a_backend_without_esc_says_so() {
    let (client, ns, env) = setup("esc").await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    passphrase_and_program(
        &ns,
        json!({"resources": {"c": {"type": "command:local:Command", "properties": {"create": "echo hi"}}}}),
    )
    .await;
    let stacks = ns.api::<Stack>();
    create(
        &stacks,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "esc"},
               "spec": {"stack": "dev", "programRef": {"name": "prog"}, "backend": env.backend_url(),
                   "envRefs": passphrase_env_refs(), "environment": ["team/prod"]}}),
    )
    .await;
    eventually("the Update fails", 120, || async {
        stacks
            .get("esc")
            .await
            .unwrap()
            .status
            .and_then(|s| s.last_update)
            .is_some_and(|l| l.state == Some(pko_api::stack::StackUpdateStateMessage::Failed))
    })
    .await;
    let message = stacks.get("esc").await.unwrap().status.unwrap().last_update.unwrap().message.unwrap_or_default();
    assert!(
        message.contains("adding ESC environments team/prod") && message.contains("does not support environments"),
        "{message}"
    );
}

/// Many Stacks applied at once each get exactly one Update: a reconcile never decides on a cached copy
/// that lags behind its own `currentUpdate` write (the load test once saw 4 of 100 Stacks updated twice).
#[tokio::test]
async fn many_stacks_applied_at_once_each_run_exactly_one_update() {
    let (client, ns, env) = setup("many").await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    create(
        &ns.api::<Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "p"},
        "program": {"resources": {"c": {"type": "command:local:Command",
            "properties": {"create": "echo ${pulumi.stack}"}}}}}),
    )
    .await;
    const N: usize = 20;
    let stacks = ns.api::<Stack>();
    for i in 0..N {
        create(
            &stacks,
            json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": format!("s{i}")},
            "spec": {"stack": format!("s{i}"), "programRef": {"name": "p"}, "backend": env.backend_url()}}),
        )
        .await;
    }
    eventually("every Stack is Ready", 240, || async {
        stacks
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|s| ready(s).is_some_and(|(st, _)| st == "True"))
            .count()
            == N
    })
    .await;
    let updates = ns.api::<pko_api::Update>().list(&Default::default()).await.unwrap().items;
    let mut per_stack = std::collections::BTreeMap::<String, usize>::new();
    for u in &updates {
        *per_stack.entry(u.labels().get("pulumi.com/stack-name").cloned().unwrap_or_default()).or_default() += 1;
    }
    let twice: Vec<_> = per_stack.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "Stacks with more than one Update: {twice:?}");
    assert_eq!(updates.len(), N);
}

/// A private repository tracked by branch: the operator's own `ls-remote` and the agent's clone both
/// use the Stack's credentials — `gitAuth.accessToken`, or the deprecated `gitAuthSecret` — and a
/// missing credentials Secret stalls the Stack `SpecInvalid`.
#[tokio::test]
async fn private_git_branch_with_gitauth_and_gitauthsecret() {
    let (client, ns, env) = setup("privgit").await;
    let root = env.dir().join("git-root");
    std::fs::create_dir_all(&root).unwrap();
    let program = "name: private\nruntime: yaml\nresources:\n  c:\n    type: command:local:Command\n    \
        properties:\n      create: echo private\noutputs:\n  out: ${c.stdout}\n";
    let commit = pko_testbed::git::bare_repo_with(&root, "app.git", &[("Pulumi.yaml", program)]);
    // an annotated tag: PKO resolves `branch` against every ref, tags included
    let out = std::process::Command::new("git")
        .args(["-c", "user.email=t@e", "-c", "user.name=t", "tag", "-a", "v1", "-m", "release", &commit])
        .current_dir(root.join("app.git"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let token = "tok-private-42";
    let server =
        pko_testbed::git::GitHttpServer::start(&root, "127.0.0.1:0", Some(("git".into(), token.into()))).await.unwrap();

    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    let stacks = ns.api::<Stack>();
    let stack = |name: &str, auth: serde_json::Value| {
        let mut spec = json!({"stack": name, "projectRepo": server.url("app.git"), "branch": "main",
            "backend": env.backend_url()});
        spec.as_object_mut().unwrap().extend(auth.as_object().unwrap().clone());
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name}, "spec": spec})
    };
    create(
        &stacks,
        stack(
            "by-token",
            json!({"gitAuth": {"accessToken": {"type": "Secret", "secret": {"name": "git", "key": "token"}}}}),
        ),
    )
    .await;
    create(&stacks, stack("by-secret", json!({"gitAuthSecret": "git-legacy"}))).await;
    let mut by_tag = stack(
        "by-tag",
        json!({"gitAuth": {"accessToken": {"type": "Secret", "secret": {"name": "git", "key": "token"}}}}),
    );
    by_tag["spec"]["branch"] = json!("v1");
    create(&stacks, by_tag).await;
    eventually("without its Secret, by-token stalls SpecInvalid", 60, || async {
        stalled(&stacks.get("by-token").await.unwrap()).is_some_and(|(r, m)| {
            r == "SpecInvalid"
                && m.contains(r#"/git: secrets "git" not found (git credentials)"#)
                && m.starts_with("unable to get secret ")
        })
    })
    .await;
    eventually("without its Secret, by-secret stalls SpecInvalid", 60, || async {
        stalled(&stacks.get("by-secret").await.unwrap()).is_some_and(|(r, m)| {
            r == "SpecInvalid" && m.contains(r#"/git-legacy: secrets "git-legacy" not found (spec.gitAuthSecret)"#)
        })
    })
    .await;
    create(
        &ns.api::<Secret>(),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "git"}, "stringData": {"token": token}}),
    )
    .await;
    create(
        &ns.api::<Secret>(),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "git-legacy"},
        "stringData": {"accessToken": token}}),
    )
    .await;
    for name in ["by-token", "by-secret", "by-tag"] {
        eventually(&format!("{name} is Ready"), 120, || async {
            ready(&stacks.get(name).await.unwrap()).is_some_and(|(s, _)| s == "True")
        })
        .await;
        let st = stacks.get(name).await.unwrap().status.unwrap();
        assert_eq!(st.outputs.unwrap()["out"], json!("private"));
        assert_eq!(
            st.last_update.unwrap().last_successful_commit.as_deref(),
            Some(commit.as_str()),
            "{name}: the ref was resolved to its commit"
        );
    }
    assert!(
        !serde_json::to_string(&stacks.list(&Default::default()).await.unwrap()).unwrap().contains(token),
        "the token is in no Stack"
    );
}

/// A resource whose outputs are larger than tonic's default 4 MiB message limit (5 MB of stdout, so
/// its engine event is a 5 MB message on the operation stream): the operator accepts messages up to
/// PKO's 400 MiB (#1154) and the Stack converges; with the default limit the stream broke and the
/// operation was retried without end.
#[tokio::test]
async fn an_engine_event_larger_than_4_mib_reaches_the_operator() {
    let (client, ns, env) = setup("bigevent").await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    passphrase_and_program(
        &ns,
        json!({"resources": {"big": {"type": "command:local:Command",
        "properties": {"create": "head -c 5000000 /dev/zero | tr '\\0' a"}}}}),
    )
    .await;
    prog_stack(&ns, &env, "big", json!({})).await;
    let stacks = ns.api::<Stack>();
    eventually("the Stack with a 5 MB engine event is Ready", 180, || async {
        ready(&stacks.get("big").await.unwrap()) == Some(("True".into(), "ProcessingCompleted".into()))
    })
    .await;
}

/// Counter `metric{source}` on `op`'s metrics endpoint (0 before the first count).
async fn reads(op: &InProcessOperator, metric: &str, source: &str) -> f64 {
    let want = format!("{metric}{{source=\"{source}\"}} ");
    op.metrics()
        .await
        .lines()
        .find_map(|l| l.strip_prefix(want.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The Secrets an operation names are read from the API server once, then only when they change
/// (`secret_cache`: a metadata watch says which version is current): a Secret changed between two
/// operations reaches the second at its new value, and an operation after that, with every Secret
/// unchanged, is served from the cache.
#[tokio::test]
async fn a_changed_secret_reaches_the_next_operation_and_an_unchanged_one_is_not_read_again() {
    let (client, ns, env) = setup("secret-reads").await;
    let op = InProcessOperator::start(&client, &env, ns.name()).await;
    passphrase_and_program(
        &ns,
        json!({"configuration": {"want": {"type": "String"}, "n": {"type": "String", "default": "0"}},
               "resources": {"r": {"type": "command:local:Command",
                                   "properties": {"create": "test \"$TOKEN\" = \"${want}\" && echo ok ${n}",
                                       "triggers": ["${want}", "${n}"]}}},
               "outputs": {"out": "${r.stdout}"}}),
    )
    .await;
    let handed_before = reads(&op, "pko_outputs_reads_total", "handed_over").await;
    let secrets = ns.api::<Secret>();
    create(
        &secrets,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tok"}, "stringData": {"value": "one"}}),
    )
    .await;
    let stacks = ns.api::<Stack>();
    create(
        &stacks,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "s"},
               "spec": {"stack": "dev", "programRef": {"name": "prog"}, "backend": env.backend_url(),
                   "envRefs": passphrase_env_refs(),
                        "config": {"want": "one"},
                        "workspaceTemplate": {"spec": {"env": [{"name": "TOKEN",
                            "valueFrom": {"secretKeyRef": {"name": "tok", "key": "value"}}}]}}}}),
    )
    .await;
    let converged = |out: &'static str| {
        let stacks = stacks.clone();
        async move {
            eventually(&format!("the Stack is Ready at its generation with output {out:?}"), 120, || async {
                let s = stacks.get("s").await.unwrap();
                let st = s.status.clone().unwrap_or_default();
                ready(&s) == Some(("True".into(), "ProcessingCompleted".into()))
                    && st.observed_generation == s.metadata.generation
                    && st.outputs.as_ref().and_then(|o| o.get("out")) == Some(&json!(out))
            })
            .await;
        }
    };
    converged("ok 0").await;
    let merge = |v: serde_json::Value| kube::api::Patch::Merge(v);
    secrets.patch("tok", &Default::default(), &merge(json!({"stringData": {"value": "two"}}))).await.unwrap();
    // the watch's lag is an informer's (milliseconds); give it that, so the test asserts the cache's rule
    tokio::time::sleep(Duration::from_secs(1)).await;
    stacks.patch("s", &Default::default(), &merge(json!({"spec": {"config": {"want": "two"}}}))).await.unwrap();
    converged("ok 0").await;
    let updates = ns.api::<pko_api::Update>().list(&Default::default()).await.unwrap().items;
    let failed: Vec<_> = updates
        .iter()
        .filter(|u| condition(u, "Failed").is_some_and(|c| c.0 == "True"))
        .map(|u| u.name_any())
        .collect();
    assert!(failed.is_empty(), "the changed Secret was read at its new value on the first try; failed: {failed:?}");
    let cached_before = reads(&op, "pko_secret_reads_total", "cache").await;
    stacks.patch("s", &Default::default(), &merge(json!({"spec": {"config": {"n": "1"}}}))).await.unwrap();
    converged("ok 1").await;
    let cached = reads(&op, "pko_secret_reads_total", "cache").await - cached_before;
    assert!(cached >= 2.0, "the passphrase and the token, unchanged, came from the cache ({cached} reads)");
    // the outputs of each of its three `up`s were handed to the Stack by the dispatcher that wrote
    // them (the recorder is the test process's: other tests count there too, never less)
    let handed = reads(&op, "pko_outputs_reads_total", "handed_over").await - handed_before;
    assert!(handed >= 3.0, "outputs handed over in memory: {handed}");
    drop(op);
}
