//! Helpers for operator tests: the real agent binary, projects, objects.
#![allow(dead_code)]

use std::io::BufRead;
use std::process::{Command, Stdio};

use kube::api::PostParams;
use pko_api::Update;
use pko_testbed::testbed;

pub mod cluster;
pub mod lag;

pub struct AgentProc(pub std::process::Child, pub String);
impl Drop for AgentProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child process (an operator replica) killed when dropped, so a failing test leaves none running.
#[allow(dead_code)]
pub struct KillOnDrop(pub std::process::Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the workspace agent binary built next to this test (cargo builds every binary of the workspace
/// before running `cargo test --workspace`).
pub fn start_agent(env: &pko_testbed::PulumiEnv, namespace: &str) -> AgentProc {
    start_agent_with(env, &["--auth", "none", "--kube-workspace-namespace", namespace])
}

/// Starts the agent with `auth_args` (e.g. `--auth kube --kube-audience …`), as the bed's admin.
pub fn start_agent_with(env: &pko_testbed::PulumiEnv, auth_args: &[&str]) -> AgentProc {
    let bin = agent_bin();
    // a work directory per agent: an agent locks its own (two agents never share one)
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let work = env.dir().join(format!("agent-work-{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    let mut child = Command::new(bin)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(auth_args)
        .arg("--work-dir")
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
    let addr = pko_proto::listening_address(&line).unwrap().to_string();
    AgentProc(child, format!("http://{addr}"))
}

/// The `pko-agent` binary next to this test's directory (cargo builds every workspace binary for
/// `cargo test --workspace`; `make test` builds them first).
pub fn agent_bin() -> std::path::PathBuf {
    let bin = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("pko-agent");
    assert!(bin.exists(), "{} is missing: build it with `cargo build -p pko-agent`", bin.display());
    bin
}

/// The `kubectl-pko` binary of this workspace (built by `cargo build --workspace --bins`).
#[allow(dead_code)]
pub fn kubectl_pko_bin() -> std::path::PathBuf {
    let bin = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("kubectl-pko");
    assert!(bin.exists(), "{} is missing: build it with `cargo build -p pko-cli`", bin.display());
    bin
}

/// `kubectl pko <args>` as the bed's admin.
#[allow(dead_code)]
pub fn kubectl_pko(args: &[&str]) -> std::process::Output {
    Command::new(kubectl_pko_bin()).args(args).env("KUBECONFIG", testbed().kubeconfig()).output().unwrap()
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

/// The whole operator (artifact server, Program, Workspace with the local runtime, Update and Stack
/// controllers, metrics) started by the same assembly as `pko-operator run` (`pko_operator::run`), in
/// this test process and owning only `namespace`, so tests of one binary that run in parallel never act
/// on each other's objects. Dropping it cancels its shutdown token and stops the agents.
pub struct InProcessOperator {
    pub running: Option<pko_operator::run::Running>,
    shutdown: tokio_util::sync::CancellationToken,
    pub metrics_url: String,
}

/// The flags of an in-process operator: local runtime on the bed, loopback ports picked by the kernel,
/// plain-HTTP metrics, no probe endpoint, only `namespace`.
pub fn run_args(env: &pko_testbed::PulumiEnv, namespace: &str) -> pko_operator::args::RunArgs {
    run_args_with(env, namespace, &[])
}

/// [`run_args`] and then `extra` flags.
pub fn run_args_with(env: &pko_testbed::PulumiEnv, namespace: &str, extra: &[&str]) -> pko_operator::args::RunArgs {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: pko_operator::args::RunArgs,
    }
    let bed = testbed();
    let (agent_bin, work, ca) = (
        agent_bin().display().to_string(),
        env.dir().join("agents").display().to_string(),
        bed.ca_file().display().to_string(),
    );
    let args = [
        "test",
        "--runtime",
        "local",
        "--agent-bin",
        &agent_bin,
        "--local-work-dir",
        &work,
        "--local-api-server",
        &bed.api_server_url(),
        "--local-ca-file",
        &ca,
        "--program-fs-addr",
        "127.0.0.1:0",
        "--metrics-bind-address",
        "127.0.0.1:0",
        "--metrics-secure=false",
        "--health-probe-bind-address",
        "0",
        "--max-operations",
        "8",
        "--namespaces",
        namespace,
    ];
    // an `extra` `--max-operations` replaces the default 8
    let overridden = extra.contains(&"--max-operations");
    let base = args
        .iter()
        .enumerate()
        .filter(|(i, a)| !(overridden && (**a == "--max-operations" || (*i > 0 && args[i - 1] == "--max-operations"))))
        .map(|(_, a)| a);
    Cli::parse_from(base.chain(extra)).run
}

impl InProcessOperator {
    pub async fn start(client: &kube::Client, env: &pko_testbed::PulumiEnv, namespace: &str) -> Self {
        Self::start_with(client, env, run_args(env, namespace)).await
    }

    /// An operator with `args`.
    pub async fn start_with(
        client: &kube::Client,
        env: &pko_testbed::PulumiEnv,
        args: pko_operator::args::RunArgs,
    ) -> Self {
        let shutdown = tokio_util::sync::CancellationToken::new();
        let running = pko_operator::run::Operator::new(client.clone(), args)
            .local_agent_env(env.vars())
            .start(shutdown.clone())
            .await
            .unwrap();
        let metrics_url = format!("http://{}/metrics", running.metrics_addr.unwrap());
        Self { running: Some(running), shutdown, metrics_url }
    }

    /// Shuts it down gracefully (as on SIGTERM) and waits until it has stopped.
    #[allow(dead_code)]
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(r) = self.running.take() {
            r.wait().await;
        }
    }

    /// The text of its `/metrics` endpoint.
    pub async fn metrics(&self) -> String {
        reqwest::get(&self.metrics_url).await.unwrap().text().await.unwrap()
    }
}

impl Drop for InProcessOperator {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.running.take();
    }
}

/// `(status, reason)` of the Stack condition `type_`.
pub fn stack_condition(s: &pko_api::Stack, type_: &str) -> Option<(String, String, String)> {
    s.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Prints every Stack (generation, observed, conditions, outputs, current and last Update) and every
/// Update (phase conditions, shard, message) of `ns`, for a test that is about to fail.
#[allow(dead_code)]
pub async fn dump_stacks_and_updates(ns: &pko_testbed::TestNamespace) {
    use kube::ResourceExt;
    for s in ns.api::<pko_api::Stack>().list(&Default::default()).await.map(|l| l.items).unwrap_or_default() {
        let st = s.status.as_ref();
        eprintln!(
            "stack {} gen={:?} labels={:?} observed={:?} outputs={:?} current={:?} last={:?} conditions={:?}",
            s.name_any(),
            s.metadata.generation,
            s.labels(),
            st.and_then(|x| x.observed_generation),
            st.and_then(|x| x.outputs.as_ref()),
            st.and_then(|x| x.current_update.as_ref()).map(|u| &u.name),
            st.and_then(|x| x.last_update.as_ref()).map(|u| (&u.name, &u.state, &u.generation)),
            st.and_then(|x| x.conditions.as_ref())
                .map(|c| c.iter().map(|c| (&c.type_, &c.status, &c.reason, &c.message)).collect::<Vec<_>>()),
        );
    }
    for u in ns.api::<Update>().list(&Default::default()).await.map(|l| l.items).unwrap_or_default() {
        let conditions = u
            .status
            .as_ref()
            .and_then(|x| x.conditions.as_ref())
            .map(|c| c.iter().map(|c| (&c.type_, &c.status, &c.reason)).collect::<Vec<_>>());
        let message = u.status.as_ref().and_then(|x| x.message.as_deref()).unwrap_or_default();
        eprintln!(
            "update {} labels={:?} finalizers={:?} conditions={conditions:?} message={message:?}",
            u.name_any(),
            u.labels(),
            u.finalizers()
        );
    }
}

/// `(reason, message)` of the Stack's `Stalled` condition when it is True.
pub fn stalled(s: &pko_api::Stack) -> Option<(String, String)> {
    s.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Stalled" && c.status == "True")
        .map(|c| (c.reason.clone(), c.message.clone()))
}

/// `(reason, message)` of the Stack's `Reconciling` condition when it is True.
pub fn reconciling(s: &pko_api::Stack) -> Option<(String, String)> {
    stack_condition(s, "Reconciling")
        .filter(|(status, ..)| status == "True")
        .map(|(_, reason, message)| (reason, message))
}

/// Runs only the Stack controller, owning `namespace` (tests of what it decides before any Workspace).
pub fn start_stack_controller(client: &kube::Client, namespace: &str) -> tokio::task::JoinHandle<()> {
    use pko_operator::context::Context;
    use pko_operator::ownership::Namespaces;
    let ctx = std::sync::Arc::new(Context::new(
        client.clone(),
        String::new(),
        std::sync::Arc::new(Namespaces::one(namespace)),
    ));
    let mut informers = pko_operator::informer::Informers::new(client.clone(), scoped(namespace));
    let (_, controller) = pko_operator::stack::controller::controller(ctx, &mut informers);
    tokio::spawn(informers.drive(controller))
}

/// The watch scope of a test: its own namespace only.
pub fn scoped(namespace: &str) -> pko_operator::informer::WatchScope {
    pko_operator::informer::WatchScope::Namespaces(vec![namespace.to_string()])
}

/// A test's start on the bed: a client, the CRDs installed, a fresh namespace `<prefix>-…` and a
/// per-test Pulumi environment.
pub async fn setup(prefix: &str) -> (kube::Client, pko_testbed::TestNamespace, pko_testbed::PulumiEnv) {
    let bed = testbed();
    let client = bed.client().await.unwrap();
    pko_testbed::install_crds(&client, pko_api::crds()).await.unwrap();
    let ns = bed.namespace(prefix).await.unwrap();
    let env = bed.pulumi_env().unwrap();
    (client, ns, env)
}

/// Every file under `dir`, recursively (e.g. the lock files of a file:// backend).
pub fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files_under(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Whether the Stack's `Ready` condition is True.
pub fn ready(s: &pko_api::Stack) -> bool {
    stack_condition(s, "Ready").is_some_and(|c| c.0 == "True")
}

/// The passphrase Secret `p` (key `v`) in `ns`, which [`passphrase_env_refs`] names.
pub async fn passphrase_secret(ns: &pko_testbed::TestNamespace) {
    create(
        &ns.api::<k8s_openapi::api::core::v1::Secret>(),
        serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "p"},
            "stringData": {"v": pko_testbed::PulumiEnv::PASSPHRASE}}),
    )
    .await;
}

/// A Stack's `envRefs` giving Pulumi the passphrase of [`passphrase_secret`].
pub fn passphrase_env_refs() -> serde_json::Value {
    serde_json::json!({"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret", "secret": {"name": "p", "key": "v"}}})
}

