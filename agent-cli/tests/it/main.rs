//! The real `agent` binary as a child process: the bundled example, exit codes, clear
//! errors for bad input, and Ctrl-C.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

mod answers;
mod approvals;
mod chat;
mod conversation;
mod crash;
mod durable;
mod eval;
mod forks;
mod hostile;
mod postgres;
mod providers;
mod reasons;
mod report;
mod sandbox;
mod settings;
mod shared;
mod sub_agents;
mod telemetry;
mod trust;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn store(&self) -> PathBuf {
        self.dir.path().join("store")
    }
    /// The `agent` binary in this environment, with no store named.
    fn bare(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agent"));
        // Tests never reach a real provider, whatever the environment holds.
        cmd.env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("AGENT_STORE")
            // Commands run in PID namespaces of their own unless a test says otherwise.
            .env_remove("AGENT_LOOP_PID_NAMESPACE")
            // Trust decisions go to the test's own config directory, never the user's.
            .env("AGENT_CONFIG_DIR", self.dir.path().join("config"));
        cmd.current_dir(self.dir.path());
        cmd
    }
    fn cmd(&self) -> Command {
        let mut cmd = self.bare();
        cmd.arg("--store").arg(self.store());
        cmd
    }
    fn script(&self, turns: Value) -> String {
        let path = self.dir.path().join("script.json");
        std::fs::write(&path, json!({ "turns": turns }).to_string()).unwrap();
        format!("script:{}", path.display())
    }
    fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }
}

/// A minimal MCP server over stdio (JSON-RPC lines), in Python, for the tests that need a
/// server the `agent` binary starts itself: `env` prints one of its environment variables,
/// `run` runs a command line with `bash -c` and answers with what it printed, `die` kills
/// the server in the middle of the call, and `slow` writes its pid to
/// `server.pid`, then a line to `effects.txt` a minute later; `env` of `NSpid` prints that
/// line of its `/proc/self/status`. The pids written are those of
/// the server's PID namespace, whose `/proc` it sees.
const PY_MCP_SERVER: &str = r#"
import json, os, subprocess, sys, time
if os.environ.get("LEAVE_A_DAEMON"):
    # A process that leaves the server's process group, as a daemon does: it writes its
    # pid, and would write to effects.txt a minute later. The server serves once it has.
    daemon = subprocess.Popen(
        ["sh", "-c", "read -r pid _ </proc/self/stat; echo $pid > daemon.pid; echo ready; exec >/dev/null; sleep 60; "
                     "echo late >> effects.txt"],
        start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL)
    daemon.stdout.readline()
    daemon.stdout.close()
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, mid = msg.get("method"), msg["id"]
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"],
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "py", "version": "1"}}
    elif method == "tools/list":
        read_only = {"readOnlyHint": True}
        result = {"tools": [
            {"name": "env", "description": "prints a variable", "annotations": read_only,
             "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}}},
            {"name": "run", "description": "runs a command", "annotations": read_only,
             "inputSchema": {"type": "object", "properties": {"command": {"type": "string"}}}},
            {"name": "die", "description": "exits", "annotations": read_only,
             "inputSchema": {"type": "object"}},
            {"name": "slow", "description": "writes its pid, then a line a minute later",
             "annotations": {"destructiveHint": True}, "inputSchema": {"type": "object"}}]}
    elif method == "tools/call" and msg["params"]["name"] == "die":
        os._exit(3)
    elif method == "tools/call" and msg["params"]["name"] == "run":
        done = subprocess.run(["bash", "-c", msg["params"]["arguments"]["command"]],
                              capture_output=True, text=True)
        result = {"content": [{"type": "text", "text": done.stdout + done.stderr}]}
    elif method == "tools/call" and msg["params"]["name"] == "slow":
        with open("server.pid", "w") as f:
            f.write(os.readlink("/proc/self") + "\n")
        time.sleep(60)
        with open("effects.txt", "a") as f:
            f.write("late\n")
        result = {"content": [{"type": "text", "text": "done"}]}
    elif method == "tools/call":
        name = msg["params"]["arguments"]["name"]
        text = name + "=" + os.environ.get(name, "")
        if name == "NSpid":
            # The server's pid in each PID namespace it is in, the outermost first.
            with open("/proc/self/status") as f:
                text = next(l for l in f if l.startswith("NSpid:")).strip()
        result = {"content": [{"type": "text", "text": text}]}
    else:
        result = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}) + "\n")
    sys.stdout.flush()
