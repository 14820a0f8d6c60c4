//! Masking of secret values in everything the agent emits (log lines, engine events, error messages).

/// Replaces every known secret value with `[secret]`. Values shorter than 3 bytes are not masked (they would mask
/// unrelated text and reveal little).
#[derive(Debug, Clone, Default)]
pub struct Masker {
    secrets: Vec<String>,
}

/// The shortest line of a multi-line secret masked on its own, in bytes (shorter lines — a brace, a blank — would
/// mask unrelated text).
pub const MIN_LINE: usize = 8;

/// What a masked value is replaced with (PKO's marker).
pub const MASK: &str = "[secret]";

impl Masker {
    /// Adds a secret value (and its JSON-escaped form, as it appears inside JSON text). A multi-line value (a PEM key,
    /// a kubeconfig) adds each of its lines of at least [`MIN_LINE`] bytes too: a program printing one line of it alone
    /// must not reveal that line.
    pub fn add(&mut self, value: &str) {
        if value.len() < 3 {
            return;
        }
        let escaped = serde_json::to_string(value).unwrap_or_default();
        let escaped = escaped.trim_matches('"').to_string();
        let lines = value.lines().map(str::trim).filter(|l| l.len() >= MIN_LINE && *l != value);
        for v in [value.to_string(), escaped].into_iter().chain(lines.map(str::to_string)) {
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
    fn each_line_of_a_multi_line_secret_is_masked_alone() {
        let mut m = Masker::default();
        m.add("-----BEGIN KEY-----\nAAAA-line-one\n}\n-----END KEY-----\n");
        assert_eq!(m.mask("got AAAA-line-one here"), "got [secret] here");
        assert_eq!(m.mask("a } stays"), "a } stays", "short lines are not masked alone");
        assert_eq!(
            m.mask("-----BEGIN KEY-----\nAAAA-line-one\n}\n-----END KEY-----\n"),
            "[secret]",
            "the whole value first"
        );
    }

    #[test]
    fn longest_secret_wins() {
        let mut m = Masker::default();
        m.add("abc");
        m.add("abcdef");
        assert_eq!(m.mask("abcdef"), "[secret]");
    }
}
