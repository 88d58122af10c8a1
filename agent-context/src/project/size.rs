//! Size accounting of a prompt: bytes kept eagerly (an upper bound of tokens, cheap), tokens
//! counted only when asked (the tokenizer is slow to load, and most prompts are far below
//! any threshold). When the provider said how many tokens the last prompt had, that count
//! plus the bytes added since is a tighter bound, still without a tokenizer.

use std::sync::{Arc, Mutex, OnceLock};

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
    /// Of each message's bytes, those of its reasoning parts.
    message_reasoning: Vec<usize>,
    /// The sum of `message_reasoning`.
    reasoning_bytes: usize,
    /// The sum of `message_bytes`, kept as they change.
    total_bytes: usize,
    /// Tokens of the messages counted so far, and which are not: a turn counts only the
    /// messages added or changed since the last count, never the whole prompt again.
    message_tokens: Mutex<Counted>,
    /// The provider's count of the last prompt sent, when it gave one.
    reported: Option<usize>,
    /// Bytes of the messages added or changed since that prompt (an upper bound of their
    /// tokens; a message removed since takes its bytes off only if it was added since).
    since: usize,
    /// Tokens the provider will count in this prompt at the fewest: its count of the last
    /// prompt, while the prompt only grew since (nothing counted was removed or changed),
    /// less the bytes of the reasoning it held (a provider may leave an earlier turn's
    /// reasoning out of later prompts: Anthropic does). `None`: no such count.
    floor: Option<usize>,
    /// Messages the prompt had when the provider counted it.
    floor_len: usize,
    /// The provider's counts may be of part of a prompt (what it did not have cached):
    /// they bound nothing, neither above nor below.
    partial: bool,
}

/// Token counts of messages, filled in when asked.
#[derive(Default)]
struct Counted {
    per_message: Vec<Option<usize>>,
    /// The sum of the counts in `per_message`.
    sum: usize,
    /// Messages (by index) added or changed since the last count; an index may be stale
    /// (popped since) or repeated.
    pending: Vec<usize>,
}

impl Sizes {
    fn counted(&self) -> std::sync::MutexGuard<'_, Counted> {
        // Plain numbers: a panic elsewhere cannot leave them half updated.
        self.message_tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn new(counter: Arc<dyn TokenCounter>, system: &str, tools_text: String) -> Sizes {
        Sizes {
            counter,
            base_bytes: system.len() + tools_text.len(),
            base: (system.to_owned(), tools_text),
            base_tokens: OnceLock::new(),
            message_bytes: Vec::new(),
            message_reasoning: Vec::new(),
            reasoning_bytes: 0,
            total_bytes: 0,
            message_tokens: Mutex::default(),
            reported: None,
            since: 0,
            floor: None,
            floor_len: 0,
            partial: false,
        }
    }

    /// The provider's counts may be of part of a prompt: none is taken as its size.
    pub(super) fn counts_may_be_partial(&mut self) {
        self.partial = true;
        self.forget_reported();
    }

    /// The provider counted `tokens` in the prompt as it stands (0: it did not say).
    pub(super) fn reported(&mut self, tokens: u64) {
        let tokens = usize::try_from(tokens).unwrap_or(usize::MAX);
        // Fewer than it counted before in a prompt that only grew since: its counts leave
        // something out (what it had cached), and are not the prompt's size.
        if tokens > 0 && self.lower_bound().is_some_and(|floor| tokens < floor) {
            self.partial = true;
        }
        if self.partial {
            self.forget_reported();
            return;
        }
        self.reported = (tokens > 0).then_some(tokens);
        self.since = 0;
        self.floor = self
            .reported
            .map(|tokens| tokens.saturating_sub(self.reasoning_bytes));
        self.floor_len = self.message_bytes.len();
    }

    /// No count of the provider's describes this prompt any more (it was compacted).
    pub(super) fn forget_reported(&mut self) {
        self.reported = None;
        self.since = 0;
        self.floor = None;
    }

    /// The counts so far are no floor of this prompt (see
    /// [`Projector::forget_lower_bound`]).
    ///
    /// [`Projector::forget_lower_bound`]: super::Projector::forget_lower_bound
    pub(super) fn forget_floor(&mut self) {
        self.floor = None;
    }

    /// The same floor for the messages alone, without the system text and the tools (at
    /// most one token a byte of them): what a request with other instructions and no tools
    /// has at the fewest, when it sends these messages whole.
    pub(super) fn messages_lower_bound(&self) -> Option<usize> {
        self.lower_bound()
            .map(|floor| floor.saturating_sub(self.base_bytes))
    }

