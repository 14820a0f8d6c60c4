//! This replica's load at a glance — operations queued per namespace, in flight, running per workspace class, pool
//! agents busy and idle per class, the pools' bounds — announced on its membership Lease (annotation
//! [`LOAD_ANNOTATION`], JSON) at each renewal it writes anyway, so `kubectl pko fleet` shows every replica's queue and
//! pools from one LIST of the fleet's Leases: no new request, no new privileged path.
//!
//! One board per process, like the metrics registry, written beside the gauges of the same numbers (`pko_queue_depth`,
//! `pko_update_operations_in_flight`, `pko_operations_running`, `pko_pool_agents`): the queue's gauges
//! ([`crate::update::controller::QueueGauges`]), the class limits ([`crate::agents::limits`]) and the pools
//! ([`crate::agents::pool::processes`], [`crate::agents::pool::pods`]). A leaf: it imports nothing of the crate; the
//! types are the contract of `pko_fleet::load`, which `kubectl pko fleet` reads.

use std::collections::BTreeMap;
use std::sync::Mutex;

pub use pko_fleet::load::{Agents, LOAD_ANNOTATION, Load};

static BOARD: Mutex<Option<Load>> = Mutex::new(None);

fn with(f: impl FnOnce(&mut Load)) {
    let mut board = BOARD.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    f(board.get_or_insert_with(Load::default));
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Records the queue: operations queued per namespace and in flight.
pub fn set_queue(queued: &BTreeMap<String, usize>, in_flight: usize) {
    with(|l| {
        l.queued = queued.iter().filter(|(_, n)| **n > 0).map(|(k, n)| (k.clone(), count(*n))).collect();
        l.in_flight = count(in_flight);
    });
}

/// Records `n` operations running in workspace class `class`.
pub fn set_running(class: &str, n: usize) {
    with(|l| {
        if n == 0 {
            l.running.remove(class);
        } else {
            l.running.insert(class.to_string(), count(n));
        }
    });
}

/// Records the agents of pool class `class` (their disk as last recorded stays).
pub fn set_agents(class: &str, busy: usize, idle: usize) {
    with(|l| {
        if busy + idle == 0 {
            l.agents.remove(class);
        } else {
            let a = l.agents.entry(class.to_string()).or_default();
            (a.busy, a.idle) = (count(busy), count(idle));
        }
    });
}

/// Records the bytes the agents of pool class `class` keep on disk: `total` over them, `max` the largest agent's.
pub fn set_agent_disk(class: &str, total: u64, max: u64) {
    with(|l| {
        if let Some(a) = l.agents.get_mut(class) {
            (a.disk_bytes, a.max_agent_disk_bytes) = (total, max);
        }
    });
}

/// Records the pools' bounds (`min`, `max` agents per class).
pub fn set_pool_bounds(min: usize, max: usize) {
    with(|l| l.pool_bounds = Some((count(min), count(max))));
}

/// The load as recorded so far.
pub fn snapshot() -> Load {
    BOARD.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone().unwrap_or_default()
}

/// [`snapshot`] as the annotation's JSON.
pub fn announcement() -> String {
    serde_json::to_string(&snapshot()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_board_keeps_what_is_nonzero_and_reads_back_from_its_json() {
        set_queue(&[("team-a".to_string(), 3), ("team-b".to_string(), 0)].into(), 2);
        set_running("c1", 2);
        set_running("c2", 1);
        set_running("c2", 0);
        set_agents("c1", 2, 1);
        set_pool_bounds(0, 4);
        let l = snapshot();
        assert_eq!(l.queued, [("team-a".to_string(), 3)].into());
        assert_eq!(
            (l.in_flight, l.running.len(), l.agents["c1"], l.pool_bounds),
            (2, 1, Agents { busy: 2, idle: 1, ..Default::default() }, Some((0, 4)))
        );
        let back: Load = serde_json::from_str(&announcement()).unwrap();
        assert_eq!(back, l);
        assert!(announcement().contains("\"inFlight\":2"), "{}", announcement());
    }
}
