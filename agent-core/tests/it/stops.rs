//! Runs that stop: cancellation, deadlines, every budget, denials, unavailable tools,
//! failed commits, inputs out of turn.

use agent_core::*;
use serde_json::json;

use crate::harness::{Reply::*, T0, check, tool, world};
use crate::scenarios::read;

#[test]
fn cancel_while_tools_run_keeps_their_results_and_starts_nothing_new() {
    let mut w = world(vec![
        Calls(vec![
            read("r1", "a"),
            ("w1", "write", json!({})),
            ("w2", "write", json!({})),
        ]),
        Final("never"),
    ]);
    w.cancel_in_tools_of_turn = Some(1);
    let r = check(w, TerminalReason::Cancelled);
    // Only the first group started; its result is kept as `cancelled`.
    assert_eq!(r.executed_names(), ["read"]);
    assert_eq!(r.result_of("r1").error_kind(), Some(ErrorKind::Cancelled));
    // The calls that never started are answered, and not counted as started.
    let w1 = r.result_of("w1");
    assert_eq!(w1.error_kind(), Some(ErrorKind::Cancelled));
    assert!(w1.content().contains("not started"));
    assert_eq!(RunState::fold(&r.log).unwrap().tool_calls, 1);
    assert_eq!(r.model_calls, 1);
}

#[test]
fn deadline_while_the_model_thinks() {
    let mut w = world(vec![Calls(vec![read("c1", "a")]), Final("too late")]);
    w.script[1].delay_ms = 5_000;
    w.budget.max_wall_time_ms = Some(1_000);
    let r = check(w, TerminalReason::DeadlineExceeded);
    assert_eq!(r.executed.len(), 1);
    assert_eq!(r.outcome.answer, None);
    assert!(
        r.outcome.message.contains("wall-clock budget of 1.0 s"),
        "{}",
        r.outcome.message
    );
    let end = r.log.last().unwrap();
    assert!(end.at_ms >= T0 + 1_000);
}

#[test]
fn deadline_during_tools_is_applied_when_they_return() {
    let mut w = world(vec![
        Calls(vec![("s", "slow_read", json!({}))]),
        Final("never"),
    ]);
    w.budget.max_wall_time_ms = Some(100);
    let r = check(w, TerminalReason::DeadlineExceeded);
    assert!(
        r.result_of("s").is_ok(),
        "the result that came back is kept"
    );
    assert_eq!(r.model_calls, 1);
}

#[test]
fn a_deadline_never_hides_an_effect_in_doubt() {
    // A write whose outcome is unknown pauses the run for a person. The wall-clock budget
    // runs out while that pause is being committed: the run stays paused on the call in
    // doubt, as it would be had the deadline come a moment later. (Found by the property
    // test: before, the run ended `deadline_exceeded` and the call was never put to anyone.)
    let mut w = world(vec![
        Calls(vec![("c1", "slow_read", json!({}))]),
        Calls(vec![("c2", "write", json!({}))]),
    ]);
    w.tools[1] = tool("write", Risk::Write).fails(ErrorKind::OutcomeUnknown, "reset");
    w.budget.max_wall_time_ms = Some(321);
    let r = check(w, TerminalReason::OutcomeUnknown);
    assert_eq!(r.outcome.pending.len(), 1);
    assert_eq!(r.outcome.pending[0].call_id.as_str(), "c2");
    assert!(
        !r.log
            .iter()
            .any(|e| matches!(&e.event, Event::RunEnded { .. })),
        "paused, not ended"
    );
}

#[test]
fn max_steps_stops_before_the_next_model_call() {
    let mut w = world(vec![
        Calls(vec![read("a", "1")]),
        Calls(vec![read("b", "2")]),
        Calls(vec![read("c", "3")]),
    ]);
    w.budget.max_steps = 2;
    let r = check(w, TerminalReason::MaxSteps);
    assert_eq!(r.model_calls, 2);
    assert_eq!(r.executed.len(), 2);
}

