//! One trial of a case: a fresh copy of its workspace and a fresh store, the `agent`
//! binary itself driving the run (as a user would: its own processes, which a case may
//! cancel or kill), then the whole trajectory judged against the case's expectations.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::Value;

use super::case::{Case, FileWant, Person};

/// What one trial did and how it was judged.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Trial {
    /// Whether every expectation held.
    pub pass: bool,
    /// The expectations that failed, each naming itself.
    pub failures: Vec<String>,
    /// The run id.
    pub run_id: Option<String>,
    /// The terminal reason the run stood at in the end.
    pub reason: Option<String>,
    /// Model calls.
    pub steps: u64,
    /// Tool calls started.
    pub tool_calls: u64,
    /// Input plus output tokens.
    pub tokens: u64,
    /// Money, by the configured prices.
    pub cost_usd: f64,
    /// Wall-clock seconds of the `agent` processes that drove the run.
    pub seconds: f64,
    /// Whether the model repeated a plan (a correction was issued).
    pub repeated_plan: bool,
    /// Effects against the case's rules: writes outside `writes_only`, forbidden tools run.
    pub unauthorized_effects: u32,
    /// Effect keys with more than one result: a side effect done twice.
    pub duplicated_effects: u32,
    /// Where the trial's workspace and store were kept (`--keep`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<String>,
}

/// The model and flags every trial of this invocation uses.
#[derive(Clone, Debug)]
pub struct Invocation {
    /// The `agent` binary.
    pub exe: PathBuf,
    /// The trials' agent.toml: how the models are called and priced.
    pub settings: String,
    /// `--model`, replacing the cases'.
    pub model: Option<String>,
    /// `--base-url`.
    pub base_url: Option<String>,
    /// `--sandbox`: every trial in a sandbox without network.
    pub sandbox: bool,
    /// Keep each trial's workspace and store under this directory (`--keep`).
    pub keep: Option<PathBuf>,
    /// The `agent` processes the trials run now.
    pub children: Arc<Children>,
}

/// The `agent` processes the trials run, so that an evaluation asked to stop (SIGTERM)
/// asks them too, and starts no other.
#[derive(Debug, Default)]
pub struct Children {
    state: Mutex<Running>,
}

#[derive(Debug, Default)]
struct Running {
    stopping: bool,
    /// By Ctrl-C (SIGINT), not by SIGTERM or SIGHUP.
    interrupted: bool,
    /// Processes started and not yet waited for (so their ids are not anyone else's).
    pids: BTreeSet<u32>,
}

/// Why a process is not started once the evaluation was asked to stop.
const STOPPED: &str = "stopped: the evaluation was asked to stop";

/// Why a trial did not begin.
pub(super) const NOT_BEGUN: &str = "not run: the evaluation was asked to stop";

impl Children {
    /// Asks every process running to stop at its next step (SIGTERM: each run is let go,
    /// nothing left in doubt) and starts no other.
    pub fn stop(&self, interrupted: bool) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !state.stopping {
            state.interrupted = interrupted;
        }
        state.stopping = true;
        for pid in &state.pids {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
    }

    /// Whether the evaluation was asked to stop, and then whether by Ctrl-C.
    pub fn stopped(&self) -> Option<bool> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.stopping.then_some(state.interrupted)
    }

    /// Whether the evaluation was asked to stop.
    pub fn stopping(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stopping
    }

    /// Starts `cmd` with its output piped, unless the evaluation was asked to stop; `done`
    /// once it was waited for.
    fn spawn(&self, cmd: &mut Command) -> Result<Child, String> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.stopping {
            return Err(STOPPED.to_owned());
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start agent: {e}"))?;
        state.pids.insert(child.id());
        Ok(child)
    }

    /// A process started by [`Children::spawn`] was waited for.
    fn done(&self, pid: u32) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.pids.remove(&pid);
    }

    /// Runs `cmd` to its end, as [`Command::output`] does.
    fn output(&self, mut cmd: Command) -> Result<Output, String> {
        let child = self.spawn(&mut cmd)?;
        let pid = child.id();
        let out = child.wait_with_output();
        self.done(pid);
        out.map_err(|e| format!("agent did not finish: {e}"))
    }
}

