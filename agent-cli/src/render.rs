//! What the commands print.

use std::fmt::Write as _;

use agent_core::{Decision, Entry, Event, ModelErrorKind, Outcome, TerminalReason, ToolCall};
use agent_runtime::Report;
use agent_store::RunSummary;
use serde_json::{Value, json};

/// What `--json` says of a run nothing drives, that did not end (its process died, or
/// let it go on SIGTERM): `agent resume` goes on with it.
pub fn interrupted_json(run_id: &str) -> Value {
    json!({"run_id": run_id, "status": "interrupted", "reason": null})
}

/// The contract's `--json` object of `run`, `resume`, ...
pub fn outcome_json(report: &Report) -> Value {
    let o = &report.outcome;
    json!({
        "run_id": report.run_id,
        "status": o.reason.class().as_str(),
        "reason": o.reason.as_str(),
        "answer": if o.reason == TerminalReason::Completed { json!(o.answer) } else { Value::Null },
        "answer_json": answer_json(report),
        "message": o.message,
        "error_kind": o.model_error,
        "advice": advice(o, &report.run_id),
        "steps": report.state.steps,
        "tool_calls": report.state.tool_calls,
        "usage": {
            "input_tokens": report.state.usage.input_tokens,
            "output_tokens": report.state.usage.output_tokens,
            "cache_read_tokens": report.state.usage.cache_read_tokens,
            "cache_write_tokens": report.state.usage.cache_write_tokens,
            "reasoning_tokens": report.state.usage.reasoning_tokens,
            "cost_usd": report.state.usage.cost_usd,
        },
        "pending": o.pending.iter().map(|p| {
            let mut call = json!({
                "call_id": p.call_id,
                "tool": p.tool,
                "arguments": p.arguments,
                "why": p.why,
            });
            if let (Some(path), Some(map)) = (&p.path, call.as_object_mut()) {
                map.insert("path".into(), Value::String(path.clone()));
            }
            call
        }).collect::<Vec<_>>(),
    })
}

/// The completed answer read as JSON, when the run's answer has a schema (it passed it);
/// null otherwise.
fn answer_json(report: &Report) -> Value {
    let has_schema = report
        .state
        .manifest
        .as_ref()
        .and_then(|m| m.answer.as_ref())
        .is_some_and(|a| a.schema.is_some());
    match (&report.outcome.answer, report.outcome.reason) {
        (Some(answer), TerminalReason::Completed) if has_schema => {
            agent_tools::answer_json(answer).unwrap_or(Value::Null)
        }
        _ => Value::Null,
    }
}

/// What a `shell` command of the run `state` is of may do in the run's sandbox, when it
/// has one: "runs in the run's sandbox: ...".
pub(crate) fn sandbox_note(state: &agent_core::RunState) -> Option<String> {
    let sandbox = state.manifest.as_ref()?.sandbox.as_deref()?;
    let network = network_words(sandbox);
    let mut places: Vec<String> = Vec::new();
    if !sandbox.read_only {
        places.push("the workspace".to_owned());
    }
    places.extend(sandbox.write.iter().map(|dir| format!("{dir:?}")));
    let places = if places.is_empty() {
        "its own /tmp".to_owned()
    } else {
        places.join(" and ")
    };
    Some(format!(
        "runs in the run's sandbox: it writes only in {places}, {network}, {}",
        credential_words(sandbox)
    ))
}

/// Which credentials a run's sandbox leaves its commands, in words.
fn credential_words(sandbox: &agent_core::SandboxRecord) -> String {
    if sandbox.show.is_empty() {
        "no credentials".to_owned()
    } else {
        let shown: Vec<String> = sandbox.show.iter().map(|p| format!("{p:?}")).collect();
        format!("the credentials in {} visible", shown.join(" and "))
    }
}

/// Whether a run's sandbox lets its commands reach the network, in words.
fn network_words(sandbox: &agent_core::SandboxRecord) -> &'static str {
    if sandbox.network {
        "with network"
    } else {
        "no network"
    }
}

/// A run's sandbox in a few words: "no network", "read-only, with network".
pub(crate) fn sandbox_kind(sandbox: &agent_core::SandboxRecord) -> String {
    let mut kind = network_words(sandbox).to_owned();
    if sandbox.read_only {
        kind = format!("read-only, {kind}");
    }
    if !sandbox.show.is_empty() {
        kind = format!("{kind}, {}", credential_words(sandbox));
    }
    kind
}

