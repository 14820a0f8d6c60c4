//! Safe extraction of gzipped tarballs (Flux artifacts, Program artifacts) into a directory the agent owns. Artifacts
//! are tenant input, so extraction assumes a hostile archive (docs/security.md):
//!
//! - **nothing is written through a link**: every parent directory of an entry must be a real directory inside the root
//!   (a symlink on the way is refused), files are created with `O_EXCL` (a link already at the final path is replaced,
//!   never followed), and entry paths are relative with no `..`;
//! - **links never lead out**: symlink targets are relative, and once every entry is in place each link is resolved as
//!   the kernel would (following the links it passes, [`MAX_LINK_HOPS`] at most) and refused if it ends outside the
//!   root — chains (`a -> .`, `b -> a/..`) included ([`check_links_inside`]); hard links, devices, FIFOs and sparse
//!   files are refused;
//! - **bounded work and memory**: the archive is read entry by entry in raw mode, so GNU long names and PAX headers are
//!   read by this module with a [`Limits::max_metadata_bytes`] cap (default 64 KiB) instead of whole into memory; every
//!   entry's declared size — data skipped included — counts toward [`Limits::max_bytes`] before it is read; a PAX
//!   `size` that disagrees with the header's is refused (the two parsers would see different archives); at most
//!   [`Limits::max_entries`] entries.

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

/// Links one path may pass through while it is resolved (Linux's own limit is 40).
pub const MAX_LINK_HOPS: usize = 40;

/// Default [`Limits::max_entries`].
pub const DEFAULT_MAX_ENTRIES: u64 = 100_000;

/// Default [`Limits::max_metadata_bytes`]: 64 KiB, far above any real path (`PATH_MAX` is 4 KiB).
pub const DEFAULT_MAX_METADATA_BYTES: u64 = 64 << 10;

/// Bounds of one extraction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Uncompressed bytes the archive may declare in all, in bytes (PKO `FLUX_MAX_UNTAR_SIZE_BYTES`, 100 MiB by
    /// default).
    pub max_bytes: u64,
    /// Entries (headers included) the archive may hold.
    pub max_entries: u64,
    /// Size of one GNU long-name/long-link or PAX header, in bytes.
    pub max_metadata_bytes: u64,
}

impl Limits {
    /// `max_bytes` with the default entry and metadata limits.
    pub fn new(max_bytes: u64) -> Self {
        Self { max_bytes, max_entries: DEFAULT_MAX_ENTRIES, max_metadata_bytes: DEFAULT_MAX_METADATA_BYTES }
    }
}

