//! `kubectl pko logs stack/<name> [-f] [--update <name>] [--all]`: the output of a Stack's operations as the operator
//! keeps it (the last lines of its newest operations), live with `-f`.
//!
//! Talks to the operator's metrics port (`https://<host>:8383`, `--endpoint` or `PKO_ENDPOINT`, for example through
//! `kubectl port-forward`), with a bearer token (`--token`, else the kubeconfig's): `GET /logs/{namespace}/{stack}`
//! lists the kept operations, `GET /logs/{namespace}/{stack}/{update} ?after=<seq>` reads one from a sequence. The
//! operator authorizes each request with a TokenReview and a SubjectAccessReview of `get` on the Stack.

use std::time::Duration;

use pko_queue::output::{Line, OperationInfo, Output};

/// How often `-f` asks for new lines.
pub const POLL: Duration = Duration::from_secs(1);

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

/// The operation to print among `ops` (newest first): Update `update` when given, else the newest. `Ok(None)`: nothing
/// is kept yet. Pure.
///
/// Errors: `update` is not among them (the message lists those that are).
pub fn choose(ops: &[OperationInfo], update: Option<&str>) -> Result<Option<OperationInfo>, String> {
    match update {
        None => Ok(ops.first().cloned()),
        Some(u) => ops.iter().find(|o| o.update == u).cloned().map(Some).ok_or_else(|| {
            let kept: Vec<&str> = ops.iter().map(|o| o.update.as_str()).collect();
            format!(
                "no output of update {u} is kept; kept: {}",
                if kept.is_empty() { "none".into() } else { kept.join(", ") }
            )
        }),
    }
}

/// `line` as printed: its text, after its time with `timestamps`. Pure.
pub fn render(line: &Line, timestamps: bool) -> String {
    if timestamps { format!("{} {}", line.time, line.text) } else { line.text.clone() }
}

/// Whether `lines` end the operation (its `result` line came). Pure.
pub fn finished(lines: &[Line]) -> bool {
    lines.iter().any(|l| l.stream == "result")
}

/// The header printed before each operation with `--all`. Pure.
pub fn header(info: &OperationInfo) -> String {
    format!("== update {} ({}) ==", info.update, info.operation)
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

    /// The kept operations of Stack `ns/stack`, newest first.
    ///
    /// Errors: the endpoint refused or did not answer.
    pub async fn operations(&self, ns: &str, stack: &str) -> anyhow::Result<Vec<OperationInfo>> {
        #[derive(serde::Deserialize)]
        struct Ops {
            operations: Vec<OperationInfo>,
        }
        Ok(self.get::<Ops>(&format!("/logs/{ns}/{stack}")).await?.map(|o| o.operations).unwrap_or_default())
    }

    /// Lines of Update `update` of Stack `ns/stack` above sequence `after`; `None` when not kept.
    ///
    /// Errors: the endpoint refused or did not answer.
    pub async fn read(
        &self,
        ns: &str,
        stack: &str,
        update: &str,
        after: Option<u64>,
    ) -> anyhow::Result<Option<Output>> {
        let q = after.map(|a| format!("?after={a}")).unwrap_or_default();
        self.get(&format!("/logs/{ns}/{stack}/{update}{q}")).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(u: &str) -> OperationInfo {
        OperationInfo { update: u.into(), operation: "up".into(), started_ms: 0 }
    }

    #[test]
    fn a_stack_is_named_as_kubectl_names_it() {
        assert_eq!(target("stack/web").as_deref(), Ok("web"));
        assert_eq!(target("stacks.pulumi.com/web").as_deref(), Ok("web"));
        assert_eq!(target("web").as_deref(), Ok("web"));
        assert!(target("pod/web").unwrap_err().contains("only stacks"));
        assert!(target("stack/").is_err());
    }

    #[test]
    fn the_newest_operation_unless_one_is_named() {
        let ops = [info("u2"), info("u1")];
        assert_eq!(choose(&ops, None).unwrap().unwrap().update, "u2");
        assert_eq!(choose(&ops, Some("u1")).unwrap().unwrap().update, "u1");
        assert_eq!(choose(&ops, Some("u9")).unwrap_err(), "no output of update u9 is kept; kept: u2, u1");
        assert_eq!(choose(&[], None).unwrap(), None);
        let l = |stream: &str| Line { seq: 1, time: "T".into(), stream: stream.into(), text: "x".into() };
        assert_eq!(render(&l("engine"), true), "T x");
        assert_eq!(render(&l("engine"), false), "x");
        assert!(finished(&[l("engine"), l("result")]) && !finished(&[l("engine")]));
        assert_eq!(header(&info("u1")), "== update u1 (up) ==");
    }
}
