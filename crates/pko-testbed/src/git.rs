//! A git server on loopback for tests and the demo: git's own smart-HTTP backend (`git http-backend`, a CGI program
//! shipped with git) behind a minimal HTTP/1.1 front, with optional basic auth.

use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use base64::Engine;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Serves every repository under a root directory at `http://127.0.0.1:<port>/<repo>`.
pub struct GitHttpServer {
    /// `http://127.0.0.1:<port>`.
    pub base_url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for GitHttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl GitHttpServer {
    /// Starts serving the repositories under `root` on `addr` (e.g. `127.0.0.1:0`). With `basic_auth` `(user,
    /// password)`, requests without those credentials get 401.
    pub async fn start(root: &Path, addr: &str, basic_auth: Option<(String, String)>) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let base_url = format!("http://{}", listener.local_addr()?);
        let root = root.to_path_buf();
        let expected = basic_auth
            .map(|(u, p)| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))));
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let (root, expected) = (root.clone(), expected.clone());
                tokio::spawn(async move {
                    if let Err(e) = handle(sock, &root, expected.as_deref()).await {
                        eprintln!("git http server: {e}");
                    }
                });
            }
        });
        Ok(Self { base_url, task })
    }

    /// URL of the repository at `<root>/<name>`.
    pub fn url(&self, name: &str) -> String {
        format!("{}/{name}", self.base_url)
    }
}

/// An HTTP/1.1 request as the git smart-HTTP client sends it.
struct Request {
    method: String,
    target: String,
    /// Lower-cased names.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<String> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }
}

/// Reads the request line and headers from `reader`.
async fn read_head(reader: &mut BufReader<TcpStream>) -> anyhow::Result<Request> {
    let mut request_line = String::new();
    reader.read_line(&mut request_line).await?;
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or("GET").to_string(), parts.next().unwrap_or("/").to_string());
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((k, v)) = line.trim_end().split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    Ok(Request { method, target, headers, body: Vec::new() })
}

/// Reads the body of `req` (by `Content-Length`, or chunked).
async fn read_body(reader: &mut BufReader<TcpStream>, req: &mut Request) -> anyhow::Result<()> {
    if let Some(len) = req.header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        req.body.resize(len, 0);
        reader.read_exact(&mut req.body).await?;
    } else if req.header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).await?;
            let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)?;
            let mut chunk = vec![0u8; n + 2];
            reader.read_exact(&mut chunk).await?;
            if n == 0 {
                break;
            }
            req.body.extend_from_slice(&chunk[..n]);
        }
    }
    Ok(())
}

/// Runs `git http-backend` (CGI) for `req` on the repositories under `root`; its raw output.
async fn backend(root: &PathBuf, req: Request) -> anyhow::Result<Vec<u8>> {
    let (path, query) = req.target.split_once('?').unwrap_or((&req.target, ""));
    let mut cgi = tokio::process::Command::new("git");
    cgi.arg("http-backend")
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", &req.method)
        .env("PATH_INFO", path)
        .env("QUERY_STRING", query)
        .env("CONTENT_TYPE", req.header("content-type").unwrap_or_default())
        .env("CONTENT_LENGTH", req.body.len().to_string())
        .env("REMOTE_ADDR", "127.0.0.1")
        .env("REMOTE_USER", "git")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(p) = req.header("git-protocol") {
        cgi.env("GIT_PROTOCOL", p);
    }
    let mut child = cgi.spawn()?;
    let mut stdin = child.stdin.take().context("git http-backend's stdin is not piped")?;
    let body = req.body;
    let writer = tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
    });
    let out = child.wait_with_output().await?;
    let _ = writer.await;
    Ok(out.stdout)
}

/// The HTTP response head and body for a CGI `output` (its `Status:` header as the status line).
fn http_response(output: &[u8]) -> (String, Vec<u8>) {
    let split = output
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4))
        .or_else(|| output.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)));
    let (head, body) = match split {
        Some((i, n)) => (String::from_utf8_lossy(&output[..i]).into_owned(), output[i + n..].to_vec()),
        None => (String::new(), output.to_vec()),
    };
    let mut status = "200 OK".to_string();
    let mut response = String::new();
    for line in head.lines() {
        match line.split_once(':') {
            Some((k, v)) if k.eq_ignore_ascii_case("status") => status = v.trim().to_string(),
            Some(_) => {
                response.push_str(line);
                response.push_str("\r\n");
            }
            None => {}
        }
    }
    (format!("HTTP/1.1 {status}\r\n{response}Content-Length: {}\r\nConnection: close\r\n\r\n", body.len()), body)
}

async fn handle(sock: TcpStream, root: &PathBuf, expected_auth: Option<&str>) -> anyhow::Result<()> {
    let mut reader = BufReader::new(sock);
    let mut req = read_head(&mut reader).await?;
    if let Some(exp) = expected_auth
        && req.header("authorization").as_deref() != Some(exp)
    {
        let msg = b"authentication required";
        let head = format!(
            "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"git\"\r\nContent-Length: {}\r\nConnection: \
                close\r\n\r\n",
            msg.len()
        );
        let mut sock = reader.into_inner();
        sock.write_all(head.as_bytes()).await?;
        sock.write_all(msg).await?;
        return Ok(());
    }
    if req.header("expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue")) {
        reader.get_mut().write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
    }
    read_body(&mut reader, &mut req).await?;
    let (head, body) = http_response(&backend(root, req).await?);
    let mut sock = reader.into_inner();
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(&body).await?;
    sock.shutdown().await?;
    Ok(())
}

/// Creates the bare repository `<root>/<name>` whose branch `main` holds one commit with `files` (`(path, contents)`),
/// made in a scratch clone under `root`. Returns the commit SHA. Panics when git fails (test support).
pub fn bare_repo_with(root: &Path, name: &str, files: &[(&str, &str)]) -> String {
    let work = root.join(format!(".work-{name}"));
    std::fs::create_dir_all(&work).unwrap();
    let git = |args: &[&str], cwd: &Path| {
        let out = std::process::Command::new("git").args(args).current_dir(cwd).output().unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let bare = root.join(name);
    git(&["init", "-q", "--bare", bare.to_str().unwrap()], root);
    git(&["init", "-q", "-b", "main"], &work);
    for (path, contents) in files {
        let p = work.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, contents).unwrap();
    }
    git(&["add", "."], &work);
    git(&["-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q", "-m", "one"], &work);
    git(&["push", "-q", bare.to_str().unwrap(), "main"], &work);
    git(&["rev-parse", "HEAD"], &work)
}
