//! Program sources: a working directory per source revision, prepared once (clone or download, then `pulumi install`)
//! and reused; the cache is bounded by size, least recently used first out.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use pko_proto::v1::{ArtifactSource, Source, source::Kind};
use sha2::{Digest, Sha256};

use crate::values::ValueResolver;

/// A source that could not be prepared: reported as `INVALID_SOURCE`, or `INSTALLATION_FAILED` when `install` is set
/// (the source is there; `pulumi install` failed).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct SourceError {
    /// What went wrong.
    pub message: String,
    /// `pulumi install` failed (the fetch itself succeeded).
    pub install: bool,
}

fn err(msg: impl Into<String>) -> SourceError {
    SourceError { message: msg.into(), install: false }
}

fn install_err(msg: impl Into<String>) -> SourceError {
    SourceError { message: msg.into(), install: true }
}

/// Variables to add to the environment of `pulumi install` in a fetched project directory (the operation's Stack's
/// own caches, `crate::stack_cache`: Go's module downloads then land where the operation's build reads them).
pub type InstallVars<'a> = dyn Fn(&Path) -> Vec<(String, String)> + Send + Sync + 'a;

/// A prepared program.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The whole prepared source (a checkout, an extracted artifact, a local directory).
    pub root: PathBuf,
    /// Directory holding `Pulumi.yaml`, inside [`Prepared::root`].
    pub project_dir: PathBuf,
    /// What ran: the commit SHA, the artifact digest, the local path or `project:<name>`.
    pub revision: String,
    /// Cache key of the working directory.
    pub key: String,
    /// Whether the agent fetched it into its cache (a local directory is the user's): only then are its dependency
    /// trees sealed and shared ([`crate::trees`]).
    pub fetched: bool,
}

/// Settings of the source cache.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Root directory of the cache.
    pub root: PathBuf,
    /// Total size the cache may keep, in bytes; least recently used entries go first.
    pub max_bytes: u64,
    /// Largest uncompressed artifact, in bytes (PKO's Flux default: 100 MiB).
    pub max_artifact_bytes: u64,
    /// Artifact downloads: timeouts and retries.
    pub download: DownloadConfig,
    /// The Pulumi CLI for `pulumi install`.
    pub pulumi: crate::pulumi::Cli,
    /// Whether a new revision's dependency tree (`node_modules`, a virtualenv) is seeded from an earlier prepared
    /// revision with the same manifests before `pulumi install` ([`crate::seed`]; `pko-agent serve
    /// --seed-dependency-trees`).
    pub seed_dependency_trees: bool,
}

/// Timeouts and retries of artifact downloads (PKO retries a Flux fetch 3 times); the agent's `--artifact-*` flags set
/// them.
#[derive(Debug, Clone, Copy)]
pub struct DownloadConfig {
    /// Time to establish the connection.
    pub connect_timeout: Duration,
    /// Longest silence while waiting for the response or its next bytes.
    pub read_timeout: Duration,
    /// Time the whole download may take: every attempt, its body and the waits between attempts (a server that drips a
    /// byte now and then ends here, once, not once per attempt).
    pub total_timeout: Duration,
    /// Attempts after the first, on connection errors, timeouts, HTTP 429 and 5xx; 1 s, 2 s, 4 s … apart.
    pub retries: u32,
}

/// The cache of prepared sources.
#[derive(Debug)]
pub struct SourceCache {
    cfg: CacheConfig,
    http: reqwest::Client,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// How many prepared sources handed out are not yet released, per key: an entry is pinned while any operation
    /// holds it (two operations of one revision release it at different times).
    in_use: Mutex<HashMap<String, usize>>,
    /// The size of each entry, measured once when first listed (an entry does not change once ready; walking
    /// `node_modules` at each `Status` would cost more than the call).
    sizes: Mutex<HashMap<String, u64>>,
}

pub use entries::CachedEntry;

const READY: &str = ".pko-ready";

impl SourceCache {
    /// A cache rooted at `cfg.root` (created when missing).
    pub fn new(cfg: CacheConfig) -> std::io::Result<Self> {
        std::fs::create_dir_all(&cfg.root)?;
        let d = cfg.download;
        let http = reqwest::Client::builder()
            .connect_timeout(d.connect_timeout)
            .read_timeout(d.read_timeout)
            .timeout(d.total_timeout)
            .redirect(reqwest::redirect::Policy::limited(5))
            .build()
            .map_err(std::io::Error::other)?;
        Ok(Self { cfg, http, locks: Mutex::default(), in_use: Mutex::default(), sizes: Mutex::default() })
    }