/// The human summary of an invocation, for standard error.
pub fn outcome_text(report: &Report) -> String {
    let o: &Outcome = &report.outcome;
    let s = &report.state;
    let plural = |n: u32, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    let mut out = format!(
        "run {} {} ({}): {}; {}, {}",
        report.run_id,
        o.reason.class().as_str(),
        o.reason,
        o.message,
        plural(s.steps, "model call"),
        plural(s.tool_calls, "tool call"),
    );
    if let Some(advice) = advice(o, &report.run_id) {
        let _ = write!(out, "; {advice}");
    }
    for p in &o.pending {
        let _ = write!(out, "\n  waiting: {}", pending_text(p, &report.run_id));
    }
    if !o.pending.is_empty() {
        let hint = if o.reason == TerminalReason::OutcomeUnknown {
            format!(
                "check what happened, then `agent resolve {} --call ID --as committed|rejected|retry`",
                report.run_id
            )
        } else {
            format!(
                "approve with `agent approve {id}` or deny with `agent deny {id} --reason TEXT`",
                id = report.run_id
            )
        };
        let _ = write!(out, "\n  {hint}");
        // What an approved command may do, where the run keeps its commands in a sandbox.
        let commands = o
            .pending
            .iter()
            .any(|p| p.tool == <agent_tools::builtin::Shell as agent_tools::TypedTool>::NAME);
        let asked = commands && o.reason != TerminalReason::OutcomeUnknown;
        if let Some(note) = sandbox_note(s).filter(|_| asked) {
            let _ = write!(out, "\n  approved, a shell command {note}");
        }
    } else if o.reason == TerminalReason::ClarificationRequired {
        let _ = write!(
            out,
            "\n  answer with `agent resume {} \"ANSWER\"`",
            report.run_id
        );
    }
    out
}

/// What to do about a spent token or cost budget.
const COST_ADVICE: &str = "raise --max-tokens or --max-cost to allow more (with a message: agent resume RUN \"…\" --max-cost USD)";

/// What a person can do about a stop, in this command line's terms (the outcome in the log
/// says what happened, not which flag to use).
fn advice(outcome: &Outcome, run_id: &str) -> Option<String> {
    Some(match outcome.reason {
        // The retries were stopped by the budget, not by the provider.
        TerminalReason::ModelError if outcome.message.contains("could pass the run's budget") => {
            COST_ADVICE
        }
        TerminalReason::ModelError => match outcome.model_error? {
            ModelErrorKind::Auth => {
                "check the API key (OPENAI_API_KEY or ANTHROPIC_API_KEY, as --model names the provider)"
            }
            ModelErrorKind::NotFound if outcome.message.contains("ollama has no model") => {
                "pull the model first (ollama pull MODEL), or check its name in --model and the \
                 --base-url (Ollama's own is http://localhost:11434)"
            }
            ModelErrorKind::NotFound => {
                "check the model name in --model and the --base-url (an OpenAI-compatible \
                 server's usually ends in /v1: Ollama's is http://localhost:11434/v1)"
            }
            // Claude Opus 4.7 and later refuse a thinking budget.
            ModelErrorKind::BadRequest if outcome.message.contains("thinking.type.enabled") => {
                "this model thinks adaptively: set thinking = \"adaptive\" in agent.toml (and an \
                 effort, if the default's is not what you want)"
            }
            // Ollama could not load the model with the run's window.
            ModelErrorKind::BadRequest if outcome.message.contains("memory to load the model") => {
                "give a smaller window (context_window in agent.toml: Ollama loads the model \
                 with it; 32768 by default) or a smaller model"
            }
            // Ollama's word for a model whose template has no tools (an agent needs them).
            ModelErrorKind::BadRequest if outcome.message.contains("does not support tools") => {
                "this model cannot call tools, which an agent needs: pick one that can (Ollama \
                 lists them at https://ollama.com/search?c=tools)"
            }
            // Nothing listens where Ollama was looked for.
            ModelErrorKind::Transport
                if outcome.message.contains("/api/chat")
                    && outcome.message.contains("connection error") =>
            {
                return Some(format!(
                    "is Ollama running? Start it (ollama serve) or give --base-url where it \
                     listens, then go on with agent resume {run_id} \"…\""
                ));
            }
            ModelErrorKind::RateLimited | ModelErrorKind::Server | ModelErrorKind::Transport => {
                return Some(format!(
                    "the failure may pass: go on later with agent resume {run_id} \"…\""
                ));
            }
            _ => return None,
        },
        TerminalReason::MaxSteps => {
            "raise --max-steps to allow more (with a message: agent resume RUN \"…\" --max-steps N)"
        }
        TerminalReason::ToolBudgetExhausted => {
            "raise --max-tool-calls (or max_retries_per_tool in agent.toml) to allow more"
        }
        TerminalReason::DeadlineExceeded => "raise --timeout to allow more",
        TerminalReason::CostBudgetExceeded => COST_ADVICE,
        TerminalReason::PolicyViolation => {
            "change the policy with --allow, or give the model another goal"
        }
        _ => return None,
    }
    .to_owned())
}

