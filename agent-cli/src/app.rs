//! The commands: each resolves its [`Settings`], builds what it needs, and maps what
//! happened to an exit code.

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use agent_context::Projector;
use agent_core::{Budget, CallId, Event, Input, Resolution, RunState};
use agent_runtime::{CancellationToken, Redactor, Report, RunRequest, Runtime, RuntimeError};

use agent_tools::{Gateway, Workspace};

use crate::args::{Cli, Commands, Limits, Setup};
use crate::build::{
    StoreSource, build, cancel_on_ctrl_c, drain_on_terminate, interactive, tokio_one_run,
};
use crate::chat;
use crate::exit::{EXIT_OK, exit_code};
use crate::failure::{Failure, failed, usage};
use crate::render;
use crate::settings::{ConfigFile, Env, ModelChoice, Settings};
use crate::stores::{Follower, OpenStore, StoreLocation};
use crate::trust;
use crate::worker::{self, QueuedAnswer};

/// Writes to standard output; a reader that went away (`agent context RUN | head -1`) is
/// not an error of ours, so a broken pipe ends the printing quietly. On a terminal, the
/// control characters in it are shown as escapes ([`render::for_terminal`]): much of what
/// is printed was written by a model, a file or a server.
/// Returns whether it was written (`false` once the reader went away).
pub(crate) fn say(text: impl std::fmt::Display) -> bool {
    static TERMINAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let terminal = *TERMINAL.get_or_init(|| std::io::stdout().is_terminal());
    write_to(std::io::stdout().lock(), terminal, text)
}

/// Writes to standard error, the same way.
pub(crate) fn tell(text: impl std::fmt::Display) {
    static TERMINAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let terminal = *TERMINAL.get_or_init(|| std::io::stderr().is_terminal());
    let _ = write_to(std::io::stderr().lock(), terminal, text);
}

/// Writes `text` to `to` and flushes, escaped for a terminal; returns whether it was
/// written.
fn write_to(mut to: impl std::io::Write, terminal: bool, text: impl std::fmt::Display) -> bool {
    let written = if terminal {
        write!(to, "{}", render::for_terminal(&text.to_string()))
    } else {
        write!(to, "{text}")
    };
    written.and_then(|()| to.flush()).is_ok()
}

/// Runs a parsed command line and returns the process's exit code.
pub fn main(cli: Cli) -> ExitCode {
    // Held to the end: dropping it sends the spans still buffered.
    let _telemetry = match crate::telemetry::init() {
        Ok(telemetry) => telemetry,
        Err(message) => {
            tell(format_args!("agent: {message}\n"));
            return ExitCode::from(crate::exit::EXIT_USAGE);
        }
    };
    // Read by the watchers of the processes a run starts, which cannot say it is wrong.
    if let Err(message) = agent_tools::check_pid_namespace_env() {
        tell(format_args!("agent: {message}\n"));
        return ExitCode::from(crate::exit::EXIT_USAGE);
    }
    // The commands a run starts run as the person does: they must not read this
    // process's environment (the keys withheld from them) nor its terminal through /proc.
    if let Err(message) = agent_tools::keep_from_commands() {
        tell(format_args!("agent: {message}\n"));
    }
    match dispatch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            tell(format_args!("agent: {}\n", failure.message));
            ExitCode::from(failure.code)
        }
    }
}

