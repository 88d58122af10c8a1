//! The sans-IO run machine. Inputs go in through [`Machine::handle`]; commands come out of
//! [`Machine::poll_command`]. The machine never reads a clock or touches IO: time arrives as
//! [`Input::Tick`], and every effect is a command the runtime carries out.
//!
//! Drain commands after every input. There is at most one command outstanding at a time;
//! the runtime answers it with the matching input (`CallModel` → `ModelReplied` or
//! `ModelFailed`, `CheckCalls` → `CallsChecked`, `ExecuteTools` → `ToolsFinished`,
//! `Commit` → `Committed` or `CommitFailed`, `AwaitApproval` → `ApprovalGranted` or
//! `ApprovalDenied`), and may send `Tick` and `Cancel` at any time.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::budget::Budget;
use crate::decision::{CallId, Decision, InvalidReply, ModelReply, ToolCall};
use crate::event::{Entry, Event, Manifest};
use crate::progress::correction_message;
use crate::reason::{Outcome, PendingCall, TerminalReason};
use crate::schedule::{ScheduledCall, schedule};
use crate::state::{FoldError, RunState, Status};
use crate::tool::{ErrorKind, ToolError, ToolResult, ToolSpec};

/// What the gateway says about one call (existence is checked by the machine itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Run it.
    Allow,
    /// Ask a person first.
    Ask {
        /// Why, for the person.
        why: String,
    },
    /// Refuse it; the model sees a `denied` error with the reason.
    Deny {
        /// Why, for the model.
        reason: String,
    },
    /// The arguments do not validate; the model sees an `invalid_arguments` error.
    Invalid {
        /// What is wrong, with the path inside the arguments.
        message: String,
    },
    /// The tool is gone (its server died and did not restart): the run stops with
    /// `tool_unavailable`.
    Unavailable {
        /// What happened to the tool.
        reason: String,
    },
}

/// Something that happened outside the machine.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// The time is now `ms` milliseconds since the epoch.
    Tick(u64),
    /// The model answered the outstanding `CallModel`.
    ModelReplied(ModelReply),
    /// The provider failed past its retry budget.
    ModelFailed {
        /// The provider's error.
        message: String,
    },
    /// The gateway's verdicts for the outstanding `CheckCalls`.
    CallsChecked {
        /// One verdict per call id; a call without one is denied (fail closed).
        verdicts: Vec<(CallId, Verdict)>,
    },
    /// The outstanding `ExecuteTools` finished; results in any order.
    ToolsFinished {
        /// The results, correlated by call id.
        results: Vec<ToolResult>,
    },
    /// The outstanding `Commit` is durable at this version.
    Committed {
        /// The version the store now holds.
        version: u64,
    },
    /// The outstanding `Commit` failed.
    CommitFailed {
        /// The store's error.
        message: String,
    },
    /// A person approved pending calls (all of them when `call_ids` is empty).
    ApprovalGranted {
        /// The approved calls.
        call_ids: Vec<CallId>,
    },
    /// A person denied pending calls (all of them when `call_ids` is empty).
    ApprovalDenied {
        /// The denied calls.
        call_ids: Vec<CallId>,
        /// Why, shown to the model.
        reason: String,
    },
    /// The caller cancelled the run.
    Cancel,
}

impl Input {
    fn name(&self) -> &'static str {
        match self {
            Input::Tick(_) => "Tick",
            Input::ModelReplied(_) => "ModelReplied",
            Input::ModelFailed { .. } => "ModelFailed",
            Input::CallsChecked { .. } => "CallsChecked",
            Input::ToolsFinished { .. } => "ToolsFinished",
            Input::Committed { .. } => "Committed",
            Input::CommitFailed { .. } => "CommitFailed",
            Input::ApprovalGranted { .. } => "ApprovalGranted",
            Input::ApprovalDenied { .. } => "ApprovalDenied",
            Input::Cancel => "Cancel",
        }
    }
}

