//! Every process an operation starts ends with it, and with its agent.
//!
//! Pulumi starts its language host and provider plugins in process groups of their own, and a program may start daemons
//! (`nohup … &`, a double fork): killing the agent's process group misses them, and a `pulumi` orphaned by an agent
//! killed alone keeps the stack's backend lock. So the agent runs every `pulumi` command under a *supervisor*, the
//! agent binary itself (`pko-agent supervise --parent <agent pid> -- <program> <args>`), which:
//!
//! - starts a session of its own (a signal to the agent's process group does not reach it);
//! - is a child subreaper (`PR_SET_CHILD_SUBREAPER`): every process of the operation that loses its parent — a plugin
//!   of a killed `pulumi`, a daemon of the program — becomes its child, so the supervisor's descendants are exactly
//!   the operation's processes;
//! - dies with its agent (`PR_SET_PDEATHSIG` = SIGTERM, and it exits at once when the agent was already gone before
//!   that was set);
//! - forwards SIGINT (Pulumi's Ctrl-C, the graceful stop) and SIGHUP/SIGQUIT to the program;
//! - on SIGTERM (the agent's hard stop, or the agent's death), and whenever the program exits, kills every descendant
//!   left (SIGKILL, until none is left) and reaps them, then exits with the program's status (128 + signal when it was
//!   killed), so nothing of an operation outlives it.
//!
//! Leftovers are named on standard error (`pko-agent: stopped N process(es) …`), which the agent publishes on the
//! operation's log. The supervisor is single-threaded and starts before any runtime, so blocking the handled signals
//! and waiting for them with `sigwait` is sound.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// The agent's subcommand that runs a program under supervision.
pub const SUBCOMMAND: &str = "supervise";

/// How the agent starts supervised commands: the supervisor binary (the agent's own executable).
#[derive(Debug, Clone)]
pub struct Supervisor {
    /// The `pko-agent` binary.
    pub binary: PathBuf,
}

impl Supervisor {
    /// The running agent's own executable as supervisor (`/proc/self/exe`).
    ///
    /// Errors: the executable's path cannot be read.
    pub fn current() -> std::io::Result<Self> {
        Ok(Self { binary: std::env::current_exe()? })
    }

    /// A command that runs `program` under this supervisor, with the calling process as the parent it dies with.
    /// Arguments added to the returned command go to `program`.
    pub fn command(&self, program: &Path) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.binary);
        c.arg(SUBCOMMAND).arg("--parent").arg(std::process::id().to_string()).arg("--").arg(program);
        c
    }
}

/// Signals the supervisor waits for.
fn handled() -> SigSet {
    let mut set = SigSet::empty();
    for s in [Signal::SIGCHLD, Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT] {
        set.add(s);
    }
    set
}

/// The supervisor's main: runs `command` (program and arguments) as described in the module documentation and returns
/// the exit code to end with. `parent` is the agent's pid: when the supervisor's parent is no longer it once the death
/// signal is armed, the agent is gone and nothing is started (exit code 125).
pub fn run(parent: i32, command: &[OsString]) -> i32 {
    let Some((program, args)) = command.split_first() else {
        eprintln!("pko-agent supervise: no program given");
        return 125;
    };
    // best effort: without them the supervisor still forwards signals and kills its own children
    let _ = nix::unistd::setsid();
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGTERM);
    if nix::unistd::getppid().as_raw() != parent {
        eprintln!("pko-agent supervise: the agent (pid {parent}) is gone; not starting {}", program.to_string_lossy());
        return 125;
    }
    let signals = handled();
    if let Err(e) = signals.thread_block() {
        eprintln!("pko-agent supervise: blocking signals: {e}");
        return 125;
    }
    // the child starts with an empty signal mask (the standard library resets it)
    let child = match std::process::Command::new(program).args(args).spawn() {
        Ok(c) => Pid::from_raw(c.id() as i32),
        Err(e) => {
            eprintln!("pko-agent supervise: starting {}: {e}", program.to_string_lossy());
            return 127;
        }
    };
    let code = wait_for(child, &signals);
    stop_descendants(Duration::from_secs(10));
    code
}

