//! Token estimates and context windows.

/// Counts tokens the way a model's tokenizer would (an estimate for other tokenizers).
pub trait TokenCounter: Send + Sync {
    /// Tokens in `text`.
    fn count(&self, text: &str) -> usize;

    /// Tokens in `value`'s JSON text (a tool call's arguments). By default the text is
    /// written out and counted; a counter that needs no text can count it as it is written.
    fn count_json(&self, value: &serde_json::Value) -> usize {
        self.count(&value.to_string())
    }
}

/// OpenAI's `o200k_base` encoding, from `tiktoken-rs` (its tables ship with the crate).
#[derive(Clone, Copy, Debug, Default)]
pub struct Tiktoken;

impl TokenCounter for Tiktoken {
    fn count(&self, text: &str) -> usize {
        tiktoken_rs::o200k_base_singleton()
            .encode_ordinary(text)
            .len()
    }
}

/// A rough count without a tokenizer: one token per four characters.
#[derive(Clone, Copy, Debug, Default)]
pub struct CharEstimate;

impl TokenCounter for CharEstimate {
    fn count(&self, text: &str) -> usize {
        text.chars().count().div_ceil(4)
    }

    fn count_json(&self, value: &serde_json::Value) -> usize {
        /// Counts the characters of UTF-8 written to it: every byte but continuations.
        struct Chars(usize);
        impl std::io::Write for Chars {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0 += buf.iter().filter(|b| (**b & 0xC0) != 0x80).count();
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut chars = Chars(0);
        // Writing to a counter cannot fail, and a `Value` always serializes.
        let _ = serde_json::to_writer(&mut chars, value);
        chars.0.div_ceil(4)
    }
}

/// Context windows of known models, by name prefix (longest prefix wins).
const WINDOWS: &[(&str, usize)] = &[
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4", 8_192),
    ("gpt-5", 400_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    ("claude-", 200_000),
    ("llama3.1", 128_000),
    ("llama3.2", 128_000),
    ("llama3", 8_192),
    ("qwen2.5", 32_768),
    ("qwen3", 40_960),
    ("mistral", 32_768),
    ("gemma3", 128_000),
];

/// The window assumed for a model nobody listed.
pub const DEFAULT_CONTEXT_WINDOW: usize = 128_000;

/// The context window of `model` in tokens (overridable in `agent.toml`).
pub fn context_window(model: &str) -> usize {
    let name = model.rsplit('/').next().unwrap_or(model);
    WINDOWS
        .iter()
        .filter(|(prefix, _)| name.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map_or(DEFAULT_CONTEXT_WINDOW, |(_, w)| *w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_of_json_is_the_estimate_of_its_text() {
        for value in [
            serde_json::json!({}),
            serde_json::json!({"path": "caf\u{e9} \u{1f600} \"q\"\n", "n": [1, 2.5, null, true]}),
            serde_json::json!("\u{4e2d}".repeat(301)),
        ] {
            assert_eq!(
                CharEstimate.count_json(&value),
                CharEstimate.count(&value.to_string()),
                "{value}"
            );
        }
    }

    #[test]
    fn windows_by_longest_prefix() {
        assert_eq!(context_window("gpt-4o-mini"), 128_000);
        assert_eq!(context_window("gpt-4.1-nano"), 1_047_576);
        assert_eq!(context_window("gpt-4-0613"), 8_192);
        assert_eq!(context_window("claude-sonnet-4-5"), 200_000);
        assert_eq!(context_window("library/llama3.1:8b"), 128_000);
        assert_eq!(context_window("something-else"), DEFAULT_CONTEXT_WINDOW);
    }

    #[test]
    fn tiktoken_counts_real_tokens() {
        assert_eq!(Tiktoken.count(""), 0);
        assert_eq!(Tiktoken.count("hello world"), 2);
        let long = "the quick brown fox ".repeat(100);
        let n = Tiktoken.count(&long);
        assert!((350..=450).contains(&n), "{n}");
    }
}
