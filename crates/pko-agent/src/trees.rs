//! Dependency trees shared by the isolated operations of one prepared revision: linked into each operation's copy of
//! the project, never copied; read-only; verified before every use.
//!
//! A dependency tree is a `node_modules` directory or a Python virtualenv (a directory holding `pyvenv.cfg`) that the
//! revision's `pulumi install` made. At its first use the agent clears every write permission in it and records its
//! seal: for the tree and every entry under it (not following links), the inode, size, mode and change time (`ctime`).
//! Before each later use the seal is taken again and compared. Writing, creating, removing, renaming, linking or
//! re-moding anything in the tree — even undone afterwards (a mode changed back, a file written and restored) —
//! moves a `ctime` or an inode, and no unprivileged process can set a `ctime` back; a tree replaced wholesale has other
//! inodes. A tree that differs is never used again ([`ShareError::Changed`]): the runner discards the revision and
//! prepares it anew. The seal is kept beside the tree (`.<name>.pko-seal`), so a restarted agent verifies what an
//! earlier one shared; it is parsed once per agent and kept in memory while the file is the one read. A check walks the
//! tree once (on up to four threads), comparing as it goes: 27 ms for the bed's TypeScript `node_modules` (15,577
//! entries) where reading the seal file and taking a second seal took 131 ms (`cargo bench -p pko-agent --bench
//! tree_seal`); what the agent's own OS user may write by absolute path is outside this guard
//! (`docs/security.md`).

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Path relative to the tree (empty: the tree itself) → inode, size in bytes, mode, change time (seconds,
/// nanoseconds).
pub type Seal = BTreeMap<PathBuf, Stamp>;

/// One entry's stamp in a [`Seal`]: inode, size in bytes (0 for a directory), mode, change time (seconds,
/// nanoseconds).
pub type Stamp = (u64, u64, u32, i64, i64);

/// Why a shared tree cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    /// The tree changed since it was sealed: `entries` (up to [`NAMED`] of them, relative to the tree) differ.
    #[error("{tree} changed since it was sealed ({} entries differ, e.g. {})", .count, .entries.join(", "))]
    Changed {
        /// The tree.
        tree: String,
        /// How many entries differ.
        count: usize,
        /// Some of them.
        entries: Vec<String>,
    },
    /// Reading or sealing the tree failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// How many differing entries a [`ShareError::Changed`] names.
pub const NAMED: usize = 5;

/// Whether `dir` is a dependency tree: named `node_modules`, or a virtualenv (holding `pyvenv.cfg`).
pub fn is_dependency_tree(dir: &Path) -> bool {
    dir.file_name().is_some_and(|n| n == "node_modules") || dir.join("pyvenv.cfg").is_file()
}

/// Whether `name` in `dir` is a directory of a virtualenv made in `dir` itself (`dir` holds `pyvenv.cfg`): `bin`,
/// `include`, `lib`, `lib64` or `share`. A Python host that is given no `virtualenv` runtime option (the bed's, from
/// the SDK's v3.68) makes the project directory itself the virtualenv; its parts are shared like a whole one, the
/// project's own files beside them are copied.
pub fn is_virtualenv_part(dir: &Path, name: &std::ffi::OsStr) -> bool {
    ["bin", "include", "lib", "lib64", "share"].iter().any(|p| name == *p) && dir.join("pyvenv.cfg").is_file()
}

/// The tree `tree` ready to be linked into an operation's directory: sealed at its first use, verified against its seal
/// at every later one.
///
/// Errors: [`ShareError::Changed`] (the tree must not be used), [`ShareError::Io`] (it could not be read or sealed).
pub fn share(tree: &Path) -> Result<(), ShareError> {
    let file = seal_file(tree);
    match known_seal(&file) {
        Ok(seal) => {
            if matches(tree, &seal)? {
                return Ok(());
            }
            let before: Seal = seal.iter().map(|(p, s)| (p.clone(), *s)).collect();
            let differ = changed(&before, &take_seal(tree)?);
            let entries = differ.iter().take(NAMED).map(|p| p.display().to_string()).collect();
            Err(ShareError::Changed { tree: tree.display().to_string(), count: differ.len().max(1), entries })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            make_read_only(tree)?;
            write_seal(&file, take_seal(tree)?)?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The seals this agent parsed or wrote, by seal file, each with the file's stamp then ([`known_seal`]); entries
/// under a removed tree go with it ([`remove_tree`]).
static KNOWN: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<PathBuf, Known>>> =
    std::sync::LazyLock::new(Default::default);

fn known() -> std::sync::MutexGuard<'static, std::collections::HashMap<PathBuf, Known>> {
    KNOWN.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The seal in the seal file `file`, parsed once per agent and kept in its memory while the file is the one it read
/// (same inode, size and change time): a check then walks the tree only, not its 15,000-line seal as well.
///
/// Errors: the file cannot be read (`NotFound`: the tree was never sealed).
fn known_seal(file: &Path) -> std::io::Result<std::sync::Arc<Index>> {
    let id = stamp(&std::fs::metadata(file)?);
    if let Some(k) = known().get(file).filter(|k| k.0 == id) {
        return Ok(k.1.clone());
    }
    let seal = std::sync::Arc::new(parse(&std::fs::read_to_string(file)?).into_iter().collect::<Index>());
    known().insert(file.to_path_buf(), Known(id, seal.clone()));
    Ok(seal)
}

/// Writes `seal` to the seal file `file` and keeps it in memory as that file's ([`known_seal`] need not parse it).
///
/// Errors: the file cannot be written or read back.
fn write_seal(file: &Path, seal: Seal) -> std::io::Result<()> {
    std::fs::write(file, render(&seal))?;
    let id = stamp(&std::fs::metadata(file)?);
    known().insert(file.to_path_buf(), Known(id, std::sync::Arc::new(seal.into_iter().collect())));
    Ok(())
}

/// Forgets the seals kept in memory for `path` and for every tree under it (it is being removed).
fn forget_seals(path: &Path) {
    let own = seal_file(path);
    let mut known = known();
    if !known.is_empty() {
        known.retain(|file, _| !file.starts_with(path) && *file != own);
    }
}

/// A parsed seal file: its own stamp when read, and the seal.
struct Known(Stamp, std::sync::Arc<Index>);

/// A seal indexed for lookups by path.
type Index = std::collections::HashMap<PathBuf, Stamp>;

/// Whether `tree` is as `seal` says, entry for entry: one walk comparing as it goes (no second seal built), each entry
/// read relative to its directory (no path resolved from the root), its directories shared among up to four threads
/// (the walk is `statx` calls: the agent's cores are otherwise idle while an operation waits for it).
///
/// Errors: the tree itself cannot be read.
fn matches(tree: &Path, seal: &Index) -> std::io::Result<bool> {
    if seal.get(Path::new("")) != Some(&stamp(&std::fs::symlink_metadata(tree)?)) {
        return Ok(false);
    }
    let work = Walk {
        dirs: std::sync::Mutex::new(vec![(tree.to_path_buf(), PathBuf::new())]),
        busy: std::sync::atomic::AtomicUsize::new(0),
        seen: std::sync::atomic::AtomicUsize::new(1),
        differs: std::sync::atomic::AtomicBool::new(false),
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(4);
    let results: Vec<std::io::Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(|| work.run(seal))).collect();
        let joined = handles.into_iter().map(|h| h.join());
        joined.map(|r| r.unwrap_or_else(|_| Err(std::io::Error::other("a walk panicked")))).collect()
    });
    results.into_iter().collect::<std::io::Result<()>>()?;
    use std::sync::atomic::Ordering::SeqCst;
    Ok(!work.differs.load(SeqCst) && work.seen.load(SeqCst) == seal.len())
}

/// A walk of a tree shared by threads: directories left to read, how many threads are reading one, how many entries
/// matched, whether one did not.
struct Walk {
    dirs: std::sync::Mutex<Vec<(PathBuf, PathBuf)>>,
    busy: std::sync::atomic::AtomicUsize,
    seen: std::sync::atomic::AtomicUsize,
    differs: std::sync::atomic::AtomicBool,
}

impl Walk {
    /// Reads directories until none is left and no thread may add one, or an entry differs.
    fn run(&self, seal: &Index) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        loop {
            let next = {
                let mut dirs = self.dirs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let next = dirs.pop();
                if next.is_some() {
                    self.busy.fetch_add(1, SeqCst);
                }
                next
            };
            let Some((dir, rel)) = next else {
                if self.busy.load(SeqCst) == 0 || self.differs.load(SeqCst) {
                    return Ok(());
                }
                std::thread::yield_now();
                continue;
            };
            let read = self.read(seal, &dir, &rel);
            self.busy.fetch_sub(1, SeqCst);
            read?;
            if self.differs.load(SeqCst) {
                return Ok(());
            }
        }
    }

    /// Compares the entries of `dir` (`rel` in the tree) with `seal`, queueing its subdirectories.
    fn read(&self, seal: &Index, dir: &Path, rel: &Path) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let (mut seen, mut found) = (0, Vec::new());
        for e in std::fs::read_dir(dir)? {
            // an entry that vanished while the walk read it differs (the full seal taken next names it)
            let Ok((e, m)) = e.and_then(|e| e.metadata().map(|m| (e, m))) else {
                self.differs.store(true, SeqCst);
                return Ok(());
            };
            let path = rel.join(e.file_name());
            if seal.get(&path) != Some(&stamp(&m)) {
                self.differs.store(true, SeqCst);
                return Ok(());
            }
            seen += 1;
            if m.is_dir() {
                found.push((e.path(), path));
            }
        }
        self.seen.fetch_add(seen, SeqCst);
        self.dirs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(found);
        Ok(())
    }
}

