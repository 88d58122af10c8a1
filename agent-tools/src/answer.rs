//! The validators of a run's final answer (CONTRACT §2): a JSON Schema the answer, read as
//! JSON, must be valid against, and check commands run in the workspace with the answer on
//! stdin. A final answer completes a run only once it passed them all; what failed goes
//! back to the model, cut to a bound.

use std::path::PathBuf;
use std::time::Duration;

use agent_core::AnswerSpec;
use serde_json::Value;

/// How long a check command may take by default.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(120);

/// Characters of a rejection the model is shown at most: a check's output is cut in the
/// middle beyond this (the first and the last half kept, where compilers and test
/// runners put what matters).
pub const MAX_REJECTION_CHARS: usize = 2_000;

/// Schema errors listed at most in one rejection.
const MAX_SCHEMA_ERRORS: usize = 5;

/// What is wrong with an answer spec, found before any run starts.
#[derive(Debug, thiserror::Error)]
pub enum AnswerSpecError {
    /// The schema does not compile.
    #[error("the answer schema is not a valid JSON Schema: {0}")]
    Schema(String),
    /// Check commands were asked for without the `process` feature.
    #[error("answer check commands need agent-tools' `process` feature")]
    NoProcess,
}

/// The run's answer validators, ready to judge answers.
pub struct AnswerChecker {
    schema: Option<jsonschema::Validator>,
    checks: Vec<String>,
    cwd: PathBuf,
    timeout: Duration,
    /// Variables named like secrets that check commands are given all the same.
    passed: std::collections::BTreeSet<String>,
    /// The sandbox check commands run in, and the workspace it is made for.
    #[cfg(feature = "process")]
    sandbox: Option<(crate::Sandbox, crate::Workspace)>,
}

