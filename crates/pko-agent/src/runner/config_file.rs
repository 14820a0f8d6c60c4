//! The request's plain config written into the stack config file (`Pulumi.<stack>.yaml`) by the agent itself, without
//! a `pulumi config set-all` (issue 49, item 4: no per-operation setup the operation does not need). Each Pulumi
//! command costs its start, 0.13–0.15 s on the bed's 2 cores, as much as `pulumi version`; an operation whose config
//! is plain strings — the common case — needs none. What Pulumi would write for such a value is the value itself
//! under its `namespace:name` key of the file's `config` map; every other key of the file (`encryptionsalt`,
//! `secretsprovider`, `environment`, other config) is kept. Secrets (the stack's secrets provider encrypts them),
//! property paths, structured values, keys that are not `namespace:name`, and projects with a `stackConfigDir` are
//! left to Pulumi; what the file then holds is checked against the request either way
//! ([`super::stack_config::written_config_mismatch`]).

use std::path::Path;

use serde_yaml_ng::{Mapping, Value};

/// Whether `key` is a `namespace:name` key as Pulumi parses one: exactly one `:`, both sides non-empty, no white space.
/// Pure.
pub fn plain_key(key: &str) -> bool {
    let mut parts = key.split(':');
    let (Some(ns), Some(name), None) = (parts.next(), parts.next(), parts.next()) else { return false };
    !ns.is_empty() && !name.is_empty() && !key.chars().any(char::is_whitespace)
}

/// The stack config file `text` (empty: none yet) with every `(key, value)` of `items` set as a plain string, or
/// `None` when a key is not [`plain_key`] or `text` is not a YAML mapping: Pulumi then writes it. Pure.
pub fn with_plain_config(text: &str, items: &[(&str, &str)]) -> Option<String> {
    if items.iter().any(|(k, _)| !plain_key(k)) {
        return None;
    }
    let mut doc = match serde_yaml_ng::from_str::<Value>(text).ok()? {
        Value::Null => Mapping::new(),
        Value::Mapping(m) => m,
        _ => return None,
    };
    let config = doc.entry(Value::from("config")).or_insert_with(|| Value::Mapping(Mapping::new()));
    if config.is_null() {
        *config = Value::Mapping(Mapping::new());
    }
    let config = config.as_mapping_mut()?;
    for (k, v) in items {
        config.insert(Value::from(*k), Value::from(*v));
    }
    serde_yaml_ng::to_string(&doc).ok()
}

/// Whether the project in `dir` keeps its stack config files elsewhere (`stackConfigDir` in `Pulumi.yaml`); a file
/// that cannot be read counts as such.
pub fn stack_config_elsewhere(dir: &Path) -> bool {
    let Some(text) = ["Pulumi.yaml", "Pulumi.yml"].iter().find_map(|f| std::fs::read_to_string(dir.join(f)).ok())
    else {
        return true;
    };
    serde_yaml_ng::from_str::<Value>(&text).map_or(true, |v| v.get("stackConfigDir").is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_values_are_written_and_the_rest_of_the_file_is_kept() {
        let before =
            "encryptionsalt: v1:abc\nconfig:\n  app:kept: old\n  app:greeting: hi\n  app:token:\n    secure: v1:x\n";
        let after = with_plain_config(before, &[("app:greeting", "hej"), ("app:n", "123")]).unwrap();
        let v: Value = serde_yaml_ng::from_str(&after).unwrap();
        assert_eq!(v["encryptionsalt"], Value::from("v1:abc"));
        assert_eq!(v["config"]["app:kept"], Value::from("old"));
        assert_eq!(v["config"]["app:greeting"], Value::from("hej"));
        assert_eq!(v["config"]["app:n"], Value::from("123"), "a number's text stays a string");
        assert_eq!(v["config"]["app:token"]["secure"], Value::from("v1:x"));
        let new = with_plain_config("", &[("app:a", "b")]).unwrap();
        assert_eq!(serde_yaml_ng::from_str::<Value>(&new).unwrap()["config"]["app:a"], Value::from("b"));
        assert!(with_plain_config("config:\n", &[("app:a", "b")]).is_some(), "an empty config map");
    }

    #[test]
    fn odd_keys_and_files_are_left_to_pulumi() {
        for key in ["a:b:c", "app:has space", ":a", "a:", "nocolon"] {
            assert_eq!(with_plain_config("", &[("app:ok", "1"), (key, "x")]), None, "{key}");
        }
        assert_eq!(with_plain_config("- a list\n", &[("app:a", "b")]), None, "not a mapping");
        assert_eq!(with_plain_config("config: [1]\n", &[("app:a", "b")]), None, "config not a mapping");
    }

    #[test]
    fn a_stack_config_dir_leaves_the_file_to_pulumi() {
        let d = tempfile::tempdir().unwrap();
        assert!(stack_config_elsewhere(d.path()), "no project file");
        std::fs::write(d.path().join("Pulumi.yaml"), "name: p\nruntime: yaml\n").unwrap();
        assert!(!stack_config_elsewhere(d.path()));
        std::fs::write(d.path().join("Pulumi.yaml"), "name: p\nruntime: yaml\nstackConfigDir: config\n").unwrap();
        assert!(stack_config_elsewhere(d.path()));
    }
}
