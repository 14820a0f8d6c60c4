//! `kubectl pko logs stack/<name> [-f] [--update <name>] [--all]`: the output of a Stack's operations as the operator
//! keeps it (the last lines of its newest operations), live with `-f`.
//!
//! Reads the `log` subresource of the Stack in the operator's aggregated API (`logs.pulumi.com/v1alpha1`) through the
//! API server with the kubeconfig's credentials, no flags needed; the API server and then the operator authorize `get`
//! on `stacks/log`. Without the APIService, `--endpoint` (or `PKO_ENDPOINT`) reads the operator's metrics port
//! (`https://<host>:8383`, e.g. through `kubectl port-forward`) with a bearer token (`--token`, else the
//! kubeconfig's): `GET /logs/{namespace}/{stack}` lists the kept operations, `GET /logs/{namespace}/{stack}/{update}
//! ?after=<seq>` reads one from a sequence, authorized by a TokenReview and a SubjectAccessReview of `get` on the
//! Stack. Both show what `pko_queue::tail` shows.

use std::time::Duration;

use futures::future::BoxFuture;
use pko_queue::output::{OperationInfo, Output};
use pko_queue::tail::{Request, Source, TailError};

/// The Stack named by `arg`: `stack/<name>`, `stacks/<name>`, `stack.pulumi.com/<name>`, `stacks.pulumi.com/<name>` or
/// a bare `<name>`. Pure.
///
/// Errors: another kind, or no name.
pub fn target(arg: &str) -> Result<String, String> {
    let (kind, name) = arg.split_once('/').unwrap_or(("stack", arg));
    if !matches!(kind, "stack" | "stacks" | "stack.pulumi.com" | "stacks.pulumi.com") {
        return Err(format!("{arg:?}: only stacks have logs here (stack/<name>)"));
    }
    if name.is_empty() || name.contains('/') {
        return Err(format!("{arg:?}: expected stack/<name>"));
    }
    Ok(name.to_string())
}

/// The path of the Stack's `log` subresource in the operator's aggregated API (`logs.pulumi.com/v1alpha1`), with the
/// query `req` asks for. Pure.
pub fn api_path(ns: &str, stack: &str, req: &Request) -> String {
    let mut q = Vec::new();
    if let Some(u) = &req.update {
        q.push(format!("update={u}"));
    }
    for (set, name) in [(req.follow, "follow"), (req.all, "all"), (req.timestamps, "timestamps")] {
        if set {
            q.push(format!("{name}=true"));
        }
    }
    let query = if q.is_empty() { String::new() } else { format!("?{}", q.join("&")) };
    format!("/apis/logs.pulumi.com/v1alpha1/namespaces/{ns}/stacks/{stack}/log{query}")
}

/// Copies the Stack's output from the operator's aggregated API, through the API server with `client`'s credentials
/// (whatever the kubeconfig holds: client certificate, token, exec plugin, OIDC), to standard output, line by line as
/// it arrives.
///
/// Errors: the API server's or the operator's refusal (its message: not found, forbidden, no APIService), or the
/// connection.
pub async fn stream_via_api(client: &kube::Client, ns: &str, stack: &str, req: &Request) -> anyhow::Result<()> {
    use futures::{AsyncBufReadExt, StreamExt};
    use std::io::Write;
    let request = http::Request::get(api_path(ns, stack, req)).body(Vec::new())?;
    let body = client.request_stream(request).await.map_err(|e| match e {
        kube::Error::Api(s) if s.code == 404 && s.message.contains("could not find the requested resource") => {
            anyhow::anyhow!(
                "the API server does not serve logs.pulumi.com: install the chart with logsApi.enabled (its \
                APIService), or read the operator's metrics port with --endpoint"
            )
        }
        kube::Error::Api(s) => anyhow::anyhow!("{} ({})", s.message, s.reason),
        e => anyhow::anyhow!(e),
    })?;
    let mut lines = Box::pin(body).lines();
    while let Some(line) = lines.next().await {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", line?)?;
        out.flush()?;
    }
    Ok(())
}

