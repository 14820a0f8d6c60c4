//! Flux sources for real: the Flux source-controller (built from the Go module proxy by the test bed)
//! runs against the bed's API server and fetches a GitRepository from a loopback git server. A Stack
//! whose `fluxSource` names it waits for the first artifact, deploys it, and deploys a new commit —
//! a new artifact revision — with no change to the Stack: the operator watches the source kind.

mod common;

use std::time::Duration;

use common::*;
use pko_api::{Stack, Update};
use pko_testbed::{eventually, testbed};
use serde_json::json;

/// The source-controller process; killed on drop.
struct SourceController(std::process::Child);

impl Drop for SourceController {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Installs the Flux source CRDs shipped with the bed's source-controller and starts it, watching
/// `ns` only, storing artifacts under `dir` and serving them on a loopback port.
fn start_source_controller(ns: &str, dir: &std::path::Path) -> SourceController {
    let bed = testbed();
    let share = bed.bin_dir().join("../share/flux-source-controller");
    let out = bed
        .kubectl()
        .args(["apply", "--server-side", "--force-conflicts", "-f"])
        .arg(share.join("crds"))
        .output()
        .unwrap();
    assert!(out.status.success(), "installing the Flux CRDs: {}", String::from_utf8_lossy(&out.stderr));
    let out = bed
        .kubectl()
        .args(["wait", "--for=condition=Established", "--timeout=60s", "-f"])
        .arg(share.join("crds"))
        .output()
        .unwrap();
    assert!(out.status.success(), "the Flux CRDs are not Established: {}", String::from_utf8_lossy(&out.stderr));
    let storage = format!("127.0.0.1:{}", free_port());
    std::fs::create_dir_all(dir.join("storage")).unwrap();
    let log = std::fs::File::create(dir.join("source-controller.log")).unwrap();
    let child = std::process::Command::new(bed.bin_dir().join("source-controller"))
        .args(["--watch-all-namespaces=false", "--enable-leader-election=false", "--log-level=info"])
        .arg(format!("--storage-path={}", dir.join("storage").display()))
        .arg(format!("--storage-addr={storage}"))
        .arg(format!("--storage-adv-addr={storage}"))
        .arg(format!("--metrics-addr=127.0.0.1:{}", free_port()))
        .arg(format!("--health-addr=127.0.0.1:{}", free_port()))
        .env("KUBECONFIG", bed.kubeconfig())
        .env("RUNTIME_NAMESPACE", ns)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("the bed's source-controller");
    SourceController(child)
}

/// Creates the Flux GitRepository `name` in `ns` of branch `main` of `url`, fetched every `interval`.
async fn create_git_repository(client: &kube::Client, ns: &str, name: &str, url: &str, interval: &str) {
    let git_repos = kube::Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        ns,
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "source.toolkit.fluxcd.io",
            "v1",
            "GitRepository",
        )),
    );
    let repo: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "metadata": {"name": name},
        "spec": {"url": url, "interval": interval, "ref": {"branch": "main"}}}))
    .unwrap();
    git_repos.create(&Default::default(), &repo).await.unwrap();
}

