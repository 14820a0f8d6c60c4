//! The fleet's membership against the real API server: replicas split the shards with no shard held
//! twice, write nothing but their renewals at rest, hand shards over within a second on a graceful
//! stop in a few writes of the shard table (not one per shard), take a crashed replica's shards after
//! its lease expires, rebalance when one joins, and wait for a replica of an earlier version (one
//! Lease per shard) to be gone before taking anything, above its epochs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::watcher;
use pko_fleet::Ownership;
use pko_fleet::membership::{Fleet, FleetConfig, ShardOwnership};
use pko_fleet::ring::BoundedRing;
use pko_testbed::{eventually, testbed};
use tokio_util::sync::CancellationToken;

const SHARDS: u32 = 64;

struct Replica {
    name: String,
    ownership: ShardOwnership,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn config(ns: &str, replica: &str) -> FleetConfig {
    counted(ns, replica, SHARDS)
}

/// A replica's config with `shards` virtual shards.
fn counted(ns: &str, replica: &str, shards: u32) -> FleetConfig {
    // shorter than production (15 s / 5 s / 10 s) to keep the test short; same ratios
    FleetConfig {
        lease_duration: Duration::from_secs(6),
        renew_interval: Duration::from_secs(2),
        renew_deadline: Duration::from_secs(4),
        ..FleetConfig::new(ns, "pko", replica, shards)
    }
}

async fn start(client: &kube::Client, ns: &str, name: &str) -> Replica {
    start_config(client, config(ns, name))
}

fn start_config(client: &kube::Client, cfg: FleetConfig) -> Replica {
    let name = cfg.replica.clone();
    let (fleet, ownership) = Fleet::new(client.clone(), cfg, Arc::new(BoundedRing::default()));
    let stop = CancellationToken::new();
    let task = tokio::spawn(fleet.run(stop.clone()));
    Replica { name, ownership, stop, task }
}

/// Shard → (holders, epoch) over `replicas`, as each replica's ownership says now.
fn holders(replicas: &[&Replica]) -> BTreeMap<u32, Vec<(String, i64)>> {
    let mut out: BTreeMap<u32, Vec<(String, i64)>> = BTreeMap::new();
    for r in replicas {
        let held = r.ownership.changes().borrow().clone();
        for (k, _) in held.shards.iter() {
            if let Some(e) = held.epoch(*k) {
                out.entry(*k).or_default().push((r.name.clone(), e));
            }
        }
    }
    out
}

/// Every shard held by exactly one of `replicas`.
fn split(replicas: &[&Replica]) -> bool {
    let h = holders(replicas);
    h.len() == SHARDS as usize && h.values().all(|v| v.len() == 1)
}

#[tokio::test]
async fn replicas_split_shards_hand_over_on_stop_and_take_over_after_a_crash() {
    let bed = testbed();
    let client = bed.client().await.unwrap();
    let ns = bed.namespace("fleet").await.unwrap();
    let ns = ns.name().to_string();

    // a watch on the namespace's Leases counts every write from here on, and checks at each event
    // that no shard is held twice
    let writes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = writes.clone();
    let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), &ns);
    let watch = tokio::spawn(watcher(leases, watcher::Config::default()).for_each(move |e| {
        if let Ok(watcher::Event::Apply(_)) = e {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        async {}
    }));

    let a = start(&client, &ns, "a").await;
    let b = start(&client, &ns, "b").await;
    let c = start(&client, &ns, "c").await;
    eventually("a, b and c split the shards", 60, || async { split(&[&a, &b, &c]) }).await;
    let h = holders(&[&a, &b, &c]);
    let per: BTreeMap<String, usize> = h.values().fold(BTreeMap::new(), |mut m, v| {
        *m.entry(v[0].0.clone()).or_default() += 1;
        m
    });
    eprintln!("shards per replica: {per:?}");
    assert!(per.values().all(|n| *n as f64 <= 1.15 * SHARDS as f64 / 3.0), "{per:?}");
    assert!(
        a.ownership.owns("x", "y") ^ b.ownership.owns("x", "y") ^ c.ownership.owns("x", "y"),
        "an object is owned by exactly one replica"
    );

    // at rest: only membership renewals (3 replicas, one every 2 s)
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = writes.load(std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let at_rest = writes.load(std::sync::atomic::Ordering::Relaxed) - before;
    eprintln!("writes at rest: {at_rest} in 10 s by 3 replicas ({:.2}/s per replica)", at_rest as f64 / 30.0);
    assert!(at_rest <= 3 * 6, "{at_rest} writes in 10 s");
    assert!(split(&[&a, &b, &c]), "nothing moved at rest");

    // graceful stop of c: a and b hold everything within 5 s, each moved shard exactly one epoch
    // later (taken once; a second write by the taker would bump it again), in a few writes: c's
    // membership released, one table write per survivor (two after a 409), renewals meanwhile
    let epochs_before: BTreeMap<u32, i64> = holders(&[&c]).into_iter().map(|(k, v)| (k, v[0].1)).collect();
    let w = writes.load(std::sync::atomic::Ordering::Relaxed);
    let t = Instant::now();
    c.stop.cancel();
    let _ = c.task.await;
    eventually("a and b hold c's shards", 10, || async { split(&[&a, &b]) }).await;
    let handoff = t.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let handoff_writes = writes.load(std::sync::atomic::Ordering::Relaxed) - w;
    eprintln!(
        "handoff after a graceful stop: {:.1} s ({} shards, {handoff_writes} Lease writes)",
        handoff.as_secs_f64(),
        epochs_before.len()
    );
    assert!(handoff <= Duration::from_secs(5), "handoff took {handoff:?}");
    assert!(
        handoff_writes <= 8 && handoff_writes < epochs_before.len(),
        "{handoff_writes} Lease writes to hand over {} shards",
        epochs_before.len()
    );
    let now = holders(&[&a, &b]);
    for (k, e) in &epochs_before {
        assert_eq!(now[k][0].1, e + 1, "shard {k}: epoch {} after {e}", now[k][0].1);
    }

    // crash of b (its task dies without releasing anything): a holds everything once b's lease expired
    let t = Instant::now();
    b.task.abort();
    let _ = b.task.await;
    eventually("a holds every shard", 30, || async { split(&[&a]) }).await;
    let failover = t.elapsed();
    eprintln!("failover after a crash: {:.1} s (lease duration 6 s)", failover.as_secs_f64());
    assert!(failover >= Duration::from_secs(4), "b's shards were taken before its lease could expire: {failover:?}");

    // a replica joins: it gets its share, released by a
    let d = start(&client, &ns, "d").await;
    eventually("a and d split the shards", 30, || async {
        split(&[&a, &d]) && holders(&[&d]).len() >= SHARDS as usize / 3
    })
    .await;
    a.stop.cancel();
    d.stop.cancel();
    let _ = (a.task.await, d.task.await);
    watch.abort();
}

/// A replica of an earlier version (a `<fleet>-member-<id>` membership and one `<fleet>-shard-<k>` Lease
/// per shard, written here by hand as it wrote them) is live: a replica of this version stands by —
/// holds nothing, writes no table — for as long as it renews; once it has left (its membership
/// released, as its graceful stop does) every shard is taken through the table, each one epoch above
/// the earlier version's Lease of that shard, so fencing tokens keep rising across the upgrade.
#[tokio::test]
async fn a_replica_of_an_earlier_version_is_waited_for_and_its_epochs_are_exceeded() {
    use pko_fleet::lease::{self, LeaseKind, Written};
    use pko_fleet::planning::Standing;
    let bed = testbed();
    let client = bed.client().await.unwrap();
    let ns = bed.namespace("fleet-upgrade").await.unwrap();
    let api: kube::Api<Lease> = kube::Api::namespaced(client.clone(), ns.name());
    let labels = |kind: &str| -> BTreeMap<String, String> {
        [(lease::FLEET_LABEL.into(), "pko".into()), (lease::KIND_LABEL.into(), kind.into())].into()
    };
    let Written::Done(old) =
        lease::create(&api, &lease::member_name("pko", "old"), labels("member"), lease::member_spec("old", 6))
            .await
            .unwrap()
    else {
        panic!("created")
    };
    for k in 0..SHARDS {
        let mut spec = k8s_openapi::api::coordination::v1::LeaseSpec {
            lease_transitions: Some(4 + (k % 3) as i32),
            ..Default::default()
        };
        lease::take(&mut spec, "old");
        let mut l = labels("shard");
        l.insert(lease::SHARD_LABEL.into(), k.to_string());
        assert!(matches!(lease::create(&api, &lease::shard_name("pko", k), l, spec).await.unwrap(), Written::Done(_)));
    }
    let a = start(&client, ns.name(), "a").await;
    eventually("a stands by for the earlier version", 20, || async {
        matches!(&*a.ownership.standing().borrow(), Standing::Earlier { member } if member == "old")
    })
    .await;
    // the earlier replica renews (every 2 s) for 8 s: a holds nothing and writes no table
    let mut old = *old;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(8) {
        lease::slim(&mut old);
        let Written::Done(renewed) =
            lease::replace(&api, &old, LeaseKind::LegacyMember, |s| lease::renew(s, "old", 6)).await.unwrap()
        else {
            panic!("renewed")
        };
        old = *renewed;
        for _ in 0..40 {
            assert_eq!(held(&a), 0, "a holds shards while a replica of the earlier version is live");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(
        api.get_opt(&lease::table_name("pko", SHARDS)).await.unwrap().is_none(),
        "no table written while standing by"
    );
    // the earlier replica stops gracefully: its membership released
    lease::slim(&mut old);
    assert!(matches!(
        lease::replace(&api, &old, LeaseKind::LegacyMember, lease::release).await.unwrap(),
        Written::Done(_)
    ));
    eventually("a holds every shard", 20, || async { held(&a) == SHARDS as usize }).await;
    assert_eq!(*a.ownership.standing().borrow(), Standing::Active);
    let h = holders(&[&a]);
    for k in 0..SHARDS {
        // the earlier Lease's epoch: 4 + k % 3, taken once by `old` (one transition more)
        assert_eq!(h[&k][0].1, 4 + i64::from(k % 3) + 2, "shard {k}: one epoch above the earlier version's Lease");
    }
    a.stop.cancel();
    let _ = a.task.await;
}

/// A shard table whose annotation does not decode (only a hand edit makes one) is never overwritten:
/// the replica takes and releases nothing from it, and takes its shards once the table reads again.
#[tokio::test]
async fn a_shard_table_that_does_not_decode_is_left_as_it_is_until_it_reads_again() {
    use pko_fleet::lease::{self, Written};
    use pko_fleet::table::{ShardTable, TABLE_ANNOTATION};
    let bed = testbed();
    let client = bed.client().await.unwrap();
    let ns = bed.namespace("fleet-badtable").await.unwrap();
    let api: kube::Api<Lease> = kube::Api::namespaced(client.clone(), ns.name());
    let name = lease::table_name("pko", SHARDS);
    let labels: BTreeMap<String, String> =
        [(lease::FLEET_LABEL.into(), "pko".into()), (lease::KIND_LABEL.into(), "table".into())].into();
    let Written::Done(_) = lease::create(&api, &name, labels, Default::default()).await.unwrap() else {
        panic!("created")
    };
    let garbled = serde_json::json!({"metadata": {"annotations": {TABLE_ANNOTATION: "{\"r-0\": [[0, 1]]"}}});
    api.patch(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&garbled)).await.unwrap();
    let a = start(&client, ns.name(), "a").await;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(4) {
        assert_eq!(held(&a), 0, "a holds shards of a table it cannot read");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stored = api.get(&name).await.unwrap();
    assert_eq!(
        stored.metadata.annotations.as_ref().and_then(|m| m.get(TABLE_ANNOTATION)).map(String::as_str),
        Some("{\"r-0\": [[0, 1]]"),
        "the table is not overwritten"
    );
    let mended = serde_json::json!({"metadata": {"annotations": {TABLE_ANNOTATION: ShardTable::default().encode()}}});
    api.patch(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&mended)).await.unwrap();
    eventually("a holds every shard once the table reads", 20, || async { held(&a) == SHARDS as usize }).await;
    a.stop.cancel();
    let _ = a.task.await;
}

/// Writes from a slim cached Lease are merge patches of the spec guarded by the resourceVersion read:
/// a stale read changes nothing (409), a fresh one changes the spec and keeps the labels as stored.
#[tokio::test]
async fn a_lease_write_from_a_stale_read_changes_nothing_and_a_fresh_one_keeps_the_labels() {
    use pko_fleet::lease::{self, LeaseKind, Written};
    let bed = testbed();
    let client = bed.client().await.unwrap();
    let ns = bed.namespace("fleet-lease").await.unwrap();
    let api: kube::Api<Lease> = kube::Api::namespaced(client.clone(), ns.name());
    let name = lease::shard_name("pko", 3);
    let labels: BTreeMap<String, String> = [
        (lease::FLEET_LABEL.into(), "pko".into()),
        (lease::KIND_LABEL.into(), "shard".into()),
        (lease::SHARD_LABEL.into(), "3".into()),
    ]
    .into();
    let mut spec = Default::default();
    lease::take(&mut spec, "r-0");
    let Written::Done(created) = lease::create(&api, &name, labels.clone(), spec).await.unwrap() else {
        panic!("created")
    };
    let mut stale = *created;
    lease::slim(&mut stale);

    let Written::Done(released) =
        lease::replace(&api, &stale, LeaseKind::LegacyShard(3), lease::release).await.unwrap()
    else {
        panic!("a fresh read is written")
    };
    assert_eq!(lease::holder(&released), None, "released: the holder is gone, not merged back");
    assert_eq!(lease::transitions(&released), 1, "the epoch stays");
    assert_eq!(released.metadata.labels.as_ref(), Some(&labels), "the labels as stored");

    // the same read again: someone (this write) changed the Lease since
    let again = lease::replace(&api, &stale, LeaseKind::LegacyShard(3), |s| lease::take(s, "r-1")).await.unwrap();
    assert_eq!(again, Written::Conflict);
    let stored = api.get(&name).await.unwrap();
    assert_eq!(lease::holder(&stored), None, "the stale write changed nothing");
    assert_eq!(lease::transitions(&stored), 1);
    let mut fresh = stored.clone();
    lease::slim(&mut fresh);
    let Written::Done(taken) =
        lease::replace(&api, &fresh, LeaseKind::LegacyShard(3), |s| lease::take(s, "r-1")).await.unwrap()
    else {
        panic!("taken")
    };
    assert_eq!((lease::holder(&taken), lease::transitions(&taken)), (Some("r-1"), 2));
}

/// The shards `r` holds validly now.
fn held(r: &Replica) -> usize {
    let h = r.ownership.changes().borrow().clone();
    h.shards.keys().filter(|k| h.epoch(**k).is_some()).count()
}

/// A replica started with another `--shards` than its fleet's stands by — holds nothing, writes no
/// shard Lease — while the eldest live member runs the old count; once the last replica of the old
/// count has gone it takes every shard of its own count, never while a replica of the old count
/// still held one; and a replica of the old count started late stands by in turn. Sampled every
/// 50 ms: never both counts holding shards at once.
#[tokio::test]
async fn a_replica_of_another_shard_count_stands_by_until_the_eldest_count_has_gone() {
    use pko_fleet::planning::Standing;
    let bed = testbed();
    let client = bed.client().await.unwrap();
    let ns = bed.namespace("fleet-count").await.unwrap();
    let ns = ns.name().to_string();

    let a = start_config(&client, counted(&ns, "a", 16));
    eventually("a holds its 16 shards", 30, || async { held(&a) == 16 }).await;
    let b = start_config(&client, counted(&ns, "b", 32));
    eventually("b stands by for 16", 20, || async {
        matches!(&*b.ownership.standing().borrow(), Standing::StandingBy { prevailing: 16, eldest } if eldest == "a")
    })
    .await;
    assert_eq!(*a.ownership.standing().borrow(), Standing::Active, "the eldest's count prevails");
    // three renewals: b takes nothing, a keeps everything
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(6) {
        assert_eq!((held(&a), held(&b)), (16, 0), "while a runs 16 shards");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), &ns);
    assert!(
        leases.get_opt(&pko_fleet::lease::table_name("pko", 32)).await.unwrap().is_none(),
        "b wrote no table of its count"
    );
    let table_16 = leases.get(&pko_fleet::lease::table_name("pko", 16)).await.unwrap();
    let annotation = table_16
        .metadata
        .annotations
        .unwrap_or_default()
        .remove(pko_fleet::table::TABLE_ANNOTATION)
        .unwrap_or_default();
    let table_16 = pko_fleet::table::ShardTable::decode(&annotation).unwrap();
    assert!(table_16.0.values().all(|e| e.holder.as_deref() == Some("a")), "a holds all 16 in its count's table");
    let member_b = leases.get(&pko_fleet::lease::replica_name("pko", "b")).await.unwrap();
    assert_eq!(pko_fleet::lease::announced_shards(&member_b), Some(32), "b's membership announces its count");

    // a stops gracefully: b takes its 32 shards, never while a holds one
    let t = Instant::now();
    a.stop.cancel();
    loop {
        let (ha, hb) = (held(&a), held(&b));
        assert!(ha == 0 || hb == 0, "both counts hold shards: a {ha}, b {hb}");
        if hb == 32 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "b holds {hb} of 32 shards 20 s after a stopped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "the new count took over {:.1} s after the last replica of the old one stopped",
        t.elapsed().as_secs_f64()
    );
    let _ = a.task.await;
    assert_eq!(*b.ownership.standing().borrow(), Standing::Active);

    // a replica of the old count started late: b is the eldest now, so it stands by
    let late = start_config(&client, counted(&ns, "a-late", 16));
    eventually("the late replica stands by for 32", 20, || async {
        matches!(&*late.ownership.standing().borrow(), Standing::StandingBy { prevailing: 32, .. })
    })
    .await;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(4) {
        assert_eq!((held(&b), held(&late)), (32, 0));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for r in [b, late] {
        r.stop.cancel();
        let _ = r.task.await;
    }
}

/// A membership Lease that does not announce the shard count (written by hand, or by a tool) gains the
/// announcement through its next renewal — a guarded merge patch that keeps its labels — and keeps it
/// through later renewals.
#[tokio::test]
async fn a_renewal_announces_the_shard_count_on_a_membership_lease_that_lacks_it() {
    use pko_fleet::lease::{self, LeaseKind, Written};
    let bed = testbed();
    let client = bed.client().await.unwrap();
    let ns = bed.namespace("fleet-announce").await.unwrap();
    let api: kube::Api<Lease> = kube::Api::namespaced(client.clone(), ns.name());
    let name = lease::replica_name("pko", "r-0");
    let labels: BTreeMap<String, String> =
        [(lease::FLEET_LABEL.into(), "pko".into()), (lease::KIND_LABEL.into(), "member".into())].into();
    let Written::Done(old) = lease::create(&api, &name, labels.clone(), lease::member_spec("r-0", 15)).await.unwrap()
    else {
        panic!("created")
    };
    assert_eq!(lease::announced_shards(&old), None, "a Lease written without the announcement");
    let mut read = *old;
    lease::slim(&mut read);
    let Written::Done(renewed) =
        lease::replace_announcing(&api, &read, LeaseKind::Replica, &lease::announcing(64), |s| {
            lease::renew(s, "r-0", 15)
        })
        .await
        .unwrap()
    else {
        panic!("renewed")
    };
    assert_eq!(lease::announced_shards(&renewed), Some(64), "the renewal announced the count");
    assert_eq!(renewed.metadata.labels.as_ref(), Some(&labels), "the labels as stored");
    assert_eq!(
        renewed.spec.as_ref().and_then(|s| s.acquire_time.clone()),
        read.spec.as_ref().and_then(|s| s.acquire_time.clone()),
        "held all along: not acquired anew"
    );
    let mut read = *renewed;
    lease::slim(&mut read);
    let Written::Done(again) =
        lease::replace_announcing(&api, &read, LeaseKind::Replica, &lease::announcing(64), |s| {
            lease::renew(s, "r-0", 15)
        })
        .await
        .unwrap()
    else {
        panic!("renewed again")
    };
    assert_eq!(lease::announced_shards(&again), Some(64));
}
