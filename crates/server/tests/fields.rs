//! Every field of OpenAI's chat-completions and completions requests is honoured or refused
//! with a 400 naming it; unknown fields are refused too. Then the fields one by one:
//! `logit_bias`, `seed`, `echo`, `response_format`, `grammar`.

mod common;

use axum::http::StatusCode;
use common::*;
use runit_server::ServerConfig;
use serde_json::{json, Value};

fn server() -> Option<Fixture> {
    fixture(SYNTHETIC, scheduler_config(), ServerConfig::default())
}

/// OpenAI's chat-completions request fields (API reference, 2025), each with a value a client
/// may send, and whether RunIT honours that value on the synthetic model.
fn chat_fields() -> Vec<(&'static str, Value, bool)> {
    vec![
        ("audio", json!({"voice": "alloy", "format": "wav"}), false),
        ("frequency_penalty", json!(0.5), true),
        ("function_call", json!("auto"), false),
        ("functions", json!([{"name": "f", "parameters": {}}]), false),
        ("logit_bias", json!({"5": 10}), true),
        ("logprobs", json!(true), true),
        ("max_completion_tokens", json!(4), true),
        ("max_tokens", json!(4), true),
        ("metadata", json!({"k": "v"}), false),
        ("modalities", json!(["text"]), true),
        ("n", json!(2), true),
        ("parallel_tool_calls", json!(true), true),
        (
            "prediction",
            json!({"type": "content", "content": "x"}),
            true,
        ),
        ("presence_penalty", json!(0.5), true),
        ("prompt_cache_key", json!("key"), true),
        ("reasoning_effort", json!("low"), false),
        ("response_format", json!({"type": "text"}), true),
        ("safety_identifier", json!("someone"), true),
        ("seed", json!(3), true),
        ("service_tier", json!("auto"), true),
        ("stop", json!(["\n\n"]), true),
        ("store", json!(false), true),
        ("stream", json!(false), true),
        ("stream_options", json!({"include_usage": true}), true),
        ("temperature", json!(0.5), true),
        ("tool_choice", json!("none"), true),
        (
            "tools",
            json!([{"type": "function", "function": {"name": "f"}}]),
            false,
        ),
        ("top_logprobs", json!(3), true),
        ("top_p", json!(0.9), true),
        ("user", json!("someone"), true),
        ("verbosity", json!("low"), false),
        ("web_search_options", json!({}), false),
    ]
}

/// OpenAI's (legacy) completions request fields.
fn completion_fields() -> Vec<(&'static str, Value, bool)> {
    vec![
        ("best_of", json!(1), true),
        ("echo", json!(true), true),
        ("frequency_penalty", json!(0.5), true),
        ("logit_bias", json!({"5": -100}), true),
        ("logprobs", json!(2), true),
        ("max_tokens", json!(4), true),
        ("n", json!(2), true),
        ("presence_penalty", json!(0.5), true),
        ("seed", json!(3), true),
        ("stop", json!("\n"), true),
        ("stream", json!(false), true),
        ("stream_options", json!({"include_usage": true}), true),
        ("suffix", json!(" end"), false),
        ("temperature", json!(0.5), true),
        ("top_p", json!(0.9), true),
        ("user", json!("someone"), true),
    ]
}

/// Posts `base` with `name: value` added; a field that is honoured answers 200, a refused
/// one 400 with `param` naming it.
async fn check_field(
    f: &Fixture,
    path: &str,
    base: &Value,
    name: &str,
    value: &Value,
    honoured: bool,
) {
    let mut body = base.clone();
    body[name] = value.clone();
    let (status, answer) = post_json(f.router(), path, &body.to_string()).await;
    if honoured {
        assert_eq!(status, StatusCode::OK, "{path} {name}: {answer}");
    } else {
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {name}: {answer}");
        assert_eq!(answer["error"]["param"], name, "{path} {name}: {answer}");
        let message = answer["error"]["message"].as_str().expect("message");
        assert!(message.contains(name), "{path} {name}: {message}");
    }
}