    /// Prepares `source` (or reuses its cached working directory) and returns the project directory; `pulumi install`
    /// runs once per fetched revision unless `install` is false (the Workspace's `skipInstall`; such an entry is cached
    /// apart from an installed one). The entry stays pinned (never evicted) until [`SourceCache::release`].
    pub async fn prepare(
        &self,
        source: &Source,
        values: &ValueResolver,
        (env, install_vars): (&BTreeMap<String, String>, &InstallVars<'_>),
        install: bool,
    ) -> Result<Prepared, SourceError> {
        let kind = source.kind.as_ref().ok_or_else(|| err("the request has no source"))?;
        if let Some(prepared) = self.unfetched(kind)? {
            return Ok(prepared);
        }
        let (key, dir, revision) = fetched_key(kind, values).await?;
        let key = if install { key } else { format!("{key}-noinstall") };
        let lock = self.lock_of(&key);
        let _guard = lock.lock().await;
        let path = self.cfg.root.join(&key);
        if !path.join(READY).exists() {
            self.fetch_and_install(kind, values, (env, install_vars), (&revision, &dir), install, &path).await?;
        }
        touch(&path.join(READY));
        let project = safe_join(&path, &dir)?;
        self.finish(key, path, project, revision, Some(()))
    }

    /// A source that is not fetched — a local directory, or a project synthesised from its info — as prepared;
    /// `None` for one that is.
    fn unfetched(&self, kind: &Kind) -> Result<Option<Prepared>, SourceError> {
        match kind {
            Kind::Local(l) => {
                let p = PathBuf::from(&l.dir);
                if !p.is_dir() {
                    return Err(err(format!("local source directory {} does not exist", l.dir)));
                }
                self.finish(format!("local:{}", l.dir), p.clone(), p, l.dir.clone(), None).map(Some)
            }
            Kind::ProjectInfo(pi) => {
                if pi.name.is_empty() || pi.runtime.is_empty() {
                    return Err(err("projectInfo needs a name and a runtime"));
                }
                let key = format!("project-{}", hex(&Sha256::digest(format!("{}\n{}", pi.name, pi.runtime))[..8]));
                let path = self.cfg.root.join(&key);
                if !path.join(READY).exists() {
                    std::fs::create_dir_all(&path).map_err(|e| err(e.to_string()))?;
                    std::fs::write(path.join("Pulumi.yaml"), format!("name: {}\nruntime: {}\n", pi.name, pi.runtime))
                        .map_err(|e| err(e.to_string()))?;
                    std::fs::write(path.join(READY), "").map_err(|e| err(e.to_string()))?;
                }
                self.finish(key, path.clone(), path, format!("project:{}", pi.name), None).map(Some)
            }
            Kind::Git(_) | Kind::Artifact(_) => Ok(None),
        }
    }

    /// Fetches `kind` at `revision` into a temporary directory, checks it holds a project at `dir`, runs `pulumi
    /// install` there when `install` asks for it, and moves it to `path`, marked ready.
    async fn fetch_and_install(
        &self,
        kind: &Kind,
        values: &ValueResolver,
        (env, install_vars): (&BTreeMap<String, String>, &InstallVars<'_>),
        (revision, dir): (&str, &str),
        install: bool,
        path: &Path,
    ) -> Result<(), SourceError> {
        let tmp =
            tempfile::Builder::new().prefix(".tmp-").tempdir_in(&self.cfg.root).map_err(|e| err(e.to_string()))?;
        match kind {
            Kind::Git(g) => {
                let auth = GitAuthArgs::resolve(g, values).await?;
                clone(g, revision, &auth, tmp.path()).await?;
            }
            Kind::Artifact(a) => self.download(a, tmp.path()).await?,
            Kind::Local(_) | Kind::ProjectInfo(_) => return Err(err("a local or projectInfo source is never fetched")),
        }
        let project = safe_join(tmp.path(), dir)?;
        if project_file(&project).is_none() {
            let where_ = if dir.is_empty() { "the root" } else { dir };
            return Err(err(format!("no Pulumi.yaml in {where_} of the source")));
        }
        // the ready marker records the dependency manifests as fetched: what a later revision is seeded by
        let manifests = crate::seed::manifest_digest(&project).unwrap_or_default();
        if install {
            let seeded = self.seed(&project, dir, &manifests).await;
            let mut env = env.clone();
            env.extend(install_vars(&project));
            self.install(&project, &env, seeded.as_ref()).await?;
        }
        std::fs::write(tmp.path().join(READY), &manifests).map_err(|e| err(e.to_string()))?;
        let _ = crate::trees::remove_tree(path);
        let tmp_path = tmp.keep();
        std::fs::rename(&tmp_path, path).map_err(|e| err(format!("caching the source: {e}")))
    }

    fn finish(
        &self,
        key: String,
        root: PathBuf,
        project_dir: PathBuf,
        revision: String,
        cached: Option<()>,
    ) -> Result<Prepared, SourceError> {
        if project_file(&project_dir).is_none() {
            return Err(err(format!("no Pulumi.yaml in {}", project_dir.display())));
        }
        *self.in_use.lock().unwrap_or_else(std::sync::PoisonError::into_inner).entry(key.clone()).or_default() += 1;
        if cached.is_some() {
            self.evict();
        }
        Ok(Prepared { root, project_dir, revision, key, fetched: cached.is_some() })
    }

    /// Removes the prepared source `key` (its dependency trees changed: [`crate::trees::ShareError::Changed`]), so the
    /// next [`SourceCache::prepare`] fetches and installs it anew.
    ///
    /// Errors: it could not be removed.
    pub fn discard(&self, key: &str) -> std::io::Result<()> {
        let path = self.cfg.root.join(key);
        self.forget_size(key);
        crate::trees::remove_tree(&path)?;
        tracing::warn!(key, "discarded a cached source whose dependency trees changed");
        Ok(())
    }

    /// Unpins a prepared source.
    pub fn release(&self, key: &str) {
        let mut in_use = self.in_use.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = in_use.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                in_use.remove(key);
            }
        }
    }

