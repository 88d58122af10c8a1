//! Talking to runs on a terminal: `agent chat`, and the approvals `agent run` asks inline.
//!
//! Nothing here decides anything the non-interactive commands do not: every answer a
//! person types becomes the same runtime call (`reply`, `approve`, `deny`) and so the same
//! committed events, and a chat can be continued later with `agent resume` or
//! `agent chat RUN`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal as _, Write as _};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_core::{CallId, PendingCall, TerminalReason};
use agent_runtime::{Report, RunRequest, Runtime, RuntimeError};

use agent_tools::{ToolActivity, ToolObserver};
use indicatif::{ProgressBar, ProgressStyle};
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;
use tokio_util::sync::CancellationToken;

use crate::app::{recorded_model, tell};
use crate::build::{STREAMED, StoreSource, build, cancel_on_ctrl_c, tokio};
use crate::exit::EXIT_OK;
use crate::failure::{Failure, failed, usage};
use crate::render;
use crate::settings::Settings;
use crate::stores::OpenStore;

/// Each call shown as it starts (a spinner) and as it finishes (one line: the call, ok or
/// the error kind, how long it took).
pub(crate) fn tool_lines() -> ToolObserver {
    let running: Arc<Mutex<BTreeMap<CallId, ProgressBar>>> = Arc::default();
    Arc::new(move |activity: ToolActivity<'_>| {
        let Ok(mut running) = running.lock() else {
            return;
        };
        match activity {
            ToolActivity::Started { call } => {
                let bar = ProgressBar::new_spinner().with_message(format!(
                    "{} {}",
                    render::for_terminal(call.id.as_str()),
                    short(&render::call_text(&call.name, &call.arguments, "", ""))
                ));
                if let Ok(style) = ProgressStyle::with_template("  {spinner} {msg} {elapsed}") {
                    bar.set_style(style);
                }
                bar.enable_steady_tick(Duration::from_millis(100));
                running.insert(call.id.clone(), bar);
            }
            ToolActivity::Finished { result, elapsed } => {
                let status = match result.error_kind() {
                    None => "ok".to_owned(),
                    Some(kind) => kind.as_str().to_owned(),
                };
                let line = format!(
                    "  {} {} {} ({status}, {:.1} s)",
                    if result.is_ok() { "✓" } else { "✗" },
                    result.call_id,
                    render::escape(&result.name),
                    elapsed.as_secs_f64()
                );
                match running.remove(&result.call_id) {
                    Some(bar) => {
                        bar.set_style(ProgressStyle::default_spinner());
                        bar.finish_and_clear();
                        tell(format_args!("{line}\n"));
                    }
                    None => tell(format_args!("{line}\n")),
                }
            }
        }
    })
}

fn short(text: &str) -> String {
    const AT: usize = 100;
    if text.chars().count() <= AT {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(AT).collect::<String>())
    }
}

/// What the person said about the pending calls.
enum Answer {
    Approve(Vec<CallId>),
    Deny(Vec<CallId>, String),
}

/// Asks about each pending call, the whole call shown: `y` yes, `n` no (with an optional
/// reason: `n not on main`), `a` always for this tool in this session. `None` when the
/// person left (Ctrl-C or Ctrl-D at the question).
fn ask_pending(
    editor: &mut DefaultEditor,
    report: &Report,
    always: &mut BTreeSet<String>,
) -> Option<Vec<Answer>> {
    // The wait for a person is a span of its own (exported with the run's, when asked).
    let span = tracing::info_span!(
        "await_approval",
        gen_ai.conversation.id = report.run_id.as_str(),
        agent.pending = report.outcome.pending.len(),
    );
    span.in_scope(|| ask_pending_now(editor, report, always))
}