#[test]
fn a_batch_past_the_tool_budget_is_not_started_at_all() {
    let mut w = world(vec![
        Calls(vec![read("a", "1")]),
        Calls(vec![read("b", "2"), read("c", "3")]),
    ]);
    w.budget.max_tool_calls = 2;
    let r = check(w, TerminalReason::ToolBudgetExhausted);
    assert_eq!(r.executed_names(), ["read"]);
    assert!(
        r.outcome.message.contains("tool-call budget (1 of 2 used)"),
        "{}",
        r.outcome.message
    );
}

#[test]
fn retrying_the_same_call_past_its_retry_budget() {
    let again = || Calls(vec![("c1", "flaky", json!({"q": 1}))]);
    let mut w = world(vec![again(), again(), again(), again(), Final("never")]);
    w.tools
        .push(tool("flaky", Risk::Read).fails(ErrorKind::Timeout, "took too long"));
    w.budget.max_repeated_plan = 10;
    let r = check(w, TerminalReason::ToolBudgetExhausted);
    // One run plus max_retries_per_tool (2) retries.
    assert_eq!(r.executed.len(), 3);
    assert!(r.outcome.message.contains("max_retries_per_tool"));
}

#[test]
fn token_budget_stops_before_the_next_model_call() {
    let mut w = world(vec![
        Calls(vec![read("a", "1")]),
        Calls(vec![read("b", "2")]),
        Final("never"),
    ]);
    w.budget.max_tokens = Some(200);
    let r = check(w, TerminalReason::CostBudgetExceeded);
    assert_eq!(
        r.model_calls, 2,
        "120 tokens per call: the third would start past 200"
    );
}

#[test]
fn money_budget_stops_before_the_next_model_call() {
    let mut w = world(vec![Calls(vec![read("a", "1")]), Final("never")]);
    w.script[0].usage.cost_usd = 0.75;
    w.budget.max_cost_usd = Some(0.5);
    let r = check(w, TerminalReason::CostBudgetExceeded);
    assert_eq!(r.model_calls, 1);
    assert!(r.outcome.message.contains("$0.7500"));
}

/// What the last call's prompt used: the least the next one will (its prompt only grew).
fn last_prompt(log: &[Entry]) -> Usage {
    let last = log.iter().rev().find_map(|e| match &e.event {
        Event::DecisionProposed { usage, .. } => Some(*usage),
        _ => None,
    });
    last.map_or_else(Usage::default, |usage| Usage {
        cost_usd: usage.cost_usd / 2.0,
        ..Usage::tokens(usage.input_tokens, 0)
    })
}

#[test]
fn a_call_whose_prompt_alone_passes_the_token_budget_is_not_made() {
    let script = || {
        world(vec![
            Calls(vec![read("a", "1")]),
            Calls(vec![read("b", "2")]),
            Calls(vec![read("c", "3")]),
            Final("never"),
        ])
    };
    // 120 tokens a call, 100 of them the prompt. Spent alone, the budget of 250 lets a
    // third call start at 240 and end at 360.
    let mut blind = script();
    blind.budget.max_tokens = Some(250);
    assert_eq!(
        check(blind, TerminalReason::CostBudgetExceeded).model_calls,
        3
    );
    // Knowing the prompt has at least 100 tokens, 240 + 100 passes it: no third call.
    let mut w = script();
    w.budget.max_tokens = Some(250);
    w.next_call = Some(last_prompt);
    let r = check(w, TerminalReason::CostBudgetExceeded);
    assert_eq!(r.model_calls, 2);
    assert!(
        r.outcome
            .message
            .contains("240 tokens used, and the next call's prompt alone has at least 100"),
        "{}",
        r.outcome.message
    );
    // A call that fits exactly is made.
    let mut w = script();
    w.budget.max_tokens = Some(340);
    w.next_call = Some(last_prompt);
    assert_eq!(check(w, TerminalReason::CostBudgetExceeded).model_calls, 3);
}

