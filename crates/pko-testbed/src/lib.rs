//! Test support for every integration test of the project.
//!
//! The test bed is a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler), the
//! real `pulumi` CLI with its YAML language host and the `command` provider, and a real `redis-server`, all on
//! loopback. `scripts/testbed/ensure.sh` (`make testbed`) builds and starts it; this crate calls that script once per
//! process (the script serialises concurrent callers with a file lock), then reads the environment it prints.
//!
//! What a test gets:
//! - [`TestBed::client`]: a kube [`Client`] with cluster-admin rights on the running API server;
//! - [`TestBed::namespace`]: a fresh namespace, deleted when the [`TestNamespace`] is dropped;
//! - [`TestBed::pulumi_env`]: a private `PULUMI_HOME`, a `file://` backend directory and a passphrase;
//! - [`TestBed::redis_prefix`]: a key prefix unique to the test, so tests may share one Redis.
//!
//! Nothing is skipped: when the bed cannot be brought up, [`testbed`] panics with the script's output.
#![forbid(unsafe_code)]

pub mod api_load;
pub mod cpu;
pub mod git;
pub mod plugins;
pub mod probe;
pub mod ssh;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// The pinned versions of the test bed, read from `scripts/testbed/versions.sh` at compile time.
pub mod versions {
    const VERSIONS_SH: &str = include_str!("../../../scripts/testbed/versions.sh");

    fn pinned(key: &str) -> &'static str {
        VERSIONS_SH
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.split_whitespace().next())
            .unwrap_or_else(|| panic!("{key} missing from scripts/testbed/versions.sh"))
    }

    /// Kubernetes version of the control plane, e.g. `v1.34.4` (what `/version` reports as `gitVersion`).
    pub fn kubernetes() -> &'static str {
        pinned("K8S_VERSION")
    }

    /// Pulumi CLI version, e.g. `v3.259.0` (what `pulumi version` prints).
    pub fn pulumi() -> &'static str {
        pinned("PULUMI_VERSION")
    }
}

/// The running test bed: the environment printed by `scripts/testbed/ensure.sh`.
#[derive(Debug, Clone)]
pub struct TestBed {
    /// Every `export NAME=value` line the script printed (KUBECONFIG, PATH, REDIS_URL, PULUMI_*, ...).
    pub env: BTreeMap<String, String>,
}

static TESTBED: OnceLock<TestBed> = OnceLock::new();

/// Path of the repository root (two levels above this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// Returns the running test bed, bringing it up (and building it, on a cold machine) on first use.
///
/// Panics with the script's output when the bed cannot be brought up: a test that needs the bed fails, it is never
/// skipped.
pub fn testbed() -> &'static TestBed {
    TESTBED.get_or_init(|| {
        let script = repo_root().join("scripts/testbed/ensure.sh");
        let out = Command::new("bash").arg(&script).output().expect("run scripts/testbed/ensure.sh");
        if !out.status.success() {
            panic!(
                "the test bed did not come up ({}):\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        TestBed { env: parse_exports(&String::from_utf8_lossy(&out.stdout)) }
    })
}

/// Parses `export NAME=value` lines; `$PATH` in a value is expanded from this process's PATH.
fn parse_exports(text: &str) -> BTreeMap<String, String> {
    let path = std::env::var("PATH").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("export "))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.replace("$PATH", &path)))
        .collect()
}

impl TestBed {
    /// The value of one environment variable of the bed, e.g. `KUBECONFIG` or `REDIS_URL`.
    ///
    /// Panics when the script did not print it.
    pub fn var(&self, name: &str) -> &str {
        self.env.get(name).unwrap_or_else(|| panic!("test bed environment has no {name}"))
    }

    /// Directory of the test bed's binaries (`kubectl`, `pulumi`, `kube-apiserver`, ...).
    pub fn bin_dir(&self) -> PathBuf {
        PathBuf::from(self.var("PKO_TESTBED_BIN"))
    }

    /// Path of the admin kubeconfig (`system:masters`).
    pub fn kubeconfig(&self) -> PathBuf {
        PathBuf::from(self.var("KUBECONFIG"))
    }

    /// URL of the API server, e.g. `https://127.0.0.1:16443`.
    pub fn api_server_url(&self) -> String {
        let kc = Kubeconfig::read_from(self.kubeconfig()).expect("admin kubeconfig");
        kc.clusters
            .first()
            .and_then(|c| c.cluster.as_ref())
            .and_then(|c| c.server.clone())
            .expect("kubeconfig has a server")
    }

