//! The membership renewer: renews this replica's membership Lease on its own task, counts the lapses between renewals,
//! and advances the validity of what is held with each renewal.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::reflector;
use tokio::sync::watch;

use super::{FleetConfig, Held};
use crate::lease::{self, LeaseKind, Written};

/// The last successful membership renewal as the renewer saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Renewal {
    /// When it was *started* (the conservative start of its validity).
    pub started: Instant,
    /// Lapses so far: successful renewals that started more than the renew deadline after the one before (this process
    /// was frozen, or the API server unreachable, in between). A holding built before a lapse is void, whatever the
    /// cached Leases still say.
    pub lapses: u64,
}

/// Whether a successful renewal started at `started` follows the previous successful one (`previous`) by more than
/// `deadline`: the holding lapsed in between (pure).
fn lapsed(previous: Option<Instant>, started: Instant, deadline: Duration) -> bool {
    previous.is_some_and(|p| started.saturating_duration_since(p) > deadline)
}

/// Renews (or creates) `cfg.replica`'s membership Lease; `true` when it was written.
async fn renew(
    api: &Api<Lease>,
    cfg: &FleetConfig,
    labels: BTreeMap<String, String>,
    store: &reflector::Store<Lease>,
) -> bool {
    let name = lease::replica_name(&cfg.fleet, &cfg.replica);
    let secs = cfg.lease_duration.as_secs().max(1) as i32;
    let current = store.get(&reflector::ObjectRef::new(&name).within(&cfg.namespace));
    let mut announce = lease::announcing(cfg.shards);
    if let Some(more) = &cfg.announce {
        announce.extend((more.0)());
    }
    let written = match current {
        Some(l) => {
            lease::replace_announcing(api, &l, LeaseKind::Replica, &announce, |s| lease::renew(s, &cfg.replica, secs))
                .await
        }
        None => {
            lease::create_announcing(api, &name, labels, announce.clone(), lease::member_spec(&cfg.replica, secs)).await
        }
    };
    match written {
        Ok(Written::Done(_)) => true,
        Ok(Written::Conflict) => {
            // our cached copy is stale: read it and try once more
            match api.get_opt(&name).await {
                Ok(Some(l)) => matches!(
                    lease::replace_announcing(api, &l, LeaseKind::Replica, &announce, |s| lease::renew(
                        s,
                        &cfg.replica,
                        secs
                    ))
                    .await,
                    Ok(Written::Done(_))
                ),
                _ => false,
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "membership renewal failed");
            false
        }
    }
}

/// Renews the membership every `cfg.renew_interval` on its own task until aborted (never delayed by the main loop's
/// Lease writes), sends each successful renewal with the lapses counted between consecutive ones, and advances the
/// published holding's validity with it ([`Held::advanced_by_renewal`]): a main loop busy longer than the deadline
/// publishes nothing, and its last publish must not expire meanwhile.
pub(super) fn spawn_renewer(
    api: Api<Lease>,
    cfg: FleetConfig,
    labels: BTreeMap<String, String>,
    store: reflector::Store<Lease>,
    renewed: watch::Sender<Option<Renewal>>,
    held: watch::Sender<Arc<Held>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lapses = 0;
        let mut previous = None;
        loop {
            let started = Instant::now();
            if renew(&api, &cfg, labels.clone(), &store).await {
                if lapsed(previous, started, cfg.renew_deadline) {
                    lapses += 1;
                }
                previous = Some(started);
                // first the renewal (what the main loop's publishes compute from), then the holding
                renewed.send_replace(Some(Renewal { started, lapses }));
                let until = started + cfg.renew_deadline;
                held.send_if_modified(|h| match h.advanced_by_renewal(lapses, until, Instant::now()) {
                    Some(v) => {
                        Arc::make_mut(h).valid_until = Some(v);
                        true
                    }
                    None => false,
                });
            }
            tokio::time::sleep_until((started + cfg.renew_interval).into()).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lapse_is_a_gap_between_two_successful_renewals_longer_than_the_deadline() {
        let t0 = Instant::now();
        let deadline = Duration::from_secs(10);
        assert!(!lapsed(None, t0, deadline), "the first renewal");
        assert!(!lapsed(Some(t0), t0 + Duration::from_secs(5), deadline), "on time");
        assert!(!lapsed(Some(t0), t0 + deadline, deadline), "at the deadline exactly");
        assert!(lapsed(Some(t0), t0 + Duration::from_secs(15), deadline), "two renewals failed in between, or frozen");
    }
}
