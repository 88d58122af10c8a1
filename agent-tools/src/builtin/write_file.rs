use agent_core::{Finding, Risk, ToolError, sha256_hex};
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{blocking, io_error, read_bytes_capped};
use crate::tool::{ToolContext, TypedTool};

/// `write_file`: creates or replaces a file, creating its parent directories.
pub struct WriteFile;

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// Path relative to the workspace root.
    pub path: String,
    /// The whole new content of the file.
    pub content: String,
}

#[async_trait]
impl TypedTool for WriteFile {
    type Args = WriteFileArgs;
    const NAME: &'static str = "write_file";
    const RISK: Risk = Risk::Write;
    const MAIN_ARGUMENT: Option<&'static str> = Some("path");

    fn description(&self) -> String {
        "Create or replace a file of the workspace with the given content; parent \
         directories are created."
            .to_owned()
    }

    fn customize(&self, mut spec: agent_core::ToolSpec) -> agent_core::ToolSpec {
        // Writing the same content twice leaves the same file.
        spec.idempotent = true;
        spec
    }

    async fn run(&self, args: WriteFileArgs, ctx: &ToolContext) -> Result<String, ToolError> {
        let workspace = ctx.workspace.clone();
        let given = args.path.clone();
        let content = args.content.clone();
        let known = ctx.resolution(&given);
        blocking(move || {
            let resolved = workspace.resolve_known(known, &given)?;
            workspace
                .write_atomic(&resolved, content.as_bytes())
                .map_err(|e| io_error(&given, &e))
        })
        .await?;
        // The receipt names the content hash, so recovery can tell whether this write
        // landed by hashing the file.
        Ok(format!(
            "wrote {} bytes to {} (sha256 {})",
            args.content.len(),
            args.path,
            sha256_hex(args.content.as_bytes())
        ))
    }

    /// The write took place if the file holds exactly the content it meant to write.
    async fn reconcile(&self, args: WriteFileArgs, ctx: &ToolContext) -> Option<Finding> {
        let workspace = ctx.workspace.clone();
        let given = args.path.clone();
        let want_len = args.content.len();
        let read = blocking(move || {
            let resolved = workspace.resolve(&given)?;
            if !resolved.exists() {
                return Ok(None);
            }
            // The content is at most 1 MiB (the argument limit): a longer file differs.
            let cap = want_len;
            read_bytes_capped(&workspace, &resolved, &given, cap)
                .map(|(bytes, whole)| whole.then_some(bytes))
        })
        .await;
        let want = sha256_hex(args.content.as_bytes());
        match read {
            Ok(Some(bytes)) if sha256_hex(&bytes) == want => Some(Finding::Applied {
                receipt: format!("{} holds the content written (sha256 {want})", args.path),
            }),
            Ok(_) => Some(Finding::NotApplied),
            Err(_) => None,
        }
    }
}