#[test]
fn a_call_whose_prompt_alone_passes_the_cost_budget_is_not_made() {
    let script = || {
        let mut w = world(vec![
            Calls(vec![read("a", "1")]),
            Calls(vec![read("b", "2")]),
            Calls(vec![read("c", "3")]),
            Final("never"),
        ]);
        for turn in &mut w.script {
            turn.usage.cost_usd = 0.1;
        }
        w.budget.max_cost_usd = Some(0.23);
        w
    };
    assert_eq!(
        check(script(), TerminalReason::CostBudgetExceeded).model_calls,
        3
    );
    let mut w = script();
    w.next_call = Some(last_prompt);
    let r = check(w, TerminalReason::CostBudgetExceeded);
    assert_eq!(r.model_calls, 2, "0.20 spent and at least 0.05 to come");
    assert!(
        r.outcome
            .message
            .contains("$0.2000 spent, and the next call's prompt alone costs at least $0.0500"),
        "{}",
        r.outcome.message
    );
    // A cost from outside that is no number stops nothing.
    let mut w = script();
    w.next_call = Some(|_| Usage {
        cost_usd: f64::NAN,
        ..Usage::default()
    });
    assert_eq!(check(w, TerminalReason::CostBudgetExceeded).model_calls, 3);
}

/// What is known of the next call holds for the call after the commit it was given with,
/// never for a later one: a write's dispatch record is committed before it runs, and what
/// was given with that commit is not taken for the call after the write.
#[test]
fn what_is_known_of_the_next_call_is_taken_by_the_next_commit() {
    let config = RunConfig {
        run_id: "r".into(),
        goal: "g".into(),
        manifest: crate::harness::manifest(Budget {
            max_tokens: Some(1_000),
            ..Budget::default()
        }),
        tools: vec![tool("write", Risk::Write).spec],
    };
    let mut m = Machine::start(config, T0);
    let mut version = next_commit(&mut m).len() as u64;
    m.handle(Input::Committed { version }).unwrap();
    assert!(matches!(m.poll_command(), Some(Command::CallModel { .. })));
    let call = ToolCall::new("w", "write", json!({"n": 1}));
    m.handle(Input::ModelReplied(ModelReply::decision(
        Decision::ToolCalls { calls: vec![call] },
        Usage::tokens(100, 20),
    )))
    .unwrap();
    let Some(Command::CheckCalls { calls, .. }) = m.poll_command() else {
        panic!("the call is checked first")
    };
    let verdicts = calls
        .iter()
        .map(|c| (c.id.clone(), Verdict::Allow))
        .collect();
    m.handle(Input::CallsChecked {
        verdicts,
        paths: Default::default(),
    })
    .unwrap();
    let events = next_commit(&mut m);
    assert!(
        events.iter().any(|e| e.name() == "effect_dispatched"),
        "{events:?}"
    );
    version += events.len() as u64;
    m.observe_next_call(Usage::tokens(5_000, 0));
    m.handle(Input::Committed { version }).unwrap();
    let Some(Command::ExecuteTools { group, .. }) = m.poll_command() else {
        panic!("the write runs once its dispatch is durable")
    };
    let results = group
        .iter()
        .map(|c| ToolResult::ok(c.call.id.clone(), &c.call.name, "x"))
        .collect();
    m.handle(Input::ToolsFinished { results }).unwrap();
    version += next_commit(&mut m).len() as u64;
    m.handle(Input::Committed { version }).unwrap();
    let next = m.poll_command();
    assert!(
        matches!(next, Some(Command::CallModel { .. })),
        "what was given with the dispatch's commit stops no call: {next:?}"
    );
}

