//! Policy: whether an intent may become an action without asking a person.
//!
//! Rules are `allow`, `ask` or `deny`, each matching a tool name (a glob such as
//! `mcp__github__*` works too) and optionally a pattern on the tool's main argument:
//! `write_file(src/**)`, `shell(git status*)`. Deny beats ask beats allow. Calls no rule
//! matches get the default of their risk: `read` is allowed, `write` and `external` ask.
//!
//! Patterns match what a call would really do ([`Subject`]): a path pattern matches the
//! workspace-relative path the tool would open (every spelling and link resolved), and a
//! command pattern matches one simple command of the command line. A compound command is
//! allowed only when each of its simple commands is allowed and none is denied; what a
//! matcher cannot see through (substitutions, `eval`, `sh -c`, output to a file) asks.

use std::fmt;

use agent_core::{Risk, ToolCall, ToolSpec, Verdict};
use globset::{GlobBuilder, GlobMatcher};

use crate::command_line::{Analysis, analyze};

/// What a rule's pattern is matched against: the meaning of the call's main argument.
#[derive(Clone, Debug)]
pub enum Subject {
    /// The tool has no main argument, or the call does not give it as a string.
    Nothing,
    /// A path: where it resolves in the workspace (`.`, `..`, links and absolute spellings
    /// resolved, `/`-separated, `.` for the root), and the spelling the model gave.
    Path {
        /// The workspace-relative path the tool would touch.
        resolved: String,
        /// The path as proposed, with `./` and repeated slashes dropped.
        given: String,
    },
    /// A shell command line and what it runs.
    Command {
        /// The line as proposed.
        line: String,
        /// Its simple commands and what is opaque in it.
        analysis: Analysis,
    },
    /// Any other main argument, matched as written.
    Text(String),
}

impl Subject {
    /// The subject of `call` without a workspace to resolve paths in: paths are matched as
    /// spelled (lexically cleaned). The gateway resolves them for real.
    pub fn of(spec: &ToolSpec, call: &ToolCall) -> Subject {
        let Some(arg) = spec.main_argument.as_deref() else {
            return Subject::Nothing;
        };
        let Some(value) = call.arguments.get(arg).and_then(|v| v.as_str()) else {
            return Subject::Nothing;
        };
        match arg {
            "command" => Subject::command(value),
            "path" => {
                let given = clean(value);
                Subject::Path {
                    resolved: given.clone(),
                    given,
                }
            }
            _ => Subject::Text(value.trim_start_matches("./").to_owned()),
        }
    }

    /// The subject of a command line.
    pub fn command(line: &str) -> Subject {
        Subject::Command {
            line: line.to_owned(),
            analysis: analyze(line),
        }
    }
}

/// A path spelling without `./` and repeated slashes (for matching as given).
pub(crate) fn clean(path: &str) -> String {
    if !path.is_empty() && path.split('/').all(|p| !p.is_empty() && p != ".") {
        // Already clean, as most paths are.
        return path.to_owned();
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.is_empty() {
        ".".to_owned()
    } else {
        parts.join("/")
    }
}

/// What a rule does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// Run without asking.
    Allow,
    /// Ask a person.
    Ask,
    /// Refuse; the model is told why.
    Deny,
}

impl Action {
    fn word(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Ask => "ask",
            Action::Deny => "deny",
        }
    }
}

/// A rule that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("policy rule {rule:?}: {problem}; write TOOL or TOOL(PATTERN), e.g. shell(git status*)")]
pub struct RuleError {
    /// The rule as written.
    pub rule: String,
    /// What is wrong.
    pub problem: String,
}

/// One rule.
#[derive(Clone, Debug)]
pub struct Rule {
    action: Action,
    text: String,
    tool: GlobMatcher,
    /// The pattern compiled for paths (`*` stops at `/`) and for commands.
    pattern: Option<(GlobMatcher, GlobMatcher)>,
    /// For a command pattern ending in ` *` (`rm *`), the command alone (`rm`) too.
    bare_command: Option<GlobMatcher>,
}