    /// CA bundle file of the API server.
    pub fn ca_file(&self) -> PathBuf {
        PathBuf::from(self.var("PKO_TESTBED_RUN")).join("certs/ca.crt")
    }

    /// Redis URL of the bed's redis-server, e.g. `redis://127.0.0.1:16379`.
    pub fn redis_url(&self) -> &str {
        self.var("REDIS_URL")
    }

    /// The kube client configuration for the admin kubeconfig.
    pub async fn config(&self) -> anyhow::Result<Config> {
        let kc = Kubeconfig::read_from(self.kubeconfig())?;
        Ok(Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?)
    }

    /// A kube client with cluster-admin rights on the bed's API server.
    pub async fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::try_from(self.config().await?)?)
    }

    /// A `kubectl` command bound to the bed (KUBECONFIG set).
    pub fn kubectl(&self) -> Command {
        let mut c = Command::new(self.bin_dir().join("kubectl"));
        c.env("KUBECONFIG", self.kubeconfig());
        c
    }

    /// Creates a fresh namespace `<prefix>-<random>` for one test; it is deleted when the returned value is dropped (or
    /// by [`TestNamespace::delete`]).
    pub async fn namespace(&self, prefix: &str) -> anyhow::Result<TestNamespace> {
        let client = self.client().await?;
        let name = format!("{}-{}", sanitize(prefix), random_suffix(6));
        let ns =
            Namespace { metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() }, ..Default::default() };
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await?;
        Ok(TestNamespace {
            name,
            client,
            kubectl: self.bin_dir().join("kubectl"),
            kubeconfig: self.kubeconfig(),
            deleted: false,
        })
    }

    /// A private Pulumi environment: its own `PULUMI_HOME`, a `file://` backend directory and a passphrase, with the
    /// bed's binaries first on PATH and every switch that keeps Pulumi offline.
    pub fn pulumi_env(&self) -> anyhow::Result<PulumiEnv> {
        let dir = tempfile::Builder::new().prefix("pko-pulumi-").tempdir()?;
        std::fs::create_dir_all(dir.path().join("home"))?;
        std::fs::create_dir_all(dir.path().join("state"))?;
        Ok(PulumiEnv { dir, path: self.var("PATH").to_string() })
    }

    /// The bed's node (`scripts/testbed/node-up.sh`, testbed.md §7): a kubelet on containerd, runc and the CNI bridge,
    /// kube-proxy, and CoreDNS resolving Service names in pods.
    ///
    /// Panics when the bed has no node (`TESTBED_NODE=0`, or no privilege to run one): a test that needs pods fails, it
    /// is never skipped.
    pub fn node(&self) -> Node {
        let name = self.env.get("PKO_TESTBED_NODE").unwrap_or_else(|| {
            panic!("the test bed has no node: `make testbed` as root brings it up (scripts/testbed/node-up.sh)")
        });
        Node { name: name.clone(), ip: self.var("PKO_TESTBED_NODE_IP").to_string() }
    }

    /// Builds the images `pko-operator`, `pko-agent` and `pko-workspace` (`scripts/images/build.sh`, what `make images`
    /// runs) from the binaries in `bin_dir` (e.g. `target/debug`), and imports them into the node's containerd;
    /// unchanged images are neither rebuilt nor re-imported. Once per process. Returns the images' tag (the workspace's
    /// version, e.g. `0.1.0`).
    ///
    /// Panics with the script's output when it fails.
    pub fn images(&self, bin_dir: &Path) -> &'static str {
        static IMAGES: OnceLock<String> = OnceLock::new();
        IMAGES.get_or_init(|| {
            self.node();
            let out = Command::new("bash")
                .arg(repo_root().join("scripts/images/build.sh"))
                .env("PKO_IMAGES_BIN_DIR", bin_dir)
                .env("PATH", self.var("PATH"))
                .output()
                .expect("run scripts/images/build.sh");
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "scripts/images/build.sh failed ({})", out.status);
            env!("CARGO_PKG_VERSION").to_string()
        })
    }

    /// A Redis key prefix unique to one test (`pko-test:<name>:<random>:`), so tests may share the server.
    pub fn redis_prefix(&self, test: &str) -> String {
        format!("pko-test:{}:{}:", sanitize(test), random_suffix(8))
    }
}

