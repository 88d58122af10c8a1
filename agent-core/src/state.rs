//! `RunState`: a pure fold over a run's committed events. Resume is this fold and nothing
//! else, so it must reproduce exactly the state the live machine had.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::budget::Usage;
use crate::decision::{CallId, Decision, ToolCall};
use crate::event::{Entry, Event, Manifest};
use crate::progress::{call_signature, fingerprint_and_signatures};
use crate::reason::{Outcome, PendingCall};
use crate::tool::{ErrorKind, ToolResult};

/// Where a run stands after its committed events.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Status {
    /// Not started (no event yet).
    New,
    /// The next step is a model call.
    Running,
    /// Calls wait for a person.
    AwaitingApproval(Approval),
    /// Side effects of unknown outcome wait for a person's word.
    AwaitingResolution {
        /// The turn they belong to.
        turn: u32,
        /// The calls in doubt.
        pending: Vec<PendingCall>,
    },
    /// The run stopped.
    Ended(Outcome),
}

/// What a paused run waits for.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Approval {
    /// The turn whose calls wait.
    pub turn: u32,
    /// The model's own summary, when it asked itself.
    pub summary: Option<String>,
    /// Calls still waiting.
    pub pending: Vec<PendingCall>,
    /// Calls of the batch allowed without asking.
    pub allowed: Vec<CallId>,
    /// Calls approved so far.
    pub granted: Vec<CallId>,
}

/// How the current plan compares with the previous turns (CONTRACT §6).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PlanTrack {
    /// Fingerprint of the latest batch, if the latest decision was a batch.
    pub last: Option<String>,
    /// Turns in a row that proposed it.
    pub streak: u32,
    /// Whether the model was already corrected for it.
    pub corrected: bool,
}

/// Per-turn counts from which the invalid and denial streaks derive.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
struct Tally {
    rejected_reply: bool,
    calls: u32,
    invalid: u32,
    denied: u32,
}

impl Tally {
    fn invalid(&self) -> bool {
        self.rejected_reply || (self.calls > 0 && self.invalid == self.calls)
    }

    fn denied(&self) -> bool {
        self.calls > 0 && self.denied == self.calls
    }
}

/// An event that does not fit the log it is folded into: the log is damaged or foreign.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("event log entry {version} ({event}): {problem}")]
pub struct FoldError {
    /// The entry's version.
    pub version: u64,
    /// The entry's event name.
    pub event: &'static str,
    /// What is wrong.
    pub problem: String,
}

