//! Truncated attribute sidecars: what a `pulumi` SIGKILLed mid-write leaves in a `file://` backend.
//!
//! Pulumi's `file://` backend stores each object through gocloud's `fileblob` driver, which writes the object itself
//! atomically (a temporary file renamed over it) but its attribute sidecar `<object>.attrs` (content type, MD5; JSON)
//! in place: `os.Create` truncates it, then a JSON encoder fills it (`gocloud.dev/blob/fileblob/attrs.go`, `setAttrs`).
//! A `pulumi` killed between the two (a pod OOM-killed or evicted, a local agent's process group killed mid-`up`;
//! Pulumi writes the checkpoint after every step) leaves an **empty** sidecar beside the stack's checkpoint, and from
//! then on every command on that stack fails with `error: failed to load checkpoint: EOF`, because reading an object
//! decodes its sidecar first. PKO has the same wound and no cure; the stack stays broken until someone deletes the file
//! by hand.
//!
//! A missing sidecar is read as "no attributes" (`getAttrs`), and Pulumi keeps nothing in a checkpoint's or lock's
//! attributes that it reads back, so removing a sidecar that does not parse loses nothing. Even a sidecar caught empty
//! while a live `pulumi` is between the two writes can be removed: its object stays readable. [`repair`] does exactly
//! that for the files one stack's operations read: the backend's `meta.yaml`, the stack's checkpoint (`.json`,
//! `.json.gz`, `.json.zst`) and its `.bak`, in the project layout and the legacy one, and the stack's lock files.
//! History and backup files, which `up`/`preview`/`refresh`/`destroy` never read, are left alone.

use std::path::{Path, PathBuf};

/// The suffix gocloud's `fileblob` gives an object's attribute sidecar.
pub const ATTRS_SUFFIX: &str = ".attrs";

/// The local directory a `file://` backend URL (`PULUMI_BACKEND_URL`) stores its state under: the URL's path without
/// its query (`?no_tmp_dir=true`), `~` for `home`, a relative path against `project_dir` (Pulumi's own resolution,
/// `pkg/backend/diy/backend.go`). `None` for any other scheme (`s3://`, `https://` …), which has no local sidecars.
pub fn backend_root(url: &str, home: Option<&Path>, project_dir: &Path) -> Option<PathBuf> {
    let path = url.strip_prefix("file://")?;
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    if path.is_empty() {
        return None;
    }
    let path = if path == "~" {
        home?.to_path_buf()
    } else if let Some(rest) = path.strip_prefix("~/") {
        home?.join(rest)
    } else {
        PathBuf::from(path)
    };
    Some(if path.is_absolute() { path } else { project_dir.join(path) })
}

/// The files, relative to the backend root, whose sidecars operations on `stack` read: `meta.yaml`, the checkpoint and
/// its `.bak` in every encoding and layout. `stack` is the request's stack name (`dev`, `org/dev` or `org/project/dev`:
/// the last segment is the stack, a middle one the project); `project` is the `name` of the program's `Pulumi.yaml`.
/// Lock files are listed by [`repair`] from [`lock_dirs`].
pub fn objects(project: &str, stack: &str) -> Vec<PathBuf> {
    let (project, name) = names(project, stack);
    let mut out = vec![PathBuf::from(".pulumi/meta.yaml")];
    for base in [format!(".pulumi/stacks/{project}/{name}"), format!(".pulumi/stacks/{name}")] {
        for ext in [".json", ".json.gz", ".json.zst"] {
            out.push(PathBuf::from(format!("{base}{ext}")));
            out.push(PathBuf::from(format!("{base}{ext}.bak")));
        }
    }
    out
}

/// The directories, relative to the backend root, holding `stack`'s lock files: the project layout
/// (`.pulumi/locks/organization/<project>/<stack>`, Pulumi's `stackLockDir` of the fully qualified name) and the legacy
/// one (`.pulumi/locks/<stack>`). Same arguments as [`objects`].
pub fn lock_dirs(project: &str, stack: &str) -> Vec<PathBuf> {
    let (project, name) = names(project, stack);
    vec![
        PathBuf::from(format!(".pulumi/locks/organization/{project}/{name}")),
        PathBuf::from(format!(".pulumi/locks/{name}")),
    ]
}

/// The project and the stack's own name from a request's stack name (`dev`, `org/dev`, `org/project/dev`) and the
/// program's project.
fn names<'a>(project: &'a str, stack: &'a str) -> (&'a str, &'a str) {
    match stack.split('/').collect::<Vec<_>>().as_slice() {
        [_, p, n] => (p, n),
        [.., n] => (project, n),
        [] => (project, stack),
    }
}

/// Whether a sidecar's content is truncated: empty, or not one JSON object (a write cut short).
pub fn truncated(content: &[u8]) -> bool {
    !matches!(serde_json::from_slice::<serde_json::Value>(content), Ok(serde_json::Value::Object(_)))
}