impl Rule {
    /// Parses `TOOL` or `TOOL(PATTERN)`.
    pub fn parse(action: Action, text: &str) -> Result<Rule, RuleError> {
        let fail = |problem: &str| RuleError {
            rule: text.to_owned(),
            problem: problem.to_owned(),
        };
        let text = text.trim();
        let (tool, pattern) = match text.split_once('(') {
            Some((tool, rest)) => {
                let Some(pattern) = rest.strip_suffix(')') else {
                    return Err(fail("a pattern opened with ( must end with )"));
                };
                if pattern.is_empty() {
                    return Err(fail("the pattern in () is empty"));
                }
                (tool.trim(), Some(pattern.to_owned()))
            }
            None => (text, None),
        };
        if tool.is_empty() {
            return Err(fail("no tool name"));
        }
        let tool = GlobBuilder::new(tool)
            .build()
            .map_err(|e| fail(&e.to_string()))?
            .compile_matcher();
        // Compiled here so a bad pattern fails at startup, not at the first call.
        let compile = |p: &str, literal_separator: bool| {
            GlobBuilder::new(p)
                .literal_separator(literal_separator)
                .build()
                .map(|g| g.compile_matcher())
                .map_err(|e| fail(&e.to_string()))
        };
        let bare_command = match pattern.as_deref().and_then(|p| p.strip_suffix(" *")) {
            Some(head) if !head.trim().is_empty() => Some(compile(head, false)?),
            _ => None,
        };
        let pattern = match pattern {
            Some(p) => Some((compile(&p, true)?, compile(&p, false)?)),
            None => None,
        };
        Ok(Rule {
            action,
            text: text.to_owned(),
            tool,
            pattern,
            bare_command,
        })
    }

    fn applies_to(&self, tool: &str) -> bool {
        self.tool.is_match(tool)
    }

    /// Whether this rule matches the whole call: it has no pattern, or its pattern matches
    /// the subject (for a command line: the whole line or any of its commands, direct or
    /// hidden; for a path: where it resolves, or, when `spelling_too`, how it was spelled).
    fn matches_any(&self, subject: &Subject, spelling_too: bool) -> bool {
        let Some((path_glob, command_glob)) = &self.pattern else {
            return true;
        };
        match subject {
            Subject::Nothing => false,
            Subject::Path { resolved, given } => {
                path_glob.is_match(resolved) || (spelling_too && path_glob.is_match(given))
            }
            Subject::Text(text) => path_glob.is_match(text),
            Subject::Command { line, analysis } => {
                command_glob.is_match(line) || analysis.all_texts().any(|t| self.matches_command(t))
            }
        }
    }

    /// Whether this rule's pattern matches one simple command's text.
    fn matches_command(&self, text: &str) -> bool {
        match &self.pattern {
            None => true,
            Some((_, command_glob)) => {
                command_glob.is_match(text)
                    || self.bare_command.as_ref().is_some_and(|g| g.is_match(text))
            }
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.action.word(), self.text)
    }
}

/// The policy of a run.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    rules: Vec<Rule>,
}

impl Policy {
    /// The contract's defaults only.
    pub fn new() -> Policy {
        Policy::default()
    }

    /// Adds a rule written as `TOOL` or `TOOL(PATTERN)`.
    pub fn add(&mut self, action: Action, text: &str) -> Result<&mut Policy, RuleError> {
        self.rules.push(Rule::parse(action, text)?);
        Ok(self)
    }

    /// The verdict for one call whose arguments already validated, its paths matched as
    /// spelled. The gateway calls [`Policy::judge`] with paths resolved in the workspace.
    pub fn verdict(&self, spec: &ToolSpec, call: &ToolCall) -> Verdict {
        self.judge(spec, &Subject::of(spec, call))
    }

    /// Whether an allow rule for `spec` that names what it may act on (not one for the
    /// whole tool) matches `subject`.
    pub fn allows_by_name(&self, spec: &ToolSpec, subject: &Subject) -> bool {
        self.rules.iter().any(|r| {
            r.action == Action::Allow
                && r.pattern.is_some()
                && r.applies_to(&spec.name)
                && r.matches_any(subject, false)
        })
    }

