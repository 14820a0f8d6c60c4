//! The operator: controllers and the artifact server, and CRD generation (`pko-operator crds`).
//!
//! Built so far: the Program controller ([`program`]) and the artifact server ([`artifacts`]), behind the
//! shard-ownership seam ([`ownership`]) the fleet will implement.
#![forbid(unsafe_code)]

pub mod artifacts;
pub mod context;
pub mod metrics;
pub mod ownership;
pub mod program;
pub mod queue;
pub mod stack;
pub mod update;
pub mod workspace;

use std::sync::Arc;

use futures::StreamExt;
use kube::Api;
use kube::runtime::{Controller, watcher};

/// Runs the Program controller until the stream ends (shutdown signal).
pub async fn run_program_controller(ctx: Arc<context::Context>) {
    let programs: Api<pko_api::Program> = Api::all(ctx.client.clone());
    Controller::new(programs, watcher::Config::default())
        .with_config(ctx.controller_config())
        .shutdown_on_signal()
        .run(program::reconcile, program::error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "program reconcile");
            }
        })
        .await;
}
