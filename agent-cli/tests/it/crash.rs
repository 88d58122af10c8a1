//! Crash recovery with the real binary: `kill -9` at random instants (seeded), and crash
//! points right after a dispatch record and right after a tool ran. Whatever happens, the
//! run ends `completed`, no committed event is lost or duplicated, and every side effect
//! happened exactly once.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use super::Env;

const TURNS: usize = 6;

/// A small deterministic generator (64-bit LCG), so a failing seed can be replayed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

/// Every turn appends one line to `effects.txt` with a shell call.
fn appending_script(env: &Env) -> String {
    let mut turns: Vec<Value> = (1..=TURNS)
        .map(|k| {
            json!({"tool_calls": [{
                "id": format!("call-{k}"),
                "name": "shell",
                "arguments": {"command": format!("sleep 0.01; echo call-{k} >> effects.txt")}
            }]})
        })
        .collect();
    turns.push(json!({"final": "all lines appended"}));
    env.script(Value::Array(turns))
}

enum Attempt {
    Finished(Output),
    Killed,
}

/// Runs `agent` with `args`, killing it with SIGKILL after `kill_after` unless it is done.
fn attempt(env: &Env, args: &[&str], kill_after: Option<Duration>) -> Attempt {
    let mut child = env
        .cmd()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(delay) = kill_after {
        // The instant of the crash is the point of this test, not a wait for something.
        std::thread::sleep(delay);
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            child.wait().unwrap();
            return Attempt::Killed;
        }
    }
    Attempt::Finished(child.wait_with_output().unwrap())
}

