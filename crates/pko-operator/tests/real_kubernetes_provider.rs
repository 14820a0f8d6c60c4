//! The real Kubernetes provider (issue "Real programs, as PKO users write them"): a Program (Pulumi
//! YAML, as a PKO user writes one) whose resources are `kubernetes:` resources, run by the operator on
//! the local runtime with `pulumi-resource-kubernetes` built in the bed from the Go module proxy — not
//! the stand-in `command` provider. It deploys a ConfigMap, a Deployment and a Service into the bed's
//! own API server, the Stack's outputs name them, a config change reaches the ConfigMap, a change made
//! with `kubectl` behind Pulumi's back (a ConfigMap patched, the Deployment scaled) is reported by a
//! scheduled drift check naming both URNs and put back by `autoRemediate`, and deleting the Stack with
//! `destroyOnFinalize` deletes them. The same three objects from a Python program (`pulumi_kubernetes`
//! from PyPI, in the bed's virtualenv) in a local workspace directory, and from a Go program (the Go
//! SDKs from the Go module proxy) in a git repository.

mod common;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{DeleteParams, Patch, PatchParams};
use pko_api::{Program, Stack};
use pko_testbed::{eventually, testbed};
use serde_json::json;

/// The Program: a ConfigMap with the greeting of the Stack's config, a Deployment of no replicas (the
/// bed's node pulls no image) and a Service selecting it, in the namespace of config `ns`; outputs
/// their names and the Service's cluster IP.
fn program() -> serde_json::Value {
    let skip_await = json!({"pulumi.com/skipAwait": "true"});
    json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "app"},
    "program": {
        "configuration": {"ns": {"type": "String"}, "greeting": {"type": "String"}},
        "resources": {
            "config": {"type": "kubernetes:core/v1:ConfigMap",
                       "properties": {"metadata": {"name": "app-config", "namespace": "${ns}"},
                           "data": {"greeting": "${greeting}"}}},
            "app": {"type": "kubernetes:apps/v1:Deployment",
                    "properties": {"metadata": {"name": "app", "namespace": "${ns}", "annotations": skip_await},
                                   "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "app"}},
                                            "template": {"metadata": {"labels": {"app": "app"}},
                                                         "spec": {"containers": [{"name": "app",
                                                             "image": "pko.local/app:1",
                                                             "envFrom": [{"configMapRef":
                                                                 {"name": "${config.metadata.name}"}}]}]}}}}},
            "web": {"type": "kubernetes:core/v1:Service",
                    "properties": {"metadata": {"name": "web", "namespace": "${ns}", "annotations": skip_await},
                                   "spec": {"selector": {"app": "app"}, "ports": [{"port": 80, "targetPort": 8080}]}}}
        },
        "outputs": {"configMap": "${config.metadata.name}", "deployment": "${app.metadata.name}",
            "clusterIP": "${web.spec.clusterIP}"}
    }})
}

fn drift(s: &Stack) -> Option<(String, String, String)> {
    stack_condition(s, "DriftDetected")
}

async fn greeting(config_maps: &kube::Api<ConfigMap>) -> Option<String> {
    config_maps.get_opt("app-config").await.unwrap().and_then(|c| c.data).and_then(|d| d.get("greeting").cloned())
}

async fn replicas(ns: &pko_testbed::TestNamespace) -> Option<i32> {
    ns.api::<Deployment>().get_opt("app").await.unwrap().and_then(|d| d.spec).and_then(|s| s.replicas)
}

/// The passphrase and the provider's cluster — the bed's API server (in a pod: the workspace's service
/// account) — as a Stack's `envRefs`.
fn env_refs() -> serde_json::Value {
    let mut refs = passphrase_env_refs();
    refs["KUBECONFIG"] = json!({"type": "Literal", "literal": {"value": testbed().kubeconfig().display().to_string()}});
    refs
}

