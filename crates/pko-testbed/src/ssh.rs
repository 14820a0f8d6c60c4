//! A git server over SSH on loopback for tests: Debian's OpenSSH `sshd` in the foreground with its own host key,
//! configuration and authorized key (a fresh ed25519 client key), serving the repositories of a directory to
//! `ssh://<user>@127.0.0.1:<port>/<dir>/<repo>` with git's own `git-upload-pack`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// A running `sshd` (stopped when dropped).
pub struct SshGitServer {
    child: Child,
    root: PathBuf,
    user: String,
    /// The loopback port it listens on.
    pub port: u16,
    /// The OpenSSH private key (PEM text) it accepts.
    pub client_key: String,
    _dir: tempfile::TempDir,
}

impl Drop for SshGitServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn keygen(path: &Path) -> anyhow::Result<()> {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .output()
        .context("running ssh-keygen")?;
    if !out.status.success() {
        bail!("ssh-keygen: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

impl SshGitServer {
    /// Starts `sshd` for the repositories under `root`, accepting only a newly generated key. Needs `/usr/sbin/sshd`
    /// (Debian's openssh-server, installed by `make testbed`) and the privilege separation directory `/run/sshd`
    /// (created when missing).
    pub fn start(root: &Path) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let (host, client) = (dir.path().join("host_key"), dir.path().join("client_key"));
        keygen(&host)?;
        keygen(&client)?;
        std::fs::copy(dir.path().join("client_key.pub"), dir.path().join("authorized_keys"))?;
        std::fs::create_dir_all("/run/sshd").context("creating /run/sshd")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let config = dir.path().join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nPidFile {}\nAuthorizedKeysFile {}\nStrictModes \
                    no\nUsePAM no\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\nPermitRootLogin \
                 prohibit-password\n",
                host.display(),
                dir.path().join("sshd.pid").display(),
                dir.path().join("authorized_keys").display()
            ),
        )?;
        let child = Command::new("/usr/sbin/sshd")
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting /usr/sbin/sshd")?;
        let end = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > end {
                bail!("sshd did not listen on 127.0.0.1:{port} within 10 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let user = String::from_utf8(Command::new("id").arg("-un").output()?.stdout)?.trim().to_string();
        let client_key = std::fs::read_to_string(&client)?;
        Ok(Self { child, root: root.to_path_buf(), user, port, client_key, _dir: dir })
    }

    /// The clone URL of `repo` (a path under the root).
    pub fn url(&self, repo: &str) -> String {
        format!("ssh://{}@127.0.0.1:{}{}/{repo}", self.user, self.port, self.root.display())
    }
}
