//! The sans-IO run machine. Inputs go in through [`Machine::handle`]; commands come out of
//! [`Machine::poll_command`]. The machine never reads a clock or touches IO: time arrives as
//! [`Input::Tick`], and every effect is a command the runtime carries out.
//!
//! Drain commands after every input. There is at most one command outstanding at a time;
//! the runtime answers it with the matching input (`CallModel` → `ModelReplied` or
//! `ModelFailed`, `CheckCalls` → `CallsChecked`, `ExecuteTools` → `ToolsFinished`,
//! `Commit` → `Committed` or `CommitFailed`, `AwaitApproval` → `ApprovalGranted` or
//! `ApprovalDenied`, `ReconcileEffects` → `EffectsReconciled`, `AwaitResolution` →
//! `Resolved`, `CheckAnswer` → `AnswerChecked`), and may send `Tick` and `Cancel` at any
//! time.
//!
//! Side effects are recorded before they start: a group with `write`/`external` calls is
//! preceded by a commit of their `effect_dispatched` events, so a crash at any instant leaves
//! either no trace of a call (it never started) or a dispatch record (its outcome must be
//! reconciled or settled by a person, never guessed).

mod commit;
mod protocol;
mod recovery;
mod turn;

pub use protocol::{Command, Input, InputError, ReplyError, Verdict};
pub use turn::MAX_REJECTED_REPLY_CHARS;

use std::collections::{BTreeMap, VecDeque};

use crate::budget::{Budget, Usage};
use crate::decision::ToolCall;
use crate::event::{Entry, Event, Manifest};
use crate::reason::{Outcome, PendingCall, TerminalReason};
use crate::schedule::ScheduledCall;
use crate::state::{FoldError, RunState, Status};
use crate::tool::{ErrorKind, ToolError, ToolResult, ToolSpec};

/// What the machine waits for, named as rustls names handshake states.
#[derive(Clone, Debug, PartialEq)]
enum Phase {
    AwaitingModel {
        turn: u32,
    },
    AwaitingChecks {
        turn: u32,
        calls: Vec<ToolCall>,
        asked_by_model: Option<String>,
    },
    AwaitingTools {
        turn: u32,
        calls: Vec<ScheduledCall>,
    },
    AwaitingReconcile {
        turn: u32,
        calls: Vec<ScheduledCall>,
    },
    AwaitingAnswerCheck {
        answer: String,
    },
    AwaitingCommit,
    AwaitingApproval,
    AwaitingResolution,
    Ended(Outcome),
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Phase::AwaitingModel { .. } => "AwaitingModel",
            Phase::AwaitingChecks { .. } => "AwaitingChecks",
            Phase::AwaitingTools { .. } => "AwaitingTools",
            Phase::AwaitingReconcile { .. } => "AwaitingReconcile",
            Phase::AwaitingAnswerCheck { .. } => "AwaitingAnswerCheck",
            Phase::AwaitingCommit => "AwaitingCommit",
            Phase::AwaitingApproval => "AwaitingApproval",
            Phase::AwaitingResolution => "AwaitingResolution",
            Phase::Ended(_) => "Ended",
        }
    }
}

/// What a new run needs.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The run id (chosen by the caller: ids are inputs).
    pub run_id: String,
    /// The goal.
    pub goal: String,
    /// What shaped the run; its budget is the run's budget.
    pub manifest: Manifest,
    /// The tools the model may call.
    pub tools: Vec<ToolSpec>,
}

/// The run state machine. See the module docs for the protocol.
#[derive(Debug)]
pub struct Machine {
    tools: BTreeMap<String, ToolSpec>,
    budget: Budget,
    committed: RunState,
    working: RunState,
    staged: Vec<Entry>,
    /// Result events of the turn, staged together in the model's call order.
    held: Vec<Event>,
    /// Groups of the current batch still to run, in order.
    groups: VecDeque<Vec<ScheduledCall>>,
    /// A group whose dispatch records are being committed; it runs once they are durable.
    dispatching: Option<(u32, Vec<ScheduledCall>)>,
    phase: Phase,
    now_ms: u64,
    /// The least the next model call will use, as the caller knows it (see
    /// [`Machine::observe_next_call`]); taken by the next commit.
    next_call: Usage,
    stop: Option<Outcome>,
    fault: Option<FoldError>,
    commands: VecDeque<Command>,
}

