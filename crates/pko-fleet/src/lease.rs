//! Lease records of the fleet (`coordination.k8s.io/v1` Leases in the operator's namespace), written only through
//! resourceVersion-guarded requests: a create fails if the Lease exists, a replace fails if anyone wrote it since it
//! was read. So two replicas can never both believe a write of theirs made them the holder.
//!
//! Two kinds, told apart by their names ([`LeaseKind`]) and the label [`KIND_LABEL`]:
//! - a **membership** Lease per replica (`<fleet>-replica-<replica>`, label `member`), renewed every few seconds: the
//!   replica is live while others see its `renewTime` change; released (`holderIdentity` cleared) on graceful shutdown;
//! - the **shard table** of each shard count (`<fleet>-shards-<S>`, label `table`, [`crate::table`]), written only when
//!   shards change hands: holder and epoch (the fencing token) of every shard.
//!
//! Versions before the table held shards through one Lease per shard (`<fleet>-shard-<k>`, its `leaseTransitions` the
//! epoch) beside a membership named `<fleet>-member-<replica>`: their kinds are still read
//! ([`LeaseKind::LegacyMember`], [`LeaseKind::Shard`]) so that a rolling upgrade from them never has two replicas act
//! on one shard (`planning::Standing::Earlier`), and so that epochs keep rising across it. A replica of this version is
//! invisible to them: they know neither name.
//!
//! `kube-lease-manager` (which supports kube 5) renews every Lease it holds: S shard Leases would cost S writes per
//! renewal period at rest. Holding shards without renewing them, with liveness carried by one membership Lease per
//! replica, keeps coordination flat in S and in Stacks; one table per count makes a handoff one write per replica.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};

/// Label naming the fleet a Lease belongs to (value: the fleet's name).
pub const FLEET_LABEL: &str = "pulumi.com/fleet";
/// Label telling membership Leases (`member`) from shard Leases (`shard`).
pub const KIND_LABEL: &str = "pulumi.com/lease";
/// Label of a shard Lease naming its shard (the same label the sharded objects carry).
pub const SHARD_LABEL: &str = "pulumi.com/shard";
/// Annotation of a membership Lease: the number of virtual shards its replica runs with (`--shards`, decimal). Replicas
/// of one fleet must agree on it; a member whose count differs from the one that prevails holds nothing
/// ([`crate::planning::standing`]). A membership Lease without it (written by a replica older than the annotation) is
/// taken to agree with everyone.
pub const SHARDS_ANNOTATION: &str = "pulumi.com/shards";

/// Name of the membership Lease of `replica` in `fleet`.
pub fn replica_name(fleet: &str, replica: &str) -> String {
    format!("{fleet}-replica-{replica}")
}

/// Name of the shard table Lease of `fleet` at `shards` virtual shards.
pub fn table_name(fleet: &str, shards: u32) -> String {
    format!("{fleet}-shards-{shards}")
}

/// Name of the membership Lease of `replica` written by versions before the shard table.
pub fn member_name(fleet: &str, replica: &str) -> String {
    format!("{fleet}-member-{replica}")
}

/// Name of the Lease of `shard` written by versions before the shard table.
pub fn shard_name(fleet: &str, shard: u32) -> String {
    format!("{fleet}-shard-{shard}")
}

/// Which of a fleet's Leases a Lease is, told by its name (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseKind {
    /// A replica's membership Lease ([`replica_name`]).
    Replica,
    /// The shard table of this shard count ([`table_name`]).
    Table(u32),
    /// The membership Lease of a replica of the earlier protocol ([`member_name`]: one Lease per shard).
    LegacyMember,
    /// The Lease of this shard, written by the earlier protocol ([`shard_name`]).
    LegacyShard(u32),
}

/// `s` as a number exactly as `format!` writes one: no sign, no leading zero.
fn number(s: &str) -> Option<u32> {
    (s == "0" || !s.starts_with(['0', '+'])).then(|| s.parse().ok()).flatten()
}

