//! The world's loop: every command of the machine answered as the scripted world says,
//! the invariants checked at each step, and the report of what happened.

use std::collections::{BTreeMap, VecDeque};

use agent_core::*;

use super::*;

pub(super) fn drive(
    world: World,
    mut machine: Machine,
    log: Vec<Entry>,
    from: &Boundary,
) -> Report {
    let fakes: BTreeMap<String, FakeTool> = world
        .tools
        .iter()
        .map(|t| (t.spec.name.clone(), t.clone()))
        .collect();
    let mut clock = from.clock;
    let mut script: VecDeque<Turn> = world.script.into_iter().skip(from.script_pos).collect();
    let mut script_pos = from.script_pos;
    let mut person: VecDeque<Person> = world.person.into_iter().skip(from.person_pos).collect();
    let person_total = from.person_pos + person.len();
    let mut log = log;
    let mut boundaries = Vec::new();
    let mut executed = Vec::new();
    let mut commands = Vec::new();
    let mut commits = from.commits;
    let mut model_calls = from.model_calls;
    let mut committed_since_model_call = true;
    let mut inputs = 0usize;
    let mut early: Option<Command> = None;

    let mut feed = |machine: &mut Machine, input: Input| {
        inputs += 1;
        assert!(
            inputs < world.max_inputs,
            "step bound reached: the machine loops"
        );
        machine.handle(input).expect("input fits the phase");
    };

    loop {
        let Some(command) = early.take().or_else(|| machine.poll_command()) else {
            panic!("the machine stopped asking without finishing");
        };
        commands.push(describe(&command));
        match command {
            Command::CallModel { turn } => {
                assert!(
                    committed_since_model_call,
                    "model asked twice without a confirmed commit between"
                );
                committed_since_model_call = false;
                model_calls += 1;
                assert_eq!(turn, model_calls, "turns count model calls");
                let t = script
                    .pop_front()
                    .unwrap_or_else(|| Reply::Fail("script ran out").into());
                script_pos += 1;
                clock += t.delay_ms;
                feed(&mut machine, Input::Tick(clock));
                if let Some(queued) = machine.poll_command() {
                    // The tick ended the run (deadline) while the model was thinking.
                    early = Some(queued);
                    continue;
                }
                feed(&mut machine, model_reply(&t));
            }
            Command::CheckAnswer { answer, .. } => {
                if world.cancel_in_answer_check {
                    feed(&mut machine, Input::Cancel);
                    continue;
                }
                let check = world
                    .answer_check
                    .expect("a run without validators checks nothing");
                let rejection = check(&answer);
                feed(&mut machine, Input::AnswerChecked { rejection });
            }
            Command::CheckCalls { calls, .. } => {
                let verdicts = calls
                    .iter()
                    .map(|c| {
                        let v = world
                            .verdicts
                            .get(&c.name)
                            .cloned()
                            .unwrap_or(Verdict::Allow);
                        (c.id.clone(), v)
                    })
                    .collect();
                let paths = calls
                    .iter()
                    .filter_map(|c| Some((c.id.clone(), world.paths.get(c.id.as_str())?.clone())))
                    .collect();
                feed(&mut machine, Input::CallsChecked { verdicts, paths });
            }
            Command::ExecuteTools { turn, group } => {
                let cancel = world.cancel_in_tools_of_turn == Some(turn);
                let start = clock;
                let mut finishing: Vec<(u64, ToolResult)> = Vec::new();
                for sc in &group {
                    let fake = &fakes[&sc.call.name];
                    let end = start + fake.delay_ms;
                    executed.push(Exec {
                        turn,
                        id: sc.call.id.clone(),
                        name: sc.call.name.clone(),
                        path: sc.path.clone(),
                        start,
                        end,
                    });
                    let result = if cancel {
                        ToolResult::error(
                            sc.call.id.clone(),
                            sc.call.name.clone(),
                            ToolError::new(ErrorKind::Cancelled, "cancelled"),
                        )
                    } else {
                        match &fake.result {
                            None => ToolResult::ok(
                                sc.call.id.clone(),
                                sc.call.name.clone(),
                                format!("{} -> {}", sc.call.name, sc.call.arguments),
                            ),
                            Some(Ok(text)) => ToolResult::ok(
                                sc.call.id.clone(),
                                sc.call.name.clone(),
                                text.clone(),
                            ),
                            Some(Err(e)) => ToolResult::error(
                                sc.call.id.clone(),
                                sc.call.name.clone(),
                                e.clone(),
                            ),
                        }
                    };
                    finishing.push((end, result));
                }
                // Results arrive in finishing order, not in the model's order.
                finishing.sort_by_key(|(end, _)| *end);
                clock = finishing.iter().map(|(end, _)| *end).max().unwrap_or(clock);
                let results = finishing.into_iter().map(|(_, r)| r).collect();
                if cancel {
                    feed(&mut machine, Input::Cancel);
                }
                feed(&mut machine, Input::Tick(clock));
                feed(&mut machine, Input::ToolsFinished { results });
            }
            Command::ReconcileEffects { calls, .. } => {
                let findings = calls
                    .iter()
                    .map(|c| (c.call.id.clone(), world.reconcile.clone()))
                    .collect();
                feed(&mut machine, Input::EffectsReconciled { findings });
            }
            Command::AwaitResolution { pending } => match person.pop_front() {
                Some(Person::Settle(resolution)) => feed(
                    &mut machine,
                    Input::Resolved {
                        call_id: pending[0].call_id.clone(),
                        resolution,
                    },
                ),
                _ => {
                    let outcome = machine.outcome().expect("a paused run has an outcome");
                    assert_eq!(outcome.reason, TerminalReason::OutcomeUnknown);
                    return finish(
                        machine,
                        outcome,
                        log,
                        executed,
                        model_calls,
                        commands,
                        boundaries,
                    );
                }
            },
            Command::Commit {
                expected_version,
                entries,
            } => {
                commits += 1;
                assert_eq!(
                    expected_version,
                    log.len() as u64,
                    "commit tagged with the log's version"
                );
                for (i, e) in entries.iter().enumerate() {
                    assert_eq!(
                        e.version,
                        expected_version + 1 + i as u64,
                        "contiguous versions"
                    );
                }
                if world.fail_commit == Some(commits) {
                    feed(
                        &mut machine,
                        Input::CommitFailed {
                            message: "disk full".into(),
                        },
                    );
                    continue;
                }
                log.extend(entries);
                if let Some(next_call) = world.next_call {
                    machine.observe_next_call(next_call(&log));
                }
                feed(
                    &mut machine,
                    Input::Committed {
                        version: log.len() as u64,
                    },
                );
                committed_since_model_call = true;
                boundaries.push(Boundary {
                    log_len: log.len(),
                    script_pos,
                    person_pos: person_total - person.len(),
                    clock,
                    commits,
                    model_calls,
                });
                // Resume is a fold: the fold of the log is exactly the live state. The log
                // goes through its bytes first, as a store keeps it, so the oracle is not
                // the very entries the machine just made.
                let bytes = serde_json::to_vec(&log).expect("the log encodes");
                let stored: Vec<Entry> =
                    serde_json::from_slice(&bytes).expect("the stored log decodes");
                let folded = RunState::fold(&stored).expect("the committed log folds");
                assert_eq!(&folded, machine.state(), "fold(stored log) == live state");
            }
            Command::AwaitApproval { .. } => match person.pop_front().unwrap_or(Person::Away) {
                Person::Approve => feed(&mut machine, Input::ApprovalGranted { call_ids: vec![] }),
                Person::Deny(reason) => feed(
                    &mut machine,
                    Input::ApprovalDenied {
                        call_ids: vec![],
                        reason: reason.into(),
                    },
                ),
                Person::Away | Person::Settle(_) => {
                    let outcome = machine.outcome().expect("a paused run has an outcome");
                    assert_eq!(outcome.reason, TerminalReason::ApprovalRequired);
                    return finish(
                        machine,
                        outcome,
                        log,
                        executed,
                        model_calls,
                        commands,
                        boundaries,
                    );
                }
            },
            Command::Finish(outcome) => {
                return finish(
                    machine,
                    outcome,
                    log,
                    executed,
                    model_calls,
                    commands,
                    boundaries,
                );
            }
        }
    }
}

