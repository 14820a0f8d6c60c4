//! Smoke tests proving the test bed is real: a real API server with working controllers, RBAC and token
//! APIs, a real Pulumi CLI that runs offline, and a real Redis.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use pko_testbed::{testbed, versions};

/// Polls `check` every 200 ms until it returns true or `timeout` passes.
async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + timeout;
    while !check().await {
        assert!(tokio::time::Instant::now() < end, "{what}: not true after {timeout:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn apiserver_is_ready_and_reports_the_pinned_version() {
    let client = testbed().client().await.unwrap();
    let readyz = client.request_text(http::Request::get("/readyz").body(vec![]).unwrap()).await.unwrap();
    assert_eq!(readyz.trim(), "ok");
    let info = client.apiserver_version().await.unwrap();
    assert_eq!(info.git_version, versions::kubernetes(), "the API server must carry its real version");
    assert_eq!(info.major, "1");
}

#[tokio::test]
async fn namespace_is_created_and_deleted() {
    let bed = testbed();
    let ns = bed.namespace("smoke-ns").await.unwrap();
    let name = ns.name().to_string();
    let client = ns.client();
    // KCM's ServiceAccount controller gives every new namespace a default ServiceAccount.
    let sas: Api<ServiceAccount> = ns.api();
    eventually("default ServiceAccount", Duration::from_secs(30), || async {
        sas.get_opt("default").await.unwrap().is_some()
    })
    .await;
    ns.delete().await.unwrap();
    // KCM's namespace controller finalizes the namespace and removes it.
    let nss: Api<Namespace> = Api::all(client);
    eventually("namespace gone", Duration::from_secs(60), || async { nss.get_opt(&name).await.unwrap().is_none() })
        .await;
}

#[tokio::test]
async fn owner_reference_cascade_is_garbage_collected() {
    let ns = testbed().namespace("smoke-gc").await.unwrap();
    let cms: Api<ConfigMap> = ns.api();
    let owner = cms
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta { name: Some("owner".into()), ..Default::default() },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let child = ConfigMap {
        metadata: ObjectMeta {
            name: Some("child".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "owner".into(),
                uid: owner.metadata.uid.clone().unwrap(),
                block_owner_deletion: Some(true),
                controller: Some(true),
            }]),
            ..Default::default()
        },
        ..Default::default()
    };
    cms.create(&PostParams::default(), &child).await.unwrap();
    cms.delete("owner", &DeleteParams::background()).await.unwrap();
    eventually("child garbage-collected", Duration::from_secs(60), || async {
        cms.get_opt("child").await.unwrap().is_none()
    })
    .await;
}

#[tokio::test]
async fn lease_update_is_guarded_by_resource_version() {
    let ns = testbed().namespace("smoke-lease").await.unwrap();
    let leases: Api<Lease> = ns.api();
    let created = leases
        .create(
            &PostParams::default(),
            &Lease {
                metadata: ObjectMeta { name: Some("shard-0".into()), ..Default::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some("a".into()),
                    lease_duration_seconds: Some(15),
                    ..Default::default()
                }),
            },
        )
        .await
        .unwrap();
    let stale = created.clone();
    let mut mine = created;
    mine.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let updated = leases.replace("shard-0", &PostParams::default(), &mine).await.unwrap();
    assert_eq!(updated.spec.unwrap().holder_identity.as_deref(), Some("b"));
    assert_ne!(updated.metadata.resource_version, stale.metadata.resource_version);

    let mut theirs = stale;
    theirs.spec.as_mut().unwrap().holder_identity = Some("c".into());
    match leases.replace("shard-0", &PostParams::default(), &theirs).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 409, "stale update must conflict: {status:?}"),
        other => panic!("stale update must be refused with 409, got {other:?}"),
    }
    assert_eq!(leases.get("shard-0").await.unwrap().spec.unwrap().holder_identity.as_deref(), Some("b"));
}

