//! Git credentials for the git CLI, shared by the operator (`ls-remote` of a tracked branch) and the agent (clone and
//! fetch). Credentials travel only in the environment of the git process — an HTTP `Authorization` header through
//! `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n`, an SSH key through a 0600 temporary file named in
//! `GIT_SSH_COMMAND` — never on its command line, where other processes could read them from `/proc/<pid>/cmdline`.
//! Git never prompts (`GIT_TERMINAL_PROMPT=0`).
//!
//! URLs and refs come from tenants (a Stack's `projectRepo`/`branch`/`commit`, a Workspace's `git`), so they are never
//! allowed to become options or transports (docs/security.md):
//! - [`validate_url`] and [`validate_ref`] refuse option-like (`-…`), control-character and remote-helper
//!   (`ext::…`) input with a message naming what is wrong;
//! - every git command line puts `--end-of-options` before URLs and refs ([`GitAuthEnv::command`] users,
//!   [`ls_remote`]);
//! - the git process may only use the transports in [`ALLOWED_PROTOCOLS`] (`GIT_ALLOW_PROTOCOL`), reads no system or
//!   global configuration, and gives up on a stalled HTTP transfer ([`HTTP_LOW_SPEED_SECONDS`]) or an unanswered SSH
//!   connection; callers bound each command's total time ([`run`]).
#![forbid(unsafe_code)]

pub mod github_app;

use std::io::Write;
use std::time::Duration;

use base64::Engine;

/// Credentials of a git remote, in PKO's precedence: SSH key > access token > user name + password (PKO
/// `GitAuthConfig`, `gitAuthSecret`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct GitCredentials {
    /// OpenSSH private key (PEM text) for `ssh://` and `user@host:path` remotes.
    pub ssh_private_key: Option<String>,
    /// Access token, sent as HTTP basic auth with the user name `git`.
    pub token: Option<String>,
    /// User name for HTTP basic auth (with `password`).
    pub username: Option<String>,
    /// Password for HTTP basic auth.
    pub password: Option<String>,
}

impl std::fmt::Debug for GitCredentials {
    /// Says which credentials are set, never their values.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitCredentials")
            .field("ssh_private_key", &self.ssh_private_key.as_ref().map(|_| "[secret]"))
            .field("token", &self.token.as_ref().map(|_| "[secret]"))
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "[secret]"))
            .finish()
    }
}

/// The environment that gives a git process [`GitCredentials`]. Holds the SSH key file, which is deleted when this is
/// dropped: keep it alive while git runs.
#[derive(Default)]
pub struct GitAuthEnv {
    env: Vec<(String, String)>,
    _key_file: Option<tempfile::NamedTempFile>,
}

impl std::fmt::Debug for GitAuthEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitAuthEnv")
            .field("variables", &self.env.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>())
            .finish()
    }
}

impl GitAuthEnv {
    /// The environment for `creds`. Errors: the SSH key file cannot be written (I/O error text).
    pub fn new(creds: &GitCredentials) -> Result<Self, String> {
        let mut a = GitAuthEnv::default();
        if let Some(key) = &creds.ssh_private_key {
            let mut f = tempfile::NamedTempFile::new().map_err(|e| format!("writing the SSH key: {e}"))?;
            let mut text = key.clone();
            if !text.ends_with('\n') {
                text.push('\n'); // OpenSSH refuses a key without its final newline
            }
            f.write_all(text.as_bytes()).map_err(|e| format!("writing the SSH key: {e}"))?;
            let path = f.path().display().to_string();
            a.env.push(("GIT_SSH_COMMAND".into(), format!("ssh -i {path} -o IdentitiesOnly=yes {SSH_OPTIONS}")));
            a._key_file = Some(f);
        } else if let Some(token) = &creds.token {
            a.basic("git", token);
        } else if let (Some(u), Some(p)) = (&creds.username, &creds.password) {
            a.basic(u, p);
        }
        Ok(a)
    }

    fn basic(&mut self, user: &str, password: &str) {
        let b = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        self.env.push(("GIT_CONFIG_COUNT".into(), "1".into()));
        self.env.push(("GIT_CONFIG_KEY_0".into(), "http.extraHeader".into()));
        self.env.push(("GIT_CONFIG_VALUE_0".into(), format!("Authorization: Basic {b}")));
    }

