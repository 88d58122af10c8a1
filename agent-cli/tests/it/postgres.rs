//! Runs kept in PostgreSQL (`--store postgres://…` or `AGENT_STORE`), on a throwaway
//! cluster: every command reads and writes them there.

use std::path::PathBuf;
use std::process::{Child, Output, Stdio};

use agent_store::testing::Cluster;
use serde_json::{Value, json};

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

/// A queue on a throwaway cluster, a working directory and a workspace in it, and the
/// `agent` binary pointed at the queue.
pub(crate) struct Queue {
    pub(crate) env: Env,
    pub(crate) url: String,
    pub(crate) ws: PathBuf,
    _cluster: Cluster,
}

impl Queue {
    pub(crate) fn new() -> Queue {
        let cluster = Cluster::start();
        let env = Env::new();
        let ws = env.dir.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        Queue {
            url: cluster.url(),
            env,
            ws,
            _cluster: cluster,
        }
    }

    fn agent(&self, args: &[&str]) -> Output {
        self.env
            .bare()
            .arg("--store")
            .arg(&self.url)
            .args(args)
            .output()
            .unwrap()
    }

    /// Writes `name`'s script (`turns`) and returns its `--model` value.
    pub(crate) fn script(&self, name: &str, turns: Value) -> String {
        let path = self.env.dir.path().join(format!("{name}.json"));
        std::fs::write(&path, json!({ "turns": turns }).to_string()).unwrap();
        format!("script:{}", path.display())
    }

    /// Queues a run of `model` in the workspace (with `extra` options); its id.
    pub(crate) fn submit(&self, model: &str, extra: &[&str], goal: &str) -> String {
        let mut args = vec!["submit", "--json", "--model", model, "--workspace"];
        args.push(self.ws.to_str().unwrap());
        args.extend_from_slice(extra);
        args.push(goal);
        let out = self.agent(&args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["status"], "queued");
        v["run_id"].as_str().unwrap().to_owned()
    }