/// A passphrase Secret `p` (key `v`) and Program `prog` with `program` as its body, in `ns` (no Role
/// for the workspace's service account: the operator resolves Secret references, as PKO's RBAC needs).
pub async fn passphrase_and_program(ns: &pko_testbed::TestNamespace, program: serde_json::Value) {
    passphrase_secret(ns).await;
    create(
        &ns.api::<pko_api::Program>(),
        serde_json::json!({"apiVersion": "pulumi.com/v1", "kind": "Program",
        "metadata": {"name": "prog"}, "program": program}),
    )
    .await;
}

/// Stack `name` (also its stack name) of Program `prog` on `env`'s backend, with the passphrase of
/// [`passphrase_and_program`], and `config`.
pub async fn prog_stack(
    ns: &pko_testbed::TestNamespace,
    env: &pko_testbed::PulumiEnv,
    name: &str,
    config: serde_json::Value,
) {
    create(
        &ns.api::<pko_api::Stack>(),
        serde_json::json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name},
        "spec": {"stack": name, "programRef": {"name": "prog"}, "backend": env.backend_url(), "config": config,
                 "envRefs": passphrase_env_refs()}}),
    )
    .await;
}

/// Fleet flags of replica `replica` in `ns` (64 shards, a 6 s lease renewed every 2 s, 4 s renew
/// deadline), plus `redis`.
pub fn fleet_args<'a>(ns: &'a str, replica: &'a str, redis: &'a [&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "--fleet",
        "--fleet-namespace",
        ns,
        "--replica-id",
        replica,
        "--shards",
        "64",
        "--lease-duration-seconds",
        "6",
        "--renew-interval-seconds",
        "2",
        "--renew-deadline-seconds",
        "4",
    ];
    v.extend_from_slice(redis);
    v
}