fn lines(dir: &Path) -> Vec<String> {
    let mut lines: Vec<String> = std::fs::read_to_string(dir.join("effects.txt"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

fn expected_lines() -> Vec<String> {
    let mut v: Vec<String> = (1..=TURNS).map(|k| format!("call-{k}")).collect();
    v.sort();
    v
}

/// Checks the log of a finished run: contiguous versions, one result per call.
fn check_log(env: &Env, run_id: &str) {
    let show = env.run(&["show", "--json", run_id]);
    let v: Value = serde_json::from_slice(&show.stdout).unwrap();
    let events = v["events"].as_array().unwrap();
    super::assert_contiguous(events, "no event lost or repeated");
    let mut results: BTreeMap<String, u32> = BTreeMap::new();
    for e in events.iter().filter(|e| e["type"] == "tool_finished") {
        *results
            .entry(e["result"]["call_id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert!(
        results.values().all(|n| *n == 1),
        "one result per call: {results:?}"
    );
    assert_eq!(events.last().unwrap()["outcome"]["reason"], "completed");
}

/// The next invocation of the harnesses: start the run, settle what is in doubt (looking
/// at the world, as a person would), or resume it.
fn next_args(
    env: &Env,
    model: &str,
    run_id: Option<&str>,
    in_doubt: Option<&String>,
) -> Vec<String> {
    let args: Vec<&str> = match (run_id, in_doubt) {
        (None, _) => vec![
            "run",
            "--json",
            "--allow",
            "shell",
            "--model",
            model,
            "append lines",
        ],
        (Some(id), Some(call)) => {
            let how = if lines(env.dir.path()).contains(call) {
                "committed"
            } else {
                "retry"
            };
            vec![
                "resolve", "--json", "--allow", "shell", id, "--call", call, "--as", how,
            ]
        }
        (Some(id), None) => vec!["resume", "--json", "--allow", "shell", id],
    };
    args.into_iter().map(str::to_owned).collect()
}

/// Drives one run to completion through crashes; returns (kills, kills after the run had
/// committed something, settled in doubt).
fn survive(env: &Env, model: &str, rng: &mut Lcg, max_kill_ms: u64) -> (u32, u32, u32) {
    let mut kills = 0;
    let mut inside = 0;
    let mut settled = 0;
    let mut run_id: Option<String> = None;
    let mut in_doubt: Vec<String> = Vec::new();
    for _ in 0..400 {
        let kill_after = Some(Duration::from_millis(rng.next() % max_kill_ms));
        let args = next_args(env, model, run_id.as_deref(), in_doubt.first());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match attempt(env, &args, kill_after) {
            Attempt::Killed => {
                kills += 1;
                if run_id.is_none() {
                    let runs: Value =
                        serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
                    run_id = runs[0]["run_id"].as_str().map(str::to_owned);
                }
                if run_id.is_some() {
                    inside += 1;
                }
                // What was in doubt may have been settled before the kill; ask again.
                in_doubt.clear();
            }
            Attempt::Finished(out) => {
                let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
                    panic!("{args:?}: {}", String::from_utf8_lossy(&out.stderr))
                });
                run_id = v["run_id"].as_str().map(str::to_owned);
                match (out.status.code(), v["reason"].as_str()) {
                    (Some(0), Some("completed")) => {
                        check_log(env, run_id.as_deref().unwrap());
                        return (kills, inside, settled);
                    }
                    (Some(3), Some("outcome_unknown")) => {
                        settled += 1;
                        in_doubt = v["pending"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|p| p["call_id"].as_str().unwrap().to_owned())
                            .collect();
                    }
                    other => panic!(
                        "{args:?} ended {other:?}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    ),
                }
            }
        }
    }
    panic!("the run did not finish in 400 attempts");
}

#[test]
fn kill_9_at_random_instants_loses_nothing_and_repeats_no_effect() {
    // 100 kills in the suite; AGENT_CRASH_KILLS=N (and AGENT_CRASH_SEED) for longer runs.
    let target: u32 = std::env::var("AGENT_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let seed: u64 = std::env::var("AGENT_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_0001);
    let mut rng = Lcg(seed);
    let (mut kills, mut inside, mut settled, mut runs) = (0, 0, 0, 0);
    while kills < target {
        let env = Env::new();
        let model = appending_script(&env);
        let (k, i, s) = survive(&env, &model, &mut rng, 200);
        assert_eq!(
            lines(env.dir.path()),
            expected_lines(),
            "every effect exactly once"
        );
        kills += k;
        inside += i;
        settled += s;
        runs += 1;
    }
    eprintln!(
        "crash harness: {runs} runs, {kills} kills ({inside} after the run began), {settled} \
         outcomes settled from the effects file"
    );
    // Random instants may fall in start-up; enough of them must fall inside the runs.
    assert!(
        inside * 4 >= kills,
        "{inside} of {kills} kills landed inside a run"
    );
}

/// Runs `agent` with `--events`, and kills it with SIGKILL right after it printed its
/// `n`th committed event: a crash known to land inside the run, after that commit. Returns
/// the kind of that event, or the output when the invocation ended first.
fn attempt_after_event(env: &Env, args: &[&str], n: usize) -> Result<String, Output> {
    use std::io::BufRead;
    let mut child = env
        .cmd()
        .args(args)
        .arg("--events")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut seen = 0;
    let mut rest = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.unwrap();
        let value: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        if let Some(kind) = value.get("type").and_then(Value::as_str) {
            seen += 1;
            if seen == n {
                child.kill().unwrap();
                child.wait().unwrap();
                return Ok(kind.to_owned());
            }
        } else {
            rest.push(line);
        }
    }
    let mut out = child.wait_with_output().unwrap();
    // The last line without a `type` is the `--json` object.
    out.stdout = rest.last().cloned().unwrap_or_default().into_bytes();
    Err(out)
}

/// Kills after the 1st to 4th event each invocation commits, until every kind of commit
/// point of a turn has been crashed after several times; every run still ends completed,
/// with each effect exactly once and no event lost, and the effects in doubt (a kill right
/// after `effect_dispatched`) are settled by a person.
#[test]
fn kill_9_after_each_kind_of_commit_loses_nothing_and_repeats_no_effect() {
    let mut rng = Lcg(0x5eed_0002);
    let mut kinds: BTreeMap<String, u32> = BTreeMap::new();
    let (mut kills, mut settled, mut runs) = (0u32, 0u32, 0u32);
    let wanted = [
        "run_started",
        "decision_proposed",
        "effect_dispatched",
        "tool_finished",
    ];
    let enough = |kinds: &BTreeMap<String, u32>, kills: u32| {
        kills >= 30
            && wanted
                .iter()
                .all(|k| kinds.get(*k).copied().unwrap_or(0) >= 2)
    };
    while runs < 40 && !enough(&kinds, kills) {
        let env = Env::new();
        let model = appending_script(&env);
        let mut run_id: Option<String> = None;
        let mut in_doubt: Option<String> = None;
        let mut done = false;
        for _ in 0..200 {
            let args = next_args(&env, &model, run_id.as_deref(), in_doubt.as_ref());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            // A fresh run is killed after its start half the time: that commit point is
            // reached once per run.
            let n = if run_id.is_none() && rng.next().is_multiple_of(2) {
                1
            } else {
                1 + (rng.next() % 4) as usize
            };
            match attempt_after_event(&env, &args, n) {
                Ok(kind) => {
                    kills += 1;
                    *kinds.entry(kind).or_default() += 1;
                    if run_id.is_none() {
                        let runs: Value =
                            serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
                        run_id = runs[0]["run_id"].as_str().map(str::to_owned);
                    }
                    in_doubt = None;
                }
                Err(out) => {
                    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
                        panic!("{args:?}: {}", String::from_utf8_lossy(&out.stderr))
                    });
                    run_id = v["run_id"].as_str().map(str::to_owned);
                    match (out.status.code(), v["reason"].as_str()) {
                        (Some(0), Some("completed")) => {
                            done = true;
                            break;
                        }
                        (Some(3), Some("outcome_unknown")) => {
                            settled += 1;
                            in_doubt = v["pending"][0]["call_id"].as_str().map(str::to_owned);
                        }
                        other => panic!(
                            "{args:?} ended {other:?}: {}",
                            String::from_utf8_lossy(&out.stderr)
                        ),
                    }
                }
            }
        }
        assert!(done, "the run did not finish in 200 attempts");
        check_log(&env, run_id.as_deref().unwrap());
        assert_eq!(
            lines(env.dir.path()),
            expected_lines(),
            "every effect exactly once"
        );
        runs += 1;
    }
    eprintln!("crash harness by events: {runs} runs, {kills} kills {kinds:?}, {settled} settled");
    for kind in wanted {
        assert!(
            kinds.get(kind).copied().unwrap_or(0) >= 2,
            "{kind} was crashed after too rarely: {kinds:?}"
        );
    }
    assert!(
        settled >= 2,
        "kills right after a dispatch leave effects in doubt for a person: {settled}"
    );
}

/// A run killed in its first turn is taken up by `agent resume` with a `run_resumed` event
/// (the time it lay dead is not worked time), shown as such, once.
#[test]
fn a_killed_run_is_taken_up_with_run_resumed() {
    // The run is short: a kill that came after it ended proves nothing, and is made again.
    let (env, run) = (0..20)
        .find_map(|_| {
            let env = Env::new();
            let model = env.script(json!([
                {"tool_calls": [{"id": "c1", "name": "list_dir", "arguments": {"path": "."}}]},
                {"final": "listed"}
            ]));
            let kind = attempt_after_event(&env, &["run", "--json", "--model", &model, "list"], 2)
                .expect("killed after its second event");
            assert_eq!(kind, "decision_proposed");
            let runs: Value = serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
            let run = runs[0]["run_id"].as_str().unwrap().to_owned();
            let ended = super::event_types(&env, &run)
                .iter()
                .any(|k| k == "run_ended");
            (!ended).then_some((env, run))
        })
        .expect("a kill came before the run ended");
    resumed(&env, &run);
    let kinds = super::event_types(&env, &run);
    let at = kinds.iter().position(|k| *k == "run_resumed").unwrap();
    assert_eq!(
        kinds.iter().filter(|k| **k == "run_resumed").count(),
        1,
        "{kinds:?}"
    );
    // After what the killed process committed (its call's result, if it got that far).
    assert!(
        at == 2 || (at == 3 && kinds[2] == "tool_finished"),
        "{kinds:?}"
    );
    assert_eq!(kinds.last().map(String::as_str), Some("run_ended"));
    let text = String::from_utf8(env.run(&["show", &run]).stdout).unwrap();
    let line = text.lines().find(|l| l.contains("run_resumed")).unwrap();
    assert!(
        line.contains("taken up again; the time since the event before is not counted"),
        "{line}"
    );
}

/// `agent run` asked to stop (SIGTERM: a service manager, `timeout`, `docker stop`) lets
/// its run go at the next step: the command in flight finishes and is committed, the run
/// is left interrupted with nothing in doubt (exit 3, saying how to go on), and `agent
/// resume` takes it up from there without running the command again.
#[test]
fn a_run_asked_to_stop_is_let_go_at_its_next_step() {
    let_go_when(Signal::SIGTERM, false);
}

/// Asked to stop while its sub-agent runs a command, a run lets the sub-agent go at its
/// next step (the command finished and committed), then itself: `agent resume` continues
/// the sub-agent, with nothing in doubt and the command not run again.
#[test]
fn a_run_asked_to_stop_lets_its_sub_agent_go_at_its_next_step() {
    let_go_when(Signal::SIGTERM, true);
}

/// A closed terminal (SIGHUP: an SSH session that dropped) stops a run as SIGTERM does,
/// with nothing left in doubt.
#[test]
fn a_run_whose_terminal_closed_is_let_go_at_its_next_step() {
    let_go_when(Signal::SIGHUP, false);
}

/// A run started ignoring SIGHUP (`nohup`) keeps ignoring it, and goes on to its end.
#[test]
fn a_run_started_with_nohup_goes_on_when_its_terminal_closes() {
    let env = Env::new();
    let (child, run, _) = waiting_for_go(&env, false, |cmd| {
        // `trap '' HUP`, as `nohup` does, then `agent` in the shell's place.
        let mut sh = std::process::Command::new("sh");
        sh.args(["-c", "trap '' HUP; exec \"$0\" \"$@\""])
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (key, value) in cmd.get_envs() {
            match value {
                Some(value) => sh.env(key, value),
                None => sh.env_remove(key),
            };
        }
        sh.current_dir(cmd.get_current_dir().unwrap());
        sh
    });
    nix::sys::signal::kill(pid_of(&child), Signal::SIGHUP).unwrap();
    std::fs::write(env.dir.path().join("go"), "").unwrap();
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(!said.contains("asked to stop"), "{said}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["answer"], "went");
    assert_eq!(
        super::event_types(&env, &run).last().map(String::as_str),
        Some("run_ended")
    );
}

fn pid_of(child: &std::process::Child) -> nix::unistd::Pid {
    nix::unistd::Pid::from_raw(child.id() as i32)
}

/// `agent run` (the command `wrap` makes of it) of a run whose command waits for a file
/// `go` (run by a sub-agent of the run `through_sub_agent`), once that command is
/// dispatched: the process, the run's id and the id of the run that runs the command.
fn waiting_for_go(
    env: &Env,
    through_sub_agent: bool,
    wrap: impl FnOnce(std::process::Command) -> std::process::Command,
) -> (std::process::Child, String, String) {
    let waits = json!([
        {"tool_calls": [{"id": "c1", "name": "shell", "arguments": {
            "command": "while [ ! -e go ]; do sleep 0.05; done; echo ran >> ran.txt"}}]},
        {"final": "went"}
    ]);
    let mut cmd = env.cmd();
    cmd.args(["run", "--json", "--allow", "shell"]);
    let model = if through_sub_agent {
        cmd.args(["--sub-agents", "--allow", "delegate"]);
        let path = env.dir.path().join("delegates.json");
        let script = json!({
            "turns": [
                {"tool_calls": [{"id": "d1", "name": "delegate", "arguments": {"goal": "wait for go"}}]},
                {"final": "went"}
            ],
            "agents": {"wait for go": {"turns": waits}}
        });
        std::fs::write(&path, script.to_string()).unwrap();
        format!("script:{}", path.display())
    } else {
        env.script(waits)
    };
    cmd.args(["--model", &model, "wait"]);
    let child = wrap(cmd)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (mut run, mut runner) = (String::new(), String::new());
    let dispatched = eventually(Duration::from_secs(60), || {
        let runs: Value =
            serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap_or(Value::Null);
        let (Some(id), Some(last)) = (runs[0]["run_id"].as_str(), runs.as_array().unwrap().last())
        else {
            return false;
        };
        run = id.to_owned();
        runner = last["run_id"].as_str().unwrap().to_owned();
        (runner != run) == through_sub_agent
            && super::event_types(env, &runner)
                .iter()
                .any(|k| k == "effect_dispatched")
    });
    assert!(dispatched, "the command was dispatched");
    (child, run, runner)
}

/// [`waiting_for_go`], asked to stop by `signal` once its command runs, and `go` made once
/// `agent` said it stops: its output, what it said after that, the run's id and the id of
/// the run that ran the command.
fn let_go_by(
    env: &Env,
    signal: Signal,
    through_sub_agent: bool,
) -> (Output, Vec<String>, String, String) {
    use std::io::BufRead;
    let (mut child, run, runner) = waiting_for_go(env, through_sub_agent, |cmd| cmd);
    nix::sys::signal::kill(pid_of(&child), signal).unwrap();
    // The command finishes only once `agent` heard it.
    let mut said = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let heard = said
        .by_ref()
        .map(Result::unwrap)
        .find(|l| l.contains("asked to stop"));
    assert!(heard.is_some(), "it says it stops");
    std::fs::write(env.dir.path().join("go"), "").unwrap();
    let out = child.wait_with_output().unwrap();
    let rest: Vec<String> = said.map(Result::unwrap).collect();
    (out, rest, run, runner)
}

/// A message to an interrupted run (here let go by SIGTERM) takes it up, the message read
/// before its next model call, after the results of what it ran: no new exchange.
#[test]
fn a_message_to_an_interrupted_run_is_read_as_it_is_taken_up() {
    let env = Env::new();
    let (out, rest, run, _) = let_go_by(&env, Signal::SIGTERM, false);
    assert_eq!(out.status.code(), Some(3), "{rest:?}");
    let out = env.run(&["resume", "--json", &run, "also say hello"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["answer"], "went");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("before it read"));
    let kinds = super::event_types(&env, &run);
    let at = |kind: &str| kinds.iter().position(|k| k == kind).unwrap();
    assert!(at("tool_finished") < at("run_resumed"), "{kinds:?}");
    assert!(at("run_resumed") < at("user_note"), "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| *k == "user_message").count(), 0);
    let prompt = String::from_utf8(env.run(&["context", &run, "--at", "2"]).stdout).unwrap();
    assert!(prompt.contains("also say hello"), "{prompt}");
}

/// A message to a run killed with a command in doubt: taken up, the run pauses for a
/// person to settle the command before any model call, so it never reads the message, and
/// the sender is told so.
#[test]
fn a_message_to_a_run_that_pauses_when_taken_up_is_said_unread() {
    let env = Env::new();
    let (child, run, _) = waiting_for_go(&env, false, |cmd| cmd);
    nix::sys::signal::kill(pid_of(&child), Signal::SIGKILL).unwrap();
    child.wait_with_output().unwrap();
    let out = env.run(&["resume", &run, "also say hello"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(said.contains("paused (outcome_unknown)"), "{said}");
    assert!(
        said.contains(&format!(
            "run {run} stopped before it read your message; send it again once it goes on"
        )),
        "{said}"
    );
    assert!(!super::event_types(&env, &run).contains(&"user_note".to_owned()));
}

/// [`a_run_asked_to_stop_is_let_go_at_its_next_step`], asked by `signal` (the command run
/// by a sub-agent `through_sub_agent`).
fn let_go_when(signal: Signal, through_sub_agent: bool) {
    let env = Env::new();
    let (out, rest, run, runner) = let_go_by(&env, signal, through_sub_agent);
    assert_eq!(out.status.code(), Some(3), "{rest:?}");
    assert!(
        rest.iter().any(
            |l| l.contains(&format!("run {run} was let go at its next step"))
                && l.contains(&format!("`agent resume {run}`"))
        ),
        "{rest:?}"
    );
    let said: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        said,
        json!({"run_id": run, "status": "interrupted", "reason": null})
    );
    // The command's result is committed; a parent's call to its sub-agent is left in
    // flight, continued when the run is taken up.
    let kinds = super::event_types(&env, &runner);
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("tool_finished"),
        "{kinds:?}"
    );
    if through_sub_agent {
        let kinds = super::event_types(&env, &run);
        assert_eq!(
            kinds.last().map(String::as_str),
            Some("effect_dispatched"),
            "{kinds:?}"
        );
    }

    // A sub-agent started is continued without asking about it again (`--allow delegate`
    // is not given here).
    let out = resumed(&env, &run);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["answer"], "went");
    let kinds = super::event_types(&env, &runner);
    let count = |kind: &str| kinds.iter().filter(|k| *k == kind).count();
    assert_eq!(
        (count("effect_dispatched"), count("run_resumed")),
        (1, 1),
        "{kinds:?}"
    );
    assert_eq!(count("effect_reconciled"), 0, "nothing was in doubt");
    assert_eq!(
        std::fs::read_to_string(env.dir.path().join("ran.txt")).unwrap(),
        "ran\n",
        "the command ran once"
    );
}

/// `agent resume --json RUN`, which must complete the run.
fn resumed(env: &Env, run: &str) -> Output {
    let out = env.run(&["resume", "--json", run]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs with a crash point armed, then recovers without it.
fn crash_at(point: &str, turns: Value, allow: &str) -> (Env, String, Output) {
    let env = Env::new();
    let model = env.script(turns);
    let out = env
        .cmd()
        .env("FAILPOINTS", format!("{point}=return"))
        .args(["run", "--json", "--allow", allow, "--model", &model, "g"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the crash point aborted the process");
    let runs: Value = serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
    let id = runs[0]["run_id"].as_str().unwrap().to_owned();
    let resumed = env.run(&["resume", "--json", "--allow", allow, &id]);
    (env, id, resumed)
}

fn append_turns() -> Value {
    json!([
        {"tool_calls": [{"id": "c1", "name": "shell", "arguments": {"command": "echo one >> effects.txt"}}]},
        {"final": "done"}
    ])
}

#[test]
fn crash_after_the_dispatch_record_is_in_doubt_and_retried_by_a_persons_word() {
    let (env, id, resumed) = crash_at("after_dispatch", append_turns(), "shell");
    assert_eq!(resumed.status.code(), Some(3));
    let v: Value = serde_json::from_slice(&resumed.stdout).unwrap();
    assert_eq!(v["reason"], "outcome_unknown");
    assert_eq!(v["pending"][0]["call_id"], "c1");
    assert!(
        lines(env.dir.path()).is_empty(),
        "the effect did not happen, and was not guessed"
    );
    let done = env.run(&[
        "resolve", "--json", "--allow", "shell", &id, "--call", "c1", "--as", "retry",
    ]);
    assert_eq!(
        done.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_eq!(lines(env.dir.path()), ["one"]);
    check_log(&env, &id);
}

#[test]
fn crash_after_the_tool_ran_is_settled_as_committed_without_running_it_again() {
    let (env, id, resumed) = crash_at("after_tools", append_turns(), "shell");
    assert_eq!(resumed.status.code(), Some(3));
    assert_eq!(lines(env.dir.path()), ["one"]);
    let wrong = env.run(&["resolve", &id, "--call", "c1", "--as", "maybe"]);
    assert_eq!(wrong.status.code(), Some(2));
    let done = env.run(&[
        "resolve",
        "--json",
        "--allow",
        "shell",
        &id,
        "--call",
        "c1",
        "--as",
        "committed",
    ]);
    assert_eq!(
        done.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_eq!(lines(env.dir.path()), ["one"], "not run twice");
    check_log(&env, &id);
}

#[test]
fn a_write_interrupted_after_it_ran_is_reconciled_by_its_content_hash() {
    let turns = json!([
        {"tool_calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "out.txt", "content": "hello\n"}}]},
        {"final": "done"}
    ]);
    let (env, id, resumed) = crash_at("after_tools", turns, "write_file");
    assert_eq!(
        resumed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let show = String::from_utf8_lossy(&env.run(&["show", &id]).stdout).into_owned();
    assert!(
        show.contains("effect_reconciled") && show.contains("w1 applied"),
        "{show}"
    );
    check_log(&env, &id);
}

#[test]
fn cancel_ends_a_paused_run() {
    let env = Env::new();
    let model = env.script(append_turns());
    let out = env.run(&["run", "--json", "--model", &model, "g"]);
    assert_eq!(out.status.code(), Some(3));
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let cancelled = env.run(&["cancel", "--json", &id]);
    assert_eq!(cancelled.status.code(), Some(130));
    let v: Value = serde_json::from_slice(&cancelled.stdout).unwrap();
    assert_eq!(v["reason"], "cancelled");
    let again = env.run(&["cancel", &id]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already ended"));
    let resumed = env.run(&["resume", "--json", &id]);
    assert_eq!(
        resumed.status.code(),
        Some(130),
        "a cancelled run stays cancelled"
    );
}

/// Recovery looks the effect up with the call as proposed: a secret in it is expanded
/// again, so the content hash matches and nothing runs twice; the log never holds it.
#[test]
fn a_write_holding_a_secret_is_reconciled_with_the_call_as_proposed() {
    let env = Env::new();
    let secret = "tok-5e1f0c2b9a7d";
    let content = format!("token = {secret}\n");
    let model = env.script(json!([
        {"tool_calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "out.txt", "content": content}}]},
        {"final": "done"}
    ]));
    let agent = |args: &[&str], failpoint: bool| {
        let mut cmd = env.cmd();
        cmd.env("DEPLOY_TOKEN", secret);
        if failpoint {
            cmd.env("FAILPOINTS", "after_tools=return");
        }
        cmd.args(args).output().unwrap()
    };
    let crashed = agent(
        &[
            "run",
            "--json",
            "--allow",
            "write_file",
            "--model",
            &model,
            "g",
        ],
        true,
    );
    assert!(
        !crashed.status.success(),
        "the crash point aborted the process"
    );
    let runs: Value = serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
    let id = runs[0]["run_id"].as_str().unwrap().to_owned();
    let resumed = agent(&["resume", "--json", "--allow", "write_file", &id], false);
    assert_eq!(
        resumed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let show = String::from_utf8_lossy(&env.run(&["show", "--json", &id]).stdout).into_owned();
    assert!(show.contains(r#""finding":{"applied""#), "{show}");
    assert!(!show.contains(secret), "{show}");
    assert_eq!(
        std::fs::read_to_string(env.dir.path().join("out.txt")).unwrap(),
        content
    );
    check_log(&env, &id);
}

#[test]
fn a_call_in_doubt_settled_as_rejected_is_never_run() {
    let (env, id, resumed) = crash_at("after_dispatch", append_turns(), "shell");
    assert_eq!(resumed.status.code(), Some(3));
    let done = env.run(&[
        "resolve", "--json", "--allow", "shell", &id, "--call", "c1", "--as", "rejected",
    ]);
    assert_eq!(
        done.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(
        lines(env.dir.path()).is_empty(),
        "a rejected effect is not run"
    );
    let show = String::from_utf8_lossy(&env.run(&["show", "--json", &id]).stdout).into_owned();
    assert!(show.contains(r#""resolution":"rejected""#), "{show}");
    check_log(&env, &id);
}

/// A crash between the durable dispatch record and the write: on resume the tool looks the
/// effect up, finds it not applied, and the write runs, once.
#[test]
fn a_write_dispatched_but_not_run_is_reconciled_as_not_applied_and_run() {
    let turns = json!([
        {"tool_calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "out.txt", "content": "hello\n"}}]},
        {"final": "done"}
    ]);
    let (env, id, resumed) = crash_at("after_dispatch", turns, "write_file");
    assert_eq!(
        resumed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let show = String::from_utf8_lossy(&env.run(&["show", &id]).stdout).into_owned();
    assert!(show.contains("w1 not applied"), "{show}");
    assert_eq!(
        std::fs::read_to_string(env.dir.path().join("out.txt")).unwrap(),
        "hello\n"
    );
    check_log(&env, &id);
}

/// The system's pid of the process that `pid` names in the PID namespace it runs in (where
/// a command runs, and sees a `/proc` of its namespace's alone), working in `dir`: the
/// process whose last `NSpid` is `pid`, the same as its pid outside any namespace. `None`
/// once no such process is left.
fn system_pid(dir: &std::path::Path, pid: &str) -> Option<String> {
    let dir = dir.canonicalize().unwrap();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            let nspid = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
            let inside = nspid.split_whitespace().last()?;
            let cwd = std::fs::read_link(entry.path().join("cwd")).ok()?;
            (inside == pid && cwd == dir).then(|| entry.file_name().to_string_lossy().into_owned())
        })
}

/// Whether process `pid` still runs (a zombie does not: it did all it will do).
fn running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
        !matches!(state.and_then(|s| s.chars().next()), Some('Z' | 'X'))
    })
}

/// Polls `done` (a file appearing, a process ending) until it holds or `within` passes.
fn eventually(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::yield_now();
    }
    done()
}

/// Runs `agent` with `args` until the process its call started has written its pid into
/// `pid_file`, kills the run with `kill -9`, and checks that the process dies soon after
/// and never writes the line it would write a minute later to `effects.txt`.
fn killed_mid_call(env: &Env, args: &[&str], pid_file: &str) {
    let mut child = env
        .cmd()
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let path = env.dir.path().join(pid_file);
    let started = eventually(Duration::from_secs(60), || {
        std::fs::read_to_string(&path).is_ok_and(|t| t.ends_with('\n'))
    });
    assert!(started, "the call never started");
    let pid = std::fs::read_to_string(&path).unwrap();
    let pid = system_pid(env.dir.path(), pid.trim());
    assert!(
        pid.is_some_and(|pid| running(&pid)),
        "the call's process runs while the run does"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    // It would sleep for a minute; it must be gone long before.
    the_process_in_dies(env, pid_file, "the run killed by SIGKILL");
}

/// `kill -9` runs none of the process's code, yet the command it was running dies with it:
/// otherwise the command would do its effect later, after the recovery had looked for the
/// effect and been told to run the call again.
#[test]
fn a_command_running_when_the_run_is_killed_dies_with_it() {
    let env = Env::new();
    let model = one_shell_call(
        &env,
        "read -r pid _ </proc/self/stat; echo $pid > pid.txt; sleep 60; echo late >> effects.txt",
    );
    let args = ["run", "--json", "--allow", "shell", "--model", &model, "go"];
    killed_mid_call(&env, &args, "pid.txt");
}

/// A command in the background that leaves the shell's process group (`setsid`, as a
/// daemon does), writes its pid to `pid.txt`, and would write to `effects.txt` a minute
/// later.
const LEAVES_THE_GROUP: &str = "setsid sh -c 'read -r pid _ </proc/self/stat; echo $pid > pid.txt; sleep 60; \
    echo late >> effects.txt' </dev/null >/dev/null 2>&1 &";

/// A script: one `shell` call of `command`, then an answer.
pub(crate) fn one_shell_call(env: &Env, command: &str) -> String {
    env.script(json!([
        {"tool_calls": [{"id": "call-1", "name": "shell", "arguments": {"command": command}}]},
        {"final": "done"}
    ]))
}

/// Runs `model` to its end with `shell` allowed; then each call's result, by call id.
fn shell_results(env: &Env, model: &str) -> impl Fn(&str) -> Value {
    shell_results_with(env, model, None)
}

/// [`shell_results`], with `AGENT_LOOP_PID_NAMESPACE` set to `namespace` if given.
fn shell_results_with(env: &Env, model: &str, namespace: Option<&str>) -> impl Fn(&str) -> Value {
    let mut cmd = env.cmd();
    if let Some(namespace) = namespace {
        cmd.env("AGENT_LOOP_PID_NAMESPACE", namespace);
    }
    let out = cmd
        .args(["run", "--json", "--allow", "shell", "--model", model, "go"])
        .output()
        .unwrap();
    call_results(env, &out)
}

/// The result of each call of the run `out` reports, once it completed, by call id.
pub(crate) fn call_results(env: &Env, out: &Output) -> impl Fn(&str) -> Value + use<> {
    assert_eq!(out.status.code(), Some(0), "{}", crate::stderr(out));
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let log: Value = serde_json::from_slice(&env.run(&["show", "--json", &id]).stdout).unwrap();
    move |call: &str| {
        log["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["type"] == "tool_finished" && e["result"]["call_id"] == call)
            .map(|e| e["result"].clone())
            .unwrap_or_else(|| panic!("no result for {call}"))
    }
}

/// The process whose pid is in `file` ends soon, and never acted.
fn the_process_in_dies(env: &Env, file: &str, after: &str) {
    let pid = std::fs::read_to_string(env.dir.path().join(file))
        .unwrap()
        .trim()
        .to_owned();
    // Found once: a process gone before is gone.
    if let Some(pid) = system_pid(env.dir.path(), &pid) {
        assert!(
            eventually(Duration::from_secs(20), || !running(&pid)),
            "process {pid} outlived {after}"
        );
    }
    assert!(!env.dir.path().join("effects.txt").exists());
}

/// A process the command started that left its process group dies with the run too: it
/// came back to the command's watcher, the reaper of all the command started, when its
/// parent died.
#[test]
fn a_process_that_left_the_commands_group_dies_when_the_run_is_killed() {
    let env = Env::new();
    let model = one_shell_call(&env, &format!("{LEAVES_THE_GROUP} sleep 60"));
    let args = ["run", "--json", "--allow", "shell", "--model", &model, "go"];
    killed_mid_call(&env, &args, "pid.txt");
}

/// And when the call ends: a process left behind in a session of its own is killed with
/// the command's, not left to act later.
#[test]
fn a_process_that_left_the_commands_group_dies_when_the_call_ends() {
    let env = Env::new();
    let command = format!("{LEAVES_THE_GROUP} while [ ! -s pid.txt ]; do :; done; echo started");
    let model = one_shell_call(&env, &command);
    let out = env.run(&["run", "--json", "--allow", "shell", "--model", &model, "go"]);
    assert_eq!(out.status.code(), Some(0), "{}", crate::stderr(&out));
    the_process_in_dies(&env, "pid.txt", "the call that started it");
}

/// The watcher outlives the signals that end a process politely, sent by the command
/// (`kill $PPID`) or to every `agent` at once: it still reports how the command ended
/// and kills what left the group. The command itself starts with no signal blocked.
#[test]
fn a_command_cannot_end_its_watcher_with_a_polite_signal() {
    let env = Env::new();
    let command = format!(
        "{LEAVES_THE_GROUP} kill $PPID; kill -HUP $PPID; kill -INT $PPID; \
         while [ ! -s pid.txt ]; do :; done; grep SigBlk /proc/self/status"
    );
    let model = one_shell_call(&env, &command);
    let results = shell_results(&env, &model);
    assert_eq!(
        results("call-1")["output"],
        "exit code: 0\n--- stdout ---\nSigBlk:\t0000000000000000\n"
    );
    the_process_in_dies(
        &env,
        "pid.txt",
        "a call whose command signalled its watcher",
    );
}

/// Where PID namespaces are not to be had (`AGENT_LOOP_PID_NAMESPACE=off` stands for a
/// system that allows none), a command that kills its watcher outright (`kill -9 $PPID`,
/// which no handler can catch) does not outlive its call: the watcher said which group the
/// command leads before it started it, and `agent`, seeing the watcher gone, kills that
/// group. The call ends then, not at its time limit, and says what happened.
#[test]
fn a_command_that_kills_its_watcher_dies_with_its_group() {
    let env = Env::new();
    let command = "read -r pid _ </proc/self/stat; echo $pid > pid.txt; sleep 30 & \
                   kill -9 $PPID; sleep 30; echo late >> effects.txt";
    let model = env.script(json!([
        {"tool_calls": [{"id": "call-1", "name": "shell",
                         "arguments": {"command": command, "timeout_ms": 600_000}}]},
        {"final": "done"}
    ]));
    let results = shell_results_with(&env, &model, Some("off"));
    let error = results("call-1")["error"].clone();
    assert_eq!(error["kind"], "execution_failed", "{error}");
    assert_eq!(
        error["message"], "the command's watcher ended without saying how the command ended",
        "{error}"
    );
    the_process_in_dies(&env, "pid.txt", "a call whose command killed its watcher");
}

/// Prints, for each process whose command line holds the goal `go-canary-goal` (the run's
/// `agent`), how many `CANARY_API_KEY` lines its environment shows and how many open files
/// its `fd` directory lists, to whoever may read them. (The marker is put together when the
/// command runs, so that the command's own processes do not hold it.)
const READS_AGENT_THROUGH_PROC: &str = r#"m=go-; m=${m}canary-goal
for p in /proc/[0-9]*; do
  tr '\0' ' ' < $p/cmdline 2>/dev/null | grep -q -- "$m" || continue
  e=$(tr '\0' '\n' < $p/environ 2>/dev/null | grep -c '^CANARY_API_KEY=')
  f=$(ls $p/fd 2>/dev/null | wc -l)
  echo "agent environ=$e fd=$f"
done
echo end"#;

/// A command cannot read through `/proc` what `agent` keeps from it: the environment it
/// was not given (a key's value, which the command could send anywhere, encoded past the
/// redaction), nor `agent`'s open files (the person's terminal among them). So even where
/// it runs as the same user in no user namespace of its own (`AGENT_LOOP_PID_NAMESPACE=off`,
/// as on a system that allows none). In a namespace of its own, `agent` is not even there
/// to be seen. Run as a user who is not root when the tests run as root (root reads every
/// process's files).
#[test]
fn a_command_cannot_read_agents_environment_or_open_files_through_proc() {
    let env = Env::new();
    let model = one_shell_call(&env, READS_AGENT_THROUGH_PROC);
    for (namespace, seen) in [("off", "agent environ=0 fd=0\n"), ("", "")] {
        let out = not_root(&env)
            .arg("--store")
            .arg(env.store())
            .env("AGENT_LOOP_PID_NAMESPACE", namespace)
            .env("CANARY_API_KEY", "canary-value-5417")
            .args(["run", "--json", "--allow", "shell", "--model", &model])
            .arg("go-canary-goal")
            .output()
            .unwrap();
        let result = call_results(&env, &out)("call-1");
        let stdout = result["output"]
            .as_str()
            .unwrap_or_else(|| panic!("{result}"));
        assert!(
            stdout.contains(&format!("--- stdout ---\n{seen}end\n")),
            "namespace {namespace:?}: {stdout}"
        );
    }
}

/// `agent` run as a user who is not root (`nobody`, through `setpriv`) when the tests run
/// as root, in the test's directory (made writable by all); else as [`Env::bare`] does.
pub(crate) fn not_root(env: &Env) -> std::process::Command {
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::geteuid().is_root() {
        return env.bare();
    }
    std::fs::set_permissions(env.dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args(NOBODY)
        .arg(env!("CARGO_BIN_EXE_agent"))
        .args(env.bare().get_args())
        .envs(env.bare().get_envs().filter_map(|(k, v)| Some((k, v?))))
        .env_remove("AGENT_STORE")
        .current_dir(env.dir.path());
    cmd
}

/// `setpriv`'s arguments that run a program as `nobody`.
const NOBODY: [&str; 4] = ["--reuid=65534", "--regid=65534", "--clear-groups", "--"];

/// A command in a PID namespace of its own sees a `/proc` of that namespace: the processes
/// of its call and no other, so it cannot read the environment of another process of the
/// user it runs as (the person's shell, where the keys `agent` withholds from commands are
/// often exported; here a `sleep` given one) nor its files. As root (the namespace made
/// directly) and as another user (through a user namespace: the namespace's first process
/// is given what it needs to mount it, then drops it; the command holds no capability).
#[test]
fn a_command_sees_only_the_processes_of_its_own_call() {
    let as_root = nix::unistd::geteuid().is_root();
    for not_root_too in [false, true] {
        if not_root_too && !as_root {
            continue;
        }
        let env = Env::new();
        let mut person = if not_root_too {
            let mut person = std::process::Command::new("setpriv");
            person.args(NOBODY).arg("sleep");
            person
        } else {
            std::process::Command::new("sleep")
        };
        let mut person = person
            .arg("600")
            .env("CANARY_TOKEN", "canary-value-5418")
            .spawn()
            .unwrap();
        let model = one_shell_call(
            &env,
            &format!(
                "tr '\\0' '\\n' < /proc/{}/environ | grep -c CANARY; \
                 ls /proc | grep -c '^[0-9]'; grep CapEff /proc/self/status",
                person.id()
            ),
        );
        let mut agent = if not_root_too {
            not_root(&env)
        } else {
            env.bare()
        };
        let out = agent
            .arg("--store")
            .arg(env.store())
            .args(["run", "--json", "--allow", "shell", "--model", &model, "go"])
            .output()
            .unwrap();
        person.kill().unwrap();
        person.wait().unwrap();
        let result = call_results(&env, &out)("call-1");
        let output = result["output"].as_str().unwrap();
        // `bash -c`, the pipeline's `ls` and `grep`: a handful, where the system has
        // dozens of processes.
        let listed: usize = output.lines().nth(3).unwrap().parse().unwrap();
        assert_eq!(
            (output.lines().nth(2), listed < 8),
            (Some("0"), true),
            "not root: {not_root_too}: {output}"
        );
        // What let the namespace's first process mount its `/proc` is not the command's.
        let capabilities = output.lines().nth(4).unwrap();
        assert!(
            !not_root_too || capabilities == "CapEff:\t0000000000000000",
            "{output}"
        );
        assert!(
            output.contains(&format!("/proc/{}/environ: No such file", person.id())),
            "{output}"
        );
    }
}

/// A command runs as the second process of a PID namespace of its own, under its watcher,
/// the namespace's first (directly as root; through a user namespace that maps the user to
/// itself otherwise, `AGENT_LOOP_PID_NAMESPACE=user` as an unprivileged user's): it can
/// neither kill its watcher (`kill -9 $PPID` reaches a namespace's init from inside only
/// through a handler, and SIGKILL has none) nor signal any process outside its call, the
/// run's own included, `kill -9 -1` neither; a process it left in a session of its own dies
/// when the call ends, and what it writes belongs to the user who runs `agent`.
#[test]
fn a_command_can_neither_end_its_watcher_nor_signal_outside_its_call() {
    for namespace in [None, Some("user")] {
        let env = Env::new();
        // A process outside the run, which the command is told the pid of. (`kill -9 -1`
        // is only sent from a namespace's second process: outside one, as root, it would
        // end every process of the machine.)
        let mut outside = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let command = format!(
            "{LEAVES_THE_GROUP} while [ ! -s pid.txt ]; do :; done; echo $$ $PPID; \
             kill -9 $PPID; kill -9 {}; echo still here: $?; touch mine.txt",
            outside.id()
        );
        let model = env.script(json!([
            {"tool_calls": [{"id": "call-1", "name": "shell", "arguments": {"command": command}}]},
            {"tool_calls": [{"id": "call-2", "name": "shell",
                             "arguments": {"command": "sleep 600 & [ $$ -eq 2 ] && kill -9 -1; \
                                                          wait $!; echo after: $?"}}]},
            {"final": "done"}
        ]));
        let results = shell_results_with(&env, &model, namespace);
        let output = results("call-1")["output"].clone();
        assert_eq!(
            output,
            format!(
                "exit code: 0\n--- stdout ---\n2 1\nstill here: 1\n--- stderr ---\n\
                 bash: line 1: kill: ({}) - No such process\n",
                outside.id()
            ),
            "{namespace:?}"
        );
        the_process_in_dies(&env, "pid.txt", "the call that started it");
        // Every process of the namespace but its init and the sender: the command's own.
        let output = results("call-2")["output"].clone();
        assert!(
            output
                .as_str()
                .is_some_and(|o| o.starts_with("exit code: 0\n--- stdout ---\nafter: 137\n")),
            "{namespace:?}: {output}"
        );
        assert!(outside.try_wait().unwrap().is_none(), "{namespace:?}");
        outside.kill().unwrap();
        outside.wait().unwrap();
        let owner = std::os::unix::fs::MetadataExt::uid(
            &std::fs::metadata(env.dir.path().join("mine.txt")).unwrap(),
        );
        assert_eq!(owner, our_uid(), "{namespace:?}");
    }
}

/// A setting of the namespace that is not one is refused before anything runs, naming the
/// ones there are; a watcher would have taken it as unset.
#[test]
fn a_pid_namespace_setting_that_is_not_one_is_refused_in_one_line() {
    let env = Env::new();
    let model = one_shell_call(&env, "touch effects.txt");
    for (value, code) in [("no", 2), ("0", 2), ("", 0), ("off", 0), ("user", 0)] {
        let out = env
            .cmd()
            .env("AGENT_LOOP_PID_NAMESPACE", value)
            .args(["run", "--allow", "shell", "--model", &model, "go"])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(code),
            "{value:?}: {}",
            crate::stderr(&out)
        );
        let written = env.dir.path().join("effects.txt");
        if code == 2 {
            assert_eq!(
                crate::stderr(&out),
                format!(
                    "agent: AGENT_LOOP_PID_NAMESPACE={value}: not a setting; set it to off \
                     (commands share agent's PID namespace) or user (a user namespace even \
                     as root), or unset it\n"
                )
            );
            assert!(!written.exists(), "{value:?}");
        } else {
            std::fs::remove_file(written).unwrap();
        }
    }
}

/// This process's user id, as the files it writes carry it.
fn our_uid() -> u32 {
    let probe = tempfile::tempfile().unwrap();
    std::os::unix::fs::MetadataExt::uid(&probe.metadata().unwrap())
}

/// The watcher's variable left in a person's environment does not turn `agent` into a
/// watcher: that also takes a socket on its standard input.
#[test]
fn the_watchers_variable_alone_does_not_make_agent_a_watcher() {
    let env = Env::new();
    let out = env
        .cmd()
        .env("AGENT_LOOP_WATCH", "1")
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", crate::stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("agent "));
}

/// Through the watcher the call still learns how its command ended: a signal that killed
/// it, or a time limit passed, which kills the process that left the group as well.
#[test]
fn a_watched_command_reports_a_signal_and_a_timeout_kills_what_left_its_group() {
    let env = Env::new();
    let model = env.script(json!([
        {"tool_calls": [{"id": "sig", "name": "shell",
                         "arguments": {"command": "echo before; kill -TERM $$"}}]},
        {"tool_calls": [{"id": "slow", "name": "shell", "arguments": {
            "command": format!("{LEAVES_THE_GROUP} while [ ! -s pid.txt ]; do :; done; sleep 60"),
            "timeout_ms": 300
        }}]},
        {"final": "done"}
    ]));
    let results = shell_results(&env, &model);
    let result = |call: &str| results(call)["error"].clone();
    let killed = result("sig");
    assert_eq!(killed["kind"], "execution_failed", "{killed}");
    let message = killed["message"].as_str().unwrap();
    assert!(
        message.starts_with("exit code: killed by a signal\n--- stdout ---\nbefore"),
        "{message}"
    );
    assert_eq!(result("slow")["kind"], "timeout");
    the_process_in_dies(&env, "pid.txt", "the call that timed out");
}

/// The same for an MCP server in the middle of a call: it sees its input close when the
/// run dies, but would finish the call first.
#[test]
fn an_mcp_server_in_a_call_when_the_run_is_killed_dies_with_it() {
    let env = Env::new();
    let config = crate::py_mcp_config(&env, "s");
    killed_in_the_servers_slow_call(&env, config);
}

/// Runs one call of server `s`'s `slow` tool (with `config`), and kills the run with
/// SIGKILL in the middle of it; the server dies with it ([`killed_mid_call`]).
fn killed_in_the_servers_slow_call(env: &Env, config: &str) {
    let model = env.script(json!([
        {"tool_calls": [{"id": "call-1", "name": "mcp__s__slow", "arguments": {}}]},
        {"final": "done"}
    ]));
    let args = [
        "run",
        "--json",
        "--mcp-config",
        config,
        "--allow",
        "mcp__s__slow",
        "--model",
        &model,
        "go",
    ];
    killed_mid_call(env, &args, "server.pid");
}

/// Writes an `mcp.json` that starts [`crate::PY_MCP_SERVER`] as the server `s`, leaving a
/// process that left its process group (`daemon.pid`); returns its name.
fn mcp_config_leaving_a_daemon(env: &Env) -> &'static str {
    py_mcp_config_with(env, json!({"LEAVE_A_DAEMON": "1"}))
}

/// Writes an `mcp.json` that starts [`crate::PY_MCP_SERVER`] as the server `s` with the
/// variables `vars` as its `env`; returns its name.
fn py_mcp_config_with(env: &Env, vars: Value) -> &'static str {
    let config = crate::py_mcp_config(env, "s");
    let config_path = env.dir.path().join(config);
    let mut json: Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    json["mcpServers"]["s"]["env"] = vars;
    std::fs::write(&config_path, json.to_string()).unwrap();
    config
}

/// Runs `model` to its end with the MCP servers of `config`.
fn run_with_mcp(env: &Env, config: &str, model: &str) -> Output {
    crate::mcp_run(env, config, model).output().unwrap()
}

/// What an MCP server started that left its process group dies with the run killed by
/// SIGKILL: the server runs under `agent` as its watcher, as a `shell` command does.
#[test]
fn what_an_mcp_server_started_out_of_its_group_dies_with_the_run_killed() {
    let env = Env::new();
    let config = mcp_config_leaving_a_daemon(&env);
    killed_in_the_servers_slow_call(&env, config);
    the_process_in_dies(&env, "daemon.pid", "the run killed by SIGKILL");
}

/// And when the run ends as it should: the server is stopped, and what it left with it.
#[test]
fn what_an_mcp_server_started_out_of_its_group_dies_when_the_run_ends() {
    let env = Env::new();
    let config = mcp_config_leaving_a_daemon(&env);
    let model = env.script(json!([
        {"tool_calls": [{"id": "call-1", "name": "mcp__s__env",
                         "arguments": {"name": "LEAVE_A_DAEMON"}}]},
        {"final": "done"}
    ]));
    let out = run_with_mcp(&env, config, &model);
    assert_eq!(out.status.code(), Some(0), "{}", crate::stderr(&out));
    the_process_in_dies(&env, "daemon.pid", "the run");
}

/// An MCP server runs in a PID namespace of its own too, as the second process of its
/// watcher's, and its configuration's `env` cannot say otherwise: that is `agent`'s
/// setting, which the server is not shown either.
#[test]
fn an_mcp_server_runs_in_a_pid_namespace_its_env_cannot_turn_off() {
    let env = Env::new();
    let config = py_mcp_config_with(&env, json!({"AGENT_LOOP_PID_NAMESPACE": "off"}));
    let call = |id: &str, name: &str| json!({"tool_calls": [{"id": id, "name": "mcp__s__env", "arguments": {"name": name}}]});
    let model = env.script(json!([
        call("ns", "NSpid"),
        call("var", "AGENT_LOOP_PID_NAMESPACE"),
        {"final": "done"}
    ]));
    let results = call_results(&env, &run_with_mcp(&env, config, &model));
    let text = |call: &str| {
        results(call)["output"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    // 2 in its own namespace, whose `/proc` it sees (and no other): in the system's, 2 is
    // the kernel's thread daemon, never a program's.
    assert_eq!(text("ns"), "NSpid:\t2");
    assert_eq!(text("var"), "AGENT_LOOP_PID_NAMESPACE=");
}

/// A server whose program cannot be started says so in words, through its watcher.
#[test]
fn an_mcp_server_whose_program_is_missing_is_named_with_the_reason() {
    let env = Env::new();
    let config = json!({"mcpServers": {"x": {"command": "no-such-server-here"}}});
    std::fs::write(env.dir.path().join("mcp.json"), config.to_string()).unwrap();
    let model = env.script(json!([{"final": "done"}]));
    let out = env.run(&["run", "--mcp-config", "mcp.json", "--model", &model, "go"]);
    assert_eq!(out.status.code(), Some(2), "{}", crate::stderr(&out));
    assert_eq!(
        crate::stderr(&out).trim_end(),
        "agent: MCP server \"x\" failed to start: no-such-server-here: No such file or \
         directory (os error 2)"
    );
}

/// And for a command hook: hooks may act (a post-call hook that formats a file, say), and
/// one still running when the run dies must not act after it.
#[test]
fn a_hook_running_when_the_run_is_killed_dies_with_it() {
    let env = Env::new();
    with_a_trusted_hook(
        &env,
        "read -r pid _ </proc/self/stat; echo $pid > hook.pid; sleep 60; echo late >> effects.txt",
    );
    killed_mid_call(&env, &["run", "--json", "go"], "hook.pid");
}

/// A process a hook started that left its process group dies when the hook has answered:
/// hooks run under `agent` as their watcher, as `shell` commands do.
#[test]
fn what_a_hook_started_out_of_its_group_dies_when_it_answers() {
    let env = Env::new();
    with_a_trusted_hook(
        &env,
        &format!("{LEAVES_THE_GROUP} while [ ! -s pid.txt ]; do :; done"),
    );
    let out = env.run(&["run", "--json", "go"]);
    assert_eq!(out.status.code(), Some(0), "{}", crate::stderr(&out));
    the_process_in_dies(&env, "pid.txt", "the hook that started it");
}

/// Writes and trusts an `agent.toml` whose model makes one `list_dir` call and answers,
/// with `command` as a `pre_tool_use` hook.
fn with_a_trusted_hook(env: &Env, command: &str) {
    let model = env.script(json!([
        {"tool_calls": [{"id": "call-1", "name": "list_dir", "arguments": {}}]},
        {"final": "done"}
    ]));
    let toml = format!(
        "model = {model:?}\n[[hooks.pre_tool_use]]\ncommand = {command:?}\n\
         timeout_secs = 120\n"
    );
    std::fs::write(env.dir.path().join("agent.toml"), toml).unwrap();
    let trusted = env.run(&["trust"]);
    assert_eq!(
        trusted.status.code(),
        Some(0),
        "{}",
        crate::stderr(&trusted)
    );
}
