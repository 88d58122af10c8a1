//! The script model: every turn shape of CONTRACT §10, and clear errors for bad files.

use agent_core::{Decision, ModelReply, Prompt, ToolCall, Usage};
use agent_providers::{Model, ModelRequest, ProviderError, ScriptModel};
use serde_json::json;

fn prompt() -> Prompt {
    Prompt {
        system: String::new(),
        messages: vec![],
        tools: vec![],
        answer_schema: None,
    }
}

async fn answer(model: &ScriptModel, step: u32) -> Result<ModelReply, ProviderError> {
    model
        .decide(ModelRequest {
            prompt: &prompt(),
            step,
        })
        .await
}

#[tokio::test]
async fn every_turn_shape_becomes_its_decision() {
    let script = json!({"turns": [
        {"final": "text"},
        {"tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "a.txt"}}]},
        {"request_approval": {"summary": "may I?"}},
        {"request_approval": {"summary": "this?", "calls": [{"id": "w", "name": "write_file"}]}},
        {"clarification": "which?"},
        {"cannot_continue": "stuck"},
        {"invalid": "{half"},
        {"error": "503 from upstream"},
        {"final": "with usage", "usage": {"input_tokens": 12, "output_tokens": 3}}
    ]});
    let model = ScriptModel::from_json(&script.to_string()).unwrap();
    assert_eq!(model.len(), 9);
    assert_eq!(
        answer(&model, 0).await.unwrap().decision,
        Ok(Decision::Final {
            answer: "text".into()
        })
    );
    assert_eq!(
        answer(&model, 1).await.unwrap().decision,
        Ok(Decision::ToolCalls {
            calls: vec![ToolCall::new("c1", "read_file", json!({"path": "a.txt"}))]
        })
    );
    assert_eq!(
        answer(&model, 2).await.unwrap().decision,
        Ok(Decision::RequestApproval {
            summary: "may I?".into(),
            calls: vec![]
        })
    );
    assert_eq!(
        answer(&model, 3).await.unwrap().decision,
        Ok(Decision::RequestApproval {
            summary: "this?".into(),
            calls: vec![ToolCall::new("w", "write_file", json!({}))]
        })
    );
    assert_eq!(
        answer(&model, 4).await.unwrap().decision,
        Ok(Decision::Clarification {
            question: "which?".into()
        })
    );
    assert_eq!(
        answer(&model, 5).await.unwrap().decision,
        Ok(Decision::CannotContinue {
            reason: "stuck".into()
        })
    );
    let invalid = answer(&model, 6).await.unwrap().decision.unwrap_err();
    assert_eq!(invalid.raw, "{half");
    assert_eq!(
        answer(&model, 7).await.unwrap_err(),
        ProviderError::Scripted("503 from upstream".into())
    );
    assert_eq!(answer(&model, 8).await.unwrap().usage, Usage::tokens(12, 3));
    let exhausted = answer(&model, 9).await.unwrap_err();
    assert_eq!(exhausted.kind(), agent_core::ModelErrorKind::Exhausted);
    assert!(exhausted.to_string().contains("9 turn(s)"));
}

#[tokio::test(start_paused = true)]
async fn delay_ms_simulates_latency_on_the_runtime_clock() {
    let model = ScriptModel::from_json(r#"{"turns": [{"final": "x", "delay_ms": 1500}]}"#).unwrap();
    let before = tokio::time::Instant::now();
    answer(&model, 0).await.unwrap();
    assert_eq!(before.elapsed().as_millis(), 1500);
}

#[test]
fn bad_files_get_one_clear_line() {
    let cases = [
        ("not json", "not a script"),
        (r#"{"steps": []}"#, "unknown field `steps`"),
        (r#"{"turns": [42]}"#, "turn 1: a turn is an object"),
        (
            r#"{"turns": [{"final": "a"}, {"finl": "b"}]}"#,
            "turn 2: unknown field `finl`",
        ),
        (
            r#"{"turns": [{"final": "a", "error": "b"}]}"#,
            "exactly one of",
        ),
        (r#"{"turns": [{"delay_ms": 5}]}"#, "has 0"),
        (
            r#"{"turns": [{"tool_calls": [{"name": "x"}]}]}"#,
            "missing field `id`",
        ),
        (r#"{"turns": [{"final": "a", "usage": 3}]}"#, "invalid type"),
    ];
    for (text, expected) in cases {
        let err = ScriptModel::from_json(text).unwrap_err().to_string();
        assert!(err.contains(expected), "{text}: {err}");
        assert!(!err.contains('\n'), "one line: {err}");
    }
}

#[tokio::test]
async fn a_final_answer_may_be_any_json_value_given_as_its_text() {
    let script =
        ScriptModel::from_json(r#"{"turns": [{"final": {"total": 3}}, {"final": 3}]}"#).unwrap();
    for (step, expected) in [(0, "{\"total\":3}"), (1, "3")] {
        let reply = answer(&script, step).await.unwrap();
        assert_eq!(
            reply.decision,
            Ok(Decision::Final {
                answer: expected.into()
            })
        );
    }
}

#[test]
fn a_missing_file_names_the_path() {
    let err = ScriptModel::from_path("/nonexistent/script.json").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("script /nonexistent/script.json: cannot read it")
    );
}
