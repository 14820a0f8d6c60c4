//! A pool's objects and decisions, pure: its names and addresses, its Service and StatefulSet, the pod a lender takes
//! or adds, the size the maintainer sets.

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use pko_api::Workspace;
use pko_proto::v1::status_response::State;

use super::{POOL_LABEL, POOL_TEMPLATE_ANNOTATION};
use crate::agents::pod::{self, PodRuntimeConfig};
use crate::agents::pool::PoolId;

/// Name of the pool of `class` (`<namespace>/<hash>`): `pko-pool-<hash>`. Its StatefulSet and Service are
/// `pko-pool-<hash>-workspace`, its pods `pko-pool-<hash>-workspace-<ordinal>`.
pub fn pool_name(class: &PoolId) -> String {
    format!("pko-pool-{}", class.hash())
}

/// gRPC address of pod `ordinal` of pool `pool` in `namespace`: its name under the headless Service.
pub fn agent_address(pool: &str, namespace: &str, ordinal: usize) -> String {
    let obj = pod::object_name(pool);
    format!("{obj}-{ordinal}.{obj}.{namespace}:{}", pko_api::workspace::AGENT_PORT)
}

/// The Service and StatefulSet (at 0 replicas) of the pool of `ws`'s class: `ws`'s pod ([`pod::stateful_set`]) under
/// the pool's name, its agent isolating each operation, with `agent_args` added to the agent's (hollow agents of a load
/// test), no owner (the pool outlives any one Workspace) and no shard label. Pure.
pub fn pool_objects(ws: &Workspace, cfg: &PodRuntimeConfig, agent_args: &[String]) -> (Service, StatefulSet) {
    let class = PoolId::of(ws);
    let hash = class.hash().to_string();
    let mut as_pool = ws.clone();
    as_pool.metadata = kube::api::ObjectMeta {
        name: Some(pool_name(&class)),
        namespace: ws.metadata.namespace.clone(),
        ..Default::default()
    };
    // the environment travels with each operation's request: a pool pod carries no Workspace's
    as_pool.spec.env = None;
    as_pool.spec.env_from = None;
    let mut service = pod::service(&as_pool);
    service.labels_mut().insert(POOL_LABEL.into(), hash.clone());
    let mut sts = pod::stateful_set(&as_pool, cfg);
    sts.labels_mut().insert(POOL_LABEL.into(), hash);
    if let Some(spec) = sts.spec.as_mut() {
        spec.replicas = Some(0);
        if let Some(c) = spec.template.spec.as_mut().and_then(|p| p.containers.iter_mut().find(|c| c.name == "pulumi"))
        {
            let args = c.args.get_or_insert_with(Vec::new);
            // a pool's agents run many Stacks: each operation isolated (the agent's default)
            args.retain(|a| a != pod::SHARED_OPERATIONS);
            args.extend(agent_args.iter().cloned());
        }
    }
    let template =
        sts.spec.as_ref().map(|s| serde_json::to_string(&s.template).unwrap_or_default()).unwrap_or_default();
    let template_hash = pko_api::hash::sha256_hex(template, 8);
    sts.annotations_mut().insert(POOL_TEMPLATE_ANNOTATION.into(), template_hash);
    (service, sts)
}

/// The pods to ask for an idle agent among `replicas`, leaving out those this replica has lent: the `warm` ones (that
/// ran the Workspace, the most recent first) first, then lowest ordinal first. Pure.
pub fn candidates(replicas: usize, lent: &HashSet<usize>, warm: &[usize]) -> Vec<usize> {
    let free = |i: &usize| *i < replicas && !lent.contains(i);
    let first = warm.iter().copied().filter(free);
    first.chain((0..replicas).filter(|i| free(i) && !warm.contains(i))).collect()
}