/// Deletes Stack `name` (`destroyOnFinalize`) and checks that the ConfigMap, Deployment and Service
/// of its program are gone from the bed's API server.
async fn delete_and_check_destroyed(ns: &pko_testbed::TestNamespace, name: &str, objects: [&str; 3]) {
    let stacks = ns.api::<Stack>();
    stacks.delete(name, &DeleteParams::background()).await.unwrap();
    eventually("the Stack is finalized and gone", 180, || async { stacks.get_opt(name).await.unwrap().is_none() })
        .await;
    assert!(ns.api::<ConfigMap>().get_opt(objects[0]).await.unwrap().is_none(), "the ConfigMap was destroyed");
    assert!(ns.api::<Deployment>().get_opt(objects[1]).await.unwrap().is_none(), "the Deployment was destroyed");
    assert!(ns.api::<Service>().get_opt(objects[2]).await.unwrap().is_none(), "the Service was destroyed");
}

#[tokio::test]
async fn a_program_of_kubernetes_resources_deploys_drifts_is_remediated_and_is_destroyed_with_the_real_provider() {
    let (client, ns, env) = setup("k8s-provider").await;
    passphrase_secret(&ns).await;
    create(&ns.api::<Program>(), program()).await;
    let args = run_args_with(&env, ns.name(), &["--min-drift-check-interval-seconds", "2"]);
    let op = InProcessOperator::start_with(&client, &env, args).await;
    let stacks = ns.api::<Stack>();
    create(
        &stacks,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "app"},
               "spec": {"stack": "dev", "programRef": {"name": "app"}, "backend": env.backend_url(),
                   "destroyOnFinalize": true,
                        "envRefs": env_refs(), "config": {"ns": ns.name(), "greeting": "hello"}}}),
    )
    .await;
    eventually("the Stack is Ready", 240, || async { ready(&stacks.get("app").await.unwrap()) }).await;
    let config_maps = ns.api::<ConfigMap>();
    assert_eq!(greeting(&config_maps).await.as_deref(), Some("hello"), "the ConfigMap is in the bed's API server");
    let deployment = ns.api::<Deployment>().get("app").await.unwrap();
    assert_eq!(deployment.spec.and_then(|s| s.replicas), Some(0));
    let service = ns.api::<Service>().get("web").await.unwrap();
    let cluster_ip = service.spec.and_then(|s| s.cluster_ip).unwrap();
    let outputs = stacks.get("app").await.unwrap().status.unwrap().outputs.unwrap();
    assert_eq!(
        (&outputs["configMap"], &outputs["deployment"], &outputs["clusterIP"]),
        (&json!("app-config"), &json!("app"), &json!(cluster_ip))
    );

    // a config change reaches the object
    stacks
        .patch("app", &PatchParams::default(), &Patch::Merge(json!({"spec": {"config": {"greeting": "bonjour"}}})))
        .await
        .unwrap();
    eventually("the new greeting is deployed", 180, || async {
        let s = stacks.get("app").await.unwrap();
        ready(&s)
            && s.status.as_ref().and_then(|st| st.observed_generation) == s.metadata.generation
            && greeting(&config_maps).await.as_deref() == Some("bonjour")
    })
    .await;

    // changed with kubectl behind Pulumi's back: a drift check (every 2 s, report only) names it
    let patch = json!({"spec": {"driftDetection": {"schedules": [{"cron": "*/2 * * * * *"}]}}});
    stacks.patch("app", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    eventually("a check finds no drift", 120, || async {
        drift(&stacks.get("app").await.unwrap()).is_some_and(|(s, r, _)| s == "False" && r == "NoChanges")
    })
    .await;
    let edited = testbed()
        .kubectl()
        .args([
            "-n",
            ns.name(),
            "patch",
            "configmap",
            "app-config",
            "--type",
            "merge",
            "-p",
            r#"{"data":{"greeting":"edited"}}"#,
        ])
        .output()
        .unwrap();
    assert!(edited.status.success(), "kubectl patch: {}", String::from_utf8_lossy(&edited.stderr));
    let scaled =
        testbed().kubectl().args(["-n", ns.name(), "scale", "deployment", "app", "--replicas=2"]).output().unwrap();
    assert!(scaled.status.success(), "kubectl scale: {}", String::from_utf8_lossy(&scaled.stderr));
    eventually("the drift is reported", 120, || async {
        drift(&stacks.get("app").await.unwrap()).is_some_and(|(s, r, _)| s == "True" && r == "Changes")
    })
    .await;
    let (_, _, message) = drift(&stacks.get("app").await.unwrap()).unwrap();
    assert!(
        message.contains("urn:pulumi:dev::app::kubernetes:core/v1:ConfigMap::config"),
        "the drift names the ConfigMap's URN: {message}"
    );
    assert!(
        message.contains("urn:pulumi:dev::app::kubernetes:apps/v1:Deployment::app"),
        "the drift names the scaled Deployment's URN: {message}"
    );
    assert_eq!(greeting(&config_maps).await.as_deref(), Some("edited"), "a report-only check changes nothing");
    assert_eq!(replicas(&ns).await, Some(2), "a report-only check changes nothing");

    // autoRemediate: an up --refresh puts the desired greeting and replica count back
    let patch = json!({"spec": {"driftDetection": {"schedules": [{"cron": "*/2 * * * * *", "autoRemediate": true}]}}});
    stacks.patch("app", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    eventually("the drift is remediated", 180, || async {
        greeting(&config_maps).await.as_deref() == Some("bonjour")
            && replicas(&ns).await == Some(0)
            && drift(&stacks.get("app").await.unwrap()).is_some_and(|(s, r, _)| s == "False" && r == "NoChanges")
    })
    .await;

    // What the real provider does here: the changed ConfigMap is replaced (its name is fixed: deleted
    // first) and the Deployment that reads it with it; `kubectl scale` took `.spec.replicas` with the
    // scale subresource, so the new Deployment's server-side apply can meet the old one still being
    // deleted and fail with a field conflict. The Stack's retry after its backoff then deploys it.
    for u in ns.api::<pko_api::Update>().list(&Default::default()).await.unwrap() {
        if let Some(c) = u
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "Failed" && c.status == "True")
        {
            eprintln!("failed Update {}: {}", u.metadata.name.unwrap_or_default(), c.message);
        }
    }

    // destroyOnFinalize: the provider deletes what it created
    delete_and_check_destroyed(&ns, "app", ["app-config", "app", "web"]).await;
    drop(op);
}