#[test]
fn denials_until_the_limit_are_a_policy_violation() {
    let mut w = world(vec![
        Calls(vec![("w1", "write", json!({"n": 1}))]),
        Calls(vec![("w2", "write", json!({"n": 2}))]),
        Calls(vec![("w3", "write", json!({"n": 3}))]),
        Final("never"),
    ]);
    w.verdicts.insert(
        "write".into(),
        Verdict::Deny {
            reason: "writes are denied by --deny write".into(),
        },
    );
    let r = check(w, TerminalReason::PolicyViolation);
    assert!(r.executed.is_empty());
    assert_eq!(r.result_of("w1").error_kind(), Some(ErrorKind::Denied));
    assert_eq!(r.model_calls, 3);
}

#[test]
fn a_denial_then_another_plan_resets_the_denial_count() {
    let mut w = world(vec![
        Calls(vec![("w1", "write", json!({"n": 1}))]),
        Calls(vec![("w2", "write", json!({"n": 2}))]),
        Calls(vec![read("r", "a")]),
        Calls(vec![("w3", "write", json!({"n": 3}))]),
        Final("ok"),
    ]);
    w.verdicts.insert(
        "write".into(),
        Verdict::Deny {
            reason: "no".into(),
        },
    );
    check(w, TerminalReason::Completed);
}

#[test]
fn unavailable_tool_fails_the_run() {
    let mut w = world(vec![Calls(vec![read("c1", "a")]), Final("never")]);
    w.verdicts.insert(
        "read".into(),
        Verdict::Unavailable {
            reason: "its MCP server exited and did not restart".into(),
        },
    );
    let r = check(w, TerminalReason::ToolUnavailable);
    assert!(r.executed.is_empty());
    assert!(r.outcome.message.contains("MCP server"));
}

#[test]
fn unknown_outcome_of_a_side_effect_pauses_and_is_not_repeated() {
    let mut w = world(vec![
        Calls(vec![("p1", "pay", json!({"amount": 10}))]),
        Final("never"),
    ]);
    w.tools.push(tool("pay", Risk::External).fails(
        ErrorKind::OutcomeUnknown,
        "connection reset after the request was sent",
    ));
    let r = check(w, TerminalReason::OutcomeUnknown);
    assert_eq!(r.executed.len(), 1);
    assert!(r.outcome.message.contains("p1"));
    assert_eq!(r.model_calls, 1);
}

#[test]
fn commit_failure_stops_with_checkpoint_failed_and_asks_nothing_more() {
    let mut w = world(vec![Calls(vec![read("c1", "a")]), Final("never")]);
    w.fail_commit = Some(2);
    let r = check(w, TerminalReason::CheckpointFailed);
    assert_eq!(
        r.model_calls, 1,
        "the model is not asked again after a failed commit"
    );
    assert_eq!(
        r.events(),
        ["run_started"],
        "the failed turn is not in the log"
    );
    assert!(r.outcome.message.contains("disk full"));
}

#[test]
fn failing_the_very_first_commit_never_asks_the_model() {
    let mut w = world(vec![Final("never")]);
    w.fail_commit = Some(1);
    let r = check(w, TerminalReason::CheckpointFailed);
    assert_eq!(r.model_calls, 0);
}

#[test]
fn inputs_out_of_turn_are_refused_without_changing_anything() {
    let config = RunConfig {
        run_id: "r".into(),
        goal: "g".into(),
        manifest: crate::harness::manifest(Budget::default()),
        tools: vec![],
    };
    let mut m = Machine::start(config, 0);
    let err = m
        .handle(Input::ToolsFinished { results: vec![] })
        .unwrap_err();
    assert_eq!(
        err,
        InputError::Unexpected {
            input: "ToolsFinished",
            phase: "AwaitingCommit"
        }
    );
    assert!(matches!(m.poll_command(), Some(Command::Commit { .. })));
    assert_eq!(m.poll_command(), None);
}

