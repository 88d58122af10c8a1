//! Secrets never reach the log, and redaction never changes what runs (CONTRACT §7).
//!
//! Two kinds of secret are known:
//!
//! - **Exact values**: the values of the process's environment variables that hold
//!   secrets ([`agent_core::holds_secret`]: `*KEY*`, `*TOKEN*`, `*SECRET*`, `*PASSWORD*`,
//!   `*_PASS`, `*_PWD` and the like, or a URL with a password) and every value of an MCP
//!   server's `env` block. Anywhere they appear in text bound for the log or a blob, they
//!   become `[REDACTED:NAME]`. Inside a *proposed call* they become a reference,
//!   `[secret:$NAME]`, recorded in the call's [`SecretRef`]s and expanded back to the
//!   variable's value before the call is checked or run: the call executed after an
//!   approval, a resume or a recovery is byte for byte the call the model proposed.
//! - **Credential formats**, anchored on their real prefixes: OpenAI (`sk-`, `sk-proj-`),
//!   Anthropic (`sk-ant-`), GitHub (`ghp_`, `gho_`, `ghu_`, `ghs_`, `ghr_`,
//!   `github_pat_`), AWS access key ids (`AKIA`, `ASIA`), Slack (`xoxb-`, `xoxp-`, …),
//!   `Bearer` tokens and `Authorization:` header values, and the password of a URL
//!   (`scheme://user:password@host`). These patterns apply to results, errors, answers,
//!   summaries and blobs, never to calls. A candidate token must contain a digit, so
//!   ordinary identifiers (`sk-learn-style-names`, `pk_sequence_generator_name`) and source
//!   text are left alone.

use regex::{Captures, Regex, RegexSet};
use serde_json::Value;

use agent_core::{Decision, Entry, ModelReply, SecretRef, ToolCall, ToolResult};

/// Values shorter than this are too likely to appear by chance to be worth replacing.
const MIN_SECRET_LEN: usize = 8;

/// A variable's value could not be put back into a call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the call uses the value of {var}, which this process does not have; set {var} \
     (or the MCP server's env entry) and resume the run"
)]
pub struct MissingSecret {
    /// The variable the call referred to.
    pub var: String,
}

/// Replaces secrets in text bound for the log, and references them in calls.
#[derive(Clone, Debug)]
pub struct Redactor {
    /// `(name, value)`, longest value first.
    secrets: Vec<(String, String)>,
    /// Whether credential formats are redacted (not by [`Redactor::none`]).
    formats: bool,
    /// The credential patterns, compiled the first time a text holds one of the anchors
    /// (most runs never need them, and compiling them was most of a run's start-up).
    compiled: std::sync::OnceLock<Formats>,
    /// The literal every pattern's match contains, in any case, and each secret value as
    /// JSON writes it: text of a serialized entry in which none occurs has nothing to redact.
    anchors: Option<&'static Anchors>,
    escaped_secrets: Vec<String>,
}

/// The credential patterns, and all of them at once: one scan tells whether any of them
/// needs looking at.
#[derive(Clone, Debug)]
struct Formats {
    patterns: Vec<Pattern>,
    any: RegexSet,
}

impl Formats {
    fn compile() -> Formats {
        let patterns = patterns();
        let any = RegexSet::new(patterns.iter().map(|p| p.regex.as_str()))
            .unwrap_or_else(|_| RegexSet::empty());
        Formats { patterns, any }
    }
}

#[derive(Clone, Debug)]
struct Pattern {
    regex: Regex,
    /// The capture group holding the secret part (0: the whole match).
    group: usize,
}

impl Redactor {
    /// Secrets from this process's environment: every variable that holds one
    /// ([`agent_core::holds_secret`]).
    pub fn from_env() -> Redactor {
        Redactor::from_vars(std::env::vars())
    }

    /// Secrets from the given environment: the variables that hold secrets
    /// ([`agent_core::holds_secret`]: named like secrets, or a URL with a password).
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Redactor {
        Redactor::new(
            vars.into_iter()
                .filter(|(name, value)| agent_core::holds_secret(name, value)),
        )
    }

    /// Secrets given as `(name, value)` pairs, and the credential formats.
    pub fn new(secrets: impl IntoIterator<Item = (String, String)>) -> Redactor {
        let mut redactor = Redactor {
            secrets: Vec::new(),
            formats: true,
            compiled: std::sync::OnceLock::new(),
            anchors: Some(Anchors::get()),
            escaped_secrets: Vec::new(),
        };
        redactor.add(secrets);
        redactor
    }

    /// A redactor that changes nothing.
    pub fn none() -> Redactor {
        Redactor {
            secrets: Vec::new(),
            formats: false,
            compiled: std::sync::OnceLock::new(),
            anchors: None,
            escaped_secrets: Vec::new(),
        }
    }

    /// Adds exact values (for example every value of an MCP server's `env` block, named
    /// `SERVER.VAR`).
    pub fn with_secrets(mut self, secrets: impl IntoIterator<Item = (String, String)>) -> Self {
        self.add(secrets);
        self
    }

