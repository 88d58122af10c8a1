//! `--model replay:RUN`: answers each model call with the decision a recorded run got.

use agent_core::{Entry, Event, ModelReply};
use async_trait::async_trait;

use crate::{Model, ModelRequest, ProviderError};

/// What the recorded run's Nth model call answered.
#[derive(Clone, Debug)]
enum Recorded {
    Reply(ModelReply),
    Failed(agent_core::ModelErrorKind, String),
}

/// Replays the decisions of a recorded run, in order; the tools run for real.
#[derive(Clone, Debug)]
pub struct ReplayModel {
    run_id: String,
    answers: Vec<Recorded>,
}

impl ReplayModel {
    /// The model calls of the run whose log is `entries`.
    pub fn from_log(run_id: &str, entries: &[Entry]) -> ReplayModel {
        let answers = entries
            .iter()
            .filter_map(|e| match &e.event {
                Event::DecisionProposed {
                    decision,
                    usage,
                    reasoning,
                    ..
                } => Some(Recorded::Reply(
                    ModelReply::decision(decision.clone(), *usage)
                        .with_reasoning(reasoning.clone()),
                )),
                Event::DecisionRejected {
                    raw,
                    problem,
                    usage,
                    ..
                } => Some(Recorded::Reply(ModelReply::invalid(
                    raw.clone(),
                    problem.clone(),
                    *usage,
                ))),
                Event::ModelFailed { message, kind, .. } => {
                    Some(Recorded::Failed(*kind, message.clone()))
                }
                _ => None,
            })
            .collect();
        ReplayModel {
            run_id: run_id.to_owned(),
            answers,
        }
    }

    /// Model calls recorded.
    pub fn len(&self) -> usize {
        self.answers.len()
    }

    /// Whether the recorded run made no model call.
    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }
}

#[async_trait]
impl Model for ReplayModel {
    fn provider(&self) -> &str {
        "replay"
    }

    fn model(&self) -> &str {
        &self.run_id
    }

    /// Each call costs what the recorded one did.
    fn knows_cost(&self) -> bool {
        true
    }

    /// Each call used what the recorded one did, whatever the prompt's text.
    fn counts_text(&self) -> bool {
        false
    }

    async fn decide(&self, request: ModelRequest<'_>) -> Result<ModelReply, ProviderError> {
        let index = usize::try_from(request.step).unwrap_or(usize::MAX);
        match self.answers.get(index) {
            Some(Recorded::Reply(reply)) => Ok(reply.clone()),
            Some(Recorded::Failed(kind, message)) => {
                Err(ProviderError::of_kind(*kind, message.clone()))
            }
            None => Err(ProviderError::Exhausted(format!(
                "run {} made {} model call(s); this run asks for one more",
                self.run_id,
                self.answers.len()
            ))),
        }
    }
}