/// The state of a run, derived only from its events.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunState {
    /// The run id.
    pub run_id: String,
    /// The goal.
    pub goal: String,
    /// What shaped the run.
    pub manifest: Option<Manifest>,
    /// When the run started (ms since the epoch).
    pub started_at_ms: u64,
    /// Time of the latest event.
    pub updated_at_ms: u64,
    /// Number of committed events.
    pub version: u64,
    /// Model calls made.
    pub steps: u32,
    /// Tool calls started.
    pub tool_calls: u32,
    /// `write`/`external` calls started (by a fork, since it was made: the budget's count).
    pub write_actions: u32,
    /// Tokens and money over all model calls of the log (a fork's inherited ones included:
    /// what its budgets count is [`RunState::budget_usage`]).
    pub usage: Usage,
    /// For a fork: what its inherited prefix used, the parent's spending, which the fork's
    /// budgets do not count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inherited_usage: Option<Usage>,
    /// Where the run stands.
    pub status: Status,
    /// The latest model call's turn number.
    pub turn: u32,
    /// The calls the latest decision proposed.
    pub turn_calls: Vec<ToolCall>,
    /// Results of the latest turn that produced any, in commit order, each cut to what a
    /// correction quotes of it (see [`crate::progress::correction_message`]): a state
    /// keeps no tool's whole output.
    pub last_results: Vec<ToolResult>,
    /// Repetition tracking.
    pub plan: PlanTrack,
    /// Calls of the latest turn that have their answer (a result, a rejection, a
    /// correction).
    pub answered: BTreeSet<CallId>,
    /// `write`/`external` calls of the latest turn recorded as dispatched, with their
    /// effect keys.
    pub dispatched: BTreeMap<CallId, String>,
    /// Dispatched calls known not to have taken effect (reconciled, or a person said retry).
    pub cleared: BTreeSet<CallId>,
    /// Calls of the latest turn a person approved.
    pub granted: BTreeSet<CallId>,
    /// Where the paths of the latest turn's calls led when they were checked, for calls
    /// that waited for a person: after the approval they act on that place or not at all.
    pub judged_paths: BTreeMap<CallId, String>,
    /// The current exchange: 0 for the goal, then one more for each user message.
    pub exchange: u32,
    /// Model calls made before the current exchange began.
    pub exchange_steps: u32,
    /// Tool calls started before the current exchange began.
    pub exchange_tool_calls: u32,
    /// Wall-clock time worked before the current stretch of work began (ms): the time a
    /// run waited for a person (between exchanges, for an approval, for a call in doubt to
    /// be resolved) does not count.
    pub worked_ms: u64,
    /// When the current stretch of work began (ms since the epoch): the current exchange's
    /// start, or the answer that let a run paused for a person go on; for a fork, not
    /// before the fork was made.
    pub exchange_started_at_ms: u64,
    /// When the run paused for a person's approval or resolution, while it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_at_ms: Option<u64>,
    /// For a fork, the last version of its log inherited from its parent: once folded,
    /// the fork's own budgets start ([`RunState::budget_usage`], the step, tool-call and
    /// write-action counts).
    #[serde(skip)]
    fork_version: Option<u64>,
    /// For a fork, when it was made: the time before it (in the parent, and between the
    /// parent's last inherited event and the fork) is not time the fork worked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_at_ms: Option<u64>,
    /// The budget a person set with a user message, replacing the one the run started with.
    pub budget: Option<crate::budget::Budget>,
    /// Each sub-agent run's usage as last recorded (already counted in `usage`).
    pub sub_agents: BTreeMap<String, Usage>,
    last_results_turn: u32,
    tally: Tally,
    invalid_before: u32,
    denials_before: u32,
    attempts: crate::attempts::Attempts,
    /// The [`call_signature`] of each of `turn_calls`, in their order (when repeats are
    /// tracked).
    turn_signatures: Vec<u128>,
    /// Whether repeated plans and reruns are tracked (hashes of every call); a fold that
    /// only shows a run does without.
    tracks_repeats: bool,
}

impl Default for RunState {
    fn default() -> Self {
        RunState {
            run_id: String::new(),
            goal: String::new(),
            manifest: None,
            started_at_ms: 0,
            updated_at_ms: 0,
            version: 0,
            steps: 0,
            tool_calls: 0,
            write_actions: 0,
            usage: Usage::default(),
            inherited_usage: None,
            status: Status::New,
            turn: 0,
            turn_calls: Vec::new(),
            last_results: Vec::new(),
            plan: PlanTrack::default(),
            answered: BTreeSet::new(),
            dispatched: BTreeMap::new(),
            cleared: BTreeSet::new(),
            granted: BTreeSet::new(),
            judged_paths: BTreeMap::new(),
            exchange: 0,
            exchange_steps: 0,
            exchange_tool_calls: 0,
            worked_ms: 0,
            exchange_started_at_ms: 0,
            forked_at_ms: None,
            paused_at_ms: None,
            fork_version: None,
            budget: None,
            sub_agents: BTreeMap::new(),
            last_results_turn: 0,
            tally: Tally::default(),
            invalid_before: 0,
            denials_before: 0,
            attempts: crate::attempts::Attempts::default(),
            turn_signatures: Vec::new(),
            tracks_repeats: true,
        }
    }
}

impl RunState {
    /// An empty state for showing a run rather than driving it: counts, budgets, status
    /// and the latest turn as usual, but no plan fingerprints or rerun counts (`plan` stays
    /// empty, `runs_of` is 0), which cost a hash of every call.
    pub fn for_display() -> RunState {
        RunState {
            tracks_repeats: false,
            ..RunState::default()
        }
    }

    /// Folds a whole log.
    pub fn fold<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Result<RunState, FoldError> {
        let mut state = RunState::default();
        for entry in entries {
            state.apply(entry)?;
        }
        Ok(state)
    }

    /// Consecutive invalid turns, counting the current one.
    pub fn invalid_streak(&self) -> u32 {
        if self.tally.invalid() {
            self.invalid_before + 1
        } else {
            0
        }
    }

    /// Consecutive turns whose calls were all denied, counting the current one.
    pub fn denial_streak(&self) -> u32 {
        if self.tally.denied() {
            self.denials_before + 1
        } else {
            0
        }
    }

