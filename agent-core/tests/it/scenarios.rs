//! One scenario per terminal reason and per branch of the turn.

use agent_core::*;
use serde_json::json;

use crate::harness::{Person, Reply::*, check, tool, world};

pub(crate) fn read(
    id: &'static str,
    path: &str,
) -> (&'static str, &'static str, serde_json::Value) {
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
fn a_rejected_reply_is_kept_in_the_log_up_to_a_bound() {
    // What a server sent that is not a decision: the log keeps the first 64 Ki characters
    // of it and says how many more there were; a short one whole.
    let huge: &'static str =
        Box::leak(format!("{{\"é\": \"{}", "ü".repeat(100_000)).into_boxed_str());
    let r = check(
        world(vec![Invalid(huge), Invalid("{oops"), Final("ok")]),
        TerminalReason::Completed,
    );
    let raws: Vec<&str> = r
        .log
        .iter()
        .filter_map(|e| match &e.event {
            Event::DecisionRejected { raw, .. } => Some(raw.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(raws.len(), 2);
    let total = huge.chars().count();
    let (kept, note) = raws[0].split_at(raws[0].rfind('\n').unwrap());
    assert_eq!(kept.chars().count(), MAX_REJECTED_REPLY_CHARS);
    assert!(huge.starts_with(kept));
    assert_eq!(
        note,
        format!(
            "\n[... {} more characters of this reply not kept ...]",
            total - MAX_REJECTED_REPLY_CHARS
        )
    );
    assert_eq!(raws[1], "{oops");
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

/// A call id or tool name is shown to the person who approves the call, on one line with
/// what it does: one with a line break, a terminal escape or a direction override is
/// refused before any call is judged. Other letters are ids like any.
#[test]
fn call_ids_and_tool_names_with_control_or_direction_characters_are_invalid() {
    let rejected = |calls: Vec<(&'static str, &'static str, serde_json::Value)>| {
        let r = check(
            world(vec![Calls(calls), Final("done")]),
            TerminalReason::Completed,
        );
        assert!(r.executed.is_empty());
        r.log
            .iter()
            .find_map(|e| match &e.event {
                Event::DecisionRejected { problem, .. } => Some(problem.clone()),
                _ => None,
            })
            .expect("a rejected decision")
    };
    let args = || json!({"path": "a"});
    for (id, name, shown) in [
        ("c1\nApproved", "read", r#""c1\nApproved""#),
        ("c1", "read\u{1b}[2K", r#""read\u{1b}[2K""#),
        ("c\u{202e}1", "read", r#""c\u{202e}1""#),
        ("c\u{2067}1", "read", r#""c\u{2067}1""#),
        ("c\u{85}1", "read", r#""c\u{85}1""#),
    ] {
        let problem = rejected(vec![("ok", "read", args()), (id, name, args())]);
        assert_eq!(
            problem,
            format!(
                "the call id or tool name {shown} has a control or direction character; use \
                 letters, digits, `_` and `-`"
            )
        );
    }
    let r = check(
        world(vec![
            Calls(vec![("appel-é_1 日本", "read", args())]),
            Final("done"),
        ]),
        TerminalReason::Completed,
    );
    assert_eq!(r.executed.len(), 1);
}

// ----- approval ----------------------------------------------------------------------------

pub(crate) fn write_world(person: Option<Person>) -> crate::harness::World {
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
    // A fold for display counts the same, without hashing calls.
    let driving = RunState::fold(&r.log).unwrap();
    let mut shown = RunState::for_display();
    r.log.iter().for_each(|e| shown.apply(e).unwrap());
    assert_eq!(
        (
            shown.steps,
            shown.tool_calls,
            shown.version,
            &shown.turn_calls
        ),
        (
            driving.steps,
            driving.tool_calls,
            driving.version,
            &driving.turn_calls
        )
    );
    assert!(driving.plan.last.is_some() && shown.plan.last.is_none());
    let call = &driving.turn_calls[0];
    assert!(driving.runs_of(call) > 0);
    assert_eq!(shown.runs_of(call), 0);
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
    for kind in ModelErrorKind::ALL {
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
            kind: Other,
            usage: Usage::default(),
        }
    );
}

// ----- machine protocol --------------------------------------------------------------------

/// Accepts only an answer that says "42".
fn wants_42(answer: &str) -> Option<String> {
    (answer != "42").then(|| format!("expected 42, got {answer:?}"))
}

#[test]
fn a_rejected_answer_goes_back_to_the_model_and_a_valid_one_completes() {
    let mut w = world(vec![Final("41"), Final("42")]);
    w.answer_check = Some(wants_42);
    let r = check(w, TerminalReason::Completed);
    assert_eq!(r.outcome.answer.as_deref(), Some("42"));
    assert_eq!(
        r.events(),
        [
            "run_started",
            "decision_proposed",
            "answer_rejected",
            "decision_proposed",
            "run_ended"
        ]
    );
    let problem = r
        .log
        .iter()
        .find_map(|e| match &e.event {
            Event::AnswerRejected { turn, problem } => Some((*turn, problem.clone())),
            _ => None,
        })
        .expect("the rejection is committed");
    assert_eq!(problem, (1, "expected 42, got \"41\"".to_owned()));
    // The rejection is committed before the model is asked again.
    let checked = r
        .commands
        .iter()
        .position(|c| c.starts_with("check_answer"))
        .unwrap();
    let asked = r.commands.iter().position(|c| c == "call_model 2").unwrap();
    assert!(
        r.commands[checked..asked]
            .iter()
            .any(|c| c.starts_with("commit")),
        "{:?}",
        r.commands
    );
}

#[test]
fn rejected_answers_past_the_repair_limit_stop_with_invalid_decision() {
    let mut w = world(vec![Final("1"), Final("2"), Final("3"), Final("42")]);
    w.answer_check = Some(wants_42);
    let r = check(w, TerminalReason::InvalidDecision);
    // max_invalid_decisions = 2: the third rejection in a row ends the run.
    assert_eq!(r.model_calls, 3);
    assert!(
        r.outcome.message.contains("expected 42, got \"3\""),
        "{}",
        r.outcome.message
    );
    assert_eq!(r.outcome.answer, None);
}

#[test]
fn a_rejected_answer_and_an_invalid_reply_make_one_streak_a_good_turn_breaks() {
    let mut w = world(vec![
        Final("1"),
        Invalid("x"),
        Calls(vec![("c1", "read", json!({}))]),
        Final("2"),
        Invalid("y"),
        Final("42"),
    ]);
    w.answer_check = Some(wants_42);
    let r = check(w, TerminalReason::Completed);
    assert_eq!(r.model_calls, 6);
}

#[test]
fn without_validators_no_answer_is_checked() {
    let r = check(world(vec![Final("41")]), TerminalReason::Completed);
    assert!(!r.commands.iter().any(|c| c.starts_with("check_answer")));
}

#[test]
fn cancel_while_the_answer_is_checked_ends_cancelled_without_an_answer() {
    let mut w = world(vec![Final("42")]);
    w.answer_check = Some(wants_42);
    w.cancel_in_answer_check = true;
    let r = check(w, TerminalReason::Cancelled);
    assert_eq!(r.outcome.answer, None);
}

#[test]
fn validators_recorded_in_the_manifest_apply_after_a_restart() {
    let mut w = world(vec![Final("41"), Final("42")]);
    w.answer_check = Some(wants_42);
    let first = check(w.clone(), TerminalReason::Completed);
    // Restart right after the first commit that holds a rejection.
    let at = first
        .boundaries
        .iter()
        .find(|b| {
            first.log[..b.log_len]
                .iter()
                .any(|e| e.event.name() == "answer_rejected")
        })
        .expect("a boundary after the rejection");
    let resumed = crate::harness::resume(w, &first.log, at);
    assert_eq!(resumed.outcome.reason, TerminalReason::Completed);
    assert!(resumed.commands.iter().any(|c| c == "check_answer \"42\""));
}

#[test]
fn a_sub_agent_reported_again_counts_only_what_it_used_since() {
    let entry = |version: u64, event: Event| Entry {
        version,
        at_ms: version,
        event,
    };
    let child = |version: u64, run_id: &str, cost: f64| {
        let mut usage = Usage::tokens(100, 10);
        usage.cost_usd = cost;
        entry(
            version,
            Event::SubAgentFinished {
                turn: 1,
                call_id: CallId::from("d1"),
                run_id: run_id.into(),
                usage,
            },
        )
    };
    let log = vec![
        entry(
            1,
            Event::RunStarted {
                run_id: "p".into(),
                goal: "g".into(),
                manifest: crate::harness::manifest(Budget::default()),
            },
        ),
        child(2, "p.a", 0.5),
        // The same child after a pause: its total, of which 0.5 was counted.
        child(3, "p.a", 0.8),
        child(4, "p.b", 0.25),
    ];
    let state = RunState::fold(&log).unwrap();
    assert!(
        (state.usage.cost_usd - 1.05).abs() < 1e-9,
        "{:?}",
        state.usage
    );
    assert_eq!(
        state.usage.input_tokens, 200,
        "the same child's tokens once, then the other's"
    );
}