fn dispatch(cli: Cli) -> Result<u8, Failure> {
    let json = cli.json;
    let file = ConfigFile::load(cli.config.as_deref())?;
    // How the models are called and priced, for an evaluation's trials.
    let model_calls = file.as_ref().map(|f| f.config.model_calls());
    let store_flag = cli.store.clone();
    let resolve = move |setup: &Setup, limits: &Limits| -> Result<Settings, Failure> {
        Ok(Settings::resolve(
            file,
            store_flag.as_deref(),
            setup,
            limits,
            Env::from_process(),
        )?)
    };
    let plain = Setup::default();
    let none = Limits::default();
    let ids = |calls: Vec<String>| calls.into_iter().map(CallId::from).collect();
    // The commands that continue an existing run differ only in what they do first.
    let (run_id, settings, what) = match cli.command {
        Commands::Run(args) => {
            let goal = text_arg(args.goal, "goal")?;
            let settings = resolve(&args.setup, &args.limits)?.with_answer(&args.answer)?;
            return run(&settings, json, &goal);
        }
        Commands::Submit(args) => {
            let goal = text_arg(args.goal, "goal")?;
            let settings = resolve(&args.setup, &args.limits)?.with_answer(&args.answer)?;
            return worker::submit(&settings, json, &goal);
        }
        Commands::Worker {
            concurrency,
            lease,
            until_empty,
        } => {
            let settings = resolve(&plain, &none)?;
            return worker::worker(&settings, json, concurrency, lease, until_empty);
        }
        Commands::Cancel { run, last } => {
            let settings = resolve(&plain, &none)?;
            let run = named_or_newest(&settings.store, run, last)?;
            return cancel(&settings, json, &run);
        }
        Commands::Context {
            run,
            last,
            at,
            setup,
        } => {
            let settings = resolve(&setup, &none)?;
            let run = named_or_newest(&settings.store, run, last)?;
            return context(&settings, json, &run, at);
        }
        Commands::Runs => return runs(&resolve(&plain, &none)?.store, json),
        Commands::Fork {
            run,
            last,
            at,
            setup,
            limits,
            answer,
        } => {
            let settings = resolve(&setup, &limits)?.with_answer(&answer)?;
            let run = named_or_newest(&settings.store, run, last)?;
            return fork(&settings, json, &run, at);
        }
        Commands::Eval {
            paths,
            model,
            base_url,
            repeat,
            jobs,
            junit,
            compare,
            keep,
            max_tokens,
            max_cost,
            sandbox,
        } => {
            let model_calls = model_calls
                .transpose()
                .map_err(|e| usage(format!("agent.toml: {e}")))?
                .unwrap_or_default();
            return crate::eval::eval(&crate::eval::EvalOptions {
                model_calls,
                max_tokens,
                max_cost,
                paths,
                model,
                base_url,
                repeat,
                jobs: jobs.unwrap_or_else(|| {
                    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
                }),
                junit,
                compare,
                keep,
                json,
                sandbox,
            });
        }
        Commands::Trust {
            path,
            workspace,
            run,
        } => {
            let setup = Setup {
                workspace,
                ..Setup::default()
            };
            let settings = resolve(&setup, &none)?;
            return match run {
                Some(run) => trust_run(&settings, json, &run),
                None => trust_command(&settings, json, path.as_deref()),
            };
        }
        Commands::Report { run, last, out } => {
            let store = resolve(&plain, &none)?.store;
            let run = named_or_newest(&store, run, last)?;
            return report(&store, json, &run, out);
        }
        Commands::Show {
            run,
            last,
            call,
            follow,
        } => {
            let store = resolve(&plain, &none)?.store;
            let run = named_or_newest(&store, run, last)?;
            return if follow {
                self::follow(&store, json, &run)
            } else {
                show(&store, json, &run, call.as_deref())
            };
        }
        Commands::Chat { run, last, setup } => {
            let settings = resolve(&setup, &none)?;
            let run = if last {
                Some(newest_run(&settings.store)?)
            } else {
                run
            };
            return chat::chat(&settings, run);
        }
        Commands::Resume {
            run,
            message,
            last,
            limits,
            setup,
        } => {
            let message = message.map(|m| text_arg(m, "message")).transpose()?;
            let settings = resolve(&setup, &limits)?;
            let (run, message) = match (last, run, message) {
                (false, Some(run), message) => (run, message),
                (false, None, _) => {
                    return Err(usage("which run? give its id, or --last for the newest"));
                }
                (true, message, None) => (newest_run(&settings.store)?, message),
                (true, _, Some(_)) => {
                    return Err(usage(
                        "with --last, give only the message (the run is the newest one)",
                    ));
                }
            };
            match message {
                Some(text) if text.trim().is_empty() => {
                    return Err(usage("the message is empty; say something to the run"));
                }
                Some(text) => (run, settings, Resume::Reply(text)),
                None if limits.any() => {
                    return Err(usage(
                        "new limits apply from a message on: give one (agent resume RUN \
                         MESSAGE --max-steps N)",
                    ));
                }
                None => (run, settings, Resume::Continue),
            }
        }
        Commands::Approve {
            run,
            last,
            calls,
            setup,
        } => {
            let settings = resolve(&setup, &none)?;
            let run = named_or_newest(&settings.store, run, last)?;
            (run, settings, Resume::Approve(ids(calls)))
        }
        Commands::Deny {
            run,
            last,
            calls,
            reason,
            setup,
        } => {
            let settings = resolve(&setup, &none)?;
            let run = named_or_newest(&settings.store, run, last)?;
            (run, settings, Resume::Deny(ids(calls), reason))
        }
        Commands::Resolve {
            run,
            last,
            call,
            resolution,
            setup,
        } => {
            let resolution = resolution.parse().map_err(usage)?;
            let settings = resolve(&setup, &none)?;
            let run = named_or_newest(&settings.store, run, last)?;
            (
                run,
                settings,
                Resume::Resolve(CallId::from(call), resolution),
            )
        }
    };
    drive_existing(&settings, json, &run_id, what)
}

/// `agent trust [PATH]`.
/// `agent trust --run RUN`.
fn trust_run(settings: &Settings, json: bool, run_id: &str) -> Result<u8, Failure> {
    let store = OpenStore::must_exist(&settings.store)?;
    let log = store.as_store().load(run_id)?;
    if log.is_empty() {
        return Err(usage(format!("no run {run_id} in {}", settings.store)));
    }
    let checks = crate::build::trust_run_checks(run_id, &log)?;
    if json {
        say(format_args!(
            "{}\n",
            serde_json::json!({"run_id": run_id, "checks": checks})
        ));
    } else if checks.is_empty() {
        say(format_args!(
            "run {run_id} runs no commands on its answer; nothing to trust\n"
        ));
    } else {
        say(format_args!(
            "run {run_id} may run its answer checks: {}\n",
            checks.join("; ")
        ));
    }
    Ok(EXIT_OK)
}

fn trust_command(settings: &Settings, json: bool, path: Option<&Path>) -> Result<u8, Failure> {
    let candidates: Vec<PathBuf> = match path {
        Some(p) if p.is_dir() => vec![p.join("agent.toml"), p.join(".mcp.json")],
        Some(p) => {
            if !p.is_file() {
                return Err(usage(format!(
                    "{}: no such file; give an agent.toml, a .mcp.json or their directory",
                    p.display()
                )));
            }
            vec![p.to_path_buf()]
        }
        None => {
            let mut v: Vec<PathBuf> = settings.file.iter().map(|f| f.path.clone()).collect();
            v.push(settings.workspace.join(".mcp.json"));
            if let crate::settings::McpSource::File(mcp) = &settings.mcp {
                v.push(mcp.clone());
            }
            v
        }
    };
    let files: Vec<&PathBuf> = candidates.iter().filter(|p| p.is_file()).collect();
    if files.is_empty() {
        return Err(usage(
            "no agent.toml or .mcp.json here; give the file or its directory: agent trust PATH",
        ));
    }
    let mut read = Vec::new();
    for path in files {
        let (file, bytes) = trust::ProjectFile::read(path).map_err(usage)?;
        trust::check_kind(path, &bytes).map_err(usage)?;
        read.push(file);
    }
    let mut trusted = trust::Trusted::load().map_err(usage)?;
    let mut done = Vec::new();
    for file in read {
        trusted.trust(&file).map_err(usage)?;
        done.push(file);
    }
    if json {
        let list: Vec<serde_json::Value> = done
            .iter()
            .map(|f| serde_json::json!({"path": f.path, "sha256": f.hash}))
            .collect();
        say(format_args!("{}\n", serde_json::Value::Array(list)));
    } else {
        for f in &done {
            say(format_args!(
                "trusted {} (sha256 {})\n",
                f.path.display(),
                &f.hash[..16]
            ));
        }
    }
    Ok(EXIT_OK)
}

/// The longest goal or message read from standard input.
const MAX_STDIN_TEXT: u64 = 1 << 20;