/// `agent runs` as a table.
pub fn runs_table(runs: &[RunSummary]) -> String {
    if runs.is_empty() {
        return "no runs yet; start one with `agent run`".to_owned();
    }
    let rows: Vec<[String; 9]> = runs
        .iter()
        .map(|r| {
            // Unknown for a summary written before usage was kept.
            let (tokens, cost) = match &r.usage {
                Some(u) => (
                    u.total_tokens().to_string(),
                    if u.cost_usd > 0.0 {
                        format!("${:.4}", u.cost_usd)
                    } else {
                        "-".to_owned()
                    },
                ),
                None => ("?".to_owned(), "?".to_owned()),
            };
            [
                r.run_id.clone(),
                shown_status(r).to_owned(),
                r.reason.map_or("-", TerminalReason::as_str).to_owned(),
                r.steps.to_string(),
                tokens,
                cost,
                time(r.started_at_ms),
                r.live.clone().unwrap_or_else(|| "-".to_owned()),
                match (&r.forked_from, &r.parent) {
                    (Some(f), _) => format!("fork of {f}"),
                    (None, Some(p)) => format!("sub-agent of {p}"),
                    (None, None) => "-".to_owned(),
                },
            ]
        })
        .collect();
    let header = [
        "RUN",
        "STATUS",
        "REASON",
        "STEPS",
        "TOKENS",
        "COST",
        "STARTED",
        "DRIVEN BY",
        "FROM",
    ];
    // Each column as wide as its widest cell (a sub-agent's id is longer than a run's).
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|row| row[c].chars().count())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let last = header.len() - 1;
    let line = |cells: [&str; 9]| {
        let mut text = String::new();
        for (c, cell) in cells.iter().enumerate() {
            let pad = " ".repeat(widths[c].saturating_sub(cell.chars().count()));
            match c {
                // Numbers line up on the right; the last column is not padded.
                3..=5 => text.push_str(&format!("{pad}{cell}  ")),
                c if c == last => text.push_str(cell),
                _ => text.push_str(&format!("{cell}{pad}  ")),
            }
        }
        text
    };
    let mut out = line(header);
    for row in &rows {
        out.push('\n');
        out.push_str(&line(row.each_ref().map(String::as_str)));
    }
    out
}

/// A run's status as a person reads it: one still `running` that nobody drives was
/// interrupted (its process died or was stopped) and waits for `agent resume`.
pub fn shown_status(run: &RunSummary) -> &str {
    if run.status == "running" && run.live.is_none() {
        "interrupted"
    } else {
        &run.status
    }
}

/// A sub-agent's run folded into one line of its parent's timeline.
pub fn child_line(child: &str, log: &[Entry]) -> String {
    let state = agent_core::RunState::fold(log).ok();
    let how = match state.as_ref().and_then(|s| s.outcome()) {
        Some(o) if o.reason == TerminalReason::Completed => format!(
            "completed: {}",
            cut(&escape(o.answer.as_deref().unwrap_or_default()), 80)
        ),
        Some(o) => format!("{}: {}", o.reason, cut(&escape(&o.message), 80)),
        None => "not ended".to_owned(),
    };
    let steps = state.as_ref().map_or(0, |s| s.steps);
    format!(
        "      └ sub-agent run {child}: {how}; {steps} model call(s), {} event(s) (agent show {child})",
        log.len()
    )
}

/// A sub-agent's run, folded, for `agent show --json`.
pub fn child_json(child: &str, log: &[Entry]) -> Value {
    let state = agent_core::RunState::fold(log).ok();
    let outcome = state.as_ref().and_then(|s| s.outcome());
    json!({
        "run_id": child,
        "reason": outcome.map(|o| o.reason.as_str()),
        "answer": outcome.and_then(|o| o.answer.clone()),
        "steps": state.as_ref().map_or(0, |s| s.steps),
        "events": log.len(),
    })
}

/// `agent show` as one line per event (calls whole, control characters escaped).
pub fn timeline(run_id: &str, entries: &[Entry]) -> String {
    let mut out = String::new();
    for e in entries {
        let _ = writeln!(
            out,
            "{:>4}  {}  {:<18}  {}",
            e.version,
            time(e.at_ms),
            e.event.name(),
            one_line(detail(run_id, &e.event))
        );
    }
    out
}

/// `text` on one line: its line breaks written as `\n` and `\r`. What a server or a
/// tool said is in the log as it was (a log written elsewhere may hold anything), and
/// `agent show` promises one line per event: no event can pass for two, or for another.
fn one_line(text: String) -> String {
    if !text.contains(['\n', '\r']) {
        return text;
    }
    text.replace('\n', "\\n").replace('\r', "\\r")
}

