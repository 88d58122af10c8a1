//! Built-in tools. Their names and argument names are part of the contract (§5); all paths
//! are relative to the workspace root and confined to it.

mod delegate;
mod edit_file;
mod glob;
mod grep;
mod list_dir;
mod read_file;
mod read_result;
#[cfg(feature = "process")]
mod shell;
mod write_file;

pub use delegate::{DELEGATE, DELEGATE_READ, Delegate, is_delegate};
pub use edit_file::{EditFile, EditFileArgs};
pub use glob::{Glob, GlobArgs};
pub use grep::{Grep, GrepArgs};
pub use list_dir::{ListDir, ListDirArgs};
pub use read_file::{ReadFile, ReadFileArgs};
pub use read_result::{ReadResult, ReadResultArgs};
#[cfg(feature = "process")]
pub use shell::{Shell, ShellArgs};
pub use write_file::{WriteFile, WriteFileArgs};

use std::path::{Path, PathBuf};

use std::sync::Arc;

use crate::tool::{Tool, Typed};

/// Bytes looked at to tell a binary file.
pub(crate) const SNIFF: usize = 8_192;

/// Every built-in tool of this version.
pub fn all() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(Typed(ReadFile)),
        Arc::new(Typed(ListDir)),
        Arc::new(Typed(Glob)),
        Arc::new(Typed(Grep)),
        Arc::new(Typed(WriteFile)),
        Arc::new(Typed(EditFile)),
        #[cfg(feature = "process")]
        Arc::new(Typed(Shell::default())),
    ]
}

fn io_error(path: &str, err: &std::io::Error) -> agent_core::ToolError {
    agent_core::ToolError::new(
        agent_core::ErrorKind::ExecutionFailed,
        format!("{path}: {err}"),
    )
}

/// Runs blocking file work off the async threads; a panic in it is a failed call.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, agent_core::ToolError> + Send + 'static,
) -> Result<T, agent_core::ToolError> {
    tokio::task::spawn_blocking(work).await.map_err(|e| {
        agent_core::ToolError::new(agent_core::ErrorKind::ExecutionFailed, e.to_string())
    })?
}

/// Opens a resolved path for reading, through the workspace capability. Only regular
/// files: a FIFO or a device would block or never end. What the resolution saw is refused
/// before anything is opened, and the file opened (without waiting, [`Workspace::open`])
/// is checked again, so a path swapped for a FIFO in between is refused, not waited on.
///
/// [`Workspace::open`]: crate::Workspace::open
fn open_regular(
    workspace: &crate::Workspace,
    resolved: &crate::workspace::Resolved,
    given: &str,
) -> Result<(std::fs::File, std::fs::Metadata), agent_core::ToolError> {
    use crate::workspace::Seen;
    let not_regular = |dir: bool| {
        agent_core::ToolError::new(
            agent_core::ErrorKind::ExecutionFailed,
            if !dir {
                format!(
                    "{given:?} is not a regular file (a pipe, socket or device); it cannot be read"
                )
            } else if resolved.is_root() {
                format!(
                    "{given:?} is the workspace root, a directory; give a file path, or use list_dir"
                )
            } else {
                format!("{given:?} is a directory; use list_dir")
            },
        )
    };
    match resolved.seen() {
        Some(Seen::Dir) => return Err(not_regular(true)),
        Some(Seen::Other) => return Err(not_regular(false)),
        Some(Seen::File { .. }) | None => {}
    }
    let file = workspace.open(resolved).map_err(|e| io_error(given, &e))?;
    let meta = file.metadata().map_err(|e| io_error(given, &e))?;
    if !meta.is_file() {
        return Err(not_regular(meta.is_dir()));
    }
    Ok((file, meta))
}

