//! Agent pools of the local runtime (`--agent-pools`): the agents of one workspace class (namespace, service account,
//! image, pod template, log level — [`crate::agents::class::workspace_class`]) are interchangeable, because every
//! operation request carries its whole source, settings and environment. So an operation goes to any idle agent of its
//! class, not to an agent per Workspace: a pool per class grows with demand up to `max` agents, and agents idle for
//! `idle_timeout` are stopped down to `min` (default 0: an idle Stack costs no process — PKO keeps one pod per Stack,
//! 24/7).
//!
//! Layout on disk, under the runtime's work root: `pools/<namespace>/<class hash>/<replica>/` holds the replica's
//! identity for the class (0600 token and kubeconfig of the service account), and `<n>/` per agent slot its work
//! directory (source cache, kept across restarts of the slot) and `agent.json` (PID, address). The records let a
//! restarted replica adopt its agents, and let any replica find the agent that runs an operation
//! ([`LocalPools::acquire`] with `started`): after a restart or a shard move, the operation is followed where it runs
//! instead of being started twice.
//!
//! Invariants: an agent is lent to one operation at a time; an agent that still runs an operation nobody follows (its
//! dispatcher was fenced) is not lent again until its `Status` says it is idle; an agent that reported `INTERRUPTED`
//! (it is shutting down) is never lent again. Agents get `--exit-when-idle-seconds` as a backstop, so an agent whose
//! replica died does not run forever.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use pko_api::Workspace;
use pko_proto::v1::status_response::State;

use super::{Ledger, PoolId};
use crate::agents::lend::{Acquired, End, GiveBack, Held, Hold, IdentityChecks, Lent, PoolConfig};
use crate::agents::local::{LocalAgent, LocalError, LocalRuntime, agent_process_alive};

mod slots;
pub use slots::{Pick, SlotView, idle_out, pick};

struct Slot {
    n: usize,
    agent: Option<LocalAgent>,
    running: Option<String>,
    lent: bool,
    draining: bool,
    idle_since: Instant,
}

impl Slot {
    fn view(&mut self) -> SlotView {
        let usable = !self.draining && self.agent.as_mut().is_some_and(LocalAgent::alive);
        SlotView {
            running: self.running.clone(),
            lent: self.lent,
            starting: self.agent.is_none() && !self.draining,
            usable,
            idle_since: self.idle_since,
        }
    }
}

struct Pool {
    namespace: String,
    service_account: String,
    log_level: Option<u32>,
    /// `pools/<namespace>/<hash>` under the work root.
    dir: PathBuf,
    slots: Vec<Slot>,
    /// The slot number that last ran each Workspace's operation.
    affinity: super::Affinity,
    /// Set once the agents recorded for this class were adopted; every acquirer awaits it, so none picks a slot while
    /// adoption is still asking the recorded agents (one live agent per work directory).
    loaded: Arc<tokio::sync::OnceCell<()>>,
}

impl Pool {
    fn replica_dir(&self, replica: &str) -> PathBuf {
        self.dir.join(replica)
    }

    fn slot_index(&self, n: usize) -> Option<usize> {
        self.slots.iter().position(|s| s.n == n)
    }
}

/// How often the pools are looked after: every second (an agent process starts and stops in milliseconds; a dead one is
/// forgotten at the next tick).
pub const MAINTAIN_EVERY: Duration = Duration::from_secs(1);

/// The agent record written next to a pool agent's work directory.
#[derive(serde::Serialize, serde::Deserialize)]
struct Record {
    pid: u32,
    address: String,
}

/// The pools of this replica, by class.
pub struct LocalPools {
    runtime: LocalRuntime,
    client: kube::Client,
    replica: String,
    cfg: PoolConfig,
    pools: Ledger<Pool>,
    identities: IdentityChecks,
    /// When the agents' disk was last asked for ([`super::DISK_EVERY`]).
    disk_asked: std::sync::Mutex<Option<Instant>>,
}

impl LocalPools {
    /// Pools of agents started with `runtime` (binary, work root, environment), recorded under `<work
    /// root>/pools/…/<replica>/`.
    pub fn new(runtime: LocalRuntime, client: kube::Client, replica: String, cfg: PoolConfig) -> Arc<Self> {
        Arc::new(Self {
            runtime,
            client,
            replica,
            cfg,
            pools: Ledger::default(),
            identities: IdentityChecks::default(),
            disk_asked: std::sync::Mutex::default(),
        })
    }

