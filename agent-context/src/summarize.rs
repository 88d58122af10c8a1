//! Summaries for compaction: a trait, and a deterministic extractive summary that needs no
//! model (used by the script model, and as the fallback when a model's summary fails).

use agent_core::{Decision, Entry, Event, Prompt, canonical_json};
use async_trait::async_trait;

/// Writes the summary that replaces older turns.
#[async_trait]
pub trait Summarizer: Send + Sync {
    /// Summarizes `history` (the log since the last compaction, that compaction's event
    /// first: `Projector::summary_from`), of which `prompt` is the current view. On `Err`
    /// the runtime falls back to the [`Extractive`] summary: compaction never waits on a
    /// summarizer that cannot answer.
    async fn summarize(&self, history: &[Entry], prompt: &Prompt) -> Result<String, SummaryError>;
}

/// Why a summarizer gave no summary.
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    /// The model (or service) that writes summaries failed.
    #[error("the summarizer failed: {0}")]
    Failed(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// It answered, but not with a summary (a tool call, an empty text).
    #[error("the summarizer's answer is not a summary: {0}")]
    NotASummary(String),
    /// The history does not fit what the summarizer can read.
    #[error("the history is too large to summarize")]
    TooLarge,
}

/// The instruction a model gets to summarize a run.
pub const SUMMARY_INSTRUCTION: &str = "Summarize the work so far for yourself, to continue \
it after the conversation is cut. Keep: the goal and constraints the person gave, what you \
learned that the goal needs (values, names, file contents that matter), what you tried that \
failed and why, and what is left to do. Do not repeat tool outputs in full. Plain text, at \
most 400 words.";

/// A summary made of the log itself: one line per turn, newest kept first within a size.
#[derive(Clone, Debug)]
pub struct Extractive {
    /// Longest summary, in characters.
    pub max_chars: usize,
}

impl Extractive {
    /// The summary of `history`.
    pub fn of(&self, history: &[Entry]) -> String {
        extract(history, self.max_chars)
    }
}

impl Default for Extractive {
    fn default() -> Self {
        Extractive { max_chars: 6_000 }
    }
}

/// The first line of `text`, at most `max` characters, with `…` when anything was left out.
pub(crate) fn first_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    // The first `max` characters, sliced rather than collected char by char.
    let end = line
        .char_indices()
        .nth(max)
        .map_or(line.len(), |(at, _)| at);
    let mut out = String::with_capacity(end + 3);
    out.push_str(&line[..end]);
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// The extractive summary of `history`.
pub fn extract(history: &[Entry], max_chars: usize) -> String {
    let mut earlier = None;
    let mut lines: Vec<String> = Vec::new();
    for entry in history {
        match &entry.event {
            Event::ContextCompacted { summary, .. } => {
                // A second compaction keeps what the first one said.
                earlier = Some(first_line(summary, 2_000));
                lines.clear();
            }
            Event::DecisionProposed { turn, decision, .. } => lines.push(match decision {
                Decision::ToolCalls { calls } => format!(
                    "Turn {turn}: called {}",
                    calls
                        .iter()
                        .map(|c| format!(
                            "{} {} {}",
                            c.id,
                            c.name,
                            first_line(&canonical_json(&c.arguments), 120)
                        ))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
                Decision::Final { answer } => {
                    format!("Turn {turn}: answered: {}", first_line(answer, 200))
                }
                other => format!("Turn {turn}: {}", other.kind()),
            }),
            Event::DecisionRejected { turn, problem, .. } => {
                lines.push(format!("Turn {turn}: invalid reply ({problem})"));
            }
            Event::ToolFinished { result, .. } | Event::CallRejected { result, .. } => {
                let status = if result.is_ok() { "ok" } else { "failed" };
                lines.push(format!(
                    "  {} {status}: {}",
                    result.call_id,
                    first_line(&result.content(), 160)
                ));
            }
            Event::CorrectionIssued { turn, .. } => {
                lines.push(format!("Turn {turn}: repeated a plan and was corrected"));
            }
            Event::UserMessage { text, .. } => {
                lines.push(format!("The person said: {}", first_line(text, 300)));
            }
            _ => {}
        }
    }
    let mut out = String::new();
    let mut used = 0;
    let mut kept = Vec::new();
    for line in lines.iter().rev() {
        if used + line.len() + 1 > max_chars {
            break;
        }
        used += line.len() + 1;
        kept.push(line.as_str());
    }
    kept.reverse();
    if let Some(earlier) = earlier {
        out.push_str(&format!("Earlier: {earlier}\n"));
    }
    if kept.len() < lines.len() {
        out.push_str(&format!(
            "({} earlier lines omitted)\n",
            lines.len() - kept.len()
        ));
    }
    out.push_str(&kept.join("\n"));
    out
}

#[async_trait]
impl Summarizer for Extractive {
    async fn summarize(&self, history: &[Entry], _prompt: &Prompt) -> Result<String, SummaryError> {
        Ok(self.of(history))
    }
}