    /// A worker process with `args`; its standard error piped when `watched`.
    pub(crate) fn worker(&self, args: &[&str], watched: bool) -> Child {
        self.env
            .bare()
            .arg("--store")
            .arg(&self.url)
            .arg("worker")
            .args(args)
            .stdout(Stdio::null())
            .stderr(if watched {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .spawn()
            .unwrap()
    }

    /// A worker (leases of a second) that drives the queue until its first run completes
    /// (`what` it waits for), then is stopped.
    fn work_until_completed(&self, what: &str) {
        let mut worker = self.worker(&["--lease", "1"], false);
        until(what, || self.runs()[0]["reason"] == "completed");
        worker.kill().unwrap();
        worker.wait().unwrap();
    }

    fn runs(&self) -> Vec<Value> {
        let out = self.agent(&["runs", "--json"]);
        let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
        runs.as_array().unwrap().clone()
    }

    /// The run's entries (none while no worker has started it).
    pub(crate) fn events(&self, id: &str) -> Vec<Value> {
        let out = self.agent(&["show", "--json", id]);
        if !out.status.success() {
            return Vec::new();
        }
        let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
        shown["events"].as_array().unwrap().clone()
    }
}

/// How many of `events` are of type `name`.
fn count(events: &[Value], name: &str) -> usize {
    events.iter().filter(|e| e["type"] == name).count()
}

/// Re-checks `done` until it holds; panics with `what` after a minute.
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Runs queued with `agent submit` are drained by two worker processes, two slots each:
/// every run ends once, every side effect happens once, and the commands read them all.
#[test]
fn workers_drain_the_queue_each_run_once() {
    let q = Queue::new();
    let jobs = 6;
    let ids: Vec<String> = (0..jobs)
        .map(|i| {
            let model = q.script(
                &format!("job{i}"),
                json!([
                    {"tool_calls": [{"id": "c1", "name": "shell",
                        "arguments": {"command": format!("echo job-{i} >> effects.txt")}}]},
                    {"final": format!("job {i} done")}
                ]),
            );
            q.submit(&model, &["--allow", "shell"], &format!("job {i}"))
        })
        .collect();
    let workers: Vec<Child> = (0..2)
        .map(|_| q.worker(&["--concurrency", "2", "--until-empty"], true))
        .collect();
    for w in workers {
        let out = w.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let effects = std::fs::read_to_string(q.ws.join("effects.txt")).unwrap();
    let mut lines: Vec<&str> = effects.lines().collect();
    lines.sort_unstable();
    let expected: Vec<String> = (0..jobs).map(|i| format!("job-{i}")).collect();
    assert_eq!(lines, expected, "each effect exactly once");
    let runs = q.runs();
    assert_eq!(runs.len(), jobs);
    assert!(runs.iter().all(|r| r["reason"] == "completed"), "{runs:?}");
    for id in &ids {
        assert_eq!(count(&q.events(id), "run_ended"), 1, "{id} ended once");
    }
    // Ended, a run is the person's again: it is not refused as queued.
    let again = q.agent(&["resume", &ids[0]]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
}

/// `agent submit` judges the project files as `agent run` does (the worker takes the spec
/// as given), and the MCP configuration a queued run names is started only as it was
/// when the run was submitted.
#[test]
fn a_run_is_queued_only_from_trusted_project_files_and_runs_with_what_was_judged() {
    let q = Queue::new();
    let dir = q.env.dir.path();
    std::fs::write(
        dir.join("agent.toml"),
        "mcp_config = \"tools/mcp.json\"\n[policy]\nallow = [\"shell\"]\n",
    )
    .unwrap();
    std::fs::create_dir(dir.join("tools")).unwrap();
    std::fs::write(dir.join("tools/mcp.json"), r#"{"mcpServers": {}}"#).unwrap();
    let model = q.script("job", json!([{"final": "done"}]));
    let ws = q.ws.to_str().unwrap();
    let out = q.agent(&["submit", "--model", &model, "--workspace", ws, "g"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("agent.toml is not trusted") && err.contains("allow rules shell"),
        "{err}"
    );
    assert!(q.runs().is_empty(), "nothing is queued");

    let out = q.agent(&["trust"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = q.submit(&model, &[], "g");
    // The file changes while the run waits in the queue.
    let evil = json!({"mcpServers": {"evil": {"command": "bash", "args": ["-c", "id > PWNED"]}}});
    std::fs::write(dir.join("tools/mcp.json"), evil.to_string()).unwrap();
    let out = q
        .worker(&["--until-empty"], true)
        .wait_with_output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("run {id}: MCP config"))
            && err.contains("tools/mcp.json changed since this run was submitted"),
        "{err}"
    );
    assert!(!q.ws.join("PWNED").exists() && !dir.join("PWNED").exists());
    assert!(q.events(&id).is_empty(), "the run did not start");
}

#[test]
fn the_queue_needs_a_shared_store() {
    let env = Env::new();
    for args in [
        &["submit", "--model", "script:x.json", "g"][..],
        &["worker", "--until-empty"],
    ] {
        let out = env.run(args);
        assert_eq!(out.status.code(), Some(2));
        assert!(
            stderr(&out).contains("needs a database store"),
            "{}",
            stderr(&out)
        );
    } // Checked before anything is opened.
    for n in ["0", "1000000"] {
        let out = env.run(&["worker", "--concurrency", n]);
        assert_eq!(out.status.code(), Some(2));
        assert!(stderr(&out).contains("give 1 to 256"), "{}", stderr(&out));
    }
}

/// A worker killed in the middle of a run: after its lease expires another worker takes
/// the run over and continues from the last commit, without running the finished call
/// again.
#[test]
fn a_dead_worker_s_run_is_taken_over_from_its_last_commit() {
    let q = Queue::new();
    let call = json!({"tool_calls": [{"id": "c1", "name": "shell",
                      "arguments": {"command": "echo once >> effects.txt"}}]});
    let id = run_whose_worker_died(&q, call, &["--allow", "shell"], "once");
    let mut second = q.worker(&["--lease", "1"], false);
    until("the run is completed by the second worker", || {
        q.runs()[0]["reason"] == "completed"
    });
    second.kill().unwrap();
    second.wait().unwrap();
    let effects = std::fs::read_to_string(q.ws.join("effects.txt")).unwrap();
    assert_eq!(effects, "once\n", "the finished call was not run again");
    let events = q.events(&id);
    assert_eq!(
        (count(&events, "tool_finished"), count(&events, "run_ended")),
        (1, 1)
    );
    super::assert_contiguous(&events, "the run's log");
}

/// A message to a queued run whose worker died in the middle of a step (its lease ran out
/// and no worker took it over yet) is kept for the worker that takes it over, which reads
/// it before its next model call.
#[test]
fn a_message_to_a_run_whose_worker_died_is_read_by_the_one_that_takes_it_over() {
    let q = Queue::new();
    let call =
        json!({"tool_calls": [{"id": "c1", "name": "list_dir", "arguments": {"path": "."}}]});
    let id = run_whose_worker_died(&q, call, &[], "look");
    until("its lease ran out", || q.runs()[0]["live"].is_null());
    let out = q.agent(&["resume", "--json", &id, "also say hello"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "queued");
    // New limits are not handed to a run between workers.
    let out = q.agent(&["resume", &id, "more", "--max-steps", "9"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("new limits"), "{}", stderr(&out));
    q.work_until_completed("the next worker completes the run");
    let (events, note) = read_on_taking_over(&q, &id, "also say hello");
    assert_eq!(count(&events[..note], "tool_finished"), 1);
}

/// Queues a run of `call`, then a final answer `done`, whose first worker (a lease of 1 s)
/// is killed once the call's turn is committed, while it waits for its second model call
/// (the script stalls there); the script is then written again without the stall, for
/// the worker that takes the run over. Its id.
fn run_whose_worker_died(q: &Queue, call: Value, extra: &[&str], goal: &str) -> String {
    let stalling = |delay_ms: u64| {
        q.script(
            "job",
            json!([call.clone(), {"final": "done", "delay_ms": delay_ms}]),
        )
    };
    let id = q.submit(&stalling(600_000), extra, goal);
    let mut first = q.worker(&["--lease", "1"], false);
    until("the first turn is committed", || {
        count(&q.events(&id), "tool_finished") == 1
    });
    first.kill().unwrap();
    first.wait().unwrap();
    stalling(0);
    id
}

/// Queues a run that writes `out.txt` (`approved`), which asks for approval; its id.
fn write_job(q: &Queue) -> String {
    let model = q.script(
        "job",
        json!([
            {"tool_calls": [{"id": "w1", "name": "write_file",
                "arguments": {"path": "out.txt", "content": "approved"}}]},
            {"final": "written"}
        ]),
    );
    q.submit(&model, &[], "write")
}

/// A worker asked to stop (SIGTERM, as a deploy or a scale-down asks) takes no more runs
/// and hands those it drives back to the queue at their next step: the command in flight
/// finishes and its result is committed, nothing is left in doubt, and the next worker goes
/// on from there at once, the command not run again.
#[test]
fn a_worker_asked_to_stop_hands_its_runs_back_at_their_next_step() {
    worker_asked_to_stop(false);
}

/// As above, with the command run by the run's sub-agent: the sub-agent is let go at its
/// next step, then its parent, which the next worker takes up and which continues it.
#[test]
fn a_worker_asked_to_stop_hands_back_a_run_whose_sub_agent_runs_a_command() {
    worker_asked_to_stop(true);
}

/// [`a_worker_asked_to_stop_hands_its_runs_back_at_their_next_step`], the command run by a
/// sub-agent `through_sub_agent`.
fn worker_asked_to_stop(through_sub_agent: bool) {
    use std::io::BufRead;
    let q = Queue::new();
    let gated = json!([
        {"tool_calls": [{"id": "c1", "name": "shell", "arguments": {
            "command": "while [ ! -e go ]; do sleep 0.05; done; echo ran >> ran.txt"}}]},
        {"final": "went"}
    ]);
    let id = if through_sub_agent {
        let path = q.env.dir.path().join("delegates.json");
        let script = json!({
            "turns": [
                {"tool_calls": [{"id": "d1", "name": "delegate", "arguments": {"goal": "gated"}}]},
                {"final": "went"}
            ],
            "agents": {"gated": {"turns": gated}}
        });
        std::fs::write(&path, script.to_string()).unwrap();
        let model = format!("script:{}", path.display());
        let options = ["--allow", "shell", "--sub-agents", "--allow", "delegate"];
        q.submit(&model, &options, "wait for go")
    } else {
        let model = q.script("gated", gated);
        q.submit(&model, &["--allow", "shell"], "wait for go")
    };
    let mut worker = q
        .env
        .bare()
        .arg("--store")
        .arg(&q.url)
        .args(["worker", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The run whose command it is.
    let mut runner = id.clone();
    until("its command is dispatched", || {
        if through_sub_agent {
            match q.runs().iter().find(|r| r.get("parent").is_some()) {
                Some(child) => runner = child["run_id"].as_str().unwrap().to_owned(),
                None => return false,
            }
        }
        q.events(&runner)
            .iter()
            .any(|e| e["type"] == "effect_dispatched")
    });
    let pid = nix::unistd::Pid::from_raw(worker.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    // The command finishes only once the worker heard it.
    let mut said = std::io::BufReader::new(worker.stderr.take().unwrap()).lines();
    let heard = said
        .by_ref()
        .map(Result::unwrap)
        .find(|l| l.contains("stopping"));
    assert!(heard.is_some(), "the worker says it stops");
    std::fs::write(q.ws.join("go"), "").unwrap();
    let out = worker.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{:?}", said.collect::<Vec<_>>());
    let line: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(
        (line["run_id"].as_str(), line["status"].as_str()),
        (Some(id.as_str()), Some("queued"))
    );
    let events = q.events(&runner);
    assert_eq!(
        events.last().unwrap()["type"],
        "tool_finished",
        "{events:?}"
    );
    assert_eq!(count(&events, "run_ended"), 0);
    assert_eq!(count(&q.events(&id), "run_ended"), 0);
    let store = agent_store::PostgresStore::connect(&q.url).unwrap();
    assert_eq!(
        store.queue_state(&id).unwrap(),
        Some(agent_store::QueueState::Runnable)
    );
    // Handed back between two steps, it takes a message from anywhere, read by the worker
    // that takes it up before its next model call.
    if !through_sub_agent {
        let told = q.agent(&["resume", "--json", &id, "mind the tests"]);
        assert_eq!(told.status.code(), Some(0), "{}", stderr(&told));
        let v: Value = serde_json::from_slice(&told.stdout).unwrap();
        assert_eq!(v, json!({"run_id": id, "status": "queued"}));
        assert_eq!(
            store.queue_state(&id).unwrap(),
            Some(agent_store::QueueState::Runnable)
        );
    }

    let next = q.agent(&["worker", "--until-empty"]);
    assert_eq!(next.status.code(), Some(0), "{}", stderr(&next));
    assert_eq!(q.events(&id).last().unwrap()["outcome"]["answer"], "went");
    let events = q.events(&runner);
    assert_eq!(events.last().unwrap()["outcome"]["answer"], "went");
    assert_eq!(count(&events, "effect_dispatched"), 1);
    assert_eq!(
        count(&events, "effect_reconciled"),
        0,
        "nothing was in doubt"
    );
    assert_eq!(count(&events, "run_resumed"), 1);
    assert_eq!(
        std::fs::read_to_string(q.ws.join("ran.txt")).unwrap(),
        "ran\n",
        "the command ran once"
    );
    if !through_sub_agent {
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        let note = kinds.iter().position(|k| *k == "user_note").unwrap();
        assert_eq!(events[note]["text"], "mind the tests");
        assert_eq!(kinds[note + 1..].first(), Some(&"run_resumed"), "{kinds:?}");
        assert_eq!(
            kinds.iter().filter(|k| **k == "decision_proposed").count(),
            2
        );
    }
}

/// A queued run that asks for approval waits in the queue; an approval from anywhere
/// records the answer and queues it again, and the next worker goes on with it.
#[test]
fn an_approval_from_anywhere_queues_a_paused_run_again() {
    let q = Queue::new();
    let id = write_job(&q);
    let drain = || {
        let out = q.agent(&["worker", "--until-empty"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    };
    drain();
    assert_eq!(q.runs()[0]["reason"], "approval_required");
    assert!(!q.ws.join("out.txt").exists());
    // Not driven from here while it is queued; answered from here, it is queued again.
    let resumed = q.agent(&["resume", &id]);
    assert_eq!(resumed.status.code(), Some(2));
    assert!(
        stderr(&resumed).contains("waits in the queue"),
        "{}",
        stderr(&resumed)
    );
    let approved = q.agent(&["approve", "--json", &id]);
    assert_eq!(approved.status.code(), Some(0), "{}", stderr(&approved));
    let v: Value = serde_json::from_slice(&approved.stdout).unwrap();
    assert_eq!(v["status"], "queued");
    assert!(
        !q.ws.join("out.txt").exists(),
        "the approver did not run the call itself"
    );
    drain();
    assert_eq!(
        std::fs::read_to_string(q.ws.join("out.txt")).unwrap(),
        "approved"
    );
    assert_eq!(q.runs()[0]["reason"], "completed");
    // Ended, it is the person's again: a second approval is refused as such.
    let late = q.agent(&["approve", &id]);
    assert_eq!(late.status.code(), Some(2), "{}", stderr(&late));
}

/// A queued run whose sub-agent asks for approval waits in the queue; `agent approve
/// PARENT` from anywhere answers the sub-agent's call through its parent, as on a directory
/// store, and the next worker goes on with both.
#[test]
fn a_sub_agents_approval_is_answered_through_its_queued_parent() {
    let q = Queue::new();
    let id = queued_with_a_sub_agent_waiting(&q);
    let approved = q.agent(&["approve", "--json", &id, "--call", "w1"]);
    assert_eq!(approved.status.code(), Some(0), "{}", stderr(&approved));
    let v: Value = serde_json::from_slice(&approved.stdout).unwrap();
    assert_eq!(v["status"], "queued");
    assert!(!q.ws.join("note.txt").exists(), "the approver ran nothing");
    assert_eq!(drained(&q, &id)["answer"], "done");
    assert_eq!(
        std::fs::read_to_string(q.ws.join("note.txt")).unwrap(),
        "hi\n"
    );
    let parent = q.events(&id);
    assert_eq!(parent.last().unwrap()["outcome"]["answer"], "done");
}

/// `agent cancel` of the sub-agent a queued run waits on: the run goes on with that
/// answer, queued again for a worker, with no call left for a person to settle.
#[test]
fn a_sub_agent_cancelled_while_its_queued_parent_waits_lets_the_parent_go_on() {
    let q = Queue::new();
    let id = queued_with_a_sub_agent_waiting(&q);
    let child = q.runs()[1]["run_id"].as_str().unwrap().to_owned();
    assert_eq!(q.runs()[1]["parent"], format!("{id}/d1"));
    let cancelled = q.agent(&["cancel", &child]);
    assert_eq!(cancelled.status.code(), Some(130), "{}", stderr(&cancelled));
    assert!(
        stderr(&cancelled).contains(&format!(
            "run {id} waited on this sub-agent; it is queued again and a worker goes on with \
             its end"
        )),
        "{}",
        stderr(&cancelled)
    );
    assert_eq!(drained(&q, &id)["answer"], "done");
    assert!(
        !q.ws.join("note.txt").exists(),
        "the cancelled sub-agent wrote nothing"
    );
    let finished = q.events(&id);
    let result = finished
        .iter()
        .find(|e| e["type"] == "tool_finished")
        .unwrap();
    assert_eq!(result["result"]["error"]["kind"], "cancelled", "{result}");
}

/// A run queued with a sub-agent, driven by a worker until it waits for the approval of its
/// sub-agent's write: the run's id.
fn queued_with_a_sub_agent_waiting(q: &Queue) -> String {
    let path = q.env.dir.path().join("note.json");
    let script = json!({
        "turns": [
            {"tool_calls": [{"id": "d1", "name": "delegate", "arguments": {"goal": "save the note"}}]},
            {"final": "done"}
        ],
        "agents": {"save the note": {"turns": [
            {"tool_calls": [{"id": "w1", "name": "write_file",
                             "arguments": {"path": "note.txt", "content": "hi\n"}}]},
            {"final": "saved"}
        ]}}
    });
    std::fs::write(&path, script.to_string()).unwrap();
    let model = format!("script:{}", path.display());
    let id = q.submit(&model, &["--sub-agents", "--allow", "delegate"], "note it");
    let paused = drained(q, &id);
    assert_eq!(paused["reason"], "approval_required", "{paused}");
    assert_eq!(paused["pending"][0]["call_id"], "w1", "{paused}");
    let listed = &q.runs()[0];
    assert_eq!(listed["run_id"], id.as_str());
    assert_eq!(
        (&listed["status"], &listed["reason"]),
        (&json!("paused"), &json!("approval_required")),
        "{listed}"
    );
    id
}

/// What a worker said of run `id`, the one run it stopped, in its JSON line.
fn drained(q: &Queue, id: &str) -> Value {
    let out = q.agent(&["worker", "--json", "--until-empty"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["run_id"], id);
    lines[0].clone()
}

/// A queued run cancelled while it waits for a person leaves the queue: it is the
/// person's, ended `cancelled`, not a run waiting in the queue for an answer, and no
/// worker takes it up again.
#[test]
fn a_queued_run_cancelled_while_it_waits_for_a_person_leaves_the_queue() {
    let q = Queue::new();
    let id = write_job(&q);
    let out = q.agent(&["worker", "--until-empty"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(q.runs()[0]["reason"], "approval_required");
    let cancelled = q.agent(&["cancel", "--json", &id]);
    assert_eq!(cancelled.status.code(), Some(130), "{}", stderr(&cancelled));
    let v: Value = serde_json::from_slice(&cancelled.stdout).unwrap();
    assert_eq!(v["reason"], "cancelled", "{v}");
    assert_eq!(
        agent_store::PostgresStore::connect(&q.url)
            .unwrap()
            .queue_state(&id)
            .unwrap(),
        Some(agent_store::QueueState::Ended)
    );
    // Resumed, it says how it ended, as any ended run.
    let resumed = q.agent(&["resume", &id]);
    assert_eq!(resumed.status.code(), Some(130), "{}", stderr(&resumed));
    assert!(
        !stderr(&resumed).contains("waits in the queue")
            && stderr(&resumed).contains("stopped (cancelled)"),
        "{}",
        stderr(&resumed)
    );
    let approved = q.agent(&["approve", &id]);
    assert_eq!(approved.status.code(), Some(2), "{}", stderr(&approved));
    assert_eq!(q.runs()[0]["reason"], "cancelled");
    assert!(!q.ws.join("out.txt").exists());
}

#[test]
fn a_message_to_a_queued_run_is_recorded_and_queued_again_for_a_worker() {
    let q = Queue::new();
    let model = q.script(
        "talk",
        json!([
            {"clarification": "which file?"},
            {"final": "read notes.txt"},
            {"final": "and nothing else"}
        ]),
    );
    let id = q.submit(&model, &[], "read the file");
    let drain = || {
        let out = q.agent(&["worker", "--until-empty"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    };
    drain();
    assert_eq!(q.runs()[0]["reason"], "clarification_required");
    // The answer to its question, from here: recorded, and the run queued again.
    let answered = q.agent(&["resume", "--json", &id, "notes.txt"]);
    assert_eq!(answered.status.code(), Some(0), "{}", stderr(&answered));
    let v: Value = serde_json::from_slice(&answered.stdout).unwrap();
    assert_eq!(v["status"], "queued");
    drain();
    assert_eq!(q.runs()[0]["reason"], "completed");
    // A follow-up after its end goes the same way.
    let again = q.agent(&["resume", "--json", &id, "anything else?"]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    drain();
    let shown = q.agent(&["show", "--json", &id]);
    let events: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let events = events["events"].as_array().unwrap();
    let messages: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "user_message")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert_eq!(messages, ["notes.txt", "anything else?"]);
    let last = events.last().unwrap();
    assert_eq!(last["outcome"]["answer"], "and nothing else", "{last}");
}

/// A message to a queued run no worker has begun is kept with it in the queue: the worker
/// that begins it commits it after its goal, and its first model call reads it. New limits
/// with it, or one too long, are refused with nothing kept.
#[test]
fn a_message_to_a_queued_run_not_begun_is_read_by_its_first_model_call() {
    let q = Queue::new();
    let model = q.script("one", json!([{"final": "done"}]));
    let id = q.submit(&model, &[], "say done");
    let refused = q.agent(&["resume", &id, "also this", "--max-steps", "3"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("new limits"),
        "{}",
        stderr(&refused)
    );
    let long = "x".repeat(64 * 1024 + 1);
    let refused = q.agent(&["resume", &id, &long]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("at most 64 KiB"),
        "{}",
        stderr(&refused)
    );
    let told = q.agent(&["resume", "--json", &id, "also say hello"]);
    assert_eq!(told.status.code(), Some(0), "{}", stderr(&told));
    let v: Value = serde_json::from_slice(&told.stdout).unwrap();
    assert_eq!(v, json!({"run_id": id, "status": "queued"}));
    let out = q.agent(&["worker", "--until-empty"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let events = q.events(&id);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds[0], "run_started", "{kinds:?}");
    assert_eq!(kinds[1], "user_note", "{kinds:?}");
    assert_eq!(count(&events, "user_note"), 1, "{kinds:?}");
    assert_eq!(events[1]["text"], "also say hello");
    assert_eq!(events.last().unwrap()["outcome"]["answer"], "done");
    // The first model call's prompt: the goal, then the message.
    let prompt = stdout(&q.agent(&["context", &id, "--at", "1"]));
    let goal = prompt.find("say done").unwrap();
    let note = prompt.find("also say hello").unwrap();
    assert!(goal < note, "{prompt}");
}

/// A message to a queued run not begun outlives the workers that take the run and die:
/// one before the run's first commit (the run has no log), one right after it (the
/// message is in it); the worker that takes it over last reads the message after the
/// goal, once.
#[test]
fn a_message_to_a_queued_run_outlives_workers_that_die_as_the_run_begins() {
    let q = Queue::new();
    let model = q.script("one", json!([{"final": "done"}]));
    let id = q.submit(&model, &[], "say done");
    let told = q.agent(&["resume", &id, "also say hello"]);
    assert_eq!(told.status.code(), Some(0), "{}", stderr(&told));
    let dying = |before_commit: u32| {
        // Each worker waits for the lease of the one before to run out.
        let mut waited = Vec::new();
        loop {
            let died = q
                .env
                .bare()
                .env(
                    "FAILPOINTS",
                    format!("before_commit={}*off->return", before_commit - 1),
                )
                .args(["--store", &q.url, "worker", "--lease", "1", "--until-empty"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .unwrap();
            if died.code().is_none() {
                return;
            }
            waited.push(died);
            assert!(waited.len() < 200, "no worker took the run: {waited:?}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    dying(1);
    assert!(q.events(&id).is_empty(), "the run has no log");
    dying(2);
    let events = q.events(&id);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["run_started", "user_note"]);
    q.work_until_completed("the last worker completes the run");
    let events = q.events(&id);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds[..2], ["run_started", "user_note"], "{kinds:?}");
    assert_eq!(count(&events, "user_note"), 1, "{kinds:?}");
    assert_eq!(events[1]["text"], "also say hello");
    assert_eq!(events.last().unwrap()["outcome"]["answer"], "done");
}

/// A message to a queued run a worker drives outlives that worker when it dies after the
/// message was handed to it and before a commit held it: the message stays in the queue,
/// the worker that takes the run over reads it before its next model call, and the person
/// who sent it, still waiting, learns it was read.
#[test]
fn a_message_handed_to_a_worker_that_dies_is_read_by_the_next() {
    let q = Queue::new();
    let id = waiting_queued_run(&q);
    let mut first = q
        .env
        .bare()
        .env("FAILPOINTS", "notes_taken=return")
        .args(["--store", &q.url, "worker", "--lease", "1", "--until-empty"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    until("the command runs", || {
        count(&q.events(&id), "effect_dispatched") == 1
    });
    let sender = Sender::to_live_run(&q, &id, "also say hello");
    // The command ends; the worker is handed the message before its next model call, and
    // dies there.
    std::fs::write(q.ws.join("go"), "").unwrap();
    assert_eq!(first.wait().unwrap().code(), None, "the first worker died");
    q.work_until_completed("the next worker completes the run");
    let (code, said) = sender.outcome();
    assert_eq!(code, Some(0), "{said}");
    read_on_taking_over(&q, &id, "also say hello");
}

/// The run's events once it read `text` and answered `done` ([`read_once`]), the note
/// committed first thing by the worker that took the run over; and where the note is.
fn read_on_taking_over(q: &Queue, id: &str, text: &str) -> (Vec<Value>, usize) {
    let events = read_once(q, id, text, "done");
    let note = events
        .iter()
        .position(|e| e["type"] == "user_note")
        .unwrap();
    assert_eq!(events[note - 1]["type"], "run_resumed");
    (events, note)
}

/// A queued run whose one call waits until the workspace holds `go`, then answers "done";
/// its id.
fn waiting_queued_run(q: &Queue) -> String {
    let model = q.script(
        "job",
        json!([
            {"tool_calls": [{"id": "s1", "name": "shell", "arguments": {"command": BLOCKS}}]},
            {"final": "done"}
        ]),
    );
    q.submit(&model, &["--allow", "shell"], "wait, then finish")
}

/// `agent resume --json RUN MESSAGE` of a live run, once it said the run has the message.
struct Sender {
    child: Child,
    said: std::io::BufReader<std::process::ChildStderr>,
}

impl Sender {
    fn to_live_run(q: &Queue, id: &str, text: &str) -> Sender {
        use std::io::BufRead as _;
        let mut child = q
            .env
            .bare()
            .args(["--store", &q.url, "resume", "--json", id, text])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut said = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        said.read_line(&mut line).unwrap();
        assert!(line.contains("has your message"), "{line}");
        Sender { child, said }
    }

    /// Its exit code and what it said on stderr after that, once it ended; its `--json`
    /// status is `read` when it exits 0 and `unread` otherwise.
    fn outcome(mut self) -> (Option<i32>, String) {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.said, &mut rest).unwrap();
        let out = self.child.wait_with_output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let read = if out.status.success() {
            "read"
        } else {
            "unread"
        };
        assert_eq!(v["status"], read, "{rest}");
        (out.status.code(), rest)
    }
}

/// The run's events, once it read `text` as one `user_note` and ended answering `answer`.
fn read_once(q: &Queue, id: &str, text: &str, answer: &str) -> Vec<Value> {
    let events = q.events(id);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(count(&events, "user_note"), 1, "{kinds:?}");
    let note = events.iter().find(|e| e["type"] == "user_note").unwrap();
    assert_eq!(note["text"], text);
    assert_eq!(
        events.last().unwrap()["outcome"]["answer"],
        answer,
        "{kinds:?}"
    );
    events
}

/// A message to a queued run that stops before it reads it is not read later: its sender
/// is told the run stopped first, and the drive of a follow-up, once the run is queued
/// again, is not handed it (it left the queue when the run stopped).
#[test]
fn a_message_to_a_queued_run_that_stops_first_is_not_read_later() {
    let q = Queue::new();
    let id = waiting_queued_run(&q);
    let mut worker = q.worker(&["--lease", "1"], false);
    until("the command runs", || {
        count(&q.events(&id), "effect_dispatched") == 1
    });
    let sender = Sender::to_live_run(&q, &id, "also say hello");
    let cancelled = q.agent(&["cancel", &id]);
    assert_eq!(cancelled.status.code(), Some(130), "{}", stderr(&cancelled));
    let (code, said) = sender.outcome();
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains("stopped before it read your message"),
        "{said}"
    );
    let followed = q.agent(&["resume", &id, "go on"]);
    assert_eq!(followed.status.code(), Some(0), "{}", stderr(&followed));
    until("the follow-up is answered", || {
        q.events(&id)
            .iter()
            .filter(|e| e["type"] == "run_ended")
            .count()
            == 2
    });
    worker.kill().unwrap();
    worker.wait().unwrap();
    let events = q.events(&id);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(count(&events, "user_note"), 0, "{kinds:?}");
    assert_eq!(
        events.last().unwrap()["outcome"]["answer"],
        "done",
        "{kinds:?}"
    );
}

/// A worker stopped (SIGSTOP) past its lease: another worker finishes the run, and when
/// the first wakes up it learns it lost the lease and writes nothing.
#[test]
fn a_worker_paused_past_its_lease_cannot_commit_after_waking() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    use std::io::{BufRead as _, BufReader};
    let q = Queue::new();
    let stalling = |delay_ms: u64| {
        q.script(
            "job",
            json!([
                {"tool_calls": [{"id": "r1", "name": "list_dir", "arguments": {}}]},
                {"final": "done", "delay_ms": delay_ms}
            ]),
        )
    };
    let model = stalling(2_000);
    let id = q.submit(&model, &[], "look");
    let mut first = q.worker(&["--lease", "1", "--until-empty"], true);
    until("the first turn is committed", || {
        count(&q.events(&id), "tool_finished") == 1
    });
    let pid = Pid::from_raw(i32::try_from(first.id()).unwrap());
    kill(pid, Signal::SIGSTOP).unwrap();
    stalling(0);
    q.work_until_completed("the second worker completes the run");
    let before = q.events(&id);
    kill(pid, Signal::SIGCONT).unwrap();
    // The first worker says it lost the lease, then finds nothing more to do.
    let told = BufReader::new(first.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .any(|line| line.contains("lost the lease on run"));
    assert!(told, "the first worker noticed it lost the lease");
    assert_eq!(first.wait().unwrap().code(), Some(0));
    assert_eq!(q.events(&id), before, "it wrote nothing");
}

/// Three workers drain a hundred queued runs with a write each while they are killed
/// (`kill -9`) at random instants and restarted: every run ends once, every file is
/// written as asked, no call finishes twice and no committed event is lost.
#[test]
fn three_workers_drain_a_hundred_runs_through_kills() {
    let q = Queue::new();
    let runs = 100;
    let store = agent_store::PostgresStore::connect(&q.url).unwrap();
    let ids: Vec<String> = (0..runs)
        .map(|i| {
            let model = q.script(
                &format!("job{i}"),
                json!([
                    {"tool_calls": [{"id": "w1", "name": "write_file",
                        "arguments": {"path": format!("f{i}.txt"), "content": format!("run {i}")}}]},
                    {"final": "written"}
                ]),
            );
            let spec = agent_cli::worker::RunSpec {
                goal: format!("write f{i}"),
                model,
                base_url: None,
                workspace: q.ws.clone(),
                rules: agent_cli::settings::RuleTexts {
                    allow: vec!["write_file".into()],
                    ..Default::default()
                },
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
            let id = format!("run-{i:03}");
            store
                .submit(&id, &serde_json::to_string(&spec).unwrap())
                .unwrap();
            id
        })
        .collect();
    let spawn = || q.worker(&["--lease", "1", "--concurrency", "2"], false);
    let mut workers: Vec<Child> = (0..3).map(|_| spawn()).collect();
    // A run no worker has started yet is listed `queued`.
    let ended = || {
        q.runs()
            .iter()
            .filter(|r| r["status"] != "running" && r["status"] != "queued")
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
            std::fs::read_to_string(q.ws.join(format!("f{i}.txt"))).unwrap(),
            format!("run {i}")
        );
        let events = q.events(id);
        super::assert_contiguous(&events, id);
        assert_eq!(
            (count(&events, "run_ended"), count(&events, "tool_finished")),
            (1, 1),
            "{id}: {events:?}"
        );
        assert_eq!(
            events.last().unwrap()["outcome"]["reason"],
            "completed",
            "{id}"
        );
    }
}

/// `agent run` on a database with a command that waits for `go` in the workspace, spawned;
/// its id once its command was dispatched.
fn blocked_run(q: &Queue) -> (Child, String) {
    let model = q.script(
        "blocks",
        json!([
            {"tool_calls": [{"id": "c1", "name": "shell", "arguments": {"command": BLOCKS}}]},
            {"final": "went"}
        ]),
    );
    let runner = blocked_runner(q, &model, &[]);
    let mut id = String::new();
    until("the run is listed", || match q.runs().first() {
        Some(run) => {
            id = run["run_id"].as_str().unwrap().to_owned();
            true
        }
        None => false,
    });
    until("its command is dispatched", || {
        q.events(&id)
            .iter()
            .any(|e| e["type"] == "effect_dispatched")
    });
    (runner, id)
}

/// A command that runs until the workspace holds `go`.
const BLOCKS: &str = "while [ ! -e go ]; do sleep 0.05; done";

/// `agent run --json` of `model` in the workspace, allowed `shell` and given `extra`.
fn blocked_runner(q: &Queue, model: &str, extra: &[&str]) -> Child {
    blocked_command(q, model, extra).spawn().unwrap()
}

/// The command [`blocked_runner`] starts.
fn blocked_command(q: &Queue, model: &str, extra: &[&str]) -> std::process::Command {
    let mut cmd = q.env.bare();
    cmd.arg("--store")
        .arg(&q.url)
        .args(["run", "--json", "--allow", "shell", "--model", model])
        .args(extra)
        .arg("--workspace")
        .arg(&q.ws)
        .arg("wait for go")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// A message to a run a process drives on a database (its hold) outlives that process
/// when it dies after the message was handed to it and before a commit held it: the
/// process that takes the run over reads it, and its sender learns it was read.
#[test]
fn a_message_handed_to_a_process_that_dies_is_read_by_the_one_that_takes_over() {
    let q = Queue::new();
    let model = q.script(
        "blocks",
        json!([
            {"tool_calls": [{"id": "c1", "name": "shell", "arguments": {"command": BLOCKS}}]},
            {"final": "went"}
        ]),
    );
    let mut runner = blocked_command(&q, &model, &[])
        .env("FAILPOINTS", "notes_taken=return")
        .spawn()
        .unwrap();
    let mut id = String::new();
    until("its command is dispatched", || {
        id = q
            .runs()
            .first()
            .and_then(|run| run["run_id"].as_str())
            .unwrap_or_default()
            .to_owned();
        !id.is_empty() && count(&q.events(&id), "effect_dispatched") == 1
    });
    let sender = Sender::to_live_run(&q, &id, "also say hello");
    std::fs::write(q.ws.join("go"), "").unwrap();
    assert_eq!(runner.wait().unwrap().code(), None, "the process died");
    let out = q.agent(&["resume", "--json", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (code, said) = sender.outcome();
    assert_eq!(code, Some(0), "{said}");
    read_once(&q, &id, "also say hello", "went");
}

/// A sub-agent's run on a database belongs to the process driving its parent: listed as
/// driven by it while it runs, refused to `agent resume` elsewhere (naming it), and stopped
/// by `agent cancel CHILD` from another process through the parent's hold, as it would be
/// on a directory store: its command stops, it ends `cancelled`, and its parent goes on
/// with that answer and completes.
#[test]
fn a_sub_agent_on_a_database_is_held_with_its_parent_and_cancelled_through_it() {
    let q = Queue::new();
    let model = delegating_script(&q);
    let runner = blocked_runner(&q, &model, &["--allow", "delegate", "--sub-agents"]);
    let by = format!("process {}", runner.id());
    let runner = sub_agent_cancelled_through_its_parent(&q, runner, &by);
    assert!(
        stdout(&runner_output(&q, runner)).contains("the parent went on"),
        "the parent went on with the child's answer"
    );
}

/// The same for a sub-agent of a queued run: its worker drives it, and is asked to stop it
/// through the lease on the parent.
#[test]
fn a_sub_agent_of_a_queued_run_is_cancelled_through_its_worker() {
    let q = Queue::new();
    let model = delegating_script(&q);
    let extra = ["--allow", "shell", "--allow", "delegate", "--sub-agents"];
    let id = q.submit(&model, &extra, "wait for go");
    let worker = q.worker(&["--until-empty"], true);
    runner_output(
        &q,
        sub_agent_cancelled_through_its_parent(&q, worker, "worker "),
    );
    let parent = q.events(&id);
    assert_eq!(
        parent.last().unwrap()["outcome"]["answer"],
        "the parent went on"
    );
}

/// A script whose run delegates to a sub-agent that runs [`BLOCKS`]; its `--model` value.
fn delegating_script(q: &Queue) -> String {
    let path = q.env.dir.path().join("delegates.json");
    let script = json!({
        "turns": [
            {"tool_calls": [{"id": "d1", "name": "delegate", "arguments": {"goal": "wait"}}]},
            {"final": "the parent went on"}
        ],
        "agents": {"wait": {"turns": [
            {"tool_calls": [{"id": "c1", "name": "shell", "arguments": {"command": BLOCKS}}]},
            {"final": "went"}
        ]}}
    });
    std::fs::write(&path, script.to_string()).unwrap();
    format!("script:{}", path.display())
}

/// Once the sub-agent of the run `driver` drives runs its command: the sub-agent is listed
/// as driven by `by…`, refused to another process, and cancelled from another; the driver,
/// to wait for.
fn sub_agent_cancelled_through_its_parent(q: &Queue, driver: Child, by: &str) -> Child {
    let mut child = String::new();
    until("the sub-agent's command is dispatched", || {
        match q.runs().iter().find(|r| r.get("parent").is_some()) {
            Some(run) => child = run["run_id"].as_str().unwrap().to_owned(),
            None => return false,
        }
        q.events(&child)
            .iter()
            .any(|e| e["type"] == "effect_dispatched")
    });
    let listed = q.runs();
    let child_listed = listed
        .iter()
        .find(|r| r["run_id"] == child.as_str())
        .unwrap();
    let live = child_listed["live"].as_str().unwrap_or_default();
    assert!(live.starts_with(by), "{listed:?}");

    let refused = q.agent(&["resume", &child]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains(&format!("being driven by {by}")),
        "{}",
        stderr(&refused)
    );
    let cancelled = q.agent(&["cancel", "--json", &child]);
    if cancelled.status.code() != Some(130) {
        // Let the driver finish before failing.
        std::fs::write(q.ws.join("go"), "").unwrap();
    }
    assert_eq!(cancelled.status.code(), Some(130), "{}", stderr(&cancelled));
    let said: Value = serde_json::from_slice(&cancelled.stdout).unwrap();
    assert_eq!(said["reason"], "cancelled", "{said}");
    assert_eq!(said["run_id"], child.as_str(), "{said}");
    let events = q.events(&child);
    assert_eq!(events.last().unwrap()["outcome"]["reason"], "cancelled");
    assert_eq!(count(&events, "effect_dispatched"), 1);
    driver
}

/// What `driver` printed once it ended (exit 0), with nothing left driven.
fn runner_output(q: &Queue, driver: Child) -> Output {
    let out = driver.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(q.runs().iter().all(|r| r["live"].is_null()), "let go");
    out
}

/// A run an `agent run` process drives on a database is that process's alone: listed as
/// driven by it, refused to `agent resume` elsewhere (naming it), and stopped by `agent
/// cancel` from another process through the database, as a Ctrl-C at its terminal would
/// stop it: its command is stopped, both say `cancelled` (exit 130), and nothing holds the
/// run after.
#[test]
fn a_run_driven_on_a_database_is_held_and_cancelled_through_it() {
    let q = Queue::new();
    let (runner, id) = blocked_run(&q);
    let pid = runner.id().to_string();
    let listed = q.runs();
    let by = listed[0]["live"].as_str().unwrap_or_default().to_owned();
    assert!(by.starts_with(&format!("process {pid}")), "{listed:?}");
    let refused = q.agent(&["resume", &id]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains(&format!("being driven by process {pid}")),
        "{}",
        stderr(&refused)
    );
    let cancelled = q.agent(&["cancel", "--json", &id]);
    assert_eq!(cancelled.status.code(), Some(130), "{}", stderr(&cancelled));
    let said: Value = serde_json::from_slice(&cancelled.stdout).unwrap();
    assert_eq!(said["reason"], "cancelled", "{said}");
    let out = runner.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["reason"], "cancelled", "{v}");
    assert!(!q.ws.join("go").exists());
    let events = q.events(&id);
    assert_eq!(events.last().unwrap()["outcome"]["reason"], "cancelled");
    assert_eq!(q.runs()[0]["live"], Value::Null, "let go");
}

/// The process driving a run on a database dies (`kill -9`; a zombie not yet reaped): on
/// the same machine, `agent resume` takes the run over at once (its holder is gone),
/// without waiting for the hold to run out.
#[test]
fn a_run_whose_process_died_here_is_taken_over_at_once() {
    let q = Queue::new();
    let (mut runner, id) = blocked_run(&q);
    runner.kill().unwrap();
    // Not reaped yet: a zombie is as dead as a process gets.
    let stat = format!("/proc/{}/stat", runner.id());
    until("the killed process is a zombie", || {
        let stat = std::fs::read_to_string(&stat).unwrap_or_default();
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    });
    std::fs::write(q.ws.join("go"), "").unwrap();
    let out = q.agent(&["resume", "--json", &id]);
    runner.wait().unwrap();
    // The command it ran is in doubt: a person says whether it took effect.
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["reason"], "outcome_unknown", "{v}");
    assert_eq!(count(&q.events(&id), "run_resumed"), 1);
    let ws = q.ws.to_str().unwrap();
    let settled = q.agent(&[
        "resolve",
        "--json",
        "--allow",
        "shell",
        "--workspace",
        ws,
        &id,
        "--call",
        "c1",
        "--as",
        "retry",
    ]);
    assert_eq!(settled.status.code(), Some(0), "{}", stderr(&settled));
    assert_eq!(q.runs()[0]["live"], Value::Null);
}

/// A queued run submitted with `--sandbox` runs its commands in the sandbox on the worker
/// that drives it: a write outside the workspace is refused there, one inside is made, and
/// a file it was to hide is not read.
#[test]
fn a_queued_run_s_commands_run_in_its_sandbox_on_the_worker() {
    let q = Queue::new();
    let outside = crate::sandbox::outside_covered();
    let secret = outside.path().join("secret");
    std::fs::write(&secret, "secret-4417").unwrap();
    let command = format!(
        "cat {}; echo x > {}/escaped; echo y > made",
        secret.display(),
        outside.path().display()
    );
    let model = q.script(
        "sandboxed",
        json!([
            {"tool_calls": [{"id": "c1", "name": "shell", "arguments": {"command": command}}]},
            {"final": "done"}
        ]),
    );
    let hide = secret.to_str().unwrap();
    let id = q.submit(
        &model,
        &["--sandbox-hide", hide, "--allow", "shell"],
        "write",
    );
    assert_eq!(drained(&q, &id)["reason"], "completed");
    assert!(q.ws.join("made").exists());
    assert!(!outside.path().join("escaped").exists());
    let events = q.events(&id);
    let finished = events
        .iter()
        .find(|e| e["type"] == "tool_finished")
        .unwrap();
    let output = finished["result"]["output"].as_str().unwrap();
    assert!(output.starts_with("exit code: 0"), "{output}");
    assert!(!output.contains("secret-4417"), "{output}");
}

/// A queued run carries its answer validators to the worker that drives it.
#[test]
fn a_queued_run_s_answer_is_checked_by_the_worker() {
    let q = Queue::new();
    let model = q.script("checked", json!([{"final": "maybe"}, {"final": "yes"}]));
    let id = q.submit(&model, &["--check", "[ \"$(cat)\" = yes ]"], "decide");
    let out = q
        .worker(&["--until-empty"], true)
        .wait_with_output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let events = q.events(&id);
    assert_eq!(count(&events, "answer_rejected"), 1, "{events:?}");
    let ended = events.last().unwrap();
    assert_eq!(ended["outcome"]["reason"], "completed");
    assert_eq!(ended["outcome"]["answer"], "yes");
}

/// A queued run's model is called as the submitter's agent.toml said, not with the
/// worker's defaults: its prices (so its cost budget holds on the worker), whole responses
/// (`stream = false`) and its retries. A cost budget without a price is refused at submit.
#[test]
fn a_queued_run_is_called_and_priced_as_it_was_submitted() {
    use agent_providers::testing::{Reply, Server};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let call = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null,
            "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "list_dir", "arguments": "{}"}}]}}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 7}
    })
    .to_string();
    // A prompt of 1,000 tokens: $0.0025 at $2.50 a million, past the budget at once.
    let costly_call = call.replace(r#""prompt_tokens":50"#, r#""prompt_tokens":1000"#);
    assert_ne!(costly_call, call);
    let priced = rt
        .block_on(Server::start(vec![
            Reply::status(200, costly_call.clone()),
            Reply::status(200, costly_call),
        ]))
        .unwrap();
    let flaky = rt
        .block_on(Server::start(vec![
            Reply::status(500, "{}"),
            Reply::status(200, call),
        ]))
        .unwrap();
    let q = Queue::new();
    let toml = q.env.dir.path().join("agent.toml");
    let ws = q.ws.to_str().unwrap();
    std::fs::write(&toml, "max_cost_usd = 0.0001\nstream = false\n").unwrap();
    let refused = q.agent(&[
        "submit",
        "--model",
        "openai:gpt-4o",
        "--base-url",
        &priced.url,
        "--workspace",
        ws,
        "g",
    ]);
    let err = stderr(&refused);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(err.contains("[prices.\"gpt-4o\"]"), "{err}");
    assert!(q.runs().is_empty(), "nothing was queued");

    std::fs::write(
        &toml,
        "max_cost_usd = 0.0025\nstream = false\nmax_output_tokens = 777\neffort = \"low\"\n\
         [prices.\"gpt-4o\"]\ninput = 2.5\noutput = 10.0\n",
    )
    .unwrap();
    let costly = q.submit("openai:gpt-4o", &["--base-url", &priced.url], "g");
    std::fs::write(&toml, "max_output_tokens = 77\n[retry]\nmax_attempts = 1\n").unwrap();
    let once = q.submit("openai:gpt-4o", &["--base-url", &flaky.url], "g");
    // The worker has no agent.toml of its own to fall back on.
    std::fs::remove_file(&toml).unwrap();
    let out = q
        .env
        .bare()
        .arg("--store")
        .arg(&q.url)
        .args(["worker", "--until-empty"])
        .env("OPENAI_API_KEY", "sk-x")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let reason = |id: &str| {
        q.runs()
            .into_iter()
            .find(|r| r["run_id"] == id)
            .map(|r| r["reason"].clone())
    };
    assert_eq!(reason(&costly), Some(json!("cost_budget_exceeded")));
    let asked = priced.received();
    assert_eq!(
        asked.len(),
        1,
        "1,007 tokens at $2.50-10/M pass $0.0025 at once"
    );
    assert_ne!(asked[0].body["stream"], json!(true), "{}", asked[0].body);
    // The file's cap is 777; what the budget leaves, $0.0025 at $10 a million, is smaller.
    assert_eq!(
        asked[0].body["max_completion_tokens"], 250,
        "{}",
        asked[0].body
    );
    assert_eq!(
        asked[0].body["reasoning_effort"], "low",
        "{}",
        asked[0].body
    );
    assert_eq!(reason(&once), Some(json!("model_error")));
    assert_eq!(flaky.received().len(), 1, "one attempt, as submitted");
    assert_eq!(flaky.received()[0].body["max_completion_tokens"], 77);
}

/// A queued run whose first call, `cat gate`, waits until the test writes to the FIFO
/// `gate` in the workspace, then answers `last`; followed (`agent show --follow`) from
/// before a worker (`--until-empty`) takes it: its id, the follower, the worker and the
/// follower's output.
fn gated_queued_run(
    q: &Queue,
    last: &str,
) -> (
    String,
    Child,
    Child,
    std::io::BufReader<std::process::ChildStdout>,
) {
    let made = std::process::Command::new("mkfifo")
        .arg(q.ws.join("gate"))
        .status()
        .unwrap();
    assert!(made.success());
    let model = q.script(
        "job",
        json!([
            {"tool_calls": [{"id": "c1", "name": "shell", "arguments": {"command": "cat gate"}}]},
            {"final": last}
        ]),
    );
    let id = q.submit(&model, &["--allow", "shell"], "a gated job");
    let mut follow = crate::follower(&q.env, &q.url, &id, &[]);
    let worker = q.worker(&["--until-empty"], true);
    let out = std::io::BufReader::new(follow.stdout.take().unwrap());
    (id, follow, worker, out)
}

/// `agent cancel` of a run a worker drives asks that worker to stop it, through the
/// queue: the command it was running is stopped, nothing more starts, the run ends
/// `cancelled` (exit 130) and the worker goes on with the queue.
#[test]
fn a_queued_run_is_cancelled_while_its_worker_drives_it() {
    let q = Queue::new();
    let (id, follow, worker, mut out) = gated_queued_run(&q, "never asked");
    crate::lines_until(&mut out, "effect_dispatched");
    let cancelled = q.agent(&["cancel", "--json", &id]);
    assert_eq!(cancelled.status.code(), Some(130), "{}", stderr(&cancelled));
    let outcome: Value = serde_json::from_slice(&cancelled.stdout).unwrap();
    assert_eq!(outcome["reason"], "cancelled");
    let worked = worker.wait_with_output().unwrap();
    assert_eq!(worked.status.code(), Some(0), "{}", stderr(&worked));
    let followed = follow.wait_with_output().unwrap();
    assert_eq!(followed.status.code(), Some(130), "{}", stderr(&followed));
    let shown: Value = serde_json::from_slice(&q.agent(&["show", "--json", &id]).stdout).unwrap();
    let events = shown["events"].as_array().unwrap();
    assert_eq!(
        events[events.len() - 2]["result"]["error"]["kind"],
        "cancelled"
    );
    assert_eq!(events[events.len() - 1]["type"], "run_ended");
}

/// A queued run no worker has taken yet is taken off the queue: no worker ever starts it
/// (before, `agent cancel` said there was no such run, and a worker ran it later). It is
/// the newest run (`--last`), as `agent runs` lists it, though it has no log.
#[test]
fn a_queued_run_is_cancelled_before_a_worker_takes_it() {
    let q = Queue::new();
    let earlier = q.script("earlier", json!([{"final": "done before"}]));
    q.submit(&earlier, &[], "earlier");
    q.work_until_completed("an earlier run is completed");
    let model = q.script("job", json!([{"final": "never asked"}]));
    let id = q.submit(&model, &[], "never mind");
    let listed = |runs: Vec<Value>| {
        let run = runs.into_iter().find(|r| r["run_id"] == id.as_str());
        run.map(|r| (r["status"].clone(), r["reason"].clone(), r["goal"].clone()))
    };
    // Listed as queued, though no worker started it (it has no log yet).
    assert_eq!(
        listed(q.runs()),
        Some((json!("queued"), Value::Null, json!("never mind")))
    );
    let shown = q.agent(&["show", "--last"]);
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
    assert!(
        stderr(&shown).contains(&format!(
            "{id} waits in the queue for a worker: nothing ran"
        )),
        "{}",
        stderr(&shown)
    );
    let cancelled = q.agent(&["cancel", "--json", "--last"]);
    assert_eq!(cancelled.status.code(), Some(130), "{}", stderr(&cancelled));
    let outcome: Value = serde_json::from_slice(&cancelled.stdout).unwrap();
    assert_eq!(outcome["reason"], "cancelled");
    assert_eq!(outcome["run_id"], id.as_str());
    let worker = q.worker(&["--until-empty"], true);
    let worked = worker.wait_with_output().unwrap();
    assert_eq!(worked.status.code(), Some(0), "{}", stderr(&worked));
    assert!(q.events(&id).is_empty(), "no worker started it");
    assert_eq!(
        listed(q.runs()),
        Some((json!("stopped"), json!("cancelled"), json!("never mind")))
    );
    let table = stdout(&q.agent(&["runs"]));
    assert!(table.contains("cancelled"), "{table}");
    let shown: Value = serde_json::from_slice(&q.agent(&["show", "--json", &id]).stdout).unwrap();
    assert_eq!(
        shown["queue"],
        "was taken off the queue before a worker started it"
    );
    let again = q.agent(&["cancel", &id]);
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
}

/// A queued run is followed from before a worker takes it until the worker ends it: each
/// event once, as `agent show` prints them, and `agent run`'s exit code.
#[test]
fn a_queued_run_is_followed_until_its_worker_ends_it() {
    let q = Queue::new();
    let (id, follow, worker, mut out) = gated_queued_run(&q, "followed");
    let before = crate::lines_until(&mut out, "effect_dispatched");
    std::fs::write(q.ws.join("gate"), "open\n").unwrap();
    let worked = worker.wait_with_output().unwrap();
    assert_eq!(worked.status.code(), Some(0), "{}", stderr(&worked));
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let followed = follow.wait_with_output().unwrap();
    let err = stderr(&followed);
    assert_eq!(followed.status.code(), Some(0), "{err}");
    let shown = stdout(&q.agent(&["show", &id]));
    assert_eq!(before.concat() + &rest, shown, "each event once, in order");
    assert!(err.contains(&format!("following run {id}, ")), "{err}");
    assert!(
        err.contains(&format!("run {id} finished (completed)")),
        "{err}"
    );
}

/// `agent resume RUN MESSAGE` of a run a worker drives, from anywhere: the message reaches
/// the worker through the database and is committed before the run's next model call.
#[test]
fn a_message_reaches_a_run_a_worker_drives() {
    message_to_a_worker_s_run(false);
}

/// The same for a sub-agent's run the worker drives for its queued parent: the message goes
/// through the parent's row and is read by the sub-agent, not by its parent.
#[test]
fn a_message_reaches_a_sub_agent_a_worker_drives() {
    message_to_a_worker_s_run(true);
}

fn message_to_a_worker_s_run(to_sub_agent: bool) {
    use std::io::BufRead;
    let q = Queue::new();
    let id = if to_sub_agent {
        let model = delegating_script(&q);
        let extra = ["--allow", "shell", "--allow", "delegate", "--sub-agents"];
        q.submit(&model, &extra, "wait for go")
    } else {
        let model = q.script(
            "gated",
            json!([
                {"tool_calls": [{"id": "c1", "name": "shell", "arguments": {"command": BLOCKS}}]},
                {"final": "went"}
            ]),
        );
        q.submit(&model, &["--allow", "shell"], "wait for go")
    };
    let worker = q.worker(&["--until-empty"], true);
    let mut to = id.clone();
    until("its command is dispatched", || {
        if to_sub_agent {
            match q.runs().iter().find(|r| r.get("parent").is_some()) {
                Some(run) => to = run["run_id"].as_str().unwrap().to_owned(),
                None => return false,
            }
        }
        q.events(&to)
            .iter()
            .any(|e| e["type"] == "effect_dispatched")
    });
    let mut told = q
        .env
        .bare()
        .arg("--store")
        .arg(&q.url)
        .args(["resume", "--json", &to, "also say hello"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = std::io::BufReader::new(told.stderr.take().unwrap()).lines();
    let first = said.next().unwrap().unwrap();
    assert!(first.contains("has your message"), "{first}");
    std::fs::write(q.ws.join("go"), "").unwrap();
    let out = told.wait_with_output().unwrap();
    let rest: Vec<String> = said.map(Result::unwrap).collect();
    assert_eq!(out.status.code(), Some(0), "{rest:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, json!({"run_id": to, "status": "read"}));
    let out = worker.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let events = q.events(&to);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let at = |kind: &str| kinds.iter().position(|k| *k == kind).unwrap();
    assert!(at("tool_finished") < at("user_note"), "{kinds:?}");
    assert!(at("user_note") < at("run_ended"), "{kinds:?}");
    assert_eq!(events[at("user_note")]["text"], "also say hello");
    assert_eq!(events.last().unwrap()["outcome"]["answer"], "went");
    let parent = q.events(&id);
    assert_eq!(count(&parent, "user_note"), usize::from(!to_sub_agent));
    assert_eq!(
        parent.last().unwrap()["outcome"]["answer"],
        if to_sub_agent {
            "the parent went on"
        } else {
            "went"
        }
    );
}