/// `<parent>/.<name>.pko-seal`: beside the tree, outside it (the seal's own writes do not change the tree).
fn seal_file(tree: &Path) -> PathBuf {
    let name = tree.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    tree.with_file_name(format!(".{name}.pko-seal"))
}

/// The seal of `tree` as it is now (no change made).
///
/// Errors: the tree itself cannot be read; entries that vanish while it is walked are left out (and so differ).
pub fn take_seal(tree: &Path) -> std::io::Result<Seal> {
    let mut out = Seal::new();
    out.insert(PathBuf::new(), stamp(&std::fs::symlink_metadata(tree)?));
    let mut stack = vec![tree.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)?.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            }
            out.insert(e.path().strip_prefix(tree).map(Path::to_path_buf).unwrap_or_default(), stamp(&m));
        }
    }
    Ok(out)
}

fn stamp(m: &std::fs::Metadata) -> Stamp {
    (m.ino(), if m.is_dir() { 0 } else { m.len() }, m.mode(), m.ctime(), m.ctime_nsec())
}

/// The entries whose stamp differs between `before` and `now`, added and removed ones included, in path order. Pure.
pub fn changed(before: &Seal, now: &Seal) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> =
        now.iter().filter(|(p, s)| before.get(*p) != Some(*s)).map(|(p, _)| p.clone()).collect();
    out.extend(before.keys().filter(|p| !now.contains_key(*p)).cloned());
    out.sort();
    out
}

