//! The pool's pure decisions over its agent slots: which agent an operation goes to, which idle agents stop.

use std::time::{Duration, Instant};

/// What an agent slot looks like to the pure decisions ([`pick`], [`idle_out`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotView {
    /// The operation the agent is known to run (lent, or found running and not yet seen idle).
    pub running: Option<String>,
    /// Lent to a dispatcher now.
    pub lent: bool,
    /// Still starting (no address yet).
    pub starting: bool,
    /// Alive and not shutting down.
    pub usable: bool,
    /// Since when it has been free.
    pub idle_since: Instant,
}

impl SlotView {
    fn free(&self) -> bool {
        self.usable && !self.lent && !self.starting && self.running.is_none()
    }
}

/// Where an operation goes, decided from the pool's slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pick {
    /// Slot `i` runs this operation already: follow it there.
    Follow(usize),
    /// Slot `i` is free: lend it.
    Lend(usize),
    /// None is free and the pool may grow: start an agent.
    Start,
    /// Every agent is busy and the pool is at its maximum: the operation waits.
    Full,
}

/// Chooses the agent for operation `op` among `slots` of a pool of at most `max` agents: the one that runs it already,
/// else slot `preferred` (the one that ran the Workspace's last operation, [`crate::agents::pool::Affinity`]) when
/// it is free, else the free agent used most recently (so the others reach their idle timeout), else a new one while
/// fewer than `max` exist (dead ones do not count), else none.
pub fn pick(slots: &[SlotView], op: &str, preferred: Option<usize>, max: usize) -> Pick {
    if let Some(i) = slots.iter().position(|s| s.usable && s.running.as_deref() == Some(op)) {
        return Pick::Follow(i);
    }
    if let Some(i) = preferred.filter(|i| slots.get(*i).is_some_and(SlotView::free)) {
        return Pick::Lend(i);
    }
    if let Some((i, _)) = slots.iter().enumerate().filter(|(_, s)| s.free()).max_by_key(|(_, s)| s.idle_since) {
        return Pick::Lend(i);
    }
    if slots.iter().filter(|s| s.usable || s.starting).count() < max.max(1) { Pick::Start } else { Pick::Full }
}

/// The slots to stop at `now`: free agents idle for at least `idle_timeout`, longest idle first, while more than `min`
/// usable agents remain.
pub fn idle_out(slots: &[SlotView], min: usize, idle_timeout: Duration, now: Instant) -> Vec<usize> {
    let mut candidates: Vec<usize> = (0..slots.len())
        .filter(|&i| slots[i].free() && now.saturating_duration_since(slots[i].idle_since) >= idle_timeout)
        .collect();
    candidates.sort_by_key(|&i| slots[i].idle_since);
    let usable = slots.iter().filter(|s| s.usable || s.starting).count();
    candidates.truncate(usable.saturating_sub(min));
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(running: Option<&str>, lent: bool, usable: bool, idle_secs_ago: u64, now: Instant) -> SlotView {
        SlotView {
            running: running.map(str::to_string),
            lent,
            starting: false,
            usable,
            idle_since: now - Duration::from_secs(idle_secs_ago),
        }
    }

    #[test]
    fn an_operation_is_followed_where_it_runs_before_anything_else() {
        let now = Instant::now();
        let slots = [view(None, false, true, 1, now), view(Some("op"), false, true, 5, now)];
        assert_eq!(pick(&slots, "op", None, 2), Pick::Follow(1));
        assert_eq!(pick(&slots, "other", None, 2), Pick::Lend(0));
    }

    #[test]
    fn the_most_recently_used_free_agent_is_lent_so_others_can_idle_out() {
        let now = Instant::now();
        let slots = [view(None, false, true, 30, now), view(None, false, true, 2, now), view(None, true, true, 0, now)];
        assert_eq!(pick(&slots, "op", None, 3), Pick::Lend(1));
    }

    #[test]
    fn the_agent_that_ran_the_workspace_last_is_lent_when_it_is_free() {
        let now = Instant::now();
        let slots = [view(None, false, true, 30, now), view(None, false, true, 2, now), view(None, true, true, 0, now)];
        assert_eq!(pick(&slots, "op", Some(0), 3), Pick::Lend(0), "its agent, though another was used more recently");
        assert_eq!(pick(&slots, "op", Some(2), 3), Pick::Lend(1), "its agent is busy: any free one, never a wait");
        assert_eq!(pick(&slots, "op", Some(7), 3), Pick::Lend(1), "its agent is gone");
        let running = [view(None, false, true, 1, now), view(Some("op"), false, true, 5, now)];
        assert_eq!(pick(&running, "op", Some(0), 2), Pick::Follow(1), "an operation is followed where it runs");
    }

    #[test]
    fn a_busy_pool_grows_to_its_maximum_and_then_makes_operations_wait() {
        let now = Instant::now();
        let busy = view(Some("a"), true, true, 0, now);
        let unfollowed = view(Some("b"), false, true, 0, now);
        assert_eq!(pick(std::slice::from_ref(&busy), "op", None, 2), Pick::Start);
        assert_eq!(
            pick(&[busy.clone(), unfollowed.clone()], "op", None, 2),
            Pick::Full,
            "an agent running an unfollowed operation is not free"
        );
        assert_eq!(pick(&[], "op", None, 0), Pick::Start, "a maximum of 0 is taken as 1");
        let dead = view(None, false, false, 0, now);
        assert_eq!(pick(&[busy, dead], "op", None, 2), Pick::Start, "a dead agent does not count");
        let draining = view(Some("op"), false, false, 0, now);
        assert_eq!(
            pick(&[draining], "op", None, 1),
            Pick::Start,
            "an interrupted agent is not followed: the operation goes elsewhere"
        );
    }

    #[test]
    fn idle_agents_stop_after_the_timeout_down_to_the_minimum() {
        let now = Instant::now();
        let t = Duration::from_secs(60);
        let slots = [
            view(None, false, true, 90, now),
            view(None, false, true, 120, now),
            view(None, false, true, 10, now),
            view(Some("a"), true, true, 300, now),
        ];
        assert_eq!(idle_out(&slots, 0, t, now), vec![1, 0], "longest idle first; busy and recent stay");
        assert_eq!(idle_out(&slots, 3, t, now), vec![1], "three of four stay");
        assert_eq!(idle_out(&slots, 4, t, now), Vec::<usize>::new());
        assert_eq!(idle_out(&slots, 0, Duration::ZERO, now), vec![1, 0, 2]);
    }
}
