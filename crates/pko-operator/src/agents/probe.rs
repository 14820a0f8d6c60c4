//! PKO's connection check of a workspace pod (pod runtime): once the StatefulSet has a new pod available, the Workspace
//! controller connects to its agent (5 s) and asks its Pulumi version, with the operator's token for the Workspace's
//! audience, before it calls the Workspace Ready. A pod whose agent cannot be reached is Ready False `ConnectionFailed`
//! (looked at again in 5 s); one whose agent refuses the call is Ready False with the gRPC code's name —
//! `Unauthenticated` when the workspace's service account may not review tokens (it lacks `system:auth-delegator`),
//! `PermissionDenied` when the operator may not `use` `workspaces/rpc` — and the agent's message; both with PKO's
//! `ConnectionFailure` Warning event. The pod is kept: the next look may succeed (PKO: `workspace_controller.go`,
//! "Connecting to workspace pod", "Querying Pulumi version to validate workspace connectivity").
//!
//! A Workspace already Ready for its generation is not probed again: a pod that restarts makes the StatefulSet not
//! available first, and the new pod is probed when it is.

use std::time::Duration;

use pko_api::Workspace;
use pko_api::constants::workspace_condition as wc;
use pko_proto::v1::PulumiVersionRequest;

/// How long connecting to an agent may take (seconds; PKO: 5 s).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// When an unreachable agent is looked at again (PKO: 5 s).
pub const UNREACHABLE_RETRY: Duration = Duration::from_secs(5);
/// When an agent that refused the call is asked again (PKO: the controller's backoff).
pub const REFUSED_RETRY: Duration = Duration::from_secs(15);

/// What probing a workspace pod's agent found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// The agent answered with its Pulumi CLI's version (e.g. `v3.259.0`).
    Answered(String),
    /// No connection within [`CONNECT_TIMEOUT`] (name not resolved, refused, timed out), or no token to present: the
    /// error, with its causes.
    Unreachable(String),
    /// The agent refused the call: the gRPC code's name as PKO writes it (`Unauthenticated`, `PermissionDenied`, …)
    /// and the agent's message.
    Refused(String, String),
}

/// The `Ready` condition `(status, reason, message)` a probe gives and when to look again (`None`: the Workspace is
/// Ready; the caller keeps its usual period). Pure.
pub fn ready_of(p: &Probe) -> ((&'static str, String, String), Option<Duration>) {
    match p {
        Probe::Answered(_) => (("True", wc::SUCCEEDED.to_string(), String::new()), None),
        Probe::Unreachable(e) => (("False", wc::CONNECTION_FAILED.to_string(), e.clone()), Some(UNREACHABLE_RETRY)),
        Probe::Refused(code, message) => (("False", code.clone(), message.clone()), Some(REFUSED_RETRY)),
    }
}

/// Whether `ws` needs its agent probed: it is not Ready (`True`, `Succeeded`) for its current generation. Pure.
pub fn needed(ws: &Workspace) -> bool {
    let ready =
        ws.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|cs| cs.iter().find(|c| c.type_ == wc::READY));
    !ready.is_some_and(|c| {
        c.status == "True" && c.reason == wc::SUCCEEDED && c.observed_generation == ws.metadata.generation
    })
}

/// `e` and each of its causes, joined by ": " (tonic's transport errors say what failed only in their causes, e.g.
/// `transport error: dns error: failed to lookup address information`).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let c_s = c.to_string();
        if !s.ends_with(&c_s) {
            s.push_str(": ");
            s.push_str(&c_s);
        }
        cause = c.source();
    }
    s
}

/// Connects to the agent at `address` (`host:port`) and asks its Pulumi version, presenting `token` (`Authorization:
/// Bearer …`) when given.
pub async fn probe(address: &str, token: Option<&str>) -> Probe {
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{address}")) {
        Ok(e) => e.connect_timeout(CONNECT_TIMEOUT).timeout(CONNECT_TIMEOUT * 2),
        Err(e) => return Probe::Unreachable(format!("agent address {address:?}: {}", chain(&e))),
    };
    let channel = match endpoint.connect().await {
        Ok(c) => c,
        Err(e) => return Probe::Unreachable(format!("connecting to the agent at {address}: {}", chain(&e))),
    };
    let mut request = tonic::Request::new(PulumiVersionRequest {});
    if let Some(t) = token {
        match format!("Bearer {t}").parse() {
            Ok(v) => {
                request.metadata_mut().insert("authorization", v);
            }
            Err(_) => return Probe::Unreachable("the operator's token is not a valid header".into()),
        }
    }
    match pko_proto::agent_client(channel).pulumi_version(request).await {
        Ok(r) => Probe::Answered(r.into_inner().version),
        Err(s) if s.code() == tonic::Code::Unavailable || s.code() == tonic::Code::DeadlineExceeded => {
            Probe::Unreachable(format!("the agent at {address}: {}", s.message()))
        }
        Err(s) => Probe::Refused(format!("{:?}", s.code()), s.message().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use pko_api::workspace::WorkspaceStatus;

    fn ws(generation: i64, ready: Option<(&str, &str, i64)>) -> Workspace {
        let mut w: Workspace = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "w", "namespace": "ns", "generation": generation}, "spec": {}}),
        )
        .unwrap();
        w.status = ready.map(|(status, reason, observed)| WorkspaceStatus {
            conditions: Some(vec![Condition {
                type_: wc::READY.into(),
                status: status.into(),
                reason: reason.into(),
                message: String::new(),
                observed_generation: Some(observed),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
            }]),
            ..Default::default()
        });
        w
    }

    #[test]
    fn a_probe_gives_pko_s_ready_condition() {
        assert_eq!(ready_of(&Probe::Answered("v3.259.0".into())), (("True", "Succeeded".into(), String::new()), None));
        let ((status, reason, message), again) =
            ready_of(&Probe::Unreachable("connecting to the agent at w-workspace.ns:50051: dns error".into()));
        assert_eq!((status, reason.as_str(), again), ("False", "ConnectionFailed", Some(Duration::from_secs(5))));
        assert!(message.contains("dns error"));
        let ((status, reason, message), again) =
            ready_of(&Probe::Refused("Unauthenticated".into(), "TokenReview failed: forbidden".into()));
        assert_eq!(
            (status, reason.as_str(), message.as_str(), again),
            ("False", "Unauthenticated", "TokenReview failed: forbidden", Some(REFUSED_RETRY))
        );
    }

    #[test]
    fn only_a_workspace_not_ready_for_its_generation_is_probed() {
        assert!(needed(&ws(1, None)), "never probed");
        assert!(needed(&ws(1, Some(("False", "WaitingForReplicas", 1)))), "its pod was replaced");
        assert!(needed(&ws(1, Some(("False", "ConnectionFailed", 1)))), "the last probe failed");
        assert!(needed(&ws(2, Some(("True", "Succeeded", 1)))), "a new generation rolls a new pod");
        assert!(!needed(&ws(2, Some(("True", "Succeeded", 2)))));
    }

    #[test]
    fn an_error_s_causes_are_kept() {
        #[derive(Debug)]
        struct E(&'static str, Option<Box<E>>);
        impl std::fmt::Display for E {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for E {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_deref().map(|e| e as _)
            }
        }
        let e = E(
            "transport error",
            Some(Box::new(E("dns error", Some(Box::new(E("failed to lookup address information", None)))))),
        );
        assert_eq!(chain(&e), "transport error: dns error: failed to lookup address information");
    }
}
