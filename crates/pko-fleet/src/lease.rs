//! Lease records of the fleet (`coordination.k8s.io/v1` Leases in the operator's namespace), written
//! only through resourceVersion-guarded requests: a create fails if the Lease exists, a replace fails
//! if anyone wrote it since it was read. So two replicas can never both believe a write of theirs
//! made them the holder.
//!
//! Two kinds, told apart by the label [`KIND_LABEL`]:
//! - a **membership** Lease per replica (`<fleet>-member-<replica>`), renewed every few seconds: the
//!   replica is live while others see its `renewTime` change; released (`holderIdentity` cleared) on
//!   graceful shutdown;
//! - a **shard** Lease per shard (`<fleet>-shard-<k>`), written only when the shard changes hands: its
//!   `holderIdentity` is the holder and its `leaseTransitions` the shard's epoch (the fencing token).
//!
//! `kube-lease-manager` (which supports kube 5) renews every Lease it holds: S shard Leases would cost
//! S writes per renewal period at rest. Holding shards without renewing them, with liveness carried by
//! one membership Lease per replica, keeps coordination flat in S and in Stacks.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};

/// Label naming the fleet a Lease belongs to (value: the fleet's name).
pub const FLEET_LABEL: &str = "pulumi.com/fleet";
/// Label telling membership Leases (`member`) from shard Leases (`shard`).
pub const KIND_LABEL: &str = "pulumi.com/lease";
/// Label of a shard Lease naming its shard (the same label the sharded objects carry).
pub const SHARD_LABEL: &str = "pulumi.com/shard";

/// Name of the membership Lease of `replica` in `fleet`.
pub fn member_name(fleet: &str, replica: &str) -> String {
    format!("{fleet}-member-{replica}")
}

/// Name of the Lease of `shard` in `fleet`.
pub fn shard_name(fleet: &str, shard: u32) -> String {
    format!("{fleet}-shard-{shard}")
}

/// The holder of `lease`, if any.
pub fn holder(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// `leaseTransitions` of `lease` (0 when unset): a shard's epoch.
pub fn transitions(lease: &Lease) -> i64 {
    lease.spec.as_ref().and_then(|s| s.lease_transitions).map(i64::from).unwrap_or(0)
}

/// What a guarded write did.
#[derive(Debug, PartialEq)]
pub enum Written {
    /// The write was applied; the Lease as stored now.
    Done(Box<Lease>),
    /// Someone else wrote first (409): nothing was changed; read again.
    Conflict,
}

/// Counter of Lease writes sent by this process: `pko_fleet_lease_writes_total{lease, result}`, `lease`
/// the [`KIND_LABEL`] value (`member` or `shard`), `result` `done` or `conflict` (a 409: someone wrote
/// first). The fleet's coordination cost at rest is its rate.
pub const LEASE_WRITES_TOTAL: &str = "pko_fleet_lease_writes_total";

fn count_write(labels: Option<&BTreeMap<String, String>>, result: &'static str) {
    let kind = labels.and_then(|l| l.get(KIND_LABEL)).cloned().unwrap_or_else(|| "unknown".into());
    metrics::counter!(LEASE_WRITES_TOTAL, "lease" => kind, "result" => result).increment(1);
}

/// A create's or replace's answer as [`Written`] (409: [`Written::Conflict`]), counted.
fn written(answer: Result<Lease, kube::Error>, labels: Option<&BTreeMap<String, String>>) -> Result<Written, kube::Error> {
    match answer {
        Ok(l) => {
            count_write(labels, "done");
            Ok(Written::Done(Box::new(l)))
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            count_write(labels, "conflict");
            Ok(Written::Conflict)
        }
        Err(e) => Err(e),
    }
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// Creates the Lease `name` with `labels` and `spec`; [`Written::Conflict`] if it exists.
///
/// Errors: the API server's, except 409.
pub async fn create(api: &Api<Lease>, name: &str, labels: BTreeMap<String, String>, spec: LeaseSpec) -> Result<Written, kube::Error> {
    let lease = Lease { metadata: ObjectMeta { name: Some(name.into()), labels: Some(labels), ..Default::default() }, spec: Some(spec) };
    written(api.create(&PostParams::default(), &lease).await, lease.metadata.labels.as_ref())
}

/// Replaces `read` (as read, with its resourceVersion) by `read` with `change` applied to its spec;
/// [`Written::Conflict`] if it was written since it was read.
///
/// Errors: the API server's, except 409.
pub async fn replace(api: &Api<Lease>, read: &Lease, change: impl FnOnce(&mut LeaseSpec)) -> Result<Written, kube::Error> {
    let mut lease = read.clone();
    change(lease.spec.get_or_insert_with(Default::default));
    let name = lease.metadata.name.clone().unwrap_or_default();
    written(api.replace(&name, &PostParams::default(), &lease).await, lease.metadata.labels.as_ref())
}

/// The spec of a membership Lease of `replica` renewed now, lasting `duration_seconds`.
pub fn member_spec(replica: &str, duration_seconds: i32) -> LeaseSpec {
    LeaseSpec { holder_identity: Some(replica.into()), lease_duration_seconds: Some(duration_seconds), renew_time: Some(now()), acquire_time: Some(now()), ..Default::default() }
}

/// Makes `spec` say `replica` holds the shard from now, one transition later (the new epoch).
pub fn take(spec: &mut LeaseSpec, replica: &str) {
    spec.holder_identity = Some(replica.into());
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    spec.acquire_time = Some(now());
    spec.renew_time = Some(now());
}

/// Makes `spec` say nobody holds it (a release; the epoch stays until the next holder takes it).
pub fn release(spec: &mut LeaseSpec) {
    spec.holder_identity = None;
}

/// Makes `spec` a renewal now.
pub fn renew(spec: &mut LeaseSpec, replica: &str, duration_seconds: i32) {
    spec.holder_identity = Some(replica.into());
    spec.lease_duration_seconds = Some(duration_seconds);
    spec.renew_time = Some(now());
}
