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

/// `ignore_eos` keeps generating past the end-of-generation token the answer ends with, up to
/// `max_tokens`; the text before it is the same.
#[tokio::test]
async fn ignore_eos_runs_to_max_tokens() {
    let Some(f) = fixture(SMOLLM2, scheduler_config(), ServerConfig::default()) else {
        return;
    };
    let request = |extra: &str| {
        format!(
            r#"{{"messages": [{{"role": "user", "content": "What is the capital of France?"}}],
            "temperature": 0, "max_tokens": 48{extra}}}"#
        )
    };
    let (status, ended) = post_json(f.router(), "/v1/chat/completions", &request("")).await;
    assert_eq!(status, StatusCode::OK, "{ended}");
    assert_eq!(ended["choices"][0]["finish_reason"], "stop", "{ended}");
    let stopped_at = ended["usage"]["completion_tokens"].as_u64().expect("count");
    assert!(stopped_at < 48, "{ended}");
    let (status, body) = post_json(
        f.router(),
        "/v1/chat/completions",
        &request(r#", "ignore_eos": true"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 48, "{body}");
    let short = ended["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    let long = body["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert!(long.starts_with(short), "{short:?} / {long:?}");
}
