//! Projections of hand-written logs: snapshots of the exact prompt, pairing rules, masking,
//! turn budgets and compaction.

use agent_context::testing::snapshot_text;
use agent_context::{
    CharEstimate, ContextConfig, DEFAULT_SYSTEM_PROMPT, Digest, Projector, REJECTED_REPLY_CHARS,
    SUMMARY_PREFIX, Tiktoken, extract, project,
};
use agent_core::*;
use serde_json::json;
use std::sync::Arc;

use crate::conversation::compact_extractively;
use crate::{Log, pairs_every_call};

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
fn a_long_rejected_reply_is_shown_back_cut_and_says_how_much_was_cut() {
    let text_of = |raw: String| {
        let mut log = Log::new("g");
        log.push(Event::DecisionRejected {
            turn: 1,
            raw,
            problem: "too long".into(),
            usage: Usage::default(),
        });
        let prompt = project(DEFAULT_SYSTEM_PROMPT, &log.0, vec![]);
        let shown = prompt
            .messages
            .iter()
            .find(|m| m.role == Role::Assistant)
            .expect("the reply is shown");
        match &shown.parts[..] {
            [Part::Text { text }] => text.clone(),
            other => panic!("{other:?}"),
        }
    };
    // Multi-byte characters: cut between characters, counted in characters.
    let whole: String = "é".repeat(REJECTED_REPLY_CHARS);
    assert_eq!(text_of(whole.clone()), whole);
    let long = format!("{whole}{}", "x".repeat(2 * REJECTED_REPLY_CHARS + 7));
    assert_eq!(
        text_of(long),
        format!(
            "{whole}\n[... {} more characters of this reply not shown ...]",
            2 * REJECTED_REPLY_CHARS + 7
        )
    );
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
        allowed_paths: Default::default(),
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

pub fn reads_log(turns: u32, result_chars: usize) -> Log {
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

/// The tests' configuration: each older result masked as soon as it leaves the recent
/// turns (`unmasked_result_chars: 0`), as every projection was before results were masked
/// in batches; the snapshots taken then hold byte for byte.
pub fn config() -> ContextConfig {
    ContextConfig {
        system: "sys".into(),
        unmasked_result_chars: 0,
        ..ContextConfig::default()
    }
}

/// The tool a run reads shortened results back with, as the runtime registers it.
pub fn read_result() -> ToolSpec {
    ToolSpec::new(
        "read_result",
        "Read a stored result by its handle.",
        json!({"type": "object", "properties": {"handle": {"type": "string"}}}),
        Risk::Read,
    )
}

pub fn projector(entries: &[Entry], config: ContextConfig) -> Projector {
    projector_with(entries, config, vec![read_result()])
}

pub fn projector_with(entries: &[Entry], config: ContextConfig, tools: Vec<ToolSpec>) -> Projector {
    let mut p = Projector::new(config, tools, std::sync::Arc::new(Tiktoken));
    for e in entries {
        p.apply(e);
    }
    p
}

pub fn results(prompt: &Prompt) -> Vec<(String, String)> {
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

/// Turns of several calls, some rejected, some answered by a correction, with a rejected
/// reply and a compaction between them: what a commit of many entries looks like.
fn batches_log() -> Log {
    let mut log = Log::new("Read them all");
    for t in 1..=6u32 {
        let ids: Vec<String> = (0..5).map(|i| format!("t{t}c{i}")).collect();
        log.push(Event::DecisionProposed {
            turn: t,
            decision: Decision::ToolCalls {
                calls: ids
                    .iter()
                    .map(|id| ToolCall::new(id.as_str(), "read_file", json!({"path": id})))
                    .collect(),
            },
            usage: Usage::tokens(400 * u64::from(t), 10),
            reasoning: Vec::new(),
        });
        // Results in another order than the calls'; one call never answered.
        for id in ids.iter().rev().skip(1) {
            log.finished(
                t,
                ToolResult::ok(id.as_str().into(), "read_file", id.repeat(300)),
            );
        }
        if t == 2 {
            log.push(Event::DecisionRejected {
                turn: 3,
                raw: "{half".into(),
                problem: "not JSON".into(),
                usage: Usage::default(),
            });
        }
        if t == 4 {
            compact_extractively(&mut log, 9_000);
        }
    }
    log
}

#[test]
fn applying_entries_together_gives_what_applying_each_in_turn_gives() {
    let logs = [
        ("reads", reads_log(8, 700)),
        ("usage", reads_with_usage(12, 5_000)),
        ("writes", write_log()),
        ("conversation", crate::conversation::conversation_log()),
        ("batches", batches_log()),
    ];
    for (name, log) in &logs {
        let entries = &log.0;
        for size in [1, 2, 3, 7, entries.len()] {
            let mut each = Projector::new(config(), vec![read_result()], Arc::new(Tiktoken));
            let mut together = Projector::new(config(), vec![read_result()], Arc::new(Tiktoken));
            for chunk in entries.chunks(size) {
                chunk.iter().for_each(|e| each.apply(e));
                together.apply_all(chunk);
                let at = chunk.last().map(|e| e.version);
                assert_eq!(
                    each.prompt(),
                    together.prompt(),
                    "{name}, {size} at a time, at {at:?}"
                );
                assert_eq!(each.tokens(), together.tokens(), "{name} {size} {at:?}");
                assert_eq!(
                    each.upper_bound(),
                    together.upper_bound(),
                    "{name} {size} {at:?}"
                );
                assert_eq!(each.should_compact(), together.should_compact());
                assert_eq!(each.facts(), together.facts());
            }
        }
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

/// Four writes, each followed by the model asking a person, who says no with a note: a
/// log the machine could have written (the facts fold it as the machine does).
fn write_log() -> Log {
    let mut log = Log::new("Write the report");
    for t in 1..=4u32 {
        let id = format!("w{t}");
        let (write, ask) = (2 * t - 1, 2 * t);
        log.calls(
            write,
            vec![ToolCall::new(
                id.as_str(),
                "write_file",
                json!({"path": format!("out/part{t}.md"), "content": "x"}),
            )],
        )
        .push(Event::ToolFinished {
            turn: write,
            result: ToolResult::ok(
                id.as_str().into(),
                "write_file",
                format!("wrote 1 bytes to out/part{t}.md (sha256 abc{t})"),
            ),
            effect_key: Some(format!("eff_{t:032}")),
        })
        .push(Event::DecisionProposed {
            turn: ask,
            decision: Decision::RequestApproval {
                summary: format!("part {t} done; go on?"),
                calls: vec![],
            },
            usage: Usage::default(),
            reasoning: Vec::new(),
        })
        .push(Event::ApprovalRequested {
            turn: ask,
            summary: Some(format!("part {t} done; go on?")),
            pending: vec![],
            allowed: vec![],
            allowed_paths: Default::default(),
        });
        log.push(Event::ApprovalDenied {
            call_ids: vec![],
            reason: format!("note {t} from the person: {}", "keep it short ".repeat(20)),
        });
    }
    log
}

/// A long run of writes: the block counts them all and lists the newest sixty, in order.
#[test]
fn the_facts_list_the_newest_sixty_side_effects_and_count_the_rest() {
    let mut log = Log::new("Write many parts");
    for t in 1..=70u32 {
        let id = format!("w{t}");
        log.calls(
            t,
            vec![ToolCall::new(
                id.as_str(),
                "write_file",
                json!({"path": format!("out/{t}.md"), "content": "x"}),
            )],
        )
        .push(Event::ToolFinished {
            turn: t,
            result: ToolResult::ok(id.as_str().into(), "write_file", format!("wrote part {t}")),
            effect_key: Some(format!("eff_{t:032}")),
        });
    }
    log.calls(
        71,
        vec![ToolCall::new("r", "read_file", json!({"path": "a"}))],
    )
    .finished(71, ToolResult::ok("r".into(), "read_file", "read"));
    let p = projector(&log.0, config());
    let facts = p.facts();
    assert!(
        facts.contains("Tool calls run: 71 (70 with side effects, 1 reads)."),
        "{facts}"
    );
    assert!(
        facts.contains("- (10 earlier ones not listed)\n"),
        "{facts}"
    );
    let listed: Vec<&str> = facts.lines().filter(|l| l.starts_with("- turn ")).collect();
    assert_eq!(listed.len(), 60);
    assert!(listed[0].starts_with("- turn 11: w11 "), "{}", listed[0]);
    assert!(listed[59].starts_with("- turn 70: w70 "), "{}", listed[59]);
    let last: Vec<&str> = facts
        .lines()
        .skip_while(|l| *l != "Last tool calls:")
        .skip(1)
        .collect();
    assert_eq!(last.len(), 5, "{facts}");
    assert!(last[0].starts_with("- w67 "), "{}", last[0]);
    assert!(last[4].starts_with("- r read_file"), "{}", last[4]);
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
        usage: Default::default(),
        window: None,
    });
    let small = ContextConfig {
        kept_user_tokens: 250,
        ..config()
    };
    // The run's write tool takes a path: what it wrote is listed as files.
    let mut write = ToolSpec::new("write_file", "w", json!({}), Risk::Write);
    write.main_argument = Some("path".into());
    let p = projector_with(&log.0, small, vec![read_result(), write]);
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
        facts.contains("Files written: out/part1.md, out/part2.md, out/part3.md, out/part4.md"),
        "{facts}"
    );
    assert!(
        facts.contains("Budgets left: 24 of 32 model calls, 124 of 128 tool calls"),
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

/// The summary keeps the newest lines that fit and counts the others, as a summary made
/// from all of its lines at once would.
#[test]
fn the_running_digest_keeps_the_newest_lines_that_fit() {
    let log = reads_log(40, 500);
    let mut whole = Digest::new(usize::MAX);
    for e in &log.0 {
        whole.apply(e);
    }
    let all: Vec<String> = whole.summary().lines().map(str::to_owned).collect();
    assert_eq!(all.len(), 80, "a line for each call and each result");
    // Exactly the size of the last five lines, and one less.
    let five: usize = all.iter().rev().take(5).map(|l| l.len() + 1).sum();
    for max in [0, 1, 50, 333, five - 1, five, 1_000, 6_000, 100_000] {
        // The suffix of lines whose sizes (with a newline each) fit in `max`.
        let mut used = 0;
        let mut kept = Vec::new();
        for line in all.iter().rev() {
            if used + line.len() + 1 > max {
                break;
            }
            used += line.len() + 1;
            kept.push(line.as_str());
        }
        kept.reverse();
        let mut expected = String::new();
        if kept.len() < all.len() {
            expected.push_str(&format!(
                "({} earlier lines omitted)\n",
                all.len() - kept.len()
            ));
        }
        expected.push_str(&kept.join("\n"));
        let mut digest = Digest::new(max);
        for e in &log.0 {
            digest.apply(e);
        }
        assert_eq!(digest.summary(), expected, "max {max}");
        assert_eq!(extract(&log.0, max), expected, "max {max}");
    }
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

/// Counts four bytes a token, and how often it was asked.
struct Counted(std::sync::atomic::AtomicUsize);

impl agent_context::TokenCounter for Counted {
    fn count(&self, text: &str) -> usize {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        text.len().div_ceil(4)
    }
}

/// A run of reads whose model reported `reported` input tokens on each call.
fn reads_with_usage(turns: u32, reported: u64) -> Log {
    reads_with(turns, Usage::tokens(reported, 10))
}

/// A run of reads each of whose calls used `usage`.
fn reads_with(turns: u32, usage: Usage) -> Log {
    let mut log = Log::new("read them");
    for t in 1..=turns {
        let id = format!("r{t}");
        log.push(Event::DecisionProposed {
            turn: t,
            decision: Decision::ToolCalls {
                calls: vec![ToolCall::new(
                    id.as_str(),
                    "read_file",
                    json!({"path": "f"}),
                )],
            },
            usage,
            reasoning: Vec::new(),
        })
        .finished(
            t,
            ToolResult::ok(id.as_str().into(), "read_file", "x".repeat(2_000)),
        );
    }
    log
}

#[test]
fn the_provider_s_count_settles_compaction_without_a_tokenizer() {
    // 40 turns of 2 KB, none masked: about 80 KB of prompt, past a 20,000-token threshold
    // by bytes.
    let config = ContextConfig {
        context_window: 25_000,
        compact_at: 0.8,
        recent_result_turns: 100,
        ..config()
    };
    let project = |log: &Log| {
        let counter = Arc::new(Counted(std::sync::atomic::AtomicUsize::new(0)));
        let mut p = Projector::new(config.clone(), vec![], counter.clone());
        log.0.iter().for_each(|e| p.apply(e));
        let compact = p.should_compact();
        let counted = counter.0.load(std::sync::atomic::Ordering::Relaxed);
        (compact, counted, p.upper_bound())
    };
    // The provider counted 5,000 tokens last time; what came since is a few KB.
    let (compact, counted, bound) = project(&reads_with_usage(40, 5_000));
    assert!(!compact);
    assert_eq!(counted, 0, "no token was counted");
    assert!(bound < 20_000 && bound > 5_000, "{bound}");
    // Without a count from the provider, the bytes do not settle it: tokens are counted.
    let (compact, counted, bound) = project(&reads_with_usage(40, 0));
    assert!(compact, "80 KB at four bytes a token is past 20,000");
    assert!(counted > 0);
    assert!(bound > 80_000, "{bound}");
    // A count near the threshold is not trusted to settle it either.
    let (_, counted, _) = project(&reads_with_usage(40, 19_000));
    assert!(counted > 0, "19,000 plus what came since may pass 20,000");
    // Nor is an estimate of ours (the provider reported nothing): it bounds nothing.
    let guessed = Usage {
        estimated: true,
        ..Usage::tokens(5_000, 10)
    };
    let (compact, counted, bound) = project(&reads_with(40, guessed));
    assert!(compact && counted > 0, "{compact} {counted}");
    assert!(bound > 80_000, "{bound}");
}

/// A provider whose counts may be partial (Ollama counts what its cache did not hold) does
/// not settle compaction with them: the prompt is counted; and a window found smaller than
/// was taken (the provider refused a prompt as too long) makes a prompt below the old
/// threshold one to compact.
#[test]
fn partial_counts_and_a_smaller_window_make_the_prompt_count() {
    let config = ContextConfig {
        context_window: 25_000,
        compact_at: 0.8,
        recent_result_turns: 100,
        ..config()
    };
    let project = |partial: bool| {
        let counter = Arc::new(Counted(std::sync::atomic::AtomicUsize::new(0)));
        let mut p = Projector::new(config.clone(), vec![], counter.clone());
        if partial {
            p.counts_may_be_partial();
        }
        p.apply_all(&reads_with_usage(40, 5_000).0);
        (p, counter)
    };
    let (trusted, counter) = project(false);
    assert!(!trusted.should_compact());
    assert_eq!(counter.0.load(std::sync::atomic::Ordering::Relaxed), 0);
    let (partial, counter) = project(true);
    assert!(
        partial.should_compact(),
        "80 KB at four bytes a token is past 20,000"
    );
    assert!(counter.0.load(std::sync::atomic::Ordering::Relaxed) > 0);
    assert_eq!(partial.lower_bound(), 0, "and they are no floor either");

    let mut small = Projector::new(config.clone(), vec![], Arc::new(CharEstimate));
    small.apply_all(&reads_with_usage(3, 0).0);
    assert!(!small.should_compact());
    small.window_at_most(small.tokens());
    assert!(
        small.should_compact(),
        "past four fifths of the window found"
    );
    small.window_at_most(1_000_000);
    assert_eq!(
        small.config().context_window,
        small.tokens(),
        "a larger one changes nothing"
    );
    // A server saying its window is a token long is not taken at its word.
    let mut told = Projector::new(config.clone(), vec![], Arc::new(CharEstimate));
    told.window_at_most(1);
    assert_eq!(
        told.config().context_window,
        agent_context::MIN_LEARNED_WINDOW
    );
}

/// The provider's count of the last prompt is the least it will count in the next one, as
/// long as that only grew: what the budgets check a call with before it is made.
#[test]
fn the_last_prompt_s_count_is_the_least_the_next_one_has() {
    let unmasked = ContextConfig {
        context_window: 25_000,
        compact_at: 0.8,
        recent_result_turns: 100,
        unmasked_result_chars: 1_000_000,
        ..config()
    };
    let project = |log: &Log, config: &ContextConfig| {
        let mut p = Projector::new(config.clone(), vec![], Arc::new(CharEstimate));
        p.apply_all(&log.0);
        p
    };
    // Three turns, the provider counted 5,000 last time; a result came since.
    let log = reads_with_usage(3, 5_000);
    let p = project(&log, &unmasked);
    assert_eq!(p.lower_bound(), 5_000);
    assert_eq!(
        project(&reads_with_usage(40, 15_000), &unmasked).lower_bound(),
        15_000,
        "far enough below the threshold"
    );
    assert!(p.upper_bound() > 5_000);
    // One entry at a time, the same.
    let mut one_by_one = Projector::new(unmasked.clone(), vec![], Arc::new(CharEstimate));
    log.0.iter().for_each(|e| one_by_one.apply(e));
    assert_eq!(one_by_one.lower_bound(), 5_000);
    // Counted in another process, perhaps with another model: no floor here.
    let mut resumed = project(&log, &unmasked);
    resumed.forget_lower_bound();
    assert_eq!(resumed.lower_bound(), 0);
    assert_eq!(
        resumed.upper_bound(),
        p.upper_bound(),
        "the upper bound stays"
    );
    // An estimate of ours is no count.
    let guessed = Usage {
        estimated: true,
        ..Usage::tokens(5_000, 10)
    };
    assert_eq!(project(&reads_with(3, guessed), &unmasked).lower_bound(), 0);
    // Older results masked since the count: the prompt may be smaller than it was.
    let masked = project(&reads_with_usage(4, 5_000), &config());
    assert_eq!(masked.lower_bound(), 0);
    assert!(
        masked
            .prompt()
            .messages
            .iter()
            .any(|m| m.parts.iter().any(
                |part| matches!(part, Part::ToolResult { content, .. } if content.len() < 2_000)
            )),
        "a result was masked"
    );
    // A prompt near the threshold may be compacted before it is sent.
    let near = project(&reads_with_usage(40, 19_500), &unmasked);
    assert_eq!(near.lower_bound(), 0);
    // But a summary is asked for there, with the messages alone: the count less the
    // system text and the tools ("sys" and "[]": five bytes).
    assert_eq!(near.summary_lower_bound(), 19_495);
    assert_eq!(resumed.summary_lower_bound(), 0);
    // Compacted since the count.
    let mut compacted = reads_with_usage(3, 5_000);
    compact_extractively(&mut compacted, 5_000);
    assert_eq!(project(&compacted, &unmasked).lower_bound(), 0);
    // The reasoning the counted prompt held may be left out of the next one.
    let mut thought = Log::new("read them");
    thought
        .push(Event::DecisionProposed {
            turn: 1,
            decision: Decision::ToolCalls {
                calls: vec![ToolCall::new("r1", "read_file", json!({"path": "f"}))],
            },
            usage: Usage::tokens(4_000, 10),
            reasoning: vec![Reasoning::Thinking {
                thinking: "t".repeat(500),
                signature: "s".repeat(97),
            }],
        })
        .finished(
            1,
            ToolResult::ok("r1".into(), "read_file", "x".repeat(10_000)),
        );
    thought.push(Event::DecisionProposed {
        turn: 2,
        decision: Decision::ToolCalls {
            calls: vec![ToolCall::new("r2", "read_file", json!({"path": "g"}))],
        },
        usage: Usage::tokens(5_000, 10),
        reasoning: Vec::new(),
    });
    assert_eq!(
        project(&thought, &unmasked).lower_bound(),
        5_000 - 600,
        "the 600 bytes of reasoning (with their part's 3) taken off"
    );
}

#[test]
fn a_summary_needs_only_the_log_since_the_last_compaction() {
    let mut log = reads_log(6, 300);
    compact_extractively(&mut log, 1_000);
    let more = reads_log(4, 300);
    for e in more.0.into_iter().skip(1) {
        let mut event = e.event;
        if let Event::DecisionProposed { turn, .. } | Event::ToolFinished { turn, .. } = &mut event
        {
            *turn += 6;
        }
        log.push(event);
    }
    compact_extractively(&mut log, 1_000);
    log.calls(
        11,
        vec![ToolCall::new("late", "read_file", json!({"path": "z"}))],
    );
    let p = projector(&log.0, config());
    let from = p.summary_from();
    assert_eq!(
        log.0[usize::try_from(from).unwrap() - 1].event.name(),
        "context_compacted",
        "it starts at the last compaction"
    );
    let tail = &log.0[usize::try_from(from).unwrap() - 1..];
    assert!(tail.len() < log.0.len() / 2);
    assert_eq!(extract(tail, 6_000), extract(&log.0, 6_000));
    assert!(extract(tail, 6_000).starts_with("Earlier: "));
    // The projection keeps that summary as it goes: compacting reads no log back.
    assert_eq!(p.digest().summary(), extract(tail, 6_000));
    assert_eq!(projector(&log.0[..3], config()).summary_from(), 1);
}

/// The prompt before each model call of `log` (after each turn's result), projected one
/// entry at a time.
fn prompts_before_each_call(log: &Log, config: ContextConfig) -> Vec<Prompt> {
    let mut p = Projector::new(config, vec![read_result()], std::sync::Arc::new(Tiktoken));
    let mut prompts = Vec::new();
    for e in &log.0 {
        p.apply(e);
        if matches!(e.event, Event::ToolFinished { .. }) {
            prompts.push(p.prompt().clone());
        }
    }
    prompts
}

/// How many messages of `before` open `after` unchanged.
fn same_messages(before: &Prompt, after: &Prompt) -> usize {
    before
        .messages
        .iter()
        .zip(&after.messages)
        .take_while(|(a, b)| a == b)
        .count()
}

#[test]
fn older_results_are_masked_in_batches_so_the_prompt_keeps_its_prefix() {
    // 2,000-character results; older ones may take 5,000 characters whole: the third
    // older result passes that, and the batch masks all older results at once.
    let batched = ContextConfig {
        unmasked_result_chars: 5_000,
        ..config()
    };
    let log = reads_log(12, 2_000);
    let prompts = prompts_before_each_call(&log, batched.clone());
    let mut breaks = Vec::new();
    for (turn, pair) in (2..).zip(prompts.windows(2)) {
        let kept = same_messages(&pair[0], &pair[1]);
        if kept < pair[0].messages.len() {
            breaks.push((turn, kept));
        }
    }
    // Message 0 is the goal; turn t adds its call and its result (messages 2t-1, 2t).
    // Recent turns: the open one and the two closed before it stay whole, so a result
    // becomes "older" three turns after its own; the batch comes when three are older.
    assert_eq!(
        breaks,
        [(6, 2), (9, 8), (12, 14)],
        "the prompt changes in place only at a batch, from the first result it masks"
    );
    for (turn, prompt) in (1..).zip(&prompts) {
        let whole = results(prompt)
            .iter()
            .filter(|(_, content)| !content.contains("older result"))
            .count();
        // Never fewer whole than the recent turns, never more than the allowance lets.
        assert!(
            (turn.min(3)..=turn.min(5)).contains(&whole),
            "turn {turn}: {whole} whole"
        );
    }
    // Per-turn masking, for comparison, changes the prompt in place at every turn from the
    // fourth on.
    let each = prompts_before_each_call(&log, config());
    let changed = each
        .windows(2)
        .filter(|pair| same_messages(&pair[0], &pair[1]) < pair[0].messages.len())
        .count();
    assert_eq!(changed, 9);
    // Batches or not, the prompt is the same function of the log, built at once or entry
    // by entry.
    assert_eq!(projector(&log.0, batched).prompt(), prompts.last().unwrap());
    // And the default allowance batches too.
    assert!(ContextConfig::default().unmasked_result_chars > 0);
}

#[test]
fn snapshot_of_results_masked_in_a_batch() {
    let log = reads_log(7, 400);
    let p = projector(
        &log.0,
        ContextConfig {
            unmasked_result_chars: 1_000,
            ..config()
        },
    );
    insta::assert_snapshot!("batched", snapshot_text(p.prompt()));
}