/// Creates Stack `name` of `spec` (merged over the backend, `destroyOnFinalize`, [`env_refs`] and the
/// config `ns`/`greeting`) on an in-process operator, waits for it to be Ready, checks the
/// `<prefix>-config`, `<prefix>-app` and `<prefix>-web` objects and the outputs naming them, and deletes
/// it: all three destroyed.
async fn deploy_check_destroy(
    setup: (kube::Client, pko_testbed::TestNamespace, pko_testbed::PulumiEnv),
    name: &str,
    prefix: &str,
    spec: serde_json::Value,
) {
    let (client, ns, env) = setup;
    passphrase_secret(&ns).await;
    let op = InProcessOperator::start(&client, &env, ns.name()).await;
    let stacks = ns.api::<Stack>();
    let mut full = json!({"stack": "dev", "backend": env.backend_url(), "destroyOnFinalize": true,
        "envRefs": env_refs(), "config": {"ns": ns.name(), "greeting": "hallo"}});
    for (k, v) in spec.as_object().unwrap() {
        match (full.get_mut(k), v) {
            (Some(serde_json::Value::Object(have)), serde_json::Value::Object(more)) => have.extend(more.clone()),
            _ => full[k] = v.clone(),
        }
    }
    create(&stacks, json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name}, "spec": full}))
        .await;
    let t = std::time::Instant::now();
    eventually("the Stack is Ready", 300, || async { ready(&stacks.get(name).await.unwrap()) }).await;
    eprintln!("{name}: Ready {:?} after it was created", t.elapsed());
    let [cm, app, web] = ["config", "app", "web"].map(|o| format!("{prefix}-{o}"));
    let data = ns.api::<ConfigMap>().get(&cm).await.unwrap().data.unwrap();
    assert_eq!(data.get("greeting").map(String::as_str), Some("hallo"));
    let cluster_ip = ns.api::<Service>().get(&web).await.unwrap().spec.and_then(|s| s.cluster_ip).unwrap();
    assert_eq!(ns.api::<Deployment>().get(&app).await.unwrap().spec.and_then(|s| s.replicas), Some(0));
    let outputs = stacks.get(name).await.unwrap().status.unwrap().outputs.unwrap();
    assert_eq!(
        (&outputs["configMap"], &outputs["deployment"], &outputs["clusterIP"]),
        (&json!(cm), &json!(app), &json!(cluster_ip))
    );

    delete_and_check_destroyed(&ns, name, [cm.as_str(), app.as_str(), web.as_str()]).await;
    drop(op);
}

