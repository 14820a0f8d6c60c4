//! Loading the manifest corpus: `deploy/examples/*.yaml` and `tests/fixtures/{valid,invalid}/*.yaml`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// One YAML document of the corpus and the file it came from.
pub struct Doc {
    pub file: PathBuf,
    pub value: Value,
    /// For invalid fixtures: the text after `# expect:` in the file header.
    pub expect: Option<String>,
}

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

fn load(dir: &Path) -> Vec<Doc> {
    let mut docs = Vec::new();
    for file in yaml_files(dir) {
        let text = std::fs::read_to_string(&file).unwrap();
        let expect = text.lines().find_map(|l| l.strip_prefix("# expect: ")).map(str::to_string);
        for de in serde_yaml_ng::Deserializer::from_str(&text) {
            let value = Value::deserialize(de).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            if !value.is_null() {
                docs.push(Doc { file: file.clone(), value, expect: expect.clone() });
            }
        }
    }
    docs
}

/// Valid manifests: our examples and the valid fixtures.
pub fn valid() -> Vec<Doc> {
    let mut docs = load(&crate_dir().join("../../deploy/examples"));
    docs.extend(load(&crate_dir().join("tests/fixtures/valid")));
    docs
}

/// Invalid manifests, each with the message the API server must answer.
pub fn invalid() -> Vec<Doc> {
    load(&crate_dir().join("tests/fixtures/invalid"))
}

/// `(group, version, kind)` of a document.
pub fn gvk(v: &Value) -> (String, String, String) {
    let api_version = v["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    (group.to_string(), version.to_string(), v["kind"].as_str().unwrap_or_default().to_string())
}

/// Whether the document is one of the operator's own kinds.
pub fn is_ours(v: &Value) -> bool {
    let (group, _, _) = gvk(v);
    group == "pulumi.com" || group == "auto.pulumi.com"
}
