//! The runtime facts block: what was done, rebuilt from the log, never from a summary.

use std::collections::BTreeSet;

use agent_core::{Budget, Decision, Entry, Event, ToolCall, ToolResult, canonical_json};

/// Side-effect actions listed at most (the oldest are counted, not listed).
const MAX_ACTIONS: usize = 60;
/// Tool calls repeated verbatim at the end of the block.
const LAST_CALLS: usize = 5;
/// Characters of a result quoted in the block.
const EXCERPT: usize = 200;

/// Facts accumulated event by event.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    /// Whether the run has `read_result` to read stored results with.
    reads_back: bool,
    goal: String,
    budget: Budget,
    steps: u32,
    tool_calls: u32,
    /// Model calls and tool calls before the current exchange (step and tool-call limits
    /// count per exchange).
    exchange_steps: u32,
    exchange_tool_calls: u32,
    tokens: u64,
    calls: Vec<ToolCall>,
    actions: Vec<String>,
    files: BTreeSet<String>,
    handles: BTreeSet<String>,
    last: Vec<String>,
}

fn excerpt(text: &str) -> String {
    let line = text.lines().next().unwrap_or("");
    let mut out: String = line.chars().take(EXCERPT).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

impl Facts {
    /// Empty facts; `reads_back` when the run has `read_result`.
    pub fn new(reads_back: bool) -> Facts {
        Facts {
            reads_back,
            ..Facts::default()
        }
    }

    /// Takes one event into account.
    pub fn apply(&mut self, entry: &Entry) {
        match &entry.event {
            Event::RunStarted { goal, manifest, .. } => {
                self.goal.clone_from(goal);
                self.budget = manifest.budget.clone();
            }
            Event::DecisionProposed {
                decision, usage, ..
            } => {
                self.steps += 1;
                self.tokens = self.tokens.saturating_add(usage.total_tokens());
                if let Decision::ToolCalls { calls } | Decision::RequestApproval { calls, .. } =
                    decision
                {
                    self.calls.extend(calls.iter().cloned());
                }
            }
            Event::DecisionRejected { usage, .. } => {
                self.steps += 1;
                self.tokens = self.tokens.saturating_add(usage.total_tokens());
            }
            Event::ModelFailed { .. } => self.steps += 1,
            Event::ToolFinished {
                turn,
                result,
                effect_key,
            } => {
                self.tool_calls += 1;
                self.record(*turn, result, effect_key.as_deref());
            }
            Event::CallRejected { turn, result } => self.record(*turn, result, None),
            Event::UserMessage { budget, .. } => {
                self.exchange_steps = self.steps;
                self.exchange_tool_calls = self.tool_calls;
                if let Some(budget) = budget {
                    self.budget = budget.clone();
                }
            }
            _ => {}
        }
    }

    fn record(&mut self, turn: u32, result: &ToolResult, effect_key: Option<&str>) {
        let call = self.calls.iter().rev().find(|c| c.id == result.call_id);
        let args = call.map_or_else(String::new, |c| canonical_json(&c.arguments));
        let status = match result.error_kind() {
            None => "ok".to_owned(),
            Some(kind) => kind.as_str().to_owned(),
        };
        let content = result.content();
        self.handles.extend(
            agent_core::Handle::blobs_in(&content)
                .iter()
                .map(ToString::to_string),
        );
        if let Some(key) = effect_key {
            self.actions.push(format!(
                "- turn {turn}: {} {} {args} -> {status} (effect {key}; receipt: {})",
                result.call_id,
                result.name,
                excerpt(&content)
            ));
            if result.is_ok()
                && matches!(result.name.as_str(), "write_file" | "edit_file")
                && let Some(path) = call.and_then(|c| c.arguments.get("path")?.as_str())
            {
                self.files.insert(path.to_owned());
            }
        }
        self.last.push(format!(
            "- {} {} {args} -> {status}: {}",
            result.call_id,
            result.name,
            excerpt(&content)
        ));
        if self.last.len() > LAST_CALLS {
            self.last.remove(0);
        }
    }

    /// The block, as the model reads it.
    pub fn render(&self) -> String {
        let mut out = String::from("Runtime facts, rebuilt from the event log:\n");
        out.push_str(&format!("Goal: {}\n", self.goal));
        let reads = self.tool_calls as usize - self.actions.len().min(self.tool_calls as usize);
        out.push_str(&format!(
            "Tool calls run: {} ({} with side effects, {reads} reads).\n",
            self.tool_calls,
            self.actions.len()
        ));
        if !self.actions.is_empty() {
            out.push_str("Side effects done (call, tool, arguments, outcome, effect key):\n");
            let skip = self.actions.len().saturating_sub(MAX_ACTIONS);
            if skip > 0 {
                out.push_str(&format!("- ({skip} earlier ones not listed)\n"));
            }
            for action in &self.actions[skip..] {
                out.push_str(action);
                out.push('\n');
            }
        }
        if !self.files.is_empty() {
            let files: Vec<&str> = self.files.iter().map(String::as_str).collect();
            out.push_str(&format!("Files written: {}\n", files.join(", ")));
        }
        if !self.handles.is_empty() {
            let handles: Vec<&str> = self.handles.iter().map(String::as_str).collect();
            let how = if self.reads_back {
                " (read them with read_result)"
            } else {
                ""
            };
            out.push_str(&format!("Stored results{how}: {}\n", handles.join(", ")));
        }
        let b = &self.budget;
        out.push_str(&format!(
            "Budgets left: {} of {} model calls, {} of {} tool calls",
            b.max_steps
                .saturating_sub(self.steps.saturating_sub(self.exchange_steps)),
            b.max_steps,
            b.max_tool_calls
                .saturating_sub(self.tool_calls.saturating_sub(self.exchange_tool_calls)),
            b.max_tool_calls
        ));
        if let Some(max) = b.max_tokens {
            out.push_str(&format!(
                ", {} of {max} tokens",
                max.saturating_sub(self.tokens)
            ));
        }
        out.push_str(".\n");
        if !self.last.is_empty() {
            out.push_str("Last tool calls:\n");
            for line in &self.last {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}
