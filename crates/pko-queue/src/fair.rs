//! The order in which a replica starts jobs (no locking; the caller passes the clock to [`Fair::take`]): deduplicated
//! by key, round-robin across namespaces, each namespace held to its [`NamespaceLimits`], and delayed jobs held until
//! they are due. A namespace with 1,000 queued jobs gets one turn in each round, like a namespace with 3, so it cannot
//! starve it.
//!
//! The share is work-conserving: a free worker goes first to a namespace under its share, and only when no namespace
//! with a job waiting is under its share is it lent to one over its share (never past its cap). Lent workers come back
//! at the next dispatch: the next free worker goes to the waiting namespace under its share. Running operations are
//! never stopped to give a worker back.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet, VecDeque};
use std::time::Instant;

use crate::{Job, NamespaceLimits};

/// Jobs waiting, delayed or in flight, in round-robin order over namespaces.
#[derive(Debug, Default)]
pub struct Fair {
    jobs: HashMap<String, (Job, Instant)>,
    ready: BTreeMap<String, VecDeque<String>>,
    rotation: VecDeque<String>,
    delayed: BinaryHeap<Reverse<(Instant, String)>>,
    /// When each delayed job is due: an entry of `delayed` counts only while it matches (a job woken early, or done
    /// and pushed again, leaves a stale entry behind).
    due: HashMap<String, Instant>,
    in_flight: HashSet<String>,
    /// Jobs pushed under a newer epoch while a job with their key was in flight under an older one: queued when that
    /// one is done (its driver was fenced; the shard's new holder must run it).
    after: HashMap<String, Job>,
    running: HashMap<String, usize>,
    limits: NamespaceLimits,
}

impl Fair {
    /// A queue holding each namespace to `limits`.
    pub fn new(limits: NamespaceLimits) -> Self {
        Self { limits, ..Default::default() }
    }

    fn running(&self, namespace: &str) -> usize {
        self.running.get(namespace).copied().unwrap_or(0)
    }

    /// Whether `job` only renews a job with its key already here: `true` when one is queued, delayed or in flight under
    /// the same or a newer epoch (nothing to do). A waiting one under an older epoch takes `job`'s epoch in place; an
    /// in-flight one under an older epoch is followed by `job` once it is done (a fenced driver must not swallow the
    /// push of the shard's new holder).
    fn absorbed(&mut self, job: &Job) -> bool {
        let Some((held, _)) = self.jobs.get_mut(&job.key) else { return false };
        if job.epoch > held.epoch {
            if self.in_flight.contains(&job.key) {
                let later = self.after.get(&job.key).map_or(0, |j| j.epoch);
                if job.epoch > later {
                    self.after.insert(job.key.clone(), job.clone());
                }
            } else {
                *held = job.clone();
            }
        }
        true
    }

    /// Queues `job` now; `false` when a job with its key is queued, delayed or in flight (one under an older epoch is
    /// renewed, see [`Self::absorbed`]).
    pub fn push(&mut self, job: Job) -> bool {
        if self.absorbed(&job) {
            return false;
        }
        self.enqueue(&job.namespace, job.key.clone());
        self.jobs.insert(job.key.clone(), (job, Instant::now()));
        true
    }

    /// Queues `job` once `at` has come; `false` as [`Self::push`].
    pub fn push_at(&mut self, job: Job, at: Instant) -> bool {
        if self.absorbed(&job) {
            return false;
        }
        self.delayed.push(Reverse((at, job.key.clone())));
        self.due.insert(job.key.clone(), at);
        self.jobs.insert(job.key.clone(), (job, Instant::now()));
        true
    }

    /// Queues the delayed job `key` now: last of its namespace, or first (`front`).
    fn release(&mut self, key: String, front: bool) {
        if let Some(ns) = self.jobs.get(&key).map(|j| j.0.namespace.clone()) {
            if front {
                self.enqueue_front(&ns, key);
            } else {
                self.enqueue(&ns, key);
            }
        }
    }

    /// The delayed job `key` is due now, and first of all (what it waited for happened: its agent is free, and the
    /// next worker gives it that agent before a job that came later takes it); `false` when it is not delayed (queued,
    /// in flight, unknown). Its namespace comes next in the rotation: the job had its turn before it was put back.
    pub fn wake(&mut self, key: &str) -> bool {
        if self.due.remove(key).is_none() {
            return false;
        }
        self.release(key.to_string(), true);
        true
    }

