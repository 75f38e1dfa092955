//! Tool calling on SmolLM2 with chat templates written in the style of Qwen 2.5 / Hermes,
//! Llama 3.1, Mistral and the later Mistral `[ARGS]` style (`tests/data/templates`): tools reach the template, `required` and
//! named choices force calls whose arguments match the schema, whole and streamed, a full
//! loop (call, tool result, answer) runs, and bad tool input is a 400 naming the field.

mod common;

use axum::http::StatusCode;
use common::*;
use runit_server::ServerConfig;
use runit_tokenizer::{ChatMessage, ChatTemplate, TemplateInputs};
use serde_json::{json, Value};

const FORMATS: [&str; 4] = ["hermes", "llama3", "mistral", "mistral_args"];

fn server(format: &str) -> Option<Fixture> {
    with_template_fixture(format)
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]}
            }, "required": ["city", "unit"], "additionalProperties": false}
        }},
        {"type": "function", "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}},
                "required": ["zone"], "additionalProperties": false}
        }}
    ])
}

/// Checks a call's arguments against the tools' schemas (written out here).
fn check_call(call: &Value) -> Value {
    assert_eq!(call["type"], "function", "{call}");
    assert!(
        call["id"].as_str().is_some_and(|id| !id.is_empty()),
        "{call}"
    );
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().expect("arguments"))
            .unwrap_or_else(|error| panic!("{call}: {error}"));
    let object = arguments.as_object().expect("an object");
    match call["function"]["name"].as_str().expect("name") {
        "get_weather" => {
            assert!(
                object["city"]
                    .as_str()
                    .is_some_and(|city| city.chars().count() <= 20),
                "{call}"
            );
            assert!(
                object["unit"] == "celsius" || object["unit"] == "fahrenheit",
                "{call}"
            );
            assert_eq!(object.len(), 2, "{call}");
        }
        "get_time" => {
            assert!(object["zone"].is_string(), "{call}");
            assert_eq!(object.len(), 1, "{call}");
        }
        other => panic!("unknown tool {other}"),
    }
    arguments
}

fn question(extra: Value) -> String {
    let mut body = json!({
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools(),
        "temperature": 0,
        "max_tokens": 120,
    });
    for (key, value) in extra.as_object().expect("object") {
        body[key] = value.clone();
    }
    body.to_string()
}