"#;

/// Writes [`PY_MCP_SERVER`] as `server.py` and an `mcp.json` that starts it as the server
/// `name`; returns the configuration's file name, for `--mcp-config`.
fn py_mcp_config(env: &Env, name: &str) -> &'static str {
    py_mcp_config_sandboxed(env, name, Value::Bool(false))
}

/// [`py_mcp_config`], the server's entry saying `"sandbox": sandbox`.
fn py_mcp_config_sandboxed(env: &Env, name: &str, sandbox: Value) -> &'static str {
    std::fs::write(env.dir.path().join("server.py"), PY_MCP_SERVER).unwrap();
    let config = json!({"mcpServers": {name: {
        "command": "python3", "args": ["server.py"], "sandbox": sandbox
    }}});
    std::fs::write(env.dir.path().join("mcp.json"), config.to_string()).unwrap();
    "mcp.json"
}

/// `agent run --json` of `model` with the MCP servers of `config`, to run.
fn mcp_run(env: &Env, config: &str, model: &str) -> Command {
    let mut cmd = env.cmd();
    cmd.args([
        "run",
        "--json",
        "--mcp-config",
        config,
        "--model",
        model,
        "go",
    ]);
    cmd
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Reads lines from `reader` until one that contains `needle`; the lines read, each with
/// its line break. Panics if the output ends first.
fn lines_until(reader: &mut impl BufRead, needle: &str) -> Vec<String> {
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "the output ended before {needle:?}: {lines:?}"
        );
        let found = line.contains(needle);
        lines.push(line);
        if found {
            return lines;
        }
    }
}

/// `agent show --follow RUN` (with `extra` options) of the store `store` names, its
/// output piped.
fn follower(env: &Env, store: &str, id: &str, extra: &[&str]) -> std::process::Child {
    env.bare()
        .args(["--store", store, "show", "--follow", id])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Asserts that `events` (as `agent show --json` prints them) are versions 1, 2, … n:
/// no event lost, repeated or out of order.
/// The types of the events of run `id`, in order, as `agent show --json` gives them.
/// `agent run --json --sub-agents --allow delegate` of `script` (turns and the agents'
/// scripts by goal, written beside the store) with `goal`: what it printed, and the
/// `--model` value of the script.
fn run_with_sub_agents(env: &Env, script: &Value, goal: &str) -> (Output, String) {
    let path = env.dir.path().join("parent.json");
    std::fs::write(&path, script.to_string()).unwrap();
    let model = format!("script:{}", path.display());
    let out = env.run(&[
        "run",
        "--json",
        "--sub-agents",
        "--allow",
        "delegate",
        "--model",
        &model,
        goal,
    ]);
    (out, model)
}

/// `agent resume ARGS` (a message to a live run), once it said it handed the message over:
/// the process, and what it says from then on.
fn handed(
    env: &Env,
    args: &[&str],
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStderr>,
) {
    let mut told = env
        .cmd()
        .arg("resume")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = std::io::BufReader::new(told.stderr.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut said, &mut line).unwrap();
    assert!(line.contains("has your message"), "{line}");
    (told, said)
}

/// The id of the first run `agent runs` lists, once `done` holds of it (`what`, said if
/// that never comes within a minute).
fn first_run_once(env: &Env, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        let out = env.run(&["runs", "--json"]);
        let runs: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if let Some(id) = runs[0]["run_id"].as_str()
            && done(id)
        {
            return id.to_owned();
        }
        std::thread::yield_now();
    }
}