/// A goal or message as given on the command line, where `-` reads it from standard input
/// (a task longer than a command line takes, or written by another program): at most
/// 1 MiB of UTF-8 text, or a one-line error before anything is written.
fn text_arg(given: String, what: &str) -> Result<String, Failure> {
    if given != "-" {
        return Ok(given);
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(std::io::stdin().lock(), MAX_STDIN_TEXT + 1),
        &mut bytes,
    )
    .map_err(|e| usage(format!("cannot read the {what} from standard input: {e}")))?;
    if bytes.len() as u64 > MAX_STDIN_TEXT {
        return Err(usage(format!(
            "the {what} on standard input is longer than 1 MiB; give a shorter one"
        )));
    }
    String::from_utf8(bytes).map_err(|e| {
        usage(format!(
            "the {what} on standard input is not UTF-8 text (byte {}); save it as UTF-8",
            e.utf8_error().valid_up_to()
        ))
    })
}

fn run(settings: &Settings, json: bool, goal: &str) -> Result<u8, Failure> {
    // Everything that can be wrong with the input is checked before anything is written.
    if goal.trim().is_empty() {
        return Err(usage(
            "the goal is empty; say what the agent should achieve",
        ));
    }
    let choice = settings.model.as_ref().ok_or_else(|| {
        usage("no model: pass --model PROVIDER:MODEL (e.g. script:PATH) or set model in agent.toml")
    })?;
    let budget = settings.budget.apply(Budget::default());
    let run_id = ulid::Ulid::generate().to_string();
    // A directory store is created once every input is checked; a database holds the run
    // for this process from here.
    let store = match &settings.store {
        location @ StoreLocation::Dir(_) => StoreSource::At(location),
        location => StoreSource::Open(Box::new(
            OpenStore::create(location)?.writable()?.take_new(&run_id)?,
        )),
    };
    let one = OneRun::new(settings, choice, store, json)?;
    crate::build::trust_own_checks(&run_id, &settings.answer.checks);
    let request = RunRequest::new(run_id, goal, budget);
    let driven = one
        .rt
        .block_on(one.runtime.start(request, one.cancel.clone()));
    one.finish(driven)
}

/// A command that drives one run: its async runtime, the agent's runtime, whether a person
/// at the terminal answers its pauses, and Ctrl-C as cancellation.
struct OneRun {
    rt: tokio::runtime::Runtime,
    runtime: Runtime,
    asks: bool,
    cancel: CancellationToken,
    json: bool,
}

impl OneRun {
    fn new(
        settings: &Settings,
        choice: &ModelChoice,
        store: StoreSource<'_>,
        json: bool,
    ) -> Result<OneRun, Failure> {
        let rt = tokio_one_run()?;
        let asks = interactive(settings);
        let runtime =
            build(settings, choice, store, &rt, !json, asks)?.with_drain(drain_on_terminate()?);
        // Asked to stop at an approval's question, the run stays paused for it.
        crate::build::stopped_at_prompt_with(crate::exit::EXIT_PAUSED);
        let cancel = cancel_on_ctrl_c(&rt);
        Ok(OneRun {
            rt,
            runtime,
            asks,
            cancel,
            json,
        })
    }

    /// What driving the run came to: a pause for approval settled at the terminal when
    /// there is one, then the outcome printed and its exit code. A run let go at its next
    /// step (SIGTERM) is interrupted: said as `agent show --follow` says it, exit 3.
    fn finish(&self, driven: Result<Report, RuntimeError>) -> Result<u8, Failure> {
        let report = match driven {
            Err(RuntimeError::LetGo { run_id }) => {
                if self.json {
                    say(format_args!("{}\n", render::interrupted_json(&run_id)));
                }
                let failure = Failure::from(RuntimeError::LetGo { run_id });
                tell(format_args!("agent: {}\n", failure.message));
                return Ok(failure.code);
            }
            driven => driven?,
        };
        let report = ask_inline(self.asks, &self.rt, &self.runtime, report, &self.cancel)?;
        Ok(finish(&report, self.json))
    }
}

/// On a terminal, a run that pauses for approval asks the person there and then, instead
/// of exiting 3.
fn ask_inline(
    asks: bool,
    rt: &tokio::runtime::Runtime,
    runtime: &Runtime,
    report: Report,
    cancel: &CancellationToken,
) -> Result<Report, Failure> {
    if !asks || report.outcome.reason != agent_core::TerminalReason::ApprovalRequired {
        return Ok(report);
    }
    let mut editor = rustyline::DefaultEditor::new()
        .map_err(|e| failed(format!("cannot read the terminal: {e}")))?;
    let mut always = std::collections::BTreeSet::new();
    Ok(chat::settle_inline(
        rt,
        runtime,
        &mut editor,
        report,
        &mut always,
        cancel,
    )?)
}

/// The model a run continues with when none is given: its own script, for a script run.
pub(crate) fn recorded_model(
    settings: &Settings,
    store: &OpenStore,
    run_id: &str,
) -> Result<ModelChoice, Failure> {
    let log = store.as_store().load(run_id)?;
    let Some(Event::RunStarted { manifest, .. }) = log.first().map(|e| &e.event) else {
        return Err(usage(format!("run {run_id} has no start event")));
    };
    if manifest.provider != "script" {
        return Err(usage(format!(
            "run {run_id} used {}:{}; pass --model to continue it",
            manifest.provider, manifest.model
        )));
    }
    Ok(settings.model_named(&format!("script:{}", manifest.model))?)
}

/// The id of the run started last in the store.
/// The run named, or with `--last` the newest one (clap has made sure there is exactly one
/// of them).
fn named_or_newest(
    location: &StoreLocation,
    run: Option<String>,
    last: bool,
) -> Result<String, Failure> {
    match run {
        Some(run) if !last => Ok(run),
        _ => newest_run(location),
    }
}

fn newest_run(location: &StoreLocation) -> Result<String, Failure> {
    let store = OpenStore::must_exist(location)?;
    let mut runs = store.as_store().runs()?;
    // A run just submitted, no worker started yet, is the newest as `agent runs` lists it.
    if let OpenStore::Postgres(queue) = &store {
        runs.extend(worker::never_started_runs(queue)?);
    }
    // A sub-agent's run starts after its parent's, and is not a run the person started.
    runs.into_iter()
        .filter(|r| r.parent.is_none())
        .max_by(|a, b| (a.started_at_ms, &a.run_id).cmp(&(b.started_at_ms, &b.run_id)))
        .map(|r| r.run_id)
        .ok_or_else(|| usage(format!("no runs in {location} yet")))
}

