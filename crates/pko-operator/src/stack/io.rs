//! The API reads and writes of a Stack pass besides source resolution ([`super::source`]) and the finalizer
//! ([`super::finalizer`]): the status write, the Workspace reclaim, the in-flight Update lookup (from the informer
//! cache) and the namespace lookup, with the pure predicates they use.

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::Store;
use pko_api::constants::{STACK_NAME_LABEL, event_reason as ev, field_manager};
use pko_api::stack::{StackStatus, StackUpdateStateMessage};
use pko_api::{Stack, Update, Workspace};

use crate::context::Context;
use crate::k8s::{self, Severity};

/// Writes the Stack's status, pinned to `resource_version` when given (409 when the Stack is no longer at it); returns
/// the `resourceVersion` it gave the Stack.
pub(super) async fn write_status(
    api: &Api<Stack>,
    name: &str,
    st: &StackStatus,
    resource_version: Option<&str>,
) -> Result<Option<String>, kube::Error> {
    k8s::apply_status_versioned(api, name, field_manager::STACK_STATUS, st, resource_version).await
}

/// `workspaceReclaimPolicy: Delete` and the last update succeeded: the Workspace (and its agent) can go until the next
/// sync recreates it (PKO §2.7; a failed Stack keeps its Workspace for debugging, #826).
pub(super) fn ready_and_reclaimable(stack: &Stack, st: &StackStatus) -> bool {
    stack.spec.workspace_reclaim_policy == Some(pko_api::stack::WorkspaceReclaimPolicy::Delete)
        && st.current_update.is_none()
        && st.last_update.as_ref().is_some_and(|l| l.state == Some(StackUpdateStateMessage::Succeeded))
}

/// Deletes the Stack's Workspace if it exists, with PKO's `WorkspaceDeleted` event.
pub(super) async fn reclaim_workspace(ctx: &Context, stack: &Stack) -> Result<(), kube::Error> {
    let ns = stack.namespace().unwrap_or_default();
    let workspaces: Api<Workspace> = Api::namespaced(ctx.client.clone(), &ns);
    match workspaces.get_opt(&stack.name_any()).await? {
        Some(ws) if ws.metadata.deletion_timestamp.is_none() => {
            workspaces.delete(&stack.name_any(), &kube::api::DeleteParams::background()).await?;
            k8s::publish(
                &ctx.events.stack,
                stack,
                Severity::Normal,
                ev::WORKSPACE_DELETED,
                "Workspace deleted per reclaim policy".into(),
            )
            .await;
        }
        _ => {}
    }
    Ok(())
}

/// The name of an Update of Stack `ns/name` not complete yet, from the Update informer's cache `updates` (`None`: there
/// is none): the second guard of one Update per Stack after `currentUpdate`, for an Update another replica created
/// before a shard move. From the cache, never a LIST (O(N²) per namespace).
pub(super) fn in_flight_update(updates: &Store<Update>, ns: &str, name: &str) -> Option<String> {
    updates.find(|u| in_flight_for(u, ns, name)).map(|u| u.name_any())
}

/// Whether `u` is an Update of Stack `ns/name` (its namespace and [`STACK_NAME_LABEL`]) that is neither complete nor
/// being deleted. Pure.
pub(super) fn in_flight_for(u: &Update, ns: &str, name: &str) -> bool {
    u.metadata.namespace.as_deref() == Some(ns)
        && u.metadata.labels.as_ref().and_then(|l| l.get(STACK_NAME_LABEL)).is_some_and(|n| n == name)
        && !u.is_complete()
        && u.metadata.deletion_timestamp.is_none()
}