#[tokio::test]
async fn every_openai_field_is_honoured_or_refused_by_name() {
    let Some(f) = server() else { return };
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4});
    for (name, value, honoured) in chat_fields() {
        check_field(&f, "/v1/chat/completions", &chat, name, &value, honoured).await;
    }
    let completion = json!({"prompt": "Once", "max_tokens": 4});
    for (name, value, honoured) in completion_fields() {
        // `echo` with `logprobs` is refused; alone it is honoured.
        check_field(&f, "/v1/completions", &completion, name, &value, honoured).await;
    }
    for (path, base) in [
        ("/v1/chat/completions", &chat),
        ("/v1/completions", &completion),
    ] {
        check_field(&f, path, base, "no_such_field", &json!(1), false).await;
        // A refused field sent as null counts as absent, as OpenAI's clients send it.
        check_field(&f, path, base, "web_search_options", &Value::Null, true).await;
    }
}

#[tokio::test]
async fn values_that_ask_for_what_is_not_done_are_refused() {
    let Some(f) = server() else { return };
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4});
    for (name, value) in [
        ("modalities", json!(["text", "audio"])),
        ("store", json!(true)),
        ("service_tier", json!("flex")),
        ("tool_choice", json!("required")),
        ("logit_bias", json!({"5": 101})),
        ("logit_bias", json!({"99999999": 1})),
        ("logit_bias", json!({"five": 1})),
        ("response_format", json!({"type": "xml"})),
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"schema": {"type": "strange"}}}),
        ),
        ("grammar", json!("root ::= missing")),
        ("top_logprobs", json!(21)),
        ("stream_options", json!({"include_obfuscation": true})),
        ("prompt_cache_key", json!(7)),
    ] {
        let mut body = chat.clone();
        body[name] = value.clone();
        let (status, answer) =
            post_json(f.router(), "/v1/chat/completions", &body.to_string()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name} {value}: {answer}");
        let param = answer["error"]["param"].as_str().expect("param");
        assert!(param.starts_with(name), "{name} {value}: {answer}");
    }
    let body = json!({"prompt": "Once", "max_tokens": 4, "echo": true, "logprobs": 1});
    let (status, answer) = post_json(f.router(), "/v1/completions", &body.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["param"], "echo");
    let body = json!({"prompt": "Once", "max_tokens": 4, "n": 2, "best_of": 3});
    let (status, answer) = post_json(f.router(), "/v1/completions", &body.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["param"], "best_of");
}