    /// How many times this exact call (id, tool, arguments) has already run.
    pub fn runs_of(&self, call: &ToolCall) -> u32 {
        // The signature this turn's fold already made, when the call is one of the turn's.
        let known = self
            .turn_calls
            .iter()
            .position(|c| c == call)
            .and_then(|at| self.turn_signatures.get(at).copied());
        self.attempts
            .get(known.unwrap_or_else(|| call_signature(call)))
    }

    /// The budget in force: the one a message set last, else the run's own (`None` before
    /// the run started).
    pub fn budget_in_force(&self) -> Option<crate::budget::Budget> {
        self.budget
            .clone()
            .or_else(|| self.manifest.as_ref().map(|m| m.budget.clone()))
    }

    /// The tool a call of the latest turn names (empty if the turn has no such call).
    pub fn call_name(&self, id: &CallId) -> String {
        self.turn_calls
            .iter()
            .find(|c| &c.id == id)
            .map(|c| c.name.clone())
            .unwrap_or_default()
    }

    /// Model calls made in the current exchange.
    pub fn exchange_steps_used(&self) -> u32 {
        self.steps.saturating_sub(self.exchange_steps)
    }

    /// Tool calls started in the current exchange.
    pub fn exchange_tool_calls_used(&self) -> u32 {
        self.tool_calls.saturating_sub(self.exchange_tool_calls)
    }

    /// When work that began at `at_ms` counts from: then, or for a fork when it was made
    /// if that is later (an exchange begun in the parent counts in the fork from there).
    fn worked_from(&self, at_ms: u64) -> u64 {
        self.forked_at_ms.map_or(at_ms, |made| at_ms.max(made))
    }

    /// Wall-clock time worked on the run by `now_ms`: every exchange so far, not the time
    /// it waited for a person in between or within one.
    pub fn worked_by(&self, now_ms: u64) -> u64 {
        let until = self
            .paused_at_ms
            .map_or(now_ms, |paused| paused.min(now_ms));
        self.worked_ms
            .saturating_add(until.saturating_sub(self.exchange_started_at_ms))
    }

    /// What the run's token and cost budgets count: every model call of the log, or for a
    /// fork those it made itself (what it inherited was its parent's spending).
    pub fn budget_usage(&self) -> Usage {
        self.inherited_usage
            .map_or(self.usage, |inherited| self.usage.since(&inherited))
    }

    /// A fork's inherited prefix is folded: what follows is the fork's own work, which its
    /// budgets count from here, as for a new exchange (the same exchange goes on: its
    /// streaks and repeats are the prefix's).
    fn begin_own_work(&mut self) {
        self.inherited_usage = Some(self.usage);
        self.exchange_steps = self.steps;
        self.exchange_tool_calls = self.tool_calls;
        self.write_actions = 0;
    }

    /// Whether the run was being worked on when its log stopped: running, and for a fork,
    /// past what it inherited (a fork just made has not been worked on).
    pub(crate) fn was_worked_on(&self) -> bool {
        matches!(self.status, Status::Running)
            && self
                .fork_version
                .is_none_or(|inherited| self.version > inherited)
    }

    /// The run paused for a person at `at_ms`: its work stops counting.
    fn pause(&mut self, at_ms: u64) {
        if self.paused_at_ms.is_none() {
            self.paused_at_ms = Some(at_ms);
        }
    }

    /// The person answered at `at_ms` and the run goes on: the time worked before the pause
    /// is kept, and work counts again from the answer.
    fn go_on(&mut self, at_ms: u64) {
        if let Some(paused) = self.paused_at_ms.take() {
            self.work_between(paused, at_ms);
        }
    }

    /// Work stopped at `until_ms` and counts again from `from_ms`: the stretch before is
    /// kept as worked, the time between is not.
    fn work_between(&mut self, until_ms: u64, from_ms: u64) {
        self.worked_ms = self
            .worked_ms
            .saturating_add(until_ms.saturating_sub(self.exchange_started_at_ms));
        self.exchange_started_at_ms = self.worked_from(from_ms);
    }

    /// Whether the latest turn still has calls without an answer while the run is running:
    /// a crash interrupted it.
    pub fn open_turn(&self) -> bool {
        matches!(self.status, Status::Running)
            && self
                .turn_calls
                .iter()
                .any(|c| !self.answered.contains(&c.id))
    }

    /// The call this run waits on, paused with it in doubt, that its sub-agent run
    /// `child_id` answers ([`crate::sub_agent_run_id`]); `None` when it waits on no such
    /// call.
    pub fn call_waiting_on(&self, child_id: &str) -> Option<&crate::PendingCall> {
        let Status::AwaitingResolution { turn, pending } = &self.status else {
            return None;
        };
        pending
            .iter()
            .find(|p| crate::sub_agent_run_id(&self.run_id, *turn, &p.call_id) == child_id)
    }