/// The `warm` pods (that ran the Workspace) to hold an operation for: those that exist, when every one of them is lent
/// here and another of the `replicas` pods is not, or one could be added below `max`; empty: no hold. Pure.
pub fn hold_for(replicas: usize, lent: &HashSet<usize>, warm: &[usize], max: usize) -> Vec<usize> {
    let warm: Vec<usize> = warm.iter().copied().filter(|i| *i < replicas).collect();
    let other = (0..replicas).any(|j| !lent.contains(&j)) || grow_slot(replicas, max, lent).is_some();
    if warm.is_empty() || !other || warm.iter().any(|i| !lent.contains(i)) {
        return Vec::new();
    }
    warm
}

/// The ordinal a lender adds when no pod is idle: the lowest at or above `replicas` that this replica has not reserved
/// already, below `max`; `None`: the pool is full. Pure.
pub fn grow_slot(replicas: usize, max: usize, lent: &HashSet<usize>) -> Option<usize> {
    (replicas..max.max(1)).find(|i| !lent.contains(i))
}

/// The maintainer's decision for a pool of `replicas` pods: raise to `min`; else lower by one when the highest pod is
/// not lent here and answered idle (`top`: its state and idle seconds) for at least `idle_timeout`; else nothing. Pure.
pub fn resize(
    replicas: usize,
    min: usize,
    top: Option<(State, f64)>,
    top_lent_here: bool,
    idle_timeout: Duration,
) -> Option<usize> {
    if replicas < min {
        return Some(min);
    }
    match top {
        Some((State::Idle, idle)) if replicas > min && !top_lent_here && idle >= idle_timeout.as_secs_f64() => {
            Some(replicas - 1)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ws(name: &str, spec: serde_json::Value) -> Workspace {
        serde_json::from_value(json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Workspace",
            "metadata": {"name": name, "namespace": "team-a", "uid": "u1", "labels": {"pulumi.com/shard": "7"}},
                "spec": spec}))
        .unwrap()
    }

    fn cfg() -> PodRuntimeConfig {
        PodRuntimeConfig {
            agent_image: "pko-agent:test".into(),
            agent_image_pull_policy: None,
            flux_max_untar_size_bytes: None,
        }
    }

    #[test]
    fn workspaces_of_one_class_share_one_pool_with_its_own_identity() {
        let a = ws("alpha", json!({"image": "img", "stacks": [{"name": "dev"}], "local": {"dir": "/a"}}));
        let b = ws("beta", json!({"image": "img", "git": {"url": "u", "ref": "main"}}));
        let (sa, sta) = pool_objects(&a, &cfg(), &[]);
        let (_, stb) = pool_objects(&b, &cfg(), &[]);
        assert_eq!(
            serde_json::to_value(&sta).unwrap(),
            serde_json::to_value(&stb).unwrap(),
            "one pool for the class, whatever the stack or source"
        );
        let name = sta.name_any();
        assert!(name.starts_with("pko-pool-") && name.ends_with("-workspace"), "{name}");
        assert_eq!(sa.name_any(), name);
        assert_eq!(sta.spec.as_ref().unwrap().replicas, Some(0), "created empty: idle costs no pod");
        assert!(sta.metadata.owner_references.is_none(), "outlives any one Workspace");
        assert!(!sta.labels().contains_key(pko_api::constants::SHARD_LABEL), "not one Workspace's shard");
        let pool = name.trim_end_matches("-workspace");
        let args = sta.spec.unwrap().template.spec.unwrap().containers[0].args.clone().unwrap().join(" ");
        assert!(
            args.contains(&format!(
                "--kube-audience {pool}.team-a --kube-workspace-namespace team-a --kube-workspace-name {pool}"
            )),
            "{args}"
        );
        assert!(
            !args.contains("--isolate-operations"),
            "a pool's agents isolate each operation (the agent's default): {args}"
        );
        let own =
            pod::stateful_set(&a, &cfg()).spec.unwrap().template.spec.unwrap().containers[0].args.clone().unwrap();
        assert!(
            own.contains(&pod::SHARED_OPERATIONS.to_string()),
            "a Workspace's own pod runs its Stack's operations as PKO's: {own:?}"
        );
        let c = ws("gamma", json!({"image": "other"}));
        assert_ne!(pool_objects(&c, &cfg(), &[]).1.name_any(), name, "another image is another class");
        // one Stack's environment never rides in the pool's pods (it travels with each request)
        let d = ws(
            "delta",
            json!({"image": "img", "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "delta-secret",
                "key": "t"}}}], "envFrom": [{"secretRef": {"name": "delta-all"}}]}),
        );
        let (_, std_) = pool_objects(&d, &cfg(), &[]);
        assert_eq!(std_.name_any(), name, "the same class");
        assert!(
            !serde_json::to_string(&std_).unwrap().contains("delta-"),
            "no Workspace's env or envFrom in the pool's pods"
        );
        assert_eq!(agent_address(pool, "team-a", 2), format!("{name}-2.{name}.team-a:50051"));
    }

    #[test]
    fn hollow_agent_arguments_reach_the_pool_pods() {
        let (_, sts) = pool_objects(&ws("a", json!({})), &cfg(), &["--hollow-seconds".into(), "1".into()]);
        let args = sts.spec.unwrap().template.spec.unwrap().containers[0].args.clone().unwrap();
        assert_eq!(args[args.len() - 2..], ["--hollow-seconds".to_string(), "1".into()]);
    }

    #[test]
    fn lenders_take_the_lowest_free_pod_and_grow_below_the_maximum() {
        let lent: HashSet<usize> = [0, 2].into();
        assert_eq!(candidates(4, &lent, &[]), vec![1, 3]);
        assert_eq!(candidates(4, &lent, &[3]), vec![3, 1], "the pod that ran the Workspace, first");
        assert_eq!(candidates(4, &lent, &[3, 1]), vec![3, 1], "the most recent first");
        assert_eq!(candidates(4, &lent, &[2]), vec![1, 3], "not while it is lent");
        assert_eq!(candidates(4, &lent, &[9]), vec![1, 3], "nor when it is gone");
        assert_eq!(grow_slot(4, 8, &lent), Some(4));
        assert_eq!(grow_slot(2, 4, &[2, 3].into()), None, "the slots above are being started by this replica already");
        assert_eq!(grow_slot(3, 4, &[3].into()), None);
        assert_eq!(grow_slot(0, 0, &HashSet::new()), Some(0), "a maximum of 0 is taken as 1");
        assert_eq!(grow_slot(1, 1, &HashSet::new()), None);
    }

    #[test]
    fn an_operation_is_held_for_its_pods_only_while_they_are_lent_here_and_another_could_run_it() {
        let lent: HashSet<usize> = [0, 2].into();
        assert_eq!(hold_for(3, &lent, &[2, 0], 3), [2, 0], "pod 1 is free");
        assert_eq!(hold_for(1, &[0].into(), &[0], 2), [0], "a pod could be added");
        assert!(hold_for(1, &[0].into(), &[0], 1).is_empty(), "nothing else could run it: it waits in the queue");
        assert!(hold_for(3, &lent, &[0, 1], 3).is_empty(), "one of its pods is free: no hold");
        assert_eq!(hold_for(3, &lent, &[5, 0], 8), [0], "a pod gone is not waited for");
        assert!(hold_for(3, &lent, &[], 3).is_empty());
    }

    #[test]
    fn the_maintainer_lowers_one_pod_idle_past_the_timeout_down_to_the_minimum() {
        let t = Duration::from_secs(60);
        assert_eq!(resize(3, 0, Some((State::Idle, 61.0)), false, t), Some(2));
        assert_eq!(resize(3, 0, Some((State::Idle, 59.0)), false, t), None, "not idle long enough");
        assert_eq!(resize(3, 0, Some((State::Busy, 0.0)), false, t), None, "the highest pod works: it stays");
        assert_eq!(
            resize(3, 0, Some((State::Idle, 600.0)), true, t),
            None,
            "lent here, its Run may not have arrived yet"
        );
        assert_eq!(resize(3, 0, None, false, t), None, "not answering (starting): left alone");
        assert_eq!(resize(2, 2, Some((State::Idle, 600.0)), false, t), None, "the minimum stays");
        assert_eq!(resize(0, 2, None, false, t), Some(2), "raised to the minimum");
        assert_eq!(resize(1, 0, Some((State::Draining, 600.0)), false, t), None);
    }
}
