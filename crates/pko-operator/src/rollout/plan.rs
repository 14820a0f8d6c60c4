//! The rollout's next state from the Stacks it governs (pure): which revision it rolls out, which Stacks are admitted
//! to it, when a step is done, paused after, halted. Idempotent: run again on the status it wrote and the same Stacks,
//! it writes the same — so a new holder of the rollout's shard neither skips nor repeats a step.
//!
//! A Stack *wants* revision R while its controller holds it for R or has admitted it (`Stack.status.rollout`); it
//! *runs* R once its last successful update was of R, and *failed* R when its last update of R failed. A step is done
//! when every Stack of it that wants R runs it (or failed, within the budget). Each Stack learns of R on its own (it
//! polls its source, or its Program changed): a Stack that neither wants nor runs R yet but has the same source as
//! one that does (`StackView::source`) is a member that has not learned R yet — its step waits for it, and it may be
//! admitted before it learns (then it updates as soon as it does). So a step is never done, nor a failing step
//! halted, while a Stack of it is still learning of R.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use pko_api::rollout::{RolloutPhase, StackRolloutSpec, StackRolloutStatus, StepRecord};

/// Default of `spec.stepDeadlineSeconds`: 30 minutes.
pub const DEFAULT_STEP_DEADLINE: Duration = Duration::from_secs(1800);

/// How soon a progressing or pausing rollout looks at its Stacks again by itself: 5 seconds (their changes wake it
/// sooner on the replica that holds their shards).
pub const PROGRESS_RECHECK: Duration = Duration::from_secs(5);

/// What the rollout reads of one Stack it governs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StackView {
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// The revision it wants (held or admitted by this rollout), if any.
    pub wants: Option<String>,
    /// The revision of its last successful update.
    pub runs: Option<String>,
    /// The revision of its last update, when that failed.
    pub failed: Option<String>,
    /// Where it takes its revisions from (`None`: unknown): Stacks with the same source learn the same revisions.
    pub source: Option<String>,
}

/// The requests of the rollout's annotations not judged yet.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Requests {
    /// A new `pulumi.com/rollout-abort` value.
    pub abort: Option<String>,
    /// A new `pulumi.com/rollout-resume` value.
    pub resume: Option<String>,
}

/// The step that takes Stacks with `labels`: the first whose labels they carry, else `steps.len()` (the rest). Pure.
pub fn step_of(spec: &StackRolloutSpec, labels: &BTreeMap<String, String>) -> usize {
    spec.steps.iter().position(|s| pko_api::rollout::carries(&s.match_labels, labels)).unwrap_or(spec.steps.len())
}

/// How many of a step's `members` Stacks update at once under `max`: a count, or a percentage rounded up; at least 1;
/// all when unset. Pure.
pub fn max_update(max: Option<&IntOrString>, members: usize) -> usize {
    let n = match max {
        None => members,
        Some(IntOrString::Int(n)) => usize::try_from(*n).unwrap_or(0),
        Some(IntOrString::String(s)) => match s.strip_suffix('%').and_then(|p| p.trim().parse::<usize>().ok()) {
            Some(p) => (members * p).div_ceil(100),
            None => s.trim().parse().unwrap_or(members),
        },
    };
    n.max(1)
}

/// The revision most governed Stacks want (ties: the current one, else the greatest). Pure.
fn target(stacks: &[StackView], current: Option<&str>) -> Option<String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for w in stacks.iter().filter_map(|s| s.wants.as_deref()).filter(|w| !w.is_empty()) {
        *counts.entry(w).or_default() += 1;
    }
    let best = counts.values().copied().max()?;
    if current.is_some_and(|c| counts.get(c) == Some(&best)) {
        return current.map(str::to_string);
    }
    counts.iter().rev().find(|(_, n)| **n == best).map(|(r, _)| r.to_string())
}

fn elapsed(since: Option<&Time>, now: &Time) -> Duration {
    since.and_then(|t| Duration::try_from(now.0.duration_since(t.0)).ok()).unwrap_or_default()
}

