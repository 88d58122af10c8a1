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
        &Typed(Shell),
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
