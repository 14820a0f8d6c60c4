//! Stale backend locks: a lock left behind by a `pulumi` whose holder is known dead.
//!
//! An agent killed with SIGKILL mid-`up` (a pod OOM-killed, a node lost, a local agent's process group killed) cannot
//! release the stack's lock; every later operation then fails with `UpdateConflict` (PKO has the same wound). Pulumi's
//! DIY backends (`file://`, `s3://`, `gs://`, `azblob://`) name each lock's holder in the conflict message (`created by
//! <user>@<host> (pid <pid>) at <RFC 3339 time>`, `pkg/backend/diy/lock.go`). A holder is **known dead** only when it
//! ran on this agent's host (the same hostname: the same machine for local agents, the same pod for a restarted
//! container) and its pid is gone, a zombie, or now belongs to a process started after the lock was taken. Holders on
//! other hosts are never judged dead here.
//!
//! The runner ([`crate::runner`]) releases the locks with `pulumi cancel` only when **every** holder is known dead, and
//! only inside a `Run` the agent admitted at the operation's newest epoch (so a replica that lost the shard can never
//! cause a release); then it tries the operation once more.

use std::path::Path;

use k8s_openapi::jiff::Timestamp;

pub use pko_proto::locks::{Holder, describe, holders};

/// What is known of a process on this host: its start time and whether it is a zombie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessInfo {
    /// When the process started.
    pub started: Timestamp,
    /// State `Z`: exited, not reaped.
    pub zombie: bool,
}

/// Whether a lock's holder is known dead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Known dead, and why.
    Dead(&'static str),
    /// Still running here (the lock is not stale: the operation waits or conflicts).
    Alive,
    /// Held on another host: not judged from here.
    Elsewhere,
}

/// Judges `holder` from this host (`hostname`), with `process` telling what runs under a pid here (`None`: no such
/// process).
pub fn verdict(holder: &Holder, hostname: &str, process: impl Fn(i32) -> Option<ProcessInfo>) -> Verdict {
    if holder.hostname != hostname {
        return Verdict::Elsewhere;
    }
    match process(holder.pid) {
        None => Verdict::Dead("no process has its pid"),
        Some(p) if p.zombie => Verdict::Dead("its process exited"),
        // the message's time is truncated to the second; allow for it and for clock steps
        Some(p)
            if holder
                .since
                .as_deref()
                .and_then(|t| t.parse::<Timestamp>().ok())
                .is_some_and(|s| p.started > s + std::time::Duration::from_secs(2)) =>
        {
            Verdict::Dead("its pid now belongs to a process started after the lock")
        }
        Some(_) => Verdict::Alive,
    }
}

/// The holders of a conflict to release: all of them when every one is known dead on this host, otherwise none (a live
/// or remote holder keeps its lock).
pub fn stale(text: &str, hostname: &str, process: impl Fn(i32) -> Option<ProcessInfo>) -> Vec<(Holder, &'static str)> {
    match judge(text, hostname, &[], process) {
        Judgement::Release(dead) => dead,
        Judgement::WaitFor(_) | Judgement::Keep => Vec::new(),
    }
}

