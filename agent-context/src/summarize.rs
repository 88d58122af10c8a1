//! Summaries for compaction: a trait, and a deterministic extractive summary that needs no
//! model (used by the script model, and as the fallback when a model's summary fails).

use std::collections::VecDeque;
use std::fmt::Write as _;

use agent_core::{Decision, Entry, Event, Prompt, ToolOutcome, Usage, canonical_json};
use async_trait::async_trait;

/// Writes the summary that replaces older turns.
#[async_trait]
pub trait Summarizer: Send + Sync {
    /// Summarizes `history` (the log since the last compaction, that compaction's event
    /// first: `Projector::summary_from`), of which `prompt` is the current view. On `Err`
    /// the runtime falls back to the [`Extractive`] summary: compaction never waits on a
    /// summarizer that cannot answer. What its model calls used, summary or not, counts
    /// toward the run's budgets.
    async fn summarize(&self, history: &[Entry], prompt: &Prompt) -> Summarized;

    /// Whether [`summarize`](Summarizer::summarize) reads `history`. When it does not, the
    /// runtime gives it an empty history rather than read the log back from the store.
    fn reads_history(&self) -> bool {
        true
    }

    /// The summary made from the projection's running [`Digest`] instead, when this
    /// summarizer can make it so (then neither the log nor `summarize` is needed).
    fn summarize_digest(&self, digest: &Digest) -> Option<String> {
        let _ = digest;
        None
    }
}

/// What a summarizer gave: the summary or why there is none, and what its model calls
/// used either way (a reply that is not a summary was paid for all the same).
#[derive(Debug)]
pub struct Summarized {
    /// The summary.
    pub summary: Result<String, SummaryError>,
    /// What it used (nothing, for a summarizer that asks no model).
    pub usage: Usage,
}

impl From<Result<String, SummaryError>> for Summarized {
    /// A summary made without a model: it used nothing.
    fn from(summary: Result<String, SummaryError>) -> Self {
        Summarized {
            summary,
            usage: Usage::default(),
        }
    }
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

/// Default of [`Extractive::max_chars`], and the size of the projection's [`Digest`].
pub const DEFAULT_SUMMARY_CHARS: usize = 6_000;

impl Default for Extractive {
    fn default() -> Self {
        Extractive {
            max_chars: DEFAULT_SUMMARY_CHARS,
        }
    }
}

/// The first line of `text`, at most `max` characters, with `…` when anything was left out.
pub(crate) fn first_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    // The first `max` characters, sliced rather than collected char by char; a line of at
    // most `max` bytes has at most `max` characters.
    let end = if line.len() <= max {
        line.len()
    } else if line.as_bytes()[..max].is_ascii() {
        // `max` ASCII characters are `max` bytes.
        max
    } else {
        line.char_indices()
            .nth(max)
            .map_or(line.len(), |(at, _)| at)
    };
    let mut out = String::with_capacity(end + 3);
    out.push_str(&line[..end]);
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// The extractive summary of `history`.
pub fn extract(history: &[Entry], max_chars: usize) -> String {
    let mut digest = Digest::new(max_chars);
    for entry in history {
        digest.apply(entry);
    }
    digest.summary()
}

/// The extractive summary kept up to date as entries are applied: what [`extract`] makes
/// of the history since the last compaction, without reading that history again. It holds
/// at most `max_chars` of lines, so it does not grow with the run.
#[derive(Clone, Debug)]
pub struct Digest {
    max_chars: usize,
    /// The first line of the last compaction's summary.
    earlier: Option<String>,
    /// The newest lines that fit in `max_chars` (each counted with its newline).
    lines: VecDeque<String>,
    used: usize,
    /// Lines since the last compaction that no longer fit.
    omitted: usize,
}

impl Digest {
    /// An empty digest whose summary holds at most `max_chars` of lines.
    pub fn new(max_chars: usize) -> Self {
        Digest {
            max_chars,
            earlier: None,
            lines: VecDeque::new(),
            used: 0,
            omitted: 0,
        }
    }

    /// The longest summary it makes, in characters of lines.
    pub fn max_chars(&self) -> usize {
        self.max_chars
    }

    /// Applies the next entry of the log.
    pub fn apply(&mut self, entry: &Entry) {
        match &entry.event {
            Event::ContextCompacted { summary, .. } => {
                // A second compaction keeps what the first one said.
                self.earlier = Some(first_line(summary, 2_000));
                self.lines.clear();
                self.used = 0;
                self.omitted = 0;
            }
            Event::DecisionProposed { turn, decision, .. } => {
                let mut line = String::with_capacity(160);
                let _ = write!(line, "Turn {turn}: ");
                match decision {
                    Decision::ToolCalls { calls } => {
                        line.push_str("called ");
                        for (i, c) in calls.iter().enumerate() {
                            if i > 0 {
                                line.push_str("; ");
                            }
                            line.push_str(c.id.as_str());
                            line.push(' ');
                            line.push_str(&c.name);
                            line.push(' ');
                            line.push_str(&first_line(&canonical_json(&c.arguments), 120));
                        }
                    }
                    Decision::Final { answer } => {
                        line.push_str("answered: ");
                        line.push_str(&first_line(answer, 200));
                    }
                    other => line.push_str(other.kind()),
                }
                self.push(line);
            }
            Event::DecisionRejected { turn, problem, .. } => {
                self.push(format!("Turn {turn}: invalid reply ({problem})"));
            }
            Event::ToolFinished { result, .. } | Event::CallRejected { result, .. } => {
                let status = if result.is_ok() { "ok" } else { "failed" };
                // An output's first line, without copying the whole output.
                let first = match &result.outcome {
                    ToolOutcome::Output(text) => first_line(text, 160),
                    ToolOutcome::Error(_) => first_line(&result.content(), 160),
                };
                let mut line =
                    String::with_capacity(result.call_id.as_str().len() + first.len() + 16);
                for piece in ["  ", result.call_id.as_str(), " ", status, ": ", &first] {
                    line.push_str(piece);
                }
                self.push(line);
            }
            Event::CorrectionIssued { turn, .. } => {
                self.push(format!("Turn {turn}: repeated a plan and was corrected"));
            }
            Event::UserMessage { text, .. } | Event::UserNote { text } => {
                self.push(format!("The person said: {}", first_line(text, 300)));
            }
            _ => {}
        }
    }

    /// Keeps `line` as the newest, and as many older lines as still fit.
    fn push(&mut self, line: String) {
        self.used += line.len() + 1;
        self.lines.push_back(line);
        while self.used > self.max_chars {
            let Some(oldest) = self.lines.pop_front() else {
                break;
            };
            self.used -= oldest.len() + 1;
            self.omitted += 1;
        }
    }

    /// The summary: the last compaction's first line, a count of the lines left out, and
    /// the newest lines that fit.
    pub fn summary(&self) -> String {
        let mut out = String::with_capacity(self.used + 64);
        if let Some(earlier) = &self.earlier {
            out.push_str(&format!("Earlier: {earlier}\n"));
        }
        if self.omitted > 0 {
            out.push_str(&format!("({} earlier lines omitted)\n", self.omitted));
        }
        for (i, line) in self.lines.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            out.push_str(line);
        }
        out
    }
}

#[async_trait]
impl Summarizer for Extractive {
    async fn summarize(&self, history: &[Entry], _prompt: &Prompt) -> Summarized {
        Ok(self.of(history)).into()
    }

    /// The digest is the same summary, kept as the log was applied, when it has this size.
    fn summarize_digest(&self, digest: &Digest) -> Option<String> {
        (digest.max_chars() == self.max_chars).then(|| digest.summary())
    }
}
