//! Hooks around tool calls: before a call (a gate that may allow, deny with a reason, or
//! ask) and after it (may add a note to the result). In-process hooks implement [`Hook`];
//! [`CommandHook`] runs an external command with the JSON shape Claude Code's hook scripts
//! already use, so existing scripts work unchanged.
//!
//! External hooks fail closed: a pre-call hook that times out, crashes, exits with a code
//! other than 0 or 2, or prints something that is not a JSON object denies the call, with a
//! reason naming the hook.

use std::time::Duration;

use agent_core::{ToolCall, ToolResult};
use async_trait::async_trait;

#[cfg(feature = "process")]
pub use crate::command_hook::CommandHook;

/// Default time an external hook may take.
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// What a pre-call hook says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookDecision {
    /// Nothing against it: policy decides.
    NoObjection,
    /// Allow it, even if policy would ask (never over a policy denial).
    Allow,
    /// Ask a person.
    Ask(String),
    /// Refuse; the model sees the reason.
    Deny(String),
}

/// A call as a pre-call hook sees it.
#[derive(Clone, Copy, Debug)]
pub struct HookCall<'a> {
    /// The call with its path argument replaced by the workspace-relative path it really
    /// touches (links, `..` and absolute spellings resolved); other calls as proposed.
    pub call: &'a ToolCall,
    /// The call exactly as the model proposed it.
    pub proposed: &'a ToolCall,
}

/// A hook around tool calls.
#[async_trait]
pub trait Hook: Send + Sync {
    /// A name for messages.
    fn name(&self) -> String;
    /// Whether the hook applies to calls of this tool.
    fn applies_to(&self, _tool: &str) -> bool {
        true
    }
    /// Before a call whose arguments validated and that policy did not deny.
    async fn before(&self, _run_id: &str, _call: &HookCall<'_>) -> HookDecision {
        HookDecision::NoObjection
    }
    /// After a call; a returned note is appended to the result the model sees.
    async fn after(&self, _run_id: &str, _call: &ToolCall, _result: &ToolResult) -> Option<String> {
        None
    }
}

/// When a command hook runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookEvent {
    /// Before the call (`PreToolUse`).
    PreToolUse,
    /// After the call (`PostToolUse`).
    PostToolUse,
}

impl HookEvent {
    #[cfg_attr(not(feature = "process"), allow(dead_code))]
    pub(crate) fn name(self) -> &'static str {
        match self {
            HookEvent::PreToolUse => "PreToolUse",
            HookEvent::PostToolUse => "PostToolUse",
        }
    }
}