    /// A number of tokens the provider will count in this prompt at the fewest, when known:
    /// see `floor`. Never above the upper bound.
    pub(super) fn lower_bound(&self) -> Option<usize> {
        self.floor.map(|floor| floor.min(self.upper_bound()))
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
        let (bytes, reasoning) = message_bytes(message);
        self.since = self.since.saturating_add(bytes);
        self.total_bytes += bytes;
        self.reasoning_bytes += reasoning;
        let index = self.message_bytes.len();
        self.message_bytes.push(bytes);
        self.message_reasoning.push(reasoning);
        let counted = self
            .message_tokens
            .get_mut()
            .unwrap_or_else(|p| p.into_inner());
        counted.per_message.push(None);
        counted.pending.push(index);
    }

    /// The last message stays, as if removed and added again: it counts as added since the
    /// provider's last count.
    pub(super) fn kept_last(&mut self) {
        if let Some(&bytes) = self.message_bytes.last() {
            self.since = self.since.saturating_sub(bytes).saturating_add(bytes);
        }
    }

    /// The last message, added since the provider's last count, was removed.
    pub(super) fn popped(&mut self) {
        if self.message_bytes.len() <= self.floor_len {
            // It was counted after all: the count is no floor of what is left.
            self.floor = None;
        }
        if let Some(bytes) = self.message_bytes.pop() {
            self.since = self.since.saturating_sub(bytes);
            self.total_bytes -= bytes;
        }
        if let Some(reasoning) = self.message_reasoning.pop() {
            self.reasoning_bytes -= reasoning;
        }
        let counted = self
            .message_tokens
            .get_mut()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(Some(tokens)) = counted.per_message.pop() {
            counted.sum -= tokens;
        }
    }

    /// Message `index` changed.
    pub(super) fn changed(&mut self, index: usize, message: &Message) {
        if index < self.floor_len {
            // What the provider counted may be smaller now (a result masked).
            self.floor = None;
        }
        if let (Some(bytes), Some(reasoning)) = (
            self.message_bytes.get_mut(index),
            self.message_reasoning.get_mut(index),
        ) {
            let (new_bytes, new_reasoning) = message_bytes(message);
            self.total_bytes = self.total_bytes - *bytes + new_bytes;
            self.reasoning_bytes = self.reasoning_bytes - *reasoning + new_reasoning;
            (*bytes, *reasoning) = (new_bytes, new_reasoning);
            // Counted whole: what it replaced may have been counted by the provider.
            self.since = self.since.saturating_add(*bytes);
            let counted = self
                .message_tokens
                .get_mut()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(tokens) = counted.per_message[index].take() {
                counted.sum -= tokens;
            }
            counted.pending.push(index);
        }
    }

    /// Every message was removed.
    pub(super) fn cleared(&mut self) {
        self.message_bytes.clear();
        self.message_reasoning.clear();
        self.reasoning_bytes = 0;
        self.total_bytes = 0;
        self.floor = None;
        *self
            .message_tokens
            .get_mut()
            .unwrap_or_else(|p| p.into_inner()) = Counted::default();
    }

    /// Tokens of the fixed part.
    pub(super) fn base_tokens(&self) -> usize {
        *self
            .base_tokens
            .get_or_init(|| self.counter.count(&self.base.0) + self.counter.count(&self.base.1))
    }

    /// Tokens of the whole prompt whose messages are `messages`.
    pub(super) fn tokens(&self, messages: &[Message]) -> usize {
        let mut counted = self.counted();
        let Counted {
            per_message,
            sum,
            pending,
        } = &mut *counted;
        for index in pending.drain(..) {
            if let (Some(slot @ None), Some(message)) =
                (per_message.get_mut(index), messages.get(index))
            {
                let tokens = self.of(message);
                *slot = Some(tokens);
                *sum += tokens;
            }
        }
        self.base_tokens() + *sum
    }

    /// Bytes of the whole prompt, which no token count exceeds.
    pub(super) fn bytes(&self) -> usize {
        self.base_bytes + self.total_bytes
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
                } => counter.count(name) + counter.count(arguments.as_str()) + 3,
                Part::ToolResult { content, .. } => counter.count(content) + 3,
                Part::Reasoning { reasoning } => counter.count(&reasoning_text(reasoning)) + 3,
            })
            .sum();
        parts + 4
    }

    /// Tokens of `text`.
    pub(super) fn count(&self, text: &str) -> usize {
        self.counter.count(text)
    }
}

