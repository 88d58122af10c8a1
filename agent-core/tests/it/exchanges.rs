//! A person talks to a run (CONTRACT §7): the answer to a clarification and follow-ups
//! after the end are `user_message` events, each opening an exchange. Step, tool-call,
//! retry and repeat limits count per exchange; tokens, cost and wall time per run.

use agent_core::*;
use serde_json::json;

use crate::harness::{Person, Reply, Reply::*, Report, check, reply, world};

fn read(id: &'static str) -> (&'static str, &'static str, serde_json::Value) {
    (id, "read", json!({ "path": id }))
}

fn state(r: &Report) -> RunState {
    RunState::fold(&r.log).expect("the log folds")
}

fn texts(r: &Report) -> Vec<String> {
    r.log
        .iter()
        .filter_map(|e| match &e.event {
            Event::UserMessage { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn an_answer_to_a_clarification_goes_on_with_the_run() {
    let w = world(vec![Clarify("which branch?"), Final("main is clean")]);
    let asked = check(w.clone(), TerminalReason::ClarificationRequired);
    let answered = reply(w, &asked, "main", None, 60_000);
    assert_eq!(answered.outcome.reason, TerminalReason::Completed);
    assert_eq!(answered.outcome.answer.as_deref(), Some("main is clean"));
    assert_eq!(texts(&answered), ["main"]);
    let events = answered.events();
    let at = events.iter().position(|e| *e == "user_message").unwrap();
    assert_eq!(events[at - 1], "run_ended", "the message follows the pause");
    assert_eq!(
        events[at + 1],
        "decision_proposed",
        "then the model is asked"
    );
    let s = state(&answered);
    assert_eq!((s.exchange, s.steps, s.turn), (1, 2, 2), "turns count on");
    assert_eq!(answered.log.len(), asked.log.len() + 3);
    assert_eq!(
        answered.log[..asked.log.len()],
        asked.log[..],
        "the past is kept"
    );
}

#[test]
fn a_follow_up_opens_a_new_exchange_after_any_end() {
    for (first, reason) in [
        (Final("done"), TerminalReason::Completed),
        (Give("no access"), TerminalReason::CannotContinue),
        (Reply::Fail("down"), TerminalReason::ModelError),
    ] {
        let w = world(vec![first, Final("again")]);
        let ended = check(w.clone(), reason);
        let more = reply(w, &ended, "try once more", None, 1);
        assert_eq!(more.outcome.reason, TerminalReason::Completed, "{reason:?}");
        assert_eq!(more.outcome.answer.as_deref(), Some("again"));
    }
}

#[test]
fn step_and_tool_call_limits_count_per_exchange() {
    let mut w = world(vec![
        Calls(vec![read("a")]),
        Final("first"),
        Calls(vec![read("b")]),
        Calls(vec![read("c")]),
        Final("never asked"),
    ]);
    w.budget.max_steps = 2;
    w.budget.max_tool_calls = 1;
    let first = check(w.clone(), TerminalReason::Completed);
    // Both limits were reached in the first exchange; the second has its own.
    let second = reply(w, &first, "and the others?", None, 1);
    assert_eq!(second.outcome.reason, TerminalReason::ToolBudgetExhausted);
    assert_eq!(
        second.model_calls, 4,
        "two model calls in the second exchange"
    );
    assert_eq!(
        second.executed_names(),
        ["read"],
        "one call in the second exchange"
    );
    let s = state(&second);
    assert_eq!((s.steps, s.tool_calls), (4, 2));
    assert_eq!(
        (s.exchange_steps_used(), s.exchange_tool_calls_used()),
        (2, 1)
    );
}

#[test]
fn tokens_count_over_the_whole_run_and_a_message_can_raise_them() {
    let mut w = world(vec![Final("a"), Final("b"), Final("c")]);
    w.budget.max_tokens = Some(200); // each call uses 120
    let one = check(w.clone(), TerminalReason::Completed);
    let two = reply(w.clone(), &one, "more", None, 1);
    assert_eq!(two.outcome.reason, TerminalReason::Completed);
    let three = reply(w.clone(), &two, "more", None, 1);
    assert_eq!(three.outcome.reason, TerminalReason::CostBudgetExceeded);
    assert_eq!(three.model_calls, 2, "spent before the third call");
    let raised = Budget {
        max_tokens: Some(1_000),
        ..w.budget.clone()
    };
    let four = reply(w, &three, "go on", Some(raised.clone()), 1);
    assert_eq!(four.outcome.reason, TerminalReason::Completed);
    assert_eq!(four.outcome.answer.as_deref(), Some("c"));
    assert_eq!(
        state(&four).budget,
        Some(raised),
        "the new budget is recorded"
    );
}

#[test]
fn wall_time_counts_the_exchanges_not_the_waits_between() {
    let mut w = world(vec![Final("a"), Final("b"), Final("c")]);
    for t in &mut w.script {
        t.delay_ms = 600;
    }
    w.budget.max_wall_time_ms = Some(1_000);
    let one = check(w.clone(), TerminalReason::Completed);
    // An hour later: the hour is not worked time, but 600 ms more passes the budget.
    let two = reply(w, &one, "more", None, 3_600_000);
    assert_eq!(two.outcome.reason, TerminalReason::DeadlineExceeded);
    let s = state(&two);
    assert!(s.worked_ms >= 600 && s.worked_ms < 1_000, "{}", s.worked_ms);
    // Two exchanges of 300 ms an hour apart fit in one second.
    let mut w = world(vec![Final("a"), Final("b")]);
    for t in &mut w.script {
        t.delay_ms = 300;
    }
    w.budget.max_wall_time_ms = Some(1_000);
    let one = check(w.clone(), TerminalReason::Completed);
    let two = reply(w, &one, "more", None, 3_600_000);
    assert_eq!(two.outcome.reason, TerminalReason::Completed);
}

/// What a driver waits for before it ticks the run to its end: the budget less the time
/// worked, counted as the machine counts it. A follow-up an hour later has what the first
/// exchange left; a fork made an hour later has it all, its inherited prefix and the hour
/// since not being its own work.
#[test]
fn what_is_left_of_the_wall_clock_budget_is_the_time_not_yet_worked() {
    let mut w = world(vec![Final("a"), Final("b")]);
    for t in &mut w.script {
        t.delay_ms = 300;
    }
    w.budget.max_wall_time_ms = Some(1_000);
    let one = check(w.clone(), TerminalReason::Completed);
    let (first, last) = (one.log[0].at_ms, one.log[one.log.len() - 1].at_ms);
    assert!(
        last - first >= 300,
        "the first exchange took its model's time"
    );
    let specs: Vec<ToolSpec> = w.tools.iter().map(|t| t.spec.clone()).collect();
    let later = last + 3_600_000;
    let follow_up = Machine::reply(specs.clone(), &one.log, "more".into(), None, later).unwrap();
    assert_eq!(
        follow_up.wall_time_left(later + 100),
        Some(1_000 - (last - first) - 100)
    );
    assert_eq!(follow_up.wall_time_left(later + 5_000), Some(0));

    let mut manifest = state(&one).manifest.unwrap();
    manifest.budget.max_wall_time_ms = Some(1_000);
    let forked = fork_log(&one.log, 1, "fork", manifest, later).unwrap();
    let fork = Machine::resume(specs, &forked, later).unwrap();
    assert_eq!(fork.wall_time_left(later + 200), Some(800));
    assert_eq!(fork.state().forked_at_ms, Some(later));
}

/// The time a run waits for a person within an exchange (an approval, a call in doubt to
/// be settled) is not worked either: a write approved an hour after it was asked for runs,
/// and the run goes on with what its budget had left; one that works past it still stops.
#[test]
fn wall_time_does_not_count_the_wait_for_an_approval() {
    use crate::harness::{Person, resume};
    for (model_ms, expected) in [
        (300, TerminalReason::Completed),
        (600, TerminalReason::DeadlineExceeded),
    ] {
        let mut w = world(vec![
            Calls(vec![("w1", "write", json!({"path": "a"}))]),
            Final("done"),
        ]);
        for t in &mut w.script {
            t.delay_ms = model_ms;
        }
        w.budget.max_wall_time_ms = Some(1_000);
        w.asks_for("write");
        w.person.push_back(Person::Away);
        let paused = check(w.clone(), TerminalReason::ApprovalRequired);
        let waiting = state(&paused);
        assert!(waiting.paused_at_ms.is_some());
        assert_eq!(
            waiting.worked_by(waiting.updated_at_ms + 3_600_000),
            model_ms
        );
        let mut later = w;
        later.person = [Person::Approve].into();
        let mut at = paused.boundaries.last().unwrap().clone();
        at.clock += 3_600_000;
        let approved = resume(later, &paused.log, &at);
        assert_eq!(approved.outcome.reason, expected, "{model_ms} ms a call");
        assert_eq!(
            approved.executed_names(),
            ["write"],
            "the approved write ran"
        );
        let done = state(&approved);
        assert_eq!(done.paused_at_ms, None);
        assert!(done.worked_by(done.updated_at_ms) < 2 * model_ms + 100);
    }
}

/// A fork's budgets count what it does itself: its inherited calls were its parent's
/// spending and steps. A fork at call 3, given 300 tokens and 2 steps, makes its two calls
/// (240 tokens) and completes, though its log's calls used 480 and made 4.
#[test]
fn a_fork_s_budgets_count_from_the_fork() {
    use crate::harness::{Boundary, resume};
    let w = world(vec![
        Calls(vec![read("a")]),
        Calls(vec![read("b")]),
        Calls(vec![read("c")]),
        Final("done"),
    ]);
    let parent = check(w.clone(), TerminalReason::Completed);
    let budget = Budget {
        max_tokens: Some(300),
        max_steps: 2,
        ..Budget::default()
    };
    let made = parent.log[parent.log.len() - 1].at_ms + 1_000;
    let forked = fork_log(
        &parent.log,
        3,
        "fork",
        crate::harness::manifest(budget),
        made,
    )
    .unwrap();
    let at = Boundary {
        log_len: forked.len(),
        script_pos: 2,
        clock: made,
        model_calls: 2,
        ..Boundary::default()
    };
    let fork = resume(w, &forked, &at);
    assert_eq!(
        fork.outcome.reason,
        TerminalReason::Completed,
        "{}",
        fork.outcome.message
    );
    let s = state(&fork);
    assert_eq!(
        (
            s.steps,
            s.usage.total_tokens(),
            s.budget_usage().total_tokens()
        ),
        (4, 480, 240)
    );
    assert_eq!(s.inherited_usage.map(|u| u.total_tokens()), Some(240));
}

/// Nor is the wait for a person to settle a call whose outcome is unknown: settled an hour
/// later, the run goes on with what its budget had left.
#[test]
fn wall_time_does_not_count_the_wait_for_a_settlement() {
    use crate::harness::{Person, resume, tool};
    let mut w = world(vec![
        Calls(vec![("c1", "write", json!({"path": "f0"}))]),
        Final("done"),
    ]);
    for t in &mut w.script {
        t.delay_ms = 300;
    }
    w.tools[1] = tool("write", Risk::Write).fails(ErrorKind::OutcomeUnknown, "reset");
    w.budget.max_wall_time_ms = Some(1_000);
    w.person.push_back(Person::Away);
    let paused = check(w.clone(), TerminalReason::OutcomeUnknown);
    assert!(state(&paused).paused_at_ms.is_some());
    let mut later = w;
    later.person = [Person::Settle(Resolution::Committed)].into();
    let mut at = paused.boundaries.last().unwrap().clone();
    at.clock += 3_600_000;
    let settled = resume(later, &paused.log, &at);
    assert_eq!(
        settled.outcome.reason,
        TerminalReason::Completed,
        "{}",
        settled.outcome.message
    );
    assert_eq!(state(&settled).paused_at_ms, None);
}

#[test]
fn streaks_and_repeats_start_again_with_a_message() {
    let mut w = world(vec![
        Invalid("?"),
        Invalid("??"),
        Invalid("???"),
        Final("ok"),
    ]);
    w.budget.max_invalid_decisions = 2;
    let first = check(w.clone(), TerminalReason::InvalidDecision);
    let second = reply(w, &first, "please answer properly", None, 1);
    assert_eq!(second.outcome.reason, TerminalReason::Completed);
}

#[test]
fn only_an_ended_run_takes_a_message() {
    let w = world(vec![Ask("may I?", vec![])]);
    let waiting = check(w.clone(), TerminalReason::ApprovalRequired);
    let specs: Vec<ToolSpec> = w.tools.iter().map(|t| t.spec.clone()).collect();
    let refuse = |log: &[Entry], text: &str| {
        Machine::reply(specs.clone(), log, text.to_owned(), None, 0).err()
    };
    assert_eq!(
        refuse(&waiting.log, "yes"),
        Some(ReplyError::AwaitingApproval)
    );
    let mut w = world(vec![Final("done")]);
    w.person.push_back(Person::Away);
    let done = check(w, TerminalReason::Completed);
    assert_eq!(refuse(&done.log, "  "), Some(ReplyError::Empty));
    let interrupted = &done.log[..1];
    assert_eq!(refuse(interrupted, "hi"), Some(ReplyError::NotEnded));
    assert!(refuse(&done.log, "hi").is_none());
    // A user message anywhere but after an end does not fold.
    let mut forged = done.log[..1].to_vec();
    forged.push(Entry {
        version: 2,
        at_ms: 0,
        event: Event::UserMessage {
            text: "x".into(),
            budget: None,
        },
    });
    assert!(RunState::fold(&forged).is_err());
}

#[test]
fn a_call_not_run_again_is_not_counted_twice() {
    // Found by the conversation property: the attempt in doubt counted when a person said
    // `retry`, and the answer "not run again" (the budget being spent) counted again.
    use crate::harness::{Person, tool};
    let mut w = world(vec![
        Calls(vec![("c1", "write", json!({"path": "f0"}))]),
        Final("x"),
    ]);
    w.tools[1] = tool("write", Risk::Write).fails(ErrorKind::OutcomeUnknown, "reset");
    w.budget.max_tool_calls = 1;
    w.person.push_back(Person::Settle(Resolution::Retry));
    let r = check(w, TerminalReason::ToolBudgetExhausted);
    let s = state(&r);
    assert_eq!(
        (s.tool_calls, s.write_actions),
        (1, 0),
        "one attempt, no effect"
    );
    assert_eq!(r.executed.len(), 1);
    assert!(r.events().contains(&"call_rejected"), "{:?}", r.events());
}
