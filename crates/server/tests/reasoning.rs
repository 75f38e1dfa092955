//! Reasoning models: `<think>` blocks go to `reasoning_content` (and streamed
//! `delta.reasoning_content`), and `chat_template_kwargs` reaches the template. A grammar
//! makes SmolLM2 write the blocks, with a template in the style of Qwen 3
//! (`tests/data/templates/qwen3.jinja`).

mod common;

use axum::http::StatusCode;
use common::*;
use runit_server::ServerConfig;
use serde_json::{json, Value};

fn server() -> Option<Fixture> {
    fixture_with_template(
        SMOLLM2,
        scheduler_config(),
        ServerConfig::default(),
        Some(&template_fixture("qwen3")),
    )
}

fn body(grammar: &str, extra: Value) -> String {
    let mut body = json!({
        "messages": [{"role": "user", "content": "Is the sky blue?"}],
        "temperature": 0,
        "max_tokens": 40,
        "grammar": grammar,
    });
    for (key, value) in extra.as_object().expect("object") {
        body[key] = value.clone();
    }
    body.to_string()
}

const THINKING: &str = r#"root ::= "<think>" [a-z ]{1,30} "</think>" "\n\n" ("Yes." | "No.")"#;

#[tokio::test]
async fn think_blocks_become_reasoning_content() {
    let Some(f) = server() else { return };
    let (status, answer) = post_json(
        f.router(),
        "/v1/chat/completions",
        &body(THINKING, json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let message = &answer["choices"][0]["message"];
    let content = message["content"].as_str().expect("content");
    assert!(content == "Yes." || content == "No.", "{answer}");
    let reasoning = message["reasoning_content"].as_str().expect("reasoning");
    assert!(
        !reasoning.is_empty() && !reasoning.contains("think"),
        "{answer}"
    );

    let (status, bytes) = send(
        f.router(),
        post(
            "/v1/chat/completions",
            &body(THINKING, json!({"stream": true})),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let mut streamed = (String::new(), String::new());
    for data in sse_data(&bytes).iter().filter(|data| *data != "[DONE]") {
        let chunk: Value = serde_json::from_str(data).expect("json");
        let delta = &chunk["choices"][0]["delta"];
        streamed.0.push_str(delta["content"].as_str().unwrap_or(""));
        streamed
            .1
            .push_str(delta["reasoning_content"].as_str().unwrap_or(""));
    }
    assert_eq!(
        (streamed.0.as_str(), streamed.1.as_str()),
        (content, reasoning)
    );
}

#[tokio::test]
async fn template_kwargs_reach_the_template() {
    let Some(f) = server() else { return };
    // With `enable_thinking: false` the prompt holds an empty, closed think block.
    let answer_only = r#"root ::= "Yes." | "No.""#;
    let (status, plain) = post_json(
        f.router(),
        "/v1/chat/completions",
        &body(answer_only, json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{plain}");
    let kwargs = json!({"chat_template_kwargs": {"enable_thinking": false}});
    let (status, closed) = post_json(
        f.router(),
        "/v1/chat/completions",
        &body(answer_only, kwargs),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{closed}");
    let tokens = |answer: &Value| answer["usage"]["prompt_tokens"].as_u64().expect("tokens");
    assert!(tokens(&closed) > tokens(&plain), "{plain} {closed}");
    assert!(closed["choices"][0]["message"]["reasoning_content"].is_null());

    // A prompt that opens the block: the answer starts inside it.
    let inside = r#"root ::= [a-z ]{1,30} "</think>" "\n\n" ("Yes." | "No.")"#;
    let kwargs = json!({"chat_template_kwargs": {"open_think": true}});
    let (status, answer) =
        post_json(f.router(), "/v1/chat/completions", &body(inside, kwargs)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let message = &answer["choices"][0]["message"];
    assert!(
        message["content"] == "Yes." || message["content"] == "No.",
        "{answer}"
    );
    assert!(
        message["reasoning_content"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{answer}"
    );

    let reserved = json!({"chat_template_kwargs": {"messages": []}});
    let (status, answer) = post_json(
        f.router(),
        "/v1/chat/completions",
        &body(answer_only, reserved),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(answer["error"]["param"], "chat_template_kwargs.messages");
}
