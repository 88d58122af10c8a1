//! `agent-core` is the pure, deterministic heart of agent-loop: the contract's vocabulary
//! as types and the run state machine, with no IO at all.
//!
//! It knows nothing of async runtimes, HTTP, sled, the file system, the clock, environment
//! variables or randomness: ids and time are inputs, effects are commands. That makes every
//! transition testable in microseconds, without mocks.
//!
//! Main types:
//! - [`Decision`], [`ToolCall`], [`ToolResult`], [`ErrorKind`]: what the model proposes and
//!   what calls produce (CONTRACT §2, §5).
//! - [`TerminalReason`], [`Outcome`]: why an invocation stopped (§3); [`Budget`] (§4).
//! - [`Event`], [`Entry`]: the event log; [`RunState`] is a pure fold over it (§7).
//! - [`Machine`]: the sans-IO state machine. [`Input`]s go in, [`Command`]s come out.
//! - [`Prompt`], [`Message`], [`Part`]: the provider-neutral prompt.
//!
//! A run that answers at once:
//!
//! ```
//! use agent_core::*;
//!
//! let manifest = Manifest {
//!     runtime_version: "0.1.0".into(),
//!     provider: "script".into(),
//!     model: "demo".into(),
//!     system_prompt_digest: String::new(),
//!     tool_schema_digest: String::new(),
//!     budget: Budget::default(),
//!     tools: Vec::new(),
//!     answer: None,
//!     forked_from: None,
//!     parent: None,
//!     workspace: None,
//!     sandbox: None,
//! };
//! let config = RunConfig { run_id: "r1".into(), goal: "say hi".into(), manifest, tools: vec![] };
//! let mut machine = Machine::start(config, 0);
//!
//! // The run is committed before the model is asked anything.
//! let Some(Command::Commit { entries, .. }) = machine.poll_command() else { panic!() };
//! machine.handle(Input::Committed { version: entries.len() as u64 }).unwrap();
//! assert_eq!(machine.poll_command(), Some(Command::CallModel { turn: 1 }));
//!
//! let reply = ModelReply::decision(Decision::Final { answer: "hi".into() }, Usage::default());
//! machine.handle(Input::ModelReplied(reply)).unwrap();
//! let Some(Command::Commit { entries, .. }) = machine.poll_command() else { panic!() };
//! machine.handle(Input::Committed { version: 1 + entries.len() as u64 }).unwrap();
//!
//! let Some(Command::Finish(outcome)) = machine.poll_command() else { panic!() };
//! assert_eq!(outcome.reason, TerminalReason::Completed);
//! assert_eq!(outcome.answer.as_deref(), Some("hi"));
//! assert_eq!(machine.poll_command(), None);
//! ```

mod attempts;
mod budget;
mod decision;
mod digest;
mod effect;
mod event;
mod family;
mod fork;
mod handle;
mod machine;
mod progress;
mod prompt;
mod reason;
mod schedule;
mod schema;
mod state;
mod tool;

pub use budget::{Budget, Usage};
pub use decision::{
    CallId, Decision, DecisionProblem, InvalidReply, MAX_ARGUMENT_BYTES, MAX_ARGUMENT_DEPTH,
    MAX_CALLS, MAX_ID_BYTES, MAX_TEXT_BYTES, ModelErrorKind, ModelReply, Reasoning, Retry,
    SECRET_PARTS, SECRET_WORDS, SecretRef, ToolCall, holds_secret, named_like_secret,
    nesting_depth,
};
pub use digest::{canonical_json, sha256_hex};
pub use effect::effect_key;
pub use event::{
    AnswerSpec, Entry, Event, Finding, ForkOrigin, Manifest, ParentCall, Resolution, SandboxRecord,
};
pub use family::{ancestor_run_ids, in_family_of, parent_run_id, sub_agent_run_id};
pub use fork::{ForkError, before_model_call, fork_log, model_call_of};
pub use handle::{BLOB_PREFIX, Handle, HandleError};
pub use machine::{
    Command, Input, InputError, MAX_REJECTED_REPLY_CHARS, Machine, ReplyError, RunConfig, Verdict,
};
pub use progress::{correction_message, fingerprint};
pub use prompt::{Arguments, Message, Part, Prompt, Role};
pub use reason::{Outcome, PendingCall, ReasonClass, TerminalReason, UnknownReason};
pub use schedule::{ScheduledCall, schedule};
pub use schema::provider_schema;
pub use state::{Approval, FoldError, PlanTrack, RunState, Status};
pub use tool::{
    DEFAULT_RESULT_LIMIT, DEFAULT_TOOL_TIMEOUT_MS, ErrorKind, PREVIEW_BYTES, Risk, ToolError,
    ToolOutcome, ToolResult, ToolSpec,
};
