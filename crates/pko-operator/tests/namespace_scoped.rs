//! A namespace-scoped install: an operator started with `--namespaces a,b` as a service account that
//! holds only Roles in those two namespaces (no ClusterRole at all) runs a Program + Stack to Ready in
//! each. Every watch is namespaced, so no cluster-wide list or watch is needed (PKO #690, #247).

mod common;

use common::*;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use pko_api::{Program, Stack};
use pko_testbed::{eventually, testbed};
use serde_json::json;

/// A client of the bed's API server as `token`.
async fn client_as(token: &str) -> kube::Client {
    use kube::config::{AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};
    let bed = testbed();
    let kc = Kubeconfig {
        clusters: vec![NamedCluster {
            name: "bed".into(),
            cluster: Some(Cluster {
                server: Some(bed.api_server_url()),
                certificate_authority: Some(bed.ca_file().display().to_string()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "op".into(),
            auth_info: Some(AuthInfo { token: Some(token.to_string().into()), ..Default::default() }),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: "op".into(),
            context: Some(Context { cluster: "bed".into(), user: Some("op".into()), ..Default::default() }),
            ..Default::default()
        }],
        current_context: Some("op".into()),
        ..Default::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    kube::Client::try_from(config).unwrap()
}

/// Grants the service account `operator` of `account_ns` the operator's namespaced Role in `ns`.
async fn grant_operator_role(ns: &pko_testbed::TestNamespace, account_ns: &str) {
    create(
        &ns.api::<k8s_openapi::api::rbac::v1::Role>(),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "operator"},
            "rules": [
            {"apiGroups": ["pulumi.com"], "resources": ["stacks", "programs", "stacks/status", "programs/status",
                "stacks/finalizers"], "verbs": ["get", "list", "watch", "patch", "update"]},
            {"apiGroups": ["auto.pulumi.com"], "resources": ["workspaces", "updates", "workspaces/status",
                "updates/status"], "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]},
            {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["get", "list", "watch", "create"]},
            {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}
        ]}),
    )
    .await;
    create(
        &ns.api::<k8s_openapi::api::rbac::v1::RoleBinding>(),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "operator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "operator"},
        "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": account_ns}]}),
    )
    .await;
}

#[tokio::test]
async fn an_operator_with_only_namespaced_roles_runs_stacks_in_two_namespaces() {
    let (admin, ns, env) = setup("nsscoped").await;
    let other = testbed().namespace("nsscoped-b").await.unwrap();
    // the operator's identity: a service account with a Role in each of the two namespaces only
    create(
        &ns.api::<ServiceAccount>(),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "operator"}}),
    )
    .await;
    grant_operator_role(&ns, ns.name()).await;
    grant_operator_role(&other, ns.name()).await;
    let tr = k8s_openapi::api::authentication::v1::TokenRequest::default();
    let token = ns
        .api::<ServiceAccount>()
        .create_token_request("operator", &PostParams::default(), &tr)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let scoped = client_as(&token).await;
    // the scoped account really has no cluster-wide view
    assert!(
        Api::<Stack>::all(scoped.clone()).list(&Default::default()).await.is_err(),
        "the scoped account can list Stacks cluster-wide"
    );

    let _op = InProcessOperator::start(&scoped, &env, &format!("{},{}", ns.name(), other.name())).await;
    for (i, n) in [&ns, &other].into_iter().enumerate() {
        create(
            &n.api::<Program>(),
            json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "p"},
                   "program": {"resources": {"hi": {"type": "command:local:Command",
                       "properties": {"create": format!("echo scoped-{i}")}}}, "outputs": {"out": "${hi.stdout}"}}}),
        )
        .await;
        create(
            &n.api::<Stack>(),
            json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "s"},
                   "spec": {"stack": format!("dev-{i}"), "programRef": {"name": "p"}, "backend": env.backend_url(),
                            "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Literal",
                                "literal": {"value": pko_testbed::PulumiEnv::PASSPHRASE}}}}}),
        )
        .await;
    }
    for (i, n) in [&ns, &other].into_iter().enumerate() {
        let stacks = Api::<Stack>::namespaced(admin.clone(), n.name());
        eventually(&format!("the Stack of {} is Ready", n.name()), 120, || async {
            let s = stacks.get("s").await.unwrap();
            s.status
                .and_then(|st| st.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
        .await;
        let s = stacks.get("s").await.unwrap();
        assert_eq!(s.status.unwrap().outputs.unwrap()["out"], json!(format!("scoped-{i}")));
    }
}
