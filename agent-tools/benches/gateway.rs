//! Gateway overhead per call: schema validation, policy and in-process hooks (`check`),
//! and the execution wrapper around a tool that does nothing (`execute`).
//!
//! Run with `cargo bench -p agent-tools --bench gateway`.
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use agent_core::*;
use agent_tools::{
    Action, Gateway, Hook, HookCall, HookDecision, Policy, Tool, ToolContext, Workspace,
};
use async_trait::async_trait;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

struct Nop;

#[async_trait]
impl Tool for Nop {
    fn spec(&self) -> ToolSpec {
        let mut s = ToolSpec::new(
            "nop",
            "does nothing",
            json!({"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}},
                   "required": ["path"], "additionalProperties": false}),
            Risk::Read,
        );
        s.main_argument = Some("path".into());
        s
    }
    async fn call(&self, _: Value, _: &ToolContext) -> Result<String, ToolError> {
        Ok("ok".into())
    }
}

struct Audit;

#[async_trait]
impl Hook for Audit {
    fn name(&self) -> String {
        "audit".into()
    }
    async fn before(&self, _: &str, call: &HookCall<'_>) -> HookDecision {
        if call.call.arguments["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("secret"))
        {
            HookDecision::Deny("secret".into())
        } else {
            HookDecision::NoObjection
        }
    }
}

fn time<F: FnMut()>(label: &str, n: u32, mut f: F) {
    f();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..n {
            f();
        }
        best = best.min(start.elapsed().as_secs_f64());
    }
    println!(
        "gateway: {label}: {:.2} us per call",
        best * 1e6 / f64::from(n)
    );
}

/// Twenty rules of the kinds people write: paths and commands, allow, ask and deny.
fn twenty_rules() -> Policy {
    let mut p = Policy::new();
    for (action, rule) in [
        (Action::Deny, "read_file(secrets/**)"),
        (Action::Deny, "read_file(**/.env)"),
        (Action::Deny, "write_file(.git/**)"),
        (Action::Deny, "shell(rm *)"),
        (Action::Deny, "shell(git push*)"),
        (Action::Deny, "shell(curl *)"),
        (Action::Deny, "shell(sudo *)"),
        (Action::Ask, "shell(git commit*)"),
        (Action::Ask, "write_file(Cargo.toml)"),
        (Action::Ask, "edit_file(Cargo.toml)"),
        (Action::Allow, "write_file(src/**)"),
        (Action::Allow, "edit_file(src/**)"),
        (Action::Allow, "write_file(tests/**)"),
        (Action::Allow, "shell(git status*)"),
        (Action::Allow, "shell(git diff*)"),
        (Action::Allow, "shell(git log*)"),
        (Action::Allow, "shell(cargo test*)"),
        (Action::Allow, "shell(cargo build*)"),
        (Action::Allow, "shell(ls*)"),
        (Action::Allow, "shell(grep *)"),
    ] {
        p.add(action, rule).unwrap();
    }
    p
}

fn main() {
    // The parser's first use in the process, before anything warmed it.
    let start = Instant::now();
    black_box(agent_tools::command_line::analyze("git status && ls"));
    println!(
        "gateway: first command-line parse in the process: {:.1} us",
        start.elapsed().as_secs_f64() * 1e6
    );
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let plain = {
        let mut g = Gateway::new(Workspace::new(dir.path()).unwrap());
        g.register(Arc::new(Nop)).unwrap();
        g
    };
    let guarded = {
        let mut policy = Policy::new();
        policy.add(Action::Deny, "nop(secret/**)").unwrap();
        policy.add(Action::Ask, "nop(private/*)").unwrap();
        policy.add(Action::Allow, "nop(src/**)").unwrap();
        let mut g = Gateway::new(Workspace::new(dir.path()).unwrap())
            .with_policy(policy)
            .with_hook(Arc::new(Audit));
        g.register(Arc::new(Nop)).unwrap();
        g
    };
    let calls = [ToolCall::new(
        "c1",
        "nop",
        json!({"path": "src/lib.rs", "n": 3}),
    )];
    const N: u32 = 20_000;
    time("check (schema + default policy)", N, || {
        black_box(rt.block_on(plain.check("run", &calls)));
    });
    time("check (schema + 3 rules + 1 in-process hook)", N, || {
        black_box(rt.block_on(guarded.check("run", &calls)));
    });
    std::fs::create_dir_all(dir.path().join("src/deep")).unwrap();
    let ruled = Gateway::with_builtins(Workspace::new(dir.path()).unwrap())
        .unwrap()
        .with_policy(twenty_rules());
    let read = [ToolCall::new(
        "c1",
        "read_file",
        json!({"path": "./src/../src/deep/lib.rs"}),
    )];
    time(
        "check read_file (path resolved in the workspace + 20 rules)",
        N,
        || {
            black_box(rt.block_on(ruled.check("run", &read)));
        },
    );
    let shell = [ToolCall::new(
        "c1",
        "shell",
        json!({"command": "git status --short && cargo test -p agent-core 2>&1 | grep -v warning"}),
    )];
    time("check shell (parse 3 commands + 20 rules)", N, || {
        black_box(rt.block_on(ruled.check("run", &shell)));
    });
    let policy = twenty_rules();
    let spec = agent_tools::builtin::all()
        .into_iter()
        .map(|t| t.spec())
        .find(|s| s.name == "shell")
        .unwrap();
    let subject = agent_tools::Subject::command("git status --short && cargo test && ls -la");
    time(
        "policy alone: 20 rules against a parsed 3-command line",
        N,
        || {
            black_box(policy.judge(&spec, &subject));
        },
    );
    let cancel = CancellationToken::new();
    time(
        "execute (spawn, timeout, result shaping) of a no-op tool",
        N,
        || {
            let group = vec![vec![ScheduledCall {
                call: calls[0].clone(),
                risk: Risk::Read,
                effect_key: None,
                path: None,
            }]];
            black_box(rt.block_on(plain.execute("run", group, &cancel)));
        },
    );
}
