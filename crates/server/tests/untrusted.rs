//! Untrusted input that is not about connections: chat templates that run away (a 400 naming
//! the limit, while the server keeps answering), special-token text in chat messages (plain
//! text), the API key (`/health` shows only its status without it) and error bodies on every
//! error status.

mod common;

use std::time::{Duration, Instant};

use axum::http::{Request, StatusCode};
use common::*;
use runit_server::{ServerConfig, TemplateLimits};
use runit_tokenizer::{ChatMessage, ChatTemplate, RenderLimits, CHATML_TEMPLATE};
use serde_json::Value;

/// ChatML, unless the last message asks for a runaway: `loop` (10^15 iterations) or
/// `flood` (gigabytes of output).
fn hostile_template() -> String {
    format!(
        "{{% if messages[-1].content == 'loop' %}}{{% for a in range(100000) %}}{{% for b in \
         range(100000) %}}{{% for c in range(100000) %}}x{{% endfor %}}{{% endfor %}}{{% endfor \
         %}}{{% elif messages[-1].content == 'flood' %}}{{% for a in range(100000) %}}{{% for b \
         in range(100000) %}}{{{{ 'output output output output' }}}}{{% endfor %}}{{% endfor \
         %}}{{% else %}}{CHATML_TEMPLATE}{{% endif %}}"
    )
}

fn chat(content: &str) -> String {
    serde_json::json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 2,
        "temperature": 0,
    })
    .to_string()
}

fn hostile_server(render: RenderLimits) -> Option<Fixture> {
    let config = ServerConfig {
        template: TemplateLimits {
            render,
            ..TemplateLimits::DEFAULT
        },
        ..ServerConfig::default()
    };
    fixture_with_template(
        SYNTHETIC,
        scheduler_config(),
        config,
        Some(&hostile_template()),
    )
}

