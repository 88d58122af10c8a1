use std::io::BufRead;

use agent_core::{ErrorKind, Risk, ToolError};
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use std::io::Read;

use std::path::{Path, PathBuf};

use super::{SNIFF, Smallest, blocking, open_regular, walk};
use crate::tool::{ToolContext, TypedTool};
use crate::workspace::{Resolved, Workspace};
use tokio_util::sync::CancellationToken;

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
        let stop = ctx.cancel.clone();
        let (lines, total) = blocking(move || {
            let start = workspace.resolve_known(known, &given)?.existing(&given)?;
            Ok(search(&workspace, &start, &regex, &stop))
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

/// One matching line: ordered by file, then line number, as the listing is.
struct Match {
    rel: PathBuf,
    number: usize,
    text: String,
}

impl Match {
    fn key(&self) -> (&Path, usize) {
        (&self.rel, self.number)
    }
}

impl PartialEq for Match {
    fn eq(&self, other: &Match) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Match {}

impl PartialOrd for Match {
    fn partial_cmp(&self, other: &Match) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Match {
    fn cmp(&self, other: &Match) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

/// The first [`MAX_MATCHES`] matching lines in the order of their paths, and the count of
/// all matching lines. The files are searched as the walk finds them, and only the
/// matches that would be listed are kept: a tree of any size costs the lines shown, not a
/// list of its files. Once `stop` fires (the call timed out or was cancelled, and was
/// answered so), the search ends where it is.
fn search(
    workspace: &Workspace,
    start: &Resolved,
    regex: &regex::Regex,
    stop: &CancellationToken,
) -> (Vec<String>, usize) {
    let mut kept = Smallest::new(MAX_MATCHES);
    let is_file = workspace.metadata(start).is_ok_and(|m| m.is_file());
    if is_file {
        search_file(workspace, start.rel().to_path_buf(), regex, &mut kept, stop);
    } else {
        let base = workspace.root().join(start.rel());
        for rel in walk(&base, stop) {
            search_file(workspace, start.rel().join(rel), regex, &mut kept, stop);
        }
    }
    let (matches, others) = kept.into_sorted();
    let total = matches.len() + others;
    let lines = matches
        .into_iter()
        .map(|m| format!("{}:{}: {}", m.rel.display(), m.number, m.text))
        .collect();
    (lines, total)
}

/// Offers each line of the file at `rel` that matches.
fn search_file(
    workspace: &Workspace,
    rel: PathBuf,
    regex: &regex::Regex,
    kept: &mut Smallest<Match>,
    stop: &CancellationToken,
) {
    // Read through the workspace capability: a file swapped for a link since the walk
    // is refused, not followed.
    let Some(rel_str) = rel.to_str() else {
        return;
    };
    let Ok(resolved) = workspace.resolve_existing(rel_str) else {
        return;
    };
    let Ok((file, _)) = open_regular(workspace, &resolved, rel_str) else {
        return;
    };
    let mut reader = std::io::BufReader::with_capacity(64 << 10, file);
    match reader.fill_buf() {
        Ok(head) if !head[..head.len().min(SNIFF)].contains(&0) => {}
        _ => return,
    }
    // Line by line, each at most MAX_SCAN_LINE bytes, decoded lossily: a file of any
    // size costs bounded memory, and a non-UTF-8 line does not end the search.
    let mut line = Vec::new();
    let mut number = 0usize;
    while !stop.is_cancelled() {
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
        if !regex.is_match(text) {
            continue;
        }
        // The line is made only when it would be listed.
        if kept.would_keep(|greatest| (rel.as_path(), number) < greatest.key()) {
            kept.offer(Match {
                rel: rel.clone(),
                number,
                text: text.chars().take(MAX_LINE).collect(),
            });
        } else {
            kept.pass();
        }
    }
}
