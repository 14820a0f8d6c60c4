//! Per-operation isolation: nothing one operation leaves on an agent reaches the next.
//!
//! A pooled agent runs the operations of many Stacks of one workspace class one after the other. With isolation on
//! (`pko-agent serve --isolate-operations`, what the operator's pools pass), each operation gets a fresh directory
//! `<work>/ops/op-<n>` (0700; `n` the lowest free, so consecutive operations run at the same path) holding:
//!
//! - `work/`: a copy of the prepared source's own files (`std::fs::copy` uses `copy_file_range`, which shares blocks on
//!   file systems that can), where Pulumi runs, with each dependency tree (`node_modules`, a virtualenv) linked to the
//!   cached revision's, read-only and verified before the operation starts ([`crate::trees`]);
//! - `home/`: the operation's `HOME` (credentials files such as `~/.aws/credentials`, `~/.kube/config`, language
//!   caches), empty at the start;
//! - `pulumi-home/`: its `PULUMI_HOME` (Pulumi's workspace settings, logins, stack selections), whose `plugins` names
//!   the agent's shared plugin cache (filled by `pulumi install` when a source revision is prepared, and by Pulumi
//!   itself);
//! - `tmp/`: its `TMPDIR`.
//!
//! The directory is removed before the operation's result is published; any left by an agent that died is removed when
//! the agent starts, and any not in use before each operation starts (an operation refuses to start while one cannot be
//! removed). The shared plugin cache is fingerprinted (path, size, mode, modification time) before the operation and
//! compared after: a plugin the operation added, changed or planted is removed, and named on the operation's log, so
//! the next operation never runs it. The agent's own environment (the workspace class's) and the request's are all an
//! operation's process sees; processes do not outlive it ([`crate::supervise`]).
//!
//! Not covered: files written to absolute paths outside these directories (e.g. `/tmp/x` by name) reach whatever else
//! the agent's OS user can read; in a pod that is the pool pod's file system.
//!
//! Without isolation (a Workspace's own agent, as PKO's pod), operations run in the cached source directory with the
//! agent's `HOME` and `PULUMI_HOME`, as they always did.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::trees::{ShareError, remove_tree};

/// Where operations' directories are made, and the plugin cache they share.
#[derive(Debug, Clone)]
pub struct Sandboxes {
    /// `<work>/ops`: one directory per running operation.
    root: PathBuf,
    /// The shared plugin cache (`<agent's PULUMI_HOME>/plugins`).
    plugins: PathBuf,
    /// The directories of operations running now (an agent with `--capacity` above 1 runs several).
    active: Arc<Mutex<HashSet<PathBuf>>>,
    /// `<root>.lock`, locked exclusively for the agent's life: a second agent on the same work directory would remove
    /// this one's running operations' directories (and this one its).
    _lock: Arc<std::fs::File>,
}

/// One operation's directories (see the module documentation).
#[derive(Debug)]
pub struct Sandbox {
    dir: PathBuf,
    plugins: PathBuf,
    active: Arc<Mutex<HashSet<PathBuf>>>,
    /// The plugin cache as the operation's own commands found it ([`Sandbox::watch_plugins`]).
    before: Option<Fingerprint>,
}

/// What [`Sandbox::finish`] found and did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Finished {
    /// Entries of the shared plugin cache the operation added or changed, removed (names under `plugins/`).
    pub plugins_removed: Vec<String>,
}

/// Path (relative to the plugin cache) → size in bytes, mode, modification time, symlink target.
pub type Fingerprint = BTreeMap<PathBuf, (u64, u32, Option<SystemTime>, Option<PathBuf>)>;

