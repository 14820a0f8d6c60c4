//! Node.js: which manifests decide a `node_modules`, which trees may seed another revision's, and when a seed makes
//! the install of the language dependencies unnecessary ([`super`] holds the contract).

use std::path::Path;

/// The files whose bytes decide what `npm install` (or yarn, pnpm) puts in `node_modules` besides the registry.
pub const NODE_MANIFESTS: &[&str] = &[
    "package.json",
    "package-lock.json",
    "npm-shrinkwrap.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    ".npmrc",
    ".yarnrc",
    ".yarnrc.yml",
    ".pnpmfile.cjs",
];

/// Whether `package_json` (its text) makes the tree depend on the project's own files: a dependency given as a path or
/// by `file:`, `link:`, `workspace:` or `portal:`, or npm `workspaces`; text that does not parse counts as such. Pure.
pub fn depends_on_own_files(package_json: &str) -> bool {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(package_json) else { return true };
    if v.get("workspaces").is_some() {
        return true;
    }
    let local = |spec: &str| {
        ["file:", "link:", "workspace:", "portal:", "./", "../", "/", "~/"].iter().any(|p| spec.starts_with(p))
    };
    ["dependencies", "devDependencies", "optionalDependencies", "peerDependencies"]
        .iter()
        .filter_map(|k| v.get(*k)?.as_object())
        .flat_map(|deps| deps.values())
        .any(|spec| spec.as_str().is_none_or(local))
}

/// The lockfiles that pin a whole `node_modules` (npm, yarn, pnpm).
const LOCKFILES: &[&str] = &["package-lock.json", "npm-shrinkwrap.json", "yarn.lock", "pnpm-lock.yaml"];

/// The root package's scripts that its package manager runs on install (they may build the project's own files).
const INSTALL_SCRIPTS: &[&str] = &["preinstall", "install", "postinstall", "prepare", "preprepare", "postprepare"];

/// Whether a `node_modules` seeded into `project` (as fetched: call it before any install) is exactly what installing
/// its dependencies would make, so that install may be skipped: a lockfile pins the whole tree (the donor had the
/// same one, [`digest`]) and `package.json` has no install-time script of its own ([`INSTALL_SCRIPTS`]:
/// those build from the new revision's files). Text that does not parse: no.
pub fn seed_settles_dependencies(project: &Path) -> bool {
    let Ok(package) = std::fs::read_to_string(project.join("package.json")) else { return false };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&package) else { return false };
    let scripts = v.get("scripts").and_then(|s| s.as_object());
    let runs_on_install = scripts.is_some_and(|s| INSTALL_SCRIPTS.iter().any(|k| s.contains_key(*k)));
    !runs_on_install && LOCKFILES.iter().any(|l| project.join(l).is_file())
}