    /// Whether agents of `ws`'s class can get their identity: a token of its service account (the Workspace is not
    /// Ready otherwise, and says why, as with an agent of its own). A pass stands for
    /// [`crate::agents::lend::IDENTITY_CHECK_TTL`].
    ///
    /// Errors: [`LocalError::Token`] naming the service account's problem.
    pub async fn check_identity(&self, ws: &Workspace) -> Result<(), LocalError> {
        self.identities
            .check(
                ws,
                |ns, sa| async move { crate::agents::local::token_request(&self.client, &ns, &sa).await.map(|_| ()) },
            )
            .await
    }

    /// Lends an agent of `ws`'s class to operation `op` (fencing epoch `epoch`). With `started` (the Update was already
    /// Progressing: a restart or a shard move), the agents recorded for the class by any replica are asked first
    /// whether they know `op`, and the one that does is followed. Else an agent that ran the Workspace, or (as `hold`
    /// allows) a hold for them ([`super::Affinity`]), else any free agent, else a new one ([`pick`]).
    /// [`Acquired::Full`]: every agent is busy and the pool is at its maximum.
    ///
    /// Errors: [`LocalError`] when a new agent cannot be started.
    pub async fn acquire(
        self: &Arc<Self>,
        ws: &Workspace,
        op: &str,
        epoch: i64,
        started: bool,
        hold: Hold,
    ) -> Result<Acquired, LocalError> {
        let class = PoolId::of(ws);
        self.load(&class, ws).await;
        if started && let Some(found) = self.locate(&class, op, epoch).await {
            return Ok(Acquired::Lent(found));
        }
        let key = super::affinity_key(ws);
        let n = {
            let mut pools = self.pools.lock();
            let Some(pool) = pools.get_mut(&class) else { return Ok(Acquired::Full) };
            let views: Vec<SlotView> = pool.slots.iter_mut().map(Slot::view).collect();
            let warm: Vec<usize> = pool.affinity.warm(&key).iter().filter_map(|n| pool.slot_index(*n)).collect();
            let mut choice = pick(&views, op, &warm, self.cfg.max);
            if let Pick::Hold(busy) = &choice {
                let agents = busy.iter().map(|i| pool.slots[*i].n).collect();
                match pool.affinity.hold(op, Instant::now(), hold.wait(self.cfg.affinity_wait)) {
                    Some(left) => return Ok(Acquired::Held(Held { pool: class.clone(), agents, left })),
                    None => choice = pick(&views, op, &[], self.cfg.max),
                }
            }
            match choice {
                Pick::Follow(i) | Pick::Lend(i) => {
                    super::count_lend(&warm, Some(i));
                    let s = &mut pool.slots[i];
                    s.lent = true;
                    s.running = Some(op.to_string());
                    let (n, address) = (s.n, s.agent.as_ref().map(|a| a.address.clone()).unwrap_or_default());
                    pool.affinity.ran(&key, op, n);
                    return Ok(Acquired::Lent(self.lent(&class, n, address)));
                }
                // no hold once the warm agents are set aside: `pick` holds only for warm agents
                Pick::Full | Pick::Hold(_) => return Ok(Acquired::Full),
                Pick::Start => {
                    super::count_lend(&warm, None);
                    self.new_slot(&class, pool, op, &key)
                }
            }
        };
        match self.start(&class, n).await {
            Ok(address) => Ok(Acquired::Lent(self.lent(&class, n, address))),
            Err(e) => {
                self.remove_slot(&class, n);
                Err(e)
            }
        }
    }

    /// A new slot in `pool`, lent to operation `op` of Workspace `key` while its agent starts: the lowest free slot
    /// number (its source cache stays) whose recorded agent is not alive (one live agent per work directory, ever),
    /// dead slots dropped first.
    fn new_slot(&self, class: &PoolId, pool: &mut Pool, op: &str, key: &str) -> usize {
        drop_dead(class, &mut pool.slots);
        let live = live_slots(&pool.replica_dir(&self.replica));
        let n = (0..).find(|n| pool.slot_index(*n).is_none() && !live.contains(n)).unwrap_or(0);
        pool.slots.push(Slot {
            n,
            agent: None,
            running: Some(op.to_string()),
            lent: true,
            draining: false,
            idle_since: Instant::now(),
        });
        pool.affinity.ran(key, op, n);
        n
    }

    fn lent(self: &Arc<Self>, class: &PoolId, n: usize, address: String) -> Lent {
        Lent::new(address, None, Some((class.clone(), n)), self.clone())
    }

    fn remove_slot(&self, class: &PoolId, n: usize) {
        if let Some(pool) = self.pools.lock().get_mut(class) {
            pool.slots.retain(|s| s.n != n);
        }
    }

