//! One scenario per terminal reason and per branch of the turn.

use agent_core::*;
use serde_json::json;

use crate::harness::{Person, Reply::*, T0, check, tool, world};

fn read(id: &'static str, path: &str) -> (&'static str, &'static str, serde_json::Value) {
    (id, "read", json!({ "path": path }))
}

// ----- finished ----------------------------------------------------------------------------

#[test]
fn direct_answer_completes_after_one_model_call() {
    let r = check(world(vec![Final("42")]), TerminalReason::Completed);
    assert_eq!(r.outcome.answer.as_deref(), Some("42"));
    assert_eq!(r.model_calls, 1);
    assert_eq!(
        r.events(),
        ["run_started", "decision_proposed", "run_ended"]
    );
    assert_eq!(
        r.commands,
        [
            "commit [\"run_started\"]",
            "call_model 1",
            "commit [\"decision_proposed\", \"run_ended\"]",
            "finish completed"
        ]
    );
}

#[test]
fn one_tool_call_then_answer() {
    let r = check(
        world(vec![Calls(vec![read("c1", "a.txt")]), Final("done")]),
        TerminalReason::Completed,
    );
    assert_eq!(r.executed_names(), ["read"]);
    assert!(r.result_of("c1").is_ok());
    assert_eq!(
        r.events(),
        [
            "run_started",
            "decision_proposed",
            "tool_finished",
            "decision_proposed",
            "run_ended"
        ]
    );
}

#[test]
fn parallel_reads_overlap_and_results_keep_the_models_order() {
    let r = check(
        world(vec![
            Calls(vec![
                ("s1", "slow_read", json!({})),
                read("r1", "a"),
                read("r2", "b"),
            ]),
            Final("ok"),
        ]),
        TerminalReason::Completed,
    );
    // One group: all three started at the same instant (the slow one finished last).
    let starts: Vec<u64> = r.executed.iter().map(|e| e.start).collect();
    assert!(starts.iter().all(|s| *s == starts[0]), "{:?}", r.executed);
    assert!(
        r.commands
            .iter()
            .any(|c| c == "execute_tools [\"s1\", \"r1\", \"r2\"]")
    );
    // The log keeps the model's order although results arrived as r1, r2, s1.
    let ids: Vec<&str> = r.results().iter().map(|x| x.call_id.as_str()).collect();
    assert_eq!(ids, ["s1", "r1", "r2"]);
}

#[test]
fn writes_run_alone_in_declared_order() {
    let mut w = world(vec![
        Calls(vec![
            read("r1", "a"),
            ("w1", "write", json!({"path": "a"})),
            read("r2", "b"),
            ("w2", "write", json!({"path": "b"})),
        ]),
        Final("ok"),
    ]);
    w.verdicts.clear();
    let r = check(w, TerminalReason::Completed);
    // Each side effect is recorded as dispatched, durably, before it starts.
    let tools_and_commits: Vec<&str> = r
        .commands
        .iter()
        .map(String::as_str)
        .filter(|c| c.starts_with("execute_tools") || c.contains("effect_dispatched"))
        .collect();
    assert_eq!(
        tools_and_commits,
        [
            "execute_tools [\"r1\"]",
            "commit [\"decision_proposed\", \"tool_finished\", \"effect_dispatched\"]",
            "execute_tools [\"w1\"]",
            "execute_tools [\"r2\"]",
            "commit [\"tool_finished\", \"tool_finished\", \"effect_dispatched\"]",
            "execute_tools [\"w2\"]",
        ]
    );
    // Each write started only after the previous group ended.
    let w1 = &r.executed[1];
    let r2 = &r.executed[2];
    assert!(w1.start >= r.executed[0].end && r2.start >= w1.end);
    // Side effects carry effect keys; reads do not.
    let keys: Vec<bool> = r
        .log
        .iter()
        .filter_map(|e| match &e.event {
            Event::ToolFinished { effect_key, .. } => Some(effect_key.is_some()),
            _ => None,
        })
        .collect();
    assert_eq!(keys, [false, true, false, true]);
}

