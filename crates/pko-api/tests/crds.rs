//! The committed CRDs match the types, and the manifest corpus uses every field of every CRD.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// `deploy/crds/*.yaml` must be exactly what the types generate (`pko-operator crds` rewrites them).
#[test]
fn committed_crds_match_the_types() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds");
    let mut expected = BTreeSet::new();
    for crd in pko_api::crds() {
        let name = pko_api::crd_file_name(&crd);
        let committed = std::fs::read_to_string(dir.join(&name))
            .unwrap_or_else(|e| panic!("deploy/crds/{name}: {e}; run `pko-operator crds`"));
        assert!(
            committed == pko_api::crd_yaml(&crd),
            "deploy/crds/{name} differs from the types; run `cargo run -p pko-operator -- crds`"
        );
        expected.insert(name);
    }
    let present: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    assert_eq!(present, expected, "deploy/crds holds files the types do not generate");
}

/// Subtrees that are Kubernetes' own types (PodSpec, EnvVar, ResourceRequirements, Condition) or the same
/// type as a whole CRD (the templates): their fields are not ours to cover field by field.
const NOT_OURS: &[&str] = &[
    ".env[]",
    ".envFrom[]",
    ".resources",
    ".podTemplate.spec",
    ".conditions[]",
    "spec.workspaceTemplate.spec",
    "spec.updateTemplate.spec",
];

fn skipped(path: &str) -> bool {
    NOT_OURS.iter().any(|s| if s.starts_with('.') { path.ends_with(s) } else { path == *s })
}

/// The shape of a schema node, descriptions removed: positions of the same type share a fingerprint.
fn fingerprint(node: &Value) -> String {
    fn strip(v: &Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .filter(|(k, _)| *k != "description" && *k != "nullable")
                    .map(|(k, v)| (k.clone(), strip(v)))
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
            other => other.clone(),
        }
    }
    strip(node).to_string()
}

fn schema_paths(node: &Value, path: String, out: &mut BTreeSet<String>, fps: &mut BTreeMap<String, String>) {
    if !path.is_empty() {
        out.insert(path.clone());
        fps.insert(path.clone(), fingerprint(node));
    }
    if skipped(&path) {
        return;
    }
    let join = |k: &str| if path.is_empty() { k.to_string() } else { format!("{path}.{k}") };
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            if path.is_empty() && (k == "metadata" || k == "apiVersion" || k == "kind") {
                continue;
            }
            schema_paths(v, join(k), out, fps);
        }
    }
    if let Some(ap) = node.get("additionalProperties").filter(|v| v.is_object()) {
        schema_paths(ap, join("*"), out, fps);
    }
    if let Some(items) = node.get("items") {
        schema_paths(items, format!("{path}[]"), out, fps);
    }
}