    fn add(&mut self, secrets: impl IntoIterator<Item = (String, String)>) {
        for (name, value) in secrets {
            if value.len() >= MIN_SECRET_LEN && !self.secrets.iter().any(|(n, _)| *n == name) {
                self.secrets.push((name, value));
            }
        }
        // Longest first, so a secret that contains another is replaced whole.
        self.secrets
            .sort_by_key(|(_, value)| std::cmp::Reverse(value.len()));
        // JSON escapes a string character by character: a string holds a value exactly
        // when its JSON text holds the value's JSON text.
        self.escaped_secrets = self
            .secrets
            .iter()
            .map(|(_, value)| {
                let quoted = serde_json::to_string(value).unwrap_or_default();
                quoted[1..quoted.len().saturating_sub(1).max(1)].to_owned()
            })
            .collect();
    }

    /// Whether an entry whose JSON text is `json` may hold anything to redact (false
    /// positives only cost the full check).
    fn may_hold_secrets(&self, json: &str) -> bool {
        self.escaped_secrets
            .iter()
            .any(|s| json.contains(s.as_str()))
            || (self.formats && assigns_to_secret(json))
            || self
                .anchors
                .as_ref()
                .is_none_or(|anchors| anchored(anchors, json))
    }

    /// `text` with every known value and credential format replaced.
    pub fn redact_str(&self, text: &str) -> String {
        let mut out = self.replace_values(text, |name| format!("[REDACTED:{name}]"), |_, _| {});
        if self.formats
            && let Some(assigned) = redact_assignments(&out)
        {
            out = assigned;
        }
        // Almost every text holds none of the literals a credential format contains.
        if !self.formats
            || self
                .anchors
                .as_ref()
                .is_some_and(|anchors| !anchored(anchors, &out))
        {
            return out;
        }
        let formats = self.compiled.get_or_init(Formats::compile);
        // One scan of them all says which patterns need looking at.
        if !formats.any.is_match(&out) {
            return out;
        }
        let matched = formats.any.matches(&out);
        for (i, pattern) in formats.patterns.iter().enumerate() {
            if !matched.matched(i) {
                continue;
            }
            out = pattern
                .regex
                .replace_all(&out, |caps: &Captures| {
                    let whole = caps.get(0).map_or("", |m| m.as_str());
                    let Some(secret) = caps.get(pattern.group) else {
                        return whole.to_owned();
                    };
                    if !secret.as_str().chars().any(|c| c.is_ascii_digit()) {
                        return whole.to_owned();
                    }
                    let start = secret.start() - caps.get(0).map_or(0, |m| m.start());
                    let end = start + secret.len();
                    format!("{}[REDACTED]{}", &whole[..start], &whole[end..])
                })
                .into_owned();
        }
        out
    }

    /// Replaces each known value in `text` by `mark(name)`, calling `found(at, mark)` with
    /// the byte offset of each replacement in the output.
    fn replace_values(
        &self,
        text: &str,
        mark: impl Fn(&str) -> String,
        mut found: impl FnMut(usize, &str),
    ) -> String {
        if self.secrets.is_empty() || !self.secrets.iter().any(|(_, v)| text.contains(v)) {
            return text.to_owned();
        }
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        'scan: while let Some(c) = rest.chars().next() {
            for (name, value) in &self.secrets {
                if rest.starts_with(value.as_str()) {
                    let placeholder = mark(name);
                    found(out.len(), name);
                    out.push_str(&placeholder);
                    rest = &rest[value.len()..];
                    continue 'scan;
                }
            }
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
        out
    }

    /// The call with every known secret value replaced by a reference to its variable,
    /// recorded in `call.secrets`. Credential patterns never apply to calls.
    pub fn reference_call(&self, call: &mut ToolCall) {
        if self.secrets.is_empty() {
            return;
        }
        let mut refs = Vec::new();
        let arguments = std::mem::take(&mut call.arguments);
        call.arguments = self.reference_value(arguments, "", &mut refs);
        call.secrets.extend(refs);
    }

