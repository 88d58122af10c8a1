use std::sync::Arc;

use agent_core::{ErrorKind, Handle, HandleError, Risk, ToolError};
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::gateway::ResultSource;
use crate::tool::{ToolContext, TypedTool};

/// Characters returned when the model gives no `limit`.
const DEFAULT_LIMIT: usize = 20_000;

/// `read_result`: pages through a stored output or an older result by its handle.
pub struct ReadResult(pub Arc<dyn ResultSource>);

/// Arguments of `read_result`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadResultArgs {
    /// The handle shown in place of the output (`blob:sha256:…` or `log:N`).
    pub handle: String,
    /// First character to return, counting from 0.
    #[serde(default)]
    pub offset: Option<usize>,
    /// Characters to return (default 20000).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub limit: Option<usize>,
}

#[async_trait]
impl TypedTool for ReadResult {
    type Args = ReadResultArgs;
    const NAME: &'static str = "read_result";
    const RISK: Risk = Risk::Read;
    const MAIN_ARGUMENT: Option<&'static str> = Some("handle");

    fn description(&self) -> String {
        "Read a tool output that was too large to show, or an older result shown shortened, by \
         the handle given in its place. Use offset and limit (in characters) to page."
            .to_owned()
    }

    async fn run(&self, args: ReadResultArgs, ctx: &ToolContext) -> Result<String, ToolError> {
        let handle: Handle = args.handle.parse().map_err(|e: HandleError| {
            ToolError::new(
                ErrorKind::InvalidArguments,
                format!("{e}; give the handle exactly as it was shown"),
            )
        })?;
        let text = self
            .0
            .fetch(&ctx.run_id, &handle)
            .map_err(|e| ToolError::new(ErrorKind::ExecutionFailed, e.to_string()))?
            .ok_or_else(|| {
                ToolError::new(
                    ErrorKind::InvalidArguments,
                    format!("no stored result has the handle {:?}", args.handle),
                )
            })?;
        let total = text.chars().count();
        let offset = args.offset.unwrap_or(0);
        let limit = args.limit.unwrap_or(DEFAULT_LIMIT);
        if offset >= total && total > 0 {
            return Ok(format!(
                "(the result has {total} characters; offset {offset} is past the end)"
            ));
        }
        let page: String = text.chars().skip(offset).take(limit).collect();
        let end = offset + page.chars().count();
        if end < total {
            Ok(format!(
                "{page}\n(characters {offset}-{end} of {total}; call again with offset {end} for more)"
            ))
        } else {
            Ok(page)
        }
    }
}
