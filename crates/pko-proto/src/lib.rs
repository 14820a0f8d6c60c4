//! Generated types and gRPC client/server of the workspace agent API, package `pko.agent.v1`
//! (`proto/pko/agent/v1/agent.proto`). See that file for the contract of each RPC and message.
#![allow(missing_docs, clippy::all)]

pub mod digest;
pub mod json;
pub mod lines;
pub mod locks;
pub mod plan;

/// `pko.agent.v1`.
pub mod v1 {
    tonic::include_proto!("pko.agent.v1");
}

/// The token audience an agent of Workspace `workspace` in `namespace` accepts (`--kube-audience`, PKO's
/// `<workspace>.<namespace>`): a contract between the operator, which asks for tokens of it, and the agent, which
/// checks them.
pub fn workspace_audience(namespace: &str, workspace: &str) -> String {
    format!("{workspace}.{namespace}")
}

/// What an agent prints on its stdout, followed by its gRPC address (`127.0.0.1:50051`) and a newline, once it listens:
/// the handshake by which a process that started it (the operator's local runtime, the tests) learns where to call it.
pub const LISTENING_ON: &str = "listening on ";

/// The address an agent's handshake line `line` reports ([`LISTENING_ON`]); `None`: not a handshake.
pub fn listening_address(line: &str) -> Option<&str> {
    line.trim().strip_prefix(LISTENING_ON)
}

/// Largest message an agent sends and the operator accepts: 400 MiB (bytes), PKO's limit since 2.6.0 (#1154) — a
/// result with large outputs, or a large engine event, must not break the stream (tonic's default is 4 MiB).
pub const MAX_AGENT_MESSAGE_BYTES: usize = 400 << 20;

/// Largest request an agent accepts: 64 MiB (bytes) — a request carries config, environment and secrets, never a
/// program.
pub const MAX_REQUEST_MESSAGE_BYTES: usize = 64 << 20;

/// A client of the agent at `channel` that accepts messages up to [`MAX_AGENT_MESSAGE_BYTES`].
pub fn agent_client(channel: tonic::transport::Channel) -> v1::agent_client::AgentClient<tonic::transport::Channel> {
    v1::agent_client::AgentClient::new(channel).max_decoding_message_size(MAX_AGENT_MESSAGE_BYTES)
}

/// The Pulumi CLI's version as PKO reports it in a Workspace's `status.pulumiVersion` (the automation API's semver:
/// `3.259.0` for `pulumi version`'s `v3.259.0`). Pure.
pub fn pulumi_version(cli: &str) -> String {
    cli.trim().trim_start_matches('v').to_string()
}

/// Minimum Pulumi CLI version for structured (non-string) config values (PKO: 3.202.0); the agent refuses such config
/// on an older CLI (`INCOMPATIBLE_CONFIGURATION`, the Stack `PulumiVersionTooLow`).
pub const MIN_PULUMI_FOR_STRUCTURED_CONFIG: (u64, u64, u64) = (3, 202, 0);

/// Parses a Pulumi version such as `v3.259.0` or `3.202.0-alpha.1+dirty` (semver, with or without a leading `v`) into
/// `(major, minor, patch)`. `None`: not such a version.
pub fn parse_pulumi_version(v: &str) -> Option<(u64, u64, u64)> {
    let v = semver::Version::parse(v.trim().trim_start_matches('v')).ok()?;
    Some((v.major, v.minor, v.patch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_as_pulumi_prints_them() {
        assert_eq!(parse_pulumi_version("v3.259.0"), Some((3, 259, 0)));
        assert_eq!(parse_pulumi_version("3.202.0-alpha.1+dirty"), Some((3, 202, 0)));
        assert_eq!(parse_pulumi_version("3.2"), None);
        assert_eq!(parse_pulumi_version("x"), None);
        assert!(parse_pulumi_version("3.201.9").unwrap() < MIN_PULUMI_FOR_STRUCTURED_CONFIG);
        assert_eq!(pulumi_version(" v3.259.0\n"), "3.259.0");
    }

    #[test]
    fn the_handshake_names_the_address() {
        assert_eq!(listening_address("listening on 127.0.0.1:50051\n"), Some("127.0.0.1:50051"));
        assert_eq!(listening_address("starting"), None);
    }

    #[test]
    fn the_audience_is_the_one_pod_agents_are_started_with() {
        assert_eq!(super::workspace_audience("team-a", "web"), "web.team-a");
    }
}