/// The test bed's node, as [`TestBed::node`] reports it.
#[derive(Debug, Clone)]
pub struct Node {
    /// Name of the Node object, e.g. `pko-node`.
    pub name: String,
    /// The node's address (its InternalIP, where the API server listens), e.g. `10.250.0.1`: pods reach the host there,
    /// so a test server bound to it serves pods.
    pub ip: String,
}

impl Node {
    /// Gives the image `source` already in the node's containerd (e.g. `localhost/pause:local`) a second name `target`
    /// (e.g. `docker.io/library/nginx:1.27-alpine`), so pods of an unchanged manifest naming `target` start without a
    /// registry, running `source`'s program. Calls are serialised and a name given already is kept.
    ///
    /// Panics when `ctr` fails (test support).
    pub fn tag_image(&self, source: &str, target: &str) {
        // A name is never given twice: `ctr images tag --force` deletes the name before it writes it again, which a pod
        // starting at that moment would not find.
        static TAGGING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one_at_a_time = TAGGING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let sock = testbed().var("PKO_TESTBED_CONTAINERD").to_string();
        let ctr = |args: &[&str]| {
            Command::new("ctr").args(["-a", &sock, "-n", "k8s.io", "images"]).args(args).output().expect("run ctr")
        };
        let listed = ctr(&["ls", "-q"]);
        if String::from_utf8_lossy(&listed.stdout).lines().any(|l| l == target) {
            return;
        }
        let out = ctr(&["tag", source, target]);
        assert!(out.status.success(), "ctr images tag {source} {target}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// The environment that builds the bed's Go programs offline: `GOPROXY=off`, and `GOMODCACHE` and `GOCACHE` naming the
/// Go caches the bed's `pulumi-go` step filled (what `go env` reports here), for operations whose `HOME` is not this
/// process's (an isolating agent's). In that order.
///
/// Panics when `go env` fails (test support).
pub fn offline_go_env() -> [(&'static str, String); 3] {
    let out = Command::new("go").args(["env", "GOMODCACHE", "GOCACHE"]).output().expect("go env");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().map(str::to_string);
    let (mods, cache) = (lines.next().expect("GOMODCACHE"), lines.next().expect("GOCACHE"));
    [("GOPROXY", "off".to_string()), ("GOMODCACHE", mods), ("GOCACHE", cache)]
}

/// Makes SIGINT stop this process (exit status 130) through a handler, for a bench that runs the bare `pulumi`: a
/// process started in the background by a shell without job control ignores SIGINT, and its children inherit that,
/// so the bare `pulumi` then waited 5 s for each plugin it stopped with SIGINT (an `up` took 7.0 s instead of 2.2 s).
/// A handled signal is reset to its default in a child. Call it inside a Tokio runtime.
///
/// Panics when the handler cannot be installed (test support).
pub fn exit_on_interrupt() {
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).expect("SIGINT");
    tokio::spawn(async move {
        interrupt.recv().await;
        std::process::exit(130);
    });
}

/// Polls `check` every 250 ms until it returns true; panics with `what` after `secs` seconds.
pub async fn eventually<F, Fut>(what: &str, secs: u64, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !check().await {
        assert!(tokio::time::Instant::now() < end, "{what}: not within {secs} s");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// Server-side applies `crds` (field manager `pko-tests`) and waits until each is Established.
///
/// Errors: the apply failed or a CRD was not Established within 30 s.
pub async fn install_crds(
    client: &Client,
    crds: Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>,
) -> anyhow::Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Patch, PatchParams};
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &PatchParams::apply("pko-tests").force(), &Patch::Apply(&crd)).await?;
        let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let c = api.get(&name).await?;
            if c.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
            {
                break;
            }
            anyhow::ensure!(std::time::Instant::now() < end, "CRD {name} not Established after 30 s");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

fn sanitize(s: &str) -> String {
    let s: String = s.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    s.trim_matches('-').chars().take(40).collect()
}

fn random_suffix(n: usize) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..n).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect()
}

/// A namespace owned by one test. Dropping it deletes the namespace (without waiting for finalization).
pub struct TestNamespace {
    name: String,
    client: Client,
    kubectl: PathBuf,
    kubeconfig: PathBuf,
    deleted: bool,
}

impl std::fmt::Debug for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNamespace").field("name", &self.name).finish()
    }
}

