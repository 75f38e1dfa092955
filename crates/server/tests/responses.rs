//! `POST /v1/responses` on SmolLM2: the response object and its items agree with the chat
//! path on the same conversation (text, usage, log-probabilities), the stream's events
//! build the same response in OpenAI's order, a token limit makes it `incomplete`,
//! `text.format` shapes the output, `<think>` text becomes a `reasoning` item, and flat
//! function tools run a full loop (call, `function_call_output`, answer).

mod common;

use std::time::Duration;

use axum::http::StatusCode;
use common::*;
use http_body_util::BodyExt;
use runit_server::ServerConfig;
use serde_json::{json, Value};
use tower::ServiceExt;

fn server() -> Option<Fixture> {
    fixture(SMOLLM2, scheduler_config(), ServerConfig::default())
}

/// The events of a streamed response: each `data` payload, parsed.
async fn events(f: &Fixture, body: &Value) -> Vec<Value> {
    let (status, bytes) = send(f.router(), post("/v1/responses", &body.to_string())).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let events: Vec<Value> = sse_data(&bytes)
        .iter()
        .map(|data| serde_json::from_str(data).expect("json"))
        .collect();
    // Each event is named by its type, and numbered from 0 in order.
    let names: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("event: "))
        .collect();
    assert_eq!(names.len(), events.len(), "{text}");
    for (n, (event, name)) in events.iter().zip(&names).enumerate() {
        assert_eq!(event["type"], *name, "{event}");
        assert_eq!(event["sequence_number"], n, "{event}");
    }
    events
}

fn types(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|event| event["type"].as_str().expect("type"))
        .collect()
}

#[tokio::test]
async fn a_response_matches_the_chat_answer_to_the_same_conversation() {
    let Some(f) = server() else { return };
    let body = json!({
        "model": "runit", "instructions": "Answer briefly.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "What is the capital of France?"}]}],
        "temperature": 0, "max_output_tokens": 24, "metadata": {"ticket": "42"},
        "include": ["message.output_text.logprobs"], "top_logprobs": 2, "store": false,
    });
    let (status, response) = post_json(f.router(), "/v1/responses", &body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{response}");
    let chat = json!({
        "messages": [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0, "max_tokens": 24, "logprobs": true, "top_logprobs": 2,
    });
    let (_, chat) = post_json(f.router(), "/v1/chat/completions", &chat.to_string()).await;
    let choice = &chat["choices"][0];
    assert!(response["id"].as_str().expect("id").starts_with("resp_"));
    assert_eq!(response["object"], "response");
    assert!(response["created_at"].as_u64().expect("created_at") > 1_700_000_000);
    assert_eq!(response["model"], "runit");
    assert_eq!(response["metadata"], json!({"ticket": "42"}));
    assert_eq!(response["instructions"], "Answer briefly.");
    assert_eq!(response["max_output_tokens"], 24);
    assert_eq!(response["temperature"], 0);
    assert_eq!(response["store"], false);
    assert_eq!(response["top_logprobs"], 2);
    assert_eq!(response["text"], json!({"format": {"type": "text"}}));
    assert_eq!(response["tools"], json!([]));
    let (status, reason) = match choice["finish_reason"].as_str() {
        Some("length") => ("incomplete", json!({"reason": "max_output_tokens"})),
        _ => ("completed", Value::Null),
    };
    assert_eq!(response["status"], status, "{response}");
    assert_eq!(response["incomplete_details"], reason, "{response}");
    let output = response["output"].as_array().expect("output");
    assert_eq!(output.len(), 1, "{response}");
    let message = &output[0];
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["status"], status);
    assert!(message["id"].as_str().expect("id").starts_with("msg_"));
    let part = &message["content"][0];
    assert_eq!(part["type"], "output_text");
    assert_eq!(part["annotations"], json!([]));
    assert_eq!(part["text"], choice["message"]["content"], "{response}");
    assert!(!part["text"].as_str().expect("text").is_empty());
    assert_eq!(part["logprobs"], choice["logprobs"]["content"]);
    let usage = &response["usage"];
    assert_eq!(usage["input_tokens"], chat["usage"]["prompt_tokens"]);
    assert_eq!(usage["output_tokens"], chat["usage"]["completion_tokens"]);
    assert_eq!(usage["total_tokens"], chat["usage"]["total_tokens"]);
    assert_eq!(usage["input_tokens_details"]["cached_tokens"], 0);
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 0);

    // A string input is one user message.
    let plain = json!({"input": "What is the capital of France?", "temperature": 0, "max_output_tokens": 12});
    let (_, plain) = post_json(f.router(), "/v1/responses", &plain.to_string()).await;
    let chat = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0, "max_tokens": 12});
    let (_, chat) = post_json(f.router(), "/v1/chat/completions", &chat.to_string()).await;
    assert_eq!(
        plain["output"][0]["content"][0]["text"],
        chat["choices"][0]["message"]["content"]
    );
}

