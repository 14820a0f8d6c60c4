//! A new revision's dependency tree seeded from an earlier prepared revision with the same manifests (issue 49, item
//! 2): a commit that changes a program but not its dependencies used to install them from nothing (20–30 s of `npm
//! install` for `@pulumi/kubernetes`, 15 s of virtualenv and `pip install` for `pulumi-kubernetes`); seeded, the
//! install finds the tree in place and only checks it, as on a developer's machine.
//!
//! Contract: the seed is a writable **copy** of the donor's tree (never a link: the donor stays sealed and
//! read-only, `crate::trees`), with the files' modification times kept (Python's bytecode caches are valid by them),
//! taken only after the donor's seal verified (a tree an operation changed is never copied), only when every manifest
//! that decides what the language's installer puts in it is byte-identical in both projects (or absent from both), and
//! only when those manifests name nothing from the project's own files: Node.js [`node`] (`package.json` and its
//! lockfiles; no `file:` dependency, no npm workspaces), Python [`python`] (`requirements.txt`, the `toolchain` and
//! `virtualenv` options, `pip.conf`; pip's toolchain only; no `-e`, `-r` or path). The manifests are compared as each
//! revision was fetched (a digest kept in the prepared revision's ready marker, named by its language), since an
//! install writes a lockfile into the donor. How the seed is settled: [`Settle`]. The donors are the agent's own
//! prepared revisions: one class's agent, one class's trees.

pub mod node;
pub mod python;

pub use node::{NODE_MANIFESTS, depends_on_own_files, seed_settles_dependencies};

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// What settles a seeded tree before the revision is ready; `pulumi install` runs in every case (plugins, `packages`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// The seed is what installing the dependencies would make ([`seed_settles_dependencies`]: a lockfile pins the
    /// tree, no install-time scripts): `pulumi install --no-dependencies`.
    Settled,
    /// `pulumi install` installs the dependencies, its package manager checking the seed (npm without a lockfile).
    Install,
    /// `python -m pip install -r requirements.txt` with the seeded virtualenv (this directory), as a developer runs
    /// it in an existing virtualenv: what the seed satisfies stays, what it does not is installed. Then `pulumi install
    /// --no-dependencies`: Pulumi's own dependency step would re-create the virtualenv and upgrade pip, setuptools and
    /// wheel from the index on every revision (3.9 s on the bed, most of it asking the index).
    Pip(PathBuf),
}

/// A seeded project: the donor's project directory and how the seed is settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seeded {
    /// The prepared project the tree was copied from.
    pub donor: PathBuf,
    /// What settles it.
    pub settle: Settle,
    /// Whether the tree was moved from the donor ([`take`]; the donor is retired), not copied ([`seed`]).
    pub moved: bool,
}

/// The digest of what decides `project`'s dependency tree as fetched (call it before anything is installed):
/// `python:<sha256 hex>` ([`python::digest`]) for a Python project, else `nodejs:<sha256 hex>` ([`node::digest`]);
/// `None` when the project is not seeded. Two revisions with the same digest get the same tree from the same index.
pub fn manifest_digest(project: &Path) -> Option<String> {
    match crate::pulumi::project_info(project).map(|(_, runtime)| runtime).as_deref() {
        Some("python") => python::digest(project).map(|h| format!("python:{h}")),
        _ => node::digest(project).map(|h| format!("nodejs:{h}")),
    }
}

/// The entries of the prepared project `donor` that make the tree a `digest` describes, relative to it.
fn tree_entries(digest: &str, donor: &Path) -> Vec<PathBuf> {
    if digest.starts_with("python:") {
        python::tree_entries(donor)
    } else if donor.join("node_modules").is_dir() {
        vec![PathBuf::from("node_modules")]
    } else {
        Vec::new()
    }
}

/// Seeds `project` (a new revision, as fetched, whose [`manifest_digest`] is `digest`) with a writable copy of the tree
/// of the first of `donors` (prepared project directories, the freshest first, each with the digest recorded when it
/// was fetched) whose digest is `digest` and whose tree's seal verifies; `None` when no donor may seed it. A copy that
/// fails is removed, and the next donor is tried.
pub fn seed(project: &Path, digest: &str, donors: impl IntoIterator<Item = (PathBuf, String)>) -> Option<Seeded> {
    for (donor, recorded) in donors {
        let Ok(entries) = usable(project, digest, (&donor, &recorded)) else { continue };
        match entries.iter().try_for_each(|e| copy_entry(&donor.join(e), &project.join(e))) {
            Ok(()) => return Some(Seeded { settle: settle(project, digest, &entries), donor, moved: false }),
            Err(e) => {
                tracing::warn!(donor = %donor.display(), error = %e, "seeding the dependency tree failed");
                remove_entries(project, &entries);
            }
        }
    }
    None
}

