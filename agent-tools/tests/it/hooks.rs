//! External hooks with real scripts, and how their answers combine with policy.

use std::sync::Arc;
use std::time::Duration;

use agent_core::*;
use agent_tools::{Action, CommandHook, Gateway, HookEvent, Policy, Workspace};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notes.txt"), "hello\n").unwrap();
        Fixture { dir }
    }

    fn gateway(&self, hooks: Vec<CommandHook>) -> Gateway {
        let mut g = Gateway::with_builtins(Workspace::new(self.dir.path()).unwrap()).unwrap();
        for h in hooks {
            g = g.with_hook(Arc::new(h));
        }
        g
    }

    fn pre(&self, script: &str, matcher: Option<&str>) -> CommandHook {
        CommandHook::new(HookEvent::PreToolUse, script, matcher, self.dir.path()).unwrap()
    }

    async fn verdict(&self, g: &Gateway, call: ToolCall) -> Verdict {
        g.check("run-7", &[call]).await.remove(0).1
    }
}

fn read() -> ToolCall {
    ToolCall::new("c1", "read_file", json!({"path": "notes.txt"}))
}

fn write() -> ToolCall {
    ToolCall::new(
        "c2",
        "write_file",
        json!({"path": "out.txt", "content": "x"}),
    )
}

#[tokio::test]
async fn the_hook_gets_the_claude_code_shaped_input() {
    let f = Fixture::new();
    let g = f.gateway(vec![f.pre("cat > input.json", None)]);
    assert_eq!(f.verdict(&g, read()).await, Verdict::Allow);
    let input: Value =
        serde_json::from_str(&std::fs::read_to_string(f.dir.path().join("input.json")).unwrap())
            .unwrap();
    assert_eq!(input["hook_event_name"], "PreToolUse");
    assert_eq!(input["tool_name"], "read_file");
    assert_eq!(input["tool_input"], json!({"path": "notes.txt"}));
    assert_eq!(input["session_id"], "run-7");
    assert_eq!(input["tool_use_id"], "c1");
}

#[tokio::test]
async fn exit_0_leaves_the_policy_verdict() {
    let f = Fixture::new();
    let g = f.gateway(vec![f.pre("exit 0", None)]);
    assert_eq!(f.verdict(&g, read()).await, Verdict::Allow);
    assert!(
        matches!(f.verdict(&g, write()).await, Verdict::Ask { .. }),
        "a silent hook approves nothing"
    );
}

#[tokio::test]
async fn exit_2_denies_with_stderr_as_the_reason() {
    let f = Fixture::new();
    let g = f.gateway(vec![f.pre("echo 'no reading today' >&2; exit 2", None)]);
    assert_eq!(
        f.verdict(&g, read()).await,
        Verdict::Deny {
            reason: "no reading today".into()
        }
    );
}

