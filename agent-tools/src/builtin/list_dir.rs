use agent_core::{Risk, ToolError};
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{Smallest, blocking, io_error};
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
        let workspace = ctx.workspace.clone();
        let path = given.clone();
        let known = ctx.resolution(&given);
        let (shown, (names, more)) = blocking(move || {
            let resolved = workspace.resolve_known(known, &path)?.existing(&path)?;
            let mut names = Smallest::new(MAX_ENTRIES);
            workspace
                .each_entry(&resolved, |name, is_dir| {
                    names.offer(if is_dir { format!("{name}/") } else { name });
                })
                .map_err(|e| io_error(&path, &e))?;
            Ok((resolved.display(), names.into_sorted()))
        })
        .await?;
        if names.is_empty() {
            return Ok(format!("{shown} is empty"));
        }
        let mut out = names.join("\n");
        if more > 0 {
            out.push_str(&format!("\n({more} more entries not shown)"));
        }
        Ok(out)
    }
}
