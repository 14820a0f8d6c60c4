//! A replica's load as it announces it on its membership Lease (annotation [`LOAD_ANNOTATION`], JSON): the contract
//! between the operator, which writes it at each renewal (`pko_operator::load`), and `kubectl pko fleet`, which reads
//! it. Counts are operations or agents.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The membership Lease's annotation carrying [`Load`] as JSON.
pub const LOAD_ANNOTATION: &str = "pulumi.com/load";

/// Agents of one pool class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Agents {
    /// Running an operation (or lent to one).
    pub busy: u32,
    /// Running, free.
    pub idle: u32,
    /// Bytes the agents keep on disk between operations (prepared revisions and their dependency trees), as they
    /// last reported them (every 10 s); 0 when not known.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub disk_bytes: u64,
    /// The largest of those agents' bytes on disk.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_agent_disk_bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One replica's load.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Load {
    /// Operations queued (not started), per namespace.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub queued: BTreeMap<String, u32>,
    /// Operations its workers drive now.
    #[serde(default)]
    pub in_flight: u32,
    /// Operations running per workspace class.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub running: BTreeMap<String, u32>,
    /// Pool agents per class.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub agents: BTreeMap<String, Agents>,
    /// The pools' bounds per class (`--pool-min-agents`, `--pool-max-agents`); `None` without pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_bounds: Option<(u32, u32)>,
}

impl Load {
    /// The load in annotation `json`; `None` when it does not parse (a replica announcing something else is shown
    /// without a load).
    pub fn parse(json: &str) -> Option<Load> {
        serde_json::from_str(json).ok()
    }

    /// Adds `other` to this load (a fleet's total); the pools' bounds are the first known.
    pub fn add(&mut self, other: &Load) {
        for (k, n) in &other.queued {
            *self.queued.entry(k.clone()).or_default() += n;
        }
        for (k, n) in &other.running {
            *self.running.entry(k.clone()).or_default() += n;
        }
        for (k, a) in &other.agents {
            let t = self.agents.entry(k.clone()).or_default();
            t.busy += a.busy;
            t.idle += a.idle;
            t.disk_bytes += a.disk_bytes;
            t.max_agent_disk_bytes = t.max_agent_disk_bytes.max(a.max_agent_disk_bytes);
        }
        self.in_flight += other.in_flight;
        self.pool_bounds = self.pool_bounds.or(other.pool_bounds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_parse_from_their_json_and_add_up() {
        let a = Load::parse(concat!(
            r#"{"queued":{"team-a":3},"inFlight":2,"running":{"c1":2},"#,
            r#""agents":{"c1":{"busy":2,"idle":1}},"poolBounds":[0,4]}"#
        ))
        .unwrap();
        assert_eq!(
            (a.queued["team-a"], a.in_flight, a.agents["c1"], a.pool_bounds),
            (3, 2, Agents { busy: 2, idle: 1, ..Default::default() }, Some((0, 4)))
        );
        assert_eq!(Load::parse(&serde_json::to_string(&a).unwrap()), Some(a.clone()));
        assert_eq!(Load::parse("not json"), None);
        let mut total = Load::default();
        total.add(&a);
        total.add(&a);
        assert_eq!(
            (total.queued["team-a"], total.in_flight, total.agents["c1"].busy, total.pool_bounds),
            (6, 4, 4, Some((0, 4)))
        );
    }
}
