//! Projections of hand-written logs: snapshots of the exact prompt, and pairing rules.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use agent_context::{DEFAULT_SYSTEM_PROMPT, project};
use agent_core::*;
use serde_json::json;

struct Log(Vec<Entry>);

impl Log {
    fn new(goal: &str) -> Log {
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
            },
        });
        log
    }
    fn push(&mut self, event: Event) -> &mut Self {
        let version = self.0.len() as u64 + 1;
        self.0.push(Entry {
            version,
            at_ms: version * 10,
            event,
        });
        self
    }
    fn calls(&mut self, turn: u32, calls: Vec<ToolCall>) -> &mut Self {
        self.push(Event::DecisionProposed {
            turn,
            decision: Decision::ToolCalls { calls },
            usage: Usage::default(),
        })
    }
    fn finished(&mut self, turn: u32, result: ToolResult) -> &mut Self {
        self.push(Event::ToolFinished {
            turn,
            result,
            effect_key: None,
        })
    }
}

fn pairs_every_call(prompt: &Prompt) {
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

#[test]
fn a_plain_run_with_a_partial_failure() {
    let mut log = Log::new("Summarize notes.txt");
    log.calls(
        1,
        vec![
            ToolCall::new("c1", "read_file", json!({"path": "notes.txt"})),
            ToolCall::new("c2", "read_file", json!({"path": "missing.txt"})),
        ],
    )
    .finished(1, ToolResult::ok("c1".into(), "read_file", "     1\thello"))
    .finished(
        1,
        ToolResult::error(
            "c2".into(),
            "read_file",
            ToolError::new(ErrorKind::ExecutionFailed, "missing.txt: no such file"),
        ),
    );
    let prompt = project(DEFAULT_SYSTEM_PROMPT, &log.0, vec![]);
    pairs_every_call(&prompt);
    insta::assert_json_snapshot!(prompt);
}

#[test]
fn rejected_reply_denied_call_and_correction_are_told_to_the_model() {
    let mut log = Log::new("Clean up");
    log.push(Event::DecisionRejected {
        turn: 1,
        raw: "{half".into(),
        problem: "not JSON".into(),
        usage: Usage::default(),
    })
    .calls(
        2,
        vec![ToolCall::new("w1", "write_file", json!({"path": "x"}))],
    )
    .push(Event::CallRejected {
        turn: 2,
        result: ToolResult::error(
            "w1".into(),
            "write_file",
            ToolError::new(ErrorKind::Denied, "a person denied this call: no"),
        ),
    })
    .calls(3, vec![ToolCall::new("r1", "list_dir", json!({}))])
    .push(Event::CorrectionIssued {
        turn: 3,
        fingerprint: "f".into(),
        message: "You have proposed the same tool calls 3 turns in a row.".into(),
        call_ids: vec!["r1".into()],
    });
    let prompt = project(DEFAULT_SYSTEM_PROMPT, &log.0, vec![]);
    pairs_every_call(&prompt);
    insta::assert_json_snapshot!(prompt);
}

#[test]
fn a_call_without_a_result_still_gets_one() {
    let mut log = Log::new("g");
    log.calls(
        1,
        vec![ToolCall::new("c1", "shell", json!({"command": "ls"}))],
    )
    .push(Event::ApprovalRequested {
        turn: 1,
        summary: None,
        pending: vec![],
        allowed: vec![],
    });
    let prompt = project("sys", &log.0, vec![]);
    pairs_every_call(&prompt);
    let last = prompt.messages.last().unwrap();
    assert!(
        matches!(&last.parts[0], Part::ToolResult { ok: false, content, .. } if content.contains("not run"))
    );
}

#[test]
fn the_same_log_gives_the_same_prompt_byte_for_byte() {
    let mut log = Log::new("g");
    log.calls(
        1,
        vec![ToolCall::new(
            "c1",
            "read_file",
            json!({"path": "a", "limit": 3}),
        )],
    )
    .finished(1, ToolResult::ok("c1".into(), "read_file", "x"));
    let a = serde_json::to_string(&project("s", &log.0, vec![])).unwrap();
    let b = serde_json::to_string(&project("s", &log.0, vec![])).unwrap();
    assert_eq!(a, b);
}
