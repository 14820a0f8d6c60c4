//! The Program controller and the artifact server against the test bed: a Program becomes a
//! digest-verified tarball at `status.artifact.url` that Pulumi deploys.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Patch, PatchParams, PostParams};
use pko_api::Program;
use pko_operator::context::Context;
use pko_operator::ownership::Namespaces;
use pko_testbed::testbed;
use serde_json::json;

async fn wait_artifact(api: &kube::Api<Program>, name: &str, generation: i64) -> pko_api::program::Artifact {
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let p = api.get(name).await.unwrap();
        if let Some(a) = p
            .status
            .as_ref()
            .and_then(|s| s.artifact.clone())
            .filter(|a| a.revision.as_deref() == Some(generation.to_string().as_str()))
        {
            assert_eq!(p.status.unwrap().observed_generation, Some(generation));
            return a;
        }
        assert!(tokio::time::Instant::now() < end, "no artifact for generation {generation}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The bytes served at `url` once it is served (within 10 s).
async fn served(http: &reqwest::Client, url: &str) -> Vec<u8> {
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = http.get(url).send().await.unwrap();
        if r.status().is_success() {
            return r.bytes().await.unwrap().to_vec();
        }
        assert!(tokio::time::Instant::now() < end, "{url} not served within 10 s: {}", r.status());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn untar(bytes: &[u8]) -> String {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes));
    let mut entries = archive.entries().unwrap();
    let mut e = entries.next().unwrap().unwrap();
    assert_eq!(e.path().unwrap().to_str(), Some("Pulumi.yaml"));
    assert_eq!(e.header().mode().unwrap(), 0o775);
    let mut s = String::new();
    e.read_to_string(&mut s).unwrap();
    assert!(entries.next().is_none(), "one file only");
    s
}

fn program_named(name: &str) -> Program {
    serde_json::from_value(json!({
        "apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": name},
        "program": {
            "configuration": {"greeting": {"type": "String", "default": "hi"}},
            "resources": {"greet": {"type": "command:local:Command",
                "properties": {"create": "echo ${greeting} there"}}},
            "outputs": {"message": "${greet.stdout}"}
        }
    }))
    .unwrap()
}

fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())
}

#[tokio::test]
async fn program_is_published_served_and_deployable() {
    let bed = testbed();
    let client = bed.client().await.unwrap();
    pko_testbed::install_crds(&client, pko_api::crds()).await.unwrap();
    let ns = bed.namespace("program").await.unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let ctx = Arc::new(Context::new(client.clone(), addr.clone(), Arc::new(Namespaces::one(ns.name()))));
    let mut informers = pko_operator::informer::Informers::new(
        client.clone(),
        pko_operator::informer::WatchScope::Namespaces(vec![ns.name().to_string()]),
    );
    let (programs, run) = pko_operator::program::program_controller(ctx.clone(), &mut informers);
    let run = informers.drive(run);
    let state = pko_operator::artifacts::ArtifactState::new(programs);
    let server = tokio::spawn(pko_operator::artifacts::serve(listener, state));
    let controller = tokio::spawn(run);

    let api = ns.api::<Program>();
    api.create(&PostParams::default(), &program_named("hello")).await.unwrap();
    let a1 = wait_artifact(&api, "hello", 1).await;
    let hex = a1.digest.clone().unwrap().trim_start_matches("sha256:").to_string();
    assert_eq!(a1.url, format!("http://{addr}/programs/{}/hello/1/{hex}.tar.gz", ns.name()));
    assert_eq!(a1.path, format!("programs/{}/hello/1/{hex}.tar.gz", ns.name()));

    let http = reqwest::Client::new();
    let bytes = served(&http, &a1.url).await;
    assert_eq!(Some(pko_operator::program::digest(&bytes)), a1.digest, "the served bytes match the published digest");
    assert_eq!(Some(bytes.len() as i64), a1.size);
    let yaml = untar(&bytes);
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    assert_eq!((doc["name"].as_str(), doc["runtime"].as_str()), (Some("hello"), Some("yaml")));

    // the rendered project deploys with the real CLI
    let env = bed.pulumi_env().unwrap();
    let dir = env.dir().join("project");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("Pulumi.yaml"), &yaml).unwrap();
    for args in [&["stack", "init", "dev"][..], &["up", "--yes", "--skip-preview"]] {
        let out = env.pulumi(&dir).args(args).output().unwrap();
        assert!(out.status.success(), "pulumi {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let out = env.pulumi(&dir).args(["stack", "output", "message"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hi there");

    // a new generation publishes a new artifact; the old generation is gone
    api.patch(
        "hello",
        &PatchParams::apply("pko-tests"),
        &Patch::Merge(json!({"program": {"configuration": {"greeting": {"type": "String", "default": "hello"}}}})),
    )
    .await
    .unwrap();
    let a2 = wait_artifact(&api, "hello", 2).await;
    assert_ne!(a2.digest, a1.digest);
    assert_eq!(http.get(&a1.url).send().await.unwrap().status(), 404);
    // the server answers from its Program cache, which may see the new status a moment after the API
    let bytes = served(&http, &a2.url).await;
    assert_eq!(Some(pko_operator::program::digest(&bytes)), a2.digest);
    assert_eq!(
        http.get(format!("http://{addr}/programs/{}/missing/1/{hex}.tar.gz", ns.name())).send().await.unwrap().status(),
        404
    );
    // the name and generation alone do not fetch it: the digest is part of the URL
    let guessed = format!("http://{addr}/programs/{}/hello/2/{}.tar.gz", ns.name(), "0".repeat(64));
    assert_eq!(http.get(&guessed).send().await.unwrap().status(), 404);
    // a Program outside this replica's watch scope is not served, even with its real URL
    let other = bed.namespace("program-other").await.unwrap();
    other.api::<Program>().create(&PostParams::default(), &program_named("hello")).await.unwrap();
    let foreign = pko_operator::program::desired_artifact(
        &other.api::<Program>().get("hello").await.unwrap(),
        &addr,
        None,
        now(),
    )
    .unwrap();
    assert_eq!(http.get(&foreign.url).send().await.unwrap().status(), 404);

    controller.abort();
    server.abort();
}
