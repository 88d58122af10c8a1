//! The translators on recorded traffic of the real APIs, no network.

use agent_core::*;
use agent_providers::Thinking;
use agent_providers::wire::{anthropic, ollama, openai, responses};
use serde_json::json;

use crate::{fixture, sse};

fn openai_stream(name: &str) -> ModelReply {
    let mut s = openai::Stream::default();
    for (_, data) in sse(&fixture(name)) {
        s.push(&data).unwrap();
    }
    assert!(s.is_done(), "{name} ends with [DONE]");
    s.finish().decide()
}

/// What a Chat Completions stream of `chunks` (then `[DONE]`) decides.
fn openai_chunks(chunks: &[serde_json::Value]) -> ModelReply {
    let mut s = openai::Stream::default();
    for chunk in chunks {
        s.push(&chunk.to_string()).unwrap();
    }
    s.push("[DONE]").unwrap();
    assert!(s.is_done());
    s.finish().decide()
}

fn anthropic_stream(name: &str) -> (ModelReply, bool) {
    let mut s = anthropic::Stream::default();
    for (event, data) in sse(&fixture(name)) {
        s.push(&event, &data).unwrap();
    }
    let done = s.is_done();
    (s.finish().decide(), done)
}

#[test]
fn openai_single_tool_call_from_fragments() {
    let reply = openai_stream("openai/single_tool.sse");
    let Ok(Decision::ToolCalls { calls }) = reply.decision else {
        panic!("{:?}", reply.decision)
    };
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].id.as_str(), "call_c91SqDXlYFuETYv8mUHzz6pp");
    assert_eq!(calls[0].name, "GetWeatherArgs");
    assert_eq!(calls[0].arguments["city"], "Edinburgh");
}

#[test]
fn openai_parallel_tool_calls_by_index() {
    let reply = openai_stream("openai/parallel_tools.sse");
    let Ok(Decision::ToolCalls { calls }) = reply.decision else {
        panic!("{:?}", reply.decision)
    };
    assert_eq!(calls.len(), 2);
    assert_ne!(calls[0].id, calls[1].id);
    assert!(calls.iter().all(|c| c.arguments.is_object()));
}

#[test]
fn openai_text_only_is_a_final_answer_and_strict_tools_parse() {
    let reply = openai_stream("openai/text_only.sse");
    let Ok(Decision::Final { answer }) = &reply.decision else {
        panic!("{:?}", reply.decision)
    };
    assert!(!answer.is_empty());
    for name in ["openai/strict_tool.sse", "openai/nonstrict_tool.sse"] {
        assert!(
            matches!(openai_stream(name).decision, Ok(Decision::ToolCalls { .. })),
            "{name}"
        );
    }
}

#[test]
fn anthropic_tool_use_with_json_fragments_and_usage() {
    let (reply, done) = anthropic_stream("anthropic/tool_use_response.txt");
    assert!(done);
    let Ok(Decision::ToolCalls { calls }) = &reply.decision else {
        panic!("{:?}", reply.decision)
    };
    assert_eq!(calls[0].id.as_str(), "toolu_01NRLabsLyVHZPKxbKvkfSMn");
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(calls[0].arguments["location"], "Paris");
    assert_eq!(reply.usage.input_tokens, 377);
    assert!(
        reply.usage.output_tokens > 1,
        "message_delta updates the output tokens"
    );
}

#[test]
fn anthropic_text_only_is_final() {
    let (reply, done) = anthropic_stream("anthropic/basic_response.txt");
    assert!(done);
    assert!(
        matches!(reply.decision, Ok(Decision::Final { .. })),
        "{:?}",
        reply.decision
    );
}

#[test]
fn anthropic_max_tokens_inside_a_tool_call_is_invalid_not_truncated() {
    let (reply, _) = anthropic_stream("anthropic/incomplete_partial_json_response.txt");
    let Err(invalid) = reply.decision else {
        panic!("{:?}", reply.decision)
    };
    assert!(
        invalid.problem.contains("output limit"),
        "{}",
        invalid.problem
    );
}

#[test]
fn anthropic_invalid_tool_json_is_invalid_with_the_raw_text_kept() {
    let (reply, _) = anthropic_stream("anthropic/tool_use_invalid_json_response.txt");
    let Err(invalid) = reply.decision else {
        panic!("{:?}", reply.decision)
    };
    assert!(
        invalid.problem.contains("not valid JSON"),
        "{}",
        invalid.problem
    );
    assert!(!invalid.raw.is_empty());
}

#[test]
fn anthropic_block_out_of_order_does_not_break_assembly() {
    let (reply, done) = anthropic_stream("anthropic/out_of_order_response.txt");
    assert!(done);
    // A lone empty text block at index 1: an empty reply, which is an invalid decision
    // the model is asked to repair, not a crash.
    let Err(invalid) = reply.decision else {
        panic!("{:?}", reply.decision)
    };
    assert_eq!(invalid.problem, "the reply is empty");
    assert_eq!(reply.usage.input_tokens, 11);
    let mut s = anthropic::Stream::default();
    assert!(s.push("ping", "{}").unwrap().is_none());
    assert!(
        s.push("brand_new_event", "not json").unwrap().is_none(),
        "unknown events are ignored"
    );
    let err = s
        .push(
            "error",
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        )
        .unwrap_err();
    assert!(err.to_string().contains("overloaded_error"), "{err}");
    assert_eq!(err.kind(), ModelErrorKind::Server);
    assert!(err.is_retryable());
}

