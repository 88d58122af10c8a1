//! A deterministic world for the machine, in the spirit of quinn-proto's `Pair`: a scripted
//! model, fake tools with chosen results and delays, a gate, a person, a virtual clock and a
//! step bound. One entry point, [`check`], so a scenario is a few lines of data.
//!
//! The world also checks the machine's invariants at every step, whatever the scenario.

use std::collections::{BTreeMap, VecDeque};

use agent_core::*;

use serde_json::{Value, json};

/// What the scripted model answers on one call.
#[derive(Clone, Debug)]
pub enum Reply {
    Final(&'static str),
    Calls(Vec<(&'static str, &'static str, Value)>),
    Ask(&'static str, Vec<(&'static str, &'static str, Value)>),
    Clarify(&'static str),
    Give(&'static str),
    Invalid(&'static str),
    Fail(&'static str),
}

/// A model reply plus its latency and usage.
#[derive(Clone, Debug)]
pub struct Turn {
    pub reply: Reply,
    pub delay_ms: u64,
    pub usage: Usage,
}

impl From<Reply> for Turn {
    fn from(reply: Reply) -> Self {
        Turn {
            reply,
            delay_ms: 10,
            usage: Usage::tokens(100, 20),
        }
    }
}

/// How a fake tool behaves.
#[derive(Clone, Debug)]
pub struct FakeTool {
    pub spec: ToolSpec,
    pub delay_ms: u64,
    /// `None` echoes the arguments back as output.
    pub result: Option<Result<String, ToolError>>,
}

pub fn tool(name: &str, risk: Risk) -> FakeTool {
    FakeTool {
        spec: ToolSpec::new(
            name,
            format!("fake {name}"),
            json!({"type": "object"}),
            risk,
        ),
        delay_ms: 5,
        result: None,
    }
}

impl FakeTool {
    pub fn delay(mut self, ms: u64) -> Self {
        self.delay_ms = ms;
        self
    }
    pub fn fails(mut self, kind: ErrorKind, message: &str) -> Self {
        self.result = Some(Err(ToolError::new(kind, message)));
        self
    }
}

/// What a person answers when the run asks for approval.
#[derive(Clone, Debug)]
pub enum Person {
    Approve,
    Deny(&'static str),
    /// Settles a call of unknown outcome.
    Settle(Resolution),
    /// Nobody answers: the invocation ends paused.
    Away,
}

/// A scenario: the world the machine runs in.
#[derive(Clone, Debug)]
pub struct World {
    pub budget: Budget,
    pub tools: Vec<FakeTool>,
    pub script: Vec<Turn>,
    /// The gateway's verdict per tool name; absent means allow.
    pub verdicts: BTreeMap<String, Verdict>,
    pub person: VecDeque<Person>,
    /// Fail the commit with this 1-based number.
    pub fail_commit: Option<usize>,
    /// Cancel while the tools of this turn run.
    pub cancel_in_tools_of_turn: Option<u32>,
    /// What tools find when asked to reconcile an effect after a restart.
    pub reconcile: Option<Finding>,
    /// Bound on inputs fed, so a looping machine fails the test instead of hanging it.
    pub max_inputs: usize,
}

pub fn world(script: Vec<Reply>) -> World {
    World {
        budget: Budget::default(),
        tools: vec![
            tool("read", Risk::Read),
            tool("write", Risk::Write),
            tool("slow_read", Risk::Read).delay(300),
        ],
        script: script.into_iter().map(Turn::from).collect(),
        verdicts: BTreeMap::new(),
        person: VecDeque::new(),
        fail_commit: None,
        cancel_in_tools_of_turn: None,
        reconcile: None,
        max_inputs: 10_000,
    }
}

impl World {
    /// Calls of `tool` ask a person first.
    pub fn asks_for(&mut self, tool: &str) {
        self.verdicts.insert(
            tool.to_owned(),
            Verdict::Ask {
                why: format!("{tool} asks"),
            },
        );
    }
}

/// One call the fake tools ran.
#[derive(Clone, Debug)]
pub struct Exec {
    pub turn: u32,
    pub id: CallId,
    pub name: String,
    pub start: u64,
    pub end: u64,
}

/// Where an invocation stood right after one of its commits: the committed log's length
/// (what a restarted process knows) and the world's own progress (the script, the person,
/// the clock), so that the same world can go on from there after a "crash".
#[derive(Clone, Debug, Default)]
pub struct Boundary {
    pub log_len: usize,
    pub script_pos: usize,
    pub person_pos: usize,
    pub clock: u64,
    pub commits: usize,
    pub model_calls: u32,
}

/// What came out of a run.
#[derive(Debug)]
pub struct Report {
    /// Where the invocation stood after each commit.
    pub boundaries: Vec<Boundary>,
    pub outcome: Outcome,
    /// The committed log.
    pub log: Vec<Entry>,
    /// Every call started, in start order.
    pub executed: Vec<Exec>,
    pub model_calls: u32,
    /// Every command, as a short line.
    pub commands: Vec<String>,
}

impl Report {
    pub fn events(&self) -> Vec<&'static str> {
        self.log.iter().map(|e| e.event.name()).collect()
    }
    pub fn executed_names(&self) -> Vec<&str> {
        self.executed.iter().map(|e| e.name.as_str()).collect()
    }
    pub fn results(&self) -> Vec<&ToolResult> {
        self.log
            .iter()
            .filter_map(|e| match &e.event {
                Event::ToolFinished { result, .. } | Event::CallRejected { result, .. } => {
                    Some(result)
                }
                _ => None,
            })
            .collect()
    }
    pub fn result_of(&self, id: &str) -> &ToolResult {
        self.results()
            .into_iter()
            .find(|r| r.call_id.as_str() == id)
            .unwrap_or_else(|| panic!("no result for {id}"))
    }
}

fn to_calls(calls: &[(&str, &str, Value)]) -> Vec<ToolCall> {
    calls
        .iter()
        .map(|(id, name, args)| ToolCall::new(*id, *name, args.clone()))
        .collect()
}

fn model_reply(turn: &Turn) -> Input {
    let decision = match &turn.reply {
        Reply::Final(answer) => Decision::Final {
            answer: (*answer).into(),
        },
        Reply::Calls(calls) => Decision::ToolCalls {
            calls: to_calls(calls),
        },
        Reply::Ask(summary, calls) => Decision::RequestApproval {
            summary: (*summary).into(),
            calls: to_calls(calls),
        },
        Reply::Clarify(q) => Decision::Clarification {
            question: (*q).into(),
        },
        Reply::Give(r) => Decision::CannotContinue {
            reason: (*r).into(),
        },
        Reply::Invalid(raw) => {
            return Input::ModelReplied(ModelReply::invalid(*raw, "not JSON", turn.usage));
        }
        Reply::Fail(msg) => {
            return Input::ModelFailed {
                retries: vec![Retry {
                    attempt: 1,
                    reason: "HTTP 503".into(),
                    wait_ms: 500,
                }],
                message: (*msg).into(),
                kind: agent_core::ModelErrorKind::Server,
            };
        }
    };
    Input::ModelReplied(ModelReply::decision(decision, turn.usage))
}

pub const T0: u64 = 1_700_000_000_000;

pub fn manifest(budget: Budget) -> Manifest {
    Manifest {
        runtime_version: "test".into(),
        provider: "script".into(),
        model: "harness".into(),
        system_prompt_digest: "sys".into(),
        tool_schema_digest: "tools".into(),
        budget,
        tools: Vec::new(),
    }
}

/// Runs the world to the end of the invocation, checking invariants at every step.
pub fn run(world: World) -> Report {
    let specs: Vec<ToolSpec> = world.tools.iter().map(|t| t.spec.clone()).collect();
    let config = RunConfig {
        run_id: "run-1".into(),
        goal: "test goal".into(),
        manifest: manifest(world.budget.clone()),
        tools: specs,
    };
    let machine = Machine::start(config, T0);
    drive(
        world,
        machine,
        Vec::new(),
        &Boundary {
            clock: T0,
            ..Boundary::default()
        },
    )
}

/// Goes on with `world` from a boundary of an earlier invocation, as a restarted process
/// would: a machine resumed from the committed prefix of the log, the world where it was.
pub fn resume(world: World, log: &[Entry], at: &Boundary) -> Report {
    let specs: Vec<ToolSpec> = world.tools.iter().map(|t| t.spec.clone()).collect();
    let prefix = log[..at.log_len].to_vec();
    let machine = Machine::resume(specs, &prefix, at.clock).expect("a committed prefix resumes");
    drive(world, machine, prefix, at)
}

/// A person speaks to an ended run at the end of an earlier invocation (`after`): the
/// same world goes on from where it stood, `gap_ms` later.
pub fn reply(
    world: World,
    after: &Report,
    text: &str,
    budget: Option<Budget>,
    gap_ms: u64,
) -> Report {
    let specs: Vec<ToolSpec> = world.tools.iter().map(|t| t.spec.clone()).collect();
    let mut at = after.boundaries.last().cloned().expect("the run committed");
    at.clock += gap_ms;
    let machine = Machine::reply(specs, &after.log, text.to_owned(), budget, at.clock)
        .expect("an ended run takes a message");
    drive(world, machine, after.log.clone(), &at)
}

fn drive(world: World, mut machine: Machine, log: Vec<Entry>, from: &Boundary) -> Report {
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
                feed(&mut machine, Input::CallsChecked { verdicts });
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

/// Runs `world` and asserts its terminal reason.
pub fn check(world: World, expected: TerminalReason) -> Report {
    let report = run(world);
    assert_eq!(
        report.outcome.reason, expected,
        "outcome: {:?}\ncommands: {:#?}",
        report.outcome, report.commands
    );
    report
}
