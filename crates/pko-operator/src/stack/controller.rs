//! The Stack controller's wiring (PKO `stack_controller.go` `SetupWithManager`): what wakes a Stack's reconcile
//! ([`super::reconcile`]) — the Stack itself, its Updates, Workspace and Program, the Stacks it depends on, and Flux
//! source artifacts ([`super::flux`]).

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::Controller;
use kube::runtime::reflector::{ObjectRef, Store};
use pko_api::constants::STACK_NAME_LABEL;
use pko_api::{Program, Stack, Update, Workspace};

use super::prerequisites;
use crate::context::Context;
use crate::informer::Informers;
use crate::k8s;

/// The Stack controller and its cache (which the metrics endpoint reads), watching through `informers`: Stacks (itself,
/// and the Stacks whose prerequisites a change may satisfy), the Updates, Workspaces and Programs that wake a Stack,
/// and the Flux sources Stacks refer to ([`super::flux`]). Run the future until shutdown.
pub fn controller(
    ctx: Arc<Context>,
    informers: &mut Informers,
) -> (Store<Stack>, impl std::future::Future<Output = ()> + Send + 'static) {
    let state = Arc::new(super::reconcile::StackController {
        ctx: ctx.clone(),
        updates: informers.updates().store(),
        programs: informers.programs().store(),
        own_writes: Default::default(),
        workspaces: informers.workspaces().store(),
        applied_workspaces: Default::default(),
        rollouts: informers.rollouts().store(),
    });
    let store = informers.stacks().store();
    let controller = Controller::for_stream(informers.stacks().objects(), store.clone());
    let by_label = |labels: Option<&std::collections::BTreeMap<String, String>>, ns: Option<String>| {
        labels.and_then(|l| l.get(STACK_NAME_LABEL)).map(|n| ObjectRef::<Stack>::new(n).within(&ns.unwrap_or_default()))
    };
    let dependents = store.clone();
    let by_program = store.clone();
    let by_rollout = store.clone();
    let controller = controller
        .watches_stream(informers.updates().objects(), move |u: Update| {
            by_label(u.metadata.labels.as_ref(), u.metadata.namespace.clone())
        })
        .watches_stream(informers.workspaces().objects(), move |w: Workspace| {
            by_label(w.metadata.labels.as_ref(), w.metadata.namespace.clone())
        })
        .watches_stream(informers.stacks().objects(), move |s: Stack| {
            let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
            dependents
                .state_filter(|s| prerequisites::depends_on(s, &ns, &name))
                .iter()
                .map(|s| ObjectRef::from_obj(&**s))
                .collect::<Vec<_>>()
        })
        .watches_stream(informers.programs().objects(), move |p: Program| {
            let (ns, name) = (p.namespace().unwrap_or_default(), p.name_any());
            by_program
                .state_filter(|s| {
                    s.namespace().as_deref() == Some(ns.as_str())
                        && s.spec.program_ref.as_ref().is_some_and(|r| r.name == name)
                })
                .iter()
                .map(|s| ObjectRef::from_obj(&**s))
                .collect::<Vec<_>>()
        })
        .watches_stream(informers.rollouts().objects(), move |r: pko_api::StackRollout| {
            by_rollout
                .state_filter(|s| super::rollout_hold::wakes(&r, s))
                .iter()
                .map(|s| ObjectRef::from_obj(&**s))
                .collect::<Vec<_>>()
        });
    // Flux sources: a new artifact revision reconciles the Stacks that refer to it
    let (flux_tx, flux_rx) = tokio::sync::mpsc::channel(1024);
    let flux = super::flux::run(
        informers.client().clone(),
        informers.scope().clone(),
        informers.stacks().subscribe(),
        store.clone(),
        flux_tx,
    );
    let controller = controller.reconcile_on(tokio_stream::wrappers::ReceiverStream::new(flux_rx));
    let undecodable = super::undecodable::report(ctx.clone(), informers.stacks().undecodable());
    let run = async move {
        let own = ctx.clone();
        tokio::select! {
            () = k8s::run_controller(controller, own.running(), "stack", super::reconcile::reconcile, state) => {}
            () = async { flux.await; std::future::pending::<()>().await } => {}
            () = async { undecodable.await; std::future::pending::<()>().await } => {}
        }
    };
    (store, run)
}