#[test]
fn mid_stream_errors_are_classified_by_their_type() {
    let anthropic_error = |kind: &str| {
        anthropic::Stream::default()
            .push(
                "error",
                &format!(r#"{{"type":"error","error":{{"type":"{kind}","message":"m"}}}}"#),
            )
            .unwrap_err()
    };
    for (kind, expected, retryable) in [
        ("rate_limit_error", ModelErrorKind::RateLimited, true),
        ("overloaded_error", ModelErrorKind::Server, true),
        ("api_error", ModelErrorKind::Server, true),
        ("authentication_error", ModelErrorKind::Auth, false),
        ("permission_error", ModelErrorKind::Auth, false),
        ("not_found_error", ModelErrorKind::NotFound, false),
        ("invalid_request_error", ModelErrorKind::BadRequest, false),
        ("something_new", ModelErrorKind::BadRequest, false),
    ] {
        let err = anthropic_error(kind);
        assert_eq!(
            (err.kind(), err.is_retryable()),
            (expected, retryable),
            "{kind}"
        );
    }
    // OpenAI names the class in `type` or `code`; exhausted quota is not worth a retry.
    let openai_error = |error: &str| {
        openai::Stream::default()
            .push(&format!(r#"{{"error":{error}}}"#))
            .unwrap_err()
    };
    let quota = openai_error(r#"{"code":"insufficient_quota","message":"pay"}"#);
    assert_eq!(quota.kind(), ModelErrorKind::BadRequest);
    let limited = openai_error(r#"{"type":"rate_limit_exceeded","message":"slow"}"#);
    assert_eq!(limited.kind(), ModelErrorKind::RateLimited);
    let garbled = openai::Stream::default().push("{not json").unwrap_err();
    assert_eq!(garbled.kind(), ModelErrorKind::Decode);
}

#[test]
fn openai_compatible_quirks() {
    // Ollama: a tool call whole in one chunk; llama.cpp: ids without `call_`, arguments in the
    // first chunk.
    let mut s = openai::Stream::default();
    s.push(r#"{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"7","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a.txt\"}"}}]}}]}"#).unwrap();
    s.push(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#)
        .unwrap();
    s.push("[DONE]").unwrap();
    let Ok(Decision::ToolCalls { calls }) = s.finish().decide().decision else {
        panic!()
    };
    assert_eq!(
        (calls[0].id.as_str(), calls[0].arguments["path"].as_str()),
        ("7", Some("a.txt"))
    );
    // `length` with tool calls present: the call is cut, so the reply is invalid.
    let mut s = openai::Stream::default();
    s.push(r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"x","function":{"name":"write_file","arguments":"{\"path\":\"a\",\"content\":\"lo"}}]},"finish_reason":"length"}]}"#).unwrap();
    s.push("[DONE]").unwrap();
    let Err(invalid) = s.finish().decide().decision else {
        panic!()
    };
    assert!(invalid.problem.contains("output limit"));
    // Usage arrives in a last chunk with no choices.
    let mut s = openai::Stream::default();
    s.push(r#"{"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#)
        .unwrap();
    s.push(r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3}}"#)
        .unwrap();
    assert_eq!(s.finish().decide().usage, Usage::tokens(12, 3));
}

/// Servers that give tool calls no id (builds of llama.cpp's server, LM Studio, Gemini's
/// OpenAI-compatible endpoint: `""`, or no `id` at all): each call gets one made from it
/// and its place in the reply, the same for the same reply, streamed or whole, and never
/// shared by two calls of one reply; an id the server gave is kept.
#[test]
fn calls_without_ids_get_ids_of_their_own() {
    let ids = |reply: ModelReply| -> Vec<String> {
        let Ok(Decision::ToolCalls { calls }) = reply.decision else {
            panic!("{:?}", reply.decision)
        };
        calls.iter().map(|c| c.id.as_str().to_owned()).collect()
    };
    let body = json!({"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[
        {"id":"","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a.txt\"}"}},
        {"type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a.txt\"}"}},
        {"id":"call_given","type":"function","function":{"name":"list_dir","arguments":"{}"}}
    ]},"finish_reason":"tool_calls"}]});
    let whole = ids(openai::parse_response(&body).decide());
    assert_eq!(whole, ids(openai::parse_response(&body).decide()));
    assert!(
        whole[0].starts_with("call_") && whole[0].len() == 21,
        "{whole:?}"
    );
    assert_ne!(whole[0], whole[1], "two equal calls, two ids");
    assert_eq!(whole[2], "call_given");

    let mut s = openai::Stream::default();
    for chunk in [
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"type":"function","function":{"name":"read_file","arguments":"{\"path\":"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"a.txt\"}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a.txt\"}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
        "[DONE]",
    ] {
        s.push(chunk).unwrap();
    }
    assert_eq!(ids(s.finish().decide()), whole[..2], "streamed as whole");

    // An id given in a call's first piece stands when a later piece says `"id": ""`.
    let mut s = openai::Stream::default();
    for chunk in [
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_first","type":"function","function":{"name":"list_dir","arguments":""}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"","function":{"arguments":"{}"}}]}}]}"#,
        "[DONE]",
    ] {
        s.push(chunk).unwrap();
    }
    assert_eq!(ids(s.finish().decide()), ["call_first"]);
}

