//! An evaluation case: a goal, the world it runs in, and what its whole trajectory must
//! show. Read from TOML (or JSON), checked whole before anything runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use agent_core::TerminalReason;
use serde::Deserialize;

/// A case file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    name: Option<String>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    tags: Vec<String>,
    goal: String,
    model: Option<String>,
    workspace: Option<PathBuf>,
    mcp_config: Option<PathBuf>,
    #[serde(default)]
    sandbox: bool,
    #[serde(default)]
    sandbox_network: bool,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    ask: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    max_steps: Option<u32>,
    max_tool_calls: Option<u32>,
    timeout: Option<f64>,
    answer_schema: Option<PathBuf>,
    #[serde(default)]
    checks: Vec<String>,
    person: Option<String>,
    resolve: Option<String>,
    cancel_after: Option<String>,
    crash_after: Option<String>,
    #[serde(default)]
    expect: RawExpect,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExpect {
    reason: Option<String>,
    answer: Option<String>,
    answer_regex: Option<String>,
    answer_schema: Option<PathBuf>,
    #[serde(default)]
    files: Vec<RawFile>,
    writes_only: Option<Vec<String>>,
    #[serde(default)]
    forbidden_tools: Vec<String>,
    #[serde(default)]
    tools: Vec<String>,
    #[serde(default)]
    events: BTreeMap<String, u32>,
    #[serde(default)]
    results: BTreeMap<String, String>,
    max_steps: Option<u32>,
    max_tool_calls: Option<u32>,
    max_tokens: Option<u64>,
    max_cost_usd: Option<f64>,
    max_seconds: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    path: String,
    content: Option<String>,
    regex: Option<String>,
    #[serde(default)]
    absent: bool,
}

/// What a person answers when a case's run pauses for approval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Person {
    /// `agent approve`.
    Approve,
    /// `agent deny`.
    Deny,
}

/// A case, checked: paths absolute, patterns compiled.
#[derive(Clone, Debug)]
pub struct Case {
    /// Its name (the file's stem unless it says).
    pub name: String,
    /// The file it came from.
    pub file: PathBuf,
    /// What it is about.
    pub description: String,
    /// Its tags, for the summary.
    pub tags: Vec<String>,
    /// The goal.
    pub goal: String,
    /// The model (`--model` form; a script's path absolute).
    pub model: Option<String>,
    /// The workspace fixture copied fresh for each trial (empty when `None`).
    pub workspace: Option<PathBuf>,
    /// `--mcp-config`.
    pub mcp_config: Option<PathBuf>,
    /// `--sandbox`.
    pub sandbox: bool,
    /// `--sandbox-network`.
    pub sandbox_network: bool,
    /// Policy flags.
    pub allow: Vec<String>,
    /// Policy flags.
    pub ask: Vec<String>,
    /// Policy flags.
    pub deny: Vec<String>,
    /// Budget flags.
    pub max_steps: Option<u32>,
    /// Budget flags.
    pub max_tool_calls: Option<u32>,
    /// `--timeout`.
    pub timeout: Option<f64>,
    /// `--answer-schema`.
    pub answer_schema: Option<PathBuf>,
    /// `--check`.
    pub checks: Vec<String>,
    /// Who answers approvals.
    pub person: Option<Person>,
    /// How calls of unknown outcome are settled (`agent resolve --as`).
    pub resolve: Option<String>,
    /// Cancel (SIGINT) once this event is committed.
    pub cancel_after: Option<String>,
    /// Kill (SIGKILL) once this event is committed, then resume.
    pub crash_after: Option<String>,
    /// The expectations.
    pub expect: Expect,
}

/// What the trajectory must show.
#[derive(Clone, Debug, Default)]
pub struct Expect {
    /// The terminal reason.
    pub reason: Option<TerminalReason>,
    /// The answer, exactly.
    pub answer: Option<String>,
    /// The answer matches this.
    pub answer_regex: Option<regex::Regex>,
    /// The answer is JSON valid against this schema.
    pub answer_schema: Option<(PathBuf, serde_json::Value)>,
    /// Files in the workspace after the run.
    pub files: Vec<FileExpect>,
    /// The only paths (globs) the run may create, change or delete.
    pub writes_only: Option<(Vec<String>, globset::GlobSet)>,
    /// Tools that must never run.
    pub forbidden_tools: Vec<String>,
    /// Tools that must have run.
    pub tools: Vec<String>,
    /// Exact counts of committed events, by type.
    pub events: BTreeMap<String, u32>,
    /// The result the model saw for a call id matches this (an output, or `kind: message`
    /// for an error).
    pub results: Vec<(String, regex::Regex)>,
    /// At most this many model calls.
    pub max_steps: Option<u32>,
    /// At most this many tool calls.
    pub max_tool_calls: Option<u32>,
    /// At most this many tokens.
    pub max_tokens: Option<u64>,
    /// At most this much money.
    pub max_cost_usd: Option<f64>,
    /// At most this many seconds of the agent's processes.
    pub max_seconds: Option<f64>,
}

