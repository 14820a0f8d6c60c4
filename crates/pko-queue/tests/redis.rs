//! The Redis work queue against the bed's real redis-server: jobs outlive the replica that queued them,
//! a shard's new holder adopts them, the old holder is fenced out (claim, heartbeat, push), a replica
//! regaining a shard runs a job its fenced driver still held at the new epoch, a Redis
//! that lost everything loses no job, and through Redis Sentinel the queue follows its master across a
//! failover (a master killed, then a forced failover back).

use std::time::Duration;

use pko_queue::redis::RedisQueue;
use pko_queue::{Job, WorkQueue};
use pko_testbed::testbed;

fn job(k: &str, shard: u32, epoch: i64) -> Job {
    Job { key: format!("ns/{k}/uid"), namespace: "ns".into(), name: k.into(), epoch, shard }
}

async fn pop(q: &RedisQueue) -> Job {
    tokio::time::timeout(Duration::from_secs(5), q.pop()).await.expect("a job within 5 s").job
}

async fn nothing(q: &RedisQueue) {
    assert!(tokio::time::timeout(Duration::from_millis(300), q.pop()).await.is_err(), "no job expected");
}

#[tokio::test]
async fn a_new_holder_adopts_queued_and_running_jobs_and_fences_the_old_one() {
    let bed = testbed();
    let prefix = bed.redis_prefix("adopt");
    let a = RedisQueue::new(bed.redis_url(), &prefix, "a", pko_queue::NamespaceLimits::NONE).unwrap();
    a.ping().await.unwrap();
    // a holds shard 3 at epoch 1: two jobs, one of which it starts
    assert!(a.push(job("u1", 3, 1)).await.unwrap());
    assert!(a.push(job("u2", 3, 1)).await.unwrap());
    let running = pop(&a).await;
    assert!(a.heartbeat(&running).await, "a is current");

    // b takes shard 3 at epoch 2 (a was presumed dead): it gets both jobs, the running one too
    let b = RedisQueue::new(bed.redis_url(), &prefix, "b", pko_queue::NamespaceLimits::NONE).unwrap();
    assert_eq!(b.adopt(3, 2).await.unwrap(), 2);
    let mut got = vec![pop(&b).await, pop(&b).await];
    got.sort_by(|x, y| x.key.cmp(&y.key));
    assert_eq!(
        got.iter().map(|j| (j.name.as_str(), j.epoch)).collect::<Vec<_>>(),
        [("u1", 2), ("u2", 2)],
        "adopted at the new epoch"
    );

    // a is fenced: its heartbeat says stop, its claim of the other job fails, its push is refused
    assert!(!a.heartbeat(&running).await, "a's epoch is stale");
    nothing(&a).await;
    assert!(!a.push(job("u3", 3, 1)).await.unwrap(), "a stale push is refused");
    // a's acknowledgement cannot remove b's job: b still finishes and acknowledges it
    a.done(&running).await;
    for j in &got {
        assert!(b.heartbeat(j).await);
        b.done(j).await;
    }
    let c = RedisQueue::new(bed.redis_url(), &prefix, "c", pko_queue::NamespaceLimits::NONE).unwrap();
    assert_eq!(c.adopt(3, 3).await.unwrap(), 0, "nothing left once b acknowledged");
}

#[tokio::test]
async fn a_replica_that_regains_a_shard_while_its_fenced_driver_still_runs_the_job_runs_it_at_the_new_epoch() {
    let bed = testbed();
    let prefix = bed.redis_prefix("regain");
    let a = RedisQueue::new(bed.redis_url(), &prefix, "a", pko_queue::NamespaceLimits::NONE).unwrap();
    a.ping().await.unwrap();
    // a drives u1 of shard 4 at epoch 1 …
    assert!(a.push(job("u1", 4, 1)).await.unwrap());
    let running = pop(&a).await;
    // … loses the shard and takes it again at epoch 2 before that driver has noticed: adopting the
    // shard and the Update's reconcile both push u1 at epoch 2 while the epoch-1 job is in flight
    assert_eq!(a.adopt(4, 2).await.unwrap(), 0, "u1 is here already: not queued twice");
    assert!(!a.push(job("u1", 4, 2)).await.unwrap(), "the key is taken while in flight");
    nothing(&a).await;
    assert!(!a.heartbeat(&running).await, "the epoch-1 driver is fenced");
    // once the fenced driver is done, the job runs again at epoch 2 (it used to vanish here)
    a.done(&running).await;
    let again = pop(&a).await;
    assert_eq!((again.name.as_str(), again.epoch), ("u1", 2));
    assert!(a.heartbeat(&again).await, "claimed in Redis at the new epoch");
    a.done(&again).await;
    nothing(&a).await;
    let b = RedisQueue::new(bed.redis_url(), &prefix, "b", pko_queue::NamespaceLimits::NONE).unwrap();
    assert_eq!(b.adopt(4, 3).await.unwrap(), 0, "acknowledged at epoch 2: nothing left in Redis");
}

