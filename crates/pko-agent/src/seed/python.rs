//! Python (Pulumi's `pip` toolchain, the default): which files decide a project's virtualenv, where that virtualenv is
//! in a prepared revision, and how a seeded one is checked ([`super`] holds the contract).
//!
//! A virtualenv is a directory `runtime.options.virtualenv` names (`venv` in `pulumi new`'s templates), or the project
//! directory itself (a Python host that ignores the option, the bed's: [`crate::trees::is_virtualenv_part`]). Its
//! files name no absolute path that matters to a run: `bin/python` links to the agent's interpreter (`pyvenv.cfg`'s
//! `home`, the same for every revision on one agent), and `site-packages` is found relative to it. The scripts in
//! `bin/` (`pip`, entry points) name the directory the install ran in by absolute path — for every prepared revision
//! a temporary directory renamed afterwards, seeded or not — so Pulumi, which runs `python`, never uses them.
//! Poetry and uv keep their environments elsewhere and are never seeded.

use std::path::{Path, PathBuf};

/// The directories of a virtualenv (besides `pyvenv.cfg`) that `python -m venv` and pip make.
pub const VIRTUALENV_PARTS: &[&str] = &["bin", "include", "lib", "lib64", "share"];

/// The options a requirements file may carry and still be decided by its own bytes and the package index: the index
/// and how to pick from it. Anything else (`-r`/`-c` other files, `-e`, `--find-links` to a path, …) may read the
/// project's other files.
const INDEX_OPTIONS: &[&str] = &[
    "--hash",
    "-i",
    "--index-url",
    "--extra-index-url",
    "--trusted-host",
    "--pre",
    "--prefer-binary",
    "--only-binary",
    "--no-binary",
    "--require-hashes",
];

/// The lines of a requirements file as pip reads them: continuations (`\\` at a line's end) joined, comments (`#` at
/// the start or after white space) and blank lines dropped, trimmed. Pure.
pub fn requirement_lines(requirements: &str) -> Vec<String> {
    let uncommented = |l: &str| {
        let b = l.as_bytes();
        let at = (0..b.len()).find(|&i| b[i] == b'#' && (i == 0 || b[i - 1].is_ascii_whitespace()));
        l[..at.unwrap_or(l.len())].trim().to_string()
    };
    requirements.replace("\\\n", " ").lines().map(uncommented).filter(|l| !l.is_empty()).collect()
}

/// Whether `requirements` (the text of `requirements.txt`) makes the virtualenv depend on the project's own or other
/// files: a requirement given as a path or a `file:` URL, or an option outside [`INDEX_OPTIONS`]. Pure.
pub fn refers_to_files(requirements: &str) -> bool {
    requirement_lines(requirements).iter().any(|line| {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { return false };
        let option = |w: &str| w.starts_with('-') && !INDEX_OPTIONS.contains(&w.split('=').next().unwrap_or(w));
        let local = ["./", "../", "/", "~", "."].iter().any(|p| first.starts_with(p)) || line.contains("file:");
        (first.starts_with('-') && option(first)) || (!first.starts_with('-') && local) || words.any(option)
    })
}