/// What to do with an existing run.
enum Resume {
    Continue,
    Reply(String),
    Approve(Vec<CallId>),
    Deny(Vec<CallId>, String),
    Resolve(CallId, Resolution),
}

fn drive_existing(
    settings: &Settings,
    json: bool,
    run_id: &str,
    what: Resume,
) -> Result<u8, Failure> {
    let answer = match &what {
        Resume::Approve(calls) => QueuedAnswer::Input(Input::ApprovalGranted {
            call_ids: calls.clone(),
        }),
        Resume::Deny(calls, reason) => QueuedAnswer::Input(Input::ApprovalDenied {
            call_ids: calls.clone(),
            reason: reason.clone(),
        }),
        Resume::Resolve(call, resolution) => QueuedAnswer::Input(Input::Resolved {
            call_id: call.clone(),
            resolution: *resolution,
        }),
        Resume::Reply(text) => QueuedAnswer::Message(text.clone()),
        Resume::Continue => QueuedAnswer::Continue,
    };
    if let Resume::Reply(text) = &what
        && let Some(code) = hand_to_live_run(settings, json, run_id, text)?
    {
        return Ok(code);
    }
    if let Some(code) = worker::answer_queued(settings, json, run_id, answer)? {
        return Ok(code);
    }
    let store = OpenStore::must_exist(&settings.store)?
        .writable()?
        .take(run_id)?;
    let log = store.as_store().load(run_id)?;
    let in_run = taken_up(settings, run_id, &log)?;
    let settings: &Settings = &in_run;
    crate::build::ensure_checks_trusted(run_id, &log, crate::build::interactive(settings))?;
    let choice = match &settings.model {
        Some(choice) => choice.clone(),
        None => recorded_model(settings, &store, run_id)?,
    };
    // A message's new limits, checked before anything is written.
    let reply = match &what {
        Resume::Reply(text) => Some((text.clone(), new_budget(settings, run_id, &log)?)),
        _ => None,
    };
    // A sub-agent driven by its own id: its parent may wait on it.
    let waiting = waiting_parent(store.as_store(), run_id);
    // A message to an interrupted run is a note read before its next model call.
    let notes_before = match (&what, RunState::fold(&log).map(|s| s.status)) {
        (Resume::Reply(_), Ok(agent_core::Status::Running)) => Some(notes_in(&log)),
        _ => None,
    };
    let one = OneRun::new(settings, &choice, StoreSource::Open(Box::new(store)), json)?;
    let runtime = &one.runtime;
    let cancel = one.cancel.clone();
    let driven = one.rt.block_on(async move {
        if let Some((text, budget)) = reply {
            return runtime.reply(run_id, &text, budget, cancel).await;
        }
        match what {
            Resume::Continue | Resume::Reply(..) => runtime.resume(run_id, cancel).await,
            Resume::Approve(calls) => runtime.approve(run_id, calls, cancel).await,
            Resume::Deny(calls, reason) => runtime.deny(run_id, calls, reason, cancel).await,
            Resume::Resolve(call, resolution) => {
                runtime.resolve(run_id, call, resolution, cancel).await
            }
        }
    });
    let code = one.finish(driven)?;
    released(settings, one.runtime.store().as_ref(), run_id, waiting)?;
    if let Some(before) = notes_before {
        let log = one.runtime.store().load(run_id)?;
        if notes_in(&log) == before {
            tell(format_args!(
                "agent: run {run_id} stopped before it read your message; send it again \
                 once it goes on\n"
            ));
        }
    }
    Ok(code)
}

/// Whether `new` entries of a run commit the note `text` (another person's note to the
/// same run is not this one).
fn reads(new: &[agent_core::Entry], text: &str) -> bool {
    new.iter()
        .any(|e| matches!(&e.event, Event::UserNote { text: read } if read == text))
}

/// How many notes (`user_note`) a log holds.
fn notes_in(log: &[agent_core::Entry]) -> usize {
    log.iter()
        .filter(|e| matches!(e.event, Event::UserNote { .. }))
        .count()
}

/// The longest message `agent resume RUN MESSAGE` hands a live run.
pub(crate) const MAX_NOTE: usize = 64 * 1024;

/// `agent resume RUN MESSAGE` of a run another process drives now: the message is handed to
/// that process, which commits it before the run's next model call (`user_note`); this
/// waits until it did, or until the run stops without it. `None` when no other process
/// drives the run (the message is then a reply, sent here).
fn hand_to_live_run(
    settings: &Settings,
    json: bool,
    run_id: &str,
    text: &str,
) -> Result<Option<u8>, Failure> {
    let store = OpenStore::must_exist(&settings.store)?.writable()?;
    let Some(by) = store.driver(run_id)? else {
        return Ok(None);
    };
    let log = store.as_store().load(run_id)?;
    let mut follower = Follower::after(run_id, &log);
    // Held between two exchanges (a chat's): taking it says who holds it.
    if !follower.running() {
        return Ok(None);
    }
    if new_budget(settings, run_id, &log)?.is_some() {
        return Err(usage(format!(
            "run {run_id} is driven by {by}: new limits are not given to a live run; send \
             the message without them, or once it stopped"
        )));
    }
    if text.len() > MAX_NOTE {
        return Err(usage(format!(
            "the message is {} bytes; a live run takes at most {} KiB: send a shorter one",
            text.len(),
            MAX_NOTE / 1024
        )));
    }
    // Redacted here (the run would redact it too): a secret in it does not reach the
    // database or the other process, and the note the run commits is known by its text.
    let text = &Redactor::from_env().redact_str(text);
    if !store.as_store().tell(run_id, text)? {
        return Err(usage(format!(
            "run {run_id} is being driven by {by}, which could not be handed the message; \
             wait for it to end, then send it"
        )));
    }
    // Said with --json too (on stderr, for the person).
    tell(format_args!(
        "agent: run {run_id} ({by}) has your message; it reads it before its next model \
         call (Ctrl-C stops waiting for that, not the message)\n"
    ));
    let read = loop {
        match follower.next(&store)? {
            Some((new, _)) => {
                if reads(&new, text) {
                    break true;
                }
                if !follower.running() {
                    break false;
                }
            }
            None => break false,
        }
    };
    if json {
        let status = if read { "read" } else { "unread" };
        say(format_args!(
            "{}\n",
            serde_json::json!({"run_id": run_id, "status": status})
        ));
    }
    if !read {
        return Err(usage(format!(
            "run {run_id} stopped before it read your message; `agent resume {run_id} \
             MESSAGE` sends it as a follow-up"
        )));
    }
    tell(format_args!("agent: run {run_id} read your message\n"));
    Ok(Some(EXIT_OK))
}