#[test]
fn partial_failure_keeps_each_result_on_its_own() {
    let mut w = world(vec![
        Calls(vec![read("ok1", "a"), ("bad", "flaky", json!({}))]),
        Final("ok"),
    ]);
    w.tools
        .push(tool("flaky", Risk::Read).fails(ErrorKind::ExecutionFailed, "disk on fire"));
    let r = check(w, TerminalReason::Completed);
    assert!(r.result_of("ok1").is_ok());
    let bad = r.result_of("bad");
    assert_eq!(bad.error_kind(), Some(ErrorKind::ExecutionFailed));
    assert!(bad.content().contains("disk on fire"));
}

// ----- repairs -----------------------------------------------------------------------------

#[test]
fn unknown_tool_and_invalid_arguments_are_repaired() {
    let mut w = world(vec![
        Calls(vec![
            ("c1", "no_such_tool", json!({})),
            ("c2", "strict", json!({"n": "x"})),
        ]),
        Calls(vec![read("c3", "a")]),
        Final("ok"),
    ]);
    w.tools.push(tool("strict", Risk::Read));
    w.verdicts.insert(
        "strict".into(),
        Verdict::Invalid {
            message: "/n: \"x\" is not of type \"integer\"".into(),
        },
    );
    let r = check(w, TerminalReason::Completed);
    let unknown = r.result_of("c1");
    assert_eq!(unknown.error_kind(), Some(ErrorKind::UnknownTool));
    assert!(unknown.content().contains("read"), "names the real tools");
    assert_eq!(
        r.result_of("c2").error_kind(),
        Some(ErrorKind::InvalidArguments)
    );
    assert!(r.result_of("c3").is_ok());
    assert_eq!(r.executed_names(), ["read"]);
}

#[test]
fn unknown_tool_and_invalid_arguments_not_repaired() {
    let bad = || {
        Calls(vec![
            ("c1", "no_such_tool", json!({})),
            ("c2", "strict", json!({"n": "x"})),
        ])
    };
    let mut w = world(vec![
        bad(),
        Calls(vec![("c3", "nope", json!({"k": 1}))]),
        bad(),
        Final("late"),
    ]);
    w.tools.push(tool("strict", Risk::Read));
    w.verdicts.insert(
        "strict".into(),
        Verdict::Invalid {
            message: "/n: bad".into(),
        },
    );
    let r = check(w, TerminalReason::InvalidDecision);
    assert!(r.executed.is_empty());
    assert_eq!(r.model_calls, 3);
}

#[test]
fn invalid_arguments_come_back_with_the_path_and_are_not_run() {
    let mut w = world(vec![Calls(vec![read("c1", "a")]), Final("ok")]);
    w.verdicts.insert(
        "read".into(),
        Verdict::Invalid {
            message: "/path: 7 is not of type \"string\"".into(),
        },
    );
    let r = check(w, TerminalReason::Completed);
    let res = r.result_of("c1");
    assert_eq!(res.error_kind(), Some(ErrorKind::InvalidArguments));
    assert!(res.content().contains("/path"));
    assert!(r.executed.is_empty());
}

#[test]
fn invalid_replies_are_repaired_within_the_limit() {
    let r = check(
        world(vec![Invalid("{oops"), Invalid("still bad"), Final("ok")]),
        TerminalReason::Completed,
    );
    assert_eq!(
        r.events()
            .iter()
            .filter(|e| **e == "decision_rejected")
            .count(),
        2
    );
}

#[test]
fn invalid_decision_past_the_repair_limit() {
    let r = check(
        world(vec![
            Invalid("a"),
            Calls(vec![("c1", "nope", json!({}))]),
            Invalid("c"),
            Final("late"),
        ]),
        TerminalReason::InvalidDecision,
    );
    assert_eq!(r.model_calls, 3);
}

#[test]
fn structurally_broken_decisions_are_invalid() {
    let r = check(
        world(vec![
            Calls(vec![]),
            Calls(vec![read("d", "a"), read("d", "b")]),
            Final(""),
        ]),
        TerminalReason::InvalidDecision,
    );
    let problems: Vec<String> = r
        .log
        .iter()
        .filter_map(|e| match &e.event {
            Event::DecisionRejected { problem, .. } => Some(problem.clone()),
            _ => None,
        })
        .collect();
    assert!(problems[0].contains("empty"), "{problems:?}");
    assert!(problems[1].contains("appears twice"), "{problems:?}");
    assert!(
        problems[2].contains("final answer is empty"),
        "{problems:?}"
    );
    assert!(r.executed.is_empty());
}

