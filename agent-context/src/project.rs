//! The projection: the log, applied event by event, into the prompt of the next model call.
//!
//! It is incremental: each event costs work in proportion to its own turn, and the prompt
//! and its token estimate are kept up to date, so building a prompt never walks the history.
//! Older tool results are shown masked (their head and a handle) once
//! `recent_result_turns` newer turns exist; the log keeps them whole, and `read_result`
//! reads them back. A `context_compacted` event replaces everything before it by the kept
//! user messages, the summary and a facts block rebuilt from the log.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

use agent_core::{
    CallId, Decision, Entry, Event, Handle, Message, Part, Prompt, Role, ToolCall, ToolResult,
    ToolSpec,
};

use crate::DEFAULT_SYSTEM_PROMPT;
use crate::facts::Facts;
use crate::tokens::{DEFAULT_CONTEXT_WINDOW, Tiktoken, TokenCounter};

/// The fixed prefix of a compaction summary, telling the model what it reads.
pub const SUMMARY_PREFIX: &str = "[Summary of earlier work. The conversation before this \
point was compacted to stay within the context window; this summary and the runtime facts \
below replace it.]";

/// The tool the projection points to for what it shows shortened; it is mentioned only
/// when the run has it.
const READ_RESULT: &str = "read_result";

/// How the prompt is bounded.
#[derive(Clone, Debug)]
pub struct ContextConfig {
    /// The system text.
    pub system: String,
    /// The model's context window, in tokens.
    pub context_window: usize,
    /// Compact when the estimate passes this share of the window.
    pub compact_at: f64,
    /// Turns whose results are shown whole; older results are masked.
    pub recent_result_turns: usize,
    /// Characters of a masked result still shown.
    pub masked_result_chars: usize,
    /// Characters all results of one turn may take together.
    pub turn_result_budget: usize,
    /// Bytes of a result kept when the turn budget cuts it.
    pub preview_bytes: usize,
    /// Tokens of the person's own messages kept verbatim through a compaction.
    pub kept_user_tokens: usize,
}

impl Default for ContextConfig {
    fn default() -> Self {
        ContextConfig {
            system: DEFAULT_SYSTEM_PROMPT.to_owned(),
            context_window: DEFAULT_CONTEXT_WINDOW,
            compact_at: 0.8,
            recent_result_turns: 2,
            masked_result_chars: 100,
            turn_result_budget: 200_000,
            preview_bytes: 2_000,
            kept_user_tokens: 20_000,
        }
    }
}

/// A result message of a closed turn, with the log version of each result in it.
struct ResultMessage {
    index: usize,
    versions: Vec<(CallId, u64)>,
}

/// The incremental projection of one run's log.
pub struct Projector {
    config: ContextConfig,
    counter: Arc<dyn TokenCounter>,
    prompt: Prompt,
    /// Bytes of each message: an upper bound of its tokens, kept eagerly.
    message_bytes: Vec<usize>,
    /// Tokens of each message, counted when first asked (the tokenizer is slow to load
    /// and most prompts are far below any threshold).
    message_tokens: Vec<OnceLock<usize>>,
    base_bytes: usize,
    base_tokens: OnceLock<usize>,
    tools_text: String,
    provisional: bool,
    open_calls: Vec<ToolCall>,
    results: Vec<(CallId, u64, Part)>,
    notes: Vec<String>,
    result_messages: VecDeque<ResultMessage>,
    facts: Facts,
    /// Whether the run has `read_result`, so shortened results can point to it.
    reads_back: bool,
    user_texts: Vec<String>,
    version: u64,
    compacted_at: Option<u64>,
}

impl std::fmt::Debug for Projector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Projector")
            .field("version", &self.version)
            .field("messages", &self.prompt.messages.len())
            .field("tokens", &self.tokens())
            .finish_non_exhaustive()
    }
}

/// The prompt of a whole log, with the default bounds and the o200k tokenizer.
pub fn project(system: &str, entries: &[Entry], tools: Vec<ToolSpec>) -> Prompt {
    let config = ContextConfig {
        system: system.to_owned(),
        ..ContextConfig::default()
    };
    let mut projector = Projector::new(config, tools, Arc::new(Tiktoken));
    for entry in entries {
        projector.apply(entry);
    }
    projector.prompt().clone()
}