/// `agent fork RUN --at N`: the fork written, then driven like a new run.
fn fork(settings: &Settings, json: bool, parent: &str, at: u32) -> Result<u8, Failure> {
    let location = &settings.store;
    let store = OpenStore::must_exist(location)?.writable()?;
    let log = store.as_store().load(parent)?;
    if log.is_empty() {
        return Err(usage(format!("no run {parent} in {location}")));
    }
    let state = RunState::fold(&log).map_err(|e| failed(format!("run {parent}: {e}")))?;
    if agent_core::before_model_call(&log, at).is_none() {
        let calls = state.steps;
        return Err(usage(format!(
            "run {parent} made {calls} model call(s); --at takes 1 to {calls}"
        )));
    }
    // The fork works where its parent did, with its sub-agents, unless told otherwise.
    let in_parent = taken_up(settings, parent, &log)?;
    let settings: &Settings = &in_parent;
    let choice = match &settings.model {
        Some(choice) => choice.clone(),
        None => recorded_model(settings, &store, parent)?,
    };
    // The parent's limits, with those given here in place.
    let budget = settings
        .budget
        .apply(state.budget_in_force().unwrap_or_default());
    let run_id = ulid::Ulid::generate().to_string();
    let store = store.take_new(&run_id)?;
    let one = OneRun::new(settings, &choice, StoreSource::Open(Box::new(store)), json)?;
    crate::build::trust_own_checks(&run_id, &settings.answer.checks);
    let driven = one.rt.block_on(
        one.runtime
            .fork(parent, at, &run_id, budget, one.cancel.clone()),
    );
    one.finish(driven)
}

/// `settings` for taking up run `run_id` (`log`, its log), or a fork of it: in the
/// workspace it was started in ([`Settings::in_run_workspace`], said on the terminal when
/// it is not this directory), with sub-agents when it was started with them, and in the
/// sandbox it was started in unless this command says otherwise (said too).
pub(crate) fn taken_up<'a>(
    settings: &'a Settings,
    run_id: &str,
    log: &[agent_core::Entry],
) -> Result<std::borrow::Cow<'a, Settings>, Failure> {
    let mut taken = match settings.in_run_workspace(run_id, log)? {
        Some((moved, said)) => {
            tell(said);
            std::borrow::Cow::Owned(moved)
        }
        None => std::borrow::Cow::Borrowed(settings),
    };
    let had_sub_agents = match log.first().map(|e| &e.event) {
        Some(Event::RunStarted { manifest, .. }) => manifest
            .tools
            .iter()
            .any(|t| agent_tools::builtin::is_delegate(&t.name)),
        _ => false,
    };
    if had_sub_agents && !taken.sub_agents {
        taken.to_mut().sub_agents = true;
    }
    // Its commands stay in the sandbox they started in, unless this command says: a run
    // whose calls a person approves from another shell runs them as it was started to.
    // (Any sandbox, whatever a log says of it, confines more than none.)
    let recorded = match log.first().map(|e| &e.event) {
        Some(Event::RunStarted { manifest, .. }) => manifest.sandbox.as_deref(),
        _ => None,
    };
    if let Some(recorded) = recorded.filter(|_| !taken.sandbox_said) {
        let sandbox = agent_tools::Sandbox::from_record(recorded);
        tell(format_args!(
            "agent: run {run_id} runs its commands in a sandbox, as it started (--no-sandbox \
             runs them without)\n"
        ));
        taken.to_mut().sandbox = Some(sandbox);
    }
    Ok(taken)
}

/// The limits a message to a run sets, when they differ from those in force.
pub(crate) fn new_budget(
    settings: &Settings,
    run_id: &str,
    log: &[agent_core::Entry],
) -> Result<Option<Budget>, Failure> {
    let state = RunState::fold(log)
        .map_err(|e| failed(format!("the log of run {run_id} is damaged: {e}")))?;
    let current = state.budget_in_force().unwrap_or_default();
    let new = settings.budget.apply(current.clone());
    Ok((new != current).then_some(new))
}

fn cancel(settings: &Settings, json: bool, run_id: &str) -> Result<u8, Failure> {
    if let Some(code) = worker::cancel_queued(settings, json, run_id)? {
        return Ok(code);
    }
    let store = OpenStore::must_exist(&settings.store)?.writable()?;
    // A run another process drives is stopped by that process, asked through the store.
    if let Some(by) = store.driver(run_id)? {
        let log = store.as_store().load(run_id)?;
        match RunState::fold(&log).map(|state| state.status) {
            // Held between two exchanges (an `agent chat` waiting for its next message).
            Ok(agent_core::Status::Ended(outcome)) => {
                return Err(usage(format!(
                    "run {run_id} already ended: {} ({}); {by} holds it",
                    outcome.reason.class().as_str(),
                    outcome.reason
                )));
            }
            Ok(agent_core::Status::Running) if store.as_store().ask_to_stop(run_id)? => {
                // `None`: its process died meanwhile, and the run is cancelled from here.
                let stopped = stopped_by_its_driver(&store, &settings.store, run_id, &log, &by)?;
                if let Some(report) = stopped {
                    return Ok(finish(&report, json));
                }
            }
            // Paused (its process asks the person), or a log that does not fold: taking
            // it below says who holds it.
            _ => {}
        }
    }
    let store = store.take(run_id)?;
    let ws = Workspace::new(".").map_err(|e| usage(format!("the current directory: {e}")))?;
    // Cancelling asks no model and starts nothing.
    let runtime = Runtime::without_model(Arc::new(Gateway::new(ws)), store.into_shared())
        .with_redactor(Redactor::from_env());
    let waiting = waiting_parent(runtime.store().as_ref(), run_id);
    let rt = tokio_one_run()?;
    let report = rt.block_on(runtime.cancel(run_id))?;
    let code = finish(&report, json);
    released(settings, runtime.store().as_ref(), run_id, waiting)?;
    Ok(code)
}

