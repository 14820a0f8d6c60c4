//! The operator's gRPC client of its agents, written once for every runtime: connecting (the message limit of the agent
//! contract, [`pko_proto::agent_client`]), the bearer token of agents that authenticate their caller (`--auth kube`),
//! and the two questions pools ask an agent — its `Status`, and whether it is the place to follow an operation
//! ([`knows`]).

use std::time::Duration;

use pko_proto::v1::agent_client::AgentClient;
use pko_proto::v1::{AttachRequest, StatusRequest, StatusResponse, status_response::State};

/// How long connecting to an agent may take before it counts as not answering (seconds).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a control call (`Status`, `Attach`) may take (seconds); never applied to `Run`'s stream.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// A gRPC client.
pub type Client = AgentClient<tonic::transport::Channel>;

/// `address` as a URL: `host:port` gets `http://`; a URL is kept.
pub fn url(address: &str) -> String {
    if address.starts_with("http") { address.to_string() } else { format!("http://{address}") }
}

/// A client of the agent at `address` (`host:port` or a URL) for control calls: connected within [`CONNECT_TIMEOUT`],
/// each call bounded by [`CONTROL_TIMEOUT`].
///
/// Errors: the address is not a URI, or the agent could not be reached (the message says which).
pub async fn control(address: &str) -> Result<Client, String> {
    let endpoint =
        tonic::transport::Endpoint::from_shared(url(address)).map_err(|e| format!("agent address {address:?}: {e}"))?;
    let channel = endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(CONTROL_TIMEOUT)
        .connect()
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    Ok(pko_proto::agent_client(channel))
}

/// A client of the agent at `address` for an operation's `Run` stream: no call deadline (an operation runs for as long
/// as Pulumi does).
///
/// Errors: as [`control`].
pub async fn streaming(address: &str) -> Result<Client, String> {
    let endpoint =
        tonic::transport::Endpoint::from_shared(url(address)).map_err(|e| format!("agent address {address:?}: {e}"))?;
    let channel = endpoint.connect_timeout(CONNECT_TIMEOUT).connect().await.map_err(|e| e.to_string())?;
    Ok(pko_proto::agent_client(channel))
}

/// `message` as a request carrying `token` as `Authorization: Bearer <token>` when given.
///
/// Errors: the token is not a valid header value.
pub fn authorized<T>(message: T, token: Option<&str>) -> Result<tonic::Request<T>, String> {
    let mut r = tonic::Request::new(message);
    if let Some(t) = token {
        let v = format!("Bearer {t}").parse().map_err(|_| "the operator's token is not a valid header".to_string())?;
        r.metadata_mut().insert("authorization", v);
    }
    Ok(r)
}

/// The agent's `Status`.
///
/// Errors: it did not answer, or refused (`<code>: <message>`).
pub async fn status(address: &str, token: Option<&str>) -> Result<StatusResponse, String> {
    let mut c = control(address).await?;
    c.status(authorized(StatusRequest {}, token)?)
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| format!("{}: {}", s.code(), s.message()))
}

/// Whether the agent at `address` knows operation `op` (running, or finished and retained) and is the place to follow
/// it at fencing epoch `epoch`: an agent shutting down is, only while `op` still runs there (once it ended
/// `INTERRUPTED`, the operation is to run on another agent).
pub async fn knows(address: &str, token: Option<&str>, op: &str, epoch: i64) -> bool {
    let Ok(mut c) = control(address).await else { return false };
    let Ok(ask) = authorized(StatusRequest {}, token) else { return false };
    match c.status(ask).await.map(tonic::Response::into_inner) {
        Ok(s) if s.state == State::Draining as i32 && s.current_operation_id != op => false,
        Ok(_) => match authorized(AttachRequest { operation_id: op.to_string(), epoch }, token) {
            Ok(attach) => c.attach(attach).await.is_ok(),
            Err(_) => false,
        },
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_become_urls_once() {
        assert_eq!(url("10.0.0.1:50051"), "http://10.0.0.1:50051");
        assert_eq!(url("http://a:1"), "http://a:1");
    }

    #[test]
    fn a_token_travels_as_a_bearer_header() {
        let r = authorized((), Some("t0k")).unwrap();
        assert_eq!(r.metadata().get("authorization").unwrap(), "Bearer t0k");
        assert!(authorized((), None).unwrap().metadata().get("authorization").is_none());
        assert!(authorized((), Some("bad\nvalue")).is_err());
    }
}
