//! The Workspace controller with two runtimes behind one interface ([`Runtime`]):
//! - `pod` (production): the Service and StatefulSet of [`super::pod`], Ready once a replica is ready;
//! - `local` (development and tests): agent processes on this machine, each using a kubeconfig whose
//!   token is a TokenRequest for the Workspace's service account, so its reads of Secrets and ConfigMaps
//!   go through real RBAC.
//!
//! Status: `Ready` with PKO's reasons, `address`, `pulumiVersion`, `observedGeneration`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Resource, ResourceExt};
use pko_api::Workspace;
use pko_api::constants::{field_manager, workspace_condition as wc};
use pko_api::workspace::WorkspaceStatus;
use tokio::io::AsyncBufReadExt;

use super::pod::{self, PodRuntimeConfig};
use crate::context::Context;

impl Error {
    /// The failing part, as a metric label: `api` or `local_runtime`.
    pub fn step(&self) -> &'static str {
        match self {
            Error::Kube(_) => "api",
            Error::Local(_) => "local_runtime",
        }
    }
}

/// Errors of a Workspace reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// API server error.
    #[error("{0}")]
    Kube(#[from] kube::Error),
    /// The local runtime could not start an agent.
    #[error("starting the local agent: {0}")]
    Local(String),
}

/// Where agents run.
pub enum Runtime {
    /// Workspace pods (StatefulSet per Workspace).
    Pod(PodRuntimeConfig),
    /// Agent processes on this machine.
    Local(LocalRuntime),
}

/// Agent processes on this machine, one per Workspace.
pub struct LocalRuntime {
    /// The `pko-agent` binary.
    pub agent_bin: PathBuf,
    /// Root of the agents' work directories and kubeconfigs.
    pub work_root: PathBuf,
    /// API server URL and CA file for the agents' kubeconfigs.
    pub api_server: String,
    /// CA bundle file of the API server.
    pub ca_file: PathBuf,
    /// Extra environment of the agents (e.g. PATH with the Pulumi CLI, PULUMI_HOME).
    pub env: Vec<(String, String)>,
    procs: Mutex<HashMap<String, LocalAgent>>,
}

struct LocalAgent {
    /// The process when this operator started it; `None` for an agent adopted after a restart.
    child: Option<tokio::process::Child>,
    pid: u32,
    address: String,
    revision: String,
}

impl LocalAgent {
    /// Whether the agent process still runs.
    fn alive(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => agent_process_alive(self.pid),
        }
    }

    /// Stops the agent: its child handle when this runtime started it, else SIGTERM by PID.
    fn kill(&mut self) {
        match &mut self.child {
            Some(c) => {
                let _ = c.start_kill();
            }
            None => {
                let _ = std::process::Command::new("kill").arg(self.pid.to_string()).status();
            }
        }
    }
}

/// Whether `pid` is a running `pko-agent` (a recorded PID may have been reused by another program).
fn agent_process_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists() && std::fs::read_to_string(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.contains("pko-agent"))
}

/// What the local runtime records next to an agent's work directory, so a restarted operator adopts the
/// agents (and the operations they run) instead of starting new ones.
#[derive(serde::Serialize, serde::Deserialize)]
struct AgentRecord {
    pid: u32,
    address: String,
    revision: String,
}

impl LocalRuntime {
    /// A local runtime starting `agent_bin` under `work_root`.
    pub fn new(agent_bin: PathBuf, work_root: PathBuf, api_server: String, ca_file: PathBuf, env: Vec<(String, String)>) -> Self {
        Self { agent_bin, work_root, api_server, ca_file, env, procs: Mutex::default() }
    }

    /// Stops every agent (operator shutdown).
    pub fn stop_all(&self) {
        for (_, mut a) in self.procs.lock().unwrap().drain() {
            a.kill();
        }
    }