#[tokio::test]
async fn jobs_of_other_shards_are_not_adopted_and_dedup_holds_across_replicas() {
    let bed = testbed();
    let prefix = bed.redis_prefix("shards");
    let a = RedisQueue::new(bed.redis_url(), &prefix, "a", pko_queue::NamespaceLimits::NONE).unwrap();
    assert!(a.push(job("x", 1, 1)).await.unwrap());
    assert!(a.push(job("y", 2, 1)).await.unwrap());
    let b = RedisQueue::new(bed.redis_url(), &prefix, "b", pko_queue::NamespaceLimits::NONE).unwrap();
    assert_eq!(b.adopt(2, 2).await.unwrap(), 1, "only shard 2's job");
    let y = pop(&b).await;
    assert_eq!(y.name, "y");
    // a still holds shard 1: its job is its own
    let x = pop(&a).await;
    assert_eq!(x.name, "x");
    // put back for a retry (its class was full), it stays recorded: a later holder still adopts it
    a.retry_after(x, Duration::from_secs(60));
    let c = RedisQueue::new(bed.redis_url(), &prefix, "c", pko_queue::NamespaceLimits::NONE).unwrap();
    assert_eq!(c.adopt(1, 2).await.unwrap(), 1, "a job waiting for its retry moves with its shard");
    b.done(&y).await;
}

#[tokio::test]
async fn a_redis_that_lost_everything_loses_no_job() {
    let bed = testbed();
    let prefix = bed.redis_prefix("flush");
    let a = RedisQueue::new(bed.redis_url(), &prefix, "a", pko_queue::NamespaceLimits::NONE).unwrap();
    assert!(a.push(job("z", 5, 4)).await.unwrap());
    // the keys vanish (as after FLUSHALL or a restart without persistence), only this test's
    let client = redis::Client::open(bed.redis_url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}:*")).query_async(&mut c).await.unwrap();
    assert!(!keys.is_empty());
    let _: i64 = redis::cmd("DEL").arg(&keys).query_async(&mut c).await.unwrap();
    // the queued job still runs (claim records it again), and a later holder adopts it
    let j = pop(&a).await;
    assert_eq!(j.name, "z");
    let b = RedisQueue::new(bed.redis_url(), &prefix, "b", pko_queue::NamespaceLimits::NONE).unwrap();
    assert_eq!(b.adopt(5, 5).await.unwrap(), 1, "the claim recorded the job again");
}

/// Drift-check slots shared by two replicas through Redis: the cap holds across them, a holder renews
/// its own slot, a released or expired slot is free again (expiry by the Redis server's clock).
#[tokio::test]
async fn slots_cap_holders_across_replicas_and_expire() {
    use pko_queue::slots::Slots;
    let bed = testbed();
    let prefix = bed.redis_prefix("slots");
    let (a, b) = (
        RedisQueue::new(bed.redis_url(), &prefix, "a", pko_queue::NamespaceLimits::NONE).unwrap(),
        RedisQueue::new(bed.redis_url(), &prefix, "b", pko_queue::NamespaceLimits::NONE).unwrap(),
    );
    let (sa, sb) = (a.slots("drift", 2), b.slots("drift", 2));
    let lease = Duration::from_secs(60);
    assert!(sa.acquire("ns/one", lease).await.unwrap());
    assert!(sb.acquire("ns/two", lease).await.unwrap());
    assert!(!sb.acquire("ns/three", lease).await.unwrap(), "the cap counts the other replica's holder");
    assert!(!sa.acquire("ns/three", lease).await.unwrap());
    assert!(sa.acquire("ns/two", lease).await.unwrap(), "a holder renews its slot, whichever replica asks");
    assert_eq!(sa.held().await.unwrap(), 2);
    sb.release("ns/one").await.unwrap();
    assert!(sb.acquire("ns/three", Duration::from_millis(200)).await.unwrap(), "a released slot is free");
    assert!(!sa.acquire("ns/four", lease).await.unwrap());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(sa.acquire("ns/four", lease).await.unwrap(), "an expired lease frees its slot (a replica that died)");
    let other = a.slots("other", 1);
    assert!(other.acquire("ns/one", lease).await.unwrap(), "slots of another name are counted apart");
    assert!(a.slots("unlimited", 0).acquire("x", lease).await.unwrap());
}

