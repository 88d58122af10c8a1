use agent_core::{ErrorKind, Risk, ToolError};
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use std::fmt::Write as _;
use std::io::{BufRead, Read};

use super::{SNIFF, blocking, io_error, open_regular};
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
        let given = args.path;
        let offset = args.offset.unwrap_or(1).max(1);
        let limit = args.limit.unwrap_or(DEFAULT_LIMIT).max(1);
        // The path policy judged, as the gateway resolved it just now.
        let known = ctx.resolution(&given);
        if workspace.is_local() {
            // Resolving looks only at the workspace's own local file system here, as the
            // gateway's check already did on this thread; a small file there is read at
            // once (`Workspace::reads_inline`), anything else on the blocking pool.
            let resolved = workspace.resolve_known(known, &given)?.existing(&given)?;
            if workspace.reads_inline(&resolved) {
                let (file, meta) = open_regular(&workspace, &resolved, &given)?;
                let size = meta.len();
                // The file opened is what counts: one that grew since it was resolved, or
                // is on another file system now, is read on the pool after all.
                if workspace.reads_inline_opened(&meta) {
                    // A local file's length as opened ends the read: no system call to
                    // find its end. What is appended meanwhile is not read.
                    return read(file.take(size), size, &given, offset, limit);
                }
                return blocking(move || read(file, size, &given, offset, limit)).await;
            }
            return blocking(move || {
                let (file, meta) = open_regular(&workspace, &resolved, &given)?;
                read(file, meta.len(), &given, offset, limit)
            })
            .await;
        }
        blocking(move || {
            let resolved = workspace.resolve_known(known, &given)?.existing(&given)?;
            let (file, meta) = open_regular(&workspace, &resolved, &given)?;
            read(file, meta.len(), &given, offset, limit)
        })
        .await
    }
}

/// Lines `offset..offset+limit` of an opened regular file of `size` bytes, numbered (see
/// [`number_lines`]).
fn read(
    file: impl std::io::Read,
    size: u64,
    given: &str,
    offset: usize,
    limit: usize,
) -> Result<String, ToolError> {
    // Room for the whole of a small file and the empty read that ends it.
    let capacity = usize::try_from(size.saturating_add(1))
        .map_or(READ_BUFFER, |n| n.clamp(SNIFF, READ_BUFFER));
    let mut reader = std::io::BufReader::with_capacity(capacity, file);
    let head = reader.fill_buf().map_err(|e| io_error(given, &e))?;
    if head[..head.len().min(SNIFF)].contains(&0) {
        return Err(ToolError::new(
            ErrorKind::ExecutionFailed,
            format!("{given} looks like a binary file ({size} bytes); only text files can be read"),
        ));
    }
    number_lines(&mut reader, offset, limit, OUTPUT_CAP, size).map_err(|e| io_error(given, &e))
}

/// The read buffer of a file larger than it.
const READ_BUFFER: usize = 64 << 10;

/// Bytes of numbered lines returned at most, leaving room for the note under the tool's
/// 50,000-character result limit: a file of any size costs this much memory.
const OUTPUT_CAP: usize = 49_000;

/// Files up to this size are read to the end to count their lines for the note.
const COUNT_LINES_UP_TO: u64 = 16 << 20;