    fn reference_value(&self, value: Value, pointer: &str, refs: &mut Vec<SecretRef>) -> Value {
        match value {
            Value::String(text) => Value::String(self.reference_text(&text, pointer, false, refs)),
            Value::Array(items) => Value::Array(
                items
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| self.reference_value(v, &format!("{pointer}/{i}"), refs))
                    .collect(),
            ),
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(key, v)| {
                        let mut key_refs = Vec::new();
                        // The member's name, as logged, names it in the pointer.
                        let logged = self.reference_text(&key, "", true, &mut key_refs);
                        let child = format!("{pointer}/{}", escape_pointer(&logged));
                        refs.extend(key_refs.into_iter().map(|mut r| {
                            r.pointer.clone_from(&child);
                            r
                        }));
                        let v = self.reference_value(v, &child, refs);
                        (logged, v)
                    })
                    .collect(),
            ),
            other => other,
        }
    }

    fn reference_text(
        &self,
        text: &str,
        pointer: &str,
        in_key: bool,
        refs: &mut Vec<SecretRef>,
    ) -> String {
        self.replace_values(
            text,
            |name| format!("[secret:${name}]"),
            |at, name| {
                refs.push(SecretRef {
                    pointer: pointer.to_owned(),
                    in_key,
                    at,
                    len: format!("[secret:${name}]").len(),
                    var: name.to_owned(),
                })
            },
        )
    }

    /// `text` with every known secret value replaced by a reference to its variable, as
    /// in a call's arguments: for text the machine keeps and hands back to run a call (the
    /// place a call's path led to), which [`Redactor::expand_str`] makes whole again.
    pub fn reference_str(&self, text: &str) -> String {
        self.replace_values(text, |name| format!("[secret:${name}]"), |_, _| {})
    }

    /// `text` with each reference to a variable this process knows (`[secret:$NAME]`)
    /// expanded to its value; a reference to any other name is left as it is.
    pub fn expand_str<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        const OPEN: &str = "[secret:$";
        if self.secrets.is_empty() || !text.contains(OPEN) {
            return text.into();
        }
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find(OPEN) {
            out.push_str(&rest[..at]);
            let after = &rest[at + OPEN.len()..];
            match after
                .find(']')
                .and_then(|end| Some((end, self.value(&after[..end])?)))
            {
                Some((end, value)) => {
                    out.push_str(value);
                    rest = &after[end + 1..];
                }
                None => {
                    out.push_str(OPEN);
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        out.into()
    }

    /// The call as the model proposed it: every reference expanded to its variable's value.
    pub fn expand_call(&self, call: &ToolCall) -> Result<ToolCall, MissingSecret> {
        if call.secrets.is_empty() {
            return Ok(call.clone());
        }
        for r in &call.secrets {
            if self.value(&r.var).is_none() {
                return Err(MissingSecret { var: r.var.clone() });
            }
        }
        let arguments = self.expand_value(&call.arguments, "", &call.secrets);
        Ok(ToolCall::new(call.id.clone(), call.name.clone(), arguments))
    }

    fn value(&self, var: &str) -> Option<&str> {
        self.secrets
            .iter()
            .find(|(name, _)| name == var)
            .map(|(_, value)| value.as_str())
    }

    fn expand_value(&self, value: &Value, pointer: &str, refs: &[SecretRef]) -> Value {
        match value {
            Value::String(text) => Value::String(self.expand_text(text, pointer, false, refs)),
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| self.expand_value(v, &format!("{pointer}/{i}"), refs))
                    .collect(),
            ),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(key, v)| {
                        let child = format!("{pointer}/{}", escape_pointer(key));
                        let v = self.expand_value(v, &child, refs);
                        (self.expand_text(key, &child, true, refs), v)
                    })
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    fn expand_text(&self, text: &str, pointer: &str, in_key: bool, refs: &[SecretRef]) -> String {
        let mut here: Vec<&SecretRef> = refs
            .iter()
            .filter(|r| r.pointer == pointer && r.in_key == in_key)
            .collect();
        if here.is_empty() {
            return text.to_owned();
        }
        // From the end, so earlier offsets stay valid.
        here.sort_by_key(|r| std::cmp::Reverse(r.at));
        let mut out = text.to_owned();
        for r in here {
            let (Some(value), Some(end)) = (self.value(&r.var), r.at.checked_add(r.len)) else {
                continue;
            };
            if out.get(r.at..end).is_some() {
                out.replace_range(r.at..end, value);
            }
        }
        out
    }

    /// A model's reply made fit for the log: references in its calls, everything else
    /// redacted. The machine only ever holds this form, so live state and log agree.
    pub fn redact_reply(&self, reply: &mut ModelReply) {
        match &mut reply.decision {
            Ok(Decision::Final { answer }) => *answer = self.redact_str(answer),
            Ok(Decision::ToolCalls { calls }) => {
                calls.iter_mut().for_each(|c| self.reference_call(c));
            }
            Ok(Decision::RequestApproval { summary, calls }) => {
                *summary = self.redact_str(summary);
                calls.iter_mut().for_each(|c| self.reference_call(c));
            }
            Ok(Decision::Clarification { question }) => *question = self.redact_str(question),
            Ok(Decision::CannotContinue { reason }) => *reason = self.redact_str(reason),
            Err(invalid) => {
                invalid.raw = self.redact_str(&invalid.raw);
                invalid.problem = self.redact_str(&invalid.problem);
            }
        }
        for retry in &mut reply.retries {
            retry.reason = self.redact_str(&retry.reason);
        }
    }

    /// A tool result made fit for the log.
    pub fn redact_result(&self, result: &mut ToolResult) {
        match &mut result.outcome {
            agent_core::ToolOutcome::Output(text) => *text = self.redact_str(text),
            agent_core::ToolOutcome::Error(e) => e.message = self.redact_str(&e.message),
        }
    }

    /// [`Redactor::redact_entries`], and each entry's JSON as written
    /// (`serde_json::to_vec` of the entry returned): the check for secrets encodes every
    /// entry anyway, and the store can write those bytes rather than encode them again
    /// ([`agent_store::Store::append_encoded`]). An entry that cannot be encoded has no
    /// bytes: the list is then empty, and the store encodes (and reports) it itself.
    pub fn redact_entries_encoded(&self, entries: Vec<Entry>) -> (Vec<Entry>, Vec<Vec<u8>>) {
        let mut encoded = Vec::with_capacity(entries.len());
        let mut whole = true;
        let redacted = entries
            .into_iter()
            .map(|entry| {
                let json = encode(&entry);
                let clean = (self.secrets.is_empty() && !self.formats)
                    || json.as_deref().is_some_and(|json| {
                        std::str::from_utf8(json).is_ok_and(|text| !self.may_hold_secrets(text))
                    });
                let (entry, json) = if clean {
                    (entry, json)
                } else {
                    let entry = self.redact_entry(entry);
                    let json = encode(&entry);
                    (entry, json)
                };
                match json {
                    Some(json) => encoded.push(json),
                    None => whole = false,
                }
                entry
            })
            .collect();
        if !whole {
            encoded.clear();
        }
        (redacted, encoded)
    }

    /// The last net before the log: every string redacted except call arguments (which
    /// already hold references, and must stay byte for byte what runs).
    pub fn redact_entries(&self, entries: Vec<Entry>) -> Vec<Entry> {
        self.redact_entries_encoded(entries).0
    }

    /// One entry with every string redacted but calls' arguments.
    fn redact_entry(&self, entry: Entry) -> Entry {
        let Ok(mut value) = serde_json::to_value(&entry) else {
            return entry;
        };
        // Most entries hold nothing to redact: they are kept as they are, without being
        // read back from JSON.
        if !self.redact_value(&mut value) {
            return entry;
        }
        serde_json::from_value(value).unwrap_or(entry)
    }

    /// Redacts every string of `value` but calls' arguments; whether anything changed.
    fn redact_value(&self, value: &mut Value) -> bool {
        match value {
            Value::String(s) => {
                let redacted = self.redact_str(s);
                let changed = redacted != *s;
                if changed {
                    *s = redacted;
                }
                changed
            }
            Value::Array(items) => items
                .iter_mut()
                .fold(false, |changed, v| self.redact_value(v) | changed),
            Value::Object(map) => map
                .iter_mut()
                .filter(|(key, _)| !matches!(key.as_str(), "arguments" | "secrets"))
                .fold(false, |changed, (_, v)| self.redact_value(v) | changed),
            _ => false,
        }
    }
}