/// `pko-operator run` with the local runtime on the bed, watching only `ns`, artifacts on loopback
/// `port`, no metrics or probe listeners, a clean environment (the Pulumi environment of `env`, its
/// directory as `HOME`); the caller adds flags, credentials and where the output goes.
#[allow(dead_code)]
pub fn operator_command(env: &pko_testbed::PulumiEnv, ns: &str, port: u16) -> Command {
    let bed = testbed();
    let mut c = Command::new(env!("CARGO_BIN_EXE_pko-operator"));
    c.args(["run", "--runtime", "local", "--namespaces", ns, "--agent-bin"])
        .arg(agent_bin())
        .args([
            "--program-fs-addr",
            &format!("127.0.0.1:{port}"),
            "--local-api-server",
            &bed.api_server_url(),
            "--local-ca-file",
        ])
        .arg(bed.ca_file())
        .arg("--local-work-dir")
        .arg(env.dir().join("agents"))
        .env_clear()
        .envs(env.vars())
        .env("HOME", env.dir())
        // metrics and probes off unless a test sets these variables again
        .env("METRICS_BIND_ADDRESS", "0")
        .env("HEALTH_PROBE_BIND_ADDRESS", "0");
    c
}

/// A `pko-operator run` process ([`operator_command`]): replica `name` of fleet `fleet` (64 shards, a
/// 6 s lease renewed every 2 s, 4 s renew deadline) in `ns`, `extra` flags (Redis, pools) last;
/// credentials from `kubeconfig`; logs in `<env dir>/<name>.{out,err}.log` (its agents inherit them).
#[allow(dead_code)]
pub fn start_replica_process(
    env: &pko_testbed::PulumiEnv,
    ns: &str,
    fleet: &str,
    name: &str,
    kubeconfig: &std::path::Path,
    port: u16,
    extra: &[&str],
) -> std::process::Child {
    let log = |s: &str| std::fs::File::create(env.dir().join(format!("{name}.{s}.log"))).unwrap();
    operator_command(env, ns, port)
        .args(["--fleet", "--fleet-namespace", ns, "--fleet-name", fleet, "--replica-id", name, "--shards", "64"])
        .args(["--lease-duration-seconds", "6", "--renew-interval-seconds", "2", "--renew-deadline-seconds", "4"])
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(Stdio::from(log("out")))
        .stderr(Stdio::from(log("err")))
        .spawn()
        .unwrap()
}

