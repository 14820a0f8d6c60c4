//! What Pulumi printed, read with `kubectl pko logs` (the `kubectl-pko` binary) from a real operator
//! process (local runtime, the bed's redis-server as output store) against the bed's API server:
//! - a running 20 s `up` is tailed live (`-f`): its first step is printed while the Update is still
//!   Progressing, and the tail ends with the operation's result;
//! - afterwards the output is still readable: after the pool agent that ran it is gone, and from a
//!   replica that did not run it (another operator process on the same Redis, after the first one is
//!   gone);
//! - only callers allowed to `get` the Stack read it: no token → not authenticated; a service account
//!   allowed `get stacks` in another namespace only → forbidden;
//! - a secret the program prints never reaches the output (`[secret]`).

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, PostParams};
use pko_api::{Program, Stack, Update};
use pko_testbed::{eventually, testbed};
use serde_json::json;
use tokio::io::AsyncBufReadExt;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `kubectl pko logs stack/<stack> -n <ns>` against `endpoint` with `token`, plus `extra`.
fn logs_command(endpoint: &str, ns: &str, stack: &str, token: Option<&str>, extra: &[&str]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(kubectl_pko_bin());
    c.args(["logs", &format!("stack/{stack}"), "-n", ns, "--endpoint", endpoint, "--insecure-skip-tls-verify"])
        .args(extra);
    c.env_clear().env("KUBECONFIG", "/nonexistent");
    if let Some(t) = token {
        c.args(["--token", t]);
    }
    c
}

async fn logs(endpoint: &str, ns: &str, stack: &str, token: Option<&str>, extra: &[&str]) -> (bool, String, String) {
    let out = logs_command(endpoint, ns, stack, token, extra).output().await.unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A service account of `ns` with a token, allowed `get` on Stacks in namespace `allowed_in`.
async fn account(client: &kube::Client, ns: &str, name: &str, allowed_in: &str) -> String {
    let sas = Api::<ServiceAccount>::namespaced(client.clone(), ns);
    sas.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap())
        .await
        .unwrap();
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name},
                      "rules": [{"apiGroups": ["pulumi.com"], "resources": ["stacks"], "verbs": ["get"]}]});
    Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(client.clone(), allowed_in)
        .create(&PostParams::default(), &serde_json::from_value(role).unwrap())
        .await
        .unwrap();
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name},
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]});
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(client.clone(), allowed_in)
        .create(&PostParams::default(), &serde_json::from_value(binding).unwrap())
        .await
        .unwrap();
    let tr = k8s_openapi::api::authentication::v1::TokenRequest::default();
    sas.create_token_request(name, &PostParams::default(), &tr).await.unwrap().status.unwrap().token
}

/// How many `pko-agent serve` processes of the operator's pools (under `<env>/agents`) run.
async fn pool_agents(env: &pko_testbed::PulumiEnv) -> usize {
    let pattern = format!("pko-agent serve .*{}", env.dir().join("agents").display());
    let out = tokio::process::Command::new("pgrep").args(["-f", &pattern]).output().await.unwrap();
    String::from_utf8_lossy(&out.stdout).lines().count()
}

fn start_operator(env: &pko_testbed::PulumiEnv, ns: &str, metrics: &str, redis: &[&str], log: &str) -> KillOnDrop {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(env.dir().join(log)).unwrap();
    KillOnDrop(
        operator_command(env, ns, free_port())
            .args(redis)
            .env("METRICS_BIND_ADDRESS", metrics)
            .env("KUBECONFIG", testbed().kubeconfig())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap(),
    )
}

