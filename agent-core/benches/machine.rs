//! Pure machine throughput: turns per second with no IO at all.
//!
//! Run with `cargo bench -p agent-core --bench machine`. Each turn is one model reply with
//! a batch of reads, the gateway's verdicts, the tools' results and the commit; the model,
//! the tools and the store are in-memory answers, so this measures the machine alone.
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::hint::black_box;
use std::time::Instant;

use agent_core::*;
use serde_json::json;

fn manifest(max_steps: u32) -> Manifest {
    Manifest {
        runtime_version: "bench".into(),
        provider: "bench".into(),
        model: "bench".into(),
        system_prompt_digest: String::new(),
        tool_schema_digest: String::new(),
        budget: Budget {
            max_steps,
            max_tool_calls: u32::MAX,
            ..Budget::default()
        },
        tools: Vec::new(),
        answer: None,
        forked_from: None,
        parent: None,
        workspace: None,
        sandbox: None,
    }
}

/// Runs `turns` tool turns and a final answer; returns the number of events committed.
fn run(turns: u32, calls_per_turn: usize) -> u64 {
    let tools = vec![ToolSpec::new(
        "read_file",
        "read",
        json!({"type": "object"}),
        Risk::Read,
    )];
    let config = RunConfig {
        run_id: "bench".into(),
        goal: "bench".into(),
        manifest: manifest(turns + 1),
        tools,
    };
    let mut now = 0;
    let mut m = Machine::start(config, now);
    let mut version = 0;
    let mut turn = 0;
    while let Some(cmd) = m.poll_command() {
        now += 1;
        m.handle(Input::Tick(now)).unwrap();
        let input = match cmd {
            Command::CallModel { .. } => {
                turn += 1;
                let decision = if turn > turns {
                    Decision::Final {
                        answer: "done".into(),
                    }
                } else {
                    Decision::ToolCalls {
                        calls: (0..calls_per_turn)
                            .map(|i| {
                                ToolCall::new(
                                    format!("c{turn}_{i}"),
                                    "read_file",
                                    json!({"path": format!("file{turn}_{i}.txt")}),
                                )
                            })
                            .collect(),
                    }
                };
                Input::ModelReplied(ModelReply::decision(decision, Usage::tokens(1000, 50)))
            }
            Command::CheckCalls { calls, .. } => Input::CallsChecked {
                verdicts: calls.into_iter().map(|c| (c.id, Verdict::Allow)).collect(),
                paths: Vec::new(),
            },
            Command::ExecuteTools { group, .. } => Input::ToolsFinished {
                results: group
                    .into_iter()
                    .map(|c| ToolResult::ok(c.call.id, c.call.name, "contents"))
                    .collect(),
            },
            Command::Commit { entries, .. } => {
                version += entries.len() as u64;
                black_box(&entries);
                Input::Committed { version }
            }
            Command::AwaitApproval { .. }
            | Command::AwaitResolution { .. }
            | Command::ReconcileEffects { .. } => unreachable!("reads never ask or doubt"),
            Command::CheckAnswer { .. } => Input::AnswerChecked { rejection: None },
            Command::Finish(outcome) => {
                assert_eq!(outcome.reason, TerminalReason::Completed);
                break;
            }
        };
        m.handle(input).unwrap();
    }
    version
}

fn main() {
    for (turns, calls) in [(1_000, 1), (1_000, 4), (10_000, 1)] {
        // Warm up once, then measure the best of five.
        run(turns, calls);
        let mut best = f64::MAX;
        let mut events = 0;
        for _ in 0..5 {
            let start = Instant::now();
            events = run(turns, calls);
            best = best.min(start.elapsed().as_secs_f64());
        }
        println!(
            "machine: {turns} turns x {calls} call(s): {:.1} ms, {:.0} turns/s, {:.2} us/turn, {events} events",
            best * 1e3,
            f64::from(turns) / best,
            best * 1e6 / f64::from(turns),
        );
    }
}