/// A message's bytes, and of them those of its reasoning parts.
fn message_bytes(message: &Message) -> (usize, usize) {
    let mut reasoning_bytes = 0;
    let parts: usize = message
        .parts
        .iter()
        .map(|part| match part {
            Part::Text { text } => text.len(),
            Part::ToolUse {
                name, arguments, ..
            } => name.len() + arguments.as_str().len() + 3,
            Part::ToolResult { content, .. } => content.len() + 3,
            Part::Reasoning { reasoning } => {
                let bytes = reasoning_text(reasoning).len() + 3;
                reasoning_bytes += bytes;
                bytes
            }
        })
        .sum();
    (parts + 4, reasoning_bytes)
}

/// What of a reasoning part is sent: its text and signature, or its encrypted data.
fn reasoning_text(reasoning: &agent_core::Reasoning) -> std::borrow::Cow<'_, str> {
    match reasoning {
        agent_core::Reasoning::Thinking {
            thinking,
            signature,
        } => format!("{thinking}{signature}").into(),
        agent_core::Reasoning::RedactedThinking { data } => data.as_str().into(),
        // Only `reasoning_content` is sent back (see the OpenAI translator), and Ollama's
        // `thinking` (see its translator).
        agent_core::Reasoning::Content { field, text }
            if field == "reasoning_content" || field == "thinking" =>
        {
            text.as_str().into()
        }
        agent_core::Reasoning::Content { .. } => "".into(),
        agent_core::Reasoning::Details { details } => details
            .iter()
            .map(serde_json::Value::to_string)
            .collect::<String>()
            .into(),
        agent_core::Reasoning::CallExtra { extra_content, .. } => extra_content.to_string().into(),
        agent_core::Reasoning::ResponsesItem {
            summary,
            encrypted_content,
            ..
        } => format!(
            "{}{}",
            summary.concat(),
            encrypted_content.as_deref().unwrap_or_default()
        )
        .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CharEstimate;
    use proptest::prelude::*;

    /// What a prompt's messages go through: added, the last removed, one replaced.
    #[derive(Clone, Debug)]
    enum Step {
        Push(String),
        Pop,
        Change(usize, String),
        Count,
        Clear,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => "[a-z ]{0,40}".prop_map(Step::Push),
            1 => Just(Step::Pop),
            2 => (0usize..16, "[a-z ]{0,40}").prop_map(|(i, t)| Step::Change(i, t)),
            2 => Just(Step::Count),
            1 => Just(Step::Clear),
        ]
    }

    proptest! {
        /// Counting only what changed since the last count gives what counting every
        /// message again gives, whatever happened in between. And what the provider
        /// counted stays a floor of the prompt: here it counts as the estimate does
        /// (`Count` is its count of the prompt as it stands), and its count of the prompt
        /// is never below the floor, whatever was removed or changed since.
        #[test]
        fn running_sums_equal_a_count_from_scratch(steps in proptest::collection::vec(step(), 0..60)) {
            let mut sizes = Sizes::new(Arc::new(CharEstimate), "system", "[]".to_owned());
            let mut messages: Vec<Message> = Vec::new();
            for step in steps {
                match step {
                    Step::Push(text) => {
                        let message = Message::user_text(text);
                        sizes.pushed(&message);
                        messages.push(message);
                    }
                    Step::Pop => {
                        if messages.pop().is_some() {
                            sizes.popped();
                        }
                    }
                    Step::Change(i, text) => {
                        if i < messages.len() {
                            messages[i] = Message::user_text(text);
                            sizes.changed(i, &messages[i]);
                        }
                    }
                    Step::Count => {
                        let count = sizes.tokens(&messages);
                        sizes.reported(count as u64);
                        prop_assert_eq!(sizes.lower_bound(), (count > 0).then_some(count));
                    }
                    Step::Clear => {
                        sizes.cleared();
                        messages.clear();
                    }
                }
                if let Some(floor) = sizes.lower_bound() {
                    prop_assert!(floor <= sizes.tokens(&messages), "{} > {}", floor, sizes.tokens(&messages));
                }
                let fresh = Sizes::new(Arc::new(CharEstimate), "system", "[]".to_owned());
                let expected: usize =
                    fresh.base_tokens() + messages.iter().map(|m| fresh.of(m)).sum::<usize>();
                prop_assert_eq!(sizes.tokens(&messages), expected);
                let bytes: usize = messages.iter().map(|m| message_bytes(m).0).sum();
                prop_assert_eq!(sizes.bytes(), "system".len() + "[]".len() + bytes);
            }
        }

        /// Keeping the last message is removing it and adding it again, for every figure
        /// (the upper bound included), whatever the provider reported in between.
        #[test]
        fn keeping_the_last_message_is_popping_and_pushing_it(
            steps in proptest::collection::vec(step(), 0..40),
            reports in proptest::collection::vec(0u64..200, 40),
        ) {
            let mut kept = Sizes::new(Arc::new(CharEstimate), "system", "[]".to_owned());
            let mut again = Sizes::new(Arc::new(CharEstimate), "system", "[]".to_owned());
            let mut messages: Vec<Message> = Vec::new();
            // A provider that counts whole prompts: a count is never below an earlier one
            // (fewer would say its counts are partial, a case of its own below).
            let reports = reports.into_iter().scan(0, |most, report| {
                *most = report.max(*most);
                Some((report % 2 == 0, *most))
            });
            for (step, (said, report)) in steps.into_iter().zip(reports) {
                match step {
                    Step::Push(text) => {
                        let message = Message::user_text(text);
                        kept.pushed(&message);
                        again.pushed(&message);
                        messages.push(message);
                    }
                    // Here: the last message kept, after a count of the provider's (a
                    // decision closing the turn) or without one (a failed call, a message).
                    Step::Pop | Step::Clear => {
                        if said {
                            kept.reported(report);
                            again.reported(report);
                        }
                        if let Some(last) = messages.last() {
                            kept.kept_last();
                            again.popped();
                            again.pushed(last);
                        }
                    }
                    Step::Change(i, text) => {
                        if i < messages.len() {
                            messages[i] = Message::user_text(text);
                            kept.changed(i, &messages[i]);
                            again.changed(i, &messages[i]);
                        }
                    }
                    Step::Count => {
                        kept.tokens(&messages);
                    }
                }
                prop_assert_eq!(kept.upper_bound(), again.upper_bound());
                prop_assert_eq!(kept.bytes(), again.bytes());
                prop_assert_eq!(kept.tokens(&messages), again.tokens(&messages));
            }
        }
    }

    /// What goes back of a reasoning part counts in the prompt's bytes: Ollama's thinking
    /// and `reasoning_content` do, another server's `reasoning` field (never sent) does not.
    #[test]
    fn reasoning_sent_back_counts_in_the_bytes() {
        let with = |field: &str| {
            let message = Message {
                role: agent_core::Role::Assistant,
                parts: vec![Part::Reasoning {
                    reasoning: agent_core::Reasoning::Content {
                        field: field.into(),
                        text: "x".repeat(1_000),
                    },
                }],
            };
            message_bytes(&message).0
        };
        assert!(with("thinking") > 1_000);
        assert!(with("reasoning_content") > 1_000);
        assert!(with("reasoning") < 1_000);
    }

    /// A provider whose counts may be partial bounds nothing: the prompt's size is its
    /// bytes, not the count plus what was added. Told so, or finding it out when a count
    /// is below one it gave before for a prompt that only grew.
    #[test]
    fn partial_counts_bound_nothing() {
        let grow = |sizes: &mut Sizes, text: &str| sizes.pushed(&Message::user_text(text));
        let mut told = Sizes::new(Arc::new(CharEstimate), "system", "[]".to_owned());
        told.counts_may_be_partial();
        grow(&mut told, &"a".repeat(4_000));
        told.reported(50);
        assert_eq!(told.upper_bound(), told.bytes());
        assert_eq!(told.lower_bound(), None);

        let mut found = Sizes::new(Arc::new(CharEstimate), "system", "[]".to_owned());
        grow(&mut found, &"a".repeat(4_000));
        found.reported(1_000);
        grow(&mut found, &"b".repeat(400));
        assert_eq!(
            found.upper_bound(),
            1_000 + 404,
            "a whole count bounds the prompt"
        );
        assert_eq!(found.lower_bound(), Some(1_000));
        // What it had cached left out of its count: fewer than before.
        found.reported(120);
        assert_eq!(found.upper_bound(), found.bytes());
        assert_eq!(found.lower_bound(), None);
        grow(&mut found, &"c".repeat(400));
        found.reported(5_000);
        assert_eq!(
            found.upper_bound(),
            found.bytes(),
            "and none after it either"
        );
        assert_eq!(found.lower_bound(), None);
    }
}
