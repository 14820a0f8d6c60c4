//! Saved plans of Stacks under plan approval (`spec.approval.mode: manual`), kept outside etcd between the preview that
//! saved one and the `up` that runs it: **one plan per Stack**, the latest (a new preview's plan replaces the previous,
//! so a superseded plan cannot run even by its id), each at most `pko_proto::plan::MAX_PLAN_BYTES`.
//!
//! Two implementations behind [`PlanStore`]: [`MemoryPlans`] (one replica; bounded in total bytes, the oldest Stacks'
//! plans going first; lost with the replica: the Stack then previews again) and [`RedisPlans`] (the fleet: any
//! replica dispatches the approved `up`). Redis key (prefix `P`): `P:plan:<ns>/<stack>`, a hash with fields `meta`
//! ([`PlanMeta`] JSON) and `plan` (the bytes), expiring [`PLAN_TTL_SECONDS`] after it was saved.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::QueueError;
use crate::connect::Pools;

/// How long a saved plan is kept: 7 days (seconds). An approval after that finds none: the Update fails and the Stack
/// previews again.
pub const PLAN_TTL_SECONDS: u64 = 7 * 24 * 3600;

/// Bytes of plans [`MemoryPlans`] keeps in total by default: 256 MiB.
pub const MEMORY_PLAN_BYTES: usize = 256 << 20;

/// What a plan was saved from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanMeta {
    /// The plan's id (`pko_proto::plan::id` of its bytes).
    pub id: String,
    /// The preview Update that saved it.
    pub update: String,
    /// The run digest of that preview (`sha256:<hex>`): what the `up` must run to use it.
    pub run_digest: String,
    /// The source revision it ran.
    pub revision: String,
    /// When it was saved (RFC 3339).
    pub saved: String,
}

/// A plan and what it was saved from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedPlan {
    /// What it was saved from.
    pub meta: PlanMeta,
    /// The plan as Pulumi saved it (JSON).
    pub bytes: Vec<u8>,
}

/// Where plans are kept. `stack` is `<namespace>/<name>` of the Stack (the Workspace the Updates name).
pub trait PlanStore: Send + Sync + std::fmt::Debug {
    /// Keeps `plan` as `stack`'s plan, replacing the one kept.
    ///
    /// Errors: the backing store's (Redis); the preview that saved it then fails, so nothing waits on a lost plan.
    fn put<'a>(&'a self, stack: &'a str, plan: &'a SavedPlan) -> BoxFuture<'a, Result<(), QueueError>>;
    /// `stack`'s plan, if one is kept.
    ///
    /// Errors: the backing store's.
    fn get<'a>(&'a self, stack: &'a str) -> BoxFuture<'a, Result<Option<SavedPlan>, QueueError>>;
}

#[derive(Debug, Default)]
struct Kept {
    plans: HashMap<String, SavedPlan>,
    /// Stacks in the order their plans were saved: the eviction order.
    order: VecDeque<String>,
    bytes: usize,
}

/// The plans of one replica, in memory, at most `limit` bytes in total.
#[derive(Debug)]
pub struct MemoryPlans {
    limit: usize,
    inner: Mutex<Kept>,
}

impl Default for MemoryPlans {
    fn default() -> Self {
        MemoryPlans::new(MEMORY_PLAN_BYTES)
    }
}

impl MemoryPlans {
    /// An empty store of at most `limit` bytes of plans.
    pub fn new(limit: usize) -> Self {
        MemoryPlans { limit, inner: Mutex::default() }
    }

    /// Bytes of plans kept now.
    pub fn bytes(&self) -> usize {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).bytes
    }
}

impl Kept {
    fn put(&mut self, stack: &str, plan: &SavedPlan, limit: usize) {
        if let Some(old) = self.plans.remove(stack) {
            self.bytes -= old.bytes.len();
            self.order.retain(|s| s != stack);
        }
        self.plans.insert(stack.to_string(), plan.clone());
        self.order.push_back(stack.to_string());
        self.bytes += plan.bytes.len();
        while self.bytes > limit && self.order.len() > 1 {
            let Some(oldest) = self.order.pop_front() else { break };
            if let Some(p) = self.plans.remove(&oldest) {
                self.bytes -= p.bytes.len();
            }
        }
    }
}

