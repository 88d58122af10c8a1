//! Keeping results small: one turn's results under a budget (the largest cut first), and
//! older turns' results masked to their head and a handle. The log keeps them whole.

use agent_core::{CallId, Handle, Message, Part};

use super::{ContextConfig, READ_RESULT};

/// A result message of a closed turn, with the log version of each result in it.
pub(super) struct ResultMessage {
    /// Where it is in the prompt.
    pub(super) index: usize,
    /// The version each result was committed as.
    pub(super) versions: Vec<(CallId, u64)>,
    /// Characters masking would take out of it.
    pub(super) chars: usize,
}

/// Characters of `message`'s results that [`mask`] would take out.
pub(super) fn maskable_chars(config: &ContextConfig, message: &Message) -> usize {
    let keep = config.masked_result_chars;
    message
        .parts
        .iter()
        .map(|part| match part {
            Part::ToolResult { content, .. } => {
                let total = content.chars().count();
                if total <= keep + 100 { 0 } else { total - keep }
            }
            _ => 0,
        })
        .sum()
}

fn version_of(versions: &[(CallId, u64)], call_id: &CallId) -> u64 {
    versions
        .iter()
        .find(|(id, _)| id == call_id)
        .map_or(0, |(_, v)| *v)
}

/// Keeps one turn's results under the budget, cutting the largest first. `reads_back`:
/// the run has `read_result`, so a cut result says how to read it whole.
pub(super) fn turn_budget(
    config: &ContextConfig,
    reads_back: bool,
    parts: &mut [Part],
    versions: &[(CallId, u64)],
) {
    let size = |p: &Part| match p {
        Part::ToolResult { content, .. } => content.chars().count(),
        _ => 0,
    };
    let budget = config.turn_result_budget;
    let mut total: usize = parts.iter().map(size).sum();
    while total > budget {
        let Some((i, _)) = parts
            .iter()
            .enumerate()
            .filter(|(_, p)| size(p) > config.preview_bytes + 400)
            .max_by_key(|(i, p)| (size(p), std::cmp::Reverse(*i)))
        else {
            break;
        };
        if let Part::ToolResult {
            call_id, content, ..
        } = &mut parts[i]
        {
            let before = content.chars().count();
            let head = head_bytes(content, config.preview_bytes);
            let left_out = before - head.chars().count();
            *content = if reads_back {
                format!(
                    "{head}\n[{left_out} characters of this result left out: one turn's \
                     results stay under {budget} characters; read it whole with \
                     {READ_RESULT} handle \"{}\"]",
                    Handle::Log(version_of(versions, call_id))
                )
            } else {
                format!(
                    "{head}\n[{left_out} characters of this result left out: one turn's \
                     results stay under {budget} characters]"
                )
            };
            total = total - before + content.chars().count();
        }
    }
}

/// Shows an older turn's long results (in `message`) by their head and a handle.
pub(super) fn mask(
    config: &ContextConfig,
    reads_back: bool,
    message: &mut Message,
    old: &ResultMessage,
) {
    let keep = config.masked_result_chars;
    for part in &mut message.parts {
        if let Part::ToolResult {
            call_id, content, ..
        } = part
        {
            let total = content.chars().count();
            if total <= keep + 100 {
                continue;
            }
            let end = content
                .char_indices()
                .nth(keep)
                .map_or(content.len(), |(at, _)| at);
            let head = content[..end].to_owned();
            let more = total - keep;
            *content = if reads_back {
                format!(
                    "{head}…\n[older result, {more} more characters: {READ_RESULT} handle \
                     \"{}\"]",
                    Handle::Log(version_of(&old.versions, call_id))
                )
            } else {
                format!("{head}…\n[older result, {more} more characters not shown]")
            };
        }
    }
}

/// The first `max` bytes of `text`, cut at a character boundary.
pub(super) fn head_bytes(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