/// Forwards signals to `child` until it exits or SIGTERM arrives; returns the exit code to end with.
fn wait_for(child: Pid, signals: &SigSet) -> i32 {
    loop {
        match signals.wait() {
            Ok(Signal::SIGCHLD) => {
                if let Some(code) = reap(child) {
                    return code;
                }
            }
            Ok(Signal::SIGTERM) => return 128 + Signal::SIGTERM as i32,
            Ok(sig) => {
                let _ = kill(child, sig);
            }
            Err(_) => {}
        }
    }
}

/// Reaps every exited child; the exit code of `main` once it is among them.
fn reap(main: Pid) -> Option<i32> {
    let mut code = None;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, c)) if pid == main => code = Some(c),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == main => code = Some(128 + sig as i32),
            Ok(WaitStatus::StillAlive) | Err(_) => return code,
            Ok(_) => {}
        }
    }
}

/// Kills every descendant of this process (SIGKILL, again for those that appear meanwhile) and reaps them, for at most
/// `limit`. Names what it stopped on standard error.
fn stop_descendants(limit: Duration) {
    let me = std::process::id() as i32;
    let end = Instant::now() + limit;
    let mut stopped: Vec<(i32, String)> = Vec::new();
    loop {
        let left = descendants(me, &process_table(Path::new("/proc")));
        let _ = reap(Pid::from_raw(0));
        if left.is_empty() || Instant::now() >= end {
            break;
        }
        for (pid, name) in left {
            if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() && !stopped.iter().any(|(p, _)| *p == pid) {
                stopped.push((pid, name));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if !stopped.is_empty() {
        let names: Vec<String> = stopped.iter().map(|(p, n)| format!("{n} (pid {p})")).collect();
        eprintln!("pko-agent: stopped {} process(es) the operation left running: {}", stopped.len(), names.join(", "));
    }
}

/// One process of the table: its pid, parent pid and command name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    /// Process id.
    pub pid: i32,
    /// Parent process id.
    pub ppid: i32,
    /// Command name (`comm`, at most 15 bytes).
    pub name: String,
    /// State `Z`: exited, not reaped (nothing left to kill).
    pub zombie: bool,
}

/// Every process of `proc_root` (normally `/proc`) that could be read.
pub fn process_table(proc_root: &Path) -> Vec<Process> {
    std::fs::read_dir(proc_root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            parse_stat(pid, &std::fs::read_to_string(e.path().join("stat")).ok()?)
        })
        .collect()
}

/// Parses `/proc/<pid>/stat` (`pid (comm) state ppid …`; the name may hold spaces and parentheses, so the fields
/// after it are read from the last `)`). Pure.
pub fn parse_stat(pid: i32, stat: &str) -> Option<Process> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_string();
    let mut rest = stat.get(close + 1..)?.split_whitespace();
    let state = rest.next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some(Process { pid, ppid, name, zombie: state == "Z" })
}

/// The live (not zombie) descendants of `root` in `table`, with their names, parents before children. Pure.
pub fn descendants(root: i32, table: &[Process]) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for c in table.iter().filter(|c| c.ppid == p && c.pid != root) {
            frontier.push(c.pid);
            if !c.zombie {
                out.push((c.pid, c.name.clone()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_names_parse() {
        let p = parse_stat(42, "42 (pulumi-language-yaml) S 7 42 42 0 -1").unwrap();
        assert_eq!((p.pid, p.ppid, p.name.as_str(), p.zombie), (42, 7, "pulumi-language-yaml", false));
        let odd = parse_stat(9, "9 (a) b (c)) Z 3 9").unwrap();
        assert_eq!((odd.name.as_str(), odd.ppid, odd.zombie), ("a) b (c)", 3, true));
        assert!(parse_stat(1, "garbage").is_none());
    }

    #[test]
    fn descendants_are_found_through_every_generation_and_zombies_are_left_out() {
        let p = |pid, ppid, zombie| Process { pid, ppid, name: format!("p{pid}"), zombie };
        let table = vec![
            p(1, 0, false),
            p(10, 1, false),
            p(11, 10, false),
            p(12, 11, false),
            p(13, 10, true),
            p(20, 1, false),
            p(14, 13, false),
        ];
        let mut d: Vec<i32> = descendants(10, &table).into_iter().map(|(pid, _)| pid).collect();
        d.sort();
        assert_eq!(d, vec![11, 12, 14], "children, grandchildren, and a zombie's child; not the zombie, not a sibling");
        assert!(descendants(20, &table).is_empty());
    }
}