/// Why an archive was refused. Nothing of a refused archive may be used: the caller extracts into a fresh directory and
/// removes it on error.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The gzip or tar stream is broken (truncated, bad checksum) or could not be read.
    #[error("reading archive: {0}")]
    Read(std::io::Error),
    /// An absolute path, a `..` component, an empty name, or a path through a link.
    #[error("unsafe path in archive: {path}: {why}")]
    UnsafePath {
        /// The entry's path as written in the archive.
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A symlink whose target is absolute or resolves outside the root.
    #[error("unsafe link in archive: {path} -> {target}")]
    UnsafeLink {
        /// The link's path.
        path: String,
        /// Its target as written.
        target: String,
    },
    /// The declared sizes add up to more than [`Limits::max_bytes`].
    #[error("archive is larger than the {0}-byte limit when uncompressed")]
    TooLarge(u64),
    /// More than [`Limits::max_entries`] entries.
    #[error("archive has more than {0} entries")]
    TooManyEntries(u64),
    /// A long-name or PAX header larger than [`Limits::max_metadata_bytes`].
    #[error("archive metadata header of {size} bytes exceeds the {limit}-byte limit")]
    Metadata {
        /// Declared size of the header's data.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// An entry kind this extractor does not write (hard link, device, FIFO, sparse file, …).
    #[error("archive entry {path}: {what} is not supported")]
    Unsupported {
        /// The entry's path.
        path: String,
        /// What it is.
        what: String,
    },
    /// Writing into the destination failed.
    #[error("extracting {path}: {source}")]
    Write {
        /// The entry's path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// What an extraction wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extracted {
    /// Entries read, metadata headers included.
    pub entries: u64,
    /// File bytes written.
    pub bytes: u64,
}

/// GNU long-name/long-link and PAX values that apply to the next entry.
#[derive(Default)]
struct Pending {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
    sparse: bool,
}

impl Pending {
    fn pax(&mut self, data: &[u8]) -> Result<(), ArchiveError> {
        for ext in tar::PaxExtensions::new(data) {
            let ext = ext.map_err(ArchiveError::Read)?;
            match ext.key_bytes() {
                b"path" => self.path = Some(ext.value_bytes().to_vec()),
                b"linkpath" => self.link = Some(ext.value_bytes().to_vec()),
                b"size" => {
                    let v = ext.value().ok().and_then(|v| v.parse::<u64>().ok());
                    self.size =
                        Some(v.ok_or_else(|| ArchiveError::Read(std::io::Error::other("PAX size is not a number")))?);
                }
                k if k.starts_with(b"GNU.sparse.") => self.sparse = true,
                _ => {}
            }
        }
        Ok(())
    }
}

fn trim_nul(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

fn shown(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Whether an entry path names the root itself (`.`, `./`, `././`).
fn names_the_root(raw: &[u8]) -> bool {
    !raw.is_empty() && Path::new(OsStr::from_bytes(raw)).components().all(|c| c == Component::CurDir)
}

/// The entry path as a relative path of normal components. Errors: empty, absolute, or with `..`.
fn entry_path(raw: &[u8]) -> Result<PathBuf, ArchiveError> {
    let unsafe_path = |why| ArchiveError::UnsafePath { path: shown(raw), why };
    let p = Path::new(OsStr::from_bytes(raw));
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err(unsafe_path("'..' is not allowed")),
            Component::RootDir | Component::Prefix(_) => return Err(unsafe_path("absolute paths are not allowed")),
        }
    }
    if out.as_os_str().is_empty() {
        return Err(unsafe_path("empty path"));
    }
    Ok(out)
}

/// Creates the directories of `rel` under `root` as needed; every existing one must be a real directory (not a link).
/// `rel` itself is created when `include_last`.
fn ensure_dirs(root: &Path, rel: &Path, include_last: bool) -> Result<(), ArchiveError> {
    let shown_rel = rel.display().to_string();
    let mut cur = root.to_path_buf();
    let n = rel.components().count();
    for (i, c) in rel.components().enumerate() {
        if i + 1 == n && !include_last {
            break;
        }
        cur.push(c);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(m) if m.file_type().is_symlink() => {
                return Err(ArchiveError::UnsafePath { path: shown_rel, why: "it goes through a link" });
            }
            Ok(_) => return Err(ArchiveError::UnsafePath { path: shown_rel, why: "a parent is not a directory" }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&cur).map_err(|source| ArchiveError::Write { path: shown_rel.clone(), source })?;
            }
            Err(source) => return Err(ArchiveError::Write { path: shown_rel, source }),
        }
    }
    Ok(())
}

/// Removes what is at `path` when it is a file or a link (never following it), so that a later entry of the same name
/// replaces it. A directory there is an error.
fn clear_final(path: &Path, rel: &Path) -> Result<(), ArchiveError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_dir() => {
            Err(ArchiveError::UnsafePath { path: rel.display().to_string(), why: "a directory is in the way" })
        }
        Ok(_) => {
            std::fs::remove_file(path).map_err(|source| ArchiveError::Write { path: rel.display().to_string(), source })
        }
        Err(_) => Ok(()),
    }
}

/// Reads a metadata entry (GNU long name or link, local PAX extensions) of `size` bytes into `pending`, for the entry
/// that follows; global PAX headers carry nothing this extractor honours.
fn read_metadata(
    entry: &mut impl Read,
    kind: tar::EntryType,
    size: u64,
    pending: &mut Pending,
) -> Result<(), ArchiveError> {
    let mut data = Vec::with_capacity(size as usize);
    entry.take(size).read_to_end(&mut data).map_err(ArchiveError::Read)?;
    if kind.is_gnu_longname() {
        pending.path = Some(trim_nul(data));
    } else if kind.is_gnu_longlink() {
        pending.link = Some(trim_nul(data));
    } else if kind.is_pax_local_extensions() {
        pending.pax(&data)?;
    }
    Ok(())
}

