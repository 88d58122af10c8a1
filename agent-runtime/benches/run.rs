//! A 1000-turn script run end to end: script model, real gateway reading a file, sled on
//! disk, every turn committed durably before the next model call. Reports wall time and
//! CPU time per turn and the bytes stored.
//!
//! Run with `cargo bench -p agent-runtime --bench run`.
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::sync::Arc;
use std::time::Instant;

use agent_core::{Budget, TerminalReason};
use agent_providers::ScriptModel;
use agent_runtime::{CancellationToken, RunRequest, Runtime};
use agent_store::SledStore;
use agent_tools::{Gateway, Workspace};
use serde_json::json;

/// CPU time of this process (user + system), from /proc, in seconds.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    // Fields 14 and 15 of stat (utime, stime), counted after the command name.
    let ticks: f64 = fields
        .get(11..13)
        .map(|f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum())
        .unwrap_or(0.0);
    ticks / 100.0
}

fn dir_size(path: &std::path::Path) -> u64 {
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_size(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

fn main() {
    const TURNS: usize = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("notes.txt"), "line of notes\n".repeat(100)).unwrap();
    let mut turns: Vec<serde_json::Value> = (0..TURNS)
        .map(|i| {
            json!({"tool_calls": [{"id": format!("c{i}"), "name": "read_file",
                "arguments": {"path": "notes.txt", "offset": (i % 50) + 1, "limit": 20}}],
                "usage": {"input_tokens": 1200, "output_tokens": 30}})
        })
        .collect();
    turns.push(json!({"final": "done"}));
    let model = ScriptModel::from_json(&json!({ "turns": turns }).to_string()).unwrap();
    let gateway = Gateway::with_builtins(Workspace::new(&ws).unwrap()).unwrap();
    let store_dir = dir.path().join("store");
    let store = Arc::new(SledStore::open(&store_dir).unwrap());
    let runtime = Runtime::new(Arc::new(model), Arc::new(gateway), store);
    let budget = Budget {
        max_steps: TURNS as u32 + 1,
        max_tool_calls: TURNS as u32,
        ..Budget::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cpu = cpu_seconds();
    let start = Instant::now();
    let report = rt
        .block_on(runtime.start(
            RunRequest::new("bench", "read a lot", budget),
            CancellationToken::new(),
        ))
        .unwrap();
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu;
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    println!(
        "run: {TURNS} turns end to end: wall {:.2} s ({:.2} ms per turn), CPU {:.2} s ({:.2} ms per turn), {:.1} MB stored",
        wall,
        wall * 1e3 / TURNS as f64,
        cpu,
        cpu * 1e3 / TURNS as f64,
        dir_size(&store_dir) as f64 / 1e6
    );
}
