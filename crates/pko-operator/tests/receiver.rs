//! Receivers against the real API server, a git server over HTTP and real `pulumi up`s: a GitHub-style signed push
//! hook syncs exactly the Stacks of the pushed repository and branch that the Receiver selects, in its namespace, with
//! the poll out of the way (`resyncFrequencySeconds: 3600`); hostile deliveries (bad or no signature, unknown path,
//! oversized body) wake nothing; a flood of one push costs one Update; the Receiver records the delivery.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use pko_api::{Receiver, Stack, Update};
use pko_testbed::eventually;
use serde_json::json;

const TOKEN: &str = "hook-T0ken-7";

fn program(word: &str) -> String {
    format!(
        "name: app\nruntime: yaml\nresources:\n  r:\n    type: command:local:Command\n    properties:\n      \
         create: echo {word}\noutputs:\n  word: {word}\n"
    )
}

/// Commits `Pulumi.yaml` saying `word` on `main` of bare repository `root/name` (made by `bare_repo_with`); its SHA.
fn push_commit(root: &std::path::Path, name: &str, word: &str) -> String {
    let work = root.join(format!(".work-{name}"));
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git").args(args).current_dir(&work).output().unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    std::fs::write(work.join("Pulumi.yaml"), program(word)).unwrap();
    git(&["-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q", "-am", word]);
    git(&["push", "-q", root.join(name).to_str().unwrap(), "main"]);
    git(&["rev-parse", "HEAD"])
}

fn git_stack(name: &str, repo: &str, labels: serde_json::Value, env: &pko_testbed::PulumiEnv) -> serde_json::Value {
    json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name, "labels": labels},
        "spec": {"stack": name, "backend": env.backend_url(), "projectRepo": repo, "branch": "main",
            "resyncFrequencySeconds": 3600, "envRefs": passphrase_env_refs()}})
}

/// POSTs `body` to the hook `url` as GitHub does (event `push`, signed with `key` unless `None`); the status.
async fn deliver(url: &str, body: &[u8], key: Option<&str>) -> u16 {
    let mut req = reqwest::Client::new().post(url).header("X-GitHub-Event", "push").body(body.to_vec());
    if let Some(k) = key {
        let sig = pko_operator::receiver::verify::sign(k.as_bytes(), body);
        req = req.header("X-Hub-Signature-256", format!("sha256={sig}"));
    }
    req.send().await.unwrap().status().as_u16()
}

fn requested(s: &Stack) -> Option<String> {
    s.metadata.annotations.as_ref()?.get(pko_api::constants::RECONCILE_REQUEST_ANNOTATION).cloned()
}