    /// The variables to set on the git process: the credentials, then the hardening every git process gets (no prompt,
    /// [`ALLOWED_PROTOCOLS`], no system or global config, stall limits, SSH batch mode).
    pub fn vars(&self) -> impl Iterator<Item = (String, String)> + '_ {
        let ssh = (!self.env.iter().any(|(k, _)| k == "GIT_SSH_COMMAND"))
            .then(|| ("GIT_SSH_COMMAND".to_string(), format!("ssh {SSH_OPTIONS}")));
        let hardening = [
            ("GIT_TERMINAL_PROMPT", "0".to_string()),
            ("GIT_ALLOW_PROTOCOL", ALLOWED_PROTOCOLS.to_string()),
            ("GIT_CONFIG_NOSYSTEM", "1".to_string()),
            ("GIT_CONFIG_GLOBAL", "/dev/null".to_string()),
            ("GIT_HTTP_LOW_SPEED_LIMIT", "1000".to_string()),
            ("GIT_HTTP_LOW_SPEED_TIME", HTTP_LOW_SPEED_SECONDS.to_string()),
        ];
        self.env.iter().cloned().chain(ssh).chain(hardening.into_iter().map(|(k, v)| (k.to_string(), v)))
    }

    /// A `git` command with these credentials (killed when dropped).
    pub fn command(&self) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("git");
        c.envs(self.vars()).kill_on_drop(true);
        c
    }
}

/// The transports a git process may use (`GIT_ALLOW_PROTOCOL`): no remote helpers such as `ext::`, which runs a
/// command. `file` stays allowed: in a workspace pod it reaches only the tenant's own files.
pub const ALLOWED_PROTOCOLS: &str = "https:http:ssh:git:file";

/// Seconds an HTTP transfer may stay below 1,000 bytes/s before git gives up (`GIT_HTTP_LOW_SPEED_TIME`).
pub const HTTP_LOW_SPEED_SECONDS: u64 = 30;

/// Options of every `ssh` that git starts: never prompt, give up on an unanswered connection (10 s) or a silent server
/// (3 × 10 s), accept a host key seen for the first time.
pub const SSH_OPTIONS: &str = "-o BatchMode=yes -o StrictHostKeyChecking=accept-new -o ConnectTimeout=10 -o \
    ServerAliveInterval=10 -o ServerAliveCountMax=3";

/// How long [`ls_remote`] may take in all, in seconds.
pub const LS_REMOTE_TIMEOUT: Duration = Duration::from_secs(60);

fn control_or_space(s: &str) -> bool {
    s.chars().any(|c| c.is_control() || c.is_whitespace())
}

/// Checks a repository URL before it reaches git: `https://`, `http://`, `ssh://`, `git://`, `file://` (also
/// `git+ssh://`), an absolute path, or scp-like `[user@]host:path`. Refused, with the reason: an empty URL, one that
/// starts with `-` (git would read an option such as `--upload-pack=<command>`), a host that starts with `-` (an `ssh`
/// option), white space or control characters, remote-helper transports (`ext::…`, `fd::…`) and other schemes.
pub fn validate_url(url: &str) -> Result<(), String> {
    if url.is_empty() {
        return Err("the repository URL is empty".into());
    }
    if url.starts_with('-') {
        return Err(format!("the repository URL {url:?} starts with '-' and would be read as an option"));
    }
    if control_or_space(url) {
        return Err(format!("the repository URL {url:?} contains white space or control characters"));
    }
    if let Some((scheme, rest)) = url.split_once("://") {
        if !["https", "http", "ssh", "git", "file", "git+ssh", "ssh+git"]
            .contains(&scheme.to_ascii_lowercase().as_str())
        {
            return Err(format!(
                "the repository URL scheme {scheme:?} is not supported (use https, http, ssh, git or file)"
            ));
        }
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let host = authority.rsplit_once('@').map(|(_, h)| h).unwrap_or(authority);
        if host.starts_with('-') {
            return Err(format!("the host of the repository URL {url:?} starts with '-'"));
        }
        // file:///path has an empty host; every network scheme needs a host and a repository path
        if !scheme.eq_ignore_ascii_case("file")
            && (host.is_empty() || host.starts_with(':') || path.trim_matches('/').is_empty())
        {
            return Err(format!("the repository URL {url:?} has no host or no repository path"));
        }
        return Ok(());
    }
    let before_slash = url.split('/').next().unwrap_or_default();
    if before_slash.contains("::") {
        return Err(format!("the repository URL {url:?} names a remote helper transport, which is not allowed"));
    }
    if url.starts_with('/') {
        return Ok(());
    }
    // scp-like: [user@]host:path, the colon before any slash
    match before_slash.split_once(':') {
        Some((userhost, _)) if !userhost.is_empty() => {
            let host = userhost.rsplit_once('@').map(|(_, h)| h).unwrap_or(userhost);
            if host.is_empty() || host.starts_with('-') {
                return Err(format!("the host of the repository URL {url:?} is empty or starts with '-'"));
            }
            // `https:/h/r` or `https:h/r` is a URL missing a slash, not scp-like host `https`
            if ["https", "http", "ssh", "git", "file"].contains(&host.to_ascii_lowercase().as_str()) {
                return Err(format!("the repository URL {url:?} is missing \"//\" after its scheme"));
            }
            if url[userhost.len() + 1..].trim_matches('/').is_empty() {
                return Err(format!("the repository URL {url:?} has no repository path"));
            }
            Ok(())
        }
        _ => Err(format!(
            "the repository URL {url:?} is not a URL (https://, ssh://, git://, file://), an absolute path or \
                user@host:path"
        )),
    }
}