/// `max_write_actions` counts within one batch too: with one write left, the second write
/// of a batch waits for a person.
#[test]
fn the_write_budget_counts_within_a_batch() {
    let mut w = world(vec![
        Calls(vec![
            ("w1", "write", json!({"n": 1})),
            ("w2", "write", json!({"n": 2})),
        ]),
        Final("x"),
    ]);
    w.budget.max_write_actions = Some(1);
    let r = check(w, TerminalReason::ApprovalRequired);
    let pending: Vec<&str> = r
        .outcome
        .pending
        .iter()
        .map(|p| p.call_id.as_str())
        .collect();
    assert_eq!(pending, ["w2"]);
    assert!(r.outcome.pending[0].why.contains("max_write_actions = 1"));
}

/// The tool-call budget allows exactly that many calls: a batch that reaches it runs, one
/// that would pass it does not start.
#[test]
fn the_tool_call_budget_is_a_limit_reached_not_passed() {
    let mut w = world(vec![
        Calls(vec![read("c1", "a"), read("c2", "b")]),
        Final("two read"),
    ]);
    w.budget.max_tool_calls = 2;
    let r = check(w, TerminalReason::Completed);
    assert_eq!(r.executed.len(), 2);
    let mut w = world(vec![
        Calls(vec![read("c1", "a"), read("c2", "b"), read("c3", "c")]),
        Final("never"),
    ]);
    w.budget.max_tool_calls = 2;
    let r = check(w, TerminalReason::ToolBudgetExhausted);
    assert!(r.executed.is_empty());
}

/// A machine started under `budget` with one read tool, its first commit confirmed: it asks
/// for the first model call.
fn asking(budget: Budget) -> Machine {
    let config = RunConfig {
        run_id: "r".into(),
        goal: "g".into(),
        manifest: crate::harness::manifest(budget),
        tools: vec![tool("read", Risk::Read).spec],
    };
    let mut m = Machine::start(config, T0);
    let Some(Command::Commit { entries, .. }) = m.poll_command() else {
        panic!("the start is committed first")
    };
    m.handle(Input::Committed {
        version: entries.len() as u64,
    })
    .unwrap();
    assert!(matches!(m.poll_command(), Some(Command::CallModel { .. })));
    m
}

/// The events of the next command, which must be a commit.
fn next_commit(m: &mut Machine) -> Vec<Event> {
    match m.poll_command() {
        Some(Command::Commit { entries, .. }) => entries.into_iter().map(|e| e.event).collect(),
        other => panic!("expected a commit, got {other:?}"),
    }
}

/// A reply that comes as the wall-clock budget runs out is handed with the time it came
/// at: it is kept (it was paid for), and what it asks is not done. A `Tick` first would
/// have ended the run and left the reply nowhere to go.
#[test]
fn a_reply_that_comes_past_the_deadline_is_kept_and_nothing_it_asks_is_done() {
    let mut m = asking(Budget {
        max_wall_time_ms: Some(1_000),
        ..Budget::default()
    });
    m.observe_time(T0 + 1_500);
    let calls = vec![ToolCall::new("c1", "read", json!({}))];
    m.handle(Input::ModelReplied(ModelReply::decision(
        Decision::ToolCalls { calls },
        Usage::tokens(900, 40),
    )))
    .unwrap();
    let events = next_commit(&mut m);
    let names: Vec<&str> = events.iter().map(Event::name).collect();
    assert_eq!(names, ["decision_proposed", "run_ended"]);
    let Event::RunEnded { outcome } = &events[1] else {
        unreachable!()
    };
    assert_eq!(outcome.reason, TerminalReason::DeadlineExceeded);
    // A final answer needs nothing done: it completes, however late.
    let mut m = asking(Budget {
        max_wall_time_ms: Some(1_000),
        ..Budget::default()
    });
    m.observe_time(T0 + 1_500);
    m.handle(Input::ModelReplied(ModelReply::decision(
        Decision::Final {
            answer: "late".into(),
        },
        Usage::default(),
    )))
    .unwrap();
    let events = next_commit(&mut m);
    assert!(
        matches!(&events[1], Event::RunEnded { outcome } if outcome.reason == TerminalReason::Completed)
    );
}