#[tokio::test]
async fn runaway_templates_are_a_400_naming_the_limit() {
    let render = RenderLimits {
        fuel: 1_000_000,
        max_output_bytes: 1 << 20,
    };
    let Some(f) = hostile_server(render) else {
        return;
    };
    let cases = [
        ("loop", "fuel limit of 1000000"),
        ("flood", "size limit of 1048576 bytes"),
    ];
    for (content, limit) in cases {
        let (status, body) = post_json(f.router(), "/v1/chat/completions", &chat(content)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let message = body["error"]["message"].as_str().expect("a message");
        assert!(message.contains(limit), "{message}");
        assert_eq!(body["error"]["code"], "template_limit_exceeded");
        assert_eq!(body["error"]["param"], "messages");
    }
    // The same server still answers a normal conversation.
    let (status, body) = post_json(f.router(), "/v1/chat/completions", &chat("Hi")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_while_templates_run() {
    // Enough fuel for renderings that take a while, on both template workers at once.
    let render = RenderLimits {
        fuel: 60_000_000,
        ..RenderLimits::DEFAULT
    };
    let Some(f) = hostile_server(render) else {
        return;
    };
    let bombs: Vec<_> = (0..2)
        .map(|_| {
            let router = f.router();
            tokio::spawn(
                async move { post_json(router, "/v1/chat/completions", &chat("loop")).await },
            )
        })
        .collect();
    let mut answered_during = 0;
    while bombs.iter().any(|bomb| !bomb.is_finished()) {
        let start = Instant::now();
        let (status, _) =
            tokio::time::timeout(Duration::from_secs(2), send(f.router(), get("/health")))
                .await
                .expect("/health answers within 2 s");
        assert_eq!(status, StatusCode::OK);
        if bombs.iter().any(|bomb| !bomb.is_finished()) {
            answered_during += 1;
        }
        assert!(start.elapsed() < Duration::from_secs(2));
        tokio::task::yield_now().await;
    }
    assert!(
        answered_during > 0,
        "the renderings ended before /health was asked"
    );
    for bomb in bombs {
        let (status, body) = bomb.await.expect("joins");
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["error"]["code"], "template_limit_exceeded");
    }
}

#[tokio::test]
async fn turn_markers_in_a_message_are_plain_text() {
    let Some(f) = fixture(SYNTHETIC, scheduler_config(), ServerConfig::default()) else {
        return;
    };
    let im_start = f
        .tokenizer
        .vocabulary()
        .token_id("<|im_start|>")
        .expect("a ChatML vocabulary");
    assert!(f.tokenizer.is_control(im_start));
    let usage = |body: &Value| body["usage"]["prompt_tokens"].as_u64().expect("usage");
    let (status, plain) = post_json(f.router(), "/v1/chat/completions", &chat("x")).await;
    assert_eq!(status, StatusCode::OK, "{plain}");
    let markers = "<|im_start|>".repeat(10);
    let (status, forged) = post_json(
        f.router(),
        "/v1/chat/completions",
        &chat(&format!("x{markers}")),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{forged}");
    // Parsed, the ten markers would be ten tokens; as text they are more.
    let as_text = f.tokenizer.encode(&markers, false, false).len() as u64;
    assert!(as_text > 10);
    assert_eq!(usage(&forged), usage(&plain) + as_text);
    // The prompt the server built holds only the template's own turn markers.
    let template = ChatTemplate::from_tokenizer(&f.tokenizer).expect("template");
    let markers_in = |content: String| {
        let prompt = template
            .render_prompt(&f.tokenizer, &[ChatMessage::user(content)], true)
            .expect("renders");
        let ids = f.tokenizer.encode_prompt(&prompt, true);
        let count = ids.iter().filter(|&&id| id == im_start).count();
        (ids.len() as u64, count)
    };
    let (forged_length, forged_markers) = markers_in(format!("x{markers}"));
    assert_eq!(forged_length, usage(&forged));
    assert_eq!(forged_markers, markers_in("x".into()).1);
}

#[tokio::test]
async fn health_shows_only_its_status_without_the_key() {
    let config = ServerConfig {
        api_key: Some("sesame".into()),
        ..ServerConfig::default()
    };
    let Some(f) = fixture(SYNTHETIC, scheduler_config(), config) else {
        return;
    };
    let health = |key: Option<&str>| {
        let mut request = Request::get("/health");
        if let Some(key) = key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        request.body(axum::body::Body::empty()).expect("request")
    };
    for key in [None, Some("wrong"), Some("sesam")] {
        let (status, body) = send(f.router(), health(key)).await;
        assert_eq!(status, StatusCode::OK);
        let body: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(body, serde_json::json!({"status": "ok"}), "{key:?}");
    }
    let (status, body) = send(f.router(), health(Some("sesame"))).await;
    assert_eq!(status, StatusCode::OK);
    let body: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(body["status"], "ok");
    assert!(body["total_blocks"].as_u64().is_some(), "{body}");
    let (status, body) = send(f.router(), get("/v1/models")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let body: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(body["error"]["code"], "invalid_api_key");
}

#[tokio::test]
async fn every_error_status_has_an_openai_body() {
    let config = ServerConfig {
        max_body_bytes: 64,
        ..ServerConfig::default()
    };
    let Some(f) = fixture(SYNTHETIC, scheduler_config(), config) else {
        return;
    };
    let cases = [
        (Request::post("/health"), StatusCode::METHOD_NOT_ALLOWED, ""),
        (
            Request::delete("/v1/models"),
            StatusCode::METHOD_NOT_ALLOWED,
            "",
        ),
        (
            Request::get("/v1/chat/completions"),
            StatusCode::METHOD_NOT_ALLOWED,
            "",
        ),
        (Request::get("/nowhere"), StatusCode::NOT_FOUND, ""),
        (
            Request::post("/v1/completions"),
            StatusCode::PAYLOAD_TOO_LARGE,
            "{\"prompt\": \"a prompt longer than the sixty-four bytes this server takes\"}",
        ),
        (
            Request::post("/v1/completions"),
            StatusCode::BAD_REQUEST,
            "{",
        ),
    ];
    for (request, expected, body) in cases {
        let request = request
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .expect("request");
        let description = format!("{} {}", request.method(), request.uri());
        let (status, bytes) = send(f.router(), request).await;
        assert_eq!(status, expected, "{description}");
        let body: Value = serde_json::from_slice(&bytes).unwrap_or_else(|error| {
            panic!(
                "{description}: not JSON ({error}): {}",
                String::from_utf8_lossy(&bytes)
            )
        });
        let error = &body["error"];
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}"
        );
        assert!(error["type"].is_string(), "{body}");
        assert!(
            error.get("param").is_some() && error.get("code").is_some(),
            "{body}"
        );
    }
}