/// JSON pointer escaping of one member name (RFC 6901).
fn escape_pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// A literal each credential pattern's match contains, in ASCII lower case (a superset:
/// the text is searched lowered), but the password of a URL's (see [`anchored`]): keep
/// it in step with [`patterns`]. `gh` stands for `gh[pousr]_`, checked where it is found
/// (it is common in words).
///
/// Lowered in ASCII only: the patterns that ignore case (`authorization`, `bearer`) hold
/// no letter whose other case is outside ASCII (as `k` and `s` have: `K`, `ſ`).
const ANCHORS: [&str; 9] = [
    "sk-",
    "gh",
    "github_pat_",
    "akia",
    "asia",
    "xox",
    "authorization",
    "bearer",
    "private key",
];

/// The quick check: [`ANCHORS`] searched for in the text lowered, each with a substring
/// search (SIMD). Built in microseconds, once per process (a runtime and its blob store
/// each make a redactor), where a regular expression of the same alternation in any case
/// took 0.4 ms of every run's start to build; and it scans in a third of that
/// expression's instructions, and a fifth of an Aho-Corasick automaton's that ignores
/// case.
#[derive(Debug)]
struct Anchors {
    finders: Vec<memchr::memmem::Finder<'static>>,
}

impl Anchors {
    fn get() -> &'static Anchors {
        static ONCE: std::sync::OnceLock<Anchors> = std::sync::OnceLock::new();
        ONCE.get_or_init(|| Anchors {
            finders: ANCHORS
                .iter()
                .map(|a| memchr::memmem::Finder::new(a.as_bytes()))
                .collect(),
        })
    }

    /// Whether `text`, in any ASCII case, holds one of [`ANCHORS`].
    fn found_in(&self, text: &str) -> bool {
        LOWERED.with_borrow_mut(|lowered| {
            lowered.clear();
            lowered.extend_from_slice(text.as_bytes());
            lowered.make_ascii_lowercase();
            let found = self.finders.iter().any(|finder| {
                if finder.needle() != b"gh" {
                    return finder.find(lowered).is_some();
                }
                finder.find_iter(lowered).any(|at| {
                    matches!(
                        &lowered[at + 2..],
                        [b'p' | b'o' | b'u' | b's' | b'r', b'_', ..]
                    )
                })
            });
            if lowered.capacity() > SCRATCH_KEPT {
                *lowered = Vec::new();
            }
            found
        })
    }
}

/// Whether `text` may hold a credential: one of [`ANCHORS`], or `://` with an `@` after
/// it, which the password of a URL needs. A URL alone (every run's first entry holds
/// the JSON Schema dialect's) is not enough to compile and run every pattern.
fn anchored(anchors: &Anchors, text: &str) -> bool {
    // An `@` is rare, and looked for first: `memrchr`, not a substring search.
    text.rfind('@').is_some_and(|at| text[..at].contains("://")) || anchors.found_in(text)
}

