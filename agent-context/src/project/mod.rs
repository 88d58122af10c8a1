//! The projection: the log, applied event by event, into the prompt of the next model call.
//!
//! It is incremental: each event costs work in proportion to its own turn, and the prompt
//! and its token estimate are kept up to date, so building a prompt never walks the history.
//! Older tool results are shown masked (their head and a handle) once
//! `recent_result_turns` newer turns exist; the log keeps them whole, and `read_result`
//! reads them back. A `context_compacted` event replaces everything before it by the kept
//! user messages, the summary and a facts block rebuilt from the log.

mod compact;
mod mask;
mod size;

use std::collections::VecDeque;
use std::sync::Arc;

use agent_core::{
    CallId, Decision, Entry, Event, Message, Part, Prompt, Reasoning, Role, ToolResult, ToolSpec,
};

use crate::DEFAULT_SYSTEM_PROMPT;
use crate::facts::Facts;
use crate::summarize::{DEFAULT_SUMMARY_CHARS, Digest};
use crate::tokens::{DEFAULT_CONTEXT_WINDOW, Tiktoken, TokenCounter};
use mask::ResultMessage;
use size::Sizes;

/// The fixed prefix of a compaction summary, telling the model what it reads.
pub const SUMMARY_PREFIX: &str = "[Summary of earlier work. The conversation before this \
point was compacted to stay within the context window; this summary and the runtime facts \
below replace it.]";

/// The tool the projection points to for what it shows shortened; it is mentioned only
/// when the run has it.
const READ_RESULT: &str = "read_result";

/// Characters of a rejected reply shown back to the model with the problem: enough to see
/// what was wrong with it; the log keeps it whole. A reply refused for its size (a 2 MB
/// answer, thousands of calls) is not sent back, and billed, whole on the next call.
pub const REJECTED_REPLY_CHARS: usize = 4_000;

/// The smallest window [`Projector::window_at_most`] takes from a provider: as small as
/// `context_window` may be set, and smaller than any agent's system text and tools.
pub const MIN_LEARNED_WINDOW: usize = 1_000;

/// Default of [`ContextConfig::unmasked_result_chars`].
pub const DEFAULT_UNMASKED_RESULT_CHARS: usize = 12_000;

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
    /// Characters the results of older turns may take, shown whole, before they are
    /// masked together. Masking a result changes the prompt from that result on, which
    /// costs the provider's cache everything after it: masking in batches keeps the
    /// prompt's prefix the same from turn to turn, and breaks it once a batch. 0 masks a
    /// result as soon as it leaves the last `recent_result_turns` turns.
    pub unmasked_result_chars: usize,
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
            unmasked_result_chars: DEFAULT_UNMASKED_RESULT_CHARS,
            masked_result_chars: 100,
            turn_result_budget: 200_000,
            preview_bytes: agent_core::PREVIEW_BYTES,
            kept_user_tokens: 20_000,
        }
    }
}

/// The turn being answered: the calls of the latest assistant message, the results and
/// notes committed for it so far.
#[derive(Default)]
struct OpenTurn {
    /// The calls answered, by id and tool (their arguments are in the assistant message).
    calls: Vec<(CallId, String)>,
    results: Vec<(CallId, u64, Part)>,
    notes: Vec<String>,
    /// Whether the prompt ends with a provisional message answering it (replaced as more
    /// of the turn is committed).
    shown: bool,
}

/// The first result recorded for each call of a turn. Looked up in the list while the turn
/// is small, as most are; through a map once it is not, so that rendering a turn of a
/// thousand calls (which happens again as each of its results is committed) does not
/// compare every call with every result.
enum ResultIndex<'a> {
    Few(&'a [(CallId, u64, Part)]),
    Many(std::collections::HashMap<&'a CallId, &'a (CallId, u64, Part)>),
}

impl<'a> ResultIndex<'a> {
    /// Results up to which a list is searched.
    const FEW: usize = 16;

