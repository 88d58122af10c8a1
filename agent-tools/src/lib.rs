//! `agent-tools` is the gateway between a model's tool-call intents and real actions: the
//! [`Tool`] trait, a registry that validates arguments against each tool's JSON Schema
//! (compiled once), the policy verdict, and execution with timeouts, cancellation, panic
//! isolation and results correlated by call id. Built-in file tools are confined to the
//! [`Workspace`] root.
//!
//! ```
//! use agent_core::{ToolCall, Verdict};
//! use agent_tools::{Gateway, Workspace};
//! use serde_json::json;
//!
//! let dir = std::env::temp_dir();
//! let gateway = Gateway::with_builtins(Workspace::new(&dir).unwrap()).unwrap();
//! let calls = [
//!     ToolCall::new("c1", "read_file", json!({"path": "notes.txt"})),
//!     ToolCall::new("c2", "read_file", json!({"path": 7})),
//! ];
//! let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! let verdicts = rt.block_on(gateway.check("run-1", &calls));
//! assert_eq!(verdicts[0].1, Verdict::Allow);
//! assert!(matches!(&verdicts[1].1, Verdict::Invalid { message } if message.starts_with("/path")));
//! ```

mod answer;
pub mod builtin;
#[cfg(feature = "process")]
mod command_hook;
pub mod command_line;
mod gateway;
pub mod git_config;
mod hooks;
#[cfg(feature = "mcp")]
pub mod mcp;
mod named;
mod policy;
#[cfg(feature = "process")]
mod process;
mod replay;
#[cfg(feature = "process")]
mod sandbox;
mod tool;
mod workspace;

pub use agent_core::provider_schema;
pub use answer::{
    AnswerChecker, AnswerSpecError, DEFAULT_CHECK_TIMEOUT, MAX_REJECTION_CHARS, answer_json,
};
pub use gateway::{
    BlobSink, Checks, DEFAULT_CONCURRENCY, Gateway, GatewayError, MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH, PREVIEW_BYTES, ResultSource, StorageError, ToolActivity, ToolObserver,
    schema_within_bounds,
};
#[cfg(feature = "process")]
pub use hooks::CommandHook;
pub use hooks::{DEFAULT_HOOK_TIMEOUT, Hook, HookCall, HookDecision, HookEvent};
pub use policy::{Action, Policy, Rule, RuleError, Subject};
#[cfg(feature = "process")]
pub use process::{
    PID_NAMESPACE_ENV, check_pid_namespace_env, keep_from_commands, watch_if_asked, watch_with,
};
pub use replay::ToolReplay;
#[cfg(feature = "process")]
pub use sandbox::{SYSTEM_CREDENTIALS, Sandbox};
pub use tool::{Tool, ToolContext, Typed, TypedTool, Unavailable};
pub use workspace::{
    CREDENTIALS, INLINE_READ_BYTES, Resolved, Seen, Workspace, home_dirs, is_local_file_system,
};
