//! The script model of CONTRACT §10: `{"turns": [TURN, ...]}`, the Nth turn answering the
//! Nth model call of a run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent_core::{Decision, ModelReply, ToolCall, Usage};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;

use crate::{Model, ModelRequest, ProviderError};

/// A script file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("script {path}: {problem}")]
pub struct ScriptError {
    /// The file (or `<inline>`).
    pub path: String,
    /// What is wrong, precise enough to fix the file.
    pub problem: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScript<'a> {
    #[serde(borrow)]
    turns: Vec<&'a serde_json::value::RawValue>,
    /// Scripts of sub-agents, by the goal they are given.
    #[serde(default, borrow)]
    agents: std::collections::BTreeMap<String, &'a serde_json::value::RawValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTurn {
    /// Text, or any other JSON value, given as its compact JSON text (for runs whose
    /// answer has a schema).
    #[serde(rename = "final")]
    final_answer: Option<Value>,
    tool_calls: Option<Vec<RawCall>>,
    request_approval: Option<RawApproval>,
    clarification: Option<String>,
    cannot_continue: Option<String>,
    invalid: Option<String>,
    error: Option<String>,
    #[serde(default)]
    delay_ms: u64,
    #[serde(default)]
    usage: Option<RawUsage>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCall {
    id: String,
    name: String,
    #[serde(default = "empty_object")]
    arguments: Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApproval {
    summary: String,
    #[serde(default)]
    calls: Vec<RawCall>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_tokens: u64,
    #[serde(default)]
    cache_write_tokens: u64,
    #[serde(default)]
    cost_usd: f64,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// What one turn answers.
#[derive(Clone, Debug, PartialEq)]
enum Answer {
    Decision(Decision),
    Invalid(String),
    Error(String),
}

#[derive(Clone, Debug, PartialEq)]
struct Turn {
    answer: Answer,
    delay: Duration,
    usage: Usage,
}

/// The offline model that plays a script.
#[derive(Clone, Debug)]
pub struct ScriptModel {
    name: String,
    /// Where the turns' texts are: checked when the script was read, and decoded when each
    /// is played, so a long script never costs a tree of values.
    source: Arc<Source>,
    /// Where each turn's text lies in `source`, and a hash of the text that was checked.
    turns: Vec<Span>,
    /// The scripts sub-agents play, by their goal: a run whose first message is one of
    /// these goals is answered from its script.
    agents: std::collections::BTreeMap<String, ScriptModel>,
}

/// Where a script's turns are read from.
#[derive(Debug)]
enum Source {
    /// The script's text, held whole.
    Text(String),
    /// A script file of more than [`FILE_BACKED_BYTES`], open: its turns are read from it
    /// as they are played, [`WINDOW_BYTES`] at a time, so a long script does not hold its
    /// text in memory for a whole run (a 10,000-turn script is about a megabyte).
    #[cfg(unix)]
    File {
        file: std::fs::File,
        /// The bytes last read, and where in the file they begin.
        window: std::sync::Mutex<(u64, Vec<u8>)>,
    },
}

/// A script file larger than this is read turn by turn as it is played.
const FILE_BACKED_BYTES: u64 = 64 << 10;

/// Bytes of a long script file read at once: turns are played in order, so one read
/// serves the hundreds of turns that follow.
const WINDOW_BYTES: usize = 64 << 10;

/// One turn's text in its source: where it starts, its length, and a hash of it as it
/// was checked.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: u64,
    len: u32,
    hash: u32,
}

/// A 32-bit hash of a turn's text, to tell that a script file changed after it was read.
fn text_hash(text: &str) -> u32 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    // The low half of a 64-bit hash: a change goes unseen once in four billion.
    (hasher.finish() & u64::from(u32::MAX)) as u32
}

const KEYS: &str =
    "final, tool_calls, request_approval, clarification, cannot_continue, invalid, error";

impl ScriptModel {
    /// Reads a script file: a regular file (a FIFO would hold the caller until something
    /// writes to it, a device such as `/dev/zero` would be read without end; a script
    /// path may come from a project's `agent.toml` or a run's log).
    pub fn from_path(path: impl AsRef<Path>) -> Result<ScriptModel, ScriptError> {
        let path = path.as_ref();
        let fail = |problem: String| ScriptError {
            path: path.display().to_string(),
            problem,
        };
        let mut file = open_regular(path).map_err(fail)?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut file, &mut text)
            .map_err(|e| fail(format!("cannot read it: {e}")))?;
        let parsed = Self::parse(&text, 0).map_err(fail)?;
        let source = if u64::try_from(text.len()).unwrap_or(u64::MAX) > FILE_BACKED_BYTES {
            Self::file_source(file, text)
        } else {
            Source::Text(text)
        };
        let name = PathBuf::from(path).display().to_string();
        Ok(Self::assemble(name, &Arc::new(source), parsed))
    }