#[test]
fn tools_and_tool_messages_reach_the_templates() {
    let messages = [
        ChatMessage::user("Weather in Paris?"),
        ChatMessage {
            tool_calls: Some(json!([{"id": "call-1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}])),
            ..ChatMessage::assistant("")
        },
        ChatMessage {
            tool_call_id: Some("call-1".into()),
            ..ChatMessage::new("tool", "18 degrees")
        },
    ];
    let inputs = TemplateInputs {
        tools: Some(tools()),
        ..TemplateInputs::default()
    };
    for format in FORMATS {
        let template =
            ChatTemplate::new(&template_fixture(format), "<s>", "</s>").expect("compiles");
        let text = template
            .render_with(&messages[..1], true, &inputs)
            .expect("renders");
        assert!(
            text.contains("get_weather") && text.contains("The weather in a city"),
            "{format}: {text}"
        );
        let text = template
            .render_with(&messages, true, &inputs)
            .expect("renders");
        assert!(
            text.contains("\"city\": \"Paris\"") || text.contains("\"city\":\"Paris\""),
            "{format}: {text}"
        );
        assert!(text.contains("18 degrees"), "{format}: {text}");
    }
}

#[tokio::test]
async fn required_and_named_choices_force_valid_calls_in_every_format() {
    for format in FORMATS {
        let Some(f) = server(format) else { return };
        for (choice, expected) in [
            (json!("required"), None),
            (
                json!({"type": "function", "function": {"name": "get_time"}}),
                Some("get_time"),
            ),
        ] {
            let body = question(json!({"tool_choice": choice, "parallel_tool_calls": false}));
            let (status, answer) = post_json(f.router(), "/v1/chat/completions", &body).await;
            assert_eq!(status, StatusCode::OK, "{format}: {answer}");
            let choice = &answer["choices"][0];
            assert_eq!(choice["finish_reason"], "tool_calls", "{format}: {answer}");
            let calls = choice["message"]["tool_calls"]
                .as_array()
                .expect("tool_calls");
            assert_eq!(calls.len(), 1, "{format}: {answer}");
            check_call(&calls[0]);
            if let Some(name) = expected {
                assert_eq!(calls[0]["function"]["name"], name, "{format}: {answer}");
            }
        }
    }
}

#[tokio::test]
async fn streamed_calls_come_as_openai_deltas() {
    for format in FORMATS {
        let Some(f) = server(format) else { return };
        let body = question(json!({"tool_choice": "required", "stream": true}));
        let (whole_status, whole) = post_json(
            f.router(),
            "/v1/chat/completions",
            &question(json!({"tool_choice": "required"})),
        )
        .await;
        assert_eq!(whole_status, StatusCode::OK, "{format}: {whole}");
        let (status, bytes) = send(f.router(), post("/v1/chat/completions", &body)).await;
        assert_eq!(status, StatusCode::OK);
        let chunks: Vec<Value> = sse_data(&bytes)
            .iter()
            .filter(|data| *data != "[DONE]")
            .map(|data| serde_json::from_str(data).expect("json"))
            .collect();
        let deltas: Vec<&Value> = chunks
            .iter()
            .map(|chunk| &chunk["choices"][0]["delta"])
            .collect();
        let streamed: Vec<&Value> = deltas
            .iter()
            .filter_map(|delta| delta["tool_calls"].as_array())
            .flatten()
            .collect();
        let whole_calls = whole["choices"][0]["message"]["tool_calls"]
            .as_array()
            .expect("calls");
        // A call's first piece has its id, type and name; later pieces carry its index
        // and the next piece of its arguments, as they are generated.
        let mut joined: Vec<Value> = Vec::new();
        for piece in &streamed {
            let k = piece["index"].as_u64().expect("index") as usize;
            if k == joined.len() {
                assert!(piece["function"]["name"].is_string(), "{format}: {piece}");
                joined.push((*piece).clone());
            } else {
                assert_eq!(k + 1, joined.len(), "{format}: pieces in call order");
                assert!(piece.get("id").is_none() && piece["function"].get("name").is_none());
                let more = piece["function"]["arguments"].as_str().expect("arguments");
                let arguments = joined[k]["function"]["arguments"].as_str().unwrap_or("");
                joined[k]["function"]["arguments"] = json!(format!("{arguments}{more}"));
            }
        }
        assert!(
            streamed.len() > 2 * joined.len(),
            "{format}: arguments streamed in pieces"
        );
        assert_eq!(joined.len(), whole_calls.len(), "{format}");
        for (k, (streamed, whole)) in joined.iter().zip(whole_calls).enumerate() {
            assert_eq!(streamed["index"], k);
            assert_eq!(streamed["function"], whole["function"], "{format}");
            check_call(streamed);
        }
        let content: String = deltas
            .iter()
            .filter_map(|delta| delta["content"].as_str())
            .collect();
        assert_eq!(content, "", "{format}: calls are not content");
        let last = chunks.last().expect("chunks");
        assert_eq!(
            last["choices"][0]["finish_reason"], "tool_calls",
            "{format}"
        );
    }
}

#[tokio::test]
async fn a_full_loop_calls_reads_the_result_and_answers() {
    for format in FORMATS {
        let Some(f) = server(format) else { return };
        let body = question(json!({"tool_choice": "required", "parallel_tool_calls": false}));
        let (_, first) = post_json(f.router(), "/v1/chat/completions", &body).await;
        let call = first["choices"][0]["message"]["tool_calls"][0].clone();
        check_call(&call);
        let followup = json!({
            "messages": [
                {"role": "user", "content": "What is the weather in Paris?"},
                first["choices"][0]["message"],
                {"role": "tool", "tool_call_id": call["id"], "content": "{\"temperature\": 18}"}
            ],
            "tools": tools(),
            "tool_choice": "none",
            "temperature": 0,
            "max_tokens": 30,
        });
        let (status, answer) =
            post_json(f.router(), "/v1/chat/completions", &followup.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{format}: {answer}");
        let message = &answer["choices"][0]["message"];
        assert!(message["tool_calls"].is_null(), "{format}: {answer}");
        assert!(
            !message["content"].as_str().expect("content").is_empty(),
            "{format}: {answer}"
        );
    }
}

#[tokio::test]
async fn bad_tool_input_is_refused_by_field() {
    let Some(f) = server("hermes") else { return };
    let user = json!({"role": "user", "content": "Hi"});
    for (body, param) in [
        (
            json!({"messages": [user], "tools": [{"type": "function", "function": {"description": "no name"}}]}),
            "tools[0].function.name",
        ),
        (
            json!({"messages": [user], "tools": [{"type": "function", "function": {"name": "bad name!"}}]}),
            "tools[0].function.name",
        ),
        (json!({"messages": [user], "tools": []}), "tools"),
        (
            json!({"messages": [user], "tools": tools(), "tool_choice": {"type": "function", "function": {"name": "other"}}}),
            "tool_choice",
        ),
        (
            json!({"messages": [user], "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"messages": [user, {"role": "tool", "content": "18"}]}),
            "messages[1].tool_call_id",
        ),
        (
            json!({"messages": [user, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{broken"}}]}]}),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            json!({"messages": [user], "tools": tools(), "tool_choice": "required", "response_format": {"type": "json_object"}}),
            "tool_choice",
        ),
        (
            json!({"messages": [user, {"role": "assistant", "refusal": "No."}]}),
            "messages[1].refusal",
        ),
        (
            json!({"messages": [{"role": "user", "content": "Hi", "extra": 1}]}),
            "messages[0].extra",
        ),
    ] {
        let (status, answer) =
            post_json(f.router(), "/v1/chat/completions", &body.to_string()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{body}: {answer}");
    }
    // A template that does not take tools cannot offer them.
    let Some(plain) = fixture_with_template(
        SMOLLM2,
        scheduler_config(),
        ServerConfig::default(),
        Some(runit_tokenizer::CHATML_TEMPLATE),
    ) else {
        return;
    };
    let (status, answer) =
        post_json(plain.router(), "/v1/chat/completions", &question(json!({}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["param"], "tools");
}
