//! The runtime facts block: what was done, rebuilt from the log, never from a summary.

use std::borrow::Cow;
use std::collections::{BTreeSet, VecDeque};

use agent_core::{Entry, Event, RunState, ToolOutcome, ToolResult, ToolSpec, canonical_json};

/// Side-effect actions listed at most (the oldest are counted, not listed).
const MAX_ACTIONS: usize = 60;
/// Tool calls repeated verbatim at the end of the block.
const LAST_CALLS: usize = 5;
/// Characters of a result quoted in the block.
const EXCERPT: usize = 200;

/// Facts accumulated event by event. The counts are the run's own state, folded as the
/// machine folds it; the block adds what was done, call by call.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    /// Whether the run has `read_result` to read stored results with.
    reads_back: bool,
    /// The tools whose main argument is a path: what their side effects wrote.
    path_tools: BTreeSet<String>,
    state: RunState,
    /// The latest side-effect actions, at most [`MAX_ACTIONS`]: the block lists no more,
    /// so no more are kept, however long the run.
    actions: VecDeque<String>,
    /// Side-effect actions in all.
    actions_total: usize,
    files: BTreeSet<String>,
    handles: BTreeSet<String>,
    last: VecDeque<String>,
}

fn excerpt(text: &str) -> String {
    crate::summarize::first_line(text, EXCERPT)
}

impl Facts {
    /// Empty facts for a run with `tools`.
    pub fn new(tools: &[ToolSpec]) -> Facts {
        Facts {
            reads_back: tools.iter().any(|t| t.name == "read_result"),
            path_tools: tools
                .iter()
                .filter(|t| t.main_argument.as_deref() == Some("path"))
                .map(|t| t.name.clone())
                .collect(),
            state: RunState::for_display(),
            ..Facts::default()
        }
    }

    /// The run's state, folded from the events applied so far.
    pub fn state(&self) -> &RunState {
        &self.state
    }

    /// Takes one event into account.
    pub fn apply(&mut self, entry: &Entry) {
        // A log the fold refuses is still shown as far as it goes; the runtime never runs
        // one.
        let _ = self.state.apply(entry);
        match &entry.event {
            Event::ToolFinished {
                turn,
                result,
                effect_key,
            } => self.record(*turn, result, effect_key.as_deref()),
            Event::CallRejected { turn, result } => self.record(*turn, result, None),
            _ => {}
        }
    }

    fn record(&mut self, turn: u32, result: &ToolResult, effect_key: Option<&str>) {
        // A result answers a call of the latest decision.
        let call = self
            .state
            .turn_calls
            .iter()
            .find(|c| c.id == result.call_id);
        let args = call.map_or_else(String::new, |c| canonical_json(&c.arguments));
        let status = match result.error_kind() {
            None => "ok",
            Some(kind) => kind.as_str(),
        };
        // The output as it is; an error's text is made.
        let content = match &result.outcome {
            ToolOutcome::Output(text) => Cow::Borrowed(text.as_str()),
            ToolOutcome::Error(_) => Cow::Owned(result.content()),
        };
        self.handles.extend(
            agent_core::Handle::blobs_in(&content)
                .iter()
                .map(ToString::to_string),
        );
        if let Some(key) = effect_key {
            self.actions_total += 1;
            if self.actions.len() == MAX_ACTIONS {
                self.actions.pop_front();
            }
            self.actions.push_back(format!(
                "- turn {turn}: {} {} {args} -> {status} (effect {key}; receipt: {})",
                result.call_id,
                result.name,
                excerpt(&content)
            ));
            if result.is_ok()
                && self.path_tools.contains(&result.name)
                && let Some(path) = call.and_then(|c| c.arguments.get("path")?.as_str())
            {
                self.files.insert(path.to_owned());
            }
        }
        if self.last.len() == LAST_CALLS {
            self.last.pop_front();
        }
        let mut line = String::with_capacity(args.len() + result.name.len() + EXCERPT + 48);
        for piece in [
            "- ",
            result.call_id.as_str(),
            " ",
            &result.name,
            " ",
            &args,
            " -> ",
            status,
            ": ",
            &excerpt(&content),
        ] {
            line.push_str(piece);
        }
        self.last.push_back(line);
    }

    /// The block, as the model reads it.
    pub fn render(&self) -> String {
        let mut out = String::from("Runtime facts, rebuilt from the event log:\n");
        let state = &self.state;
        out.push_str(&format!("Goal: {}\n", state.goal));
        let reads = state.tool_calls as usize - self.actions_total.min(state.tool_calls as usize);
        out.push_str(&format!(
            "Tool calls run: {} ({} with side effects, {reads} reads).\n",
            state.tool_calls, self.actions_total
        ));
        if !self.actions.is_empty() {
            out.push_str("Side effects done (call, tool, arguments, outcome, effect key):\n");
            let skip = self.actions_total - self.actions.len();
            if skip > 0 {
                out.push_str(&format!("- ({skip} earlier ones not listed)\n"));
            }
            for action in &self.actions {
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
        let b = state.budget_in_force().unwrap_or_default();
        out.push_str(&format!(
            "Budgets left: {} of {} model calls, {} of {} tool calls",
            b.max_steps.saturating_sub(state.exchange_steps_used()),
            b.max_steps,
            b.max_tool_calls
                .saturating_sub(state.exchange_tool_calls_used()),
            b.max_tool_calls
        ));
        if let Some(max) = b.max_tokens {
            out.push_str(&format!(
                ", {} of {max} tokens",
                max.saturating_sub(state.usage.total_tokens())
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