impl LeaseKind {
    /// The kind of the Lease named `name` in `fleet`; `None` for a name of no such form.
    pub fn of(fleet: &str, name: &str) -> Option<Self> {
        let rest = name.strip_prefix(fleet)?.strip_prefix('-')?;
        if rest.strip_prefix("replica-").is_some_and(|r| !r.is_empty()) {
            return Some(Self::Replica);
        }
        if rest.strip_prefix("member-").is_some_and(|r| !r.is_empty()) {
            return Some(Self::LegacyMember);
        }
        if let Some(count) = rest.strip_prefix("shards-") {
            return number(count).filter(|n| *n > 0).map(Self::Table);
        }
        number(rest.strip_prefix("shard-")?).map(Self::LegacyShard)
    }

    /// The [`KIND_LABEL`] value of this kind (`member`, `table` or `shard`).
    pub fn label(self) -> &'static str {
        match self {
            Self::Replica | Self::LegacyMember => "member",
            Self::Table(_) => "table",
            Self::LegacyShard(_) => "shard",
        }
    }
}

/// Strips `lease` to what the fleet decides and writes from: name, namespace, resourceVersion, spec, the
/// [`SHARDS_ANNOTATION`] and a table's [`crate::table::TABLE_ANNOTATION`]. Writes from a stripped Lease are guarded
/// merge patches ([`replace`]), which leave the rest of the object as stored.
pub fn slim(lease: &mut Lease) {
    let meta = std::mem::take(&mut lease.metadata);
    let kept = [SHARDS_ANNOTATION, crate::table::TABLE_ANNOTATION];
    let annotations = meta
        .annotations
        .map(|a| a.into_iter().filter(|(k, _)| kept.contains(&k.as_str())).collect::<BTreeMap<_, _>>())
        .filter(|a| !a.is_empty());
    lease.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        resource_version: meta.resource_version,
        annotations,
        ..Default::default()
    };
}

/// The shard count a membership Lease announces ([`SHARDS_ANNOTATION`]); `None` when it announces none or one that is
/// not a positive number.
pub fn announced_shards(lease: &Lease) -> Option<u32> {
    lease.metadata.annotations.as_ref()?.get(SHARDS_ANNOTATION)?.parse().ok().filter(|n: &u32| *n > 0)
}

