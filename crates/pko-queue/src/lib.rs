//! The work queue between reconciles and operation workers. Reconciles push a job per Update; a fixed
//! set of workers pops jobs and drives the operations. The fleet replaces the in-memory queue with the
//! Redis one (at-least-once, fenced by shard epoch) behind the same trait.
//! No PKO types or Kubernetes here: the Redis queue grows in this crate.
#![forbid(unsafe_code)]

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use futures::future::BoxFuture;
use tokio::sync::Notify;

/// One Update to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Dedup key: the operation id (`<namespace>/<name>/<uid>`).
    pub key: String,
    /// Namespace of the Update.
    pub namespace: String,
    /// Name of the Update.
    pub name: String,
    /// Fencing epoch of the shard that pushed it.
    pub epoch: i64,
}

/// A queue of jobs, deduplicated by key from push until [`WorkQueue::done`].
pub trait WorkQueue: Send + Sync + std::fmt::Debug + 'static {
    /// Enqueues `job`; `false` when a job with its key is queued or in flight.
    fn push(&self, job: Job) -> bool;
    /// Waits for the next job; it stays in flight until [`WorkQueue::done`].
    fn pop(&self) -> BoxFuture<'_, Job>;
    /// The job with `key` finished (or was abandoned): its key may be pushed again.
    fn done(&self, key: &str);
    /// Jobs waiting.
    fn queued(&self) -> usize;
    /// Jobs popped and not done.
    fn in_flight(&self) -> usize;
}

/// The in-process queue (one replica).
#[derive(Debug, Default)]
pub struct InMemoryQueue {
    state: Mutex<State>,
    notify: Notify,
}

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<Job>,
    keys: HashSet<String>,
    in_flight: usize,
}

impl WorkQueue for InMemoryQueue {
    fn push(&self, job: Job) -> bool {
        let mut s = self.state.lock().unwrap();
        if !s.keys.insert(job.key.clone()) {
            return false;
        }
        s.queue.push_back(job);
        drop(s);
        self.notify.notify_one();
        true
    }

    fn pop(&self) -> BoxFuture<'_, Job> {
        Box::pin(async move {
            loop {
                let notified = self.notify.notified();
                {
                    let mut s = self.state.lock().unwrap();
                    if let Some(job) = s.queue.pop_front() {
                        s.in_flight += 1;
                        if !s.queue.is_empty() {
                            self.notify.notify_one();
                        }
                        return job;
                    }
                }
                notified.await;
            }
        })
    }

    fn done(&self, key: &str) {
        let mut s = self.state.lock().unwrap();
        if s.keys.remove(key) {
            s.in_flight = s.in_flight.saturating_sub(1);
        }
    }

    fn queued(&self) -> usize {
        self.state.lock().unwrap().queue.len()
    }

    fn in_flight(&self) -> usize {
        self.state.lock().unwrap().in_flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn job(k: &str) -> Job {
        Job { key: k.into(), namespace: "ns".into(), name: k.into(), epoch: 1 }
    }

    #[tokio::test]
    async fn fifo_with_dedup_until_done() {
        let q = InMemoryQueue::default();
        assert!(q.push(job("a")));
        assert!(q.push(job("b")));
        assert!(!q.push(job("a")), "queued twice");
        assert_eq!(q.pop().await.key, "a");
        assert!(!q.push(job("a")), "in flight");
        assert_eq!((q.queued(), q.in_flight()), (1, 1));
        q.done("a");
        assert!(q.push(job("a")), "pushable again once done");
        assert_eq!(q.pop().await.key, "b");
        assert_eq!(q.pop().await.key, "a");
        assert_eq!(q.in_flight(), 2);
    }

    #[tokio::test]
    async fn pop_waits_for_a_push_and_workers_share_the_jobs() {
        let q = Arc::new(InMemoryQueue::default());
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let q = q.clone();
                tokio::spawn(async move { q.pop().await.key })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        for k in ["x", "y", "z"] {
            q.push(job(k));
        }
        let mut got = Vec::new();
        for w in workers {
            got.push(tokio::time::timeout(Duration::from_secs(2), w).await.expect("a worker got a job").unwrap());
        }
        got.sort();
        assert_eq!(got, vec!["x", "y", "z"]);
    }
}
