//! The projection itself.

use agent_core::{
    CallId, Decision, Entry, Event, Message, Part, Prompt, Role, ToolCall, ToolResult, ToolSpec,
};

/// Builds the prompt for the next model call from the committed log.
pub fn project(system: &str, entries: &[Entry], tools: Vec<ToolSpec>) -> Prompt {
    let mut builder = Builder::default();
    for entry in entries {
        builder.apply(&entry.event);
    }
    builder.close_turn();
    Prompt {
        system: system.to_owned(),
        messages: builder.messages,
        tools,
    }
}

#[derive(Default)]
struct Builder {
    messages: Vec<Message>,
    /// Calls of the latest assistant message still waiting for a result part.
    open_calls: Vec<ToolCall>,
    /// Result parts of the current turn, by call id.
    results: Vec<(CallId, Part)>,
    /// Text parts for the user message after the results.
    notes: Vec<String>,
}

impl Builder {
    fn apply(&mut self, event: &Event) {
        match event {
            Event::RunStarted { goal, .. } => self.messages.push(Message::user_text(goal.clone())),
            Event::DecisionProposed { decision, .. } => {
                self.close_turn();
                self.assistant(decision);
            }
            Event::DecisionRejected { raw, problem, .. } => {
                self.close_turn();
                let raw = if raw.trim().is_empty() {
                    "(empty reply)"
                } else {
                    raw
                };
                self.messages.push(Message::assistant_text(raw));
                self.notes.push(format!(
                    "Your reply was not a valid decision: {problem}. Reply with tool calls or a \
                     final answer."
                ));
            }
            Event::CallRejected { result, .. } | Event::ToolFinished { result, .. } => {
                self.results
                    .push((result.call_id.clone(), result_part(result)));
            }
            Event::CorrectionIssued {
                message, call_ids, ..
            } => {
                for id in call_ids {
                    let name = self.call_name(id);
                    self.results.push((
                        id.clone(),
                        Part::ToolResult {
                            call_id: id.clone(),
                            name,
                            ok: false,
                            content: "not run: this plan was repeated".to_owned(),
                        },
                    ));
                }
                self.notes.push(message.clone());
            }
            Event::ApprovalGranted { call_ids } if call_ids.is_empty() => {
                self.notes
                    .push("A person approved your request. Go ahead.".to_owned());
            }
            Event::ApprovalDenied { call_ids, reason } if call_ids.is_empty() => {
                self.notes.push(format!(
                    "A person did not approve your request ({reason}). Find another way or \
                     give your final answer."
                ));
            }
            // Effects are bookkeeping; what the model learns of a call is its result.
            Event::EffectDispatched { .. }
            | Event::EffectReconciled { .. }
            | Event::ResolutionRequested { .. }
            | Event::EffectResolved { .. }
            | Event::ApprovalRequested { .. }
            | Event::ApprovalGranted { .. }
            | Event::ApprovalDenied { .. }
            | Event::ModelFailed { .. }
            | Event::RunEnded { .. } => {}
        }
    }

    fn assistant(&mut self, decision: &Decision) {
        let mut parts = Vec::new();
        let text = match decision {
            Decision::Final { answer } => Some(answer.clone()),
            Decision::ToolCalls { .. } => None,
            Decision::RequestApproval { summary, .. } => {
                Some(format!("I ask a person's approval: {summary}"))
            }
            Decision::Clarification { question } => Some(question.clone()),
            Decision::CannotContinue { reason } => Some(format!("I cannot continue: {reason}")),
        };
        if let Some(text) = text {
            parts.push(Part::Text { text });
        }
        for call in decision.calls() {
            parts.push(Part::ToolUse {
                call_id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            });
        }
        self.open_calls = decision.calls().to_vec();
        self.messages.push(Message {
            role: Role::Assistant,
            parts,
        });
    }

    /// Ends the current turn: one user message with a result part for every call of the
    /// latest assistant message, in the model's order, then the notes.
    fn close_turn(&mut self) {
        let mut parts = Vec::new();
        for call in std::mem::take(&mut self.open_calls) {
            let part = match self.results.iter().position(|(id, _)| *id == call.id) {
                Some(i) => self.results.remove(i).1,
                None => Part::ToolResult {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    ok: false,
                    content: "not run: no result was recorded for this call".to_owned(),
                },
            };
            parts.push(part);
        }
        self.results.clear();
        parts.extend(
            std::mem::take(&mut self.notes)
                .into_iter()
                .map(|text| Part::Text { text }),
        );
        if !parts.is_empty() {
            self.messages.push(Message {
                role: Role::User,
                parts,
            });
        }
    }

    fn call_name(&self, id: &CallId) -> String {
        self.open_calls
            .iter()
            .find(|c| &c.id == id)
            .map(|c| c.name.clone())
            .unwrap_or_default()
    }
}

fn result_part(result: &ToolResult) -> Part {
    Part::ToolResult {
        call_id: result.call_id.clone(),
        name: result.name.clone(),
        ok: result.is_ok(),
        content: result.content(),
    }
}