/// What a summary's model calls used is committed with the compaction (or with a summary
/// not used) and counts toward the budgets before the model is asked again.
#[test]
fn a_summary_s_usage_counts_toward_the_budget() {
    for declined in [false, true] {
        let mut m = asking(Budget {
            max_tokens: Some(1_000),
            ..Budget::default()
        });
        let usage = Usage::tokens(900, 100);
        m.handle(if declined {
            Input::CompactionDeclined {
                tokens_before: 5_000,
                tokens_after: 6_000,
                usage,
            }
        } else {
            Input::ContextCompacted {
                summary: "s".into(),
                through_version: 1,
                tokens_before: 5_000,
                tokens_after: 500,
                usage,
                window: None,
            }
        })
        .unwrap();
        let events = next_commit(&mut m);
        assert_eq!(events.len(), 1);
        m.handle(Input::Committed { version: 2 }).unwrap();
        let Some(Command::Commit { entries, .. }) = m.poll_command() else {
            panic!("the budget is spent: the run ends, the model is not asked")
        };
        let Event::RunEnded { outcome } = &entries[0].event else {
            panic!("{entries:?}")
        };
        assert_eq!(
            outcome.reason,
            TerminalReason::CostBudgetExceeded,
            "{declined}"
        );
        assert_eq!(m.state().usage.total_tokens(), 1_000);
    }
}

/// The log's words for a summary's cost and an estimated usage (what `agent show --json`
/// and other readers of a log see), and logs without them read as before.
#[test]
fn summaries_and_estimates_are_written_in_the_log_s_words() {
    for (file, name) in [
        ("compaction-declined-estimated", "compaction_declined"),
        ("context-compacted-with-usage", "context_compacted"),
    ] {
        let path = format!(
            "{}/../fuzz/corpus/stored_events/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(path).unwrap();
        let entry: Entry = serde_json::from_str(&text).unwrap();
        assert_eq!(entry.event.name(), name);
        assert_eq!(
            serde_json::to_value(&entry).unwrap(),
            serde_json::from_str::<serde_json::Value>(&text).unwrap()
        );
    }
    let declined: Entry = serde_json::from_str(
        r#"{"version":7,"at_ms":1,"type":"compaction_declined","tokens_before":9,"tokens_after":10,
            "usage":{"input_tokens":900,"output_tokens":30,"estimated":true}}"#,
    )
    .unwrap();
    let Event::CompactionDeclined { usage, .. } = declined.event else {
        unreachable!()
    };
    assert!(usage.estimated);
    let old: Event = serde_json::from_str(
        r#"{"type":"context_compacted","summary":"s","through_version":3,"tokens_before":9,"tokens_after":1}"#,
    )
    .unwrap();
    assert!(matches!(old, Event::ContextCompacted { usage, .. } if usage.is_zero()));
}

/// An attempt the provider accepted before it failed may be billed: what its retry record
/// says it may have cost counts in the run's usage, as a call's own does.
#[test]
fn what_a_retried_attempt_may_have_cost_counts() {
    let mut m = asking(Budget::default());
    let retry = Retry {
        attempt: 1,
        reason: "the stream broke".into(),
        wait_ms: 500,
        usage: Usage {
            estimated: true,
            ..Usage::tokens(900, 100)
        },
    };
    // The last attempt too was accepted, and then failed for good.
    m.handle(Input::ModelFailed {
        message: "gave up".into(),
        kind: ModelErrorKind::Transport,
        retries: vec![retry],
        usage: Usage {
            estimated: true,
            ..Usage::tokens(900, 20)
        },
        by_budget: false,
    })
    .unwrap();
    let events = next_commit(&mut m);
    assert_eq!(events[0].name(), "model_retried");
    assert_eq!(events[1].name(), "model_failed");
    let ended = events.last().unwrap();
    assert!(
        matches!(ended, Event::RunEnded { outcome } if outcome.reason == TerminalReason::ModelError),
        "{ended:?}"
    );
    m.handle(Input::Committed {
        version: 1 + events.len() as u64,
    })
    .unwrap();
    assert_eq!(m.state().usage.total_tokens(), 1_920);
    assert!(m.state().usage.estimated);
}