/// Shard number → holder, from the shard table of fleet `fleet` (`<fleet>-shards-<S>`; the tables of
/// every count, should there be several).
#[allow(dead_code)]
pub async fn shard_holders(
    leases: &kube::Api<k8s_openapi::api::coordination::v1::Lease>,
    fleet: &str,
) -> std::collections::BTreeMap<u32, String> {
    let lp = kube::api::ListParams::default().labels(&format!("pulumi.com/fleet={fleet},pulumi.com/lease=table"));
    leases
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(|l| pko_fleet::table::ShardTable::of(l).expect("a readable shard table").holders())
        .collect()
}

/// The Update manifest `update` with its Workspace (`spec.workspaceName`, read from `workspaces`) as
/// controlling owner: as in PKO, an Update runs only with one (an Update created by hand without a
/// controller owner is canceled).
pub async fn owned_update(
    workspaces: &kube::Api<pko_api::Workspace>,
    mut update: serde_json::Value,
) -> serde_json::Value {
    let name = update["spec"]["workspaceName"].as_str().unwrap_or_default().to_string();
    let ws = workspaces.get(&name).await.unwrap_or_else(|e| panic!("the Workspace {name} of an Update: {e}"));
    update["metadata"]["ownerReferences"] = serde_json::json!([{"apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Workspace", "name": name, "uid": ws.metadata.uid, "controller": true}]);
    update
}