/// Clears the write bits of `tree` and of every file and directory under it (links are left alone: their mode is not
/// theirs).
fn make_read_only(tree: &Path) -> std::io::Result<()> {
    let mut stack = vec![tree.to_path_buf()];
    let mut dirs = Vec::new();
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)?.flatten() {
            let m = e.metadata()?;
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                clear_write(&e.path(), m.permissions().mode())?;
            }
        }
        dirs.push(dir);
    }
    // directories last, deepest first: their entries were changed while they were still writable
    dirs.iter().rev().try_for_each(|d| clear_write(d, std::fs::symlink_metadata(d)?.permissions().mode()))
}

/// Clears the write bits of `path` (whose mode is `mode`); nothing when it has none (a tree moved in read-only keeps
/// its entries' change times, and no system call is made for each of its 15,000 files).
fn clear_write(path: &Path, mode: u32) -> std::io::Result<()> {
    if mode & 0o222 == 0 {
        return Ok(());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & !0o222))
}

/// One line per entry: `ino size mode ctime_s ctime_ns path`. Pure.
fn render(seal: &Seal) -> String {
    let mut out = String::new();
    for (p, (ino, size, mode, s, ns)) in seal {
        out.push_str(&format!("{ino} {size} {mode} {s} {ns} {}\n", p.display()));
    }
    out
}

/// The seal [`render`] wrote; a line that does not parse is left out (and so differs). Pure.
fn parse(text: &str) -> Seal {
    let mut out = Seal::new();
    for line in text.lines() {
        let mut f = line.splitn(6, ' ');
        let mut num = || f.next().and_then(|v| v.parse::<i64>().ok());
        let (Some(ino), Some(size), Some(mode), Some(s), Some(ns)) = (num(), num(), num(), num(), num()) else {
            continue;
        };
        let (Ok(ino), Ok(size), Ok(mode)) = (u64::try_from(ino), u64::try_from(size), u32::try_from(mode)) else {
            continue;
        };
        out.insert(PathBuf::from(f.next().unwrap_or("")), (ino, size, mode, s, ns));
    }
    out
}

/// Removes `path` (a tree, a file or a link; nothing when missing), and forgets the seals kept in memory under it. A
/// directory a program made unwritable is made writable first.
pub fn remove_tree(path: &Path) -> std::io::Result<()> {
    forget_seals(path);
    let Ok(m) = std::fs::symlink_metadata(path) else { return Ok(()) };
    if !m.is_dir() {
        return std::fs::remove_file(path);
    }
    if std::fs::remove_dir_all(path).is_ok() {
        return Ok(());
    }
    make_writable(path);
    std::fs::remove_dir_all(path)
}

