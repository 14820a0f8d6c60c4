//! The one ownership check of an operation's worker: a job may be driven here only while this replica holds the job's
//! shard at the job's epoch (`pko_fleet::Ownership::epoch`) — and, where a write can start an operation twice, while
//! the queue confirms the job is still this worker's ([`pko_queue::WorkQueue::heartbeat`]: the shard's new holder has
//! not raised its fence). Every write of the worker, and the `Run` call, stands behind [`Fence::check`].

use std::time::Duration;

use pko_queue::{Job, WorkQueue};

use crate::ownership::Ownership;

/// How often a running operation's fence is looked at (seconds; the queue's heartbeat every 10th).
pub const LOOK_EVERY: Duration = Duration::from_secs(1);

/// The job's shard lost at its epoch: nothing more is written; its new holder follows the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("fenced: the shard is no longer held at this epoch")]
pub struct Fenced;

/// The fence of one job.
pub struct Fence<'a> {
    ownership: &'a dyn Ownership,
    queue: &'a dyn WorkQueue,
    job: &'a Job,
    shard_key: String,
}

impl<'a> Fence<'a> {
    /// The fence of `job`, whose object has the shard key `shard_key` ([`pko_api::shard::ShardKey`]).
    pub fn new(ownership: &'a dyn Ownership, queue: &'a dyn WorkQueue, job: &'a Job, shard_key: String) -> Self {
        Self { ownership, queue, job, shard_key }
    }

    /// Whether this replica holds the job's shard at the job's epoch (in memory).
    pub fn holds(&self) -> bool {
        self.ownership.epoch(&self.job.namespace, &self.shard_key) == self.job.epoch
    }

    /// `Ok` while [`Self::holds`].
    ///
    /// Errors: [`Fenced`].
    pub fn check(&self) -> Result<(), Fenced> {
        if self.holds() { Ok(()) } else { Err(Fenced) }
    }

    /// [`Self::holds`], and the queue confirms the job is still this worker's (one round trip to Redis): asked right
    /// before an operation may start on an agent.
    pub async fn confirmed(&self) -> bool {
        self.holds() && self.queue.heartbeat(self.job).await
    }

    /// Until when (wall clock) the shard is held at the job's epoch ([`Ownership::not_after`]), sent with `Run` so that
    /// an agent refuses a call that arrives later; `None`: no deadline.
    pub fn not_after(&self) -> Option<std::time::SystemTime> {
        self.ownership.not_after(&self.job.namespace, &self.shard_key)
    }

    /// Returns once the job may no longer be driven here: checked every [`LOOK_EVERY`] (ownership), the queue's
    /// heartbeat every tenth look.
    pub async fn lost(&self) {
        let mut tick = 0u32;
        loop {
            tokio::time::sleep(LOOK_EVERY).await;
            tick += 1;
            if !self.holds() || (tick.is_multiple_of(10) && !self.queue.heartbeat(self.job).await) {
                return;
            }
        }
    }

    /// The job.
    pub fn job(&self) -> &Job {
        self.job
    }
}