    /// Stops agents whose Workspace (by uid) is not in `alive`.
    pub fn retain(&self, alive: &[String]) {
        self.procs.lock().unwrap().retain(|uid, a| {
            let keep = alive.contains(uid);
            if !keep {
                a.kill();
            }
            keep
        });
    }

    async fn ensure(&self, client: &kube::Client, ws: &Workspace) -> Result<String, Error> {
        let uid = ws.uid().unwrap_or_default();
        let revision = pod::revision_hash(ws);
        let ns = ws.namespace().unwrap_or_default();
        let name = ws.name_any();
        let dir = self.work_root.join(&ns).join(&name);
        let record_path = dir.join("agent.json");
        let running = {
            let mut procs = self.procs.lock().unwrap();
            if !procs.contains_key(&uid)
                && let Some(r) = std::fs::read(&record_path).ok().and_then(|b| serde_json::from_slice::<AgentRecord>(&b).ok())
                && agent_process_alive(r.pid)
            {
                tracing::info!(workspace = %format!("{ns}/{name}"), pid = r.pid, address = %r.address, "adopted a running local agent");
                procs.insert(uid.clone(), LocalAgent { child: None, pid: r.pid, address: r.address, revision: r.revision });
            }
            let usable = procs.get_mut(&uid).map(|a| (a.revision == revision && a.alive(), a.address.clone()));
            match usable {
                Some((true, address)) => Some(address),
                Some((false, _)) => {
                    if let Some(mut a) = procs.remove(&uid) {
                        a.kill();
                    }
                    None
                }
                None => None,
            }
        };
        if let Some(address) = running {
            self.refresh_token(client, ws).await?;
            return Ok(address);
        }
        let spec = ws.spec.with_defaults();
        let sa = spec.service_account_name.clone().unwrap_or_else(|| "default".into());
        create_private_dir(&dir).map_err(|e| Error::Local(format!("creating {}: {e}", dir.display())))?;
        // the agent's identity: a token of the Workspace's service account, in a 0600 file its kubeconfig
        // names (`tokenFile`), renewed by `refresh_token` before it expires
        let token_path = dir.join("token");
        self.write_token(client, &ns, &sa, &token_path).await?;
        let kubeconfig = dir.join("kubeconfig");
        let kc = agent_kubeconfig(&self.api_server, &self.ca_file, &token_path, &ns);
        let kc = serde_yaml::to_string(&kc).map_err(|e| Error::Local(format!("writing the kubeconfig: {e}")))?;
        write_private(&kubeconfig, kc.as_bytes()).map_err(|e| Error::Local(format!("writing {}: {e}", kubeconfig.display())))?;
        let mut cmd = tokio::process::Command::new(&self.agent_bin);
        // A clean environment: only what the runtime passes (see `LocalRuntime::new`), never the
        // Workspace's `env` — that reaches Pulumi through each operation request, and must not redirect
        // the agent's own identity (a Workspace `KUBECONFIG` would). The agent's kubeconfig is a flag.
        cmd.env_clear()
            .envs(self.env.iter().cloned())
            .args(["serve", "--listen", "127.0.0.1:0", "--auth", "none", "--kube-workspace-namespace", &ns, "--kubeconfig"])
            .arg(&kubeconfig)
            .arg("--work-dir")
            .arg(dir.join("work"))
            .env("KUBECONFIG", &kubeconfig)
            .env("PULUMI_HOME", dir.join("pulumi-home"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // the agent outlives an operator crash (and is adopted by the next operator), like a pod
            .process_group(0);
        if let Some(level) = spec.pulumi_log_level.filter(|l| *l > 0) {
            cmd.args(["--pulumi-log-level", &level.to_string()]);
        }
        let mut child = cmd.spawn().map_err(|e| Error::Local(format!("{}: {e}", self.agent_bin.display())))?;
        let stdout = child.stdout.take().expect("piped");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.map_err(|_| Error::Local("agent did not start within 20 s".into()))?;
        let address =
            first.ok().flatten().and_then(|l| l.strip_prefix("listening on ").map(str::to_string)).ok_or_else(|| Error::Local("agent did not report its address".into()))?;
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let pid = child.id().unwrap_or(0);
        let record = AgentRecord { pid, address: address.clone(), revision: revision.clone() };
        std::fs::write(&record_path, serde_json::to_vec(&record).unwrap_or_default()).map_err(|e| Error::Local(e.to_string()))?;
        self.procs.lock().unwrap().insert(uid, LocalAgent { child: Some(child), pid, address: address.clone(), revision });
        Ok(address)
    }
}

/// Lifetime of a local agent's service-account token, in seconds; it is renewed after half of it.
pub const LOCAL_TOKEN_SECONDS: i64 = 3600;

/// The variables of the operator's environment a local agent inherits (`PATH`, `HOME`, `TMPDIR`, `TZ`,
/// `LANG`, `LC_*`, `RUST_LOG`, `PULUMI_*`): never `KUBECONFIG`, cloud credentials or other secrets of the
/// operator's process.
pub fn local_agent_env(vars: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    vars.into_iter().filter(|(k, _)| ["PATH", "HOME", "TMPDIR", "TZ", "LANG", "RUST_LOG"].contains(&k.as_str()) || k.starts_with("LC_") || k.starts_with("PULUMI_")).collect()
}

/// The kubeconfig of a local agent: the API server with its CA file, the token in `token_file` (re-read
/// by the agent's client every minute), namespace `ns`. Built with kube's own type.
fn agent_kubeconfig(server: &str, ca: &std::path::Path, token_file: &std::path::Path, ns: &str) -> kube::config::Kubeconfig {
    use kube::config::{AuthInfo, Cluster, Context as KubeContext, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};
    Kubeconfig {
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        clusters: vec![NamedCluster {
            name: "workspace".into(),
            cluster: Some(Cluster { server: Some(server.into()), certificate_authority: Some(ca.display().to_string()), ..Default::default() }),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "workspace".into(),
            auth_info: Some(AuthInfo { token_file: Some(token_file.display().to_string()), ..Default::default() }),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: "workspace".into(),
            context: Some(KubeContext { cluster: "workspace".into(), user: Some("workspace".into()), namespace: Some(ns.into()), ..Default::default() }),
            ..Default::default()
        }],
        current_context: Some("workspace".into()),
        ..Default::default()
    }
}

/// Creates `dir` (and its parents) readable only by this user (0700).
fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Writes `bytes` to `path` readable only by this user (0600), atomically (a temporary file renamed).
fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

impl LocalRuntime {
    /// Writes a fresh token of service account `ns/sa` (lifetime [`LOCAL_TOKEN_SECONDS`]) to `path`.
    async fn write_token(&self, client: &kube::Client, ns: &str, sa: &str, path: &std::path::Path) -> Result<(), Error> {
        let tr = TokenRequest { spec: TokenRequestSpec { audiences: vec![], expiration_seconds: Some(LOCAL_TOKEN_SECONDS), ..Default::default() }, ..Default::default() };
        let token = Api::<ServiceAccount>::namespaced(client.clone(), ns).create_token_request(sa, &PostParams::default(), &tr).await?.status.map(|s| s.token).unwrap_or_default();
        write_private(path, token.as_bytes()).map_err(|e| Error::Local(format!("writing {}: {e}", path.display())))
    }

    /// Renews the token of a running agent when half its lifetime has passed.
    async fn refresh_token(&self, client: &kube::Client, ws: &Workspace) -> Result<(), Error> {
        let ns = ws.namespace().unwrap_or_default();
        let path = self.work_root.join(&ns).join(ws.name_any()).join("token");
        let age = std::fs::metadata(&path).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
        if age.is_none_or(|a| a.as_secs() as i64 > LOCAL_TOKEN_SECONDS / 2) {
            let sa = ws.spec.with_defaults().service_account_name.unwrap_or_else(|| "default".into());
            self.write_token(client, &ns, &sa, &path).await?;
            tracing::info!(workspace = %format!("{ns}/{}", ws.name_any()), "renewed the local agent's token");
        }
        Ok(())
    }
}

impl Drop for LocalRuntime {
    /// Agents this runtime started end with it (a crashed operator's agents survive and are adopted).
    fn drop(&mut self) {
        if let Ok(mut procs) = self.procs.lock() {
            for (_, a) in procs.iter_mut() {
                if let Some(c) = &mut a.child {
                    let _ = c.start_kill();
                }
            }
        }
    }
}

/// How often the local runtime checks that a Workspace's agent process still runs (seconds).
pub const LOCAL_AGENT_CHECK: Duration = Duration::from_secs(15);

/// Whether the status to write — `new` (address, observedGeneration) with the Ready condition
/// `(status, reason, message)` — is what `stored` already says; then nothing is written (the local
/// runtime looks every [`LOCAL_AGENT_CHECK`] and must not write each time).
fn status_unchanged(stored: &WorkspaceStatus, new: &WorkspaceStatus, (status, reason, message): (&str, &str, &str)) -> bool {
    let conds = stored.conditions.as_deref().unwrap_or_default();
    stored.address == new.address
        && stored.observed_generation == new.observed_generation
        && conds.len() == 1
        && conds.iter().any(|c| c.type_ == wc::READY && c.status == status && c.reason == reason && c.message == message && c.observed_generation == new.observed_generation)
}

/// The Workspace controller.
pub struct WorkspaceController {
    ctx: Arc<Context>,
    runtime: Runtime,
}

impl WorkspaceController {
    /// A controller using `runtime`.
    pub fn new(ctx: Arc<Context>, runtime: Runtime) -> Arc<Self> {
        Arc::new(Self { ctx, runtime })
    }

    /// Runs until shutdown; the local runtime's agents are stopped at the end.
    pub async fn run(self: Arc<Self>) {
        let api: Api<Workspace> = Api::all(self.ctx.client.clone());
        let controller = Controller::new(api, watcher::Config::default());
        // local agents whose Workspace is gone are stopped: read from the controller's own cache (once
        // it has synced), never by listing the API
        let (this, store) = (self.clone(), controller.store());
        let sweeper = tokio::spawn(async move {
            let Runtime::Local(local) = &this.runtime else { return };
            if store.wait_until_ready().await.is_err() {
                return;
            }
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                local.retain(&store.state().iter().filter_map(|w| w.uid()).collect::<Vec<_>>());
            }
        });
        controller
            .with_config(self.ctx.controller_config())
            .owns(Api::<StatefulSet>::all(self.ctx.client.clone()), watcher::Config::default().labels("auto.pulumi.com/component=workspace"))
            .graceful_shutdown_on(self.ctx.shutdown.clone().cancelled_owned())
            .run(
                |w, c| async move { crate::k8s::observe("workspace", &*w.clone(), c.reconcile(w)).await },
                |_w, e, _c| {
                    crate::k8s::reconcile_failed("workspace", e.step(), e);
                    Action::requeue(Duration::from_secs(5))
                },
                self.clone(),
            )
            .for_each(|_| async {})
            .await;
        sweeper.abort();
        if let Runtime::Local(l) = &self.runtime {
            l.stop_all();
        }
    }

    async fn reconcile(self: Arc<Self>, ws: Arc<Workspace>) -> Result<Action, Error> {
        let ns = ws.namespace().unwrap_or_default();
        let name = ws.name_any();
        if !self.ctx.ownership.owns(&ns, &name) {
            return Ok(Action::await_change());
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let api: Api<Workspace> = Api::namespaced(self.ctx.client.clone(), &ns);
        let mut st = ws.status.clone().unwrap_or_default();
        st.observed_generation = ws.meta().generation;
        if ws.meta().deletion_timestamp.is_some() {
            return self.write(&api, &ws, st, ("False", wc::DELETING, "workspace is being deleted"), &now).await.map(|_| Action::await_change());
        }
        let (ready, address, requeue) = match &self.runtime {
            Runtime::Pod(cfg) => {
                let pp = PatchParams::apply(field_manager::OPERATOR).force();
                Api::<Service>::namespaced(self.ctx.client.clone(), &ns).patch(&pod::object_name(&name), &pp, &Patch::Apply(pod::service(&ws))).await?;
                let sts = Api::<StatefulSet>::namespaced(self.ctx.client.clone(), &ns).patch(&pod::object_name(&name), &pp, &Patch::Apply(pod::stateful_set(&ws, cfg))).await?;
                let ready = sts.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0) >= 1;
                if ready {
                    (("True", wc::SUCCEEDED, ""), Some(pod::address(&name, &ns)), Duration::from_secs(300))
                } else {
                    (("False", wc::WAITING_FOR_REPLICAS, "waiting for the workspace pod"), None, Duration::from_secs(10))
                }
            }
            Runtime::Local(local) => match local.ensure(&self.ctx.client, &ws).await {
                // look again soon: an agent process that died is restarted here (a pod's restart is the
                // kubelet's, and its StatefulSet event wakes this controller)
                Ok(addr) => (("True", wc::SUCCEEDED, ""), Some(addr), LOCAL_AGENT_CHECK),
                Err(e) => {
                    let msg = e.to_string();
                    st.address = None;
                    self.write(&api, &ws, st, ("False", wc::CONNECTION_FAILED, &msg), &now).await?;
                    return Ok(Action::requeue(Duration::from_secs(5)));
                }
            },
        };
        st.address = address;
        self.write(&api, &ws, st, ready, &now).await?;
        Ok(Action::requeue(requeue))
    }

    async fn write(&self, api: &Api<Workspace>, ws: &Workspace, mut st: WorkspaceStatus, (status, reason, message): (&str, &str, &str), now: &Time) -> Result<(), Error> {
        let name = ws.name_any();
        let name = name.as_str();
        let old = st.conditions.clone().unwrap_or_default();
        if status_unchanged(&ws.status.clone().unwrap_or_default(), &st, (status, reason, message)) {
            return Ok(());
        }
        let mut conditions: Vec<Condition> = old.into_iter().filter(|c| c.type_ == wc::READY).collect();
        pko_api::conditions::set(&mut conditions, wc::READY, status, reason, message, st.observed_generation, now);
        st.conditions = Some(conditions);
        crate::k8s::apply_status(api, name, field_manager::WORKSPACE_STATUS, &st).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(address: Option<&str>, generation: i64, status: &str, reason: &str) -> WorkspaceStatus {
        WorkspaceStatus {
            address: address.map(str::to_string),
            observed_generation: Some(generation),
            conditions: Some(vec![Condition {
                type_: wc::READY.into(),
                status: status.into(),
                reason: reason.into(),
                message: String::new(),
                observed_generation: Some(generation),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn status_is_written_only_when_it_changes() {
        let s = stored(Some("127.0.0.1:1"), 1, "True", wc::SUCCEEDED);
        assert!(status_unchanged(&s, &s, ("True", wc::SUCCEEDED, "")));
        let moved = WorkspaceStatus { address: Some("127.0.0.1:2".into()), ..s.clone() };
        assert!(!status_unchanged(&s, &moved, ("True", wc::SUCCEEDED, "")), "a restarted agent has a new address");
        assert!(!status_unchanged(&s, &s, ("False", wc::CONNECTION_FAILED, "agent did not start")));
        let next = WorkspaceStatus { observed_generation: Some(2), ..s.clone() };
        assert!(!status_unchanged(&s, &next, ("True", wc::SUCCEEDED, "")), "a new generation is observed");
        assert!(!status_unchanged(&WorkspaceStatus::default(), &s, ("True", wc::SUCCEEDED, "")), "nothing written yet");
    }
}