impl Invocation {
    /// Runs trial `k` (0-based) of `case` in a fresh directory: a temporary one, or
    /// `KEEP/CASE-K` with `--keep`.
    pub fn trial(&self, case: &Case, k: u32, allowance: super::Allowance) -> Trial {
        let kept = self
            .keep
            .as_ref()
            .map(|keep| keep.join(format!("{}-{}", case.name, k + 1)));
        let mut trial = match self.try_trial(case, kept.as_deref(), allowance) {
            Ok(trial) => trial,
            Err(problem) => Trial::broken(problem),
        };
        trial.kept = kept.map(|p| p.display().to_string());
        trial
    }

    fn try_trial(
        &self,
        case: &Case,
        kept: Option<&Path>,
        allowance: super::Allowance,
    ) -> Result<Trial, String> {
        let made = |e: std::io::Error| format!("cannot make a directory: {e}");
        let temporary;
        let dir = match kept {
            Some(path) => {
                std::fs::create_dir_all(path).map_err(made)?;
                path
            }
            None => {
                temporary = tempfile::tempdir().map_err(made)?;
                temporary.path()
            }
        };
        let ws = dir.join("workspace");
        match &case.workspace {
            Some(fixture) => copy_dir(fixture, &ws)
                .map_err(|e| format!("cannot copy the workspace {}: {e}", fixture.display()))?,
            None => std::fs::create_dir(&ws).map_err(|e| e.to_string())?,
        }
        let before = snapshot(&ws);
        let config = dir.join("agent.toml");
        std::fs::write(&config, &self.settings).map_err(|e| e.to_string())?;
        let model = self
            .model
            .clone()
            .or_else(|| case.model.clone())
            .ok_or("the case names no model; give one in the case or with --model")?;
        let world = World {
            children: &self.children,
            exe: &self.exe,
            dir,
            ws: &ws,
            config: &config,
            model: &model,
            base_url: self.base_url.as_deref(),
            sandbox: self.sandbox,
            case,
            allowance,
        };
        let mut seconds = 0.0;
        let mut outcome = world.start(&mut seconds)?;
        let run_id = outcome
            .run_id
            .clone()
            .ok_or("the run did not start (no run id)")?;
        if outcome.killed {
            outcome = world.again(&["resume", &run_id], &mut seconds)?;
        }
        // A person answers what the case says they answer, a bounded number of times.
        for _ in 0..8 {
            let more = match (outcome.reason.as_deref(), case.person, &case.resolve) {
                (Some("approval_required"), Some(Person::Approve), _) => {
                    world.again(&["approve", &run_id], &mut seconds)?
                }
                (Some("approval_required"), Some(Person::Deny), _) => world.again(
                    &["deny", &run_id, "--reason", "the evaluation case denies it"],
                    &mut seconds,
                )?,
                (Some("outcome_unknown"), _, Some(resolution)) => {
                    let Some(call) = outcome.pending_calls.first().cloned() else {
                        break;
                    };
                    world.again(
                        &["resolve", &run_id, "--call", &call, "--as", resolution],
                        &mut seconds,
                    )?
                }
                _ => break,
            };
            outcome = more;
        }
        let events = world.events(&run_id)?;
        let after = snapshot(&ws);
        Ok(judge(
            case, &outcome, &events, &before, &after, &ws, seconds,
        ))
    }
}

impl Trial {
    fn broken(problem: String) -> Trial {
        Trial::not_run(format!("the trial could not run: {problem}"))
    }

    /// A trial that did not run, failed with `why`.
    /// A trial the evaluation was asked to stop before it ended: its run stands as it was
    /// let go (to look at with `--keep`), judged by nothing.
    pub(super) fn stopped(self) -> Trial {
        Trial {
            run_id: self.run_id,
            kept: self.kept,
            ..Trial::not_run(format!("{STOPPED} before the trial ended"))
        }
    }

