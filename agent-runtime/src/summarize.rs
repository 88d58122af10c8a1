//! A summarizer that asks the run's own model, falling back to the extractive summary.

use std::sync::Arc;

use agent_context::{Extractive, SUMMARY_INSTRUCTION, Summarizer, context_window, extract};
use agent_core::{Decision, Entry, Message, Prompt};
use agent_providers::{Model, ModelRequest};
use async_trait::async_trait;

/// Attempts at a summary request that fits the window, dropping the oldest half each time.
const ATTEMPTS: usize = 3;

/// Asks the model for the summary with a fixed instruction.
pub struct ModelSummarizer {
    model: Arc<dyn Model>,
    fallback: Extractive,
}

impl ModelSummarizer {
    /// A summarizer using `model`.
    pub fn new(model: Arc<dyn Model>) -> Self {
        ModelSummarizer {
            model,
            fallback: Extractive::default(),
        }
    }
}

#[async_trait]
impl Summarizer for ModelSummarizer {
    async fn summarize(&self, history: &[Entry], prompt: &Prompt) -> Result<String, String> {
        let window = context_window(self.model.model());
        let mut messages: Vec<Message> = prompt.messages.clone();
        for _ in 0..ATTEMPTS {
            let mut request = Prompt {
                system: SUMMARY_INSTRUCTION.to_owned(),
                messages: messages.clone(),
                tools: Vec::new(),
            };
            request
                .messages
                .push(Message::user_text(SUMMARY_INSTRUCTION));
            // A rough size check: four characters a token.
            let chars = serde_json::to_string(&request)
                .map(|s| s.len())
                .unwrap_or(0);
            if chars / 4 < window * 9 / 10 {
                let reply = self
                    .model
                    .decide(ModelRequest {
                        prompt: &request,
                        step: u32::MAX,
                    })
                    .await;
                if let Ok(reply) = reply
                    && let Ok(Decision::Final { answer }) = reply.decision
                {
                    return Ok(answer);
                }
                break;
            }
            // Too large: drop the oldest half of the material and try again.
            let drop = messages.len() / 2;
            messages.drain(..drop.max(1));
        }
        Ok(extract(history, self.fallback.max_chars))
    }
}