    /// The lock of the cached revision `key`: held while it is prepared, handed to an operation, taken over as a seed
    /// or evicted, so none of these meets another half done.
    fn lock_of(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner).entry(key.into()).or_default().clone()
    }

    /// Whether an operation holds the prepared source `key` (prepared and not yet released).
    pub fn is_in_use(&self, key: &str) -> bool {
        self.in_use.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains_key(key)
    }

    /// Downloads the artifact (retrying as [`DownloadConfig`] says, all within its total timeout), checks its digest
    /// and extracts it into `into` ([`crate::archive::extract_tar_gz`] within the artifact limit).
    async fn download(&self, a: &ArtifactSource, into: &Path) -> Result<(), SourceError> {
        let total = self.cfg.download.total_timeout;
        let file = tokio::time::timeout(total, self.fetch_with_retries(a))
            .await
            .map_err(|_| err(deadline_message(&a.url, total)))??;
        let into = into.to_path_buf();
        let limits = crate::archive::Limits::new(self.cfg.max_artifact_bytes);
        let extracted = tokio::task::spawn_blocking(move || crate::archive::extract_tar_gz(file, &into, &limits))
            .await
            .map_err(|e| err(e.to_string()))?;
        extracted.map(|_| ()).map_err(|e| err(e.to_string()))
    }

    /// [`SourceCache::fetch_once`] from each of [`addresses`] in turn until one answers; the whole round again after 1
    /// s, 2 s, 4 s … while an error says a retry may help, at most [`DownloadConfig::retries`] times. The error
    /// returned is the artifact URL's own (the one the user wrote or the Program published); a mirror's is logged.
    async fn fetch_with_retries(&self, a: &ArtifactSource) -> Result<std::fs::File, SourceError> {
        let mut attempt = 0u32;
        loop {
            let mut first: Option<SourceError> = None;
            let mut retry = false;
            for url in addresses(a) {
                match self.fetch_once(a, url).await {
                    Ok(f) => return Ok(f),
                    Err((e, again)) => {
                        if first.is_some() {
                            tracing::info!(mirror = %url, error = %e, "artifact download from a mirror failed");
                        }
                        retry |= again;
                        first.get_or_insert(e);
                    }
                }
            }
            let e = first.unwrap_or_else(|| err("the artifact has no URL"));
            if !retry || attempt >= self.cfg.download.retries {
                return Err(e);
            }
            let wait = Duration::from_secs(1 << attempt.min(5));
            tracing::info!(url = %a.url, error = %e, attempt = attempt + 1, wait_s = wait.as_secs(),
                "artifact download failed; retrying");
            attempt += 1;
            tokio::time::sleep(wait).await;
        }
    }

    /// One download attempt of `a` from `url` into a temporary file, checked against `a`'s digest. Errors carry whether
    /// a retry may help (connection errors, timeouts, HTTP 429 and 5xx).
    async fn fetch_once(&self, a: &ArtifactSource, url: &str) -> Result<std::fs::File, (SourceError, bool)> {
        let transient = |e: &reqwest::Error| e.is_connect() || e.is_timeout() || e.is_request() || e.is_body();
        let resp = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| (err(format!("downloading {url}: {}", describe(&e))), transient(&e)))?;
        let status = resp.status();
        if !status.is_success() {
            let retry = status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS;
            return Err((err(format!("downloading {url}: HTTP {status}")), retry));
        }
        // the compressed size is bounded by the uncompressed limit too
        let cap = self.cfg.max_artifact_bytes;
        let mut file = tempfile::tempfile().map_err(|e| (err(e.to_string()), false))?;
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| (err(format!("downloading {url}: {}", describe(&e))), transient(&e)))?;
            size += chunk.len() as u64;
            if size > cap {
                return Err((err(format!("artifact is larger than the {cap}-byte limit")), false));
            }
            hasher.update(&chunk);
            file.write_all(&chunk).map_err(|e| (err(e.to_string()), false))?;
        }
        let got = format!("sha256:{}", hex(&hasher.finalize()));
        if !a.digest.is_empty() && !got.eq_ignore_ascii_case(&a.digest) {
            return Err((err(format!("artifact digest mismatch: expected {}, got {got}", a.digest)), false));
        }
        use std::io::Seek;
        file.rewind().map_err(|e| (err(e.to_string()), false))?;
        Ok(file)
    }
}