/// Reads a resolved regular file, at most `cap` bytes: `(bytes, whole)`, where `whole` says
/// the file ended within the cap. Never holds more than `cap + 1` bytes.
fn read_bytes_capped(
    workspace: &crate::Workspace,
    resolved: &crate::workspace::Resolved,
    given: &str,
    cap: usize,
) -> Result<(Vec<u8>, bool), agent_core::ToolError> {
    use std::io::Read;
    let (file, _) = open_regular(workspace, resolved, given)?;
    let mut bytes = Vec::new();
    file.take(cap as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(given, &e))?;
    let whole = bytes.len() <= cap;
    bytes.truncate(cap);
    Ok((bytes, whole))
}

/// Largest file `write_file`'s and `edit_file`'s look-ups and edits read (bigger files
/// are refused rather than held in memory).
pub(crate) const EDIT_CAP: usize = 16 << 20;

/// Reads a resolved regular file whole, refusing one larger than [`EDIT_CAP`].
fn read_bytes(
    workspace: &crate::Workspace,
    resolved: &crate::workspace::Resolved,
    given: &str,
) -> Result<Vec<u8>, agent_core::ToolError> {
    let (bytes, whole) = read_bytes_capped(workspace, resolved, given, EDIT_CAP)?;
    if !whole {
        return Err(agent_core::ToolError::new(
            agent_core::ErrorKind::ExecutionFailed,
            format!(
                "{given:?} is larger than {} MiB; it is not edited or compared whole",
                EDIT_CAP >> 20
            ),
        ));
    }
    Ok(bytes)
}

/// Keeps the first `head` and the last `tail` bytes of a stream, and counts the rest: the
/// end of a log is where the error usually is, and memory stays bounded whatever comes.
#[derive(Debug)]
#[cfg_attr(not(feature = "process"), allow(dead_code))]
pub(crate) struct HeadTail {
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    dropped: u64,
}

#[cfg_attr(not(feature = "process"), allow(dead_code))]
impl HeadTail {
    pub(crate) fn new(head_cap: usize, tail_cap: usize) -> HeadTail {
        HeadTail {
            head: Vec::new(),
            tail: std::collections::VecDeque::new(),
            head_cap,
            tail_cap,
            dropped: 0,
        }
    }

    pub(crate) fn push(&mut self, mut chunk: &[u8]) {
        let room = self.head_cap - self.head.len();
        if room > 0 {
            let n = room.min(chunk.len());
            self.head.extend_from_slice(&chunk[..n]);
            chunk = &chunk[n..];
        }
        if chunk.len() >= self.tail_cap {
            self.dropped += (self.tail.len() + chunk.len() - self.tail_cap) as u64;
            self.tail.clear();
            self.tail.extend(&chunk[chunk.len() - self.tail_cap..]);
            return;
        }
        self.tail.extend(chunk);
        let over = self.tail.len().saturating_sub(self.tail_cap);
        if over > 0 {
            self.tail.drain(..over);
            self.dropped += over as u64;
        }
    }

    /// Everything kept, as text, with the count of what was cut between head and tail.
    pub(crate) fn text(&self) -> String {
        let mut out = String::from_utf8_lossy(&self.head).into_owned();
        if self.dropped > 0 {
            out.push_str(&format!("\n[... {} bytes cut ...]\n", self.dropped));
        }
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        out.push_str(&String::from_utf8_lossy(&tail));
        out
    }
}

/// Files under `dir` (relative to it), skipping what `.gitignore` and hidden-file rules
/// exclude; symlinks are not followed, so a walk never leaves the workspace.
fn walk<'a>(
    dir: &'a Path,
    stop: &'a tokio_util::sync::CancellationToken,
) -> impl Iterator<Item = PathBuf> + 'a {
    ignore::WalkBuilder::new(dir)
        .follow_links(false)
        .require_git(false)
        .build()
        // A call that timed out or was cancelled has been answered already; its walk, on
        // the blocking pool where nothing can abort it, stops here rather than go on
        // through a tree of any size.
        .take_while(|_| !stop.is_cancelled())
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_some_and(|t| t.is_file()))
        .filter_map(move |e| e.path().strip_prefix(dir).ok().map(Path::to_path_buf))
}