// ----- approval ----------------------------------------------------------------------------

fn write_world(person: Option<Person>) -> crate::harness::World {
    let mut w = world(vec![
        Calls(vec![
            read("r1", "a"),
            ("w1", "write", json!({"path": "out.txt"})),
        ]),
        Final("written"),
    ]);
    w.verdicts.insert(
        "write".into(),
        Verdict::Ask {
            why: "write risk asks by default".into(),
        },
    );
    w.person.extend(person);
    w
}

#[test]
fn write_needing_approval_pauses_naming_exactly_the_pending_call() {
    let r = check(write_world(None), TerminalReason::ApprovalRequired);
    let ids: Vec<&str> = r
        .outcome
        .pending
        .iter()
        .map(|p| p.call_id.as_str())
        .collect();
    assert_eq!(ids, ["w1"]);
    assert_eq!(r.outcome.pending[0].why, "write risk asks by default");
    assert!(
        r.executed.is_empty(),
        "nothing of the batch runs before the person answers"
    );
    let folded = RunState::fold(&r.log).unwrap();
    assert!(
        matches!(folded.status, Status::AwaitingApproval(_)),
        "the pause is durable"
    );
}

#[test]
fn approved_write_runs_with_the_allowed_calls() {
    let r = check(
        write_world(Some(Person::Approve)),
        TerminalReason::Completed,
    );
    assert_eq!(r.executed_names(), ["read", "write"]);
    assert!(r.result_of("w1").is_ok());
    assert!(r.events().contains(&"approval_granted"));
}

#[test]
fn denied_write_tells_the_model_and_the_run_goes_on() {
    let r = check(
        write_world(Some(Person::Deny("not today"))),
        TerminalReason::Completed,
    );
    assert_eq!(r.executed_names(), ["read"]);
    let denied = r.result_of("w1");
    assert_eq!(denied.error_kind(), Some(ErrorKind::Denied));
    assert!(denied.content().contains("not today"));
}

#[test]
fn model_asking_approval_without_calls_waits_for_a_person() {
    let r = check(
        world(vec![Ask("may I delete the cache?", vec![]), Final("ok")]),
        TerminalReason::ApprovalRequired,
    );
    assert!(r.outcome.message.contains("delete the cache"));
    let mut w = world(vec![Ask("may I delete the cache?", vec![]), Final("ok")]);
    w.person.push_back(Person::Approve);
    check(w, TerminalReason::Completed);
}

#[test]
fn model_asking_approval_for_calls_asks_even_for_allowed_ones() {
    let mut w = world(vec![
        Ask("read the secrets file?", vec![read("c1", "secrets")]),
        Final("ok"),
    ]);
    w.person.push_back(Person::Approve);
    let r = check(w, TerminalReason::Completed);
    assert_eq!(r.executed_names(), ["read"]);
    assert!(r.events().contains(&"approval_requested"));
}

#[test]
fn write_action_budget_turns_the_next_write_into_a_question() {
    let mut w = world(vec![
        Calls(vec![("w1", "write", json!({"n": 1}))]),
        Calls(vec![("w2", "write", json!({"n": 2}))]),
        Final("ok"),
    ]);
    w.budget.max_write_actions = Some(1);
    let r = check(w, TerminalReason::ApprovalRequired);
    assert_eq!(r.executed_names(), ["write"]);
    assert_eq!(r.outcome.pending[0].call_id.as_str(), "w2");
    assert!(r.outcome.pending[0].why.contains("max_write_actions"));
}

// ----- progress ----------------------------------------------------------------------------

#[test]
fn repeated_plan_gets_one_correction_then_no_progress() {
    let same = || Calls(vec![read("c1", "a.txt"), read("c2", "b.txt")]);
    // Ids and order change; the plan is the same.
    let shuffled = Calls(vec![read("x2", "b.txt"), read("x1", "a.txt")]);
    let r = check(
        world(vec![same(), shuffled, same(), same(), Final("never")]),
        TerminalReason::NoProgress,
    );
    // Executed exactly max_repeated_plan (2) times, two calls each.
    assert_eq!(r.executed.len(), 4);
    let corrections: Vec<&String> = r
        .log
        .iter()
        .filter_map(|e| match &e.event {
            Event::CorrectionIssued { message, .. } => Some(message),
            _ => None,
        })
        .collect();
    assert_eq!(corrections.len(), 1);
    assert!(
        corrections[0].contains("read -> {\"path\":\"a.txt\"}"),
        "{}",
        corrections[0]
    );
    assert_eq!(r.model_calls, 4);
}

