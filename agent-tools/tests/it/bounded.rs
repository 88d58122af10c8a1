//! Reads that cannot block, balloon or stop early: pipes, huge files, bad encodings.

use agent_core::ErrorKind;
use agent_tools::Typed;
use agent_tools::builtin::{Grep, ReadFile, Shell};
use serde_json::json;

use crate::builtins::call;

#[tokio::test]
async fn a_fifo_is_refused_at_once_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let err = call(&Typed(ReadFile), dir.path(), json!({"path": "pipe"}))
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::ExecutionFailed);
    assert!(
        err.message.contains("not a regular file"),
        "{}",
        err.message
    );
    // grep walks past it too.
    std::fs::write(dir.path().join("a.txt"), "needle\n").unwrap();
    let out = call(&Typed(Grep), dir.path(), json!({"pattern": "needle"}))
        .await
        .unwrap();
    assert_eq!(out, "a.txt:1: needle");
}

#[test]
fn opening_a_fifo_never_waits_for_a_writer() {
    // What a tool opens is checked after the open (a path may be swapped for a FIFO once
    // it was resolved), so the open itself must not wait for a writer that never comes.
    let dir = tempfile::tempdir().unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(dir.path().join("pipe"))
        .status()
        .unwrap();
    assert!(made.success());
    let ws = agent_tools::Workspace::new(dir.path()).unwrap();
    let resolved = ws.resolve_existing("pipe").unwrap();
    assert_eq!(resolved.seen(), Some(agent_tools::Seen::Other));
    let (done, opened) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let file = ws
            .open(&resolved)
            .map(|f| f.metadata().unwrap().file_type());
        let _ = done.send(file.map_err(|e| e.to_string()));
    });
    // A guard against a hang, not a timing assertion: an open that waits never returns.
    let opened = opened
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("opening the FIFO waited for a writer");
    use std::os::unix::fs::FileTypeExt;
    assert!(opened.unwrap().is_fifo());
}

#[tokio::test]
async fn a_small_local_file_is_read_at_once_without_the_blocking_pool() {
    use futures::FutureExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("small.txt"), "one\ntwo\n").unwrap();
    let big: String = (0..10_000).map(|i| format!("line {i}\n")).collect();
    assert!(big.len() as u64 > agent_tools::INLINE_READ_BYTES);
    std::fs::write(dir.path().join("big.txt"), &big).unwrap();
    let ws = agent_tools::Workspace::new(dir.path()).unwrap();
    assert!(
        ws.is_local(),
        "the test's temporary directory should be on a local file system"
    );
    let tool = Typed(ReadFile);
    // Read on the caller's thread: done at the first poll, no hand-off to the pool.
    let small = call(&tool, dir.path(), json!({"path": "small.txt"}))
        .now_or_never()
        .expect("a small local file is read without waiting for the blocking pool");
    assert_eq!(small.unwrap(), "     1\tone\n     2\ttwo\n");
    // A big one goes to the pool (`Workspace::reads_inline`, tested with the workspace;
    // whether its first poll finds it done is a race with the pool's thread) and reads
    // the same.
    let lines = call(&tool, dir.path(), json!({"path": "big.txt", "limit": 2}))
        .await
        .unwrap();
    assert!(
        lines.starts_with("     1\tline 0\n     2\tline 1\n"),
        "{lines}"
    );
}

#[tokio::test]
async fn grep_reads_past_a_line_that_is_not_utf8() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = b"first needle\n".to_vec();
    bytes.extend_from_slice(b"bad \xff\xfe bytes\n");
    bytes.extend_from_slice(b"third needle\n");
    std::fs::write(dir.path().join("mixed.txt"), bytes).unwrap();
    let out = call(&Typed(Grep), dir.path(), json!({"pattern": "needle|bad"}))
        .await
        .unwrap();
    assert_eq!(
        out,
        "mixed.txt:1: first needle\nmixed.txt:2: bad \u{fffd}\u{fffd} bytes\nmixed.txt:3: third needle"
    );
}

#[tokio::test]
async fn a_huge_file_is_read_to_the_cap_only() {
    let dir = tempfile::tempdir().unwrap();
    // 3 GB, sparse: a header of text lines, then zeros the reader never reaches.
    let path = dir.path().join("huge.log");
    let file = std::fs::File::create(&path).unwrap();
    use std::io::Write;
    let mut w = std::io::BufWriter::new(&file);
    for i in 0..10_000 {
        writeln!(w, "line {i} of a log that goes on and on").unwrap();
    }
    w.flush().unwrap();
    drop(w);
    file.set_len(3 << 30).unwrap();
    let out = call(&Typed(ReadFile), dir.path(), json!({"path": "huge.log"}))
        .await
        .unwrap();
    assert!(out.len() <= 50_000, "{}", out.len());
    assert!(
        out.contains("of a file of 3221225472 bytes; call again with offset"),
        "{}",
        &out[out.len() - 200..]
    );
}

#[tokio::test]
async fn shell_output_keeps_its_ends_and_counts_the_middle() {
    let dir = tempfile::tempdir().unwrap();
    let out = call(
        &Typed(Shell::default()),
        dir.path(),
        json!({"command": "echo BEGIN; head -c 5000000 /dev/zero | tr '\\0' x; echo; echo END"}),
    )
    .await
    .unwrap();
    assert!(
        out.contains("BEGIN") && out.trim_end().ends_with("END"),
        "{}",
        out.len()
    );
    assert!(
        out.contains("[... 4973011 bytes cut ...]"),
        "the middle is counted"
    );
    assert!(out.len() < 40_000, "{}", out.len());
}