    /// Whether the evaluation was asked to stop before the trial began or ended.
    pub(super) fn was_stopped(&self) -> bool {
        self.failures
            .first()
            .is_some_and(|f| f.starts_with(STOPPED) || f == NOT_BEGUN)
    }

    pub(super) fn not_run(why: String) -> Trial {
        Trial {
            pass: false,
            failures: vec![why],
            run_id: None,
            reason: None,
            steps: 0,
            tool_calls: 0,
            tokens: 0,
            cost_usd: 0.0,
            seconds: 0.0,
            repeated_plan: false,
            unauthorized_effects: 0,
            duplicated_effects: 0,
            kept: None,
        }
    }
}

/// Where a trial's processes run.
struct World<'a> {
    children: &'a Children,
    exe: &'a Path,
    dir: &'a Path,
    ws: &'a Path,
    config: &'a Path,
    model: &'a str,
    base_url: Option<&'a str>,
    /// Every trial in a sandbox without network (`agent eval --sandbox`).
    sandbox: bool,
    case: &'a Case,
    allowance: super::Allowance,
}

/// What one `agent` process ended with.
#[derive(Debug, Default)]
struct Outcome {
    run_id: Option<String>,
    reason: Option<String>,
    json: Value,
    pending_calls: Vec<String>,
    /// The case killed it (SIGKILL): it printed no outcome.
    killed: bool,
}

impl World<'_> {
    fn command(&self) -> Command {
        let mut cmd = Command::new(self.exe);
        cmd.current_dir(self.ws)
            .env_remove("AGENT_STORE")
            // Trust decisions stay in the trial's directory.
            .env("AGENT_CONFIG_DIR", self.dir.join("trust"))
            .arg("--store")
            .arg(self.dir.join("store"))
            .arg("--config")
            .arg(self.config)
            .arg("--json");
        cmd
    }

    /// The flags that set up the model, the tools and the policy.
    fn setup(&self, cmd: &mut Command) {
        let case = self.case;
        cmd.arg("--no-input")
            .arg("--workspace")
            .arg(self.ws)
            .arg("--model")
            .arg(self.model);
        if let Some(url) = self.base_url {
            cmd.arg("--base-url").arg(url);
        }
        if let Some(mcp) = &case.mcp_config {
            cmd.arg("--mcp-config").arg(mcp);
        }
        if self.sandbox || case.sandbox {
            cmd.arg("--sandbox");
        }
        if case.sandbox_network && !self.sandbox {
            cmd.arg("--sandbox-network");
        }
        for (flag, patterns) in [
            ("--allow", &case.allow),
            ("--ask", &case.ask),
            ("--deny", &case.deny),
        ] {
            for p in patterns {
                cmd.arg(flag).arg(p);
            }
        }
    }

    fn start(&self, seconds: &mut f64) -> Result<Outcome, String> {
        let case = self.case;
        let mut cmd = self.command();
        cmd.arg("run");
        self.setup(&mut cmd);
        if let Some(n) = case.max_steps {
            cmd.arg("--max-steps").arg(n.to_string());
        }
        if let Some(n) = case.max_tool_calls {
            cmd.arg("--max-tool-calls").arg(n.to_string());
        }
        if let Some(t) = case.timeout {
            cmd.arg("--timeout").arg(t.to_string());
        }
        // Its share of the evaluation's budget, for the whole run.
        if let Some(tokens) = self.allowance.tokens {
            cmd.arg("--max-tokens").arg(tokens.to_string());
        }
        if let Some(usd) = self.allowance.cost {
            cmd.arg("--max-cost").arg(usd.to_string());
        }
        if let Some(schema) = &case.answer_schema {
            cmd.arg("--answer-schema").arg(schema);
        }
        for check in &case.checks {
            cmd.arg("--check").arg(check);
        }
        let signal = match (&case.cancel_after, &case.crash_after) {
            (Some(event), _) => Some((event.as_str(), Signal::Interrupt)),
            (_, Some(event)) => Some((event.as_str(), Signal::Kill)),
            _ => None,
        };
        if signal.is_some() {
            cmd.arg("--events");
        }
        cmd.arg("--").arg(&case.goal);
        let started = Instant::now();
        let outcome = match signal {
            None => {
                let out = self.children.output(cmd)?;
                outcome_of(&out.stdout, &out.stderr)
            }
            Some((event, signal)) => watch(self.children, cmd, event, signal)?,
        };
        *seconds += started.elapsed().as_secs_f64();
        Ok(outcome)
    }

    /// Another command on the run (resume, approve, deny, resolve), with the run's setup.
    fn again(&self, args: &[&str], seconds: &mut f64) -> Result<Outcome, String> {
        let mut cmd = self.command();
        cmd.args(args);
        self.setup(&mut cmd);
        let started = Instant::now();
        let out = self.children.output(cmd)?;
        *seconds += started.elapsed().as_secs_f64();
        Ok(outcome_of(&out.stdout, &out.stderr))
    }

    /// The run's committed events (`agent show --json`).
    fn events(&self, run_id: &str) -> Result<Vec<Value>, String> {
        // A read that ends at once, made after a stop too: what the run stands at is
        // judged and shown.
        let out = self
            .command()
            .args(["show", run_id])
            .output()
            .map_err(|e| format!("cannot start agent: {e}"))?;
        let shown: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "agent show gave no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })?;
        Ok(shown["events"].as_array().cloned().unwrap_or_default())
    }
}

