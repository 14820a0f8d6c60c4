//! Caches a Stack's own isolated operations keep between them on one agent, and no other Stack's operation ever uses.
//!
//! Each operation of an isolated agent starts with an empty `HOME` and `TMPDIR` ([`crate::sandbox`]). For TypeScript
//! that cost more than the update itself: Pulumi's ts-node (its vendored 7.0.1) keeps the programs it compiled and
//! type-checked in `$TMPDIR/ts-node-*`, and without it every operation type-checked the program against
//! `@pulumi/kubernetes` again (3.4 s of a 6 s `up` on the bed). A Stack's cache directory holds that compile cache
//! (`TS_NODE_CACHE_DIRECTORY`) from one of its operations to the next. Go is the same with more at stake: an isolated
//! operation's empty `HOME` meant an empty build and module cache, so every operation of a Go Stack downloaded its
//! modules and built the Pulumi SDK and its providers' SDKs from nothing (4 min for a `pulumi-kubernetes` program on
//! the bed); the Stack's cache holds `GOCACHE` and `GOMODCACHE` too, unless the Workspace's `env` or the agent's own
//! environment names them (caches the platform chose to share, as the bed's tests do).
//!
//! Why per Stack, not per class or revision: ts-node's entries are keyed by the source's content, not verified on read,
//! so an entry planted by one Stack's program would run in another Stack whose source has the same content; Go's build
//! cache maps an action (compile this package with these inputs) to an output it does not verify either, and its
//! extracted modules are not checked against `go.sum` once extracted. A Stack's
//! cache is used only by that Stack's operations (the key: backend, project and stack, [`StackCaches::open`]), one at a
//! time; what an earlier operation of the same Stack left there is what that Stack's own program wrote — as in PKO's
//! workspace pod, whose `TMPDIR` lives as long as the pod. Between its operations the cache is sealed
//! ([`crate::trees::take_seal`]: inode, size, mode, `ctime` of every entry, kept in the agent's memory, which no
//! operation can reach): a cache another operation changed by absolute path is removed before the Stack uses it again.
//! An agent that starts removes every cache an earlier one left (their seals went with it). The caches are bounded in
//! number ([`MAX_STACKS`]) and in bytes (`pko-agent serve --stack-cache-max-bytes`): the least recently used go first.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::sandbox::create_private_dir;
use crate::trees::{Seal, changed, remove_tree, take_seal};

/// Most Stacks whose caches an agent keeps; the least recently used goes first. A TypeScript compile cache is the
/// program's compiled JavaScript (kilobytes to a few megabytes).
pub const MAX_STACKS: usize = 256;

/// Bytes the caches of an agent's Stacks may hold together by default (`pko-agent serve --stack-cache-max-bytes`):
/// 4 GiB — a few Go Stacks' build caches (842 MiB for a `pulumi-kubernetes` program on the bed), or hundreds of
/// TypeScript compile caches.
pub const MAX_BYTES: u64 = 4 << 30;

/// The caches of the Stacks an agent served, under one root (`<work-dir>/stacks`).
#[derive(Debug)]
pub struct StackCaches {
    root: PathBuf,
    state: Mutex<State>,
    limits: Limits,
}

/// How much the caches may hold: at most `stacks` Stacks' caches, `bytes` bytes of files in all (as sealed). A cache
/// above `bytes` alone is removed when its operation ends.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most Stacks' caches kept ([`MAX_STACKS`] by default).
    pub stacks: usize,
    /// Most bytes of files in all the idle caches ([`MAX_BYTES`] by default).
    pub bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self { stacks: MAX_STACKS, bytes: MAX_BYTES }
    }
}

#[derive(Debug)]
struct Sealed {
    seal: Seal,
    at: u64,
    bytes: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Directory name → the seal taken when the Stack's last operation ended, when (a use counter), its bytes.
    sealed: HashMap<String, Sealed>,
    /// Directory names an operation uses now.
    in_use: HashSet<String>,
    clock: u64,
}

/// A Stack's cache while one of its operations uses it: [`StackCaches::close`] it when the operation ends.
#[derive(Debug)]
pub struct Opened {
    name: String,
    /// The cache directory.
    pub dir: PathBuf,
    /// The cache was found changed since the Stack's last operation and was emptied: this many entries differed.
    pub discarded: usize,
}

impl StackCaches {
    /// The caches under `root`, within `limits`; whatever `root` held (an earlier agent's caches, whose seals are gone)
    /// is removed.
    ///
    /// Errors: `root` cannot be emptied or created.
    pub fn new(root: PathBuf, limits: Limits) -> std::io::Result<Self> {
        remove_tree(&root)?;
        create_private_dir(&root)?;
        Ok(Self { root, state: Mutex::default(), limits })
    }

