//! Helpers for operator tests: the real agent binary, projects, objects.
#![allow(dead_code)]

use std::io::BufRead;
use std::process::{Command, Stdio};

use kube::api::PostParams;
use pko_api::Update;
use pko_testbed::testbed;

pub struct AgentProc(pub std::process::Child, pub String);
impl Drop for AgentProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the workspace agent binary built next to this test (cargo builds every binary of the workspace
/// before running `cargo test --workspace`).
pub fn start_agent(env: &pko_testbed::PulumiEnv, namespace: &str) -> AgentProc {
    let bin = agent_bin();
    let work = env.dir().join("agent-work");
    let mut child = Command::new(bin)
        .args(["serve", "--listen", "127.0.0.1:0", "--auth", "none", "--kube-workspace-namespace", namespace, "--work-dir"])
        .arg(&work)
        .env_clear()
        .envs(env.vars())
        .env("HOME", env.dir())
        .env("KUBECONFIG", testbed().kubeconfig())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut reader = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
    let addr = line.trim().strip_prefix("listening on ").unwrap().to_string();
    AgentProc(child, format!("http://{addr}"))
}

/// The `pko-agent` binary next to this test's directory (cargo builds every workspace binary for
/// `cargo test --workspace`; `make test` builds them first).
pub fn agent_bin() -> std::path::PathBuf {
    let bin = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("pko-agent");
    assert!(bin.exists(), "{} is missing: build it with `cargo build -p pko-agent`", bin.display());
    bin
}

pub fn project(env: &pko_testbed::PulumiEnv, name: &str, body: &str) -> std::path::PathBuf {
    let dir = env.dir().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("Pulumi.yaml"), format!("name: {name}\nruntime: yaml\n{body}")).unwrap();
    dir
}

pub async fn create<K>(api: &kube::Api<K>, v: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(&PostParams::default(), &serde_json::from_value(v).unwrap()).await.unwrap()
}

pub fn condition(u: &Update, t: &str) -> Option<(String, String)> {
    u.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == t).map(|c| (c.status.clone(), c.reason.clone()))
}

