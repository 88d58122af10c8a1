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

fn main() {
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
    let cancel = CancellationToken::new();
    time(
        "execute (spawn, timeout, result shaping) of a no-op tool",
        N,
        || {
            let group = vec![vec![ScheduledCall {
                call: calls[0].clone(),
                risk: Risk::Read,
                effect_key: None,
            }]];
            black_box(rt.block_on(plain.execute("run", group, &cancel)));
        },
    );
}