/// Gemini's OpenAI-compatible endpoint: its calls' pieces carry no `index`, and each
/// call an `extra_content` (its thought signature) that must come back with the call, or
/// the next request is refused. Pieces without an index go to the call they continue.
#[test]
fn gemini_calls_without_indexes_keep_their_signature_and_send_it_back() {
    let signature = json!({"google": {"thought_signature": "CrICAdHtim827fQ=="}});
    let reply = openai_chunks(&[
        json!({"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"extra_content":signature,"id":"call_297140","type":"function","function":{"name":"read_file","arguments":"{\"path\":"}}]}}]}),
        // A continuation: no index, an empty id, no name.
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"id":"","type":"","function":{"arguments":"\"a.txt\"}"}}]}}]}),
        // The next call: another id; its second piece names it again.
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_297141","type":"function","function":{"name":"list_dir","arguments":"{"}}]}}]}),
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_297141","type":"function","function":{"name":"list_dir","arguments":"}"}}]}}]}),
        // And one with no id at all, named: a third call, its name not run into the second's.
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"function":{"name":"list_dir","arguments":"{\"path\":\"b\"}"}}]}}]}),
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
    ]);
    let Ok(Decision::ToolCalls { calls }) = &reply.decision else {
        panic!("{:?}", reply.decision)
    };
    let got: Vec<(&str, &str, String)> = calls
        .iter()
        .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.to_string()))
        .collect();
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(
        got[0],
        ("call_297140", "read_file", r#"{"path":"a.txt"}"#.into())
    );
    assert_eq!(got[1], ("call_297141", "list_dir", "{}".into()));
    assert_eq!(
        (got[2].1, got[2].2.as_str()),
        ("list_dir", r#"{"path":"b"}"#)
    );
    let extra = Reasoning::CallExtra {
        call_id: "call_297140".into(),
        extra_content: signature.clone(),
    };
    assert_eq!(reply.reasoning, std::slice::from_ref(&extra));
    // A whole response says the same.
    let whole = openai::parse_response(&json!({"choices": [{"message": {"role": "assistant",
        "tool_calls": [{"extra_content": signature, "id": "call_297140", "type": "function",
            "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}}]},
        "finish_reason": "tool_calls"}]}))
    .decide();
    assert_eq!(whole.reasoning, [extra]);

    // Sent back on its call, as it came; the other calls carry none.
    let mut p = prompt();
    p.messages[1].parts.push(Part::ToolUse {
        call_id: "call_297141".into(),
        name: "list_dir".into(),
        arguments: Arguments::new(&json!({})),
    });
    p.messages[1].parts.insert(
        0,
        Part::Reasoning {
            reasoning: Reasoning::CallExtra {
                call_id: "call_297141".into(),
                extra_content: signature.clone(),
            },
        },
    );
    let body = openai::request_body(&p, "gemini-3-flash-preview", true);
    let sent = body["messages"][2]["tool_calls"].as_array().unwrap();
    assert_eq!(sent.len(), 3, "{body}");
    assert!(
        sent[..2].iter().all(|c| c.get("extra_content").is_none()),
        "{body}"
    );
    assert_eq!(sent[2]["id"], "call_297141");
    assert_eq!(sent[2]["extra_content"], signature);
    // Other providers' requests leave it out.
    let other = anthropic::request_body(&p, "m", 10, false, false).to_string();
    assert!(!other.contains("thought_signature"), "{other}");
}

/// What the model thought, as OpenAI-compatible servers send it beside the answer
/// (`reasoning_content`: DeepSeek, vLLM, llama.cpp; `reasoning`: Ollama, OpenRouter), is
/// kept; `reasoning_content` goes back with the calls it led to (DeepSeek's thinking mode
/// refuses a request without it), never with an answer, and `reasoning` never.
#[test]
fn reasoning_beside_the_answer_is_kept_and_goes_back_with_its_calls() {
    let reply = openai_chunks(&[
        json!({"choices":[{"index":0,"delta":{"role":"assistant","content":null,"reasoning_content":"The user wants "}}]}),
        json!({"choices":[{"index":0,"delta":{"content":null,"reasoning_content":"a.txt read."}}]}),
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a.txt\"}"}}]}}]}),
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
    ]);
    assert!(
        matches!(reply.decision, Ok(Decision::ToolCalls { .. })),
        "{reply:?}"
    );
    let thought = Reasoning::Content {
        field: "reasoning_content".into(),
        text: "The user wants a.txt read.".into(),
    };
    assert_eq!(reply.reasoning, std::slice::from_ref(&thought));
    assert_eq!(
        thought.readable().as_deref(),
        Some("The user wants a.txt read.")
    );
    // Ollama's field, in a whole response; an answer's thought is kept too.
    let whole = openai::parse_response(&json!({"choices": [{"message": {"role": "assistant",
        "content": "It says hello.", "reasoning": "Answer now."}, "finish_reason": "stop"}]}))
    .decide();
    let ollama = Reasoning::Content {
        field: "reasoning".into(),
        text: "Answer now.".into(),
    };
    assert_eq!(whole.reasoning, std::slice::from_ref(&ollama));
    // Both fields with the same text (vLLM, renaming one to the other): kept once.
    let both = openai::parse_response(&json!({"choices": [{"message": {"role": "assistant",
        "content": "It says hello.", "reasoning": "Answer now.", "reasoning_content": "Answer now."},
        "finish_reason": "stop"}]}))
    .decide();
    assert_eq!(
        both.reasoning,
        [Reasoning::Content {
            field: "reasoning_content".into(),
            text: "Answer now.".into()
        }]
    );

    let mut p = prompt();
    p.messages[1]
        .parts
        .insert(0, Part::Reasoning { reasoning: thought });
    p.messages[1].parts.insert(
        1,
        Part::Reasoning {
            reasoning: ollama.clone(),
        },
    );
    p.messages.push(Message {
        role: Role::Assistant,
        parts: vec![
            Part::Reasoning {
                reasoning: Reasoning::Content {
                    field: "reasoning_content".into(),
                    text: "Done, say so.".into(),
                },
            },
            Part::Text {
                text: "It says hello.".into(),
            },
        ],
    });
    let body = openai::request_body(&p, "deepseek-v4-flash", true);
    let assistants: Vec<&serde_json::Value> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "assistant")
        .collect();
    assert_eq!(assistants.len(), 2, "{body}");
    assert_eq!(
        assistants[0]["reasoning_content"],
        "The user wants a.txt read."
    );
    assert!(assistants[0].get("reasoning").is_none(), "{body}");
    assert!(assistants[1].get("reasoning_content").is_none(), "{body}");
    // Other providers' requests leave it out.
    let other = anthropic::request_body(&p, "m", 10, false, false).to_string();
    assert!(!other.contains("a.txt read"), "{other}");
}

/// DeepSeek refuses a request in which a message of calls since the last user message has
/// no `reasoning_content`: one the log has none for (a run continued on DeepSeek from
/// another model) gets an empty one, which it takes; earlier turns, and other models,
/// get none. Kimi refuses one in which any message of calls has none.
#[test]
fn deepseek_and_kimi_get_an_empty_reasoning_for_calls_that_had_none() {
    let mut p = prompt();
    // The results end the prompt: the calls are of the turn under way.
    p.messages[2]
        .parts
        .retain(|part| !matches!(part, Part::Text { .. }));
    let body = openai::request_body(&p, "deepseek-v4-pro", true);
    assert_eq!(body["messages"][2]["reasoning_content"], "", "{body}");
    let other = openai::request_body(&p, "gpt-4o", true);
    assert!(
        other["messages"][2].get("reasoning_content").is_none(),
        "{other}"
    );
    // A person's words after the results begin a new turn: the calls before need none.
    let body = openai::request_body(&prompt(), "deepseek-v4-pro", true);
    assert!(
        body["messages"][2].get("reasoning_content").is_none(),
        "{body}"
    );
    // Kimi's thinking mode wants it on every message of calls, earlier turns' too.
    let body = openai::request_body(&prompt(), "kimi-k2.5", true);
    assert_eq!(body["messages"][2]["reasoning_content"], "", "{body}");
}

/// Mistral's API takes only call ids of 9 letters and digits: another model's ids (a run
/// continued or forked on Mistral) go as 9 hex digits of their hash, the same for a call
/// and its result; Mistral's own go as they are, and other models get ids unchanged.
#[test]
fn call_ids_of_other_models_fit_mistral_and_still_pair() {
    let ids = |body: &serde_json::Value| -> (Vec<String>, Vec<String>) {
        let messages = body["messages"].as_array().unwrap();
        let asked = messages
            .iter()
            .filter_map(|m| m["tool_calls"].as_array())
            .flatten()
            .map(|c| c["id"].as_str().unwrap().to_owned())
            .collect();
        let answered = messages
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| m["tool_call_id"].as_str().unwrap().to_owned())
            .collect();
        (asked, answered)
    };
    let (asked, answered) = ids(&openai::request_body(
        &prompt(),
        "mistral-large-latest",
        true,
    ));
    assert_eq!(asked.len(), 2);
    assert_ne!(asked[0], asked[1]);
    assert_eq!(answered, asked, "each result with its call");
    for id in &asked {
        assert!(
            id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()),
            "{id}"
        );
    }
    let (asked, _) = ids(&openai::request_body(&prompt(), "gpt-4o", true));
    assert_eq!(asked, ["c1", "c2"]);
    // Mistral's own ids go as they are.
    let mut p = prompt();
    for message in &mut p.messages {
        for part in &mut message.parts {
            if let Part::ToolUse { call_id, .. } | Part::ToolResult { call_id, .. } = part
                && call_id.as_str() == "c1"
            {
                *call_id = "D681PevKs".into();
            }
        }
    }
    let (asked, answered) = ids(&openai::request_body(&p, "devstral-medium", true));
    assert_eq!(
        (asked[0].as_str(), answered[0].as_str()),
        ("D681PevKs", "D681PevKs")
    );
}