/// One file's expectation.
#[derive(Clone, Debug)]
pub struct FileExpect {
    /// Relative to the workspace.
    pub path: String,
    /// What it must hold.
    pub want: FileWant,
}

/// What a file must be.
#[derive(Clone, Debug)]
pub enum FileWant {
    /// Exactly this.
    Content(String),
    /// Text matching this.
    Regex(regex::Regex),
    /// Not there.
    Absent,
}

/// The events a case may name (to wait for, or to count).
const EVENT_TYPES: &[&str] = &[
    "run_started",
    "decision_proposed",
    "decision_rejected",
    "model_retried",
    "model_failed",
    "call_rejected",
    "correction_issued",
    "approval_requested",
    "approval_granted",
    "approval_denied",
    "effect_dispatched",
    "effect_reconciled",
    "resolution_requested",
    "effect_resolved",
    "answer_rejected",
    "tool_finished",
    "context_compacted",
    "user_message",
    "run_ended",
];

impl Case {
    /// Reads and checks a case file; the error names the file and what to fix.
    pub fn load(file: &Path) -> Result<Case, String> {
        let at = |problem: String| format!("{}: {problem}", file.display());
        let text =
            std::fs::read_to_string(file).map_err(|e| at(format!("cannot read it ({e})")))?;
        let json = file.extension().is_some_and(|e| e == "json");
        let raw: RawCase = if json {
            serde_json::from_str(&text).map_err(|e| at(e.to_string()))?
        } else {
            toml::from_str(&text).map_err(|e| {
                format!(
                    "{}{}",
                    file.display(),
                    crate::config::toml_problem(&text, &e)
                )
            })?
        };
        // `case.toml` alone has an empty parent: the current directory.
        let dir = file
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let dir = std::path::absolute(dir).map_err(|e| at(e.to_string()))?;
        Case::check(raw, file, &dir).map_err(at)
    }