    /// The verdict for a call of `spec` whose main argument means `subject`.
    pub fn judge(&self, spec: &ToolSpec, subject: &Subject) -> Verdict {
        let rules: Vec<&Rule> = self
            .rules
            .iter()
            .filter(|r| r.applies_to(&spec.name))
            .collect();
        let of = |action: Action| rules.iter().copied().filter(move |r| r.action == action);
        // Deny wins for every alias and every command of the line, however hidden.
        if let Some(rule) = of(Action::Deny).find(|r| r.matches_any(subject, true)) {
            return Verdict::Deny {
                reason: format!("denied by policy rule `{rule}`"),
            };
        }
        if let Some(rule) = of(Action::Ask).find(|r| r.matches_any(subject, true)) {
            return Verdict::Ask {
                why: format!("policy rule `{rule}` asks"),
            };
        }
        if of(Action::Allow).any(|r| r.pattern.is_none()) {
            return Verdict::Allow;
        }
        let allows: Vec<&Rule> = of(Action::Allow).collect();
        if !allows.is_empty() {
            match subject {
                Subject::Command { analysis, .. } => {
                    if let Some(verdict) = command_allowed(&allows, analysis) {
                        return verdict;
                    }
                }
                other => {
                    if allows.iter().any(|r| r.matches_any(other, false)) {
                        return Verdict::Allow;
                    }
                }
            }
        }
        match spec.risk {
            Risk::Read => Verdict::Allow,
            risk => Verdict::Ask {
                why: format!(
                    "{} is {} {} tool, which asks by default (an allow rule for {} lets it run)",
                    spec.name,
                    if risk.as_str().starts_with(['a', 'e', 'i', 'o', 'u']) {
                        "an"
                    } else {
                        "a"
                    },
                    risk.as_str(),
                    spec.name
                ),
            },
        }
    }
}

