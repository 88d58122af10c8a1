//! The `Tool` trait, and `TypedTool` for tools whose arguments are a Rust struct.

use std::sync::Arc;

use agent_core::{CallId, ErrorKind, Finding, Risk, ToolError, ToolSpec};
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::workspace::{Resolved, Workspace};

/// What a running call can see: where it may act and whether it should stop.
#[derive(Clone, Debug)]
pub struct ToolContext {
    /// The root that file and process tools are confined to.
    pub workspace: Arc<Workspace>,
    /// Fired when the call must stop (run cancelled, or the call timed out).
    pub cancel: CancellationToken,
    /// The run the call belongs to.
    pub run_id: String,
    /// The call being answered.
    pub call_id: CallId,
    /// The effect key, for `write`/`external` calls.
    pub effect_key: Option<String>,
    /// The call's path argument as given and as the gateway resolved it right before the
    /// call, the resolution policy judged: a file tool acts on it ([`ToolContext::resolution`])
    /// rather than on a walk of its own. `None` outside the gateway, and for a call without
    /// a path argument.
    pub resolved: Option<(String, Resolved)>,
}

impl ToolContext {
    /// The gateway's resolution of `given`, if it resolved exactly that path for this call.
    pub fn resolution(&self, given: &str) -> Option<Resolved> {
        match &self.resolved {
            Some((path, resolved)) if path == given => Some(resolved.clone()),
            _ => None,
        }
    }
}

/// Why a tool cannot be called any more.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// The server behind the tool exited, and was already restarted as often as allowed.
    #[error("{server} exited and was already restarted once")]
    Exited {
        /// The server, as a person knows it (`MCP server NAME`).
        server: String,
    },
    /// The server behind the tool exited and could not be started again.
    #[error("{server} could not restart: {why}")]
    RestartFailed {
        /// The server, as a person knows it.
        server: String,
        /// What failed.
        why: String,
    },
    /// Gone for another reason, in the tool's words.
    #[error("{0}")]
    Gone(String),
}

/// A tool the model can call. The gateway validates arguments against `spec().input_schema`
/// before `call` runs, enforces the timeout and catches panics.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// What the tool declares about itself.
    fn spec(&self) -> ToolSpec;

    /// `Err(why)` when the tool is gone for good (its server died and did not restart); the
    /// run then stops with `tool_unavailable` instead of calling it.
    fn available(&self) -> Result<(), Unavailable> {
        Ok(())
    }

    /// Runs one call with already-validated arguments. An `Err` is data for the model.
    async fn call(&self, arguments: Value, ctx: &ToolContext) -> Result<String, ToolError>;

    /// After a crash: whether the effect of this call (identified by `ctx.effect_key`) took
    /// place. `None` means the tool cannot tell, and a person will be asked.
    async fn reconcile(&self, _arguments: &Value, _ctx: &ToolContext) -> Option<Finding> {
        None
    }
}

/// A tool whose arguments are a typed struct: its JSON Schema is generated from the struct,
/// never written by hand. Wrap it in [`Typed`] to register it.
#[async_trait]
pub trait TypedTool: Send + Sync + 'static {
    /// The arguments.
    type Args: DeserializeOwned + JsonSchema + Send;
    /// The tool's name.
    const NAME: &'static str;
    /// The tool's risk.
    const RISK: Risk;
    /// The argument policy patterns like `tool(glob)` match on (a path or a command).
    const MAIN_ARGUMENT: Option<&'static str> = None;
    /// What the tool does, for the model.
    fn description(&self) -> String;
    /// Adjusts the generated spec (timeouts, limits); the default keeps it.
    fn customize(&self, spec: ToolSpec) -> ToolSpec {
        spec
    }
    /// Runs one call.
    async fn run(&self, args: Self::Args, ctx: &ToolContext) -> Result<String, ToolError>;
    /// Looks an effect up after a crash (see [`Tool::reconcile`]).
    async fn reconcile(&self, _args: Self::Args, _ctx: &ToolContext) -> Option<Finding> {
        None
    }
}

/// Adapter from [`TypedTool`] to [`Tool`].
pub struct Typed<T>(pub T);

#[async_trait]
impl<T: TypedTool> Tool for Typed<T> {
    fn spec(&self) -> ToolSpec {
        let schema = serde_json::to_value(schemars::schema_for!(T::Args)).unwrap_or(Value::Null);
        let mut spec = ToolSpec::new(T::NAME, self.0.description(), schema, T::RISK);
        spec.main_argument = T::MAIN_ARGUMENT.map(str::to_owned);
        self.0.customize(spec)
    }

    async fn call(&self, arguments: Value, ctx: &ToolContext) -> Result<String, ToolError> {
        let args: T::Args = serde_json::from_value(arguments)
            .map_err(|e| ToolError::new(ErrorKind::InvalidArguments, e.to_string()))?;
        self.0.run(args, ctx).await
    }

    async fn reconcile(&self, arguments: &Value, ctx: &ToolContext) -> Option<Finding> {
        let args: T::Args = serde_json::from_value(arguments.clone()).ok()?;
        self.0.reconcile(args, ctx).await
    }
}