fn ask_pending_now(
    editor: &mut DefaultEditor,
    report: &Report,
    always: &mut BTreeSet<String>,
) -> Option<Vec<Answer>> {
    let run_id = &report.run_id;
    let pending: &[PendingCall] = &report.outcome.pending;
    let mut approved = Vec::new();
    let mut denied: Vec<(CallId, String)> = Vec::new();
    if pending.is_empty() {
        // The model asked a person's approval of its plan, without calls.
        tell(format_args!("? {}\n", report.outcome.message));
        loop {
            match read(editor, "approve? [y]es / [n]o [reason] > ")?.trim() {
                "y" | "yes" => return Some(vec![Answer::Approve(Vec::new())]),
                answer if answer == "n" || answer.starts_with("n ") => {
                    let reason = answer.strip_prefix('n').unwrap_or("").trim();
                    return Some(vec![Answer::Deny(Vec::new(), reason.to_owned())]);
                }
                _ => tell(format_args!("  answer y or n\n")),
            }
        }
    }
    for p in pending {
        let call = render::call_text(&p.tool, &p.arguments, run_id, p.call_id.as_str());
        if always.contains(&p.tool) {
            tell(format_args!(
                "  approved {} {call} (always {} in this session)\n",
                p.call_id, p.tool
            ));
            approved.push(p.call_id.clone());
            continue;
        }
        let leads = render::leads_to(p);
        tell(format_args!(
            "? {} {call}{leads}\n  ({})\n",
            p.call_id, p.why
        ));
        if p.tool == <agent_tools::builtin::Shell as agent_tools::TypedTool>::NAME
            && let Some(note) = render::sandbox_note(&report.state)
        {
            tell(format_args!("  (approved, it {note})\n"));
        }
        let prompt = format!("approve? [y]es / [n]o [reason] / [a]lways {} > ", p.tool);
        loop {
            let answer = read(editor, &prompt)?;
            match answer.trim() {
                "y" | "yes" => approved.push(p.call_id.clone()),
                "a" | "always" => {
                    always.insert(p.tool.clone());
                    approved.push(p.call_id.clone());
                }
                answer if answer == "n" || answer.starts_with("n ") => {
                    let reason = answer.strip_prefix('n').unwrap_or("").trim();
                    denied.push((p.call_id.clone(), reason.to_owned()));
                }
                _ => {
                    tell(format_args!("  answer y, n or a\n"));
                    continue;
                }
            }
            break;
        }
    }
    // Denials first (the run keeps waiting for the rest), then the approvals go on.
    let mut answers: Vec<Answer> = Vec::new();
    let mut reasons: BTreeMap<String, Vec<CallId>> = BTreeMap::new();
    for (id, reason) in denied {
        reasons.entry(reason).or_default().push(id);
    }
    answers.extend(
        reasons
            .into_iter()
            .map(|(reason, ids)| Answer::Deny(ids, reason)),
    );
    if !approved.is_empty() {
        answers.push(Answer::Approve(approved));
    }
    Some(answers)
}

/// The person's next line at the chat's prompt.
fn read_line(editor: &mut DefaultEditor) -> rustyline::Result<String> {
    let _waiting = crate::build::prompting();
    editor.readline("> ")
}

fn read(editor: &mut DefaultEditor, prompt: &str) -> Option<String> {
    let _waiting = crate::build::prompting();
    editor.readline(prompt).ok()
}

/// Settles a run's pending approvals by asking on the terminal, as long as it pauses for
/// them. Returns the last report; a person who leaves at a question leaves the run paused.
pub(super) fn settle_inline(
    rt: &tokio::runtime::Runtime,
    runtime: &Runtime,
    editor: &mut DefaultEditor,
    mut report: Report,
    always: &mut BTreeSet<String>,
    cancel: &CancellationToken,
) -> Result<Report, RuntimeError> {
    while report.outcome.reason == TerminalReason::ApprovalRequired && !cancel.is_cancelled() {
        let Some(answers) = ask_pending(editor, &report, always) else {
            break;
        };
        for answer in answers {
            report = apply(rt, runtime, &report.run_id.clone(), answer, cancel)?;
        }
    }
    Ok(report)
}

/// The cancellation of one exchange: by the next Ctrl-C (outside the line editor, which
/// reads Ctrl-C as a key), or by the runtime when someone asks the run to stop from
/// elsewhere (`agent cancel`).
struct Exchange {
    /// Cancelled by Ctrl-C only.
    pressed: CancellationToken,
    /// What the runtime is given: cancelled with `pressed`, or on its own.
    cancel: CancellationToken,
}

impl Exchange {
    fn new(rt: &tokio::runtime::Runtime) -> Exchange {
        let pressed = cancel_on_ctrl_c(rt);
        Exchange {
            cancel: pressed.child_token(),
            pressed,
        }
    }

    /// Who stopped the exchange, were it stopped.
    fn stopped_by(&self) -> StoppedBy {
        if self.pressed.is_cancelled() {
            StoppedBy::Person
        } else {
            StoppedBy::Elsewhere
        }
    }
}

/// Who stopped an exchange that ended `cancelled`: the person at this terminal (Ctrl-C), or
/// someone elsewhere (`agent cancel`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum StoppedBy {
    Person,
    Elsewhere,
}

