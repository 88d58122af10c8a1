//! Continuing a turn a crash interrupted, and settling side effects of unknown outcome.
//!
//! After a restart the committed log may end inside a turn: some calls have results, some
//! were dispatched (a `write`/`external` call recorded as started) without one, some never
//! started. Calls that never started are re-validated and run. A dispatched call without a
//! result is in doubt: its tool may look the effect up (`ReconcileEffects`); what it cannot
//! settle waits for a person (`outcome_unknown`), and is never run again on the machine's
//! own initiative.

use super::{Command, InputError, Machine, Phase};
use crate::decision::CallId;
use crate::event::{Event, Finding, Resolution};
use crate::reason::PendingCall;
use crate::schedule::ScheduledCall;
use crate::state::Status;
use crate::tool::{ErrorKind, ToolError, ToolResult};

impl Machine {
    /// Continues the open turn of the committed state.
    pub(super) fn recover(&mut self) {
        let turn = self.working.turn;
        let in_doubt: Vec<ScheduledCall> = self
            .working
            .in_doubt()
            .into_iter()
            .map(|call| self.scheduled(call.clone()))
            .collect();
        if in_doubt.is_empty() {
            return self.rerun(turn);
        }
        self.phase = Phase::AwaitingReconcile {
            turn,
            calls: in_doubt.clone(),
        };
        self.commands.push_back(Command::ReconcileEffects {
            turn,
            calls: in_doubt,
        });
    }

    fn scheduled(&self, call: crate::decision::ToolCall) -> ScheduledCall {
        let risk = self
            .tools
            .get(&call.name)
            .map_or(crate::tool::Risk::External, |s| s.risk);
        let effect_key = self.working.dispatched.get(&call.id).cloned();
        ScheduledCall {
            call,
            risk,
            effect_key,
            path: None,
        }
    }

    /// Re-validates and runs the calls of the turn that have no answer and are not in doubt.
    fn rerun(&mut self, turn: u32) {
        // Results found by reconciliation count as answers from here on.
        self.flush_results();
        let calls: Vec<crate::decision::ToolCall> = self
            .working
            .turn_calls
            .iter()
            .filter(|c| !self.working.answered.contains(&c.id))
            .cloned()
            .collect();
        if calls.is_empty() {
            return self.settle_turn();
        }
        let (known, unknown): (Vec<_>, Vec<_>) = calls
            .into_iter()
            .partition(|c| self.tools.contains_key(&c.name));
        for call in unknown {
            // The tool is gone since the crash (an MCP server not configured any more).
            self.stage(Event::CallRejected {
                turn,
                result: ToolResult::error(
                    call.id,
                    call.name.clone(),
                    ToolError::new(
                        ErrorKind::UnknownTool,
                        format!("no tool is named {:?} any more", call.name),
                    ),
                ),
            });
        }
        if known.is_empty() {
            return self.settle_turn();
        }
        self.phase = Phase::AwaitingChecks {
            turn,
            calls: known.clone(),
            asked_by_model: None,
        };
        self.commands
            .push_back(Command::CheckCalls { turn, calls: known });
    }

    pub(super) fn on_reconciled(
        &mut self,
        turn: u32,
        calls: Vec<ScheduledCall>,
        findings: Vec<(CallId, Option<Finding>)>,
    ) {
        let mut in_doubt = Vec::new();
        for scheduled in calls {
            let finding = findings
                .iter()
                .find(|(id, _)| *id == scheduled.call.id)
                .and_then(|(_, f)| f.clone());
            match finding {
                Some(Finding::Applied { receipt }) => {
                    self.stage(Event::EffectReconciled {
                        call_id: scheduled.call.id.clone(),
                        finding: Finding::Applied {
                            receipt: receipt.clone(),
                        },
                    });
                    self.stage(Event::ToolFinished {
                        turn,
                        result: ToolResult::ok(
                            scheduled.call.id,
                            scheduled.call.name,
                            format!("(found after a restart) {receipt}"),
                        ),
                        effect_key: scheduled.effect_key,
                    });
                }
                Some(Finding::NotApplied) => self.stage(Event::EffectReconciled {
                    call_id: scheduled.call.id,
                    finding: Finding::NotApplied,
                }),
                None => in_doubt.push(super::pending_call(
                    &scheduled.call,
                    "outcome unknown: the run stopped while this call ran, and its tool \
                     cannot look the effect up"
                        .to_owned(),
                )),
            }
        }
        if in_doubt.is_empty() {
            return self.rerun(turn);
        }
        self.request_resolution(turn, in_doubt);
    }

    /// Pauses the run until a person settles the calls in doubt.
    pub(super) fn request_resolution(&mut self, turn: u32, pending: Vec<PendingCall>) {
        self.stage(Event::ResolutionRequested { turn, pending });
        self.commit();
    }

    pub(super) fn on_resolved(
        &mut self,
        call_id: CallId,
        resolution: Resolution,
    ) -> Result<(), InputError> {
        let Status::AwaitingResolution { turn, pending } = &self.committed.status else {
            return Err(InputError::NotPending(call_id));
        };
        let turn = *turn;
        let Some(call) = pending.iter().find(|p| p.call_id == call_id).cloned() else {
            return Err(InputError::NotPending(call_id));
        };
        self.stage(Event::EffectResolved {
            call_id: call_id.clone(),
            resolution,
        });
        let effect_key = self.working.dispatched.get(&call_id).cloned();
        let result = match resolution {
            Resolution::Committed => Some(ToolResult::ok(
                call_id,
                call.tool,
                "a person confirmed that this call took effect",
            )),
            Resolution::Rejected => Some(ToolResult::error(
                call_id,
                call.tool,
                ToolError::new(
                    ErrorKind::ExecutionFailed,
                    "a person confirmed that this call did not take effect",
                ),
            )),
            // Cleared: it runs again once nothing else is in doubt.
            Resolution::Retry => None,
        };
        if let Some(result) = result {
            self.stage(Event::ToolFinished {
                turn,
                result,
                effect_key,
            });
        }
        self.commit();
        Ok(())
    }
}