/// OpenRouter's `reasoning_details`, streamed in pieces (a block's text or data grows
/// under its type and index), are put together in order and go back unchanged with the
/// calls they led to; Gemini 3 and Claude behind OpenRouter need them there.
#[test]
fn openrouter_reasoning_blocks_are_put_together_and_go_back_with_their_calls() {
    let f = "google-gemini-v1";
    let reply = openai_chunks(&[
        json!({"choices":[{"index":0,"delta":{"role":"assistant","content":"","reasoning":"Let me ",
            "reasoning_details":[{"type":"reasoning.text","text":"Let me ","format":f,"index":0}]}}]}),
        json!({"choices":[{"index":0,"delta":{"content":"","reasoning":"look.",
            "reasoning_details":[{"type":"reasoning.text","text":"look.","format":f,"index":0}]}}]}),
        json!({"choices":[{"index":0,"delta":{"content":"",
            "reasoning_details":[{"type":"reasoning.encrypted","data":"CiQB","id":"tool_1","format":f,"index":0}],
            "tool_calls":[{"index":0,"id":"tool_1","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a.txt\"}"}}]}}]}),
        json!({"choices":[{"index":0,"delta":{
            "reasoning_details":[{"type":"reasoning.encrypted","data":"xyz==","index":0,"signature":null}]}}]}),
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
    ]);
    assert!(
        matches!(reply.decision, Ok(Decision::ToolCalls { .. })),
        "{reply:?}"
    );
    let blocks = vec![
        json!({"type": "reasoning.text", "text": "Let me look.", "format": f, "index": 0}),
        json!({"type": "reasoning.encrypted", "data": "CiQBxyz==", "id": "tool_1", "format": f, "index": 0}),
    ];
    let details = Reasoning::Details {
        details: blocks.clone(),
    };
    assert_eq!(
        reply.reasoning,
        [
            Reasoning::Content {
                field: "reasoning".into(),
                text: "Let me look.".into()
            },
            details.clone()
        ]
    );
    // A whole response gives them whole.
    let whole = openai::parse_response(&json!({"choices": [{"message": {"role": "assistant",
        "content": null, "reasoning_details": blocks,
        "tool_calls": [{"id": "tool_1", "type": "function",
            "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}}]},
        "finish_reason": "tool_calls"}]}))
    .decide();
    assert_eq!(whole.reasoning, std::slice::from_ref(&details));

    let mut p = prompt();
    p.messages[1]
        .parts
        .insert(0, Part::Reasoning { reasoning: details });
    let body = openai::request_body(&p, "google/gemini-3-pro-preview", true);
    assert_eq!(
        body["messages"][2]["reasoning_details"],
        json!(blocks),
        "{body}"
    );
    assert!(body["messages"][2].get("reasoning").is_none(), "{body}");
}

/// Anthropic takes call ids of `[a-zA-Z0-9_-]` only: ids another provider made (a run
/// forked or continued with Claude after Kimi, whose ids read `functions.read_file:0`) are
/// made to fit, stay apart, and still pair each result with its call; fitting ids go as
/// they are.
#[test]
fn call_ids_another_provider_made_fit_anthropic_and_still_pair() {
    let mut p = prompt();
    for message in &mut p.messages {
        for part in &mut message.parts {
            match part {
                Part::ToolUse { call_id, .. } | Part::ToolResult { call_id, .. } => {
                    if call_id.as_str() == "c1" {
                        *call_id = "functions.read_file:0".into();
                    } else {
                        // The same once made to fit, but for its hash.
                        *call_id = "functions:read_file.0".into();
                    }
                }
                _ => {}
            }
        }
    }
    let body = anthropic::request_body(&p, "m", 10, false, false);
    let blocks = |i: usize| body["messages"][i]["content"].as_array().unwrap().clone();
    let asked: Vec<String> = blocks(1)
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .map(|b| b["id"].as_str().unwrap().to_owned())
        .collect();
    let answered: Vec<String> = blocks(2)
        .iter()
        .filter(|b| b["type"] == "tool_result")
        .map(|b| b["tool_use_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(asked.len(), 2, "{body}");
    assert_ne!(asked[0], asked[1]);
    assert_eq!(answered, asked, "each result with its call");
    for id in &asked {
        assert!(
            id.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
            "{id}"
        );
        assert!(id.starts_with("functions_read_file_"), "{id}");
    }
    // Ids that fit go as they are.
    let body = anthropic::request_body(&prompt(), "m", 10, false, false);
    assert_eq!(body["messages"][1]["content"][1]["id"], "c1", "{body}");
}

#[test]
fn a_refusal_is_cannot_continue() {
    let reply = openai::parse_response(&json!({
        "choices": [{"message": {"content": null, "refusal": "I can't help with that."}, "finish_reason": "stop"}]
    }))
    .decide();
    assert_eq!(
        reply.decision,
        Ok(Decision::CannotContinue {
            reason: "I can't help with that.".into()
        })
    );
}

fn prompt() -> Prompt {
    let mut schema = json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "Args",
        "type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer", "format": "uint"}}});
    schema["required"] = json!(["path"]);
    Prompt {
        system: "be brief".into(),
        messages: vec![
            Message::user_text("read a.txt"),
            Message {
                role: Role::Assistant,
                parts: vec![
                    Part::Text {
                        text: "Reading.".into(),
                    },
                    Part::ToolUse {
                        call_id: "c1".into(),
                        name: "read_file".into(),
                        arguments: json!({"path": "a.txt"}).into(),
                    },
                    Part::ToolUse {
                        call_id: "c2".into(),
                        name: "read_file".into(),
                        arguments: json!({"path": "b.txt"}).into(),
                    },
                ],
            },
            Message {
                role: Role::User,
                parts: vec![
                    Part::ToolResult {
                        call_id: "c1".into(),
                        name: "read_file".into(),
                        ok: true,
                        content: "hello".into(),
                    },
                    Part::ToolResult {
                        call_id: "c2".into(),
                        name: "read_file".into(),
                        ok: false,
                        content: "execution_failed: missing".into(),
                    },
                    Part::Text {
                        text: "A note.".into(),
                    },
                ],
            },
        ],
        tools: vec![ToolSpec::new("read_file", "reads", schema, Risk::Read)],
        answer_schema: None,
    }
}

#[test]
fn openai_request_pairs_results_and_cleans_schemas() {
    let body = openai::request_body(&prompt(), "gpt-4o", true);
    let roles: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "tool", "user"]
    );
    assert_eq!(body["messages"][2]["tool_calls"][1]["id"], "c2");
    assert_eq!(
        body["messages"][2]["tool_calls"][0]["function"]["arguments"],
        "{\"path\":\"a.txt\"}"
    );
    assert_eq!(body["messages"][4]["tool_call_id"], "c2");
    let params = &body["tools"][0]["function"]["parameters"];
    assert!(params.get("$schema").is_none() && params.get("title").is_none());
    assert!(params["properties"]["n"].get("format").is_none());
    assert_eq!(params["required"], json!(["path"]));
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"]["include_usage"], true);
}

