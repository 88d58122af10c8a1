//! The stages of a turn: the model's reply, screening, verdicts, execution group by
//! group, results and settlement.

use std::collections::{BTreeMap, BTreeSet};

use super::{Command, Machine, Phase, Verdict, pending_call};
use crate::decision::{CallId, Decision, InvalidReply, ModelReply, ToolCall};
use crate::digest::{canonical_json, sha256_hex};
use crate::event::Event;
use crate::progress::correction_message;
use crate::reason::{Outcome, TerminalReason};
use crate::schedule::{ScheduledCall, schedule};
use crate::state::Status;
use crate::tool::{ErrorKind, ToolError, ToolOutcome, ToolResult, ToolSpec};

impl Machine {
    pub(super) fn on_reply(&mut self, turn: u32, reply: ModelReply) {
        let ModelReply {
            decision,
            usage,
            retries,
            reasoning,
        } = reply;
        for retry in retries {
            self.stage(Event::ModelRetried { turn, retry });
        }
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
                    raw: kept_of_rejected(raw),
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
            reasoning,
        });
        let checked = self
            .working
            .manifest
            .as_ref()
            .and_then(|m| m.answer.as_ref())
            .is_some();
        // A reply that asks for work: calls to check and run, an answer to check.
        let works = match &decision {
            Decision::ToolCalls { .. } | Decision::RequestApproval { .. } => true,
            Decision::Final { .. } => checked,
            Decision::Clarification { .. } | Decision::CannotContinue { .. } => false,
        };
        if works && self.ended_by_deadline() {
            return;
        }
        match decision {
            Decision::Final { answer } => {
                if checked {
                    self.phase = Phase::AwaitingAnswerCheck {
                        answer: answer.clone(),
                    };
                    self.commands
                        .push_back(Command::CheckAnswer { turn, answer });
                } else {
                    self.end(Outcome::completed(answer));
                }
            }
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

    /// Ends the run if its wall-clock budget is spent: a reply that came as it ran out is
    /// kept (it was paid for), and nothing it asks for is done (no call checked or run, no
    /// check command started).
    fn ended_by_deadline(&mut self) -> bool {
        if !self.deadline_passed() {
            return false;
        }
        self.end(Outcome::stop(
            TerminalReason::DeadlineExceeded,
            self.deadline_message(),
        ));
        true
    }

    /// The validators' word on a final answer: it completes the run, or goes back to the
    /// model as a correction that counts as an invalid decision.
    pub(super) fn on_answer_checked(&mut self, answer: String, rejection: Option<String>) {
        match rejection {
            None => self.end(Outcome::completed(answer)),
            Some(problem) => {
                let turn = self.working.turn;
                self.stage(Event::AnswerRejected {
                    turn,
                    problem: problem.clone(),
                });
                let invalid = self.working.invalid_streak();
                if invalid > self.budget.max_invalid_decisions && self.stop.is_none() {
                    return self.end(Outcome::stop(
                        TerminalReason::InvalidDecision,
                        format!(
                            "the final answer failed its validators, {invalid} invalid turns \
                             in a row (max_invalid_decisions = {}): {}",
                            self.budget.max_invalid_decisions,
                            first_line(&problem)
                        ),
                    ));
                }
                self.settle_turn();
            }
        }
    }

    /// Rejects calls to unknown tools, then asks the gateway about the rest.
    pub(super) fn screen(
        &mut self,
        turn: u32,
        calls: Vec<ToolCall>,
        asked_by_model: Option<String>,
    ) {
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
                    allowed_paths: BTreeMap::new(),
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

    pub(super) fn on_verdicts(
        &mut self,
        turn: u32,
        calls: Vec<ToolCall>,
        asked_by_model: Option<String>,
        verdicts: Vec<(CallId, Verdict)>,
        paths: Vec<(CallId, String)>,
    ) {
        let mut verdicts: BTreeMap<CallId, Verdict> = verdicts.into_iter().collect();
        let mut paths = paths;
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
                Verdict::Ask { why } if self.working.granted.contains(&call.id) => {
                    // A person already approved this call before a restart, for the place
                    // its path led to then.
                    let approved = self.working.judged_paths.get(&call.id);
                    let now = paths.iter().find(|(id, _)| *id == call.id).map(|(_, p)| p);
                    match (approved, now) {
                        (Some(then), Some(now)) if then != now => {
                            let why = format!(
                                "{why} (approved when its path led to {then}; it now leads to \
                                 {now})"
                            );
                            pending.push(pending_call_at(&call, why, &mut paths));
                        }
                        _ => runnable.push(call.id.clone()),
                    }
                    None
                }
                Verdict::Ask { why } => {
                    pending.push(pending_call_at(&call, why, &mut paths));
                    None
                }
                Verdict::Allow => {
                    if let Some(summary) = &asked_by_model {
                        let why = format!("the model asked: {summary}");
                        pending.push(pending_call_at(&call, why, &mut paths));
                    } else if side_effect && writes_left == Some(0) {
                        let max = self.budget.max_write_actions.unwrap_or(0);
                        let why =
                            format!("the write-action budget (max_write_actions = {max}) is spent");
                        pending.push(pending_call_at(&call, why, &mut paths));
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
            let allowed_paths = runnable
                .iter()
                .filter_map(|id| Some((id.clone(), take_path(&mut paths, id)?)))
                .collect();
            self.stage(Event::ApprovalRequested {
                turn,
                summary: asked_by_model,
                pending,
                allowed: runnable,
                allowed_paths,
            });
            return self.commit();
        }
        self.execute(turn, runnable, paths);
    }

    /// Checks the budgets that limit tool calls, then schedules the calls named in `ids`
    /// (in the model's order), each to act on the place in `paths` its path led to when it
    /// was judged.
    pub(super) fn execute(
        &mut self,
        turn: u32,
        ids: Vec<CallId>,
        mut paths: Vec<(CallId, String)>,
    ) {
        // Results still held here are rejections, which no budget below counts; results of
        // calls that ran are flushed before a rerun (see `recover`).
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
            self.answer_not_rerun(turn, &calls, "its retry budget is spent");
            return self.end(Outcome::stop(
                TerminalReason::ToolBudgetExhausted,
                format!(
                    "call {} to {} already ran {runs} times; its retry budget \
                     (max_retries_per_tool = {retries}) is spent",
                    call.id, call.name
                ),
            ));
        }
        let used = self.working.exchange_tool_calls_used();
        let batch = u32::try_from(calls.len()).unwrap_or(u32::MAX);
        if used.saturating_add(batch) > self.budget.max_tool_calls {
            self.answer_not_rerun(turn, &calls, "the tool-call budget is spent");
            return self.end(Outcome::stop(
                TerminalReason::ToolBudgetExhausted,
                format!(
                    "a batch of {batch} calls would pass the tool-call budget ({used} of {} \
                     used)",
                    self.budget.max_tool_calls
                ),
            ));
        }
        let mut groups = schedule(calls, &self.tools, &self.working.run_id, turn);
        for scheduled in groups.iter_mut().flatten() {
            scheduled.path = take_path(&mut paths, &scheduled.call.id);
        }
        self.groups = groups.into();
        self.next_group(turn);
    }

    /// Starts the next group of the batch: side effects first get their dispatch records
    /// committed, then the group runs. With no group left, the turn is settled.
    pub(super) fn next_group(&mut self, turn: u32) {
        if self.stop.is_some() {
            // No new side effect after a cancel or a passed deadline.
            for group in std::mem::take(&mut self.groups) {
                for scheduled in group {
                    self.not_started(turn, scheduled.call);
                }
            }
            return self.settle_turn();
        }
        let Some(group) = self.groups.pop_front() else {
            return self.settle_turn();
        };
        let effects: Vec<&ScheduledCall> =
            group.iter().filter(|c| c.effect_key.is_some()).collect();
        if effects.is_empty() {
            return self.run_group(turn, group);
        }
        for scheduled in effects.into_iter().cloned().collect::<Vec<_>>() {
            self.stage(Event::EffectDispatched {
                turn,
                call_id: scheduled.call.id.clone(),
                effect_key: scheduled.effect_key.unwrap_or_default(),
                tool: scheduled.call.name.clone(),
                arguments_digest: sha256_hex(canonical_json(&scheduled.call.arguments).as_bytes()),
            });
        }
        self.dispatching = Some((turn, group));
        self.commit();
    }

    /// Runs a group whose dispatch records (if any) are durable.
    pub(super) fn run_group(&mut self, turn: u32, group: Vec<ScheduledCall>) {
        if self.stop.is_some() {
            for scheduled in group {
                self.not_started(turn, scheduled.call);
            }
            return self.next_group(turn);
        }
        self.phase = Phase::AwaitingTools {
            turn,
            calls: group.clone(),
        };
        self.commands
            .push_back(Command::ExecuteTools { turn, group });
    }

    /// Calls that ran once already (their effect was dispatched, then settled as not having
    /// taken effect) and will not run again because the run stops: each still gets its one
    /// result, so no call that started is left unanswered.
    fn answer_not_rerun(&mut self, turn: u32, calls: &[ToolCall], why: &str) {
        for call in calls {
            if self.working.dispatched.contains_key(&call.id) {
                // Its first attempt was counted when it was found (or said) not to have
                // taken effect; this one never starts, so it is not a call started.
                self.reject(
                    turn,
                    call.clone(),
                    ErrorKind::ExecutionFailed,
                    format!("it did not take effect and was not run again: {why}"),
                );
            }
        }
    }

    fn not_started(&mut self, turn: u32, call: ToolCall) {
        let reason = self
            .stop
            .as_ref()
            .map_or("interrupted", |s| s.reason.as_str());
        let message = format!("not started: the run stopped ({reason})");
        self.reject(turn, call, ErrorKind::Cancelled, message);
    }

    /// Answers a call that did not run with an error result.
    fn reject(&mut self, turn: u32, call: ToolCall, kind: ErrorKind, message: String) {
        self.stage(Event::CallRejected {
            turn,
            result: ToolResult::error(call.id, call.name, ToolError::new(kind, message)),
        });
    }

    pub(super) fn on_results(
        &mut self,
        turn: u32,
        calls: Vec<ScheduledCall>,
        results: Vec<ToolResult>,
    ) {
        let mut by_id: BTreeMap<CallId, ToolResult> = results
            .into_iter()
            .map(|r| (r.call_id.clone(), r))
            .collect();
        let mut in_doubt = Vec::new();
        for scheduled in calls {
            let call = scheduled.call;
            let Some(mut result) = by_id.remove(&call.id) else {
                // No result: the call never started (the run was interrupted), or the
                // gateway lost it.
                if self.stop.is_some() {
                    self.not_started(turn, call);
                } else {
                    let message = "the tool gateway returned no result for this call".to_owned();
                    self.reject(turn, call, ErrorKind::ExecutionFailed, message);
                }
                continue;
            };
            result.name.clone_from(&call.name);
            if let (Some(_), ToolOutcome::Error(e)) = (&scheduled.effect_key, &result.outcome)
                && e.kind == ErrorKind::OutcomeUnknown
            {
                // A side effect may or may not have happened: never guess, never repeat
                // it. The call stays dispatched without a result until a person settles it.
                in_doubt.push(pending_call(
                    &call,
                    format!("outcome unknown: {}", e.message),
                ));
                continue;
            }
            self.stage(Event::ToolFinished {
                turn,
                result,
                effect_key: scheduled.effect_key,
            });
        }
        if !in_doubt.is_empty() {
            self.groups.clear();
            return self.request_resolution(turn, in_doubt);
        }
        self.next_group(turn);
    }

    /// The run is let go with `calls` in flight: the results that came are committed, the
    /// rest stay as a crash would leave them (a result whose outcome is unknown too: a
    /// person is asked by whoever takes the run up, if its tool cannot look it up). The
    /// groups not started are left to run then.
    pub(super) fn on_let_go(
        &mut self,
        turn: u32,
        calls: &[ScheduledCall],
        results: Vec<ToolResult>,
    ) {
        self.groups.clear();
        for mut result in results {
            let Some(scheduled) = calls.iter().find(|s| s.call.id == result.call_id) else {
                continue;
            };
            if let (Some(_), ToolOutcome::Error(e)) = (&scheduled.effect_key, &result.outcome)
                && e.kind == ErrorKind::OutcomeUnknown
            {
                continue;
            }
            result.name.clone_from(&scheduled.call.name);
            self.stage(Event::ToolFinished {
                turn,
                result,
                effect_key: scheduled.effect_key.clone(),
            });
        }
        if self.staged.is_empty() && self.held.is_empty() {
            let next_call = std::mem::take(&mut self.next_call);
            return self.after_commit(next_call);
        }
        self.commit();
    }

    /// The turn's events are all staged: apply the limits that look at whole turns, then
    /// commit.
    pub(super) fn settle_turn(&mut self) {
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
                    "every call was denied {denials} turns in a row (max_denials = {})",
                    self.budget.max_denials
                ),
            ));
        }
        self.commit();
    }

    pub(super) fn after_settlement(&mut self) {
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
                let paths = self
                    .working
                    .judged_paths
                    .iter()
                    .map(|(id, path)| (id.clone(), path.clone()))
                    .collect();
                self.execute(turn, ids, paths);
            }
        }
    }
}

