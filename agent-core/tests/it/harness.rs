//! A deterministic world for the machine, in the spirit of quinn-proto's `Pair`: a scripted
//! model, fake tools with chosen results and delays, a gate, a person, a virtual clock and a
//! step bound. One entry point, [`check`], so a scenario is a few lines of data.
//!
//! The world also checks the machine's invariants at every step, whatever the scenario.

use std::collections::{BTreeMap, VecDeque};

use agent_core::*;

use serde_json::{Value, json};

mod drive;

use drive::drive;

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
    /// Where the gateway finds each call's path leads, per call id; absent means the call
    /// acts on no path.
    pub paths: BTreeMap<String, String>,
    pub person: VecDeque<Person>,
    /// Fail the commit with this 1-based number.
    pub fail_commit: Option<usize>,
    /// Cancel while the tools of this turn run.
    pub cancel_in_tools_of_turn: Option<u32>,
    /// What tools find when asked to reconcile an effect after a restart.
    pub reconcile: Option<Finding>,
    /// Bound on inputs fed, so a looping machine fails the test instead of hanging it.
    pub max_inputs: usize,
    /// The run's answer validator: `None` for a run without one; the function says why an
    /// answer is rejected, or `None` to accept it.
    pub answer_check: Option<fn(&str) -> Option<String>>,
    /// Cancel while the answer is being checked.
    pub cancel_in_answer_check: bool,
    /// What the driver knows of the next model call before each commit is confirmed (as the
    /// runtime knows it from the provider's count of the last prompt), from the log as it
    /// will stand; `None` knows nothing.
    pub next_call: Option<fn(&[Entry]) -> Usage>,
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
        paths: BTreeMap::new(),
        person: VecDeque::new(),
        fail_commit: None,
        cancel_in_tools_of_turn: None,
        reconcile: None,
        max_inputs: 10_000,
        answer_check: None,
        cancel_in_answer_check: false,
        next_call: None,
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
    /// The place the executor was told the call's path led to when it was judged.
    pub path: Option<String>,
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
                    usage: Usage::default(),
                }],
                message: (*msg).into(),
                kind: agent_core::ModelErrorKind::Server,
                usage: Usage::default(),
                by_budget: false,
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
        answer: None,
        forked_from: None,
        parent: None,
        workspace: None,
        sandbox: None,
    }
}

/// Runs the world to the end of the invocation, checking invariants at every step.
pub fn run(world: World) -> Report {
    let specs: Vec<ToolSpec> = world.tools.iter().map(|t| t.spec.clone()).collect();
    let mut manifest = manifest(world.budget.clone());
    if world.answer_check.is_some() {
        manifest.answer = Some(Box::new(AnswerSpec {
            schema: None,
            checks: vec!["harness check".into()],
        }));
    }
    let config = RunConfig {
        run_id: "run-1".into(),
        goal: "test goal".into(),
        manifest,
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

/// Goes on with `world` from a boundary of an earlier invocation as [`resume`] does, but
/// `down_ms` later and through [`Machine::take_up`], as a process that takes a run up
/// again after it was left: an interrupted run commits `run_resumed` first.
pub fn take_up(world: World, log: &[Entry], at: &Boundary, down_ms: u64) -> Report {
    let specs: Vec<ToolSpec> = world.tools.iter().map(|t| t.spec.clone()).collect();
    let prefix = log[..at.log_len].to_vec();
    let mut at = at.clone();
    at.clock += down_ms;
    let machine = Machine::take_up(specs, &prefix, at.clock).expect("a committed prefix resumes");
    drive(world, machine, prefix, &at)
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
