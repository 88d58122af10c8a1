//! A summarizer that asks the run's own model. When it cannot (the model fails, answers
//! with something else, or the history is too large even halved), it says why and the
//! runtime falls back to the extractive summary.

use std::sync::Arc;

use agent_context::{
    CharEstimate, SUMMARY_INSTRUCTION, Summarized, Summarizer, SummaryError, TokenCounter,
    context_window,
};
use agent_core::{Decision, Entry, Message, Prompt};
use agent_providers::{Model, ModelRequest};
use async_trait::async_trait;

/// Attempts at a summary request that fits the window, dropping the oldest half each time.
const ATTEMPTS: usize = 3;

/// Asks the model for the summary with a fixed instruction.
pub struct ModelSummarizer {
    model: Arc<dyn Model>,
}

impl ModelSummarizer {
    /// A summarizer using `model`.
    pub fn new(model: Arc<dyn Model>) -> Self {
        ModelSummarizer { model }
    }
}

#[async_trait]
impl Summarizer for ModelSummarizer {
    /// It reads the prompt, not the log.
    fn reads_history(&self) -> bool {
        false
    }

    async fn summarize(&self, _history: &[Entry], prompt: &Prompt) -> Summarized {
        let window = context_window(self.model.model());
        let mut messages: Vec<Message> = prompt.messages.clone();
        for _ in 0..ATTEMPTS {
            let mut request = Prompt {
                system: SUMMARY_INSTRUCTION.to_owned(),
                messages: messages.clone(),
                tools: Vec::new(),
                answer_schema: None,
            };
            request
                .messages
                .push(Message::user_text(SUMMARY_INSTRUCTION));
            // A rough size check is enough: the summary request only has to fit.
            let text = serde_json::to_string(&request).unwrap_or_default();
            if CharEstimate.count(&text) < window * 9 / 10 {
                let asked = self
                    .model
                    .decide(ModelRequest::new(&request, u32::MAX))
                    .await;
                let reply = match asked {
                    Ok(reply) => reply,
                    Err(e) => return Err(SummaryError::Failed(Box::new(e))).into(),
                };
                // Paid for, whatever it says.
                let summary = match reply.decision {
                    Ok(Decision::Final { answer }) if !answer.trim().is_empty() => Ok(answer),
                    Ok(other) => Err(SummaryError::NotASummary(format!("{other:?}"))),
                    Err(invalid) => Err(SummaryError::NotASummary(invalid.problem)),
                };
                return Summarized {
                    summary,
                    usage: reply.usage,
                };
            }
            // Too large: drop the oldest half of the material and try again.
            let drop = messages.len() / 2;
            messages.drain(..drop.max(1));
        }
        Err(SummaryError::TooLarge).into()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use agent_core::{ModelReply, Usage};
    use agent_providers::ProviderError;

    use super::*;

    /// Answers with a fixed summary, or fails; records the size of each request.
    struct Fake {
        name: &'static str,
        answer: Option<&'static str>,
        seen: Mutex<Vec<usize>>,
    }

    #[async_trait]
    impl Model for Fake {
        fn provider(&self) -> &str {
            "fake"
        }
        fn model(&self) -> &str {
            self.name
        }
        async fn decide(&self, request: ModelRequest<'_>) -> Result<ModelReply, ProviderError> {
            self.seen
                .lock()
                .unwrap()
                .push(request.prompt.messages.len());
            match self.answer {
                Some(a) => Ok(ModelReply::decision(
                    Decision::Final { answer: a.into() },
                    Usage::tokens(120, 30),
                )),
                None => Err(ProviderError::Transport("down".into())),
            }
        }
    }

    fn prompt(messages: usize, each: usize) -> Prompt {
        Prompt {
            system: String::new(),
            messages: (0..messages)
                .map(|i| Message::user_text(format!("{i} {}", "x".repeat(each))))
                .collect(),
            tools: Vec::new(),
            answer_schema: None,
        }
    }

    fn fake(name: &'static str, answer: Option<&'static str>) -> Arc<Fake> {
        Arc::new(Fake {
            name,
            answer,
            seen: Mutex::new(Vec::new()),
        })
    }

    #[tokio::test]
    async fn the_model_writes_the_summary_with_the_fixed_instruction() {
        let model = fake("gpt-4o", Some("we read three files"));
        let s = ModelSummarizer::new(model.clone());
        let summarized = s.summarize(&[], &prompt(4, 10)).await;
        assert_eq!(summarized.summary.unwrap(), "we read three files");
        assert_eq!(
            summarized.usage,
            Usage::tokens(120, 30),
            "what the call used"
        );
        assert_eq!(
            *model.seen.lock().unwrap(),
            [5],
            "the history and the instruction"
        );
    }

    #[tokio::test]
    async fn a_failing_model_says_why() {
        let s = ModelSummarizer::new(fake("gpt-4o", None));
        let summarized = s.summarize(&[], &prompt(2, 10)).await;
        let err = summarized.summary.unwrap_err();
        assert!(matches!(err, SummaryError::Failed(_)), "{err}");
        assert!(err.to_string().contains("down"), "{err}");
        assert!(summarized.usage.is_zero());
        let s = ModelSummarizer::new(fake("gpt-4o", Some("  ")));
        let summarized = s.summarize(&[], &prompt(2, 10)).await;
        let err = summarized.summary.unwrap_err();
        assert!(matches!(err, SummaryError::NotASummary(_)), "{err}");
        // An empty answer is no summary, but it was paid for.
        assert_eq!(summarized.usage, Usage::tokens(120, 30));
    }

    #[tokio::test]
    async fn a_request_too_large_drops_the_oldest_material_a_bounded_number_of_times() {
        // gpt-4: an 8,192-token window; 40 messages of 2,000 characters do not fit.
        let model = fake("gpt-4", Some("short"));
        let s = ModelSummarizer::new(model.clone());
        let summarized = s.summarize(&[], &prompt(40, 2_000)).await;
        assert_eq!(summarized.summary.unwrap(), "short");
        let seen = model.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        assert!(seen[0] <= 11, "the oldest halves were dropped: {seen:?}");
        // Far too large: after the bounded attempts, it gives up.
        let model = fake("gpt-4", Some("never"));
        let s = ModelSummarizer::new(model.clone());
        let summarized = s.summarize(&[], &prompt(400, 4_000)).await;
        let err = summarized.summary.unwrap_err();
        assert!(matches!(err, SummaryError::TooLarge), "{err}");
        assert!(summarized.usage.is_zero(), "nothing asked, nothing used");
        assert!(
            model.seen.lock().unwrap().is_empty(),
            "never asked with a request that does not fit"
        );
    }
}
