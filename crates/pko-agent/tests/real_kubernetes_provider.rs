//! A TypeScript program with `@pulumi/kubernetes` from npm and the real Kubernetes provider built in
//! the bed (issue "Real programs, as PKO users write them"), run by the agent from a Flux-style artifact:
//! `pulumi install` (npm, from the npm registry; its download cache kept outside the repository) once
//! for the revision, then `up` into the bed's own API server, then `destroy`. Not the stand-in `command`
//! provider. `pulumi install` installs the plugin the SDK names (`kubernetes` v4.24.1) as PKO's
//! workspaces do; without the internet it downloads it from a loopback plugin server (Pulumi's
//! `PULUMI_PLUGIN_DOWNLOAD_URL_OVERRIDES`) that serves the bed's build under that name — the operation
//! itself runs the bed's build on `PATH` (an ambient plugin), whichever is installed. The same three
//! objects from a Go program (the Go language host and the Go SDKs from the Go module proxy), built
//! offline from the bed's Go caches.

mod common;

use std::collections::HashMap;

use common::*;
use pko_proto::v1::{ArtifactSource, OperationType, ResultStatus, Source, source};
use pko_testbed::testbed;

/// A program of the ConfigMap (greeting of config `greeting`), Deployment and Service named
/// `<prefix>-config`, `<prefix>-app`, `<prefix>-web`, as the agent receives it: a Flux-style artifact.
struct Program<'a> {
    /// Names the objects and the operations.
    prefix: &'a str,
    files: &'a [(&'a str, &'a [u8])],
    /// The plugin version its SDK names (`pulumi install` installs it).
    plugin_version: &'a str,
    /// The agent's environment besides the bed's (language caches, offline switches).
    agent_env: Vec<(&'a str, String)>,
}