impl Sandboxes {
    /// Operations' directories under `root`, sharing the plugin cache of `shared_pulumi_home` (created when missing),
    /// for this agent alone: `<root>.lock` is locked exclusively (released by the kernel when the agent dies). Removes
    /// every directory an earlier agent left in `root`.
    ///
    /// Errors: another live agent holds `root` (the message says so), `root` or the plugin cache cannot be created, or
    /// a leftover cannot be removed.
    pub fn new(root: PathBuf, shared_pulumi_home: &Path) -> std::io::Result<Self> {
        create_private_dir(&root)?;
        let lock_path = root.with_extension("lock");
        let lock = std::fs::File::options().create(true).truncate(false).write(true).open(&lock_path)?;
        if let Err(e) = lock.try_lock() {
            let why = match e {
                std::fs::TryLockError::WouldBlock => "another agent uses this work directory".to_string(),
                std::fs::TryLockError::Error(e) => e.to_string(),
            };
            return Err(std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                format!("{}: {why} (two agents must never share one)", lock_path.display()),
            ));
        }
        let plugins = shared_pulumi_home.join("plugins");
        std::fs::create_dir_all(&plugins)?;
        let s = Self { root, plugins, active: Arc::default(), _lock: Arc::new(lock) };
        s.sweep()?;
        Ok(s)
    }

    /// The shared plugin cache.
    pub fn plugins(&self) -> &Path {
        &self.plugins
    }

    /// Removes every operation directory in the root that no running operation uses (left by an agent that died, or by
    /// an operation whose removal failed). Returns how many there were.
    ///
    /// Errors: one could not be removed (the message names it).
    pub fn sweep(&self) -> std::io::Result<usize> {
        let mut n = 0;
        let active = self.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        for e in std::fs::read_dir(&self.root)?.flatten().filter(|e| !active.contains(&e.path())) {
            remove_tree(&e.path())
                .map_err(|err| std::io::Error::new(err.kind(), format!("removing {}: {err}", e.path().display())))?;
            n += 1;
        }
        Ok(n)
    }

    /// A fresh directory for the next operation, after removing what earlier ones left: `op-<n>`, the lowest `n` no
    /// running operation uses, so consecutive operations run at the same path.
    ///
    /// Errors: a leftover could not be removed, or the directories could not be made.
    pub fn create(&self) -> std::io::Result<Sandbox> {
        self.sweep()?;
        // the same path every time, not a random one: build caches key a program by its directory (Go's main
        // package), and a new path rebuilt and relinked a Kubernetes Go program at every operation
        let dir = {
            let mut active = self.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let free = (0..=active.len()).map(|n| self.root.join(format!("op-{n}"))).find(|d| !active.contains(d));
            let dir = free.ok_or_else(|| std::io::Error::other("no free operation directory"))?;
            // refuses a path that exists: the sweep removed every one not in use
            std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700).create(&dir)?;
            active.insert(dir.clone());
            dir
        };
        for sub in ["work", "home", "pulumi-home", "tmp"] {
            create_private_dir(&dir.join(sub))?;
        }
        std::os::unix::fs::symlink(&self.plugins, dir.join("pulumi-home/plugins"))?;
        // a login of the class (an image's `pulumi login`) is the class's, not an operation's: a copy
        let login = self.plugins.with_file_name("credentials.json");
        if login.is_file() {
            std::fs::copy(&login, dir.join("pulumi-home/credentials.json"))?;
        }
        Ok(Sandbox { dir, plugins: self.plugins.clone(), active: self.active.clone(), before: None })
    }
}

impl Sandbox {
    /// The variables that point the operation at its own directories: `HOME`, `PULUMI_HOME`, `TMPDIR`. The request's
    /// environment may set them otherwise (its own choice).
    pub fn env(&self) -> [(String, String); 3] {
        let p = |s: &str| self.dir.join(s).display().to_string();
        [("HOME".into(), p("home")), ("PULUMI_HOME".into(), p("pulumi-home")), ("TMPDIR".into(), p("tmp"))]
    }

    /// Copies the prepared source `root` into the operation's `work/`, each dependency tree linked instead when `share`
    /// ([`crate::trees::share`]; the agent's own cache only), and returns where `project` (inside `root`) is in the
    /// copy, with what was copied. Symbolic links are copied as links.
    ///
    /// Errors: [`ShareError::Changed`] (a tree changed since it was sealed: the revision must be prepared again), or
    /// [`ShareError::Io`] (`project` is not inside `root`, or a copy failed).
    pub fn copy_source(&self, root: &Path, project: &Path, share: bool) -> Result<(PathBuf, Copied), ShareError> {
        let rel = project
            .strip_prefix(root)
            .map_err(|_| std::io::Error::other(format!("{} is not inside {}", project.display(), root.display())))?;
        let work = self.dir.join("work");
        // emptied first: an earlier attempt of this operation may have copied part of a discarded revision
        remove_tree(&work)?;
        create_private_dir(&work)?;
        let mut copied = Copied::default();
        copy_tree(root, &work, share, &mut copied)?;
        Ok((work.join(rel), copied))
    }

