//! Staging and committing events, what follows a commit, and the start of turns.

use super::{Command, InputError, Machine, Phase};
use crate::budget::Usage;
use crate::decision::CallId;
use crate::event::{Entry, Event};
use crate::reason::{Outcome, TerminalReason};
use crate::state::Status;

impl Machine {
    /// What follows a commit, derived from the committed state alone, which is also what
    /// makes resume after a crash continue exactly where the log stands.
    /// `next_call` is the least the next model call will use, when known.
    pub(super) fn after_commit(&mut self, next_call: Usage) {
        match self.committed.status.clone() {
            Status::Ended(outcome) => {
                self.phase = Phase::Ended(outcome.clone());
                self.commands.push_back(Command::Finish(outcome));
            }
            Status::AwaitingApproval(approval) => {
                if let Some(outcome) = self.paused_stop() {
                    return self.end(outcome);
                }
                self.phase = Phase::AwaitingApproval;
                self.commands.push_back(Command::AwaitApproval {
                    pending: approval.pending,
                    summary: approval.summary,
                });
            }
            Status::AwaitingResolution { pending, .. } => {
                if let Some(outcome) = self.paused_stop() {
                    return self.end(outcome);
                }
                self.phase = Phase::AwaitingResolution;
                self.commands
                    .push_back(Command::AwaitResolution { pending });
            }
            Status::Running if self.committed.open_turn() => self.recover(),
            Status::Running | Status::New => self.begin_turn(next_call),
        }
    }

    /// What still stops a run that has just paused for a person: a cancellation. Any other
    /// stop that came while the pause was being committed (the wall-clock budget running
    /// out) is dropped, as it would be a moment later (see `interrupt`): the pause names
    /// what waits for the person (an effect in doubt above all), and ending the run over it
    /// would hide that.
    fn paused_stop(&mut self) -> Option<Outcome> {
        self.stop
            .take()
            .filter(|outcome| outcome.reason == TerminalReason::Cancelled)
    }