    /// The cache of the Stack named `key` (`<backend> <project> <stack>`) for one operation: the directory as the
    /// Stack's last operation left it, or empty (first use; found changed since — `discarded` says how many entries
    /// differed). `None` while another operation of the same Stack uses it: that one runs without.
    ///
    /// Errors: the directory could not be read, emptied or created.
    pub fn open(&self, key: &str) -> std::io::Result<Option<Opened>> {
        let name = dir_name(key);
        let dir = self.root.join(&name);
        let sealed = {
            let mut s = self.lock();
            if !s.in_use.insert(name.clone()) {
                return Ok(None);
            }
            s.sealed.remove(&name)
        };
        let discarded = match sealed {
            Some(Sealed { seal, .. }) if dir.is_dir() => changed(&seal, &take_seal(&dir).unwrap_or_default()).len(),
            _ => usize::from(dir.exists()),
        };
        let fresh = discarded > 0 || !dir.is_dir();
        let made = if fresh { remove_tree(&dir).and_then(|()| create_private_dir(&dir)) } else { Ok(()) };
        if let Err(e) = made {
            self.lock().in_use.remove(&name);
            return Err(e);
        }
        Ok(Some(Opened { name, dir, discarded }))
    }

    /// Ends an operation's use of its Stack's cache: sealed as the operation left it, the least recently used caches
    /// beyond the limit removed. A cache that cannot be sealed is removed (its next use starts empty).
    ///
    /// Errors: a cache could not be removed.
    pub fn close(&self, opened: Opened) -> std::io::Result<()> {
        let seal = take_seal(&opened.dir);
        let unsealable = seal.is_err();
        let evict = {
            let mut s = self.lock();
            s.in_use.remove(&opened.name);
            s.clock += 1;
            let now = s.clock;
            // moved, not cloned: with Go's module cache a seal has tens of thousands of entries
            if let Ok(seal) = seal {
                let bytes = seal.values().map(|stamp| stamp.1).sum();
                s.sealed.insert(opened.name.clone(), Sealed { seal, at: now, bytes });
            }
            // moved aside under the lock: an operation opening the same Stack's cache meanwhile starts a fresh one
            let mut aside = Vec::new();
            for name in least_recent(&s, self.limits) {
                s.sealed.remove(&name);
                let to = self.root.join(format!(".evicted-{name}-{now}"));
                if std::fs::rename(self.root.join(&name), &to).is_ok() {
                    aside.push(to);
                }
            }
            aside
        };
        if unsealable {
            remove_tree(&opened.dir)?;
        }
        for dir in evict {
            remove_tree(&dir)?;
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Opened {
    /// The variables that point the operation's tools at the cache, each at a directory of its own in it:
    /// `TS_NODE_CACHE_DIRECTORY` (Pulumi's ts-node), `GOCACHE` (Go's build cache), `GOMODCACHE` (Go's module cache).
    pub fn env(&self) -> [(String, String); 3] {
        let at = |sub: &str| self.dir.join(sub).display().to_string();
        [
            ("TS_NODE_CACHE_DIRECTORY".into(), at("ts-node")),
            ("GOCACHE".into(), at("go-build")),
            ("GOMODCACHE".into(), at("go-mod")),
        ]
    }

    /// Whether this is the cache of the Stack named `key` (what [`StackCaches::open`] was given).
    pub fn is_for(&self, key: &str) -> bool {
        self.name == dir_name(key)
    }

    /// The variables of [`Opened::env`] that neither the operation's `env` nor the agent's own environment
    /// (`inherited`: whether the agent's process has the variable) sets: a cache the Workspace or the workspace class
    /// names is the one used. Pure.
    pub fn env_unset(&self, env: &BTreeMap<String, String>, inherited: impl Fn(&str) -> bool) -> Vec<(String, String)> {
        self.env().into_iter().filter(|(k, _)| !env.contains_key(k) && !inherited(k)).collect()
    }
}

/// The idle sealed caches to remove, oldest first, until at most `limits.stacks` caches are kept and the idle ones
/// hold at most `limits.bytes`. Pure.
fn least_recent(s: &State, limits: Limits) -> Vec<String> {
    let mut idle: Vec<(&String, &Sealed)> = s.sealed.iter().filter(|(n, _)| !s.in_use.contains(*n)).collect();
    idle.sort_by_key(|(_, c)| c.at);
    let mut count = s.sealed.len() + s.in_use.len();
    let mut bytes: u64 = idle.iter().map(|(_, c)| c.bytes).sum();
    let mut out = Vec::new();
    for (name, c) in idle {
        if count <= limits.stacks && bytes <= limits.bytes {
            break;
        }
        out.push(name.clone());
        count -= 1;
        bytes -= c.bytes;
    }
    out
}

/// The directory of the Stack `key`: 32 hex digits of its SHA-256 (a Stack's name never reaches a path). Pure.
fn dir_name(key: &str) -> String {
    let d = Sha256::digest(key.as_bytes());
    d.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn caches(max: usize) -> (tempfile::TempDir, StackCaches) {
        let base = tempfile::tempdir().unwrap();
        let c = StackCaches::new(base.path().join("stacks"), Limits { stacks: max, bytes: MAX_BYTES }).unwrap();
        (base, c)
    }

    #[test]
    fn a_stacks_cache_outlives_its_operation_and_no_other_stack_gets_it() {
        let (_base, c) = caches(8);
        let a = c.open("file:///s proj a").unwrap().unwrap();
        std::fs::write(a.dir.join("entry.js"), "compiled").unwrap();
        let dir = a.dir.clone();
        c.close(a).unwrap();
        let again = c.open("file:///s proj a").unwrap().unwrap();
        assert_eq!((again.dir.clone(), again.discarded), (dir.clone(), 0));
        assert_eq!(std::fs::read_to_string(again.dir.join("entry.js")).unwrap(), "compiled");
        let b = c.open("file:///s proj b").unwrap().unwrap();
        assert_ne!(b.dir, dir);
        assert!(std::fs::read_dir(&b.dir).unwrap().next().is_none(), "another Stack's cache starts empty");
        c.close(again).unwrap();
        c.close(b).unwrap();
    }

    #[test]
    fn a_cache_changed_between_its_stacks_operations_is_emptied() {
        let (_base, c) = caches(8);
        let a = c.open("k").unwrap().unwrap();
        std::fs::write(a.dir.join("entry.js"), "compiled").unwrap();
        let dir = a.dir.clone();
        c.close(a).unwrap();
        // another operation, by absolute path: same content written back, still a change (ctime)
        std::fs::write(dir.join("entry.js"), "compiled").unwrap();
        let again = c.open("k").unwrap().unwrap();
        assert_eq!(again.discarded, 1);
        assert!(!again.dir.join("entry.js").exists());
        c.close(again).unwrap();
        // a planted file
        std::fs::write(dir.join("planted.js"), "x").unwrap();
        let third = c.open("k").unwrap().unwrap();
        assert!(third.discarded > 0 && !third.dir.join("planted.js").exists());
        c.close(third).unwrap();
    }

    #[test]
    fn a_second_operation_of_a_stack_runs_without_while_the_first_holds_it() {
        let (_base, c) = caches(8);
        let a = c.open("k").unwrap().unwrap();
        assert!(c.open("k").unwrap().is_none());
        c.close(a).unwrap();
        assert!(c.open("k").unwrap().is_some());
    }

    #[test]
    fn a_cache_an_earlier_agent_left_is_never_used() {
        let base = tempfile::tempdir().unwrap();
        let first = StackCaches::new(base.path().join("stacks"), Limits::default()).unwrap();
        let a = first.open("k").unwrap().unwrap();
        std::fs::write(a.dir.join("entry.js"), "compiled").unwrap();
        first.close(a).unwrap();
        drop(first);
        let next = StackCaches::new(base.path().join("stacks"), Limits::default()).unwrap();
        let a = next.open("k").unwrap().unwrap();
        assert!(!a.dir.join("entry.js").exists());
    }

    #[test]
    fn the_least_recently_used_caches_go_beyond_the_limit() {
        let (_base, c) = caches(2);
        for k in ["a", "b", "c"] {
            let o = c.open(k).unwrap().unwrap();
            std::fs::write(o.dir.join("f"), k).unwrap();
            c.close(o).unwrap();
        }
        assert_eq!(std::fs::read_dir(&c.root).unwrap().count(), 2);
        assert!(!c.root.join(dir_name("a")).exists());
        for k in ["b", "c"] {
            assert_eq!(std::fs::read_to_string(c.root.join(dir_name(k)).join("f")).unwrap(), k);
        }
    }

    #[test]
    fn the_least_recently_used_caches_go_beyond_the_bytes() {
        let base = tempfile::tempdir().unwrap();
        let c = StackCaches::new(base.path().join("stacks"), Limits { stacks: 8, bytes: 2500 }).unwrap();
        for (k, size) in [("a", 1000), ("b", 1000), ("c", 1000), ("huge", 3000)] {
            let o = c.open(k).unwrap().unwrap();
            std::fs::write(o.dir.join("f"), vec![b'x'; size]).unwrap();
            c.close(o).unwrap();
            let kept: Vec<bool> = ["a", "b", "c"].iter().map(|k| c.root.join(dir_name(k)).exists()).collect();
            let expected = match k {
                "a" => [true, false, false],
                "b" => [true, true, false],
                "c" => [false, true, true],
                _ => [false, false, false],
            };
            assert_eq!(kept, expected, "after {k}");
        }
        assert!(!c.root.join(dir_name("huge")).exists(), "a cache above the bytes alone is not kept");
    }

    #[test]
    fn go_and_typescript_caches_are_directories_of_the_stacks_cache() {
        let (_base, c) = caches(8);
        let o = c.open("k").unwrap().unwrap();
        let names: Vec<String> = o.env().iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(names, ["TS_NODE_CACHE_DIRECTORY", "GOCACHE", "GOMODCACHE"]);
        for (_, v) in o.env() {
            assert_eq!(Path::new(&v).parent(), Some(o.dir.as_path()));
        }
        let env = BTreeMap::from([("GOCACHE".to_string(), "/workspace/go-build".to_string())]);
        let unset: Vec<String> = o.env_unset(&env, |k| k == "GOMODCACHE").into_iter().map(|(k, _)| k).collect();
        assert_eq!(unset, ["TS_NODE_CACHE_DIRECTORY"], "the Workspace's and the agent's own caches are kept");
        c.close(o).unwrap();
    }
}
