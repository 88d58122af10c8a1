//! Projections of hand-written logs: snapshots of the exact prompt, and pairing rules.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use agent_context::testing::snapshot_text;
use agent_context::{
    ContextConfig, DEFAULT_SYSTEM_PROMPT, Projector, SUMMARY_PREFIX, Tiktoken, TokenCounter,
    extract, project,
};
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
                tools: Vec::new(),
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
    insta::assert_snapshot!(snapshot_text(&prompt));
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
    insta::assert_snapshot!(snapshot_text(&prompt));
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

fn reads_log(turns: u32, result_chars: usize) -> Log {
    let mut log = Log::new("Audit the repository");
    for t in 1..=turns {
        let id = format!("c{t}");
        log.calls(
            t,
            vec![ToolCall::new(
                id.as_str(),
                "read_file",
                json!({"path": format!("f{t}.rs")}),
            )],
        )
        .finished(
            t,
            ToolResult::ok(
                id.as_str().into(),
                "read_file",
                format!("{t}:{}", "x".repeat(result_chars)),
            ),
        );
    }
    log
}

fn config() -> ContextConfig {
    ContextConfig {
        system: "sys".into(),
        ..ContextConfig::default()
    }
}

/// The tool a run reads shortened results back with, as the runtime registers it.
fn read_result() -> ToolSpec {
    ToolSpec::new(
        "read_result",
        "Read a stored result by its handle.",
        json!({"type": "object", "properties": {"handle": {"type": "string"}}}),
        Risk::Read,
    )
}

fn projector(entries: &[Entry], config: ContextConfig) -> Projector {
    projector_with(entries, config, vec![read_result()])
}

fn projector_with(entries: &[Entry], config: ContextConfig, tools: Vec<ToolSpec>) -> Projector {
    let mut p = Projector::new(config, tools, std::sync::Arc::new(Tiktoken));
    for e in entries {
        p.apply(e);
    }
    p
}

