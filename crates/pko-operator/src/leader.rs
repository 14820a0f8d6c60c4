//! PKO's `--leader-elect` for one active replica outside a fleet: the replica acts only while it holds the Lease
//! `operator.pulumi.com` (PKO's `LeaderElectionID`) in its namespace, and stops at once when it loses it (as
//! controller-runtime's manager exits). The Lease is held through `kube-lease-manager` (server-side apply,
//! conflict-checked, renewed before it runs out) and released on shutdown, so a successor takes over at once.
//!
//! Because the Lease has PKO's name and the standard `LeaseSpec` fields, a PKO manager still running during a migration
//! holds this operator back until it stops (and the other way round).
//!
//! With `--fleet` the flag is accepted and changes nothing: every replica is active and the shard Leases decide what
//! each acts on.

use std::time::Duration;

use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Name of the leader Lease (PKO: `LeaderElectionID: "operator.pulumi.com"`).
pub const LEADER_LEASE: &str = "operator.pulumi.com";

/// PKO's leader-election timings (`LEADER_ELECTION_*`, Go durations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long the Lease lasts without renewal (PKO default 60 s).
    pub lease_duration: Duration,
    /// How long the holder keeps failing to renew before it gives up (PKO default 45 s): it renews once less than
    /// `lease_duration − renew_deadline` is left.
    pub renew_deadline: Duration,
    /// How often a waiting replica looks at the Lease again (PKO default 10 s), so a Lease released on shutdown is
    /// taken at once rather than when it would have run out.
    pub retry_period: Duration,
}

impl Timing {
    /// `(duration, grace)` in whole seconds for `kube-lease-manager`: the Lease's duration, and how long before its end
    /// the holder renews (at least 1 s, below the duration).
    pub fn lease_seconds(&self) -> (u64, u64) {
        let duration = self.lease_duration.as_secs().max(2);
        let grace = duration.saturating_sub(self.renew_deadline.as_secs()).clamp(1, duration - 1);
        (duration, grace)
    }
}

/// The leadership of this replica, while held: a task renews the Lease.
pub struct Leadership {
    lost: watch::Receiver<bool>,
    stop: tokio_util::sync::CancellationToken,
    task: JoinHandle<()>,
}

/// Waits until `identity` holds the leader Lease in `namespace` (looking again every retry period), or `shutdown` is
/// cancelled (`None`).
///
/// Errors: the Lease cannot be read or created (RBAC: `get`/`create`/`patch` on `leases`).
pub async fn acquire(
    client: kube::Client,
    namespace: &str,
    identity: &str,
    timing: Timing,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<Option<Leadership>, LeaseManagerError> {
    let (duration, grace) = timing.lease_seconds();
    let build = || {
        LeaseManagerBuilder::new(client.clone(), LEADER_LEASE)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(duration)
            .with_grace(grace)
            .with_field_manager(format!("pko-leader-{identity}"))
            .build()
    };
    tracing::info!(lease = %format!("{namespace}/{LEADER_LEASE}"), %identity, duration_s = duration,
        "waiting for leadership (--leader-elect)");
    let retry = timing.retry_period.max(Duration::from_millis(200));
    let manager = loop {
        // a manager's `changed` sleeps until another holder's Lease would run out and keeps what it
        // read: a fresh manager each retry period reads the Lease again, so one released on shutdown
        // is taken at once (client-go's candidates poll every retry period the same way)
        let manager = build().await?;
        tokio::select! {
            r = manager.changed() => if r? { break manager },
            _ = tokio::time::sleep(retry) => {}
            _ = shutdown.cancelled() => return Ok(None),
        }
    };
    tracing::info!(%identity, "leadership acquired");
    let (tx, lost) = watch::channel(false);
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(hold(manager, tx, stop.clone(), timing.renew_deadline));
    Ok(Some(Leadership { lost, stop, task }))
}

/// Renews the Lease until told to stop (then releases it) or until it is lost: another holder, or renewals failing for
/// longer than `renew_deadline` (then `lost` turns true).
async fn hold(
    manager: kube_lease_manager::LeaseManager,
    lost: watch::Sender<bool>,
    stop: tokio_util::sync::CancellationToken,
    renew_deadline: Duration,
) {
    let mut failing_since: Option<std::time::Instant> = None;
    loop {
        let started = std::time::Instant::now();
        tokio::select! {
            r = manager.changed() => match r {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    // a call that got as far as waiting for the next renewal had succeeded before
                    if started.elapsed() > Duration::from_secs(1) {
                        failing_since = None;
                    }
                    let since = *failing_since.get_or_insert_with(std::time::Instant::now);
                    tracing::warn!(error = %e, "renewing the leader Lease");
                    if since.elapsed() > renew_deadline {
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            },
            _ = stop.cancelled() => {
                match manager.release().await {
                    Ok(()) => tracing::info!("leadership released"),
                    Err(e) => tracing::warn!(error = %e, "releasing the leader Lease"),
                }
                return;
            }
        }
    }
    let _ = lost.send(true);
}

impl Leadership {
    /// Resolves when the Lease is lost (another holder, or it could not be renewed in time).
    pub async fn lost(&mut self) {
        let _ = self.lost.wait_for(|lost| *lost).await;
    }

    /// Gives the Lease up (on shutdown): a successor need not wait for it to run out.
    pub async fn release(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pko_timings_map_to_duration_and_grace() {
        let retry_period = Duration::from_secs(10);
        let pko =
            Timing { lease_duration: Duration::from_secs(60), renew_deadline: Duration::from_secs(45), retry_period };
        assert_eq!(pko.lease_seconds(), (60, 15));
        let odd =
            Timing { lease_duration: Duration::from_secs(10), renew_deadline: Duration::from_secs(30), retry_period };
        assert_eq!(odd.lease_seconds(), (10, 1), "a renew deadline past the duration still renews before the end");
        let tiny = Timing { lease_duration: Duration::from_millis(500), renew_deadline: Duration::ZERO, retry_period };
        assert_eq!(tiny.lease_seconds(), (2, 1));
    }
}
