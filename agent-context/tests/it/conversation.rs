//! Conversations: each message of the person in its place, the newest kept through
//! compaction, and nothing pointing to a tool the run lacks.

use agent_context::testing::snapshot_text;
use agent_context::{ContextConfig, SUMMARY_PREFIX, Tiktoken, TokenCounter, extract};
use agent_core::*;
use serde_json::json;

use crate::projection::{config, projector, projector_with, reads_log};
use crate::{Log, pairs_every_call};

/// A conversation: the goal, then follow-ups, each answered after one read.
pub fn conversation_log() -> Log {
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
            reasoning: Vec::new(),
        });
        log.push(Event::RunEnded {
            outcome: Outcome::completed(format!("answer {i}")),
        });
    }
    log
}

/// Appends a compaction whose summary is the extractive one.
pub fn compact_extractively(log: &mut Log, tokens_before: usize) {
    let summary = extract(&log.0, 2_000);
    let through_version = log.0.len() as u64;
    log.push(Event::ContextCompacted {
        summary,
        through_version,
        tokens_before: tokens_before as u64,
        tokens_after: 0,
        usage: Default::default(),
        window: None,
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
