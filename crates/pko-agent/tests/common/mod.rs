//! Harness for agent tests: starts the real `pko-agent` binary against the test bed's Pulumi CLI, gives
//! a gRPC client, builds requests, and serves artifacts over loopback HTTP.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use pko_proto::v1::agent_client::AgentClient;
use pko_proto::v1::{
    ConfigItem, EnvVar, LocalSource, OperationEvent, OperationRequest, OperationResult, OperationType, Source,
    StackSettings, ValueRef, config_item, operation_event::Event, source, value_ref,
};
use pko_testbed::{PulumiEnv, testbed};
use tonic::transport::Channel;

pub const PASSPHRASE: &str = PulumiEnv::PASSPHRASE;

/// A running agent process.
pub struct Agent {
    pub child: Child,
    /// The agent's own log (stderr).
    pub log: PathBuf,
    /// Its standard output after the handshake: the operations' lines.
    pub out: PathBuf,
    pub addr: String,
    pub work: tempfile::TempDir,
}

impl Agent {
    /// Starts `pko-agent serve` on a free loopback port with `extra` arguments and env.
    pub fn start(env: &PulumiEnv, extra: &[&str], extra_env: &[(&str, &str)]) -> Agent {
        let work = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pko-agent"));
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--work-dir"])
            .arg(work.path())
            .args(["--grace-seconds", "60"])
            .args(extra)
            .env_clear()
            .envs(env.vars())
            .env("HOME", env.dir())
            .env("RUST_LOG", "info")
            .envs(extra_env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // its own process group, like a container: `kill_group` ends it with its pulumi and plugins
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().expect("start pko-agent");
        let stdout = child.stdout.take().unwrap();
        // the agent's log goes to a file next to its work dir (shown when a test fails)
        let mut stderr = child.stderr.take().unwrap();
        let log = work.path().join("agent.log");
        let log_path = log.clone();
        std::thread::spawn(move || {
            let mut f = std::fs::File::create(&log_path).unwrap();
            std::io::copy(&mut stderr, &mut f)
        });
        let mut line = String::new();
        let mut reader = std::io::BufReader::new(stdout);
        reader.read_line(&mut line).unwrap();
        // keep draining stdout (into a file) so the agent can never block on a full pipe
        let out = work.path().join("agent.out");
        let out_path = out.clone();
        std::thread::spawn(move || {
            let mut f = std::fs::File::create(&out_path).unwrap();
            std::io::copy(&mut reader, &mut f)
        });
        let addr = pko_proto::listening_address(&line).unwrap_or_else(|| panic!("agent said {line:?}")).to_string();
        Agent { child, addr, work, log, out }
    }

    /// What the agent wrote to its standard output so far (after the handshake).
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    pub async fn client(&self) -> AgentClient<Channel> {
        AgentClient::connect(format!("http://{}", self.addr)).await.unwrap()
    }

    /// SIGTERM (the pod's termination signal).
    pub fn sigterm(&self) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::Signal::SIGTERM)
            .unwrap();
    }

    /// SIGKILL to the agent's whole process group — the agent, its `pulumi` and the plugins — as when
    /// a pod is OOM-killed or its node is lost; returns once no process of the group is left.
    pub fn kill_group(&mut self) {
        let group = nix::unistd::Pid::from_raw(-(self.child.id() as i32));
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
        let end = std::time::Instant::now() + Duration::from_secs(30);
        while nix::sys::signal::kill(group, None).is_ok() {
            assert!(std::time::Instant::now() < end, "the agent's process group outlived SIGKILL for 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the process to exit; panics after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let end = std::time::Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(std::time::Instant::now() < end, "agent did not exit within {timeout:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh Pulumi environment (home, file:// backend, passphrase) on the bed.
pub fn pulumi_env() -> PulumiEnv {
    testbed().pulumi_env().unwrap()
}

/// The lock files of the env's `file://` backend (`.pulumi/locks/**.json`).
pub fn lock_files(env: &PulumiEnv) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "json") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&env.dir().join("state/.pulumi/locks"), &mut out);
    out
}

/// Writes a Pulumi YAML project into a new directory under `env` and returns its path.
pub fn project(env: &PulumiEnv, name: &str, body: &str) -> PathBuf {
    let dir = env.dir().join(format!("src-{name}-{}", rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("Pulumi.yaml"), format!("name: {name}\nruntime: yaml\n{body}")).unwrap();
    dir
}

pub fn rand_suffix() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() % 0xffff_ffff
    )
}

pub fn literal(v: &str) -> ValueRef {
    ValueRef { kind: Some(value_ref::Kind::Literal(v.into())), origin: String::new() }
}

/// A request for `kind` on `stack` of the project in `dir`, with the env's backend and passphrase.
pub fn request(env: &PulumiEnv, id: &str, dir: &Path, stack: &str, kind: OperationType) -> OperationRequest {
    OperationRequest {
        operation_id: id.into(),
        epoch: 1,
        source: Some(Source { kind: Some(source::Kind::Local(LocalSource { dir: dir.display().to_string() })) }),
        stack: Some(StackSettings {
            name: stack.into(),
            create: true,
            secrets_provider: "passphrase".into(),
            ..Default::default()
        }),
        config: vec![],
        env: vec![
            EnvVar { name: "PULUMI_BACKEND_URL".into(), value: Some(literal(&env.backend_url())), secret: false },
            EnvVar { name: "PULUMI_CONFIG_PASSPHRASE".into(), value: Some(literal(PASSPHRASE)), secret: true },
        ],
        r#type: kind as i32,
        options: Some(Default::default()),
        ..Default::default()
    }
}

pub fn config(key: &str, v: serde_json::Value, secret: bool) -> ConfigItem {
    ConfigItem {
        key: key.into(),
        path: false,
        value: Some(config_item::Value::Literal(pko_agent::convert::to_value(&v))),
        secret,
        json: false,
    }
}

/// Runs `req` and collects every event of its stream.
pub async fn run(client: &mut AgentClient<Channel>, req: OperationRequest) -> Vec<OperationEvent> {
    let stream = client.run(req).await.unwrap_or_else(|s| panic!("Run refused: {s:?}")).into_inner();
    stream.map(|e| e.unwrap()).collect().await
}

/// The result event of a finished stream.
pub fn result(events: &[OperationEvent]) -> OperationResult {
    match events.last().and_then(|e| e.event.clone()) {
        Some(Event::Result(r)) => r,
        other => panic!("stream did not end with a result: {other:?}"),
    }
}

/// Every log line and engine event of a stream, as text.
pub fn all_text(events: &[OperationEvent]) -> String {
    events
        .iter()
        .map(|e| match &e.event {
            Some(Event::Log(l)) => l.text.clone(),
            Some(Event::EngineEvent(s)) => pko_agent::convert::from_struct(s).to_string(),
            Some(Event::Result(r)) => format!("{r:?}"),
            None => String::new(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn outputs(r: &OperationResult) -> HashMap<String, (serde_json::Value, bool)> {
    r.outputs.iter().map(|(k, v)| (k.clone(), (serde_json::from_slice(&v.value).unwrap(), v.secret))).collect()
}

#[allow(unused_imports)] // not every test binary serves files
pub use pko_testbed::plugins::{HttpServer, serve_files};

/// A gzipped tarball of `files` (names written raw, so unsafe names can be tested).
pub fn tarball(files: &[(&str, &[u8])]) -> Vec<u8> {
    pko_agent::source::testing::tarball(files, None)
}

pub fn sha256(b: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", sha2::Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect::<String>())
}
