//! agent-context's integration tests: projections of hand-written logs (snapshots of the
//! exact prompt, pairing rules, masking, compaction) and of conversations.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod conversation;
mod projection;

use agent_core::*;

/// A log written by hand, entry by entry.
pub struct Log(pub Vec<Entry>);

impl Log {
    pub fn new(goal: &str) -> Log {
        let mut log = Log(Vec::new());
        log.push(Event::RunStarted {
            run_id: "run-1".into(),
            goal: goal.into(),
            manifest: Manifest {
                runtime_version: "test".into(),
                provider: "script".into(),
                model: "m".into(),
                system_prompt_digest: String::new(),
                tool_schema_digest: String::new(),
                budget: Budget::default(),
                tools: Vec::new(),
                answer: None,
                forked_from: None,
                parent: None,
                workspace: None,
                sandbox: None,
            },
        });
        log
    }
    pub fn push(&mut self, event: Event) -> &mut Self {
        let version = self.0.len() as u64 + 1;
        self.0.push(Entry {
            version,
            at_ms: version * 10,
            event,
        });
        self
    }
    pub fn calls(&mut self, turn: u32, calls: Vec<ToolCall>) -> &mut Self {
        self.push(Event::DecisionProposed {
            turn,
            decision: Decision::ToolCalls { calls },
            usage: Usage::default(),
            reasoning: Vec::new(),
        })
    }
    pub fn finished(&mut self, turn: u32, result: ToolResult) -> &mut Self {
        self.push(Event::ToolFinished {
            turn,
            result,
            effect_key: None,
        })
    }
}

/// Every tool call is answered by a result in the next message, and every result answers
/// a call.
pub fn pairs_every_call(prompt: &Prompt) {
    for (i, message) in prompt.messages.iter().enumerate() {
        for part in &message.parts {
            if let Part::ToolUse { call_id, .. } = part {
                let next = &prompt.messages[i + 1];
                assert_eq!(next.role, Role::User);
                let n = next
                    .parts
                    .iter()
                    .filter(|p| matches!(p, Part::ToolResult { call_id: id, .. } if id == call_id))
                    .count();
                assert_eq!(n, 1, "call {call_id} is answered once in the next message");
            }
        }
    }
}
