//! Properties over random scripts. The harness asserts the machine's invariants at every
//! step (the model is never asked twice without a confirmed commit between; the fold of the
//! committed log equals the live state; nothing is emitted after `Finish`; every started
//! call has exactly one result with its id); these tests throw many worlds at it.

use agent_core::*;
use proptest::prelude::*;
use serde_json::json;

use crate::harness::{Person, Reply, World, resume, run, tool, world};

const IDS: [&str; 4] = ["c1", "c2", "c3", "c4"];
const TOOLS: [&str; 6] = ["read", "write", "slow_read", "flaky", "strict", "ghost"];

fn call() -> impl Strategy<Value = (&'static str, &'static str, serde_json::Value)> {
    (0..IDS.len(), 0..TOOLS.len(), 0..3u8)
        .prop_map(|(i, t, p)| (IDS[i], TOOLS[t], json!({ "path": format!("f{p}") })))
}

fn reply() -> impl Strategy<Value = Reply> {
    prop_oneof![
        2 => Just(Reply::Final("done")),
        8 => prop::collection::vec(call(), 1..4).prop_map(Reply::Calls),
        1 => prop::collection::vec(call(), 0..2).prop_map(|c| Reply::Ask("may I?", c)),
        1 => Just(Reply::Clarify("which one?")),
        1 => Just(Reply::Give("stuck")),
        2 => Just(Reply::Invalid("{not json")),
        1 => Just(Reply::Fail("boom")),
    ]
}

fn person() -> impl Strategy<Value = Person> {
    prop_oneof![
        Just(Person::Approve),
        Just(Person::Deny("no")),
        Just(Person::Away),
        Just(Person::Settle(Resolution::Committed)),
        Just(Person::Settle(Resolution::Rejected)),
        Just(Person::Settle(Resolution::Retry)),
    ]
}

prop_compose! {
    fn any_world()(
        script in prop::collection::vec(reply(), 0..14),
        people in prop::collection::vec(person(), 0..4),
        ask_writes in any::<bool>(),
        max_steps in 1..12u32,
        max_tool_calls in 1..24u32,
        max_write_actions in prop::option::of(0..3u32),
        max_wall_time_ms in prop::option::of(50..3_000u64),
        max_tokens in prop::option::of(100..2_000u64),
        fail_commit in prop::option::of(1..10usize),
        cancel_turn in prop::option::of(1..6u32),
        outcome_unknown in any::<bool>(),
        deny_reads in any::<bool>(),
        flaky_gone in any::<bool>(),
        max_denials in 1..4u32,
        finding in prop::option::of(prop_oneof![
            Just(Finding::NotApplied),
            Just(Finding::Applied { receipt: "found it".into() }),
        ]),
    ) -> World {
        let mut w = world(script);
        w.tools.push(tool("flaky", Risk::Read).fails(ErrorKind::Timeout, "slow"));
        w.tools.push(tool("strict", Risk::Read));
        if outcome_unknown {
            w.tools[1] = tool("write", Risk::Write).fails(ErrorKind::OutcomeUnknown, "reset");
        }
        w.verdicts.insert("strict".into(), Verdict::Invalid { message: "/path: bad".into() });
        if ask_writes {
            w.verdicts.insert("write".into(), Verdict::Ask { why: "write asks".into() });
        }
        // Denials (so policy_violation is in the space) and a tool gone for good (so
        // tool_unavailable is).
        if deny_reads {
            w.verdicts.insert("read".into(), Verdict::Deny { reason: "not that".into() });
        }
        if flaky_gone {
            w.verdicts.insert("flaky".into(), Verdict::Unavailable { reason: "its server died".into() });
        }
        w.person.extend(people);
        w.budget.max_steps = max_steps;
        w.budget.max_tool_calls = max_tool_calls;
        w.budget.max_write_actions = max_write_actions;
        w.budget.max_wall_time_ms = max_wall_time_ms;
        w.budget.max_tokens = max_tokens;
        w.budget.max_denials = max_denials;
        // What tools find when a resumed run looks its effects in doubt up.
        w.reconcile = finding;
        w.fail_commit = fail_commit;
        w.cancel_in_tools_of_turn = cancel_turn;
        w
    }
}

