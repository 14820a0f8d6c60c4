//! The local agent runtime (development, tests, `make demo`): one `pko-agent` process per Workspace on this machine,
//! each with its own 0700 directory, a 0600 kubeconfig naming a 0600 `tokenFile` of the Workspace's service account
//! (renewed after half its lifetime), and a clean environment. A record next to each agent lets a restarted operator
//! adopt the agent — and the operations it runs — instead of starting a new one. Signals go through `nix`; the
//! kubeconfig is kube's own `Kubeconfig` type.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use pko_api::Workspace;
use tokio::io::AsyncBufReadExt;

/// How often a Workspace's own agent process is checked to still run (seconds); a dead one is restarted then.
pub const AGENT_CHECK: Duration = Duration::from_secs(15);

/// Stops the agents of `local` whose Workspace is gone from `store`: after the first sync (agents adopted from an
/// earlier operator), then at every deletion in `changes`; returns when `changes` ends or the cache cannot sync.
pub async fn sweep(
    local: &LocalRuntime,
    store: kube::runtime::reflector::Store<Workspace>,
    changes: impl futures::Stream<Item = crate::informer::Change<Workspace>>,
) {
    use futures::StreamExt;
    let retain = || local.retain(&store.state().iter().filter_map(|w| w.uid()).collect());
    // read the changes while waiting for the sync: an unread subscription holds the informer back
    let mut changes = std::pin::pin!(changes);
    let mut synced = false;
    loop {
        tokio::select! {
            ready = store.wait_until_ready(), if !synced => {
                if ready.is_err() {
                    return;
                }
                synced = true;
                retain();
            }
            change = changes.next() => match change {
                None => return,
                Some(crate::informer::Change::Deleted(_)) if synced => retain(),
                Some(_) => {}
            },
        }
    }
}

/// Why a local agent could not be run.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// Asking the API server for the agent's token failed.
    #[error("requesting the agent's token: {0}")]
    Token(#[from] kube::Error),
    /// The agent's files or process could not be set up, or it did not start.
    #[error("starting the local agent: {0}")]
    Agent(String),
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

/// A `pko-agent` process on this machine (of a Workspace, or of a pool).
pub(crate) struct LocalAgent {
    /// The process when this operator started it; `None` for an agent adopted after a restart.
    pub(crate) child: Option<tokio::process::Child>,
    pub(crate) pid: u32,
    /// Its gRPC address, `127.0.0.1:<port>`.
    pub(crate) address: String,
    /// The Workspace revision it runs (empty for a pool's agent).
    pub(crate) revision: String,
}

impl LocalAgent {
    /// SIGTERM: the agent stops taking work, Ctrl-Cs a running Pulumi and exits once drained.
    pub(crate) fn terminate(&self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid as i32), nix::sys::signal::Signal::SIGTERM);
    }

    /// Whether the agent process still runs.
    pub(crate) fn alive(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => agent_process_alive(self.pid),
        }
    }

    /// Once the agent is dead: SIGKILL what is left of its process group (agents start as group leaders), i.e. the
    /// `pulumi` and plugins a SIGKILLed agent orphaned — as a container's processes die with it — so the lock they
    /// hold is known dead (the agent's `locks` module) and nothing runs on unobserved. Only for an agent this runtime
    /// started (its group id is certainly its own; an adopted agent's PID may have been reused).
    pub(crate) fn reap_group(&self) {
        if self.child.is_some() {
            let group = nix::unistd::Pid::from_raw(-(self.pid as i32));
            if nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL).is_ok() {
                tracing::warn!(pid = self.pid, "agent died: its leftover processes (pulumi, plugins) were killed");
            }
        }
    }

    /// Stops the agent: its child handle when this runtime started it, else SIGTERM by PID.
    fn kill(&mut self) {
        match &mut self.child {
            Some(c) => {
                let _ = c.start_kill();
            }
            None => self.terminate(),
        }
    }
}

/// Whether `pid` is a running `pko-agent` (a recorded PID may have been reused by another program).
pub(crate) fn agent_process_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.contains("pko-agent"))
}

/// What the local runtime records next to an agent's work directory, so a restarted operator adopts the agents (and the
/// operations they run) instead of starting new ones.
#[derive(serde::Serialize, serde::Deserialize)]
struct AgentRecord {
    pid: u32,
    address: String,
    revision: String,
}