/// What a conflict calls for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// Every holder is known dead: release their locks (the holders, and why each is dead).
    Release(Vec<(Holder, &'static str)>),
    /// Some holders still run on this host and none is elsewhere: wait for these to end, then judge again (an agent's
    /// `pulumi` that its supervisor is stopping, or another operation finishing).
    WaitFor(Vec<Holder>),
    /// A holder on another host, or none named (the Pulumi Cloud's conflict): nothing to do here.
    Keep,
}

/// Why a holder on another host is released: the operator judged it dead.
pub const RELEASED_BY_OPERATOR: &str = "its host is gone: judged by the operator on an unlock request";

/// Judges every holder of the conflict in `text` from this host (see [`verdict`]); a holder on another host is dead
/// when `released` (`(who, pid)` pairs the operator judged dead on an unlock request) names it.
pub fn judge(
    text: &str,
    hostname: &str,
    released: &[(String, i32)],
    process: impl Fn(i32) -> Option<ProcessInfo>,
) -> Judgement {
    let (mut dead, mut alive) = (Vec::new(), Vec::new());
    let all = holders(text);
    if all.is_empty() {
        return Judgement::Keep;
    }
    for h in all {
        match verdict(&h, hostname, &process) {
            Verdict::Dead(why) => dead.push((h, why)),
            Verdict::Alive => alive.push(h),
            Verdict::Elsewhere if released.iter().any(|(who, pid)| *who == h.who && *pid == h.pid) => {
                dead.push((h, RELEASED_BY_OPERATOR))
            }
            Verdict::Elsewhere => return Judgement::Keep,
        }
    }
    if alive.is_empty() { Judgement::Release(dead) } else { Judgement::WaitFor(alive) }
}

/// Start time and state of process `pid` from `proc` (normally `/proc`): `/proc/<pid>/stat` fields 3 (state) and 22
/// (start time in clock ticks after boot, `USER_HZ` = 100 on Linux) and `btime` of `/proc/stat`. `None` when there is
/// no such process.
pub fn process_info(proc: &Path, pid: i32) -> Option<ProcessInfo> {
    if pid <= 0 {
        return None;
    }
    let stat = std::fs::read_to_string(proc.join(pid.to_string()).join("stat")).ok()?;
    // the command name (field 2) may hold spaces and parentheses: fields after the last ')'
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let zombie = fields.first() == Some(&"Z");
    let ticks: i64 = fields.get(19)?.parse().ok()?;
    let btime: i64 = std::fs::read_to_string(proc.join("stat"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let started = Timestamp::from_millisecond(btime * 1000 + ticks * 10).ok()?;
    Some(ProcessInfo { started, zombie })
}

/// This host's name as `pulumi` records it in a lock (`os.Hostname()`); empty when unknown.
pub fn hostname() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFLICT: &str = "error: the stack is currently locked by 2 lock(s). Either wait for the other process(es) \
        to end or delete the lock file with `pulumi cancel`.
  file:///tmp/b/.pulumi/locks/organization/p/dev/1.json: created by root@node-a (pid 4242) at 2026-11-23T11:00:00Z
  file:///tmp/b/.pulumi/locks/organization/p/dev/2.json: created by ci@corp@node-a (pid 77) at 2026-11-23T12:00:00+01:00
";

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_holder_is_dead_only_on_this_host_with_its_pid_gone_exited_or_reused() {
        let h = &holders(CONFLICT)[0];
        let at = |t: &str, zombie| {
            let started = ts(t);
            move |_| Some(ProcessInfo { started, zombie })
        };
        assert_eq!(verdict(h, "node-b", |_| None), Verdict::Elsewhere, "another host's holder is never judged");
        assert_eq!(verdict(h, "node-a", |_| None), Verdict::Dead("no process has its pid"));
        assert_eq!(verdict(h, "node-a", at("2026-11-23T10:59:00Z", true)), Verdict::Dead("its process exited"));
        assert_eq!(
            verdict(h, "node-a", at("2026-11-23T10:59:00Z", false)),
            Verdict::Alive,
            "started before the lock: the holder"
        );
        assert_eq!(
            verdict(h, "node-a", at("2026-11-23T11:00:01Z", false)),
            Verdict::Alive,
            "within the message's second precision"
        );
        assert!(
            matches!(verdict(h, "node-a", at("2026-11-23T11:05:00Z", false)), Verdict::Dead(_)),
            "the pid was reused"
        );
    }

    #[test]
    fn locks_are_released_only_when_every_holder_is_dead() {
        assert_eq!(stale(CONFLICT, "node-a", |_| None).len(), 2);
        let one_alive = |pid| (pid == 77).then_some(ProcessInfo { started: ts("2026-11-23T10:00:00Z"), zombie: false });
        assert!(stale(CONFLICT, "node-a", one_alive).is_empty());
        assert!(stale(CONFLICT, "node-b", |_| None).is_empty());
        assert!(
            stale("error: [409] Conflict: Another update is currently in progress.", "node-a", |_| None).is_empty(),
            "the Pulumi Cloud's conflict names no holder"
        );
    }

    #[test]
    fn live_holders_on_this_host_are_waited_for_and_remote_ones_are_left_alone() {
        let one_alive = |pid| (pid == 77).then_some(ProcessInfo { started: ts("2026-11-23T10:00:00Z"), zombie: false });
        match judge(CONFLICT, "node-a", &[], one_alive) {
            Judgement::WaitFor(h) => assert_eq!(h.iter().map(|h| h.pid).collect::<Vec<_>>(), vec![77]),
            other => panic!("{other:?}"),
        }
        assert!(matches!(judge(CONFLICT, "node-a", &[], |_| None), Judgement::Release(d) if d.len() == 2));
        assert_eq!(judge(CONFLICT, "node-b", &[], one_alive), Judgement::Keep);
        assert_eq!(judge("error: [409] Conflict", "node-a", &[], |_| None), Judgement::Keep);
    }

    #[test]
    fn remote_holders_the_operator_judged_dead_are_released_and_no_others() {
        let all = holders(CONFLICT);
        let named: Vec<(String, i32)> = all.iter().map(|h| (h.who.clone(), h.pid)).collect();
        match judge(CONFLICT, "node-b", &named, |_| None) {
            Judgement::Release(d) => assert!(d.iter().all(|(_, why)| *why == RELEASED_BY_OPERATOR) && d.len() == 2),
            other => panic!("{other:?}"),
        }
        // one holder not named (another pid under the same user@host): kept
        assert_eq!(judge(CONFLICT, "node-b", &named[..1], |_| None), Judgement::Keep);
        let wrong_pid: Vec<(String, i32)> = named.iter().map(|(w, p)| (w.clone(), p + 1)).collect();
        assert_eq!(judge(CONFLICT, "node-b", &wrong_pid, |_| None), Judgement::Keep);
    }

    #[test]
    fn this_process_is_found_in_proc_and_a_free_pid_is_not() {
        let me = process_info(Path::new("/proc"), std::process::id() as i32).expect("this test's own process");
        assert!(!me.zombie);
        assert!(
            me.started <= Timestamp::now() && me.started > Timestamp::now() - std::time::Duration::from_secs(24 * 3600)
        );
        assert_eq!(process_info(Path::new("/proc"), i32::MAX), None);
        assert_eq!(process_info(Path::new("/proc"), 0), None);
    }
}