fn git(args: &[&str], cwd: &std::path::Path) {
    let out = std::process::Command::new("git").args(args).current_dir(cwd).output().unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn pulumi_yaml(greeting: &str) -> String {
    format!(
        "name: fluxed\nruntime: yaml\nresources:\n  greet:\n    type: command:local:Command\n    properties:\n      \
            create: echo {greeting}\noutputs:\n  greeting: ${{greet.stdout}}\n"
    )
}

fn output(s: &Stack) -> Option<String> {
    s.status.as_ref()?.outputs.as_ref()?.get("greeting")?.as_str().map(str::to_string)
}

#[tokio::test]
async fn a_new_flux_artifact_revision_runs_a_new_update() {
    let (client, ns, env) = setup("flux").await;
    let repos = env.dir().join("repos");
    std::fs::create_dir_all(&repos).unwrap();
    pko_testbed::git::bare_repo_with(&repos, "infra.git", &[("Pulumi.yaml", &pulumi_yaml("one"))]);
    let server = pko_testbed::git::GitHttpServer::start(&repos, "127.0.0.1:0", None).await.unwrap();
    let mut sc = start_source_controller(ns.name(), env.dir());
    passphrase_secret(&ns).await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    // the Stack first: it waits for the source's first artifact, which the watch then delivers
    let stacks = ns.api::<Stack>();
    create(
        &stacks,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "fluxed"},
               "spec": {"stack": "dev", "backend": env.backend_url(),
                        "fluxSource": {"sourceRef": {"apiVersion": "source.toolkit.fluxcd.io/v1",
                            "kind": "GitRepository", "name": "infra"}, "dir": "."},
                        "envRefs": passphrase_env_refs()}}),
    )
    .await;
    eventually("the Stack waits for an artifact", 60, || async {
        stalled(&stacks.get("fluxed").await.unwrap()).is_some_and(|(r, _)| r == "SourceUnavailable")
    })
    .await;
    create_git_repository(&client, ns.name(), "infra", &server.url("infra.git"), "2s").await;

    let end = tokio::time::Instant::now() + Duration::from_secs(180);
    while output(&stacks.get("fluxed").await.unwrap()).as_deref() != Some("one") {
        let exited = sc.0.try_wait().unwrap();
        if tokio::time::Instant::now() > end || exited.is_some() {
            let out = testbed()
                .kubectl()
                .args(["get", "stacks,updates,gitrepositories", "-n", ns.name(), "-o", "yaml"])
                .output()
                .unwrap();
            let log = std::fs::read_to_string(env.dir().join("source-controller.log")).unwrap_or_default();
            panic!(
                "the first artifact was not deployed in 180 s (source-controller exited: \
                    {exited:?}):\n{}\nsource-controller:\n{log}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let first =
        stacks.get("fluxed").await.unwrap().status.unwrap().last_update.unwrap().last_successful_commit.unwrap();
    assert!(first.starts_with("main@sha1:"), "the commit is the artifact revision: {first}");

    // a new commit: source-controller makes a new artifact revision, which alone runs a new Update
    let work = repos.join(".work-infra.git");
    std::fs::write(work.join("Pulumi.yaml"), pulumi_yaml("two")).unwrap();
    git(&["-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q", "-am", "two"], &work);
    git(&["push", "-q", repos.join("infra.git").to_str().unwrap(), "main"], &work);
    let t0 = std::time::Instant::now();
    eventually("the new revision is deployed", 180, || async {
        output(&stacks.get("fluxed").await.unwrap()).as_deref() == Some("two")
    })
    .await;
    eprintln!("push → deployed: {:?}", t0.elapsed());
    let s = stacks.get("fluxed").await.unwrap();
    assert_eq!(s.metadata.generation, Some(1), "the Stack itself never changed");
    let last = s.status.unwrap().last_update.unwrap();
    assert_ne!(last.last_successful_commit.as_deref(), Some(first.as_str()));
    let ups = ns.api::<Update>().list(&Default::default()).await.unwrap().items;
    assert_eq!(
        ups.iter().filter(|u| u.spec.stack_name.as_deref() == Some("dev")).count(),
        2,
        "one Update per artifact revision"
    );
}

/// A real program from a Flux source on a pool (issue "Real programs, as PKO users write them"): the
/// bed's TypeScript program (`scripts/testbed/programs/typescript-kubernetes`, `@pulumi/kubernetes` from
/// npm) in a GitRepository, fetched by the real source-controller, installed (`npm install`) and
/// deployed by a pooled agent — each operation in its own directories — with the real Kubernetes
/// provider into the bed's API server as the Workspace's service account (the pool's class); deleting
/// the Stack (`destroyOnFinalize`) destroys it.
#[tokio::test]
async fn a_typescript_program_from_a_flux_source_deploys_on_a_pool_with_the_real_kubernetes_provider() {
    let (client, ns, env) = setup("flux-ts").await;
    let repos = env.dir().join("repos");
    std::fs::create_dir_all(&repos).unwrap();
    let program = pko_testbed::repo_root().join("scripts/testbed/programs/typescript-kubernetes");
    let files =
        ["Pulumi.yaml", "package.json", "index.ts"].map(|f| (f, std::fs::read_to_string(program.join(f)).unwrap()));
    let files: Vec<(&str, &str)> = files.iter().map(|(f, c)| (*f, c.as_str())).collect();
    pko_testbed::git::bare_repo_with(&repos, "app.git", &files);
    let server = pko_testbed::git::GitHttpServer::start(&repos, "127.0.0.1:0", None).await.unwrap();
    let _sc = start_source_controller(ns.name(), env.dir());
    create_git_repository(&client, ns.name(), "app", &server.url("app.git"), "1m").await;
    let plugins = pko_testbed::plugins::PluginServer::kubernetes(&["4.24.1"], Default::default()).await;
    passphrase_secret(&ns).await;
    let _op = InProcessOperator::start_with(&client, &env, run_args_with(&env, ns.name(), &["--agent-pools"])).await;
    let literal = |v: &str| json!({"type": "Literal", "literal": {"value": v}});
    let mut env_refs = passphrase_env_refs();
    // no kubeconfig: a pool's class is its namespace and service account, whose kubeconfig its agents
    // give Pulumi; the provider deploys with that account's RBAC (`edit` in the namespace)
    let bound = testbed()
        .kubectl()
        .args([
            "create",
            "rolebinding",
            "deployer",
            "-n",
            ns.name(),
            "--clusterrole=edit",
            &format!("--serviceaccount={}:default", ns.name()),
        ])
        .output()
        .unwrap();
    assert!(bound.status.success(), "{}", String::from_utf8_lossy(&bound.stderr));
    env_refs["PULUMI_PLUGIN_DOWNLOAD_URL_OVERRIDES"] = literal(&plugins.overrides());
    env_refs["npm_config_cache"] =
        literal(&format!("{}/.npm", std::env::var("HOME").unwrap_or_else(|_| "/root".into())));
    let stacks = ns.api::<Stack>();
    let t = std::time::Instant::now();
    create(
        &stacks,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "tsapp"},
               "spec": {"stack": "dev", "backend": env.backend_url(), "destroyOnFinalize": true, "envRefs": env_refs,
                        "config": {"ns": ns.name(), "greeting": "hej"},
                        "fluxSource": {"sourceRef": {"apiVersion": "source.toolkit.fluxcd.io/v1",
                            "kind": "GitRepository", "name": "app"}, "dir": "."}}}),
    )
    .await;
    eventually("the Stack is Ready", 300, || async { ready(&stacks.get("tsapp").await.unwrap()) }).await;
    eprintln!(
        "TypeScript from Flux on a pool: Ready {:?} after the Stack was created (npm install included)",
        t.elapsed()
    );
    let outputs = stacks.get("tsapp").await.unwrap().status.unwrap().outputs.unwrap();
    assert_eq!((&outputs["configMap"], &outputs["deployment"]), (&json!("ts-config"), &json!("ts-app")));
    let cm = ns.api::<k8s_openapi::api::core::v1::ConfigMap>().get("ts-config").await.unwrap();
    assert_eq!(cm.data.unwrap().get("greeting").map(String::as_str), Some("hej"));
    let workspace = ns.api::<pko_api::Workspace>().get("tsapp").await.unwrap();
    assert!(workspace.status.and_then(|s| s.pool).is_some(), "the Workspace ran on a pool");

    stacks.delete("tsapp", &Default::default()).await.unwrap();
    eventually("the Stack is finalized", 180, || async { stacks.get_opt("tsapp").await.unwrap().is_none() }).await;
    assert!(
        ns.api::<k8s_openapi::api::core::v1::ConfigMap>().get_opt("ts-config").await.unwrap().is_none(),
        "destroyed on finalize"
    );
}
