//! A TypeScript program with `@pulumi/kubernetes` from npm and the real Kubernetes provider built in
//! the bed (issue "Real programs, as PKO users write them"), run by the agent from a Flux-style artifact:
//! `pulumi install` (npm, from the npm registry; its download cache kept outside the repository) once
//! for the revision, then `up` into the bed's own API server, then `destroy`. Not the stand-in `command`
//! provider. `pulumi install` installs the plugin the SDK names (`kubernetes` v4.24.1) as PKO's
//! workspaces do; without the internet it downloads it from a loopback plugin server (Pulumi's
//! `PULUMI_PLUGIN_DOWNLOAD_URL_OVERRIDES`) that serves the bed's build under that name — the operation
//! itself runs the bed's build on `PATH` (an ambient plugin), whichever is installed.

mod common;

use std::collections::HashMap;

use common::*;
use pko_proto::v1::{ArtifactSource, OperationType, ResultStatus, Source, source};
use pko_testbed::testbed;

const INDEX_TS: &str = r#"import * as pulumi from "@pulumi/pulumi";
import * as k8s from "@pulumi/kubernetes";

const config = new pulumi.Config();
const ns = config.require("ns");
const skipAwait = { "pulumi.com/skipAwait": "true" };
const cm = new k8s.core.v1.ConfigMap("config", { metadata: { name: "ts-config", namespace: ns }, data: { greeting: config.require("greeting") } });
const app = new k8s.apps.v1.Deployment("app", {
    metadata: { name: "ts-app", namespace: ns, annotations: skipAwait },
    spec: {
        replicas: 0,
        selector: { matchLabels: { app: "ts-app" } },
        template: { metadata: { labels: { app: "ts-app" } }, spec: { containers: [{ name: "app", image: "pko.local/app:1", envFrom: [{ configMapRef: { name: cm.metadata.name } }] }] } },
    },
});
const web = new k8s.core.v1.Service("web", {
    metadata: { name: "ts-web", namespace: ns, annotations: skipAwait },
    spec: { selector: { app: "ts-app" }, ports: [{ port: 80, targetPort: 8080 }] },
});
export const configMap = cm.metadata.name;
export const deployment = app.metadata.name;
export const clusterIP = web.spec.clusterIP;
"#;

/// The bed's `pulumi-resource-kubernetes` as a plugin archive named for `version`, as Pulumi's download
/// URLs name them (`pulumi-resource-kubernetes-v<version>-linux-amd64.tar.gz`).
fn provider_archive(env: &pko_testbed::PulumiEnv, version: &str) -> (String, Vec<u8>) {
    let path_var = env.vars().into_iter().find(|(k, _)| k == "PATH").unwrap().1;
    let binary = std::env::split_paths(&path_var).map(|d| d.join("pulumi-resource-kubernetes")).find(|p| p.is_file()).expect("the bed's pulumi-resource-kubernetes");
    let body = std::fs::read(binary).unwrap();
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    let mut header = tar::Header::new_gnu();
    header.set_size(body.len() as u64);
    header.set_mode(0o755);
    header.set_cksum();
    tar.append_data(&mut header, "pulumi-resource-kubernetes", body.as_slice()).unwrap();
    (format!("/plugins/pulumi-resource-kubernetes-v{version}-linux-amd64.tar.gz"), tar.into_inner().unwrap().finish().unwrap())
}

#[tokio::test]
async fn a_typescript_program_of_kubernetes_resources_installs_deploys_and_destroys_with_the_real_provider() {
    let env = pulumi_env();
    let bed = testbed();
    let ns = format!("agent-k8s-ts-{}", rand_suffix());
    let made = bed.kubectl().args(["create", "namespace", &ns]).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    // @pulumi/kubernetes 4.24.1: the newest npm release not newer than the bed's provider build
    let package = r#"{"name": "tsk8s", "main": "index.ts", "dependencies": {"@pulumi/pulumi": "3.259.0", "@pulumi/kubernetes": "4.24.1"}, "devDependencies": {"typescript": "^5.0.0", "@types/node": "^20.0.0"}}"#;
    let files: [(&str, &[u8]); 3] = [("Pulumi.yaml", b"name: tsk8s\nruntime: nodejs\n"), ("package.json", package.as_bytes()), ("index.ts", INDEX_TS.as_bytes())];
    let tar = tarball(&files);
    let server = serve_files(HashMap::from([("/app.tar.gz".to_string(), tar.clone()), provider_archive(&env, "4.24.1")])).await;
    let overrides = format!("^github://api.github.com/pulumi={}/plugins", server.base);
    let npm_cache = format!("{}/.npm", std::env::var("HOME").unwrap_or_else(|_| "/root".into()));
    let kubeconfig = bed.kubeconfig().display().to_string();
    let agent = Agent::start(&env, &["--auth", "none"], &[("npm_config_cache", &npm_cache), ("KUBECONFIG", &kubeconfig), ("PULUMI_PLUGIN_DOWNLOAD_URL_OVERRIDES", &overrides)]);
    let mut c = agent.client().await;
    let mut req = request(&env, "ts-k8s-up", env.dir(), "dev", OperationType::Up);
    req.source = Some(Source { kind: Some(source::Kind::Artifact(ArtifactSource { url: format!("{}/app.tar.gz", server.base), digest: sha256(&tar), dir: String::new() })) });
    req.config = vec![config("ns", serde_json::json!(ns), false), config("greeting", serde_json::json!("hej"), false)];
    let t = std::time::Instant::now();
    let events = run(&mut c, req.clone()).await;
    let r = result(&events);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", all_text(&events));
    eprintln!("first up of the TypeScript program (npm install included): {:?}", t.elapsed());
    let out = outputs(&r);
    assert_eq!((out["configMap"].0.clone(), out["deployment"].0.clone()), (serde_json::json!("ts-config"), serde_json::json!("ts-app")));
    let got = bed.kubectl().args(["-n", &ns, "get", "configmap", "ts-config", "-o", "jsonpath={.data.greeting}"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&got.stdout), "hej", "the ConfigMap is in the bed's API server");
    let ip = bed.kubectl().args(["-n", &ns, "get", "service", "ts-web", "-o", "jsonpath={.spec.clusterIP}"]).output().unwrap();
    assert_eq!(out["clusterIP"].0, serde_json::json!(String::from_utf8_lossy(&ip.stdout)));

    // warm: the installed revision is reused
    req.operation_id = "ts-k8s-up-2".into();
    req.config[1] = config("greeting", serde_json::json!("hej igen"), false);
    let t = std::time::Instant::now();
    let r = result(&run(&mut c, req.clone()).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
    eprintln!("warm up of the TypeScript program: {:?}", t.elapsed());
    let got = bed.kubectl().args(["-n", &ns, "get", "configmap", "ts-config", "-o", "jsonpath={.data.greeting}"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&got.stdout), "hej igen");

    req.operation_id = "ts-k8s-destroy".into();
    req.r#type = OperationType::Destroy as i32;
    let r = result(&run(&mut c, req).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
    for kind in ["configmap/ts-config", "deployment/ts-app", "service/ts-web"] {
        let got = bed.kubectl().args(["-n", &ns, "get", kind, "--ignore-not-found", "-o", "name"]).output().unwrap();
        assert!(got.stdout.is_empty(), "{kind} destroyed: {}", String::from_utf8_lossy(&got.stdout));
    }
    let _ = bed.kubectl().args(["delete", "namespace", &ns, "--wait=false"]).output();
}
