//! Crash at every commit boundary, resume from the committed log, and check that no side
//! effect is lost or done twice: the pure-core twin of the `kill -9` harness.

use std::collections::BTreeMap;

use agent_core::*;
use serde_json::json;

use crate::harness::{T0, manifest};

fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec::new("read", "r", json!({"type": "object"}), Risk::Read),
        ToolSpec::new("append", "w", json!({"type": "object"}), Risk::Write),
    ]
}

/// Turns: reads and appends mixed, then a final answer.
fn script() -> Vec<Decision> {
    let call = |id: &str, name: &str| ToolCall::new(id, name, json!({ "line": id }));
    vec![
        Decision::ToolCalls {
            calls: vec![
                call("r1", "read"),
                call("a1", "append"),
                call("a2", "append"),
            ],
        },
        Decision::ToolCalls {
            calls: vec![call("a3", "append"), call("r2", "read")],
        },
        Decision::ToolCalls {
            calls: vec![call("a4", "append")],
        },
        Decision::Final {
            answer: "done".into(),
        },
    ]
}

/// The outside world: how often each side effect really happened.
#[derive(Default, Debug)]
struct World {
    effects: BTreeMap<CallId, u32>,
}

enum Reconciler {
    /// Looks the effect up, like `write_file`'s content hash.
    Perfect,
    /// Cannot tell; a person settles from what really happened.
    Person,
}

/// Drives `machine` until it finishes, pauses, or reaches the `crash_at`-th commit (which is
/// then lost). Returns the outcome (None when it crashed).
fn drive(
    machine: &mut Machine,
    log: &mut Vec<Entry>,
    world: &mut World,
    crash_at: Option<usize>,
    reconciler: &Reconciler,
) -> Option<Outcome> {
    let mut commits = 0;
    let script = script();
    let mut guard = 0;
    loop {
        guard += 1;
        assert!(guard < 1_000, "the machine loops");
        let command = machine.poll_command().expect("a command");
        match command {
            Command::CallModel { turn } => {
                let decision = script.get((turn - 1) as usize).cloned().expect("scripted");
                let reply = ModelReply::decision(decision, Usage::default());
                machine.handle(Input::ModelReplied(reply)).unwrap();
            }
            Command::CheckCalls { calls, .. } => {
                let verdicts = calls.into_iter().map(|c| (c.id, Verdict::Allow)).collect();
                machine
                    .handle(Input::CallsChecked {
                        verdicts,
                        paths: Vec::new(),
                    })
                    .unwrap();
            }
            Command::CheckAnswer { .. } => {
                unreachable!("these runs have no answer validators")
            }
            Command::ExecuteTools { group, .. } => {
                for sc in &group {
                    if sc.effect_key.is_some() {
                        // A side effect must have been recorded as dispatched before this.
                        assert!(
                            log.iter().any(|e| matches!(&e.event,
                                Event::EffectDispatched { call_id, .. } if *call_id == sc.call.id)),
                            "{} ran without a durable dispatch record",
                            sc.call.id
                        );
                        *world.effects.entry(sc.call.id.clone()).or_default() += 1;
                    }
                }
                let results = group
                    .into_iter()
                    .map(|sc| ToolResult::ok(sc.call.id, sc.call.name, "ok"))
                    .collect();
                machine.handle(Input::ToolsFinished { results }).unwrap();
            }
            Command::Commit {
                expected_version,
                entries,
            } => {
                commits += 1;
                if crash_at == Some(commits) {
                    return None;
                }
                assert_eq!(expected_version, log.len() as u64);
                log.extend(entries);
                machine
                    .handle(Input::Committed {
                        version: log.len() as u64,
                    })
                    .unwrap();
            }
            Command::ReconcileEffects { calls, .. } => {
                let findings = calls
                    .into_iter()
                    .map(|sc| {
                        let happened = world.effects.get(&sc.call.id).copied().unwrap_or(0) > 0;
                        let finding = match reconciler {
                            Reconciler::Perfect if happened => Some(Finding::Applied {
                                receipt: "line found".into(),
                            }),
                            Reconciler::Perfect => Some(Finding::NotApplied),
                            Reconciler::Person => None,
                        };
                        (sc.call.id, finding)
                    })
                    .collect();
                machine
                    .handle(Input::EffectsReconciled { findings })
                    .unwrap();
            }
            Command::AwaitResolution { pending } => {
                // The person looks at the world and says what happened.
                let call = &pending[0].call_id;
                let happened = world.effects.get(call).copied().unwrap_or(0) > 0;
                let resolution = if happened {
                    Resolution::Committed
                } else {
                    Resolution::Retry
                };
                machine
                    .handle(Input::Resolved {
                        call_id: call.clone(),
                        resolution,
                    })
                    .unwrap();
            }
            Command::AwaitApproval { .. } => panic!("nothing asks here"),
            Command::Finish(outcome) => return Some(outcome),
        }
    }
}

