//! Token estimates and context windows.

/// Counts tokens the way a model's tokenizer would (an estimate for other tokenizers).
pub trait TokenCounter: Send + Sync {
    /// Tokens in `text`.
    fn count(&self, text: &str) -> usize;
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