/// What [`take`] did: the seed, if any, and whether the donor was retired (its caller then removes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// The seeded project, `None` when the donor may not seed it or the move failed.
    pub seeded: Option<Seeded>,
    /// Whether `retire` ran and succeeded: the donor is no longer a prepared revision and is to be removed.
    pub retired: bool,
}

/// Seeds `project` like [`seed`] from the one prepared project `donor` by **moving** its tree (a rename: no copy of
/// thousands of files), after its seal verified. The caller holds the donor (no operation holds it and none can start
/// on it); `retire` (run only once the donor may seed `project`, or when its tree changed and is to be discarded)
/// makes it no longer a prepared revision and says whether it did. A donor that may not seed `project` for any other
/// reason (another digest, no tree, `project` already holds part of the tree) is left ready and intact. The moved tree
/// is writable by its owner again unless it settles the dependencies as it is ([`Settle::Settled`]: nothing writes
/// into it before the new revision's first operation seals it). A move that fails is undone by removing what moved.
pub fn take(project: &Path, digest: &str, donor: &Path, retire: impl FnOnce() -> bool) -> Taken {
    let entries = match usable(project, digest, (donor, digest)) {
        Ok(entries) => entries,
        Err(Unusable::Changed) => return Taken { seeded: None, retired: retire() },
        Err(Unusable::NotForThis) => return Taken { seeded: None, retired: false },
    };
    if !retire() {
        return Taken { seeded: None, retired: false };
    }
    let settle = settle(project, digest, &entries);
    let moved = entries.iter().try_for_each(|e| {
        let (from, to) = (donor.join(e), project.join(e));
        let m = std::fs::symlink_metadata(&from)?;
        if m.is_dir() {
            // a directory moving to another parent updates its `..`: it must be writable (a sealed tree is not)
            std::fs::set_permissions(&from, std::fs::Permissions::from_mode(m.permissions().mode() | 0o700))?;
        }
        std::fs::rename(&from, &to)?;
        match settle {
            Settle::Settled => Ok(()),
            _ => owner_writable(&to),
        }
    });
    let seeded = match moved {
        Ok(()) => Some(Seeded { donor: donor.to_path_buf(), settle, moved: true }),
        Err(e) => {
            tracing::warn!(donor = %donor.display(), error = %e, "moving the dependency tree failed");
            remove_entries(project, &entries);
            None
        }
    };
    Taken { seeded, retired: true }
}

/// Why a donor may not seed a project ([`usable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unusable {
    /// Its tree changed since it was sealed: it is to be discarded.
    Changed,
    /// Another digest, no tree, or the project already holds part of the tree: the donor is fine, just not for this.
    NotForThis,
}

/// The entries of `donor`'s tree (with its `recorded` digest) that may seed `project`: the digests match, the donor
/// has the tree, `project` has none of it, and the tree's directories verify against their seals.
fn usable(project: &Path, digest: &str, (donor, recorded): (&Path, &str)) -> Result<Vec<PathBuf>, Unusable> {
    if donor == project || recorded != digest {
        return Err(Unusable::NotForThis);
    }
    let entries = tree_entries(digest, donor);
    if entries.is_empty() || entries.iter().any(|e| project.join(e).symlink_metadata().is_ok()) {
        return Err(Unusable::NotForThis);
    }
    if let Some(e) = entries.iter().find_map(|e| verify(&donor.join(e)).err()) {
        tracing::warn!(donor = %donor.display(), error = %e, "not seeding from a dependency tree that changed");
        return Err(Unusable::Changed);
    }
    Ok(entries)
}

fn remove_entries(project: &Path, entries: &[PathBuf]) {
    for e in entries {
        let _ = crate::trees::remove_tree(&project.join(e));
    }
}

/// Gives the owner write access to `entry` and everything under it (links left alone): a moved sealed tree that an
/// installer may still change.
fn owner_writable(entry: &Path) -> std::io::Result<()> {
    let m = std::fs::symlink_metadata(entry)?;
    if m.is_symlink() {
        return Ok(());
    }
    let bits = if m.is_dir() { 0o700 } else { 0o200 };
    std::fs::set_permissions(entry, std::fs::Permissions::from_mode(m.permissions().mode() | bits))?;
    if m.is_dir() {
        for e in std::fs::read_dir(entry)? {
            owner_writable(&e?.path())?;
        }
    }
    Ok(())
}

/// What settles the tree seeded into `project` from `entries`. Pure but for reading the project's manifests.
fn settle(project: &Path, digest: &str, entries: &[PathBuf]) -> Settle {
    if digest.starts_with("python:") {
        Settle::Pip(python::seeded_venv(project, entries))
    } else if seed_settles_dependencies(project) {
        Settle::Settled
    } else {
        Settle::Install
    }
}