    fn enqueue(&mut self, namespace: &str, key: String) {
        let list = self.ready.entry(namespace.to_string()).or_default();
        if list.is_empty() && !self.rotation.iter().any(|n| n == namespace) {
            self.rotation.push_back(namespace.to_string());
        }
        list.push_back(key);
    }

    fn enqueue_front(&mut self, namespace: &str, key: String) {
        self.ready.entry(namespace.to_string()).or_default().push_front(key);
        self.rotation.retain(|n| n != namespace);
        self.rotation.push_front(namespace.to_string());
    }

    /// The next job to start at `now`, in flight from now until [`Self::done`]: the first of the next namespace in the
    /// rotation that is under its share, else (lending) under its cap.
    pub fn take(&mut self, now: Instant) -> Option<Job> {
        self.take_with_time(now).map(|(j, _)| j)
    }

    /// [`Self::take`], with when the job was first queued here.
    pub fn take_with_time(&mut self, now: Instant) -> Option<(Job, Instant)> {
        while self.delayed.peek().is_some_and(|Reverse((at, _))| *at <= now) {
            let Some(Reverse((at, key))) = self.delayed.pop() else { break };
            if self.due.get(&key) == Some(&at) {
                self.due.remove(&key);
                self.release(key, false);
            }
        }
        let limits = self.limits;
        self.take_first(|running| limits.under_share(running)).or_else(|| self.take_first(|r| limits.under_cap(r)))
    }

    /// The first job of the next namespace in the rotation whose running count `eligible` accepts; the namespaces
    /// passed over keep their order.
    fn take_first(&mut self, eligible: impl Fn(usize) -> bool) -> Option<(Job, Instant)> {
        for _ in 0..self.rotation.len() {
            let ns = self.rotation.pop_front()?;
            if !eligible(self.running(&ns)) {
                self.rotation.push_back(ns);
                continue;
            }
            let list = self.ready.get_mut(&ns)?;
            let key = list.pop_front();
            if list.is_empty() {
                self.ready.remove(&ns);
            } else {
                self.rotation.push_back(ns.clone());
            }
            let Some((job, queued_at)) = key.and_then(|k| self.jobs.get(&k).cloned()) else { continue };
            self.in_flight.insert(job.key.clone());
            *self.running.entry(ns).or_default() += 1;
            return Some((job, queued_at));
        }
        None
    }

    /// Why the queued job `key` is not started: its namespace runs `(running, limit)` operations, all it may — its
    /// cap, or its share while another namespace under its share has a job waiting (that one gets the next free
    /// worker). `None`: it is not queued (in flight, delayed, unknown), or it waits only for its turn or a free worker.
    pub fn held_by_limit(&self, key: &str) -> Option<(usize, usize)> {
        let (job, _) = self.jobs.get(key)?;
        let ns = job.namespace.as_str();
        if !self.ready.get(ns).is_some_and(|l| l.iter().any(|k| k == key)) {
            return None;
        }
        let running = self.running(ns);
        if !self.limits.under_cap(running) {
            return Some((running, self.limits.cap));
        }
        let contended = self.ready.keys().any(|other| other != ns && self.limits.under_share(self.running(other)));
        (!self.limits.under_share(running) && contended).then_some((running, self.limits.effective_share()))
    }