#[test]
fn anthropic_request_puts_results_first_with_is_error() {
    let body = anthropic::request_body(&prompt(), "claude-sonnet-4-5", 1024, true, false);
    assert_eq!(body["system"], "be brief");
    assert_eq!(body["max_tokens"], 1024);
    let user = &body["messages"][2];
    assert_eq!(user["role"], "user");
    let kinds: Vec<&str> = user["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["tool_result", "tool_result", "text"]);
    assert_eq!(user["content"][1]["is_error"], true);
    assert_eq!(user["content"][1]["tool_use_id"], "c2");
    assert_eq!(body["messages"][1]["content"][1]["type"], "tool_use");
    assert!(body["tools"][0]["input_schema"].get("$schema").is_none());
}

/// Where a body's `cache_control` breakpoints are, as JSON pointers.
fn breakpoints(body: &serde_json::Value) -> Vec<String> {
    fn walk(v: &serde_json::Value, at: String, found: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(map) => {
                if map.contains_key("cache_control") {
                    assert_eq!(map["cache_control"], json!({"type": "ephemeral"}));
                    found.push(at.clone());
                }
                for (k, v) in map {
                    walk(v, format!("{at}/{k}"), found);
                }
            }
            serde_json::Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(v, format!("{at}/{i}"), found);
                }
            }
            _ => {}
        }
    }
    let mut found = Vec::new();
    walk(body, String::new(), &mut found);
    found.sort();
    found
}

#[test]
fn anthropic_cache_breakpoints_mark_tools_system_and_the_last_two_user_messages() {
    let mut p = prompt();
    p.messages.push(Message {
        role: Role::Assistant,
        parts: vec![Part::ToolUse {
            call_id: "c3".into(),
            name: "read_file".into(),
            arguments: json!({"path": "c.txt"}).into(),
        }],
    });
    p.messages.push(Message {
        role: Role::User,
        parts: vec![Part::ToolResult {
            call_id: "c3".into(),
            name: "read_file".into(),
            ok: true,
            content: "third".into(),
        }],
    });
    p.tools.push(ToolSpec::new(
        "list_dir",
        "lists",
        json!({"type": "object"}),
        Risk::Read,
    ));
    let body = anthropic::request_body(&p, "claude-sonnet-4-5", 1024, true, true);
    assert_eq!(
        breakpoints(&body),
        [
            "/messages/2/content/2", // the note after the two results, last block of its message
            "/messages/4/content/0", // the newest result
            "/system/0",
            "/tools/1", // the last tool: all tools are cached with it
        ]
    );
    assert!(breakpoints(&body).len() <= anthropic::MAX_BREAKPOINTS);
    assert_eq!(
        body["system"][0],
        json!({"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}})
    );
    // Marking changes nothing else: without the marks it is the body sent uncached.
    let mut unmarked = body.clone();
    unmarked["system"] = json!("be brief");
    for at in ["/messages/2/content/2", "/messages/4/content/0", "/tools/1"] {
        unmarked
            .pointer_mut(at)
            .unwrap()
            .as_object_mut()
            .unwrap()
            .remove("cache_control");
    }
    assert_eq!(
        unmarked,
        anthropic::request_body(&p, "claude-sonnet-4-5", 1024, true, false)
    );
    assert!(breakpoints(&unmarked).is_empty());
    // A first request: one user message, no tools.
    let first = Prompt {
        system: "be brief".into(),
        messages: vec![Message::user_text("hi")],
        tools: vec![],
        answer_schema: None,
    };
    assert_eq!(
        breakpoints(&anthropic::request_body(&first, "m", 10, false, true)),
        ["/messages/0/content/0", "/system/0"]
    );
}

#[test]
fn long_tool_names_fit_the_providers_and_come_back_whole() {
    let long = format!(
        "mcp__{}__{}",
        "a_very_long_server_name".repeat(2),
        "and_a_long_tool_name_too"
    );
    assert!(long.len() > 64);
    let mut p = prompt();
    p.tools.push(ToolSpec::new(
        long.clone(),
        "long",
        json!({"type": "object"}),
        Risk::External,
    ));
    let body = openai::request_body(&p, "gpt-4o", false);
    let sent = body["tools"][1]["function"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        sent.len() <= 64
            && sent
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    );
    assert_eq!(
        anthropic::request_body(&p, "m", 10, false, true)["tools"][1]["name"],
        sent.as_str()
    );
    let mut reply = ModelReply::decision(
        Decision::ToolCalls {
            calls: vec![ToolCall::new("c1", sent.as_str(), json!({}))],
        },
        Usage::default(),
    );
    agent_providers::wire::restore_names(&mut reply, &p.tools);
    let Ok(Decision::ToolCalls { calls }) = reply.decision else {
        panic!()
    };
    assert_eq!(calls[0].name, long);
    assert_eq!(agent_providers::wire::wire_name("read_file"), "read_file");
}

/// A text reply cut by the output limit is not a final answer (CONTRACT §2), streamed or
/// whole, OpenAI-compatible (as llama.cpp answers) or Anthropic.
#[test]
fn a_text_reply_cut_at_the_output_limit_is_not_a_final_answer() {
    let cut = fixture("openai/text_only.sse")
        .replace(r#""finish_reason":"stop""#, r#""finish_reason":"length""#);
    let mut s = openai::Stream::default();
    for (_, data) in sse(&cut) {
        s.push(&data).unwrap();
    }
    let reply = s.finish().decide();
    let problem = reply.decision.unwrap_err().problem;
    assert!(problem.contains("cut at the output limit"), "{problem}");

    let llama_cpp = json!({
        "choices": [{"index": 0, "finish_reason": "length",
                     "message": {"role": "assistant", "content": "The launch meeting is on Thurs"}}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 8}
    });
    let reply = openai::parse_response(&llama_cpp).decide();
    assert!(reply.decision.is_err(), "{:?}", reply.decision);
    assert_eq!(
        reply.usage.output_tokens, 8,
        "the tokens it used still count"
    );

    let cut = fixture("anthropic/basic_response.txt").replace(
        r#""stop_reason":"end_turn""#,
        r#""stop_reason":"max_tokens""#,
    );
    let mut s = anthropic::Stream::default();
    for (event, data) in sse(&cut) {
        s.push(&event, &data).unwrap();
    }
    assert!(s.finish().decide().decision.is_err());
    let whole = json!({
        "content": [{"type": "text", "text": "Half an ans"}],
        "stop_reason": "max_tokens",
        "usage": {"input_tokens": 10, "output_tokens": 4}
    });
    assert!(anthropic::parse_response(&whole).decide().decision.is_err());
}

#[test]
fn cached_prompt_tokens_from_both_providers() {
    // OpenAI: cached tokens are inside `prompt_tokens`.
    let reply = openai_stream("openai/cached_usage.sse");
    assert!(matches!(reply.decision, Ok(Decision::ToolCalls { .. })));
    assert_eq!(
        reply.usage,
        Usage::tokens(2006, 300).with_cache(1920, 0),
        "{:?}",
        reply.usage
    );
    // The same in a whole response.
    let whole = openai::parse_response(&json!({
        "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 2,
                  "prompt_tokens_details": {"cached_tokens": 32}}
    }));
    assert_eq!(whole.usage, Usage::tokens(50, 2).with_cache(32, 0));
    // DeepSeek says it in fields of its own; so does Moonshot.
    for usage in [
        json!({"prompt_tokens": 50, "completion_tokens": 2, "prompt_cache_hit_tokens": 40,
               "prompt_cache_miss_tokens": 10}),
        json!({"prompt_tokens": 50, "completion_tokens": 2, "cached_tokens": 40}),
    ] {
        let whole = openai::parse_response(&json!({
            "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
            "usage": usage
        }));
        assert_eq!(
            whole.usage,
            Usage::tokens(50, 2).with_cache(40, 0),
            "{usage}"
        );
    }

    // Anthropic: `input_tokens` is only what follows the last breakpoint; the prompt is
    // all three counts.
    let (reply, done) = anthropic_stream("anthropic/cached_tool_use_response.txt");
    assert!(done);
    assert!(matches!(reply.decision, Ok(Decision::ToolCalls { .. })));
    assert_eq!(
        reply.usage,
        Usage::tokens(21 + 188_086, 393).with_cache(0, 188_086)
    );
    let body: serde_json::Value =
        serde_json::from_str(&fixture("anthropic/cache_read_message.json")).unwrap();
    let whole = anthropic::parse_response(&body);
    assert_eq!(
        whole.usage,
        Usage::tokens(3 + 40 + 188_086, 8).with_cache(188_086, 40)
    );
    assert_eq!(whole.usage.uncached_input_tokens(), 3);
}

#[test]
fn cache_writes_gpt_5_6_reports_are_counted_and_priced_above_an_uncached_token() {
    // OpenAI's example: of 2,600 prompt tokens, 2,000 read from the cache, 400 written to
    // it, 200 neither. Streamed and whole, Chat Completions and Responses.
    let details = json!({"cached_tokens": 2000, "cache_write_tokens": 400});
    let expected = Usage::tokens(2600, 10).with_cache(2000, 400);
    let streamed = openai_chunks(&[
        json!({"choices": [{"index": 0, "delta": {"content": "hi"}}]}),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 2600, "completion_tokens": 10,
                                        "prompt_tokens_details": details}}),
    ]);
    assert_eq!(streamed.usage, expected);
    let whole = openai::parse_response(&json!({
        "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 2600, "completion_tokens": 10, "prompt_tokens_details": details}
    }));
    assert_eq!(whole.usage, expected);
    let response = json!({
        "status": "completed",
        "output": [{"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": "hi"}]}],
        "usage": {"input_tokens": 2600, "output_tokens": 10, "input_tokens_details": details}
    });
    assert_eq!(responses::parse_response(&response).usage, expected);
    let mut s = responses::Stream::default();
    s.push(
        "response.completed",
        &json!({"type": "response.completed", "response": response}).to_string(),
    )
    .unwrap();
    assert!(s.is_done());
    assert_eq!(s.finish().decide().usage, expected);

    // Written tokens cost 1.25 times an uncached one unless a price is given; read ones
    // their own price.
    assert_eq!(expected.uncached_input_tokens(), 200);
    let price = agent_providers::Price {
        cache_read_per_million: Some(0.25),
        ..agent_providers::Price::new(2.5, 15.0)
    };
    let cost = (200.0 * 2.5 + 2000.0 * 0.25 + 400.0 * 2.5 * 1.25 + 10.0 * 15.0) / 1e6;
    assert!(
        (price.cost(&expected) - cost).abs() < 1e-12,
        "{}",
        price.cost(&expected)
    );
}

