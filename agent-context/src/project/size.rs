//! Size accounting of a prompt: bytes kept eagerly (an upper bound of tokens, cheap), tokens
//! counted only when asked (the tokenizer is slow to load, and most prompts are far below
//! any threshold). When the provider said how many tokens the last prompt had, that count
//! plus the bytes added since is a tighter bound, still without a tokenizer.

use std::sync::{Arc, OnceLock};

use agent_core::{Message, Part};

use crate::tokens::TokenCounter;

/// The sizes of a prompt's fixed part (system text, tool specs) and of each message.
pub(super) struct Sizes {
    counter: Arc<dyn TokenCounter>,
    /// The system text and the tools as JSON: what the fixed part's tokens are counted of.
    base: (String, String),
    base_bytes: usize,
    base_tokens: OnceLock<usize>,
    message_bytes: Vec<usize>,
    message_tokens: Vec<OnceLock<usize>>,
    /// The provider's count of the last prompt sent, when it gave one.
    reported: Option<usize>,
    /// Bytes of the messages added or changed since that prompt (an upper bound of their
    /// tokens; a message removed since takes its bytes off only if it was added since).
    since: usize,
}

impl Sizes {
    pub(super) fn new(counter: Arc<dyn TokenCounter>, system: &str, tools_text: String) -> Sizes {
        Sizes {
            counter,
            base_bytes: system.len() + tools_text.len(),
            base: (system.to_owned(), tools_text),
            base_tokens: OnceLock::new(),
            message_bytes: Vec::new(),
            message_tokens: Vec::new(),
            reported: None,
            since: 0,
        }
    }

    /// The provider counted `tokens` in the prompt as it stands (0: it did not say).
    pub(super) fn reported(&mut self, tokens: u64) {
        self.reported = (tokens > 0).then(|| usize::try_from(tokens).unwrap_or(usize::MAX));
        self.since = 0;
    }

    /// No count of the provider's describes this prompt any more (it was compacted).
    pub(super) fn forget_reported(&mut self) {
        self.reported = None;
        self.since = 0;
    }

    /// A number of tokens the prompt cannot exceed, found without a tokenizer: its bytes,
    /// or the provider's last count plus the bytes added since, whichever is smaller.
    pub(super) fn upper_bound(&self) -> usize {
        let bytes = self.bytes();
        match self.reported {
            Some(reported) => bytes.min(reported.saturating_add(self.since)),
            None => bytes,
        }
    }

    /// A message was added at the end.
    pub(super) fn pushed(&mut self, message: &Message) {
        let bytes = message_bytes(message);
        self.since = self.since.saturating_add(bytes);
        self.message_bytes.push(bytes);
        self.message_tokens.push(OnceLock::new());
    }

    /// The last message, added since the provider's last count, was removed.
    pub(super) fn popped(&mut self) {
        if let Some(bytes) = self.message_bytes.pop() {
            self.since = self.since.saturating_sub(bytes);
        }
        self.message_tokens.pop();
    }

    /// Message `index` changed.
    pub(super) fn changed(&mut self, index: usize, message: &Message) {
        if let Some(bytes) = self.message_bytes.get_mut(index) {
            *bytes = message_bytes(message);
            // Counted whole: what it replaced may have been counted by the provider.
            self.since = self.since.saturating_add(*bytes);
            self.message_tokens[index] = OnceLock::new();
        }
    }

    /// Every message was removed.
    pub(super) fn cleared(&mut self) {
        self.message_bytes.clear();
        self.message_tokens.clear();
    }

    /// Tokens of the fixed part.
    pub(super) fn base_tokens(&self) -> usize {
        *self
            .base_tokens
            .get_or_init(|| self.counter.count(&self.base.0) + self.counter.count(&self.base.1))
    }

    /// Tokens of the whole prompt whose messages are `messages`.
    pub(super) fn tokens(&self, messages: &[Message]) -> usize {
        self.base_tokens()
            + self
                .message_tokens
                .iter()
                .zip(messages)
                .map(|(tokens, message)| *tokens.get_or_init(|| self.of(message)))
                .sum::<usize>()
    }

    /// Bytes of the whole prompt, which no token count exceeds.
    pub(super) fn bytes(&self) -> usize {
        self.base_bytes + self.message_bytes.iter().sum::<usize>()
    }

    /// Tokens of one message.
    pub(super) fn of(&self, message: &Message) -> usize {
        let counter = self.counter.as_ref();
        let parts: usize = message
            .parts
            .iter()
            .map(|part| match part {
                Part::Text { text } => counter.count(text),
                Part::ToolUse {
                    name, arguments, ..
                } => counter.count(name) + counter.count(&arguments.to_string()) + 3,
                Part::ToolResult { content, .. } => counter.count(content) + 3,
            })
            .sum();
        parts + 4
    }

    /// Tokens of `text`.
    pub(super) fn count(&self, text: &str) -> usize {
        self.counter.count(text)
    }
}

fn message_bytes(message: &Message) -> usize {
    let parts: usize = message
        .parts
        .iter()
        .map(|part| match part {
            Part::Text { text } => text.len(),
            Part::ToolUse {
                name, arguments, ..
            } => name.len() + arguments.to_string().len() + 3,
            Part::ToolResult { content, .. } => content.len() + 3,
        })
        .sum();
    parts + 4
}