#[test]
fn a_different_plan_after_the_correction_goes_on() {
    let same = || Calls(vec![read("c1", "a.txt")]);
    let r = check(
        world(vec![
            same(),
            same(),
            same(),
            Calls(vec![read("c9", "z")]),
            Final("ok"),
        ]),
        TerminalReason::Completed,
    );
    assert_eq!(r.executed.len(), 3);
}

// ----- the other stops ---------------------------------------------------------------------

#[test]
fn clarification_pauses_with_the_question() {
    let r = check(
        world(vec![Clarify("which branch?")]),
        TerminalReason::ClarificationRequired,
    );
    assert!(r.outcome.message.contains("which branch?"));
    assert_eq!(r.outcome.answer, None);
}

#[test]
fn cannot_continue_fails_with_the_reason() {
    let r = check(
        world(vec![Give("no access")]),
        TerminalReason::CannotContinue,
    );
    assert!(r.outcome.message.contains("no access"));
}

#[test]
fn model_error_ends_the_run_and_is_logged() {
    let r = check(
        world(vec![Fail("503 after 4 attempts")]),
        TerminalReason::ModelError,
    );
    assert!(r.events().contains(&"model_failed"));
    assert!(r.outcome.message.contains("503"));
    // The class travels with the failure: into the log and the outcome, for the caller.
    assert_eq!(r.outcome.model_error, Some(ModelErrorKind::Server));
    let logged = r.log.iter().find_map(|e| match &e.event {
        Event::ModelFailed { kind, .. } => Some(*kind),
        _ => None,
    });
    assert_eq!(logged, Some(ModelErrorKind::Server));
}

