//! Looking after the pools of pods: the maintainer of a pool (the holder of its shard) scales it to its minimum and
//! down as its highest pod goes idle, and publishes its gauges; the pools of the cluster are discovered by label, so
//! a replica maintains pools it did not create (before a restart, or another replica's). Lending is the parent's.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use pko_proto::v1::status_response::State;

use super::{
    DISCOVER_EVERY, MAINTAIN_EVERY, POOL_LABEL, PodPool, PodPoolError, PodPools, agent_address, api_error, pool_label,
    pool_name, replicas, resize, set_replicas,
};
use crate::agents::pod;
use crate::agents::pool::{PoolId, every, publish_disk};

impl PodPools {
    /// Looks after the pools until `shutdown`: every [`MAINTAIN_EVERY`], those whose shard this replica holds are
    /// resized ([`resize`]) and their gauges published; every [`DISCOVER_EVERY`], the pools of the cluster are listed
    /// (pools created before a restart, or by another replica). At shutdown the pods stay: the next maintainer scales
    /// them down.
    pub async fn run(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        every(MAINTAIN_EVERY, &shutdown, || self.tick()).await;
    }

    /// One look after the pools: the cluster's pools listed when [`DISCOVER_EVERY`] has passed, then those this replica
    /// maintains resized.
    async fn tick(&self) {
        let due = {
            let mut last = self.discovered.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let due = last.is_none_or(|t| t.elapsed() >= DISCOVER_EVERY);
            if due {
                *last = Some(Instant::now());
            }
            due
        };
        if due {
            self.discover().await;
        }
        self.maintain().await;
    }

    /// Adds the pools of the cluster this replica does not know yet (by [`POOL_LABEL`]). The list is served from the
    /// API server's watch cache (`resourceVersion=0`, unpaged): a consistent list of every StatefulSet of the cluster
    /// from etcd each minute and replica would scan them all for a label; a pool a moment too new to be seen is found a
    /// minute later.
    async fn discover(&self) {
        let lp = ListParams::default().labels(POOL_LABEL).match_any();
        let found = match Api::<StatefulSet>::all(self.client.clone()).list_metadata(&lp).await {
            Ok(l) => l.items,
            Err(e) => {
                tracing::debug!(error = %e, "listing the agent pools");
                return;
            }
        };
        let mut pools = self.pools.lock();
        for m in found {
            let (Some(ns), Some(hash)) = (m.metadata.namespace.clone(), m.labels().get(POOL_LABEL).cloned()) else {
                continue;
            };
            let class = PoolId::from_class(format!("{ns}/{hash}"));
            let name = pool_name(&class);
            pools.entry(class).or_insert(PodPool {
                namespace: ns,
                name,
                lent: HashMap::new(),
                affinity: Default::default(),
                ensured: false,
            });
        }
    }

    async fn maintain(&self) {
        let owned: Vec<(PoolId, String, String, HashSet<usize>)> = self
            .pools
            .lock()
            .iter()
            .filter(|(_, p)| self.ownership.owns(&p.namespace, &p.name))
            .map(|(c, p)| (c.clone(), p.namespace.clone(), p.name.clone(), p.lent.keys().copied().collect()))
            .collect();
        for (class, ns, name, lent) in owned {
            if let Err(e) = self.maintain_one(&class, &ns, &name, &lent).await {
                tracing::warn!(pool = %pool_label(&ns, &name), error = %e, "looking after the agent pool");
            }
        }
    }

    /// Resizes one pool and publishes its gauges (pods busy and idle, as they answer).
    async fn maintain_one(
        &self,
        class: &PoolId,
        ns: &str,
        name: &str,
        lent: &HashSet<usize>,
    ) -> Result<(), PodPoolError> {
        let id = pool_label(ns, name);
        let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), ns);
        let object = pod::object_name(name);
        let Some(sts) = api.get_opt(&object).await.map_err(|source| api_error(&id)(source))? else {
            // deleted: created again at its next operation
            self.pools.lock().remove(class);
            return Ok(());
        };
        let replicas = replicas(&sts);
        let token = self
            .tokens
            .token(&pko_proto::workspace_audience(ns, name))
            .await
            .map_err(|source| PodPoolError::Token { pool: id.clone(), source })?;
        let mut answers = Vec::with_capacity(replicas);
        for i in 0..replicas {
            answers.push(crate::agents::client::status(&agent_address(name, ns, i), Some(&token)).await.ok());
        }
        let (busy, idle) = answers
            .iter()
            .flatten()
            .fold((0u32, 0u32), |(b, i), s| if s.state == State::Idle as i32 { (b, i + 1) } else { (b + 1, i) });
        metrics::gauge!(crate::metric_names::POOL_AGENTS, "class" => class.to_string(), "state" => "busy")
            .set(f64::from(busy));
        metrics::gauge!(crate::metric_names::POOL_AGENTS, "class" => class.to_string(), "state" => "idle")
            .set(f64::from(idle));
        crate::load::set_agents(class.as_str(), busy as usize, idle as usize);
        let answered: Vec<_> = answers.iter().flatten().cloned().collect();
        publish_disk(class.as_str(), &answered);
        let top = replicas
            .checked_sub(1)
            .and_then(|t| answers.get(t).cloned().flatten())
            .map(|s| (State::try_from(s.state).unwrap_or(State::Unspecified), s.idle_seconds));
        let top_lent_here = replicas.checked_sub(1).is_some_and(|t| lent.contains(&t));
        let Some(n) = resize(replicas, self.cfg.min, top, top_lent_here, self.cfg.idle_timeout) else { return Ok(()) };
        match set_replicas(&api, &object, sts.resource_version(), n).await {
            Ok(()) if n < replicas => {
                tracing::info!(pool = %id, from = replicas, to = n, "agent pool's highest pod idle: scaling down");
                metrics::counter!(crate::metric_names::POOL_AGENTS_STOPPED_TOTAL).increment((replicas - n) as u64);
            }
            Ok(()) => tracing::info!(pool = %id, from = replicas, to = n, "agent pool raised to its minimum"),
            // a lender raised it meanwhile: looked at again at the next tick
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(source) => return Err(api_error(&id)(source)),
        }
        Ok(())
    }
}