    /// Checks the budgets that limit model calls, then asks for the next decision. A token
    /// or cost budget stops the run when it is spent, and before a call that is certain to
    /// pass it: one whose prompt alone (`next_call`, the least it will use) does.
    pub(super) fn begin_turn(&mut self, next_call: Usage) {
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
        if state.exchange_steps_used() >= self.budget.max_steps {
            return self.end(Outcome::stop(
                TerminalReason::MaxSteps,
                format!(
                    "the model was called {} times, the step budget",
                    state.exchange_steps_used()
                ),
            ));
        }
        if let Some(max) = self.budget.max_tokens {
            let used = state.budget_usage().total_tokens();
            let least = next_call.input_tokens;
            if used >= max {
                return self.end(Outcome::stop(
                    TerminalReason::CostBudgetExceeded,
                    format!("{used} tokens used, the token budget is {max}"),
                ));
            }
            if used.saturating_add(least) > max {
                return self.end(Outcome::stop(
                    TerminalReason::CostBudgetExceeded,
                    format!(
                        "{used} tokens used, and the next call's prompt alone has at least \
                         {least}: it would pass the token budget of {max}, so it was not made"
                    ),
                ));
            }
        }
        if let Some(max) = self.budget.max_cost_usd {
            let used = state.budget_usage().cost_usd;
            let least = next_call.cost_usd;
            if used >= max {
                return self.end(Outcome::stop(
                    TerminalReason::CostBudgetExceeded,
                    format!("${used:.4} spent, the cost budget is ${max:.4}"),
                ));
            }
            // Only a finite, positive cost from outside counts (as in `Usage::add`).
            if least.is_finite() && least > 0.0 && used + least > max {
                return self.end(Outcome::stop(
                    TerminalReason::CostBudgetExceeded,
                    format!(
                        "${used:.4} spent, and the next call's prompt alone costs at least \
                         ${least:.4}: it would pass the cost budget of ${max:.4}, so it was not \
                         made"
                    ),
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
    pub(super) fn stage(&mut self, event: Event) {
        if matches!(
            event,
            Event::CallRejected { .. }
                | Event::ToolFinished { .. }
                | Event::SubAgentFinished { .. }
        ) {
            self.held.push(event);
            return;
        }
        self.flush_results();
        self.stage_now(event);
    }

    pub(super) fn flush_results(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let mut held = std::mem::take(&mut self.held);
        let calls = &self.working.turn_calls;
        let position = |event: &Event| {
            let id = match event {
                Event::CallRejected { result, .. } | Event::ToolFinished { result, .. } => {
                    &result.call_id
                }
                Event::SubAgentFinished { call_id, .. } => call_id,
                _ => return usize::MAX,
            };
            calls.iter().position(|c| c.id == *id).unwrap_or(usize::MAX)
        };
        held.sort_by_key(position);
        for event in held {
            self.stage_now(event);
        }
    }

    pub(super) fn stage_now(&mut self, event: Event) {
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

    pub(super) fn commit(&mut self) {
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

    pub(super) fn end(&mut self, outcome: Outcome) {
        self.stage(Event::RunEnded { outcome });
        self.commit();
    }

    pub(super) fn commit_failed(&mut self, message: String) {
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
    pub(super) fn interrupt(&mut self, outcome: Outcome) {
        match self.phase {
            Phase::AwaitingModel { .. }
            | Phase::AwaitingChecks { .. }
            | Phase::AwaitingAnswerCheck { .. }
            | Phase::AwaitingReconcile { .. } => self.end(outcome),
            Phase::AwaitingApproval | Phase::AwaitingResolution => {
                if outcome.reason == TerminalReason::Cancelled {
                    self.end(outcome);
                }
            }
            Phase::AwaitingTools { .. } | Phase::AwaitingCommit => self.stop = Some(outcome),
            Phase::Ended(_) => {}
        }
    }

    // ----- helpers -----------------------------------------------------------------------

    pub(super) fn deadline_passed(&self) -> bool {
        self.budget
            .max_wall_time_ms
            .is_some_and(|max| self.worked() >= max)
    }

    /// Wall-clock time worked on the run so far (every exchange, not the waits between).
    pub(super) fn worked(&self) -> u64 {
        if self.working.version == 0 {
            0
        } else {
            self.working.worked_by(self.now_ms)
        }
    }

    pub(super) fn deadline_message(&self) -> String {
        let max = self.budget.max_wall_time_ms.unwrap_or(0);
        format!(
            "the wall-clock budget of {:.1} s is spent",
            max as f64 / 1000.0
        )
    }

    pub(super) fn approval_outcome(&self) -> Outcome {
        let (pending, summary) = match &self.committed.status {
            Status::AwaitingApproval(a) => (a.pending.clone(), a.summary.clone()),
            _ => (Vec::new(), None),
        };
        let message = match (&summary, pending.len()) {
            (Some(summary), 0) => format!("the model asks a person's approval: {summary}"),
            (_, n) => format!("{n} call(s) need a person's approval"),
        };
        Outcome {
            pending,
            ..Outcome::stop(TerminalReason::ApprovalRequired, message)
        }
    }

    /// The pending calls an approval or denial settles: all of them when none is named.
    pub(super) fn resolution_outcome(&self) -> Outcome {
        let pending = match &self.committed.status {
            Status::AwaitingResolution { pending, .. } => pending.clone(),
            _ => Vec::new(),
        };
        let calls: Vec<String> = pending
            .iter()
            .map(|p| format!("{} ({})", p.call_id, p.tool))
            .collect();
        let message = format!(
            "whether call {} took effect is unknown; a person must check and settle it",
            calls.join(", ")
        );
        Outcome {
            pending,
            ..Outcome::stop(TerminalReason::OutcomeUnknown, message)
        }
    }

    pub(super) fn settle_ids(&self, call_ids: Vec<CallId>) -> Result<Vec<CallId>, InputError> {
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
}
