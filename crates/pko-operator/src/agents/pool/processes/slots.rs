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
    /// These slots, which ran the Workspace, are busy while another is free or could be started: hold the operation
    /// for them if it may still wait ([`crate::agents::pool::Affinity::hold`]), else pick again with none warm.
    Hold(Vec<usize>),
}

/// Chooses the agent for operation `op` among `slots` of a pool of at most `max` agents: the one that runs it already,
/// else the first free one of `warm` (the slots that ran the Workspace, the most recent first,
/// [`crate::agents::pool::Affinity`]), or a hold for them when they are all alive and busy; else the free agent used
/// most recently (so the others reach their idle timeout), else a new one while fewer than `max` exist (dead ones do
/// not count), else none. A hold is never answered when nothing else could run the operation either ([`Pick::Full`]).
pub fn pick(slots: &[SlotView], op: &str, warm: &[usize], max: usize) -> Pick {
    if let Some(i) = slots.iter().position(|s| s.usable && s.running.as_deref() == Some(op)) {
        return Pick::Follow(i);
    }
    let warm: Vec<usize> = warm.iter().copied().filter(|i| slots.get(*i).is_some_and(|s| s.usable)).collect();
    if let Some(i) = warm.iter().copied().find(|i| slots[*i].free()) {
        return Pick::Lend(i);
    }
    let other = slots.iter().enumerate().filter(|(_, s)| s.free()).max_by_key(|(_, s)| s.idle_since).map(|(i, _)| i);
    let can_start = slots.iter().filter(|s| s.usable || s.starting).count() < max.max(1);
    match other {
        Some(_) if !warm.is_empty() => Pick::Hold(warm),
        None if can_start && !warm.is_empty() => Pick::Hold(warm),
        Some(i) => Pick::Lend(i),
        None if can_start => Pick::Start,
        None => Pick::Full,
    }
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
        assert_eq!(pick(&slots, "op", &[], 2), Pick::Follow(1));
        assert_eq!(pick(&slots, "other", &[], 2), Pick::Lend(0));
    }

    #[test]
    fn the_most_recently_used_free_agent_is_lent_so_others_can_idle_out() {
        let now = Instant::now();
        let slots = [view(None, false, true, 30, now), view(None, false, true, 2, now), view(None, true, true, 0, now)];
        assert_eq!(pick(&slots, "op", &[], 3), Pick::Lend(1));
    }

    #[test]
    fn an_agent_that_ran_the_workspace_is_lent_when_it_is_free() {
        let now = Instant::now();
        let slots = [view(None, false, true, 30, now), view(None, false, true, 2, now), view(None, true, true, 0, now)];
        assert_eq!(pick(&slots, "op", &[0], 3), Pick::Lend(0), "its agent, though another was used more recently");
        assert_eq!(pick(&slots, "op", &[2, 0], 3), Pick::Lend(0), "the most recent of them is busy: the next");
        assert_eq!(pick(&slots, "op", &[2], 3), Pick::Hold(vec![2]), "its agent is busy while another is free: a hold");
        assert_eq!(pick(&slots, "op", &[7], 3), Pick::Lend(1), "its agent is gone");
        let running = [view(None, false, true, 1, now), view(Some("op"), false, true, 5, now)];
        assert_eq!(pick(&running, "op", &[0], 2), Pick::Follow(1), "an operation is followed where it runs");
    }

    #[test]
    fn an_operation_is_held_for_its_busy_agents_only_while_another_could_run_it() {
        let now = Instant::now();
        let busy = view(Some("a"), true, true, 0, now);
        let free = view(None, false, true, 1, now);
        assert_eq!(pick(&[busy.clone(), free.clone(), busy.clone()], "op", &[2, 0], 3), Pick::Hold(vec![2, 0]));
        assert_eq!(pick(std::slice::from_ref(&busy), "op", &[0], 2), Pick::Hold(vec![0]), "not a new, cold agent");
        assert_eq!(pick(std::slice::from_ref(&busy), "op", &[0], 1), Pick::Full, "nothing else could run it");
        let dead = view(Some("a"), true, false, 0, now);
        assert_eq!(pick(&[dead, free], "op", &[0], 2), Pick::Lend(1), "a dead agent is not waited for");
    }

    #[test]
    fn a_busy_pool_grows_to_its_maximum_and_then_makes_operations_wait() {
        let now = Instant::now();
        let busy = view(Some("a"), true, true, 0, now);
        let unfollowed = view(Some("b"), false, true, 0, now);
        assert_eq!(pick(std::slice::from_ref(&busy), "op", &[], 2), Pick::Start);
        assert_eq!(
            pick(&[busy.clone(), unfollowed.clone()], "op", &[], 2),
            Pick::Full,
            "an agent running an unfollowed operation is not free"
        );
        assert_eq!(pick(&[], "op", &[], 0), Pick::Start, "a maximum of 0 is taken as 1");
        let dead = view(None, false, false, 0, now);
        assert_eq!(pick(&[busy, dead], "op", &[], 2), Pick::Start, "a dead agent does not count");
        let draining = view(Some("op"), false, false, 0, now);
        assert_eq!(
            pick(&[draining], "op", &[], 1),
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
