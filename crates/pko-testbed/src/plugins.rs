//! Provider plugins for programs that name a plugin version, offline.
//!
//! A program's SDK names the plugin version it was generated for (`@pulumi/kubernetes` 4.24.1, `pulumi-kubernetes`
//! 4.24.0 on PyPI, `github.com/pulumi/pulumi-kubernetes/sdk/v4` v4.24.0), and `pulumi install` installs exactly that
//! version, even with the bed's build on `PATH`. Without the internet, [`PluginServer`] serves the bed's own
//! `pulumi-resource-kubernetes` under those versions on loopback, as Pulumi's download URLs name them;
//! [`PluginServer::overrides`] is the value of Pulumi's `PULUMI_PLUGIN_DOWNLOAD_URL_OVERRIDES` that sends
//! `github://api.github.com/pulumi` downloads there. The operation itself then runs the build on `PATH` (an ambient
//! plugin), whichever is installed.

use std::collections::HashMap;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serves a fixed set of files (`path` → body, e.g. `/app.tar.gz`) over HTTP/1.1 on one address until dropped; any
/// other path gets 404.
pub struct HttpServer {
    /// `http://<address>:<port>`.
    pub base: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts an [`HttpServer`] of `files` on an ephemeral loopback port. Panics when no port can be bound (test support).
pub async fn serve_files(files: HashMap<String, Vec<u8>>) -> HttpServer {
    serve_files_on("127.0.0.1", files).await
}

/// [`serve_files`] on an ephemeral port of address `ip` (e.g. the node's address, which pods reach).
pub async fn serve_files_on(ip: &str, files: HashMap<String, Vec<u8>>) -> HttpServer {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind a port");
    let base = format!("http://{}", listener.local_addr().expect("the bound address"));
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else { return };
            let files = files.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = sock.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]);
                let path = req.split_whitespace().nth(1).unwrap_or("/").to_string();
                let (status, body) = match files.get(&path) {
                    Some(b) => ("200 OK", b.clone()),
                    None => ("404 Not Found", b"not found".to_vec()),
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: \
                        close\r\n\r\n",
                    body.len()
                );
                let _ = sock.write_all(head.as_bytes()).await;
                let _ = sock.write_all(&body).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    HttpServer { base, task }
}

/// The bed's `pulumi-resource-kubernetes` as the plugin archive Pulumi downloads for `version` (e.g. `4.24.0`): `(path,
/// gzipped tar)` with path `/plugins/pulumi-resource-kubernetes-v<version>-linux-amd64.tar.gz`. Panics when the bed has
/// no such binary (test support: the bed's `pulumi-kubernetes` step builds it).
pub fn kubernetes_plugin_archive(version: &str) -> (String, Vec<u8>) {
    let binary = std::path::Path::new(&crate::testbed().env["PKO_TESTBED_BIN"]).join("pulumi-resource-kubernetes");
    let body = std::fs::read(&binary).unwrap_or_else(|e| panic!("the bed's {}: {e}", binary.display()));
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    let mut header = tar::Header::new_gnu();
    header.set_size(body.len() as u64);
    header.set_mode(0o755);
    header.set_cksum();
    tar.append_data(&mut header, "pulumi-resource-kubernetes", body.as_slice()).expect("tar in memory");
    let gz = tar.into_inner().and_then(|gz| gz.finish()).expect("gzip in memory");
    (format!("/plugins/pulumi-resource-kubernetes-v{version}-linux-amd64.tar.gz"), gz)
}

/// A loopback server of the bed's Kubernetes provider under the plugin versions SDKs name, plus any other files (e.g. a
/// program's artifact).
pub struct PluginServer {
    /// The files and plugin archives, at [`HttpServer::base`].
    pub http: HttpServer,
}

impl PluginServer {
    /// Serves the bed's `pulumi-resource-kubernetes` as each of `versions` (e.g. `["4.24.0"]`) and `files` beside them.
    pub async fn kubernetes(versions: &[&str], files: HashMap<String, Vec<u8>>) -> Self {
        Self::kubernetes_on("127.0.0.1", versions, files).await
    }

    /// [`PluginServer::kubernetes`] on address `ip` (the node's address: for workspace pods).
    pub async fn kubernetes_on(ip: &str, versions: &[&str], mut files: HashMap<String, Vec<u8>>) -> Self {
        files.extend(versions.iter().map(|v| kubernetes_plugin_archive(v)));
        PluginServer { http: serve_files_on(ip, files).await }
    }

    /// `PULUMI_PLUGIN_DOWNLOAD_URL_OVERRIDES`: Pulumi's `github://api.github.com/pulumi` plugin downloads from this
    /// server.
    pub fn overrides(&self) -> String {
        format!("^github://api.github.com/pulumi={}/plugins", self.http.base)
    }
}