#[tokio::test]
async fn a_signed_push_hook_syncs_exactly_the_selected_stacks_of_its_repository_and_branch_once() {
    let (client, ns, env) = setup("receiver").await;
    passphrase_secret(&ns).await;
    let repos = env.dir().join("repos");
    std::fs::create_dir_all(&repos).unwrap();
    pko_testbed::git::bare_repo_with(&repos, "app.git", &[("Pulumi.yaml", &program("one"))]);
    pko_testbed::git::bare_repo_with(&repos, "other.git", &[("Pulumi.yaml", &program("other"))]);
    let git = pko_testbed::git::GitHttpServer::start(&repos, "127.0.0.1:0", None).await.unwrap();
    let args = run_args_with(&env, ns.name(), &["--webhook-bind-address", "127.0.0.1:0"]);
    let op = InProcessOperator::start_with(&client, &env, args).await;
    let hook_addr = op.running.as_ref().unwrap().webhook_addr.expect("the hook endpoint serves");
    let stacks = ns.api::<Stack>();
    let web = json!({"tier": "web"});
    create(&stacks, git_stack("app", &git.url("app.git"), web.clone(), &env)).await;
    create(&stacks, git_stack("unselected", &git.url("app.git"), json!({}), &env)).await;
    create(&stacks, git_stack("other", &git.url("other.git"), web.clone(), &env)).await;
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hook"},
        "stringData": {"token": TOKEN}});
    create(&ns.api::<Secret>(), secret).await;
    create(
        &ns.api::<Receiver>(),
        json!({"apiVersion": "pulumi.com/v1alpha1", "kind": "Receiver", "metadata": {"name": "pushes"},
            "spec": {"type": "github", "events": ["push"], "secretRef": {"name": "hook"},
                "resources": [{"kind": "Stack", "name": "*", "matchLabels": {"tier": "web"}}]}}),
    )
    .await;
    for s in ["app", "unselected", "other"] {
        eventually(&format!("Stack {s} Ready"), 180, || async { stacks.get(s).await.is_ok_and(|s| ready(&s)) }).await;
    }
    let receivers = ns.api::<Receiver>();
    eventually("the Receiver publishes its path", 30, || async {
        receivers.get("pushes").await.unwrap().status.and_then(|s| s.webhook_path).is_some()
    })
    .await;
    let path = receivers.get("pushes").await.unwrap().status.and_then(|s| s.webhook_path).unwrap();
    let url = format!("http://{hook_addr}{path}");

    let sha = push_commit(&repos, "app.git", "two");
    let body = serde_json::to_vec(&json!({"ref": "refs/heads/main", "after": sha,
        "repository": {"clone_url": git.url("app.git"), "ssh_url": "git@example.invalid:x/app.git"}}))
    .unwrap();
    // hostile first: none of these wakes anything
    assert_eq!(deliver(&url, &body, None).await, 401, "no signature");
    assert_eq!(deliver(&url, &body, Some("wrong")).await, 401, "another key");
    assert_eq!(deliver(&format!("http://{hook_addr}/hook/{}", "0".repeat(64)), &body, Some(TOKEN)).await, 404);
    assert_eq!(deliver(&url, &vec![b' '; 2 << 20], Some(TOKEN)).await, 413, "over 1 MiB");
    assert_eq!(requested(&stacks.get("app").await.unwrap()), None, "nothing was asked yet");

    let t0 = Instant::now();
    assert_eq!(deliver(&url, &body, Some(TOKEN)).await, 200);
    let updates = ns.api::<Update>();
    let at_push = |s: &Stack| {
        let status = s.status.as_ref();
        let current = status.and_then(|s| s.current_update.as_ref()).and_then(|u| u.commit.as_deref());
        let last = status.and_then(|s| s.last_update.as_ref()).and_then(|u| u.last_attempted_commit.as_deref());
        current == Some(sha.as_str()) || last == Some(sha.as_str())
    };
    while !at_push(&stacks.get("app").await.unwrap()) {
        assert!(t0.elapsed() < Duration::from_secs(30), "the push's Update within 30 s (the poll is 3600 s)");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let to_update = t0.elapsed();
    eprintln!("signed push hook -> the Stack's new Update: {:.2} s", to_update.as_secs_f64());
    // a flood of the same push: one sync
    for _ in 0..20 {
        assert_eq!(deliver(&url, &body, Some(TOKEN)).await, 200);
    }
    eventually("app at the pushed commit", 120, || async {
        let s = stacks.get("app").await.unwrap();
        ready(&s) && s.status.and_then(|s| s.last_update).and_then(|u| u.last_successful_commit) == Some(sha.clone())
    })
    .await;
    let of = |name: &str| {
        let updates = updates.clone();
        let name = name.to_string();
        async move {
            let all = updates.list(&Default::default()).await.unwrap().items;
            all.iter().filter(|u| u.spec.workspace_name.as_deref() == Some(name.as_str())).count()
        }
    };
    assert_eq!(of("app").await, 2, "the first deploy and one for the push, whatever the flood");
    assert_eq!(requested(&stacks.get("unselected").await.unwrap()), None, "not selected by the Receiver's labels");
    assert_eq!(requested(&stacks.get("other").await.unwrap()), None, "another repository");
    assert_eq!(of("other").await, 1);
    let delivery = receivers.get("pushes").await.unwrap().status.unwrap().last_delivery.unwrap();
    assert_eq!(delivery.revision.as_deref(), Some(sha.as_str()));
    assert!(delivery.result == "synced" || delivery.result == "unchanged", "{delivery:?}");

    // the race a push's delivery can lose: the Stack's own pass ran the pushed commit before the hook asked for it
    // (here a request of another value makes it list the branch); the push's request then runs no second update
    let sha3 = push_commit(&repos, "app.git", "three");
    let ask = |value: String| {
        let stacks = stacks.clone();
        async move {
            let patch = json!({"metadata": {"annotations": {pko_api::constants::RECONCILE_REQUEST_ANNOTATION: value}}});
            stacks.patch("app", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        }
    };
    ask("by-hand-1".into()).await;
    eventually("app at the third commit by its own pass", 120, || async {
        let s = stacks.get("app").await.unwrap();
        ready(&s) && s.status.and_then(|s| s.last_update).and_then(|u| u.last_successful_commit) == Some(sha3.clone())
    })
    .await;
    let before = of("app").await;
    ask(format!("{}{sha3}", pko_api::constants::PUSH_REQUEST_PREFIX)).await;
    eventually("the push's request seen", 60, || async {
        let s = stacks.get("app").await.unwrap();
        ready(&s) && s.status.and_then(|s| s.observed_reconcile_request) == requested(&stacks.get("app").await.unwrap())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(of("app").await, before, "a push request met by the update already at its commit");
    let _ = Api::<Receiver>::namespaced(client.clone(), ns.name()).delete("pushes", &Default::default()).await;
}