    fn check(raw: RawCase, file: &Path, dir: &Path) -> Result<Case, String> {
        let name = raw.name.unwrap_or_else(|| {
            file.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
        if raw.goal.trim().is_empty() {
            return Err("the goal is empty; say what the agent should achieve".into());
        }
        let existing = |what: &str, p: &Path| -> Result<PathBuf, String> {
            let path = dir.join(p);
            if path.exists() {
                Ok(path)
            } else {
                Err(format!("{what} {} does not exist", path.display()))
            }
        };
        let model = match raw.model {
            Some(m) => Some(match m.strip_prefix("script:") {
                Some(p) => format!("script:{}", existing("the script", Path::new(p))?.display()),
                None => m,
            }),
            None => None,
        };
        let workspace = raw
            .workspace
            .map(|p| {
                let path = existing("the workspace", &p)?;
                if path.is_dir() {
                    Ok(path)
                } else {
                    Err(format!(
                        "the workspace {} is not a directory",
                        path.display()
                    ))
                }
            })
            .transpose()?;
        let mcp_config = raw
            .mcp_config
            .map(|p| existing("the MCP configuration", &p))
            .transpose()?;
        let answer_schema = raw
            .answer_schema
            .map(|p| existing("the answer schema", &p))
            .transpose()?;
        let person = match raw.person.as_deref() {
            None => None,
            Some("approve") => Some(Person::Approve),
            Some("deny") => Some(Person::Deny),
            Some(other) => {
                return Err(format!("person = {other:?}: use \"approve\" or \"deny\""));
            }
        };
        if let Some(r) = &raw.resolve {
            r.parse::<agent_core::Resolution>()
                .map_err(|e| format!("resolve = {r:?}: {e}"))?;
        }
        for (key, event) in [
            ("cancel_after", &raw.cancel_after),
            ("crash_after", &raw.crash_after),
        ] {
            if let Some(event) = event {
                known_event(key, event)?;
            }
        }
        if raw.cancel_after.is_some() && raw.crash_after.is_some() {
            return Err("cancel_after and crash_after: give one of them".into());
        }
        let expect = check_expect(raw.expect, dir)?;
        Ok(Case {
            name,
            file: file.to_path_buf(),
            description: raw.description,
            tags: raw.tags,
            goal: raw.goal,
            model,
            workspace,
            mcp_config,
            sandbox: raw.sandbox,
            sandbox_network: raw.sandbox_network,
            allow: raw.allow,
            ask: raw.ask,
            deny: raw.deny,
            max_steps: raw.max_steps,
            max_tool_calls: raw.max_tool_calls,
            timeout: raw.timeout,
            answer_schema,
            checks: raw.checks,
            person,
            resolve: raw.resolve,
            cancel_after: raw.cancel_after,
            crash_after: raw.crash_after,
            expect,
        })
    }
}

fn known_event(key: &str, event: &str) -> Result<(), String> {
    if EVENT_TYPES.contains(&event) {
        Ok(())
    } else {
        Err(format!(
            "{key} = {event:?} is not an event; events are: {}",
            EVENT_TYPES.join(", ")
        ))
    }
}

fn check_expect(raw: RawExpect, dir: &Path) -> Result<Expect, String> {
    let regex = |what: &str, text: &str| {
        regex::Regex::new(text)
            .map_err(|e| format!("{what} {text:?}: {}", one_line(&e.to_string())))
    };
    let reason = raw
        .reason
        .map(|r| {
            r.parse::<TerminalReason>().map_err(|_| {
                let all: Vec<&str> = TerminalReason::ALL.iter().map(|r| r.as_str()).collect();
                format!(
                    "expect.reason = {r:?} is not a terminal reason; reasons are: {}",
                    all.join(", ")
                )
            })
        })
        .transpose()?;
    let answer_regex = raw
        .answer_regex
        .map(|r| regex("expect.answer_regex", &r))
        .transpose()?;
    let answer_schema = raw
        .answer_schema
        .map(|p| {
            let path = dir.join(&p);
            let text = std::fs::read_to_string(&path).map_err(|e| {
                format!(
                    "expect.answer_schema {}: cannot read it ({e})",
                    path.display()
                )
            })?;
            let value: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| format!("expect.answer_schema {}: not JSON ({e})", path.display()))?;
            jsonschema::validator_for(&value).map_err(|e| {
                format!(
                    "expect.answer_schema {}: not a valid JSON Schema ({e})",
                    path.display()
                )
            })?;
            Ok::<_, String>((path, value))
        })
        .transpose()?;
    let mut files = Vec::new();
    for f in raw.files {
        let want = match (f.content, f.regex, f.absent) {
            (Some(c), None, false) => FileWant::Content(c),
            (None, Some(r), false) => {
                FileWant::Regex(regex(&format!("expect.files {:?} regex", f.path), &r)?)
            }
            (None, None, true) => FileWant::Absent,
            _ => {
                return Err(format!(
                    "expect.files {:?}: give exactly one of content, regex or absent = true",
                    f.path
                ));
            }
        };
        files.push(FileExpect { path: f.path, want });
    }
    let writes_only = raw
        .writes_only
        .map(|globs| {
            let mut set = globset::GlobSetBuilder::new();
            for g in &globs {
                let glob = globset::GlobBuilder::new(g)
                    .literal_separator(true)
                    .build()
                    .map_err(|e| format!("expect.writes_only {g:?}: {e}"))?;
                set.add(glob);
            }
            let set = set
                .build()
                .map_err(|e| format!("expect.writes_only: {e}"))?;
            Ok::<_, String>((globs, set))
        })
        .transpose()?;
    for event in raw.events.keys() {
        known_event("expect.events", event)?;
    }
    let results = raw
        .results
        .iter()
        .map(|(id, re)| Ok((id.clone(), regex(&format!("expect.results.{id}"), re)?)))
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Expect {
        reason,
        answer: raw.answer,
        answer_regex,
        answer_schema,
        files,
        writes_only,
        forbidden_tools: raw.forbidden_tools,
        tools: raw.tools,
        events: raw.events,
        results,
        max_steps: raw.max_steps,
        max_tool_calls: raw.max_tool_calls,
        max_tokens: raw.max_tokens,
        max_cost_usd: raw.max_cost_usd,
        max_seconds: raw.max_seconds,
    })
}

/// An error message on one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The case files named: files as given, and the `*.toml` files directly in each
/// directory (not below it: `broken/` beside the cases is not run unless named), sorted.
pub fn find(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let entries = std::fs::read_dir(path)
                .map_err(|e| format!("{}: cannot list it ({e})", path.display()))?;
            let mut found: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "toml"))
                .collect();
            if found.is_empty() {
                return Err(format!(
                    "{}: no case files (*.toml) in this directory",
                    path.display()
                ));
            }
            found.sort();
            files.extend(found);
        } else if path.is_file() {
            files.push(path.clone());
        } else {
            return Err(format!(
                "{}: no such file or directory; give case files or their directory",
                path.display()
            ));
        }
    }
    Ok(files)
}
