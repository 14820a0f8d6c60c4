//! The structure rules of `docs/architecture.md`, checked on the source (no test bed): the controllers
//! are peers, the agent runtime imports none of them, the shared modules import no controller, no
//! circle of imports between the operator's files, the shared contracts name their writer and reader,
//! no non-test function in any crate is longer than 80 lines, no source file longer than 600 lines, and
//! no line of Rust anywhere in the workspace wider than 120 columns. A rule that breaks fails `make
//! test` with the file and the import, function or line that broke it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a non-test function may be (lines, from `fn` to its closing brace).
const MAX_FUNCTION_LINES: usize = 80;

/// The longest a source file under a crate's `src/` may be (lines): a file past it usually holds two
/// concerns.
const MAX_FILE_LINES: usize = 600;

/// The widest a line of Rust may be (columns, counted in characters; rustfmt's `max_width`).
const MAX_COLUMNS: usize = 120;

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn operator_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The non-test code of a file (everything above its `#[cfg(test)]` module, by the project's
/// convention), with `//` comments and string literals blanked (rustdoc links are no imports).
fn code_of(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = Vec::new();
    let mut state = Literal::None;
    for l in text.lines() {
        if state == Literal::None && l.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        lines.push(strip(l, &mut state));
    }
    lines
}

/// Where a line of code starts: outside any literal, inside a string literal, or inside a raw string
/// literal closed by `"` and this many `#` (literals may span lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Literal {
    None,
    Str,
    Raw(usize),
}

/// `line` without string literals' contents and without its `//` comment, starting in `state` and
/// leaving in it the state the next line starts in.
fn strip(line: &str, state: &mut Literal) -> String {
    let mut out = String::new();
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match *state {
            Literal::Str if c == '\\' => i += 1,
            Literal::Str if c == '"' => {
                *state = Literal::None;
                out.push('"');
            }
            Literal::Raw(n) if c == '"' && chars[i + 1..].iter().take(n).filter(|h| **h == '#').count() == n => {
                *state = Literal::None;
                out.push('"');
                i += n;
            }
            Literal::Str | Literal::Raw(_) => {}
            Literal::None if c == '/' && chars.get(i + 1) == Some(&'/') => break,
            // a char literal (`'"'`, `'\\''`), not a lifetime: skipped whole
            Literal::None if c == '\'' && char_literal_len(&chars[i..]).is_some() => {
                i += char_literal_len(&chars[i..]).unwrap_or(1) - 1;
            }
            Literal::None if c == '"' => {
                *state = Literal::Str;
                out.push('"');
            }
            Literal::None if c == 'r' && (i == 0 || !chars[i - 1].is_alphanumeric() && chars[i - 1] != '_') => {
                let hashes = chars[i + 1..].iter().take_while(|h| **h == '#').count();
                if chars.get(i + 1 + hashes) == Some(&'"') {
                    *state = Literal::Raw(hashes);
                    out.push('"');
                    i += 1 + hashes;
                } else {
                    out.push(c);
                }
            }
            Literal::None => out.push(c),
        }
        i += 1;
    }
    out
}

/// The length of the char literal `chars` starts with (`'x'`, `'\\n'`, `'\\u{1F600}'`), if it is one.
fn char_literal_len(chars: &[char]) -> Option<usize> {
    match chars.get(1)? {
        '\\' => chars.iter().skip(2).position(|c| *c == '\'').map(|p| p + 3),
        _ => (chars.get(2) == Some(&'\'')).then_some(3),
    }
}

/// The operator's module of `file` (`stack/reconcile.rs` → `["stack", "reconcile"]`, `agents/mod.rs`
/// → `["agents"]`, `lib.rs` → `[]`).
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(operator_src()).unwrap().with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// Every module path a file's code names (`crate::a::b::C`, `super::x`, and one level of `{…}`
/// groups), made absolute.
fn paths_named(module: &[String], code: &str) -> Vec<Vec<String>> {
    let b = code.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut found = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let at_path = (b[i..].starts_with(b"crate::") || b[i..].starts_with(b"super::")) && (i == 0 || !word(b[i - 1]));
        if !at_path {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && word(b[j]) {
            j += 1;
        }
        let head = &code[i..j];
        let mut items = vec![head.trim_end_matches("::").to_string()];
        if head.ends_with("::") && b.get(j) == Some(&b'{') {
            let close = b[j..].iter().position(|c| *c == b'}').map(|k| j + k).unwrap_or(b.len());
            let group = &code[j + 1..close];
            items = group
                .split(',')
                .map(|it| it.split(" as ").next().unwrap_or("").trim())
                .filter(|it| !it.is_empty())
                .map(|it| format!("{head}{it}"))
                .collect();
        }
        found.extend(items.iter().map(|item| absolute(module, item)));
        i = j.max(i + 1);
    }
    found
}