/// Gives the owner full access to every directory under `dir` (not following links), so its entries can be removed.
fn make_writable(dir: &Path) {
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            make_writable(&e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("node_modules");
        std::fs::create_dir_all(t.join("dep/lib")).unwrap();
        std::fs::write(t.join("dep/lib/index.js"), "module.exports = 1;\n").unwrap();
        std::fs::write(t.join("dep/package.json"), "{}").unwrap();
        std::os::unix::fs::symlink("dep/lib/index.js", t.join("link.js")).unwrap();
        (d, t)
    }

    fn make_writable(t: &Path) {
        for p in [t.to_path_buf(), t.join("dep"), t.join("dep/lib"), t.join("dep/lib/index.js")] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }

    #[test]
    fn a_tree_is_sealed_read_only_at_its_first_use_and_passes_while_untouched() {
        let (_d, t) = tree();
        assert!(is_dependency_tree(&t));
        share(&t).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o222;
        assert_eq!((mode(&t), mode(&t.join("dep/lib")), mode(&t.join("dep/lib/index.js"))), (0, 0, 0));
        share(&t).unwrap();
        share(&t).unwrap();
    }

    #[test]
    fn a_seal_is_kept_in_memory_from_its_writing_until_its_tree_is_removed() {
        let (d, t) = tree();
        let file = seal_file(&t);
        share(&t).unwrap();
        assert!(known().contains_key(&file), "the seal written is kept: the next check does not parse it");
        share(&t).unwrap();
        remove_tree(d.path()).unwrap();
        assert!(!known().contains_key(&file), "removing the directory above forgets it");
        let (_d, t) = tree();
        share(&t).unwrap();
        remove_tree(&t).unwrap();
        assert!(!known().contains_key(&seal_file(&t)), "removing the tree itself forgets it too");
    }

    #[test]
    fn a_write_undone_or_a_mode_changed_back_is_still_found() {
        let (_d, t) = tree();
        share(&t).unwrap();
        // write a file and restore its content and mode: the ctime moved
        let f = t.join("dep/lib/index.js");
        let before = std::fs::read(&f).unwrap();
        make_writable(&t);
        std::fs::write(&f, "module.exports = 2;\n").unwrap();
        std::fs::write(&f, &before).unwrap();
        for p in [t.join("dep/lib/index.js"), t.join("dep/lib"), t.join("dep"), t.clone()] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o555)).unwrap();
        }
        let Err(ShareError::Changed { count, entries, .. }) = share(&t) else { panic!("a changed tree was shared") };
        assert!(count >= 2 && entries.iter().any(|e| e == "dep/lib/index.js"), "{entries:?}");
    }

    #[test]
    fn a_planted_a_removed_or_a_replaced_entry_is_found() {
        for tamper in ["plant", "remove", "replace"] {
            let (_d, t) = tree();
            share(&t).unwrap();
            make_writable(&t);
            match tamper {
                "plant" => std::fs::write(t.join("dep/lib/evil.js"), "x").unwrap(),
                "remove" => std::fs::remove_file(t.join("dep/package.json")).unwrap(),
                _ => {
                    let old = t.with_file_name("old");
                    std::fs::rename(&t, &old).unwrap();
                    std::fs::create_dir(&t).unwrap();
                }
            }
            assert!(matches!(share(&t), Err(ShareError::Changed { .. })), "{tamper}");
        }
    }

    #[test]
    fn a_change_anywhere_in_a_wide_deep_tree_is_found_by_every_check() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("node_modules");
        for p in 0..40 {
            let dir = t.join(format!("p{p}/lib/a/b"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("index.js"), "1").unwrap();
        }
        share(&t).unwrap();
        for _ in 0..20 {
            share(&t).expect("an untouched tree passes, check after check");
        }
        let deep = t.join("p27/lib/a/b");
        std::fs::set_permissions(&deep, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&deep, std::fs::Permissions::from_mode(0o555)).unwrap();
        for _ in 0..5 {
            let Err(ShareError::Changed { entries, .. }) = share(&t) else { panic!("a re-moded directory passed") };
            assert_eq!(entries, ["p27/lib/a/b"]);
        }
    }

    #[test]
    fn virtualenvs_are_trees_and_the_seal_round_trips() {
        let d = tempfile::tempdir().unwrap();
        let venv = d.path().join("venv");
        std::fs::create_dir(&venv).unwrap();
        assert!(!is_dependency_tree(&venv));
        std::fs::write(venv.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        assert!(is_dependency_tree(&venv));
        std::fs::write(venv.join("a b.txt"), "spaces in names").unwrap();
        let seal = take_seal(&venv).unwrap();
        assert_eq!(parse(&render(&seal)), seal);
        assert_eq!(seal_file(&venv), d.path().join(".venv.pko-seal"));
    }
}