/// Whether `text` may assign a value to a name that holds a secret: a name
/// ([`agent_core::named_like_secret`]) just before one of its `=` (a superset of what
/// [`redact_assignments`] replaces: lines are not looked at, so that it holds of an
/// entry's JSON text, where a line break is written `\n`).
fn assigns_to_secret(text: &str) -> bool {
    memchr::memchr_iter(b'=', text.as_bytes()).any(|at| {
        let before = text[..at].trim_end_matches([' ', '\t', '"', '\'']);
        let name = &before[before
            .rfind(|c: char| !is_name_char(c))
            .map_or(0, |i| i + 1)..];
        !name.is_empty() && agent_core::named_like_secret(&name.replace(['.', '-'], "_"))
    })
}

/// A character of a name assigned to: `A-Z`, `a-z`, `0-9`, `_`, `.`, `-`.
fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')
}

/// `text` with the value of each assignment to a name that holds a secret replaced by
/// `[REDACTED]`, or `None` where there is none: a line `NAME=value` (a `.env` file, a
/// shell script, TOML, INI, Java properties, a compose file's `- NAME=value`), with
/// `export ` before it, spaces around the `=` and the value quoted or not, whose name is
/// named like a secret ([`agent_core::named_like_secret`]: `STRIPE_SECRET_KEY`,
/// `db.password`) and whose value is one word of 8 characters or more of those secrets are
/// written with, a letter and a digit among them: no number (`max_tokens = 200000000`), no
/// reference to another (`$VAR`, `${VAR}`), no code.
/// Code (`let api_key = load();`) is left alone: the name must begin its line, and the
/// value be no expression.
fn redact_assignments(text: &str) -> Option<String> {
    if !assigns_to_secret(text) {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut changed = false;
    for line in text.split_inclusive('\n') {
        match secret_value_in(line) {
            Some((start, end)) => {
                out.push_str(&line[..start]);
                out.push_str("[REDACTED]");
                out.push_str(&line[end..]);
                changed = true;
            }
            None => out.push_str(line),
        }
    }
    changed.then_some(out)
}

/// Where the secret value assigned on `line` lies (byte offsets), if it assigns one.
fn secret_value_in(line: &str) -> Option<(usize, usize)> {
    let mut rest = line.trim_start();
    for prefix in ["export ", "- "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest).trim_start();
    }
    let name_len = rest.find(|c: char| !is_name_char(c)).unwrap_or(rest.len());
    let (name, after) = rest.split_at(name_len);
    let after = after.trim_start_matches([' ', '\t']);
    let value = after.strip_prefix('=')?;
    if name.is_empty()
        || value.starts_with('=')
        || !agent_core::named_like_secret(&name.replace(['.', '-'], "_"))
    {
        return None;
    }
    let value = value.trim_start_matches([' ', '\t']);
    let (value, quote) = match value.chars().next() {
        Some(q @ ('"' | '\'')) => (&value[1..], Some(q)),
        _ => (value, None),
    };
    // A value is a word of the characters secrets are written with: no call, index or
    // statement of code (`usage["output_tokens"].as_u64();`); a quoted one is closed on
    // its line.
    let len = match quote {
        Some(q) => value.find(q)?,
        None => value
            .find(|c: char| c.is_whitespace() || c == '#')
            .unwrap_or(value.len()),
    };
    let secret = &value[..len];
    let start = line.len() - value.len();
    (secret.chars().count() >= 8
        && secret.chars().any(|c| c.is_ascii_digit())
        && secret.chars().any(|c| c.is_ascii_alphabetic())
        && secret
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_+/=.:@~%!*^&?".contains(c)))
    .then_some((start, start + len))
}

fn patterns() -> Vec<Pattern> {
    [
        // OpenAI (sk-, sk-proj-, sk-svcacct-) and Anthropic (sk-ant-api03-…) keys.
        (r"\bsk-(?:ant-|proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}", 0),
        // GitHub tokens.
        (r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}", 0),
        (r"\bgithub_pat_[A-Za-z0-9_]{22,}", 0),
        // AWS access key ids.
        (r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", 0),
        // Slack tokens.
        (r"\bxox[abposr]-[A-Za-z0-9-]{10,}", 0),
        // Authorization header values, with or without a scheme.
        (
            r"(?i)\b(?:proxy-)?authorization:[ \t]*(?:(?:bearer|basic|token|digest)[ \t]+)?([A-Za-z0-9._~+/-]{8,}=*)",
            1,
        ),
        // Bearer tokens anywhere.
        (r"(?i)\bbearer[ \t]+([A-Za-z0-9._~+/-]{16,}=*)", 1),
        // The password of a URL.
        (r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@]+:([^\s/?#@]+)@", 1),
        // A private key in PEM or OpenPGP armour (an SSH key, a TLS key, a GnuPG secret
        // key): its headers and body, to the end of the text where it was cut short.
        (
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----((?:\s|[A-Za-z][A-Za-z-]*:[^\n]*)*[A-Za-z0-9+/=\s]{16,})",
            1,
        ),
    ]
    .into_iter()
    .filter_map(|(re, group)| Regex::new(re).ok().map(|regex| Pattern { regex, group }))
    .collect()
}

/// Largest encoding buffer kept between entries: one huge entry does not pin its size.
const SCRATCH_KEPT: usize = 1 << 20;

thread_local! {
    /// The text the quick check searches, lowered.
    static LOWERED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The buffer entries are encoded into, reused so that an encoding does not grow its
    /// buffer by doubling from scratch each time.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An entry's JSON, in a buffer of its exact size.
fn encode(entry: &Entry) -> Option<Vec<u8>> {
    SCRATCH.with_borrow_mut(|buf| {
        buf.clear();
        let encoded = serde_json::to_writer(&mut *buf, entry)
            .ok()
            .map(|()| buf.to_vec());
        if buf.capacity() > SCRATCH_KEPT {
            *buf = Vec::new();
        }
        encoded
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A text referenced and expanded again is what it was; a reference to a name this
    /// process does not know, or an unclosed one, is left as written.
    #[test]
    fn referenced_text_expands_back_and_unknown_references_stay() {
        let r = Redactor::new([
            ("TOKEN_A".to_owned(), "value-of-a-123".to_owned()),
            ("TOKEN_B".to_owned(), "value-of-b-456".to_owned()),
        ]);
        let text = "dir/value-of-a-123/x-value-of-b-456-value-of-a-123.txt";
        let referenced = r.reference_str(text);
        assert_eq!(
            referenced,
            "dir/[secret:$TOKEN_A]/x-[secret:$TOKEN_B]-[secret:$TOKEN_A].txt"
        );
        assert_eq!(r.expand_str(&referenced), text);
        assert_eq!(
            r.expand_str("a/[secret:$OTHER]/[secret:$TOKEN_B]/[secret:$TOKEN_A"),
            "a/[secret:$OTHER]/value-of-b-456/[secret:$TOKEN_A"
        );
        assert!(matches!(
            r.expand_str("plain/path.txt"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    /// The quick check before an entry is redacted never skips one that holds something
    /// to redact: a sample of every credential format, and secrets JSON escapes.
    #[test]
    fn the_quick_check_sees_every_pattern_and_escaped_secrets() {
        let r = Redactor::new([
            ("QUOTED_TOKEN".to_owned(), "ab\"c\\d\ne-123456".to_owned()),
            ("PLAIN_KEY".to_owned(), "plainsecretvalue42".to_owned()),
        ]);
        assert_eq!(r.redact_str("fn main() {}"), "fn main() {}");
        // Every run's first entry holds a URL without a password: the JSON Schema dialect.
        let dialect = r#"{"$schema":"https://json-schema.org/draft/2020-12/schema"}"#;
        assert!(!r.may_hold_secrets(dialect));
        assert_eq!(r.redact_str(dialect), dialect);
        assert!(
            r.compiled.get().is_none(),
            "text without an anchor compiles no credential pattern"
        );
        let samples = [
            format!("key sk-proj-{}", "A1b2".repeat(6)),
            format!("token ghp_{}", "a1".repeat(16)),
            format!("github_pat_{}", "A_1".repeat(8)),
            // Written in pieces: this file itself goes through the redactor in a test.
            format!("id AKIA{}", "IOSFODNN7EXAMPLE"),
            format!("xoxb-{}", "1a".repeat(6)),
            format!("Authorization: Basic {}", "dXNlcjpwYXNzd29yZA=="),
            format!("bearer\t{}", "tok1".repeat(5)),
            format!("postgres://me:{}@db/x", "hunter2"),
            "the value ab\"c\\d\ne-123456 leaked".to_owned(),
            "plainsecretvalue42".to_owned(),
            format!(
                "{}\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU=\n",
                pem_begin("OPENSSH ")
            ),
        ];
        for sample in &samples {
            assert_ne!(
                &r.redact_str(sample),
                sample,
                "a sample that is redacted: {sample}"
            );
            let json = serde_json::to_string(&json!({ "content": sample })).unwrap();
            assert!(r.may_hold_secrets(&json), "{json}");
        }
        let clean = serde_json::to_string(&json!({"content": "fn main() {}\n"})).unwrap();
        assert!(!r.may_hold_secrets(&clean));
    }

    /// The value assigned to a name that holds a secret, on a line of its own (a `.env`
    /// file, a shell script, TOML, INI, properties, a compose file's list) is redacted,
    /// quoted or not, the rest of the line kept; a value that is short, has no digit or
    /// refers to another variable, a name that holds none, a comparison and code where
    /// the name does not begin the line are left alone. The quick check sees it in JSON.
    #[test]
    fn values_assigned_to_secret_names_are_redacted() {
        let r = Redactor::new([]);
        // Written with `{eq}`: this file itself goes through the redactor in a test.
        let eq = "=";
        let redacted = [
            (
                format!("STRIPE_SECRET_KEY{eq}rk_live_51H8x2"),
                "STRIPE_SECRET_KEY=[REDACTED]",
            ),
            (
                format!("export GH_TOKEN{eq}'abc123def456' # mine"),
                "export GH_TOKEN='[REDACTED]' # mine",
            ),
            (
                format!("  - POSTGRES_PASSWORD{eq}pg-2024-secret"),
                "  - POSTGRES_PASSWORD=[REDACTED]",
            ),
            (
                format!("db.password {eq} \"hunter2hunter2\""),
                "db.password = \"[REDACTED]\"",
            ),
            (format!("SMTP_PASS{eq}mail12345"), "SMTP_PASS=[REDACTED]"),
        ];
        for (line, expected) in &redacted {
            let text = format!("# settings\nDEBUG{eq}1\n{line}\nPORT{eq}8080\n");
            assert_eq!(
                r.redact_str(&text),
                format!("# settings\nDEBUG=1\n{expected}\nPORT=8080\n"),
                "{line}"
            );
            let json = serde_json::to_string(&json!({ "output": text })).unwrap();
            assert!(r.may_hold_secrets(&json), "{json}");
        }
        for kept in [
            format!("API_KEY{eq}changeme"),
            format!("API_KEY{eq}abc1"),
            format!("DB_PASSWORD{eq}${{DB_PASSWORD_2}}"),
            format!("DB_PASSWORD{eq}$SECRET_1"),
            format!("USER_NAME{eq}admin12345"),
            format!("if API_KEY {eq}{eq} 12345678; then"),
            format!("let api_key {eq} load(\"k12345678\");"),
            format!("    api_key: str {eq} field(default{eq}\"x1234567\")"),
            format!("self.output_tokens {eq} usage[\"output_tokens\"].as_u64().unwrap_or(0);"),
            format!("total_tokens {eq} 12345678;"),
            format!("max_tokens {eq} 200000000"),
            format!("API_KEY{eq}\"never closed 12345678"),
        ] {
            assert_eq!(r.redact_str(&kept), kept);
        }
        assert!(!r.may_hold_secrets(r#"{"output":"PORT=8080, x == y"}"#));
    }

    /// A key's first line, written in pieces: this file itself goes through the redactor.
    fn pem_begin(kind: &str) -> String {
        format!("-----BEGIN {kind}{}-----", "PRIVATE KEY")
    }

    /// A private key printed whole (an SSH key, a TLS key with its encryption headers, a
    /// GnuPG secret key) keeps its first and last lines and loses the rest; one cut short
    /// loses all after its first line; a text that only names the format is left alone.
    #[test]
    fn a_private_key_is_redacted_whole_or_cut_short() {
        let r = Redactor::new([]);
        let body =
            "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\nAAAAAAAAAAEAAAAzAAAAC3NzaC1lZDI1NTE5\n";
        for kind in ["OPENSSH ", "RSA ", "EC ", "ENCRYPTED ", ""] {
            let end = format!("-----END {kind}PRIVATE KEY-----");
            let key = format!("{}\n{body}{end}\n", pem_begin(kind));
            let text = format!("$ cat id\n{key}$ echo done\n");
            let redacted = r.redact_str(&text);
            assert_eq!(
                redacted,
                format!(
                    "$ cat id\n{}[REDACTED]{end}\n$ echo done\n",
                    pem_begin(kind)
                ),
                "{kind}"
            );
            let cut = format!("{}\n{}", pem_begin(kind), &body[..50]);
            assert_eq!(r.redact_str(&cut), format!("{}[REDACTED]", pem_begin(kind)));
        }
        let encrypted = format!(
            "{}\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,3F17F5316E2BAC89\n\n{body}",
            pem_begin("RSA ")
        );
        assert_eq!(
            r.redact_str(&encrypted),
            format!("{}[REDACTED]", pem_begin("RSA "))
        );
        let pgp = format!(
            "-----BEGIN PGP {}-----\n\nlQOYBGXhZ2kBCADx9k1Y2V\n=J4s1\n-----END PGP {0}-----",
            "PRIVATE KEY BLOCK"
        );
        assert!(!r.redact_str(&pgp).contains("lQOYBGXhZ2kBCADx9k1Y2V"));
        let named = format!(
            "a key starts with `{}` and 4 more lines",
            pem_begin("OPENSSH ")
        );
        assert_eq!(r.redact_str(&named), named);
    }

    /// The quick check matches its literals in ASCII case only: a superset of the patterns
    /// that ignore case, whose literals hold no letter with a case outside ASCII, and of
    /// the others, in any ASCII case.
    #[test]
    fn the_quick_check_ignores_ascii_case_and_misses_nothing_unicode_case_would_find() {
        let r = Redactor::new([]);
        for sample in [
            format!("AUTHORIZATION: {}", "dXNlcjpwYXNzd29yZA=="),
            format!("BeArEr {}", "tok1".repeat(5)),
        ] {
            assert_ne!(r.redact_str(&sample), sample);
            assert!(r.may_hold_secrets(&sample), "{sample}");
        }
        assert!(r.may_hold_secrets("SK-Proj GHP_ Xox AkIa"));
        for anchor in [
            "sk-",
            "GHO_",
            "gHs_",
            "GitHub_PAT_",
            "AKIA",
            "aSiA",
            "XOX",
            "Bearer",
        ] {
            assert!(r.may_hold_secrets(&format!("a {anchor} b")), "{anchor}");
        }
        // `gh` is common in words: only `gh[pousr]_` counts.
        assert!(!r.may_hold_secrets("the night was high; a ghost_ of ghx_ and gh"));
        // The letters of `authorization` and `bearer` have no other case outside ASCII (the
        // check is able to see one: `k` and `s` have).
        let letters = |set: &str| {
            let class = Regex::new(&format!("(?i)^[{set}]$")).unwrap();
            ('\u{80}'..=char::MAX)
                .filter(|c| class.is_match(c.encode_utf8(&mut [0; 4])))
                .collect::<Vec<char>>()
        };
        assert_eq!(letters("authorizationbearer"), Vec::<char>::new());
        assert_eq!(letters("ks"), vec!['\u{17f}', '\u{212a}']);
    }

    /// The encoded entries are the JSON of the entries as redacted: a clean entry's bytes
    /// from the check, a redacted one's encoded again; the same entries `redact_entries`
    /// gives.
    #[test]
    fn entries_come_back_with_the_json_of_what_is_written() {
        use agent_core::{Entry, Event, ModelErrorKind};
        let r = Redactor::new([("MY_TOKEN".to_owned(), "plainsecretvalue42".to_owned())]);
        let entry = |version: u64, message: &str| Entry {
            version,
            at_ms: 7,
            event: Event::ModelFailed {
                turn: 1,
                message: message.to_owned(),
                kind: ModelErrorKind::Other,
                usage: Default::default(),
            },
        };
        let entries = vec![
            entry(1, "nothing here"),
            entry(2, "the key plainsecretvalue42 leaked"),
            entry(3, "also clean"),
        ];
        let (redacted, encoded) = r.redact_entries_encoded(entries.clone());
        assert_eq!(redacted[0], entries[0], "a clean entry is kept as it is");
        assert!(
            matches!(&redacted[1].event, Event::ModelFailed { message, .. }
                if message == "the key [REDACTED:MY_TOKEN] leaked"),
            "{:?}",
            redacted[1]
        );
        assert_eq!(encoded.len(), 3);
        for (entry, json) in redacted.iter().zip(&encoded) {
            assert_eq!(&serde_json::to_vec(entry).unwrap(), json);
        }
        let (same, encoded) = Redactor::none().redact_entries_encoded(entries.clone());
        assert_eq!(same, entries);
        assert_eq!(encoded[1], serde_json::to_vec(&entries[1]).unwrap());
    }

    #[test]
    fn replaces_known_values_and_formats() {
        let r = Redactor::new([("OPENAI_API_KEY".to_owned(), "abc123secretvalue".to_owned())]);
        assert_eq!(
            r.redact_str("key=abc123secretvalue and x"),
            "key=[REDACTED:OPENAI_API_KEY] and x"
        );
        let bearer = format!("Bearer tok_{}9", "a".repeat(12));
        assert_eq!(
            r.redact_str(&format!("curl -H 'Authorization: {bearer}' url")),
            "curl -H 'Authorization: Bearer [REDACTED]' url"
        );
        assert_eq!(r.redact_str("nothing here"), "nothing here");
    }

    #[test]
    fn secret_names_are_the_contracts() {
        let vars = [
            ("OPENAI_API_KEY", "value-of-the-key-1"),
            ("GITHUB_TOKEN", "value-of-the-token-2"),
            ("db_password", "value-of-the-password-3"),
            ("MY_SECRET_THING", "value-of-the-secret-4"),
            ("HOME", "/home/someone/path"),
            ("SHORT_KEY", "tiny"),
        ];
        let r = Redactor::from_vars(vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        let text = vars.map(|(_, v)| v).join(" ");
        assert_eq!(
            r.redact_str(&text),
            "[REDACTED:OPENAI_API_KEY] [REDACTED:GITHUB_TOKEN] [REDACTED:db_password] \
             [REDACTED:MY_SECRET_THING] /home/someone/path tiny"
        );
    }

    #[test]
    fn a_call_keeps_a_reference_and_expands_byte_for_byte() {
        let r = Redactor::new([("API_TOKEN".to_owned(), "tok-9f8e7d6c5b4a".to_owned())]);
        let proposed = ToolCall::new(
            "c1",
            "shell",
            json!({"command": "curl -H 'X: tok-9f8e7d6c5b4a' u?t=tok-9f8e7d6c5b4a",
                   "tok-9f8e7d6c5b4a": ["tok-9f8e7d6c5b4a"]}),
        );
        let mut logged = proposed.clone();
        r.reference_call(&mut logged);
        let text = serde_json::to_string(&logged).unwrap();
        assert!(!text.contains("tok-9f8e7d6c5b4a"), "{text}");
        assert!(text.contains("[secret:$API_TOKEN]"), "{text}");
        let back: ToolCall = serde_json::from_str(&text).unwrap();
        assert_eq!(r.expand_call(&back).unwrap(), proposed);
        let err = Redactor::none().expand_call(&back).unwrap_err();
        assert_eq!(err.var, "API_TOKEN");
    }
}
