//! Links stay inside their root: a path resolved as the kernel would, and a tree checked link by link.

use std::collections::VecDeque;
use std::path::{Component, Path, PathBuf};

use super::{ArchiveError, MAX_LINK_HOPS};

/// Why a path does not resolve inside its root ([`resolve_inside`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outside {
    /// It is absolute, or `..` leaves the root.
    Leaves,
    /// A link on the way is absolute.
    AbsoluteLink,
    /// More than [`MAX_LINK_HOPS`] links on the way.
    TooManyHops,
    /// A link on the way cannot be read.
    Unreadable,
}

/// Resolves `rel` (relative to `root`) as the kernel would — following every link on the way, at most
/// [`MAX_LINK_HOPS`] XX and returns the real path relative to `root`. Components that do not exist are taken as
/// written. Errors: [`Outside`], why the path does not stay inside `root`.
pub(super) fn resolve_inside(root: &Path, rel: &Path, hops: usize) -> Result<PathBuf, Outside> {
    let mut todo: VecDeque<std::ffi::OsString> = VecDeque::new();
    let mut done: Vec<std::ffi::OsString> = Vec::new();
    let mut hops = hops;
    for c in rel.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => return Err(Outside::Leaves),
            other => todo.push_back(other.as_os_str().to_owned()),
        }
    }
    while let Some(c) = todo.pop_front() {
        if c == ".." {
            done.pop().ok_or(Outside::Leaves)?;
            continue;
        }
        if c == "." {
            continue;
        }
        let mut here: PathBuf = root.to_path_buf();
        here.extend(&done);
        here.push(&c);
        match std::fs::symlink_metadata(&here) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > MAX_LINK_HOPS {
                    return Err(Outside::TooManyHops);
                }
                let target = std::fs::read_link(&here).map_err(|_| Outside::Unreadable)?;
                if target.is_absolute() {
                    return Err(Outside::AbsoluteLink);
                }
                for t in target.components().rev() {
                    todo.push_front(t.as_os_str().to_owned());
                }
            }
            _ => done.push(c),
        }
    }
    Ok(done.iter().collect())
}

/// Checks every symlink under `root` (a checkout or an extracted artifact; `.git` skipped): each must resolve inside
/// `root` ([`resolve_inside`]). Errors: [`ArchiveError::UnsafeLink`] naming the first link that leaves, or
/// [`ArchiveError::Write`] when the tree cannot be read.
pub fn check_links_inside(root: &Path) -> Result<(), ArchiveError> {
    let mut stack = vec![PathBuf::new()];
    while let Some(dir) = stack.pop() {
        let read = std::fs::read_dir(root.join(&dir))
            .map_err(|source| ArchiveError::Write { path: dir.display().to_string(), source })?;
        for e in read.flatten() {
            let rel = dir.join(e.file_name());
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() && rel != Path::new(".git") {
                stack.push(rel);
            } else if t.is_symlink() && resolve_inside(root, &rel, 0).is_err() {
                let target = std::fs::read_link(root.join(&rel)).map(|p| p.display().to_string()).unwrap_or_default();
                return Err(ArchiveError::UnsafeLink { path: rel.display().to_string(), target });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkout_with_a_link_out_is_refused() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join(".git")).unwrap();
        std::os::unix::fs::symlink("/etc", d.path().join(".git/ok-inside-git-dir")).unwrap();
        check_links_inside(d.path()).unwrap();
        std::os::unix::fs::symlink("../../etc/passwd", d.path().join("Pulumi.dev.yaml")).unwrap();
        assert!(matches!(check_links_inside(d.path()), Err(ArchiveError::UnsafeLink { .. })));
    }
}
