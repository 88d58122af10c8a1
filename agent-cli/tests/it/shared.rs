//! Many `agent` processes on one directory store: runs side by side, a live run read while
//! it goes, a run taken by one process at a time, and runs killed with SIGKILL resumed.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use serde_json::{Value, json};

use super::{Env, stderr};

fn json_out(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", super::stdout(out), stderr(out)))
}

/// Reads a child's `--events` lines until one of type `kind`; returns the events read.
fn events_until(child: &mut Child, kind: &str) -> Vec<Value> {
    let stdout = child.stdout.as_mut().unwrap();
    let mut seen = Vec::new();
    let mut line = String::new();
    let mut reader = BufReader::new(stdout);
    loop {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "the run ended before {kind}"
        );
        let value: Value = serde_json::from_str(&line).unwrap();
        let done = value["type"] == kind;
        seen.push(value);
        if done {
            return seen;
        }
    }
}

#[test]
fn a_live_run_is_listed_and_shown_as_it_goes_and_no_second_process_takes_it() {
    let env = Env::new();
    let gate = env.dir.path().join("gate");
    // The shell call is dispatched: the run waits in `cat gate` until the test writes.
    let (child, seen) = gated_run(&env, &[json!({"final": "done"})]);
    let by = format!("process {}", child.id());

    let runs = json_out(&env.run(&["runs", "--json"]));
    assert_eq!(runs[0]["status"], "running", "{runs}");
    assert_eq!(runs[0]["live"], by.as_str(), "{runs}");
    let id = runs[0]["run_id"].as_str().unwrap().to_owned();
    let table = super::stdout(&env.run(&["runs"]));
    assert!(table.contains(&by) && table.contains("running"), "{table}");

    // What it committed so far, read through the process that drives it.
    let shown = json_out(&env.run(&["show", "--json", &id]));
    let versions: Vec<u64> = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, (1..=seen.len() as u64).collect::<Vec<_>>());
    assert_eq!(shown["live"], by.as_str());
    let text = env.run(&["show", &id]);
    assert!(
        stderr(&text).contains(&format!("run {id} is live, driven by {by}")),
        "{}",
        stderr(&text)
    );
    let context = env.run(&["context", "--json", &id]);
    assert_eq!(context.status.code(), Some(0), "{}", stderr(&context));
    assert_eq!(json_out(&context)["live"], by.as_str());

    // Nobody else may drive it meanwhile (`agent cancel` asks its process to stop it:
    // `a_live_run_is_cancelled_from_another_process`; a message is handed to its process:
    // `conversation::a_message_to_a_live_run_is_read_before_its_next_model_call`).
    for args in [vec!["resume", id.as_str()], vec!["approve", id.as_str()]] {
        let out = env.run(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&format!("run {id} is being driven by {by}")),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }

    std::fs::write(&gate, "open\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let runs = json_out(&env.run(&["runs", "--json"]));
    assert_eq!(runs[0]["status"], "finished", "{runs}");
    assert_eq!(runs[0]["live"], Value::Null, "{runs}");
    assert_eq!(
        json_out(&env.run(&["show", "--json", &id]))["live"],
        Value::Null
    );
}

