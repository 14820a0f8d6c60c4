//! Work-queue throughput (`cargo bench -p pko-queue --bench queue_throughput`): jobs pushed, popped
//! (claimed) and acknowledged per second, side by side in one run, on
//! - the in-memory queue (one replica without Redis),
//! - the Redis queue against the test bed's real redis-server, one replica,
//! - the Redis queue, three replicas sharing the Redis, each with its own shards.
//!
//! `JOBS` (default 20000) jobs over 100 namespaces, `CONSUMERS` (default 64) concurrent consumers per
//! replica (the operator's workers). A dispatch here is the queue's part only: push → claim → ack.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pko_queue::redis::RedisQueue;
use pko_queue::{InMemoryQueue, Job, WorkQueue};

fn jobs(n: usize, shard_of: impl Fn(usize) -> u32) -> Vec<Job> {
    (0..n)
        .map(|i| Job {
            key: format!("ns{}/u{i}/uid", i % 100),
            namespace: format!("ns{}", i % 100),
            name: format!("u{i}"),
            epoch: 1,
            shard: shard_of(i),
        })
        .collect()
}

/// Pushes `jobs` to `q`, then `consumers` tasks pop and acknowledge until all are done; returns
/// (push seconds, pop+ack seconds).
async fn drive(q: Arc<dyn WorkQueue>, jobs: Vec<Job>, consumers: usize) -> (f64, f64) {
    let n = jobs.len();
    let t = Instant::now();
    let mut pushes = Vec::new();
    for chunk in jobs.chunks(n.div_ceil(consumers).max(1)) {
        let (q, chunk) = (q.clone(), chunk.to_vec());
        pushes.push(tokio::spawn(async move {
            for j in chunk {
                q.push(j).await.expect("push");
            }
        }));
    }
    for p in pushes {
        p.await.unwrap();
    }
    let pushed = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let left = Arc::new(std::sync::atomic::AtomicUsize::new(n));
    let mut tasks = Vec::new();
    for _ in 0..consumers {
        let (q, left) = (q.clone(), left.clone());
        tasks.push(tokio::spawn(async move {
            while left.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                let Ok(c) = tokio::time::timeout(Duration::from_millis(200), q.pop()).await else { continue };
                q.done(&c.job).await;
                left.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    (pushed, t.elapsed().as_secs_f64())
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("queue_throughput: run with `cargo bench` (it times the queues against the bed's redis-server)");
        return;
    }
    let (n, consumers) = (env_usize("JOBS", 20_000), env_usize("CONSUMERS", 64));
    let bed = pko_testbed::testbed();
    println!("jobs={n} consumers_per_replica={consumers} (push, then claim+ack; jobs per second)");

    let show = |what: &str, p: f64, d: f64| {
        println!(
            "{what:<18} push {:>8.0}/s  claim+ack {:>8.0}/s  all in {:>8.0}/s",
            n as f64 / p,
            n as f64 / d,
            n as f64 / (p + d)
        )
    };
    let (p, d) = drive(Arc::new(InMemoryQueue::new(pko_queue::NamespaceLimits::NONE)), jobs(n, |_| 0), consumers).await;
    show("in-memory", p, d);

    let prefix = bed.redis_prefix("bench1");
    let q = RedisQueue::new(bed.redis_url(), &prefix, "r0", pko_queue::NamespaceLimits::NONE).expect("redis queue");
    q.ping().await.expect("the bed's redis-server answers");
    let (p, d) = drive(Arc::new(q), jobs(n, |i| (i % 64) as u32), consumers).await;
    show("redis, 1 replica", p, d);
    let one = n as f64 / (p + d);

    // three replicas, shards split three ways, driven at once
    let prefix = bed.redis_prefix("bench3");
    let t = Instant::now();
    let mut runs = Vec::new();
    for r in 0..3u32 {
        let q = RedisQueue::new(bed.redis_url(), &prefix, &format!("r{r}"), pko_queue::NamespaceLimits::NONE)
            .expect("redis queue");
        let part: Vec<Job> = jobs(n, |i| (i % 64) as u32).into_iter().filter(|j| j.shard % 3 == r).collect();
        runs.push(tokio::spawn(drive(Arc::new(q), part, consumers)));
    }
    for r in runs {
        r.await.unwrap();
    }
    let three = n as f64 / t.elapsed().as_secs_f64();
    println!("{:<18} all in {three:>8.0}/s ({:.2}x one replica, side by side)", "redis, 3 replicas", three / one);
    let _ = redis_cleanup(bed.redis_url(), &["bench1", "bench3"]);
}

/// Deletes the benchmark's keys (`pko-test:bench*`).
fn redis_cleanup(url: &str, _names: &[&str]) -> std::io::Result<()> {
    let keys =
        std::process::Command::new("redis-cli").args(["-u", url, "--scan", "--pattern", "pko-test:bench*"]).output()?;
    for chunk in String::from_utf8_lossy(&keys.stdout).lines().collect::<Vec<_>>().chunks(500) {
        std::process::Command::new("redis-cli").args(["-u", url, "del"]).args(chunk).output()?;
    }
    Ok(())
}