impl LocalRuntime {
    /// A local runtime starting `agent_bin` under `work_root`.
    pub fn new(
        agent_bin: PathBuf,
        work_root: PathBuf,
        api_server: String,
        ca_file: PathBuf,
        env: Vec<(String, String)>,
    ) -> Self {
        Self { agent_bin, work_root, api_server, ca_file, env, procs: Mutex::default() }
    }

    /// The agents by Workspace uid. A panic while the lock was held cannot leave the map torn (every change is one
    /// insert or remove), so a poisoned lock is taken as it is.
    fn agents(&self) -> std::sync::MutexGuard<'_, HashMap<String, LocalAgent>> {
        self.procs.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stops every agent (operator shutdown).
    pub fn stop_all(&self) {
        for (_, mut a) in self.agents().drain() {
            a.kill();
        }
    }

    /// Stops agents whose Workspace (by uid) is not in `alive`.
    pub fn retain(&self, alive: &std::collections::HashSet<String>) {
        self.agents().retain(|uid, a| {
            let keep = alive.contains(uid);
            if !keep {
                a.kill();
            }
            keep
        });
    }

    /// Makes sure the agent of `ws` runs at its current revision (adopting one a previous operator started, restarting
    /// a dead or outdated one) and returns its address.
    ///
    /// Errors: [`LocalError`].
    pub async fn ensure_agent(&self, client: &kube::Client, ws: &Workspace) -> Result<String, LocalError> {
        let uid = ws.uid().unwrap_or_default();
        let revision = super::pod::revision_hash(ws);
        let ns = ws.namespace().unwrap_or_default();
        let name = ws.name_any();
        let dir = self.work_root.join(&ns).join(&name);
        let record_path = dir.join("agent.json");
        let running = {
            let mut procs = self.agents();
            if !procs.contains_key(&uid)
                && let Some(r) =
                    std::fs::read(&record_path).ok().and_then(|b| serde_json::from_slice::<AgentRecord>(&b).ok())
                && agent_process_alive(r.pid)
            {
                tracing::info!(workspace = %format!("{ns}/{name}"), pid = r.pid, address = %r.address,
                    "adopted a running local agent");
                procs.insert(
                    uid.clone(),
                    LocalAgent { child: None, pid: r.pid, address: r.address, revision: r.revision },
                );
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
        let kubeconfig = self.prepare_identity(client, &dir, &ns, &sa, false).await?;
        // a Workspace's own agent runs one Stack: its operations share the cached source and HOME (PKO)
        let (child, address) = self
            .spawn(&dir, &kubeconfig, &ns, spec.pulumi_log_level, &[super::pod::SHARED_OPERATIONS.to_string()])
            .await?;
        let pid = child.id().unwrap_or(0);
        let record = AgentRecord { pid, address: address.clone(), revision: revision.clone() };
        std::fs::write(&record_path, serde_json::to_vec(&record).unwrap_or_default())
            .map_err(|e| LocalError::Agent(e.to_string()))?;
        self.agents().insert(uid, LocalAgent { child: Some(child), pid, address: address.clone(), revision });
        Ok(address)
    }
}

/// Whether the token file at `path` was written less than half [`LOCAL_TOKEN_SECONDS`] ago (by its modification time; a
/// missing file is not fresh).
fn token_fresh(path: &std::path::Path) -> bool {
    let age = std::fs::metadata(path).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
    age.is_some_and(|a| a.as_secs() as i64 <= LOCAL_TOKEN_SECONDS / 2)
}

/// A token of service account `ns/sa` (lifetime [`LOCAL_TOKEN_SECONDS`]): the identity of local agents.
///
/// Errors: [`LocalError::Token`] — e.g. the service account does not exist, or the operator may not request its
/// tokens.
pub(crate) async fn token_request(client: &kube::Client, ns: &str, sa: &str) -> Result<String, LocalError> {
    let tr = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(LOCAL_TOKEN_SECONDS),
            ..Default::default()
        },
        ..Default::default()
    };
    Ok(Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(sa, &PostParams::default(), &tr)
        .await?
        .status
        .map(|s| s.token)
        .unwrap_or_default())
}

/// Lifetime of a local agent's service-account token, in seconds; it is renewed after half of it.
pub const LOCAL_TOKEN_SECONDS: i64 = 3600;

