//! The Redis work queue against the bed's real redis-server: jobs outlive the replica that queued them,
//! a shard's new holder adopts them, the old holder is fenced out (claim, heartbeat, push), and a Redis
//! that lost everything loses no job.

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
    let a = RedisQueue::new(bed.redis_url(), &prefix, "a", 0).unwrap();
    a.ping().await.unwrap();
    // a holds shard 3 at epoch 1: two jobs, one of which it starts
    assert!(a.push(job("u1", 3, 1)).await.unwrap());
    assert!(a.push(job("u2", 3, 1)).await.unwrap());
    let running = pop(&a).await;
    assert!(a.heartbeat(&running).await, "a is current");

    // b takes shard 3 at epoch 2 (a was presumed dead): it gets both jobs, the running one too
    let b = RedisQueue::new(bed.redis_url(), &prefix, "b", 0).unwrap();
    assert_eq!(b.adopt(3, 2).await.unwrap(), 2);
    let mut got = vec![pop(&b).await, pop(&b).await];
    got.sort_by(|x, y| x.key.cmp(&y.key));
    assert_eq!(got.iter().map(|j| (j.name.as_str(), j.epoch)).collect::<Vec<_>>(), [("u1", 2), ("u2", 2)], "adopted at the new epoch");

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
    let c = RedisQueue::new(bed.redis_url(), &prefix, "c", 0).unwrap();
    assert_eq!(c.adopt(3, 3).await.unwrap(), 0, "nothing left once b acknowledged");
}

#[tokio::test]
async fn jobs_of_other_shards_are_not_adopted_and_dedup_holds_across_replicas() {
    let bed = testbed();
    let prefix = bed.redis_prefix("shards");
    let a = RedisQueue::new(bed.redis_url(), &prefix, "a", 0).unwrap();
    assert!(a.push(job("x", 1, 1)).await.unwrap());
    assert!(a.push(job("y", 2, 1)).await.unwrap());
    let b = RedisQueue::new(bed.redis_url(), &prefix, "b", 0).unwrap();
    assert_eq!(b.adopt(2, 2).await.unwrap(), 1, "only shard 2's job");
    assert_eq!(pop(&b).await.name, "y");
    // a still holds shard 1: its job is its own
    let x = pop(&a).await;
    assert_eq!(x.name, "x");
    // put back for a retry (its class was full), it stays recorded: a later holder still adopts it
    a.retry_after(x, Duration::from_secs(60));
    let c = RedisQueue::new(bed.redis_url(), &prefix, "c", 0).unwrap();
    assert_eq!(c.adopt(1, 2).await.unwrap(), 1, "a job waiting for its retry moves with its shard");
}

#[tokio::test]
async fn a_redis_that_lost_everything_loses_no_job() {
    let bed = testbed();
    let prefix = bed.redis_prefix("flush");
    let a = RedisQueue::new(bed.redis_url(), &prefix, "a", 0).unwrap();
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
    let b = RedisQueue::new(bed.redis_url(), &prefix, "b", 0).unwrap();
    assert_eq!(b.adopt(5, 5).await.unwrap(), 1, "the claim recorded the job again");
}