/// Allow rules with patterns against a command line: allowed when every simple command is
/// allowed and nothing is opaque; `None` when no rule matches any of its commands (the
/// default applies).
fn command_allowed(allows: &[&Rule], analysis: &Analysis) -> Option<Verdict> {
    let allowed = |text: &str| allows.iter().any(|r| r.matches_command(text));
    let matched = analysis
        .commands
        .iter()
        .filter(|c| allowed(&c.text))
        .count();
    if matched == 0 {
        return None;
    }
    if let Some(why) = analysis.opaque.first() {
        return Some(Verdict::Ask {
            why: format!(
                "the command cannot be checked against the rules ({why}); a person must approve it"
            ),
        });
    }
    match analysis.commands.iter().find(|c| !allowed(&c.text)) {
        None => Some(Verdict::Allow),
        Some(c) => Some(Verdict::Ask {
            why: format!("`{}` is not allowed by any rule", c.text),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_spelling_is_cleaned_of_dots_and_repeated_slashes_and_a_clean_one_kept() {
        for (given, cleaned) in [
            ("a/b.txt", "a/b.txt"),
            ("a//b/./c", "a/b/c"),
            ("./a", "a"),
            ("a/", "a"),
            ("/abs/x", "abs/x"),
            ("a/../b", "a/../b"),
            (".", "."),
            ("", "."),
            ("./", "."),
        ] {
            assert_eq!(clean(given), cleaned, "{given:?}");
        }
    }

    fn spec(name: &str, risk: Risk, arg: Option<&str>) -> ToolSpec {
        let mut s = ToolSpec::new(name, "", json!({}), risk);
        s.main_argument = arg.map(str::to_owned);
        s
    }

    fn verdict(policy: &Policy, spec: &ToolSpec, args: serde_json::Value) -> Verdict {
        policy.verdict(spec, &ToolCall::new("c", spec.name.clone(), args))
    }

    #[test]
    fn defaults_follow_risk() {
        let p = Policy::new();
        assert_eq!(
            verdict(&p, &spec("read_file", Risk::Read, None), json!({})),
            Verdict::Allow
        );
        assert!(matches!(
            verdict(&p, &spec("write_file", Risk::Write, None), json!({})),
            Verdict::Ask { why } if why.contains("an allow rule for write_file")
        ));
        assert!(matches!(
            verdict(&p, &spec("shell", Risk::External, None), json!({})),
            Verdict::Ask { .. }
        ));
    }

    #[test]
    fn patterns_match_the_main_argument() {
        let write = spec("write_file", Risk::Write, Some("path"));
        let shell = spec("shell", Risk::External, Some("command"));
        let mut p = Policy::new();
        p.add(Action::Allow, "write_file(src/**)").unwrap();
        p.add(Action::Allow, "shell(git status*)").unwrap();
        assert_eq!(
            verdict(&p, &write, json!({"path": "src/a/b.rs"})),
            Verdict::Allow
        );
        assert_eq!(
            verdict(&p, &write, json!({"path": "./src/lib.rs"})),
            Verdict::Allow
        );
        assert!(matches!(
            verdict(&p, &write, json!({"path": "Cargo.toml"})),
            Verdict::Ask { .. }
        ));
        assert_eq!(
            verdict(&p, &shell, json!({"command": "git status --short"})),
            Verdict::Allow
        );
        assert!(matches!(
            verdict(&p, &shell, json!({"command": "git push"})),
            Verdict::Ask { .. }
        ));
        let mut one_level = Policy::new();
        one_level.add(Action::Allow, "write_file(src/*)").unwrap();
        assert!(matches!(
            verdict(&one_level, &write, json!({"path": "src/a/b.rs"})),
            Verdict::Ask { .. }
        ));
    }

    #[test]
    fn deny_beats_ask_beats_allow_whatever_the_order() {
        let shell = spec("shell", Risk::External, Some("command"));
        let mut p = Policy::new();
        p.add(Action::Deny, "shell(rm *)").unwrap();
        p.add(Action::Allow, "shell").unwrap();
        p.add(Action::Ask, "shell(git push*)").unwrap();
        assert_eq!(
            verdict(&p, &shell, json!({"command": "ls"})),
            Verdict::Allow
        );
        assert!(matches!(
            verdict(&p, &shell, json!({"command": "rm -rf /"})),
            Verdict::Deny { reason } if reason.contains("deny shell(rm *)")
        ));
        assert!(matches!(
            verdict(&p, &shell, json!({"command": "git push origin"})),
            Verdict::Ask { .. }
        ));
        let read = spec("read_file", Risk::Read, Some("path"));
        let mut p = Policy::new();
        p.add(Action::Deny, "read_file(secrets/**)").unwrap();
        assert!(matches!(
            verdict(&p, &read, json!({"path": "secrets/key"})),
            Verdict::Deny { .. }
        ));
        assert_eq!(
            verdict(&p, &read, json!({"path": "notes.txt"})),
            Verdict::Allow
        );
    }

    #[test]
    fn tool_globs_and_tools_without_a_main_argument() {
        let mcp = spec("mcp__github__create_issue", Risk::External, None);
        let mut p = Policy::new();
        p.add(Action::Allow, "mcp__github__*").unwrap();
        assert_eq!(verdict(&p, &mcp, json!({})), Verdict::Allow);
        let mut q = Policy::new();
        q.add(Action::Allow, "mcp__github__create_issue(x*)")
            .unwrap();
        assert!(
            matches!(verdict(&q, &mcp, json!({})), Verdict::Ask { .. }),
            "a pattern needs a main argument"
        );
    }

    #[test]
    fn bad_rules_are_refused_with_the_form() {
        for bad in ["", "shell(", "shell()", "(x)", "shell([)"] {
            let err = Rule::parse(Action::Allow, bad).unwrap_err();
            assert!(err.to_string().contains("TOOL(PATTERN)"), "{bad}: {err}");
        }
    }
}
