//! The stack's secrets provider settings in its stack config file (`Pulumi.<stack>.yaml`: `secretsprovider`,
//! `encryptedkey`, `encryptionsalt`), kept from one operation of a stack to the next on an agent.
//!
//! Why: an isolated operation starts from the revision's own files, and a Workspace's own agent resets the file to the
//! source's before each operation (PKO's pod keeps its workspace, and with it the file Pulumi wrote). Without
//! `encryptionsalt`, Pulumi makes a new passphrase secrets manager on every command — a second key derivation — and
//! writes a new salt back: 0.2 s of every `up` on the bed (a `pulumi-kubernetes` YAML program: 1.15 s without the
//! salt, 0.95 s with it, 8 interleaved runs each). So after each command the agent remembers what the file holds, and
//! before the next operation of the same stack writes it back into a file that has none of the three settings (a file
//! that names its own provider is left as it is).
//!
//! The settings are not secrets (projects commit them: a salt, a wrapped data key); they stay in the agent's memory,
//! keyed by the stack ([`super::caches::stack_key`]: backend, project, stack) and a digest of the passphrase settings
//! and the request's secrets provider, so a changed passphrase or provider starts from Pulumi's own again. A
//! remembered salt Pulumi refuses (`incorrect passphrase`) is forgotten.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_yaml_ng::{Mapping, Value};
use sha2::{Digest, Sha256};

/// The top-level keys of a stack config file that configure its secrets provider, as Pulumi names them.
pub const FIELDS: [&str; 3] = ["secretsprovider", "encryptedkey", "encryptionsalt"];

/// The variables whose values decide which passphrase a passphrase provider derives its key from.
const PASSPHRASE_VARS: [&str; 2] = ["PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE"];

/// What the agent remembers: the settings of each stack it ran, by [`SecretsProviders::key`].
#[derive(Debug, Default)]
pub struct SecretsProviders(Mutex<HashMap<String, Vec<(String, String)>>>);

impl SecretsProviders {
    /// The memory's key for the stack `stack_key` run with `env` and the request's `secrets_provider` (PKO's
    /// `spec.secretsProvider`, empty: none): the stack and a SHA-256 of the passphrase variables and the provider.
    /// Pure.
    pub fn key(stack_key: &str, env: &std::collections::BTreeMap<String, String>, secrets_provider: &str) -> String {
        let mut h = Sha256::new();
        h.update(secrets_provider.as_bytes());
        h.update([0]);
        for v in PASSPHRASE_VARS {
            h.update(env.get(v).map(String::as_str).unwrap_or("\0unset").as_bytes());
            h.update([0]);
        }
        let digest: String = h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
        format!("{stack_key} {digest}")
    }

    /// Remembers the settings the stack config file `text` holds (none: nothing changes).
    pub fn remember(&self, key: &str, text: &str) {
        let fields = read(text);
        if !fields.is_empty() {
            self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key.to_string(), fields);
        }
    }

    /// The settings remembered for `key`.
    pub fn recall(&self, key: &str) -> Option<Vec<(String, String)>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(key).cloned()
    }

    /// Forgets `key`'s settings (Pulumi refused them).
    pub fn forget(&self, key: &str) {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(key);
    }
}

/// The [`FIELDS`] the stack config file `text` sets to a string, in that order. Pure.
pub fn read(text: &str) -> Vec<(String, String)> {
    let Ok(Value::Mapping(doc)) = serde_yaml_ng::from_str::<Value>(text) else { return Vec::new() };
    FIELDS.iter().filter_map(|f| doc.get(*f).and_then(Value::as_str).map(|v| (f.to_string(), v.to_string()))).collect()
}

/// The stack config file `text` (empty: none yet) with `fields` added, or `None` when it needs nothing: it already
/// names any of [`FIELDS`] (its own provider), `fields` is empty, or it is not a YAML mapping. Pure.
pub fn with_fields(text: &str, fields: &[(String, String)]) -> Option<String> {
    let mut doc = match serde_yaml_ng::from_str::<Value>(text).ok()? {
        Value::Null => Mapping::new(),
        Value::Mapping(m) => m,
        _ => return None,
    };
    if fields.is_empty() || FIELDS.iter().any(|f| doc.contains_key(*f)) {
        return None;
    }
    for (k, v) in fields {
        doc.insert(Value::from(k.as_str()), Value::from(v.as_str()));
    }
    serde_yaml_ng::to_string(&doc).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_are_read_and_written_back_only_into_a_file_without_any() {
        let written = "config:\n  app:a: b\nencryptionsalt: v1:salt\n";
        let fields = read(written);
        assert_eq!(fields, [("encryptionsalt".to_string(), "v1:salt".to_string())]);
        let fresh = with_fields("config:\n  app:a: c\n", &fields).unwrap();
        let v: Value = serde_yaml_ng::from_str(&fresh).unwrap();
        assert_eq!((v["encryptionsalt"].as_str(), v["config"]["app:a"].as_str()), (Some("v1:salt"), Some("c")));
        assert_eq!(read(&with_fields("", &fields).unwrap()), fields, "no file yet");
        assert_eq!(with_fields("secretsprovider: awskms://k\n", &fields), None, "the file's own provider");
        assert_eq!(with_fields("encryptionsalt: v1:other\n", &fields), None);
        assert_eq!(with_fields("config: {}\n", &[]), None, "nothing remembered");
        assert_eq!(with_fields("- a list\n", &fields), None);
        assert!(read("secretsprovider: {nested: 1}\n").is_empty(), "not a string: not a setting");
    }

    #[test]
    fn the_memory_is_per_stack_and_passphrase() {
        let env = |p: &str| std::collections::BTreeMap::from([("PULUMI_CONFIG_PASSPHRASE".to_string(), p.to_string())]);
        let (a, b) = (
            SecretsProviders::key("file:///s p s", &env("one"), ""),
            SecretsProviders::key("file:///s p s", &env("two"), ""),
        );
        assert_ne!(a, b, "another passphrase, another entry");
        assert_ne!(a, SecretsProviders::key("file:///s p s", &env("one"), "awskms://k"), "another provider");
        assert!(!a.contains("one"), "the passphrase itself is never part of the key");
        let m = SecretsProviders::default();
        m.remember(&a, "config: {}\n");
        assert_eq!(m.recall(&a), None, "a file without settings remembers nothing");
        m.remember(&a, "encryptionsalt: v1:x\n");
        assert_eq!(m.recall(&a), Some(vec![("encryptionsalt".into(), "v1:x".into())]));
        assert_eq!(m.recall(&b), None);
        m.forget(&a);
        assert_eq!(m.recall(&a), None);
    }
}
