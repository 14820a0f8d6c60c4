//! Property-based fuzzing (proptest) of what the agent parses from tenants: the archive extractor over
//! random bytes and random archives of paths, links and headers, and `Run` request decoding and
//! validation over random bytes and random git URLs, refs and env names. Each case asserts that nothing
//! panics, nothing is written outside the destination, every link left behind resolves inside it, and
//! validated input cannot reach git as an option. `PROPTEST_CASES` raises the case count.

use std::path::Path;

use pko_agent::archive::testing::{Item, build, gzip, pax_record};
use pko_agent::archive::{Limits, extract_tar_gz};
use proptest::prelude::*;

/// Names under the temporary directory other than `root`: anything written outside.
fn outside(tmp: &Path) -> Vec<String> {
    std::fs::read_dir(tmp)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "root")
        .collect()
}

/// Every symlink under `root` whose (existing) target is outside `root`.
fn links_out(root: &Path) -> Vec<String> {
    let real_root = root.canonicalize().unwrap();
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_symlink()
                && let Ok(real) = e.path().canonicalize()
                && !real.starts_with(&real_root)
            {
                out.push(format!("{} -> {}", e.path().display(), real.display()));
            }
        }
    }
    out
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("..".to_string()),
        Just(".".to_string()),
        Just("a".to_string()),
        Just("b".to_string()),
        Just("l".to_string()),
        Just("".to_string()),
        "[a-z]{1,3}"
    ]
}

fn rel_path() -> impl Strategy<Value = String> {
    prop::collection::vec(segment(), 1..5)
        .prop_map(|v| v.join("/"))
        .prop_flat_map(|p| prop_oneof![Just(p.clone()), Just(format!("/{p}"))])
}

#[derive(Debug, Clone)]
enum Spec {
    File(String, Vec<u8>),
    Dir(String),
    Link(String, String),
    Hard(String, String),
    LongName(String),
    PaxPath(String),
}

fn spec() -> impl Strategy<Value = Spec> {
    prop_oneof![
        (rel_path(), prop::collection::vec(any::<u8>(), 0..64)).prop_map(|(p, d)| Spec::File(p, d)),
        rel_path().prop_map(Spec::Dir),
        (rel_path(), rel_path()).prop_map(|(p, t)| Spec::Link(p, t)),
        (rel_path(), rel_path()).prop_map(|(p, t)| Spec::Hard(p, t)),
        rel_path().prop_map(Spec::LongName),
        rel_path().prop_map(Spec::PaxPath),
    ]
}

fn archive(specs: &[Spec]) -> Vec<u8> {
    let mut items: Vec<Item<'_>> = Vec::new();
    for s in specs {
        items.push(match s {
            Spec::File(p, d) => Item::File(p, d),
            Spec::Dir(p) => Item::Dir(p),
            Spec::Link(p, t) => Item::Symlink(p, t),
            Spec::Hard(p, t) => Item::HardLink(p, t),
            Spec::LongName(p) => Item::Raw {
                entry_type: b'L',
                name: "././@LongLink",
                data: format!("{p}\0").into_bytes(),
                declared: None,
            },
            Spec::PaxPath(p) => {
                Item::Raw { entry_type: b'x', name: "pax", data: pax_record("path", p), declared: None }
            }
        });
    }
    build(&items)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_archives_never_write_outside_or_leave_links_out(specs in prop::collection::vec(spec(), 1..12)) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let r = extract_tar_gz(&archive(&specs)[..], &root, &Limits::new(1 << 20));
        prop_assert!(outside(tmp.path()).is_empty(), "wrote outside: {:?} for {:?}", outside(tmp.path()), specs);
        if r.is_ok() {
            prop_assert!(links_out(&root).is_empty(), "links out: {:?} for {:?}", links_out(&root), specs);
        }
    }

    #[test]
    fn random_bytes_are_an_error_not_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..4096),
        compressed in any::<bool>()) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let input = if compressed { gzip(&bytes) } else { bytes };
        let _ = extract_tar_gz(&input[..], &root, &Limits::new(1 << 20));
        prop_assert!(outside(tmp.path()).is_empty());
    }

    #[test]
    fn random_request_bytes_decode_and_validate_without_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(req) = <pko_proto::v1::OperationRequest as prost::Message>::decode(&bytes[..]) {
            let _ = pko_agent::service::validate_request(&req);
        }
    }

    #[test]
    fn validated_git_input_never_reads_as_an_option(url in "\\PC{0,40}", rev in "\\PC{0,20}",
        prefix in prop_oneof![Just(""), Just("-"), Just("--upload-pack="), Just("ext::"), Just("ssh://-")]) {
        let url = format!("{prefix}{url}");
        let rev = format!("{prefix}{rev}");
        if pko_git::validate_url(&url).is_ok() {
            prop_assert!(!url.starts_with('-') && !url.chars().any(char::is_control));
            prop_assert!(url.contains("://") || !url.split('/').next().unwrap_or_default().contains("::"));
        }
        if pko_git::validate_ref("revision", &rev).is_ok() {
            prop_assert!(!rev.starts_with('-') && !rev.chars().any(char::is_whitespace) && !rev.contains(".."));
        }
    }
}
