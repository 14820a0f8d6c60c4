//! Handoff and failover of the fleet's shards at the default shard count, against the bed's real API
//! server: three in-process members (`pko_fleet::membership::Fleet`, the operator's code), 2,048
//! shards, 8 s leases (renewals every 8/3 s, renew deadline 16/3 s: production's ratios).
//!
//! Rounds, each from a settled fleet of a, b and c:
//! - **handoff**: c stops gracefully (as on SIGTERM: it holds nothing, then releases its membership);
//!   timed until a and b hold every shard (from their published holdings). c then starts again and the
//!   fleet rebalances (**join**, timed until c holds its share and every shard is held once).
//! - **failover**: c's task is aborted (as on SIGKILL: nothing released); timed until a and b hold
//!   every shard, then c rejoins.
//!
//! Every Lease write of the namespace is counted by a watch, per phase; at rest (10 s, settled) too.
//! Prints min / median / max per phase and the writes per phase. `ROUNDS` (default 10) rounds of each.
//! Run: `cargo bench -p pko-fleet --bench fleet_handoff`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::watcher;
use pko_fleet::membership::{Fleet, FleetConfig, ShardOwnership};
use pko_fleet::ring::BoundedRing;
use tokio_util::sync::CancellationToken;

const SHARDS: u32 = pko_fleet::DEFAULT_SHARDS;

struct Replica {
    name: String,
    ownership: ShardOwnership,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn start(client: &kube::Client, ns: &str, name: &str) -> Replica {
    let cfg = FleetConfig {
        lease_duration: Duration::from_secs(8),
        renew_interval: Duration::from_millis(2_667),
        renew_deadline: Duration::from_millis(5_333),
        ..FleetConfig::new(ns, "pko", name, SHARDS)
    };
    let (fleet, ownership) = Fleet::new(client.clone(), cfg, Arc::new(BoundedRing::default()));
    let stop = CancellationToken::new();
    let task = tokio::spawn(fleet.run(stop.clone()));
    Replica { name: name.into(), ownership, stop, task }
}

/// Shard → holders among `replicas`, by their published, valid holdings.
fn holders(replicas: &[&Replica]) -> BTreeMap<u32, Vec<String>> {
    let mut out: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for r in replicas {
        let held = r.ownership.changes().borrow().clone();
        for k in held.shards.keys().filter(|k| held.epoch(**k).is_some()) {
            out.entry(*k).or_default().push(r.name.clone());
        }
    }
    out
}

/// Every shard held by exactly one of `replicas`, each holding at least `min_each`.
fn split(replicas: &[&Replica], min_each: usize) -> bool {
    let h = holders(replicas);
    let each = replicas.iter().all(|r| h.values().filter(|v| v[0] == r.name).count() >= min_each);
    h.len() == SHARDS as usize && h.values().all(|v| v.len() == 1) && each
}

/// Waits (polling every 10 ms) until `check`; the time it took, or `None` after `limit`.
async fn until(limit: Duration, check: impl Fn() -> bool) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if check() {
            return Some(t.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

fn summary(name: &str, times: &[Duration], writes: &[usize]) {
    let mut s: Vec<f64> = times.iter().map(Duration::as_secs_f64).collect();
    s.sort_by(f64::total_cmp);
    let mut w = writes.to_vec();
    w.sort_unstable();
    match (s.first(), s.get(s.len() / 2), s.last(), w.first(), w.get(w.len() / 2), w.last()) {
        (Some(min), Some(med), Some(max), Some(wmin), Some(wmed), Some(wmax)) => {
            println!(
                "{name:<9} {:>2} rounds  {min:6.2} / {med:6.2} / {max:6.2} s   Lease writes {wmin} / {wmed} / {wmax}",
                s.len()
            )
        }
        _ => println!("{name:<9} no round completed"),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let bed = pko_testbed::testbed();
    let client = bed.client().await?;
    let ns = bed.namespace("bench-handoff").await?;
    let ns = ns.name().to_string();
    let writes = Arc::new(AtomicUsize::new(0));
    let counter = writes.clone();
    let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), &ns);
    let watch = tokio::spawn(watcher(leases, watcher::Config::default()).for_each(move |e| {
        if let Ok(watcher::Event::Apply(_)) = e {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        async {}
    }));
    let settle = Duration::from_secs(120);
    let share = SHARDS as usize / 4; // a fair third is 682; the ring's bounds keep each above this
    let t = Instant::now();
    let (a, b) = (start(&client, &ns, "a"), start(&client, &ns, "b"));
    let mut c = start(&client, &ns, "c");
    until(settle, || split(&[&a, &b, &c], share)).await.ok_or_else(|| anyhow::anyhow!("the fleet did not form"))?;
    println!(
        "formation of 3 replicas at S = {SHARDS}: {:.2} s, {} Lease writes",
        t.elapsed().as_secs_f64(),
        writes.load(Ordering::Relaxed)
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let w0 = writes.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(10)).await;
    println!("at rest: {:.2} Lease writes/s per replica", (writes.load(Ordering::Relaxed) - w0) as f64 / 30.0);

    let (mut handoff, mut handoff_w, mut join, mut join_w, mut failover, mut failover_w) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for round in 0..rounds * 2 {
        let crash = round >= rounds;
        let w = writes.load(Ordering::Relaxed);
        let t = Instant::now();
        if crash {
            c.task.abort();
        } else {
            c.stop.cancel();
        }
        let _ = (&mut c.task).await;
        if until(settle, || split(&[&a, &b], share)).await.is_none() {
            anyhow::bail!("round {round}: a and b did not take c's shards");
        }
        let took = t.elapsed(); // from the stop or the kill
        tokio::time::sleep(Duration::from_millis(300)).await; // writes still in flight are counted
        let (list, wlist) = if crash { (&mut failover, &mut failover_w) } else { (&mut handoff, &mut handoff_w) };
        list.push(took);
        wlist.push(writes.load(Ordering::Relaxed) - w);
        let w = writes.load(Ordering::Relaxed);
        c = start(&client, &ns, "c");
        let Some(joined) = until(settle, || split(&[&a, &b, &c], share)).await else {
            anyhow::bail!("round {round}: c did not rejoin")
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        join.push(joined);
        join_w.push(writes.load(Ordering::Relaxed) - w);
        eprintln!(
            "round {round:>2} ({}): moved in {:.2} s, rejoined in {:.2} s",
            if crash { "SIGKILL" } else { "SIGTERM" },
            took.as_secs_f64(),
            joined.as_secs_f64()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    println!("\nS = {SHARDS}, 3 replicas, lease 8 s; min / median / max");
    summary("handoff", &handoff, &handoff_w);
    summary("failover", &failover, &failover_w);
    summary("join", &join, &join_w);
    for r in [a, b, c] {
        r.stop.cancel();
        let _ = r.task.await;
    }
    watch.abort();
    Ok(())
}
