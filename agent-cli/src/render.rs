//! What the commands print.

use std::fmt::Write as _;

use agent_core::{Decision, Entry, Event, Outcome, TerminalReason, ToolCall};
use agent_runtime::Report;
use agent_store::RunSummary;
use serde_json::{Value, json};

/// The contract's `--json` object of `run`, `resume`, ...
pub fn outcome_json(report: &Report) -> Value {
    let o = &report.outcome;
    json!({
        "run_id": report.run_id,
        "status": o.reason.class().as_str(),
        "reason": o.reason.as_str(),
        "answer": if o.reason == TerminalReason::Completed { json!(o.answer) } else { Value::Null },
        "message": o.message,
        "steps": report.state.steps,
        "tool_calls": report.state.tool_calls,
        "usage": {
            "input_tokens": report.state.usage.input_tokens,
            "output_tokens": report.state.usage.output_tokens,
        },
        "pending": o.pending.iter().map(|p| json!({
            "call_id": p.call_id,
            "tool": p.tool,
            "arguments": p.arguments,
            "why": p.why,
        })).collect::<Vec<_>>(),
    })
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
    for p in &o.pending {
        let _ = write!(
            out,
            "\n  waiting: {} {} {} ({})",
            p.call_id,
            p.tool,
            compact(&p.arguments, 120),
            p.why
        );
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
    }
    out
}

/// `agent runs` as a table.
pub fn runs_table(runs: &[RunSummary]) -> String {
    if runs.is_empty() {
        return "no runs yet; start one with `agent run`".to_owned();
    }
    let mut out = format!(
        "{:<26}  {:<8}  {:<22}  {:>5}  {}",
        "RUN", "STATUS", "REASON", "STEPS", "STARTED"
    );
    for r in runs {
        let reason = r.reason.map_or("-", TerminalReason::as_str);
        let _ = write!(
            out,
            "\n{:<26}  {:<8}  {:<22}  {:>5}  {}",
            r.run_id,
            r.status,
            reason,
            r.steps,
            time(r.started_at_ms)
        );
    }
    out
}

/// `agent show` as one line per event.
pub fn timeline(entries: &[Entry]) -> String {
    let mut out = String::new();
    for e in entries {
        let _ = writeln!(
            out,
            "{:>4}  {}  {:<18}  {}",
            e.version,
            time(e.at_ms),
            e.event.name(),
            detail(&e.event)
        );
    }
    out
}

fn detail(event: &Event) -> String {
    match event {
        Event::RunStarted {
            run_id,
            goal,
            manifest,
        } => format!(
            "{run_id} goal {:?} model {}:{}",
            goal, manifest.provider, manifest.model
        ),
        Event::DecisionProposed {
            turn,
            decision,
            usage,
        } => {
            let what = match decision {
                Decision::Final { answer } => format!("final {}", cut(answer, 100)),
                Decision::ToolCalls { calls } => format!("tool_calls {}", calls_text(calls)),
                Decision::RequestApproval { summary, calls } => {
                    format!("request_approval {:?} {}", summary, calls_text(calls))
                }
                Decision::Clarification { question } => format!("clarification {question:?}"),
                Decision::CannotContinue { reason } => format!("cannot_continue {reason:?}"),
            };
            format!(
                "turn {turn}: {what} ({} in, {} out)",
                usage.input_tokens, usage.output_tokens
            )
        }
        Event::DecisionRejected { turn, problem, .. } => format!("turn {turn}: {problem}"),
        Event::ModelFailed { turn, message } => format!("turn {turn}: {message}"),
        Event::ModelRetried { turn, retry } => format!(
            "turn {turn}: attempt {} failed ({}); retried after {} ms",
            retry.attempt, retry.reason, retry.wait_ms
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
            let calls: Vec<String> = pending
                .iter()
                .map(|p| format!("{} {}", p.call_id, p.tool))
                .collect();
            match summary {
                Some(s) => format!("{s:?} {}", calls.join(", ")),
                None => calls.join(", "),
            }
        }
        Event::ApprovalGranted { call_ids } => ids(call_ids),
        Event::ApprovalDenied { call_ids, reason } => format!("{} ({reason})", ids(call_ids)),
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
            ..
        } => format!(
            "history through v{through_version} summarized: {tokens_before} -> {tokens_after} tokens"
        ),
        Event::RunEnded { outcome } => format!("{}: {}", outcome.reason, outcome.message),
    }
}

fn ids(ids: &[agent_core::CallId]) -> String {
    ids.iter()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn calls_text(calls: &[ToolCall]) -> String {
    calls
        .iter()
        .map(|c| format!("{} {} {}", c.id, c.name, compact(&c.arguments, 60)))
        .collect::<Vec<_>>()
        .join("; ")
}

fn compact(value: &Value, max: usize) -> String {
    cut(&value.to_string(), max)
}

/// The first line of `text`, at most `max` characters.
fn cut(text: &str, max: usize) -> String {
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
    use agent_core::Part;
    let mut out = format!("=== system\n{}\n", prompt.system);
    for (i, message) in prompt.messages.iter().enumerate() {
        let role = match message.role {
            agent_core::Role::User => "user",
            agent_core::Role::Assistant => "assistant",
        };
        let _ = writeln!(out, "=== {} {role}", i + 1);
        for part in &message.parts {
            match part {
                Part::Text { text } => {
                    let _ = writeln!(out, "{text}");
                }
                Part::ToolUse {
                    call_id,
                    name,
                    arguments,
                } => {
                    let _ = writeln!(out, "[tool use {call_id}] {name} {arguments}");
                }
                Part::ToolResult {
                    call_id,
                    ok,
                    content,
                    ..
                } => {
                    let status = if *ok { "ok" } else { "error" };
                    let _ = writeln!(out, "[tool result {call_id}, {status}]\n{content}");
                }
            }
        }
    }
    let names: Vec<&str> = prompt.tools.iter().map(|t| t.name.as_str()).collect();
    let _ = writeln!(out, "=== tools\n{}", names.join(", "));
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

    #[test]
    fn cut_keeps_the_first_line_and_marks_the_rest() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("one\ntwo", 10), "one…");
        assert_eq!(cut("abcdef", 3), "abc…");
    }

    #[test]
    fn time_is_utc_rfc3339() {
        assert_eq!(time(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