/// Writes the regular file `rel` (under `into`) from `entry` of `size` bytes, created new (a file or link of that name
/// before it is removed, never followed), executable when the archive says so. Returns the bytes written.
fn write_file<R: Read>(entry: &mut tar::Entry<'_, R>, into: &Path, rel: &Path, size: u64) -> Result<u64, ArchiveError> {
    let dest = into.join(rel);
    ensure_dirs(into, rel, false)?;
    clear_final(&dest, rel)?;
    let mode = if entry.header().mode().unwrap_or(0o644) & 0o111 != 0 { 0o755 } else { 0o644 };
    let write_err = |source| ArchiveError::Write { path: rel.display().to_string(), source };
    let mut file =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&dest).map_err(write_err)?;
    copy_entry(entry, size, &mut file).map_err(|e| match e {
        CopyError::Read(e) => ArchiveError::Read(e),
        CopyError::Write(source) => ArchiveError::Write { path: rel.display().to_string(), source },
    })
}

/// Makes the symbolic link `rel` (under `into`) to `target`: relative, and — looked at lexically from the link's own
/// directory — inside `into` (the full check follows once every entry is written).
fn write_symlink(into: &Path, rel: &Path, target: &[u8]) -> Result<(), ArchiveError> {
    let unsafe_link = || ArchiveError::UnsafeLink { path: rel.display().to_string(), target: shown(target) };
    let t = Path::new(OsStr::from_bytes(target));
    if target.is_empty() || t.is_absolute() {
        return Err(unsafe_link());
    }
    ensure_dirs(into, rel, false)?;
    if resolve_inside(into, &rel.parent().unwrap_or(Path::new("")).join(t), 0).is_err() {
        return Err(unsafe_link());
    }
    let dest = into.join(rel);
    clear_final(&dest, rel)?;
    std::os::unix::fs::symlink(t, &dest)
        .map_err(|source| ArchiveError::Write { path: rel.display().to_string(), source })
}

/// Extracts the gzipped tarball `reader` into the existing directory `into` within `limits`.
///
/// Errors: [`ArchiveError`]; on error `into` may hold part of the archive (but nothing outside it was written) and must
/// be discarded.
pub fn extract_tar_gz(reader: impl Read, into: &Path, limits: &Limits) -> Result<Extracted, ArchiveError> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(reader));
    let entries = archive.entries().map_err(ArchiveError::Read)?.raw(true);
    let mut out = Extracted::default();
    let mut declared = 0u64;
    let mut pending = Pending::default();
    let mut links: Vec<PathBuf> = Vec::new();
    for entry in entries {
        let mut entry = entry.map_err(ArchiveError::Read)?;
        out.entries += 1;
        if out.entries > limits.max_entries {
            return Err(ArchiveError::TooManyEntries(limits.max_entries));
        }
        let size = entry.header().entry_size().map_err(ArchiveError::Read)?;
        let kind = entry.header().entry_type();
        let metadata = kind.is_gnu_longname()
            || kind.is_gnu_longlink()
            || kind.is_pax_local_extensions()
            || kind.is_pax_global_extensions();
        if metadata && size > limits.max_metadata_bytes {
            return Err(ArchiveError::Metadata { size, limit: limits.max_metadata_bytes });
        }
        declared = declared.saturating_add(size);
        if declared > limits.max_bytes {
            return Err(ArchiveError::TooLarge(limits.max_bytes));
        }
        if metadata {
            read_metadata(&mut entry, kind, size, &mut pending)?;
            continue;
        }
        let meta = std::mem::take(&mut pending);
        let raw_path = meta.path.clone().unwrap_or_else(|| entry.path_bytes().into_owned());
        let unsupported = |what: &str| ArchiveError::Unsupported { path: shown(&raw_path), what: what.into() };
        if meta.size.is_some_and(|s| s != size) {
            return Err(unsupported("a PAX size that disagrees with the header's size"));
        }
        if meta.sparse || kind.is_gnu_sparse() {
            return Err(unsupported("a sparse file"));
        }
        if kind.is_dir() && names_the_root(&raw_path) {
            // `./`, as Flux's source-controller writes first: the root exists already
            continue;
        }
        let rel = entry_path(&raw_path)?;
        if kind.is_dir() {
            ensure_dirs(into, &rel, true)?;
        } else if kind.is_file() || kind == tar::EntryType::Continuous {
            out.bytes += write_file(&mut entry, into, &rel, size)?;
        } else if kind.is_symlink() {
            let target = meta.link.or_else(|| entry.link_name_bytes().map(|c| c.into_owned())).unwrap_or_default();
            write_symlink(into, &rel, &target)?;
            links.push(rel);
        } else if kind.is_hard_link() {
            return Err(unsupported("a hard link"));
        } else {
            return Err(unsupported(&format!("entry type {:?}", kind)));
        }
    }
    check_links_inside(into)?;
    Ok(out)
}