#[test]
fn anthropic_thinking_is_kept_and_sent_back_unchanged_before_the_tool_use() {
    let (reply, done) = anthropic_stream("anthropic/thinking_tool_use_response.txt");
    assert!(done);
    let Ok(Decision::ToolCalls { calls }) = &reply.decision else {
        panic!("{:?}", reply.decision)
    };
    assert_eq!(calls[0].arguments["path"], "notes.txt");
    let thinking = "The user wants to know what the notes say.\n\nI should read notes.txt \
                    before answering, with \"read_file\".";
    let signature = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds/+==";
    let data = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP";
    assert_eq!(
        reply.reasoning,
        [
            Reasoning::Thinking {
                thinking: thinking.into(),
                signature: signature.into(),
            },
            Reasoning::RedactedThinking { data: data.into() },
        ]
    );
    // The thinking is what the model thought, never its answer.
    assert!(!matches!(reply.decision, Ok(Decision::Final { .. })));

    // The same blocks in a whole response.
    let whole = anthropic::parse_response(&json!({
        "content": [
            {"type": "thinking", "thinking": thinking, "signature": signature},
            {"type": "redacted_thinking", "data": data},
            {"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "notes.txt"}}
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 5}
    }));
    assert_eq!(whole.reasoning, reply.reasoning);

    // Sent back first in the assistant message, byte for byte, before its tool use.
    let mut p = prompt();
    let mut parts: Vec<Part> = reply
        .reasoning
        .iter()
        .map(|r| Part::Reasoning {
            reasoning: r.clone(),
        })
        .collect();
    parts.append(&mut p.messages[1].parts);
    p.messages[1].parts = parts;
    let body = anthropic::request_body(&p, "claude-sonnet-4-5", 1024, true, false);
    let blocks = body["messages"][1]["content"].as_array().unwrap();
    assert_eq!(
        blocks[0],
        json!({"type": "thinking", "thinking": thinking, "signature": signature})
    );
    assert_eq!(
        blocks[1],
        json!({"type": "redacted_thinking", "data": data})
    );
    assert_eq!(blocks[2]["type"], "text");
    assert_eq!(blocks[3]["type"], "tool_use");
    let sent = body.to_string();
    assert!(sent.contains(&serde_json::to_string(thinking).unwrap()));
    // Chat Completions takes no reasoning back.
    let openai_body = openai::request_body(&p, "gpt-4o", false).to_string();
    assert!(!openai_body.contains("signature") && !openai_body.contains("notes say"));
}

#[test]
fn anthropic_thinking_budget_is_asked_for_within_the_output_limit() {
    let thinking = |limit, thinking| {
        anthropic::request_body_thinking(&prompt(), "m", limit, false, false, Some(thinking))
    };
    let body = thinking(8_192, Thinking::Budget(4_000));
    assert_eq!(
        body["thinking"],
        json!({"type": "enabled", "budget_tokens": 4_000})
    );
    assert_eq!(body["max_tokens"], 8_192);
    // The API wants the budget below the output limit: the limit is raised past it.
    let body = thinking(8_192, Thinking::Budget(16_000));
    assert!(body["max_tokens"].as_u64().unwrap() > 16_000);
    // Below the API's least budget is raised to it.
    let body = thinking(8_192, Thinking::Budget(10));
    assert_eq!(
        body["thinking"]["budget_tokens"],
        anthropic::MIN_THINKING_TOKENS
    );
    assert!(
        anthropic::request_body(&prompt(), "m", 8_192, false, false)
            .get("thinking")
            .is_none()
    );
    // Adaptive: no budget, the thinking counts within the output limit as given.
    let body = thinking(3_000, Thinking::Adaptive);
    assert_eq!(body["thinking"], json!({"type": "adaptive"}));
    assert_eq!(body["max_tokens"], 3_000);
}

fn responses_stream(name: &str) -> ModelReply {
    let mut s = responses::Stream::default();
    for (event, data) in sse(&fixture(name)) {
        s.push(&event, &data).unwrap();
    }
    assert!(s.is_done(), "{name} ends with response.completed");
    s.finish().decide()
}

#[test]
fn responses_stream_gives_calls_by_call_id_reasoning_and_cached_usage() {
    let reply = responses_stream("openai/responses_reasoning_tool.sse");
    let Ok(Decision::ToolCalls { calls }) = &reply.decision else {
        panic!("{:?}", reply.decision)
    };
    assert_eq!(calls[0].id.as_str(), "call_Mf3n0m4GgK1lqJ2lV2W3y1Ae");
    assert_eq!(calls[0].name, "read_file");
    assert_eq!(calls[0].arguments, json!({"path": "notes.txt"}));
    assert_eq!(
        reply.reasoning,
        [Reasoning::ResponsesItem {
            id: "rs_68af4030592c81938ec0a5fbab4a3e9f".into(),
            summary: vec![
                "**Reading the notes**\n\nThe user asks what the notes say, so I read notes.txt first."
                    .into()
            ],
            encrypted_content: Some("gAAAAABor0Aw1xZ5aVZlcfNhQ8M2aqPwF0Zsv1h0Ekm7wV0pP0yYtQ==".into()),
        }]
    );
    assert_eq!(
        reply.usage,
        Usage::tokens(2210, 145)
            .with_cache(1920, 0)
            .with_reasoning(128)
    );

    let text = responses_stream("openai/responses_text.sse");
    assert_eq!(
        text.decision,
        Ok(Decision::Final {
            answer: "The notes say hello.".into()
        })
    );
    assert_eq!(text.usage, Usage::tokens(2420, 9).with_cache(2304, 0));

    // A last event without its output: the items as each was done.
    let mut s = responses::Stream::default();
    for (event, data) in sse(&fixture("openai/responses_reasoning_tool.sse")) {
        let data = if event == "response.completed" {
            let mut v: serde_json::Value = serde_json::from_str(&data).unwrap();
            v["response"]["output"] = json!([]);
            v.to_string()
        } else {
            data
        };
        s.push(&event, &data).unwrap();
    }
    let items_only = s.finish().decide();
    assert_eq!(items_only.decision, reply.decision);
    assert_eq!(items_only.reasoning, reply.reasoning);
    assert_eq!(items_only.usage, reply.usage);
}

#[test]
fn responses_incomplete_failed_and_refused_replies() {
    let cut = responses::parse_response(&json!({
        "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "The answ"}]}],
        "usage": {"input_tokens": 10, "output_tokens": 5}
    }));
    assert!(cut.truncated);
    assert!(
        cut.decide().decision.is_err(),
        "a cut answer is never final"
    );
    let refused = responses::parse_response(&json!({
        "status": "completed",
        "output": [{"type": "message", "content": [{"type": "refusal", "refusal": "I can't help with that."}]}]
    }));
    assert_eq!(
        refused.decide().decision,
        Ok(Decision::CannotContinue {
            reason: "I can't help with that.".into()
        })
    );
    let mut s = responses::Stream::default();
    let failed = s
        .push(
            "response.failed",
            &json!({"type": "response.failed", "response": {"status": "failed",
                "error": {"code": "rate_limit_exceeded", "message": "slow down"}}})
            .to_string(),
        )
        .unwrap_err();
    assert!(failed.is_retryable(), "{failed}");
    assert!(failed.to_string().contains("slow down"), "{failed}");
    let mut s = responses::Stream::default();
    let bad = s
        .push(
            "error",
            &json!({"type": "error", "code": "invalid_api_key", "message": "bad key"}).to_string(),
        )
        .unwrap_err();
    assert!(!bad.is_retryable(), "{bad}");
    // Unknown events are ignored.
    assert_eq!(s.push("response.future_thing", "{}").unwrap(), None);
}

#[test]
fn responses_request_pairs_calls_and_outputs_and_sends_reasoning_back() {
    let mut p = prompt();
    p.messages[1].parts.insert(
        0,
        Part::Reasoning {
            reasoning: Reasoning::ResponsesItem {
                id: "rs_1".into(),
                summary: vec!["Read both.".into()],
                encrypted_content: Some("gAAAA==".into()),
            },
        },
    );
    // Another provider's thinking is left out.
    p.messages[1].parts.insert(
        1,
        Part::Reasoning {
            reasoning: Reasoning::Thinking {
                thinking: "claude's".into(),
                signature: "sig".into(),
            },
        },
    );
    let body = responses::request_body(&p, "gpt-5", true);
    assert_eq!(body["instructions"], "be brief");
    assert_eq!(body["store"], false);
    assert_eq!(body["include"], json!(["reasoning.encrypted_content"]));
    assert_eq!(body["stream"], true);
    let kinds: Vec<String> = body["input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            i["type"].as_str().map_or_else(
                || format!("{} message", i["role"].as_str().unwrap()),
                str::to_owned,
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "user message",
            "reasoning",
            "assistant message",
            "function_call",
            "function_call",
            "function_call_output",
            "function_call_output",
            "user message"
        ]
    );
    let input = &body["input"];
    assert_eq!(
        input[1],
        json!({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Read both."}],
               "encrypted_content": "gAAAA=="})
    );
    assert_eq!(input[3]["call_id"], "c1");
    assert_eq!(input[3]["arguments"], "{\"path\":\"a.txt\"}");
    assert_eq!(input[6]["call_id"], "c2");
    assert_eq!(input[6]["output"], "execution_failed: missing");
    assert!(!body.to_string().contains("claude's"));
    let tool = &body["tools"][0];
    assert_eq!(tool["type"], "function");
    assert_eq!(tool["name"], "read_file");
    assert!(tool["parameters"].get("$schema").is_none());
}