/// The rollout's next status, from its `spec`, its `status`, the `stacks` it governs, its `requests` and `now`; and
/// when to look again (`None`: on a change only). Pure.
pub fn advance(
    spec: &StackRolloutSpec,
    status: &StackRolloutStatus,
    stacks: &[StackView],
    requests: &Requests,
    now: &Time,
) -> (StackRolloutStatus, Option<Duration>) {
    let mut st = status.clone();
    if let Some(a) = &requests.abort {
        st.observed_abort = Some(a.clone());
        if st.revision.is_some() && !matches!(st.phase, RolloutPhase::Completed | RolloutPhase::Idle) {
            st.phase = RolloutPhase::Aborted;
            st.message = Some(format!("aborted (pulumi.com/rollout-abort: {a}) at step {}", st.step + 1));
        }
    }
    if let Some(r) = &requests.resume {
        st.observed_resume = Some(r.clone());
        if st.phase == RolloutPhase::Halted {
            st.phase = RolloutPhase::Progressing;
            st.step_started_at = Some(now.clone());
            st.message = None;
        }
    }
    let wanted = target(stacks, st.revision.as_deref());
    if wanted.is_some() && wanted != st.revision {
        st = StackRolloutStatus {
            revision: wanted,
            phase: RolloutPhase::Progressing,
            step: 0,
            step_started_at: Some(now.clone()),
            step_done_at: None,
            admitted: Vec::new(),
            steps: Vec::new(),
            message: None,
            ..st
        };
    }
    let Some(revision) = st.revision.clone() else {
        st.phase = RolloutPhase::Idle;
        return (st, None);
    };
    let sources = stacks
        .iter()
        .filter(|s| s.wants.as_deref() == Some(&revision) || s.runs.as_deref() == Some(&revision))
        .filter_map(|s| s.source.clone())
        .collect();
    let mut r = Run { spec, stacks, revision: &revision, sources, now, st };
    let again = r.go();
    (r.st, again)
}

/// One advance over the revision being rolled out.
struct Run<'a> {
    spec: &'a StackRolloutSpec,
    stacks: &'a [StackView],
    revision: &'a str,
    /// The sources of the Stacks that want or run the revision: every Stack of these learns of it.
    sources: std::collections::BTreeSet<String>,
    now: &'a Time,
    st: StackRolloutStatus,
}

impl<'a> Run<'a> {
    /// The Stacks of step `i` in this revision: those that want or run it, and those still learning of it (the same
    /// source as one that wants or runs it).
    fn members(&self, i: usize) -> Vec<&'a StackView> {
        let (stacks, spec, revision): (&'a [StackView], _, _) = (self.stacks, self.spec, self.revision);
        let sources = &self.sources;
        let part = |s: &&StackView| {
            s.wants.as_deref() == Some(revision)
                || s.runs.as_deref() == Some(revision)
                || s.source.as_ref().is_some_and(|src| sources.contains(src))
        };
        stacks.iter().filter(part).filter(|s| step_of(spec, &s.labels) == i).collect()
    }

    fn admit(&mut self, name: &str) {
        if !self.st.admitted.iter().any(|a| a == name) {
            self.st.admitted.push(name.to_string());
            self.st.admitted.sort();
        }
    }

    fn go(&mut self) -> Option<Duration> {
        match self.st.phase {
            RolloutPhase::Halted | RolloutPhase::Aborted => return None,
            // late learners of a completed revision: nothing holds them any more
            RolloutPhase::Completed => {
                let late: Vec<String> = self
                    .stacks
                    .iter()
                    .filter(|s| s.wants.as_deref() == Some(self.revision))
                    .map(|s| s.name.clone())
                    .collect();
                late.iter().for_each(|n| self.admit(n));
                return None;
            }
            _ => {}
        }
        if self.spec.paused {
            self.st.phase = RolloutPhase::Paused;
            self.st.message = Some(format!("paused at step {} (spec.paused)", self.st.step + 1));
            return Some(PROGRESS_RECHECK);
        }
        self.st.phase = RolloutPhase::Progressing;
        loop {
            let i = usize::try_from(self.st.step).unwrap_or(0);
            // Stacks of started steps that learn of the revision late are admitted at once
            let earlier: Vec<String> = (0..i).flat_map(|j| self.members(j)).map(|s| s.name.clone()).collect();
            earlier.iter().for_each(|n| self.admit(n));
            match self.step(i) {
                Some(again) => return again,
                None if i >= self.spec.steps.len() => {
                    self.st.phase = RolloutPhase::Completed;
                    self.st.message = Some(format!("every Stack that wanted {} runs it", self.revision));
                    return None;
                }
                None => {
                    self.st.step += 1;
                    self.st.step_started_at = Some(self.now.clone());
                    self.st.step_done_at = None;
                }
            }
        }
    }