    /// When the next delayed job is due, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.delayed.peek().map(|Reverse((at, _))| *at)
    }

    /// The job `key` is finished or abandoned: its key may be pushed again.
    pub fn done(&mut self, key: &str) {
        self.forget(key);
        if let Some(next) = self.after.remove(key) {
            self.push(next);
        }
    }

    fn forget(&mut self, key: &str) {
        let Some((job, _)) = self.jobs.remove(key) else { return };
        self.due.remove(key);
        if self.in_flight.remove(key) {
            if let Some(n) = self.running.get_mut(&job.namespace) {
                *n = n.saturating_sub(1);
            }
        } else if let Some(list) = self.ready.get_mut(&job.namespace) {
            list.retain(|k| k != key);
            if list.is_empty() {
                self.ready.remove(&job.namespace);
                self.rotation.retain(|n| n != &job.namespace);
            }
        }
    }

    /// Forgets the waiting jobs `keep` refuses (a lost shard's); in-flight ones stay until done.
    pub fn retain_waiting(&mut self, keep: impl Fn(&Job) -> bool) {
        let drop: Vec<String> = self
            .jobs
            .values()
            .map(|(j, _)| j)
            .filter(|j| !self.in_flight.contains(&j.key) && !keep(j))
            .map(|j| j.key.clone())
            .collect();
        for k in drop {
            self.done(&k);
        }
    }

    /// Jobs waiting (queued or delayed).
    pub fn waiting(&self) -> usize {
        self.jobs.len() - self.in_flight.len()
    }

    /// Jobs waiting (queued or delayed) per namespace; namespaces with none are absent.
    pub fn waiting_by_namespace(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for (job, _) in self.jobs.values().filter(|(j, _)| !self.in_flight.contains(&j.key)) {
            *out.entry(job.namespace.clone()).or_insert(0) += 1;
        }
        out
    }

    /// Jobs taken and not done.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn job(ns: &str, k: &str) -> Job {
        Job { key: format!("{ns}/{k}"), namespace: ns.into(), name: k.into(), epoch: 1, shard: 0 }
    }

    fn keys(f: &mut Fair, n: usize) -> Vec<String> {
        (0..n).filter_map(|_| f.take(Instant::now()).map(|j| j.key)).collect()
    }

    #[test]
    fn a_push_under_a_newer_epoch_is_not_swallowed_by_a_job_of_an_older_one() {
        let mut f = Fair::new(NamespaceLimits::NONE);
        let old = job("ns", "s011");
        let new = Job { epoch: 2, ..old.clone() };
        // waiting: renewed in place
        assert!(f.push(old.clone()));
        assert!(!f.push(new.clone()));
        assert_eq!(f.take(Instant::now()).map(|j| j.epoch), Some(2));
        f.done(&old.key);
        // in flight under epoch 1 (its driver is being fenced): epoch 2 runs once it is done
        assert!(f.push(old.clone()));
        assert_eq!(f.take(Instant::now()).map(|j| j.epoch), Some(1));
        assert!(!f.push(new.clone()));
        assert!(!f.push(old.clone()), "an older or equal epoch changes nothing");
        assert_eq!(f.take(Instant::now()), None, "the key stays taken while in flight");
        f.done(&old.key);
        assert_eq!(f.take(Instant::now()).map(|j| j.epoch), Some(2), "the new holder's job runs");
        f.done(&old.key);
        assert_eq!((f.waiting(), f.in_flight()), (0, 0));
        // the same epoch while in flight: nothing follows
        assert!(f.push(old.clone()));
        f.take(Instant::now());
        assert!(!f.push(old.clone()));
        f.done(&old.key);
        assert_eq!(f.take(Instant::now()), None);
    }

    #[test]
    fn a_noisy_namespace_does_not_starve_a_quiet_one() {
        let mut f = Fair::new(NamespaceLimits::NONE);
        for i in 0..1000 {
            f.push(job("noisy", &i.to_string()));
        }
        for i in 0..3 {
            f.push(job("quiet", &i.to_string()));
        }
        let first = keys(&mut f, 6);
        assert_eq!(first, ["noisy/0", "quiet/0", "noisy/1", "quiet/1", "noisy/2", "quiet/2"]);
        assert_eq!((f.waiting(), f.in_flight()), (997, 6));
    }

    #[test]
    fn the_per_namespace_cap_holds_and_frees_on_done() {
        let mut f = Fair::new(NamespaceLimits { share: 0, cap: 2 });
        for i in 0..5 {
            f.push(job("a", &i.to_string()));
        }
        f.push(job("b", "0"));
        assert_eq!(keys(&mut f, 5), ["a/0", "b/0", "a/1"], "a at its cap of 2, even with nobody else waiting");
        f.done("a/0");
        assert_eq!(keys(&mut f, 5), ["a/2"]);
    }

    #[test]
    fn one_namespace_alone_uses_every_worker_and_two_busy_ones_split_them() {
        // two workers, share 1 (the default 50 %): the caller takes only while a worker is free
        let mut f = Fair::new(NamespaceLimits { share: 1, cap: 0 });
        for i in 0..4 {
            f.push(job("a", &i.to_string()));
        }
        assert_eq!(keys(&mut f, 2), ["a/0", "a/1"], "alone, a borrows the idle worker");
        f.push(job("b", "0"));
        f.push(job("b", "1"));
        assert_eq!(f.held_by_limit("a/2"), Some((2, 1)), "b waits under its share: a yields");
        assert_eq!(f.held_by_limit("b/0"), None, "b waits only for a free worker");
        f.done("a/0");
        assert_eq!(keys(&mut f, 1), ["b/0"], "the lent worker comes back at the next dispatch");
        f.done("a/1");
        assert_eq!(keys(&mut f, 1), ["a/2"], "one each");
        f.done("b/0");
        assert_eq!(keys(&mut f, 1), ["b/1"], "one each");
        f.done("b/1");
        assert_eq!(keys(&mut f, 1), ["a/3"], "b has nothing waiting: a borrows again");
        assert_eq!(f.held_by_limit("a/3"), None);
    }

    #[test]
    fn a_job_held_by_its_namespaces_limit_says_so() {
        let mut f = Fair::new(NamespaceLimits { share: 1, cap: 2 });
        f.push(job("a", "0"));
        f.push(job("a", "1"));
        f.push(job("a", "2"));
        f.push(job("b", "0"));
        assert_eq!(f.held_by_limit("a/1"), None, "nothing runs yet: it waits for its turn");
        assert_eq!(keys(&mut f, 1), ["a/0"]);
        assert_eq!(f.held_by_limit("a/1"), Some((1, 1)), "at its share while b waits under its own");
        assert_eq!(keys(&mut f, 2), ["b/0", "a/1"], "b first, then a borrows");
        assert_eq!(f.held_by_limit("a/2"), Some((2, 2)), "at its cap, nobody else waiting");
        assert_eq!(f.held_by_limit("a/0"), None, "in flight");
        assert_eq!(f.held_by_limit("nope"), None);
        f.done("a/0");
        assert_eq!(f.held_by_limit("a/2"), None);
    }

    #[test]
    fn dedup_until_done_and_delays() {
        let mut f = Fair::new(NamespaceLimits::NONE);
        let t0 = Instant::now();
        assert!(f.push(job("a", "x")));
        assert!(!f.push(job("a", "x")));
        assert!(f.push_at(job("a", "later"), t0 + Duration::from_secs(5)));
        assert!(!f.push(job("a", "later")), "delayed counts as queued");
        assert_eq!(f.take(t0).map(|j| j.key), Some("a/x".into()));
        assert!(!f.push(job("a", "x")), "in flight");
        assert_eq!(f.take(t0), None, "the delayed job is not due");
        assert_eq!(f.next_due(), Some(t0 + Duration::from_secs(5)));
        assert_eq!(f.take(t0 + Duration::from_secs(5)).map(|j| j.key), Some("a/later".into()));
        f.done("a/x");
        assert!(f.push(job("a", "x")));
    }

    #[test]
    fn a_delayed_job_woken_is_due_at_once_and_only_once() {
        let mut f = Fair::new(NamespaceLimits::NONE);
        let t0 = Instant::now();
        f.push_at(job("a", "held"), t0 + Duration::from_secs(3));
        assert!(f.wake("a/held"));
        assert!(!f.wake("a/held"), "queued already");
        assert!(!f.wake("a/unknown"));
        assert_eq!(keys(&mut f, 3), ["a/held"]);
        assert_eq!(
            f.take(t0 + Duration::from_secs(3)),
            None,
            "its delay's entry is stale: the job is not queued twice"
        );
        f.done("a/held");
        f.push_at(job("a", "x"), t0 + Duration::from_secs(1));
        f.done("a/x");
        assert!(f.push(job("a", "x")), "done while delayed, then pushed again");
        assert_eq!(f.take(t0 + Duration::from_secs(2)).map(|j| j.key), Some("a/x".into()));
        assert_eq!(f.take(t0 + Duration::from_secs(2)), None, "the old delay does not queue it a second time");
    }

    #[test]
    fn a_woken_job_is_taken_before_the_jobs_queued_meanwhile() {
        let mut f = Fair::new(NamespaceLimits::NONE);
        let t0 = Instant::now();
        f.push(job("b", "other"));
        f.push_at(job("a", "held"), t0 + Duration::from_secs(3));
        f.push(job("a", "x"));
        f.push(job("a", "y"));
        assert!(f.wake("a/held"));
        assert_eq!(keys(&mut f, 4), ["a/held", "b/other", "a/x", "a/y"], "first, then the rotation goes on");
        f.push_at(job("a", "late"), t0);
        f.push(job("a", "z"));
        assert_eq!(keys(&mut f, 2), ["a/z", "a/late"], "a delay that simply ran out queues it last");
    }

    #[test]
    fn waiting_jobs_of_a_lost_shard_are_forgotten() {
        let mut f = Fair::new(NamespaceLimits::NONE);
        f.push(Job { shard: 1, ..job("a", "x") });
        f.push(Job { shard: 2, ..job("a", "y") });
        f.retain_waiting(|j| j.shard != 1);
        assert_eq!(keys(&mut f, 3), ["a/y"]);
        assert_eq!(f.waiting(), 0);
    }
}
