//! `--auth kube`: callers are checked with TokenReview and SubjectAccessReview on the test bed's real API
//! server (RBAC: verb `use` on `workspaces/rpc` of the workspace).

mod common;

use common::*;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{ObjectMeta, PostParams};
use pko_proto::v1::PulumiVersionRequest;
use pko_proto::v1::agent_client::AgentClient;
use pko_testbed::testbed;
use tonic::Request;

async fn token(ns: &pko_testbed::TestNamespace, sa: &str, audience: &str) -> String {
    let sas = ns.api::<ServiceAccount>();
    let _ = sas
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: ObjectMeta { name: Some(sa.into()), ..Default::default() },
                ..Default::default()
            },
        )
        .await;
    let tr = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience.into()],
            expiration_seconds: Some(600),
            ..Default::default()
        },
        ..Default::default()
    };
    sas.create_token_request(sa, &PostParams::default(), &tr).await.unwrap().status.unwrap().token
}

async fn call(c: &mut AgentClient<tonic::transport::Channel>, token: Option<&str>) -> Result<String, tonic::Status> {
    let mut req = Request::new(PulumiVersionRequest {});
    if let Some(t) = token {
        req.metadata_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    c.pulumi_version(req).await.map(|r| r.into_inner().version)
}

#[tokio::test]
async fn unauthenticated_and_unauthorized_callers_are_refused() {
    let bed = testbed();
    let ns = bed.namespace("agent-auth").await.unwrap();
    let audience = format!("ws.{}", ns.name());
    // RBAC: `operator` may use the workspace's rpc subresource, `stranger` may not
    ns.api::<Role>()
        .create(
            &PostParams::default(),
            &Role {
                metadata: ObjectMeta { name: Some("workspace-rpc".into()), ..Default::default() },
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec!["auto.pulumi.com".into()]),
                    resources: Some(vec!["workspaces/rpc".into()]),
                    resource_names: Some(vec!["ws".into()]),
                    verbs: vec!["use".into()],
                    ..Default::default()
                }]),
            },
        )
        .await
        .unwrap();
    ns.api::<RoleBinding>()
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: ObjectMeta { name: Some("operator-rpc".into()), ..Default::default() },
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "Role".into(),
                    name: "workspace-rpc".into(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: "operator".into(),
                    namespace: Some(ns.name().into()),
                    ..Default::default()
                }]),
            },
        )
        .await
        .unwrap();
    let allowed = token(&ns, "operator", &audience).await;
    let stranger = token(&ns, "stranger", &audience).await;
    let wrong_audience = token(&ns, "operator", "somewhere-else").await;

    let env = pulumi_env();
    let kubeconfig = bed.kubeconfig().display().to_string();
    let agent = Agent::start(
        &env,
        &[
            "--auth",
            "kube",
            "--kube-workspace-namespace",
            ns.name(),
            "--kube-workspace-name",
            "ws",
            "--kube-audience",
            &audience,
        ],
        &[("KUBECONFIG", &kubeconfig)],
    );
    let mut c = agent.client().await;

    let e = call(&mut c, None).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let e = call(&mut c, Some("not-a-token")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let e = call(&mut c, Some(&wrong_audience)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "a token for another audience: {e:?}");
    let e = call(&mut c, Some(&stranger)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("stranger"), "{}", e.message());
    assert_eq!(call(&mut c, Some(&allowed)).await.unwrap(), pko_testbed::versions::pulumi());
    // cached decision, same answer
    assert!(call(&mut c, Some(&allowed)).await.is_ok());
    assert_eq!(call(&mut c, Some(&stranger)).await.unwrap_err().code(), tonic::Code::PermissionDenied);
}

#[test]
fn auth_none_is_refused_off_loopback() {
    let env = pulumi_env();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pko-agent"))
        .args(["serve", "--listen", "0.0.0.0:0", "--auth", "none"])
        .envs(env.vars())
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--auth none is only allowed on a loopback address"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
