//! Runs that go on from their log: resumption, approvals and settlements of calls of
//! unknown outcome, and logs the fold refuses.

use agent_core::*;
use serde_json::json;

use crate::harness::{Person, Reply::*, T0, check, tool, world};
use crate::scenarios::{read, write_world};

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
    let granted = just_after_the_approval(&full);
    let resumed = resume(w, &full.log, granted);
    assert_eq!(resumed.outcome.reason, TerminalReason::Completed);
    assert_eq!(resumed.executed.len(), 1);
    assert!(
        !resumed.events()[granted.log_len..].contains(&"approval_requested"),
        "{:?}",
        resumed.events()
    );
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

/// A batch that waits for a person: the request records where each call's path led when
/// it was checked, and after the approval (in another process) every call of the batch is
/// executed bound to that place.
#[test]
fn an_approved_batch_runs_bound_to_the_places_its_calls_were_checked_at() {
    use crate::harness::{resume, run};
    let mut w = world(vec![
        Calls(vec![
            ("r1", "read", json!({"path": "docs/a"})),
            ("w1", "write", json!({"path": "docs/b"})),
        ]),
        Final("done"),
    ]);
    w.asks_for("write");
    w.paths.insert("r1".into(), "notes/a".into());
    w.paths.insert("w1".into(), "work/b".into());
    w.person.push_back(Person::Away);
    let paused = run(w.clone());
    assert_eq!(paused.outcome.reason, TerminalReason::ApprovalRequired);
    assert_eq!(paused.outcome.pending[0].path.as_deref(), Some("work/b"));
    let requested = paused
        .log
        .iter()
        .find_map(|e| match &e.event {
            Event::ApprovalRequested {
                pending,
                allowed_paths,
                ..
            } => Some((pending.clone(), allowed_paths.clone())),
            _ => None,
        })
        .expect("an approval was requested");
    assert_eq!(requested.0[0].path.as_deref(), Some("work/b"));
    assert_eq!(
        requested.1,
        [(CallId::from("r1"), "notes/a".to_owned())].into()
    );
    // Another process approves: its gateway never checked these calls.
    let mut later = w;
    later.paths.clear();
    later.person = [Person::Approve].into();
    let approved = resume(later, &paused.log, paused.boundaries.last().unwrap());
    assert_eq!(approved.outcome.reason, TerminalReason::Completed);
    let ran: Vec<(&str, Option<&str>)> = approved
        .executed
        .iter()
        .map(|e| (e.id.as_str(), e.path.as_deref()))
        .collect();
    assert_eq!(ran, [("r1", Some("notes/a")), ("w1", Some("work/b"))]);
}

/// Without a person in between, a call is executed bound to the place its check found.
#[test]
fn a_call_allowed_at_once_runs_bound_to_the_place_it_was_checked_at() {
    let mut w = world(vec![
        Calls(vec![("r1", "read", json!({"path": "docs/a"}))]),
        Final("done"),
    ]);
    w.paths.insert("r1".into(), "notes/a".into());
    let done = check(w, TerminalReason::Completed);
    assert_eq!(done.executed[0].path.as_deref(), Some("notes/a"));
}

/// An approval committed before a crash, for a call whose path leads elsewhere when the
/// call is checked again after it: the person approved the other place, so the call waits
/// for a person again, with both places named; where it still leads there, it runs.
#[test]
fn an_approval_before_a_crash_holds_only_for_the_place_it_was_given_for() {
    use crate::harness::{resume, run};
    let mut w = world(vec![
        Calls(vec![("w1", "write", json!({"path": "docs/new.txt"}))]),
        Final("written"),
    ]);
    w.asks_for("write");
    w.paths.insert("w1".into(), "work/new.txt".into());
    w.person.push_back(Person::Approve);
    // The approval's commit carries the write's dispatch; the lookup finds it not done.
    w.reconcile = Some(Finding::NotApplied);
    let full = run(w.clone());
    assert_eq!(full.outcome.reason, TerminalReason::Completed);
    let granted = just_after_the_approval(&full);

    let mut moved = w.clone();
    moved.paths.insert("w1".into(), "src/new.txt".into());
    moved.person = [Person::Away].into();
    let asked = resume(moved, &full.log, granted);
    assert_eq!(asked.outcome.reason, TerminalReason::ApprovalRequired);
    assert!(asked.executed.is_empty(), "{:?}", asked.executed);
    let pending = &asked.outcome.pending[0];
    assert_eq!(pending.path.as_deref(), Some("src/new.txt"));
    assert!(
        pending
            .why
            .contains("approved when its path led to work/new.txt; it now leads to src/new.txt"),
        "{}",
        pending.why
    );

    let still = resume(w, &full.log, granted);
    assert_eq!(still.outcome.reason, TerminalReason::Completed);
    assert_eq!(still.executed.len(), 1);
    assert_eq!(still.executed[0].path.as_deref(), Some("work/new.txt"));
}