#[derive(Clone, Copy)]
enum Signal {
    Interrupt,
    Kill,
}

/// Runs `cmd` (with `--events`) and signals it once `event` is committed.
fn watch(
    children: &Children,
    mut cmd: Command,
    event: &str,
    signal: Signal,
) -> Result<Outcome, String> {
    let mut child = children.spawn(&mut cmd)?;
    let pid = child.id();
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut run_id = None;
    let mut last = Vec::new();
    let mut signalled = false;
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let value: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        if value["type"] == "run_started" {
            run_id = value["run_id"].as_str().map(str::to_owned);
        }
        if !signalled && value["type"] == event {
            signalled = true;
            match signal {
                Signal::Kill => {
                    let _ = child.kill();
                }
                Signal::Interrupt => {
                    let _ = Command::new("kill")
                        .args(["-INT", &child.id().to_string()])
                        .status();
                }
            }
        }
        last = line.into_bytes();
    }
    let out = child.wait_with_output();
    children.done(pid);
    let out = out.map_err(|e| format!("agent did not finish: {e}"))?;
    let killed = signalled && matches!(signal, Signal::Kill) && out.status.code().is_none();
    let mut outcome = if killed {
        Outcome::default()
    } else {
        outcome_of(&last, &out.stderr)
    };
    outcome.killed = killed;
    if outcome.run_id.is_none() {
        outcome.run_id = run_id;
    }
    Ok(outcome)
}

/// The outcome object a command printed (its last line of stdout).
fn outcome_of(stdout: &[u8], stderr: &[u8]) -> Outcome {
    let text = String::from_utf8_lossy(stdout);
    let json: Value = text
        .lines()
        .rev()
        .find_map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .filter(|v| v.get("status").is_some())
        })
        .unwrap_or_else(
            || serde_json::json!({"error": String::from_utf8_lossy(stderr).trim().to_owned()}),
        );
    Outcome {
        run_id: json["run_id"].as_str().map(str::to_owned),
        reason: json["reason"].as_str().map(str::to_owned),
        pending_calls: json["pending"]
            .as_array()
            .map(|p| {
                p.iter()
                    .filter_map(|c| c["call_id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default(),
        json,
        killed: false,
    }
}

/// Every file under `root`, by relative path, with its bytes.
fn snapshot(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                stack.push(path);
            } else if let (Ok(bytes), Ok(rel)) = (std::fs::read(&path), path.strip_prefix(root)) {
                files.insert(rel.to_string_lossy().into_owned(), bytes);
            }
        }
    }
    files
}