    /// The source a long script file is played from: the file itself where turns can be
    /// read at their offsets, its text elsewhere.
    #[cfg(unix)]
    fn file_source(file: std::fs::File, _text: String) -> Source {
        Source::File {
            file,
            window: std::sync::Mutex::new((0, Vec::new())),
        }
    }

    #[cfg(not(unix))]
    fn file_source(_file: std::fs::File, text: String) -> Source {
        Source::Text(text)
    }

    /// Parses a script from JSON text.
    pub fn from_json(text: &str) -> Result<ScriptModel, ScriptError> {
        let parsed = Self::parse(text, 0).map_err(|problem| ScriptError {
            path: "<inline>".to_owned(),
            problem,
        })?;
        let source = Arc::new(Source::Text(text.to_owned()));
        Ok(Self::assemble("inline".to_owned(), &source, parsed))
    }

    /// Number of turns.
    pub fn len(&self) -> usize {
        self.turns.len()
    }

    /// Whether the script has no turn.
    pub fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }

    /// The JSON text of turn `index` (from 0), as it was checked when the script was read;
    /// `Ok(None)` past the last turn.
    fn turn(&self, index: usize) -> Result<Option<String>, String> {
        let Some(span) = self.turns.get(index) else {
            return Ok(None);
        };
        let text = match &*self.source {
            // Held since it was checked: it cannot have changed.
            Source::Text(text) => usize::try_from(span.start)
                .ok()
                .and_then(|start| text.get(start..start + span.len as usize))
                .map(str::to_owned),
            #[cfg(unix)]
            Source::File { file, window } => {
                read_span(file, window, span).filter(|text| text_hash(text) == span.hash)
            }
        };
        match text {
            Some(text) => Ok(Some(text)),
            None => Err(format!(
                "turn {} of script {} is no longer what was read when the run started \
                 (the file changed); start the run again",
                index + 1,
                self.name
            )),
        }
    }

    /// The turns of the script `text`, which begins `base` bytes into its source, and its
    /// sub-agents' scripts.
    fn parse(text: &str, base: u64) -> Result<Parsed, String> {
        // serde would read an array as the struct's fields in order, and say "expected a
        // sequence" of its first element.
        if text.trim_start().starts_with('[') {
            return Err(
                "not a script (an array); put the turns in an object: {\"turns\": [TURN, ...]}"
                    .to_owned(),
            );
        }
        let raw: RawScript = serde_json::from_str(text)
            .map_err(|e| format!("not a script ({e}); expected {{\"turns\": [TURN, ...]}}"))?;
        for (i, turn) in raw.turns.iter().enumerate() {
            check_turn(turn.get()).map_err(|e| format!("turn {}: {e}", i + 1))?;
        }
        // Where a slice of `text` begins in the source.
        let offset = |slice: &str| base + (slice.as_ptr() as usize - text.as_ptr() as usize) as u64;
        let mut agents = Vec::with_capacity(raw.agents.len());
        for (goal, script) in raw.agents {
            let parsed = Self::parse(script.get(), offset(script.get()))
                .map_err(|e| format!("agents {goal:?}: {e}"))?;
            agents.push((goal, parsed));
        }
        let mut turns = Vec::with_capacity(raw.turns.len());
        for (i, turn) in raw.turns.iter().enumerate() {
            let text = turn.get();
            let len = u32::try_from(text.len())
                .map_err(|_| format!("turn {}: longer than 4 GiB", i + 1))?;
            turns.push(Span {
                start: offset(text),
                len,
                hash: text_hash(text),
            });
        }
        Ok(Parsed { turns, agents })
    }

    /// A model of what `parse` found, played from `source`.
    fn assemble(name: String, source: &Arc<Source>, parsed: Parsed) -> ScriptModel {
        ScriptModel {
            agents: parsed
                .agents
                .into_iter()
                .map(|(goal, parsed)| (goal, Self::assemble(name.clone(), source, parsed)))
                .collect(),
            name,
            source: Arc::clone(source),
            turns: parsed.turns,
        }
    }
}