/// The addresses an artifact is downloaded from, in order: its URL, then its mirrors — only when it has a digest
/// (bytes from another address are verified against it; without one, only the URL the Workspace names is trusted).
/// Pure.
pub fn addresses(a: &ArtifactSource) -> impl Iterator<Item = &str> {
    let mirrors = if a.digest.is_empty() { &a.mirrors[..0] } else { &a.mirrors[..] };
    std::iter::once(a.url.as_str()).chain(mirrors.iter().map(String::as_str).filter(move |m| *m != a.url))
}

/// Why a download ran out of time: the URL's host (never its path or query, which may carry a token) and the limit.
/// Pure.
pub fn deadline_message(url: &str, total: Duration) -> String {
    let host = reqwest::Url::parse(url)
        .ok()
        .and_then(|u| Some(format!("{}{}", u.host_str()?, u.port().map(|p| format!(":{p}")).unwrap_or_default())));
    format!(
        "downloading the artifact from {}: not complete within {} s, all attempts included (agent flag \
            --artifact-timeout-seconds)",
        host.unwrap_or_else(|| "an unparsable URL".into()),
        total.as_secs()
    )
}

/// A reqwest error with its causes (reqwest's own text is only "error sending request").
fn describe(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() { "timed out".to_string() } else { e.to_string() };
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        text.push_str(&format!(": {s}"));
        src = s.source();
    }
    text
}

/// Whether `p` is relative and never climbs above its root.
fn is_relative_inside(p: &Path) -> bool {
    let mut depth: i32 = 0;
    for c in p.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

fn safe_join(root: &Path, dir: &str) -> Result<PathBuf, SourceError> {
    let d = dir.trim_start_matches("./");
    if d.is_empty() {
        return Ok(root.to_path_buf());
    }
    if !is_relative_inside(Path::new(d)) {
        return Err(err(format!("source directory {dir:?} leaves the source")));
    }
    Ok(root.join(d))
}

/// The cache key, the project's directory in the source and the revision of a fetched source (git: its commit, resolved
/// from the ref; an artifact: its digest, or its URL when it has none — PKO downloads such an artifact unverified,
/// and a Flux artifact URL names its revision).
///
/// Errors: the ref cannot be resolved, a digest not of the form `sha256:<64 hex digits>`.
async fn fetched_key(kind: &Kind, values: &ValueResolver) -> Result<(String, String, String), SourceError> {
    match kind {
        Kind::Git(g) => {
            let auth = GitAuthArgs::resolve(g, values).await?;
            let sha = resolve_git_revision(g, &auth).await?;
            Ok((format!("git-{}-{}", hex(&Sha256::digest(g.url.as_bytes())[..6]), sha), g.dir.clone(), sha))
        }
        Kind::Artifact(a) if a.digest.is_empty() => {
            let key = format!("artifact-url-{}", hex(&Sha256::digest(a.url.as_bytes())[..16]));
            Ok((key, a.dir.clone(), String::new()))
        }
        Kind::Artifact(a) => {
            let hexd =
                a.digest.strip_prefix("sha256:").filter(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()));
            let hexd = hexd.ok_or_else(|| {
                err(format!("artifact digest {:?} is not of the form sha256:<64 hex digits>", a.digest))
            })?;
            Ok((format!("artifact-{}", hexd.to_ascii_lowercase()), a.dir.clone(), a.digest.clone()))
        }
        Kind::Local(_) | Kind::ProjectInfo(_) => Err(err("a local or projectInfo source has no fetched revision")),
    }
}

