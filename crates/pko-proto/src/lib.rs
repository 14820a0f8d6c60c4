//! Generated types and gRPC client/server of the workspace agent API, package `pko.agent.v1`
//! (`proto/pko/agent/v1/agent.proto`). See that file for the contract of each RPC and message.
#![allow(missing_docs, clippy::all)]

/// `pko.agent.v1`.
pub mod v1 {
    tonic::include_proto!("pko.agent.v1");
}

/// The token audience an agent of Workspace `workspace` in `namespace` accepts (`--kube-audience`,
/// PKO's `<workspace>.<namespace>`): a contract between the operator, which asks for tokens of it, and
/// the agent, which checks them.
pub fn workspace_audience(namespace: &str, workspace: &str) -> String {
    format!("{workspace}.{namespace}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_audience_is_the_one_pod_agents_are_started_with() {
        assert_eq!(super::workspace_audience("team-a", "web"), "web.team-a");
    }
}
