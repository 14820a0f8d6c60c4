//! A Workspace's own pod (the pod runtime without pools, PKO's layout): its Service and StatefulSet applied
//! (server-side, field manager `pulumi-kubernetes-operator`), Ready once a replica is available and — for a new pod
//! — its agent answers the connection check ([`super::probe`], PKO's "Querying Pulumi version to validate workspace
//! connectivity").

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use pko_api::Workspace;
use pko_api::constants::{field_manager, workspace_condition as wc};

use super::pod::{self, PodRuntimeConfig};
use super::probe::{self, Probe};
use super::tokens::AgentTokens;
use super::{Readiness, Ready};

/// How often a Ready Workspace's pod is looked at again (seconds; its StatefulSet's changes wake the controller
/// sooner).
pub const READY_RECHECK: Duration = Duration::from_secs(300);
/// How often a Workspace whose StatefulSet is not ready yet is looked at again (seconds).
pub const WAITING_RECHECK: Duration = Duration::from_secs(10);

/// PKO's `Ready` for a workspace StatefulSet `sts`: `RollingUpdate` while its controller has not observed its
/// generation or a new revision rolls out, `WaitingForReplicas` until a replica is available, else up. Pure.
pub fn stateful_set_ready(sts: &StatefulSet) -> Ready {
    let st = sts.status.clone().unwrap_or_default();
    if st.observed_generation != sts.metadata.generation || st.update_revision != st.current_revision {
        return Ready::Waiting(wc::ROLLING_UPDATE, "Waiting for the statefulset to be updated".into());
    }
    if st.available_replicas.unwrap_or(0) < 1 {
        return Ready::Waiting(wc::WAITING_FOR_REPLICAS, "Waiting for the workspace pod to be available".into());
    }
    Ready::Up
}

/// Applies `ws`'s Service and StatefulSet (shaped by `cfg`) and says whether its agent is ready; `tokens`: the
/// operator's, presented to the agent when a new pod is probed.
///
/// Errors: the API server's, on the applies (retried by the reconcile).
pub async fn prepare(
    client: &kube::Client,
    cfg: &PodRuntimeConfig,
    tokens: Option<&AgentTokens>,
    ws: &Workspace,
) -> Result<Readiness, kube::Error> {
    let (ns, name) = (ws.namespace().unwrap_or_default(), ws.name_any());
    let pp = PatchParams::apply(field_manager::OPERATOR).force();
    Api::<Service>::namespaced(client.clone(), &ns)
        .patch(&pod::object_name(&name), &pp, &Patch::Apply(pod::service(ws)))
        .await?;
    let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns)
        .patch(&pod::object_name(&name), &pp, &Patch::Apply(pod::stateful_set(ws, cfg)))
        .await?;
    let address = pod::address(&name, &ns);
    Ok(match stateful_set_ready(&sts) {
        Ready::Up if !probe::needed(ws) => {
            Readiness { address: Some(address), again: Some(READY_RECHECK), ..Readiness::new(Ready::Up) }
        }
        Ready::Up => {
            let found = ask(&address, tokens, &pko_proto::workspace_audience(&ns, &name)).await;
            probed(address, found)
        }
        waiting => Readiness { again: Some(WAITING_RECHECK), ..Readiness::new(waiting) },
    })
}

/// Probes the agent at `address`, with a token of `tokens` for `audience` when given.
async fn ask(address: &str, tokens: Option<&AgentTokens>, audience: &str) -> Probe {
    match tokens {
        Some(tokens) => match tokens.token(audience).await {
            Ok(t) => probe::probe(address, Some(&t)).await,
            Err(e) => Probe::Unreachable(format!("requesting a token for the workspace agent: {e}")),
        },
        None => probe::probe(address, None).await,
    }
}

/// The readiness a probe of the agent at `address` gives: up with its CLI's version, or failed with PKO's
/// `ConnectionFailure` warning and a look again soon. Pure.
fn probed(address: String, found: Probe) -> Readiness {
    let ((_, reason, message), again) = probe::ready_of(&found);
    match (found, again) {
        (Probe::Answered(v), None) => Readiness {
            address: Some(address),
            pulumi_version: Some(pko_proto::pulumi_version(&v)).filter(|v| !v.is_empty()),
            again: Some(READY_RECHECK),
            ..Readiness::new(Ready::Up)
        },
        (_, again) => {
            Readiness { again, warning: Some(message.clone()), ..Readiness::new(Ready::Failed(reason, message)) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_decides_readiness_and_reports_the_cli() {
        let up = probed("a:1".into(), Probe::Answered("v3.259.0".into()));
        assert_eq!(
            (up.ready, up.address.as_deref(), up.pulumi_version.as_deref()),
            (Ready::Up, Some("a:1"), Some("3.259.0"))
        );
        let down = probed("a:1".into(), Probe::Unreachable("refused".into()));
        assert_eq!(down.ready, Ready::Failed(wc::CONNECTION_FAILED.into(), "refused".into()));
        assert_eq!(
            (down.address, down.warning.as_deref(), down.again),
            (None, Some("refused"), Some(probe::UNREACHABLE_RETRY))
        );
        let refused = probed("a:1".into(), Probe::Refused("PermissionDenied".into(), "no".into()));
        assert_eq!(refused.ready, Ready::Failed("PermissionDenied".into(), "no".into()));
    }
}