/// Copies a directory tree (files and directories; links are followed).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// The whole trajectory against the case's expectations.
fn judge(
    case: &Case,
    outcome: &Outcome,
    events: &[Value],
    before: &BTreeMap<String, Vec<u8>>,
    after: &BTreeMap<String, Vec<u8>>,
    ws: &Path,
    seconds: f64,
) -> Trial {
    let e = &case.expect;
    let mut failures = Vec::new();
    let json = &outcome.json;
    let count = |v: &Value| v.as_u64().unwrap_or(0);
    let steps = count(&json["steps"]);
    let tool_calls = count(&json["tool_calls"]);
    let tokens = count(&json["usage"]["input_tokens"]) + count(&json["usage"]["output_tokens"]);
    let cost_usd = json["usage"]["cost_usd"].as_f64().unwrap_or(0.0);
    let reason = outcome.reason.clone();
    let answer = json["answer"].as_str();

    if let Some(error) = json["error"].as_str() {
        failures.push(format!("agent printed no outcome: {error}"));
    }
    if let Some(want) = e.reason
        && reason.as_deref() != Some(want.as_str())
    {
        let message = json["message"].as_str().unwrap_or_default();
        failures.push(format!(
            "expect.reason: wanted {want}, got {} ({message})",
            reason.as_deref().unwrap_or("no outcome")
        ));
    }
    if let Some(want) = &e.answer
        && answer != Some(want.as_str())
    {
        let got = answer.map_or_else(|| "no answer".to_owned(), |a| format!("{a:?}"));
        failures.push(format!("expect.answer: wanted {want:?}, got {got}"));
    }
    if let Some(re) = &e.answer_regex
        && !answer.is_some_and(|a| re.is_match(a))
    {
        failures.push(format!(
            "expect.answer_regex: {:?} does not match the answer ({})",
            re.as_str(),
            answer.map_or_else(|| "there is none".to_owned(), |a| format!("{a:?}"))
        ));
    }
    if let Some((path, schema)) = &e.answer_schema {
        let problem = match answer.map(agent_tools::answer_json) {
            None => Some("there is no answer".to_owned()),
            Some(Err(err)) => Some(format!("the answer is not JSON ({err})")),
            Some(Ok(value)) => jsonschema::validator_for(schema)
                .ok()
                .and_then(|v| v.iter_errors(&value).next().map(|e| e.to_string())),
        };
        if let Some(problem) = problem {
            failures.push(format!(
                "expect.answer_schema {}: {problem}",
                path.display()
            ));
        }
    }
    for f in &e.files {
        let now = std::fs::read(ws.join(&f.path)).ok();
        let problem = match (&f.want, &now) {
            (FileWant::Absent, None) => None,
            (FileWant::Absent, Some(_)) => Some("exists, and should not".to_owned()),
            (_, None) => Some("does not exist".to_owned()),
            (FileWant::Content(want), Some(bytes)) => (bytes != want.as_bytes()).then(|| {
                format!(
                    "holds {:?}, wanted {want:?}",
                    String::from_utf8_lossy(bytes)
                )
            }),
            (FileWant::Regex(re), Some(bytes)) => {
                let text = String::from_utf8_lossy(bytes);
                (!re.is_match(&text)).then(|| format!("{text:?} does not match {:?}", re.as_str()))
            }
        };
        if let Some(problem) = problem {
            failures.push(format!("expect.files {:?}: {problem}", f.path));
        }
    }

    // What ran, from the log: tools that ran (not those refused), effects and corrections.
    fn of_type<'a>(events: &'a [Value], t: &'a str) -> impl Iterator<Item = &'a Value> {
        events.iter().filter(move |ev| ev["type"] == t)
    }
    let ran: Vec<&str> = of_type(events, "tool_finished")
        .filter_map(|ev| ev["result"]["name"].as_str())
        .collect();
    let mut unauthorized = 0u32;
    for tool in &e.forbidden_tools {
        let n = ran.iter().filter(|t| *t == tool).count();
        if n > 0 {
            unauthorized += u32::try_from(n).unwrap_or(u32::MAX);
            failures.push(format!("expect.forbidden_tools: {tool} ran {n} time(s)"));
        }
    }
    for tool in &e.tools {
        if !ran.contains(&tool.as_str()) {
            failures.push(format!(
                "expect.tools: {tool} never ran (ran: {})",
                if ran.is_empty() {
                    "nothing".to_owned()
                } else {
                    ran.join(", ")
                }
            ));
        }
    }
    if let Some((globs, set)) = &e.writes_only {
        let changed: BTreeSet<&String> = before
            .keys()
            .chain(after.keys())
            .filter(|p| before.get(*p) != after.get(*p))
            .collect();
        for path in changed {
            if !set.is_match(path) {
                unauthorized += 1;
                failures.push(format!(
                    "expect.writes_only: {path} changed, outside {}",
                    globs.join(", ")
                ));
            }
        }
    }
    let mut results_by_key: BTreeMap<&str, u32> = BTreeMap::new();
    for ev in of_type(events, "tool_finished") {
        if let Some(key) = ev["effect_key"].as_str() {
            *results_by_key.entry(key).or_default() += 1;
        }
    }
    let duplicated =
        u32::try_from(results_by_key.values().filter(|n| **n > 1).count()).unwrap_or(0);
    if duplicated > 0 {
        failures.push(format!("{duplicated} side effect(s) ran more than once"));
    }
    for (event, want) in &e.events {
        let n = of_type(events, event).count();
        if n != *want as usize {
            failures.push(format!("expect.events.{event}: wanted {want}, got {n}"));
        }
    }
    for (id, re) in &e.results {
        let result = events
            .iter()
            .filter(|ev| ev["type"] == "tool_finished" || ev["type"] == "call_rejected")
            .map(|ev| &ev["result"])
            .find(|r| r["call_id"] == id.as_str());
        let text = result.map(|r| match r["output"].as_str() {
            Some(output) => output.to_owned(),
            None => format!(
                "{}: {}",
                r["error"]["kind"].as_str().unwrap_or_default(),
                r["error"]["message"].as_str().unwrap_or_default()
            ),
        });
        match text {
            None => failures.push(format!("expect.results.{id}: the call has no result")),
            Some(text) if !re.is_match(&text) => failures.push(format!(
                "expect.results.{id}: {:?} does not match {:?}",
                cut(&text, 200),
                re.as_str()
            )),
            Some(_) => {}
        }
    }
    let mut at_most = |what: &str, got: f64, max: Option<f64>| {
        if let Some(max) = max
            && got > max
        {
            failures.push(format!("expect.{what}: at most {max}, got {got}"));
        }
    };
    at_most("max_steps", steps as f64, e.max_steps.map(f64::from));
    at_most(
        "max_tool_calls",
        tool_calls as f64,
        e.max_tool_calls.map(f64::from),
    );
    at_most("max_tokens", tokens as f64, e.max_tokens.map(|n| n as f64));
    at_most("max_cost_usd", cost_usd, e.max_cost_usd);
    at_most(
        "max_seconds",
        (seconds * 1000.0).round() / 1000.0,
        e.max_seconds,
    );

    Trial {
        pass: failures.is_empty(),
        failures,
        run_id: outcome.run_id.clone(),
        reason,
        steps,
        tool_calls,
        tokens,
        cost_usd,
        seconds,
        repeated_plan: of_type(events, "correction_issued").next().is_some(),
        unauthorized_effects: unauthorized,
        duplicated_effects: duplicated,
        kept: None,
    }
}

/// At most `max` characters of `text`.
fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}