#[tokio::test]
async fn a_stack_s_output_is_tailed_live_kept_and_read_only_by_who_may_get_the_stack() {
    let (client, ns, env) = setup("logs").await;
    let prefix = testbed().redis_prefix("logs");
    let redis = ["--redis-url", testbed().redis_url(), "--redis-prefix", &prefix];
    passphrase_secret(&ns).await;
    let secret = "Pr1nted-S3cret-41";
    create(
        &ns.api::<Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "slow"},
               "program": {"resources": {"first": {"type": "command:local:Command",
                   "properties": {"create": "echo first"}},
                                         "slow": {"type": "command:local:Command",
                                             "properties": {"create": "sleep 20; echo done"},
                                                  "options": {"dependsOn": ["${first}"]}}}}}),
    )
    .await;
    create(
        &ns.api::<Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "leaky"},
               "program": {"configuration": {"pw": {"type": "String"}},
                   "resources": {"boom": {"type": "command:local:Command",
                           "properties": {"create": "echo \"pw=$PW\" >&2; exit 3", "environment": {"PW": "${pw}"}}}}}}),
    )
    .await;
    let reader = account(&client, ns.name(), "reader", ns.name()).await;
    let elsewhere = format!("{}-b", ns.name());
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": elsewhere}})).unwrap())
        .await
        .unwrap();
    let outsider = account(&client, ns.name(), "outsider", &elsewhere).await;

    let metrics = format!("127.0.0.1:{}", free_port());
    let endpoint = format!("https://{metrics}");
    let pools = ["--pool-idle-timeout-seconds", "3"];
    let first = start_operator(&env, ns.name(), &metrics, &[&redis[..], &pools[..]].concat(), "operator-1.log");
    for name in ["slow", "leaky"] {
        create(
            &ns.api::<Stack>(),
            json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name},
                   "spec": {"stack": "dev", "programRef": {"name": name}, "backend": env.backend_url(),
                       "envRefs": passphrase_env_refs(),
                            "secretsRef": if name == "leaky" { json!({"pw": {"type": "Literal",
                                "literal": {"value": secret}}}) } else { json!({}) }}}),
        )
        .await;
    }

    eventually("the operator's endpoint answers", 60, || async {
        let (ok, _, err) = logs(&endpoint, ns.name(), "slow", Some(&reader), &[]).await;
        ok || err.contains("no output of stack")
    })
    .await;
    // live: `-f` started before the operation is kept waits for it, prints its first step while the
    // Update is still Progressing, and ends with the result
    let mut tail = logs_command(&endpoint, ns.name(), "slow", Some(&reader), &["-f"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(tail.stdout.take().unwrap()).lines();
    let updates = ns.api::<Update>();
    let seen = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let line = lines.next_line().await.unwrap().expect("the tail ended before the slow step started");
            if line.contains("command:local:Command slow creating") {
                return line;
            }
        }
    })
    .await
    .expect("the slow step is printed within 120 s");
    assert!(pool_agents(&env).await > 0, "a pool agent runs it");
    let all = updates.list(&Default::default()).await.unwrap().items;
    let running = all.iter().find(|u| u.spec.workspace_name.as_deref() == Some("slow"));
    assert!(
        running.and_then(|u| condition(u, "Progressing")).is_some_and(|c| c.0 == "True"),
        "printed while the Update runs: {seen}"
    );
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(90), async {
        while let Ok(Some(l)) = lines.next_line().await {
            rest.push(l);
        }
        tail.wait().await.unwrap()
    })
    .await
    .expect("the tail ends with the operation");
    assert!(ended.success());
    let rest = rest.join("\n");
    for want in ["+ command:local:Command slow created", "Resources: ", "succeeded"] {
        assert!(rest.contains(want), "{want:?} in the tail:\n{rest}");
    }

    // the failing program: its error is there, its secret is not
    let stacks = ns.api::<Stack>();
    eventually("the leaky Stack's update failed", 120, || async {
        stacks.get("leaky").await.ok().and_then(|s| s.status?.last_update?.state)
            == Some(pko_api::stack::StackUpdateStateMessage::Failed)
    })
    .await;
    let (ok, out, err) = logs(&endpoint, ns.name(), "leaky", Some(&reader), &[]).await;
    assert!(ok, "{err}");
    assert!(out.contains("error: ") && out.contains("failed"), "the error and the result:\n{out}");
    assert!(!out.contains(secret), "the secret is masked:\n{out}");

    // who may read: no token, and a token allowed only in another namespace
    let (ok, _, err) = logs(&endpoint, ns.name(), "slow", None, &[]).await;
    assert!(!ok && err.contains("not authenticated"), "{err}");
    let (ok, out, err) = logs(&endpoint, ns.name(), "slow", Some(&outsider), &[]).await;
    assert!(!ok && err.contains("forbidden") && out.is_empty(), "{err}");
    let (ok, _, err) = logs(&endpoint, &elsewhere, "slow", Some(&outsider), &[]).await;
    assert!(!ok && err.contains("no output of stack"), "allowed there, nothing kept there: {err}");

    // the pool agents that ran them are gone (idle for 3 s): the output stays
    eventually("the pool's agents stopped", 60, || async { pool_agents(&env).await == 0 }).await;
    let (ok, out, err) = logs(&endpoint, ns.name(), "slow", Some(&reader), &[]).await;
    assert!(ok && out.contains("+ command:local:Command slow created"), "readable with no agent left: {out}{err}");

    // kept outside the replica that ran it: another replica on the same Redis serves it
    drop(first);
    let metrics2 = format!("127.0.0.1:{}", free_port());
    let _second = start_operator(&env, ns.name(), &metrics2, &redis, "operator-2.log");
    let endpoint2 = format!("https://{metrics2}");
    let again = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    eventually("the other replica serves the stored output", 60, || {
        let (endpoint2, ns, reader, again) = (endpoint2.clone(), ns.name().to_string(), reader.clone(), again.clone());
        async move {
            let (ok, out, _) = logs(&endpoint2, &ns, "slow", Some(&reader), &["--all"]).await;
            *again.lock().unwrap() = out;
            ok
        }
    })
    .await;
    let again = again.lock().unwrap().clone();
    assert!(again.contains("+ command:local:Command slow created") && again.contains("== update slow-"), "{again}");
    let _ = Api::<Namespace>::all(client.clone()).delete(&elsewhere, &Default::default()).await;
}