    /// Step `i`: `Some(when to look again)` while it runs, pauses or halted the rollout; `None` once done and its
    /// pause over.
    fn step(&mut self, i: usize) -> Option<Option<Duration>> {
        let members = self.members(i);
        let runs = |s: &&&StackView| s.runs.as_deref() == Some(self.revision);
        let failed: Vec<String> = members
            .iter()
            .filter(|s| !runs(s) && s.failed.as_deref() == Some(self.revision))
            .map(|s| s.name.clone())
            .collect();
        let done = members.iter().filter(runs).count();
        while self.st.steps.len() <= i {
            self.st.steps.push(StepRecord::default());
        }
        let record = &mut self.st.steps[i];
        record.stacks = members.len() as i32;
        record.failed = failed.len() as i32;
        record.started_at = record.started_at.clone().or_else(|| self.st.step_started_at.clone());
        let budget = usize::try_from(self.spec.failure_budget.unwrap_or(0)).unwrap_or(0);
        if failed.len() > budget {
            let why = format!(
                "step {}: {} Stack(s) failed revision {} (budget {budget}): {}",
                i + 1,
                failed.len(),
                self.revision,
                failed.join(", ")
            );
            return Some(self.halt(i, why));
        }
        if done + failed.len() < members.len() {
            return Some(self.running(i, &members, done, failed.len()));
        }
        let done_at = self.st.step_done_at.clone().unwrap_or_else(|| self.now.clone());
        self.st.step_done_at = Some(done_at.clone());
        self.st.steps[i].done_at = Some(done_at.clone());
        let pause = Duration::from_secs(self.spec.pause_seconds.unwrap_or(0).max(0) as u64);
        let paused_for = elapsed(Some(&done_at), self.now);
        if i < self.spec.steps.len() && paused_for < pause {
            self.st.message = Some(format!("step {} done; pausing {} s before step {}", i + 1, pause.as_secs(), i + 2));
            return Some(Some(pause - paused_for));
        }
        None
    }

    /// Step `i` with Stacks still updating: more admitted up to `maxUpdate`, unless its deadline passed.
    fn running(&mut self, i: usize, members: &[&StackView], done: usize, failed: usize) -> Option<Duration> {
        let deadline =
            self.spec.step_deadline_seconds.map_or(DEFAULT_STEP_DEADLINE, |s| Duration::from_secs(s.max(1) as u64));
        if elapsed(self.st.step_started_at.as_ref(), self.now) > deadline {
            let late: Vec<String> = members
                .iter()
                .filter(|s| s.runs.as_deref() != Some(self.revision) && s.failed.as_deref() != Some(self.revision))
                .take(10)
                .map(|s| s.name.clone())
                .collect();
            let why = format!(
                "step {}: not every Stack runs revision {} within {} s: {}",
                i + 1,
                self.revision,
                deadline.as_secs(),
                late.join(", ")
            );
            return self.halt(i, why);
        }
        let max = max_update(self.spec.steps.get(i).and_then(|s| s.max_update.as_ref()), members.len());
        let open =
            |s: &&&StackView| s.runs.as_deref() != Some(self.revision) && s.failed.as_deref() != Some(self.revision);
        let in_flight = members.iter().filter(open).filter(|s| self.st.admitted.contains(&s.name)).count();
        let next: Vec<String> = members
            .iter()
            .filter(open)
            .filter(|s| !self.st.admitted.contains(&s.name))
            .take(max.saturating_sub(in_flight))
            .map(|s| s.name.clone())
            .collect();
        next.iter().for_each(|n| self.admit(n));
        let steps = self.spec.steps.len() + 1;
        self.st.message = Some(format!(
            "step {} of {steps}: {done} of {} Stack(s) run {}, {failed} failed, up to {max} at once",
            i + 1,
            members.len(),
            self.revision
        ));
        Some(PROGRESS_RECHECK)
    }

    fn halt(&mut self, i: usize, why: String) -> Option<Duration> {
        self.st.phase = RolloutPhase::Halted;
        self.st.steps[i].halted = Some(why.clone());
        self.st.message = Some(format!("halted: {why}; the Stacks not admitted keep their last good revision"));
        None
    }
}

#[cfg(test)]
mod tests;