/// The annotations of a membership Lease announcing `shards` ([`SHARDS_ANNOTATION`]).
pub fn announcing(shards: u32) -> BTreeMap<String, String> {
    BTreeMap::from([(SHARDS_ANNOTATION.to_string(), shards.to_string())])
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

/// Counter of Lease writes sent by this process: `pko_fleet_lease_writes_total{lease, result}`, `lease` the
/// [`KIND_LABEL`] value (`member` or `table`), `result` `done` or `conflict` (a 409: someone wrote first). The fleet's
/// coordination cost at rest is its rate.
pub const LEASE_WRITES_TOTAL: &str = "pko_fleet_lease_writes_total";

fn count_write(kind: &'static str, result: &'static str) {
    metrics::counter!(LEASE_WRITES_TOTAL, "lease" => kind, "result" => result).increment(1);
}

/// Creates every series of [`LEASE_WRITES_TOTAL`] a member writes (`member` and `table`, `done` and `conflict`) at
/// zero, so that a rate of conflicts reads 0, not "no data", before the first one (a fleet whose table writes never met
/// a 409 had no conflict series at all).
pub fn init_write_counters() {
    for kind in ["member", "table"] {
        for result in ["done", "conflict"] {
            metrics::counter!(LEASE_WRITES_TOTAL, "lease" => kind, "result" => result).increment(0);
        }
    }
}

/// A create's or replace's answer as [`Written`] (409: [`Written::Conflict`]), counted under `kind` (the [`KIND_LABEL`]
/// value).
fn written(answer: Result<Lease, kube::Error>, kind: &'static str) -> Result<Written, kube::Error> {
    match answer {
        Ok(l) => {
            count_write(kind, "done");
            Ok(Written::Done(Box::new(l)))
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            count_write(kind, "conflict");
            Ok(Written::Conflict)
        }
        Err(e) => Err(e),
    }
}

/// The JSON merge patch turning spec `from` into `to` (pure): every field of `to`, and `null` for each field `from` had
/// and `to` has not (a merge patch leaves a field it does not name as it is), under `metadata.resourceVersion`, which
/// makes the API server refuse it (409) if the Lease was written since.
///
/// Errors: a spec that does not serialize (none does).
pub fn spec_patch(
    resource_version: &str,
    from: &LeaseSpec,
    to: &LeaseSpec,
) -> Result<serde_json::Value, serde_json::Error> {
    spec_patch_announcing(resource_version, from, to, &BTreeMap::new())
}

/// [`spec_patch`], also setting `annotations` (merged into those stored; empty: none named).
///
/// Errors: a spec that does not serialize (none does).
pub fn spec_patch_announcing(
    resource_version: &str,
    from: &LeaseSpec,
    to: &LeaseSpec,
    annotations: &BTreeMap<String, String>,
) -> Result<serde_json::Value, serde_json::Error> {
    type Fields = serde_json::Map<String, serde_json::Value>;
    let mut spec: Fields = serde_json::from_value(serde_json::to_value(to)?)?;
    let before: Fields = serde_json::from_value(serde_json::to_value(from)?)?;
    for field in before.keys() {
        spec.entry(field.clone()).or_insert(serde_json::Value::Null);
    }
    let mut metadata = serde_json::json!({"resourceVersion": resource_version});
    if !annotations.is_empty() {
        metadata["annotations"] = serde_json::to_value(annotations)?;
    }
    Ok(serde_json::json!({"metadata": metadata, "spec": spec}))
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// Creates the Lease `name` with `labels` and `spec`; [`Written::Conflict`] if it exists.
///
/// Errors: the API server's, except 409.
pub async fn create(
    api: &Api<Lease>,
    name: &str,
    labels: BTreeMap<String, String>,
    spec: LeaseSpec,
) -> Result<Written, kube::Error> {
    create_announcing(api, name, labels, BTreeMap::new(), spec).await
}

/// [`create`] with `annotations` (a membership Lease's [`announcing`]).
///
/// Errors: the API server's, except 409.
pub async fn create_announcing(
    api: &Api<Lease>,
    name: &str,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    spec: LeaseSpec,
) -> Result<Written, kube::Error> {
    let kind = match labels.get(KIND_LABEL).map(String::as_str) {
        Some("member") => "member",
        Some("table") => "table",
        _ => "shard",
    };
    let annotations = (!annotations.is_empty()).then_some(annotations);
    let lease = Lease {
        metadata: ObjectMeta { name: Some(name.into()), labels: Some(labels), annotations, ..Default::default() },
        spec: Some(spec),
    };
    written(api.create(&PostParams::default(), &lease).await, kind)
}

/// Writes `change` applied to the spec of `read` (as read, possibly [`slim`]), guarded by its resourceVersion: a merge
/// patch of the spec ([`spec_patch`]), so labels and the rest stay as stored; [`Written::Conflict`] if the Lease was
/// written since it was read. `kind` labels the write in [`LEASE_WRITES_TOTAL`].
///
/// Errors: the API server's, except 409; a Lease read without a name or resourceVersion is refused as a 422 before
/// anything is sent.
pub async fn replace(
    api: &Api<Lease>,
    read: &Lease,
    kind: LeaseKind,
    change: impl FnOnce(&mut LeaseSpec),
) -> Result<Written, kube::Error> {
    replace_announcing(api, read, kind, &BTreeMap::new(), change).await
}

/// [`replace`], also setting `annotations` where `read` does not show them already (a membership renewal that announces
/// its shard count: written once, then only when the count changed).
///
/// Errors: as [`replace`].
pub async fn replace_announcing(
    api: &Api<Lease>,
    read: &Lease,
    kind: LeaseKind,
    annotations: &BTreeMap<String, String>,
    change: impl FnOnce(&mut LeaseSpec),
) -> Result<Written, kube::Error> {
    let (Some(name), Some(rv)) = (read.metadata.name.as_deref(), read.metadata.resource_version.as_deref()) else {
        return Err(unguarded());
    };
    let before = read.spec.clone().unwrap_or_default();
    let mut after = before.clone();
    change(&mut after);
    let stored = read.metadata.annotations.clone().unwrap_or_default();
    let missing: BTreeMap<String, String> =
        annotations.iter().filter(|(k, v)| stored.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), v.clone())).collect();
    let patch = spec_patch_announcing(rv, &before, &after, &missing).map_err(kube::Error::SerdeError)?;
    written(api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await, kind.label())
}