/// The first token of a greedy completion of `prompt`, with `extra` fields.
async fn first_token(f: &Fixture, prompt: &str, extra: Value) -> (u32, String) {
    let mut body = json!({"prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": 1});
    for (key, value) in extra.as_object().expect("object") {
        body[key] = value.clone();
    }
    let (status, answer) = post_json(f.router(), "/v1/completions", &body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let text = answer["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_string();
    let ids = f.tokenizer.encode(&text, false, false);
    (ids.first().copied().unwrap_or(u32::MAX), text)
}

#[tokio::test]
async fn logit_bias_bans_and_forces_tokens() {
    let Some(f) = server() else { return };
    let (top, text) = first_token(&f, "Once upon a time", json!({})).await;
    assert_ne!(top, u32::MAX, "the model answers a token: {text:?}");
    let (banned, _) = first_token(
        &f,
        "Once upon a time",
        json!({"logit_bias": {top.to_string(): -100}}),
    )
    .await;
    assert_ne!(banned, top, "a banned token is never picked");
    let forced_id = f.tokenizer.encode(" dragon", false, false)[0];
    let (forced, _) = first_token(
        &f,
        "Once upon a time",
        json!({"logit_bias": {forced_id.to_string(): 100}}),
    )
    .await;
    assert_eq!(forced, forced_id, "a forced token is always picked");
}

#[tokio::test]
async fn a_seed_draws_the_same_tokens_whatever_else_runs() {
    let Some(f) = server() else { return };
    let body = json!({"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 1234}).to_string();
    let (_, alone) = post_json(f.router(), "/v1/completions", &body).await;
    let busy =
        json!({"prompt": "Something else entirely", "max_tokens": 20, "temperature": 1.0, "n": 2})
            .to_string();
    let (crowded, _) = tokio::join!(
        post_json(f.router(), "/v1/completions", &body),
        post_json(f.router(), "/v1/completions", &busy)
    );
    assert_eq!(crowded.0, StatusCode::OK);
    assert_eq!(alone["choices"][0]["text"], crowded.1["choices"][0]["text"]);
}

#[tokio::test]
async fn echo_starts_the_text_with_the_prompt() {
    let Some(f) = server() else { return };
    let plain = json!({"prompt": "Once upon", "max_tokens": 5, "temperature": 0});
    let (_, without) = post_json(f.router(), "/v1/completions", &plain.to_string()).await;
    let mut echoed = plain.clone();
    echoed["echo"] = json!(true);
    let (status, with) = post_json(f.router(), "/v1/completions", &echoed.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{with}");
    let expected = format!(
        "Once upon{}",
        without["choices"][0]["text"].as_str().expect("text")
    );
    assert_eq!(with["choices"][0]["text"], expected.as_str());
}

#[tokio::test]
async fn response_format_and_grammar_shape_the_output() {
    let Some(f) = server() else { return };
    let schema = json!({"type": "object", "properties": {"colour": {"enum": ["red", "green"]}, "size": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["colour", "size"], "additionalProperties": false});
    let body = json!({
        "messages": [{"role": "user", "content": "A colour?"}],
        "max_tokens": 60, "temperature": 0.7, "seed": 5, "n": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema, "strict": true}},
    });
    let (status, answer) = post_json(f.router(), "/v1/chat/completions", &body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    for choice in answer["choices"].as_array().expect("choices") {
        let text = choice["message"]["content"].as_str().expect("content");
        let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(
            value["colour"] == "red" || value["colour"] == "green",
            "{text}"
        );
        let size = value["size"].as_i64().expect("size");
        assert!((1..=9).contains(&size), "{text}");
        assert_eq!(value.as_object().expect("object").len(), 2, "{text}");
    }
    let body = json!({"prompt": "Answer:", "max_tokens": 10, "grammar": "root ::= (\"yes\" | \"no\") \"!\""});
    let (status, answer) = post_json(f.router(), "/v1/completions", &body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let text = answer["choices"][0]["text"].as_str().expect("text");
    assert!(text == "yes!" || text == "no!", "{text:?}");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn a_grammar_left_without_tokens_ends_with_an_error_and_the_server_serves_on() {
    let Some(f) = server() else { return };
    // The grammar admits only "a"; banning every token that spells it leaves none.
    let banned: serde_json::Map<String, Value> = (0..f.tokenizer.n_vocab() as u32)
        .filter(|&id| f.tokenizer.token_piece(id).ok() == Some(b"a".as_slice()))
        .map(|id| (id.to_string(), json!(-100)))
        .collect();
    assert!(!banned.is_empty());
    let body = json!({"prompt": "Say a", "max_tokens": 4, "grammar": "root ::= \"a\"", "logit_bias": banned});
    let (status, answer) = post_json(f.router(), "/v1/completions", &body.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let message = answer["error"]["message"].as_str().expect("message");
    assert!(message.contains("grammar admits no token"), "{message}");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, bytes) = send(f.router(), post("/v1/completions", &streamed.to_string())).await;
    assert_eq!(status, StatusCode::OK);
    let events = sse_data(&bytes);
    assert!(
        events
            .iter()
            .any(|data| data.contains("grammar admits no token")),
        "{events:?}"
    );
    // The server serves on (`first_token` checks the 200).
    first_token(&f, "Once upon a time", json!({})).await;
}

#[tokio::test]
async fn suffix_is_refused_by_a_model_without_fim_tokens() {
    let Some(f) = fixture(SMOLLM2, scheduler_config(), ServerConfig::default()) else {
        return;
    };
    assert_eq!(f.tokenizer.fill_in_middle(), None);
    let body = json!({"prompt": "def add(a, b):", "suffix": "print(add(1, 2))", "max_tokens": 8});
    let (status, answer) = post_json(f.router(), "/v1/completions", &body.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["param"], "suffix");
    let message = answer["error"]["message"].as_str().expect("message");
    assert!(message.contains("fill-in-the-middle"), "{message}");
}