impl Machine {
    /// A new run. The first command commits `run_started`; the model is asked only after.
    pub fn start(config: RunConfig, now_ms: u64) -> Machine {
        Machine::start_noted(config, Vec::new(), now_ms)
    }

    /// A new run with what people said to it before it began (a queued run's notes): the
    /// first command commits `run_started` and a `user_note` for each, in their order, as
    /// one batch, so that the run exists with its notes or not at all; the model reads
    /// them after the goal.
    pub fn start_noted(config: RunConfig, notes: Vec<String>, now_ms: u64) -> Machine {
        let budget = config.manifest.budget.clone();
        let mut machine = Machine::empty(config.tools, budget, RunState::default(), now_ms);
        machine.stage(Event::RunStarted {
            run_id: config.run_id,
            goal: config.goal,
            manifest: config.manifest,
        });
        for text in notes {
            machine.stage(Event::UserNote { text });
        }
        machine.commit();
        machine
    }

    /// A run rebuilt from its committed log, continuing where it stood. The budget is the
    /// one recorded at the run's start.
    pub fn resume(
        tools: Vec<ToolSpec>,
        entries: &[Entry],
        now_ms: u64,
    ) -> Result<Machine, FoldError> {
        let mut machine = Machine::rebuilt(tools, entries, now_ms)?;
        machine.after_commit(Usage::default());
        Ok(machine)
    }

    /// A run rebuilt from its committed log to be driven on by this process, as
    /// [`Machine::resume`] rebuilds it. A run that was being worked on when its last
    /// process stopped (crashed, killed, or let it go) is taken up again: the first command
    /// commits `run_resumed`, so that the time nothing drove it is not counted as worked, and
    /// the run goes on once it is committed. A run waiting for a person, ended, or a fork
    /// that has done nothing of its own yet goes on as [`Machine::resume`] has it.
    pub fn take_up(
        tools: Vec<ToolSpec>,
        entries: &[Entry],
        now_ms: u64,
    ) -> Result<Machine, FoldError> {
        let mut machine = Machine::rebuilt(tools, entries, now_ms)?;
        if machine.committed.was_worked_on() {
            machine.stage(Event::RunResumed {});
            machine.commit();
        } else {
            machine.after_commit(Usage::default());
        }
        Ok(machine)
    }

    /// The machine of a committed log, under the budget in force at its end, before it is
    /// told what to do next.
    fn rebuilt(tools: Vec<ToolSpec>, entries: &[Entry], now_ms: u64) -> Result<Machine, FoldError> {
        let state = RunState::fold(entries)?;
        let Some(budget) = state.budget_in_force() else {
            return Err(FoldError {
                version: 0,
                event: "run_started",
                problem: "the log is empty".into(),
            });
        };
        Ok(Machine::empty(tools, budget, state, now_ms))
    }

    /// A run that had ended, or paused on a question, given a person's message: the answer
    /// to its question or a follow-up. The first command commits the `user_message` (with
    /// `budget`, when given, as the run's budget from then on); the model is asked after.
    /// A run waiting for approval or resolution, or interrupted, is refused.
    pub fn reply(
        tools: Vec<ToolSpec>,
        entries: &[Entry],
        text: String,
        budget: Option<Budget>,
        now_ms: u64,
    ) -> Result<Machine, ReplyError> {
        if text.trim().is_empty() {
            return Err(ReplyError::Empty);
        }
        let state = RunState::fold(entries)?;
        match &state.status {
            Status::Ended(_) => {}
            Status::AwaitingApproval(_) => return Err(ReplyError::AwaitingApproval),
            Status::AwaitingResolution { .. } => return Err(ReplyError::AwaitingResolution),
            Status::New | Status::Running => return Err(ReplyError::NotEnded),
        }
        let Some(in_force) = state.budget_in_force() else {
            return Err(ReplyError::NotEnded);
        };
        let effective = budget.clone().unwrap_or(in_force);
        let mut machine = Machine::empty(tools, effective, state, now_ms);
        machine.stage(Event::UserMessage { text, budget });
        machine.commit();
        Ok(machine)
    }