fn event_types(env: &Env, id: &str) -> Vec<String> {
    let shown: Value = serde_json::from_slice(&env.run(&["show", "--json", id]).stdout).unwrap();
    shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

fn assert_contiguous(events: &[Value], what: &str) {
    for (n, e) in events.iter().enumerate() {
        assert_eq!(e["version"].as_u64(), Some(n as u64 + 1), "{what}: {e}");
    }
}

fn example(env: &Env, extra: &[&str]) -> Output {
    let root = repo();
    let script = format!(
        "script:{}",
        root.join("examples/meeting/script.json").display()
    );
    let ws = root.join("examples/meeting/workspace");
    let mut args = vec![
        "run",
        "--model",
        &script,
        "--workspace",
        ws.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    args.push("When and where is the launch meeting?");
    env.run(&args)
}

#[test]
fn the_bundled_example_completes_and_shows_its_timeline() {
    let env = Env::new();
    let out = example(&env, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("Thursday 12 November at 10:00"));
    assert!(stderr(&out).contains("finished (completed)"));

    let runs = env.run(&["runs", "--json"]);
    let runs: Value = serde_json::from_slice(&runs.stdout).unwrap();
    assert_eq!(runs[0]["status"], "finished");
    assert_eq!(runs[0]["steps"], 3);
    let id = runs[0]["run_id"].as_str().unwrap().to_owned();

    let show = env.run(&["show", &id]);
    assert_eq!(show.status.code(), Some(0));
    let text = stdout(&show);
    let names: Vec<&str> = text
        .lines()
        .map(|l| l.split_whitespace().nth(2).unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "run_started",
            "decision_proposed",
            "tool_finished",
            "decision_proposed",
            "tool_finished",
            "tool_finished",
            "decision_proposed",
            "run_ended"
        ]
    );
    let table = stdout(&env.run(&["runs"]));
    assert!(
        table.contains(&id) && table.contains("completed"),
        "{table}"
    );
}

#[test]
fn json_prints_the_contract_object() {
    let env = Env::new();
    let out = example(&env, &["--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "finished");
    assert_eq!(v["reason"], "completed");
    assert_eq!(v["steps"], 3);
    assert_eq!(v["tool_calls"], 3);
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 1629, "output_tokens": 103, "cache_read_tokens": 0,
               "cache_write_tokens": 0, "reasoning_tokens": 0, "cost_usd": 0.0})
    );
    assert_eq!(v["pending"], json!([]));
    assert!(v["answer"].as_str().unwrap().contains("Aurora"));
    assert_eq!(v["run_id"].as_str().unwrap().len(), 26, "a ULID");
}

#[test]
fn events_stream_each_committed_event_as_a_json_line() {
    let env = Env::new();
    let out = example(&env, &["--events", "--json"]);
    let text = stdout(&out);
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 9, "8 events then the outcome");
    let versions: Vec<u64> = lines[..8]
        .iter()
        .map(|l| l["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, (1..=8).collect::<Vec<_>>());
    assert_eq!(lines[7]["type"], "run_ended");
    assert_eq!(lines[8]["reason"], "completed");
    let show: Value = serde_json::from_slice(
        &env.run(&["show", "--json", lines[8]["run_id"].as_str().unwrap()])
            .stdout,
    )
    .unwrap();
    assert_eq!(show["events"].as_array().unwrap().len(), 8);
}

#[test]
fn exit_codes_follow_the_reason_class() {
    let cases = [
        (
            json!([{"clarification": "which file?"}]),
            3,
            "clarification_required",
        ),
        (
            json!([{"request_approval": {"summary": "delete the cache?"}}]),
            3,
            "approval_required",
        ),
        (
            json!([{"cannot_continue": "no access"}]),
            5,
            "cannot_continue",
        ),
        (json!([{"error": "upstream 503"}]), 5, "model_error"),
        (
            json!([{"invalid": "?"}, {"invalid": "?"}, {"invalid": "?"}]),
            5,
            "invalid_decision",
        ),
        (json!([]), 5, "model_error"),
    ];
    for (turns, code, reason) in cases {
        let env = Env::new();
        let model = env.script(turns);
        let out = env.run(&["run", "--json", "--model", &model, "goal"]);
        assert_eq!(out.status.code(), Some(code), "{reason}: {}", stderr(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["reason"], reason);
        assert_eq!(v["answer"], Value::Null);
    }
}

#[test]
fn budgets_from_flags_stop_with_exit_4() {
    let env = Env::new();
    let call = json!({"tool_calls": [{"id": "c1", "name": "list_dir", "arguments": {}}]});
    let other =
        json!({"tool_calls": [{"id": "c2", "name": "list_dir", "arguments": {"path": "."}}]});
    let model = env.script(json!([call, other, {"final": "x"}]));
    let out = env.run(&["run", "--json", "--model", &model, "--max-steps", "2", "g"]);
    assert_eq!(out.status.code(), Some(4));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["reason"].as_str(), v["steps"].as_u64()),
        (Some("max_steps"), Some(2))
    );

    let out = env.run(&[
        "run",
        "--json",
        "--model",
        &model,
        "--max-tool-calls",
        "1",
        "g",
    ]);
    assert_eq!(out.status.code(), Some(4));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["reason"], "tool_budget_exhausted");
    assert_eq!(v["tool_calls"], 1);
}