impl Projector {
    /// An empty projection.
    pub fn new(
        config: ContextConfig,
        tools: Vec<ToolSpec>,
        counter: Arc<dyn TokenCounter>,
    ) -> Self {
        let tools_text = serde_json::to_string(&tools).unwrap_or_default();
        let base_bytes = config.system.len() + tools_text.len();
        let reads_back = tools.iter().any(|t| t.name == READ_RESULT);
        Projector {
            prompt: Prompt {
                system: config.system.clone(),
                messages: Vec::new(),
                tools,
            },
            config,
            counter,
            message_bytes: Vec::new(),
            message_tokens: Vec::new(),
            base_bytes,
            base_tokens: OnceLock::new(),
            tools_text,
            provisional: false,
            open_calls: Vec::new(),
            results: Vec::new(),
            notes: Vec::new(),
            result_messages: VecDeque::new(),
            facts: Facts::new(reads_back),
            reads_back,
            user_texts: Vec::new(),
            version: 0,
            compacted_at: None,
        }
    }

    /// The prompt the next model call gets.
    pub fn prompt(&self) -> &Prompt {
        &self.prompt
    }

    /// Its estimated size in tokens.
    pub fn tokens(&self) -> usize {
        self.base_tokens()
            + self
                .message_tokens
                .iter()
                .zip(&self.prompt.messages)
                .map(|(tokens, message)| {
                    *tokens.get_or_init(|| message_tokens(self.counter.as_ref(), message))
                })
                .sum::<usize>()
    }

    /// Tokens of the system text and the tool specs.
    fn base_tokens(&self) -> usize {
        *self.base_tokens.get_or_init(|| {
            self.counter.count(&self.config.system) + self.counter.count(&self.tools_text)
        })
    }

    /// Its size in bytes, which no token count exceeds.
    fn bytes(&self) -> usize {
        self.base_bytes + self.message_bytes.iter().sum::<usize>()
    }

    /// The last version applied.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The configuration.
    pub fn config(&self) -> &ContextConfig {
        &self.config
    }

    /// The facts block as it stands.
    pub fn facts(&self) -> String {
        self.facts.render()
    }

    /// Whether the prompt passed the compaction threshold and has not just been compacted.
    pub fn should_compact(&self) -> bool {
        let threshold = self.config.context_window as f64 * self.config.compact_at;
        self.compacted_at != Some(self.version)
            && self.bytes() as f64 > threshold
            && self.tokens() as f64 > threshold
    }

    /// Applies the next committed entry.
    pub fn apply(&mut self, entry: &Entry) {
        self.drop_provisional();
        self.version = entry.version;
        self.facts.apply(entry);
        match &entry.event {
            Event::RunStarted { goal, .. } => {
                self.user_texts.push(goal.clone());
                self.push(Message::user_text(goal.clone()));
            }
            Event::DecisionProposed { decision, .. } => {
                self.close_turn();
                self.assistant(decision);
            }
            Event::DecisionRejected { raw, problem, .. } => {
                self.close_turn();
                let raw = if raw.trim().is_empty() {
                    "(empty reply)"
                } else {
                    raw
                };
                self.push(Message::assistant_text(raw));
                self.notes.push(format!(
                    "Your reply was not a valid decision: {problem}. Reply with tool calls or a \
                     final answer."
                ));
            }
            Event::ModelFailed { .. } => self.close_turn(),
            Event::CallRejected { result, .. } | Event::ToolFinished { result, .. } => {
                self.results
                    .push((result.call_id.clone(), entry.version, result_part(result)));
            }
            Event::CorrectionIssued {
                message, call_ids, ..
            } => {
                for id in call_ids {
                    let name = self.call_name(id);
                    let part = Part::ToolResult {
                        call_id: id.clone(),
                        name,
                        ok: false,
                        content: "not run: this plan was repeated".to_owned(),
                    };
                    self.results.push((id.clone(), entry.version, part));
                }
                self.notes.push(message.clone());
            }
            Event::ApprovalGranted { call_ids } if call_ids.is_empty() => {
                self.notes
                    .push("A person approved your request. Go ahead.".to_owned());
            }
            Event::ApprovalDenied { call_ids, reason } => {
                if call_ids.is_empty() {
                    self.notes.push(format!(
                        "A person did not approve your request ({reason}). Find another way or \
                         give your final answer."
                    ));
                }
                // The person's own words survive compactions.
                self.user_texts.push(reason.clone());
            }
            Event::UserMessage { text, .. } => {
                // The person's words, in their place: after the results the run ended with
                // (in the same message, so roles still alternate), or after the model's
                // last reply.
                self.close_turn();
                self.user_texts.push(text.clone());
                self.user_said(text);
            }
            Event::ContextCompacted { summary, .. } => self.compact(summary),
            // Effects are bookkeeping; what the model learns of a call is its result.
            Event::EffectDispatched { .. }
            | Event::EffectReconciled { .. }
            | Event::ResolutionRequested { .. }
            | Event::EffectResolved { .. }
            | Event::ModelRetried { .. }
            | Event::ApprovalRequested { .. }
            | Event::ApprovalGranted { .. }
            | Event::RunEnded { .. } => {}
        }
        self.render_provisional();
    }