    /// Takes the plugin cache's fingerprint: after the agent's own preparation of the source (whose `pulumi install`
    /// fills the cache), right before the operation's commands run.
    pub fn watch_plugins(&mut self) {
        self.before = Some(fingerprint(&self.plugins));
    }

    /// Compares the shared plugin cache with what it held at [`Sandbox::watch_plugins`], removes every entry the
    /// operation added or changed since, then removes the operation's directory.
    ///
    /// Errors: the directory or a changed plugin could not be removed.
    pub fn finish(self) -> std::io::Result<Finished> {
        let plugins_removed = match &self.before {
            Some(before) => changed_entries(before, &fingerprint(&self.plugins)),
            None => Vec::new(),
        };
        for name in &plugins_removed {
            remove_tree(&self.plugins.join(name))?;
        }
        // no longer in use: a directory this cannot remove is swept before the next operation
        self.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.dir);
        remove_tree(&self.dir)?;
        Ok(Finished { plugins_removed })
    }
}

/// The top-level entries of the plugin cache (plugin directories, lock files) under which `after` differs from `before`
/// by an added or changed path. Entries only deleted are not listed (nothing is left to remove). Pure.
pub fn changed_entries(before: &Fingerprint, after: &Fingerprint) -> Vec<String> {
    let mut names: Vec<String> = after
        .iter()
        .filter(|(path, meta)| before.get(*path) != Some(*meta))
        .filter_map(|(path, _)| path.components().next().map(|c| c.as_os_str().to_string_lossy().into_owned()))
        .collect();
    names.dedup();
    names
}

/// Every path under `root` (not following links) with its size, mode, modification time and link target; empty when
/// `root` cannot be read.
pub fn fingerprint(root: &Path) -> Fingerprint {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Fingerprint::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(m) = std::fs::symlink_metadata(e.path()) else { continue };
            let rel = e.path().strip_prefix(root).map(Path::to_path_buf).unwrap_or_default();
            let target = m.file_type().is_symlink().then(|| std::fs::read_link(e.path()).ok()).flatten();
            if m.is_dir() {
                stack.push(e.path());
            }
            out.insert(rel, (if m.is_dir() { 0 } else { m.len() }, m.permissions().mode(), m.modified().ok(), target));
        }
    }
    out
}

/// What [`Sandbox::copy_source`] put in an operation's directory.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    /// Regular files copied.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Dependency trees linked (not copied).
    pub trees: u64,
}

/// Copies the tree `from` into the existing directory `to`: directories, regular files (with their modes) and symbolic
/// links (as links); with `share`, a dependency tree is verified and linked ([`crate::trees::share`]). Counted in
/// `copied`.
fn copy_tree(from: &Path, to: &Path, share: bool, copied: &mut Copied) -> Result<(), ShareError> {
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let t = e.file_type()?;
        if t.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
        } else if t.is_dir()
            && share
            && (crate::trees::is_dependency_tree(&src) || crate::trees::is_virtualenv_part(from, &e.file_name()))
        {
            crate::trees::share(&src)?;
            std::os::unix::fs::symlink(&src, &dst)?;
            copied.trees += 1;
        } else if t.is_dir() {
            std::fs::create_dir(&dst)?;
            std::fs::set_permissions(&dst, std::fs::metadata(&src)?.permissions())?;
            copy_tree(&src, &dst, share, copied)?;
        } else if t.is_file() && !is_seal_file(&e.file_name()) {
            copied.bytes += std::fs::copy(&src, &dst)?;
            copied.files += 1;
        }
    }
    Ok(())
}

/// Seals of shared trees stay with the cache ([`crate::trees`]): an operation has no use for them.
fn is_seal_file(name: &std::ffi::OsStr) -> bool {
    name.to_str().is_some_and(|n| n.starts_with('.') && n.ends_with(".pko-seal"))
}