/// What a test's dispatcher holds: every object at epoch 1 unless `fenced`, with `not_after` asked when
/// `Run` is sent (the fence deadline the agent enforces).
pub struct TestHold<F: Fn() -> Option<std::time::SystemTime> + Send + Sync + 'static> {
    /// The shard is not held (any more): nothing may be written.
    pub fenced: bool,
    /// The hold's deadline.
    pub not_after: F,
}

impl<F: Fn() -> Option<std::time::SystemTime> + Send + Sync + 'static> std::fmt::Debug for TestHold<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestHold").field("fenced", &self.fenced).finish()
    }
}

impl<F: Fn() -> Option<std::time::SystemTime> + Send + Sync + 'static> pko_operator::ownership::Ownership
    for TestHold<F>
{
    fn owns(&self, _namespace: &str, _name: &str) -> bool {
        !self.fenced
    }
    fn epoch(&self, _namespace: &str, _name: &str) -> i64 {
        if self.fenced { 2 } else { 1 }
    }
    fn not_after(&self, _namespace: &str, _name: &str) -> Option<std::time::SystemTime> {
        (self.not_after)()
    }
}

/// Held at epoch 1, no deadline.
pub fn held() -> TestHold<fn() -> Option<std::time::SystemTime>> {
    TestHold { fenced: false, not_after: || None }
}

/// Runs `update` on `workspace` on the agent at `address` as a worker at epoch 1 would, behind the fence
/// of `hold` (the dispatch steps alone: no queue, no pool).
pub async fn dispatch_on(
    client: &kube::Client,
    address: &str,
    update: &Update,
    workspace: &pko_api::Workspace,
    hold: &dyn pko_operator::ownership::Ownership,
) -> Result<pko_proto::v1::OperationResult, pko_operator::update::dispatch::DispatchError> {
    dispatch_into(client, address, update, workspace, hold, &pko_operator::queue::output::MemoryOutput::default()).await
}

/// [`dispatch_on`], keeping the operation's output in `output`.
#[allow(dead_code)]
pub async fn dispatch_into(
    client: &kube::Client,
    address: &str,
    update: &Update,
    workspace: &pko_api::Workspace,
    hold: &dyn pko_operator::ownership::Ownership,
    output: &dyn pko_operator::queue::output::OutputStore,
) -> Result<pko_proto::v1::OperationResult, pko_operator::update::dispatch::DispatchError> {
    use kube::ResourceExt;
    let queue = pko_operator::queue::InMemoryQueue::default();
    let ns = update.namespace().unwrap_or_default();
    let job = pko_operator::queue::Job {
        key: update.operation_id(),
        namespace: ns,
        name: update.name_any(),
        epoch: 1,
        shard: 0,
    };
    let fence =
        pko_operator::update::fence::Fence::new(hold, &queue, &job, pko_api::shard::ShardKey::shard_key(update));
    let lent = pko_operator::agents::Lent::own(address.to_string());
    let events = pko_operator::k8s::Events::new(client);
    let op = pko_operator::update::dispatch::Operation {
        client,
        events: &events,
        github_api_url: pko_git::github_app::DEFAULT_API_URL,
        artifact_addr: "",
        update,
        workspace,
        agent: &lent,
        fence: &fence,
        started: &|| {},
        output,
        plans: &pko_queue::plans::MemoryPlans::default(),
        outputs: &pko_operator::outputs::Written::default(),
        secrets: &pko_operator::secret_cache::SecretCache::default(),
        limits: pko_operator::update::limits::Limits::default(),
        cancel: &|| None,
    };
    pko_operator::update::dispatch::run(&op).await
}
