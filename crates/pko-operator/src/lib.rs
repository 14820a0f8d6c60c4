//! The operator: the Program, Stack, Workspace and Update controllers (peers that meet through API
//! objects), the artifact server, metrics and probes, and the one assembly that wires them ([`run`],
//! flags in [`args`]). The fleet's seams live in crates of their own below this one: ownership
//! ([`ownership`] = `pko-fleet`) and the work queue ([`queue`] = `pko-queue`). `docs/architecture.md` has
//! the module map.
#![forbid(unsafe_code)]

pub mod args;
pub mod artifacts;
pub mod context;
pub mod fleet;
pub mod informer;
pub mod k8s;
pub mod leader;
/// Ownership of objects by this replica: the `pko-fleet` crate (the fleet implements it there).
pub use pko_fleet as ownership;
/// The work queue between the Update controller and its workers: the `pko-queue` crate.
pub use pko_queue as queue;
pub mod metrics;
pub mod outputs;
pub mod program;
pub mod run;
pub mod stack;
pub mod update;
pub mod workspace;

use std::sync::Arc;

use kube::runtime::Controller;

/// The Program controller and its cache (which the artifact server reads), watching Programs through
/// `informers`: run the future until shutdown.
pub fn program_controller(
    ctx: Arc<context::Context>,
    informers: &mut informer::Informers,
) -> (kube::runtime::reflector::Store<pko_api::Program>, impl std::future::Future<Output = ()> + Send + 'static) {
    let programs = informers.programs();
    let store = programs.store();
    let mut controller = Controller::for_stream(programs.objects(), store.clone());
    if let Some(gained) = ctx.shards_gained.clone() {
        // Programs are watched whole: one that was not ours may be now
        controller = controller.reconcile_all_on(futures::stream::unfold(gained, |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        }));
    }
    let run = async move { k8s::run_controller(controller, &ctx.clone(), "program", program::reconcile, ctx).await };
    (store, run)
}