fn results(prompt: &Prompt) -> Vec<(String, String)> {
    prompt
        .messages
        .iter()
        .flat_map(|m| m.parts.iter())
        .filter_map(|p| match p {
            Part::ToolResult {
                call_id, content, ..
            } => Some((call_id.to_string(), content.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn older_results_are_masked_with_a_handle_and_recent_ones_stay_whole() {
    let log = reads_log(6, 2_000);
    let p = projector(&log.0, config());
    pairs_every_call(p.prompt());
    let results = results(p.prompt());
    assert_eq!(results.len(), 6);
    // Turns 1-3 are masked (two newer turns closed since); 4-6 are whole: 4-5 are closed
    // and recent, 6 is the open turn.
    for (id, content) in &results[..3] {
        assert!(content.contains("older result"), "{id}: {content}");
        let version = log
            .0
            .iter()
            .find(|e| {
                matches!(&e.event,
            Event::ToolFinished { result, .. } if result.call_id.as_str() == id)
            })
            .unwrap()
            .version;
        assert!(
            content.contains(&format!("handle \"log:{version}\"")),
            "{content}"
        );
        assert!(content.len() < 500);
    }
    for (id, content) in &results[3..] {
        assert_eq!(content.len(), 2_002, "{id} whole");
    }
}

#[test]
fn the_incremental_projection_equals_the_one_from_scratch_at_every_event() {
    let log = reads_log(8, 700);
    let mut incremental =
        Projector::new(config(), vec![read_result()], std::sync::Arc::new(Tiktoken));
    for i in 0..log.0.len() {
        incremental.apply(&log.0[i]);
        let fresh = projector(&log.0[..=i], config());
        assert_eq!(
            incremental.prompt(),
            fresh.prompt(),
            "after event {}",
            i + 1
        );
        assert_eq!(incremental.tokens(), fresh.tokens());
        pairs_every_call(incremental.prompt());
    }
}

#[test]
fn one_turns_results_stay_under_the_turn_budget_largest_cut_first() {
    let mut log = Log::new("g");
    log.calls(
        1,
        vec![
            ToolCall::new("a", "read_file", json!({})),
            ToolCall::new("b", "read_file", json!({})),
            ToolCall::new("c", "read_file", json!({})),
        ],
    )
    .finished(
        1,
        ToolResult::ok("a".into(), "read_file", "a".repeat(120_000)),
    )
    .finished(
        1,
        ToolResult::ok("b".into(), "read_file", "b".repeat(90_000)),
    )
    .finished(
        1,
        ToolResult::ok("c".into(), "read_file", "c".repeat(5_000)),
    );
    let p = projector(&log.0, config());
    let results = results(p.prompt());
    let total: usize = results.iter().map(|(_, c)| c.chars().count()).sum();
    assert!(total <= 200_000, "{total}");
    assert!(results[0].1.contains("left out"), "the largest is cut");
    assert_eq!(results[1].1.len(), 90_000, "cutting the largest was enough");
    assert_eq!(results[2].1.len(), 5_000);
}

fn write_log() -> Log {
    let mut log = Log::new("Write the report");
    for t in 1..=4u32 {
        let id = format!("w{t}");
        log.calls(
            t,
            vec![ToolCall::new(
                id.as_str(),
                "write_file",
                json!({"path": format!("out/part{t}.md"), "content": "x"}),
            )],
        )
        .push(Event::ToolFinished {
            turn: t,
            result: ToolResult::ok(
                id.as_str().into(),
                "write_file",
                format!("wrote 1 bytes to out/part{t}.md (sha256 abc{t})"),
            ),
            effect_key: Some(format!("eff_{t:032}")),
        });
        log.push(Event::ApprovalDenied {
            call_ids: vec![],
            reason: format!("note {t} from the person: {}", "keep it short ".repeat(20)),
        });
    }
    log
}

#[test]
fn compaction_keeps_the_facts_and_the_newest_user_messages() {
    let mut log = write_log();
    let before = projector(&log.0, config()).tokens();
    log.push(Event::ContextCompacted {
        summary: "Wrote parts 1 to 4 of the report.".into(),
        through_version: log.0.len() as u64,
        tokens_before: before as u64,
        tokens_after: 0,
    });
    let small = ContextConfig {
        kept_user_tokens: 250,
        ..config()
    };
    let p = projector(&log.0, small);
    assert_eq!(p.prompt().messages.len(), 1);
    let texts: Vec<&str> = p.prompt().messages[0]
        .parts
        .iter()
        .filter_map(|part| match part {
            Part::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    let facts = texts.last().unwrap();
    for t in 1..=4 {
        assert!(
            facts.contains(&format!("out/part{t}.md")),
            "file {t} named: {facts}"
        );
        assert!(
            facts.contains(&format!("eff_{t:032}")),
            "effect key {t} named"
        );
    }
    assert!(
        facts.contains("Budgets left: 28 of 32 model calls"),
        "{facts}"
    );
    let summary = texts[texts.len() - 2];
    assert!(summary.starts_with(SUMMARY_PREFIX));
    // The newest notes are kept whole; older ones fall out or are cut.
    let kept = &texts[..texts.len() - 2];
    assert!(kept.last().unwrap().starts_with("note 4"), "{kept:?}");
    assert!(
        !kept.iter().any(|t| t.starts_with("Write the report")),
        "the oldest fell out"
    );
    // Events after the compaction append as usual.
    let mut more = log;
    more.calls(
        5,
        vec![ToolCall::new("r9", "read_file", json!({"path": "a"}))],
    )
    .finished(5, ToolResult::ok("r9".into(), "read_file", "fresh"));
    let p = projector(&more.0, config());
    pairs_every_call(p.prompt());
    assert_eq!(p.prompt().messages.len(), 3);
}

#[test]
fn the_extractive_summary_is_deterministic_and_bounded() {
    let log = reads_log(40, 500);
    let a = extract(&log.0, 1_000);
    assert_eq!(a, extract(&log.0, 1_000));
    assert!(a.len() <= 1_100, "{}", a.len());
    assert!(a.contains("earlier lines omitted"));
    assert!(a.contains("c40"), "the newest turn is kept");
}

#[test]
fn snapshot_of_masked_results_and_a_compaction() {
    let log = reads_log(5, 400);
    let p = projector(&log.0, config());
    insta::assert_snapshot!("masked", snapshot_text(p.prompt()));
    let mut log = log;
    compact_extractively(&mut log, p.tokens());
    let p = projector(&log.0, config());
    insta::assert_snapshot!("compacted", snapshot_text(p.prompt()));
}

#[test]
fn snapshot_of_an_oversized_result_replaced_by_its_preview_and_handle() {
    let mut log = Log::new("Inspect the logs");
    log.calls(
        1,
        vec![
            ToolCall::new("big", "read_file", json!({"path": "app.log"})),
            ToolCall::new("small", "read_file", json!({"path": "notes.txt"})),
        ],
    )
    .finished(
        1,
        ToolResult::ok("big".into(), "read_file", "ERROR disk full\n".repeat(300)),
    )
    .finished(1, ToolResult::ok("small".into(), "read_file", "all good"));
    let small_budget = ContextConfig {
        turn_result_budget: 1_500,
        preview_bytes: 320,
        ..config()
    };
    let p = projector(&log.0, small_budget);
    insta::assert_snapshot!("oversized", snapshot_text(p.prompt()));
}

/// A conversation: the goal, then follow-ups, each answered after one read.
fn conversation_log() -> Log {
    let mut log = Log::new("Review the notes in docs/");
    let asks = [
        "Start with docs/a.md.",
        "Now docs/b.md, and compare it with a.md.",
        "Which of the two is older?",
        "Summarize both in one sentence each.",
        "Thanks. Last one: is anything in them out of date?",
    ];
    let mut turn = 0;
    for (i, ask) in asks.iter().enumerate() {
        if i > 0 {
            log.push(Event::UserMessage {
                text: (*ask).into(),
                budget: None,
            });
        }
        turn += 1;
        let id = format!("r{turn}");
        log.calls(
            turn,
            vec![ToolCall::new(
                id.as_str(),
                "read_file",
                json!({"path": format!("docs/{i}.md")}),
            )],
        )
        .finished(
            turn,
            ToolResult::ok(id.as_str().into(), "read_file", format!("contents {i}")),
        );
        turn += 1;
        log.push(Event::DecisionProposed {
            turn,
            decision: Decision::Final {
                answer: format!("answer {i}"),
            },
            usage: Usage::default(),
        });
        log.push(Event::RunEnded {
            outcome: Outcome::completed(format!("answer {i}")),
        });
    }
    log
}

/// Appends a compaction whose summary is the extractive one.
fn compact_extractively(log: &mut Log, tokens_before: usize) {
    let summary = extract(&log.0, 2_000);
    let through_version = log.0.len() as u64;
    log.push(Event::ContextCompacted {
        summary,
        through_version,
        tokens_before: tokens_before as u64,
        tokens_after: 0,
    });
}

fn texts_of(message: &Message) -> Vec<&str> {
    message
        .parts
        .iter()
        .filter_map(|part| match part {
            Part::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_conversation_keeps_each_message_in_place_and_the_newest_through_compaction() {
    let mut log = conversation_log();
    let p = projector(&log.0, config());
    pairs_every_call(p.prompt());
    insta::assert_snapshot!("conversation", snapshot_text(p.prompt()));
    // Each follow-up comes right after the answer it follows, as the person's turn.
    let messages = &p.prompt().messages;
    for (i, m) in messages.iter().enumerate() {
        if texts_of(m)
            .iter()
            .any(|t| t.starts_with("Which of the two"))
        {
            assert_eq!(m.role, Role::User);
            assert_eq!(texts_of(&messages[i - 1]), ["answer 1"]);
        }
    }
    compact_extractively(&mut log, p.tokens());
    // Room for the two newest messages only (a budget in tokens, as the 20,000 default).
    let newest_two = Tiktoken.count("Thanks. Last one: is anything in them out of date?")
        + Tiktoken.count("Summarize both in one sentence each.");
    let small = ContextConfig {
        kept_user_tokens: newest_two,
        ..config()
    };
    let p = projector(&log.0, small);
    insta::assert_snapshot!("conversation_compacted", snapshot_text(p.prompt()));
    assert_eq!(p.prompt().messages.len(), 1);
    let texts = texts_of(&p.prompt().messages[0]);
    let (kept, rest) = texts.split_at(texts.len() - 2);
    assert_eq!(
        kept,
        [
            "Summarize both in one sentence each.",
            "Thanks. Last one: is anything in them out of date?"
        ],
        "the newest, verbatim"
    );
    assert!(rest[0].starts_with(SUMMARY_PREFIX));
    assert!(
        rest[0].contains("Which of the two is older?"),
        "older messages live on in the summary only"
    );
    let facts = rest[1];
    for i in 0..5 {
        assert!(facts.contains(&format!("docs/{i}.md")), "{facts}");
    }
    assert!(
        facts.contains("Budgets left: 30 of 32 model calls, 127 of 128 tool calls"),
        "limits count per exchange: {facts}"
    );
}

#[test]
fn without_read_result_nothing_points_to_it() {
    // A runtime whose gateway lacks read_result: the prompt shortens as usual, but never
    // tells the model to call a tool it does not have.
    let mut log = reads_log(6, 3_000);
    let p = projector_with(&log.0, config(), vec![]);
    compact_extractively(&mut log, p.tokens());
    let small = ContextConfig {
        turn_result_budget: 2_500,
        ..config()
    };
    for p in [
        projector_with(&reads_log(6, 3_000).0, small, vec![]),
        projector_with(&log.0, config(), vec![]),
    ] {
        let text = serde_json::to_string(p.prompt()).unwrap();
        assert!(!text.contains("read_result"), "{text}");
        assert!(text.contains("not shown") || text.contains(SUMMARY_PREFIX));
    }
    let with = projector(&reads_log(6, 3_000).0, config());
    assert!(
        serde_json::to_string(with.prompt())
            .unwrap()
            .contains("read_result handle")
    );
}