/// Which side of a copy failed.
enum CopyError {
    Read(std::io::Error),
    Write(std::io::Error),
}

/// Copies at most `size` bytes of `from` to `to`; returns the bytes copied.
fn copy_entry(from: &mut impl Read, size: u64, to: &mut impl std::io::Write) -> Result<u64, CopyError> {
    let mut buf = vec![0u8; 64 << 10];
    let mut from = from.take(size);
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Read(e)),
        };
        to.write_all(&buf[..n]).map_err(CopyError::Write)?;
        total += n as u64;
    }
}

/// Archive builders for tests of this crate and of its users (the hostile corpus among them): each returns a gzipped
/// tarball whose headers are written raw, so unsafe names reach the archive. Not in the binary: only with the `testing`
/// feature (this crate's tests enable it).
#[cfg(any(test, feature = "testing"))]
pub mod testing;

mod links;
pub use links::check_links_inside;
use links::resolve_inside;

#[cfg(test)]
mod tests {
    use super::testing::{Item, build, pax_record};
    use super::*;

    fn extract(items: &[Item<'_>]) -> (tempfile::TempDir, Result<Extracted, ArchiveError>) {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("root")).unwrap();
        let r = extract_tar_gz(&build(items)[..], &d.path().join("root"), &Limits::new(1 << 20));
        (d, r)
    }

    /// Everything under `d` except `root/`: what an attack wrote outside.
    fn outside(d: &tempfile::TempDir) -> Vec<String> {
        std::fs::read_dir(d.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "root")
            .collect()
    }

    #[test]
    fn a_plain_archive_with_inside_links_extracts() {
        let (d, r) = extract(&[
            Item::File("Pulumi.yaml", b"name: x\nruntime: yaml\n"),
            Item::Dir("sub"),
            Item::File("sub/a.txt", b"a"),
            Item::Symlink("link", "sub/a.txt"),
            Item::Symlink("sub/up", "../Pulumi.yaml"),
        ]);
        let r = r.unwrap();
        assert_eq!((r.entries, r.bytes), (5, 23));
        assert_eq!(std::fs::read_to_string(d.path().join("root/link")).unwrap(), "a");
        assert_eq!(std::fs::read_to_string(d.path().join("root/sub/up")).unwrap(), "name: x\nruntime: yaml\n");
    }

    #[test]
    fn a_root_directory_entry_is_skipped_but_a_root_file_is_refused() {
        // Flux's source-controller archives start with a `./` directory entry
        let (d, r) = extract(&[Item::Dir("./"), Item::File("./Pulumi.yaml", b"name: x\n")]);
        assert_eq!(r.unwrap().bytes, 8);
        assert!(d.path().join("root/Pulumi.yaml").is_file());
        let (_, r) = extract(&[Item::File(".", b"x")]);
        assert!(matches!(r, Err(ArchiveError::UnsafePath { .. })), "{r:?}");
    }

    #[test]
    fn traversal_absolute_and_links_that_leave_are_refused() {
        for items in [
            vec![Item::File("../evil", b"x")],
            vec![Item::File("a/../../evil", b"x")],
            vec![Item::File("/evil", b"x")],
            vec![Item::Symlink("l", "../evil")],
            vec![Item::Symlink("l", "/etc")],
            vec![Item::HardLink("h", "/etc/passwd")],
            vec![Item::HardLink("h", "Pulumi.yaml")],
        ] {
            let (d, r) = extract(&items);
            assert!(r.is_err(), "{items:?}");
            assert!(outside(&d).is_empty(), "{items:?}");
        }
    }

    #[test]
    fn symlink_chains_are_refused() {
        // a -> . ; b -> a/.. : lexically inside, really the parent of the root
        let (d, r) = extract(&[Item::Symlink("a", "."), Item::Symlink("b", "a/..")]);
        assert!(matches!(r, Err(ArchiveError::UnsafeLink { .. })), "{r:?}");
        // the order reversed: b is made before a exists
        let (_, r) = extract(&[Item::Symlink("b", "a/.."), Item::Symlink("a", ".")]);
        assert!(matches!(r, Err(ArchiveError::UnsafeLink { .. })), "{r:?}");
        // writing through a link to a directory inside is refused too (nothing is ever written through one)
        let (d2, r) = extract(&[Item::Dir("real"), Item::Symlink("l", "real"), Item::File("l/x", b"x")]);
        assert!(matches!(r, Err(ArchiveError::UnsafePath { .. })), "{r:?}");
        assert!(!d2.path().join("root/real/x").exists());
        assert!(outside(&d).is_empty());
        // a file entry replacing a link is written in the link's place, not through it
        let (d3, r) = extract(&[Item::Symlink("f", "g"), Item::File("f", b"new"), Item::File("g", b"old")]);
        r.unwrap();
        assert_eq!(std::fs::read_to_string(d3.path().join("root/g")).unwrap(), "old");
        assert!(std::fs::symlink_metadata(d3.path().join("root/f")).unwrap().is_file());
    }

    #[test]
    fn declared_sizes_and_metadata_are_bounded() {
        let (_, r) = extract(&[Item::File("big", &[0u8; 4096])]);
        r.unwrap();
        let d = tempfile::tempdir().unwrap();
        let e =
            extract_tar_gz(&build(&[Item::File("big", &[0u8; 4096])])[..], d.path(), &Limits::new(1000)).unwrap_err();
        assert!(matches!(e, ArchiveError::TooLarge(1000)), "{e}");
        // a long name larger than the metadata limit is refused before it is read
        let (_, r) = extract(&[
            Item::Raw { entry_type: b'L', name: "././@LongLink", data: vec![b'a'; 70 << 10], declared: None },
            Item::File("x", b"x"),
        ]);
        assert!(matches!(r, Err(ArchiveError::Metadata { .. })), "{r:?}");
        // a PAX size that disagrees with the header
        let mut pax = pax_record("size", "536870912");
        pax.extend(pax_record("path", "p"));
        let (_, r) =
            extract(&[Item::Raw { entry_type: b'x', name: "pax", data: pax, declared: None }, Item::File("x", b"x")]);
        assert!(matches!(r, Err(ArchiveError::Unsupported { .. })), "{r:?}");
        // a sparse file
        let (_, r) = extract(&[Item::Raw { entry_type: b'S', name: "s", data: vec![], declared: None }]);
        assert!(r.is_err());
        // too many entries
        let d = tempfile::tempdir().unwrap();
        let items: Vec<String> = (0..20).map(|i| format!("f{i}")).collect();
        let files: Vec<Item<'_>> = items.iter().map(|n| Item::File(n, b"")).collect();
        let e = extract_tar_gz(&build(&files)[..], d.path(), &Limits { max_entries: 10, ..Limits::new(1 << 20) })
            .unwrap_err();
        assert!(matches!(e, ArchiveError::TooManyEntries(10)), "{e}");
    }

    #[test]
    fn long_names_and_pax_paths_apply_to_the_next_entry() {
        let long = format!("{}/file", "d".repeat(150));
        let mut name = long.clone().into_bytes();
        name.push(0);
        let (d, r) = extract(&[
            Item::Raw { entry_type: b'L', name: "././@LongLink", data: name, declared: None },
            Item::File("short", b"x"),
        ]);
        r.unwrap();
        assert!(d.path().join("root").join(&long).is_file());
        let (d, r) = extract(&[
            Item::Raw { entry_type: b'x', name: "pax", data: pax_record("path", "from-pax"), declared: None },
            Item::File("short", b"y"),
        ]);
        r.unwrap();
        assert!(d.path().join("root/from-pax").is_file());
        let (_, r) = extract(&[
            Item::Raw { entry_type: b'x', name: "pax", data: pax_record("path", "../escape"), declared: None },
            Item::File("short", b"y"),
        ]);
        assert!(matches!(r, Err(ArchiveError::UnsafePath { .. })), "{r:?}");
    }

    #[test]
    fn truncated_and_garbage_input_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let full = build(&[Item::File("a", &[7u8; 10_000])]);
        assert!(matches!(
            extract_tar_gz(&full[..full.len() / 2], d.path(), &Limits::new(1 << 20)),
            Err(ArchiveError::Read(_))
        ));
        assert!(extract_tar_gz(&b"not gzip at all"[..], d.path(), &Limits::new(1 << 20)).is_err());
    }
}