    fn of(results: &'a [(CallId, u64, Part)]) -> ResultIndex<'a> {
        if results.len() <= Self::FEW {
            return ResultIndex::Few(results);
        }
        let mut map = std::collections::HashMap::with_capacity(results.len());
        for result in results {
            map.entry(&result.0).or_insert(result);
        }
        ResultIndex::Many(map)
    }

    fn get(&self, id: &CallId) -> Option<&'a (CallId, u64, Part)> {
        match self {
            ResultIndex::Few(results) => results.iter().find(|(r, _, _)| r == id),
            ResultIndex::Many(map) => map.get(id).copied(),
        }
    }
}

impl OpenTurn {
    fn is_empty(&self) -> bool {
        self.calls.is_empty() && self.notes.is_empty()
    }

    fn clear(&mut self) {
        self.calls.clear();
        self.results.clear();
        self.notes.clear();
    }
}

/// The incremental projection of one run's log. Its jobs are in modules: building messages
/// here, their sizes in `size`, keeping results small in `mask`, compaction in `compact`.
pub struct Projector {
    config: ContextConfig,
    prompt: Prompt,
    sizes: Sizes,
    turn: OpenTurn,
    /// Closed turns whose results are still shown whole, oldest first.
    result_messages: VecDeque<ResultMessage>,
    facts: Facts,
    /// The extractive summary of the history since the last compaction, kept as entries
    /// are applied, so that compacting never reads the log back.
    digest: Digest,
    /// Whether the run has `read_result`, so shortened results can point to it.
    reads_back: bool,
    /// The person's own words (goal, messages, reasons), kept through compactions.
    user_texts: Vec<String>,
    version: u64,
    /// The version of the last `context_compacted` event applied.
    compacted_at: Option<u64>,
    /// The size at which a compaction was found not to help: none is tried again before
    /// the prompt grew past it by a tenth of the window.
    declined_at: Option<usize>,
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

/// Whether `event` closes the open turn: the model answered it (or failed to), or a person
/// spoke after it.
fn closes_turn(event: &Event) -> bool {
    matches!(
        event,
        Event::DecisionProposed { .. }
            | Event::DecisionRejected { .. }
            | Event::ModelFailed { .. }
            | Event::UserMessage { .. }
            | Event::UserNote { .. }
    )
}

/// The prompt of a whole log, with the default bounds and the o200k tokenizer.
pub fn project(system: &str, entries: &[Entry], tools: Vec<ToolSpec>) -> Prompt {
    let config = ContextConfig {
        system: system.to_owned(),
        ..ContextConfig::default()
    };
    let mut projector = Projector::new(config, tools, Arc::new(Tiktoken));
    projector.apply_all(entries);
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
        let reads_back = tools.iter().any(|t| t.name == READ_RESULT);
        let facts = Facts::new(&tools);
        Projector {
            sizes: Sizes::new(counter, &config.system, tools_text),
            prompt: Prompt {
                system: config.system.clone(),
                messages: Vec::new(),
                tools,
                answer_schema: None,
            },
            config,
            turn: OpenTurn::default(),
            result_messages: VecDeque::new(),
            facts,
            digest: Digest::new(DEFAULT_SUMMARY_CHARS),
            reads_back,
            user_texts: Vec::new(),
            version: 0,
            compacted_at: None,
            declined_at: None,
        }
    }

    /// The prompt the next model call gets.
    pub fn prompt(&self) -> &Prompt {
        &self.prompt
    }

    /// Its estimated size in tokens.
    pub fn tokens(&self) -> usize {
        self.sizes.tokens(&self.prompt.messages)
    }

    /// The last version applied.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Where the history a summary needs starts: the last `context_compacted` event (what
    /// came before it is in its summary), or the start of the log.
    pub fn summary_from(&self) -> u64 {
        self.compacted_at.unwrap_or(1)
    }

    /// The configuration.
    pub fn config(&self) -> &ContextConfig {
        &self.config
    }