/// What the model calls of a log used in all, for the line after its timeline; `None`
/// when no call reported any. For a fork, what it used itself, then what the calls it
/// inherited had used (its parent's spending, which its budgets do not count).
pub fn usage_total(entries: &[Entry]) -> Option<String> {
    let inherited_until = match entries.first().map(|e| &e.event) {
        Some(Event::RunStarted { manifest, .. }) => {
            manifest.forked_from.as_ref().map(|f| f.version)
        }
        _ => None,
    };
    let mut tally = UsageTally::default();
    let mut inherited = agent_core::Usage::default();
    for e in entries {
        tally.count(&e.event);
        if Some(e.version) == inherited_until {
            inherited = tally.total;
        }
    }
    let total = tally.total;
    if inherited.total_tokens() > 0 {
        return Some(format!(
            "usage: {} (the fork's own; before it, its parent's calls used {})",
            usage_text(&total.since(&inherited)),
            usage_text(&inherited)
        ));
    }
    (total.total_tokens() > 0).then(|| format!("usage: {}", usage_text(&total)))
}

/// What a run's model calls used, counted event by event as its budgets count them (the
/// fold of `agent_core::RunState`): decisions, rejected and failed calls, retried attempts
/// that may be billed, summaries, and its sub-agents' calls.
#[derive(Default)]
pub struct UsageTally {
    /// The usage so far.
    pub total: agent_core::Usage,
    /// What each sub-agent had used when it last reported (its whole usage so far).
    children: std::collections::BTreeMap<String, agent_core::Usage>,
}

impl UsageTally {
    /// Counts what `event` used ([`Event::count_usage`]).
    pub fn count(&mut self, event: &Event) {
        event.count_usage(&mut self.total, &mut self.children);
    }
}