/// `agent ARGS` in `env` with `input` on its standard input.
fn with_input(env: &Env, args: &[&str], input: &[u8]) -> Output {
    use std::io::Write as _;
    let mut child = env
        .cmd()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // A command that refuses early may not read it all.
    let _ = stdin.write_all(input);
    drop(stdin);
    child.wait_with_output().unwrap()
}

/// `-` as the goal (or a message) reads it from standard input: a task longer than a
/// command line takes, or written by another program. Past 1 MiB, or not UTF-8, it is a
/// one-line error and nothing is written.
#[test]
fn a_goal_or_message_of_a_dash_is_read_from_standard_input() {
    let env = Env::new();
    let model = env.script(json!([{"final": "one"}, {"final": "two"}]));
    let task = format!(
        "Summarize the notes.\n\n{}\n",
        "A line of the spec. ".repeat(8_000)
    );
    assert!(task.len() > 128 * 1024, "longer than one argument may be");
    let out = with_input(
        &env,
        &["run", "--json", "--model", &model, "-"],
        task.as_bytes(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let shown: Value = serde_json::from_slice(&env.run(&["show", "--json", &id]).stdout).unwrap();
    let goal = shown["events"][0]["goal"].as_str().unwrap_or_default();
    assert!(
        goal == task,
        "the goal is what came in, whole: {:?}",
        goal.get(..80)
    );
    let out = with_input(
        &env,
        &["resume", "--json", &id, "-"],
        "and then?\n".as_bytes(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let shown: Value = serde_json::from_slice(&env.run(&["show", "--json", &id]).stdout).unwrap();
    let said = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "user_message")
        .unwrap();
    assert_eq!(said["text"], "and then?\n");

    let other = Env::new();
    for (input, problem) in [
        (vec![b'x'; (1 << 20) + 1], "longer than 1 MiB"),
        (b"caf\xe9".to_vec(), "is not UTF-8 text (byte 3)"),
        (b" \n".to_vec(), "the goal is empty"),
    ] {
        let out = with_input(&other, &["run", "--model", &model, "-"], &input);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(problem), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(!other.store().exists(), "nothing written: {err}");
    }
}

#[test]
fn bad_input_is_one_line_exit_2_and_writes_nothing() {
    let env = Env::new();
    std::fs::write(
        env.dir.path().join("broken.json"),
        "{\"turns\": [{\"finl\": 1}]}",
    )
    .unwrap();
    let broken = format!("script:{}", env.dir.path().join("broken.json").display());
    let good = env.script(json!([{"final": "x"}]));
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["run", "--model", "script:/no/such/file.json", "g"],
            "cannot read it",
        ),
        (
            vec!["run", "--model", &broken, "g"],
            "turn 1: unknown field `finl`",
        ),
        (vec!["run", "--model", "gpt-4", "g"], "PROVIDER:MODEL"),
        (
            vec!["run", "--model", "openai:gpt-4o", "g"],
            "OPENAI_API_KEY is not set",
        ),
        (
            vec!["run", "--model", &good, "--workspace", "/no/such/dir", "g"],
            "--workspace /no/such/dir",
        ),
        (
            vec!["run", "--model", &good, "--max-steps", "0", "g"],
            "--max-steps",
        ),
        (
            vec!["run", "--model", &good, "--timeout=0", "g"],
            "--timeout",
        ),
        (vec!["run", "--model", &good, "  "], "goal is empty"),
        (vec!["show", "nope"], "no store at"),
    ];
    for (args, expected) in cases {
        let out = env.run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.starts_with("agent: ") && err.contains(expected),
            "{args:?}: {err}"
        );
        assert!(!env.store().exists(), "{args:?} wrote the store");
    }
    // Missing arguments are clap's usage errors, also exit 2.
    assert_eq!(env.run(&["run", "g"]).status.code(), Some(2));
    assert_eq!(env.run(&["frobnicate"]).status.code(), Some(2));
}