impl std::fmt::Debug for AnswerChecker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerChecker")
            .field("schema", &self.schema.is_some())
            .field("checks", &self.checks)
            .field("cwd", &self.cwd)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl AnswerChecker {
    /// The validators `spec` names; check commands run in `cwd` (the workspace root).
    pub fn new(
        spec: &AnswerSpec,
        cwd: impl Into<PathBuf>,
    ) -> Result<AnswerChecker, AnswerSpecError> {
        let schema = spec
            .schema
            .as_ref()
            .map(|schema| {
                jsonschema::validator_for(schema)
                    .map_err(|e| AnswerSpecError::Schema(e.to_string()))
            })
            .transpose()?;
        if !spec.checks.is_empty() && !cfg!(feature = "process") {
            return Err(AnswerSpecError::NoProcess);
        }
        Ok(AnswerChecker {
            schema,
            checks: spec.checks.clone(),
            cwd: cwd.into(),
            timeout: DEFAULT_CHECK_TIMEOUT,
            passed: std::collections::BTreeSet::new(),
            #[cfg(feature = "process")]
            sandbox: None,
        })
    }

    /// Runs check commands in `sandbox`, as `shell` commands in `workspace` run in it
    /// ([`crate::builtin::Shell::sandboxed`]): a check runs what the model left in the
    /// workspace (its tests, its build scripts), which must not do there what a command
    /// the model ran could not. Where the sandbox cannot be made, a check rejects the
    /// answer, saying why.
    #[cfg(feature = "process")]
    #[must_use]
    pub fn sandboxed(
        mut self,
        sandbox: crate::Sandbox,
        workspace: crate::Workspace,
    ) -> AnswerChecker {
        self.sandbox = Some((sandbox, workspace));
        self
    }

    /// Gives check commands these variables named like secrets, which they are not
    /// otherwise: a check runs what the model left in the workspace (its tests, its build
    /// scripts), and must not hand them the keys a `shell` command is not given either
    /// ([`crate::builtin::Shell::passing`]).
    pub fn passing(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> AnswerChecker {
        self.passed = names.into_iter().map(Into::into).collect();
        self
    }

    /// Gives each check command `timeout` (default [`DEFAULT_CHECK_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> AnswerChecker {
        self.timeout = timeout;
        self
    }

    /// Judges `answer`: `None` when it passes every validator, otherwise what failed first
    /// (the schema before the checks, the checks in order), as the model will be told.
    /// A check that cannot be run, or runs past its timeout, rejects (fail closed).
    pub async fn check(&self, run_id: &str, answer: &str) -> Option<String> {
        if let Some(validator) = &self.schema {
            let value = match answer_json(answer) {
                Ok(value) => value,
                Err(e) => {
                    return Some(format!(
                        "the answer must be JSON valid against the answer schema, and it is \
                         not JSON ({e}); reply with the JSON document alone"
                    ));
                }
            };
            let errors: Vec<String> = crate::gateway::schema_errors(validator, &value)
                .map(|(path, message)| format!("at {path}: {message}"))
                .collect();
            if !errors.is_empty() {
                let mut listed = errors
                    .iter()
                    .take(MAX_SCHEMA_ERRORS)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ");
                if errors.len() > MAX_SCHEMA_ERRORS {
                    listed.push_str(&format!("; and {} more", errors.len() - MAX_SCHEMA_ERRORS));
                }
                return Some(bounded(&format!(
                    "the answer does not match the answer schema: {listed}"
                )));
            }
        }
        for command in &self.checks {
            if let Some(problem) = self.run_check(command, run_id, answer).await {
                return Some(bounded(&problem));
            }
        }
        None
    }

    #[cfg(feature = "process")]
    async fn run_check(&self, command: &str, run_id: &str, answer: &str) -> Option<String> {
        use crate::command_hook::{Answer, run_command};
        let env = [("AGENT_RUN_ID", run_id)];
        let withheld = crate::process::withheld_here(|name| self.passed.contains(name));
        let input = answer.as_bytes().to_vec();
        let spec = match &self.sandbox {
            Some((sandbox, ws)) => Some(sandbox.spec_apart(ws).await),
            None => None,
        };
        let spec = match spec {
            Some(Err(why)) => {
                return Some(format!(
                    "the check `{command}` could not judge the answer ({why}); the answer \
                     is rejected"
                ));
            }
            Some(Ok(spec)) => Some(spec),
            None => None,
        };
        let kept_from = crate::process::KeptFrom {
            unset: &withheld,
            sandbox: spec.as_deref(),
        };
        match run_command(command, &self.cwd, &env, kept_from, input, self.timeout).await {
            Answer::Exited { code: Some(0), .. } => None,
            Answer::Exited {
                code,
                stdout,
                stderr,
            } => {
                let code =
                    code.map_or_else(|| "killed by a signal".to_owned(), |c| format!("exit {c}"));
                let output = [stdout, stderr]
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join("\n");
                let output = if output.is_empty() {
                    "(no output)".to_owned()
                } else {
                    output
                };
                Some(format!(
                    "the check `{command}` rejected the answer ({code}):\n{output}"
                ))
            }
            Answer::Failed(why) => Some(format!(
                "the check `{command}` could not judge the answer ({why}); the answer is \
                 rejected"
            )),
        }
    }

    #[cfg(not(feature = "process"))]
    async fn run_check(&self, command: &str, _: &str, _: &str) -> Option<String> {
        Some(format!(
            "the check `{command}` cannot run without the `process` feature; the answer is \
             rejected"
        ))
    }
}

/// The answer read as JSON: the whole text, or the one fenced code block it consists of
/// (```` ```json … ``` ````), as models often wrap it.
pub fn answer_json(answer: &str) -> Result<Value, serde_json::Error> {
    let text = answer.trim();
    let inner = text
        .strip_prefix("```")
        .and_then(|rest| rest.strip_suffix("```"))
        .map(|body| {
            // The info string (`json`) ends at the first line break.
            body.split_once('\n').map_or(body, |(info, code)| {
                if info.trim().chars().all(|c| c.is_ascii_alphanumeric()) {
                    code
                } else {
                    body
                }
            })
        });
    serde_json::from_str(inner.unwrap_or(text).trim())
}