#[test]
fn a_responses_stream_cut_before_its_last_event_is_not_done() {
    let mut s = responses::Stream::default();
    for (event, data) in sse(&fixture("openai/responses_reasoning_tool.sse")) {
        if event == "response.completed" {
            break;
        }
        s.push(&event, &data).unwrap();
    }
    assert!(
        !s.is_done(),
        "the transport reports a stream cut short as broken"
    );
    // A `response.*` event that is not JSON is an error, not ignored.
    let mut s = responses::Stream::default();
    assert!(s.push("response.completed", "{not json").is_err());
}

/// What a stream of Ollama's `/api/chat` lines decides.
fn ollama_lines(lines: &[serde_json::Value]) -> Result<ModelReply, agent_providers::ProviderError> {
    let mut s = ollama::Stream::default();
    for line in lines {
        s.push(&format!("{line}\n"))?;
    }
    assert!(s.is_done(), "the last line says done");
    Ok(s.finish().decide())
}

#[test]
fn ollama_streams_thinking_calls_and_counts() {
    // As Ollama streams a thinking model's call: thinking, the call whole, then the counts.
    let reply = ollama_lines(&[
        json!({"model":"qwen3","message":{"role":"assistant","content":"","thinking":"I should "},"done":false}),
        json!({"model":"qwen3","message":{"role":"assistant","content":"","thinking":"read it."},"done":false}),
        json!({"model":"qwen3","message":{"role":"assistant","content":"","tool_calls":[
            {"id":"call_x1","function":{"index":0,"name":"read_file","arguments":{"path":"notes.txt"}}},
            {"function":{"index":1,"name":"read_file","arguments":{"path":"todo.txt"}}}]},"done":false}),
        json!({"model":"qwen3","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop",
               "total_duration":885095291,"prompt_eval_count":122,"eval_count":33}),
    ])
    .unwrap();
    let Ok(Decision::ToolCalls { calls }) = &reply.decision else {
        panic!("{:?}", reply.decision)
    };
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].id.as_str(), "call_x1");
    assert_eq!(calls[0].arguments, json!({"path": "notes.txt"}));
    assert!(
        !calls[1].id.as_str().is_empty(),
        "a call without an id gets one"
    );
    assert_ne!(calls[1].id, calls[0].id);
    assert_eq!(calls[1].arguments, json!({"path": "todo.txt"}));
    assert_eq!(reply.usage, Usage::tokens(122, 33));
    assert_eq!(
        reply.reasoning,
        [Reasoning::Content {
            field: "thinking".into(),
            text: "I should read it.".into()
        }]
    );

    // Text, cut at the output limit: never a final answer.
    let cut = ollama_lines(&[
        json!({"message":{"role":"assistant","content":"The answer is"},"done":false}),
        json!({"message":{"role":"assistant","content":""},"done":true,"done_reason":"length","prompt_eval_count":10,"eval_count":5}),
    ])
    .unwrap();
    assert!(cut.decision.is_err(), "{:?}", cut.decision);
    let whole = ollama::parse_response(&json!({
        "message": {"role": "assistant", "content": "It says hello."},
        "done": true, "done_reason": "stop", "prompt_eval_count": 26, "eval_count": 5
    }))
    .decide();
    assert_eq!(
        whole.decision,
        Ok(Decision::Final {
            answer: "It says hello.".into()
        })
    );
    assert_eq!(whole.usage, Usage::tokens(26, 5));

    // An error line mid-stream is a server's failure (retried), said in a bounded excerpt;
    // a line that is not JSON, a decoding failure.
    let mut s = ollama::Stream::default();
    let long = "x".repeat(10_000);
    let error = s
        .push(
            &json!({"error": format!("model runner has unexpectedly stopped {long}")}).to_string(),
        )
        .unwrap_err();
    assert!(error.is_retryable(), "{error}");
    assert!(error.to_string().len() < 1_000, "{error}");
    assert!(matches!(
        s.push("{not json"),
        Err(agent_providers::ProviderError::Decode(_))
    ));
    assert!(!s.is_done());
}

