//! The install manifest (`deploy/manifests/operator.yaml`) on the real API server: every object is
//! accepted, the controller manager acts on the Deployment, and the operator's service account may do
//! what the controllers do — and no more than a sample of what they never need.

mod common;

use pko_testbed::{eventually, repo_root, testbed};

fn kubectl(args: &[&str]) -> (bool, String) {
    let out = testbed().kubectl().args(args).output().unwrap();
    (
        out.status.success(),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)).trim().to_string(),
    )
}

/// Whether the operator's service account may `verb` the `resource` (`plural.group`, `plural` for the
/// core group; `/subresource` may follow; `plural/name#subresource` for a named object) in `namespace`,
/// asked with a SubjectAccessReview (exact for kinds the server does not serve, such as Flux's).
async fn can_i(client: &kube::Client, verb: &str, resource: &str, namespace: &str) -> bool {
    use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
    let (resource, subresource, name) = match resource.split_once('#') {
        Some((r, sub)) => {
            let (plural, name) = r.split_once('/').unwrap();
            (plural.to_string(), Some(sub.to_string()), Some(name.to_string()))
        }
        None => match resource.split_once('/') {
            Some((r, sub)) => (r.to_string(), Some(sub.to_string()), None),
            None => (resource.to_string(), None, None),
        },
    };
    let (plural, group) = resource
        .split_once('.')
        .map(|(p, g)| (p.to_string(), g.to_string()))
        .unwrap_or((resource.clone(), String::new()));
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some("system:serviceaccount:pko-system:pko-operator".into()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                "system:serviceaccounts:pko-system".into(),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group),
                resource: Some(plural),
                subresource,
                name,
                namespace: Some(namespace.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer =
        kube::Api::<SubjectAccessReview>::all(client.clone()).create(&Default::default(), &review).await.unwrap();
    answer.status.is_some_and(|s| s.allowed)
}

#[tokio::test]
async fn install_manifest_is_accepted_and_grants_what_the_controllers_use() {
    let client = testbed().client().await.unwrap();
    pko_testbed::install_crds(&client, pko_api::crds()).await.unwrap();
    let manifest = repo_root().join("deploy/manifests/operator.yaml");
    let (ok, out) =
        kubectl(&["apply", "--server-side", "--field-manager", "pko-tests", "-f", manifest.to_str().unwrap()]);
    assert!(ok, "{out}");

    // the Deployment is real: the controller manager creates its ReplicaSet
    eventually("the operator's ReplicaSet exists", 60, || async {
        kubectl(&["-n", "pko-system", "get", "replicasets", "-l", "app.kubernetes.io/name=pko-operator", "-o", "name"])
            .1
            .starts_with("replicaset")
    })
    .await;

    let needed = [
        ("watch", "stacks.pulumi.com", "team-a"),
        ("patch", "stacks.pulumi.com", "team-a"),
        ("patch", "stacks.pulumi.com/status", "team-a"),
        ("update", "stacks.pulumi.com/finalizers", "team-a"),
        ("watch", "programs.pulumi.com", "team-a"),
        ("patch", "programs.pulumi.com/status", "team-a"),
        ("create", "workspaces.auto.pulumi.com", "team-a"),
        ("delete", "workspaces.auto.pulumi.com", "team-a"),
        ("patch", "workspaces.auto.pulumi.com/status", "team-a"),
        ("use", "workspaces.auto.pulumi.com/rpc", "team-a"),
        ("create", "updates.auto.pulumi.com", "team-a"),
        ("delete", "updates.auto.pulumi.com", "team-a"),
        ("patch", "updates.auto.pulumi.com/status", "team-a"),
        ("patch", "statefulsets.apps", "team-a"),
        ("patch", "services", "team-a"),
        ("get", "secrets", "team-a"),
        ("create", "secrets", "team-a"),
        ("create", "events.events.k8s.io", "team-a"),
        ("get", "namespaces", "team-a"),
        ("watch", "gitrepositories.source.toolkit.fluxcd.io", "team-a"),
        ("create", "serviceaccounts/pko-operator#token", "pko-system"),
        ("update", "leases.coordination.k8s.io", "pko-system"),
        ("create", "tokenreviews.authentication.k8s.io", ""),
        ("create", "subjectaccessreviews.authorization.k8s.io", ""),
    ];
    let mut missing = Vec::new();
    for (verb, resource, ns) in needed {
        if !can_i(&client, verb, resource, ns).await {
            missing.push((verb, resource, ns));
        }
    }
    assert!(missing.is_empty(), "the operator's service account lacks {missing:?}");
    for (verb, resource, ns) in [
        ("delete", "secrets", "team-a"),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", "team-a"),
        ("update", "leases.coordination.k8s.io", "team-a"),
        ("create", "serviceaccounts/default#token", "pko-system"),
    ] {
        assert!(
            !can_i(&client, verb, resource, ns).await,
            "the operator's service account should not {verb} {resource} in {ns}"
        );
    }

    let (ok, out) = kubectl(&["delete", "--wait=true", "--timeout=120s", "-f", manifest.to_str().unwrap()]);
    assert!(ok, "{out}");
}