/// Whether namespace `ns` is being deleted.
pub(super) async fn namespace_terminating(ctx: &Context, ns: &str) -> Result<bool, kube::Error> {
    let namespace = Api::<k8s_openapi::api::core::v1::Namespace>::all(ctx.client.clone()).get_opt(ns).await?;
    Ok(namespace.is_some_and(|n| n.metadata.deletion_timestamp.is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use pko_api::stack::StackUpdateState;
    use serde_json::json;

    #[test]
    fn an_update_is_in_flight_for_its_own_stack_until_complete_or_deleted() {
        let update = |ns: &str, stack: Option<&str>, complete: bool, deleting: bool| {
            let mut u: Update = serde_json::from_value(json!({
                "apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update",
                "metadata": {"name": "u", "namespace": ns},
                "spec": {},
                "status": {"conditions": [{"type": "Complete", "status": if complete { "True" } else { "False" },
                    "reason": "r", "message": "", "lastTransitionTime": "2026-11-24T00:00:00Z"}]},
            }))
            .unwrap();
            if let Some(s) = stack {
                u.metadata.labels = Some([(STACK_NAME_LABEL.to_string(), s.to_string())].into());
            }
            if deleting {
                u.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
            }
            u
        };
        assert!(in_flight_for(&update("a", Some("web"), false, false), "a", "web"));
        assert!(
            !in_flight_for(&update("b", Some("web"), false, false), "a", "web"),
            "another namespace's Stack of that name"
        );
        assert!(!in_flight_for(&update("a", Some("api"), false, false), "a", "web"), "another Stack's");
        assert!(!in_flight_for(&update("a", None, false, false), "a", "web"), "no Stack's");
        assert!(!in_flight_for(&update("a", Some("web"), true, false), "a", "web"), "complete");
        assert!(!in_flight_for(&update("a", Some("web"), false, true), "a", "web"), "being deleted");
    }

    #[test]
    fn only_a_succeeded_stack_with_the_delete_policy_reclaims_its_workspace() {
        use pko_api::stack::WorkspaceReclaimPolicy;
        let mut stack = Stack::new("s", pko_api::StackSpec { stack: "dev".into(), ..Default::default() });
        let ok = StackStatus {
            last_update: Some(StackUpdateState {
                state: Some(StackUpdateStateMessage::Succeeded),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(!ready_and_reclaimable(&stack, &ok), "Retain is the default");
        stack.spec.workspace_reclaim_policy = Some(WorkspaceReclaimPolicy::Delete);
        assert!(ready_and_reclaimable(&stack, &ok));
        let failed = StackStatus {
            last_update: Some(StackUpdateState {
                failures: Some(0),
                message: Some("failed".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(!ready_and_reclaimable(&stack, &failed), "a failed Stack keeps its Workspace for debugging");
        let running = StackStatus { current_update: Some(Default::default()), ..ok };
        assert!(!ready_and_reclaimable(&stack, &running));
    }
}

/// What the API server says about the hosts of `holders` for an unlock request of a Stack in `ns` whose Workspace is
/// `workspace` ([`super::unlock::Facts`]): per distinct host other than this one, a Pod GET in the Stack's namespace
/// and in the operator's, and the fleet's membership Lease of a replica of that id. A handful of reads, only when a
/// user asks for an unlock.
pub(super) async fn unlock_facts(
    ctx: &Context,
    ns: &str,
    workspace: &str,
    holders: &[pko_proto::locks::Holder],
) -> Result<super::unlock::Facts, kube::Error> {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Pod;
    let place = &ctx.placement;
    let mut facts = super::unlock::Facts {
        this_host: place.hostname.clone(),
        agent_sets: vec![format!("{workspace}-workspace"), "pko-pool-".into()],
        ..Default::default()
    };
    let hosts: std::collections::BTreeSet<&str> =
        holders.iter().map(|h| h.hostname.as_str()).filter(|h| *h != place.hostname && !h.is_empty()).collect();
    let namespaces: std::collections::BTreeSet<&str> =
        [Some(ns), place.namespace.as_deref()].into_iter().flatten().collect();
    for host in hosts {
        for n in &namespaces {
            if Api::<Pod>::namespaced(ctx.client.clone(), n).get_opt(host).await?.is_some() {
                facts.pods.insert(host.to_string());
            }
        }
        if let (Some(n), Some(fleet)) = (place.namespace.as_deref(), place.fleet.as_deref()) {
            // this version's membership, else an earlier version's (a lock taken before an upgrade)
            let leases = Api::<Lease>::namespaced(ctx.client.clone(), n);
            let lease = match leases.get_opt(&pko_fleet::lease::replica_name(fleet, host)).await? {
                Some(l) => Some(l),
                None => leases.get_opt(&pko_fleet::lease::member_name(fleet, host)).await?,
            };
            if let Some(lease) = lease {
                facts.replicas.insert(host.to_string(), membership_live(&lease, k8s_openapi::jiff::Timestamp::now()));
            }
        }
    }
    Ok(facts)
}

/// Whether a membership Lease was renewed within its duration at `now` (and names a holder). Pure.
fn membership_live(lease: &k8s_openapi::api::coordination::v1::Lease, now: k8s_openapi::jiff::Timestamp) -> bool {
    let Some(spec) = lease.spec.as_ref().filter(|s| s.holder_identity.as_deref().is_some_and(|h| !h.is_empty())) else {
        return false;
    };
    let duration = std::time::Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(0) as u64);
    spec.renew_time.as_ref().is_some_and(|t| t.0 + duration >= now)
}

#[cfg(test)]
mod unlock_tests {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn a_membership_is_live_while_renewed_within_its_duration_with_a_holder() {
        let now: Timestamp = "2026-11-26T12:00:00Z".parse().unwrap();
        let lease = |holder: &str, ago: u64| Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(now - std::time::Duration::from_secs(ago))),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(super::membership_live(&lease("r1", 5), now));
        assert!(!super::membership_live(&lease("r1", 16), now), "expired");
        assert!(!super::membership_live(&lease("", 1), now), "released");
        assert!(!super::membership_live(&Lease::default(), now));
    }
}