/// What the machine asks the runtime to do next.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Build the context from the committed log and ask the model for one decision.
    CallModel {
        /// The model call's number (1-based).
        turn: u32,
    },
    /// Validate these calls' arguments and ask policy and pre-call hooks about them.
    CheckCalls {
        /// The turn that proposed them.
        turn: u32,
        /// Calls to known tools, in the model's order.
        calls: Vec<ToolCall>,
    },
    /// Run these groups one after another; the calls of one group may run concurrently.
    ExecuteTools {
        /// The turn that proposed them.
        turn: u32,
        /// The schedule.
        groups: Vec<Vec<ScheduledCall>>,
    },
    /// Append these entries atomically if the log is at `expected_version`, durably.
    Commit {
        /// The version the log must be at.
        expected_version: u64,
        /// The entries, versions `expected_version + 1 ..`.
        entries: Vec<Entry>,
    },
    /// Wait for a person to approve or deny these calls.
    AwaitApproval {
        /// The calls waiting (empty when the model asked about a plan without calls).
        pending: Vec<PendingCall>,
        /// The model's own summary, when it asked.
        summary: Option<String>,
    },
    /// The run has stopped with this outcome; nothing more will be asked.
    Finish(Outcome),
}

/// An input that does not fit where the machine is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// The input answers a command that is not outstanding.
    #[error("{input} is not expected while the machine is {phase}")]
    Unexpected {
        /// The input's name.
        input: &'static str,
        /// The phase's name.
        phase: &'static str,
    },
    /// An approval names a call that is not pending.
    #[error("call {0} is not pending approval")]
    NotPending(CallId),
}

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
    AwaitingCommit,
    AwaitingApproval,
    Ended(Outcome),
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Phase::AwaitingModel { .. } => "AwaitingModel",
            Phase::AwaitingChecks { .. } => "AwaitingChecks",
            Phase::AwaitingTools { .. } => "AwaitingTools",
            Phase::AwaitingCommit => "AwaitingCommit",
            Phase::AwaitingApproval => "AwaitingApproval",
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
    phase: Phase,
    now_ms: u64,
    stop: Option<Outcome>,
    fault: Option<FoldError>,
    commands: VecDeque<Command>,
}

