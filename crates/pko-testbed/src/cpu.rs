//! CPU time spent during a bench phase, from `/proc`: the whole machine's busy time and named processes' own
//! (`utime + stime` of `/proc/<pid>/stat`), in seconds. For the benches' side-by-side reports: where an operation's
//! cores went (Pulumi, the operator, the API server).

use std::path::Path;

/// Clock ticks per second of `/proc`'s times (`USER_HZ`, 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// A snapshot to measure from ([`CpuMeter::start`]).
#[derive(Debug, Clone)]
pub struct CpuMeter {
    machine: u64,
    processes: Vec<(String, i32, u64)>,
}

/// The CPU seconds spent since a [`CpuMeter`] started: the machine's busy time (every core, every process, the
/// kernel) and each named process's own.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuUse {
    /// Busy seconds of all cores (`/proc/stat`'s `cpu` line less idle and iowait).
    pub machine: f64,
    /// Each name's seconds: the processes given that name, summed (their threads; not their children).
    pub processes: Vec<(String, f64)>,
}

impl CpuMeter {
    /// Starts measuring the machine and `processes` (name, pid); a process that is gone counts zero.
    pub fn start(processes: &[(String, i32)]) -> CpuMeter {
        let processes = processes.iter().map(|(n, pid)| (n.clone(), *pid, process_ticks(*pid))).collect();
        CpuMeter { machine: machine_busy_ticks(), processes }
    }

    /// What was spent since [`CpuMeter::start`]; processes of one name summed, in the order first given.
    pub fn spent(&self) -> CpuUse {
        let seconds = |ticks: u64| ticks as f64 / TICKS_PER_SECOND;
        let mut processes: Vec<(String, f64)> = Vec::new();
        for (n, pid, t0) in &self.processes {
            let s = seconds(process_ticks(*pid).saturating_sub(*t0));
            match processes.iter_mut().find(|(seen, _)| seen == n) {
                Some((_, sum)) => *sum += s,
                None => processes.push((n.clone(), s)),
            }
        }
        CpuUse { machine: seconds(machine_busy_ticks().saturating_sub(self.machine)), processes }
    }
}

impl std::fmt::Display for CpuUse {
    /// `machine 61.2 CPU-s (operator 4.1, kube-apiserver 6.0, etcd 1.2)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let each: Vec<String> = self.processes.iter().map(|(n, s)| format!("{n} {s:.1}")).collect();
        write!(f, "machine {:.1} CPU-s ({})", self.machine, each.join(", "))
    }
}

/// The bed's control-plane processes (name, pid) from its `pids` file (`name pid` lines): etcd, redis,
/// kube-apiserver, the controller manager, the scheduler.
pub fn control_plane(run_dir: &Path) -> Vec<(String, i32)> {
    let text = std::fs::read_to_string(run_dir.join("pids")).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(n, pid)| Some((n.to_string(), pid.trim().parse().ok()?)))
        .collect()
}

/// The running processes whose command (`/proc/<pid>/comm`, at most 15 bytes) is `comm`, each named `comm`.
pub fn named(comm: &str) -> Vec<(String, i32)> {
    let pids = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    pids.filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm))
        .map(|pid| (comm.to_string(), pid))
        .collect()
}

/// Busy ticks of all cores since boot: `/proc/stat`'s first line, every field but idle (4th) and iowait (5th).
fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    busy_ticks(stat.lines().next().unwrap_or_default())
}

/// Busy ticks of a `/proc/stat` `cpu` line (guest time is already within user time, so it is left out). Pure.
fn busy_ticks(line: &str) -> u64 {
    let fields: Vec<u64> = line.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    fields.iter().take(8).enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, t)| t).sum()
}

/// `utime + stime` ticks of process `pid` (0 when it is gone).
fn process_ticks(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|s| stat_ticks(&s)).unwrap_or(0)
}

/// `utime + stime` of a `/proc/<pid>/stat` line, read after the command's closing parenthesis (a command may hold
/// spaces). Pure.
fn stat_ticks(stat: &str) -> u64 {
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    // after ")": state is field 3 of the line; utime and stime are fields 14 and 15
    let at = |i: usize| fields.get(i - 3).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    at(14) + at(15)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_ticks_leave_out_idle_and_iowait_and_guest_time() {
        assert_eq!(busy_ticks("cpu  10 2 30 400 50 6 7 8 90 100"), 10 + 2 + 30 + 6 + 7 + 8);
    }

    #[test]
    fn processes_are_found_by_command_and_those_of_one_name_are_summed() {
        let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
        let me = std::process::id() as i32;
        assert!(named(comm.trim()).iter().any(|(_, pid)| *pid == me), "this process is found by its command");
        let meter = CpuMeter::start(&[("me".into(), me), ("me".into(), me)]);
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(200) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let spent = meter.spent();
        assert_eq!(spent.processes.len(), 1, "one name, one sum: {spent}");
        assert!(spent.processes[0].1 > 0.0 && spent.machine > 0.0, "{spent}");
    }

    #[test]
    fn a_process_s_ticks_are_its_user_and_system_time_whatever_its_command() {
        let stat = "4242 (tokio runtime) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 3 4 20 0 9 0 1000 1 1";
        assert_eq!(stat_ticks(stat), 325);
    }
}