/// Slots are fair across replicas: a key refused waits in line, and a holder that releases and asks
/// again at once (a schedule as fast as the retry) is refused while a key that waited longer asks.
#[tokio::test]
async fn a_free_slot_goes_to_the_key_that_waited_whichever_replica_asks() {
    use pko_queue::slots::Slots;
    let bed = testbed();
    let prefix = bed.redis_prefix("fair-slots");
    let (a, b) = (
        RedisQueue::new(bed.redis_url(), &prefix, "a", pko_queue::NamespaceLimits::NONE).unwrap(),
        RedisQueue::new(bed.redis_url(), &prefix, "b", pko_queue::NamespaceLimits::NONE).unwrap(),
    );
    let (sa, sb) = (a.slots("drift", 1), b.slots("drift", 1));
    let lease = Duration::from_secs(60);
    assert!(sa.acquire("ns/one", lease).await.unwrap());
    assert!(!sb.acquire("ns/two", lease).await.unwrap(), "taken");
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(!sa.acquire("ns/three", lease).await.unwrap(), "taken");
    sa.release("ns/one").await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    for _ in 0..3 {
        assert!(!sa.acquire("ns/one", lease).await.unwrap(), "two and three waited: the freed slot is theirs");
    }
    assert!(!sb.acquire("ns/three", lease).await.unwrap(), "two waited longer");
    assert!(sb.acquire("ns/two", lease).await.unwrap(), "the first refused is served first");
    sb.release("ns/two").await.unwrap();
    assert!(sa.acquire("ns/three", lease).await.unwrap(), "next in line, asked on the other replica");
    sa.release("ns/three").await.unwrap();
    assert!(sa.acquire("ns/one", lease).await.unwrap(), "its turn");
}

/// A redis-server process (no persistence) on a free loopback port, with `extra` arguments.
struct Server {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(extra: &[&str], sentinel_conf: Option<String>) -> Server {
        // the probe listener is closed before the server binds the port
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        Self::start_on(port, extra, sentinel_conf)
    }