/// `agent chat [RUN]`.
pub(crate) fn chat(settings: &Settings, run: Option<String>) -> Result<u8, Failure> {
    if !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
        return Err(usage(
            "agent chat needs a terminal; in scripts use `agent run GOAL` and `agent resume RUN \
             MESSAGE`",
        ));
    }
    let location = &settings.store;
    if let (Some(id), crate::stores::StoreLocation::Postgres(_)) = (&run, location) {
        let queue = crate::stores::queue(location, "chat")?;
        if queue.queue_state(id)?.is_some() {
            return chat_queued(settings, queue, id);
        }
    }
    // A new run's id is chosen now: on a database it is held from here.
    let new_id = ulid::Ulid::generate().to_string();
    let store = OpenStore::create(location)?.writable()?;
    let store = match &run {
        Some(id) => store.take(id)?,
        None => store.take_new(&new_id)?,
    };
    let mut current: Option<Report> = None;
    let choice = match (&run, &settings.model) {
        (_, Some(choice)) => choice.clone(),
        (Some(id), None) => recorded_model(settings, &store, id)?,
        (None, None) => {
            return Err(usage(
                "no model: pass --model PROVIDER:MODEL (e.g. script:PATH) or set model in \
                 agent.toml",
            ));
        }
    };
    let mut in_run = std::borrow::Cow::Borrowed(settings);
    if let Some(id) = &run {
        let log = store.as_store().load(id)?;
        if log.is_empty() {
            return Err(usage(format!("no run {id} in {location}")));
        }
        in_run = crate::app::taken_up(settings, id, &log)?;
        crate::build::ensure_checks_trusted(id, &log, crate::build::interactive(settings))?;
    }
    let settings: &Settings = &in_run;
    let budget = settings.budget.apply(agent_core::Budget::default());
    let rt = tokio()?;
    // SIGTERM lets an exchange's run go at its next step, and ends a chat that waits for
    // the person at once.
    let drain = crate::build::drain_on_terminate()?;
    let runtime = build(
        settings,
        &choice,
        StoreSource::Open(Box::new(store)),
        &rt,
        true,
        true,
    )?
    .with_drain(drain.clone());
    let mut editor =
        DefaultEditor::new().map_err(|e| failed(format!("cannot read the terminal: {e}")))?;
    let mut always: BTreeSet<String> = BTreeSet::new();
    // The exchange that took an interrupted run up, if one did.
    let mut first = None;
    if let Some(id) = &run {
        // Where the run stands; an interrupted one goes on first.
        let standing = match rt.block_on(runtime.standing(id))? {
            Some(report) => report,
            None => {
                let exchange = Exchange::new(&rt);
                let report = rt.block_on(runtime.resume(id, exchange.cancel.clone()))?;
                first = Some(exchange);
                report
            }
        };
        current = Some(standing);
    }
    tell(format_args!(
        "agent chat: type a message; /context, /cost, /exit. Ctrl-C stops the current exchange.\n"
    ));
    if let Some(report) = &current {
        tell(format_args!("agent: {}\n", render::outcome_text(report)));
    }
    if let Some(report) = current.take() {
        match follow(&rt, &runtime, &mut editor, report, first, &mut always) {
            Some(report) => current = Some(report),
            None => return Ok(EXIT_OK),
        }
    }
    // A message typed during the last exchange that its run did not read.
    let mut next: Option<String> = None;
    loop {
        if drain.is_cancelled() {
            // What stopped it was said; the run goes on with the next `agent chat RUN`.
            return Ok(crate::exit::EXIT_PAUSED);
        }
        let read = match next.take() {
            Some(text) => Ok(text),
            None => read_line(&mut editor),
        };
        let line = match read {
            Ok(line) => line,
            Err(ReadlineError::Interrupted | ReadlineError::Eof) => break,
            Err(e) => {
                return Err(failed(format!("cannot read the terminal: {e}")));
            }
        };
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        let _ = editor.add_history_entry(text);
        let run_id = current.as_ref().map(|r| r.run_id.clone());
        match text {
            "/exit" | "/quit" => break,
            "/cost" => {
                match &current {
                    Some(r) => tell(format_args!("  {}\n", cost_line(r))),
                    None => tell(format_args!("  nothing spent yet\n")),
                }
                continue;
            }
            "/context" => {
                match &run_id {
                    Some(id) => print_context(&rt, &runtime, id),
                    None => tell(format_args!("  no run yet: say what it should do\n")),
                }
                continue;
            }
            command if command.starts_with('/') => {
                tell(format_args!(
                    "  unknown command {command}: /context, /cost, /exit\n"
                ));
                continue;
            }
            _ => {}
        }
        STREAMED.store(false, std::sync::atomic::Ordering::Relaxed);
        let exchange = Exchange::new(&rt);
        let cancel = &exchange.cancel;
        // Lines typed while the run works are handed to it, read before its next model call.
        let noted = run_id.clone().unwrap_or_else(|| new_id.clone());
        let typing = Typing::start(runtime.store(), noted.clone());
        let result = rt.block_on(async {
            match &run_id {
                None => {
                    let request = RunRequest::new(new_id.clone(), text, budget.clone());
                    runtime.start(request, cancel.clone()).await
                }
                Some(id) => runtime.reply(id, text, None, cancel.clone()).await,
            }
        });
        let leaving = typing.is_some_and(Typing::finish);
        let followed = match result {
            Ok(report) => match follow(
                &rt,
                &runtime,
                &mut editor,
                report,
                Some(exchange),
                &mut always,
            ) {
                Some(report) => {
                    current = Some(report);
                    true
                }
                // The person left at a question: the run waits for them.
                None => false,
            },
            Err(e) => {
                tell(format_args!("agent: {}\n", Failure::from(e).message));
                // The run is where it was.
                if let Some(id) = run_id {
                    current = reload(&rt, &runtime, &id);
                }
                true
            }
        };
        if !followed || leaving {
            break;
        }
        // What was typed too late for the run to read is the next message.
        let unread = runtime.store().told(&noted);
        if !unread.is_empty() {
            tell(format_args!(
                "  ✉ the run stopped before it read what you typed: it is your next message\n"
            ));
            next = Some(unread.join("\n"));
        }
    }
    Ok(EXIT_OK)
}