fn start() -> Machine {
    let config = RunConfig {
        run_id: "crashy".into(),
        goal: "append lines".into(),
        manifest: manifest(Budget::default()),
        tools: tools(),
    };
    Machine::start(config, T0)
}

fn crash_everywhere(reconciler: Reconciler) -> usize {
    // Count the commits of an uninterrupted run.
    let mut log = Vec::new();
    let mut world = World::default();
    let outcome = drive(&mut start(), &mut log, &mut world, None, &reconciler).unwrap();
    assert_eq!(outcome.reason, TerminalReason::Completed);
    let clean_commits = {
        let mut n = 0;
        let mut m = start();
        let mut w = World::default();
        let mut l = Vec::new();
        while drive(&mut m, &mut l, &mut w, Some(n + 1), &reconciler).is_none() {
            n += 1;
            m = start();
            w = World::default();
            l.clear();
        }
        n
    };
    assert!(clean_commits > 5);
    let mut in_doubt_seen = 0;
    for crash in 1..=clean_commits {
        let mut log = Vec::new();
        let mut world = World::default();
        assert!(drive(&mut start(), &mut log, &mut world, Some(crash), &reconciler).is_none());
        // Resume from whatever was durable, as often as it takes.
        let mut outcome = None;
        if log.is_empty() {
            // Nothing was durable: the run never existed; start it again.
            outcome = drive(&mut start(), &mut log, &mut world, None, &reconciler);
        }
        while outcome.is_none() {
            let mut machine = Machine::resume(tools(), &log, T0 + 1).expect("the log folds");
            let state = machine.state().clone();
            in_doubt_seen += state.in_doubt().len();
            outcome = drive(&mut machine, &mut log, &mut world, None, &reconciler);
        }
        let outcome = outcome.unwrap();
        assert_eq!(
            outcome.reason,
            TerminalReason::Completed,
            "crash at commit {crash}"
        );
        for id in ["a1", "a2", "a3", "a4"] {
            assert_eq!(
                world.effects.get(&CallId::from(id)),
                Some(&1),
                "crash at commit {crash}: effect {id} happened {:?} times",
                world.effects.get(&CallId::from(id))
            );
        }
        let versions: Vec<u64> = log.iter().map(|e| e.version).collect();
        assert_eq!(versions, (1..=log.len() as u64).collect::<Vec<_>>());
        RunState::fold(&log).unwrap();
    }
    in_doubt_seen
}

#[test]
fn crash_at_every_commit_with_a_tool_that_reconciles() {
    let in_doubt = crash_everywhere(Reconciler::Perfect);
    assert!(in_doubt > 0, "some crashes left effects in doubt");
}

#[test]
fn crash_at_every_commit_with_a_person_settling_what_is_in_doubt() {
    let in_doubt = crash_everywhere(Reconciler::Person);
    assert!(in_doubt > 0, "some crashes left effects in doubt");
}

