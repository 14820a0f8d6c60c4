//! Git credentials for the git CLI, shared by the operator (`ls-remote` of a tracked branch) and the
//! agent (clone and fetch). Credentials travel only in the environment of the git process — an HTTP
//! `Authorization` header through `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n`, an SSH key
//! through a 0600 temporary file named in `GIT_SSH_COMMAND` — never on its command line, where other
//! processes could read them from `/proc/<pid>/cmdline`. Git never prompts (`GIT_TERMINAL_PROMPT=0`).
#![forbid(unsafe_code)]

use std::io::Write;

use base64::Engine;

/// Credentials of a git remote, in PKO's precedence: SSH key > access token > user name + password
/// (PKO `GitAuthConfig`, `gitAuthSecret`).
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

/// The environment that gives a git process [`GitCredentials`]. Holds the SSH key file, which is
/// deleted when this is dropped: keep it alive while git runs.
#[derive(Default)]
pub struct GitAuthEnv {
    env: Vec<(String, String)>,
    _key_file: Option<tempfile::NamedTempFile>,
}

impl std::fmt::Debug for GitAuthEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitAuthEnv").field("variables", &self.env.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>()).finish()
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
            a.env.push(("GIT_SSH_COMMAND".into(), format!("ssh -i {path} -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=accept-new")));
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

    /// The variables to set on the git process (`GIT_TERMINAL_PROMPT=0` included).
    pub fn vars(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.env.iter().cloned().chain(std::iter::once(("GIT_TERMINAL_PROMPT".to_string(), "0".to_string())))
    }

    /// A `git` command with these credentials (killed when dropped).
    pub fn command(&self) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("git");
        c.envs(self.vars()).kill_on_drop(true);
        c
    }
}

/// The commit SHA that `branch` (a branch name or a full `refs/...` name) points to in the remote `url`,
/// by `git ls-remote`. Errors: git's message (unreachable remote, refused credentials) or
/// `branch <b> not found in <url>`.
pub async fn ls_remote(url: &str, branch: &str, creds: &GitCredentials) -> Result<String, String> {
    let refname = if branch.starts_with("refs/") { branch.to_string() } else { format!("refs/heads/{branch}") };
    let auth = GitAuthEnv::new(creds)?;
    let out = auth.command().args(["ls-remote", url, &refname]).output().await.map_err(|e| format!("running git: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.split_once('\t').filter(|(_, r)| *r == refname).map(|(sha, _)| sha.to_string()))
        .ok_or_else(|| format!("branch {branch} not found in {url}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(c: &GitCredentials) -> Vec<(String, String)> {
        GitAuthEnv::new(c).unwrap().vars().collect()
    }

    #[test]
    fn a_token_becomes_a_basic_auth_header_in_the_environment() {
        let v = vars(&GitCredentials { token: Some("tok".into()), username: Some("u".into()), password: Some("p".into()), ..Default::default() });
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
        assert!(!a.vars().any(|(k, _)| k.starts_with("GIT_CONFIG")), "one credential only");
        drop(a);
        assert!(!std::path::Path::new(&path).exists(), "the key file goes with the environment");
    }

    #[test]
    fn debug_output_never_shows_secrets() {
        let c = GitCredentials { token: Some("s3cr3t".into()), username: Some("me".into()), password: Some("pw-value".into()), ssh_private_key: None };
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
        assert!(ls_remote(&url, "nope", &GitCredentials::default()).await.unwrap_err().contains("branch nope not found"));
    }
}