/// Lines a person types while an exchange runs, handed to the run as they are entered
/// ([`agent_store::Store::tell`]): it reads each before its next model call. Only on a
/// terminal, whose kernel hands over a whole line at a time; stopped (the thread joined)
/// when dropped, before the chat reads the terminal itself again.
struct Typing {
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// Ctrl-D was typed: the chat ends once the exchange does.
    closed: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Typing {
    fn start(store: Arc<dyn agent_store::Store>, run_id: String) -> Option<Typing> {
        if !std::io::stdin().is_terminal() {
            return None;
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let closing = Arc::clone(&closed);
        let thread = std::thread::spawn(move || {
            let stdin = std::io::stdin();
            let mut line = vec![0u8; 64 * 1024];
            let every = rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 50_000_000,
            };
            while !stopping.load(std::sync::atomic::Ordering::SeqCst) {
                let mut fds = [rustix::event::PollFd::new(
                    &stdin,
                    rustix::event::PollFlags::IN,
                )];
                match rustix::event::poll(&mut fds, Some(&every)) {
                    Ok(0) => continue,
                    Ok(_) => {}
                    Err(_) => return,
                }
                // One line, read from the descriptor itself: nothing is kept in a buffer
                // the chat's own reading would not see.
                let n = match rustix::io::read(&stdin, &mut line) {
                    Ok(0) => {
                        closing.store(true, std::sync::atomic::Ordering::SeqCst);
                        tell(format_args!(
                            "  (Ctrl-D: the chat ends with this exchange)\n"
                        ));
                        return;
                    }
                    Err(_) => return,
                    Ok(n) => n,
                };
                let text = String::from_utf8_lossy(&line[..n]).trim().to_owned();
                if text.is_empty() {
                    continue;
                }
                if store.tell(&run_id, &text).unwrap_or(false) {
                    tell(format_args!(
                        "  ✉ sent: the run reads it before its next model call\n"
                    ));
                } else {
                    tell(format_args!(
                        "  (not sent: the run has not started yet; say it again when it \
                         asks)\n"
                    ));
                }
            }
        });
        Some(Typing {
            stop,
            closed,
            thread: Some(thread),
        })
    }

    /// Stops reading; whether Ctrl-D was typed meanwhile.
    fn finish(self) -> bool {
        let closed = Arc::clone(&self.closed);
        drop(self);
        closed.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Typing {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `agent chat RUN` of a run in a database's queue. Workers drive it, on their machines and
/// in their workspaces, so nothing runs here: the terminal shows each event as a worker
/// commits it; when the run waits for the person, it asks their approvals, or their
/// answer or next message, records it as `agent approve`, `agent deny` or
/// `agent resume RUN MESSAGE` would, and queues the run again for a worker.
fn chat_queued(
    settings: &Settings,
    queue: agent_store::PostgresStore,
    run_id: &str,
) -> Result<u8, Failure> {
    let queue = Arc::new(queue);
    let shared: Arc<dyn agent_store::Store> = Arc::clone(&queue) as _;
    let ws = agent_tools::Workspace::new(".")
        .map_err(|e| usage(format!("the current directory: {e}")))?;
    let runtime = Runtime::without_model(Arc::new(agent_tools::Gateway::new(ws)), shared)
        .with_redactor(agent_runtime::Redactor::from_env());
    let watched = OpenStore::create(&settings.store)?;
    let rt = tokio()?;
    let mut editor =
        DefaultEditor::new().map_err(|e| failed(format!("cannot read the terminal: {e}")))?;
    let mut always: BTreeSet<String> = BTreeSet::new();
    // What the run did before is `agent show`'s; from here on, what it does.
    let log = match agent_store::Store::load(&*queue, run_id) {
        // Queued, not yet started by a worker.
        Err(agent_store::StoreError::RunNotFound(_)) => Vec::new(),
        log => log?,
    };
    let mut follower = crate::stores::Follower::after(run_id, &log);
    drop(log);
    tell(format_args!(
        "agent chat: run {run_id} is in the queue: workers drive it, and its events show \
         here as they are committed. Type a message when it waits for you; /cost, /exit.\n"
    ));
    loop {
        while let Some((new, _)) = follower.next(&watched)? {
            if !new.is_empty() {
                let children = crate::app::children_of(&*queue, &new);
                tell(crate::app::timeline_text(run_id, &new, &children));
            }
        }
        let Some(report) = rt.block_on(runtime.standing(run_id))? else {
            tell(format_args!(
                "agent: run {run_id} was interrupted; a worker goes on with it once it is \
                 queued again (`agent resume {run_id} MESSAGE`)\n"
            ));
            return Ok(EXIT_OK);
        };
        STREAMED.store(false, std::sync::atomic::Ordering::Relaxed);
        // Nothing here stops a queued run: a worker does, when asked from elsewhere.
        show_outcome(&report, Some(StoppedBy::Elsewhere));
        if report.outcome.reason == TerminalReason::OutcomeUnknown {
            // Settled with `agent resolve` (its advice was shown), not by a message.
            return Ok(EXIT_OK);
        }
        if report.outcome.reason == TerminalReason::ApprovalRequired {
            let Some(answers) = ask_pending(&mut editor, &report, &mut always) else {
                return Ok(EXIT_OK);
            };
            for answer in answers {
                let input = match answer {
                    Answer::Approve(call_ids) => agent_core::Input::ApprovalGranted { call_ids },
                    Answer::Deny(call_ids, reason) => agent_core::Input::ApprovalDenied {
                        call_ids,
                        reason: if reason.is_empty() {
                            "a person said no".to_owned()
                        } else {
                            reason
                        },
                    },
                };
                rt.block_on(runtime.record_answer(run_id, input))?;
            }
        } else {
            let Some(text) = read_message(&mut editor, &report)? else {
                return Ok(EXIT_OK);
            };
            let log = agent_store::Store::load(&*queue, run_id)?;
            let budget = crate::app::new_budget(settings, run_id, &log)?;
            drop(log);
            rt.block_on(runtime.record_reply(run_id, &text, budget))?;
        }
        queue.wake(run_id)?;
    }
}

/// The person's next message to a queued run; `None` when they leave (`/exit`, Ctrl-D,
/// Ctrl-C at the prompt).
fn read_message(editor: &mut DefaultEditor, report: &Report) -> Result<Option<String>, Failure> {
    loop {
        let line = match read_line(editor) {
            Ok(line) => line,
            Err(ReadlineError::Interrupted | ReadlineError::Eof) => return Ok(None),
            Err(e) => return Err(failed(format!("cannot read the terminal: {e}"))),
        };
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        let _ = editor.add_history_entry(text);
        match text {
            "/exit" | "/quit" => return Ok(None),
            "/cost" => tell(format_args!("  {}\n", cost_line(report))),
            command if command.starts_with('/') => {
                tell(format_args!("  unknown command {command}: /cost, /exit\n"));
            }
            _ => return Ok(Some(text.to_owned())),
        }
    }
}

/// What a run used so far, for `/cost`.
fn cost_line(r: &Report) -> String {
    format!(
        "{} model calls, {} tool calls, {} input and {} output tokens{}",
        r.state.steps,
        r.state.tool_calls,
        r.state.usage.input_tokens,
        r.state.usage.output_tokens,
        if r.state.usage.cost_usd > 0.0 {
            format!(", ${:.4}", r.state.usage.cost_usd)
        } else {
            String::new()
        }
    )
}

/// Shows what an exchange came to (`exchange`; `None` for where a run stood when the chat
/// began) and, while the run waits for approvals, asks them and goes on. `None` when the
/// person left at a question.
fn follow(
    rt: &tokio::runtime::Runtime,
    runtime: &Runtime,
    editor: &mut DefaultEditor,
    mut report: Report,
    mut exchange: Option<Exchange>,
    always: &mut BTreeSet<String>,
) -> Option<Report> {
    loop {
        show_outcome(&report, exchange.as_ref().map(Exchange::stopped_by));
        if report.outcome.reason != TerminalReason::ApprovalRequired {
            return Some(report);
        }
        let answers = ask_pending(editor, &report, always)?;
        let next = Exchange::new(rt);
        for answer in answers {
            // What is typed while the run goes on is handed to it, as in an exchange.
            let typing = Typing::start(runtime.store(), report.run_id.clone());
            let applied = apply(rt, runtime, &report.run_id, answer, &next.cancel);
            drop(typing);
            match applied {
                Ok(next) => report = next,
                Err(e) => {
                    tell(format_args!("agent: {}\n", Failure::from(e).message));
                    return reload(rt, runtime, &report.run_id);
                }
            }
        }
        exchange = Some(next);
    }
}

fn apply(
    rt: &tokio::runtime::Runtime,
    runtime: &Runtime,
    run_id: &str,
    answer: Answer,
    cancel: &CancellationToken,
) -> Result<Report, RuntimeError> {
    STREAMED.store(false, std::sync::atomic::Ordering::Relaxed);
    rt.block_on(async {
        match answer {
            Answer::Approve(ids) => runtime.approve(run_id, ids, cancel.clone()).await,
            Answer::Deny(ids, reason) => {
                let reason = if reason.is_empty() {
                    "a person said no".to_owned()
                } else {
                    reason
                };
                runtime.deny(run_id, ids, reason, cancel.clone()).await
            }
        }
    })
}

fn reload(rt: &tokio::runtime::Runtime, runtime: &Runtime, run_id: &str) -> Option<Report> {
    rt.block_on(runtime.standing(run_id)).ok().flatten()
}

/// The answer (unless it was already streamed), or what the run waits for and why (and
/// who stopped it, when it was stopped).
fn show_outcome(report: &Report, stopped_by: Option<StoppedBy>) {
    let o = &report.outcome;
    match (&o.answer, o.reason) {
        (Some(answer), _) => {
            if !STREAMED.load(std::sync::atomic::Ordering::Relaxed) {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{answer}");
                let _ = out.flush();
            } else {
                tell(format_args!("\n"));
            }
        }
        (None, TerminalReason::ClarificationRequired) => {
            let question = o
                .message
                .rsplit_once(": ")
                .map_or(o.message.as_str(), |(_, q)| q);
            tell(format_args!("? {question}\n"));
        }
        (None, TerminalReason::ApprovalRequired) => {}
        (None, TerminalReason::Cancelled) => tell(format_args!(
            "agent: stopped{}; the run is kept — say something to go on, or /exit\n",
            match stopped_by {
                Some(StoppedBy::Elsewhere) => " from elsewhere (`agent cancel`)",
                Some(StoppedBy::Person) | None => "",
            }
        )),
        (None, _) => tell(format_args!("agent: {}\n", render::outcome_text(report))),
    }
}

fn print_context(rt: &tokio::runtime::Runtime, runtime: &Runtime, run_id: &str) {
    let store = runtime.store();
    let id = run_id.to_owned();
    let log = rt
        .block_on(async move { tokio::task::spawn_blocking(move || store.load(&id)).await })
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let projector = runtime.projector(&log);
    let mut out = std::io::stdout().lock();
    let _ = write!(
        out,
        "{}",
        render::prompt_text(
            projector.prompt(),
            projector.tokens(),
            projector.config().context_window
        )
    );
    let _ = out.flush();
}
