//! `agent report RUN`: one self-contained HTML file to look at a run: its timeline (each
//! model call and tool call a bar, the calls of a turn side by side), tokens and cost over
//! the run, compactions, approvals and denials, effects with their keys, and how it ended.
//! Nothing is fetched: the data is in the file, drawn by the script in it. Long runs are
//! shown a page of turns at a time.

use agent_core::{Entry, ErrorKind, Event, Usage};
use serde::Serialize;

/// A bar of the timeline.
#[derive(Serialize)]
struct Bar {
    /// `model` or `tool`.
    kind: &'static str,
    turn: u32,
    /// What it shows: the model's decision, or the call.
    label: String,
    start_ms: u64,
    end_ms: u64,
    /// `ok`, or the error kind.
    status: String,
}

/// One point of the tokens and cost chart: the totals after a model call.
#[derive(Serialize)]
struct Point {
    turn: u32,
    at_ms: u64,
    input_tokens: u64,
    output_tokens: u64,
    cache_read_tokens: u64,
    cost_usd: f64,
}

/// Something a person should see in a list.
#[derive(Serialize)]
struct Mark {
    at_ms: u64,
    what: String,
}

#[derive(Serialize)]
struct Data {
    run_id: String,
    goal: String,
    model: String,
    /// How its commands ran, when in a sandbox: "sandboxed (no network)".
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox: Option<String>,
    started_ms: u64,
    ended_ms: u64,
    outcome: Option<String>,
    bars: Vec<Bar>,
    points: Vec<Point>,
    compactions: Vec<Mark>,
    approvals: Vec<Mark>,
    denials: Vec<Mark>,
    effects: Vec<Mark>,
}

