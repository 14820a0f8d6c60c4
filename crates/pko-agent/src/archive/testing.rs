/// One entry of [`build`].
#[derive(Debug, Clone)]
pub enum Item<'a> {
    /// A regular file.
    File(&'a str, &'a [u8]),
    /// A directory.
    Dir(&'a str),
    /// A symlink `(path, target)`.
    Symlink(&'a str, &'a str),
    /// A hard link `(path, target)`.
    HardLink(&'a str, &'a str),
    /// A header of `entry_type` (e.g. `b'L'`, `b'x'`, `b'S'`) with `name`, `data`, and a declared size that may differ
    /// from the data's length (`None`: the data's length). Data is padded as tar pads.
    Raw {
        /// Entry type byte.
        entry_type: u8,
        /// Name field.
        name: &'a str,
        /// Data following the header.
        data: Vec<u8>,
        /// Size written in the header.
        declared: Option<u64>,
    },
}

fn header(name: &str, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(0o644);
    let field = h.as_old_mut().name.as_mut();
    let n = name.len().min(field.len());
    field[..n].copy_from_slice(&name.as_bytes()[..n]);
    h
}

fn link_header(name: &str, kind: tar::EntryType, target: &str) -> tar::Header {
    let mut h = header(name, kind, 0);
    let field = h.as_old_mut().linkname.as_mut();
    let n = target.len().min(field.len());
    field[..n].copy_from_slice(&target.as_bytes()[..n]);
    h.set_cksum();
    h
}

/// The uncompressed tar stream of `items` (with its end-of-archive blocks).
pub fn tar(items: &[Item<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for item in items {
        let (mut h, data): (tar::Header, Vec<u8>) = match item {
            Item::File(p, d) => (header(p, tar::EntryType::Regular, d.len() as u64), d.to_vec()),
            Item::Dir(p) => (header(p, tar::EntryType::Directory, 0), Vec::new()),
            Item::Symlink(p, t) => (link_header(p, tar::EntryType::Symlink, t), Vec::new()),
            Item::HardLink(p, t) => (link_header(p, tar::EntryType::Link, t), Vec::new()),
            Item::Raw { entry_type, name, data, declared } => {
                (header(name, tar::EntryType::new(*entry_type), declared.unwrap_or(data.len() as u64)), data.clone())
            }
        };
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(&data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// `tar(items)`, gzipped.
pub fn build(items: &[Item<'_>]) -> Vec<u8> {
    gzip(&tar(items))
}

/// Gzips `data`.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(data).expect("writing to memory");
    gz.finish().expect("writing to memory")
}

/// A PAX record `"<len> <key>=<value>\n"`.
pub fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while format!("{len}").len() + body.len() != len {
        len += 1;
    }
    format!("{len}{body}").into_bytes()
}