proptest! {
    // 512 cases by default; PROPTEST_CASES=N runs more.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(512)
    ))]

    #[test]
    fn invariants_hold_for_any_script(w in any_world()) {
        let max_steps = w.budget.max_steps;
        let max_tool_calls = w.budget.max_tool_calls;
        let r = run(w);
        // Budgets are never overrun.
        prop_assert!(r.model_calls <= max_steps);
        prop_assert!(r.executed.len() as u32 <= max_tool_calls);
        // Only `completed` carries an answer.
        prop_assert_eq!(r.outcome.answer.is_some(), r.outcome.reason == TerminalReason::Completed);
        // The committed log ends where the invocation ended.
        let state = RunState::fold(&r.log).unwrap();
        match r.outcome.reason {
            TerminalReason::CheckpointFailed => {}
            TerminalReason::ApprovalRequired => {
                prop_assert!(matches!(state.status, Status::AwaitingApproval(_)));
            }
            TerminalReason::OutcomeUnknown => {
                let paused = matches!(state.status, Status::AwaitingResolution { .. });
                prop_assert!(paused, "a run in doubt waits for a resolution");
            }
            reason => prop_assert_eq!(state.outcome().map(|o| o.reason), Some(reason)),
        }
        // Tool calls counted in the state are the calls that started: each committed result,
        // and each attempt in doubt that did not take effect (found so, or a person said
        // to run it again), which gets no result of its own.
        prop_assert_eq!(state.tool_calls as usize, calls_started(&r.log));
    }

    /// A "crash" right after any commit, then a restart with the same world: the resumed
    /// machine, driven to the end, ends as the uninterrupted run did, with the same log.
    /// Where the crash left an effect dispatched without a result, recovery takes over
    /// instead: the call in doubt is never run again before a look-up or a person said so.
    #[test]
    fn a_run_resumed_after_any_commit_ends_as_the_uninterrupted_one(w in any_world(), cut in any::<prop::sample::Index>()) {
        let full = run(w.clone());
        if full.boundaries.is_empty() {
            // The very first commit failed: there is nothing to resume.
            return Ok(());
        }
        let at = &full.boundaries[cut.index(full.boundaries.len())];
        let prefix = &full.log[..at.log_len];
        let specs: Vec<ToolSpec> = w.tools.iter().map(|t| t.spec.clone()).collect();
        let m = Machine::resume(specs, prefix, crate::harness::T0).unwrap();
        prop_assert_eq!(m.state(), &RunState::fold(prefix).unwrap());
        let in_doubt = dispatched_without_result(prefix);
        let resumed = resume(w, &full.log, at);
        let state = RunState::fold(&resumed.log).unwrap();
        prop_assert_eq!(state.tool_calls as usize, calls_started(&resumed.log));
        if in_doubt.is_empty() {
            prop_assert_eq!(&resumed.outcome, &full.outcome);
            prop_assert_eq!(&resumed.log, &full.log);
        } else {
            // Before any word on it (a finding or a person's), the call in doubt is not run.
            for (turn, id) in &in_doubt {
                // The same call of the same turn (a later turn may reuse the id).
                let first_run = resumed.executed.iter().position(|e| &e.id == id && e.turn == *turn);
                if let Some(run_at) = first_run {
                    let settled = resumed.log[at.log_len..].iter().any(|e| match &e.event {
                        Event::EffectReconciled { call_id, finding: Finding::NotApplied } => call_id == id,
                        Event::EffectResolved { call_id, resolution: Resolution::Retry } => call_id == id,
                        _ => false,
                    });
                    prop_assert!(settled, "call {} ran again (execution {}) without a word on it", id, run_at);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256)
    ))]

    /// A "crash" right after any commit, then the run taken up again by another process
    /// hours later: the time nothing drove it is not worked time, so it ends as the
    /// uninterrupted run did (a wall-clock budget included) with the same events, and one
    /// `run_resumed` where it was taken up if it was being worked on.
    #[test]
    fn a_run_taken_up_after_any_commit_and_any_downtime_ends_as_the_uninterrupted_one(
        w in any_world(),
        cut in any::<prop::sample::Index>(),
        down_ms in 0..36_000_000u64,
    ) {
        let mut w = w;
        // The commit that fails is counted by number: one more commit would move it.
        w.fail_commit = None;
        let full = run(w.clone());
        let at = &full.boundaries[cut.index(full.boundaries.len())];
        let prefix = &full.log[..at.log_len];
        prop_assume!(dispatched_without_result(prefix).is_empty());
        let state = RunState::fold(prefix).unwrap();
        let taken = crate::harness::take_up(w, &full.log, at, down_ms);
        prop_assert_eq!(&taken.outcome, &full.outcome);
        let events = |log: &[Entry]| log.iter().map(|e| e.event.clone()).collect::<Vec<_>>();
        let mut expected = events(&full.log);
        if matches!(state.status, Status::Running) {
            expected.insert(at.log_len, Event::RunResumed {});
        }
        prop_assert_eq!(events(&taken.log), expected);
        prop_assert_eq!(&taken.log[..at.log_len], prefix, "the past is kept");
    }

    /// A person keeps talking to whatever run the world produces: after each end, a
    /// message opens a new exchange (up to three). The harness checks its invariants at
    /// every step; here: the past is never rewritten, every message is in the log once,
    /// step and tool-call limits hold per exchange, and the fold agrees.
    #[test]
    fn a_conversation_over_any_script_keeps_its_limits_per_exchange(w in any_world(), gap in 0..10_000u64) {
        let max_steps = w.budget.max_steps;
        let max_tool_calls = w.budget.max_tool_calls;
        let mut report = run(w.clone());
        let mut said = 0;
        for _ in 0..3 {
            let state = RunState::fold(&report.log).unwrap();
            if !matches!(state.status, Status::Ended(_)) {
                break;
            }
            let before = report.log.clone();
            let calls_before = report.model_calls;
            report = crate::harness::reply(w.clone(), &report, "and then?", None, gap);
            prop_assert_eq!(&report.log[..before.len()], &before[..], "the past is kept");
            if report.log.len() == before.len() {
                // The message's own commit failed: nothing was said.
                prop_assert_eq!(report.outcome.reason, TerminalReason::CheckpointFailed);
                break;
            }
            said += 1;
            let first = report.log[before.len()].event.name();
            prop_assert_eq!(first, "user_message");
            prop_assert!(report.model_calls - calls_before <= max_steps);
            prop_assert!(report.executed.len() as u32 <= max_tool_calls);
            let state = RunState::fold(&report.log).unwrap();
            prop_assert_eq!(state.exchange, said);
            prop_assert!(state.exchange_steps_used() <= max_steps);
            prop_assert!(state.exchange_tool_calls_used() <= max_tool_calls);
        }
        let messages = report.log.iter().filter(|e| matches!(e.event, Event::UserMessage { .. })).count();
        prop_assert_eq!(messages, said as usize);
    }
}

