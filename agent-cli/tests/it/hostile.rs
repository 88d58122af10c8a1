//! Hostile and broken input from the command line: numbers that make no sense, usage that
//! overflows, readers that go away. No panic (exit 101), one-line errors, exit 2.
#![allow(clippy::print_stderr)]

use std::process::Stdio;

use serde_json::{Value, json};

use crate::{Env, stderr};

#[test]
fn nonsense_numbers_in_agent_toml_are_named_in_one_line() {
    let env = Env::new();
    let model = env.script(json!([{"final": "ok"}]));
    for (setting, key) in [
        ("max_tokens = 0", "max_tokens"),
        ("max_steps = 0", "max_steps"),
        ("compact_at = -1.0", "compact_at"),
        ("compact_at = nan", "compact_at"),
        ("timeout = inf", "timeout"),
        ("timeout = 1e30", "timeout"),
        ("context_window = 3", "context_window"),
        ("max_cost_usd = -2.0", "max_cost_usd"),
        ("[retry]\nmax_attempts = 0", "max_attempts"),
        ("thinking = 5", "thinking"),
        ("thinking = \"lots\"", "thinking"),
        ("thinking = -3", "thinking"),
        ("effort = \"extreme\"", "effort"),
        ("max_output_tokens = 0", "max_output_tokens"),
        (
            "[prices.\"m\"]\ninput = 1.0\noutput = 1.0\ncache_write = -1.0",
            "cache_write",
        ),
        (
            "[prices.\"m\"]\ninput = 1.0\noutput = 1.0\ncache_read = nan",
            "cache_read",
        ),
        (
            "[[hooks.pre_tool_use]]\ncommand = \"true\"\ntimeout_secs = 1e30",
            "timeout_secs",
        ),
        (
            "[[hooks.pre_tool_use]]\ncommand = \"true\"\nmatcher = \"(unclosed\"",
            "matcher",
        ),
    ] {
        std::fs::write(
            env.dir.path().join("agent.toml"),
            format!("model = {model:?}\n{setting}\n"),
        )
        .unwrap();
        let out = env.run(&["run", "g"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{setting}: {err}");
        assert!(err.contains(key), "{setting}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{setting}: {err}");
        assert!(!env.store().exists(), "{setting}: nothing is written");
    }
    // The flag alone: the last file above would be refused first.
    std::fs::remove_file(env.dir.path().join("agent.toml")).unwrap();
    let out = env.run(&["run", "--timeout", "1e300", "--model", &model, "g"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // The number as it was written, not its 301 digits.
    assert!(
        stderr(&out).starts_with("agent: --timeout = 1e300: give a number of seconds"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn usage_that_overflows_leaves_a_run_that_can_be_read_resumed_and_ended() {
    let env = Env::new();
    let huge = json!({"input_tokens": u64::MAX, "output_tokens": u64::MAX});
    let model = env.script(json!([
        {"tool_calls": [{"id": "c1", "name": "list_dir", "arguments": {}}], "usage": huge},
        {"tool_calls": [{"id": "c2", "name": "list_dir", "arguments": {}}], "usage": huge},
        {"request_approval": {"summary": "may I?"}, "usage": huge},
    ]));
    let out = env.run(&["run", "--json", "--model", &model, "g"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["usage"]["input_tokens"],
        u64::MAX,
        "saturated, not wrapped"
    );
    let id = v["run_id"].as_str().unwrap().to_owned();
    for args in [
        vec!["context", &id],
        vec!["show", &id],
        vec!["runs"],
        vec!["resume", "--json", &id],
    ] {
        let out = env.run(&args);
        assert_ne!(out.status.code(), Some(101), "{args:?}: {}", stderr(&out));
        assert!(out.status.code().is_some());
    }
    let out = env.run(&["cancel", &id]);
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
}

#[test]
fn a_reader_that_goes_away_is_not_a_panic() {
    let env = Env::new();
    let model = env.script(json!([
        {"tool_calls": [{"id": "c1", "name": "list_dir", "arguments": {}}]},
        {"final": "done"}
    ]));
    let out = env.run(&["run", "--json", "--model", &model, "g"]);
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    for args in [
        vec!["context", &id],
        vec!["show", &id],
        vec!["show", "--json", &id],
    ] {
        // The reader closes its end before the command writes a byte.
        let mut child = env
            .cmd()
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).is_empty(), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn arguments_nested_too_deep_are_refused_and_the_log_stays_readable() {
    let env = Env::new();
    let deep: Value =
        serde_json::from_str(&format!("{}{}", "[".repeat(100), "]".repeat(100))).unwrap();
    let model = env.script(json!([
        {"tool_calls": [{"id": "c1", "name": "list_dir", "arguments": {"path": deep}}]},
        {"final": "flattened"}
    ]));
    let out = env.run(&["run", "--json", "--model", &model, "g"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let show = env.run(&["show", "--json", &id]);
    assert_eq!(show.status.code(), Some(0), "{}", stderr(&show));
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains("levels deep; at most 32"), "{text}");
    let resumed = env.run(&["resume", "--json", &id]);
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
}

#[test]
fn a_damaged_run_is_an_error_naming_it_and_the_other_runs_are_unharmed() {
    let env = Env::new();
    let model = env.script(json!([{"final": "ok"}]));
    let mut ids = Vec::new();
    for _ in 0..3 {
        let out = env.run(&["run", "--json", "--model", &model, "g"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        ids.push(
            serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let damaged = env.store().join("runs").join(&ids[1]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(damaged.join("db"))
        .unwrap()
        .set_len(100)
        .unwrap();
    for args in [vec!["show", &ids[1]], vec!["resume", &ids[1]]] {
        let out = env.run(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(5), "{args:?}: {err}");
        assert!(
            err.contains("damaged") && err.contains(damaged.to_str().unwrap()),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    // Each run has a database of its own: the others are read and listed as ever.
    for id in [&ids[0], &ids[2]] {
        let out = env.run(&["show", id]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let runs: Value = serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 3, "{runs}");
}

#[test]
fn a_run_waiting_for_an_answer_can_be_cancelled() {
    let env = Env::new();
    let model = env.script(json!([{"clarification": "which meeting?"}]));
    let out = env.run(&["run", "--json", "--model", &model, "g"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let cancelled = env.run(&["cancel", "--json", &id]);
    assert_eq!(cancelled.status.code(), Some(130), "{}", stderr(&cancelled));
    let runs: Value = serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
    assert_eq!(runs[0]["reason"], "cancelled");
    let again = env.run(&["cancel", &id]);
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
}

/// Peak resident memory of `agent ARGS`, in KiB, as the kernel accounts it to a waiting
/// parent (a small Python wrapper, so no other test's processes count).
fn peak_rss_kib(env: &Env, args: &[&str]) -> (Option<i32>, u64) {
    let script = "import resource, subprocess, sys\n\
                  r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n\
                  print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n\
                  sys.exit(r.returncode)";
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_agent"))
        .arg("--store")
        .arg(env.store())
        .args(args)
        .current_dir(env.dir.path())
        .env("AGENT_CONFIG_DIR", env.dir.path().join("config"))
        .output()
        .unwrap();
    let kib = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    (out.status.code(), kib)
}

/// The suite streams 256 MB of shell output (the unbounded code held it whole: about three
/// times that resident); `AGENT_MEM_SHELL_MB=1024` measures the 1 GB of BENCHMARKS.md.
#[test]
fn a_3_gb_file_and_a_flood_of_shell_output_cost_under_64_mb() {
    let shell_mb: u64 = std::env::var("AGENT_MEM_SHELL_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let env = Env::new();
    let huge = env.dir.path().join("huge.log");
    std::fs::write(&huge, "the first line\n".repeat(1_000)).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&huge)
        .unwrap()
        .set_len(3 << 30)
        .unwrap();
    let model = env.script(json!([
        {"tool_calls": [{"id": "r1", "name": "read_file", "arguments": {"path": "huge.log"}}]},
        {"tool_calls": [{"id": "s1", "name": "shell", "arguments":
            {"command": format!("head -c {} /dev/zero | tr '\\0' x", shell_mb << 20)}}]},
        {"final": "read"}
    ]));
    let (code, kib) = peak_rss_kib(&env, &["run", "--allow", "shell", "--model", &model, "g"]);
    assert_eq!(code, Some(0));
    assert!(kib < 64 * 1024, "peak resident memory {kib} KiB");
    // Against the same binary doing nothing much: the reads themselves cost little.
    let idle = env.script(json!([{"final": "nothing read"}]));
    let (_, base) = peak_rss_kib(&env, &["run", "--model", &idle, "g"]);
    assert!(
        kib.saturating_sub(base) < 16 * 1024,
        "{kib} KiB against {base} KiB for a run that reads nothing"
    );
    eprintln!(
        "memory: 3 GB file + {shell_mb} MB of shell output: peak {kib} KiB resident \
         ({base} KiB for a run that reads nothing)"
    );
}

#[test]
fn an_mcp_tool_beyond_a_bound_is_left_out_and_the_servers_others_are_offered() {
    // Named so that `mcp__<server>__env`, `__run` and `__die` take the 64 characters
    // model APIs accept and `__slow` one more: that tool alone is left out, with a line
    // saying why.
    let env = Env::new();
    let server = "s".repeat(54);
    let config = crate::py_mcp_config(&env, &server);
    let model = env.script(json!([{"final": "ok"}]));
    let out = env.run(&[
        "run",
        "--json",
        "--mcp-config",
        config,
        "--model",
        &model,
        "g",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    let left: Vec<&str> = err.lines().filter(|l| l.contains("left out")).collect();
    assert_eq!(
        left,
        [format!(
            "agent: MCP server {server:?}: its tool \"slow\" is left out: it would be offered \
             as mcp__{server}__slow (65 characters), and model APIs accept at most 64: give \
             the server a shorter name in the MCP configuration"
        )],
        "{err}"
    );
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let shown: Value = serde_json::from_slice(&env.run(&["show", "--json", &id]).stdout).unwrap();
    let tools: Vec<&str> = shown["events"][0]["manifest"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .filter(|n| n.starts_with("mcp__"))
        .collect();
    assert_eq!(
        tools,
        [
            format!("mcp__{server}__die"),
            format!("mcp__{server}__env"),
            format!("mcp__{server}__run")
        ]
    );
}
