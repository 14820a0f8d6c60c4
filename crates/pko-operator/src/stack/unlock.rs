//! An unlock request (`pulumi.com/unlock-request`, `kubectl pko unlock`): the Pulumi backend locks the Stack's last
//! Update failed on, released only when every holder is **known dead**.
//!
//! An agent releases by itself the locks of holders on its own host whose process is gone (`pko-agent/src/locks.rs`): a
//! restarted pool or workspace pod keeps its name, a local agent shares its replica's host. What it cannot judge is a
//! holder on another host — a replica's local agent after that replica's pod is gone and its Stacks moved, a pool pod
//! scaled away, or a `pulumi` run outside the operator. This replica judges those from what the API server says, holder
//! by holder ([`judge`], pure): the holder's host must be **ours** (one of the fleet's replicas by its membership
//! Lease, or a pod of the Stack's own workspace or of a pool) and **gone** (no pod of that name, the replica's
//! membership not live), or be this replica's host with no such process. Anything else — a live replica, an existing
//! pod (its agent judges the pid itself), an unknown host such as a laptop — may still be alive, and the request is
//! refused naming it. Judged only while no Update of the Stack runs.
//!
//! Accepted, the next Update carries the holders (`pulumi.com/release-locks`) and its agent, fenced like any other,
//! releases exactly those with `pulumi cancel` when the conflict names no other one.

use std::collections::{BTreeMap, BTreeSet};

use pko_proto::locks::Holder;

/// What the API server and this host say about the holders' hosts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    /// This replica's host name (`gethostname`: its pod's name in a cluster); its local agents run here.
    pub this_host: String,
    /// The fleet's replicas among the holders' hosts, by host (replica id): whether its membership Lease is live
    /// (`pko_fleet::lease`; renewed within its duration).
    pub replicas: BTreeMap<String, bool>,
    /// Holders' hosts that are the name of an existing Pod (in the Stack's or the operator's namespace).
    pub pods: BTreeSet<String>,
    /// Names of the StatefulSets whose pods run this Stack's agents: its Workspace's own (`<workspace>-workspace`) and
    /// the pools (`pko-pool-<class>`, matched as a prefix).
    pub agent_sets: Vec<String>,
}

/// One holder, judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judged {
    /// Known dead, and why.
    Dead(String),
    /// May still be alive, and why.
    MayBeAlive(String),
}

/// Whether `host` is a pod of one of `sets` (`<set>-<ordinal>`, or `pko-pool-…-<ordinal>` for the pools' prefix).
fn agent_pod(host: &str, sets: &[String]) -> bool {
    let Some((set, ordinal)) = host.rsplit_once('-') else { return false };
    !ordinal.is_empty()
        && ordinal.bytes().all(|b| b.is_ascii_digit())
        && sets.iter().any(|s| set == s || (s.ends_with('-') && set.starts_with(s.as_str())))
}

/// Judges `holder` from `facts`; `process_alive` tells whether a pid runs on this host. Pure.
pub fn judge(holder: &Holder, facts: &Facts, process_alive: impl Fn(i32) -> bool) -> Judged {
    let host = holder.hostname.as_str();
    if host == facts.this_host {
        return if process_alive(holder.pid) {
            Judged::MayBeAlive(format!("process {} runs on this replica's host {host}", holder.pid))
        } else {
            Judged::Dead(format!("no process {} runs on this replica's host", holder.pid))
        };
    }
    if facts.pods.contains(host) {
        return Judged::MayBeAlive(format!(
            "pod {host} exists (its agent releases the lock itself once process {} has ended)",
            holder.pid
        ));
    }
    match facts.replicas.get(host) {
        Some(true) => Judged::MayBeAlive(format!("replica {host} is live")),
        Some(false) => Judged::Dead(format!(
            "replica {host} is gone (its membership Lease is not renewed and no pod {host} exists)"
        )),
        None if agent_pod(host, &facts.agent_sets) => Judged::Dead(format!("agent pod {host} no longer exists")),
        None => Judged::MayBeAlive(format!("host {host} is not one of this operator's replicas or agent pods")),
    }
}

/// What an unlock request comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Every holder is known dead: release these; the note names each and why.
    Release(Vec<Holder>, String),
    /// Refused: the note names the holder that may be alive, or says no holder is known.
    Refuse(String),
}

