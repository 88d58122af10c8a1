//! What a run shows on a terminal while it works: a spinner with the step, the model and
//! the time while the model thinks, then one line per model call with what it decided and
//! the tokens (and cost) so far; the tool calls have theirs (`chat::tool_lines`). Nothing
//! of it when standard error is not a terminal.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_core::{Decision, ModelReply, Usage};
use agent_providers::{Model, ModelRequest, ProviderError};
use async_trait::async_trait;
use indicatif::{ProgressBar, ProgressStyle};

use crate::app::tell;
use crate::render;

/// The spinner on screen, if any: text streamed from the model is written around it.
static SHOWN: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Clears the spinner, if one is shown, for the model's own text: once the answer is
/// being written, it is what shows that the model works.
pub(crate) fn stop_spinner() {
    if let Some(bar) = SHOWN.lock().ok().and_then(|mut s| s.take()) {
        bar.finish_and_clear();
    }
}

/// A model shown as it works.
pub(crate) struct Shown {
    inner: Arc<dyn Model>,
    so_far: Mutex<Usage>,
}

impl Shown {
    pub(crate) fn new(inner: Arc<dyn Model>) -> Shown {
        Shown {
            inner,
            so_far: Mutex::new(Usage::default()),
        }
    }
}

#[async_trait]
impl Model for Shown {
    fn provider(&self) -> &str {
        self.inner.provider()
    }

    fn model(&self) -> &str {
        self.inner.model()
    }

    fn knows_cost(&self) -> bool {
        self.inner.knows_cost()
    }

    fn least_cost(&self, input_tokens: u64) -> f64 {
        self.inner.least_cost(input_tokens)
    }

    fn output_tokens_for(&self, usd: f64) -> Option<u64> {
        self.inner.output_tokens_for(usd)
    }

    fn counts_whole_prompts(&self) -> bool {
        self.inner.counts_whole_prompts()
    }

    fn counts_text(&self) -> bool {
        self.inner.counts_text()
    }

    async fn decide(&self, request: ModelRequest<'_>) -> Result<ModelReply, ProviderError> {
        let step = request.step + 1;
        let so_far = self.so_far.lock().map(|u| *u).unwrap_or_default();
        let bar = ProgressBar::new_spinner().with_message(format!(
            "step {step}: {} is thinking{}",
            render::escape(self.inner.model()),
            totals(&so_far)
        ));
        if let Ok(style) = ProgressStyle::with_template("  {spinner} {msg} {elapsed}") {
            bar.set_style(style);
        }
        // Drawn now, before the model is asked, then kept turning.
        bar.tick();
        bar.enable_steady_tick(Duration::from_millis(100));
        if let Ok(mut shown) = SHOWN.lock() {
            *shown = Some(bar.clone());
        }
        let reply = self.inner.decide(request).await;
        if let Ok(mut shown) = SHOWN.lock() {
            *shown = None;
        }
        bar.finish_and_clear();
        let line = match &reply {
            Ok(reply) => {
                let so_far = match self.so_far.lock() {
                    Ok(mut total) => {
                        total.add(&reply.usage);
                        *total
                    }
                    Err(_) => so_far,
                };
                format!(
                    "  step {step}: {} ({}){}",
                    decided(reply),
                    render::usage_text(&reply.usage),
                    totals(&so_far)
                )
            }
            Err(e) => format!("  step {step}: the model call failed ({})", e.kind()),
        };
        tell(format_args!("{line}\n"));
        reply
    }
}

/// What a reply decided, in a few words.
fn decided(reply: &ModelReply) -> String {
    match &reply.decision {
        Ok(Decision::ToolCalls { calls }) => match calls.len() {
            1 => "1 tool call".to_owned(),
            n => format!("{n} tool calls"),
        },
        Ok(Decision::Final { .. }) => "a final answer".to_owned(),
        Ok(Decision::RequestApproval { .. }) => "asks for approval".to_owned(),
        Ok(Decision::Clarification { .. }) => "asks a question".to_owned(),
        Ok(Decision::CannotContinue { .. }) => "cannot continue".to_owned(),
        Err(_) => "not a valid decision".to_owned(),
    }
}

/// `; so far 1200 in, 80 out, $0.0012`, or nothing before the first call.
fn totals(so_far: &Usage) -> String {
    if so_far.total_tokens() == 0 {
        String::new()
    } else {
        format!("; so far {}", render::usage_text(so_far))
    }
}

#[cfg(test)]
mod tests {
    use agent_providers::{Dialect, HttpModel, Price};

    use super::*;

    /// The spinner wraps the model on a terminal: a run's cost budget is judged by the
    /// model inside (see `Model::knows_cost`), priced or not, and its prompts' counts are
    /// trusted as far as the model inside says (`Model::counts_whole_prompts`).
    #[test]
    fn the_shown_model_knows_its_cost_as_the_model_inside_does() {
        let model =
            || HttpModel::new(Dialect::OpenAi, "openai", "m", "http://127.0.0.1:9", None).unwrap();
        assert!(!Shown::new(Arc::new(model())).knows_cost());
        let priced = Shown::new(Arc::new(model().with_price(Price::new(1.0, 2.0))));
        assert!(priced.knows_cost());
        // The least a prompt costs, as the model inside knows it.
        assert_eq!(priced.least_cost(1_000_000), 1.0);
        assert_eq!(priced.output_tokens_for(1.0), Some(500_000));
        assert_eq!(Shown::new(Arc::new(model())).least_cost(1_000_000), 0.0);
        assert!(Shown::new(Arc::new(model())).counts_whole_prompts());
        let ollama =
            HttpModel::new(Dialect::Ollama, "ollama", "m", "http://127.0.0.1:9", None).unwrap();
        assert!(!Shown::new(Arc::new(ollama)).counts_whole_prompts());
    }
}