/// `path` (`crate::…`, `super::…`, `self::…`) named in `module`, as a path from the crate root: each
/// `super` is the module's parent (for `a/b.rs` and `a/mod.rs` alike, Rust's rule).
fn absolute(module: &[String], path: &str) -> Vec<String> {
    let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    if segs.first() == Some(&"crate") {
        return segs[1..].iter().map(|s| s.to_string()).collect();
    }
    let mut base: Vec<String> = module.to_vec();
    let mut rest = segs.as_slice();
    while let Some((first, tail)) = rest.split_first() {
        match *first {
            "super" => {
                base.pop();
            }
            "self" => {}
            _ => break,
        }
        rest = tail;
    }
    base.extend(rest.iter().map(|s| s.to_string()));
    base
}

/// The file-level import graph of the operator: module → modules it names (the deepest module file
/// on each path), without ties to its own ancestors.
fn import_graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let files = rust_files(&operator_src());
    let modules: BTreeMap<Vec<String>, PathBuf> = files.iter().map(|f| (module_of(f), f.clone())).collect();
    let mut graph = BTreeMap::new();
    for (m, f) in &modules {
        let code = code_of(f).join("\n");
        let mut edges = BTreeSet::new();
        for path in paths_named(m, &code) {
            for k in (1..=path.len()).rev() {
                let t = &path[..k];
                if modules.contains_key(t) {
                    if t != m.as_slice() && !m.starts_with(t) {
                        edges.insert(t.to_vec());
                    }
                    break;
                }
            }
        }
        graph.insert(m.clone(), edges);
    }
    graph
}

/// The controller a module belongs to, if any.
fn controller_of(m: &[String]) -> Option<&'static str> {
    match m.first().map(String::as_str) {
        Some("stack") => Some("stack"),
        Some("update") => Some("update"),
        Some("workspace") => Some("workspace"),
        Some("program") => Some("program"),
        Some("receiver") => Some("receiver"),
        Some("rollout") => Some("rollout"),
        _ => None,
    }
}

#[test]
fn controllers_are_peers_and_the_runtime_and_contracts_import_none_of_them() {
    let mut broken = Vec::new();
    for (m, edges) in import_graph() {
        for to in &edges {
            let (from_c, to_c) = (controller_of(&m), controller_of(to));
            let from_top = m.first().map(String::as_str).unwrap_or_default();
            let to_top = to.first().map(String::as_str).unwrap_or_default();
            let rule = match (from_c, to_c) {
                (Some(a), Some(b)) if a != b => Some("a controller imports no other controller"),
                (None, Some(_)) if from_top == "agents" => Some("agents/ imports no controller"),
                (None, Some(_))
                    if ["k8s", "context", "outputs", "stalled", "informer", "metrics"].contains(&from_top) =>
                {
                    Some("shared modules import no controller")
                }
                _ if from_top == "agents" && ["fleet", "run"].contains(&to_top) => {
                    Some("agents/ imports neither fleet.rs nor run.rs")
                }
                _ if ["k8s", "context", "outputs", "stalled"].contains(&from_top) && to_top == "agents" => {
                    Some("shared modules stand below agents/")
                }
                _ => None,
            };
            if let Some(rule) = rule {
                broken.push(format!("{} → {}: {rule}", m.join("::"), to.join("::")));
            }
        }
    }
    assert!(broken.is_empty(), "structure rules broken:\n{}", broken.join("\n"));
}

#[test]
fn no_circle_of_imports_between_the_operators_files() {
    let graph = import_graph();
    // a circle is an edge a → b with a path back from b to a
    let reaches = |from: &Vec<String>, to: &Vec<String>| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            if &n == to {
                return true;
            }
            if seen.insert(n.clone()) {
                todo.extend(graph.get(&n).into_iter().flatten().cloned());
            }
        }
        false
    };
    let circles: Vec<String> = graph
        .iter()
        .flat_map(|(a, edges)| {
            edges.iter().filter(|b| reaches(b, a)).map(move |b| format!("{} ↔ {}", a.join("::"), b.join("::")))
        })
        .collect();
    assert!(circles.is_empty(), "import circles:\n{}", circles.join("\n"));
}

#[test]
fn every_shared_contract_names_its_one_writer_and_one_reader() {
    for contract in ["outputs.rs", "stalled.rs"] {
        let text = std::fs::read_to_string(operator_src().join(contract)).unwrap();
        let header: String = text.lines().take_while(|l| l.starts_with("//!")).collect::<Vec<_>>().join("\n");
        assert!(header.contains("Writer") || header.contains("writer"), "{contract}: its //! names no writer");
        assert!(header.contains("Reader") || header.contains("reader"), "{contract}: its //! names no reader");
    }
}

