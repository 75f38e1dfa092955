//! Several prompts in one `/v1/completions` request (strings, token-id arrays, streamed or
//! not; choice `prompt_index * n + i`), and graceful shutdown.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::StatusCode;
use common::*;
use runit_server::ServerConfig;
use serde_json::Value;

/// Room for every choice of the requests below at once (a request may ask for no more
/// sequences than run at once).
fn server() -> Option<Fixture> {
    let config = runit_engine::EngineConfig {
        max_sequences: 8,
        ..scheduler_config()
    };
    fixture(SYNTHETIC, config, ServerConfig::default())
}

const PROMPTS: [&str; 3] = ["Once upon a time", "The quick brown fox", "1, 2, 3,"];
const MAX_TOKENS: usize = 8;

/// Per choice index: the streamed text and the finish reason.
fn streamed_choices(body: &[u8]) -> BTreeMap<u64, (String, Option<String>)> {
    let events = sse_data(body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut choices: BTreeMap<u64, (String, Option<String>)> = BTreeMap::new();
    for event in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(event).expect("chunk json");
        assert_eq!(chunk["object"], "text_completion");
        for choice in chunk["choices"].as_array().expect("choices") {
            let entry = choices
                .entry(choice["index"].as_u64().expect("index"))
                .or_default();
            entry.0.push_str(choice["text"].as_str().expect("text"));
            if let Some(reason) = choice["finish_reason"].as_str() {
                assert!(entry.1.is_none(), "one finish reason per choice");
                entry.1 = Some(reason.to_string());
            }
        }
    }
    choices
}

#[tokio::test]
async fn several_prompts_answer_in_openai_index_order() {
    let Some(f) = server() else { return };
    let ids: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| f.tokenizer.encode(p, true, false))
        .collect();
    let expected: Vec<String> = ids.iter().map(|p| f.alone(p, MAX_TOKENS)).collect();
    assert!(
        expected.windows(2).any(|pair| pair[0] != pair[1]),
        "the prompts must give different texts for the order to be tested"
    );
    let n = 2;
    let request = format!(
        r#"{{"prompt": {PROMPTS:?}, "n": {n}, "temperature": 0, "max_tokens": {MAX_TOKENS}}}"#
    );
    let (status, body) = post_json(f.router(), "/v1/completions", &request).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let choices = body["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), PROMPTS.len() * n);
    for (index, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], index);
        assert_eq!(
            choice["text"],
            expected[index / n].as_str(),
            "choice {index}"
        );
        assert!(choice["finish_reason"].is_string());
    }
    let prompt_tokens: usize = ids.iter().map(Vec::len).sum();
    assert_eq!(body["usage"]["prompt_tokens"], prompt_tokens);

    // Streamed, the same texts arrive under the same indices.
    let streamed = request.replace("\"n\"", "\"stream\": true, \"n\"");
    let (status, bytes) = send(f.router(), post("/v1/completions", &streamed)).await;
    assert_eq!(status, StatusCode::OK);
    let streamed = streamed_choices(&bytes);
    assert_eq!(streamed.len(), PROMPTS.len() * n);
    for (index, (text, reason)) in &streamed {
        let whole = &choices[*index as usize];
        assert_eq!(text.as_str(), whole["text"], "streamed choice {index}");
        assert_eq!(reason.as_deref(), whole["finish_reason"].as_str());
    }
}

#[tokio::test]
async fn token_id_arrays_and_mixed_prompts() {
    let Some(f) = server() else { return };
    let ids: Vec<Vec<u32>> = PROMPTS[..2]
        .iter()
        .map(|p| f.tokenizer.encode(p, true, false))
        .collect();
    let expected: Vec<String> = ids.iter().map(|p| f.alone(p, MAX_TOKENS)).collect();
    let by_ids = format!(r#"{{"prompt": {ids:?}, "temperature": 0, "max_tokens": {MAX_TOKENS}}}"#);
    let mixed = format!(
        r#"{{"prompt": [{:?}, {:?}], "temperature": 0, "max_tokens": {MAX_TOKENS}}}"#,
        PROMPTS[0], ids[1]
    );
    for request in [&by_ids, &mixed] {
        let (status, body) = post_json(f.router(), "/v1/completions", request).await;
        assert_eq!(status, StatusCode::OK, "{request} -> {body}");
        let texts: Vec<&str> = body["choices"]
            .as_array()
            .expect("choices")
            .iter()
            .map(|c| c["text"].as_str().expect("text"))
            .collect();
        assert_eq!(texts, expected, "{request}");
    }
    // A single flat id array is still one prompt.
    let flat = format!(
        r#"{{"prompt": {:?}, "temperature": 0, "max_tokens": 4}}"#,
        ids[0]
    );
    let (status, body) = post_json(f.router(), "/v1/completions", &flat).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["choices"].as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn malformed_prompt_lists_name_the_field() {
    let Some(f) = server() else { return };
    let cases = [
        (r#"{"prompt": []}"#.to_string(), "prompt"),
        (r#"{"prompt": [[]]}"#.to_string(), "prompt[0]"),
        (r#"{"prompt": ["a", 5]}"#.to_string(), "prompt[1]"),
        (r#"{"prompt": ["a", {"b": 1}]}"#.to_string(), "prompt[1]"),
        (r#"{"prompt": [[1, -2]]}"#.to_string(), "prompt[0]"),
        (r#"{"prompt": [1, 2.5]}"#.to_string(), "prompt"),
        (
            r#"{"prompt": [[1], [4294967296]]}"#.to_string(),
            "prompt[1]",
        ),
        (format!(r#"{{"prompt": {:?}}}"#, vec!["a"; 17]), "prompt"),
        (format!(r#"{{"prompt": {:?}, "n": 16}}"#, vec!["a"; 5]), "n"),
        // More sequences than the server runs at once (8).
        (format!(r#"{{"prompt": {:?}, "n": 3}}"#, vec!["a"; 3]), "n"),
        (
            format!(r#"{{"prompt": ["a", {:?}]}}"#, "word ".repeat(CONTEXT * 2)),
            "prompt",
        ),
        (r#"{"prompt": [[1], [99999999]]}"#.to_string(), "prompt"),
    ];
    for (request, param) in cases {
        let (status, body) = post_json(f.router(), "/v1/completions", &request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{request} -> {body}");
        assert_eq!(body["error"]["param"], param, "{request} -> {body}");
    }
}

#[tokio::test]
async fn serve_until_returns_once_shutdown_completes() {
    use std::io::{Read, Write};
    let Some(f) = server() else { return };
    let listener = runit_server::bind("127.0.0.1", 0).await.expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(runit_server::serve_until(
        listener,
        Arc::clone(&f.state),
        async move {
            let _ = stopped.await;
        },
    ));
    let answer = tokio::task::spawn_blocking(move || {
        let mut connection = std::net::TcpStream::connect(address).expect("connect");
        connection
            .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .expect("write");
        let mut answer = String::new();
        connection.read_to_string(&mut answer).expect("read");
        answer
    })
    .await
    .expect("the client joins");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    stop.send(()).expect("server waits");
    let result = tokio::time::timeout(std::time::Duration::from_secs(10), server)
        .await
        .expect("the server stops")
        .expect("the task joins");
    assert!(result.is_ok(), "{result:?}");
}