fn project_file(dir: &Path) -> Option<PathBuf> {
    ["Pulumi.yaml", "Pulumi.yml"].iter().map(|f| dir.join(f)).find(|p| p.is_file())
}

fn touch(p: &Path) {
    let _ = std::fs::File::options().append(true).open(p).and_then(|f| f.set_modified(SystemTime::now()));
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

mod entries;
mod git;
mod install;
pub use git::GIT_TIMEOUT;
use git::{GitAuthArgs, clone, resolve_git_revision};

/// Archive builders for tests of this crate and of its users; only with the `testing` feature.
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    /// A gzipped tarball of `files` (names written raw, so unsafe names such as `../x` reach the archive), plus an
    /// optional symlink `(path, target)`.
    pub fn tarball(files: &[(&str, &[u8])], link: Option<(&str, &str)>) -> Vec<u8> {
        use crate::archive::testing::{Item, build};
        let mut items: Vec<Item<'_>> = files.iter().map(|(p, d)| Item::File(p, d)).collect();
        items.extend(link.map(|(p, t)| Item::Symlink(p, t)));
        build(&items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_are_tried_after_the_url_and_only_for_a_verified_artifact() {
        let a = |digest: &str, mirrors: &[&str]| ArtifactSource {
            url: "http://r2/p.tgz".into(),
            digest: digest.into(),
            dir: String::new(),
            mirrors: mirrors.iter().map(|m| m.to_string()).collect(),
        };
        let got = |a: &ArtifactSource| addresses(a).map(str::to_string).collect::<Vec<_>>();
        assert_eq!(
            got(&a("sha256:00", &["http://r0/p.tgz", "http://r2/p.tgz"])),
            ["http://r2/p.tgz", "http://r0/p.tgz"],
            "the URL first, itself never twice"
        );
        assert_eq!(
            got(&a("", &["http://r0/p.tgz"])),
            ["http://r2/p.tgz"],
            "no digest: only the URL the Workspace names"
        );
        assert_eq!(got(&a("sha256:00", &[])), ["http://r2/p.tgz"]);
    }

    #[test]
    fn a_source_stays_in_use_until_every_operation_holding_it_released_it() {
        let _ = rustls::crypto::ring::default_provider().install_default(); // as the agent's main does
        let d = tempfile::tempdir().unwrap();
        let second = Duration::from_secs(1);
        let download =
            DownloadConfig { connect_timeout: second, read_timeout: second, total_timeout: second, retries: 0 };
        let pulumi = crate::pulumi::Cli { bin: "pulumi".into(), supervisor: None };
        let cfg = CacheConfig {
            root: d.path().join("cache"),
            max_bytes: 1 << 30,
            max_artifact_bytes: 1 << 20,
            download,
            pulumi,
            seed_dependency_trees: true,
        };
        let cache = SourceCache::new(cfg).unwrap();
        std::fs::write(d.path().join("Pulumi.yaml"), "name: p\nruntime: yaml\n").unwrap();
        let hold = || cache.finish("k".into(), d.path().into(), d.path().into(), "r".into(), None).unwrap();
        let (_a, _b) = (hold(), hold());
        cache.release("k");
        assert!(cache.is_in_use("k"), "the second operation still holds it");
        cache.release("k");
        assert!(!cache.is_in_use("k"));
        cache.release("k");
        assert!(!cache.is_in_use("k"), "a release too many changes nothing");
    }

    #[test]
    fn a_download_deadline_names_the_host_and_the_limit_not_the_path() {
        let m = deadline_message(
            "http://art.example:8080/programs/ns/p/1/abc.tar.gz?token=s3cr3t",
            Duration::from_secs(300),
        );
        assert!(
            m.contains("art.example:8080") && m.contains("300 s") && !m.contains("s3cr3t") && !m.contains("abc.tar.gz"),
            "{m}"
        );
    }

    #[test]
    fn directories_may_not_leave_the_source() {
        assert!(safe_join(Path::new("/c"), "../x").is_err());
        assert_eq!(safe_join(Path::new("/c"), "./app").unwrap(), PathBuf::from("/c/app"));
        assert_eq!(safe_join(Path::new("/c"), "").unwrap(), PathBuf::from("/c"));
    }
}