/// Tokens (and cost, when known) of a call or a run: `1200 in (1000 cache read), 80 out,
/// $0.0012`; the cached tokens are part of the input. Counts that are (or include) an
/// estimate, the provider having reported none, are marked `~`.
pub fn usage_text(usage: &agent_core::Usage) -> String {
    let approx = if usage.estimated { "~" } else { "" };
    let mut out = format!("{approx}{} in", usage.input_tokens);
    let cached: Vec<String> = [
        (usage.cache_read_tokens, "cache read"),
        (usage.cache_write_tokens, "cache write"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    if !cached.is_empty() {
        let _ = write!(out, " ({})", cached.join(", "));
    }
    let _ = write!(out, ", {approx}{} out", usage.output_tokens);
    if usage.reasoning_tokens > 0 {
        let _ = write!(out, " ({} reasoning)", usage.reasoning_tokens);
    }
    if usage.cost_usd > 0.0 {
        let _ = write!(out, ", {approx}${:.4}", usage.cost_usd);
    }
    out
}

/// Characters of a model's thinking shown on its decision's line in `agent show`.
const THOUGHT_CHARS: usize = 160;

/// Characters of a bulky argument (a file body) shown before it is folded.
pub const FOLD_AT: usize = 2_000;

/// A call waiting for a person: its id, the call, where its path leads when that is not
/// the path as the call spells it, and why it waits.
pub fn pending_text(p: &agent_core::PendingCall, run_id: &str) -> String {
    let call = call_text(&p.tool, &p.arguments, run_id, p.call_id.as_str());
    let id = escape(p.call_id.as_str());
    format!("{id} {call}{} ({})", leads_to(p), p.why)
}

/// " (leads to PATH)" when a pending call's path resolved to a place its arguments do not
/// spell (through a link, `..` or `./`): the place a person approves.
pub fn leads_to(p: &agent_core::PendingCall) -> String {
    let Some(path) = &p.path else {
        return String::new();
    };
    let spelled = p
        .arguments
        .as_object()
        .is_some_and(|map| map.values().any(|v| v.as_str() == Some(path.as_str())));
    if spelled {
        String::new()
    } else {
        format!(" (leads to {})", escape(path))
    }
}

/// One call as a person judges it: the tool, then each argument. The main arguments
/// (`command`, `path`) and every argument up to [`FOLD_AT`] characters are shown whole;
/// a longer one is folded with the count of what is not shown and the command that shows
/// it all. Control characters and bidirectional overrides are escaped, so what is shown
/// is what runs.
pub fn call_text(tool: &str, arguments: &Value, run_id: &str, call_id: &str) -> String {
    let mut out = escape(tool);
    let Value::Object(map) = arguments else {
        let _ = write!(out, " {arguments}");
        return out;
    };
    for (key, value) in map {
        let _ = write!(out, " {}=", escape(key));
        match value {
            Value::String(text) => {
                let total = text.chars().count();
                let main = matches!(key.as_str(), "command" | "path");
                if main || total <= FOLD_AT {
                    let _ = write!(out, "\"{}\"", escape(text));
                } else {
                    let head: String = text.chars().take(FOLD_AT).collect();
                    let _ = write!(
                        out,
                        "\"{}\"… {} more characters (all of it: agent show {run_id} --call {call_id})",
                        escape(&head),
                        total - FOLD_AT
                    );
                }
            }
            other => {
                let _ = write!(out, "{other}");
            }
        }
    }
    out
}

/// `text` with control characters, bidirectional overrides and invisible separators
/// written as escapes, and `"` and `\\` escaped.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() || is_invisible(c) => {
                let _ = write!(out, "\\u{{{:04x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// `text` as a terminal may be given it: control characters other than newline and tab
/// (C1 ones included), bidirectional overrides and invisible separators written as
/// escapes (`\u001b`, which JSON reads as the same character: `--json` output stays
/// JSON), so that what a model, a file or a server wrote cannot move the cursor, clear or
/// retitle the screen, set the clipboard (OSC 52) or reorder what is shown. Text with none
/// of them is given back as it is.
pub fn for_terminal(text: &str) -> std::borrow::Cow<'_, str> {
    let bare = |c: char| (c.is_control() && c != '\n' && c != '\t') || is_invisible(c);
    if !text.chars().any(bare) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if bare(c) {
            // Every such character is in the Basic Multilingual Plane: four digits.
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Characters that change how text around them looks without showing themselves.
fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}'
        | '\u{061c}' | '\u{00ad}')
}

fn detail(run_id: &str, event: &Event) -> String {
    match event {
        Event::RunStarted {
            run_id,
            goal,
            manifest,
        } => {
            let mut line = format!(
                "{run_id} goal {:?} model {}:{}",
                goal, manifest.provider, manifest.model
            );
            if let Some(origin) = &manifest.forked_from {
                let _ = write!(
                    line,
                    " forked from {} before its model call {} (its log through v{})",
                    origin.run_id, origin.at, origin.version
                );
            }
            if let Some(sandbox) = &manifest.sandbox {
                let _ = write!(line, " commands sandboxed ({})", sandbox_kind(sandbox));
                if !sandbox.write.is_empty() {
                    let _ = write!(line, ", writing also in {:?}", sandbox.write);
                }
            }
            line
        }
        Event::DecisionProposed {
            turn,
            decision,
            usage,
            reasoning,
        } => {
            let what = match decision {
                Decision::Final { answer } => format!("final {}", cut(answer, 100)),
                Decision::ToolCalls { calls } => {
                    format!("tool_calls {}", calls_text(run_id, calls))
                }
                Decision::RequestApproval { summary, calls } => {
                    format!(
                        "request_approval {:?} {}",
                        summary,
                        calls_text(run_id, calls)
                    )
                }
                Decision::Clarification { question } => format!("clarification {question:?}"),
                Decision::CannotContinue { reason } => format!("cannot_continue {reason:?}"),
            };
            let mut line = format!("turn {turn}: {what} ({})", usage_text(usage));
            // What the model thought, never its answer: the start of it, escaped.
            let thought: Vec<String> = reasoning.iter().filter_map(|r| r.readable()).collect();
            if !thought.is_empty() {
                let text = thought.join(" ");
                let shown: String = text.chars().take(THOUGHT_CHARS).collect();
                let more = if shown.len() < text.len() { "…" } else { "" };
                let _ = write!(line, " thinking \"{}{more}\"", escape(&shown));
            } else if !reasoning.is_empty() {
                line.push_str(" thinking (encrypted)");
            }
            line
        }
        Event::DecisionRejected { turn, problem, .. } => format!("turn {turn}: {problem}"),
        Event::SubAgentFinished {
            call_id,
            run_id,
            usage,
            ..
        } => format!(
            "{call_id} answered by sub-agent run {run_id} ({})",
            usage_text(usage)
        ),
        Event::AnswerRejected { turn, problem } => {
            format!("turn {turn}: {}", cut(&escape(problem), 300))
        }
        Event::ModelFailed {
            turn,
            message,
            kind,
            usage,
        } => format!(
            "turn {turn}: {kind}: {message}{}",
            if usage.is_zero() {
                String::new()
            } else {
                format!(" (it may have cost {})", usage_text(usage))
            }
        ),
        Event::ModelRetried { turn, retry } => format!(
            "turn {turn}: attempt {} failed ({}); retried after {} ms{}",
            retry.attempt,
            retry.reason,
            retry.wait_ms,
            if retry.usage.is_zero() {
                String::new()
            } else {
                format!(" (it may have cost {})", usage_text(&retry.usage))
            }
        ),
        Event::CallRejected { result, .. } | Event::ToolFinished { result, .. } => {
            let (status, text) = match &result.outcome {
                agent_core::ToolOutcome::Output(text) => ("ok", text.as_str()),
                agent_core::ToolOutcome::Error(e) => (e.kind.as_str(), e.message.as_str()),
            };
            format!(
                "{} {} {status}: {}",
                result.call_id,
                result.name,
                cut(text, 100)
            )
        }
        Event::CorrectionIssued { call_ids, .. } => format!(
            "repeated plan not run ({})",
            call_ids
                .iter()
                .map(|c| c.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Event::ApprovalRequested {
            pending, summary, ..
        } => {
            let calls: Vec<String> = pending.iter().map(|p| pending_text(p, run_id)).collect();
            match summary {
                Some(s) => format!("{s:?} {}", calls.join(", ")),
                None => calls.join(", "),
            }
        }
        Event::ApprovalGranted { call_ids } => ids(call_ids),
        Event::ApprovalDenied { call_ids, reason } => format!("{} ({reason})", ids(call_ids)),
        Event::UserMessage { text, budget } => format!(
            "{}{}",
            cut(&format!("{text:?}"), 200),
            if budget.is_some() {
                " (with a new budget)"
            } else {
                ""
            }
        ),
        Event::UserNote { text } => cut(&format!("{text:?}"), 200),
        Event::EffectDispatched {
            call_id,
            tool,
            effect_key,
            ..
        } => format!("{call_id} {tool} {effect_key}"),
        Event::EffectReconciled { call_id, finding } => match finding {
            agent_core::Finding::Applied { receipt } => format!("{call_id} applied: {receipt}"),
            agent_core::Finding::NotApplied => format!("{call_id} not applied"),
        },
        Event::ResolutionRequested { pending, .. } => pending
            .iter()
            .map(|p| format!("{} {}", p.call_id, p.tool))
            .collect::<Vec<_>>()
            .join(", "),
        Event::EffectResolved {
            call_id,
            resolution,
        } => format!("{call_id} as {}", format!("{resolution:?}").to_lowercase()),
        Event::ContextCompacted {
            through_version,
            tokens_before,
            tokens_after,
            usage,
            window,
            ..
        } => format!(
            "{}history through v{through_version} summarized: {tokens_before} -> {tokens_after} \
             tokens{}",
            window.map_or_else(String::new, |w| format!(
                "the provider refused the prompt as past the model's window, {w} tokens from \
                 now on; "
            )),
            summary_cost(usage)
        ),
        Event::CompactionDeclined {
            tokens_before,
            tokens_after,
            usage,
        } => format!(
            "summary not used, it would not shorten the prompt: {tokens_before} -> \
             {tokens_after} tokens{}",
            summary_cost(usage)
        ),
        Event::RunResumed {} => {
            "taken up again; the time since the event before is not counted as worked".to_owned()
        }
        Event::RunEnded { outcome } => format!("{}: {}", outcome.reason, outcome.message),
    }
}

/// What a summary's model call used, when it used something: ` (summary: 900 in, 80 out)`.
fn summary_cost(usage: &agent_core::Usage) -> String {
    if usage.is_zero() {
        String::new()
    } else {
        format!(" (summary: {})", usage_text(usage))
    }
}

fn ids(ids: &[agent_core::CallId]) -> String {
    ids.iter()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn calls_text(run_id: &str, calls: &[ToolCall]) -> String {
    calls
        .iter()
        .map(|c| {
            format!(
                "{} {}",
                escape(c.id.as_str()),
                call_text(&c.name, &c.arguments, run_id, c.id.as_str())
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The first line of `text`, at most `max` characters.
pub(crate) fn cut(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    let mut out: String = line
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// `agent context` as text: the system, each message and its parts, the tools, the size.
pub fn prompt_text(prompt: &agent_core::Prompt, tokens: usize, window: usize) -> String {
    let mut out = agent_context::PromptText(prompt).to_string();
    let _ = writeln!(
        out,
        "=== about {tokens} tokens of a {window}-token context window ({:.0}%)",
        tokens as f64 * 100.0 / window.max(1) as f64
    );
    out
}

/// UTC time of `ms` since the epoch, to the millisecond.
pub fn time(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's columns line up whatever their cells hold: a sub-agent's long id, the
    /// time with its milliseconds, who drives a run.
    #[test]
    fn the_runs_table_lines_up_its_columns() {
        let mut run = RunSummary::new("01M8ZRP000FJTBGQ4M13QX6DG0");
        run.status = "finished".into();
        run.reason = Some(TerminalReason::Completed);
        run.started_at_ms = 1_796_361_203_842;
        let mut child = RunSummary::new("01M8ZRP000FJTBGQ4M13QX6DG0.1aac68bc4087");
        child.status = "running".into();
        child.live = Some("process 4242".into());
        child.steps = 12;
        child.parent = Some("01M8ZRP000FJTBGQ4M13QX6DG0/d1".into());
        child.usage = Some(agent_core::Usage {
            cost_usd: 0.0123,
            ..agent_core::Usage::tokens(1_000, 234)
        });
        let mut old = RunSummary::new("01OLD");
        old.usage = None;
        let table = runs_table(&[run, child, old]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        for (column, cells) in [
            ("STATUS", ["finished", "running", "interrupted"]),
            ("REASON", ["completed", "-", "-"]),
            ("STARTED", ["2026-12-04", "1970-01-01", "1970-01-01"]),
            ("DRIVEN BY", ["-", "process 4242", "-"]),
            ("FROM", ["-", "sub-agent of", "-"]),
        ] {
            let at = lines[0].find(column).unwrap();
            for (line, cell) in lines[1..].iter().zip(cells) {
                assert_eq!(line[at..].find(cell), Some(0), "{column}: {table}");
            }
        }
        // Numbers end where their header ends; a usage not kept is unknown, not zero.
        let end = |column: &str| lines[0].find(column).unwrap() + column.len();
        assert_eq!(&lines[2][end("STEPS") - 2..end("STEPS")], "12", "{table}");
        assert_eq!(&lines[1][end("TOKENS") - 1..end("TOKENS")], "0", "{table}");
        assert_eq!(
            &lines[2][end("TOKENS") - 4..end("TOKENS")],
            "1234",
            "{table}"
        );
        assert_eq!(
            &lines[2][end("COST") - 7..end("COST")],
            "$0.0123",
            "{table}"
        );
        assert_eq!(&lines[3][end("COST") - 1..end("COST")], "?", "{table}");
    }

    #[test]
    fn a_refused_thinking_budget_is_answered_with_adaptive_thinking() {
        let refused = |message: &str| Outcome {
            model_error: Some(ModelErrorKind::BadRequest),
            ..Outcome::stop(TerminalReason::ModelError, message.to_owned())
        };
        // Anthropic's words for a budget sent to a model that only thinks adaptively.
        let said = "the provider refused the request (400): invalid_request_error: \
                    \"thinking.type.enabled\" is not supported for this model. Use \
                    \"thinking.type.adaptive\" and \"output_config.effort\" to control thinking \
                    behavior.";
        let told = advice(&refused(said), "r").unwrap();
        assert!(told.contains("thinking = \"adaptive\""), "{told}");
        assert_eq!(advice(&refused("max_tokens: too large"), "r"), None);
    }

    #[test]
    fn retries_stopped_by_the_budget_are_answered_with_the_budget() {
        let failed = |message: &str| Outcome {
            model_error: Some(ModelErrorKind::Transport),
            ..Outcome::stop(TerminalReason::ModelError, message.to_owned())
        };
        let told = advice(
            &failed(
                "the model provider failed: the stream ended without its end marker (gave up \
                 after 1 attempt: another could pass the run's budget)",
            ),
            "r",
        )
        .unwrap();
        assert!(told.contains("--max-cost"), "{told}");
        let told = advice(&failed("the model provider failed: connection reset"), "r").unwrap();
        assert!(told.contains("may pass"), "{told}");
    }

    #[test]
    fn cut_keeps_the_first_line_and_marks_the_rest() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("one\ntwo", 10), "one…");
        assert_eq!(cut("abcdef", 3), "abc…");
    }

    #[test]
    fn text_for_a_terminal_keeps_lines_and_shows_controls_as_escapes() {
        let plain = "two lines\n\tand a tab, é, 日本";
        assert!(matches!(
            for_terminal(plain),
            std::borrow::Cow::Borrowed(p) if p == plain
        ));
        assert_eq!(
            for_terminal("a\u{1b}]52;c;cm0=\u{7}b\r\u{9b}2J\u{7f}\u{202e}c\n"),
            "a\\u001b]52;c;cm0=\\u0007b\\u000d\\u009b2J\\u007f\\u202ec\n"
        );
        // `--json` on a terminal stays JSON, and means the same.
        let value = json!({"answer": "x\u{202e}\u{9b}\u{7f}y\u{1b}\u{feff}"});
        let shown = for_terminal(&value.to_string()).into_owned();
        assert!(!shown.contains('\u{202e}'), "{shown}");
        assert_eq!(serde_json::from_str::<Value>(&shown).unwrap(), value);
    }

    #[test]
    fn calls_are_shown_whole_and_escaped() {
        let hidden = format!("git status{}; echo PWNED", " ".repeat(120));
        let shown = call_text("shell", &json!({ "command": hidden }), "r", "c1");
        assert!(shown.ends_with("; echo PWNED\""), "{shown}");
        let tricky = call_text(
            "shell",
            &json!({"command": "ls\n\u{1b}[2Arm -rf x \u{202e}"}),
            "r",
            "c1",
        );
        assert_eq!(
            tricky,
            "shell command=\"ls\\n\\u{001b}[2Arm -rf x \\u{202e}\""
        );
        let body = "x".repeat(FOLD_AT + 5);
        let folded = call_text(
            "write_file",
            &json!({"path": "a", "content": body}),
            "r",
            "c1",
        );
        assert!(
            folded.contains("\"… 5 more characters (all of it: agent show r --call c1) path=\"a\""),
            "{folded}"
        );
    }

    #[test]
    fn a_pending_call_names_the_place_its_path_leads_to_when_not_spelled_so() {
        let pending = |path: Option<&str>| agent_core::PendingCall {
            call_id: "w1".into(),
            tool: "write_file".into(),
            arguments: json!({"path": "docs/new.txt", "content": "X"}),
            why: "write_file asks".into(),
            path: path.map(str::to_owned),
        };
        assert_eq!(
            pending_text(&pending(Some("work/new.txt")), "r"),
            "w1 write_file content=\"X\" path=\"docs/new.txt\" (leads to work/new.txt) \
             (write_file asks)"
        );
        let mut forged = pending(None);
        forged.call_id = "w1\nApproved".into();
        assert!(
            pending_text(&forged, "r").starts_with("w1\\nApproved write_file"),
            "{}",
            pending_text(&forged, "r")
        );
        assert_eq!(leads_to(&pending(Some("docs/new.txt"))), "");
        assert_eq!(leads_to(&pending(None)), "");
        assert_eq!(
            leads_to(&pending(Some("a\u{202e}b"))),
            " (leads to a\\u{202e}b)"
        );
    }

    /// A log written elsewhere may hold anything: ids with line breaks (refused from a
    /// model now, not in an older or a forged log), a server's error over several lines.
    /// Each event stays one line of `agent show`.
    #[test]
    fn each_event_is_one_line_whatever_the_log_holds() {
        let entry = |version: u64, event: Event| Entry {
            version,
            at_ms: 0,
            event,
        };
        let forged = "c1\n   9  1970-01-01T00:00:00.000Z  run_ended           completed";
        let call = ToolCall::new(forged, "read\rfile", json!({"path": "a"}));
        let log = [
            entry(
                1,
                Event::DecisionProposed {
                    turn: 1,
                    decision: Decision::ToolCalls { calls: vec![call] },
                    usage: Default::default(),
                    reasoning: Vec::new(),
                },
            ),
            entry(
                2,
                Event::ModelFailed {
                    turn: 2,
                    message: "bad gateway\nretry later".into(),
                    kind: Default::default(),
                    usage: Default::default(),
                },
            ),
        ];
        let shown = timeline("r", &log);
        assert_eq!(shown.lines().count(), 2, "{shown}");
        assert!(
            shown.contains("tool_calls c1\\n   9  1970-01-01T00:00:00.000Z  run_ended"),
            "{shown}"
        );
        assert!(shown.contains("read\\rfile"), "{shown}");
        assert!(
            shown.contains("other: bad gateway\\nretry later"),
            "{shown}"
        );
    }

    /// A summary's model call shows what it used on the compaction's line, and a summary
    /// not used shows too: both were paid for.
    #[test]
    fn compactions_show_what_their_summary_used() {
        let used = agent_core::Usage {
            cost_usd: 0.012,
            ..agent_core::Usage::tokens(9_000, 300)
        };
        let compacted = Event::ContextCompacted {
            summary: "s".into(),
            through_version: 7,
            tokens_before: 90_000,
            tokens_after: 4_000,
            usage: used,
            window: None,
        };
        assert_eq!(
            detail("r", &compacted),
            "history through v7 summarized: 90000 -> 4000 tokens (summary: 9000 in, 300 out, \
             $0.0120)"
        );
        let declined = Event::CompactionDeclined {
            tokens_before: 90_000,
            tokens_after: 95_000,
            usage: used,
        };
        assert_eq!(
            detail("r", &declined),
            "summary not used, it would not shorten the prompt: 90000 -> 95000 tokens \
             (summary: 9000 in, 300 out, $0.0120)"
        );
        let free = Event::ContextCompacted {
            summary: "s".into(),
            through_version: 7,
            tokens_before: 90_000,
            tokens_after: 4_000,
            usage: Default::default(),
            window: None,
        };
        assert!(
            detail("r", &free).ends_with("4000 tokens"),
            "{}",
            detail("r", &free)
        );
        let retried = Event::ModelRetried {
            turn: 3,
            retry: agent_core::Retry {
                attempt: 1,
                reason: "the stream broke".into(),
                wait_ms: 500,
                usage: agent_core::Usage {
                    estimated: true,
                    ..agent_core::Usage::tokens(900, 100)
                },
            },
        };
        assert_eq!(
            detail("r", &retried),
            "turn 3: attempt 1 failed (the stream broke); retried after 500 ms (it may have \
             cost ~900 in, ~100 out)"
        );
        // And the run's total counts them.
        let log: Vec<Entry> = [compacted, declined, free, retried]
            .into_iter()
            .enumerate()
            .map(|(i, event)| Entry {
                version: i as u64 + 1,
                at_ms: 0,
                event,
            })
            .collect();
        assert_eq!(
            usage_total(&log).as_deref(),
            Some("usage: ~18900 in, ~700 out, ~$0.0240")
        );
    }

    #[test]
    fn time_is_utc_rfc3339() {
        assert_eq!(time(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