/// Lines `offset..offset+limit` (1-based) of `reader` with their numbers, at most `cap`
/// bytes in all, and a note when more remain. Reads lines before `offset` without keeping
/// them, and never holds more than `cap` bytes of the file.
fn number_lines(
    reader: &mut impl BufRead,
    offset: usize,
    limit: usize,
    cap: usize,
    size: u64,
) -> std::io::Result<String> {
    let mut line_no = 0usize;
    // Skip to the offset.
    while line_no + 1 < offset {
        if reader.fill_buf()?.is_empty() {
            break;
        }
        reader.skip_until(b'\n')?;
        line_no += 1;
    }
    if reader.fill_buf()?.is_empty() {
        return Ok(if line_no == 0 {
            "(empty file)".to_owned()
        } else {
            format!("(the file has {line_no} lines; offset {offset} is past the end)")
        });
    }
    let mut out = String::new();
    let mut line = Vec::new();
    let mut prefix = String::new();
    let mut shown = 0usize;
    let mut cut_line = None;
    let mut held_back = false;
    // Whether a read met the end: `BufReader` would ask the file again (a system call)
    // at every later `fill_buf`.
    let mut at_end = false;
    while shown < limit {
        if reader.fill_buf()?.is_empty() {
            at_end = true;
            break;
        }
        prefix.clear();
        let _ = write!(prefix, "{:>6}\t", line_no + 1);
        let room = cap.saturating_sub(out.len() + prefix.len() + 1);
        if room == 0 {
            break;
        }
        line.clear();
        reader
            .by_ref()
            .take(room as u64 + 1)
            .read_until(b'\n', &mut line)?;
        line_no += 1;
        shown += 1;
        let ended = line.last() == Some(&b'\n');
        if ended {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
        }
        if line.len() > room || (!ended && !reader.fill_buf()?.is_empty()) {
            reader.skip_until(b'\n')?;
            if shown > 1 {
                // It does not fit after the others: the next call starts with it.
                held_back = true;
                break;
            }
            // A first line longer than the cap: shown cut, the rest of it skipped.
            line.truncate(room);
            cut_line = Some(line_no);
        }
        out.push_str(&prefix);
        match std::str::from_utf8(&line) {
            Ok(text) => out.push_str(text),
            Err(_) => out.push_str(&String::from_utf8_lossy(&line)),
        }
        out.push('\n');
        if cut_line.is_some() {
            break;
        }
    }
    let last = if held_back { line_no - 1 } else { line_no };
    let more = held_back || (!at_end && !reader.fill_buf()?.is_empty());
    if let Some(n) = cut_line {
        out.push_str(&format!(
            "(line {n} is cut: the output stops at {cap} bytes; use grep to find what you need in it)\n"
        ));
    }
    if more {
        let first = offset;
        if size <= COUNT_LINES_UP_TO {
            let mut total = line_no;
            while !reader.fill_buf()?.is_empty() {
                reader.skip_until(b'\n')?;
                total += 1;
            }
            out.push_str(&format!(
                "(lines {first}-{last} of {total}; call again with offset {} for more)\n",
                last + 1
            ));
        } else {
            out.push_str(&format!(
                "(lines {first}-{last} of a file of {size} bytes; call again with offset {} for more)\n",
                last + 1
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::number_lines;
    use std::io::Read;

    /// A reader of `data` that counts how often it is asked.
    struct Counted<'a> {
        data: &'a [u8],
        asked: usize,
    }

    impl Read for Counted<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.asked += 1;
            self.data.read(buf)
        }
    }

    #[test]
    fn a_small_file_is_read_with_one_read_and_one_that_meets_the_end() {
        let text = b"a\nb\n";
        let mut counted = Counted {
            data: text,
            asked: 0,
        };
        let mut reader = std::io::BufReader::with_capacity(64, &mut counted);
        let out = number_lines(&mut reader, 1, 10, 1000, text.len() as u64).unwrap();
        assert_eq!(out, "     1\ta\n     2\tb\n");
        drop(reader);
        assert_eq!(counted.asked, 2);
    }

    fn lines(text: &str, offset: usize, limit: usize, cap: usize) -> String {
        let mut reader = std::io::Cursor::new(text.as_bytes().to_vec());
        number_lines(&mut reader, offset, limit, cap, text.len() as u64).unwrap()
    }

    #[test]
    fn pages_through_lines() {
        let text = "a\nb\nc\n";
        assert_eq!(
            lines(text, 1, 10, 1000),
            "     1\ta\n     2\tb\n     3\tc\n"
        );
        assert_eq!(
            lines(text, 2, 1, 1000),
            "     2\tb\n(lines 2-2 of 3; call again with offset 3 for more)\n"
        );
        assert!(lines(text, 9, 1, 1000).contains("past the end"));
        assert_eq!(lines("", 1, 1, 1000), "(empty file)");
        assert_eq!(lines("x", 1, 5, 1000), "     1\tx\n");
        assert_eq!(lines("a\r\nb", 1, 5, 1000), "     1\ta\n     2\tb\n");
    }

    #[test]
    fn the_output_stops_at_the_cap() {
        // Ten lines of 10 bytes: the cap lets three through, then says where to go on.
        let text = "123456789\n".repeat(10);
        let out = lines(&text, 1, 100, 60);
        assert_eq!(out.matches("123456789").count(), 3, "{out}");
        assert!(
            out.ends_with("(lines 1-3 of 10; call again with offset 4 for more)\n"),
            "{out}"
        );
        // One line longer than the cap is shown cut.
        let long = format!("{}\nnext\n", "x".repeat(500));
        let out = lines(&long, 1, 100, 60);
        assert!(out.contains("line 1 is cut"), "{out}");
        assert!(out.len() < 200, "{out}");
    }
}