/// The decision on an unlock request for a Stack whose last Update ended with `message` (the holders an agent named
/// there: `pko_proto::locks::describe`). Pure.
pub fn decide(message: Option<&str>, facts: &Facts, process_alive: impl Fn(i32) -> bool) -> Decision {
    let holders = pko_proto::locks::holders(message.unwrap_or_default());
    if holders.is_empty() {
        return Decision::Refuse(
            "no backend lock holder is known: the Stack's last update did not fail on a lock that names its holder"
                .into(),
        );
    }
    let mut dead = Vec::new();
    for h in &holders {
        match judge(h, facts, &process_alive) {
            Judged::Dead(why) => dead.push(format!("{h}: {why}")),
            Judged::MayBeAlive(why) => return Decision::Refuse(format!("the lock held by {h} is kept: {why}")),
        }
    }
    Decision::Release(
        holders,
        format!("releasing {} backend lock(s) with the next update: {}", dead.len(), dead.join("; ")),
    )
}

/// Whether process `pid` runs on this host (`/proc/<pid>` exists).
pub fn process_alive(pid: i32) -> bool {
    pid > 0 && std::path::Path::new("/proc").join(pid.to_string()).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(who: &str, pid: i32) -> Holder {
        pko_proto::locks::holders(&format!("x: created by {who} (pid {pid}) at 2026-11-26T10:00:00Z")).remove(0)
    }

    fn facts() -> Facts {
        Facts {
            this_host: "replica-a".into(),
            replicas: [
                ("replica-a".to_string(), true),
                ("replica-b".to_string(), true),
                ("replica-gone".to_string(), false),
            ]
            .into(),
            pods: ["pko-pool-abc-0".to_string(), "replica-b".to_string()].into(),
            agent_sets: vec!["web-workspace".into(), "pko-pool-".into()],
        }
    }

    #[test]
    fn a_holder_is_dead_only_on_a_host_of_ours_that_is_gone() {
        let f = facts();
        let alive = |pid| pid == 10;
        let dead = |h: &Holder| matches!(judge(h, &f, alive), Judged::Dead(_));
        assert!(!dead(&holder("root@replica-a", 10)), "a live process on this host");
        assert!(dead(&holder("root@replica-a", 11)), "no such process on this host");
        assert!(!dead(&holder("root@replica-b", 11)), "a live replica (its pod exists)");
        assert!(dead(&holder("root@replica-gone", 11)), "a replica whose membership expired and whose pod is gone");
        assert!(!dead(&holder("root@pko-pool-abc-0", 11)), "an existing pool pod judges its own pids");
        assert!(dead(&holder("root@pko-pool-abc-3", 11)), "a pool pod scaled away");
        assert!(dead(&holder("root@web-workspace-0", 11)), "the workspace's own pod, gone");
        assert!(!dead(&holder("me@laptop", 11)), "a host that is not ours");
        assert!(!dead(&holder("me@pko-pool-abc", 11)), "no ordinal: not a pod of the set");
        assert!(!dead(&holder("me@other-workspace-0", 11)), "another Stack's workspace pod");
    }

    #[test]
    fn a_request_releases_only_when_every_holder_is_dead_and_names_the_one_kept() {
        let f = facts();
        let two = format!(
            "{}\n{}",
            "lock: created by root@replica-gone (pid 5) at 2026-11-26T10:00:00Z",
            "lock: created by root@pko-pool-abc-3 (pid 6)"
        );
        match decide(Some(&two), &f, |_| false) {
            Decision::Release(h, note) => {
                assert_eq!(h.len(), 2);
                assert!(
                    note.contains("root@replica-gone (pid 5)") && note.contains("pko-pool-abc-3 no longer exists"),
                    "{note}"
                );
            }
            other => panic!("{other:?}"),
        }
        let with_laptop = format!("{two}\nlock: created by me@laptop (pid 7)");
        match decide(Some(&with_laptop), &f, |_| false) {
            Decision::Refuse(note) => {
                assert!(note.contains("me@laptop (pid 7)") && note.contains("not one of"), "{note}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(decide(Some("error: boom"), &f, |_| false),
                Decision::Refuse(n) if n.contains("no backend lock holder")));
        assert!(matches!(decide(None, &f, |_| false), Decision::Refuse(_)));
    }

    #[test]
    fn this_process_is_alive_and_a_free_pid_is_not() {
        assert!(process_alive(std::process::id() as i32));
        assert!(!process_alive(i32::MAX));
        assert!(!process_alive(0));
    }
}