impl Machine {
    /// A new run. The first command commits `run_started`; the model is asked only after.
    pub fn start(config: RunConfig, now_ms: u64) -> Machine {
        let budget = config.manifest.budget.clone();
        let mut machine = Machine::empty(config.tools, budget, RunState::default(), now_ms);
        machine.stage(Event::RunStarted {
            run_id: config.run_id,
            goal: config.goal,
            manifest: config.manifest,
        });
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
        let state = RunState::fold(entries)?;
        let Some(manifest) = &state.manifest else {
            return Err(FoldError {
                version: 0,
                event: "run_started",
                problem: "the log is empty".into(),
            });
        };
        let budget = manifest.budget.clone();
        let mut machine = Machine::empty(tools, budget, state, now_ms);
        machine.after_commit();
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
            phase: Phase::AwaitingCommit,
            now_ms,
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

    /// The run's budget.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The tools the run may call.
    pub fn tools(&self) -> impl Iterator<Item = &ToolSpec> {
        self.tools.values()
    }

    /// Where the invocation stands if it stops now: the outcome once ended, or the
    /// `approval_required` pause while calls wait for a person.
    pub fn outcome(&self) -> Option<Outcome> {
        match &self.phase {
            Phase::Ended(outcome) => Some(outcome.clone()),
            Phase::AwaitingApproval => Some(self.approval_outcome()),
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
                if self.stop.is_none() || matches!(self.phase, Phase::AwaitingApproval) {
                    self.interrupt(Outcome::stop(
                        TerminalReason::Cancelled,
                        "the run was cancelled; no new action was started after that",
                    ));
                }
            }
            (Phase::AwaitingModel { turn }, Input::ModelReplied(reply)) => {
                self.on_reply(turn, reply);
            }
            (Phase::AwaitingModel { turn }, Input::ModelFailed { message }) => {
                self.stage(Event::ModelFailed {
                    turn,
                    message: message.clone(),
                });
                self.end(Outcome::stop(
                    TerminalReason::ModelError,
                    format!("the model provider failed: {message}"),
                ));
            }
            (
                Phase::AwaitingChecks {
                    turn,
                    calls,
                    asked_by_model,
                },
                Input::CallsChecked { verdicts },
            ) => self.on_verdicts(turn, calls, asked_by_model, verdicts),
            (Phase::AwaitingTools { turn, calls }, Input::ToolsFinished { results }) => {
                self.on_results(turn, calls, results);
            }
            (Phase::AwaitingCommit, Input::Committed { version }) => {
                if version == self.working.version {
                    // Fold the turn into the committed state rather than cloning the working
                    // one: O(events of the turn), not O(history).
                    for entry in std::mem::take(&mut self.staged) {
                        if let Err(err) = self.committed.apply(&entry) {
                            self.fault.get_or_insert(err);
                        }
                    }
                    match self.fault.take() {
                        Some(fault) => self.commit_failed(format!("internal error: {fault}")),
                        None => self.after_commit(),
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
                    let name = self.call_name(&id);
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

    // ----- turn stages -------------------------------------------------------------------

    fn on_reply(&mut self, turn: u32, reply: ModelReply) {
        let ModelReply { decision, usage } = reply;
        let checked = decision.and_then(|d| match d.check() {
            Ok(()) => Ok(d),
            Err(problem) => Err(InvalidReply {
                raw: serde_json::to_string(&d).unwrap_or_default(),
                problem: problem.to_string(),
            }),
        });
        let decision = match checked {
            Ok(decision) => decision,
            Err(InvalidReply { raw, problem }) => {
                self.stage(Event::DecisionRejected {
                    turn,
                    raw,
                    problem,
                    usage,
                });
                return self.settle_turn();
            }
        };
        self.stage(Event::DecisionProposed {
            turn,
            decision: decision.clone(),
            usage,
        });
        match decision {
            Decision::Final { answer } => self.end(Outcome::completed(answer)),
            Decision::Clarification { question } => self.end(Outcome::stop(
                TerminalReason::ClarificationRequired,
                format!("the model asks a question only a person can answer: {question}"),
            )),
            Decision::CannotContinue { reason } => self.end(Outcome::stop(
                TerminalReason::CannotContinue,
                format!("the model says it cannot continue: {reason}"),
            )),
            Decision::ToolCalls { calls } => {
                let plan = &self.working.plan;
                if plan.streak > self.budget.max_repeated_plan {
                    if plan.corrected {
                        let streak = plan.streak;
                        return self.end(Outcome::stop(
                            TerminalReason::NoProgress,
                            format!(
                                "the model proposed the same tool calls {streak} turns in a row, \
                                 even after being told it was repeating itself"
                            ),
                        ));
                    }
                    let fingerprint = plan.last.clone().unwrap_or_default();
                    let message =
                        correction_message(&calls, plan.streak, &self.working.last_results);
                    self.stage(Event::CorrectionIssued {
                        turn,
                        fingerprint,
                        message,
                        call_ids: calls.iter().map(|c| c.id.clone()).collect(),
                    });
                    return self.commit();
                }
                self.screen(turn, calls, None);
            }
            Decision::RequestApproval { summary, calls } => self.screen(turn, calls, Some(summary)),
        }
    }

    /// Rejects calls to unknown tools, then asks the gateway about the rest.
    fn screen(&mut self, turn: u32, calls: Vec<ToolCall>, asked_by_model: Option<String>) {
        let proposed = calls.len();
        let mut known = Vec::with_capacity(calls.len());
        for call in calls {
            if self.tools.contains_key(&call.name) {
                known.push(call);
            } else {
                let names: Vec<&str> = self.tools.keys().map(String::as_str).collect();
                let message = format!(
                    "no tool is named {:?}; the tools are: {}",
                    call.name,
                    names.join(", ")
                );
                self.stage(Event::CallRejected {
                    turn,
                    result: ToolResult::error(
                        call.id,
                        call.name,
                        ToolError::new(ErrorKind::UnknownTool, message),
                    ),
                });
            }
        }
        if known.is_empty() {
            if let (Some(summary), 0) = (asked_by_model, proposed) {
                // The model asked about a plan without calls: a person answers it.
                self.stage(Event::ApprovalRequested {
                    turn,
                    summary: Some(summary),
                    pending: Vec::new(),
                    allowed: Vec::new(),
                });
                return self.commit();
            }
            return self.settle_turn();
        }
        self.phase = Phase::AwaitingChecks {
            turn,
            calls: known.clone(),
            asked_by_model,
        };
        self.commands
            .push_back(Command::CheckCalls { turn, calls: known });
    }

    fn on_verdicts(
        &mut self,
        turn: u32,
        calls: Vec<ToolCall>,
        asked_by_model: Option<String>,
        verdicts: Vec<(CallId, Verdict)>,
    ) {
        let mut verdicts: BTreeMap<CallId, Verdict> = verdicts.into_iter().collect();
        let mut writes_left = self
            .budget
            .max_write_actions
            .map(|max| max.saturating_sub(self.working.write_actions));
        let mut runnable = Vec::new();
        let mut pending = Vec::new();
        let gone = calls.iter().find_map(|c| match verdicts.get(&c.id) {
            Some(Verdict::Unavailable { reason }) => {
                Some(format!("tool {} is unavailable: {reason}", c.name))
            }
            _ => None,
        });
        if let Some(message) = gone {
            return self.end(Outcome::stop(TerminalReason::ToolUnavailable, message));
        }
        for call in calls {
            let verdict = verdicts.remove(&call.id).unwrap_or(Verdict::Deny {
                reason: "the tool gateway gave no verdict for this call".into(),
            });
            let side_effect = self
                .tools
                .get(&call.name)
                .is_some_and(ToolSpec::has_side_effects);
            let rejection = match verdict {
                Verdict::Invalid { message } => {
                    Some(ToolError::new(ErrorKind::InvalidArguments, message))
                }
                Verdict::Deny { reason } | Verdict::Unavailable { reason } => {
                    Some(ToolError::new(ErrorKind::Denied, reason))
                }
                Verdict::Ask { why } => {
                    pending.push(pending_call(&call, why));
                    None
                }
                Verdict::Allow => {
                    if let Some(summary) = &asked_by_model {
                        pending.push(pending_call(&call, format!("the model asked: {summary}")));
                    } else if side_effect && writes_left == Some(0) {
                        let max = self.budget.max_write_actions.unwrap_or(0);
                        pending.push(pending_call(
                            &call,
                            format!("the write-action budget (max_write_actions = {max}) is spent"),
                        ));
                    } else {
                        if side_effect {
                            writes_left = writes_left.map(|n| n - 1);
                        }
                        runnable.push(call.id.clone());
                    }
                    None
                }
            };
            if let Some(error) = rejection {
                self.stage(Event::CallRejected {
                    turn,
                    result: ToolResult::error(call.id, call.name, error),
                });
            }
        }
        if !pending.is_empty() {
            self.stage(Event::ApprovalRequested {
                turn,
                summary: asked_by_model,
                pending,
                allowed: runnable,
            });
            return self.commit();
        }
        self.execute(turn, runnable);
    }

    /// Checks the budgets that limit tool calls, then schedules the calls named in `ids`
    /// (in the model's order).
    fn execute(&mut self, turn: u32, ids: Vec<CallId>) {
        let wanted: BTreeSet<CallId> = ids.into_iter().collect();
        let calls: Vec<ToolCall> = self
            .working
            .turn_calls
            .iter()
            .filter(|c| wanted.contains(&c.id))
            .cloned()
            .collect();
        if calls.is_empty() {
            return self.settle_turn();
        }
        let retries = self.budget.max_retries_per_tool;
        if let Some(call) = calls.iter().find(|c| self.working.runs_of(c) > retries) {
            let runs = self.working.runs_of(call);
            return self.end(Outcome::stop(
                TerminalReason::ToolBudgetExhausted,
                format!(
                    "call {} to {} already ran {runs} times; its retry budget \
                     (max_retries_per_tool = {retries}) is spent",
                    call.id, call.name
                ),
            ));
        }
        let used = self.working.tool_calls;
        let batch = u32::try_from(calls.len()).unwrap_or(u32::MAX);
        if used.saturating_add(batch) > self.budget.max_tool_calls {
            return self.end(Outcome::stop(
                TerminalReason::ToolBudgetExhausted,
                format!(
                    "a batch of {batch} calls would pass the tool-call budget ({used} of {} \
                     used); raise --max-tool-calls to allow more",
                    self.budget.max_tool_calls
                ),
            ));
        }
        let groups = schedule(calls, &self.tools, &self.working.run_id, turn);
        self.phase = Phase::AwaitingTools {
            turn,
            calls: groups.iter().flatten().cloned().collect(),
        };
        self.commands
            .push_back(Command::ExecuteTools { turn, groups });
    }

    fn on_results(&mut self, turn: u32, calls: Vec<ScheduledCall>, results: Vec<ToolResult>) {
        let mut by_id: BTreeMap<CallId, ToolResult> = results
            .into_iter()
            .map(|r| (r.call_id.clone(), r))
            .collect();
        let mut unknown = Vec::new();
        for scheduled in calls {
            let call = scheduled.call;
            let Some(mut result) = by_id.remove(&call.id) else {
                // No result: the call never started (the run was interrupted before its
                // group), or the gateway lost it.
                let error = match &self.stop {
                    Some(stop) => ToolError::new(
                        ErrorKind::Cancelled,
                        format!("not started: the run stopped ({})", stop.reason),
                    ),
                    None => ToolError::new(
                        ErrorKind::ExecutionFailed,
                        "the tool gateway returned no result for this call",
                    ),
                };
                self.stage(Event::CallRejected {
                    turn,
                    result: ToolResult::error(call.id, call.name, error),
                });
                continue;
            };
            result.name = call.name;
            if scheduled.effect_key.is_some()
                && result.error_kind() == Some(ErrorKind::OutcomeUnknown)
            {
                unknown.push(format!("{} ({})", result.call_id, result.name));
            }
            self.stage(Event::ToolFinished {
                turn,
                result,
                effect_key: scheduled.effect_key,
            });
        }
        if !unknown.is_empty() {
            // A side effect may or may not have happened: never guess, never repeat it.
            return self.end(Outcome::stop(
                TerminalReason::OutcomeUnknown,
                format!(
                    "whether call {} took effect is unknown; check, then settle it with \
                     `agent resolve`",
                    unknown.join(", ")
                ),
            ));
        }
        self.settle_turn();
    }

    /// The turn's events are all staged: apply the limits that look at whole turns, then
    /// commit.
    fn settle_turn(&mut self) {
        self.flush_results();
        if let Some(outcome) = self.stop.take() {
            return self.end(outcome);
        }
        let invalid = self.working.invalid_streak();
        if invalid > self.budget.max_invalid_decisions {
            return self.end(Outcome::stop(
                TerminalReason::InvalidDecision,
                format!(
                    "the model broke the decision protocol {invalid} turns in a row \
                     (max_invalid_decisions = {})",
                    self.budget.max_invalid_decisions
                ),
            ));
        }
        let denials = self.working.denial_streak();
        if denials >= self.budget.max_denials {
            return self.end(Outcome::stop(
                TerminalReason::PolicyViolation,
                format!(
                    "every call was denied {denials} turns in a row (max_denials = {}); \
                     change the policy with --allow or give the model another goal",
                    self.budget.max_denials
                ),
            ));
        }
        self.commit();
    }

    fn after_settlement(&mut self) {
        match &self.working.status {
            Status::AwaitingApproval(_) => self.commit(),
            _ => {
                let Status::AwaitingApproval(approval) = &self.committed.status else {
                    return self.commit();
                };
                let mut ids = approval.allowed.clone();
                ids.extend(approval.granted.iter().cloned());
                if let Some(Event::ApprovalGranted { call_ids }) =
                    self.staged.first().map(|e| &e.event)
                {
                    ids.extend(call_ids.iter().cloned());
                }
                let turn = approval.turn;
                self.execute(turn, ids);
            }
        }
    }

    // ----- commits and the start of turns ------------------------------------------------

    fn after_commit(&mut self) {
        match self.committed.status.clone() {
            Status::Ended(outcome) => {
                self.phase = Phase::Ended(outcome.clone());
                self.commands.push_back(Command::Finish(outcome));
            }
            Status::AwaitingApproval(approval) => {
                if let Some(outcome) = self.stop.take() {
                    return self.end(outcome);
                }
                self.phase = Phase::AwaitingApproval;
                self.commands.push_back(Command::AwaitApproval {
                    pending: approval.pending,
                    summary: approval.summary,
                });
            }
            Status::Running | Status::New => self.begin_turn(),
        }
    }

    /// Checks the budgets that limit model calls, then asks for the next decision.
    fn begin_turn(&mut self) {
        if let Some(outcome) = self.stop.take() {
            return self.end(outcome);
        }
        if self.deadline_passed() {
            return self.end(Outcome::stop(
                TerminalReason::DeadlineExceeded,
                self.deadline_message(),
            ));
        }
        let state = &self.working;
        if state.steps >= self.budget.max_steps {
            return self.end(Outcome::stop(
                TerminalReason::MaxSteps,
                format!(
                    "the model was called {} times, the step budget; raise --max-steps to allow \
                     more",
                    state.steps
                ),
            ));
        }
        if let Some(max) = self.budget.max_tokens {
            let used = state.usage.total_tokens();
            if used >= max {
                return self.end(Outcome::stop(
                    TerminalReason::CostBudgetExceeded,
                    format!("{used} tokens used, the token budget is {max}"),
                ));
            }
        }
        if let Some(max) = self.budget.max_cost_usd {
            let used = state.usage.cost_usd;
            if used >= max {
                return self.end(Outcome::stop(
                    TerminalReason::CostBudgetExceeded,
                    format!("${used:.4} spent, the cost budget is ${max:.4}"),
                ));
            }
        }
        let turn = state.steps + 1;
        self.phase = Phase::AwaitingModel { turn };
        self.commands.push_back(Command::CallModel { turn });
    }

    /// Stages an event of the turn. Results (`call_rejected`, `tool_finished`) are held
    /// and staged together, in the order the model listed the calls, before the next other
    /// event or the commit, so a batch's results are committed in the model's order.
    fn stage(&mut self, event: Event) {
        if matches!(
            event,
            Event::CallRejected { .. } | Event::ToolFinished { .. }
        ) {
            self.held.push(event);
            return;
        }
        self.flush_results();
        self.stage_now(event);
    }

    fn flush_results(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let mut held = std::mem::take(&mut self.held);
        let calls = &self.working.turn_calls;
        let position = |event: &Event| match event {
            Event::CallRejected { result, .. } | Event::ToolFinished { result, .. } => calls
                .iter()
                .position(|c| c.id == result.call_id)
                .unwrap_or(usize::MAX),
            _ => usize::MAX,
        };
        held.sort_by_key(position);
        for event in held {
            self.stage_now(event);
        }
    }

    fn stage_now(&mut self, event: Event) {
        let entry = Entry {
            version: self.working.version + 1,
            at_ms: self.now_ms,
            event,
        };
        if let Err(err) = self.working.apply(&entry) {
            // Only a bug in the machine gets here; the commit turns it into a stop.
            self.fault.get_or_insert(err);
            return;
        }
        self.staged.push(entry);
    }

    fn commit(&mut self) {
        self.flush_results();
        if let Some(fault) = self.fault.take() {
            return self.commit_failed(format!("internal error, nothing was written: {fault}"));
        }
        self.phase = Phase::AwaitingCommit;
        self.commands.push_back(Command::Commit {
            expected_version: self.committed.version,
            entries: self.staged.clone(),
        });
    }

    fn end(&mut self, outcome: Outcome) {
        self.stage(Event::RunEnded { outcome });
        self.commit();
    }

    fn commit_failed(&mut self, message: String) {
        self.working = self.committed.clone();
        self.staged.clear();
        self.held.clear();
        let outcome = Outcome::stop(
            TerminalReason::CheckpointFailed,
            format!("the event log could not be committed: {message}"),
        );
        self.phase = Phase::Ended(outcome.clone());
        self.commands.push_back(Command::Finish(outcome));
    }

    /// A cancel or a passed deadline: stop now if nothing runs, else at the end of the
    /// step that runs (tools are cancelled by the runtime and their results kept).
    fn interrupt(&mut self, outcome: Outcome) {
        match self.phase {
            Phase::AwaitingModel { .. } | Phase::AwaitingChecks { .. } => self.end(outcome),
            Phase::AwaitingApproval => {
                if outcome.reason == TerminalReason::Cancelled {
                    self.end(outcome);
                }
            }
            Phase::AwaitingTools { .. } | Phase::AwaitingCommit => self.stop = Some(outcome),
            Phase::Ended(_) => {}
        }
    }

    // ----- helpers -----------------------------------------------------------------------

    fn deadline_passed(&self) -> bool {
        self.budget
            .max_wall_time_ms
            .is_some_and(|max| self.now_ms >= self.committed_start().saturating_add(max))
    }

    fn committed_start(&self) -> u64 {
        if self.working.version == 0 {
            self.now_ms
        } else {
            self.working.started_at_ms
        }
    }

    fn deadline_message(&self) -> String {
        let max = self.budget.max_wall_time_ms.unwrap_or(0);
        format!(
            "the wall-clock budget of {:.1} s is spent; raise --timeout to allow more",
            max as f64 / 1000.0
        )
    }

    fn approval_outcome(&self) -> Outcome {
        let (pending, summary) = match &self.committed.status {
            Status::AwaitingApproval(a) => (a.pending.clone(), a.summary.clone()),
            _ => (Vec::new(), None),
        };
        let message = match (&summary, pending.len()) {
            (Some(summary), 0) => format!("the model asks a person's approval: {summary}"),
            (_, n) => format!("{n} call(s) need a person's approval"),
        };
        Outcome {
            reason: TerminalReason::ApprovalRequired,
            answer: None,
            message,
            pending,
        }
    }

    /// The pending calls an approval or denial settles: all of them when none is named.
    fn settle_ids(&self, call_ids: Vec<CallId>) -> Result<Vec<CallId>, InputError> {
        let Status::AwaitingApproval(approval) = &self.committed.status else {
            return Err(InputError::Unexpected {
                input: "approval",
                phase: "not awaiting approval",
            });
        };
        if call_ids.is_empty() {
            return Ok(approval.pending.iter().map(|p| p.call_id.clone()).collect());
        }
        for id in &call_ids {
            if !approval.pending.iter().any(|p| &p.call_id == id) {
                return Err(InputError::NotPending(id.clone()));
            }
        }
        Ok(call_ids)
    }

    fn call_name(&self, id: &CallId) -> String {
        self.working
            .turn_calls
            .iter()
            .find(|c| &c.id == id)
            .map(|c| c.name.clone())
            .unwrap_or_default()
    }
}

fn pending_call(call: &ToolCall, why: String) -> PendingCall {
    PendingCall {
        call_id: call.id.clone(),
        tool: call.name.clone(),
        arguments: call.arguments.clone(),
        why,
    }
}