#[test]
fn a_directory_that_is_not_a_store_is_refused() {
    let env = Env::new();
    std::fs::create_dir(env.store()).unwrap();
    std::fs::write(env.store().join("mine.txt"), "keep").unwrap();
    let model = env.script(json!([{"final": "x"}]));
    let out = env.run(&["run", "--model", &model, "g"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is not an agent store"),
        "{}",
        stderr(&out)
    );
    let out = env.run(&["show", "r"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(std::fs::read_dir(env.store()).unwrap().count(), 1);

    // A file, or a path through one, is no store either, and is left as it was.
    let file = env.store().join("mine.txt");
    for (store, said) in [
        (file.clone(), "mine.txt is a file, not an agent store"),
        (file.join("sub"), "sub cannot be an agent store: "),
    ] {
        let out = env.run(&[
            "run",
            "--model",
            &model,
            "--store",
            store.to_str().unwrap(),
            "g",
        ]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(said), "{err}");
        assert!(
            err.trim_end().ends_with("choose another --store directory"),
            "{err}"
        );
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
}

#[test]
fn unknown_runs_and_empty_stores_are_reported_plainly() {
    let env = Env::new();
    let out = env.run(&["runs"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("no runs yet"));
    assert_eq!(stdout(&env.run(&["runs", "--json"])).trim(), "[]");
    let model = env.script(json!([{"final": "x"}]));
    env.run(&["run", "--model", &model, "g"]);
    let out = env.run(&["show", "01NOTARUN"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no run \"01NOTARUN\""));
}

#[test]
fn resume_of_a_finished_run_reports_it_again() {
    let env = Env::new();
    let model = env.script(json!([{"final": "done"}]));
    let out = env.run(&["run", "--json", "--model", &model, "g"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = v["run_id"].as_str().unwrap();
    let again = env.run(&["resume", "--json", id]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    let w: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(
        (w["reason"].as_str(), w["answer"].as_str()),
        (Some("completed"), Some("done"))
    );
}

#[cfg(unix)]
#[test]
fn ctrl_c_cancels_the_run_with_exit_130() {
    let env = Env::new();
    let model = env.script(json!([{"final": "never", "delay_ms": 600000}]));
    let mut child = env
        .cmd()
        .args(["run", "--events", "--model", &model, "g"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The run exists once its first event is printed; then interrupt it.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["type"], "run_started");
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    let last: Value = serde_json::from_str(rest.last().unwrap()).unwrap();
    assert_eq!(last["type"], "run_ended");
    assert_eq!(last["outcome"]["reason"], "cancelled");
}

fn write_script(env: &Env) -> String {
    env.script(json!([
        {"tool_calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "out/result.txt", "content": "42\n"}}]},
        {"final": "written"}
    ]))
}

#[test]
fn context_prints_the_exact_next_prompt() {
    let env = Env::new();
    let out = example(&env, &["--json"]);
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let ctx = env.run(&["context", "--json", &id]);
    assert_eq!(ctx.status.code(), Some(0), "{}", stderr(&ctx));
    let v: Value = serde_json::from_slice(&ctx.stdout).unwrap();
    let messages = v["messages"].as_array().unwrap();
    assert_eq!(
        messages[0]["parts"][0]["text"],
        "When and where is the launch meeting?"
    );
    assert_eq!(
        messages.len(),
        6,
        "goal, 2 assistant+results pairs, final answer"
    );
    assert!(v["estimated_tokens"].as_u64().unwrap() > 100);
    assert_eq!(v["context_window"], 128_000);
    let tools: Vec<&str> = v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        tools.contains(&"read_file") && tools.contains(&"read_result"),
        "{tools:?}"
    );
    let text = stdout(&env.run(&["context", &id]));
    assert!(text.starts_with("=== system\n"), "{text}");
    assert!(text.contains("[tool result call_2, ok]"), "{text}");
    assert!(text.contains("tokens of a 128000-token context window"));
    std::fs::write(
        env.dir.path().join("agent.toml"),
        "context_window = 32000\n",
    )
    .unwrap();
    let v: Value = serde_json::from_slice(&env.run(&["context", "--json", &id]).stdout).unwrap();
    assert_eq!(v["context_window"], 32_000);
}
