//! Queued runs drained by 1, 4 and 16 `agent worker` processes on one PostgreSQL (a
//! throwaway cluster the bench starts, fsync on, on the machine's disk): durable turns per
//! second, and the wall time per run.
//!
//! Each run is 10 one-call `read_file` turns of a script model, then a final answer; every
//! turn is committed through the worker's fenced store before the next model call.
//!
//! Next to it, the same runs on one directory store shared by 1, 4 and 16 lanes of `agent
//! run` processes started one after another (a process per run, so process start is
//! included).
//!
//! Run with `cargo bench -p agent-cli --bench workers`.
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::process::{Command, Stdio};
use std::time::Instant;

use agent_cli::settings::RuleTexts;
use agent_cli::worker::RunSpec;
use agent_store::PostgresStore;
use agent_store::testing::Cluster;
use serde_json::json;

const RUNS: usize = 64;
const TURNS: usize = 10;

fn main() {
    let cluster = Cluster::start_durable();
    let url = cluster.url();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("a.txt"), "a line\n".repeat(30)).unwrap();
    let turns: Vec<_> = (0..TURNS)
        .map(|t| {
            json!({"tool_calls": [{"id": format!("c{t}"), "name": "read_file",
                "arguments": {"path": "a.txt", "offset": t + 1}}]})
        })
        .chain(std::iter::once(json!({"final": "read"})))
        .collect();
    let script = dir.path().join("script.json");
    std::fs::write(&script, json!({ "turns": turns }).to_string()).unwrap();
    let spec = RunSpec {
        goal: "read".into(),
        model: format!("script:{}", script.display()),
        base_url: None,
        workspace: ws,
        rules: RuleTexts::default(),
        mcp_config: None,
        mcp_sha256: None,
        budget: agent_core::Budget::default(),
        context_window: None,
        compact_at: None,
        masking: Default::default(),
        answer: Default::default(),
        sub_agents: false,
        shell_env: Vec::new(),
        sandbox: None,
        calls: Default::default(),
    };
    let spec = serde_json::to_string(&spec).unwrap();
    shared_directory(dir.path(), &script);
    let store = PostgresStore::connect(&url).unwrap();
    for workers in [1, 4, 16] {
        for r in 0..RUNS {
            store.submit(&format!("w{workers}-{r:03}"), &spec).unwrap();
        }
        let start = Instant::now();
        let children: Vec<_> = (0..workers)
            .map(|_| {
                Command::new(env!("CARGO_BIN_EXE_agent"))
                    .arg("--store")
                    .arg(&url)
                    .args(["worker", "--until-empty"])
                    .env_remove("AGENT_STORE")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for mut child in children {
            assert!(child.wait().unwrap().success());
        }
        let elapsed = start.elapsed().as_secs_f64();
        let turns = (RUNS * (TURNS + 1)) as f64;
        println!(
            "workers: {workers:>2} worker processes, {RUNS} runs x {} turns: {:.0} durable turns/s, \
             {:.1} ms a run ({elapsed:.2} s)",
            TURNS + 1,
            turns / elapsed,
            elapsed * 1000.0 / RUNS as f64 * workers as f64
        );
    }
}

/// The same runs through `agent run` on one directory store, `lanes` processes at a time.
fn shared_directory(dir: &std::path::Path, script: &std::path::Path) {
    let ws = dir.join("ws");
    let model = format!("script:{}", script.display());
    for lanes in [1, 4, 16] {
        let store = dir.join(format!("store-{lanes}"));
        let start = Instant::now();
        let threads: Vec<_> = (0..lanes)
            .map(|_| {
                let (store, ws, model) = (store.clone(), ws.clone(), model.clone());
                std::thread::spawn(move || {
                    for _ in 0..RUNS / lanes {
                        let status = Command::new(env!("CARGO_BIN_EXE_agent"))
                            .arg("--store")
                            .arg(&store)
                            .arg("run")
                            .arg("--workspace")
                            .arg(&ws)
                            .args(["--model", &model, "read"])
                            .env_remove("AGENT_STORE")
                            .stdout(Stdio::null())
                            .stderr(Stdio::null())
                            .status()
                            .unwrap();
                        assert!(status.success());
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let elapsed = start.elapsed().as_secs_f64();
        let turns = (RUNS * (TURNS + 1)) as f64;
        println!(
            "directory: {lanes:>2} processes at a time, {RUNS} runs x {} turns: {:.0} durable \
             turns/s, {:.1} ms a run ({elapsed:.2} s)",
            TURNS + 1,
            turns / elapsed,
            elapsed * 1000.0 / RUNS as f64 * lanes as f64
        );
    }
}