/// `text` cut to [`MAX_REJECTION_CHARS`], its middle left out.
fn bounded(text: &str) -> String {
    let chars = text.chars().count();
    if chars <= MAX_REJECTION_CHARS {
        return text.to_owned();
    }
    let half = MAX_REJECTION_CHARS / 2;
    let head: String = text.chars().take(half).collect();
    let tail: String = text.chars().skip(chars - half).collect();
    format!(
        "{head}\n… ({} characters left out) …\n{tail}",
        chars - 2 * half
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema_checker() -> AnswerChecker {
        let spec = AnswerSpec {
            schema: Some(json!({
                "type": "object",
                "required": ["total"],
                "properties": {"total": {"type": "integer"}, "unit": {"enum": ["eur", "usd"]}}
            })),
            checks: Vec::new(),
        };
        AnswerChecker::new(&spec, ".").unwrap()
    }

    fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn json_is_read_whole_or_from_one_fenced_block() {
        assert_eq!(answer_json(" {\"a\": 1} ").unwrap(), json!({"a": 1}));
        assert_eq!(
            answer_json("```json\n{\"a\": 1}\n```").unwrap(),
            json!({"a": 1})
        );
        assert_eq!(answer_json("```\n[1]\n```").unwrap(), json!([1]));
        assert!(answer_json("The total is {\"a\": 1}").is_err());
        assert!(answer_json("```json\n{\"a\": 1}\n``` and more").is_err());
    }

    #[test]
    fn a_schema_rejects_text_and_names_the_path_of_what_fails() {
        let checker = schema_checker();
        assert_eq!(
            block_on(checker.check("r", "{\"total\": 3, \"unit\": \"eur\"}")),
            None
        );
        let not_json = block_on(checker.check("r", "three euros")).unwrap();
        assert!(not_json.contains("not JSON"), "{not_json}");
        let wrong = block_on(checker.check("r", "{\"total\": \"3\", \"unit\": \"gbp\"}")).unwrap();
        assert!(wrong.contains("at /total:"), "{wrong}");
        assert!(wrong.contains("at /unit:"), "{wrong}");
        let missing = block_on(checker.check("r", "{}")).unwrap();
        assert!(
            missing.contains("at /:") && missing.contains("total"),
            "{missing}"
        );
    }

    #[test]
    fn a_schema_that_does_not_compile_is_refused_up_front() {
        let spec = AnswerSpec {
            schema: Some(json!({"type": "no such type"})),
            checks: Vec::new(),
        };
        let err = AnswerChecker::new(&spec, ".").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("the answer schema is not a valid JSON Schema")
        );
    }

    #[test]
    fn long_rejections_keep_their_head_and_tail() {
        let text = format!("HEAD{}TAIL", "x".repeat(10_000));
        let cut = bounded(&text);
        assert!(cut.starts_with("HEAD") && cut.ends_with("TAIL"));
        assert!(cut.chars().count() < MAX_REJECTION_CHARS + 100);
        assert!(cut.contains("characters left out"));
    }

    #[cfg(feature = "process")]
    mod commands {
        use super::*;

        fn checker(checks: &[&str], dir: &std::path::Path) -> AnswerChecker {
            let spec = AnswerSpec {
                schema: None,
                checks: checks.iter().map(|c| (*c).to_owned()).collect(),
            };
            AnswerChecker::new(&spec, dir).unwrap()
        }

        #[test]
        fn a_check_sees_the_answer_on_stdin_and_the_run_id_in_its_environment() {
            let dir = tempfile::tempdir().unwrap();
            let c = checker(
                &[
                    r#"read -r line; [ "$line" = "yes" ] && [ "$AGENT_RUN_ID" = "run-7" ] && [ -f marker ]"#,
                ],
                dir.path(),
            );
            std::fs::write(dir.path().join("marker"), "").unwrap();
            assert_eq!(block_on(c.check("run-7", "yes")), None);
            assert!(block_on(c.check("run-8", "yes")).is_some());
            assert!(block_on(c.check("run-7", "no")).is_some());
        }

        #[test]
        fn a_failing_check_gives_its_output_and_exit_code() {
            let dir = tempfile::tempdir().unwrap();
            let c = checker(&["true", "echo 'expected 4 items' >&2; exit 3"], dir.path());
            let problem = block_on(c.check("r", "x")).unwrap();
            assert!(problem.contains("(exit 3)"), "{problem}");
            assert!(problem.contains("expected 4 items"), "{problem}");
        }

        #[test]
        fn a_check_past_its_timeout_rejects_and_is_killed() {
            let dir = tempfile::tempdir().unwrap();
            let c = checker(&["sleep 30"], dir.path()).with_timeout(Duration::from_millis(200));
            let problem = block_on(c.check("r", "x")).unwrap();
            assert!(problem.contains("timed out"), "{problem}");
            assert!(problem.contains("rejected"), "{problem}");
        }

        #[test]
        fn a_check_that_cannot_start_rejects() {
            let c = checker(&["true"], std::path::Path::new("/nonexistent/dir"));
            let problem = block_on(c.check("r", "x")).unwrap();
            assert!(problem.contains("could not judge"), "{problem}");
        }
    }
}