    /// Creates the pool of `ws`'s class on first use and adopts the agents this replica recorded for it (a restart),
    /// each with the operation it runs.
    async fn load(&self, class: &PoolId, ws: &Workspace) {
        let (loaded, dir) = {
            let mut pools = self.pools.lock();
            let pool = pools.entry(class.clone()).or_insert_with(|| {
                let spec = ws.spec.with_defaults();
                Pool {
                    namespace: ws.namespace().unwrap_or_default(),
                    service_account: spec.service_account_name.unwrap_or_else(|| "default".into()),
                    log_level: spec.pulumi_log_level,
                    dir: self.runtime.work_root.join("pools").join(class.as_str()),
                    slots: Vec::new(),
                    affinity: Default::default(),
                    loaded: Arc::default(),
                }
            });
            (pool.loaded.clone(), pool.replica_dir(&self.replica))
        };
        loaded.get_or_init(|| self.adopt(class, dir)).await;
    }

    /// Adopts the live agents recorded in `dir` (this replica's directory of `class`).
    async fn adopt(&self, class: &PoolId, dir: PathBuf) {
        let mut adopted = Vec::new();
        for (n, record) in records(&dir) {
            if !agent_process_alive(record.pid) {
                continue;
            }
            let answer = crate::agents::client::status(&record.address, None)
                .await
                .ok()
                .map(|s| (State::try_from(s.state).unwrap_or(State::Unspecified), s.current_operation_id));
            let running = match answer {
                Some((State::Busy, op)) if !op.is_empty() => Some(op),
                Some((State::Idle | State::Busy, _)) => None,
                _ => continue,
            };
            tracing::info!(class = %class, slot = n, pid = record.pid, address = %record.address, running = ?running,
                "adopted a pooled agent");
            adopted.push(Slot {
                n,
                agent: Some(LocalAgent {
                    child: None,
                    pid: record.pid,
                    address: record.address,
                    revision: String::new(),
                }),
                running,
                lent: false,
                draining: false,
                idle_since: Instant::now(),
            });
        }
        if let Some(pool) = self.pools.lock().get_mut(class) {
            pool.slots.extend(adopted);
        }
    }

    /// The agent recorded for `class` (by any replica) that knows operation `op`, asked with `Attach`.
    async fn locate(self: &Arc<Self>, class: &PoolId, op: &str, epoch: i64) -> Option<Lent> {
        let dir = self.pools.lock().get(class).map(|p| p.dir.clone())?;
        let replicas = std::fs::read_dir(&dir).ok()?;
        for replica in replicas.flatten() {
            let replica_name = replica.file_name().to_string_lossy().to_string();
            for (n, record) in records(&replica.path()) {
                if !agent_process_alive(record.pid)
                    || !crate::agents::client::knows(&record.address, None, op, epoch).await
                {
                    continue;
                }
                tracing::info!(class = %class, operation = op, address = %record.address, replica = %replica_name,
                    "found the agent running the operation; following it");
                if replica_name == self.replica {
                    let mut pools = self.pools.lock();
                    if let Some(s) = pools.get_mut(class).and_then(|p| p.slots.iter_mut().find(|s| s.n == n)) {
                        s.lent = true;
                        s.running = Some(op.to_string());
                        drop(pools);
                        return Some(self.lent(class, n, record.address));
                    }
                }
                return Some(Lent::new(record.address, None, None, self.clone()));
            }
        }
        None
    }

    /// Starts the agent of slot `n` of `class` and records it. Returns its address.
    async fn start(&self, class: &PoolId, n: usize) -> Result<String, LocalError> {
        let (ns, sa, log_level, replica_dir) = {
            let pools = self.pools.lock();
            let p = pools.get(class).ok_or_else(|| LocalError::Agent(format!("pool {class} is gone")))?;
            (p.namespace.clone(), p.service_account.clone(), p.log_level, p.replica_dir(&self.replica))
        };
        let identity = replica_dir.join("identity");
        // one identity per class and replica, shared by its agents: a fresh token is reused
        let kubeconfig = self.runtime.prepare_identity(&self.client, &identity, &ns, &sa, true).await?;
        let slot_dir = replica_dir.join(n.to_string());
        // the backstop: an agent whose replica died stops itself a minute after the idle timeout
        let backstop = (self.cfg.idle_timeout + Duration::from_secs(60)).as_secs().to_string();
        let mut args = vec!["--exit-when-idle-seconds".to_string(), backstop];
        args.extend(self.cfg.agent_args.iter().cloned());
        let (child, address) = self.runtime.spawn(&slot_dir, &kubeconfig, &ns, log_level, &args).await?;
        let pid = child.id().unwrap_or(0);
        let record = serde_json::to_vec(&Record { pid, address: address.clone() }).unwrap_or_default();
        std::fs::write(slot_dir.join("agent.json"), record)
            .map_err(|e| LocalError::Agent(format!("recording the agent: {e}")))?;
        tracing::info!(class = %class, slot = n, pid, %address, "pool agent started");
        metrics::counter!(crate::metric_names::POOL_AGENTS_STARTED_TOTAL).increment(1);
        let mut pools = self.pools.lock();
        match pools.get_mut(class).and_then(|p| p.slots.iter_mut().find(|s| s.n == n)) {
            Some(s) => {
                s.agent =
                    Some(LocalAgent { child: Some(child), pid, address: address.clone(), revision: String::new() })
            }
            None => {
                // the pool was stopped while the agent started
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
            }
        }
        Ok(address)
    }

