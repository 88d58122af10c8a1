//! What the model is sent, with the projection's bounds and without them.
//!
//! - 50 turns with 2 KB tool results, and 200 turns with 20 KB results: total input tokens
//!   sent over the run versus the naive full resend, and the peak prompt size;
//! - the cost of the incremental projection per event at 10, 1,000 and 10,000 events.
//!
//! Run with `cargo bench -p agent-context --bench context`.
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::sync::Arc;
use std::time::Instant;

use agent_context::{ContextConfig, Projector, Tiktoken, extract};
use agent_core::*;
use serde_json::json;

fn entry(version: u64, event: Event) -> Entry {
    Entry {
        version,
        at_ms: version,
        event,
    }
}

/// A run of `turns` reads, each returning `size` characters of varied text.
fn run_log(turns: u32, size: usize) -> Vec<Entry> {
    let manifest = Manifest {
        runtime_version: "bench".into(),
        provider: "script".into(),
        model: "bench".into(),
        system_prompt_digest: String::new(),
        tool_schema_digest: String::new(),
        budget: Budget::default(),
        tools: Vec::new(),
        answer: None,
        forked_from: None,
        parent: None,
        workspace: None,
        sandbox: None,
    };
    let mut log = vec![entry(
        1,
        Event::RunStarted {
            run_id: "bench".into(),
            goal: "Find where the retry policy is configured and explain it.".into(),
            manifest,
        },
    )];
    for t in 1..=turns {
        let id = format!("c{t}");
        let v = log.len() as u64;
        log.push(entry(
            v + 1,
            Event::DecisionProposed {
                turn: t,
                decision: Decision::ToolCalls {
                    calls: vec![ToolCall::new(
                        id.as_str(),
                        "read_file",
                        json!({"path": format!("src/module_{t}.rs")}),
                    )],
                },
                usage: Usage::default(),
                reasoning: Vec::new(),
            },
        ));
        let line =
            format!("fn handler_{t}(request: Request) -> Response {{ retry(request, {t}) }}\n");
        let body: String = line
            .repeat(size / line.len() + 1)
            .chars()
            .take(size)
            .collect();
        log.push(entry(
            v + 2,
            Event::ToolFinished {
                turn: t,
                result: ToolResult::ok(id.as_str().into(), "read_file", body),
                effect_key: None,
            },
        ));
    }
    log
}

struct Sent {
    total: usize,
    peak: usize,
    compactions: usize,
}

/// Replays the log as a run would: before each model call (each decision), the prompt is
/// sent; past the threshold the history is compacted with the extractive summary.
fn replay(log: &[Entry], config: ContextConfig, compact: bool) -> Sent {
    let mut p = Projector::new(config, vec![], Arc::new(Tiktoken));
    let mut sent = Sent {
        total: 0,
        peak: 0,
        compactions: 0,
    };
    let mut applied: Vec<Entry> = Vec::new();
    let mut next_version = 1;
    for e in log {
        if matches!(e.event, Event::DecisionProposed { .. }) {
            if compact && p.should_compact() {
                let summary = extract(&applied, 6_000);
                let before = p.tokens() as u64;
                let after = p.tokens_after_compaction(&summary) as u64;
                let compaction = entry(
                    next_version,
                    Event::ContextCompacted {
                        summary,
                        through_version: next_version - 1,
                        tokens_before: before,
                        tokens_after: after,
                        usage: Default::default(),
                        window: None,
                    },
                );
                p.apply(&compaction);
                applied.push(compaction);
                next_version += 1;
                sent.compactions += 1;
            }
            let tokens = p.tokens();
            sent.total += tokens;
            sent.peak = sent.peak.max(tokens);
        }
        let mut e = e.clone();
        e.version = next_version;
        next_version += 1;
        p.apply(&e);
        applied.push(e);
    }
    sent
}

fn case(label: &str, turns: u32, size: usize, window: usize) {
    let log = run_log(turns, size);
    let naive = ContextConfig {
        recent_result_turns: usize::MAX,
        turn_result_budget: usize::MAX,
        context_window: usize::MAX / 2,
        ..ContextConfig::default()
    };
    let bounded = ContextConfig {
        context_window: window,
        ..ContextConfig::default()
    };
    let full = replay(&log, naive, false);
    let ours = replay(&log, bounded, true);
    println!(
        "context: {label}: naive resend {} tokens (peak {}); bounded {} tokens (peak {}, {} compactions) = {:.1}% of naive",
        full.total,
        full.peak,
        ours.total,
        ours.peak,
        ours.compactions,
        ours.total as f64 * 100.0 / full.total as f64
    );
}

fn incremental(events: u32) {
    let log = run_log(events / 2, 1_000);
    let mut p = Projector::new(ContextConfig::default(), vec![], Arc::new(Tiktoken));
    let start = Instant::now();
    for e in &log {
        p.apply(e);
    }
    let apply = start.elapsed();
    let start = Instant::now();
    let tokens = p.tokens();
    let count = start.elapsed();
    println!(
        "context: {:>5} events: apply {:.2} us per event; first token count of the {} -token prompt {:.2} ms",
        log.len(),
        apply.as_secs_f64() * 1e6 / log.len() as f64,
        tokens,
        count.as_secs_f64() * 1e3
    );
}

fn main() {
    case("50 turns x 2 KB results, 128k window", 50, 2_000, 128_000);
    case(
        "200 turns x 20 KB results, 128k window",
        200,
        20_000,
        128_000,
    );
    case("200 turns x 20 KB results, 16k window", 200, 20_000, 16_000);
    for events in [10, 1_000, 10_000] {
        incremental(events);
    }
}
