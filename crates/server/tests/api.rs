//! The HTTP API on the tiny synthetic model: endpoints, greedy outputs equal to a lone
//! `generate`, streaming, stop strings, concurrency, cancellation and error bodies.

mod common;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::*;
use http_body_util::BodyExt;
use runit_engine::EngineConfig;
use runit_server::ServerConfig;
use serde_json::Value;
use tower::ServiceExt;

fn server() -> Option<Fixture> {
    fixture(SYNTHETIC, scheduler_config(), ServerConfig::default())
}

fn completion_body(prompt: &str, extra: &str) -> String {
    format!(r#"{{"prompt": {prompt:?}, "temperature": 0, "max_tokens": 12{extra}}}"#)
}

#[tokio::test]
async fn health_and_models() {
    let Some(f) = fixture(
        SYNTHETIC,
        scheduler_config(),
        ServerConfig {
            model_name: "tiny".into(),
            ..ServerConfig::default()
        },
    ) else {
        return;
    };
    let (status, body) = send(f.router(), get("/health")).await;
    assert_eq!(status, StatusCode::OK);
    let health: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(health["status"], "ok");
    let (status, body) = send(f.router(), get("/v1/models")).await;
    assert_eq!(status, StatusCode::OK);
    let models: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(models["data"][0]["meta"]["n_ctx"], CONTEXT);
}

#[tokio::test]
async fn completion_equals_lone_generation() {
    let Some(f) = server() else { return };
    let prompt = "Once upon a time";
    let ids = f.tokenizer.encode(prompt, true, false);
    let expected = f.alone(&ids, 12);
    assert!(!expected.is_empty(), "the model answers something");
    let (status, body) =
        post_json(f.router(), "/v1/completions", &completion_body(prompt, "")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["choices"][0]["text"], expected.as_str());
    assert_eq!(body["usage"]["prompt_tokens"], ids.len());
    let completion = body["usage"]["completion_tokens"].as_u64().expect("count");
    assert!((1..=12).contains(&completion));
    let reason = body["choices"][0]["finish_reason"]
        .as_str()
        .expect("reason");
    assert_eq!(reason, if completion == 12 { "length" } else { "stop" });
    // The same prompt given as token ids.
    let token_body = format!(r#"{{"prompt": {ids:?}, "temperature": 0, "max_tokens": 12}}"#);
    let (status, by_ids) = post_json(f.router(), "/v1/completions", &token_body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(by_ids["choices"][0]["text"], expected.as_str());
}

#[tokio::test]
async fn chat_streams_what_it_answers_in_one_body() {
    let Some(f) = server() else { return };
    let request = r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}],
        "temperature": 0, "max_completion_tokens": 10, "logprobs": true, "top_logprobs": 2}"#;
    let (status, whole) = post_json(f.router(), "/v1/chat/completions", request).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let prompt = f.chat_prompt("Hello");
    let content = whole["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert_eq!(content, f.alone(&prompt, 10));
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    assert_eq!(whole["usage"]["prompt_tokens"], prompt.len());
    let logprobs = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs");
    assert_eq!(
        logprobs.len() as u64,
        whole["usage"]["completion_tokens"].as_u64().expect("n")
    );
    for entry in logprobs {
        let top = entry["top_logprobs"].as_array().expect("top");
        assert_eq!(top.len(), 2);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(entry["logprob"], top[0]["logprob"]);
    }

    let streamed = request.replace(
        "\"temperature\"",
        "\"stream\": true, \"stream_options\": {\"include_usage\": true}, \"temperature\"",
    );
    let (status, body) = send(f.router(), post("/v1/chat/completions", &streamed)).await;
    assert_eq!(status, StatusCode::OK);
    let events = sse_data(&body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk json"))
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut text = String::new();
    let mut reasons = Vec::new();
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        if let Some(choice) = chunk["choices"].get(0) {
            text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            if let Some(reason) = choice["finish_reason"].as_str() {
                reasons.push(reason.to_string());
            }
        }
    }
    assert_eq!(text, content);
    assert_eq!(
        reasons,
        vec![whole["choices"][0]["finish_reason"]
            .as_str()
            .expect("r")
            .to_string()]
    );
    let usage = &chunks.last().expect("usage chunk")["usage"];
    // The streamed request repeats the first, so its prompt may come from the prefix cache:
    // the counts are equal but for that.
    let cached = |usage: &Value| usage["prompt_tokens_details"]["cached_tokens"].as_u64();
    let rest = |usage: &Value| {
        let mut usage = usage.clone();
        usage
            .as_object_mut()
            .expect("an object")
            .remove("prompt_tokens_details");
        usage
    };
    assert_eq!(rest(usage), rest(&whole["usage"]));
    assert!(
        cached(usage) >= cached(&whole["usage"]),
        "{usage} {}",
        whole["usage"]
    );
}

#[tokio::test]
async fn stop_string_cuts_the_text() {
    let Some(f) = server() else { return };
    let prompt = "The quick brown fox";
    let full = f.alone(&f.tokenizer.encode(prompt, true, false), 12);
    let chars: Vec<char> = full.chars().collect();
    if chars.len() < 6 {
        eprintln!("skipping: the synthetic model's answer is too short ({full:?})");
        return;
    }
    // A stop string from the middle of the answer, likely spanning a token boundary.
    let stop: String = chars[3..6].iter().collect();
    let cut = &full[..full.find(&stop).expect("stop occurs")];
    let body = completion_body(prompt, &format!(r#", "stop": [{stop:?}]"#));
    let (status, answer) = post_json(f.router(), "/v1/completions", &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["choices"][0]["text"], cut);
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    let streamed = completion_body(prompt, &format!(r#", "stop": {stop:?}, "stream": true"#));
    let (_, events) = send(f.router(), post("/v1/completions", &streamed)).await;
    let text: String = sse_data(&events)
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| {
            let chunk: Value = serde_json::from_str(e).expect("json");
            chunk["choices"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(text, cut);
    assert!(f.state.scheduler.wait_idle(Duration::from_secs(30)));
    let stats = f.state.scheduler.stats();
    assert_eq!(stats.free_blocks, stats.total_blocks);
}

#[tokio::test]
async fn concurrent_requests_equal_lone_runs_and_free_their_blocks() {
    let Some(f) = server() else { return };
    let prompts = [
        "alpha beta",
        "one two three four five",
        "x",
        "hello world, how are",
    ];
    let expected: Vec<String> = prompts
        .iter()
        .map(|p| f.alone(&f.tokenizer.encode(p, true, false), 12))
        .collect();
    let bodies: Vec<String> = prompts.iter().map(|p| completion_body(p, "")).collect();
    let requests = bodies
        .iter()
        .map(|body| post_json(f.router(), "/v1/completions", body));
    let answers = futures::future::join_all(requests).await;
    for (i, (status, body)) in answers.iter().enumerate() {
        assert_eq!(*status, StatusCode::OK);
        assert_eq!(
            body["choices"][0]["text"],
            expected[i].as_str(),
            "prompt {i}"
        );
    }
    // n = 2 greedy choices are both the greedy answer.
    let (_, two) = post_json(
        f.router(),
        "/v1/completions",
        &completion_body(prompts[0], r#", "n": 2"#),
    )
    .await;
    assert_eq!(two["choices"][1]["text"], expected[0].as_str());
    assert_eq!(two["choices"][1]["index"], 1);
    assert!(f.state.scheduler.wait_idle(Duration::from_secs(30)));
    let stats = f.state.scheduler.stats();
    assert_eq!(stats.free_blocks, stats.total_blocks);
}

#[tokio::test]
async fn dropped_stream_cancels_its_sequence() {
    let Some(f) = server() else { return };
    let body = r#"{"prompt": "tell me a long story", "max_tokens": 200, "stream": true, "temperature": 0}"#;
    let response = f
        .router()
        .oneshot(post("/v1/completions", body))
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

async fn expect_error(
    f: &Fixture,
    path: &str,
    body: &str,
    status: StatusCode,
    param: Option<&str>,
) {
    let (got, answer) = post_json(f.router(), path, body).await;
    assert_eq!(got, status, "{body} -> {answer}");
    let error = &answer["error"];
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{answer}"
    );
    assert!(error["type"].is_string(), "{answer}");
    if let Some(param) = param {
        assert_eq!(error["param"], param, "{body} -> {answer}");
    }
}

#[tokio::test]
async fn malformed_requests_get_openai_error_bodies() {
    let Some(f) = server() else { return };
    let chat = "/v1/chat/completions";
    let completions = "/v1/completions";
    let bad = StatusCode::BAD_REQUEST;
    expect_error(&f, chat, "{not json", bad, None).await;
    expect_error(&f, chat, "[1, 2]", bad, None).await;
    expect_error(&f, chat, r#"{"messages": []}"#, bad, Some("messages")).await;
    expect_error(&f, chat, r#"{"messages": "hi"}"#, bad, Some("messages")).await;
    expect_error(
        &f,
        chat,
        r#"{"messages": [{"role": "wizard", "content": "hi"}]}"#,
        bad,
        Some("messages[0].role"),
    )
    .await;
    expect_error(
        &f,
        chat,
        r#"{"messages": [{"role": "user", "content": 5}]}"#,
        bad,
        Some("messages[0].content"),
    )
    .await;
    let hi = r#""messages": [{"role": "user", "content": "hi"}]"#;
    expect_error(
        &f,
        chat,
        &format!(r#"{{{hi}, "temperature": "hot"}}"#),
        bad,
        Some("temperature"),
    )
    .await;
    expect_error(
        &f,
        chat,
        &format!(r#"{{{hi}, "ignore_eos": 1}}"#),
        bad,
        Some("ignore_eos"),
    )
    .await;
    expect_error(
        &f,
        chat,
        &format!(r#"{{{hi}, "max_tokens": 0}}"#),
        bad,
        Some("max_tokens"),
    )
    .await;
    expect_error(
        &f,
        chat,
        &format!(r#"{{{hi}, "max_tokens": -3}}"#),
        bad,
        Some("max_tokens"),
    )
    .await;
    expect_error(
        &f,
        chat,
        &format!(r#"{{{hi}, "max_tokens": 100000}}"#),
        bad,
        Some("max_tokens"),
    )
    .await;
    expect_error(
        &f,
        chat,
        &format!(r#"{{{hi}, "stop": [1]}}"#),
        bad,
        Some("stop[0]"),
    )
    .await;
    expect_error(&f, chat, &format!(r#"{{{hi}, "n": 0}}"#), bad, Some("n")).await;
    expect_error(
        &f,
        chat,
        &format!(r#"{{{hi}, "model": "gpt-9"}}"#),
        StatusCode::NOT_FOUND,
        Some("model"),
    )
    .await;
    let long = "word ".repeat(CONTEXT * 2);
    expect_error(
        &f,
        completions,
        &format!(r#"{{"prompt": {long:?}}}"#),
        bad,
        Some("prompt"),
    )
    .await;
    expect_error(
        &f,
        completions,
        r#"{"prompt": {"a": 1}}"#,
        bad,
        Some("prompt"),
    )
    .await;
    expect_error(
        &f,
        completions,
        r#"{"prompt": "x", "logprobs": true}"#,
        bad,
        Some("logprobs"),
    )
    .await;
    let (status, body) = send(f.router(), get("/v1/nothing")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(serde_json::from_slice::<Value>(&body).expect("json")["error"].is_object());
}

#[tokio::test]
async fn body_limit_and_api_key() {
    let Some(f) = fixture(
        SYNTHETIC,
        scheduler_config(),
        ServerConfig {
            api_key: Some("sesame".into()),
            max_body_bytes: 1024,
            ..ServerConfig::default()
        },
    ) else {
        return;
    };
    let body = completion_body("hi", "");
    let (status, answer) = post_json(f.router(), "/v1/completions", &body).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(answer["error"]["code"], "invalid_api_key");
    let with_key = |key: &str, body: String| {
        Request::post("/v1/completions")
            .header("authorization", format!("Bearer {key}"))
            .body(Body::from(body))
            .expect("request")
    };
    let (status, _) = send(f.router(), with_key("wrong", body.clone())).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = send(f.router(), with_key("sesame", body)).await;
    assert_eq!(status, StatusCode::OK);
    let huge = completion_body(&"a".repeat(4096), "");
    let (status, answer) = send(f.router(), with_key("sesame", huge)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let answer: Value = serde_json::from_slice(&answer).expect("json");
    assert_eq!(answer["error"]["code"], "request_too_large");
    // /health needs no key.
    let (status, _) = send(f.router(), get("/health")).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn full_queue_answers_503() {
    let Some(f) = fixture(
        SYNTHETIC,
        EngineConfig {
            max_sequences: 1,
            max_queued: 1,
            ..scheduler_config()
        },
        ServerConfig::default(),
    ) else {
        return;
    };
    let body = r#"{"prompt": "a b c", "max_tokens": 100, "temperature": 0}"#;
    let requests = (0..6).map(|_| post_json(f.router(), "/v1/completions", body));
    let answers = futures::future::join_all(requests).await;
    let unavailable: Vec<&Value> = answers
        .iter()
        .filter(|(status, _)| *status == StatusCode::SERVICE_UNAVAILABLE)
        .map(|(_, body)| body)
        .collect();
    assert!(!unavailable.is_empty(), "no request was refused");
    assert_eq!(unavailable[0]["error"]["code"], "queue_full");
    assert!(answers.iter().any(|(status, _)| *status == StatusCode::OK));
}