/// Creates `dir` (and its parents) readable only by this user (0700).
pub(crate) fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_gets_fresh_directories_a_copy_of_its_source_and_leaves_nothing() {
        let base = tempfile::tempdir().unwrap();
        let home = base.path().join("shared-home");
        let src = base.path().join("src");
        std::fs::create_dir_all(src.join("app/lib")).unwrap();
        std::fs::write(src.join("app/Pulumi.yaml"), "name: p\nruntime: yaml\n").unwrap();
        std::fs::write(src.join("app/lib/x"), "x").unwrap();
        std::os::unix::fs::symlink("lib/x", src.join("app/link")).unwrap();
        let boxes = Sandboxes::new(base.path().join("ops"), &home).unwrap();
        let mut sb = boxes.create().unwrap();
        sb.watch_plugins();
        std::fs::create_dir_all(src.join("app/node_modules/dep")).unwrap();
        std::fs::write(src.join("app/node_modules/dep/index.js"), "1").unwrap();
        let (project, copied) = sb.copy_source(&src, &src.join("app"), true).unwrap();
        assert!(project.starts_with(&sb.dir) && project.join("Pulumi.yaml").is_file());
        assert_eq!((copied.files, copied.bytes, copied.trees), (2, 23, 1), "the project's own files; the tree linked");
        assert_eq!(std::fs::read_link(project.join("node_modules")).unwrap(), src.join("app/node_modules"));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(project.join("node_modules/dep/index.js")).unwrap().permissions(),
        );
        assert_eq!(mode & 0o222, 0, "shared read-only (root writes anyway: the seal is the guard)");
        assert_eq!(std::fs::read_link(project.join("link")).unwrap(), PathBuf::from("lib/x"), "links stay links");
        std::fs::write(project.join("Pulumi.dev.yaml"), "secret").unwrap();
        assert!(!src.join("app/Pulumi.dev.yaml").exists(), "the source stays pristine");
        let env: BTreeMap<String, String> = sb.env().into_iter().collect();
        assert!(Path::new(&env["HOME"]).is_dir() && Path::new(&env["TMPDIR"]).is_dir());
        assert_eq!(
            std::fs::canonicalize(Path::new(&env["PULUMI_HOME"]).join("plugins")).unwrap(),
            std::fs::canonicalize(home.join("plugins")).unwrap()
        );
        // a program that makes its directory unremovable for its owner
        let locked = Path::new(&env["HOME"]).join("locked");
        std::fs::create_dir_all(locked.join("inner")).unwrap();
        std::fs::set_permissions(&locked, std::os::unix::fs::PermissionsExt::from_mode(0o500)).unwrap();
        let dir = sb.dir.clone();
        assert_eq!(sb.finish().unwrap(), Finished::default());
        assert!(!dir.exists(), "nothing of the operation is left");
    }

    #[test]
    fn a_project_that_is_its_own_virtualenv_shares_its_parts_and_copies_its_files() {
        let base = tempfile::tempdir().unwrap();
        let src = base.path().join("src");
        std::fs::create_dir_all(src.join("lib/python3.11/site-packages/pulumi")).unwrap();
        std::fs::create_dir_all(src.join("bin")).unwrap();
        std::fs::create_dir_all(src.join("mine")).unwrap();
        std::fs::write(src.join("lib/python3.11/site-packages/pulumi/__init__.py"), "sdk").unwrap();
        std::fs::write(src.join("bin/python"), "").unwrap();
        std::os::unix::fs::symlink("lib", src.join("lib64")).unwrap();
        for (f, text) in [("pyvenv.cfg", "home = /usr/bin\n"), ("__main__.py", "main"), ("mine/util.py", "util")] {
            std::fs::write(src.join(f), text).unwrap();
        }
        let boxes = Sandboxes::new(base.path().join("ops"), &base.path().join("h")).unwrap();
        let sb = boxes.create().unwrap();
        let (project, copied) = sb.copy_source(&src, &src, true).unwrap();
        assert_eq!((copied.files, copied.trees), (3, 2), "pyvenv.cfg, __main__.py, mine/util.py; lib and bin linked");
        assert_eq!(std::fs::read_link(project.join("lib")).unwrap(), src.join("lib"));
        assert_eq!(std::fs::read_link(project.join("lib64")).unwrap(), PathBuf::from("lib"));
        assert!(std::fs::symlink_metadata(project.join("mine")).unwrap().is_dir(), "the project's own directory");
        // a local source (not the agent's cache) is copied whole
        let sb2 = boxes.create().unwrap();
        let (_, copied) = sb2.copy_source(&src, &src, false).unwrap();
        assert_eq!((copied.files, copied.trees), (5, 0));
    }

    #[test]
    fn a_plugin_the_operation_added_or_changed_is_removed_and_others_are_kept() {
        let base = tempfile::tempdir().unwrap();
        let home = base.path().join("shared-home");
        let boxes = Sandboxes::new(base.path().join("ops"), &home).unwrap();
        let plugins = boxes.plugins().to_path_buf();
        for p in ["resource-a-v1.0.0", "resource-b-v1.0.0"] {
            std::fs::create_dir_all(plugins.join(p)).unwrap();
            std::fs::write(plugins.join(p).join("pulumi-resource"), "bin").unwrap();
        }
        let mut sb = boxes.create().unwrap();
        std::fs::create_dir_all(plugins.join("resource-installed-v1.0.0")).unwrap();
        sb.watch_plugins();
        std::fs::write(plugins.join("resource-a-v1.0.0/pulumi-resource"), "evil!").unwrap();
        std::fs::create_dir_all(plugins.join("resource-planted-v9.0.0")).unwrap();
        let done = sb.finish().unwrap();
        assert_eq!(done.plugins_removed, vec!["resource-a-v1.0.0".to_string(), "resource-planted-v9.0.0".to_string()]);
        assert!(plugins.join("resource-b-v1.0.0/pulumi-resource").is_file(), "an untouched plugin stays");
        assert!(plugins.join("resource-installed-v1.0.0").is_dir(), "what the agent's preparation installed stays");
        assert!(!plugins.join("resource-a-v1.0.0").exists() && !plugins.join("resource-planted-v9.0.0").exists());
    }

    #[test]
    fn leftovers_are_swept_and_running_operations_are_left_alone() {
        let base = tempfile::tempdir().unwrap();
        let ops = base.path().join("ops");
        // what an agent that died left
        std::fs::create_dir_all(ops.join("op-dead/home")).unwrap();
        std::fs::write(ops.join("op-dead/home/secret"), "s").unwrap();
        let boxes = Sandboxes::new(ops.clone(), &base.path().join("h")).unwrap();
        assert!(!ops.join("op-dead").exists(), "swept when the agent starts");
        // two operations at once (--capacity 2): the second does not sweep the first's directory
        let first = boxes.create().unwrap();
        std::fs::write(first.dir.join("home/mine"), "m").unwrap();
        let second = boxes.create().unwrap();
        assert!(first.dir.join("home/mine").exists(), "a running operation's directory stays");
        assert_eq!((first.dir.clone(), second.dir.clone()), (ops.join("op-0"), ops.join("op-1")));
        // one that could not be removed at its end is swept before the next operation
        std::fs::create_dir_all(ops.join("op-stuck")).unwrap();
        let third = boxes.create().unwrap();
        assert!(!ops.join("op-stuck").exists());
        for sb in [first, second, third] {
            sb.finish().unwrap();
        }
        assert_eq!(std::fs::read_dir(&ops).unwrap().count(), 0);
        let next = boxes.create().unwrap();
        assert_eq!(next.dir, ops.join("op-0"), "the next operation runs where the first did");
        next.finish().unwrap();
    }

    #[test]
    fn a_second_agent_on_the_same_work_directory_is_refused_until_the_first_is_gone() {
        let base = tempfile::tempdir().unwrap();
        let ops = base.path().join("ops");
        let first = Sandboxes::new(ops.clone(), &base.path().join("h")).unwrap();
        let running = first.create().unwrap();
        let e = Sandboxes::new(ops.clone(), &base.path().join("h")).unwrap_err();
        assert!(e.to_string().contains("another agent uses this work directory"), "{e}");
        assert!(running.dir.is_dir(), "the refused agent swept nothing");
        running.finish().unwrap();
        drop(first);
        Sandboxes::new(ops, &base.path().join("h")).expect("the lock goes with its agent");
    }

    #[test]
    fn changed_entries_name_top_level_plugins_once() {
        let fp = |items: &[(&str, u64)]| -> Fingerprint {
            items.iter().map(|(p, n)| (PathBuf::from(p), (*n, 0o644, None, None))).collect()
        };
        let before = fp(&[("a", 0), ("a/bin", 1), ("b", 0), ("b/bin", 1)]);
        let after = fp(&[("a", 0), ("a/bin", 2), ("a/new", 1), ("c.lock", 0)]);
        assert_eq!(
            changed_entries(&before, &after),
            vec!["a".to_string(), "c.lock".to_string()],
            "b only deleted: not listed"
        );
    }
}