/// The error of a write from a Lease without name or resourceVersion: it could not be guarded.
fn unguarded() -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure("a Lease write needs the name and resourceVersion it was read with", "Invalid")
            .with_code(422)
            .boxed(),
    )
}

/// The spec of a membership Lease of `replica` renewed now, lasting `duration_seconds`.
pub fn member_spec(replica: &str, duration_seconds: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(replica.into()),
        lease_duration_seconds: Some(duration_seconds),
        renew_time: Some(now()),
        acquire_time: Some(now()),
        ..Default::default()
    }
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

/// Makes `spec` a renewal now; a membership released or held by another before (a replica starting again under the same
/// id after a graceful stop) is acquired anew: `acquireTime` is now, so it is the youngest member, not the eldest
/// ([`crate::planning::standing`]).
pub fn renew(spec: &mut LeaseSpec, replica: &str, duration_seconds: i32) {
    if spec.holder_identity.as_deref() != Some(replica) {
        spec.acquire_time = Some(now());
    }
    spec.holder_identity = Some(replica.into());
    spec.lease_duration_seconds = Some(duration_seconds);
    spec.renew_time = Some(now());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_kind_is_read_from_the_names_the_fleet_writes_and_nothing_else() {
        assert_eq!(LeaseKind::of("pko", &replica_name("pko", "r-0")), Some(LeaseKind::Replica));
        assert_eq!(LeaseKind::of("pko", &replica_name("pko", "member-1")), Some(LeaseKind::Replica));
        assert_eq!(LeaseKind::of("pko", &table_name("pko", 2048)), Some(LeaseKind::Table(2048)));
        for other in ["pko-shards-", "pko-shards-0", "pko-shards-02", "pko-shards-x", "pko-replica-"] {
            assert_eq!(LeaseKind::of("pko", other), None, "{other}");
        }
        assert_eq!(LeaseKind::Replica.label(), "member");
        assert_eq!(LeaseKind::Table(8).label(), "table");
        assert_eq!(LeaseKind::of("pko", &member_name("pko", "r-0")), Some(LeaseKind::LegacyMember));
        assert_eq!(
            LeaseKind::of("pko", &member_name("pko", "load-shard-3")),
            Some(LeaseKind::LegacyMember),
            "a replica named like a shard"
        );
        assert_eq!(LeaseKind::of("pko", &shard_name("pko", 0)), Some(LeaseKind::LegacyShard(0)));
        assert_eq!(LeaseKind::of("pko", &shard_name("pko", 2047)), Some(LeaseKind::LegacyShard(2047)));
        assert_eq!(
            LeaseKind::of("pko-a", &shard_name("pko-a", 5)),
            Some(LeaseKind::LegacyShard(5)),
            "a fleet name with a dash"
        );
        for other in [
            "pko-shard-",
            "pko-shard-x",
            "pko-shard-07",
            "pko-shard-+7",
            "pko-shard--7",
            "pko-member-",
            "pkoshard-1",
            "other-shard-1",
            "pko-lock-1",
            "pko",
        ] {
            assert_eq!(LeaseKind::of("pko", other), None, "{other}");
        }
        assert_eq!(LeaseKind::LegacyMember.label(), "member");
        assert_eq!(LeaseKind::LegacyShard(3).label(), "shard");
    }

    #[test]
    fn a_slim_lease_keeps_name_namespace_resource_version_and_spec_only() {
        let mut l = Lease {
            metadata: ObjectMeta {
                name: Some("pko-shard-1".into()),
                namespace: Some("ns".into()),
                resource_version: Some("42".into()),
                uid: Some("u".into()),
                labels: Some([(KIND_LABEL.to_string(), "shard".to_string())].into()),
                annotations: Some([("a".to_string(), "b".to_string())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("r-0".into()),
                lease_transitions: Some(3),
                ..Default::default()
            }),
        };
        let spec = l.spec.clone();
        slim(&mut l);
        assert_eq!(
            l.metadata,
            ObjectMeta {
                name: Some("pko-shard-1".into()),
                namespace: Some("ns".into()),
                resource_version: Some("42".into()),
                ..Default::default()
            }
        );
        assert_eq!(l.spec, spec);
        // a membership Lease keeps the count it announces, and nothing else of its annotations
        let mut m = Lease {
            metadata: ObjectMeta {
                name: Some("pko-member-a".into()),
                annotations: Some([("a".to_string(), "b".to_string())].into_iter().chain(announcing(64)).collect()),
                ..Default::default()
            },
            spec: None,
        };
        slim(&mut m);
        assert_eq!(m.metadata.annotations, Some(announcing(64)));
        assert_eq!(announced_shards(&m), Some(64));
        // a table keeps its table
        let table = BTreeMap::from([(crate::table::TABLE_ANNOTATION.to_string(), "{}".to_string())]);
        let mut t = Lease {
            metadata: ObjectMeta {
                annotations: Some(table.clone().into_iter().chain([("a".to_string(), "b".to_string())]).collect()),
                ..Default::default()
            },
            spec: None,
        };
        slim(&mut t);
        assert_eq!(t.metadata.annotations, Some(table));
        for bad in ["0", "-1", "x", ""] {
            m.metadata.annotations = Some([(SHARDS_ANNOTATION.to_string(), bad.to_string())].into());
            assert_eq!(announced_shards(&m), None, "{bad:?}");
        }
    }

    #[test]
    fn a_renewal_of_a_membership_released_or_held_by_another_is_a_new_acquisition() {
        let mut spec = member_spec("a", 15);
        spec.acquire_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        renew(&mut spec, "a", 15);
        assert_eq!(
            spec.acquire_time,
            Some(MicroTime(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
            "a renewal keeps the time it was acquired"
        );
        release(&mut spec);
        renew(&mut spec, "a", 15);
        assert!(
            spec.acquire_time.as_ref().is_some_and(|t| t.0 > k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            "acquired anew after a release"
        );
    }

    #[test]
    fn a_patch_announcing_names_its_annotations_beside_the_guard() {
        let spec = member_spec("a", 15);
        let patch = spec_patch_announcing("7", &spec, &spec, &announcing(32)).expect("a patch");
        assert_eq!(
            patch["metadata"],
            serde_json::json!({"resourceVersion": "7", "annotations": {SHARDS_ANNOTATION: "32"}})
        );
        assert_eq!(
            spec_patch("7", &spec, &spec).expect("a patch")["metadata"],
            serde_json::json!({"resourceVersion": "7"})
        );
    }

    #[test]
    fn a_spec_patch_names_every_field_it_sets_nulls_every_field_it_clears_and_is_guarded() {
        let mut held = LeaseSpec::default();
        take(&mut held, "r-0");
        let mut released = held.clone();
        release(&mut released);
        let patch = spec_patch("17", &held, &released).expect("a patch");
        assert_eq!(patch["metadata"], serde_json::json!({"resourceVersion": "17"}));
        assert_eq!(
            patch["spec"]["holderIdentity"],
            serde_json::Value::Null,
            "cleared: null, or the merge would keep it"
        );
        assert_eq!(patch["spec"]["leaseTransitions"], 1, "the epoch stays");
        assert!(patch["spec"]["renewTime"].is_string());
        assert!(patch["spec"].get("preferredHolder").is_none(), "a field neither had is not named");
        let mut taken = released.clone();
        take(&mut taken, "r-1");
        let patch = spec_patch("18", &released, &taken).expect("a patch");
        assert_eq!(patch["spec"]["holderIdentity"], "r-1");
        assert_eq!(patch["spec"]["leaseTransitions"], 2, "the next epoch");
    }
}