/// The digest of `project`'s [`NODE_MANIFESTS`] as fetched (before `npm install` writes a lockfile): SHA-256 hex over
/// each one's name, presence and bytes; `None` when it has no `package.json`, or one that depends on its own files
/// ([`depends_on_own_files`]). Two revisions with the same digest get the same `node_modules` from the same registry.
pub fn digest(project: &Path) -> Option<String> {
    use sha2::{Digest, Sha256};
    let package = std::fs::read_to_string(project.join("package.json")).ok()?;
    if depends_on_own_files(&package) {
        return None;
    }
    let mut h = Sha256::new();
    for m in NODE_MANIFESTS {
        h.update(m.as_bytes());
        match std::fs::read(project.join(m)) {
            Ok(bytes) => {
                h.update((bytes.len() as u64 + 1).to_be_bytes());
                h.update(&bytes);
            }
            Err(_) => h.update(0u64.to_be_bytes()),
        }
    }
    Some(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seed::{manifest_digest, seed};
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    fn project(root: &Path, name: &str, package: &str, lock: Option<&str>) -> PathBuf {
        let p = root.join(name);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("package.json"), package).unwrap();
        if let Some(l) = lock {
            std::fs::write(p.join("package-lock.json"), l).unwrap();
        }
        p
    }

    fn installed(p: &Path) {
        let m = p.join("node_modules/@pulumi/x");
        std::fs::create_dir_all(&m).unwrap();
        std::fs::write(m.join("index.js"), "module.exports = 1").unwrap();
        std::fs::create_dir_all(p.join("node_modules/.bin")).unwrap();
        std::os::unix::fs::symlink("../@pulumi/x/index.js", p.join("node_modules/.bin/x")).unwrap();
    }

    const PKG: &str = r#"{"dependencies": {"@pulumi/x": "^1.0.0"}}"#;

    #[test]
    fn local_dependencies_and_workspaces_are_never_seeded() {
        assert!(!depends_on_own_files(PKG));
        assert!(depends_on_own_files(r#"{"dependencies": {"a": "file:../a"}}"#));
        assert!(depends_on_own_files(r#"{"devDependencies": {"a": "./a"}}"#));
        assert!(depends_on_own_files(r#"{"dependencies": {"a": "workspace:*"}}"#));
        assert!(depends_on_own_files(r#"{"workspaces": ["packages/*"]}"#));
        assert!(depends_on_own_files("not json"));
    }

    /// `p` with its digest as fetched, then "installed" (npm writes a lockfile the fetched revision did not have).
    fn prepared(p: &Path) -> (PathBuf, String) {
        let digest = manifest_digest(p).unwrap();
        installed(p);
        std::fs::write(p.join("package-lock.json"), "written by npm install").unwrap();
        (p.to_path_buf(), digest)
    }

    #[test]
    fn a_new_revision_with_the_same_manifests_gets_a_writable_copy_of_a_verified_tree() {
        let d = tempfile::tempdir().unwrap();
        let other = prepared(&project(d.path(), "other", r#"{"dependencies": {"@pulumi/y": "1"}}"#, None));
        let old = prepared(&project(d.path(), "old", PKG, None));
        crate::trees::share(&old.0.join("node_modules")).unwrap(); // sealed, read-only, as an operation left it
        let new = project(d.path(), "new", PKG, None);
        let digest = manifest_digest(&new).unwrap();
        assert_eq!(digest, old.1, "the lockfile npm wrote does not count: the digest is taken as fetched");
        assert_eq!(seed(&new, &digest, [other.clone(), old.clone()]).map(|s| s.donor), Some(old.0.clone()));
        let copied = new.join("node_modules/@pulumi/x/index.js");
        assert_eq!(std::fs::read_to_string(&copied).unwrap(), "module.exports = 1");
        std::fs::write(&copied, "changed").expect("the copy is writable");
        assert_eq!(std::fs::read_link(new.join("node_modules/.bin/x")).unwrap(), Path::new("../@pulumi/x/index.js"));
        crate::trees::share(&old.0.join("node_modules")).expect("the donor is untouched");
        assert_eq!(seed(&new, &digest, [old.clone()]).map(|s| s.donor), None, "a node_modules is left alone");
        let locked = project(d.path(), "locked", PKG, Some("a lockfile of its own"));
        assert_ne!(manifest_digest(&locked), Some(old.1.clone()), "another lockfile, another digest");
        assert_eq!(manifest_digest(&project(d.path(), "local", r#"{"dependencies": {"a": "file:a"}}"#, None)), None);
    }

    #[test]
    fn only_a_locked_project_without_install_scripts_skips_installing_its_seeded_dependencies() {
        let d = tempfile::tempdir().unwrap();
        assert!(seed_settles_dependencies(&project(d.path(), "locked", PKG, Some("{}"))));
        assert!(!seed_settles_dependencies(&project(d.path(), "unlocked", PKG, None)), "npm would resolve anew");
        let built = r#"{"dependencies": {"@pulumi/x": "1"}, "scripts": {"postinstall": "tsc", "test": "x"}}"#;
        assert!(!seed_settles_dependencies(&project(d.path(), "built", built, Some("{}"))), "builds its own files");
        assert!(!seed_settles_dependencies(&project(d.path(), "bad", "not json", Some("{}"))));
        assert!(seed_settles_dependencies(&project(d.path(), "tests", r#"{"scripts": {"test": "x"}}"#, Some("{}"))));
    }

    #[test]
    fn a_donor_whose_tree_changed_since_it_was_sealed_is_never_copied() {
        let d = tempfile::tempdir().unwrap();
        let old = prepared(&project(d.path(), "old", PKG, None));
        let tree = old.0.join("node_modules");
        crate::trees::share(&tree).unwrap();
        let planted = tree.join("@pulumi/x/planted.js");
        std::fs::set_permissions(tree.join("@pulumi/x"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(&planted, "evil").unwrap();
        let new = project(d.path(), "new", PKG, None);
        let digest = manifest_digest(&new).unwrap();
        assert_eq!(seed(&new, &digest, [old]).map(|s| s.donor), None);
        assert!(!new.join("node_modules").exists());
    }
}
