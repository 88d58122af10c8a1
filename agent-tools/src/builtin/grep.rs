use std::io::BufRead;

use agent_core::{ErrorKind, Risk, ToolError};
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use std::io::Read;

use super::{SNIFF, blocking, open_regular, walk};
use crate::tool::{ToolContext, TypedTool};
use crate::workspace::{Resolved, Workspace};

/// Matching lines listed at most.
const MAX_MATCHES: usize = 500;
/// Characters of one matching line shown at most.
const MAX_LINE: usize = 300;
/// Bytes of one line searched at most (the rest of a longer line is skipped).
const MAX_SCAN_LINE: usize = 1 << 20;

/// `grep`: lines of workspace files matching a regular expression.
pub struct Grep;

/// Arguments of `grep`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepArgs {
    /// A regular expression (Rust `regex` syntax).
    pub pattern: String,
    /// File or directory to search, relative to the root (default: the whole workspace).
    #[serde(default)]
    pub path: Option<String>,
}

#[async_trait]
impl TypedTool for Grep {
    type Args = GrepArgs;
    const NAME: &'static str = "grep";
    const RISK: Risk = Risk::Read;
    const MAIN_ARGUMENT: Option<&'static str> = Some("path");

    fn description(&self) -> String {
        "Search files of the workspace for a regular expression; prints path:line: text for \
         each matching line. Respects .gitignore and skips binary files."
            .to_owned()
    }

    async fn run(&self, args: GrepArgs, ctx: &ToolContext) -> Result<String, ToolError> {
        let regex = regex::Regex::new(&args.pattern)
            .map_err(|e| ToolError::new(ErrorKind::InvalidArguments, format!("pattern: {e}")))?;
        let workspace = ctx.workspace.clone();
        let given = args.path.clone().unwrap_or_else(|| ".".to_owned());
        let known = ctx.resolution(&given);
        let (lines, total) = blocking(move || {
            let start = workspace.resolve_known(known, &given)?.existing(&given)?;
            Ok(search(&workspace, &start, &regex))
        })
        .await?;
        if lines.is_empty() {
            return Ok(format!("no line matches {}", args.pattern));
        }
        let mut out = lines.join("\n");
        if total > lines.len() {
            out.push_str(&format!(
                "\n({} more matching lines not shown; narrow the pattern or the path)",
                total - lines.len()
            ));
        }
        Ok(out)
    }
}

fn search(workspace: &Workspace, start: &Resolved, regex: &regex::Regex) -> (Vec<String>, usize) {
    let mut lines = Vec::new();
    let mut total = 0;
    let is_file = workspace.metadata(start).is_ok_and(|m| m.is_file());
    let files: Vec<std::path::PathBuf> = if is_file {
        vec![start.rel().to_path_buf()]
    } else {
        let base = workspace.root().join(start.rel());
        let mut files: Vec<_> = walk(&base).map(|rel| start.rel().join(rel)).collect();
        files.sort();
        files
    };
    for rel in files {
        // Read through the workspace capability: a file swapped for a link since the walk
        // is refused, not followed.
        let Some(rel_str) = rel.to_str() else {
            continue;
        };
        let Ok(resolved) = workspace.resolve_existing(rel_str) else {
            continue;
        };
        let Ok((file, _)) = open_regular(workspace, &resolved, rel_str) else {
            continue;
        };
        let mut reader = std::io::BufReader::with_capacity(64 << 10, file);
        match reader.fill_buf() {
            Ok(head) if !head[..head.len().min(SNIFF)].contains(&0) => {}
            _ => continue,
        }
        // Line by line, each at most MAX_SCAN_LINE bytes, decoded lossily: a file of any
        // size costs bounded memory, and a non-UTF-8 line does not end the search.
        let mut line = Vec::new();
        let mut number = 0usize;
        loop {
            line.clear();
            let read = reader
                .by_ref()
                .take(MAX_SCAN_LINE as u64)
                .read_until(b'\n', &mut line);
            match read {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            number += 1;
            if line.last() != Some(&b'\n') && reader.skip_until(b'\n').is_err() {
                break;
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches(['\n', '\r']);
            if regex.is_match(text) {
                total += 1;
                if lines.len() < MAX_MATCHES {
                    let shown: String = text.chars().take(MAX_LINE).collect();
                    lines.push(format!("{}:{number}: {shown}", rel.display()));
                }
            }
        }
    }
    (lines, total)
}
