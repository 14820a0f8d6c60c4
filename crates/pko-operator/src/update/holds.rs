//! Jobs held for busy pool agents ([`crate::agents::pool::Affinity::hold`]): the worker that was refused an agent
//! puts its job back with the hold's time ([`pko_queue::WorkQueue::retry_after`]) and records it here under each agent
//! it waits for; the worker that gives an agent back takes the agent's held jobs and wakes them
//! ([`pko_queue::WorkQueue::wake`]: a job no longer delayed is left as it is), so a held job waits for its agents, not
//! for its delay. Workers are the only writers and readers.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::agents::pool::PoolId;

/// Held job keys by agent (`(class, agent number)`).
#[derive(Debug, Default)]
pub struct Holds(Mutex<HashMap<(PoolId, usize), Vec<String>>>);

impl Holds {
    /// Most job keys remembered per agent: past it the oldest is dropped (it still runs once its delay is up).
    pub const MAX_PER_AGENT: usize = 1024;

    /// Records that job `key` waits for `agent`.
    pub fn add(&self, agent: (PoolId, usize), key: &str) {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let keys = held.entry(agent).or_default();
        if keys.iter().any(|k| k == key) {
            return;
        }
        if keys.len() >= Self::MAX_PER_AGENT {
            keys.remove(0);
        }
        keys.push(key.to_string());
    }

    /// The job keys held for `agent`, forgotten here.
    pub fn take(&self, agent: &(PoolId, usize)) -> Vec<String> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(agent).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jobs_held_for_an_agent_are_taken_once_and_each_once() {
        let holds = Holds::default();
        let a = (PoolId::from_class("ns/c".into()), 0);
        let b = (PoolId::from_class("ns/c".into()), 1);
        holds.add(a.clone(), "ns/u1/x");
        holds.add(a.clone(), "ns/u2/y");
        holds.add(a.clone(), "ns/u1/x");
        holds.add(b.clone(), "ns/u3/z");
        assert_eq!(holds.take(&a), ["ns/u1/x", "ns/u2/y"]);
        assert!(holds.take(&a).is_empty(), "taken");
        assert_eq!(holds.take(&b), ["ns/u3/z"], "another agent's are its own");
    }
}
