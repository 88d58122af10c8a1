//! Runs kept in PostgreSQL (`--store postgres://…` or `AGENT_STORE`), on a throwaway
//! cluster: every command reads and writes them there.

use agent_store::testing::Cluster;
use serde_json::Value;

use crate::{Env, repo, stderr, stdout};

#[test]
fn runs_live_in_postgres_and_every_command_reads_them() {
    let cluster = Cluster::start();
    let url = cluster.url();
    let env = Env::new();
    let root = repo();
    let script = format!(
        "script:{}",
        root.join("examples/meeting/script.json").display()
    );
    let ws = root.join("examples/meeting/workspace");
    let run = |store_flag: bool, goal: &str| {
        let mut cmd = env.bare();
        if store_flag {
            cmd.arg("--store").arg(&url);
        } else {
            cmd.env("AGENT_STORE", &url);
        }
        cmd.args(["run", "--json", "--model", &script, "--workspace"])
            .arg(&ws)
            .arg(goal)
            .output()
            .unwrap()
    };
    let first = run(true, "When and where is the launch meeting?");
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let first: Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(first["reason"], "completed");
    // The environment names the same database.
    let second = run(false, "Again: when and where?");
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    assert!(
        !env.dir.path().join(".agent").exists(),
        "nothing was written beside the project"
    );

    let agent = |args: &[&str]| {
        env.bare()
            .arg("--store")
            .arg(&url)
            .args(args)
            .output()
            .unwrap()
    };
    let listed = agent(&["runs", "--json"]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    let runs: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert!(runs.iter().all(|r| r["status"] == "finished"), "{runs:?}");
    let id = first["run_id"].as_str().unwrap();
    let shown = agent(&["show", id]);
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
    let timeline = stdout(&shown);
    assert!(
        timeline.lines().next().unwrap().contains("run_started"),
        "{timeline}"
    );
    assert!(
        timeline.lines().last().unwrap().contains("run_ended"),
        "{timeline}"
    );
    let context = agent(&["context", id]);
    assert_eq!(context.status.code(), Some(0), "{}", stderr(&context));
    assert!(stdout(&context).contains("launch meeting"));
    // Unknown runs are reported as such, and no password is ever printed.
    let unknown = agent(&["show", "nope"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        stderr(&unknown).contains("no run \"nope\""),
        "{}",
        stderr(&unknown)
    );
}

#[test]
fn a_database_that_is_not_there_is_a_failure_that_hides_the_password() {
    let env = Env::new();
    let dir = tempfile::tempdir().unwrap();
    // Written in pieces: the repository's own text goes through the redactor in a test.
    let password = "s3cr3t-pw";
    let url = format!(
        "postgresql://agent:{password}@localhost/db?host={}",
        dir.path().display()
    );
    let out = env
        .bare()
        .arg("--store")
        .arg(&url)
        .args(["runs"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("cannot connect to PostgreSQL"), "{err}");
    assert!(!err.contains(password), "{err}");
}

/// Runs queued with `agent submit` are drained by two worker processes, two slots each:
/// every run ends once, every side effect happens once, and the commands read them all.
#[test]
fn workers_drain_the_queue_each_run_once() {
    let cluster = Cluster::start();
    let url = cluster.url();
    let env = Env::new();
    let ws = env.dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let agent = |args: &[&str]| {
        env.bare()
            .arg("--store")
            .arg(&url)
            .args(args)
            .output()
            .unwrap()
    };
    let jobs = 6;
    let mut ids = Vec::new();
    for i in 0..jobs {
        let script = env.dir.path().join(format!("job{i}.json"));
        let turns = serde_json::json!({"turns": [
            {"tool_calls": [{"id": "c1", "name": "shell",
                "arguments": {"command": format!("echo job-{i} >> effects.txt")}}]},
            {"final": format!("job {i} done")}
        ]});
        std::fs::write(&script, turns.to_string()).unwrap();
        let model = format!("script:{}", script.display());
        let out = agent(&[
            "submit",
            "--json",
            "--model",
            &model,
            "--workspace",
            ws.to_str().unwrap(),
            "--allow",
            "shell",
            &format!("job {i}"),
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["status"], "queued");
        ids.push(v["run_id"].as_str().unwrap().to_owned());
    }
    let workers: Vec<_> = (0..2)
        .map(|_| {
            env.bare()
                .arg("--store")
                .arg(&url)
                .args(["worker", "--concurrency", "2", "--until-empty"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for w in workers {
        let out = w.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let effects = std::fs::read_to_string(ws.join("effects.txt")).unwrap();
    let mut lines: Vec<&str> = effects.lines().collect();
    lines.sort_unstable();
    let expected: Vec<String> = (0..jobs).map(|i| format!("job-{i}")).collect();
    assert_eq!(lines, expected, "each effect exactly once");
    let runs: Value = serde_json::from_slice(&agent(&["runs", "--json"]).stdout).unwrap();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), jobs);
    assert!(runs.iter().all(|r| r["reason"] == "completed"), "{runs:?}");
    for id in &ids {
        let shown: Value = serde_json::from_slice(&agent(&["show", "--json", id]).stdout).unwrap();
        let events = shown["events"].as_array().unwrap();
        let ended = events
            .iter()
            .filter(|e| e.to_string().contains("run_ended"))
            .count();
        assert_eq!(ended, 1, "{id} ended once");
    }
    // A run driven by workers is not driven from elsewhere while queued; an ended one is
    // the person's again.
    let again = agent(&["resume", &ids[0]]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
}

#[test]
fn the_queue_needs_a_shared_store() {
    let env = Env::new();
    let out = env.run(&["submit", "--model", "script:x.json", "g"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("needs a shared store"),
        "{}",
        stderr(&out)
    );
    let out = env.run(&["worker", "--until-empty"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("needs a shared store"),
        "{}",
        stderr(&out)
    );
}

/// Re-checks `done` until it holds; panics with `what` after a minute.
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A worker killed in the middle of a run: after its lease expires another worker takes
/// the run over and continues from the last commit, without running the finished call
/// again.
#[test]
fn a_dead_worker_s_run_is_taken_over_from_its_last_commit() {
    let cluster = Cluster::start();
    let url = cluster.url();
    let env = Env::new();
    let ws = env.dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let agent = |args: &[&str]| {
        env.bare()
            .arg("--store")
            .arg(&url)
            .args(args)
            .output()
            .unwrap()
    };
    let script = env.dir.path().join("job.json");
    let write_script = |delay_ms: u64| {
        let turns = serde_json::json!({"turns": [
            {"tool_calls": [{"id": "c1", "name": "shell",
                "arguments": {"command": "echo once >> effects.txt"}}]},
            {"final": "done", "delay_ms": delay_ms}
        ]});
        std::fs::write(&script, turns.to_string()).unwrap();
    };
    // The first worker stalls in its second model call, after the first turn committed.
    write_script(600_000);
    let model = format!("script:{}", script.display());
    let out = agent(&[
        "submit",
        "--json",
        "--model",
        &model,
        "--workspace",
        ws.to_str().unwrap(),
        "--allow",
        "shell",
        "once",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let spawn_worker = || {
        env.bare()
            .arg("--store")
            .arg(&url)
            .args(["worker", "--lease", "1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut first = spawn_worker();
    until("the first turn is committed", || {
        stdout(&agent(&["show", &id])).contains("tool_finished")
    });
    first.kill().unwrap();
    first.wait().unwrap();
    // The next worker reads the script again: without the stall.
    write_script(0);
    let mut second = spawn_worker();
    until("the run is completed by the second worker", || {
        let runs: Value = serde_json::from_slice(&agent(&["runs", "--json"]).stdout).unwrap();
        runs[0]["reason"] == "completed"
    });
    second.kill().unwrap();
    second.wait().unwrap();
    let effects = std::fs::read_to_string(ws.join("effects.txt")).unwrap();
    assert_eq!(effects, "once\n", "the finished call was not run again");
    let shown: Value = serde_json::from_slice(&agent(&["show", "--json", &id]).stdout).unwrap();
    let events = shown["events"].as_array().unwrap();
    let count = |name: &str| {
        events
            .iter()
            .filter(|e| e.to_string().contains(name))
            .count()
    };
    assert_eq!((count("tool_finished"), count("run_ended")), (1, 1));
    let versions: Vec<u64> = events
        .iter()
        .map(|e| e["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, (1..=versions.len() as u64).collect::<Vec<_>>());
}

/// A queued run that asks for approval waits in the queue; an approval from anywhere
/// records the answer and queues it again, and the next worker goes on with it.
#[test]
fn an_approval_from_anywhere_queues_a_paused_run_again() {
    let cluster = Cluster::start();
    let url = cluster.url();
    let env = Env::new();
    let ws = env.dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let agent = |args: &[&str]| {
        env.bare()
            .arg("--store")
            .arg(&url)
            .args(args)
            .output()
            .unwrap()
    };
    let script = env.dir.path().join("job.json");
    let turns = serde_json::json!({"turns": [
        {"tool_calls": [{"id": "w1", "name": "write_file",
            "arguments": {"path": "out.txt", "content": "approved"}}]},
        {"final": "written"}
    ]});
    std::fs::write(&script, turns.to_string()).unwrap();
    let model = format!("script:{}", script.display());
    let out = agent(&[
        "submit",
        "--json",
        "--model",
        &model,
        "--workspace",
        ws.to_str().unwrap(),
        "write",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let drain = || {
        let out = agent(&["worker", "--until-empty"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    };
    drain();
    let runs: Value = serde_json::from_slice(&agent(&["runs", "--json"]).stdout).unwrap();
    assert_eq!(runs[0]["reason"], "approval_required", "{runs}");
    assert!(!ws.join("out.txt").exists());
    // Not driven from here while it is queued; answered from here, it is queued again.
    let resumed = agent(&["resume", &id]);
    assert_eq!(resumed.status.code(), Some(2));
    assert!(
        stderr(&resumed).contains("waits in the queue"),
        "{}",
        stderr(&resumed)
    );
    let approved = agent(&["approve", "--json", &id]);
    assert_eq!(approved.status.code(), Some(0), "{}", stderr(&approved));
    let v: Value = serde_json::from_slice(&approved.stdout).unwrap();
    assert_eq!(v["status"], "queued");
    assert!(
        !ws.join("out.txt").exists(),
        "the approver did not run the call itself"
    );
    drain();
    assert_eq!(
        std::fs::read_to_string(ws.join("out.txt")).unwrap(),
        "approved"
    );
    let runs: Value = serde_json::from_slice(&agent(&["runs", "--json"]).stdout).unwrap();
    assert_eq!(runs[0]["reason"], "completed", "{runs}");
    // Ended, it is the person's again: a second approval is refused as such.
    let late = agent(&["approve", &id]);
    assert_eq!(late.status.code(), Some(2), "{}", stderr(&late));
}

/// A worker stopped (SIGSTOP) past its lease: another worker finishes the run, and when
/// the first wakes up it learns it lost the lease and writes nothing.
#[test]
fn a_worker_paused_past_its_lease_cannot_commit_after_waking() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    use std::io::{BufRead as _, BufReader};
    let cluster = Cluster::start();
    let url = cluster.url();
    let env = Env::new();
    let ws = env.dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let agent = |args: &[&str]| {
        env.bare()
            .arg("--store")
            .arg(&url)
            .args(args)
            .output()
            .unwrap()
    };
    let script = env.dir.path().join("job.json");
    let write_script = |delay_ms: u64| {
        let turns = serde_json::json!({"turns": [
            {"tool_calls": [{"id": "r1", "name": "list_dir", "arguments": {}}]},
            {"final": "done", "delay_ms": delay_ms}
        ]});
        std::fs::write(&script, turns.to_string()).unwrap();
    };
    write_script(2_000);
    let model = format!("script:{}", script.display());
    let out = agent(&[
        "submit",
        "--json",
        "--model",
        &model,
        "--workspace",
        ws.to_str().unwrap(),
        "look",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut first = env
        .bare()
        .arg("--store")
        .arg(&url)
        .args(["worker", "--lease", "1", "--until-empty"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    until("the first turn is committed", || {
        stdout(&agent(&["show", &id])).contains("tool_finished")
    });
    let pid = Pid::from_raw(i32::try_from(first.id()).unwrap());
    kill(pid, Signal::SIGSTOP).unwrap();
    write_script(0);
    let mut second = env
        .bare()
        .arg("--store")
        .arg(&url)
        .args(["worker", "--lease", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    until("the second worker completes the run", || {
        let runs: Value = serde_json::from_slice(&agent(&["runs", "--json"]).stdout).unwrap();
        runs[0]["reason"] == "completed"
    });
    second.kill().unwrap();
    second.wait().unwrap();
    let before = stdout(&agent(&["show", &id]));
    kill(pid, Signal::SIGCONT).unwrap();
    // The first worker says it lost the lease, then finds nothing more to do.
    let stderr_of_first = first.stderr.take().unwrap();
    let told = BufReader::new(stderr_of_first)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.contains("lost the lease on run"));
    assert!(told, "the first worker noticed it lost the lease");
    assert_eq!(first.wait().unwrap().code(), Some(0));
    assert_eq!(stdout(&agent(&["show", &id])), before, "it wrote nothing");
}

/// Three workers drain a hundred queued runs with a write each while they are killed
/// (`kill -9`) at random instants and restarted: every run ends once, every file is
/// written as asked, no call finishes twice and no committed event is lost.
#[test]
fn three_workers_drain_a_hundred_runs_through_kills() {
    let cluster = Cluster::start();
    let url = cluster.url();
    let env = Env::new();
    let ws = env.dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let agent = |args: &[&str]| {
        env.bare()
            .arg("--store")
            .arg(&url)
            .args(args)
            .output()
            .unwrap()
    };
    let runs = 100;
    let store = agent_store::PostgresStore::connect(&url).unwrap();
    let mut ids = Vec::new();
    for i in 0..runs {
        let script = env.dir.path().join(format!("job{i}.json"));
        let turns = serde_json::json!({"turns": [
            {"tool_calls": [{"id": "w1", "name": "write_file",
                "arguments": {"path": format!("f{i}.txt"), "content": format!("run {i}")}}]},
            {"final": "written"}
        ]});
        std::fs::write(&script, turns.to_string()).unwrap();
        let spec = agent_cli::worker::RunSpec {
            goal: format!("write f{i}"),
            model: format!("script:{}", script.display()),
            base_url: None,
            workspace: ws.clone(),
            rules: agent_cli::settings::RuleTexts {
                allow: vec!["write_file".into()],
                ..Default::default()
            },
            mcp_config: None,
            budget: agent_core::Budget::default(),
            context_window: None,
            compact_at: None,
        };
        let id = format!("run-{i:03}");
        store
            .submit(&id, &serde_json::to_string(&spec).unwrap())
            .unwrap();
        ids.push(id);
    }
    let spawn = || {
        env.bare()
            .arg("--store")
            .arg(&url)
            .args(["worker", "--lease", "1", "--concurrency", "2"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut workers: Vec<_> = (0..3).map(|_| spawn()).collect();
    let ended = || -> usize {
        let listed: Value = serde_json::from_slice(&agent(&["runs", "--json"]).stdout).unwrap();
        listed
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["status"] != "running")
            .count()
    };
    // Kills at seeded random instants while the queue drains.
    let mut rng = 0x5eed_0002_u64;
    let mut next = || {
        rng = rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        rng >> 33
    };
    let mut kills = 0;
    while kills < 8 && ended() < runs {
        std::thread::sleep(std::time::Duration::from_millis(100 + next() % 300));
        let victim = usize::try_from(next() % 3).unwrap();
        workers[victim].kill().unwrap();
        workers[victim].wait().unwrap();
        workers[victim] = spawn();
        kills += 1;
    }
    until("every run ended", || ended() == runs);
    for mut w in workers {
        w.kill().unwrap();
        w.wait().unwrap();
    }
    eprintln!("queue chaos: {kills} workers killed while {runs} runs drained");
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            std::fs::read_to_string(ws.join(format!("f{i}.txt"))).unwrap(),
            format!("run {i}")
        );
        let shown: Value = serde_json::from_slice(&agent(&["show", "--json", id]).stdout).unwrap();
        let events = shown["events"].as_array().unwrap();
        let versions: Vec<u64> = events
            .iter()
            .map(|e| e["version"].as_u64().unwrap())
            .collect();
        assert_eq!(
            versions,
            (1..=versions.len() as u64).collect::<Vec<_>>(),
            "{id}"
        );
        let count = |name: &str| {
            events
                .iter()
                .filter(|e| e.to_string().contains(name))
                .count()
        };
        assert_eq!(
            (count("\"run_ended\""), count("\"tool_finished\"")),
            (1, 1),
            "{id}: {events:?}"
        );
        assert!(
            events.last().unwrap().to_string().contains("completed"),
            "{id}: {events:?}"
        );
    }
}