/// The first commit boundary whose log holds the person's approval: a crash there loses
/// nothing the person said.
fn just_after_the_approval(report: &crate::harness::Report) -> &crate::harness::Boundary {
    report
        .boundaries
        .iter()
        .find(|b| {
            report.log[..b.log_len]
                .iter()
                .any(|e| matches!(e.event, Event::ApprovalGranted { .. }))
        })
        .expect("the person approved")
}

/// A run left by its process (a crash) after a 300 ms read and taken up an hour later: the
/// hour is not worked time. It commits `run_resumed` before anything else, has what it had
/// not used of its one-second budget, and finishes; left and taken up once more, the fold
/// of its log still leaves both hours out.
#[test]
fn the_time_nothing_drove_a_run_is_not_worked_time() {
    use crate::harness::take_up;
    const HOUR: u64 = 3_600_000;
    let mut w = world(vec![
        Calls(vec![("s1", "slow_read", json!({}))]),
        Calls(vec![("s2", "slow_read", json!({}))]),
        Final("done"),
    ]);
    w.budget.max_wall_time_ms = Some(1_000);
    let full = check(w.clone(), TerminalReason::Completed);
    let after_result = |r: &crate::harness::Report, id: &str| {
        r.boundaries
            .iter()
            .find(|b| {
                matches!(&r.log[b.log_len - 1].event,
                    Event::ToolFinished { result, .. } if result.call_id.as_str() == id)
            })
            .cloned()
            .unwrap()
    };
    let at = after_result(&full, "s1");
    let prefix = &full.log[..at.log_len];
    let worked = prefix.last().unwrap().at_ms - T0;
    assert!(worked >= 300, "the read took its time: {worked} ms");

    let specs: Vec<ToolSpec> = w.tools.iter().map(|t| t.spec.clone()).collect();
    let mut m = Machine::take_up(specs, prefix, at.clock + HOUR).unwrap();
    let Some(Command::Commit { entries, .. }) = m.poll_command() else {
        panic!("the run is taken up by a commit first")
    };
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].event, Event::RunResumed {});
    assert_eq!(entries[0].at_ms, at.clock + HOUR);
    assert_eq!(m.wall_time_left(at.clock + HOUR), Some(1_000 - worked));
    assert_eq!(
        m.poll_command(),
        None,
        "nothing runs before it is committed"
    );

    let taken = take_up(w.clone(), &full.log, &at, HOUR);
    assert_eq!(taken.outcome, full.outcome);
    let again = after_result(&taken, "s2");
    let twice = take_up(w, &taken.log, &again, HOUR);
    assert_eq!(twice.outcome, full.outcome);
    let resumed = twice
        .events()
        .iter()
        .filter(|e| **e == "run_resumed")
        .count();
    assert_eq!(resumed, 2);
    let end = |r: &crate::harness::Report| {
        let last = r.log.last().unwrap().at_ms;
        RunState::fold(&r.log).unwrap().worked_by(last)
    };
    assert_eq!(end(&twice), end(&full), "the two hours are not worked time");
    assert!(end(&full) >= 600);
}

/// A run waiting for a person, an ended run and a fork not yet worked on are not taken up
/// by a commit: they go on as a rebuilt machine does. And the fold refuses a `run_resumed`
/// while the run waits for a person (the person's answer takes it up).
#[test]
fn only_a_run_that_was_being_worked_on_is_taken_up_by_a_commit() {
    let mut w = world(vec![
        Calls(vec![("w1", "write", json!({"n": 1}))]),
        Final("x"),
    ]);
    w.asks_for("write");
    let paused = check(w.clone(), TerminalReason::ApprovalRequired);
    let specs: Vec<ToolSpec> = w.tools.iter().map(|t| t.spec.clone()).collect();
    let mut m = Machine::take_up(specs.clone(), &paused.log, T0 + 60_000).unwrap();
    assert!(matches!(
        m.poll_command(),
        Some(Command::AwaitApproval { .. })
    ));
    let done = check(world(vec![Final("x")]), TerminalReason::Completed);
    let mut m = Machine::take_up(specs.clone(), &done.log, T0 + 60_000).unwrap();
    assert!(matches!(m.poll_command(), Some(Command::Finish(_))));

    let forked = fork_log(
        &done.log,
        1,
        "fork-1",
        crate::harness::manifest(Budget::default()),
        T0 + 5,
    )
    .unwrap();
    let mut m = Machine::take_up(specs, &forked, T0 + 60_000).unwrap();
    assert!(matches!(m.poll_command(), Some(Command::CallModel { .. })));

    let mut resumed = paused.log.clone();
    resumed.push(Entry {
        version: resumed.len() as u64 + 1,
        at_ms: T0 + 60_000,
        event: Event::RunResumed {},
    });
    let err = RunState::fold(&resumed).unwrap_err();
    assert!(err.to_string().contains("waited for a person"), "{err}");
}
