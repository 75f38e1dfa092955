//! `POST /v1/responses`, OpenAI's Responses API, as a thin layer over the chat path: the
//! request's fields are read by the same readers as chat's (`request::options` with
//! [`Endpoint::Responses`]: `max_output_tokens`, `temperature`, `top_p`, `top_logprobs`,
//! `text.format` for the grammar, flat function `tools` and `tool_choice`), its
//! `instructions` and `input` become the conversation ([`input`]), and the one choice's
//! deltas become output items ([`output`]), answered whole or as Responses stream events.
//! Nothing is stored, so `store: true`, `previous_response_id`, `conversation` and
//! `background: true` are refused, as is every other field the server cannot honour.

mod input;
mod output;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures::stream::{select_all, BoxStream, StreamExt};
use runit_engine::SamplerParams;
use serde_json::{json, Map, Value};

use crate::choice::Delta;
use crate::error::ApiError;
use crate::handlers::{chat_request, read_body, respond};
use crate::log::RequestLog;
use crate::request::{field, Options};
use crate::response::{serve_events, Endpoint, EventSource};
use crate::submit::{submit, Submitted};
use crate::AppState;
use output::Output;

/// `POST /v1/responses`.
pub async fn responses(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let id = state.next_request_id(Endpoint::Responses);
    respond(&id, "/v1/responses", async {
        let body = read_body(&state, body)?;
        let (options, prompt) =
            chat_request(&state, &body, Endpoint::Responses, input::conversation).await?;
        let Submitted {
            header,
            streams,
            log,
        } = submit(
            &state,
            Endpoint::Responses,
            &id,
            &[prompt],
            "input",
            &options,
        )?;
        let echo = echo(&body, &options, &id, header.created, &header.model);
        let output = Output::new(header, echo);
        Ok(if options.stream {
            serve_events(streams, log, Events(output))
        } else {
            complete(output, streams, log).await
        })
    })
    .await
}

/// The response object's fields that repeat the request (or say what was used in its
/// place), as OpenAI's response object lists them.
fn echo(
    body: &Map<String, Value>,
    options: &Options,
    id: &str,
    created: u64,
    model: &str,
) -> Map<String, Value> {
    let given = |name: &str, default: Value| field(body, name).cloned().unwrap_or(default);
    // The sampler's values, rounded back from f32.
    let used = |value: f32| json!((f64::from(value) * 1e6).round() / 1e6);
    let defaults = SamplerParams::DEFAULT;
    let temperature = given("temperature", used(defaults.temperature));
    let top_p = given("top_p", used(defaults.top_p));
    let value = json!({
        "id": id,
        "object": "response",
        "created_at": created,
        "model": model,
        "error": null,
        "background": false,
        "instructions": given("instructions", Value::Null),
        "max_output_tokens": options.max_tokens.map(|limit| limit.count),
        "max_tool_calls": given("max_tool_calls", Value::Null),
        "metadata": given("metadata", json!({})),
        "parallel_tool_calls": given("parallel_tool_calls", json!(true)),
        "previous_response_id": null,
        "prompt_cache_key": given("prompt_cache_key", Value::Null),
        "reasoning": null,
        "safety_identifier": given("safety_identifier", Value::Null),
        "service_tier": "default",
        "store": false,
        "temperature": temperature,
        "text": given("text", json!({"format": {"type": "text"}})),
        "tool_choice": given("tool_choice", json!("auto")),
        "tools": given("tools", json!([])),
        "top_logprobs": options.top_logprobs,
        "top_p": top_p,
        "truncation": "disabled",
        "user": given("user", Value::Null),
    });
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// Waits for the choice and answers the response object.
async fn complete(
    mut output: Output,
    choices: Vec<BoxStream<'static, Delta>>,
    mut log: RequestLog,
) -> Response {
    let mut choices = select_all(choices);
    while let Some(delta) = choices.next().await {
        log.record(&delta);
        if let Some(message) = delta.error {
            log.finish(Some("error"));
            let error = ApiError::sequence_failed(message);
            error.log();
            return error.into_response();
        }
        output.push(delta);
    }
    log.finish(None);
    axum::Json(output.finished()).into_response()
}

/// The events of a streamed response, each named by its `type`; a failed sequence ends
/// the stream with an `error` event.
struct Events(Output);

impl EventSource for Events {
    fn start(&mut self) -> Vec<Event> {
        self.0.start().iter().map(sse).collect()
    }

    fn delta(&mut self, delta: Delta) -> Vec<Event> {
        if let Some(message) = &delta.error {
            let error = ApiError::sequence_failed(message.clone());
            return vec![sse(&self.0.error(&error.message, error.code))];
        }
        self.0.push(delta).iter().map(sse).collect()
    }

    fn end(&mut self, _failed: bool) -> Vec<Event> {
        Vec::new()
    }
}

/// One event as OpenAI sends it: `event: TYPE` and the JSON `data`.
fn sse(event: &Value) -> Event {
    let kind = event["type"].as_str().unwrap_or("error");
    Event::default().event(kind).data(event.to_string())
}
