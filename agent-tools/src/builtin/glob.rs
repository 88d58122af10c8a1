use agent_core::{ErrorKind, Risk, ToolError};
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{Smallest, walk};
use crate::tool::{ToolContext, TypedTool};

/// Paths listed at most.
const MAX_PATHS: usize = 1_000;

/// `glob`: workspace files whose path matches a pattern, respecting `.gitignore`.
pub struct Glob;

/// Arguments of `glob`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobArgs {
    /// A glob over paths relative to the root, such as `src/**/*.rs` or `*.md`.
    pub pattern: String,
}

#[async_trait]
impl TypedTool for Glob {
    type Args = GlobArgs;
    const NAME: &'static str = "glob";
    const RISK: Risk = Risk::Read;
    const MAIN_ARGUMENT: Option<&'static str> = Some("pattern");

    fn description(&self) -> String {
        "Find files of the workspace whose path matches a glob (`**` crosses directories); \
         files ignored by .gitignore are skipped. Paths are sorted."
            .to_owned()
    }

    async fn run(&self, args: GlobArgs, ctx: &ToolContext) -> Result<String, ToolError> {
        let matcher = globset::GlobBuilder::new(&args.pattern)
            .literal_separator(true)
            .build()
            .map_err(|e| ToolError::new(ErrorKind::InvalidArguments, format!("pattern: {e}")))?
            .compile_matcher();
        let root = ctx.workspace.root().to_path_buf();
        let stop = ctx.cancel.clone();
        let (paths, more) = tokio::task::spawn_blocking(move || {
            let mut paths = Smallest::new(MAX_PATHS);
            walk(&root, &stop)
                .filter(|rel| matcher.is_match(rel))
                .for_each(|rel| paths.offer(rel.display().to_string()));
            paths.into_sorted()
        })
        .await
        .map_err(|e| ToolError::new(ErrorKind::ExecutionFailed, e.to_string()))?;
        if paths.is_empty() {
            return Ok(format!("no file matches {}", args.pattern));
        }
        let mut out = paths.join("\n");
        if more > 0 {
            out.push_str(&format!(
                "\n({more} more paths not shown; narrow the pattern)"
            ));
        }
        Ok(out)
    }
}
