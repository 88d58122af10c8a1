use agent_core::{Risk, ToolError};
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use super::io_error;
use crate::tool::{ToolContext, TypedTool};

/// Entries listed at most; the rest are counted.
const MAX_ENTRIES: usize = 1_000;

/// `list_dir`: the entries of a directory, directories marked with a trailing `/`.
pub struct ListDir;

/// Arguments of `list_dir`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDirArgs {
    /// Directory relative to the workspace root (default: the root).
    #[serde(default)]
    pub path: Option<String>,
}

#[async_trait]
impl TypedTool for ListDir {
    type Args = ListDirArgs;
    const NAME: &'static str = "list_dir";
    const RISK: Risk = Risk::Read;
    const MAIN_ARGUMENT: Option<&'static str> = Some("path");

    fn description(&self) -> String {
        "List a directory of the workspace, sorted by name; directories end with '/'.".to_owned()
    }

    async fn run(&self, args: ListDirArgs, ctx: &ToolContext) -> Result<String, ToolError> {
        let given = args.path.unwrap_or_else(|| ".".to_owned());
        let dir = ctx.workspace.resolve(&given)?;
        let mut reader = tokio::fs::read_dir(&dir)
            .await
            .map_err(|e| io_error(&given, &e))?;
        let mut names = Vec::new();
        while let Some(entry) = reader
            .next_entry()
            .await
            .map_err(|e| io_error(&given, &e))?
        {
            let mut name = entry.file_name().to_string_lossy().into_owned();
            if entry.file_type().await.is_ok_and(|t| t.is_dir()) {
                name.push('/');
            }
            names.push(name);
        }
        names.sort();
        if names.is_empty() {
            return Ok(format!("{} is empty", ctx.workspace.display(&dir)));
        }
        let more = names.len().saturating_sub(MAX_ENTRIES);
        names.truncate(MAX_ENTRIES);
        let mut out = names.join("\n");
        if more > 0 {
            out.push_str(&format!("\n({more} more entries not shown)"));
        }
        Ok(out)
    }
}