    fn assistant(&mut self, decision: &Decision) {
        let mut parts = Vec::new();
        let text = match decision {
            Decision::Final { answer } => Some(answer.clone()),
            Decision::ToolCalls { .. } => None,
            Decision::RequestApproval { summary, .. } => {
                Some(format!("I ask a person's approval: {summary}"))
            }
            Decision::Clarification { question } => Some(question.clone()),
            Decision::CannotContinue { reason } => Some(format!("I cannot continue: {reason}")),
        };
        if let Some(text) = text {
            parts.push(Part::Text { text });
        }
        for call in decision.calls() {
            parts.push(Part::ToolUse {
                call_id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            });
        }
        self.open_calls = decision.calls().to_vec();
        self.push(Message {
            role: Role::Assistant,
            parts,
        });
    }

    /// The user message that answers the latest assistant message: a result part for
    /// every call, in the model's order, then the notes. Returns the versions of results.
    fn answer_parts(&self) -> (Vec<Part>, Vec<(CallId, u64)>) {
        let mut parts = Vec::new();
        let mut versions = Vec::new();
        for call in &self.open_calls {
            match self.results.iter().find(|(id, _, _)| *id == call.id) {
                Some((id, version, part)) => {
                    parts.push(part.clone());
                    versions.push((id.clone(), *version));
                }
                None => parts.push(Part::ToolResult {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    ok: false,
                    content: "not run: no result was recorded for this call".to_owned(),
                }),
            }
        }
        self.apply_turn_budget(&mut parts, &versions);
        parts.extend(
            self.notes
                .iter()
                .map(|text| Part::Text { text: text.clone() }),
        );
        (parts, versions)
    }

