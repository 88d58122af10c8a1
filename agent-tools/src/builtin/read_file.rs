use agent_core::{ErrorKind, Risk, ToolError};
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{SNIFF, blocking, read_bytes};
use crate::tool::{ToolContext, TypedTool};

/// Lines returned when the model gives no `limit`.
const DEFAULT_LIMIT: usize = 2_000;

/// `read_file`: a text file's lines, numbered.
pub struct ReadFile;

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// Path relative to the workspace root.
    pub path: String,
    /// First line to return, counting from 1.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub offset: Option<usize>,
    /// Number of lines to return (default 2000).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub limit: Option<usize>,
}

#[async_trait]
impl TypedTool for ReadFile {
    type Args = ReadFileArgs;
    const NAME: &'static str = "read_file";
    const RISK: Risk = Risk::Read;
    const MAIN_ARGUMENT: Option<&'static str> = Some("path");

    fn description(&self) -> String {
        "Read a text file of the workspace. Returns numbered lines; use offset and limit \
         (in lines) to page through long files."
            .to_owned()
    }

    async fn run(&self, args: ReadFileArgs, ctx: &ToolContext) -> Result<String, ToolError> {
        let workspace = ctx.workspace.clone();
        let given = args.path.clone();
        let bytes = blocking(move || {
            let resolved = workspace.resolve_existing(&given)?;
            read_bytes(&workspace, &resolved, &given)
        })
        .await?;
        if bytes[..bytes.len().min(SNIFF)].contains(&0) {
            return Err(ToolError::new(
                ErrorKind::ExecutionFailed,
                format!(
                    "{} looks like a binary file ({} bytes); only text files can be read",
                    args.path,
                    bytes.len()
                ),
            ));
        }
        let text = String::from_utf8_lossy(&bytes);
        Ok(number_lines(
            &text,
            args.offset.unwrap_or(1),
            args.limit.unwrap_or(DEFAULT_LIMIT),
        ))
    }
}

/// Lines `offset..offset+limit` (1-based) with their numbers, and a note when more remain.
fn number_lines(text: &str, offset: usize, limit: usize) -> String {
    let total = text.lines().count();
    let first = offset.max(1);
    if total == 0 {
        return "(empty file)".to_owned();
    }
    if first > total {
        return format!("(the file has {total} lines; offset {first} is past the end)");
    }
    let mut out = String::new();
    let mut last = first;
    for (i, line) in text.lines().enumerate().skip(first - 1).take(limit.max(1)) {
        last = i + 1;
        out.push_str(&format!("{:>6}\t{line}\n", i + 1));
    }
    if last < total {
        out.push_str(&format!(
            "(lines {first}-{last} of {total}; call again with offset {} for more)\n",
            last + 1
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::number_lines;

    #[test]
    fn pages_through_lines() {
        let text = "a\nb\nc\n";
        assert_eq!(
            number_lines(text, 1, 10),
            "     1\ta\n     2\tb\n     3\tc\n"
        );
        assert_eq!(
            number_lines(text, 2, 1),
            "     2\tb\n(lines 2-2 of 3; call again with offset 3 for more)\n"
        );
        assert!(number_lines(text, 9, 1).contains("past the end"));
        assert_eq!(number_lines("", 1, 1), "(empty file)");
    }
}
