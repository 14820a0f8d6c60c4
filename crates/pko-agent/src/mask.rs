//! Masking of secret values in everything the agent emits (log lines, engine events, error messages).

/// Replaces every known secret value with `[secret]`. Values shorter than 3 bytes are not masked (they
/// would mask unrelated text and reveal little).
#[derive(Debug, Clone, Default)]
pub struct Masker {
    secrets: Vec<String>,
}

/// What a masked value is replaced with (PKO's marker).
pub const MASK: &str = "[secret]";

impl Masker {
    /// Adds a secret value (and its JSON-escaped form, as it appears inside JSON text).
    pub fn add(&mut self, value: &str) {
        if value.len() < 3 {
            return;
        }
        let escaped = serde_json::to_string(value).unwrap_or_default();
        let escaped = escaped.trim_matches('"').to_string();
        for v in [value.to_string(), escaped] {
            if !self.secrets.contains(&v) {
                self.secrets.push(v);
            }
        }
        // longest first, so a secret containing another is masked whole
        self.secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }

    /// `text` with every secret replaced by [`MASK`].
    pub fn mask(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), MASK);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_plain_and_json_escaped_values() {
        let mut m = Masker::default();
        m.add("hunter2");
        m.add("a\"b\\c");
        m.add("xy");
        assert_eq!(m.mask("pw=hunter2!"), "pw=[secret]!");
        assert_eq!(m.mask(r#"{"v":"a\"b\\c"}"#), r#"{"v":"[secret]"}"#);
        assert_eq!(m.mask("xy stays"), "xy stays", "short values are not masked");
    }

    #[test]
    fn longest_secret_wins() {
        let mut m = Masker::default();
        m.add("abc");
        m.add("abcdef");
        assert_eq!(m.mask("abcdef"), "[secret]");
    }
}
