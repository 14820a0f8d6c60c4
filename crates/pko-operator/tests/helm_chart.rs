//! The Helm chart `deploy/helm/pko` with the real `helm` (built by the bed from the Go module proxy):
//! it lints; the install manifest is exactly what the chart renders (no drift); values render what they
//! promise and bad combinations fail naming the value; and `helm install` on the real API server
//! creates objects it accepts, whose aggregated ClusterRoles let a namespace user with the built-in
//! `edit` role manage Stacks and one with `view` only read them; `helm uninstall` leaves none of them.

mod common;

use std::process::Command;

use common::cluster::helm;
use pko_testbed::{eventually, repo_root, testbed};
use serde::Deserialize;
use serde_yaml_ng::Value;

fn chart() -> String {
    repo_root().join("deploy/helm/pko").display().to_string()
}

/// The objects `helm template` renders with `--set` values `sets`; panics with helm's message when it fails.
fn render(sets: &[&str]) -> Vec<Value> {
    let (ok, out, err) = try_render(sets);
    assert!(ok, "helm template {sets:?}: {err}");
    out
}

fn try_render(sets: &[&str]) -> (bool, Vec<Value>, String) {
    let c = chart();
    let mut args = vec!["template", "pko", c.as_str(), "--namespace", "pko-system"];
    for s in sets {
        args.extend(["--set", s]);
    }
    let (ok, out, err) = helm(&args);
    let docs = if ok {
        serde_yaml_ng::Deserializer::from_str(&out)
            .map(|d| Value::deserialize(d).unwrap())
            .filter(|v| !v.is_null())
            .collect()
    } else {
        Vec::new()
    };
    (ok, docs, err)
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter().find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

fn container(docs: &[Value]) -> &Value {
    let deployment = find(docs, "Deployment", "pko-operator").expect("the operator Deployment");
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

fn args(docs: &[Value]) -> Vec<String> {
    container(docs)["args"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect()
}

fn env(docs: &[Value], name: &str) -> Option<Value> {
    container(docs)["env"].as_sequence().unwrap().iter().find(|e| e["name"] == name).cloned()
}

#[test]
fn the_chart_lints_and_the_install_manifest_is_what_it_renders() {
    let (ok, out, err) = helm(&["lint", "--strict", &chart()]);
    assert!(ok, "helm lint: {out}{err}");
    let script = repo_root().join("scripts/manifests.sh");
    let out = Command::new(&script).arg("--print").env("HELM", testbed().bin_dir().join("helm")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let committed = std::fs::read_to_string(repo_root().join("deploy/manifests/operator.yaml")).unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout) == committed,
        "deploy/manifests/operator.yaml drifted from the chart: run scripts/manifests.sh"
    );
}

#[test]
fn values_render_what_they_promise_and_bad_combinations_fail_naming_the_value() {
    // defaults: one replica, no fleet, PKO's metrics-secure default, PKO's termination grace period
    let docs = render(&[]);
    let a = args(&docs);
    assert!(a.contains(&"--runtime=pod".to_string()) && !a.contains(&"--fleet".to_string()), "{a:?}");
    assert!(env(&docs, "PKO_REDIS_URL").is_none());
    let pod = &find(&docs, "Deployment", "pko-operator").unwrap()["spec"]["template"]["spec"];
    assert_eq!(pod["terminationGracePeriodSeconds"], 300);
    assert_eq!(container(&docs)["image"], "pko-operator:0.1.0");
    assert_eq!(env(&docs, "AGENT_IMAGE").unwrap()["value"], "pko-agent:0.1.0");
    assert!(
        find(&docs, "ClusterRole", "pko-operator-edit").is_some()
            && find(&docs, "ClusterRole", "pko-operator-view").is_some()
    );
    assert!(docs.iter().all(|d| d["kind"] != "ServiceMonitor"), "no ServiceMonitor unless asked and served");

    // a fleet needs Redis, said by name
    let (ok, _, err) = try_render(&["replicaCount=3"]);
    assert!(!ok && err.contains("redis.url"), "{err}");
    let docs = render(&["replicaCount=3", "redis.bundled.enabled=true", "fleet.shards=512"]);
    let a = args(&docs);
    assert!(a.contains(&"--fleet".to_string()) && a.contains(&"--shards=512".to_string()), "{a:?}");
    assert_eq!(find(&docs, "Deployment", "pko-operator").unwrap()["spec"]["replicas"], 3);
    assert_eq!(env(&docs, "PKO_REDIS_URL").unwrap()["value"], "redis://pko-operator-redis.$(POD_NAMESPACE):6379");
    let redis = find(&docs, "Deployment", "pko-operator-redis").expect("the bundled Redis");
    let redis_labels = &redis["spec"]["template"]["metadata"]["labels"];
    let selector = find(&docs, "Service", "pko-operator").unwrap()["spec"]["selector"].as_mapping().unwrap().clone();
    assert!(
        !selector.iter().all(|(k, v)| &redis_labels[k] == v),
        "the operator's Service must not select the Redis pod"
    );
    // a password-bearing URL from a Secret
    let docs = render(&["replicaCount=2", "redis.existingSecret.name=redis", "redis.existingSecret.key=url"]);
    assert_eq!(env(&docs, "PKO_REDIS_URL").unwrap()["valueFrom"]["secretKeyRef"]["name"], "redis");

    // PKO's values
    let docs = render(&[
        "controller.logLevel=debug",
        "controller.logFormat=json",
        "imagePullSecrets[0]=regcred",
        "image.registry=registry.example",
        "nodeSelector.disk=ssd",
        "rbac.createClusterAggregationRoles=false",
        "extraEnv[0].name=X",
        "extraEnv[0].value=on",
    ]);
    assert!(
        args(&docs).contains(&"--zap-log-level=debug".to_string()) && env(&docs, "RUST_LOG").is_none(),
        "PKO's level through PKO's flag"
    );
    assert_eq!(env(&docs, "LOG_FORMAT").unwrap()["value"], "json");
    assert_eq!(env(&docs, "X").unwrap()["value"], "on");
    let pod = &find(&docs, "Deployment", "pko-operator").unwrap()["spec"]["template"]["spec"];
    assert_eq!(pod["imagePullSecrets"][0]["name"], "regcred");
    assert_eq!(pod["nodeSelector"]["disk"], "ssd");
    assert_eq!(container(&docs)["image"], "registry.example/pko-operator:0.1.0");
    assert!(find(&docs, "ClusterRole", "pko-operator-edit").is_none());

    // PKO's zap integers and levels mean what they mean in PKO (the binary maps them: `2` is trace,
    // `panic` errors only); anything else is a RUST_LOG filter list
    assert!(args(&render(&["controller.logLevel=2"])).contains(&"--zap-log-level=2".to_string()));
    assert!(args(&render(&["controller.logLevel=panic"])).contains(&"--zap-log-level=panic".to_string()));
    let filtered = render(&["controller.logLevel=info\\,pko_fleet=debug"]);
    assert_eq!(env(&filtered, "RUST_LOG").unwrap()["value"], "info,pko_fleet=debug");
    assert!(!args(&filtered).iter().any(|a| a.starts_with("--zap-log-level")));
    // one replica: leader election with PKO's values, so a rollout never runs two operators at once
    let docs = render(&[]);
    assert!(args(&docs).contains(&"--leader-elect".to_string()), "{:?}", args(&docs));
    for (var, value) in [
        ("LEADER_ELECTION_LEASE_DURATION", "60s"),
        ("LEADER_ELECTION_RENEW_DEADLINE", "45s"),
        ("LEADER_ELECTION_RETRY_PERIOD", "10s"),
        ("KUBE_API_TIMEOUT", "30s"),
    ] {
        assert_eq!(env(&docs, var).unwrap()["value"], value, "{var}");
    }
    assert!(env(&docs, "FLUX_MAX_UNTAR_SIZE_BYTES").is_none());
    assert_eq!(env(&docs, "PROGRAM_FS_ADV_ADDR").unwrap()["value"], "pko-operator.$(POD_NAMESPACE):80");
    let docs = render(&[
        "leaderElection.leaseDuration=120s",
        "kubeAPI.timeout=1m",
        "flux.maxUntarSizeBytes=-1",
        "controller.advertisedAddress=pko.example",
    ]);
    assert_eq!(env(&docs, "LEADER_ELECTION_LEASE_DURATION").unwrap()["value"], "120s");
    assert_eq!(env(&docs, "KUBE_API_TIMEOUT").unwrap()["value"], "1m");
    assert_eq!(env(&docs, "FLUX_MAX_UNTAR_SIZE_BYTES").unwrap()["value"], "-1");
    assert_eq!(env(&docs, "PROGRAM_FS_ADV_ADDR").unwrap()["value"], "pko.example:80");
    let fleet = render(&["replicaCount=3", "redis.url=redis://r:6379"]);
    assert!(
        !args(&fleet).contains(&"--leader-elect".to_string())
            && env(&fleet, "LEADER_ELECTION_LEASE_DURATION").is_none(),
        "a fleet fences by shard Leases"
    );
    assert!(!args(&render(&["leaderElection.enabled=false"])).contains(&"--leader-elect".to_string()));

    // namespaced RBAC needs the namespaces
    let (ok, _, err) = try_render(&["rbac.createClusterRole=false"]);
    assert!(!ok && err.contains("namespace.watch"), "{err}");
    let docs = render(&["rbac.createClusterRole=false", "namespace.watch={team-a,team-b}"]);
    assert!(
        ["team-a", "team-b"]
            .iter()
            .all(|ns| docs.iter().any(|d| d["kind"] == "Role" && d["metadata"]["namespace"] == *ns))
    );
    assert!(find(&docs, "ClusterRole", "pko-operator").is_none());
    assert!(args(&docs).contains(&"--namespaces=team-a,team-b".to_string()));
    // PKO's rbac.createRole: a Role and its binding in the release namespace, beside the ClusterRole
    let docs = render(&["rbac.createRole=true"]);
    let role = docs
        .iter()
        .find(|d| d["kind"] == "Role" && d["metadata"]["name"] == "pko-operator-controller-manager")
        .expect("the namespaced Role");
    assert_eq!(role["metadata"]["namespace"], "pko-system");
    assert!(
        role["rules"].as_sequence().is_some_and(|r| r
            .iter()
            .any(|r| r["resources"].as_sequence().is_some_and(|res| res.iter().any(|x| x == "stacks")))),
        "the controllers' rules: {role:?}"
    );
    assert!(docs.iter().any(|d| d["kind"] == "RoleBinding"
        && d["metadata"]["name"] == "pko-operator-controller-manager"
        && d["roleRef"]["name"] == "pko-operator-controller-manager"));
    assert!(find(&docs, "ClusterRole", "pko-operator").is_some(), "rbac.createClusterRole stays as it is");
    let docs = render(&["rbac.createRole=true", "rbac.createClusterRole=false", "namespace.watch={team-a}"]);
    assert_eq!(
        docs.iter()
            .filter(|d| d["kind"] == "Role" && d["metadata"]["name"] == "pko-operator-controller-manager")
            .count(),
        1,
        "one per watched namespace"
    );
    assert!(!docs.iter().any(|d| d["kind"] == "Role"
        && d["metadata"]["name"] == "pko-operator-controller-manager"
        && d["metadata"]["namespace"] == "pko-system"));

    // pools of workspace pods: the operator's flags
    assert!(
        !args(&render(&[])).iter().any(|a| a.starts_with("--agent-pools")),
        "off by default: a pod per Workspace, as PKO"
    );
    let pooled = args(&render(&[
        "pools.enabled=true",
        "pools.minAgents=1",
        "pools.maxAgents=4",
        "pools.idleTimeoutSeconds=30",
        "pools.affinityWaitSeconds=1.5",
    ]));
    for flag in [
        "--agent-pools",
        "--pool-min-agents=1",
        "--pool-max-agents=4",
        "--pool-idle-timeout-seconds=30",
        "--pool-affinity-wait-seconds=1.5",
    ] {
        assert!(pooled.contains(&flag.to_string()), "{flag} in {pooled:?}");
    }
    assert!(!pooled.iter().any(|a| a.contains("cache-max-bytes")), "the agents' own disk budgets unless set");
    // the pool agents' disk budgets, 8 GiB written as helm reads a large number (a float) and passed as an integer
    let budgets =
        args(&render(&["pools.enabled=true", "pools.cacheMaxBytes=1073741824", "pools.stackCacheMaxBytes=8589934592"]));
    for flag in ["--pool-cache-max-bytes=1073741824", "--pool-stack-cache-max-bytes=8589934592"] {
        assert!(budgets.contains(&flag.to_string()), "{flag} in {budgets:?}");
    }
}

fn kubectl(args: &[&str]) -> (bool, String) {
    let out = testbed().kubectl().args(args).output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// Whether `user` may `get` the `log` subresource of `resource` (`stacks`, `updates`) of `logs.pulumi.com` in `ns`.
async fn can_read_log(user: &str, resource: &str, ns: &str) -> bool {
    use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            resource_attributes: Some(ResourceAttributes {
                group: Some("logs.pulumi.com".into()),
                resource: Some(resource.into()),
                subresource: Some("log".into()),
                verb: Some("get".into()),
                namespace: Some(ns.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let client = testbed().client().await.unwrap();
    let api = kube::Api::<SubjectAccessReview>::all(client);
    api.create(&Default::default(), &review).await.unwrap().status.is_some_and(|s| s.allowed)
}

#[tokio::test]
async fn helm_install_is_accepted_and_namespace_users_with_edit_manage_stacks_and_with_view_read_them() {
    let (release, ns) = ("pko-helmtest", "pko-helmtest");
    let _ = helm(&["uninstall", release, "--namespace", ns, "--wait"]);
    let _ = kubectl(&["delete", "apiservice", "v1alpha1.logs.pulumi.com", "--ignore-not-found"]);
    let (ok, out, err) = helm(&[
        "install",
        release,
        &chart(),
        "--namespace",
        ns,
        "--create-namespace",
        "--set",
        "replicaCount=2",
        "--set",
        "redis.bundled.enabled=true",
    ]);
    assert!(ok, "helm install: {out}{err}");

    // the built-in roles aggregate ours (the controller manager's aggregation controller)
    let team = "pko-helmtest-team";
    let _ = kubectl(&["create", "namespace", team]);
    for (user, role) in [("alice", "edit"), ("bob", "view")] {
        let (ok, out) = kubectl(&["-n", team, "create", "rolebinding", user, "--clusterrole", role, "--user", user]);
        assert!(ok || out.contains("already exists") || out.contains("AlreadyExists"), "{out}");
    }
    let can = |user: &'static str, verb: &'static str, resource: &'static str| async move {
        let (_, out) = kubectl(&["auth", "can-i", verb, resource, "-n", team, "--as", user]);
        out.trim() == "yes"
    };
    eventually("edit lets alice create Stacks and Programs", 60, || async {
        can("alice", "create", "stacks.pulumi.com").await && can("alice", "delete", "programs.pulumi.com").await
    })
    .await;
    eventually("view lets bob list Stacks", 60, || async { can("bob", "list", "stacks.pulumi.com").await }).await;
    assert!(!can("bob", "create", "stacks.pulumi.com").await, "view does not create");
    assert!(can("alice", "watch", "updates.auto.pulumi.com").await, "edit reads too");
    // and read what Pulumi printed for them (the logs API's subresources), nothing more of it
    // (a SubjectAccessReview: `kubectl auth can-i` resolves the resource by discovery, which an APIService
    // whose pods do not run yet does not answer)
    eventually("view lets bob read stacks/log", 60, || async { can_read_log("bob", "stacks", team).await }).await;
    assert!(can_read_log("alice", "updates", team).await, "edit reads updates/log");
    assert!(!can_read_log("bob", "stacks", "default").await, "not in a namespace without the binding");
    let (ok, out) = kubectl(&["get", "apiservice", "v1alpha1.logs.pulumi.com", "-o", "jsonpath={.spec.service}"]);
    assert!(
        ok && out.contains("pko-helmtest-operator") && out.contains(ns),
        "the APIService routes to the release: {out}"
    );

    // what helm made is there, and goes with the release
    let (_, out) = kubectl(&["-n", ns, "get", "deployments", "-o", "name"]);
    assert!(
        out.contains("deployment.apps/pko-helmtest-operator")
            && out.contains("deployment.apps/pko-helmtest-operator-redis"),
        "{out}"
    );
    let (ok, out, err) = helm(&["uninstall", release, "--namespace", ns, "--wait"]);
    assert!(ok, "helm uninstall: {out}{err}");
    let (_, out) = kubectl(&[
        "-n",
        ns,
        "get",
        "deployments,services,serviceaccounts,roles,rolebindings",
        "-l",
        "app.kubernetes.io/instance=pko-helmtest",
        "-o",
        "name",
    ]);
    assert!(out.trim().is_empty() || out.contains("No resources"), "left after uninstall: {out}");
    let (_, out) = kubectl(&["get", "clusterroles,clusterrolebindings,apiservices", "-o", "name"]);
    assert!(!out.contains("pko-helmtest") && !out.contains("logs.pulumi.com"), "left after uninstall: {out}");
    let _ = kubectl(&["delete", "namespace", team, ns, "--wait=false"]);
}