/// Checks a branch, tag, ref or commit name before it reaches git (git's `check-ref-format` rules, plus no leading
/// `-`): no white space or control characters, none of `~ ^ : ? * [ \`, no `..`, no `@{`, no leading `/`, no trailing
/// `/`, `.` or `.lock`. `what` names the field in the message (e.g. `spec.branch`).
pub fn validate_ref(what: &str, r: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("{what} {r:?} {why}"));
    if r.is_empty() {
        return bad("is empty");
    }
    if r.starts_with('-') {
        return bad("starts with '-' and would be read as an option");
    }
    if control_or_space(r) || r.chars().any(|c| "~^:?*[\\".contains(c)) {
        return bad("contains white space, a control character or one of ~ ^ : ? * [ \\");
    }
    if r.contains("..")
        || r.contains("@{")
        || r.contains("//")
        || r.starts_with('/')
        || r.ends_with('/')
        || r.ends_with('.')
        || r.ends_with(".lock")
    {
        return bad("is not a valid git ref name");
    }
    Ok(())
}

/// Whether `s` is a full commit SHA (40 hex digits).
pub fn is_sha(s: &str) -> bool {
    s.len() == 40 && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// Runs `cmd` (a git command, killed when dropped) for at most `timeout`. Errors: git could not start, or `git <what>
/// did not finish within N s`.
pub async fn run(
    mut cmd: tokio::process::Command,
    what: &str,
    timeout: Duration,
) -> Result<std::process::Output, String> {
    cmd.stdin(std::process::Stdio::null());
    match tokio::time::timeout(timeout, cmd.output()).await {
        Ok(r) => r.map_err(|e| format!("running git: {e}")),
        Err(_) => Err(format!("git {what} did not finish within {} s", timeout.as_secs())),
    }
}

/// The commit SHA that `branch` names in the remote `url`, as PKO resolves it (go-git's remote list in `git.go`): the
/// first ref whose full or short name is `branch` (tags and other refs too; an annotated tag gives its commit), read
/// from `git ls-remote` within [`LS_REMOTE_TIMEOUT`].
///
/// Errors: the URL or branch refused ([`validate_url`], [`validate_ref`]), git's message (unreachable remote, refused
/// credentials), a timeout, or `no commits found for ref "<b>"`.
pub async fn ls_remote(url: &str, branch: &str, creds: &GitCredentials) -> Result<String, String> {
    validate_ref("branch", branch)?;
    let listing = ls_remote_listing(url, creds).await?;
    head_of(&listing, url, branch)
}

/// Every ref of the remote `url` as `git ls-remote` lists them (`<sha>\t<name>` lines), within
/// [`LS_REMOTE_TIMEOUT`]: one listing answers for every branch of the repository.
///
/// Errors: the URL refused ([`validate_url`]), git's message (unreachable remote, refused credentials), a timeout.
pub async fn ls_remote_listing(url: &str, creds: &GitCredentials) -> Result<String, String> {
    validate_url(url)?;
    let auth = GitAuthEnv::new(creds)?;
    let mut cmd = auth.command();
    cmd.args(["ls-remote", "--end-of-options", url]);
    let out = run(cmd, "ls-remote", LS_REMOTE_TIMEOUT).await?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The commit `branch` names in `listing` (of `url`), as [`ls_remote`] resolves it. Pure.
///
/// Errors: `no commits found for ref "<b>" in <url>`.
pub fn head_of(listing: &str, url: &str, branch: &str) -> Result<String, String> {
    pick_ref(listing, branch).ok_or_else(|| format!("no commits found for ref \"{branch}\" in {url}"))
}

/// go-git's short name of a ref: `refs/heads/x`, `refs/tags/x` and `refs/remotes/x` give `x`, any other `refs/x` gives
/// `x`, anything else is its own short name. Pure.
pub fn short_ref_name(full: &str) -> &str {
    ["refs/heads/", "refs/tags/", "refs/remotes/", "refs/"].iter().find_map(|p| full.strip_prefix(p)).unwrap_or(full)
}

/// The SHA of the first ref of an `ls-remote` listing (`<sha>\t<name>` lines) whose full or short name is `wanted`; for
/// an annotated tag, the commit of its peeled line (`<name>^{}`). Pure.
pub fn pick_ref(listing: &str, wanted: &str) -> Option<String> {
    let refs: Vec<(&str, &str)> = listing.lines().filter_map(|l| l.split_once('\t')).collect();
    let (sha, name) =
        refs.iter().find(|(_, name)| !name.ends_with("^{}") && (*name == wanted || short_ref_name(name) == wanted))?;
    let peeled = format!("{name}^{{}}");
    Some(refs.iter().find(|(_, n)| *n == peeled).map_or(*sha, |(s, _)| *s).to_string())
}

#[cfg(test)]
mod tests {

    #[test]
    fn refs_resolve_by_full_or_short_name_as_pko_does() {
        let listing = "aaa\tHEAD\nbbb\trefs/heads/main\nccc\trefs/heads/feature/x\nddd\trefs/tags/v1\n\
                       eee\trefs/tags/v1^{}\nfff\trefs/tags/light\n111\trefs/pull/7/head\n";
        assert_eq!(pick_ref(listing, "main").as_deref(), Some("bbb"));
        assert_eq!(pick_ref(listing, "refs/heads/main").as_deref(), Some("bbb"));
        assert_eq!(pick_ref(listing, "feature/x").as_deref(), Some("ccc"));
        assert_eq!(pick_ref(listing, "v1").as_deref(), Some("eee"), "an annotated tag gives its commit");
        assert_eq!(pick_ref(listing, "light").as_deref(), Some("fff"), "a lightweight tag");
        assert_eq!(pick_ref(listing, "pull/7/head").as_deref(), Some("111"));
        assert_eq!(pick_ref(listing, "HEAD").as_deref(), Some("aaa"));
        assert_eq!(pick_ref(listing, "v1^{}"), None);
        assert_eq!(pick_ref(listing, "nope"), None);
        assert_eq!(short_ref_name("refs/remotes/origin/x"), "origin/x");
    }

    use super::*;

    fn vars(c: &GitCredentials) -> Vec<(String, String)> {
        GitAuthEnv::new(c).unwrap().vars().collect()
    }

    #[test]
    fn a_token_becomes_a_basic_auth_header_in_the_environment() {
        let v = vars(&GitCredentials {
            token: Some("tok".into()),
            username: Some("u".into()),
            password: Some("p".into()),
            ..Default::default()
        });
        assert!(v.contains(&("GIT_CONFIG_KEY_0".into(), "http.extraHeader".into())));
        // base64("git:tok") — the token wins over user name and password
        assert!(v.contains(&("GIT_CONFIG_VALUE_0".into(), "Authorization: Basic Z2l0OnRvaw==".into())));
        assert!(v.contains(&("GIT_TERMINAL_PROMPT".into(), "0".into())));
    }

    #[test]
    fn an_ssh_key_wins_and_is_written_to_a_private_file() {
        let c = GitCredentials { ssh_private_key: Some("KEY".into()), token: Some("tok".into()), ..Default::default() };
        let a = GitAuthEnv::new(&c).unwrap();
        let cmd = a.vars().find(|(k, _)| k == "GIT_SSH_COMMAND").unwrap().1;
        let path = cmd.split_whitespace().nth(2).unwrap().to_string();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "KEY\n");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(!a.vars().any(|(k, _)| k == "GIT_CONFIG_COUNT"), "one credential only");
        drop(a);
        assert!(!std::path::Path::new(&path).exists(), "the key file goes with the environment");
    }

    #[test]
    fn debug_output_never_shows_secrets() {
        let c = GitCredentials {
            token: Some("s3cr3t".into()),
            username: Some("me".into()),
            password: Some("pw-value".into()),
            ssh_private_key: None,
        };
        let d = format!("{c:?} {:?}", GitAuthEnv::new(&c).unwrap());
        assert!(!d.contains("s3cr3t") && !d.contains("pw-value") && !d.contains("Z2l0"), "{d}");
    }

    #[tokio::test]
    async fn ls_remote_resolves_a_branch_of_a_local_repository() {
        let dir = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| {
            let out = std::process::Command::new("git").args(args).current_dir(dir.path()).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8(out.stdout).unwrap()
        };
        git(&["init", "-q", "-b", "main"]);
        git(&["-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "one"]);
        let head = git(&["rev-parse", "HEAD"]).trim().to_string();
        let url = format!("file://{}", dir.path().display());
        assert_eq!(ls_remote(&url, "main", &GitCredentials::default()).await.unwrap(), head);
        assert_eq!(ls_remote(&url, "refs/heads/main", &GitCredentials::default()).await.unwrap(), head);
        assert!(
            ls_remote(&url, "nope", &GitCredentials::default())
                .await
                .unwrap_err()
                .contains(r#"no commits found for ref "nope""#),
            "PKO's text"
        );
    }

    #[test]
    fn urls_that_git_would_read_as_options_or_helpers_are_refused() {
        for ok in [
            "https://github.com/o/r.git",
            "http://127.0.0.1:8080/r",
            "ssh://git@host:22/r.git",
            "git://127.0.0.1/r.git",
            "file:///srv/r",
            "git@github.com:o/r.git",
            "/srv/r",
        ] {
            assert_eq!(validate_url(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "--upload-pack=touch /tmp/x",
            "-u",
            "ext::sh -c touch% /tmp/x",
            "fd::3",
            "ssh://-oProxyCommand=touch%20x/r",
            "ssh://user@-oProxyCommand=x/r",
            "-oProxyCommand=x:r",
            "https://h/r\n--upload-pack=x",
            "javascript://x",
            "relative/path",
            "https://",
            "https:///o/r.git",
            "https://github.com",
            "https://github.com/",
            "https:/github.com/o/r",
            "https:github.com/o/r",
            "git@github.com:",
        ] {
            assert!(validate_url(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(validate_url("--upload-pack=x").unwrap_err().contains("option"));
    }

    #[test]
    fn refs_that_git_would_read_as_options_are_refused() {
        for ok in ["main", "feature/x", "refs/heads/main", "v1.2.3", "HEAD", "0123456789abcdef0123456789abcdef01234567"]
        {
            assert_eq!(validate_ref("spec.branch", ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "--upload-pack=touch x",
            "-b",
            "a..b",
            "a b",
            "x\n",
            "a~1",
            "a^",
            "a:b",
            "@{-1}",
            "x.lock",
            "x/",
            "/x",
            "a*",
        ] {
            let e = validate_ref("spec.branch", bad).unwrap_err();
            assert!(e.starts_with("spec.branch"), "{e}");
        }
    }

    #[tokio::test]
    async fn ls_remote_never_runs_an_option_like_url_or_branch() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("pwned");
        let url = format!("--upload-pack=touch {}", marker.display());
        assert!(ls_remote(&url, "main", &GitCredentials::default()).await.unwrap_err().contains("option"));
        let e = ls_remote(
            "file:///nonexistent",
            &format!("--upload-pack=touch {}", marker.display()),
            &GitCredentials::default(),
        )
        .await
        .unwrap_err();
        assert!(e.contains("option"), "{e}");
        assert!(!marker.exists(), "no command ran");
    }

    #[test]
    fn every_git_process_is_hardened() {
        let v: Vec<(String, String)> = GitAuthEnv::default().vars().collect();
        let get = |k: &str| v.iter().find(|(n, _)| n == k).map(|(_, x)| x.clone());
        assert_eq!(get("GIT_ALLOW_PROTOCOL").as_deref(), Some(ALLOWED_PROTOCOLS));
        assert_eq!(get("GIT_CONFIG_NOSYSTEM").as_deref(), Some("1"));
        assert!(get("GIT_SSH_COMMAND").unwrap().contains("BatchMode=yes"));
        assert_eq!(get("GIT_HTTP_LOW_SPEED_TIME").as_deref(), Some("30"));
    }
}
