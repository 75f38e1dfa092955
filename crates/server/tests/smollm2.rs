//! A smoke test on SmolLM2-135M-Instruct: a chat answer through the server equals the same
//! conversation generated alone, and it is real text.

mod common;

use axum::http::StatusCode;
use common::*;
use runit_server::ServerConfig;

#[tokio::test]
async fn chat_answer_equals_lone_generation() {
    let Some(f) = fixture(SMOLLM2, scheduler_config(), ServerConfig::default()) else {
        return;
    };
    let request = r#"{"messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0, "max_tokens": 16}"#;
    let (status, body) = post_json(f.router(), "/v1/chat/completions", request).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let content = body["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    let expected = f.alone(&f.chat_prompt("What is the capital of France?"), 16);
    assert_eq!(content, expected);
    assert!(content.contains("Paris"), "{content:?}");
}
