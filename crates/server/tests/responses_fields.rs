//! `POST /v1/responses`: every field of OpenAI's Responses create request is honoured or
//! refused with a 400 naming it; bad input items, tools and values are refused by field
//! and the server serves on; and flat function tools run a whole loop on SmolLM2 with a
//! Hermes-style template (a forced call, whole and streamed, then its
//! `function_call_output` and the answer).

mod common;

use axum::http::StatusCode;
use common::*;
use runit_server::ServerConfig;
use serde_json::{json, Value};

fn server() -> Option<Fixture> {
    fixture(SMOLLM2, scheduler_config(), ServerConfig::default())
}

fn hermes() -> Option<Fixture> {
    with_template_fixture("hermes")
}

/// OpenAI's Responses create-request fields (the `openai` Python SDK's
/// `ResponseCreateParams`, late 2026), each with a value a client may send, and whether
/// RunIT honours that value.
fn response_fields() -> Vec<(&'static str, Value, bool)> {
    vec![
        ("access_programs", json!({"cyber": "standard"}), false),
        ("background", json!(false), true),
        (
            "background_options",
            json!({"completion_window": "soonest"}),
            false,
        ),
        ("context_management", json!([{"type": "compaction"}]), false),
        ("conversation", json!("conv_1"), false),
        ("image", json!({"context_compression": "auto"}), false),
        ("include", json!(["message.output_text.logprobs"]), true),
        ("instructions", json!("Be brief."), true),
        ("max_output_tokens", json!(4), true),
        ("max_tool_calls", json!(2), true),
        ("metadata", json!({"k": "v"}), true),
        (
            "moderation",
            json!({"model": "omni-moderation-latest"}),
            false,
        ),
        ("parallel_tool_calls", json!(false), true),
        ("previous_response_id", json!("resp_1"), false),
        ("prompt", json!({"id": "pmpt_1"}), false),
        ("prompt_cache_key", json!("key"), true),
        ("prompt_cache_options", json!({"mode": "implicit"}), false),
        ("prompt_cache_retention", json!("24h"), false),
        ("reasoning", json!({"effort": "low"}), false),
        ("safety_identifier", json!("someone"), true),
        ("service_tier", json!("auto"), true),
        ("store", json!(false), true),
        ("stream", json!(false), true),
        (
            "stream_options",
            json!({"include_obfuscation": false}),
            true,
        ),
        ("temperature", json!(0.5), true),
        ("text", json!({"format": {"type": "json_object"}}), true),
        ("tool_choice", json!("none"), true),
        (
            "tools",
            json!([{"type": "function", "name": "f", "parameters": {"type": "object"}}]),
            false,
        ),
        ("top_logprobs", json!(3), true),
        ("top_p", json!(0.9), true),
        ("truncation", json!("disabled"), true),
        ("user", json!("someone"), true),
    ]
}

