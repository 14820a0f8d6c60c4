//! The operator: controllers and the artifact server, and CRD generation (`pko-operator crds`).
//!
//! Built so far: the Program controller ([`program`]) and the artifact server ([`artifacts`]), behind the
//! shard-ownership seam ([`ownership`]) the fleet will implement.
#![forbid(unsafe_code)]

pub mod args;
pub mod artifacts;
pub mod context;
pub mod k8s;
pub mod metrics;
pub mod outputs;
pub mod ownership;
pub mod program;
pub mod queue;
pub mod run;
pub mod stack;
pub mod update;
pub mod workspace;

use std::sync::Arc;

use futures::StreamExt;
use kube::Api;
use kube::runtime::{Controller, watcher};

/// The Program controller and its cache (which the artifact server reads): run the future until the
/// stream ends (shutdown signal).
pub fn program_controller(ctx: Arc<context::Context>) -> (kube::runtime::reflector::Store<pko_api::Program>, impl std::future::Future<Output = ()> + Send) {
    let programs: Api<pko_api::Program> = Api::all(ctx.client.clone());
    let controller = Controller::new(programs, watcher::Config::default()).with_config(ctx.controller_config()).graceful_shutdown_on(ctx.shutdown.clone().cancelled_owned());
    let store = controller.store();
    let run = controller.run(|p, c| async move { k8s::observe("program", &*p.clone(), program::reconcile(p, c)).await }, program::error_policy, ctx).for_each(|r| async move {
        if let Err(e) = r {
            tracing::debug!(error = %e, "program reconcile");
        }
    });
    (store, run)
}