#[test]
fn an_effect_in_doubt_pauses_naming_the_call_and_is_not_run_again() {
    // Crash right after the first dispatch record is durable and the effect happened.
    let mut log = Vec::new();
    let mut world = World::default();
    let mut m = start();
    // Commit 1: run_started; 2: decision + read result + dispatch of a1; then a1 runs;
    // commit 3 (dispatch of a2) is lost.
    assert!(drive(&mut m, &mut log, &mut world, Some(3), &Reconciler::Person).is_none());
    assert_eq!(world.effects.get(&CallId::from("a1")), Some(&1));
    let mut resumed = Machine::resume(tools(), &log, T0).unwrap();
    let Some(Command::ReconcileEffects { calls, .. }) = resumed.poll_command() else {
        panic!("a dispatched effect without a result is reconciled first");
    };
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].call.id.as_str(), "a1");
    resumed
        .handle(Input::EffectsReconciled {
            findings: vec![(CallId::from("a1"), None)],
        })
        .unwrap();
    let Some(Command::Commit { entries, .. }) = resumed.poll_command() else {
        panic!()
    };
    assert_eq!(entries.last().unwrap().event.name(), "resolution_requested");
    resumed
        .handle(Input::Committed {
            version: log.len() as u64 + entries.len() as u64,
        })
        .unwrap();
    let Some(Command::AwaitResolution { pending }) = resumed.poll_command() else {
        panic!()
    };
    assert_eq!(pending[0].call_id.as_str(), "a1");
    let outcome = resumed.outcome().unwrap();
    assert_eq!(outcome.reason, TerminalReason::OutcomeUnknown);
    assert!(outcome.message.contains("a1") && outcome.message.contains("settle"));
    assert_eq!(
        resumed.handle(Input::Resolved {
            call_id: CallId::from("zz"),
            resolution: Resolution::Committed
        }),
        Err(InputError::NotPending(CallId::from("zz")))
    );
}

