//! A kit for snapshot tests of a projection (feature `testing`): a terse builder of event
//! logs, and the prompt as stable, readable text.
//!
//! ```
//! use agent_context::testing::{LogBuilder, snapshot_text};
//! use agent_context::project;
//! use serde_json::json;
//!
//! let log = LogBuilder::new("Summarize notes.txt")
//!     .calls(&[("c1", "read_file", json!({"path": "notes.txt"}))])
//!     .ok("c1", "read_file", "Launch on Thursday.")
//!     .answer("The launch is on Thursday.")
//!     .build();
//! let text = snapshot_text(&project("You are a test agent.", &log, vec![]));
//! assert!(text.contains("[tool result c1, ok]\nLaunch on Thursday."));
//! // insta::assert_snapshot!(text);
//! ```

use agent_core::{
    Budget, Decision, Entry, ErrorKind, Event, Manifest, Outcome, Prompt, TerminalReason, ToolCall,
    ToolError, ToolResult, Usage,
};
use serde_json::Value;

use crate::render::PromptText;

/// Builds a run's event log a line per event: versions, times and turn numbers follow by
/// themselves (one second apart), so a test states only what happened.
#[derive(Clone, Debug)]
pub struct LogBuilder {
    entries: Vec<Entry>,
    turn: u32,
}

impl LogBuilder {
    /// A run started with `goal` and the default budget.
    pub fn new(goal: &str) -> LogBuilder {
        LogBuilder::with_budget(goal, Budget::default())
    }

    /// A run started with `goal` and `budget`.
    pub fn with_budget(goal: &str, budget: Budget) -> LogBuilder {
        let manifest = Manifest {
            runtime_version: "test".into(),
            provider: "script".into(),
            model: "test".into(),
            system_prompt_digest: String::new(),
            tool_schema_digest: String::new(),
            budget,
            tools: Vec::new(),
            answer: None,
            forked_from: None,
            parent: None,
            workspace: None,
            sandbox: None,
        };
        LogBuilder {
            entries: Vec::new(),
            turn: 0,
        }
        .event(Event::RunStarted {
            run_id: "run-1".into(),
            goal: goal.into(),
            manifest,
        })
    }

    /// Appends any event.
    pub fn event(mut self, event: Event) -> LogBuilder {
        let version = self.entries.len() as u64 + 1;
        self.entries.push(Entry {
            version,
            at_ms: version * 1_000,
            event,
        });
        self
    }

    fn decide(mut self, decision: Decision) -> LogBuilder {
        self.turn += 1;
        let turn = self.turn;
        self.event(Event::DecisionProposed {
            turn,
            decision,
            usage: Usage::default(),
            reasoning: Vec::new(),
        })
    }

    /// The model's next turn: these calls, as `(id, tool, arguments)`.
    pub fn calls(self, calls: &[(&str, &str, Value)]) -> LogBuilder {
        let calls = calls
            .iter()
            .map(|(id, name, arguments)| ToolCall::new(*id, *name, arguments.clone()))
            .collect();
        self.decide(Decision::ToolCalls { calls })
    }

    /// A call of the latest turn ran and returned `output`.
    pub fn ok(self, id: &str, tool: &str, output: &str) -> LogBuilder {
        let turn = self.turn;
        self.event(Event::ToolFinished {
            turn,
            result: ToolResult::ok(id.into(), tool, output),
            effect_key: None,
        })
    }

    /// A call of the latest turn ran and failed.
    pub fn failed(self, id: &str, tool: &str, kind: ErrorKind, message: &str) -> LogBuilder {
        let turn = self.turn;
        self.event(Event::ToolFinished {
            turn,
            result: ToolResult::error(id.into(), tool, ToolError::new(kind, message)),
            effect_key: None,
        })
    }

    /// The model's next turn: a final answer, and the run completes.
    pub fn answer(self, text: &str) -> LogBuilder {
        self.decide(Decision::Final {
            answer: text.into(),
        })
        .event(Event::RunEnded {
            outcome: Outcome::completed(text),
        })
    }

    /// The model's next turn: a question for the person; the run pauses.
    pub fn asks(self, question: &str) -> LogBuilder {
        self.decide(Decision::Clarification {
            question: question.into(),
        })
        .event(Event::RunEnded {
            outcome: Outcome::stop(TerminalReason::ClarificationRequired, question),
        })
    }

    /// The person says something: an answer, or a follow-up.
    pub fn say(self, text: &str) -> LogBuilder {
        self.event(Event::UserMessage {
            text: text.into(),
            budget: None,
        })
    }

    /// The history so far is compacted into `summary`.
    pub fn compacted(self, summary: &str) -> LogBuilder {
        let through_version = self.entries.len() as u64;
        self.event(Event::ContextCompacted {
            summary: summary.into(),
            through_version,
            tokens_before: 0,
            tokens_after: 0,
            usage: agent_core::Usage::default(),
            window: None,
        })
    }

    /// The log.
    pub fn build(self) -> Vec<Entry> {
        self.entries
    }
}

/// The prompt as text (the format of `agent context`), with what differs from run to run
/// replaced: blob hashes become `blob:sha256:…`. Stable, so a snapshot of it changes only
/// when the projection does.
pub fn snapshot_text(prompt: &Prompt) -> String {
    redact_hashes(&PromptText(prompt).to_string())
}

fn redact_hashes(text: &str) -> String {
    const MARK: &str = agent_core::BLOB_PREFIX;
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        let (before, after) = rest.split_at(at + MARK.len());
        out.push_str(before);
        let hex = after.bytes().take_while(u8::is_ascii_hexdigit).count();
        if hex == 64 {
            out.push('…');
            rest = &after[hex..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_hashes_are_redacted_and_nothing_else() {
        let hash = "ab".repeat(32);
        let text = format!("see blob:sha256:{hash} and blob:sha256:short and log:3");
        assert_eq!(
            redact_hashes(&text),
            "see blob:sha256:… and blob:sha256:short and log:3"
        );
    }

    #[test]
    fn the_builder_numbers_versions_and_turns() {
        let log = LogBuilder::new("g")
            .calls(&[("c1", "read_file", serde_json::json!({}))])
            .ok("c1", "read_file", "x")
            .answer("done")
            .say("more?")
            .answer("no")
            .build();
        let versions: Vec<u64> = log.iter().map(|e| e.version).collect();
        assert_eq!(versions, (1..=8).collect::<Vec<_>>());
        let turns: Vec<u32> = log
            .iter()
            .filter_map(|e| match e.event {
                Event::DecisionProposed { turn, .. } => Some(turn),
                _ => None,
            })
            .collect();
        assert_eq!(turns, [1, 2, 3]);
        agent_core::RunState::fold(&log).expect("a built log folds");
    }
}