    fn empty(tools: Vec<ToolSpec>, budget: Budget, state: RunState, now_ms: u64) -> Machine {
        Machine {
            tools: tools.into_iter().map(|t| (t.name.clone(), t)).collect(),
            budget,
            working: state.clone(),
            committed: state,
            staged: Vec::new(),
            held: Vec::new(),
            groups: VecDeque::new(),
            dispatching: None,
            phase: Phase::AwaitingCommit,
            now_ms,
            next_call: Usage::default(),
            stop: None,
            fault: None,
            commands: VecDeque::new(),
        }
    }

    /// The next command, if any. Drain after every input.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// The committed state: exactly the fold of the committed log.
    pub fn state(&self) -> &RunState {
        &self.committed
    }

    /// The committed state, for a caller done with the machine (no copy of it).
    pub fn into_state(self) -> RunState {
        self.committed
    }

    /// What the run's model calls have used as its budgets count it
    /// ([`RunState::budget_usage`]), the turn being worked on included: its reply is
    /// committed with its calls' results, once they have run, so [`Machine::state`] does not
    /// hold it yet while they run (sub-agents among them, whose budget is what is left).
    pub fn spent(&self) -> Usage {
        self.working.budget_usage()
    }

    /// The run's budget.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// What is left of the wall-clock budget at `now_ms`, as an [`Input::Tick`] then would
    /// judge it: the time worked on the run so far (every exchange, not the waits for a
    /// person between them) taken from it. `None` when the run has no such budget. A
    /// deadline the caller sleeps until is this far from now; one that says `Some(0)` is
    /// passed, and the next tick ends the run.
    pub fn wall_time_left(&self, now_ms: u64) -> Option<u64> {
        let max = self.budget.max_wall_time_ms?;
        let worked = if self.working.version == 0 {
            0
        } else {
            self.working.worked_by(self.now_ms.max(now_ms))
        };
        Some(max.saturating_sub(worked))
    }

    /// Time passes, without the wall-clock budget being judged: for the caller holding an
    /// answer to the outstanding command (a model's reply, a summary, a check's verdict),
    /// which hands it next, to be recorded at this time and judged with it. An
    /// [`Input::Tick`] past the deadline would end the run before the answer, and the
    /// answer would then fit nowhere.
    pub fn observe_time(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
    }

    /// The least the next model call will use, if the commit being awaited is followed by
    /// one: its prompt's tokens at the fewest the provider can count (the count it gave of
    /// the last prompt, when the prompt only grew since), and what they cost at the
    /// cheapest price of an input token. The token and cost budgets are checked with it
    /// before the call, as every budget is checked before what it limits: a call certain to
    /// pass one is not made. Hand it before [`Input::Committed`]; the commit's answer takes
    /// it (nothing known, the default, checks what was spent alone).
    pub fn observe_next_call(&mut self, least: Usage) {
        self.next_call = least;
    }

    /// The least the next model call will use, as [`Machine::observe_next_call`], for a
    /// machine just rebuilt from its log ([`Machine::resume`]) that asks for a model call
    /// before any commit could take it: the token and cost budgets are checked again with
    /// it, and the run ends instead of the call when the call would pass one. Anything else
    /// (a command other than that call queued, or already taken) is left as it is.
    pub fn recheck_next_call(&mut self, least: Usage) {
        let only_a_call = matches!(self.phase, Phase::AwaitingModel { .. })
            && self.commands.len() == 1
            && matches!(self.commands.front(), Some(Command::CallModel { .. }));
        if only_a_call {
            self.commands.clear();
            self.begin_turn(least);
        }
    }

    /// The tools the run may call.
    pub fn tools(&self) -> impl Iterator<Item = &ToolSpec> {
        self.tools.values()
    }