async fn check(f: &Fixture, body: &Value, param: &str) {
    let (status, answer) = post_json(f.router(), "/v1/responses", &body.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
    assert_eq!(answer["error"]["param"], param, "{body}: {answer}");
}

#[tokio::test]
async fn every_field_is_honoured_or_refused_by_name() {
    let Some(f) = server() else { return };
    let base = json!({"input": "Hi", "max_output_tokens": 4});
    for (name, value, honoured) in response_fields() {
        let mut body = base.clone();
        body[name] = value.clone();
        let (status, answer) = post_json(f.router(), "/v1/responses", &body.to_string()).await;
        if honoured {
            assert_eq!(status, StatusCode::OK, "{name}: {answer}");
        } else {
            assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {answer}");
            // SmolLM2's own template takes no tools: `tools` is refused by that reason.
            assert_eq!(answer["error"]["param"], name, "{name}: {answer}");
            let message = answer["error"]["message"].as_str().expect("message");
            assert!(message.contains(name), "{name}: {message}");
        }
    }
    let mut unknown = base.clone();
    unknown["messages"] = json!([]);
    check(&f, &unknown, "messages").await;
    // A refused field sent as null counts as absent.
    let mut null = base.clone();
    null["previous_response_id"] = Value::Null;
    let (status, answer) = post_json(f.router(), "/v1/responses", &null.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

#[tokio::test]
async fn bad_input_is_refused_by_field_and_the_server_serves_on() {
    let Some(f) = hermes() else { return };
    let user = json!({"role": "user", "content": "Hi"});
    let function =
        json!({"type": "function", "name": "get_time", "parameters": {"type": "object"}});
    for (body, param) in [
        (json!({"input": "Hi", "store": true}), "store"),
        (json!({"input": "Hi", "background": true}), "background"),
        (
            json!({"input": "Hi", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (json!({"input": "Hi", "truncation": "auto"}), "truncation"),
        (
            json!({"input": "Hi", "include": ["reasoning.encrypted_content"]}),
            "include[0]",
        ),
        (
            json!({"input": "Hi", "stream_options": {"include_obfuscation": true}}),
            "stream_options.include_obfuscation",
        ),
        (
            json!({"input": "Hi", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (json!({"input": "Hi", "top_logprobs": 21}), "top_logprobs"),
        (json!({"input": "Hi", "metadata": {"k": 1}}), "metadata.k"),
        (
            json!({"input": "Hi", "text": {"format": {"type": "xml"}}}),
            "text.format.type",
        ),
        (
            json!({"input": "Hi", "text": {"verbosity": "low"}}),
            "text.verbosity",
        ),
        (
            json!({"input": "Hi", "text": {"format": {"type": "json_schema", "schema": {"type": "strange"}}}}),
            "text.format",
        ),
        (
            json!({"input": "Hi", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"input": "Hi", "tools": [{"type": "file_search", "vector_store_ids": []}]}),
            "tools[0].type",
        ),
        (
            json!({"input": "Hi", "tools": [{"type": "function", "name": "bad name!"}]}),
            "tools[0].name",
        ),
        (
            json!({"input": "Hi", "tools": [function], "tool_choice": {"type": "web_search_preview"}}),
            "tool_choice.type",
        ),
        (
            json!({"input": "Hi", "tools": [function], "tool_choice": {"type": "function", "name": "other"}}),
            "tool_choice",
        ),
        (
            json!({"input": "Hi", "tools": [{"type": "function", "function": {"name": "f"}}]}),
            "tools[0].function",
        ),
        (json!({}), "input"),
        (json!({"input": []}), "input"),
        (json!({"input": 7}), "input"),
        (json!({"input": [42]}), "input[0]"),
        (json!({"input": [{"content": "Hi"}]}), "input[0].role"),
        (
            json!({"input": [{"role": "tool", "content": "Hi"}]}),
            "input[0].role",
        ),
        (
            json!({"input": [{"role": "user", "content": "Hi", "extra": 1}]}),
            "input[0].extra",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "Look:"},
            {"type": "input_image", "image_url": "https://example.com/a.png"}]}]}),
            "input[0].content[1]",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}),
            "input[0].content[0]",
        ),
        (
            json!({"input": [user, {"type": "function_call", "name": "f", "arguments": "{}"}]}),
            "input[1].call_id",
        ),
        (
            json!({"input": [user, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{broken"}]}),
            "input[1].arguments",
        ),
        (
            json!({"input": [user, {"type": "function_call_output", "output": "18"}]}),
            "input[1].call_id",
        ),
        (
            json!({"input": [user, {"type": "reasoning", "summary": []}]}),
            "input[1].type",
        ),
        (
            json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
            "input[0].type",
        ),
        (
            json!({"input": [{"type": "computer_call_output", "call_id": "c"}]}),
            "input[0].type",
        ),
        (json!({"input": "Hi", "instructions": 3}), "instructions"),
        (
            json!({"input": "Hi", "max_output_tokens": 5000}),
            "max_output_tokens",
        ),
        (json!({"input": "word ".repeat(2000)}), "input"),
    ] {
        check(&f, &body, param).await;
    }
    let (status, answer) = post_json(
        f.router(),
        "/v1/responses",
        // Greedy: a sampled answer (a clock seed) could end before its third token.
        &json!({"input": "Hi", "max_output_tokens": 3, "temperature": 0}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["usage"]["output_tokens"], 3);
}

fn weather() -> Value {
    json!([{"type": "function", "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20},
            "unit": {"enum": ["celsius", "fahrenheit"]}
        }, "required": ["city", "unit"], "additionalProperties": false}, "strict": true}])
}

#[tokio::test]
async fn function_tools_run_a_whole_loop() {
    let Some(f) = hermes() else { return };
    let question = json!({"role": "user", "content": "What is the weather in Paris?"});
    let body = json!({"input": [question], "tools": weather(), "tool_choice": "required",
        "parallel_tool_calls": false, "temperature": 0, "max_output_tokens": 80});
    let (status, first) = post_json(f.router(), "/v1/responses", &body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["status"], "completed", "{first}");
    assert_eq!(first["tools"], weather());
    assert_eq!(first["tool_choice"], "required");
    let output = first["output"].as_array().expect("output");
    assert_eq!(
        output.len(),
        1,
        "a forced call is the whole answer: {first}"
    );
    let call = &output[0];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["status"], "completed");
    assert!(call["id"].as_str().expect("id").starts_with("fc_"));
    assert!(call["call_id"]
        .as_str()
        .expect("call_id")
        .starts_with("call_"));
    let arguments: Value =
        serde_json::from_str(call["arguments"].as_str().expect("arguments")).expect("JSON");
    assert_eq!(
        arguments.as_object().expect("object").len(),
        2,
        "{arguments}"
    );
    assert!(arguments["unit"] == "celsius" || arguments["unit"] == "fahrenheit");

    // The same call streamed: its arguments in pieces, then whole.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, bytes) = send(f.router(), post("/v1/responses", &streamed.to_string())).await;
    assert_eq!(status, StatusCode::OK);
    let events: Vec<Value> = sse_data(&bytes)
        .iter()
        .map(|data| serde_json::from_str(data).expect("json"))
        .collect();
    let pieces: Vec<&str> = events
        .iter()
        .filter(|event| event["type"] == "response.function_call_arguments.delta")
        .map(|event| event["delta"].as_str().expect("delta"))
        .collect();
    assert!(pieces.len() > 2, "arguments stream in pieces: {pieces:?}");
    assert_eq!(
        pieces.concat(),
        call["arguments"].as_str().expect("arguments")
    );
    let done = events
        .iter()
        .find(|event| event["type"] == "response.function_call_arguments.done")
        .expect("arguments done");
    assert_eq!(done["arguments"], call["arguments"]);
    let added = &events[2];
    assert_eq!(added["type"], "response.output_item.added");
    assert_eq!(added["item"]["type"], "function_call");
    assert_eq!(added["item"]["name"], "get_weather");
    assert_eq!(added["item"]["arguments"], "");
    assert_eq!(events.last().expect("events")["type"], "response.completed");

    // The call's output goes back with the call (as a client echoes it, unset fields as
    // null); the model answers in text.
    let mut echoed = call.clone();
    echoed["namespace"] = Value::Null;
    let followup = json!({
        "input": [question, echoed, {"type": "function_call_output", "call_id": call["call_id"],
            "output": "{\"celsius\": 18}"}],
        "tools": weather(), "tool_choice": "none", "temperature": 0, "max_output_tokens": 30,
    });
    let (status, answer) = post_json(f.router(), "/v1/responses", &followup.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let output = answer["output"].as_array().expect("output");
    assert_eq!(output.len(), 1, "{answer}");
    assert_eq!(output[0]["type"], "message");
    let text = output[0]["content"][0]["text"].as_str().expect("text");
    assert!(!text.is_empty(), "{answer}");
    // The loop's prompt is the chat path's: the same conversation as chat messages answers
    // the same text.
    let chat = json!({
        "messages": [question,
            {"role": "assistant", "content": null, "tool_calls": [{"id": call["call_id"],
                "type": "function", "function": {"name": "get_weather", "arguments": call["arguments"]}}]},
            {"role": "tool", "tool_call_id": call["call_id"], "content": "{\"celsius\": 18}"}],
        "tools": [{"type": "function", "function": weather()[0].as_object().map(|tool| {
            let mut tool = tool.clone();
            tool.remove("type");
            tool
        })}],
        "tool_choice": "none", "temperature": 0, "max_tokens": 30,
    });
    let (status, chat) = post_json(f.router(), "/v1/chat/completions", &chat.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{chat}");
    assert_eq!(chat["choices"][0]["message"]["content"], text);
}

#[tokio::test]
async fn parallel_calls_stream_as_the_whole_response() {
    let Some(f) = hermes() else { return };
    let mut tools = weather();
    tools.as_array_mut().expect("tools").push(json!({"type": "function", "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}},
            "required": ["zone"], "additionalProperties": false}}));
    let body = json!({"input": "What are the weather and the time in Paris?", "tools": tools,
        "tool_choice": "required", "temperature": 0, "max_output_tokens": 160});
    let (status, whole) = post_json(f.router(), "/v1/responses", &body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let output = whole["output"].as_array().expect("output");
    assert!(!output.is_empty(), "{whole}");
    for (index, item) in output.iter().enumerate() {
        assert_eq!(item["type"], "function_call", "{whole}");
        let arguments = item["arguments"].as_str().expect("arguments");
        serde_json::from_str::<Value>(arguments).unwrap_or_else(|e| panic!("{whole}: {e}"));
        assert!(item["call_id"]
            .as_str()
            .expect("call_id")
            .ends_with(&format!("_{index}")));
    }
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, bytes) = send(f.router(), post("/v1/responses", &streamed.to_string())).await;
    let events: Vec<Value> = sse_data(&bytes)
        .iter()
        .map(|data| serde_json::from_str(data).expect("json"))
        .collect();
    let end = &events.last().expect("events")["response"];
    assert_eq!(without_ids(&end["output"]), without_ids(&whole["output"]));
    // Each call is added, grown and done before the next is added.
    let order: Vec<(String, u64)> = events
        .iter()
        .filter_map(|event| {
            let index = event["output_index"].as_u64()?;
            Some((event["type"].as_str()?.to_string(), index))
        })
        .collect();
    for window in order.windows(2) {
        let ((kind, index), (_, next)) = (&window[0], &window[1]);
        let expected = if kind == "response.output_item.done" {
            index + 1
        } else {
            *index
        };
        assert_eq!(*next, expected, "{order:?}");
    }
}