/// Installs and deploys `p` with the agent into a fresh namespace of the bed's API server, deploys a
/// changed greeting, destroys it, and checks each step on the objects. Returns the first and the warm
/// operation's time.
async fn deploy_change_destroy(p: Program<'_>) -> (std::time::Duration, std::time::Duration) {
    let env = pulumi_env();
    let bed = testbed();
    let ns = format!("agent-k8s-{}-{}", p.prefix, rand_suffix());
    let made = bed.kubectl().args(["create", "namespace", &ns]).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let tar = tarball(p.files);
    // a second revision of a Node.js or Python program: its code changed, its dependencies not
    let seeds = p.files.iter().any(|(f, _)| *f == "package.json" || *f == "requirements.txt");
    let edit = |f: &str, c: &[u8]| match f {
        "index.ts" => [c, b"\n// revision 2\n".as_slice()].concat(),
        "__main__.py" => [c, b"\n# revision 2\n".as_slice()].concat(),
        _ => c.to_vec(),
    };
    let changed: Vec<(&str, Vec<u8>)> = p.files.iter().map(|(f, c)| (*f, edit(f, c))).collect();
    let tar2 = tarball(&changed.iter().map(|(f, c)| (*f, c.as_slice())).collect::<Vec<_>>());
    let server = pko_testbed::plugins::PluginServer::kubernetes(
        &[p.plugin_version],
        HashMap::from([("/app.tar.gz".to_string(), tar.clone()), ("/app2.tar.gz".to_string(), tar2.clone())]),
    )
    .await;
    let kubeconfig = bed.kubeconfig().display().to_string();
    let overrides = server.overrides();
    let mut agent_env: Vec<(&str, &str)> =
        vec![("KUBECONFIG", &kubeconfig), ("PULUMI_PLUGIN_DOWNLOAD_URL_OVERRIDES", &overrides)];
    agent_env.extend(p.agent_env.iter().map(|(k, v)| (*k, v.as_str())));
    let agent = Agent::start(&env, &["--auth", "none"], &agent_env);
    let mut c = agent.client().await;
    // the artifact `path` of the plugin server, holding `tar`
    let artifact = |path: &str, tar: &[u8]| Source {
        kind: Some(source::Kind::Artifact(ArtifactSource {
            url: format!("{}/{path}", server.http.base),
            digest: sha256(tar),
            dir: String::new(),
            mirrors: vec![],
        })),
    };
    let mut req = request(&env, &format!("{}-k8s-up", p.prefix), env.dir(), "dev", OperationType::Up);
    req.source = Some(artifact("app.tar.gz", &tar));
    req.config = vec![config("ns", serde_json::json!(ns), false), config("greeting", serde_json::json!("hej"), false)];
    let t = std::time::Instant::now();
    let events = run(&mut c, req.clone()).await;
    let first = t.elapsed();
    let r = result(&events);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", all_text(&events));
    let (cm, app, web) = (format!("{}-config", p.prefix), format!("{}-app", p.prefix), format!("{}-web", p.prefix));
    let out = outputs(&r);
    assert_eq!(
        (out["configMap"].0.clone(), out["deployment"].0.clone()),
        (serde_json::json!(cm), serde_json::json!(app))
    );
    let greeting = || {
        bed.kubectl()
            .args(["-n", &ns, "get", "configmap", &cm, "-o", "jsonpath={.data.greeting}"])
            .output()
            .unwrap()
            .stdout
    };
    assert_eq!(String::from_utf8_lossy(&greeting()), "hej", "the ConfigMap is in the bed's API server");
    let ip =
        bed.kubectl().args(["-n", &ns, "get", "service", &web, "-o", "jsonpath={.spec.clusterIP}"]).output().unwrap();
    assert_eq!(out["clusterIP"].0, serde_json::json!(String::from_utf8_lossy(&ip.stdout)));

    // warm: the installed revision is reused
    req.operation_id = format!("{}-k8s-up-2", p.prefix);
    req.config[1] = config("greeting", serde_json::json!("hej igen"), false);
    let t = std::time::Instant::now();
    let r = result(&run(&mut c, req.clone()).await);
    let warm = t.elapsed();
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
    assert_eq!(String::from_utf8_lossy(&greeting()), "hej igen");

    if seeds {
        // the second revision starts from the first's node_modules or virtualenv (same manifests) and runs
        req.operation_id = format!("{}-k8s-up-3", p.prefix);
        req.source = Some(artifact("app2.tar.gz", &tar2));
        req.config[1] = config("greeting", serde_json::json!("revision 2"), false);
        let t = std::time::Instant::now();
        let r = result(&run(&mut c, req.clone()).await);
        assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
        eprintln!("the second revision's first up: {:?}", t.elapsed());
        assert_eq!(String::from_utf8_lossy(&greeting()), "revision 2");
        let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
        let seeded =
            log.lines().find(|l| l.contains("seeded the dependency tree from a revision with the same manifests"));
        let seeded = seeded.unwrap_or_else(|| panic!("no seed in the agent's log: {log}"));
        eprintln!("{seeded}");
        // no operation holds the first revision now: its tree is moved, not copied
        assert!(seeded.ends_with("moved=true"), "the first revision's tree was copied: {seeded}");
        if p.files.iter().any(|(f, _)| *f == "requirements.txt") {
            let checked = log.lines().find(|l| l.contains("pip checked the seeded virtualenv"));
            eprintln!("{}", checked.unwrap_or_else(|| panic!("pip did not check the seeded virtualenv: {log}")));
        }
        if p.files.iter().any(|(f, _)| *f == "package-lock.json" || *f == "requirements.txt") {
            // the tree and Pulumi.yaml are the first revision's: so are its plugins, installed; the provider the
            // up above used is that one
            let settled = log.lines().find(|l| l.contains("plugins as the donor's: no pulumi install"));
            eprintln!("{}", settled.unwrap_or_else(|| panic!("a settled seed still ran pulumi install: {log}")));
        }
    }

    req.operation_id = format!("{}-k8s-destroy", p.prefix);
    req.r#type = OperationType::Destroy as i32;
    let r = result(&run(&mut c, req).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
    for kind in [format!("configmap/{cm}"), format!("deployment/{app}"), format!("service/{web}")] {
        let got = bed.kubectl().args(["-n", &ns, "get", &kind, "--ignore-not-found", "-o", "name"]).output().unwrap();
        assert!(got.stdout.is_empty(), "{kind} destroyed: {}", String::from_utf8_lossy(&got.stdout));
    }
    let _ = bed.kubectl().args(["delete", "namespace", &ns, "--wait=false"]).output();
    (first, warm)
}

#[tokio::test]
async fn a_typescript_program_of_kubernetes_resources_installs_deploys_and_destroys_with_the_real_provider() {
    // @pulumi/kubernetes 4.24.1: the newest npm release not newer than the bed's provider build
    // with its lockfile, as projects commit it: a second revision's seeded tree is then settled (no npm install)
    let files: [(&str, &[u8]); 4] = [
        ("Pulumi.yaml", include_bytes!("../../../scripts/testbed/programs/typescript-kubernetes/Pulumi.yaml")),
        ("package.json", include_bytes!("../../../scripts/testbed/programs/typescript-kubernetes/package.json")),
        (
            "package-lock.json",
            include_bytes!("../../../scripts/testbed/programs/typescript-kubernetes/package-lock.json"),
        ),
        ("index.ts", include_bytes!("../../../scripts/testbed/programs/typescript-kubernetes/index.ts")),
    ];
    let npm_cache = format!("{}/.npm", std::env::var("HOME").unwrap_or_else(|_| "/root".into()));
    let (first, warm) = deploy_change_destroy(Program {
        prefix: "ts",
        files: &files,
        plugin_version: "4.24.1",
        agent_env: vec![("npm_config_cache", npm_cache)],
    })
    .await;
    eprintln!("TypeScript program: first up (npm install included) {first:?}, warm up {warm:?}");
}

/// The Python program of the bed (`scripts/testbed/programs/python-kubernetes`: `pulumi-kubernetes` 4.24.0 from the
/// package index): `pulumi install` makes its virtualenv; a second revision's is seeded from it and checked by pip.
#[tokio::test]
async fn a_python_program_of_kubernetes_resources_installs_deploys_and_destroys_with_the_real_provider() {
    let files: [(&str, &[u8]); 3] = [
        ("Pulumi.yaml", include_bytes!("../../../scripts/testbed/programs/python-kubernetes/Pulumi.yaml")),
        ("__main__.py", include_bytes!("../../../scripts/testbed/programs/python-kubernetes/__main__.py")),
        ("requirements.txt", include_bytes!("../../../scripts/testbed/programs/python-kubernetes/requirements.txt")),
    ];
    let (first, warm) =
        deploy_change_destroy(Program { prefix: "py", files: &files, plugin_version: "4.24.0", agent_env: vec![] })
            .await;
    eprintln!("Python program: first up (virtualenv and pip install included) {first:?}, warm up {warm:?}");
}

/// The Go program of the bed (`scripts/testbed/programs/go-kubernetes`: `pulumi-kubernetes` sdk/v4
/// v4.24.0 from the Go module proxy), built by the Go language host with the bed's Go toolchain. The
/// module proxy is switched off (`GOPROXY=off`): `go mod download` and `go build` read only the Go
/// caches the bed filled, which the agent's isolated operations (a `HOME` of their own) are pointed at
/// with `GOMODCACHE` and `GOCACHE`, as the TypeScript test points npm at its cache.
#[tokio::test]
async fn a_go_program_of_kubernetes_resources_builds_offline_deploys_and_destroys_with_the_real_provider() {
    let files: [(&str, &[u8]); 4] = [
        ("Pulumi.yaml", include_bytes!("../../../scripts/testbed/programs/go-kubernetes/Pulumi.yaml")),
        ("go.mod", include_bytes!("../../../scripts/testbed/programs/go-kubernetes/go.mod")),
        ("go.sum", include_bytes!("../../../scripts/testbed/programs/go-kubernetes/go.sum")),
        ("main.go", include_bytes!("../../../scripts/testbed/programs/go-kubernetes/main.go")),
    ];
    let agent_env = pko_testbed::offline_go_env().to_vec();
    let (first, warm) =
        deploy_change_destroy(Program { prefix: "go", files: &files, plugin_version: "4.24.0", agent_env }).await;
    eprintln!("Go program: first up (go mod download and go build included) {first:?}, warm up {warm:?}");
}