#[tokio::test]
async fn json_answers_allow_deny_and_ask() {
    let f = Fixture::new();
    let answer = |decision: &str| {
        format!(
            "echo '{{\"hookSpecificOutput\": {{\"hookEventName\": \"PreToolUse\", \
             \"permissionDecision\": \"{decision}\", \"permissionDecisionReason\": \"because\"}}}}'"
        )
    };
    let g = f.gateway(vec![f.pre(&answer("deny"), None)]);
    assert_eq!(
        f.verdict(&g, read()).await,
        Verdict::Deny {
            reason: "because".into()
        }
    );
    let g = f.gateway(vec![f.pre(&answer("ask"), None)]);
    assert_eq!(
        f.verdict(&g, read()).await,
        Verdict::Ask {
            why: "because".into()
        }
    );
    let g = f.gateway(vec![f.pre(&answer("allow"), None)]);
    assert_eq!(
        f.verdict(&g, write()).await,
        Verdict::Allow,
        "a hook's allow answers policy's ask"
    );
    // The top-level form works too.
    let g = f.gateway(vec![
        f.pre(r#"echo '{"permissionDecision": "deny"}'"#, None),
    ]);
    assert!(matches!(f.verdict(&g, read()).await, Verdict::Deny { .. }));
}

#[tokio::test]
async fn a_hook_never_overrides_a_policy_denial() {
    let f = Fixture::new();
    let mut policy = Policy::new();
    policy.add(Action::Deny, "write_file").unwrap();
    let g = f
        .gateway(vec![f.pre(
            r#"touch ran; echo '{"permissionDecision": "allow"}'"#,
            None,
        )])
        .with_policy(policy);
    assert!(
        matches!(f.verdict(&g, write()).await, Verdict::Deny { reason } if reason.contains("policy rule"))
    );
    assert!(
        !f.dir.path().join("ran").exists(),
        "hooks do not run for denied calls"
    );
}

#[tokio::test]
async fn broken_hooks_fail_closed_naming_the_hook() {
    let f = Fixture::new();
    let mut slow = f.pre("sleep 30", None);
    slow.timeout = Duration::from_millis(200);
    let cases = [
        (slow, "timed out"),
        (f.pre("echo this is not json", None), "not JSON"),
        (f.pre("exit 1", None), "exit code 1"),
        (f.pre("kill -9 $$", None), "killed by a signal"),
        (
            f.pre(r#"echo '{"permissionDecision": "maybe"}'"#, None),
            "expected allow, deny or ask",
        ),
        (f.pre("/no/such/hook", None), "exit code 127"),
    ];
    for (hook, expected) in cases {
        let name = hook.command.clone();
        let g = f.gateway(vec![hook]);
        match f.verdict(&g, read()).await {
            Verdict::Deny { reason } => {
                assert!(reason.contains(expected), "{name}: {reason}");
                assert!(
                    reason.contains(&name),
                    "the reason names the hook: {reason}"
                );
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn matchers_choose_the_tools_a_hook_applies_to() {
    let f = Fixture::new();
    let g = f.gateway(vec![f.pre("exit 2", Some("write_file|edit_file"))]);
    assert_eq!(f.verdict(&g, read()).await, Verdict::Allow);
    assert!(matches!(f.verdict(&g, write()).await, Verdict::Deny { .. }));
}

#[tokio::test]
async fn post_hooks_see_the_response_and_may_add_a_note() {
    let f = Fixture::new();
    let post = CommandHook::new(
        HookEvent::PostToolUse,
        r#"cat > post.json; echo '{"hookSpecificOutput": {"additionalContext": "checked by lint"}}'"#,
        None,
        f.dir.path(),
    )
    .unwrap();
    let g = f.gateway(vec![post]);
    let call = ScheduledCall {
        call: read(),
        risk: Risk::Read,
        effect_key: None,
        path: None,
    };
    let results = g
        .execute("run-7", vec![vec![call]], &CancellationToken::new())
        .await;
    let text = results[0].content();
    assert!(
        text.contains("hello") && text.contains("checked by lint"),
        "{text}"
    );
    let input: Value =
        serde_json::from_str(&std::fs::read_to_string(f.dir.path().join("post.json")).unwrap())
            .unwrap();
    assert_eq!(input["hook_event_name"], "PostToolUse");
    assert_eq!(input["tool_response"]["output"], "     1\thello\n");
}

/// The whole exchange with a hook (its input included) is under its timeout: a hook that
/// does not read 300 KB of input and sleeps is timed out and denies, and what it started
/// is killed with it.
#[tokio::test]
async fn a_hook_that_neither_reads_nor_answers_is_timed_out_whole() {
    let f = Fixture::new();
    let mut hook = f.pre("sleep 30 & echo $! > sleeper.pid; sleep 30", None);
    hook.timeout = Duration::from_millis(300);
    let g = f.gateway(vec![hook]);
    let big = ToolCall::new(
        "c3",
        "write_file",
        json!({"path": "out.txt", "content": "y".repeat(300_000)}),
    );
    let verdict = f.verdict(&g, big).await;
    assert!(
        matches!(&verdict, Verdict::Deny { reason } if reason.contains("timed out after 300 ms")),
        "{verdict:?}"
    );
    let pid = std::fs::read_to_string(f.dir.path().join("sleeper.pid")).unwrap();
    let pid = pid.trim().to_owned();
    assert!(
        crate::more_builtins::eventually_gone(&pid),
        "the hook's background process {pid} was killed with it"
    );
}

/// A hook that answers without reading its input still counts.
#[tokio::test]
async fn a_hook_that_ignores_its_input_still_answers() {
    let f = Fixture::new();
    let g = f.gateway(vec![f.pre("echo 'not you' >&2; exit 2", None)]);
    let big = ToolCall::new(
        "c3",
        "write_file",
        json!({"path": "out.txt", "content": "y".repeat(300_000)}),
    );
    assert!(matches!(
        f.verdict(&g, big).await,
        Verdict::Deny { reason } if reason == "not you"
    ));
}