/// The run that waits on sub-agent run `child`, paused with its call to it in doubt.
fn waiting_parent(store: &dyn agent_store::Store, child: &str) -> Option<String> {
    let parent = agent_core::parent_run_id(child)?;
    let state = RunState::fold(&store.load(parent).ok()?).ok()?;
    state.call_waiting_on(child).map(|_| parent.to_owned())
}

/// After a command drove sub-agent run `child` by its own id: when its parent, `waiting`
/// on it before, waits on it no more (the runtime let it go on with the sub-agent's end),
/// the parent is woken in the queue when it waits there, and the person told how it goes on.
fn released(
    settings: &Settings,
    store: &dyn agent_store::Store,
    child: &str,
    waiting: Option<String>,
) -> Result<(), Failure> {
    match waiting {
        Some(parent) if waiting_parent(store, child).is_none() => parent_goes_on(settings, &parent),
        _ => Ok(()),
    }
}

/// The parent a sub-agent's end let go on: woken in the queue when it waits there, and
/// the person told how it goes on.
fn parent_goes_on(settings: &Settings, parent: &str) -> Result<(), Failure> {
    let queued = match &settings.store {
        StoreLocation::Postgres(_) => {
            let queue = crate::stores::queue(&settings.store, "cancel")?;
            queue.queue_state(parent)? == Some(agent_store::QueueState::Paused)
                && queue.wake(parent)?
        }
        StoreLocation::Dir(_) => false,
    };
    // Said with --json too: on stderr, for the person.
    let how = if queued {
        "it is queued again and a worker goes on with".to_owned()
    } else {
        format!("`agent resume {parent}` goes on with")
    };
    tell(format_args!(
        "agent: run {parent} waited on this sub-agent; {how} its end\n"
    ));
    Ok(())
}

/// How long `agent cancel` waits for the process driving a run to stop it.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits until the process driving `run_id` (`by`; `log`, its log as read first), asked to
/// stop it, lets the run go; then where the run stands (`cancelled`, or how it ended first). `None` when it
/// stands nowhere (its process died before it stopped the run: it is interrupted).
fn stopped_by_its_driver(
    store: &OpenStore,
    location: &StoreLocation,
    run_id: &str,
    log: &[agent_core::Entry],
    by: &str,
) -> Result<Option<Report>, Failure> {
    let deadline = std::time::Instant::now() + STOP_WAIT;
    let mut follower = Follower::after(run_id, log);
    // Until the run stops, or its driver lets it go: an `agent chat` keeps its run after
    // the exchange it stopped, for the person's next message.
    while follower.next(store)?.is_some() && follower.running() {
        if std::time::Instant::now() >= deadline {
            return Err(failed(format!(
                "run {run_id}: {by} was asked to stop it, and still drives it after {} s",
                STOP_WAIT.as_secs()
            )));
        }
    }
    let ws = Workspace::new(".").map_err(|e| usage(format!("the current directory: {e}")))?;
    let reader = OpenStore::must_exist(location)?;
    let runtime = Runtime::without_model(Arc::new(Gateway::new(ws)), reader.into_shared());
    Ok(tokio_one_run()?.block_on(runtime.standing(run_id))?)
}

fn finish(report: &Report, json: bool) -> u8 {
    if json {
        say(format_args!("{}\n", render::outcome_json(report)));
    } else {
        if let Some(answer) = &report.outcome.answer {
            say(format_args!("{answer}\n"));
        }
        tell(format_args!("agent: {}\n", render::outcome_text(report)));
    }
    exit_code(report.outcome.reason)
}

/// After a read-only command printed what a damaged store still holds: the damage.
fn report_damage(store: &OpenStore) -> Result<u8, Failure> {
    match store.damage() {
        Some(damage) => Err(failed(damage)),
        None => Ok(EXIT_OK),
    }
}

/// On stderr, that a run is still going: what was shown is what it committed so far.
fn tell_live(run_id: &str, live: Option<&str>) {
    if let Some(by) = live {
        tell(format_args!(
            "agent: run {run_id} is live, driven by {by}: this is what it committed so far\n"
        ));
    }
}

fn context(settings: &Settings, json: bool, run_id: &str, at: Option<u32>) -> Result<u8, Failure> {
    let location = &settings.store;
    let store = OpenStore::must_exist(location)?;
    let damage = store.damage();
    let mut log = store.as_store().load(run_id)?;
    let live = store.driver(run_id)?;
    if log.is_empty() {
        return Err(usage(format!("no run {run_id} in {location}")));
    }
    if let Some(n) = at {
        // The prompt of call N is the projection of everything committed before it.
        let calls = RunState::fold(&log).map(|s| s.steps).unwrap_or(0);
        let Some(first) = agent_core::before_model_call(&log, n) else {
            return Err(usage(format!(
                "run {run_id} made {calls} model call(s); --at takes 1 to {calls}"
            )));
        };
        log.truncate(first);
    }
    // A command that only reads starts nothing and calls nothing: no model, no MCP
    // server, no hook. The model's name sets the context window; the tools are the ones the
    // run recorded at its start.
    let (recorded_model, recorded, scripted) = match log.first().map(|e| &e.event) {
        Some(Event::RunStarted { manifest, .. }) => (
            manifest.model.clone(),
            manifest.tools.clone(),
            manifest.provider == "script",
        ),
        _ => (String::new(), Vec::new(), false),
    };
    let model_name = match &settings.model {
        Some(ModelChoice::Http(http)) => http.model.clone(),
        _ => recorded_model,
    };
    let tools = if recorded.is_empty() {
        // A run from before tools were recorded: the built-ins.
        let ws = Workspace::new(".").map_err(|e| usage(format!("the current directory: {e}")))?;
        Gateway::with_builtins(ws).map_err(failed)?.specs()
    } else {
        recorded
    };
    let mut projector = Projector::new(
        settings.context_config(&model_name),
        tools,
        // Counted as the run counts them (`build::runtime`): a script's prompts at four
        // bytes a token, a real model's with o200k.
        if scripted {
            Arc::new(agent_context::CharEstimate)
        } else {
            Arc::new(agent_context::Tiktoken)
        },
    );
    projector.apply_all(&log);
    let prompt = projector.prompt();
    let window = projector.config().context_window;
    if json {
        let value = serde_json::json!({
            "run_id": run_id,
            "system": prompt.system,
            "messages": prompt.messages,
            "tools": prompt.tools,
            "answer_schema": prompt.answer_schema,
            "estimated_tokens": projector.tokens(),
            "context_window": window,
            "live": live,
        });
        say(format_args!("{value}\n"));
    } else {
        say(format_args!(
            "{}",
            render::prompt_text(prompt, projector.tokens(), window)
        ));
        tell_live(run_id, live.as_deref());
    }
    match damage {
        Some(damage) => Err(failed(damage)),
        None => Ok(EXIT_OK),
    }
}