/// The first line of a text, cut to a length that fits an outcome's message.
fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    match line.char_indices().nth(200) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_owned(),
    }
}

/// A call waiting for a person, with the place its path led to when it was judged (taken
/// from `paths`).
fn pending_call_at(
    call: &ToolCall,
    why: String,
    paths: &mut Vec<(CallId, String)>,
) -> crate::reason::PendingCall {
    let mut pending = pending_call(call, why);
    pending.path = take_path(paths, &call.id);
    pending
}

/// The place judged for call `id`, taken out of `paths` (a batch's few, looked through).
fn take_path(paths: &mut Vec<(CallId, String)>, id: &CallId) -> Option<String> {
    let at = paths.iter().position(|(of, _)| of == id)?;
    Some(paths.swap_remove(at).1)
}

/// The most of a rejected reply the log keeps, in characters. The model is shown the first
/// 4,000 of them; a person reading the log sees enough to tell what went wrong. A server
/// sending replies of megabytes that are not decisions, up to the repair limit, no longer
/// writes them whole into every run's log.
pub const MAX_REJECTED_REPLY_CHARS: usize = 65_536;

/// `raw` as the log keeps it: whole up to [`MAX_REJECTED_REPLY_CHARS`], else that many
/// characters and a line saying how many more there were.
fn kept_of_rejected(raw: String) -> String {
    match raw.char_indices().nth(MAX_REJECTED_REPLY_CHARS) {
        None => raw,
        Some((cut, _)) => format!(
            "{}\n[... {} more characters of this reply not kept ...]",
            &raw[..cut],
            raw[cut..].chars().count()
        ),
    }
}