#[test]
fn a_replys_reasoning_is_committed_with_its_decision_and_survives_a_resume() {
    let thought = vec![
        Reasoning::Thinking {
            thinking: "The file should be appended to.".into(),
            signature: "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds".into(),
        },
        Reasoning::RedactedThinking {
            data: "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP".into(),
        },
    ];
    let mut machine = start();
    let mut log: Vec<Entry> = Vec::new();
    loop {
        match machine.poll_command().expect("a command") {
            Command::Commit { entries, .. } => {
                log.extend(entries);
                machine
                    .handle(Input::Committed {
                        version: log.len() as u64,
                    })
                    .unwrap();
            }
            Command::CallModel { .. } => {
                let reply = ModelReply::decision(script()[0].clone(), Usage::default())
                    .with_reasoning(thought.clone());
                machine.handle(Input::ModelReplied(reply)).unwrap();
            }
            Command::CheckCalls { calls, .. } => {
                let verdicts = calls.into_iter().map(|c| (c.id, Verdict::Allow)).collect();
                machine
                    .handle(Input::CallsChecked {
                        verdicts,
                        paths: Vec::new(),
                    })
                    .unwrap();
            }
            Command::ExecuteTools { group, .. } => {
                let results = group
                    .into_iter()
                    .map(|sc| ToolResult::ok(sc.call.id, sc.call.name, "ok"))
                    .collect();
                machine.handle(Input::ToolsFinished { results }).unwrap();
            }
            other => panic!("{other:?}"),
        }
        if log
            .iter()
            .any(|e| matches!(e.event, Event::DecisionProposed { .. }))
        {
            break;
        }
    }
    let proposed = log
        .iter()
        .find_map(|e| match &e.event {
            Event::DecisionProposed { reasoning, .. } => Some(reasoning.clone()),
            _ => None,
        })
        .expect("the decision was committed");
    assert_eq!(proposed, thought);
    // In the log's JSON as the provider gave it, and read back the same.
    let json = serde_json::to_string(&log).unwrap();
    assert!(
        json.contains(r#""reasoning":[{"kind":"thinking","thinking":"The file should"#),
        "{json}"
    );
    let back: Vec<Entry> = serde_json::from_str(&json).unwrap();
    assert_eq!(back, log);
    // A decision without reasoning is written as before it existed.
    let plain = Event::DecisionProposed {
        turn: 1,
        decision: Decision::Final { answer: "a".into() },
        usage: Usage::default(),
        reasoning: vec![],
    };
    assert!(!serde_json::to_string(&plain).unwrap().contains("reasoning"));
    // It folds, and a resumed machine goes on from it.
    assert!(Machine::resume(tools(), &log, T0 + 1).is_ok());
}

/// Drives `machine` (the model deciding `decisions` in turn, every call allowed, every
/// commit appended to `log`) until it asks to run a group of calls: that group.
fn until_tools_run(
    machine: &mut Machine,
    log: &mut Vec<Entry>,
    decisions: &[Decision],
) -> Vec<ScheduledCall> {
    loop {
        match machine.poll_command().expect("a command") {
            Command::CallModel { turn } => {
                let decision = decisions[(turn - 1) as usize].clone();
                let reply = ModelReply::decision(decision, Usage::default());
                machine.handle(Input::ModelReplied(reply)).unwrap();
            }
            Command::CheckCalls { calls, .. } => {
                let verdicts = calls.into_iter().map(|c| (c.id, Verdict::Allow)).collect();
                let paths = Vec::new();
                machine
                    .handle(Input::CallsChecked { verdicts, paths })
                    .unwrap();
            }
            Command::Commit { entries, .. } => {
                log.extend(entries);
                let version = log.len() as u64;
                machine.handle(Input::Committed { version }).unwrap();
            }
            Command::ExecuteTools { group, .. } => return group,
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// A run let go with calls in flight (a sub-agent let go at its own next step) commits
/// the results that came, no more, and then stands as a machine loaded from its log does:
/// the call left without a result is reconciled or run by whoever takes the run up.
#[test]
fn a_run_let_go_with_calls_in_flight_commits_what_came_and_stands_as_its_log_says() {
    let call = |id: &str, name: &str| ToolCall::new(id, name, json!({ "line": id }));
    // Two reads run together; the append runs alone, after them.
    let decisions = vec![
        Decision::ToolCalls {
            calls: vec![call("r1", "read"), call("r2", "read"), call("a1", "append")],
        },
        Decision::Final {
            answer: "done".into(),
        },
    ];
    let mut log = Vec::new();
    let mut machine = start();
    let group = until_tools_run(&mut machine, &mut log, &decisions);
    let ids: Vec<&str> = group.iter().map(|s| s.call.id.as_str()).collect();
    assert_eq!(ids, ["r1", "r2"]);
    let results = vec![
        ToolResult::ok(CallId::from("r1"), "read", "one"),
        // Not one of the group's calls: ignored.
        ToolResult::ok(CallId::from("zz"), "read", "stray"),
    ];
    machine.handle(Input::ToolsLetGo { results }).unwrap();
    let Some(Command::Commit { entries, .. }) = machine.poll_command() else {
        panic!("what came is committed");
    };
    // The decision, not committed yet before reads (they have no dispatch to record), is
    // committed with them.
    let names: Vec<&str> = entries.iter().map(|e| e.event.name()).collect();
    assert_eq!(names, ["decision_proposed", "tool_finished"]);
    assert!(matches!(&entries[1].event,
        Event::ToolFinished { result, .. } if result.call_id.as_str() == "r1"));
    log.extend(entries);
    machine
        .handle(Input::Committed {
            version: log.len() as u64,
        })
        .unwrap();
    let mut loaded = Machine::resume(tools(), &log, T0).unwrap();
    let next = machine.poll_command();
    assert!(
        matches!(&next, Some(Command::CheckCalls { calls, .. })
            if calls.iter().map(|c| c.id.as_str()).collect::<Vec<_>>() == ["r2", "a1"]),
        "{next:?}"
    );
    assert_eq!(next, loaded.poll_command());

    // Let go while the append runs, its outcome unknown: nothing to commit, and its
    // dispatch is reconciled by whoever takes the run up, as after a crash.
    let mut machine = loaded;
    machine
        .handle(Input::CallsChecked {
            verdicts: ["r2", "a1"]
                .into_iter()
                .map(|id| (CallId::from(id), Verdict::Allow))
                .collect(),
            paths: Vec::new(),
        })
        .unwrap();
    let group = until_tools_run(&mut machine, &mut log, &decisions);
    assert_eq!(group[0].call.id.as_str(), "r2");
    let results = vec![ToolResult::ok(CallId::from("r2"), "read", "two")];
    machine.handle(Input::ToolsFinished { results }).unwrap();
    let group = until_tools_run(&mut machine, &mut log, &decisions);
    assert_eq!(group[0].call.id.as_str(), "a1");
    let unknown = ToolResult::error(
        CallId::from("a1"),
        "append",
        ToolError::new(ErrorKind::OutcomeUnknown, "cut off"),
    );
    machine
        .handle(Input::ToolsLetGo {
            results: vec![unknown],
        })
        .unwrap();
    let next = machine.poll_command();
    assert!(
        matches!(&next, Some(Command::ReconcileEffects { calls, .. })
            if calls.len() == 1 && calls[0].call.id.as_str() == "a1"),
        "{next:?}"
    );
    assert_eq!(
        next,
        Machine::resume(tools(), &log, T0).unwrap().poll_command()
    );
}

/// Notes people left for a run before it began are committed with its start, in one batch:
/// a process that dies before that commit leaves a run with no log (begun again with the
/// notes), never a run without them. The model is asked only after.
#[test]
fn a_run_begun_with_notes_commits_them_with_its_start() {
    let config = RunConfig {
        run_id: "noted".into(),
        goal: "append lines".into(),
        manifest: manifest(Budget::default()),
        tools: tools(),
    };
    let notes = vec!["first this".to_owned(), "then that".to_owned()];
    let mut machine = Machine::start_noted(config, notes, T0);
    let Some(Command::Commit {
        expected_version,
        entries,
    }) = machine.poll_command()
    else {
        panic!("a new run begins with a commit")
    };
    assert_eq!(expected_version, 0);
    let kinds: Vec<&str> = entries.iter().map(|e| e.event.name()).collect();
    assert_eq!(kinds, ["run_started", "user_note", "user_note"]);
    let texts: Vec<&Event> = entries[1..].iter().map(|e| &e.event).collect();
    assert_eq!(
        texts,
        [
            &Event::UserNote {
                text: "first this".into()
            },
            &Event::UserNote {
                text: "then that".into()
            }
        ]
    );
    let versions: Vec<u64> = entries.iter().map(|e| e.version).collect();
    assert_eq!(versions, [1, 2, 3]);
    assert_eq!(machine.poll_command(), None, "nothing before the commit");
    machine.handle(Input::Committed { version: 3 }).unwrap();
    assert_eq!(machine.poll_command(), Some(Command::CallModel { turn: 1 }));
    // The notes open no exchange of their own: the goal's limits hold.
    let state = RunState::fold(&entries).unwrap();
    let goal_only = RunState::fold(&entries[..1]).unwrap();
    assert_eq!(
        (state.steps, state.exchange),
        (0, goal_only.exchange),
        "{state:?}"
    );
    let mut resumed = Machine::resume(tools(), &entries, T0).unwrap();
    assert_eq!(resumed.poll_command(), Some(Command::CallModel { turn: 1 }));
}

/// A person's note to a running run, given instead of the model's reply, is committed and
/// the same turn asks the model again: not a step, no new exchange; its log folds and
/// resumes as any. A note while the run waits for a person does not fold.
#[test]
fn a_note_to_a_running_run_is_committed_before_the_model_is_asked_again() {
    let decisions = vec![
        Decision::ToolCalls {
            calls: vec![ToolCall::new("r1", "read", json!({}))],
        },
        Decision::Final {
            answer: "done".into(),
        },
    ];
    let mut log = Vec::new();
    let mut machine = start();
    let group = until_tools_run(&mut machine, &mut log, &decisions);
    let results = vec![ToolResult::ok(group[0].call.id.clone(), "read", "one")];
    machine.handle(Input::ToolsFinished { results }).unwrap();
    let Some(Command::Commit { entries, .. }) = machine.poll_command() else {
        panic!()
    };
    log.extend(entries);
    let version = log.len() as u64;
    machine.handle(Input::Committed { version }).unwrap();
    assert_eq!(machine.poll_command(), Some(Command::CallModel { turn: 2 }));
    let exchange = machine.state().exchange;

    let text = "also say hello".to_owned();
    machine
        .handle(Input::UserNote { text: text.clone() })
        .unwrap();
    let Some(Command::Commit { entries, .. }) = machine.poll_command() else {
        panic!("the note is committed first")
    };
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].event, Event::UserNote { text });
    log.extend(entries);
    let version = log.len() as u64;
    machine.handle(Input::Committed { version }).unwrap();
    assert_eq!(machine.poll_command(), Some(Command::CallModel { turn: 2 }));
    let state = RunState::fold(&log).unwrap();
    assert_eq!((state.steps, state.exchange), (1, exchange));
    let mut resumed = Machine::resume(tools(), &log, T0).unwrap();
    assert_eq!(resumed.poll_command(), Some(Command::CallModel { turn: 2 }));

    // Waiting for a person, a run reads no note.
    let paused = vec![
        log[0].clone(),
        Entry {
            version: 2,
            at_ms: T0,
            event: Event::ResolutionRequested {
                turn: 1,
                pending: Vec::new(),
            },
        },
        Entry {
            version: 3,
            at_ms: T0,
            event: Event::UserNote {
                text: "hello".into(),
            },
        },
    ];
    let err = RunState::fold(&paused).unwrap_err();
    assert!(err.to_string().contains("user note"), "{err}");
}