fn runs(location: &StoreLocation, json: bool) -> Result<u8, Failure> {
    let store = OpenStore::existing(location)?;
    let mut runs = match &store {
        Some(store) => store.as_store().runs()?,
        None => Vec::new(),
    };
    if let Some(OpenStore::Postgres(queue)) = &store {
        runs.extend(worker::never_started_runs(queue)?);
    }
    runs.sort_by(|a, b| (a.started_at_ms, &a.run_id).cmp(&(b.started_at_ms, &b.run_id)));
    agent_store::RunSummary::surface_sub_agents(&mut runs);
    for run in &mut runs {
        // The store's bookkeeping, not the run's.
        run.sub_agent_usage.clear();
        run.in_doubt.clear();
    }
    if json {
        say(format_args!(
            "{}\n",
            serde_json::to_string(&runs).unwrap_or_default()
        ));
    } else {
        say(format_args!("{}\n", render::runs_table(&runs)));
    }
    match &store {
        Some(store) => report_damage(store),
        None => Ok(EXIT_OK),
    }
}

fn report(
    location: &StoreLocation,
    json: bool,
    run_id: &str,
    out: Option<std::path::PathBuf>,
) -> Result<u8, Failure> {
    let store = OpenStore::must_exist(location)?;
    let entries = store.as_store().load(run_id)?;
    if entries.is_empty() {
        return Err(usage(format!("no run {run_id} in {location}")));
    }
    let html = crate::report::html(run_id, &entries);
    let out = out.unwrap_or_else(|| format!("agent-report-{run_id}.html").into());
    // Written whole or not at all: beside its place, then renamed over it.
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(usage(format!(
            "cannot write {}: there is no directory {}; make it, or give another --out",
            out.display(),
            dir.display()
        )));
    }
    write_whole(&dir, &out, html.as_bytes())
        .map_err(|e| usage(format!("cannot write {}: {e}", out.display())))?;
    if json {
        let value = serde_json::json!({"run_id": run_id, "path": out.to_string_lossy()});
        say(format_args!("{value}\n"));
    } else {
        say(format_args!("{}\n", out.display()));
    }
    report_damage(&store)
}

