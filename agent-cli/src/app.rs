//! The commands.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use agent_core::{Budget, Event};
use agent_providers::{Model, ModelSpec, ScriptModel};
use agent_runtime::{CancellationToken, EventSink, Report, RunRequest, Runtime, RuntimeError};
use agent_store::{SledStore, Store, StoreError};
use agent_tools::{Gateway, Workspace};

use crate::args::{Cli, Commands, RunArgs};
use crate::exit::{EXIT_FAILED, EXIT_OK, EXIT_USAGE, exit_code};
use crate::render;

/// A command that could not run, with its exit code.
struct Failure {
    code: u8,
    message: String,
}

fn usage(message: impl std::fmt::Display) -> Failure {
    Failure {
        code: EXIT_USAGE,
        message: message.to_string(),
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        usage(e)
    }
}

impl From<RuntimeError> for Failure {
    fn from(e: RuntimeError) -> Self {
        match e {
            RuntimeError::Store(e) => usage(e),
            RuntimeError::Damaged { .. } => usage(e),
            other => Failure {
                code: EXIT_FAILED,
                message: other.to_string(),
            },
        }
    }
}

/// Runs a parsed command line and returns the process's exit code.
pub fn main(cli: Cli) -> ExitCode {
    match dispatch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("agent: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

fn dispatch(cli: Cli) -> Result<u8, Failure> {
    let json = cli.json;
    match cli.command {
        Commands::Run(args) => run(&cli.store, json, args),
        Commands::Resume {
            run,
            model,
            workspace,
            events,
        } => resume(&cli.store, json, &run, model.as_deref(), &workspace, events),
        Commands::Runs => runs(&cli.store, json),
        Commands::Show { run } => show(&cli.store, json, &run),
    }
}

fn load_model(text: &str) -> Result<Arc<dyn Model>, Failure> {
    match ModelSpec::parse(text).map_err(usage)? {
        ModelSpec::Script(path) => Ok(Arc::new(ScriptModel::from_path(path).map_err(usage)?)),
    }
}

fn workspace(dir: &Path) -> Result<Gateway, Failure> {
    let ws =
        Workspace::new(dir).map_err(|e| usage(format!("--workspace {}: {e}", dir.display())))?;
    Gateway::with_builtins(ws).map_err(|e| Failure {
        code: EXIT_FAILED,
        message: e.to_string(),
    })
}

fn budget(args: &RunArgs) -> Result<Budget, Failure> {
    let mut budget = Budget::default();
    if let Some(n) = args.max_steps {
        if n == 0 {
            return Err(usage("--max-steps must be at least 1"));
        }
        budget.max_steps = n;
    }
    if let Some(n) = args.max_tool_calls {
        budget.max_tool_calls = n;
    }
    if let Some(secs) = args.timeout {
        if !(secs.is_finite() && secs > 0.0) {
            return Err(usage(format!(
                "--timeout {secs}: give a positive number of seconds"
            )));
        }
        budget.max_wall_time_ms = Some((secs * 1000.0).round() as u64);
    }
    Ok(budget)
}

fn tokio() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure {
            code: EXIT_FAILED,
            message: format!("cannot start the async runtime: {e}"),
        })
}

fn event_printer() -> EventSink {
    Arc::new(|entry| {
        if let Ok(line) = serde_json::to_string(entry) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    })
}

/// Cancels the run on Ctrl-C: no new side effect starts after that.
fn cancel_on_ctrl_c(rt: &tokio::runtime::Runtime) -> CancellationToken {
    let cancel = CancellationToken::new();
    let token = cancel.clone();
    rt.spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            token.cancel();
        }
    });
    cancel
}

fn run(store_dir: &Path, json: bool, args: RunArgs) -> Result<u8, Failure> {
    // Everything that can be wrong with the input is checked before anything is written.
    if args.goal.trim().is_empty() {
        return Err(usage(
            "the goal is empty; say what the agent should achieve",
        ));
    }
    let model = load_model(&args.model)?;
    let gateway = workspace(&args.workspace)?;
    let budget = budget(&args)?;
    let store: Arc<dyn Store> = Arc::new(SledStore::open(store_dir)?);
    let mut runtime = Runtime::new(model, Arc::new(gateway), store);
    if args.events {
        runtime = runtime.with_event_sink(event_printer());
    }
    let rt = tokio()?;
    let cancel = cancel_on_ctrl_c(&rt);
    let run_id = ulid::Ulid::generate().to_string();
    let report = rt.block_on(runtime.start(RunRequest::new(run_id, args.goal, budget), cancel))?;
    Ok(finish(&report, json))
}

fn resume(
    store_dir: &Path,
    json: bool,
    run_id: &str,
    model: Option<&str>,
    dir: &Path,
    events: bool,
) -> Result<u8, Failure> {
    let store = open_existing(store_dir)?;
    let log = store.load(run_id)?;
    let model = match model {
        Some(text) => load_model(text)?,
        None => {
            let Some(Event::RunStarted { manifest, .. }) = log.first().map(|e| &e.event) else {
                return Err(usage(format!("run {run_id} has no start event")));
            };
            if manifest.provider != "script" {
                return Err(usage(format!(
                    "run {run_id} used {}:{}; pass --model to continue it",
                    manifest.provider, manifest.model
                )));
            }
            load_model(&format!("script:{}", manifest.model))?
        }
    };
    let gateway = workspace(dir)?;
    let store: Arc<dyn Store> = Arc::new(store);
    let mut runtime = Runtime::new(model, Arc::new(gateway), store);
    if events {
        runtime = runtime.with_event_sink(event_printer());
    }
    let rt = tokio()?;
    let cancel = cancel_on_ctrl_c(&rt);
    let report = rt.block_on(runtime.resume(run_id, cancel))?;
    Ok(finish(&report, json))
}

fn finish(report: &Report, json: bool) -> u8 {
    if json {
        println!("{}", render::outcome_json(report));
    } else {
        if let Some(answer) = &report.outcome.answer {
            println!("{answer}");
        }
        eprintln!("agent: {}", render::outcome_text(report));
    }
    exit_code(report.outcome.reason)
}

fn open_existing(dir: &Path) -> Result<SledStore, Failure> {
    SledStore::open_existing(dir)?.ok_or_else(|| {
        usage(format!(
            "no store at {}; runs are created by `agent run` (or pass --store DIR)",
            dir.display()
        ))
    })
}

fn runs(store_dir: &Path, json: bool) -> Result<u8, Failure> {
    let mut runs = match SledStore::open_existing(store_dir)? {
        Some(store) => store.runs()?,
        None => Vec::new(),
    };
    // Run ids are ULIDs: by id is by start time.
    runs.sort_by(|a, b| (a.started_at_ms, &a.run_id).cmp(&(b.started_at_ms, &b.run_id)));
    if json {
        println!("{}", serde_json::to_string(&runs).unwrap_or_default());
    } else {
        println!("{}", render::runs_table(&runs));
    }
    Ok(EXIT_OK)
}

fn show(store_dir: &Path, json: bool, run_id: &str) -> Result<u8, Failure> {
    let store = open_existing(store_dir)?;
    let entries = store.load(run_id)?;
    if json {
        let value = serde_json::json!({ "run_id": run_id, "events": entries });
        println!("{value}");
    } else {
        print!("{}", render::timeline(&entries));
    }
    Ok(EXIT_OK)
}