    /// The extractive summary of the history since the last compaction (what
    /// [`extract`](crate::extract) makes of the log from [`summary_from`](Self::summary_from)).
    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    /// The facts block as it stands.
    pub fn facts(&self) -> String {
        self.facts.render()
    }

    /// Whether the prompt passed the compaction threshold and has not just been compacted.
    /// The tokens are counted only when no cheaper bound (the bytes, or the provider's
    /// count of the last prompt plus the bytes added since) settles it below the threshold.
    pub fn should_compact(&self) -> bool {
        let threshold = self.config.context_window as f64 * self.config.compact_at;
        let retry_above = self.declined_at.map_or(0.0, |tokens| {
            (tokens + self.config.context_window / 10) as f64
        });
        self.compacted_at != Some(self.version)
            && self.sizes.upper_bound() as f64 > threshold.max(retry_above)
            && self.tokens() as f64 > threshold.max(retry_above)
    }

    /// A compaction of the prompt at `tokens` would not have made it smaller: none is tried
    /// again (a summarizer may be a paid model call) before the prompt grew by a tenth of
    /// the window.
    pub fn compaction_declined(&mut self, tokens: usize) {
        self.declined_at = Some(tokens);
    }

    /// A number of tokens this prompt cannot exceed, found without a tokenizer: its bytes,
    /// or the provider's count of the last prompt plus the bytes added since.
    pub fn upper_bound(&self) -> usize {
        self.sizes.upper_bound()
    }

    /// A number of tokens the provider will count in the next prompt at the fewest: its
    /// count of the last prompt, when the prompt only grew since (nothing it counted was
    /// masked, compacted or removed), less the bytes of the reasoning that prompt held (a
    /// provider may leave an earlier turn's reasoning out of later prompts); 0 when there is
    /// no such count, or when the prompt may pass the compaction threshold (a compaction
    /// would make it smaller). No tokenizer is used. What the budgets check a call with
    /// before it is made.
    pub fn lower_bound(&self) -> usize {
        let threshold = self.config.context_window as f64 * self.config.compact_at;
        if self.sizes.upper_bound() as f64 > threshold {
            return 0;
        }
        self.sizes.lower_bound().unwrap_or(0)
    }

    /// A number of tokens the next prompt has at the fewest by the projector's own token
    /// counter (o200k's unless another was given), for a prompt no provider has counted
    /// anything like yet ([`Projector::lower_bound`] is 0: a run's first call, or the first
    /// after a compaction): half of what it counts, a margin for a provider whose tokenizer
    /// is another (those of the major providers count a text within a few tens of percent
    /// of o200k). 0 when the prompt may pass the compaction threshold (a compaction would
    /// make it smaller). The prompt's tokens are counted, which loads the tokenizer the
    /// first time: ask only when a decision depends on it.
    pub fn counted_lower_bound(&self) -> usize {
        let threshold = self.config.context_window as f64 * self.config.compact_at;
        if self.sizes.upper_bound() as f64 > threshold {
            return 0;
        }
        self.tokens() / 2
    }

    /// A number of tokens a summary request has at the fewest when it sends this prompt's
    /// messages whole under instructions of its own and no tools: [`Projector`]'s floor of
    /// the prompt as it stands (not 0 near the threshold: the summary is asked for there),
    /// less its system text and tools. 0 when there is no such count.
    pub fn summary_lower_bound(&self) -> usize {
        self.sizes.messages_lower_bound().unwrap_or(0)
    }

    /// The model's window is at most `tokens`: the provider refused a prompt as longer than
    /// its window, which was taken to be larger. The prompt is compacted as this window
    /// says from now on; a larger figure changes nothing, and none goes below
    /// [`MIN_LEARNED_WINDOW`] (a server's figure is not trusted to make every turn a
    /// compaction).
    pub fn window_at_most(&mut self, tokens: usize) {
        self.config.context_window = self
            .config
            .context_window
            .min(tokens.max(MIN_LEARNED_WINDOW));
    }

