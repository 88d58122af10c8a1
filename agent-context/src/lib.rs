//! `agent-context` projects a run's event log into the bounded, provider-neutral
//! [`Prompt`] the model is sent (CONTRACT §9). The projection is a pure function of the log:
//! the same log gives the same prompt, byte for byte, which is what makes `agent context`
//! and replay trustworthy. It is incremental ([`Projector`]): the runtime keeps it between
//! turns and applies only new events.
//!
//! Every tool call the model made is paired with a result part, even when the call never
//! ran. Older results are masked to their head and a handle; one turn's results stay under
//! a budget; past a share of the context window the history is compacted into a summary
//! ([`Summarizer`]) plus a facts block rebuilt from the log.
//!
//! ```
//! use agent_context::{DEFAULT_SYSTEM_PROMPT, project};
//! use agent_core::{Budget, Entry, Event, Manifest, Role};
//!
//! let manifest = Manifest {
//!     runtime_version: "0.1.0".into(), provider: "script".into(), model: "m".into(),
//!     system_prompt_digest: String::new(), tool_schema_digest: String::new(),
//!     budget: Budget::default(),
//!     tools: Vec::new(),
//!     answer: None,
//!     forked_from: None,
//!     parent: None,
//!     workspace: None,
//!     sandbox: None,
//! };
//! let log = [Entry { version: 1, at_ms: 0, event: Event::RunStarted {
//!     run_id: "r1".into(), goal: "Summarize notes.txt".into(), manifest } }];
//! let prompt = project(DEFAULT_SYSTEM_PROMPT, &log, vec![]);
//! assert_eq!(prompt.messages.len(), 1);
//! assert_eq!(prompt.messages[0].role, Role::User);
//! ```

mod facts;
mod project;
mod render;
mod summarize;
#[cfg(feature = "testing")]
pub mod testing;
mod tokens;

pub use facts::Facts;
pub use project::{
    ContextConfig, MIN_LEARNED_WINDOW, Projector, REJECTED_REPLY_CHARS, SUMMARY_PREFIX, project,
};
pub use render::PromptText;
pub use summarize::{
    DEFAULT_SUMMARY_CHARS, Digest, Extractive, SUMMARY_INSTRUCTION, Summarized, Summarizer,
    SummaryError, extract,
};
pub use tokens::{CharEstimate, DEFAULT_CONTEXT_WINDOW, Tiktoken, TokenCounter, context_window};

pub use agent_core::Prompt;

/// The system text a run uses unless configured otherwise.
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are an agent working in a workspace on the \
user's goal. Use the tools to look before you act. Call tools when you need facts; when the \
goal is reached, answer with your final answer. If the goal is ambiguous, ask one \
clarifying question. If you cannot reach the goal, say so and why.";