    /// Keeps one turn's results under the budget, cutting the largest first.
    fn apply_turn_budget(&self, parts: &mut [Part], versions: &[(CallId, u64)]) {
        let size = |p: &Part| match p {
            Part::ToolResult { content, .. } => content.chars().count(),
            _ => 0,
        };
        let mut total: usize = parts.iter().map(size).sum();
        while total > self.config.turn_result_budget {
            let Some((i, _)) = parts
                .iter()
                .enumerate()
                .filter(|(_, p)| size(p) > self.config.preview_bytes + 400)
                .max_by_key(|(i, p)| (size(p), std::cmp::Reverse(*i)))
            else {
                break;
            };
            if let Part::ToolResult {
                call_id, content, ..
            } = &mut parts[i]
            {
                let version = versions
                    .iter()
                    .find(|(id, _)| id == call_id)
                    .map_or(0, |(_, v)| *v);
                let before = content.chars().count();
                let head = head_bytes(content, self.config.preview_bytes);
                let left_out = before - head.chars().count();
                let budget = self.config.turn_result_budget;
                *content = if self.reads_back {
                    format!(
                        "{head}\n[{left_out} characters of this result left out: one turn's \
                         results stay under {budget} characters; read it whole with \
                         {READ_RESULT} handle \"{}\"]",
                        Handle::Log(version)
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

    fn close_turn(&mut self) {
        if self.open_calls.is_empty() && self.notes.is_empty() {
            self.results.clear();
            return;
        }
        let (parts, versions) = self.answer_parts();
        self.open_calls.clear();
        self.results.clear();
        self.notes.clear();
        let index = self.prompt.messages.len();
        self.push(Message {
            role: Role::User,
            parts,
        });
        if !versions.is_empty() {
            self.result_messages
                .push_back(ResultMessage { index, versions });
        }
        while self.result_messages.len() > self.config.recent_result_turns {
            if let Some(old) = self.result_messages.pop_front() {
                self.mask(&old);
            }
        }
    }

    /// Shows an older turn's long results by their head and a handle.
    fn mask(&mut self, old: &ResultMessage) {
        let keep = self.config.masked_result_chars;
        let Some(message) = self.prompt.messages.get_mut(old.index) else {
            return;
        };
        for part in &mut message.parts {
            if let Part::ToolResult {
                call_id, content, ..
            } = part
            {
                let total = content.chars().count();
                if total <= keep + 100 {
                    continue;
                }
                let version = old
                    .versions
                    .iter()
                    .find(|(id, _)| id == call_id)
                    .map_or(0, |(_, v)| *v);
                let head: String = content.chars().take(keep).collect();
                let more = total - keep;
                *content = if self.reads_back {
                    format!(
                        "{head}…\n[older result, {more} more characters: {READ_RESULT} handle \
                         \"{}\"]",
                        Handle::Log(version)
                    )
                } else {
                    format!("{head}…\n[older result, {more} more characters not shown]")
                };
            }
        }
        let bytes = message_bytes(message);
        self.message_bytes[old.index] = bytes;
        self.message_tokens[old.index] = OnceLock::new();
    }

    fn render_provisional(&mut self) {
        if self.open_calls.is_empty() && self.notes.is_empty() {
            return;
        }
        let (parts, _) = self.answer_parts();
        self.push(Message {
            role: Role::User,
            parts,
        });
        self.provisional = true;
    }

    fn drop_provisional(&mut self) {
        if self.provisional {
            self.prompt.messages.pop();
            self.message_tokens.pop();
            self.message_bytes.pop();
            self.provisional = false;
        }
    }

    fn user_said(&mut self, text: &str) {
        let part = Part::Text {
            text: text.to_owned(),
        };
        match self.prompt.messages.last_mut() {
            Some(last) if last.role == Role::User => {
                last.parts.push(part);
                let index = self.prompt.messages.len() - 1;
                self.message_bytes[index] = message_bytes(&self.prompt.messages[index]);
                self.message_tokens[index] = OnceLock::new();
            }
            _ => self.push(Message {
                role: Role::User,
                parts: vec![part],
            }),
        }
    }

    fn push(&mut self, message: Message) {
        self.message_bytes.push(message_bytes(&message));
        self.message_tokens.push(OnceLock::new());
        self.prompt.messages.push(message);
    }

    /// The one message a compaction leaves: the person's messages (newest first within
    /// the budget, the oldest kept one cut), the summary and the facts.
    fn compacted_message(&self, summary: &str) -> Message {
        let mut kept = Vec::new();
        let mut budget = self.config.kept_user_tokens;
        for text in self.user_texts.iter().rev() {
            let tokens = self.counter.count(text);
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
            text: if self.reads_back {
                format!(
                    "{SUMMARY_PREFIX}\nResults mentioned here can be read again with \
                     {READ_RESULT}.\n{summary}"
                )
            } else {
                format!("{SUMMARY_PREFIX}\n{summary}")
            },
        });
        parts.push(Part::Text {
            text: self.facts.render(),
        });
        Message {
            role: Role::User,
            parts,
        }
    }

    /// The estimated prompt size if the history were compacted with `summary` now.
    pub fn tokens_after_compaction(&self, summary: &str) -> usize {
        self.base_tokens() + message_tokens(self.counter.as_ref(), &self.compacted_message(summary))
    }

    fn compact(&mut self, summary: &str) {
        let message = self.compacted_message(summary);
        self.prompt.messages.clear();
        self.message_tokens.clear();
        self.message_bytes.clear();
        self.result_messages.clear();
        self.open_calls.clear();
        self.results.clear();
        self.notes.clear();
        self.push(message);
        self.compacted_at = Some(self.version);
    }

    fn call_name(&self, id: &CallId) -> String {
        self.open_calls
            .iter()
            .find(|c| &c.id == id)
            .map(|c| c.name.clone())
            .unwrap_or_default()
    }
}

fn result_part(result: &ToolResult) -> Part {
    Part::ToolResult {
        call_id: result.call_id.clone(),
        name: result.name.clone(),
        ok: result.is_ok(),
        content: result.content(),
    }
}

/// The first `max` bytes of `text`, cut at a character boundary.
fn head_bytes(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
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

fn message_tokens(counter: &dyn TokenCounter, message: &Message) -> usize {
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
