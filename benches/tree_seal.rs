//! The check of a shared dependency tree's seal before each isolated operation (`pko_agent::trees::share`):
//! `cargo bench -p pko-agent --bench tree_seal` (`TREE=<dir>`: a copy of that tree, e.g. a real `node_modules`,
//! instead of the synthetic one). The synthetic tree has the shape of the bed's TypeScript program's `node_modules`
//! (`@pulumi/kubernetes`: 15,578 entries): 160 packages of 8 directories of 11 files each. Prints the first use (seal
//! taken) and the median and slowest of [`RUNS`] later checks, with what the tree holds, and the first use of the
//! tree once more as a seed moved in read-only finds it.

use std::path::Path;
use std::time::{Duration, Instant};

const RUNS: usize = 30;

/// A tree of `packages` × `dirs` × `files` small files under `root`.
fn synthetic(root: &Path, (packages, dirs, files): (usize, usize, usize)) {
    for p in 0..packages {
        for d in 0..dirs {
            let dir = root.join(format!("package-{p}/lib/part-{d}"));
            std::fs::create_dir_all(&dir).unwrap();
            for f in 0..files {
                std::fs::write(dir.join(format!("module-{f}.js")), format!("module.exports = {f};\n")).unwrap();
            }
        }
    }
}

fn entries(root: &Path) -> usize {
    std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| if e.file_type().unwrap().is_dir() { 1 + entries(&e.path()) } else { 1 })
        .sum()
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("tree_seal: run with `cargo bench`");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("node_modules");
    match std::env::var("TREE") {
        Ok(from) => pko_agent::seed::copy_writable(Path::new(&from), &tree).unwrap(),
        Err(_) => synthetic(&tree, (160, 8, 11)),
    }
    let t = Instant::now();
    pko_agent::trees::share(&tree).unwrap();
    let first = t.elapsed();
    let mut times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            pko_agent::trees::share(&tree).unwrap();
            t.elapsed()
        })
        .collect();
    times.sort();
    // a seed moved into a new revision read-only (its lockfile settles it): sealed again at its first use there
    std::fs::remove_file(work.path().join(".node_modules.pko-seal")).unwrap();
    let t = Instant::now();
    pko_agent::trees::share(&tree).unwrap();
    let moved = t.elapsed();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "tree of {} entries: first use (sealed) {:.1} ms; later checks median {:.1} ms, slowest {:.1} ms ({RUNS} \
         runs); first use of the tree already read-only (a moved seed) {:.1} ms",
        entries(&tree),
        ms(first),
        ms(times[RUNS / 2]),
        ms(times[RUNS - 1]),
        ms(moved)
    );
    pko_agent::trees::remove_tree(&tree).unwrap();
}
