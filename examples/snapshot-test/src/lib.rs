//! An agent of your own, as far as its prompt is concerned: its system text, its tools and
//! its context settings. The tests snapshot what the model is sent at chosen points of a
//! run, so a change to any of them shows up as a readable diff in review.

use agent_context::{ContextConfig, Projector, Tiktoken};
use agent_core::{Entry, Risk, ToolSpec};
use serde_json::json;

/// The system text of this agent.
pub const SYSTEM: &str = "You help people plan meetings. Look rooms up before you answer.";

/// The tools this agent offers the model.
pub fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec::new(
        "find_room",
        "Finds a free meeting room with at least `seats` seats.",
        json!({"type": "object", "properties": {"seats": {"type": "integer"}}, "required": ["seats"]}),
        Risk::Read,
    )]
}

/// The prompt the model gets after `log`, with this agent's settings.
pub fn prompt_after(log: &[Entry]) -> agent_core::Prompt {
    let config = ContextConfig {
        system: SYSTEM.to_owned(),
        ..ContextConfig::default()
    };
    let mut projector = Projector::new(config, tools(), std::sync::Arc::new(Tiktoken));
    for entry in log {
        projector.apply(entry);
    }
    projector.prompt().clone()
}