/// Calls started, as the log tells: each committed result, and each attempt in doubt that
/// did not take effect (found so after a restart, or a person said to run it again), which
/// gets no result of its own.
fn calls_started(log: &[Entry]) -> usize {
    log.iter()
        .filter(|e| {
            matches!(
                e.event,
                Event::ToolFinished { .. }
                    | Event::EffectResolved {
                        resolution: Resolution::Retry,
                        ..
                    }
                    | Event::EffectReconciled {
                        finding: Finding::NotApplied,
                        ..
                    }
            )
        })
        .count()
}

/// Calls (turn and id) whose effect was dispatched and have no result in `log`.
fn dispatched_without_result(log: &[Entry]) -> Vec<(u32, CallId)> {
    let mut open: Vec<(u32, CallId)> = Vec::new();
    for e in log {
        match &e.event {
            Event::EffectDispatched { turn, call_id, .. } => open.push((*turn, call_id.clone())),
            Event::ToolFinished { turn, result, .. } => {
                open.retain(|(t, c)| !(*t == *turn && *c == result.call_id));
            }
            Event::EffectResolved { call_id, .. } => open.retain(|(_, c)| c != call_id),
            _ => {}
        }
    }
    open
}

/// The property space is as wide as claimed: over the generated worlds, denials end runs
/// with `policy_violation`, a gone tool with `tool_unavailable`, and people settle effects.
#[test]
fn the_generated_worlds_reach_the_reasons_they_should() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut seen = std::collections::BTreeSet::new();
    let mut settled = 0;
    let mut reconciled = 0;
    for _ in 0..1_000 {
        let w = any_world().new_tree(&mut runner).unwrap().current();
        let r = run(w.clone());
        seen.insert(r.outcome.reason.as_str());
        if r.events().contains(&"effect_resolved") {
            settled += 1;
        }
        // A crash right after a dispatch record: the resumed run looks the effect up.
        if let Some(at) = r
            .boundaries
            .iter()
            .find(|b| matches!(r.log[b.log_len - 1].event, Event::EffectDispatched { .. }))
        {
            let resumed = resume(w, &r.log, at);
            if resumed.events().contains(&"effect_reconciled") {
                reconciled += 1;
            }
        }
    }
    for reason in [
        "completed",
        "approval_required",
        "outcome_unknown",
        "policy_violation",
        "tool_unavailable",
        "max_steps",
        "invalid_decision",
        "model_error",
        "cancelled",
        "checkpoint_failed",
    ] {
        assert!(seen.contains(reason), "{reason} is never reached: {seen:?}");
    }
    assert!(settled > 0, "no person ever settled an effect");
    assert!(
        reconciled > 0,
        "no resumed run ever had a finding on an effect"
    );
}