    /// Dispatched side effects with no result and no finding: their outcome is unknown.
    pub fn in_doubt(&self) -> Vec<&ToolCall> {
        self.turn_calls
            .iter()
            .filter(|c| {
                self.dispatched.contains_key(&c.id)
                    && !self.answered.contains(&c.id)
                    && !self.cleared.contains(&c.id)
            })
            .collect()
    }

    /// The outcome, once the run has ended.
    pub fn outcome(&self) -> Option<&Outcome> {
        match &self.status {
            Status::Ended(outcome) => Some(outcome),
            _ => None,
        }
    }

    /// Applies one committed entry.
    pub fn apply(&mut self, entry: &Entry) -> Result<(), FoldError> {
        self.apply_known(entry, None)
    }

    /// Applies an entry that `ahead`, a fold of the same log further on, already applied:
    /// a decision's fingerprint and call signatures are taken from `ahead` rather than
    /// computed again (the machine folds each entry into its working state, then into its
    /// committed state once the commit is confirmed).
    pub(crate) fn apply_after(&mut self, entry: &Entry, ahead: &RunState) -> Result<(), FoldError> {
        self.apply_known(entry, Some(ahead))
    }

    fn apply_known(&mut self, entry: &Entry, ahead: Option<&RunState>) -> Result<(), FoldError> {
        let fail = |problem: String| FoldError {
            version: entry.version,
            event: entry.event.name(),
            problem,
        };
        if entry.version != self.version + 1 {
            return Err(fail(format!(
                "expected version {}, the log is not contiguous",
                self.version + 1
            )));
        }
        match (&self.status, &entry.event) {
            (Status::New, Event::RunStarted { .. }) => {}
            (Status::New, _) => return Err(fail("the log does not begin with run_started".into())),
            (_, Event::RunStarted { .. }) => {
                return Err(fail("run_started after the run began".into()));
            }
            // A run paused by its end (a question for a person) can still be cancelled.
            (Status::Ended(ended), Event::RunEnded { outcome })
                if ended.reason.class() == crate::ReasonClass::Paused
                    && outcome.reason == crate::TerminalReason::Cancelled => {}
            // A person answers a question, or follows up on an ended run; a run waiting for
            // approval or for a resolution is not ended, so it never gets here.
            (Status::Ended(_), Event::UserMessage { .. }) => {}
            (_, Event::UserMessage { .. }) => {
                return Err(fail("a user message while the run had not ended".into()));
            }
            (
                Status::AwaitingApproval(_) | Status::AwaitingResolution { .. },
                Event::UserNote { .. },
            ) => {
                return Err(fail("a user note while the run waited for a person".into()));
            }
            (Status::Ended(_), _) => return Err(fail("event after run_ended".into())),
            // Only a run that was being worked on is taken up again: one waiting for a
            // person is taken up by the person's answer.
            (
                Status::AwaitingApproval(_) | Status::AwaitingResolution { .. },
                Event::RunResumed {},
            ) => {
                return Err(fail("run_resumed while the run waited for a person".into()));
            }
            _ => {}
        }
        match &entry.event {
            Event::RunStarted {
                run_id,
                goal,
                manifest,
            } => {
                self.run_id.clone_from(run_id);
                self.goal.clone_from(goal);
                self.manifest = Some(manifest.clone());
                self.started_at_ms = entry.at_ms;
                self.forked_at_ms = manifest.forked_from.as_ref().and_then(|f| f.made_at_ms);
                self.fork_version = manifest.forked_from.as_ref().map(|f| f.version);
                self.exchange_started_at_ms = self.worked_from(entry.at_ms);
                self.status = Status::Running;
            }
            // Work stopped with the last event before it (what the process did after that
            // was lost with it).
            Event::RunResumed {} => self.work_between(self.updated_at_ms, entry.at_ms),
            // Read with the next model call's prompt; nothing else changes.
            Event::UserNote { .. } => {}
            Event::UserMessage { budget, .. } => {
                // Work stopped with the exchange's last event, or when it paused for a
                // person who then ended it (`agent cancel`).
                let until = self.paused_at_ms.take().unwrap_or(self.updated_at_ms);
                self.work_between(until, entry.at_ms);
                self.exchange = self.exchange.saturating_add(1);
                self.exchange_steps = self.steps;
                self.exchange_tool_calls = self.tool_calls;
                if budget.is_some() {
                    self.budget.clone_from(budget);
                }
                // Streaks, repeats and retries start again.
                self.plan = PlanTrack::default();
                self.tally = Tally::default();
                self.invalid_before = 0;
                self.denials_before = 0;
                self.attempts.clear();
                self.clear_turn();
                self.status = Status::Running;
            }
            Event::DecisionProposed {
                turn,
                decision,
                usage,
                ..
            } => {
                self.begin_turn(*turn, usage);
                self.turn_calls = decision.calls().to_vec();
                self.tally.calls = u32::try_from(self.turn_calls.len()).unwrap_or(u32::MAX);
                match decision {
                    Decision::ToolCalls { .. } if !self.tracks_repeats => {}
                    Decision::ToolCalls { calls } => {
                        let known = ahead.and_then(|ahead| ahead.decision_folded(*turn, calls));
                        let (fp, signatures) =
                            known.unwrap_or_else(|| fingerprint_and_signatures(calls));
                        self.turn_signatures = signatures;
                        if self.plan.last.as_deref() == Some(fp.as_str()) {
                            self.plan.streak += 1;
                        } else {
                            self.plan = PlanTrack {
                                last: Some(fp),
                                streak: 1,
                                corrected: false,
                            };
                        }
                    }
                    _ => self.plan = PlanTrack::default(),
                }
            }
            Event::DecisionRejected { turn, usage, .. } => {
                self.begin_turn(*turn, usage);
                self.tally.rejected_reply = true;
                self.plan = PlanTrack::default();
            }
            Event::ModelFailed { turn, usage, .. } => {
                self.begin_turn(*turn, usage);
            }
            Event::AnswerRejected { turn, .. } => {
                if *turn != self.turn {
                    return Err(fail(format!(
                        "answer_rejected for turn {turn}, the latest decision is turn {}",
                        self.turn
                    )));
                }
                self.tally.rejected_reply = true;
            }
            Event::CallRejected { turn, result } => {
                self.answered.insert(result.call_id.clone());
                match result.error_kind() {
                    Some(ErrorKind::UnknownTool | ErrorKind::InvalidArguments) => {
                        self.tally.invalid += 1;
                    }
                    Some(ErrorKind::Denied) => self.tally.denied += 1,
                    _ => {}
                }
                self.record_result(*turn, result);
            }
            Event::CorrectionIssued { call_ids, .. } => {
                self.plan.corrected = true;
                self.answered.extend(call_ids.iter().cloned());
            }
            Event::EffectDispatched {
                call_id,
                effect_key,
                ..
            } => {
                self.dispatched.insert(call_id.clone(), effect_key.clone());
                self.cleared.remove(call_id);
            }
            Event::EffectReconciled { call_id, finding } => {
                if *finding == crate::event::Finding::NotApplied {
                    self.cleared.insert(call_id.clone());
                    // The attempt was started and gets no result of its own: it counts
                    // toward the tool-call budget (calls started), as after a person's
                    // `retry`.
                    self.tool_calls = self.tool_calls.saturating_add(1);
                }
            }
            Event::ResolutionRequested { turn, pending } => {
                self.pause(entry.at_ms);
                self.status = Status::AwaitingResolution {
                    turn: *turn,
                    pending: pending.clone(),
                };
            }
            Event::EffectResolved {
                call_id,
                resolution,
            } => {
                let Status::AwaitingResolution { pending, .. } = &mut self.status else {
                    return Err(fail("no resolution was pending".into()));
                };
                let Some(pos) = pending.iter().position(|p| &p.call_id == call_id) else {
                    return Err(fail(format!("call {call_id} was not in doubt")));
                };
                pending.remove(pos);
                if *resolution == crate::event::Resolution::Retry {
                    self.cleared.insert(call_id.clone());
                    // The attempt in doubt was started, and gets no result of its own: it
                    // counts toward the tool-call budget (calls started). Not toward the
                    // call's retries: running it again is a person's decision, after a crash.
                    self.tool_calls = self.tool_calls.saturating_add(1);
                }
                if pending.is_empty() {
                    self.status = Status::Running;
                    self.go_on(entry.at_ms);
                }
            }
            Event::ApprovalRequested {
                turn,
                summary,
                pending,
                allowed,
                allowed_paths,
            } => {
                let paths = pending
                    .iter()
                    .filter_map(|p| Some((p.call_id.clone(), p.path.clone()?)))
                    .chain(allowed_paths.iter().map(|(id, p)| (id.clone(), p.clone())));
                self.judged_paths.extend(paths);
                self.pause(entry.at_ms);
                self.status = Status::AwaitingApproval(Approval {
                    turn: *turn,
                    summary: summary.clone(),
                    pending: pending.clone(),
                    allowed: allowed.clone(),
                    granted: Vec::new(),
                });
            }
            Event::ApprovalGranted { call_ids } | Event::ApprovalDenied { call_ids, .. } => {
                let granted = matches!(entry.event, Event::ApprovalGranted { .. });
                let Status::AwaitingApproval(approval) = &mut self.status else {
                    return Err(fail("no approval was pending".into()));
                };
                for id in call_ids {
                    let Some(pos) = approval.pending.iter().position(|p| &p.call_id == id) else {
                        return Err(fail(format!("call {id} was not pending")));
                    };
                    approval.pending.remove(pos);
                    if granted {
                        approval.granted.push(id.clone());
                        self.granted.insert(id.clone());
                    }
                }
                if approval.pending.is_empty() {
                    self.status = Status::Running;
                    self.go_on(entry.at_ms);
                }
            }
            Event::ToolFinished {
                turn,
                result,
                effect_key,
            } => {
                self.tool_calls += 1;
                self.answered.insert(result.call_id.clone());
                if effect_key.is_some() {
                    self.write_actions += 1;
                }
                if self.tracks_repeats
                    && let Some(at) = self.turn_calls.iter().position(|c| c.id == result.call_id)
                {
                    let signature = match self.turn_signatures.get(at) {
                        Some(signature) => *signature,
                        None => call_signature(&self.turn_calls[at]),
                    };
                    self.attempts.record(signature);
                }
                self.record_result(*turn, result);
            }
            Event::SubAgentFinished { run_id, usage, .. } => {
                // The child's whole usage so far: what was not counted yet counts now.
                let counted = self.sub_agents.insert(run_id.clone(), *usage);
                self.usage.add(&usage.since(&counted.unwrap_or_default()));
            }
            // A summary's model calls count like the run's own.
            Event::ContextCompacted { usage, .. } | Event::CompactionDeclined { usage, .. } => {
                self.usage.add(usage);
            }
            // An attempt the provider accepted before it failed may be billed.
            Event::ModelRetried { retry, .. } => self.usage.add(&retry.usage),
            Event::RunEnded { outcome } => self.status = Status::Ended(outcome.clone()),
        }
        self.version = entry.version;
        self.updated_at_ms = entry.at_ms;
        if self.fork_version == Some(entry.version) {
            self.begin_own_work();
        }
        Ok(())
    }