impl PlanStore for MemoryPlans {
    fn put<'a>(&'a self, stack: &'a str, plan: &'a SavedPlan) -> BoxFuture<'a, Result<(), QueueError>> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).put(stack, plan, self.limit);
        Box::pin(async { Ok(()) })
    }

    fn get<'a>(&'a self, stack: &'a str) -> BoxFuture<'a, Result<Option<SavedPlan>, QueueError>> {
        let found = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).plans.get(stack).cloned();
        Box::pin(async move { Ok(found) })
    }
}

/// The fleet's plans, in Redis.
pub struct RedisPlans {
    pool: Pools,
    prefix: String,
}

impl std::fmt::Debug for RedisPlans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPlans").field("prefix", &self.prefix).finish()
    }
}

impl RedisPlans {
    pub(crate) fn new(pool: Pools, prefix: String) -> Self {
        RedisPlans { pool, prefix: format!("{prefix}:plan:") }
    }
}

impl PlanStore for RedisPlans {
    fn put<'a>(&'a self, stack: &'a str, plan: &'a SavedPlan) -> BoxFuture<'a, Result<(), QueueError>> {
        Box::pin(async move {
            let mut c = self.pool.get().await?;
            let key = format!("{}{stack}", self.prefix);
            let meta = serde_json::to_string(&plan.meta)?;
            let _: () = redis::pipe()
                .atomic()
                .del(&key)
                .hset_multiple(&key, &[("meta", meta.into_bytes()), ("plan", plan.bytes.clone())])
                .expire(&key, PLAN_TTL_SECONDS as i64)
                .query_async(&mut c)
                .await?;
            Ok(())
        })
    }

    fn get<'a>(&'a self, stack: &'a str) -> BoxFuture<'a, Result<Option<SavedPlan>, QueueError>> {
        Box::pin(async move {
            let mut c = self.pool.get().await?;
            let key = format!("{}{stack}", self.prefix);
            let (meta, bytes): (Option<String>, Option<Vec<u8>>) =
                redis::cmd("HMGET").arg(&key).arg("meta").arg("plan").query_async(&mut c).await?;
            let (Some(meta), Some(bytes)) = (meta, bytes) else { return Ok(None) };
            Ok(Some(SavedPlan { meta: serde_json::from_str(&meta)?, bytes }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(id: &str, size: usize) -> SavedPlan {
        let meta = PlanMeta {
            id: id.into(),
            update: format!("u-{id}"),
            run_digest: "sha256:00".into(),
            revision: "abc".into(),
            saved: "2026-11-28T00:00:00Z".into(),
        };
        SavedPlan { meta, bytes: vec![b'x'; size] }
    }

    #[tokio::test]
    async fn a_stack_keeps_only_its_latest_plan_and_old_stacks_go_first() {
        let store = MemoryPlans::new(100);
        store.put("ns/a", &plan("1", 40)).await.unwrap();
        store.put("ns/a", &plan("2", 40)).await.unwrap();
        assert_eq!(store.get("ns/a").await.unwrap().map(|p| p.meta.id), Some("2".into()), "replaced, not added");
        assert_eq!(store.bytes(), 40);
        store.put("ns/b", &plan("3", 40)).await.unwrap();
        store.put("ns/c", &plan("4", 40)).await.unwrap();
        assert!(store.get("ns/a").await.unwrap().is_none(), "over 100 bytes: the oldest Stack's plan went");
        assert!(store.get("ns/b").await.unwrap().is_some() && store.get("ns/c").await.unwrap().is_some());
        assert_eq!(store.bytes(), 80);
        assert!(store.get("other/a").await.unwrap().is_none(), "by namespace and name");
    }
}