fn finish(
    mut machine: Machine,
    outcome: Outcome,
    log: Vec<Entry>,
    executed: Vec<Exec>,
    model_calls: u32,
    commands: Vec<String>,
    boundaries: Vec<Boundary>,
) -> Report {
    if machine.is_ended() {
        // Absorbing: late inputs change nothing and produce no command.
        let before = machine.state().clone();
        for late in [
            Input::Tick(u64::MAX),
            Input::Cancel,
            Input::ToolsFinished { results: vec![] },
            Input::Committed { version: 99 },
            Input::ModelReplied(ModelReply::decision(
                Decision::Final {
                    answer: "late".into(),
                },
                Usage::default(),
            )),
        ] {
            machine.handle(late).expect("absorbed");
            assert_eq!(machine.poll_command(), None, "a command after Finish");
        }
        assert_eq!(&before, machine.state());
    }
    // Every started call has exactly one result with its id in the log (none when its
    // turn could not be committed, or while its outcome is in doubt).
    let lost = outcome.reason == TerminalReason::CheckpointFailed;
    let mut in_doubt: Vec<CallId> = outcome.pending.iter().map(|p| p.call_id.clone()).collect();
    // Calls of the batch already allowed wait with the ones a person must approve.
    if outcome.reason == TerminalReason::ApprovalRequired
        && let Some(Event::ApprovalRequested { allowed, .. }) = log
            .iter()
            .rev()
            .map(|e| &e.event)
            .find(|e| matches!(e, Event::ApprovalRequested { .. }))
    {
        in_doubt.extend(allowed.iter().cloned());
    }
    for exec in &executed {
        let n = log
            .iter()
            .filter(|e| match &e.event {
                Event::ToolFinished { turn, result, .. } => {
                    *turn == exec.turn && result.call_id == exec.id
                }
                // A call in doubt found (or said) not to have taken effect, and not run
                // again because the run stopped: answered without a second start.
                Event::CallRejected { turn, result } => {
                    *turn == exec.turn
                        && result.call_id == exec.id
                        && result.content().contains("was not run again")
                }
                _ => false,
            })
            .count();
        // In doubt, or waiting (again) for a person before it runs again after a
        // person's "retry".
        let doubtful = matches!(
            outcome.reason,
            TerminalReason::OutcomeUnknown | TerminalReason::ApprovalRequired
        ) && in_doubt.contains(&exec.id);
        assert!(
            n == 1 || (n == 0 && (lost || doubtful)),
            "call {} of turn {} has {n} results; commands: {commands:#?}",
            exec.id,
            exec.turn
        );
    }
    Report {
        boundaries,
        outcome,
        log,
        executed,
        model_calls,
        commands,
    }
}

fn describe(command: &Command) -> String {
    match command {
        Command::CallModel { turn } => format!("call_model {turn}"),
        Command::CheckCalls { calls, .. } => format!("check_calls {}", calls.len()),
        Command::CheckAnswer { answer, .. } => format!("check_answer {answer:?}"),
        Command::ExecuteTools { group, .. } => format!(
            "execute_tools {:?}",
            group
                .iter()
                .map(|c| c.call.id.0.clone())
                .collect::<Vec<_>>()
        ),
        Command::ReconcileEffects { calls, .. } => format!("reconcile_effects {}", calls.len()),
        Command::AwaitResolution { pending } => format!("await_resolution {}", pending.len()),
        Command::Commit { entries, .. } => format!(
            "commit {:?}",
            entries.iter().map(|e| e.event.name()).collect::<Vec<_>>()
        ),
        Command::AwaitApproval { pending, .. } => format!("await_approval {}", pending.len()),
        Command::Finish(o) => format!("finish {}", o.reason),
    }
}