/// Removes the truncated sidecars of the files `stack`'s operations read under the backend `root` (see the module docs)
/// and returns the paths removed. Errors: the first failure to read a directory or a sidecar that exists, or to remove
/// a truncated one (a missing file is not an error).
pub fn repair(root: &Path, project: &str, stack: &str) -> std::io::Result<Vec<PathBuf>> {
    let mut sidecars: Vec<PathBuf> = objects(project, stack).into_iter().map(|o| sidecar(&root.join(o))).collect();
    for dir in lock_dirs(project, stack) {
        match std::fs::read_dir(root.join(dir)) {
            Ok(entries) => {
                for e in entries {
                    let path = e?.path();
                    if path.to_string_lossy().ends_with(ATTRS_SUFFIX) {
                        sidecars.push(path);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    let mut removed = Vec::new();
    for path in sidecars {
        match std::fs::read(&path) {
            Ok(content) if truncated(&content) => match std::fs::remove_file(&path) {
                Ok(()) => removed.push(path),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            },
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

/// The sidecar path of `object`.
fn sidecar(object: &Path) -> PathBuf {
    let mut s = object.as_os_str().to_owned();
    s.push(ATTRS_SUFFIX);
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backend_root_is_the_url_path_of_file_backends_only() {
        let home = Path::new("/home/u");
        let dir = Path::new("/work/prog");
        assert_eq!(backend_root("file:///state", Some(home), dir), Some(PathBuf::from("/state")));
        assert_eq!(backend_root("file:///state?no_tmp_dir=true", Some(home), dir), Some(PathBuf::from("/state")));
        assert_eq!(backend_root("file://~", Some(home), dir), Some(PathBuf::from("/home/u")));
        assert_eq!(backend_root("file://~/st", Some(home), dir), Some(PathBuf::from("/home/u/st")));
        assert_eq!(backend_root("file://~/st", None, dir), None);
        assert_eq!(backend_root("file://rel", Some(home), dir), Some(PathBuf::from("/work/prog/rel")));
        assert_eq!(backend_root("file://", Some(home), dir), None);
        assert_eq!(backend_root("s3://bucket", Some(home), dir), None);
        assert_eq!(backend_root("https://api.pulumi.com", Some(home), dir), None);
    }

    #[test]
    fn the_objects_are_the_checkpoint_its_backup_and_meta_in_both_layouts() {
        let o = objects("proj", "dev");
        assert!(o.contains(&PathBuf::from(".pulumi/meta.yaml")));
        assert!(o.contains(&PathBuf::from(".pulumi/stacks/proj/dev.json")));
        assert!(o.contains(&PathBuf::from(".pulumi/stacks/proj/dev.json.bak")));
        assert!(o.contains(&PathBuf::from(".pulumi/stacks/proj/dev.json.gz")));
        assert!(o.contains(&PathBuf::from(".pulumi/stacks/dev.json.zst")));
        // a fully qualified name names its own project; `org/dev` the program's
        assert!(objects("proj", "organization/other/dev").contains(&PathBuf::from(".pulumi/stacks/other/dev.json")));
        assert!(objects("proj", "organization/dev").contains(&PathBuf::from(".pulumi/stacks/proj/dev.json")));
        assert_eq!(
            lock_dirs("proj", "organization/other/dev"),
            vec![PathBuf::from(".pulumi/locks/organization/other/dev"), PathBuf::from(".pulumi/locks/dev")]
        );
    }

    #[test]
    fn only_a_sidecar_that_is_not_one_json_object_is_truncated() {
        assert!(truncated(b""));
        assert!(truncated(b"{\"user.cache_control\":\"\",\"user.content_type\":\"appl"));
        assert!(truncated(b"null"));
        assert!(!truncated(b"{\"user.content_type\":\"application/octet-stream\",\"md5\":\"abc=\"}\n"));
    }

    #[test]
    fn repair_removes_truncated_sidecars_of_the_stack_and_nothing_else() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let write = |p: &str, c: &str| {
            let p = r.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, c).unwrap();
        };
        let good = "{\"user.content_type\":\"application/octet-stream\"}\n";
        write(".pulumi/meta.yaml.attrs", good);
        write(".pulumi/stacks/proj/dev.json", "{}");
        write(".pulumi/stacks/proj/dev.json.attrs", "");
        write(".pulumi/stacks/proj/dev.json.bak.attrs", good);
        write(".pulumi/locks/organization/proj/dev/abc.json.attrs", "{\"user.con");
        write(".pulumi/locks/organization/proj/dev/def.json.attrs", good);
        // another stack's and the history's truncated sidecars are not this stack's to touch
        write(".pulumi/stacks/proj/prod.json.attrs", "");
        write(".pulumi/history/proj/dev/dev-1.checkpoint.json.attrs", "");

        let mut removed = repair(r, "proj", "dev").unwrap();
        removed.sort();
        assert_eq!(
            removed,
            vec![
                r.join(".pulumi/locks/organization/proj/dev/abc.json.attrs"),
                r.join(".pulumi/stacks/proj/dev.json.attrs")
            ]
        );
        for kept in [
            ".pulumi/meta.yaml.attrs",
            ".pulumi/stacks/proj/dev.json",
            ".pulumi/stacks/proj/dev.json.bak.attrs",
            ".pulumi/locks/organization/proj/dev/def.json.attrs",
            ".pulumi/stacks/proj/prod.json.attrs",
            ".pulumi/history/proj/dev/dev-1.checkpoint.json.attrs",
        ] {
            assert!(r.join(kept).exists(), "{kept} kept");
        }
        assert!(repair(r, "proj", "dev").unwrap().is_empty(), "nothing left to repair");
        assert!(repair(&r.join("missing"), "proj", "dev").unwrap().is_empty(), "a backend not yet written is fine");
    }
}