#[test]
fn ollama_requests_carry_calls_as_objects_results_by_tool_and_thinking_back() {
    let prompt = Prompt {
        system: "sys".into(),
        messages: vec![
            Message::user_text("read the notes"),
            Message {
                role: Role::Assistant,
                parts: vec![
                    Part::Reasoning {
                        reasoning: Reasoning::Content {
                            field: "thinking".into(),
                            text: "Read them first.".into(),
                        },
                    },
                    Part::ToolUse {
                        call_id: "call_1".into(),
                        name: "read_file".into(),
                        arguments: Arguments::new(&json!({"path": "notes.txt"})),
                    },
                ],
            },
            Message {
                role: Role::User,
                parts: vec![
                    Part::ToolResult {
                        call_id: "call_1".into(),
                        name: "read_file".into(),
                        ok: true,
                        content: "hello".into(),
                    },
                    Part::Text {
                        text: "and be quick".into(),
                    },
                ],
            },
            Message {
                role: Role::Assistant,
                parts: vec![
                    Part::Reasoning {
                        reasoning: Reasoning::Content {
                            field: "thinking".into(),
                            text: "Done.".into(),
                        },
                    },
                    Part::Text {
                        text: "It says hello.".into(),
                    },
                ],
            },
        ],
        tools: vec![ToolSpec::new(
            "read_file",
            "read",
            json!({"type": "object"}),
            Risk::Read,
        )],
        answer_schema: None,
    };
    let body = ollama::request_body(&prompt, "qwen3:8b", true);
    assert_eq!(body["model"], "qwen3:8b");
    assert_eq!(body["stream"], true);
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "read the notes"},
            {"role": "assistant", "content": "", "thinking": "Read them first.", "tool_calls": [
                {"type": "function", "id": "call_1",
                 "function": {"name": "read_file", "arguments": {"path": "notes.txt"}}}]},
            {"role": "tool", "content": "hello", "tool_name": "read_file", "tool_call_id": "call_1"},
            {"role": "user", "content": "and be quick"},
            {"role": "assistant", "content": "It says hello."},
        ])
    );
    assert_eq!(body["tools"][0]["type"], "function");
    assert_eq!(body["tools"][0]["function"]["name"], "read_file");

    // Another server's reasoning (a run continued on Ollama) is not Ollama's to take back.
    let mut other = prompt.clone();
    other.messages[1].parts[0] = Part::Reasoning {
        reasoning: Reasoning::Content {
            field: "reasoning_content".into(),
            text: "Read them first.".into(),
        },
    };
    let body = ollama::request_body(&other, "qwen3:8b", true);
    assert_eq!(
        body["messages"][2].get("thinking"),
        None,
        "{}",
        body["messages"][2]
    );
}
