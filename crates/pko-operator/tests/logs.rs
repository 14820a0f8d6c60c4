//! What Pulumi printed, read with `kubectl pko logs` (the `kubectl-pko` binary) from a real operator
//! process (local runtime, the bed's redis-server as output store) against the bed's API server:
//! - a running 20 s `up` is tailed live (`-f`): its first step is printed while the Update is still
//!   Progressing, and the tail ends with the operation's result;
//! - afterwards the output is still readable: after the pool agent that ran it is gone, and from a
//!   replica that did not run it (another operator process on the same Redis, after the first one is
//!   gone);
//! - only callers allowed to `get` the Stack read it: no token → not authenticated; a service account
//!   allowed `get stacks` in another namespace only → forbidden;
//! - a secret the program prints never reaches the output (`[secret]`);
//! - the same through the API server (the aggregated API `logs.pulumi.com`, the operator's
//!   `--logs-api-bind-address` behind an APIService): `kubectl pko logs` with no flags, tailing live with the bed's
//!   client-certificate kubeconfig; a tenant bound to `view` in the namespace (the chart's aggregated role) reads it
//!   with a token kubeconfig and is refused in another namespace; the replica that did not run it answers too.

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

/// The node's address, where the API server listens and its aggregator reaches the operator's logs API.
fn node_ip() -> String {
    let url = testbed().api_server_url();
    url.trim_start_matches("https://").split(':').next().unwrap().to_string()
}

fn free_node_port() -> u16 {
    std::net::TcpListener::bind((node_ip().as_str(), 0)).unwrap().local_addr().unwrap().port()
}

/// The aggregated API `logs.pulumi.com` routed to a replica's `--logs-api-bind-address` (the node's address, `port`):
/// a Service without selector in `ns`, its EndpointSlice and the APIService (cluster-scoped: one test at a time, test
/// binaries run one after another). Deleted on drop, before the operator stops: an APIService left unavailable makes
/// discovery fail, which stalls namespace deletion cluster-wide.
struct LogsApiService;

impl LogsApiService {
    fn objects(ns: &str, port: u16) -> String {
        let ip = node_ip();
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: pko-logs-api, namespace: {ns}}}\n\
             spec: {{ports: [{{name: https, port: 443, targetPort: {port}}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: pko-logs-api, namespace: {ns}, labels: {{kubernetes.io/service-name: pko-logs-api}}}}\n\
             addressType: IPv4\nendpoints: [{{addresses: [{ip}], conditions: {{ready: true}}}}]\n\
             ports: [{{name: https, port: {port}, protocol: TCP}}]\n---\n\
             apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata: {{name: v1alpha1.logs.pulumi.com}}\n\
             spec: {{group: logs.pulumi.com, version: v1alpha1, insecureSkipTLSVerify: true, groupPriorityMinimum: 100,\
             versionPriority: 100, service: {{name: pko-logs-api, namespace: {ns}, port: 443}}}}\n"
        )
    }

    /// Routes the API to `port` and waits until the API server serves its discovery; the guard deletes it.
    async fn route(ns: &str, port: u16) -> LogsApiService {
        Self::reroute(ns, port).await;
        LogsApiService
    }

    /// Points the API at `port` (creating its objects, or moving them to another replica) and waits until the API
    /// server serves its discovery.
    async fn reroute(ns: &str, port: u16) {
        let mut apply = testbed().kubectl();
        apply.args(["apply", "-f", "-"]).stdin(Stdio::piped()).stdout(Stdio::null());
        let mut child = apply.spawn().unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(Self::objects(ns, port).as_bytes()).unwrap();
        assert!(child.wait().unwrap().success(), "applying the logs APIService");
        eventually("the API server routes logs.pulumi.com to the replica", 60, || async {
            let out = testbed().kubectl().args(["get", "--raw", "/apis/logs.pulumi.com/v1alpha1"]).output().unwrap();
            out.status.success()
        })
        .await;
    }
}

impl Drop for LogsApiService {
    fn drop(&mut self) {
        let _ = testbed().kubectl().args(["delete", "apiservice", "v1alpha1.logs.pulumi.com", "--wait=false"]).output();
    }
}