/// The digest of what decides `project`'s virtualenv (as fetched): the `toolchain` and `virtualenv` runtime options,
/// the lines of `requirements.txt` ([`requirement_lines`]), and `pip.conf` in the project and in the virtualenv's
/// directory; SHA-256 hex. `None` when the project is not seeded: another toolchain than pip, no `requirements.txt`, a
/// requirements file that [`refers_to_files`], or a virtualenv outside the project (an absolute path, `..`).
pub fn digest(project: &Path) -> Option<String> {
    use sha2::{Digest, Sha256};
    let toolchain = crate::pulumi::runtime_option(project, "toolchain");
    if toolchain.as_deref().is_some_and(|t| t != "pip") {
        return None;
    }
    let venv = crate::pulumi::runtime_option(project, "virtualenv").unwrap_or_default();
    venv_dir(&venv)?;
    let requirements = std::fs::read_to_string(project.join("requirements.txt")).ok()?;
    if refers_to_files(&requirements) {
        return None;
    }
    let mut h = Sha256::new();
    // what pip reads, not the bytes: a comment or a blank line changes nothing it installs
    for part in [toolchain.unwrap_or_default(), venv.clone(), requirement_lines(&requirements).join("\n")] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    for conf in [project.join("pip.conf"), project.join(&venv).join("pip.conf")] {
        let bytes = std::fs::read(conf).unwrap_or_default();
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(&bytes);
    }
    Some(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The `virtualenv` option as a path inside the project (empty: none), or `None` when it leaves the project. Pure.
fn venv_dir(option: &str) -> Option<PathBuf> {
    let p = Path::new(option);
    p.components()
        .all(|c| matches!(c, std::path::Component::Normal(_) | std::path::Component::CurDir))
        .then(|| p.into())
}

/// The entries of the prepared project `donor` (relative to it) that make its virtualenv: the directory the
/// `virtualenv` option names when it holds `pyvenv.cfg`, else the project's own `pyvenv.cfg` and [`VIRTUALENV_PARTS`]
/// when the project is the virtualenv; none when it has none.
pub fn tree_entries(donor: &Path) -> Vec<PathBuf> {
    let option = crate::pulumi::runtime_option(donor, "virtualenv").unwrap_or_default();
    if let Some(dir) = venv_dir(&option).filter(|d| !d.as_os_str().is_empty())
        && donor.join(&dir).join("pyvenv.cfg").is_file()
    {
        return vec![dir];
    }
    if !donor.join("pyvenv.cfg").is_file() {
        return Vec::new();
    }
    let parts = VIRTUALENV_PARTS.iter().map(PathBuf::from).filter(|p| donor.join(p).symlink_metadata().is_ok());
    std::iter::once(PathBuf::from("pyvenv.cfg")).chain(parts).collect()
}

/// The virtualenv seeded into `project` from `entries` ([`tree_entries`]): the project itself or the one directory.
pub fn seeded_venv(project: &Path, entries: &[PathBuf]) -> PathBuf {
    match entries.first() {
        Some(dir) if dir != Path::new("pyvenv.cfg") => project.join(dir),
        _ => project.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirement_lines_are_what_pip_reads() {
        let text = "# head\npulumi==3.1 \\\n    --hash=sha256:ab  # pinned\n\nx @ git+https://h/r#egg=x\n";
        assert_eq!(requirement_lines(text), ["pulumi==3.1      --hash=sha256:ab", "x @ git+https://h/r#egg=x"]);
    }

    #[test]
    fn requirements_from_the_index_are_seeded_and_from_files_are_not() {
        assert!(!refers_to_files("pulumi>=3.0.0,<4.0.0\npulumi-kubernetes==4.24.0\n"));
        assert!(!refers_to_files(
            "# pinned\n--index-url https://pypi.org/simple\npulumi==3.1 \\\n    --hash=sha256:ab\n"
        ));
        assert!(!refers_to_files("pulumi @ git+https://github.com/pulumi/pulumi#subdirectory=sdk/python\n"));
        assert!(refers_to_files("-r base.txt\n"));
        assert!(refers_to_files("-e .\n"));
        assert!(refers_to_files("./vendor/mylib\n"));
        assert!(refers_to_files("mylib @ file:///src/mylib\n"));
        assert!(refers_to_files("--find-links ./wheels\npulumi\n"));
        assert!(refers_to_files("pulumi --config-settings x=y\n"));
    }

    fn project(root: &Path, name: &str, yaml: &str, requirements: Option<&str>) -> PathBuf {
        let p = root.join(name);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("Pulumi.yaml"), yaml).unwrap();
        if let Some(r) = requirements {
            std::fs::write(p.join("requirements.txt"), r).unwrap();
        }
        p
    }

    const OPTIONED: &str = "name: p\nruntime:\n  name: python\n  options:\n    virtualenv: venv\n";

    #[test]
    fn the_digest_covers_the_requirements_the_options_and_pip_conf() {
        let d = tempfile::tempdir().unwrap();
        let bare = digest(&project(d.path(), "a", "name: p\nruntime: python\n", Some("pulumi\n"))).unwrap();
        let same = digest(&project(d.path(), "b", "name: q\nruntime: python\ndescription: x\n", Some("pulumi\n")));
        assert_eq!(same.as_deref(), Some(bare.as_str()), "the project's name and description do not count");
        let commented = project(d.path(), "b2", "name: p\nruntime: python\n", Some("# the SDK\n\npulumi  # any\n"));
        assert_eq!(digest(&commented).as_deref(), Some(bare.as_str()), "comments and blank lines do not count");
        let optioned = digest(&project(d.path(), "c", OPTIONED, Some("pulumi\n"))).unwrap();
        assert_ne!(optioned, bare, "another virtualenv, another digest");
        let conf = project(d.path(), "d", OPTIONED, Some("pulumi\n"));
        std::fs::write(conf.join("pip.conf"), "[global]\nindex-url = https://mirror\n").unwrap();
        assert_ne!(digest(&conf).unwrap(), optioned, "pip.conf changes what pip installs");
        assert_eq!(digest(&project(d.path(), "e", "name: p\nruntime: python\n", None)), None);
        let poetry = "name: p\nruntime:\n  name: python\n  options:\n    toolchain: poetry\n";
        assert_eq!(digest(&project(d.path(), "f", poetry, Some("pulumi\n"))), None);
        let outside = "name: p\nruntime:\n  name: python\n  options:\n    virtualenv: /opt/venv\n";
        assert_eq!(digest(&project(d.path(), "g", outside, Some("pulumi\n"))), None);
        assert_eq!(digest(&project(d.path(), "h", OPTIONED, Some("-e .\n"))), None);
    }

    #[test]
    fn the_virtualenv_is_the_named_directory_or_the_project_itself() {
        let d = tempfile::tempdir().unwrap();
        let named = project(d.path(), "named", OPTIONED, Some("pulumi\n"));
        assert!(tree_entries(&named).is_empty(), "not installed yet");
        std::fs::create_dir_all(named.join("venv/lib")).unwrap();
        std::fs::write(named.join("venv/pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        assert_eq!(tree_entries(&named), vec![PathBuf::from("venv")]);
        assert_eq!(seeded_venv(Path::new("/p"), &tree_entries(&named)), Path::new("/p/venv"));
        let own = project(d.path(), "own", "name: p\nruntime: python\n", Some("pulumi\n"));
        std::fs::write(own.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        std::fs::create_dir_all(own.join("lib")).unwrap();
        std::fs::create_dir_all(own.join("bin")).unwrap();
        std::os::unix::fs::symlink("lib", own.join("lib64")).unwrap();
        let entries = tree_entries(&own);
        assert_eq!(entries, ["pyvenv.cfg", "bin", "lib", "lib64"].map(PathBuf::from).to_vec());
        assert_eq!(seeded_venv(Path::new("/p"), &entries), Path::new("/p"));
    }
}