    /// Keeps the pools in shape until `shutdown`, once a second: forgets dead agents, asks agents that may still run an
    /// unfollowed operation whether they are idle, stops agents idle past the timeout down to the minimum, starts
    /// agents up to the minimum, renews tokens, and publishes the pool gauges. At shutdown, stops the idle agents; busy
    /// ones finish their operation (a successor follows it) and then stop by their idle backstop.
    pub async fn run(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        super::every(MAINTAIN_EVERY, &shutdown, || self.maintain()).await;
        self.stop_idle();
    }

    async fn maintain(&self) {
        self.forget_dead_and_ask_unfollowed().await;
        self.resize().await;
        self.renew_tokens().await;
        self.ask_disk().await;
    }

    /// Every [`super::DISK_EVERY`]: each class's live agents are asked how much they keep on disk.
    async fn ask_disk(&self) {
        {
            let mut asked = self.disk_asked.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if asked.is_some_and(|t| t.elapsed() < super::DISK_EVERY) {
                return;
            }
            *asked = Some(Instant::now());
        }
        let addresses: Vec<(PoolId, Vec<String>)> = self
            .pools
            .lock()
            .iter()
            .map(|(class, pool)| {
                (class.clone(), pool.slots.iter().filter_map(|s| s.agent.as_ref().map(|a| a.address.clone())).collect())
            })
            .collect();
        for (class, addresses) in addresses {
            let mut answers = Vec::new();
            for address in addresses {
                answers.extend(crate::agents::client::status(&address, None).await.ok());
            }
            super::publish_disk(class.as_str(), &answers);
        }
    }

    /// Dead agents go; agents that may still run an operation nobody follows are asked whether they are idle now.
    async fn forget_dead_and_ask_unfollowed(&self) {
        let mut ask = Vec::new();
        for (class, pool) in self.pools.lock().iter_mut() {
            drop_dead(class, &mut pool.slots);
            for s in pool.slots.iter().filter(|s| !s.lent && s.running.is_some()) {
                if let Some(a) = &s.agent {
                    ask.push((class.clone(), s.n, a.address.clone()));
                }
            }
        }
        for (class, n, address) in ask {
            let idle =
                matches!(crate::agents::client::status(&address, None).await, Ok(s) if s.state == State::Idle as i32);
            if idle
                && let Some(s) =
                    self.pools.lock().get_mut(&class).and_then(|p| p.slots.iter_mut().find(|s| s.n == n && !s.lent))
            {
                s.running = None;
                s.idle_since = Instant::now();
            }
        }
    }

    /// Idle agents beyond the minimum stop ([`idle_out`]); the minimum is started; the gauges follow.
    async fn resize(&self) {
        let now = Instant::now();
        let mut to_start = Vec::new();
        for (class, pool) in self.pools.lock().iter_mut() {
            let views: Vec<SlotView> = pool.slots.iter_mut().map(Slot::view).collect();
            for i in idle_out(&views, self.cfg.min, self.cfg.idle_timeout, now) {
                let s = &mut pool.slots[i];
                if let Some(a) = &s.agent {
                    tracing::info!(class = %class, slot = s.n, "pool agent idle: stopping it");
                    a.terminate();
                    metrics::counter!(crate::metric_names::POOL_AGENTS_STOPPED_TOTAL).increment(1);
                }
                s.draining = true;
            }
            pool.slots.retain(|s| !(s.draining && !s.lent && s.running.is_none()));
            let usable = views.iter().filter(|v| v.usable || v.starting).count();
            for _ in usable..self.cfg.min {
                let n = (0..).find(|n| pool.slot_index(*n).is_none()).unwrap_or(0);
                pool.slots.push(Slot { n, agent: None, running: None, lent: false, draining: false, idle_since: now });
                to_start.push((class.clone(), n));
            }
            let busy = pool.slots.iter().filter(|s| s.running.is_some() || s.lent).count();
            metrics::gauge!(crate::metric_names::POOL_AGENTS, "class" => class.to_string(), "state" => "busy")
                .set(busy as f64);
            metrics::gauge!(crate::metric_names::POOL_AGENTS, "class" => class.to_string(), "state" => "idle")
                .set((pool.slots.len() - busy) as f64);
            crate::load::set_agents(class.as_str(), busy, pool.slots.len() - busy);
        }
        for (class, n) in to_start {
            if let Err(e) = self.start(&class, n).await {
                tracing::warn!(class = %class, error = %e, "could not start a pool agent for the minimum");
                self.remove_slot(&class, n);
            }
        }
    }