/// The `limit` least of the items offered, and how many others there were: a listing of a
/// directory or a tree of any size holds `limit` names, not all of them.
pub(crate) struct Smallest<T: Ord> {
    kept: std::collections::BinaryHeap<T>,
    limit: usize,
    others: usize,
}

impl<T: Ord> Smallest<T> {
    pub(crate) fn new(limit: usize) -> Smallest<T> {
        Smallest {
            kept: std::collections::BinaryHeap::new(),
            limit,
            others: 0,
        }
    }

    pub(crate) fn offer(&mut self, item: T) {
        if self.kept.len() < self.limit {
            self.kept.push(item);
            return;
        }
        self.others += 1;
        if let Some(mut greatest) = self.kept.peek_mut()
            && item < *greatest
        {
            *greatest = item;
        }
    }

    /// Whether an item would be kept, told before it is made: `less` says whether it
    /// orders before the greatest item kept. One that would not is counted with
    /// [`Smallest::pass`].
    pub(crate) fn would_keep(&self, less: impl FnOnce(&T) -> bool) -> bool {
        self.kept.len() < self.limit || self.kept.peek().is_some_and(less)
    }

    /// Counts an item that is not kept.
    pub(crate) fn pass(&mut self) {
        self.others += 1;
    }

    /// The items kept, least first, and the count of the others.
    pub(crate) fn into_sorted(self) -> (Vec<T>, usize) {
        (self.kept.into_sorted_vec(), self.others)
    }
}

/// Keeps the first third and the last two thirds of `max` characters, saying how much was
/// cut between them: the end of a log is where the error usually is.
pub(crate) fn head_tail(text: &str, max: usize) -> String {
    let total = text.chars().count();
    if total <= max {
        return text.to_owned();
    }
    let head_len = max / 3;
    let tail_len = max - head_len;
    let head: String = text.chars().take(head_len).collect();
    let tail: String = text.chars().skip(total - tail_len).collect();
    format!(
        "{head}\n[... {} characters cut ...]\n{tail}",
        total - head_len - tail_len
    )
}

#[cfg(test)]
mod tests {
    use super::head_tail;

    #[test]
    fn the_smallest_are_those_a_whole_sort_would_keep() {
        // A fixed sequence with repeats, in no order (a linear congruential walk).
        let items: Vec<u32> = (0..5_000u32)
            .scan(7u32, |x, _| {
                *x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                Some(*x % 1_000)
            })
            .collect();
        for limit in [0, 1, 10, 999, 5_000, 6_000] {
            let mut smallest = super::Smallest::new(limit);
            items.iter().for_each(|&i| smallest.offer(i));
            let mut sorted = items.clone();
            sorted.sort_unstable();
            let others = sorted.len().saturating_sub(limit);
            sorted.truncate(limit);
            assert_eq!(smallest.into_sorted(), (sorted, others), "limit {limit}");
        }
    }

    #[test]
    fn a_bounded_stream_keeps_its_head_and_tail() {
        let mut b = super::HeadTail::new(3, 4);
        for chunk in [&b"abc"[..], b"defg", b"hijklmnop", b"q"] {
            b.push(chunk);
        }
        assert_eq!(b.text(), "abc\n[... 10 bytes cut ...]\nnopq");
        let mut small = super::HeadTail::new(3, 4);
        small.push(b"ab");
        assert_eq!(small.text(), "ab");
    }

    #[test]
    fn head_tail_keeps_both_ends() {
        assert_eq!(head_tail("short", 10), "short");
        let text: String = ('a'..='z').collect();
        assert_eq!(
            head_tail(&text, 9),
            "abc\n[... 17 characters cut ...]\nuvwxyz"
        );
    }
}