/// A directory of a donor's tree verified against its seal (sealed now at its first use); links and files (a
/// virtualenv's `lib64`, `pyvenv.cfg`) are copied as they are.
fn verify(entry: &Path) -> Result<(), crate::trees::ShareError> {
    match std::fs::symlink_metadata(entry) {
        Ok(m) if m.is_dir() => crate::trees::share(entry),
        Ok(_) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Copies one entry of a tree: a directory with [`copy_writable`], a link as a link, a file writable by its owner.
fn copy_entry(from: &Path, to: &Path) -> std::io::Result<()> {
    let m = std::fs::symlink_metadata(from)?;
    if m.is_dir() {
        copy_writable(from, to)
    } else if m.is_symlink() {
        std::os::unix::fs::symlink(std::fs::read_link(from)?, to)
    } else {
        copy_file(from, to, &m)
    }
}

/// Copies the file `from` (its metadata `m`) to the new file `to`: its bytes (`copy_file_range`), its mode with the
/// owner's write bit, its modification time; one open of each.
fn copy_file(from: &Path, to: &Path, m: &std::fs::Metadata) -> std::io::Result<()> {
    let mut src = std::fs::File::open(from)?;
    let mut dst = std::fs::File::options().write(true).create_new(true).open(to)?;
    std::io::copy(&mut src, &mut dst)?;
    dst.set_permissions(std::fs::Permissions::from_mode(m.permissions().mode() | 0o200))?;
    dst.set_modified(m.modified()?)
}

/// Copies the tree `from` to `to` (which must not exist): files and directories writable by their owner, files with
/// their modification time, symbolic links as links.
///
/// Errors: the first read, write or link that failed.
pub fn copy_writable(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir(to)?;
    let mut stack = vec![(from.to_path_buf(), to.to_path_buf())];
    while let Some((src, dst)) = stack.pop() {
        for e in std::fs::read_dir(&src)? {
            let e = e?;
            let (s, d) = (e.path(), dst.join(e.file_name()));
            let t = e.file_type()?;
            if t.is_dir() {
                std::fs::create_dir(&d)?;
                stack.push((s, d));
            } else if t.is_symlink() {
                std::os::unix::fs::symlink(std::fs::read_link(&s)?, &d)?;
            } else if t.is_file() {
                copy_file(&s, &d, &e.metadata()?)?;
            }
        }
        let mode = std::fs::metadata(&src)?.permissions().mode();
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(mode | 0o700))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prepared Python project of the bed's kind (the project is the virtualenv), its digest taken as fetched.
    fn prepared_python(root: &Path, name: &str) -> (PathBuf, String) {
        let p = root.join(name);
        std::fs::create_dir_all(p.join("lib/site-packages/pulumi")).unwrap();
        std::fs::write(p.join("Pulumi.yaml"), "name: p\nruntime: python\n").unwrap();
        std::fs::write(p.join("requirements.txt"), "pulumi==3.1\n").unwrap();
        let digest = manifest_digest(&p).unwrap();
        std::fs::write(p.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        std::fs::write(p.join("lib/site-packages/pulumi/__init__.py"), "x = 1\n").unwrap();
        std::os::unix::fs::symlink("lib", p.join("lib64")).unwrap();
        (p, digest)
    }

    #[test]
    fn a_python_revision_gets_a_copy_of_the_virtualenv_with_its_times_and_links() {
        let d = tempfile::tempdir().unwrap();
        let old = prepared_python(d.path(), "old");
        assert!(old.1.starts_with("python:"));
        let module = old.0.join("lib/site-packages/pulumi/__init__.py");
        let then = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        std::fs::File::options().write(true).open(&module).unwrap().set_modified(then).unwrap();
        let new = d.path().join("new");
        std::fs::create_dir(&new).unwrap();
        std::fs::write(new.join("Pulumi.yaml"), "name: p\nruntime: python\n").unwrap();
        std::fs::write(new.join("requirements.txt"), "pulumi==3.1\n").unwrap();
        let digest = manifest_digest(&new).unwrap();
        assert_eq!(digest, old.1);
        let seeded = seed(&new, &digest, [old.clone()]).unwrap();
        assert_eq!(seeded, Seeded { donor: old.0.clone(), settle: Settle::Pip(new.clone()), moved: false });
        let copied = new.join("lib/site-packages/pulumi/__init__.py");
        assert_eq!(std::fs::metadata(&copied).unwrap().modified().unwrap(), then, "bytecode stays valid");
        assert_eq!(std::fs::read_link(new.join("lib64")).unwrap(), Path::new("lib"));
        assert_eq!(std::fs::read_to_string(new.join("pyvenv.cfg")).unwrap(), "home = /usr/bin\n");
        std::fs::write(&copied, "changed").expect("the copy is writable");
        crate::trees::share(&old.0.join("lib")).expect("the donor is untouched");
        assert_eq!(seed(&new, &digest, [old]), None, "a virtualenv is left alone");
    }

    fn node_project(root: &Path, name: &str, lock: bool) -> PathBuf {
        let p = root.join(name);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("package.json"), r#"{"dependencies": {"x": "1"}}"#).unwrap();
        if lock {
            std::fs::write(p.join("package-lock.json"), "{}").unwrap();
        }
        p
    }

    #[test]
    fn a_retired_donors_tree_is_moved_and_stays_sealed_only_when_it_settles() {
        let d = tempfile::tempdir().unwrap();
        for (lock, settled) in [(true, Settle::Settled), (false, Settle::Install)] {
            let old = node_project(d.path(), &format!("old-{lock}"), lock);
            let digest = manifest_digest(&old).unwrap();
            std::fs::create_dir_all(old.join("node_modules/x")).unwrap();
            std::fs::write(old.join("node_modules/x/index.js"), "1").unwrap();
            crate::trees::share(&old.join("node_modules")).unwrap(); // sealed and read-only, as operations left it
            let new = node_project(d.path(), &format!("new-{lock}"), lock);
            let taken = take(&new, &digest, &old, || true);
            assert!(taken.retired);
            let seeded = taken.seeded.unwrap();
            assert_eq!((seeded.settle.clone(), seeded.moved), (settled.clone(), true));
            assert!(!old.join("node_modules").exists(), "moved, not copied");
            let file = new.join("node_modules/x/index.js");
            assert_eq!(std::fs::read_to_string(&file).unwrap(), "1");
            let writable = std::fs::metadata(&file).unwrap().permissions().mode() & 0o200 != 0;
            assert_eq!(
                writable,
                settled == Settle::Install,
                "npm may change an unsettled tree; a settled one is sealed"
            );
            crate::trees::share(&new.join("node_modules")).expect("the new revision seals it at its first use");
        }
    }

    #[test]
    fn a_changed_tree_is_never_moved() {
        let d = tempfile::tempdir().unwrap();
        let old = node_project(d.path(), "old", true);
        let digest = manifest_digest(&old).unwrap();
        std::fs::create_dir_all(old.join("node_modules/x")).unwrap();
        crate::trees::share(&old.join("node_modules")).unwrap();
        std::fs::set_permissions(old.join("node_modules/x"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(old.join("node_modules/x/planted.js"), "evil").unwrap();
        let new = node_project(d.path(), "new", true);
        assert_eq!(take(&new, &digest, &old, || true), Taken { seeded: None, retired: true }, "changed: discarded");
        assert!(!new.join("node_modules").exists());
    }

    #[test]
    fn a_donor_that_may_not_seed_this_revision_stays_ready_and_intact() {
        let d = tempfile::tempdir().unwrap();
        let old = node_project(d.path(), "old", true);
        let digest = manifest_digest(&old).unwrap();
        std::fs::create_dir_all(old.join("node_modules/x")).unwrap();
        crate::trees::share(&old.join("node_modules")).unwrap();
        let new = node_project(d.path(), "new", true);
        std::fs::create_dir_all(new.join("node_modules/y")).unwrap(); // the revision commits its node_modules
        let taken = take(&new, &digest, &old, || panic!("a donor that may not seed is never retired"));
        assert_eq!(taken, Taken { seeded: None, retired: false });
        crate::trees::share(&old.join("node_modules")).expect("the donor's tree is where it was, sealed");
        assert!(new.join("node_modules/y").exists() && !new.join("node_modules/x").exists());
        let refused = take(&node_project(d.path(), "third", true), &digest, &old, || false);
        assert_eq!(refused, Taken { seeded: None, retired: false }, "a donor that could not be retired is not moved");
        assert!(old.join("node_modules/x").exists());
    }

    #[test]
    fn a_python_donor_whose_virtualenv_changed_is_never_copied() {
        let d = tempfile::tempdir().unwrap();
        let old = prepared_python(d.path(), "old");
        crate::trees::share(&old.0.join("lib")).unwrap();
        let dir = old.0.join("lib/site-packages/pulumi");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.join("planted.py"), "evil").unwrap();
        let new = d.path().join("new");
        std::fs::create_dir(&new).unwrap();
        assert_eq!(seed(&new, &old.1, [old.clone()]), None);
        assert!(!new.join("lib").exists() && !new.join("pyvenv.cfg").exists());
    }
}