#[tokio::test]
async fn a_python_program_of_kubernetes_resources_deploys_and_is_destroyed_with_the_real_provider() {
    let setup = setup("k8s-provider-py").await;
    // the bed's Python program (scripts/testbed/programs/python-kubernetes), its SDKs in the bed's virtualenv
    let dir = setup.2.dir().join("pyapp");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["Pulumi.yaml", "__main__.py", "requirements.txt"] {
        std::fs::copy(pko_testbed::repo_root().join("scripts/testbed/programs/python-kubernetes").join(f), dir.join(f))
            .unwrap();
    }
    let spec = json!({"workspaceTemplate": {"spec": {"local": {"dir": dir.display().to_string()}}}});
    deploy_check_destroy(setup, "pyapp", "py", spec).await;
}

/// The bed's Go program (`scripts/testbed/programs/go-kubernetes`, `pulumi-kubernetes` sdk/v4 from the
/// Go module proxy) from a git repository: `pulumi install` downloads its modules and the plugin version
/// its SDK names (from a loopback plugin server), the Go language host builds it; the module proxy is
/// switched off (`GOPROXY=off`), so everything comes from the bed's Go caches.
#[tokio::test]
async fn a_go_program_of_kubernetes_resources_from_git_deploys_and_is_destroyed_with_the_real_provider() {
    let setup = setup("k8s-provider-go").await;
    let root = setup.2.dir().join("git-root");
    std::fs::create_dir_all(&root).unwrap();
    let program = |f: &str| {
        std::fs::read_to_string(pko_testbed::repo_root().join("scripts/testbed/programs/go-kubernetes").join(f))
            .unwrap()
    };
    let files = ["Pulumi.yaml", "go.mod", "go.sum", "main.go"].map(|f| (f, program(f)));
    let files: Vec<(&str, &str)> = files.iter().map(|(f, c)| (*f, c.as_str())).collect();
    pko_testbed::git::bare_repo_with(&root, "goapp.git", &files);
    let git = pko_testbed::git::GitHttpServer::start(&root, "127.0.0.1:0", None).await.unwrap();
    let plugins = pko_testbed::plugins::PluginServer::kubernetes(&["4.24.0"], Default::default()).await;
    let literal = |v: &str| json!({"type": "Literal", "literal": {"value": v}});
    let mut refs = serde_json::Map::from_iter([(
        "PULUMI_PLUGIN_DOWNLOAD_URL_OVERRIDES".to_string(),
        literal(&plugins.overrides()),
    )]);
    refs.extend(pko_testbed::offline_go_env().map(|(k, v)| (k.to_string(), literal(&v))));
    let spec = json!({"projectRepo": git.url("goapp.git"), "branch": "main", "envRefs": refs});
    deploy_check_destroy(setup, "goapp", "go", spec).await;
}
