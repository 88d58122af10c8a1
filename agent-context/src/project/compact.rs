//! Compaction: the one message that replaces the history before a `context_compacted`
//! event — the person's own messages (newest first within a budget), the summary, and the
//! facts rebuilt from the log.

use agent_core::{Message, Part, Role};

use super::mask::head_bytes;
use super::size::Sizes;
use super::{ContextConfig, READ_RESULT, SUMMARY_PREFIX};

/// The compacted history: `user_texts` (the oldest kept one cut to fit), `summary`,
/// `facts`. `reads_back`: the run has `read_result` to read earlier results again.
pub(super) fn compacted_message(
    config: &ContextConfig,
    sizes: &Sizes,
    user_texts: &[String],
    reads_back: bool,
    summary: &str,
    facts: String,
) -> Message {
    let mut kept = Vec::new();
    let mut budget = config.kept_user_tokens;
    for text in user_texts.iter().rev() {
        let tokens = sizes.count(text);
        if tokens <= budget {
            kept.push(text.clone());
            budget -= tokens;
        } else {
            let share = text.len() * budget / tokens.max(1);
            let head = head_bytes(text, share);
            if !head.is_empty() {
                kept.push(format!("{head}…"));
            }
            break;
        }
    }
    kept.reverse();
    let mut parts: Vec<Part> = kept.into_iter().map(|text| Part::Text { text }).collect();
    parts.push(Part::Text {
        text: if reads_back {
            format!(
                "{SUMMARY_PREFIX}\nResults mentioned here can be read again with \
                 {READ_RESULT}.\n{summary}"
            )
        } else {
            format!("{SUMMARY_PREFIX}\n{summary}")
        },
    });
    parts.push(Part::Text { text: facts });
    Message {
        role: Role::User,
        parts,
    }
}