#[tokio::test]
async fn service_account_token_is_issued_and_reviewed() {
    let ns = testbed().namespace("smoke-token").await.unwrap();
    let sas: Api<ServiceAccount> = ns.api();
    sas.create(
        &PostParams::default(),
        &ServiceAccount {
            metadata: ObjectMeta { name: Some("agent".into()), ..Default::default() },
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let audience = format!("ws.{}", ns.name());
    let tr = sas
        .create_token_request(
            "agent",
            &PostParams::default(),
            &TokenRequest {
                spec: TokenRequestSpec {
                    audiences: vec![audience.clone()],
                    expiration_seconds: Some(600),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let token = tr.status.unwrap().token;
    assert!(!token.is_empty());

    let reviews: Api<TokenReview> = Api::all(ns.client());
    let review = |aud: String, token: String| TokenReview {
        spec: TokenReviewSpec { token: Some(token), audiences: Some(vec![aud]) },
        ..Default::default()
    };
    let ok = reviews.create(&PostParams::default(), &review(audience, token.clone())).await.unwrap().status.unwrap();
    assert_eq!(ok.authenticated, Some(true), "{ok:?}");
    assert_eq!(
        ok.user.unwrap().username.as_deref(),
        Some(format!("system:serviceaccount:{}:agent", ns.name()).as_str())
    );
    let wrong = reviews.create(&PostParams::default(), &review("other".into(), token)).await.unwrap().status.unwrap();
    assert_ne!(wrong.authenticated, Some(true), "a token for another audience must not authenticate");
}

#[tokio::test]
async fn redis_answers_ping() {
    let client = redis::Client::open(testbed().redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG");
}

const SMOKE_PROGRAM: &str = r#"name: smoke
runtime: yaml
resources:
  pw:
    type: command:local:Command
    properties:
      create: openssl rand -hex 8
    options:
      additionalSecretOutputs: [stdout]
  marker:
    type: command:local:Command
    properties:
      create: echo created > "$MARKER"; echo hi
      delete: echo destroyed > "$MARKER"
      environment:
        MARKER: ${marker_path}
variables:
  marker_path: MARKER_PATH
outputs:
  pw: ${pw.stdout}
  out: ${marker.stdout}
"#;

/// `pulumi up` of a YAML program with `command:local:Command`, inside a network namespace with only
/// loopback up: nothing can be downloaded, so this proves the bed is offline-complete.
#[test]
fn pulumi_up_output_destroy_offline() {
    let bed = testbed();
    let env = bed.pulumi_env().unwrap();
    let project = env.dir().join("project");
    std::fs::create_dir_all(&project).unwrap();
    let marker = env.dir().join("marker.txt");
    std::fs::write(project.join("Pulumi.yaml"), SMOKE_PROGRAM.replace("MARKER_PATH", &marker.display().to_string()))
        .unwrap();

    let run = |args: &str, netns: bool| {
        let script =
            if netns { format!("ip link set lo up && exec pulumi {args}") } else { format!("exec pulumi {args}") };
        let mut cmd = if netns {
            let mut c = std::process::Command::new("unshare");
            c.args(["--net", "--", "sh", "-c", &script]);
            c
        } else {
            let mut c = std::process::Command::new("sh");
            c.args(["-c", &script]);
            c
        };
        cmd.current_dir(&project).env_clear().envs(env.vars()).env("HOME", env.dir());
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "pulumi {args} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };

    // Inside the network namespace only loopback exists: show it, so a broken unshare cannot pass silently.
    let links = std::process::Command::new("unshare").args(["--net", "--", "ip", "-o", "link"]).output().unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    assert_eq!(links.lines().count(), 1, "network namespace must hold only lo: {links}");

    run("stack init dev", true);
    run("up --yes --skip-preview", true);
    assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "created");

    let outputs: serde_json::Value = serde_json::from_str(&run("stack output --json", true)).unwrap();
    assert_eq!(outputs["out"], "hi");
    assert_eq!(outputs["pw"], "[secret]", "secret output must stay masked without --show-secrets");
    let shown: serde_json::Value = serde_json::from_str(&run("stack output --json --show-secrets", true)).unwrap();
    assert_eq!(shown["pw"].as_str().unwrap().len(), 16);

    run("destroy --yes --skip-preview", true);
    assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "destroyed", "the command provider's delete must run");
}

/// The Python language host: a Python program using today's PyPI `pulumi` SDK (with a config value and
/// a `command:local:Command`) runs offline, inside a network namespace with only loopback up.
#[test]
fn python_program_runs_offline() {
    let bed = testbed();
    let env = bed.pulumi_env().unwrap();
    let project = env.dir().join("py");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("Pulumi.yaml"), "name: pysmoke\nruntime: python\n").unwrap();
    std::fs::write(
        project.join("__main__.py"),
        r#"import pulumi
cfg = pulumi.Config()
cmd = pulumi.CustomResource("command:local:Command", "hello",
                            {"create": "echo hello " + cfg.require("who"), "stdout": None})
pulumi.export("who", cfg.require("who"))
pulumi.export("said", cmd.stdout)
"#,
    )
    .unwrap();
    let pulumi = |args: &[&str]| {
        let out = std::process::Command::new("unshare")
            .args(["--net", "--", "sh", "-c", "ip link set lo up && exec pulumi \"$@\"", "sh"])
            .args(args)
            .current_dir(&project)
            .env_clear()
            .envs(env.vars())
            .env("HOME", env.dir())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pulumi {args:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    pulumi(&["stack", "init", "dev"]);
    pulumi(&["config", "set", "who", "python"]);
    pulumi(&["up", "--yes", "--skip-preview"]);
    let outputs: serde_json::Value = serde_json::from_str(&pulumi(&["stack", "output", "--json"])).unwrap();
    assert_eq!(outputs["who"], "python");
    assert_eq!(outputs["said"], "hello python");
}