fn doc_paths(v: &Value, path: String, map_keys: &BTreeSet<String>, out: &mut BTreeSet<String>) {
    if !path.is_empty() {
        out.insert(path.clone());
    }
    match v {
        Value::Object(m) => {
            let is_map = map_keys.contains(&path);
            for (k, x) in m {
                if path.is_empty() && (k == "metadata" || k == "apiVersion" || k == "kind") {
                    continue;
                }
                let key = if is_map { "*" } else { k.as_str() };
                let p = if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
                doc_paths(x, p, map_keys, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| doc_paths(x, format!("{path}[]"), map_keys, out)),
        _ => {}
    }
}

/// A field of a type used at several positions (e.g. every `ResourceRef`) counts as covered when it is
/// used at any position of that type.
fn covered_elsewhere(path: &str, fps: &BTreeMap<String, String>, used: &BTreeSet<String>) -> bool {
    let boundaries = path.char_indices().filter(|(_, c)| *c == '.' || *c == '[').map(|(i, _)| i);
    for cut in boundaries {
        let (ancestor, rel) = path.split_at(cut);
        let Some(fp) = fps.get(ancestor) else { continue };
        if fps.iter().any(|(other, f)| f == fp && other != ancestor && used.contains(&format!("{other}{rel}"))) {
            return true;
        }
    }
    false
}

#[test]
fn corpus_uses_every_field_of_every_crd() {
    let docs = common::valid();
    let mut missing = Vec::new();
    for crd in pko_api::crds() {
        let crd = serde_json::to_value(&crd).unwrap();
        let group = crd["spec"]["group"].as_str().unwrap().to_string();
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap().to_string();
        for version in crd["spec"]["versions"].as_array().unwrap() {
            let name = version["name"].as_str().unwrap();
            let mut wanted = BTreeSet::new();
            let mut fps = BTreeMap::new();
            schema_paths(&version["schema"]["openAPIV3Schema"], String::new(), &mut wanted, &mut fps);
            // map-typed fields: their keys are user data, matched by `*`
            let map_keys: BTreeSet<String> =
                wanted.iter().filter_map(|p| p.strip_suffix(".*").map(str::to_string)).collect();
            let mut used = BTreeSet::new();
            for d in docs.iter().filter(|d| common::gvk(&d.value) == (group.clone(), name.to_string(), kind.clone())) {
                doc_paths(&d.value, String::new(), &map_keys, &mut used);
            }
            // v1alpha1 serves the v1 spec schema (asserted below), so its spec is covered by the v1 corpus.
            if kind == "Stack" && name == "v1alpha1" {
                let versions = crd["spec"]["versions"].as_array().unwrap();
                assert_eq!(
                    versions[0]["schema"]["openAPIV3Schema"]["properties"]["spec"],
                    version["schema"]["openAPIV3Schema"]["properties"]["spec"],
                    "Stack v1alpha1 must serve the v1 spec"
                );
                wanted.retain(|p| !p.starts_with("spec."));
            }
            for p in wanted.difference(&used) {
                if !covered_elsewhere(p, &fps, &used) {
                    missing.push(format!("{kind} {name}: {p}"));
                }
            }
        }
    }
    assert!(missing.is_empty(), "fields no manifest of the corpus uses:\n{}", missing.join("\n"));
}

/// Every valid manifest of ours deserializes into the Rust types and serializes back unchanged.
#[test]
fn corpus_round_trips_through_the_rust_types() {
    fn round<T: serde::de::DeserializeOwned + serde::Serialize>(v: &Value) -> Value {
        let typed: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"));
        serde_json::to_value(&typed).unwrap()
    }
    let mut n = 0;
    for d in common::valid().into_iter().filter(|d| common::is_ours(&d.value)) {
        let (_, version, kind) = common::gvk(&d.value);
        let back = match (kind.as_str(), version.as_str()) {
            ("Stack", "v1") => round::<pko_api::Stack>(&d.value),
            ("Stack", "v1alpha1") => round::<pko_api::stack::v1alpha1::Stack>(&d.value),
            ("Program", _) => round::<pko_api::Program>(&d.value),
            ("Workspace", _) => round::<pko_api::Workspace>(&d.value),
            ("Update", _) => round::<pko_api::Update>(&d.value),
            ("Receiver", _) => round::<pko_api::Receiver>(&d.value),
            ("StackRollout", _) => round::<pko_api::StackRollout>(&d.value),
            other => panic!("unexpected kind {other:?} in {}", d.file.display()),
        };
        assert_eq!(
            normalize(back),
            normalize(d.value.clone()),
            "{} ({kind}) changed in a round trip",
            d.file.display()
        );
        n += 1;
    }
    assert!(n >= 10, "corpus too small: {n}");
}

/// YAML numbers such as `42` come back as `42`; the metadata block is compared as written.
fn normalize(v: Value) -> Value {
    v
}

/// `docs/api.md` must be what the types generate (`make docs` rewrites it).
#[test]
fn committed_api_reference_matches_the_types() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/api.md");
    let committed = std::fs::read_to_string(&path).unwrap();
    assert!(
        committed == pko_api::reference::api_reference_markdown(),
        "docs/api.md differs from the types; run `make docs`"
    );
}