/// Each non-test function of `file`: (its first line, its name, its length in lines).
fn functions(file: &Path) -> Vec<(usize, String, usize)> {
    let lines = code_of(file);
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(name) = fn_name(&lines[i]) else {
            i += 1;
            continue;
        };
        let (mut depth, mut started, mut j) = (0i32, false, i);
        while j < lines.len() {
            for c in lines[j].chars() {
                match c {
                    '{' => {
                        depth += 1;
                        started = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if (started && depth <= 0) || (!started && lines[j].trim_end().ends_with(';')) {
                break;
            }
            j += 1;
        }
        if started {
            out.push((i + 1, name, j - i + 1));
            i = j + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// The name of the function a line declares (`pub async fn run(` → `run`).
fn fn_name(line: &str) -> Option<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "fn")?;
    let allowed = |w: &str| w.starts_with("pub") || ["async", "const", "unsafe", "extern", "\"C\""].contains(&w);
    if !words[..at].iter().all(|w| allowed(w)) {
        return None;
    }
    let name: String = words.get(at + 1)?.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!name.is_empty()).then_some(name)
}

#[test]
fn no_non_test_function_is_longer_than_80_lines() {
    let mut long = Vec::new();
    for krate in std::fs::read_dir(crates_dir()).unwrap().flatten() {
        let src = krate.path().join("src");
        if !src.is_dir() {
            continue;
        }
        for file in rust_files(&src) {
            for (line, name, n) in functions(&file) {
                if n > MAX_FUNCTION_LINES {
                    long.push(format!(
                        "{}:{line} {name}: {n} lines",
                        file.strip_prefix(crates_dir()).unwrap_or(&file).display()
                    ));
                }
            }
        }
    }
    assert!(long.is_empty(), "functions over {MAX_FUNCTION_LINES} lines:\n{}", long.join("\n"));
}

#[test]
fn no_source_file_is_longer_than_600_lines() {
    let mut long = Vec::new();
    for krate in std::fs::read_dir(crates_dir()).unwrap().flatten() {
        let src = krate.path().join("src");
        for file in rust_files(&src).into_iter().filter(|_| src.is_dir()) {
            let n = std::fs::read_to_string(&file).unwrap().lines().count();
            if n > MAX_FILE_LINES {
                long.push(format!("{}: {n} lines", file.strip_prefix(crates_dir()).unwrap_or(&file).display()));
            }
        }
    }
    assert!(long.is_empty(), "source files over {MAX_FILE_LINES} lines:\n{}", long.join("\n"));
}

#[test]
fn no_line_of_rust_is_wider_than_120_columns() {
    let root = crates_dir().join("..");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(crates_dir()).unwrap().flatten().map(|e| e.path()).collect();
    dirs.push(root.join("benches"));
    let mut wide = Vec::new();
    for file in dirs.iter().filter(|d| d.is_dir()).flat_map(|d| rust_files(d)) {
        for (i, line) in std::fs::read_to_string(&file).unwrap().lines().enumerate() {
            // bytes, as the project's own check counts them: a dash or an arrow takes three
            let n = line.len();
            if n > MAX_COLUMNS {
                wide.push(format!("{}:{}: {n} columns", file.strip_prefix(&root).unwrap_or(&file).display(), i + 1));
            }
        }
    }
    assert!(wide.is_empty(), "{} lines over {MAX_COLUMNS} columns:\n{}", wide.len(), wide.join("\n"));
}

#[test]
fn the_checks_see_what_they_check() {
    // the scanners themselves: an import, a group, a super path, a function's length
    let m = vec!["update".to_string(), "worker".to_string()];
    let found = paths_named(&m, "use crate::agents::{End, Lent};\nuse super::fence::Fence;");
    assert!(found.contains(&vec!["agents".to_string(), "End".to_string()]), "{found:?}");
    assert!(found.contains(&vec!["update".to_string(), "fence".to_string(), "Fence".to_string()]), "{found:?}");
    assert_eq!(fn_name("    pub(super) async fn drive(&self) -> Drive {").as_deref(), Some("drive"));
    assert_eq!(fn_name("let f = |x| x; // fn not"), None);
    let graph = import_graph();
    assert!(
        graph[&vec!["update".to_string(), "worker".to_string()]].contains(&vec!["agents".to_string()]),
        "the worker imports the runtime"
    );
    assert!(!functions(&operator_src().join("update/worker.rs")).is_empty());
}

#[test]
fn the_shard_label_of_leases_is_the_one_on_sharded_objects() {
    // written twice on purpose: `pko-fleet` has no PKO dependency; this is the contract between them
    assert_eq!(pko_fleet::lease::SHARD_LABEL, pko_api::constants::SHARD_LABEL);
}