/// Writes `path` (in `dir`) whole: through a temporary file beside it, renamed over it, so
/// that a reader never meets half of it. The file gets the mode a new file of the person's
/// gets (0644 under the usual umask), not a temporary file's 0600: a report or a JUnit file
/// is read by other programs and people.
pub(crate) fn write_whole(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut file = tempfile::Builder::new()
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(dir)?;
    std::io::Write::write_all(&mut file, bytes)?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// A sub-agent's run: the version of the entry that says it finished, its id, its log.
pub(crate) type Child = (u64, String, Vec<agent_core::Entry>);

/// The sub-agents' runs that `entries` say finished, each folded into one line under the
/// call it answered.
pub(crate) fn children_of(
    store: &dyn agent_store::Store,
    entries: &[agent_core::Entry],
) -> Vec<Child> {
    entries
        .iter()
        .filter_map(|e| match &e.event {
            Event::SubAgentFinished { run_id, .. } => Some((e.version, run_id.clone())),
            _ => None,
        })
        .map(|(version, child)| {
            let log = store.load(&child).unwrap_or_default();
            (version, child, log)
        })
        .collect()
}

/// `entries` as `agent show` prints them: a line each, a sub-agent's under its call.
pub(crate) fn timeline_text(
    run_id: &str,
    entries: &[agent_core::Entry],
    children: &[Child],
) -> String {
    let mut text = String::new();
    for line in render::timeline(run_id, entries).lines() {
        text.push_str(line);
        text.push('\n');
        let version: Option<u64> = line.split_whitespace().next().and_then(|v| v.parse().ok());
        if let Some((_, child, log)) = children.iter().find(|(v, ..)| Some(*v) == version) {
            text.push_str(&render::child_line(child, log));
            text.push('\n');
        }
    }
    text
}

/// `agent show --follow`: the timeline so far, then each entry as it is committed, for as
/// long as something drives the run ([`OpenStore::going_on`]); then where the run stands,
/// as `agent run` says it, and its exit code.
fn follow(location: &StoreLocation, json: bool, run_id: &str) -> Result<u8, Failure> {
    let store = OpenStore::must_exist(location)?;
    let mut follower = Follower::new(run_id);
    let mut first = true;
    let mut children = RunningChildren::default();
    loop {
        // While sub-agents run, their entries are looked for as often as the run's.
        let wait = if children.open.is_empty() || json {
            store.follow_wait()
        } else {
            agent_store::FOLLOW_POLL
        };
        let Some((new, going)) = follower.next_within(&store, wait)? else {
            break;
        };
        if let (true, Some(how)) = (first, &going) {
            tell(format_args!(
                "agent: following run {run_id}, {how}; Ctrl-C stops following, not the run\n"
            ));
        }
        first = false;
        let written = if json {
            new.iter().all(|entry| {
                serde_json::to_string(entry).is_ok_and(|line| say(format_args!("{line}\n")))
            })
        } else {
            // What its sub-agents did meanwhile comes before what the run did with it.
            let meanwhile = children.news(store.as_store());
            children.saw(run_id, &new);
            (meanwhile.is_empty() || say(meanwhile))
                && (new.is_empty()
                    || say(timeline_text(
                        run_id,
                        &new,
                        &children_of(store.as_store(), &new),
                    )))
        };
        if !written {
            // The reader went away (`agent show -f RUN | head`).
            return Ok(EXIT_OK);
        }
    }
    if let Some(damage) = store.damage() {
        return Err(failed(damage));
    }
    // Where it stands, as the command that drove it would have said.
    let ws = Workspace::new(".").map_err(|e| usage(format!("the current directory: {e}")))?;
    let runtime = Runtime::without_model(Arc::new(Gateway::new(ws)), store.into_shared());
    match tokio_one_run()?.block_on(runtime.standing(run_id))? {
        Some(report) => {
            if json {
                say(format_args!("{}\n", render::outcome_json(&report)));
            } else {
                tell(format_args!("agent: {}\n", render::outcome_text(&report)));
            }
            Ok(exit_code(report.outcome.reason))
        }
        None => {
            if json {
                say(format_args!("{}\n", render::interrupted_json(run_id)));
            } else {
                tell(format_args!(
                    "agent: run {run_id} was interrupted: nothing drives it now; \
                     `agent resume {run_id}` goes on with it\n"
                ));
            }
            Ok(crate::exit::EXIT_PAUSED)
        }
    }
}

/// The sub-agents of a followed run that run now, by the call each answers: their
/// entries are shown as they are committed, under the run's (`agent show --follow`).
#[derive(Default)]
struct RunningChildren {
    /// Per call: the child's run id and the first version of its log not shown yet.
    open: std::collections::BTreeMap<CallId, (String, u64)>,
}

impl RunningChildren {
    /// Notes the sub-agents `entries` of run `run_id` start and finish.
    fn saw(&mut self, run_id: &str, entries: &[agent_core::Entry]) {
        for entry in entries {
            match &entry.event {
                Event::DecisionProposed {
                    turn,
                    decision: agent_core::Decision::ToolCalls { calls },
                    ..
                } => {
                    for call in calls {
                        if agent_tools::builtin::is_delegate(&call.name) {
                            let child = agent_core::sub_agent_run_id(run_id, *turn, &call.id);
                            self.open.insert(call.id.clone(), (child, 1));
                        }
                    }
                }
                Event::ToolFinished { result, .. } | Event::CallRejected { result, .. } => {
                    self.open.remove(&result.call_id);
                }
                Event::RunEnded { .. } => self.open.clear(),
                _ => {}
            }
        }
    }

    /// The timeline lines of what the running sub-agents committed since the last look,
    /// each marked with the call it answers.
    fn news(&mut self, store: &dyn agent_store::Store) -> String {
        let mut text = String::new();
        for (call, (child, next)) in &mut self.open {
            // Not started yet (or unreadable): looked for again next time.
            let Ok(new) = store.load_from(child, *next) else {
                continue;
            };
            let Some(last) = new.last() else {
                continue;
            };
            *next = last.version + 1;
            for line in render::timeline(child, &new).lines() {
                text.push_str(&format!("      │ {call} {line}\n"));
            }
        }
        text
    }
}

fn show(
    location: &StoreLocation,
    json: bool,
    run_id: &str,
    call: Option<&str>,
) -> Result<u8, Failure> {
    let store = OpenStore::must_exist(location)?;
    let entries = match store.as_store().load(run_id) {
        // Queued, and no worker started it: it has no log, and says so.
        Err(agent_store::StoreError::RunNotFound(_))
            if let Some(how) = store.never_started(run_id)? =>
        {
            if json {
                let value = serde_json::json!({"run_id": run_id, "events": [], "queue": how});
                say(format_args!("{value}\n"));
            } else {
                tell(format_args!("agent: run {run_id} {how}: nothing ran\n"));
            }
            return Ok(EXIT_OK);
        }
        loaded => loaded?,
    };
    let live = store.driver(run_id)?;
    if let Some(id) = call {
        // Every proposal of that call id (a model may reuse ids across turns).
        let found: Vec<serde_json::Value> = entries
            .iter()
            .filter_map(|e| match &e.event {
                Event::DecisionProposed { turn, decision, .. } => Some((*turn, decision)),
                _ => None,
            })
            .flat_map(|(turn, decision)| {
                let calls = match decision {
                    agent_core::Decision::ToolCalls { calls }
                    | agent_core::Decision::RequestApproval { calls, .. } => calls.as_slice(),
                    _ => &[],
                };
                calls
                    .iter()
                    .filter(|c| c.id.as_str() == id)
                    .map(move |c| {
                        serde_json::json!({
                            "turn": turn,
                            "call_id": c.id,
                            "tool": c.name,
                            "arguments": c.arguments,
                        })
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        if found.is_empty() {
            return Err(usage(format!(
                "run {run_id} has no call {id:?}; `agent show {run_id}` lists its calls"
            )));
        }
        let value = serde_json::Value::Array(found);
        if json {
            say(format_args!("{value}\n"));
        } else {
            say(format_args!(
                "{}\n",
                serde_json::to_string_pretty(&value).unwrap_or_default()
            ));
        }
        return Ok(EXIT_OK);
    }
    let children = children_of(store.as_store(), &entries);
    if json {
        let folded: Vec<serde_json::Value> = children
            .iter()
            .map(|(_, child, log)| render::child_json(child, log))
            .collect();
        let value = serde_json::json!({
            "run_id": run_id, "live": live, "events": entries, "children": folded,
        });
        say(format_args!("{value}\n"));
    } else {
        say(timeline_text(run_id, &entries, &children));
        // Every line of the timeline is an event; the total goes beside it.
        if let Some(total) = render::usage_total(&entries) {
            tell(format_args!("{total}\n"));
        }
        tell_live(run_id, live.as_deref());
    }
    report_damage(&store)
}

#[cfg(test)]
mod tests {
    use agent_core::{Entry, Event};

    fn note(version: u64, text: &str) -> Entry {
        Entry {
            version,
            at_ms: 0,
            event: Event::UserNote { text: text.into() },
        }
    }

    /// Two people telling one run at once: each is told "read" for its own note only.
    #[test]
    fn a_sender_is_told_read_for_its_own_note_only() {
        let new = [note(4, "stop after this file")];
        assert!(super::reads(&new, "stop after this file"));
        assert!(!super::reads(&new, "also check the tests"));
        assert!(!super::reads(&[], "stop after this file"));
    }
}
