use agent_core::{ErrorKind, Finding, Risk, ToolError};
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{blocking, io_error, read_bytes};
use crate::tool::{ToolContext, TypedTool};

/// `edit_file`: replaces one exact, unique piece of text in a file.
pub struct EditFile;

/// Arguments of `edit_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditFileArgs {
    /// Path relative to the workspace root.
    pub path: String,
    /// The exact text to replace; it must occur exactly once.
    pub old: String,
    /// The replacement.
    pub new: String,
}

#[async_trait]
impl TypedTool for EditFile {
    type Args = EditFileArgs;
    const NAME: &'static str = "edit_file";
    const RISK: Risk = Risk::Write;
    const MAIN_ARGUMENT: Option<&'static str> = Some("path");

    fn description(&self) -> String {
        "Replace an exact piece of text in a file of the workspace. `old` must occur exactly \
         once: include enough surrounding lines to make it unique."
            .to_owned()
    }

    async fn run(&self, args: EditFileArgs, ctx: &ToolContext) -> Result<String, ToolError> {
        let fail = |message: String| ToolError::new(ErrorKind::ExecutionFailed, message);
        if args.old.is_empty() {
            return Err(ToolError::new(
                ErrorKind::InvalidArguments,
                "old is empty; give the exact text to replace",
            ));
        }
        let workspace = ctx.workspace.clone();
        let given = args.path.clone();
        let known = ctx.resolution(&given);
        let (resolved, bytes) = blocking(move || {
            let resolved = workspace.resolve_known(known, &given)?.existing(&given)?;
            let bytes = read_bytes(&workspace, &resolved, &given)?;
            Ok((resolved, bytes))
        })
        .await?;
        let text = String::from_utf8(bytes).map_err(|_| {
            fail(format!(
                "{} is not UTF-8 text; edit_file only edits text files",
                args.path
            ))
        })?;
        let count = text.matches(&args.old).count();
        let Some(at) = text.find(&args.old) else {
            return Err(fail(format!(
                "the text of old was not found in {}; read the file and copy it exactly",
                args.path
            )));
        };
        if count > 1 {
            return Err(fail(format!(
                "the text of old occurs {count} times in {}; include more surrounding text to \
                 make it unique",
                args.path
            )));
        }
        let mut edited = String::with_capacity(text.len() + args.new.len());
        edited.push_str(&text[..at]);
        edited.push_str(&args.new);
        edited.push_str(&text[at + args.old.len()..]);
        let workspace = ctx.workspace.clone();
        let given = args.path.clone();
        blocking(move || {
            workspace
                .write_atomic(&resolved, edited.as_bytes())
                .map_err(|e| io_error(&given, &e))
        })
        .await?;
        let line = text[..at].matches('\n').count() + 1;
        Ok(format!(
            "edited {}: replaced 1 occurrence at line {line}",
            args.path
        ))
    }

    /// The edit took place if `new` is there and `old` is gone; it did not if `old` is
    /// still there exactly once. Anything else cannot be told apart.
    async fn reconcile(&self, args: EditFileArgs, ctx: &ToolContext) -> Option<Finding> {
        let workspace = ctx.workspace.clone();
        let given = args.path.clone();
        let bytes = blocking(move || {
            let resolved = workspace.resolve_existing(&given)?;
            read_bytes(&workspace, &resolved, &given)
        })
        .await
        .ok()?;
        let text = String::from_utf8(bytes).ok()?;
        let old = text.matches(&args.old).count();
        if old == 1 && !args.old.contains(&args.new) {
            Some(Finding::NotApplied)
        } else if old == 0 && text.contains(&args.new) {
            Some(Finding::Applied {
                receipt: format!("{} contains the replacement text", args.path),
            })
        } else {
            None
        }
    }
}
