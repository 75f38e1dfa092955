//! OpenAI's `prediction` seeds the sequence's drafter: the answer is the model's own (the
//! greedy text of a lone run), `usage.completion_tokens_details` counts the predicted tokens
//! kept and rejected (in whole answers and in a stream's usage chunk), and a prediction
//! longer than the context is a 400 after which the server serves on.

mod common;

use axum::http::StatusCode;
use common::{fixture, post, post_json, scheduler_config, send, sse_data, Fixture, SYNTHETIC};
use runit_server::ServerConfig;
use serde_json::{json, Value};

const TOKENS: usize = 24;

fn server() -> Option<Fixture> {
    fixture(SYNTHETIC, scheduler_config(), ServerConfig::default())
}

fn request(prediction: &str, stream: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": TOKENS,
        "temperature": 0,
        "prediction": {"type": "content", "content": prediction},
        "stream": stream,
        "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
    })
}

#[tokio::test]
async fn a_prediction_speeds_nothing_up_but_its_drafts_and_keeps_the_answer() {
    let Some(f) = server() else { return };
    let expected = f.alone(&f.chat_prompt("Tell me a story"), TOKENS);
    let body = request(&expected, false).to_string();
    let (status, answer) = post_json(f.router(), "/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], expected);
    let details = &answer["usage"]["completion_tokens_details"];
    let accepted = details["accepted_prediction_tokens"]
        .as_u64()
        .expect("accepted");
    assert!(accepted > 0, "{answer}");
    assert!(details["rejected_prediction_tokens"].is_u64(), "{answer}");

    // A wrong prediction: drafts are rejected, the answer is the same.
    let body = request("something else entirely, nothing alike", false).to_string();
    let (status, answer) = post_json(f.router(), "/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], expected);

    // Streamed: the usage chunk carries the counts.
    let body = request(&expected, true).to_string();
    let (status, bytes) = send(f.router(), post("/v1/chat/completions", &body)).await;
    assert_eq!(status, StatusCode::OK);
    let usage = sse_data(&bytes)
        .iter()
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .find(|chunk| chunk["usage"].is_object())
        .expect("a usage chunk");
    let accepted = &usage["usage"]["completion_tokens_details"]["accepted_prediction_tokens"];
    assert!(accepted.as_u64().is_some_and(|n| n > 0), "{usage}");
}

#[tokio::test]
async fn a_prediction_longer_than_the_context_is_refused_and_the_server_serves_on() {
    let Some(f) = server() else { return };
    let long = "word ".repeat(2 * common::CONTEXT);
    let (status, answer) = post_json(
        f.router(),
        "/v1/chat/completions",
        &request(&long, false).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["param"], "prediction", "{answer}");
    let (status, answer) = post_json(
        f.router(),
        "/v1/chat/completions",
        &request("short", false).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let bad = json!({"messages": [{"role": "user", "content": "Hi"}],
                     "prediction": {"type": "content", "content": 3}});
    let (status, answer) = post_json(f.router(), "/v1/chat/completions", &bad.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["param"], "prediction.content", "{answer}");
}