/// The operator's `/logs` endpoint.
pub struct Endpoint {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Endpoint {
    /// `base` (`https://host:port`), authenticated with `token`; the server's certificate checked against `ca` (PEM)
    /// when given, not at all with `insecure` (the operator's default certificate is self-signed).
    ///
    /// Errors: an unreadable CA, or the HTTP client.
    pub fn new(
        base: &str,
        token: Option<String>,
        ca: Option<&std::path::Path>,
        insecure: bool,
    ) -> anyhow::Result<Self> {
        let mut b = reqwest::Client::builder().timeout(Duration::from_secs(30)).danger_accept_invalid_certs(insecure);
        if let Some(ca) = ca {
            let pem =
                std::fs::read(ca).map_err(|e| anyhow::anyhow!("--certificate-authority {}: {e}", ca.display()))?;
            b = b.add_root_certificate(reqwest::Certificate::from_pem(&pem)?);
        }
        Ok(Endpoint { base: base.trim_end_matches('/').to_string(), token, http: b.build()? })
    }

    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<Option<T>> {
        let mut req = self.http.get(format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.map_err(|e| anyhow::anyhow!("{}: {e}", self.base))?;
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        match status.as_u16() {
            200 => Ok(Some(serde_json::from_str(&body)?)),
            404 => Ok(None),
            401 => anyhow::bail!(
                "not authenticated by {}: give a bearer token (--token, or a token in your kubeconfig)",
                self.base
            ),
            403 => anyhow::bail!("forbidden: {}", body.trim()),
            _ => anyhow::bail!("{}: {status}: {}", self.base, body.trim()),
        }
    }
}

/// `stack` is `<namespace>/<name>`, as the endpoint's paths name it.
impl Source for Endpoint {
    fn operations<'a>(&'a self, stack: &'a str) -> BoxFuture<'a, Result<Vec<OperationInfo>, TailError>> {
        #[derive(serde::Deserialize)]
        struct Ops {
            operations: Vec<OperationInfo>,
        }
        Box::pin(async move {
            let ops =
                self.get::<Ops>(&format!("/logs/{stack}")).await.map_err(|e| TailError::Source(format!("{e:#}")))?;
            Ok(ops.map(|o| o.operations).unwrap_or_default())
        })
    }

    fn read<'a>(
        &'a self,
        stack: &'a str,
        update: &'a str,
        after: Option<u64>,
    ) -> BoxFuture<'a, Result<Option<Output>, TailError>> {
        let q = after.map(|a| format!("?after={a}")).unwrap_or_default();
        Box::pin(async move {
            self.get(&format!("/logs/{stack}/{update}{q}")).await.map_err(|e| TailError::Source(format!("{e:#}")))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stack_is_named_as_kubectl_names_it() {
        assert_eq!(target("stack/web").as_deref(), Ok("web"));
        assert_eq!(target("stacks.pulumi.com/web").as_deref(), Ok("web"));
        assert_eq!(target("web").as_deref(), Ok("web"));
        assert!(target("pod/web").unwrap_err().contains("only stacks"));
        assert!(target("stack/").is_err());
    }

    #[test]
    fn the_api_path_carries_what_is_asked() {
        let mut req = Request { stack: "team/web".into(), ..Default::default() };
        assert_eq!(api_path("team", "web", &req), "/apis/logs.pulumi.com/v1alpha1/namespaces/team/stacks/web/log");
        req.update = Some("web-2".into());
        req.follow = true;
        req.timestamps = true;
        assert_eq!(
            api_path("team", "web", &req),
            "/apis/logs.pulumi.com/v1alpha1/namespaces/team/stacks/web/log?update=web-2&follow=true&timestamps=true"
        );
    }
}