/// `kubectl pko logs stack/<stack> -n <ns>` through the API server with `kubeconfig`, no other flag but `extra`.
fn api_logs_command(kubeconfig: &std::path::Path, ns: &str, stack: &str, extra: &[&str]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(kubectl_pko_bin());
    c.args(["logs", &format!("stack/{stack}"), "-n", ns]).args(extra);
    c.env_clear().env("KUBECONFIG", kubeconfig).env("HOME", std::env::temp_dir());
    c
}

async fn api_logs(kubeconfig: &std::path::Path, ns: &str, stack: &str, extra: &[&str]) -> (bool, String, String) {
    let out = api_logs_command(kubeconfig, ns, stack, extra).output().await.unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// A kubeconfig of service account `name` of `ns` (a token: no client certificate), bound to the built-in `view` role
/// in `ns` only; the chart's aggregated view rule for `logs.pulumi.com` is created as the chart creates it.
async fn view_tenant(client: &kube::Client, ns: &str, name: &str, dir: &std::path::Path) -> std::path::PathBuf {
    let rule = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": format!("{ns}-logs-view"),
            "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
        "rules": [{"apiGroups": ["logs.pulumi.com"], "resources": ["stacks/log", "updates/log"], "verbs": ["get"]}]});
    Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &serde_json::from_value(rule).unwrap())
        .await
        .unwrap();
    let sas = Api::<ServiceAccount>::namespaced(client.clone(), ns);
    sas.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap())
        .await
        .unwrap();
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]});
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &serde_json::from_value(binding).unwrap())
        .await
        .unwrap();
    let tr = k8s_openapi::api::authentication::v1::TokenRequest::default();
    let token = sas.create_token_request(name, &PostParams::default(), &tr).await.unwrap().status.unwrap().token;
    let path = dir.join(format!("{name}.kubeconfig"));
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\n\
         clusters: [{{name: bed, cluster: {{server: \"{}\", certificate-authority: \"{}\"}}}}]\n\
         users: [{{name: {name}, user: {{token: \"{token}\"}}}}]\n\
         contexts: [{{name: t, context: {{cluster: bed, user: {name}, namespace: {ns}}}}}]\ncurrent-context: t\n",
        testbed().api_server_url(),
        testbed().ca_file().display()
    );
    std::fs::write(&path, kubeconfig).unwrap();
    path
}

/// A `pko-operator run` process with its metrics on `metrics` and, with `api_port`, the logs API on the node's address.
fn start_operator_with_api(
    env: &pko_testbed::PulumiEnv,
    ns: &str,
    metrics: &str,
    api_port: Option<u16>,
    redis: &[&str],
    log: &str,
) -> KillOnDrop {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(env.dir().join(log)).unwrap();
    let api = api_port.map(|p| format!("{}:{p}", node_ip())).unwrap_or_else(|| "0".into());
    KillOnDrop(
        operator_command(env, ns, free_port())
            .args(redis)
            .env("LOGS_API_BIND_ADDRESS", api)
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
    let api_port = free_node_port();
    let first = start_operator_with_api(
        &env,
        ns.name(),
        &metrics,
        Some(api_port),
        &[&redis[..], &pools[..]].concat(),
        "operator-1.log",
    );
    let api = LogsApiService::route(ns.name(), api_port).await;
    let admin = testbed().kubeconfig();
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
    // the same live, through the API server with the bed's client-certificate kubeconfig and no flag
    let api_tail = tokio::spawn(tail_through_api(admin.clone(), ns.name().to_string(), updates.clone()));
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

    let (printed_while_running, api_text, api_ok) = api_tail.await.unwrap();
    assert!(api_ok && printed_while_running, "the API tail printed the slow step while it ran:\n{api_text}");
    for want in ["+ command:local:Command slow created", "Resources: ", "succeeded"] {
        assert!(api_text.contains(want), "{want:?} in the API tail:\n{api_text}");
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

    // an Update's own log subresource, as `kubectl get --raw` reads it
    let slow_update = updates
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|u| u.spec.workspace_name.as_deref() == Some("slow"))
        .unwrap()
        .metadata
        .name
        .unwrap();
    let raw = format!("/apis/logs.pulumi.com/v1alpha1/namespaces/{}/updates/{slow_update}/log", ns.name());
    let out = testbed().kubectl().args(["get", "--raw", &raw]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("+ command:local:Command slow created"), "updates/log: {text}");
    let (ok, out, err) = api_logs(&admin, ns.name(), "leaky", &[]).await;
    assert!(ok && out.contains("error: ") && !out.contains(secret), "through the API, masked:\n{out}{err}");

    // through the API: a tenant with `view` in the namespace (a token kubeconfig) reads, and only there
    let tenant = view_tenant(&client, ns.name(), "viewer", env.dir()).await;
    eventually("a view tenant reads the Stack's output through the API server", 30, || {
        let (tenant, ns) = (tenant.clone(), ns.name().to_string());
        async move {
            let (ok, out, _) = api_logs(&tenant, &ns, "slow", &[]).await;
            ok && out.contains("+ command:local:Command slow created")
        }
    })
    .await;
    let (ok, out, err) = api_logs(&tenant, &elsewhere, "slow", &[]).await;
    assert!(!ok && out.is_empty() && err.contains("forbidden"), "refused in another namespace: {err}");

    // straight to the replica, past the API server: headers name a user only on the front proxy's certificate, and
    // the operator's own SubjectAccessReview decides
    let path = format!("/apis/logs.pulumi.com/v1alpha1/namespaces/{}/stacks/slow/log", ns.name());
    let as_admin = [("X-Remote-User", "pko-testbed-admin"), ("X-Remote-Group", "system:masters")];
    assert_eq!(direct(api_port, &path, false, &as_admin).await, 401, "headers without the proxy's certificate");
    assert_eq!(direct(api_port, &path, true, &[("X-Remote-User", "nobody")]).await, 403, "a user without RBAC");
    assert_eq!(direct(api_port, &path, true, &as_admin).await, 200, "the proxy naming an allowed user");

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
    let api_port2 = free_node_port();
    let _second = start_operator_with_api(&env, ns.name(), &metrics2, Some(api_port2), &redis, "operator-2.log");
    LogsApiService::reroute(ns.name(), api_port2).await;
    let mut last = (false, String::new(), String::new());
    for _ in 0..60 {
        last = api_logs(&admin, ns.name(), "slow", &["--all"]).await;
        if last.0 && last.1.contains("+ command:local:Command slow created") && last.1.contains("== update slow-") {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(last.0, "the other replica serves the stored output through the API: {}{}", last.1, last.2);
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
    drop(api);
    let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(client.clone())
        .delete(&format!("{}-logs-view", ns.name()), &Default::default())
        .await;
    let _ = Api::<Namespace>::all(client.clone()).delete(&elsewhere, &Default::default()).await;
}

/// The status of `GET path` sent straight to the replica's logs API at `port`, with `headers`, presenting the bed's
/// front proxy client certificate when `as_proxy`.
async fn direct(port: u16, path: &str, as_proxy: bool, headers: &[(&str, &str)]) -> u16 {
    let mut b = reqwest::Client::builder().danger_accept_invalid_certs(true);
    if as_proxy {
        let certs = std::path::Path::new(testbed().var("PKO_TESTBED_RUN")).join("certs");
        let mut pem = std::fs::read(certs.join("front-proxy-client.crt")).unwrap();
        pem.extend(std::fs::read(certs.join("front-proxy-client.key")).unwrap());
        b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    let mut req = b.build().unwrap().get(format!("https://{}:{port}{path}", node_ip()));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap().status().as_u16()
}

/// `kubectl pko logs stack/slow -f` through the API server with `kubeconfig`, started before the operation is kept:
/// whether it printed the slow step while the Update ran, all it printed, and whether it ended well.
async fn tail_through_api(kubeconfig: std::path::PathBuf, ns: String, updates: Api<Update>) -> (bool, String, bool) {
    let mut tail = api_logs_command(&kubeconfig, &ns, "slow", &["-f"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(tail.stdout.take().unwrap()).lines();
    let (mut text, mut while_running) = (String::new(), false);
    let read = async {
        while let Ok(Some(l)) = lines.next_line().await {
            if l.contains("command:local:Command slow creating") {
                let all = updates.list(&Default::default()).await.unwrap().items;
                let slow = all.iter().find(|u| u.spec.workspace_name.as_deref() == Some("slow"));
                while_running = slow.and_then(|u| condition(u, "Progressing")).is_some_and(|c| c.0 == "True");
            }
            text.push_str(&l);
            text.push('\n');
        }
        tail.wait().await.unwrap()
    };
    let status = tokio::time::timeout(Duration::from_secs(210), read).await.expect("the API tail ends");
    (while_running, text, status.success())
}