#[tokio::test]
async fn a_token_limit_makes_the_response_incomplete() {
    let Some(f) = server() else { return };
    let body = json!({"input": "Tell me a long story about a dragon.", "temperature": 0, "max_output_tokens": 3});
    let (status, response) = post_json(f.router(), "/v1/responses", &body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{response}");
    assert_eq!(response["status"], "incomplete");
    assert_eq!(
        response["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(response["output"][0]["status"], "incomplete");
    assert_eq!(response["usage"]["output_tokens"], 3);
}

#[tokio::test]
async fn streamed_events_build_the_same_response() {
    let Some(f) = server() else { return };
    for limit in [40, 4] {
        let body = json!({"input": "Name three colours.", "temperature": 0, "max_output_tokens": limit,
            "include": ["message.output_text.logprobs"]});
        let (_, whole) = post_json(f.router(), "/v1/responses", &body.to_string()).await;
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let events = events(&f, &streamed).await;
        let kinds = types(&events);
        let deltas = kinds
            .iter()
            .filter(|kind| **kind == "response.output_text.delta")
            .count();
        assert!(deltas >= 2, "{kinds:?}");
        let last = if whole["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        let mut expected = vec![
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ];
        expected.extend(vec!["response.output_text.delta"; deltas]);
        expected.extend([
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            last,
        ]);
        assert_eq!(kinds, expected);
        assert_eq!(events[0]["response"]["status"], "in_progress");
        assert_eq!(events[0]["response"]["output"], json!([]));
        let text: String = events
            .iter()
            .filter(|event| event["type"] == "response.output_text.delta")
            .map(|event| event["delta"].as_str().expect("delta"))
            .collect();
        let whole_part = &whole["output"][0]["content"][0];
        assert_eq!(text, whole_part["text"].as_str().expect("text"));
        let logprobs: Vec<Value> = events
            .iter()
            .filter(|event| event["type"] == "response.output_text.delta")
            .flat_map(|event| event["logprobs"].as_array().expect("logprobs").clone())
            .collect();
        assert_eq!(Value::Array(logprobs), whole_part["logprobs"]);
        let done = &events[events.len() - 2]["item"];
        let item_id = done["id"].as_str().expect("id");
        assert!(events[2..events.len() - 1]
            .iter()
            .all(|event| event["item_id"] == item_id || event["item"]["id"] == item_id));
        let end = &events[events.len() - 1]["response"];
        assert_eq!(end["status"], whole["status"]);
        // The stream repeats the whole request, whose prompt the prefix cache may now serve:
        // the counts are equal but for that.
        let cached = |usage: &Value| usage["input_tokens_details"]["cached_tokens"].as_u64();
        let rest = |usage: &Value| {
            let mut usage = usage.clone();
            usage["input_tokens_details"]["cached_tokens"] = json!(null);
            usage
        };
        assert_eq!(rest(&end["usage"]), rest(&whole["usage"]));
        assert!(cached(&end["usage"]) >= cached(&whole["usage"]));
        assert_eq!(end["output"][0]["content"], whole["output"][0]["content"]);
        assert_eq!(end["output"][0], *done);
    }
}

#[tokio::test]
async fn a_dropped_stream_cancels_its_sequence() {
    let Some(f) = server() else { return };
    let body = json!({"input": "Tell me a long story.", "max_output_tokens": 200,
        "stream": true, "temperature": 0});
    let response = f
        .router()
        .oneshot(post("/v1/responses", &body.to_string()))
        .await
        .expect("answer");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let first = body.frame().await.expect("a frame").expect("frame ok");
    assert!(first.is_data());
    drop(body);
    assert!(f.state.scheduler.wait_idle(Duration::from_secs(30)));
    let stats = f.state.scheduler.stats();
    assert_eq!(stats.free_blocks, stats.total_blocks);
}

#[tokio::test]
async fn text_format_shapes_the_output() {
    let Some(f) = server() else { return };
    let schema = json!({"type": "object", "properties": {"colour": {"enum": ["red", "green"]}},
        "required": ["colour"], "additionalProperties": false});
    let format = json!({"type": "json_schema", "name": "c", "schema": schema, "strict": true});
    let body = json!({"input": "A colour?", "temperature": 0.7, "max_output_tokens": 30,
        "text": {"format": format}});
    let (status, response) = post_json(f.router(), "/v1/responses", &body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{response}");
    let text = response["output"][0]["content"][0]["text"]
        .as_str()
        .expect("text");
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    assert!(
        value == json!({"colour": "red"}) || value == json!({"colour": "green"}),
        "{text}"
    );
    assert_eq!(response["text"]["format"], format);
}

const THINKING: &str = r#"root ::= "<think>" [a-z ]{1,30} "</think>" "\n\n" ("Yes." | "No.")"#;

#[tokio::test]
async fn think_blocks_become_a_reasoning_item() {
    let Some(f) = with_template_fixture("qwen3") else {
        return;
    };
    let body = json!({"input": "Is the sky blue?", "temperature": 0, "max_output_tokens": 40,
        "grammar": THINKING});
    let (status, response) = post_json(f.router(), "/v1/responses", &body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{response}");
    let output = response["output"].as_array().expect("output");
    assert_eq!(output.len(), 2, "{response}");
    assert_eq!(output[0]["type"], "reasoning");
    assert!(output[0]["id"].as_str().expect("id").starts_with("rs_"));
    let reasoning = output[0]["content"][0]["text"].as_str().expect("text");
    assert!(
        !reasoning.is_empty() && !reasoning.contains("think"),
        "{response}"
    );
    assert_eq!(output[0]["content"][0]["type"], "reasoning_text");
    let answer = output[1]["content"][0]["text"].as_str().expect("text");
    assert!(answer == "Yes." || answer == "No.", "{response}");
    let usage = &response["usage"];
    let thinking = usage["output_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .expect("reasoning_tokens");
    let answer_tokens = f.tokenizer.encode(answer, false, false).len() as u64;
    assert!(thinking > 0, "{usage}");
    assert!(
        thinking + answer_tokens <= usage["output_tokens"].as_u64().expect("output"),
        "{usage}"
    );

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = events(&f, &streamed).await;
    let text: String = events
        .iter()
        .filter(|event| event["type"] == "response.reasoning_text.delta")
        .map(|event| event["delta"].as_str().expect("delta"))
        .collect();
    assert_eq!(text, reasoning);
    let done = events
        .iter()
        .find(|event| event["type"] == "response.reasoning_text.done")
        .expect("reasoning done");
    assert_eq!(done["text"], reasoning);
    let end = events.last().expect("events");
    assert_eq!(
        without_ids(&end["response"]["output"]),
        without_ids(&response["output"])
    );
}
