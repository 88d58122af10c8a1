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
    model.decide(ModelRequest::new(&prompt(), step)).await
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
        (
            r#"[{"final": "a"}]"#,
            r#"not a script (an array); put the turns in an object: {"turns": [TURN, ...]}"#,
        ),
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

/// A script path may come from a project's `agent.toml` or a run's log: one that is not a
/// regular file is refused at once, not waited on (a FIFO) or read without end (a device).
#[cfg(unix)]
#[test]
fn a_script_is_read_only_from_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("script.json");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let target = dir.path().join("link.json");
    std::os::unix::fs::symlink("/dev/zero", &target).unwrap();
    for path in [fifo.as_path(), target.as_path(), dir.path()] {
        let err = ScriptModel::from_path(path).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "script {}: is not a regular file (a FIFO, a device or a directory); a script \
                 is read from a file: write it to one",
                path.display()
            )
        );
    }
    // A link to a regular file is read as the file.
    let file = dir.path().join("real.json");
    std::fs::write(&file, r#"{"turns": [{"final": "a"}]}"#).unwrap();
    let link = dir.path().join("to-real.json");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    assert!(ScriptModel::from_path(&link).is_ok());
}

/// A script with `n` one-call turns and a final answer, and a sub-agent's script, as text
/// with line breaks between its turns (what a person writes).
fn long_script(n: usize) -> String {
    let mut turns: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            json!({"tool_calls": [{"id": format!("c{i}"), "name": "read_file",
                "arguments": {"path": format!("data/f{i}.txt")}}]})
        })
        .collect();
    turns.push(json!({"final": "done"}));
    let agents = json!({"peek": {"turns": [{"final": "from the sub-agent"}]}});
    format!(
        "{{\"agents\": {agents},\n \"turns\": [\n  {}\n]}}\n",
        turns
            .iter()
            .map(serde_json::Value::to_string)
            .collect::<Vec<_>>()
            .join(",\n  ")
    )
}

/// The decision turn `i` of [`long_script`] makes.
fn read_of(i: usize) -> Decision {
    Decision::ToolCalls {
        calls: vec![ToolCall::new(
            format!("c{i}"),
            "read_file",
            json!({"path": format!("data/f{i}.txt")}),
        )],
    }
}

/// A 1,500-turn script written to a file (kept while the directory lives), its text, and
/// the model read from the file.
struct LongScript {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    text: String,
    model: ScriptModel,
}

fn long_script_file() -> LongScript {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("script.json");
    let text = long_script(1_500);
    assert!(text.len() > 100_000, "{} bytes", text.len());
    std::fs::write(&path, &text).unwrap();
    let model = ScriptModel::from_path(&path).unwrap();
    LongScript {
        _dir: dir,
        path,
        text,
        model,
    }
}

async fn answer_as(model: &ScriptModel, goal: &str) -> Result<ModelReply, ProviderError> {
    let prompt = Prompt {
        messages: vec![agent_core::Message::user_text(goal)],
        ..prompt()
    };
    model.decide(ModelRequest::new(&prompt, 0)).await
}

/// A script file too long to hold in memory for a run is played from the file: every turn,
/// and a sub-agent's, as the same text given inline plays it.
#[tokio::test]
async fn a_long_script_file_plays_as_its_text_does() {
    let LongScript {
        _dir,
        text,
        model: from_file,
        ..
    } = long_script_file();
    let inline = ScriptModel::from_json(&text).unwrap();
    assert_eq!(from_file.len(), 1_501);
    for step in [0, 1, 749, 1_499, 1_500] {
        let played = answer(&from_file, step).await.unwrap();
        assert_eq!(played, answer(&inline, step).await.unwrap(), "turn {step}");
    }
    assert_eq!(
        answer(&from_file, 749).await.unwrap().decision,
        Ok(read_of(749))
    );
    assert_eq!(
        answer_as(&from_file, "peek").await.unwrap().decision,
        Ok(Decision::Final {
            answer: "from the sub-agent".into()
        })
    );
    let exhausted = answer(&from_file, 1_501).await.unwrap_err();
    assert_eq!(exhausted.kind(), agent_core::ModelErrorKind::Exhausted);
}

/// A long script file is read turn by turn: a turn changed after the script was checked
/// (the same length, other text) or cut off is refused in words, never played.
#[cfg(unix)]
#[tokio::test]
async fn a_long_script_file_changed_after_it_was_read_is_refused() {
    use std::os::unix::fs::FileExt;
    let LongScript {
        _dir,
        path,
        text,
        model,
    } = long_script_file();
    // "f700.txt" becomes "f799.txt" in place.
    let at = text.find("data/f700.txt").unwrap() + "data/f7".len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(b"99", at as u64).unwrap();
    let changed = answer(&model, 700).await.unwrap_err().to_string();
    assert!(
        changed.contains("turn 701 of script") && changed.contains("the file changed"),
        "{changed}"
    );
    // The turns around it are as they were.
    assert!(answer(&model, 699).await.is_ok());
    assert!(answer(&model, 701).await.is_ok());
    file.set_len(u64::try_from(text.len() / 2).unwrap())
        .unwrap();
    // Turn 11 is read again (it lies before what was read last), with what follows it up
    // to the file's new end; turn 1401 lies past that end.
    assert!(answer(&model, 10).await.is_ok());
    let cut = answer(&model, 1_400).await.unwrap_err().to_string();
    assert!(cut.contains("turn 1401 of script"), "{cut}");
}

/// One read of a long script file serves the turns that follow the one played: a turn
/// already read plays as it was checked, whatever the file holds since.
#[cfg(unix)]
#[tokio::test]
async fn a_long_script_file_is_read_ahead_not_once_a_turn() {
    use std::os::unix::fs::FileExt;
    let LongScript {
        _dir,
        path,
        text,
        model,
    } = long_script_file();
    assert!(answer(&model, 0).await.is_ok());
    let at = text.find("data/f5.txt").unwrap() + "data/f".len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(b"6", at as u64).unwrap();
    assert_eq!(answer(&model, 5).await.unwrap().decision, Ok(read_of(5)));
}