    /// The tokens of the classes with agents are renewed after half their lifetime.
    async fn renew_tokens(&self) {
        let identities: Vec<(PathBuf, String, String)> = self
            .pools
            .lock()
            .values()
            .filter(|p| !p.slots.is_empty())
            .map(|p| (p.replica_dir(&self.replica).join("identity"), p.namespace.clone(), p.service_account.clone()))
            .collect();
        for (dir, ns, sa) in identities {
            if let Err(e) = self.runtime.refresh_identity(&self.client, &dir, &ns, &sa).await {
                tracing::warn!(namespace = %ns, service_account = %sa, error = %e, "could not renew a pool's token");
            }
        }
    }

    /// Stops every agent not running an operation (replica shutdown).
    pub fn stop_idle(&self) {
        for pool in self.pools.lock().values_mut() {
            for s in pool.slots.iter_mut().filter(|s| !s.lent && s.running.is_none()) {
                if let Some(a) = &s.agent {
                    a.terminate();
                }
            }
        }
    }

    /// Agents per class now: `(class, usable agents, of which busy)`, sorted by class (tests, the demo).
    pub fn sizes(&self) -> Vec<(String, usize, usize)> {
        let mut out: Vec<_> = self
            .pools
            .lock()
            .iter_mut()
            .map(|(c, p)| {
                let views: Vec<SlotView> = p.slots.iter_mut().map(Slot::view).collect();
                (
                    c.to_string(),
                    views.iter().filter(|v| v.usable).count(),
                    views.iter().filter(|v| v.usable && (v.lent || v.running.is_some())).count(),
                )
            })
            .collect();
        out.sort();
        out
    }
}

impl GiveBack for LocalPools {
    fn give_back(&self, class: &PoolId, n: usize, end: End) {
        let mut pools = self.pools.lock();
        let Some(pool) = pools.get_mut(class) else { return };
        let Some(s) = pool.slots.iter_mut().find(|s| s.n == n) else { return };
        s.lent = false;
        match end {
            End::Result | End::Busy => s.running = None,
            End::Interrupted => s.draining = true,
            // still running there perhaps: the reaper asks the agent before lending it again
            End::Unknown => {}
        }
        s.idle_since = Instant::now();
    }
}

/// Forgets the slots whose agent died (a lent slot stays until its lender gives it back), killing what a dead agent
/// left of its process group ([`LocalAgent::reap_group`]).
fn drop_dead(class: &PoolId, slots: &mut Vec<Slot>) {
    slots.retain_mut(|s| {
        let keep = s.lent || s.agent.is_none() || s.agent.as_mut().is_some_and(LocalAgent::alive);
        if !keep {
            tracing::info!(class = %class, slot = s.n, "pool agent exited");
            if let Some(a) = &s.agent {
                a.reap_group();
            }
        }
        keep
    });
}

/// The slots under a replica's directory of a class whose recorded agent process is alive (adopted or not: one that did
/// not answer when adopted still owns its work directory until it exits).
fn live_slots(replica_dir: &Path) -> std::collections::HashSet<usize> {
    records(replica_dir).into_iter().filter(|(_, r)| agent_process_alive(r.pid)).map(|(n, _)| n).collect()
}

/// The agent records under a replica's directory of a class: `(slot, record)`.
fn records(replica_dir: &Path) -> Vec<(usize, Record)> {
    let Ok(entries) = std::fs::read_dir(replica_dir) else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_str()?.parse::<usize>().ok()?;
            let record = serde_json::from_slice(&std::fs::read(e.path().join("agent.json")).ok()?).ok()?;
            Some((n, record))
        })
        .collect()
}