    fn begin_turn(&mut self, turn: u32, usage: &Usage) {
        self.invalid_before = self.invalid_streak();
        self.denials_before = self.denial_streak();
        self.tally = Tally::default();
        self.turn = turn;
        self.clear_turn();
        self.steps += 1;
        self.usage.add(usage);
    }

    /// The fingerprint and call signatures this fold made of turn `turn`'s decision, when
    /// `calls` are that decision's.
    fn decision_folded(&self, turn: u32, calls: &[ToolCall]) -> Option<(String, Vec<u128>)> {
        let same = self.turn == turn
            && self.turn_signatures.len() == calls.len()
            && self.turn_calls.len() == calls.len()
            && self.turn_calls.iter().zip(calls).all(|(a, b)| a.id == b.id);
        let fp = self.plan.last.as_ref().filter(|_| same)?;
        Some((fp.clone(), self.turn_signatures.clone()))
    }

    /// Forgets the calls of the latest turn.
    fn clear_turn(&mut self) {
        self.turn_calls.clear();
        self.turn_signatures.clear();
        self.answered.clear();
        // Most turns have none of these; clearing an empty B-tree still walks its drop.
        if !self.dispatched.is_empty() {
            self.dispatched.clear();
        }
        if !self.cleared.is_empty() {
            self.cleared.clear();
        }
        if !self.granted.is_empty() {
            self.granted.clear();
        }
        if !self.judged_paths.is_empty() {
            self.judged_paths.clear();
        }
    }

    fn record_result(&mut self, turn: u32, result: &ToolResult) {
        if self.last_results_turn != turn {
            self.last_results.clear();
            self.last_results_turn = turn;
        }
        self.last_results.push(crate::progress::quotable(result));
    }
}
