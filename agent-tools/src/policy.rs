//! Policy: whether an intent may become an action without asking a person.
//!
//! Rules are `allow`, `ask` or `deny`, each matching a tool name (a glob such as
//! `mcp__github__*` works too) and optionally a pattern on the tool's main argument:
//! `write_file(src/**)`, `shell(git status*)`. Deny beats ask beats allow. Calls no rule
//! matches get the default of their risk: `read` is allowed, `write` and `external` ask.

use std::fmt;

use agent_core::{Risk, ToolCall, ToolSpec, Verdict};
use globset::{GlobBuilder, GlobMatcher};

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
        let pattern = match pattern {
            Some(p) => Some((compile(&p, true)?, compile(&p, false)?)),
            None => None,
        };
        Ok(Rule {
            action,
            text: text.to_owned(),
            tool,
            pattern,
        })
    }

    fn matches(&self, spec: &ToolSpec, call: &ToolCall) -> bool {
        if !self.tool.is_match(&call.name) {
            return false;
        }
        let Some((path_glob, command_glob)) = &self.pattern else {
            return true;
        };
        let Some(arg) = spec.main_argument.as_deref() else {
            return false;
        };
        let Some(value) = call.arguments.get(arg).and_then(|v| v.as_str()) else {
            return false;
        };
        // Commands match across `/`; paths do not (`src/*` is one level, `src/**` all).
        let is_path = arg != "command";
        let value = if is_path {
            value.trim_start_matches("./")
        } else {
            value
        };
        if is_path {
            path_glob.is_match(value)
        } else {
            command_glob.is_match(value)
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

    /// The verdict for one call whose arguments already validated.
    pub fn verdict(&self, spec: &ToolSpec, call: &ToolCall) -> Verdict {
        let strongest = self
            .rules
            .iter()
            .filter(|r| r.matches(spec, call))
            .max_by_key(|r| r.action);
        match strongest {
            Some(rule) => match rule.action {
                Action::Allow => Verdict::Allow,
                Action::Ask => Verdict::Ask {
                    why: format!("policy rule `{rule}` asks"),
                },
                Action::Deny => Verdict::Deny {
                    reason: format!("denied by policy rule `{rule}`"),
                },
            },
            None => match spec.risk {
                Risk::Read => Verdict::Allow,
                risk => Verdict::Ask {
                    why: format!(
                        "{} is a {} tool, which asks by default (allow it with --allow {})",
                        spec.name,
                        risk.as_str(),
                        spec.name
                    ),
                },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
            Verdict::Ask { why } if why.contains("--allow write_file")
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