#[test]
fn model_error_kinds_are_written_as_their_names_and_default_for_old_logs() {
    use ModelErrorKind::*;
    for kind in [
        RateLimited,
        Auth,
        NotFound,
        BadRequest,
        Server,
        Transport,
        Decode,
        Setup,
        Exhausted,
        Other,
    ] {
        let json = serde_json::to_value(kind).unwrap();
        assert_eq!(json, kind.as_str(), "{kind:?}");
        assert_eq!(
            serde_json::from_value::<ModelErrorKind>(json).unwrap(),
            kind
        );
        assert_eq!(
            kind.is_transient(),
            matches!(kind, RateLimited | Server | Transport),
            "{kind:?}"
        );
    }
    // A log written before kinds were recorded still reads.
    let old: Event =
        serde_json::from_str(r#"{"type":"model_failed","turn":1,"message":"503"}"#).unwrap();
    assert_eq!(
        old,
        Event::ModelFailed {
            turn: 1,
            message: "503".into(),
            kind: Other
        }
    );
}

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

// ----- machine protocol --------------------------------------------------------------------

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

#[test]
fn resume_from_a_paused_log_continues_with_the_approval() {
    let paused = check(write_world(None), TerminalReason::ApprovalRequired);
    let tools: Vec<ToolSpec> = write_world(None)
        .tools
        .iter()
        .map(|t| t.spec.clone())
        .collect();
    let mut m = Machine::resume(tools, &paused.log, T0 + 60_000).unwrap();
    let Some(Command::AwaitApproval { pending, .. }) = m.poll_command() else {
        panic!("a resumed paused run asks the person again");
    };
    assert_eq!(pending.len(), 1);
    m.handle(Input::ApprovalGranted {
        call_ids: vec![CallId::from("w1")],
    })
    .unwrap();
    let Some(Command::ExecuteTools { group, .. }) = m.poll_command() else {
        panic!("approval runs the batch, reads first");
    };
    let ids: Vec<&str> = group.iter().map(|c| c.call.id.as_str()).collect();
    assert_eq!(ids, ["r1"]);
    assert_eq!(
        m.handle(Input::ApprovalGranted { call_ids: vec![] })
            .unwrap_err(),
        InputError::Unexpected {
            input: "ApprovalGranted",
            phase: "AwaitingTools"
        }
    );
}

#[test]
fn approving_a_call_that_is_not_pending_is_refused() {
    let paused = check(write_world(None), TerminalReason::ApprovalRequired);
    let tools: Vec<ToolSpec> = write_world(None)
        .tools
        .iter()
        .map(|t| t.spec.clone())
        .collect();
    let mut m = Machine::resume(tools, &paused.log, T0).unwrap();
    let _ = m.poll_command();
    assert_eq!(
        m.handle(Input::ApprovalGranted {
            call_ids: vec![CallId::from("r1")]
        })
        .unwrap_err(),
        InputError::NotPending(CallId::from("r1"))
    );
}

#[test]
fn resume_of_a_damaged_log_is_an_error_not_a_panic() {
    let done = check(world(vec![Final("x")]), TerminalReason::Completed);
    let mut gap = done.log.clone();
    gap.remove(1);
    let err = Machine::resume(vec![], &gap, T0).unwrap_err();
    assert!(err.to_string().contains("not contiguous"), "{err}");
    assert!(Machine::resume(vec![], &[], T0).is_err());
    let mut headless = done.log.clone();
    headless.remove(0);
    for (i, e) in headless.iter_mut().enumerate() {
        e.version = i as u64 + 1;
    }
    assert!(Machine::resume(vec![], &headless, T0).is_err());
}

#[test]
fn resume_of_a_finished_run_only_finishes() {
    let done = check(world(vec![Final("x")]), TerminalReason::Completed);
    let mut m = Machine::resume(vec![], &done.log, T0).unwrap();
    let Some(Command::Finish(outcome)) = m.poll_command() else {
        panic!()
    };
    assert_eq!(outcome.answer.as_deref(), Some("x"));
    assert_eq!(m.poll_command(), None);
}

#[test]
fn a_batch_is_committed_in_the_models_order_whatever_happened_to_each_call() {
    let mut w = world(vec![
        Calls(vec![
            read("c1", "a"),
            ("c2", "missing_tool", json!({})),
            ("c3", "write", json!({"n": 1})),
            ("c4", "slow_read", json!({})),
        ]),
        Final("ok"),
    ]);
    w.verdicts.insert(
        "write".into(),
        Verdict::Deny {
            reason: "no".into(),
        },
    );
    let r = check(w, TerminalReason::Completed);
    let ids: Vec<&str> = r.results().iter().map(|x| x.call_id.as_str()).collect();
    assert_eq!(ids, ["c1", "c2", "c3", "c4"]);
}

#[test]
fn unknown_outcome_settled_by_a_person_continues_without_running_it_again() {
    let script = || {
        vec![
            Calls(vec![("p1", "pay", json!({"amount": 10}))]),
            Final("paid"),
        ]
    };
    let pay = || tool("pay", Risk::External).fails(ErrorKind::OutcomeUnknown, "connection reset");
    let mut w = world(script());
    w.tools.push(pay());
    w.verdicts.insert("pay".into(), Verdict::Allow);
    w.person.push_back(Person::Settle(Resolution::Committed));
    let r = check(w, TerminalReason::Completed);
    assert_eq!(
        r.executed.len(),
        1,
        "the person's word, not a second payment"
    );
    assert!(r.result_of("p1").content().contains("a person confirmed"));
    assert!(r.events().contains(&"effect_resolved"));
}

#[test]
fn unknown_outcome_settled_as_retry_runs_the_call_again_once() {
    let script = || {
        vec![
            Calls(vec![("p1", "pay", json!({"amount": 10}))]),
            Final("paid"),
        ]
    };
    let mut w = world(script());
    w.tools
        .push(tool("pay", Risk::External).fails(ErrorKind::OutcomeUnknown, "connection reset"));
    w.verdicts.insert("pay".into(), Verdict::Allow);
    // Retry: it runs again, is in doubt again; then the person confirms it.
    w.person.push_back(Person::Settle(Resolution::Retry));
    w.person.push_back(Person::Settle(Resolution::Committed));
    let r = check(w, TerminalReason::Completed);
    assert_eq!(
        r.executed.len(),
        2,
        "run again exactly once, on the person's word"
    );
    let settled = r
        .events()
        .iter()
        .filter(|e| **e == "effect_resolved")
        .count();
    assert_eq!(settled, 2);
}

#[test]
fn unknown_outcome_settled_as_rejected_is_not_run_again() {
    let script = || {
        vec![
            Calls(vec![("p1", "pay", json!({"amount": 10}))]),
            Final("not paid"),
        ]
    };
    let mut w = world(script());
    w.tools
        .push(tool("pay", Risk::External).fails(ErrorKind::OutcomeUnknown, "connection reset"));
    w.verdicts.insert("pay".into(), Verdict::Allow);
    w.person.push_back(Person::Settle(Resolution::Rejected));
    let r = check(w, TerminalReason::Completed);
    assert_eq!(r.executed.len(), 1, "never run again");
    let result = r.result_of("p1");
    assert!(
        !result.is_ok(),
        "the model is told it did not take effect: {result:?}"
    );
    assert!(r.events().contains(&"effect_resolved"));
}

/// The fold refuses what no run can have written: events before the start, a second
/// start, events after an end for good. A run paused by its end may still be cancelled.
#[test]
fn the_fold_refuses_logs_no_run_writes() {
    let done = check(world(vec![Final("x")]), TerminalReason::Completed);
    let renumber = |mut log: Vec<Entry>| {
        for (i, e) in log.iter_mut().enumerate() {
            e.version = i as u64 + 1;
        }
        log
    };
    let refused = |log: &[Entry]| RunState::fold(log).unwrap_err();
    let headless = renumber(done.log[1..].to_vec());
    let err = refused(&headless);
    assert_eq!((err.version, err.event), (1, done.log[1].event.name()));
    assert!(err.problem.contains("run_started"), "{err}");
    let twice = renumber(vec![done.log[0].clone(), done.log[0].clone()]);
    let err = refused(&twice);
    assert_eq!((err.version, err.event), (2, "run_started"));
    let ended_at = |reason: TerminalReason| Entry {
        version: 0,
        at_ms: T0,
        event: Event::RunEnded {
            outcome: Outcome::stop(reason, "x"),
        },
    };
    let mut after_end = done.log.clone();
    after_end.push(ended_at(TerminalReason::Cancelled));
    let after_end = renumber(after_end);
    let err = refused(&after_end);
    assert_eq!(
        (err.version, err.event),
        (after_end.len() as u64, "run_ended")
    );
    // A question for a person ends the invocation, not the run: cancelling it is allowed,
    // and only that.
    let asked = check(
        world(vec![Clarify("which?")]),
        TerminalReason::ClarificationRequired,
    );
    let mut cancelled = asked.log.clone();
    cancelled.push(ended_at(TerminalReason::Cancelled));
    let state = RunState::fold(&renumber(cancelled)).unwrap();
    assert_eq!(
        state.outcome().map(|o| o.reason),
        Some(TerminalReason::Cancelled)
    );
    let mut completed = asked.log.clone();
    completed.push(ended_at(TerminalReason::Completed));
    let completed = renumber(completed);
    let err = refused(&completed);
    assert_eq!(
        (err.version, err.event),
        (completed.len() as u64, "run_ended")
    );
}

/// After a crash right after a dispatch record, what the tool finds decides: not applied,
/// the call runs; applied, it does not, and its receipt is the result.
#[test]
fn a_finding_after_a_crash_decides_whether_the_call_runs() {
    use crate::harness::{resume, run};
    for (finding, runs) in [
        (Finding::NotApplied, 1),
        (
            Finding::Applied {
                receipt: "the line is there".into(),
            },
            0,
        ),
    ] {
        let mut w = world(vec![
            Calls(vec![("w1", "write", json!({"n": 1}))]),
            Final("done"),
        ]);
        w.reconcile = Some(finding.clone());
        let full = run(w.clone());
        let at = full
            .boundaries
            .iter()
            .find(|b| {
                matches!(
                    full.log[b.log_len - 1].event,
                    Event::EffectDispatched { .. }
                )
            })
            .unwrap();
        let resumed = resume(w, &full.log, at);
        assert_eq!(
            resumed.outcome.reason,
            TerminalReason::Completed,
            "{finding:?}"
        );
        assert_eq!(resumed.executed.len(), runs, "{finding:?}");
        let result = resumed.result_of("w1").content();
        if runs == 0 {
            assert!(result.contains("the line is there"), "{result}");
        }
    }
}

/// Paused for approval, a run ignores a passing deadline (nobody is waiting on the clock)
/// but ends on a cancel.
#[test]
fn a_paused_run_ends_on_a_cancel_not_on_the_clock() {
    let mut w = world(vec![
        Calls(vec![("w1", "write", json!({"n": 1}))]),
        Final("x"),
    ]);
    w.asks_for("write");
    w.budget.max_wall_time_ms = Some(1_000);
    let paused = check(w.clone(), TerminalReason::ApprovalRequired);
    let specs: Vec<ToolSpec> = w.tools.iter().map(|t| t.spec.clone()).collect();
    let mut m = Machine::resume(specs, &paused.log, T0).unwrap();
    assert!(matches!(
        m.poll_command(),
        Some(Command::AwaitApproval { .. })
    ));
    m.handle(Input::Tick(T0 + 60_000)).unwrap();
    assert_eq!(m.poll_command(), None, "still waiting for the person");
    m.handle(Input::Cancel).unwrap();
    let Some(Command::Commit { entries, .. }) = m.poll_command() else {
        panic!("the cancel is committed")
    };
    assert!(matches!(&entries.last().unwrap().event,
        Event::RunEnded { outcome } if outcome.reason == TerminalReason::Cancelled));
}

/// A call a person approved before a restart is not asked about again: after the crash
/// its effect is looked up (not applied), and it runs on the approval already committed.
#[test]
fn an_approval_committed_before_a_crash_holds_after_it() {
    use crate::harness::{resume, run};
    let mut w = world(vec![
        Calls(vec![("w1", "write", json!({"n": 1}))]),
        Final("written"),
    ]);
    w.asks_for("write");
    w.person.push_back(Person::Approve);
    w.reconcile = Some(Finding::NotApplied);
    let full = run(w.clone());
    assert_eq!(full.outcome.reason, TerminalReason::Completed);
    let granted = full
        .boundaries
        .iter()
        .find(|b| {
            full.log[..b.log_len]
                .iter()
                .any(|e| matches!(e.event, Event::ApprovalGranted { .. }))
        })
        .unwrap();
    let resumed = resume(w, &full.log, granted);
    assert_eq!(resumed.outcome.reason, TerminalReason::Completed);
    assert_eq!(resumed.executed.len(), 1);
    assert!(
        !resumed.events()[granted.log_len..].contains(&"approval_requested"),
        "{:?}",
        resumed.events()
    );
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

/// Approving one of two pending calls records the approval and waits for the other: nothing
/// runs before every pending call is settled (cargo-mutants found no test of it).
#[test]
fn approving_one_of_two_pending_calls_waits_for_the_other() {
    let mut w = world(vec![
        Calls(vec![
            ("w1", "write", json!({"path": "a"})),
            ("w2", "write", json!({"path": "b"})),
        ]),
        Final("done"),
    ]);
    w.asks_for("write");
    w.person.push_back(Person::Away);
    let paused = check(w.clone(), TerminalReason::ApprovalRequired);
    let specs: Vec<ToolSpec> = w.tools.iter().map(|t| t.spec.clone()).collect();
    let mut m = Machine::resume(specs, &paused.log, T0 + 1_000).unwrap();
    assert!(matches!(
        m.poll_command(),
        Some(Command::AwaitApproval { .. })
    ));
    m.handle(Input::ApprovalGranted {
        call_ids: vec!["w1".into()],
    })
    .unwrap();
    let Some(Command::Commit { entries, .. }) = m.poll_command() else {
        panic!("the approval is committed first");
    };
    let names: Vec<&str> = entries.iter().map(|e| e.event.name()).collect();
    assert_eq!(names, ["approval_granted"], "nothing dispatched yet");
    let version = entries.last().unwrap().version;
    m.handle(Input::Committed { version }).unwrap();
    match m.poll_command() {
        Some(Command::AwaitApproval { pending, .. }) => {
            let ids: Vec<&str> = pending.iter().map(|p| p.call_id.as_str()).collect();
            assert_eq!(ids, ["w2"]);
        }
        other => panic!("expected to wait for w2, got {other:?}"),
    }
}
