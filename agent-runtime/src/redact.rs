//! Secrets never reach the log (CONTRACT §7): values of environment variables named like
//! secrets, `Authorization` headers and bearer tokens are replaced before events are
//! committed.

use regex::Regex;
use serde_json::Value;

use agent_core::Entry;

/// Values shorter than this are too likely to appear by chance to be worth replacing.
const MIN_SECRET_LEN: usize = 6;

/// Replaces secrets in the text of events.
#[derive(Clone, Debug)]
pub struct Redactor {
    secrets: Vec<(String, String)>,
    patterns: Vec<(Regex, &'static str)>,
}

impl Redactor {
    /// Secrets from the environment: every variable whose name contains `KEY`, `TOKEN`,
    /// `SECRET` or `PASSWORD`.
    pub fn from_env() -> Redactor {
        Redactor::new(std::env::vars().filter(|(name, _)| {
            let upper = name.to_ascii_uppercase();
            ["KEY", "TOKEN", "SECRET", "PASSWORD"]
                .iter()
                .any(|word| upper.contains(word))
        }))
    }

    /// Secrets given as `(name, value)` pairs.
    pub fn new(secrets: impl IntoIterator<Item = (String, String)>) -> Redactor {
        let mut secrets: Vec<(String, String)> = secrets
            .into_iter()
            .filter(|(_, value)| value.len() >= MIN_SECRET_LEN)
            .collect();
        // Longest first, so a secret that contains another is replaced whole.
        secrets.sort_by_key(|(_, value)| std::cmp::Reverse(value.len()));
        let patterns = [
            (
                r#"(?i)\b((?:proxy-)?authorization)\s*[:=]\s*[^\s,;'"]+(?:\s+[^\s,;'"]+)?"#,
                "$1: [REDACTED]",
            ),
            (
                r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}",
                "Bearer [REDACTED]",
            ),
            (
                r"\b(?:sk|pk|ghp|gho|xox[abp])-?[A-Za-z0-9_-]{16,}",
                "[REDACTED]",
            ),
        ]
        .into_iter()
        .filter_map(|(re, with)| Regex::new(re).ok().map(|re| (re, with)))
        .collect();
        Redactor { secrets, patterns }
    }

    /// A redactor that changes nothing.
    pub fn none() -> Redactor {
        Redactor {
            secrets: Vec::new(),
            patterns: Vec::new(),
        }
    }

    /// `text` with every secret replaced.
    pub fn redact_str(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (name, value) in &self.secrets {
            if out.contains(value.as_str()) {
                out = out.replace(value.as_str(), &format!("[REDACTED:{name}]"));
            }
        }
        for (re, with) in &self.patterns {
            if re.is_match(&out) {
                out = re.replace_all(&out, *with).into_owned();
            }
        }
        out
    }

    /// The entries with every string in them redacted.
    pub fn redact_entries(&self, entries: Vec<Entry>) -> Vec<Entry> {
        if self.secrets.is_empty() && self.patterns.is_empty() {
            return entries;
        }
        entries
            .into_iter()
            .map(|entry| {
                let Ok(mut value) = serde_json::to_value(&entry) else {
                    return entry;
                };
                self.redact_value(&mut value);
                serde_json::from_value(value).unwrap_or(entry)
            })
            .collect()
    }

    fn redact_value(&self, value: &mut Value) {
        match value {
            Value::String(s) => *s = self.redact_str(s),
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_value(v)),
            Value::Object(map) => map.values_mut().for_each(|v| self.redact_value(v)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_env_secrets_headers_and_tokens() {
        let r = Redactor::new([
            ("OPENAI_API_KEY".to_owned(), "abc123secretvalue".to_owned()),
            ("SHORT_KEY".to_owned(), "x".to_owned()),
        ]);
        assert_eq!(
            r.redact_str("key=abc123secretvalue and x"),
            "key=[REDACTED:OPENAI_API_KEY] and x"
        );
        assert_eq!(
            r.redact_str("curl -H 'Authorization: Bearer tok_abcdefgh12345' url"),
            "curl -H 'Authorization: [REDACTED]' url"
        );
        assert_eq!(
            r.redact_str("use bearer abcdefghijklmnop"),
            "use Bearer [REDACTED]"
        );
        assert_eq!(r.redact_str("sk-proj1234567890abcdefXYZ"), "[REDACTED]");
        assert_eq!(r.redact_str("nothing here"), "nothing here");
    }
}