impl TestNamespace {
    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client the namespace was created with.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// A namespaced API handle for `K` in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Deletes the namespace now (the API server finishes the deletion in the background).
    pub async fn delete(mut self) -> anyhow::Result<()> {
        self.deleted = true;
        Api::<Namespace>::all(self.client.clone()).delete(&self.name, &DeleteParams::background()).await?;
        Ok(())
    }
}

// The controllers that would remove those finalizers stopped with the test; a namespace left `Terminating` is retried
// by the namespace controller for the bed's life (a list of every kind per retry: ~100 requests/s for nine of them).
/// The shell script a dropped [`TestNamespace`] leaves running (`$0` kubectl, `$1` the namespace): deletes the
/// namespace, then removes the finalizers of the project's objects and of the tests' Flux sources until it is gone (~60
/// s at most), each kind listed on its own so a kind the bed lacks fails alone.
const RELEASE_NAMESPACE: &str = r#"
"$0" delete namespace "$1" --wait=false --ignore-not-found >/dev/null 2>&1
for _ in $(seq 1 30); do
  "$0" get namespace "$1" >/dev/null 2>&1 || exit 0
  for kind in stacks.pulumi.com programs.pulumi.com workspaces.auto.pulumi.com updates.auto.pulumi.com \
      gitrepositories.source.toolkit.fluxcd.io ocirepositories.source.toolkit.fluxcd.io \
      buckets.source.toolkit.fluxcd.io; do
    "$0" -n "$1" get "$kind" -o name 2>/dev/null
  done | while read -r o; do
    "$0" -n "$1" patch "$o" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1
  done
  sleep 2
done
"#;

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if !self.deleted {
            // Drop cannot await: the deletion and the release of finalizers go on in the background,
            // after the test (and its binary) may have ended.
            let _ = Command::new("sh")
                .env("KUBECONFIG", &self.kubeconfig)
                .args(["-c", RELEASE_NAMESPACE])
                .arg(&self.kubectl)
                .arg(&self.name)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn();
        }
    }
}

/// A per-test Pulumi environment (removed when dropped).
#[derive(Debug)]
pub struct PulumiEnv {
    dir: tempfile::TempDir,
    path: String,
}

impl PulumiEnv {
    /// Passphrase of the passphrase secrets provider used by every test stack.
    pub const PASSPHRASE: &'static str = "pko-test-passphrase";

    /// The root of this environment (holds `home/` and `state/`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The `file://` backend URL of this environment.
    pub fn backend_url(&self) -> String {
        format!("file://{}", self.dir.path().join("state").display())
    }

    /// The environment variables to give a Pulumi process: PATH, PULUMI_HOME, PULUMI_BACKEND_URL,
    /// PULUMI_CONFIG_PASSPHRASE and the switches that keep it offline.
    pub fn vars(&self) -> Vec<(String, String)> {
        let home = self.dir.path().join("home").display().to_string();
        [
            ("PATH", self.path.clone()),
            ("PULUMI_HOME", home),
            ("PULUMI_BACKEND_URL", self.backend_url()),
            ("PULUMI_CONFIG_PASSPHRASE", Self::PASSPHRASE.to_string()),
            ("PULUMI_SKIP_UPDATE_CHECK", "true".into()),
            ("PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION", "true".into()),
            ("PULUMI_DISABLE_REGISTRY_RESOLVE", "true".into()),
            ("PULUMI_SKIP_CONFIRMATIONS", "true".into()),
            ("PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK", "true".into()),
            ("PULUMI_DIY_BACKEND_NO_LEGACY_WARNING", "true".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// A `pulumi` command with this environment, run in `cwd`.
    pub fn pulumi(&self, cwd: &Path) -> Command {
        let mut c = Command::new("pulumi");
        c.current_dir(cwd).env_clear().envs(self.vars()).env("HOME", self.dir.path());
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_are_parsed_and_path_expanded() {
        let env = parse_exports("export KUBECONFIG=/k\nnoise\nexport PATH=/bin/x:$PATH\n");
        assert_eq!(env["KUBECONFIG"], "/k");
        assert!(env["PATH"].starts_with("/bin/x:"));
        assert!(!env["PATH"].contains("$PATH"));
    }

    #[test]
    fn pinned_versions_are_read() {
        assert!(versions::kubernetes().starts_with("v1.3"));
        assert!(versions::pulumi().starts_with("v3."));
    }

    #[test]
    fn names_are_dns_labels() {
        assert_eq!(sanitize("Smoke_Test::lease"), "smoke-test--lease");
        assert_eq!(random_suffix(6).len(), 6);
    }
}