/// The variables of the operator's environment a local agent inherits (`PATH`, `HOME`, `TMPDIR`, `TZ`, `LANG`, `LC_*`,
/// `RUST_LOG`, `PULUMI_*`): never `KUBECONFIG`, cloud credentials or other secrets of the operator's process.
pub fn local_agent_env(vars: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    vars.into_iter()
        .filter(|(k, _)| {
            ["PATH", "HOME", "TMPDIR", "TZ", "LANG", "RUST_LOG", "FLUX_MAX_UNTAR_SIZE_BYTES"].contains(&k.as_str())
                || k.starts_with("LC_")
                || k.starts_with("PULUMI_")
        })
        .collect()
}

/// The kubeconfig of a local agent: the API server with its CA file, the token in `token_file` (re-read by the agent's
/// client every minute), namespace `ns`. Built with kube's own type.
fn agent_kubeconfig(
    server: &str,
    ca: &std::path::Path,
    token_file: &std::path::Path,
    ns: &str,
) -> kube::config::Kubeconfig {
    use kube::config::{
        AuthInfo, Cluster, Context as KubeContext, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
    };
    Kubeconfig {
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        clusters: vec![NamedCluster {
            name: "workspace".into(),
            cluster: Some(Cluster {
                server: Some(server.into()),
                certificate_authority: Some(ca.display().to_string()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "workspace".into(),
            auth_info: Some(AuthInfo { token_file: Some(token_file.display().to_string()), ..Default::default() }),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: "workspace".into(),
            context: Some(KubeContext {
                cluster: "workspace".into(),
                user: Some("workspace".into()),
                namespace: Some(ns.into()),
                ..Default::default()
            }),
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

/// Writes `bytes` to `path` readable only by this user (0600), atomically: a temporary file of a name of its own in the
/// same directory (`tempfile`, created 0600), renamed — so writers of one path at once (a pool starting several
/// agents of one class share its identity) each rename a whole file.
fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let mut f = tempfile::Builder::new().prefix(".write-").tempfile_in(dir)?;
    f.write_all(bytes)?;
    f.as_file().sync_all()?;
    f.persist(path).map_err(|e| e.error)?;
    Ok(())
}

impl LocalRuntime {
    /// Writes the identity of agents working in `dir` for service account `ns/sa` (0600 token and kubeconfig in `dir`,
    /// 0700) and returns the kubeconfig's path; with `reuse` (a directory of one service account only: a pool class's)
    /// a token younger than half its lifetime is kept. Errors: the TokenRequest ([`LocalError::Token`]) or a file
    /// ([`LocalError::Agent`]).
    pub(crate) async fn prepare_identity(
        &self,
        client: &kube::Client,
        dir: &std::path::Path,
        ns: &str,
        sa: &str,
        reuse: bool,
    ) -> Result<PathBuf, LocalError> {
        create_private_dir(dir).map_err(|e| LocalError::Agent(format!("creating {}: {e}", dir.display())))?;
        // the agent's identity: a token of the service account, in a 0600 file its kubeconfig names
        // (`tokenFile`), renewed before it expires
        let token_path = dir.join("token");
        if !(reuse && token_fresh(&token_path)) {
            self.write_token(client, ns, sa, &token_path).await?;
        }
        let kubeconfig = dir.join("kubeconfig");
        let kc = agent_kubeconfig(&self.api_server, &self.ca_file, &token_path, ns);
        let kc =
            serde_yaml_ng::to_string(&kc).map_err(|e| LocalError::Agent(format!("writing the kubeconfig: {e}")))?;
        write_private(&kubeconfig, kc.as_bytes())
            .map_err(|e| LocalError::Agent(format!("writing {}: {e}", kubeconfig.display())))?;
        Ok(kubeconfig)
    }

    /// Renews the token in `dir` (see [`Self::prepare_identity`]) once half its lifetime has passed. Returns whether it
    /// was renewed.
    ///
    /// Errors: as [`Self::prepare_identity`].
    pub(crate) async fn refresh_identity(
        &self,
        client: &kube::Client,
        dir: &std::path::Path,
        ns: &str,
        sa: &str,
    ) -> Result<bool, LocalError> {
        let path = dir.join("token");
        if token_fresh(&path) {
            return Ok(false);
        }
        self.write_token(client, ns, sa, &path).await?;
        Ok(true)
    }

    /// Starts a `pko-agent` working in `dir` (its `work` and `pulumi-home` below), with `kubeconfig` as its identity,
    /// reading references in namespace `ns`, plus `extra` arguments; waits up to 20 s for the address it listens on
    /// (loopback, a free port). The process has its own process group, so it outlives an operator crash.
    ///
    /// Errors: [`LocalError::Agent`] when it cannot start or does not report its address.
    pub(crate) async fn spawn(
        &self,
        dir: &std::path::Path,
        kubeconfig: &std::path::Path,
        ns: &str,
        log_level: Option<u32>,
        extra: &[String],
    ) -> Result<(tokio::process::Child, String), LocalError> {
        create_private_dir(dir).map_err(|e| LocalError::Agent(format!("creating {}: {e}", dir.display())))?;
        let mut cmd = tokio::process::Command::new(&self.agent_bin);
        // A clean environment: only what the runtime passes (see `LocalRuntime::new`), never the
        // Workspace's `env` — that reaches Pulumi through each operation request, and must not redirect
        // the agent's own identity (a Workspace `KUBECONFIG` would). The agent's kubeconfig is a flag.
        cmd.env_clear()
            .envs(self.env.iter().cloned())
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--auth",
                "none",
                "--kube-workspace-namespace",
                ns,
                "--kubeconfig",
            ])
            .arg(kubeconfig)
            .arg("--work-dir")
            .arg(dir.join("work"))
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("PULUMI_HOME", dir.join("pulumi-home"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // the agent outlives an operator crash (and is adopted by the next operator), like a pod
            .process_group(0);
        if let Some(level) = log_level.filter(|l| *l > 0) {
            cmd.args(["--pulumi-log-level", &level.to_string()]);
        }
        let mut child = cmd.spawn().map_err(|e| LocalError::Agent(format!("{}: {e}", self.agent_bin.display())))?;
        let stdout = child.stdout.take().ok_or_else(|| LocalError::Agent("the agent's stdout is not piped".into()))?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .map_err(|_| LocalError::Agent("agent did not start within 20 s".into()))?;
        let address = first
            .ok()
            .flatten()
            .and_then(|l| pko_proto::listening_address(&l).map(str::to_string))
            .ok_or_else(|| LocalError::Agent("agent did not report its address".into()))?;
        // the operations' lines (masked, each naming its namespace, stack and update) join the
        // operator's own log, as a pool pod's reach its container log; a frozen operator stops reading
        // them and the agent drops lines rather than stall (pko_agent::output::Queue)
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::info!(target: "pko_agent", "{line}");
            }
        });
        Ok((child, address))
    }

    /// Writes a fresh token of service account `ns/sa` (lifetime [`LOCAL_TOKEN_SECONDS`]) to `path`.
    async fn write_token(
        &self,
        client: &kube::Client,
        ns: &str,
        sa: &str,
        path: &std::path::Path,
    ) -> Result<(), LocalError> {
        let token = token_request(client, ns, sa).await?;
        write_private(path, token.as_bytes()).map_err(|e| LocalError::Agent(format!("writing {}: {e}", path.display())))
    }

    /// Renews the token of a running agent when half its lifetime has passed.
    async fn refresh_token(&self, client: &kube::Client, ws: &Workspace) -> Result<(), LocalError> {
        let ns = ws.namespace().unwrap_or_default();
        let sa = ws.spec.with_defaults().service_account_name.unwrap_or_else(|| "default".into());
        if self.refresh_identity(client, &self.work_root.join(&ns).join(ws.name_any()), &ns, &sa).await? {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_of_one_private_file_at_once_all_succeed_and_leave_a_whole_0600_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        let writers: Vec<_> = (0..8)
            .map(|i| {
                let path = path.clone();
                std::thread::spawn(move || {
                    (0..200)
                        .map(|_| write_private(&path, format!("writer {i}\n").repeat(64).as_bytes()))
                        .filter(Result::is_err)
                        .count()
                })
            })
            .collect();
        let failed: usize = writers.into_iter().map(|w| w.join().unwrap()).sum();
        assert_eq!(failed, 0, "writes failed");
        let content = std::fs::read_to_string(&path).unwrap();
        assert_eq!(content.lines().collect::<std::collections::BTreeSet<_>>().len(), 1, "one writer's whole file");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left");
    }

    #[test]
    fn a_token_is_fresh_for_half_its_lifetime() {
        let dir = std::env::temp_dir().join(format!("pko-token-fresh-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        assert!(!token_fresh(&path), "no token yet");
        std::fs::write(&path, b"t").unwrap();
        assert!(token_fresh(&path), "just written");
        let half = std::time::Duration::from_secs(LOCAL_TOKEN_SECONDS as u64 / 2 + 5);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(std::time::SystemTime::now() - half)
            .unwrap();
        assert!(!token_fresh(&path), "older than half its lifetime");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