#[test]
fn a_run_whose_process_was_killed_is_interrupted_not_running() {
    let env = Env::new();
    // The call is dispatched; the command waits on the empty pipe.
    let (mut child, _) = gated_run(&env, &[json!({"final": "done"})]);
    child.kill().unwrap();
    child.wait().unwrap();
    let runs = json_out(&env.run(&["runs", "--json"]));
    assert_eq!(runs[0]["status"], "running", "{runs}");
    assert_eq!(runs[0]["live"], Value::Null, "{runs}");
    let table = super::stdout(&env.run(&["runs"]));
    assert!(table.contains("interrupted"), "{table}");
    // It goes on where it stopped: the command in doubt is put to a person, not run again.
    let id = runs[0]["run_id"].as_str().unwrap();
    let out = env.run(&["resume", "--json", id]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(json_out(&out)["reason"], "outcome_unknown");
}

/// `agent cancel` of a run another process drives asks that process to stop it, as a
/// Ctrl-C at its terminal would: the command it was running is stopped, nothing more
/// starts, both commands say `cancelled` (exit 130), and the log ends so. A run nobody
/// drives is cancelled as before; a cancelled run is not cancelled again.
#[test]
fn a_live_run_is_cancelled_from_another_process() {
    let env = Env::new();
    let (child, seen) = gated_run(&env, &[json!({"final": "never asked"})]);
    let id = run_of(&seen);
    let out = env.run(&["cancel", "--json", &id]);
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert_eq!(json_out(&out)["reason"], "cancelled");
    let driver = child.wait_with_output().unwrap();
    assert_eq!(driver.status.code(), Some(130), "{}", stderr(&driver));
    assert_eq!(
        super::event_types(&env, &id),
        [
            "run_started",
            "decision_proposed",
            "effect_dispatched",
            "tool_finished",
            "run_ended"
        ]
    );
    let shown = json_out(&env.run(&["show", "--json", &id]));
    assert_eq!(shown["events"][3]["result"]["error"]["kind"], "cancelled");
    let again = env.run(&["cancel", &id]);
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
    assert!(
        stderr(&again).contains("already ended"),
        "{}",
        stderr(&again)
    );
}

/// A run whose first call, `cat gate`, waits until the test writes to the FIFO `gate`,
/// then goes on with `then`: its process, once that call is dispatched, and the events it
/// committed until then (the first names the run).
fn gated_run(env: &Env, then: &[Value]) -> (Child, Vec<Value>) {
    let gate = env.dir.path().join("gate");
    if !gate.exists() {
        let made = std::process::Command::new("mkfifo")
            .arg(&gate)
            .status()
            .unwrap();
        assert!(made.success());
    }
    let mut turns = vec![json!(
        {"tool_calls": [{"id": "c1", "name": "shell", "arguments": {"command": "cat gate"}}]}
    )];
    turns.extend_from_slice(then);
    let model = env.script(Value::Array(turns));
    let mut child = env
        .cmd()
        .args(["run", "--json", "--events", "--allow", "shell"])
        .args(["--model", &model, "a goal"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let seen = events_until(&mut child, "effect_dispatched");
    (child, seen)
}

/// The run id the first of a run's events names.
fn run_of(seen: &[Value]) -> String {
    seen[0]["run_id"].as_str().unwrap().to_owned()
}

/// `agent show --follow` from another process prints what the run committed, then each
/// entry as it is committed, and ends when the run does, with `agent run`'s exit code
/// and words; a run that ended is printed at once, with --json one event a line and then
/// the outcome `run --json` prints.
#[test]
fn a_run_is_followed_from_another_process_as_it_commits_until_it_ends() {
    let env = Env::new();
    let store = env.store().display().to_string();
    let (runner, seen) = gated_run(&env, &[json!({"final": "done"})]);
    let id = run_of(&seen);
    let by = format!("driven by process {}", runner.id());
    let mut follow = super::follower(&env, &store, &id, &[]);
    let mut out = BufReader::new(follow.stdout.take().unwrap());
    // What the run committed before the follower started (it waits in the call)...
    let before = super::lines_until(&mut out, "effect_dispatched");
    assert_eq!(before.len(), 3, "{before:?}");
    // ...then what it commits after.
    std::fs::write(env.dir.path().join("gate"), "open\n").unwrap();
    let ran = runner.wait_with_output().unwrap();
    assert_eq!(ran.status.code(), Some(0), "{}", stderr(&ran));
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let followed = follow.wait_with_output().unwrap();
    let err = stderr(&followed);
    assert_eq!(followed.status.code(), Some(0), "{err}");
    assert!(
        rest.contains("tool_finished") && rest.contains("run_ended"),
        "{rest}"
    );
    let shown = super::stdout(&env.run(&["show", &id]));
    assert_eq!(before.concat() + &rest, shown, "each event once, in order");
    assert!(err.contains(&format!("following run {id}, {by}")), "{err}");
    assert!(
        err.contains(&format!("run {id} finished (completed)")),
        "{err}"
    );

    let ended = env.run(&["show", "--follow", "--json", &id]);
    assert_eq!(ended.status.code(), Some(0), "{}", stderr(&ended));
    let lines: Vec<Value> = super::stdout(&ended)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (outcome, events) = lines.split_last().unwrap();
    assert_eq!(outcome["reason"], "completed");
    assert_eq!(outcome["answer"], "done");
    assert_eq!(
        events,
        json_out(&env.run(&["show", "--json", &id]))["events"]
            .as_array()
            .unwrap()
            .as_slice()
    );
}

/// A followed run that pauses for a person ends the following with exit 3 and what to do;
/// so does one whose process is killed, said to be interrupted.
#[test]
fn following_ends_when_the_run_pauses_or_its_process_dies() {
    let env = Env::new();
    let store = env.store().display().to_string();
    let write = json!({"tool_calls": [{"id": "w1", "name": "write_file",
        "arguments": {"path": "out.txt", "content": "x"}}]});
    let (runner, seen) = gated_run(&env, &[write]);
    let id = run_of(&seen);
    let mut follow = super::follower(&env, &store, &id, &[]);
    let mut out = BufReader::new(follow.stdout.take().unwrap());
    super::lines_until(&mut out, "effect_dispatched");
    std::fs::write(env.dir.path().join("gate"), "open\n").unwrap();
    assert_eq!(runner.wait_with_output().unwrap().status.code(), Some(3));
    let rest = super::lines_until(&mut out, "approval_requested");
    assert!(rest.concat().contains("w1 write_file"), "{rest:?}");
    let followed = follow.wait_with_output().unwrap();
    let err = stderr(&followed);
    assert_eq!(followed.status.code(), Some(3), "{err}");
    assert!(
        err.contains(&format!("run {id} paused (approval_required)")),
        "{err}"
    );
    assert!(err.contains(&format!("agent approve {id}")), "{err}");

    let (mut runner, seen) = gated_run(&env, &[json!({"final": "done"})]);
    let id = run_of(&seen);
    let mut follow = super::follower(&env, &store, &id, &["--json"]);
    let mut out = BufReader::new(follow.stdout.take().unwrap());
    super::lines_until(&mut out, "effect_dispatched");
    runner.kill().unwrap();
    runner.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let followed = follow.wait_with_output().unwrap();
    assert_eq!(followed.status.code(), Some(3), "{}", stderr(&followed));
    let last: Value = serde_json::from_str(rest.trim()).unwrap();
    assert_eq!(last["status"], "interrupted", "{rest}");
    assert_eq!(last["run_id"], id.as_str());
}

const PROCESSES: usize = 20;
const TURNS: usize = 50;

/// Process `i`'s run: `TURNS` reads of its own file (each asking for a different number
/// of lines, so that no plan repeats), then its own answer.
fn own_script(env: &Env, i: usize) -> String {
    std::fs::write(
        env.dir.path().join(format!("f{i}.txt")),
        format!("content of {i}\n"),
    )
    .unwrap();
    let mut turns: Vec<Value> = (0..TURNS)
        .map(|t| {
            json!({"tool_calls": [{"id": format!("c{t}"), "name": "read_file",
                "arguments": {"path": format!("f{i}.txt"), "limit": t + 1}}]})
        })
        .collect();
    turns.push(json!({"final": format!("done {i}")}));
    let path = env.dir.path().join(format!("s{i}.json"));
    std::fs::write(&path, json!({ "turns": turns }).to_string()).unwrap();
    format!("script:{}", path.display())
}

/// Every run's log is whole and its own: versions 1..n, its goal, each of its calls
/// finished once with its own file's content, and its own answer.
fn check_own_log(env: &Env, id: &str) {
    let shown = json_out(&env.run(&["show", "--json", id]));
    let events = shown["events"].as_array().unwrap();
    super::assert_contiguous(events, id);
    let goal = events[0]["goal"].as_str().unwrap();
    let i: usize = goal.strip_prefix("task ").unwrap().parse().unwrap();
    let mut finished = BTreeSet::new();
    for e in events.iter().filter(|e| e["type"] == "tool_finished") {
        let result = &e["result"];
        assert_eq!(
            result["output"],
            format!("     1\tcontent of {i}\n"),
            "{id}: {e}"
        );
        assert!(finished.insert(result["call_id"].as_str().unwrap().to_owned()));
    }
    assert_eq!(finished.len(), TURNS, "{id}");
    let end = events.last().unwrap();
    assert_eq!(end["type"], "run_ended", "{id}");
    assert_eq!(end["outcome"]["reason"], "completed", "{id}");
    assert_eq!(end["outcome"]["answer"], format!("done {i}"), "{id}");
}

/// Lists and shows runs in a loop until told to stop; counts the reads and the runs seen
/// live. Any failure of `runs` or `show` fails the test.
fn reader(env: Arc<Env>, stop: Arc<AtomicBool>, reads: Arc<AtomicUsize>, live: Arc<AtomicUsize>) {
    while !stop.load(Ordering::SeqCst) {
        let listed = env.run(&["runs", "--json"]);
        assert_eq!(listed.status.code(), Some(0), "runs: {}", stderr(&listed));
        let runs = json_out(&listed);
        for run in runs.as_array().unwrap().iter().take(3) {
            if run["live"].is_string() {
                live.fetch_add(1, Ordering::SeqCst);
            }
            let id = run["run_id"].as_str().unwrap();
            let shown = env.run(&["show", "--json", id]);
            assert_eq!(shown.status.code(), Some(0), "show: {}", stderr(&shown));
            let events = json_out(&shown)["events"].as_array().unwrap().len() as u64;
            assert!(events >= run["version"].as_u64().unwrap(), "{run}");
            reads.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[test]
fn twenty_processes_share_one_store_while_another_reads_and_half_are_killed() {
    let env = Arc::new(Env::new());
    let models: Vec<String> = (0..PROCESSES).map(|i| own_script(&env, i)).collect();
    let mut children: Vec<Child> = models
        .iter()
        .enumerate()
        .map(|(i, model)| {
            env.cmd()
                .args(["run", "--json", "--events", "--max-steps", "60"])
                .args(["--model", model, &format!("task {i}")])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let live = Arc::new(AtomicUsize::new(0));
    let lister = {
        let (env, stop, reads, live) = (env.clone(), stop.clone(), reads.clone(), live.clone());
        std::thread::spawn(move || reader(env, stop, reads, live))
    };
    // The even ones are killed after their (10 + 4i)th event (of 103), in the middle of the run; the
    // odd ones run to the end.
    let watchers: Vec<_> = children
        .drain(..)
        .enumerate()
        .map(|(i, mut child)| {
            std::thread::spawn(move || {
                let stdout = child.stdout.take().unwrap();
                let mut events = 0;
                let mut last = String::new();
                for line in BufReader::new(stdout).lines() {
                    let line = line.unwrap();
                    events += 1;
                    if i % 2 == 0 && events == 10 + 4 * i {
                        child.kill().unwrap();
                        child.wait().unwrap();
                        return (i, None);
                    }
                    last = line;
                }
                let out = child.wait_with_output().unwrap();
                assert_eq!(out.status.code(), Some(0), "{i}: {}", stderr(&out));
                (i, Some(serde_json::from_str::<Value>(&last).unwrap()))
            })
        })
        .collect();
    let ended: Vec<(usize, Option<Value>)> =
        watchers.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, Ordering::SeqCst);
    lister.join().unwrap();
    assert!(
        reads.load(Ordering::SeqCst) > 0,
        "the reader never read a run"
    );

    let killed: Vec<usize> = ended
        .iter()
        .filter(|(_, o)| o.is_none())
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(killed.len(), PROCESSES / 2);
    for (i, outcome) in &ended {
        if let Some(outcome) = outcome {
            assert_eq!(outcome["answer"], format!("done {i}"), "{outcome}");
        }
    }
    let runs = json_out(&env.run(&["runs", "--json"]));
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), PROCESSES, "every run is listed");
    let interrupted: Vec<&str> = runs
        .iter()
        .filter(|r| r["status"] == "running")
        .map(|r| {
            assert_eq!(r["live"], Value::Null, "a dead process drives nothing: {r}");
            r["run_id"].as_str().unwrap()
        })
        .collect();
    // A killed process's run is interrupted, or finished if the kill came after its last
    // commit (its events can wait in the pipe after the run ended); the others finished.
    for r in runs {
        let task: usize = r["goal"].as_str().unwrap()["task ".len()..]
            .parse()
            .unwrap();
        match r["status"].as_str() {
            Some("running") => assert!(killed.contains(&task), "{r}"),
            _ => assert_eq!(r["reason"], "completed", "{r}"),
        }
    }
    assert!(!interrupted.is_empty(), "no kill landed mid-run: {runs:?}");
    // The killed ones resume, side by side too.
    let resumed: Vec<_> = interrupted
        .iter()
        .map(|id| {
            env.cmd()
                .args(["resume", "--json", id])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in resumed {
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    for run in runs {
        check_own_log(&env, run["run_id"].as_str().unwrap());
    }
}