/// The bytes of `span` in `file`, from `window` when it holds them, else read into it
/// from where the span begins; `None` when the file no longer has them as text.
#[cfg(unix)]
fn read_span(
    file: &std::fs::File,
    window: &std::sync::Mutex<(u64, Vec<u8>)>,
    span: &Span,
) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let mut window = window
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (begins, bytes) = &mut *window;
    let len = span.len as usize;
    let held = span
        .start
        .checked_sub(*begins)
        .and_then(|at| usize::try_from(at).ok())
        .filter(|&at| at.checked_add(len).is_some_and(|end| end <= bytes.len()));
    let at = match held {
        Some(at) => at,
        None => {
            bytes.resize(len.max(WINDOW_BYTES), 0);
            // A read may stop short at the end of the file: what it read is the window.
            let mut read = 0;
            while read < bytes.len() {
                match file.read_at(&mut bytes[read..], span.start + read as u64) {
                    Ok(0) => break,
                    Ok(n) => read += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            bytes.truncate(read);
            *begins = span.start;
            if read < len {
                return None;
            }
            0
        }
    };
    String::from_utf8(bytes[at..at + len].to_vec()).ok()
}

/// A script's turns and its sub-agents' scripts, as [`ScriptModel::parse`] found them.
struct Parsed {
    turns: Vec<Span>,
    agents: Vec<(String, Parsed)>,
}

/// What [`parse_turn`] checks, without building the turn: a script is checked whole when
/// it is loaded, and each turn is built when it is played. Arguments and answers, which
/// may be any JSON, are read past rather than built; everything else is read as
/// `parse_turn` reads it.
fn check_turn(text: &str) -> Result<(), String> {
    use serde::de::IgnoredAny;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct CheckTurn {
        #[serde(rename = "final")]
        final_answer: Option<IgnoredAny>,
        tool_calls: Option<Vec<CheckCall>>,
        request_approval: Option<CheckApproval>,
        clarification: Option<String>,
        cannot_continue: Option<String>,
        invalid: Option<String>,
        error: Option<String>,
        #[serde(default, rename = "delay_ms")]
        _delay_ms: u64,
        #[serde(default, rename = "usage")]
        _usage: Option<RawUsage>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct CheckCall {
        #[serde(rename = "id")]
        _id: String,
        #[serde(rename = "name")]
        _name: String,
        #[serde(default, rename = "arguments")]
        _arguments: IgnoredAny,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct CheckApproval {
        #[serde(rename = "summary")]
        _summary: String,
        #[serde(default, rename = "calls")]
        _calls: Vec<CheckCall>,
    }

    if !text.trim_start().starts_with('{') {
        return Err(format!("a turn is an object with one of: {KEYS}"));
    }
    let raw: CheckTurn = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let answers = [
        raw.final_answer.is_some(),
        raw.tool_calls.is_some(),
        raw.request_approval.is_some(),
        raw.clarification.is_some(),
        raw.cannot_continue.is_some(),
        raw.invalid.is_some(),
        raw.error.is_some(),
    ]
    .into_iter()
    .filter(|present| *present)
    .count();
    if answers != 1 {
        return Err(format!(
            "a turn has exactly one of: {KEYS} (this one has {answers})"
        ));
    }
    Ok(())
}

fn parse_turn(text: &str) -> Result<Turn, String> {
    if !text.trim_start().starts_with('{') {
        return Err(format!("a turn is an object with one of: {KEYS}"));
    }
    let raw: RawTurn = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let calls = |raw: Vec<RawCall>| -> Vec<ToolCall> {
        raw.into_iter()
            .map(|c| ToolCall::new(c.id, c.name, c.arguments))
            .collect()
    };
    let mut answers = Vec::new();
    if let Some(answer) = raw.final_answer {
        let answer = match answer {
            Value::String(text) => text,
            other => other.to_string(),
        };
        answers.push(Answer::Decision(Decision::Final { answer }));
    }
    if let Some(list) = raw.tool_calls {
        answers.push(Answer::Decision(Decision::ToolCalls { calls: calls(list) }));
    }
    if let Some(a) = raw.request_approval {
        answers.push(Answer::Decision(Decision::RequestApproval {
            summary: a.summary,
            calls: calls(a.calls),
        }));
    }
    if let Some(question) = raw.clarification {
        answers.push(Answer::Decision(Decision::Clarification { question }));
    }
    if let Some(reason) = raw.cannot_continue {
        answers.push(Answer::Decision(Decision::CannotContinue { reason }));
    }
    if let Some(text) = raw.invalid {
        answers.push(Answer::Invalid(text));
    }
    if let Some(message) = raw.error {
        answers.push(Answer::Error(message));
    }
    if answers.len() != 1 {
        return Err(format!(
            "a turn has exactly one of: {KEYS} (this one has {})",
            answers.len()
        ));
    }
    let usage = raw.usage.map_or_else(Usage::default, |u| {
        let mut usage = Usage::tokens(u.input_tokens, u.output_tokens)
            .with_cache(u.cache_read_tokens, u.cache_write_tokens);
        usage.cost_usd = u.cost_usd;
        usage
    });
    Ok(Turn {
        answer: answers.remove(0),
        delay: Duration::from_millis(raw.delay_ms),
        usage,
    })
}

#[async_trait]
impl Model for ScriptModel {
    fn provider(&self) -> &str {
        "script"
    }

    fn model(&self) -> &str {
        &self.name
    }

    /// A turn's cost is what its `usage` says (`cost_usd`, 0 when not given).
    fn knows_cost(&self) -> bool {
        true
    }

    /// A turn uses what its `usage` says, whatever the prompt's text.
    fn counts_text(&self) -> bool {
        false
    }

    async fn decide(&self, request: ModelRequest<'_>) -> Result<ModelReply, ProviderError> {
        // A sub-agent's run: its goal, the first message, names its script.
        if let Some(agent) = request
            .prompt
            .messages
            .first()
            .and_then(|m| m.parts.first())
            .and_then(|p| match p {
                agent_core::Part::Text { text } => self.agents.get(text),
                _ => None,
            })
        {
            return agent.decide(request).await;
        }
        let index = usize::try_from(request.step).unwrap_or(usize::MAX);
        let Some(text) = self.turn(index).map_err(ProviderError::Scripted)? else {
            return Err(ProviderError::Exhausted(format!(
                "the script has {} turn(s) and all were used; add a turn or end with a final answer",
                self.len()
            )));
        };
        // Checked when the script was read: it decodes the same now.
        let turn = parse_turn(&text).map_err(ProviderError::Scripted)?;
        if !turn.delay.is_zero() {
            // Simulated latency: the script stands in for a model that takes this long.
            tokio::time::sleep(turn.delay).await;
        }
        match turn.answer {
            Answer::Decision(d) => Ok(ModelReply::decision(d, turn.usage)),
            Answer::Invalid(raw) => Ok(ModelReply::invalid(
                raw,
                "the reply is not a decision (not JSON of a known shape)",
                turn.usage,
            )),
            Answer::Error(message) => Err(ProviderError::Scripted(message)),
        }
    }
}

/// Opens `path` to read if it is a regular file (symbolic links followed), judged on the
/// open file: opened without waiting (`O_NONBLOCK`), so that a FIFO does not block the
/// open itself.
fn open_regular(path: &Path) -> Result<std::fs::File, String> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        let nonblock = rustix::fs::OFlags::NONBLOCK.bits();
        options.custom_flags(i32::try_from(nonblock).unwrap_or(0));
    }
    let file = options
        .open(path)
        .map_err(|e| format!("cannot read it: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_file() {
        return Err(
            "is not a regular file (a FIFO, a device or a directory); a script is read from \
             a file: write it to one"
                .to_owned(),
        );
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::{check_turn, parse_turn};

    /// The check at load time refuses exactly what building the turn refuses, with the
    /// same words.
    #[test]
    fn the_load_check_and_the_turn_agree() {
        let turns = [
            r#"{"final": "done"}"#,
            r#"{"final": {"a": [1, 2]}}"#,
            r#"{"final": null}"#,
            r#"{"tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "a"}}]}"#,
            r#"{"tool_calls": [{"id": "c1", "name": "read_file"}], "delay_ms": 5}"#,
            r#"{"tool_calls": [{"id": 1, "name": "read_file"}]}"#,
            r#"{"tool_calls": [{"id": "c1"}]}"#,
            r#"{"tool_calls": [{"id": "c1", "name": "x", "args": {}}]}"#,
            r#"{"request_approval": {"summary": "ok?"}}"#,
            r#"{"request_approval": {"summary": "ok?", "calls": [{"id": "c", "name": "w"}]}}"#,
            r#"{"request_approval": {"calls": []}}"#,
            r#"{"clarification": "which?"}"#,
            r#"{"cannot_continue": "no"}"#,
            r#"{"invalid": "garbage"}"#,
            r#"{"error": "boom"}"#,
            r#"{"final": "a", "error": "b"}"#,
            r#"{}"#,
            r#"{"delay_ms": 3}"#,
            r#"{"final": "x", "usage": {"input_tokens": 3, "cost_usd": 0.5}}"#,
            r#"{"final": "x", "usage": {"input_tokens": -3}}"#,
            r#"{"final": "x", "usage": {"tokens": 3}}"#,
            r#"{"final": "x", "surprise": 1}"#,
            r#"{"final": "x"#,
            r#"[1]"#,
            r#"  "text""#,
        ];
        for turn in turns {
            assert_eq!(check_turn(turn).err(), parse_turn(turn).err(), "{turn}");
        }
    }
}