fn data(run_id: &str, entries: &[Entry]) -> Data {
    let mut d = Data {
        run_id: run_id.to_owned(),
        goal: String::new(),
        model: String::new(),
        sandbox: None,
        started_ms: entries.first().map_or(0, |e| e.at_ms),
        ended_ms: entries.last().map_or(0, |e| e.at_ms),
        outcome: None,
        bars: Vec::new(),
        points: Vec::new(),
        compactions: Vec::new(),
        approvals: Vec::new(),
        denials: Vec::new(),
        effects: Vec::new(),
    };
    let mut tally = crate::render::UsageTally::default();
    // When the work in progress began: the commit before a model call, the decision (or
    // the dispatch records) before its tools.
    let mut last_ms = d.started_ms;
    let mut tools_from = d.started_ms;
    for e in entries {
        tally.count(&e.event);
        let total = &tally.total;
        // A model call, from the commit before it to what it came to.
        let model_bar = |turn: u32, label: String, status: String| Bar {
            kind: "model",
            turn,
            label,
            start_ms: last_ms,
            end_ms: e.at_ms,
            status,
        };
        match &e.event {
            Event::RunStarted { goal, manifest, .. } => {
                d.goal.clone_from(goal);
                d.model = format!("{}:{}", manifest.provider, manifest.model);
                d.sandbox = manifest
                    .sandbox
                    .as_deref()
                    .map(|sandbox| format!("sandboxed ({})", crate::render::sandbox_kind(sandbox)));
            }
            Event::DecisionProposed { turn, decision, .. } => {
                let label = match decision {
                    agent_core::Decision::ToolCalls { calls } => format!(
                        "{} tool call{}",
                        calls.len(),
                        if calls.len() == 1 { "" } else { "s" }
                    ),
                    agent_core::Decision::Final { .. } => "final answer".to_owned(),
                    agent_core::Decision::RequestApproval { .. } => "asks approval".to_owned(),
                    agent_core::Decision::Clarification { .. } => "asks a question".to_owned(),
                    agent_core::Decision::CannotContinue { .. } => "cannot continue".to_owned(),
                };
                d.bars.push(model_bar(*turn, label, "ok".to_owned()));
                d.points.push(point(*turn, e.at_ms, total));
                tools_from = e.at_ms;
            }
            Event::DecisionRejected { turn, problem, .. } => {
                d.bars.push(model_bar(
                    *turn,
                    format!("invalid: {problem}"),
                    "invalid_decision".to_owned(),
                ));
                d.points.push(point(*turn, e.at_ms, total));
            }
            Event::ModelFailed { turn, kind, .. } => {
                d.bars.push(model_bar(
                    *turn,
                    format!("failed: {kind}"),
                    kind.to_string(),
                ));
                // An attempt the provider accepted before it failed may be billed.
                d.points.push(point(*turn, e.at_ms, total));
            }
            // A sub-agent's model calls are the run's, as its budgets count them.
            Event::SubAgentFinished { turn, .. } => d.points.push(point(*turn, e.at_ms, total)),
            Event::EffectDispatched {
                call_id,
                effect_key,
                ..
            } => {
                tools_from = e.at_ms;
                d.effects.push(Mark {
                    at_ms: e.at_ms,
                    what: format!("{call_id} dispatched, effect key {effect_key}"),
                });
            }
            Event::ToolFinished { turn, result, .. } | Event::CallRejected { turn, result } => {
                if let Event::ToolFinished {
                    effect_key: Some(key),
                    ..
                } = &e.event
                {
                    d.effects.push(Mark {
                        at_ms: e.at_ms,
                        what: format!(
                            "{} {} {}, effect key {key}",
                            result.call_id,
                            result.name,
                            result.error_kind().map_or("done", ErrorKind::as_str)
                        ),
                    });
                }
                let status = result
                    .error_kind()
                    .map_or("ok", ErrorKind::as_str)
                    .to_owned();
                if result.error_kind() == Some(ErrorKind::Denied) {
                    d.denials.push(Mark {
                        at_ms: e.at_ms,
                        what: format!("{} {}: {}", result.call_id, result.name, result.content()),
                    });
                }
                d.bars.push(Bar {
                    kind: "tool",
                    turn: *turn,
                    label: format!("{} {}", result.call_id, result.name),
                    start_ms: tools_from.min(e.at_ms),
                    end_ms: e.at_ms,
                    status,
                });
            }
            Event::AnswerRejected { turn, problem } => d.bars.push(Bar {
                kind: "tool",
                turn: *turn,
                label: format!(
                    "answer rejected: {}",
                    problem.lines().next().unwrap_or_default()
                ),
                start_ms: tools_from.min(e.at_ms),
                end_ms: e.at_ms,
                status: "answer_rejected".to_owned(),
            }),
            Event::ContextCompacted {
                tokens_before,
                tokens_after,
                through_version,
                ..
            } => {
                d.compactions.push(Mark {
                    at_ms: e.at_ms,
                    what: format!(
                        "history through v{through_version} summarized: {tokens_before} → {tokens_after} tokens"
                    ),
                });
            }
            Event::CompactionDeclined {
                tokens_before,
                tokens_after,
                ..
            } => {
                d.compactions.push(Mark {
                    at_ms: e.at_ms,
                    what: format!("summary not used: {tokens_before} → {tokens_after} tokens"),
                });
            }
            Event::ApprovalRequested { turn, pending, .. } => d.approvals.push(Mark {
                at_ms: e.at_ms,
                what: format!(
                    "turn {turn}: asked about {}",
                    pending
                        .iter()
                        .map(|p| format!("{} {}", p.call_id, p.tool))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
            Event::RunEnded { outcome } => {
                d.outcome = Some(format!("{}: {}", outcome.reason, outcome.message));
            }
            // Calls the crash left without a result run again from here, not from their
            // decision before it.
            Event::RunResumed {} => tools_from = e.at_ms,
            other => {
                let name = other.name();
                if name.starts_with("approval") || name.starts_with("call_denied") {
                    d.approvals.push(Mark {
                        at_ms: e.at_ms,
                        what: name.replace('_', " "),
                    });
                } else if name.starts_with("effect") {
                    d.effects.push(Mark {
                        at_ms: e.at_ms,
                        what: name.replace('_', " "),
                    });
                }
            }
        }
        last_ms = e.at_ms;
    }
    d
}

fn point(turn: u32, at_ms: u64, total: &Usage) -> Point {
    Point {
        turn,
        at_ms,
        input_tokens: total.input_tokens,
        output_tokens: total.output_tokens,
        cache_read_tokens: total.cache_read_tokens,
        cost_usd: total.cost_usd,
    }
}

/// The report of a run's log, as one HTML document.
pub fn html(run_id: &str, entries: &[Entry]) -> String {
    let data = data(run_id, entries);
    // In a script element, `</` could end it early and `<!--` open a comment: the run's
    // text is the model's and the tools', untrusted.
    let json = serde_json::to_string(&data)
        .unwrap_or_else(|_| "{}".to_owned())
        .replace('<', "\\u003c");
    TEMPLATE.replace("/*DATA*/null", &json)
}

const TEMPLATE: &str = include_str!("report.html");

#[cfg(test)]
mod tests {
    use agent_core::{Budget, Decision, Entry, Event, Manifest, Usage};

    use super::data;

    fn entry(version: u64, at_ms: u64, event: Event) -> Entry {
        Entry {
            version,
            at_ms,
            event,
        }
    }

    fn manifest() -> Manifest {
        Manifest {
            runtime_version: "t".into(),
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
        }
    }

    /// The model's first decision, at 1,100 ms, using nothing.
    fn first_decision(decision: Decision) -> Entry {
        entry(
            2,
            1_100,
            Event::DecisionProposed {
                turn: 1,
                decision,
                usage: Usage::default(),
                reasoning: Vec::new(),
            },
        )
    }

    fn started() -> Entry {
        entry(
            1,
            1_000,
            Event::RunStarted {
                run_id: "r".into(),
                goal: "g".into(),
                manifest: manifest(),
            },
        )
    }

    /// The usage curve counts what summaries used, and a summary not used is listed.
    #[test]
    fn summaries_count_in_the_usage_and_are_listed() {
        let log = [
            started(),
            entry(
                2,
                1_100,
                Event::CompactionDeclined {
                    tokens_before: 9_000,
                    tokens_after: 9_500,
                    usage: Usage::tokens(1_000, 100),
                },
            ),
            entry(
                3,
                1_200,
                Event::ContextCompacted {
                    summary: "s".into(),
                    through_version: 2,
                    tokens_before: 9_000,
                    tokens_after: 800,
                    usage: Usage::tokens(2_000, 200),
                    window: None,
                },
            ),
            entry(
                4,
                1_300,
                Event::DecisionProposed {
                    turn: 1,
                    decision: Decision::Final { answer: "a".into() },
                    usage: Usage::tokens(500, 5),
                    reasoning: Vec::new(),
                },
            ),
        ];
        let d = data("r", &log);
        let last = d.points.last().expect("a point for the decision");
        assert_eq!((last.input_tokens, last.output_tokens), (3_500, 305));
        assert_eq!(d.compactions.len(), 2);
        assert!(d.compactions[0].what.starts_with("summary not used"));
    }

    /// The curve counts what the run's budgets count: retried and failed attempts that may
    /// be billed, and its sub-agents' calls (each report of a child its usage so far).
    #[test]
    fn retries_failures_and_sub_agents_count_in_the_usage() {
        let log = [
            started(),
            entry(
                2,
                1_100,
                Event::ModelRetried {
                    turn: 1,
                    retry: agent_core::Retry {
                        attempt: 1,
                        reason: "cut".into(),
                        wait_ms: 10,
                        usage: Usage::tokens(100, 1),
                    },
                },
            ),
            entry(
                3,
                1_200,
                Event::ModelFailed {
                    turn: 1,
                    message: "gave up".into(),
                    kind: agent_core::ModelErrorKind::Transport,
                    usage: Usage::tokens(100, 2),
                },
            ),
            entry(
                4,
                1_300,
                Event::SubAgentFinished {
                    turn: 2,
                    call_id: "d1".into(),
                    run_id: "r.child".into(),
                    usage: Usage::tokens(1_000, 10),
                },
            ),
            entry(
                5,
                1_400,
                Event::SubAgentFinished {
                    turn: 3,
                    call_id: "d1".into(),
                    run_id: "r.child".into(),
                    usage: Usage::tokens(1_500, 15),
                },
            ),
        ];
        let d = data("r", &log);
        let last = d.points.last().expect("points");
        assert_eq!((last.input_tokens, last.output_tokens), (1_700, 18));
    }

    #[test]
    fn a_rejected_answer_is_a_bar_from_the_decision_to_the_verdict() {
        let log = [
            started(),
            first_decision(Decision::Final {
                answer: "41".into(),
            }),
            entry(
                3,
                1_350,
                Event::AnswerRejected {
                    turn: 1,
                    problem: "expected 42\nmore".into(),
                },
            ),
        ];
        let d = data("r", &log);
        let bar = d
            .bars
            .iter()
            .find(|b| b.status == "answer_rejected")
            .expect("a bar for the rejection");
        assert_eq!((bar.start_ms, bar.end_ms), (1_100, 1_350));
        assert_eq!(bar.label, "answer rejected: expected 42");
        assert_eq!(bar.turn, 1);
    }

    /// A call that a crash left without a result, run again when the run is taken up an
    /// hour later, is a bar from then, not from its decision before the crash.
    #[test]
    fn a_call_run_again_after_a_crash_is_a_bar_from_when_the_run_was_taken_up() {
        let call = agent_core::ToolCall::new("c1", "read_file", serde_json::json!({}));
        let taken_up = 3_601_100;
        let log = [
            started(),
            first_decision(Decision::ToolCalls { calls: vec![call] }),
            entry(3, taken_up, Event::RunResumed {}),
            entry(
                4,
                taken_up + 40,
                Event::ToolFinished {
                    turn: 1,
                    result: agent_core::ToolResult::ok("c1".into(), "read_file", "x"),
                    effect_key: None,
                },
            ),
        ];
        let d = data("r", &log);
        let bar = d
            .bars
            .iter()
            .find(|b| b.kind == "tool")
            .expect("a tool bar");
        assert_eq!((bar.start_ms, bar.end_ms), (taken_up, taken_up + 40));
    }
}