    /// The provider's counts of prompts may be of part of them (a server that counts only
    /// what it did not have cached, as Ollama does): none is taken as a prompt's size, so
    /// the bytes, or the tokenizer, say when to compact. Call it before applying entries.
    /// A provider that reports fewer tokens than it did for a prompt that only grew since
    /// is taken so without it.
    pub fn counts_may_be_partial(&mut self) {
        self.sizes.counts_may_be_partial();
    }

    /// The provider's counts of the prompts so far are no floor of the next one: they may
    /// have been another model's, with other tools or another system text (a run continued
    /// in another process, with other settings). The upper bound keeps them.
    pub fn forget_lower_bound(&mut self) {
        self.sizes.forget_floor();
    }

    /// Applies the next committed entry.
    pub fn apply(&mut self, entry: &Entry) {
        self.apply_one(entry);
        self.render_provisional();
    }

    /// Applies the next committed entries, a commit's or a whole log's: the prompt is what
    /// applying each in turn makes it, byte for byte, but the answer to a turn still open
    /// is rendered once at the end instead of after each entry (a turn of a thousand calls
    /// would otherwise render all its results again for each).
    pub fn apply_all<'e>(&mut self, entries: impl IntoIterator<Item = &'e Entry>) {
        // An event that closes the turn builds its answer as the provisional one was
        // built, from the turn as it stands, and counts it as added since the provider's
        // last count either way.
        for entry in entries {
            self.apply_one(entry);
        }
        self.render_provisional();
    }

    /// Applies an entry, leaving the open turn's answer unrendered.
    fn apply_one(&mut self, entry: &Entry) {
        // An event that closes the turn keeps its provisional answer as the answer (it is
        // what the answer would be built as); any other replaces it.
        if !closes_turn(&entry.event) {
            self.drop_provisional();
        }
        self.version = entry.version;
        self.facts.apply(entry);
        self.digest.apply(entry);
        match &entry.event {
            Event::RunStarted { goal, manifest, .. } => {
                self.prompt.answer_schema = manifest.answer.as_ref().and_then(|a| a.schema.clone());
                self.user_texts.push(goal.clone());
                self.push(Message::user_text(goal.clone()));
            }
            Event::DecisionProposed {
                decision,
                usage,
                reasoning,
                ..
            } => {
                self.counted(usage);
                self.close_turn();
                self.assistant(decision, reasoning);
            }
            Event::DecisionRejected {
                raw,
                problem,
                usage,
                ..
            } => {
                self.counted(usage);
                self.close_turn();
                let shown = if raw.trim().is_empty() {
                    "(empty reply)".to_owned()
                } else {
                    match raw.char_indices().nth(REJECTED_REPLY_CHARS) {
                        None => raw.clone(),
                        Some((cut, _)) => format!(
                            "{}\n[... {} more characters of this reply not shown ...]",
                            &raw[..cut],
                            raw[cut..].chars().count()
                        ),
                    }
                };
                self.push(Message::assistant_text(shown));
                self.turn.notes.push(format!(
                    "Your reply was not a valid decision: {problem}. Reply with tool calls or a \
                     final answer."
                ));
            }
            Event::AnswerRejected { problem, .. } => {
                self.turn.notes.push(format!(
                    "Your final answer was rejected, so the run is not done: {problem}\n\
                     Fix what failed and give your final answer again."
                ));
            }
            Event::ModelFailed { .. } => self.close_turn(),
            Event::CallRejected { result, .. } | Event::ToolFinished { result, .. } => {
                self.turn.results.push((
                    result.call_id.clone(),
                    entry.version,
                    result_part(result),
                ));
            }
            Event::CorrectionIssued {
                message, call_ids, ..
            } => {
                for id in call_ids {
                    // A repeated plan's calls: the latest turn's, as the run's state has them.
                    let name = self.facts.state().call_name(id);
                    let part = Part::ToolResult {
                        call_id: id.clone(),
                        name,
                        ok: false,
                        content: "not run: this plan was repeated".to_owned(),
                    };
                    self.turn.results.push((id.clone(), entry.version, part));
                }
                self.turn.notes.push(message.clone());
            }
            Event::ApprovalGranted { call_ids } if call_ids.is_empty() => {
                self.turn
                    .notes
                    .push("A person approved your request. Go ahead.".to_owned());
            }
            Event::ApprovalDenied { call_ids, reason } => {
                if call_ids.is_empty() {
                    self.turn.notes.push(format!(
                        "A person did not approve your request ({reason}). Find another way or \
                         give your final answer."
                    ));
                }
                // The person's own words survive compactions.
                self.user_texts.push(reason.clone());
            }
            Event::UserMessage { text, .. } | Event::UserNote { text } => {
                // The person's words, in their place: after the results the run ended with
                // (or those of the calls it ran when the person spoke from elsewhere), in
                // the same message so that roles still alternate, or after the model's
                // last reply.
                self.close_turn();
                self.user_texts.push(text.clone());
                self.user_said(text);
            }
            Event::ContextCompacted {
                summary, window, ..
            } => {
                // A window the provider showed to be smaller holds from here on.
                if let Some(window) = window {
                    self.window_at_most(usize::try_from(*window).unwrap_or(usize::MAX));
                }
                self.compact(summary);
            }
            // The prompt stays as it is; the next try waits until it grew.
            Event::CompactionDeclined { tokens_before, .. } => {
                self.compaction_declined(usize::try_from(*tokens_before).unwrap_or(usize::MAX));
            }
            // Effects are bookkeeping; what the model learns of a call is its result.
            Event::EffectDispatched { .. }
            | Event::SubAgentFinished { .. }
            | Event::EffectReconciled { .. }
            | Event::ResolutionRequested { .. }
            | Event::EffectResolved { .. }
            | Event::ModelRetried { .. }
            | Event::ApprovalRequested { .. }
            | Event::ApprovalGranted { .. }
            | Event::RunResumed {}
            | Event::RunEnded { .. } => {}
        }
    }

    fn assistant(&mut self, decision: &Decision, reasoning: &[Reasoning]) {
        // What the model thought comes first, as its provider gave it and wants it back.
        // Sized exactly: the prompt keeps every message until a compaction, and a vector
        // grown by pushes holds room for four parts.
        let mut parts: Vec<Part> = Vec::with_capacity(reasoning.len() + 1 + decision.calls().len());
        parts.extend(reasoning.iter().map(|r| Part::Reasoning {
            reasoning: r.clone(),
        }));
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
                arguments: agent_core::Arguments::new(&call.arguments),
            });
        }
        self.turn.calls = decision
            .calls()
            .iter()
            .map(|c| (c.id.clone(), c.name.clone()))
            .collect();
        self.push(Message {
            role: Role::Assistant,
            parts,
        });
    }

    /// The user message that answers the latest assistant message: a result part for
    /// every call, in the model's order, then the notes. Returns the versions of results.
    fn answer_parts(&self) -> (Vec<Part>, Vec<(CallId, u64)>) {
        // Sized exactly, as the assistant's message is.
        let mut parts = Vec::with_capacity(self.turn.calls.len() + self.turn.notes.len());
        let mut versions = Vec::with_capacity(self.turn.calls.len());
        let results = ResultIndex::of(&self.turn.results);
        for (call_id, name) in &self.turn.calls {
            match results.get(call_id) {
                Some((id, version, part)) => {
                    parts.push(part.clone());
                    versions.push((id.clone(), *version));
                }
                None => parts.push(Part::ToolResult {
                    call_id: call_id.clone(),
                    name: name.clone(),
                    ok: false,
                    content: "not run: no result was recorded for this call".to_owned(),
                }),
            }
        }
        mask::turn_budget(&self.config, self.reads_back, &mut parts, &versions);
        parts.extend(
            self.turn
                .notes
                .iter()
                .map(|text| Part::Text { text: text.clone() }),
        );
        (parts, versions)
    }

    /// The versions of the results the answer to the latest assistant message shows.
    fn answer_versions(&self) -> Vec<(CallId, u64)> {
        let results = ResultIndex::of(&self.turn.results);
        self.turn
            .calls
            .iter()
            .filter_map(|(call_id, _)| {
                let (id, version, _) = results.get(call_id)?;
                Some((id.clone(), *version))
            })
            .collect()
    }

    /// The provider's count of the prompt a reply answered (an estimate of ours is no
    /// count, neither upper nor lower bound: none is kept).
    fn counted(&mut self, usage: &agent_core::Usage) {
        self.sizes.reported(if usage.estimated {
            0
        } else {
            usage.input_tokens
        });
    }

    fn close_turn(&mut self) {
        if self.turn.is_empty() {
            self.turn.results.clear();
            return;
        }
        let index;
        let versions;
        if self.turn.shown {
            // The provisional answer, rendered from the turn as it stands, becomes the
            // answer: the same message, not built again.
            self.turn.shown = false;
            self.sizes.kept_last();
            index = self.prompt.messages.len() - 1;
            versions = self.answer_versions();
        } else {
            let (parts, built) = self.answer_parts();
            index = self.prompt.messages.len();
            self.push(Message {
                role: Role::User,
                parts,
            });
            versions = built;
        }
        self.turn.clear();
        if !versions.is_empty() {
            let chars = mask::maskable_chars(&self.config, &self.prompt.messages[index]);
            self.result_messages.push_back(ResultMessage {
                index,
                versions,
                chars,
            });
        }
        let recent = self.config.recent_result_turns;
        let older: usize = self
            .result_messages
            .iter()
            .rev()
            .skip(recent)
            .map(|m| m.chars)
            .sum();
        // All older results at once, when they pass their allowance.
        if older > self.config.unmasked_result_chars {
            while self.result_messages.len() > recent {
                if let Some(old) = self.result_messages.pop_front()
                    && let Some(message) = self.prompt.messages.get_mut(old.index)
                {
                    mask::mask(&self.config, self.reads_back, message, &old);
                    self.sizes.changed(old.index, message);
                }
            }
        }
    }

    fn render_provisional(&mut self) {
        if self.turn.is_empty() {
            return;
        }
        let (parts, _) = self.answer_parts();
        self.push(Message {
            role: Role::User,
            parts,
        });
        self.turn.shown = true;
    }

    fn drop_provisional(&mut self) {
        if self.turn.shown {
            self.prompt.messages.pop();
            self.sizes.popped();
            self.turn.shown = false;
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
                self.sizes.changed(index, &self.prompt.messages[index]);
            }
            _ => self.push(Message {
                role: Role::User,
                parts: vec![part],
            }),
        }
    }

    fn push(&mut self, message: Message) {
        self.sizes.pushed(&message);
        self.prompt.messages.push(message);
    }

    fn compacted_message(&self, summary: &str) -> Message {
        compact::compacted_message(
            &self.config,
            &self.sizes,
            &self.user_texts,
            self.reads_back,
            summary,
            self.facts.render(),
        )
    }

    /// The estimated prompt size if the history were compacted with `summary` now.
    pub fn tokens_after_compaction(&self, summary: &str) -> usize {
        self.sizes.base_tokens() + self.sizes.of(&self.compacted_message(summary))
    }

    fn compact(&mut self, summary: &str) {
        let message = self.compacted_message(summary);
        self.prompt.messages.clear();
        self.sizes.cleared();
        self.sizes.forget_reported();
        self.result_messages.clear();
        self.turn.clear();
        self.push(message);
        self.compacted_at = Some(self.version);
        self.declined_at = None;
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
