//! Generated types and gRPC client/server of the workspace agent API, package `pko.agent.v1`
//! (`proto/pko/agent/v1/agent.proto`). See that file for the contract of each RPC and message.
#![allow(missing_docs, clippy::all)]

/// `pko.agent.v1`.
pub mod v1 {
    tonic::include_proto!("pko.agent.v1");
}