    fn start_on(port: u16, extra: &[&str], sentinel_conf: Option<String>) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = std::process::Command::new("redis-server");
        if let Some(conf) = sentinel_conf {
            // Sentinel rewrites its config file: a private, writable one
            let file = dir.path().join("sentinel.conf");
            std::fs::write(&file, format!("port {port}\nbind 127.0.0.1\ndir {}\n{conf}", dir.path().display()))
                .unwrap();
            cmd.arg(&file).arg("--sentinel");
        } else {
            cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir"])
                .arg(dir.path())
                .args(extra);
        }
        let child = cmd.stdout(std::process::Stdio::null()).spawn().expect("redis-server (the bed's Debian package)");
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < end, "redis-server did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Server { child, port, _dir: dir }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `INFO <section>` (or any command) of this server, through redis-cli.
    fn cli(&self, args: &[&str]) -> String {
        let out =
            std::process::Command::new("redis-cli").args(["-p", &self.port.to_string()]).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn through_sentinel_the_queue_follows_its_master_across_a_failover_and_keeps_queued_jobs() {
    use pko_queue::connect::Target;
    let mut master = Server::start(&[], None);
    let replica = Server::start(&["--replicaof", "127.0.0.1", &master.port.to_string()], None);
    let sentinel = Server::start(
        &[],
        Some(format!(
            "sentinel monitor m 127.0.0.1 {} 1\nsentinel down-after-milliseconds m 1000\nsentinel failover-timeout m \
                10000\nsentinel parallel-syncs m 1\n",
            master.port
        )),
    );
    let target = Target::parse(&sentinel.url(), Some("m")).unwrap();
    let prefix = "sentinel-test";
    let a = RedisQueue::on(&target, prefix, "a", pko_queue::NamespaceLimits::NONE).unwrap();
    a.ping().await.unwrap();
    assert!(a.push(job("u1", 5, 1)).await.unwrap());
    assert!(a.push(job("u2", 5, 1)).await.unwrap());
    let running = pop(&a).await;
    // replicated, and the Sentinel knows the replica
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while !(replica.cli(&["INFO", "replication"]).contains("master_link_status:up")
        && sentinel.cli(&["SENTINEL", "replicas", "m"]).contains(&replica.port.to_string()))
    {
        assert!(std::time::Instant::now() < end, "replica not synced or not known to the Sentinel within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // the master dies; the Sentinel promotes the replica
    let _ = master.child.kill();
    let _ = master.child.wait();
    // what was in Redis before the failover is there: a new holder adopts both jobs from it, once the
    // Sentinel names the promoted master (while the failover runs it names none: an error, retried)
    let t = std::time::Instant::now();
    let b = RedisQueue::on(&target, prefix, "b", pko_queue::NamespaceLimits::NONE).unwrap();
    let adopted = loop {
        match b.adopt(5, 2).await {
            Ok(n) => break n,
            Err(e) => {
                assert!(t.elapsed() < Duration::from_secs(60), "no master through the Sentinel within 60 s: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    eprintln!("queue working on the promoted master {:.1} s after the old one died", t.elapsed().as_secs_f64());
    assert!(replica.cli(&["ROLE"]).starts_with("master"), "the replica was promoted");
    assert_eq!(adopted, 2, "the queued and the running job survived the failover");
    assert!(b.push(job("u3", 5, 2)).await.unwrap(), "and new jobs are recorded on the new master");
    let mut got = vec![pop(&b).await.name, pop(&b).await.name, pop(&b).await.name];
    got.sort();
    assert_eq!(got, ["u1", "u2", "u3"]);
    // the old holder's pool dropped its broken connection and follows the Sentinel too: it reaches the
    // new master and is fenced there (an unreachable Redis would have let it run on from memory)
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while a.heartbeat(&running).await {
        assert!(std::time::Instant::now() < end, "the old holder's queue never reached the new master");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // a failover back while the demoted server lives on (SENTINEL FAILOVER): the Sentinel disconnects
    // its clients, and a connection that would still reach it gets READONLY and is dropped; either way
    // the queue's next write goes to the new master
    let old = Server::start_on(master.port, &[], None);
    drop(master);
    // the Sentinel converts a returning old master only once it has been up for 8 s (4 publish periods)
    // and the new master looks sane, then it syncs in full: seconds, yet once over 60 s on a loaded
    // machine (a CI run); 120 s bounds a stuck Sentinel, not a slow one
    let t = std::time::Instant::now();
    let end = t + Duration::from_secs(120);
    while !(old.cli(&["INFO", "replication"]).contains("master_link_status:up")
        && sentinel.cli(&["SENTINEL", "replicas", "m"]).contains(&format!("{}", old.port)))
    {
        assert!(std::time::Instant::now() < end, "the old master did not rejoin as a replica within 120 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("the old master rejoined as a replica {:.1} s after it restarted", t.elapsed().as_secs_f64());
    assert!(b.push(job("u4", 5, 2)).await.unwrap(), "b has a pooled connection to the current master");
    assert!(sentinel.cli(&["SENTINEL", "FAILOVER", "m"]).contains("OK"));
    let t = std::time::Instant::now();
    let end = t + Duration::from_secs(60);
    while !(old.cli(&["ROLE"]).starts_with("master") && replica.cli(&["ROLE"]).starts_with("slave")) {
        assert!(std::time::Instant::now() < end, "the forced failover did not complete within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pushed = loop {
        match b.push(job("u5", 5, 2)).await {
            Ok(p) => break p,
            Err(e) => {
                assert!(t.elapsed() < Duration::from_secs(60), "b stuck on the demoted server: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(pushed, "recorded on the new master");
    assert!(old.cli(&["KEYS", "sentinel-test:job:*"]).contains("u5"), "u5 is on the promoted server");
    eprintln!("after a forced failover the queue wrote to the new master {:.1} s later", t.elapsed().as_secs_f64());
}

/// What operations printed, in the fleet's Redis: any replica reads what another stored; a line
/// replayed by a new holder attaching is kept once; the last lines of the newest operations are kept.
#[tokio::test]
async fn operation_output_is_shared_by_the_fleet_bounded_and_kept_once() {
    use pko_queue::output::{Limits, Line, OperationInfo, OutputStore};
    let bed = testbed();
    let prefix = bed.redis_prefix("output");
    let limits = Limits { lines: 3, operations: 2, ..Limits::default() };
    let a = RedisQueue::new(bed.redis_url(), &prefix, "a", pko_queue::NamespaceLimits::NONE).unwrap().output(limits);
    let b = RedisQueue::new(bed.redis_url(), &prefix, "b", pko_queue::NamespaceLimits::NONE).unwrap().output(limits);
    let lines = |r: std::ops::Range<u64>| {
        r.map(|s| Line { seq: s, time: "t".into(), stream: "engine".into(), text: format!("l{s}") }).collect::<Vec<_>>()
    };
    let info = |u: &str, ms| OperationInfo { update: u.into(), operation: "up".into(), started_ms: ms };
    a.append("ns/s", &info("u1", 1), &lines(0..2)).await.unwrap();
    let read = b.read("ns/s", "u1", None).await.unwrap().unwrap();
    assert_eq!(read.lines, lines(0..2), "another replica reads what one stored");
    assert!(!read.truncated);
    b.append("ns/s", &info("u1", 1), &lines(0..4)).await.unwrap();
    let read = a.read("ns/s", "u1", None).await.unwrap().unwrap();
    assert_eq!(read.lines, lines(1..4), "replayed lines kept once, the last 3");
    assert!(read.truncated);
    assert_eq!(a.read("ns/s", "u1", Some(2)).await.unwrap().unwrap().lines, lines(3..4), "after a sequence");
    a.append("ns/s", &info("u2", 2), &lines(0..1)).await.unwrap();
    a.append("ns/s", &info("u3", 3), &lines(0..1)).await.unwrap();
    let names: Vec<String> = b.operations("ns/s").await.unwrap().into_iter().map(|i| i.update).collect();
    assert_eq!(names, ["u3", "u2"], "the newest 2, newest first");
    assert_eq!(b.read("ns/s", "u1", None).await.unwrap(), None, "the oldest is gone, stream and all");
    assert_eq!(b.operations("ns/other").await.unwrap(), vec![]);
}

/// Saved plans in the fleet's Redis: any replica reads the plan another kept, bytes and all; a Stack keeps only its
/// latest plan; the key expires.
#[tokio::test]
async fn a_saved_plan_is_read_by_any_replica_and_replaced_by_the_next() {
    use pko_queue::plans::{PLAN_TTL_SECONDS, PlanMeta, PlanStore, SavedPlan};
    let bed = testbed();
    let prefix = bed.redis_prefix("plans");
    let a = RedisQueue::new(bed.redis_url(), &prefix, "a", pko_queue::NamespaceLimits::NONE).unwrap().plans();
    let b = RedisQueue::new(bed.redis_url(), &prefix, "b", pko_queue::NamespaceLimits::NONE).unwrap().plans();
    let plan = |id: &str, bytes: &[u8]| SavedPlan {
        meta: PlanMeta {
            id: id.into(),
            update: format!("s-{id}"),
            run_digest: "sha256:ab".into(),
            revision: "c0ffee".into(),
            saved: "2026-11-28T20:00:00Z".into(),
        },
        bytes: bytes.to_vec(),
    };
    assert_eq!(b.get("ns/s").await.unwrap(), None);
    let first = plan("1111111111111111", b"{\"a\":\x00\xff}");
    a.put("ns/s", &first).await.unwrap();
    assert_eq!(b.get("ns/s").await.unwrap(), Some(first), "another replica reads it, binary bytes intact");
    let second = plan("2222222222222222", b"{}");
    b.put("ns/s", &second).await.unwrap();
    assert_eq!(a.get("ns/s").await.unwrap(), Some(second), "the next plan replaces it");
    assert_eq!(a.get("ns/t").await.unwrap(), None, "per Stack");
    let ttl = std::process::Command::new("redis-cli")
        .args(["-u", bed.redis_url(), "TTL", &format!("{prefix}:plan:ns/s")])
        .output()
        .unwrap();
    let ttl: u64 = String::from_utf8_lossy(&ttl.stdout).trim().parse().unwrap();
    assert!(ttl > PLAN_TTL_SECONDS - 60 && ttl <= PLAN_TTL_SECONDS, "expires in 7 days, not {ttl} s");
}