/// A provider's failure whose retries the run's budget could not pay for (the provider
/// says so: `by_budget`) stops the run as the budget does before a call,
/// `cost_budget_exceeded`, with the failure in the log and the message; the provider's
/// kind of failure is kept beside it.
#[test]
fn retries_the_budget_could_not_pay_for_stop_the_run_on_its_budget() {
    let mut m = asking(Budget {
        max_tokens: Some(2_000),
        ..Budget::default()
    });
    m.handle(Input::ModelFailed {
        message: "the stream broke (gave up after 1 attempt: another could pass the run's \
                  budget)"
            .into(),
        kind: ModelErrorKind::Transport,
        retries: Vec::new(),
        usage: Usage {
            estimated: true,
            ..Usage::tokens(1_500, 20)
        },
        by_budget: true,
    })
    .unwrap();
    let events = next_commit(&mut m);
    let names: Vec<&str> = events.iter().map(|e| e.name()).collect();
    assert_eq!(names, ["model_failed", "run_ended"]);
    let Event::RunEnded { outcome } = &events[1] else {
        unreachable!()
    };
    assert_eq!(outcome.reason, TerminalReason::CostBudgetExceeded);
    assert_eq!(outcome.model_error, Some(ModelErrorKind::Transport));
    assert!(
        outcome.message.contains("the stream broke"),
        "{}",
        outcome.message
    );
}

/// A machine rebuilt from its log may ask for a model call before any commit could take
/// what is known of it ([`Machine::observe_next_call`]): [`Machine::recheck_next_call`]
/// checks the budgets with it then, and ends the run instead of a call that would pass
/// one; it leaves anything but a lone call where it is.
#[test]
fn a_resumed_run_s_first_call_is_checked_with_what_is_known_of_it() {
    let mut w = world(vec![Calls(vec![read("r1", "a")]), Final("done")]);
    w.budget.max_tokens = Some(10_000);
    let specs: Vec<ToolSpec> = w.tools.iter().map(|t| t.spec.clone()).collect();
    let report = check(w, TerminalReason::Completed);
    // The log as a process that died right after the read's result was committed left it.
    let read = report
        .log
        .iter()
        .position(|e| e.event.name() == "tool_finished")
        .unwrap();
    let prefix = &report.log[..=read];
    let resumed = || Machine::resume(specs.clone(), prefix, T0).unwrap();
    let used = resumed().state().usage.total_tokens();
    assert!(used > 0);
    let mut m = resumed();
    m.recheck_next_call(Usage::tokens(10_000 - used + 1, 0));
    match next_commit(&mut m).as_slice() {
        [Event::RunEnded { outcome }] => {
            assert_eq!(outcome.reason, TerminalReason::CostBudgetExceeded);
            assert!(
                outcome.message.contains("so it was not made"),
                "{}",
                outcome.message
            );
        }
        other => panic!("the call is not made: {other:?}"),
    }
    assert_eq!(m.poll_command(), None);
    let mut m = resumed();
    m.recheck_next_call(Usage::tokens(10_000 - used, 0));
    assert!(matches!(
        m.poll_command(),
        Some(Command::CallModel { turn: 2 })
    ));
    assert_eq!(m.poll_command(), None);
    // A run that is not about to call the model is left alone: here the run's start,
    // still to be committed.
    let config = RunConfig {
        run_id: "r".into(),
        goal: "g".into(),
        manifest: crate::harness::manifest(Budget {
            max_tokens: Some(1),
            ..Budget::default()
        }),
        tools: specs,
    };
    let mut fresh = Machine::start(config, T0);
    fresh.recheck_next_call(Usage::tokens(1_000, 0));
    let names: Vec<&str> = next_commit(&mut fresh).iter().map(Event::name).collect();
    assert_eq!(names, ["run_started"]);
}