    /// Where the invocation stands if it stops now: the outcome once ended, or the pause
    /// (`approval_required`, `outcome_unknown`) while calls wait for a person.
    pub fn outcome(&self) -> Option<Outcome> {
        match &self.phase {
            Phase::Ended(outcome) => Some(outcome.clone()),
            Phase::AwaitingApproval => Some(self.approval_outcome()),
            Phase::AwaitingResolution => Some(self.resolution_outcome()),
            _ => None,
        }
    }

    /// Whether the run has stopped for good in this machine (late inputs change nothing).
    pub fn is_ended(&self) -> bool {
        matches!(self.phase, Phase::Ended(_))
    }

    /// Feeds one input. Inputs after the end are absorbed and change nothing.
    pub fn handle(&mut self, input: Input) -> Result<(), InputError> {
        if self.is_ended() {
            return Ok(());
        }
        let phase = std::mem::replace(&mut self.phase, Phase::AwaitingCommit);
        match (phase, input) {
            (phase, Input::Tick(now)) => {
                self.phase = phase;
                self.now_ms = self.now_ms.max(now);
                if self.deadline_passed() && self.stop.is_none() {
                    self.interrupt(Outcome::stop(
                        TerminalReason::DeadlineExceeded,
                        self.deadline_message(),
                    ));
                }
            }
            (phase, Input::Cancel) => {
                self.phase = phase;
                let paused = matches!(
                    self.phase,
                    Phase::AwaitingApproval | Phase::AwaitingResolution
                );
                if self.stop.is_none() || paused {
                    self.interrupt(Outcome::stop(
                        TerminalReason::Cancelled,
                        "the run was cancelled; no new action was started after that",
                    ));
                }
            }
            (Phase::AwaitingModel { turn }, Input::ModelReplied(reply)) => {
                self.on_reply(turn, reply);
            }
            (
                Phase::AwaitingModel { .. },
                Input::ContextCompacted {
                    summary,
                    through_version,
                    tokens_before,
                    tokens_after,
                    usage,
                    window,
                },
            ) => {
                // Not a step: after the commit the same turn asks the model again, once
                // the budgets (which the summary's usage counts toward) allow it.
                self.stage(Event::ContextCompacted {
                    summary,
                    through_version,
                    tokens_before,
                    tokens_after,
                    usage,
                    window,
                });
                self.commit();
            }
            (Phase::AwaitingModel { .. }, Input::UserNote { text }) => {
                // As a compaction: after the commit the same turn asks the model again.
                self.stage(Event::UserNote { text });
                self.commit();
            }
            (
                Phase::AwaitingModel { .. },
                Input::CompactionDeclined {
                    tokens_before,
                    tokens_after,
                    usage,
                },
            ) => {
                self.stage(Event::CompactionDeclined {
                    tokens_before,
                    tokens_after,
                    usage,
                });
                self.commit();
            }
            (
                Phase::AwaitingModel { turn },
                Input::ModelFailed {
                    message,
                    kind,
                    retries,
                    usage,
                    by_budget,
                },
            ) => {
                for retry in retries {
                    self.stage(Event::ModelRetried { turn, retry });
                }
                self.stage(Event::ModelFailed {
                    turn,
                    message: message.clone(),
                    kind,
                    usage,
                });
                // Retries the budget could not pay for stop the run as the budget does
                // before a call; the provider's failure is in the log and the message.
                let mut outcome = if by_budget {
                    Outcome::stop(
                        TerminalReason::CostBudgetExceeded,
                        format!(
                            "the token or cost budget left could not pay for another attempt \
                             after the model provider failed: {message}"
                        ),
                    )
                } else {
                    Outcome::stop(
                        TerminalReason::ModelError,
                        format!("the model provider failed: {message}"),
                    )
                };
                outcome.model_error = Some(kind);
                self.end(outcome);
            }
            (
                Phase::AwaitingChecks {
                    turn,
                    calls,
                    asked_by_model,
                },
                Input::CallsChecked { verdicts, paths },
            ) => self.on_verdicts(turn, calls, asked_by_model, verdicts, paths),
            (Phase::AwaitingReconcile { turn, calls }, Input::EffectsReconciled { findings }) => {
                self.on_reconciled(turn, calls, findings);
            }
            (
                Phase::AwaitingResolution,
                Input::Resolved {
                    call_id,
                    resolution,
                },
            ) => {
                self.phase = Phase::AwaitingResolution;
                self.on_resolved(call_id, resolution)?;
            }
            (Phase::AwaitingAnswerCheck { answer }, Input::AnswerChecked { rejection }) => {
                self.on_answer_checked(answer, rejection);
            }
            (Phase::AwaitingTools { turn, calls }, Input::SubAgentsFinished { finished }) => {
                for (call_id, run_id, usage) in finished {
                    if calls.iter().any(|c| c.call.id == call_id) {
                        self.stage(Event::SubAgentFinished {
                            turn,
                            call_id,
                            run_id,
                            usage,
                        });
                    }
                }
                self.phase = Phase::AwaitingTools { turn, calls };
            }
            (Phase::AwaitingTools { turn, calls }, Input::ToolsFinished { results }) => {
                self.on_results(turn, calls, results);
            }
            (Phase::AwaitingTools { turn, calls }, Input::ToolsLetGo { results }) => {
                self.on_let_go(turn, &calls, results);
            }
            (Phase::AwaitingCommit, Input::Committed { version }) => {
                // What was known of the next call describes the call after this commit
                // alone.
                let next_call = std::mem::take(&mut self.next_call);
                if version == self.working.version {
                    // Fold the turn into the committed state rather than cloning the working
                    // one: O(events of the turn), not O(history).
                    for entry in std::mem::take(&mut self.staged) {
                        if let Err(err) = self.committed.apply_after(&entry, &self.working) {
                            self.fault.get_or_insert(err);
                        }
                    }
                    match (self.fault.take(), self.dispatching.take()) {
                        (Some(fault), _) => {
                            self.commit_failed(format!("internal error: {fault}"));
                        }
                        (None, Some((turn, group))) => self.run_group(turn, group),
                        (None, None) => self.after_commit(next_call),
                    }
                } else {
                    let message = format!(
                        "the store confirmed version {version}, expected {}",
                        self.working.version
                    );
                    self.commit_failed(message);
                }
            }
            (Phase::AwaitingCommit, Input::CommitFailed { message }) => self.commit_failed(message),
            (Phase::AwaitingApproval, Input::ApprovalGranted { call_ids }) => {
                self.phase = Phase::AwaitingApproval;
                let ids = self.settle_ids(call_ids)?;
                self.stage(Event::ApprovalGranted {
                    call_ids: ids.clone(),
                });
                self.after_settlement();
            }
            (Phase::AwaitingApproval, Input::ApprovalDenied { call_ids, reason }) => {
                self.phase = Phase::AwaitingApproval;
                let ids = self.settle_ids(call_ids)?;
                let reason = if reason.trim().is_empty() {
                    "a person denied this call".to_owned()
                } else {
                    format!("a person denied this call: {reason}")
                };
                self.stage(Event::ApprovalDenied {
                    call_ids: ids.clone(),
                    reason: reason.clone(),
                });
                let turn = self.working.turn;
                for id in ids {
                    let name = self.working.call_name(&id);
                    self.stage(Event::CallRejected {
                        turn,
                        result: ToolResult::error(
                            id,
                            name,
                            ToolError::new(ErrorKind::Denied, reason.clone()),
                        ),
                    });
                }
                self.after_settlement();
            }
            (phase, input) => {
                let err = InputError::Unexpected {
                    input: input.name(),
                    phase: phase.name(),
                };
                self.phase = phase;
                return Err(err);
            }
        }
        Ok(())
    }
}

pub(crate) fn pending_call(call: &ToolCall, why: String) -> PendingCall {
    PendingCall {
        call_id: call.id.clone(),
        tool: call.name.clone(),
        arguments: call.arguments.clone(),
        why,
        path: None,
    }
}
