//! The endpoints: `/health`, `/v1/models` (and `/v1/models/{id}`), `/v1/chat/completions`,
//! `/v1/completions`, the chat path that `/v1/responses` shares ([`chat_request`]), and the
//! bearer-token check in front of the `/v1` routes (a constant-time comparison).

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use runit_tokenizer::TemplateInputs;
use serde_json::{json, Map, Value};
use tracing::Instrument;

use crate::error::ApiError;
use crate::messages::Conversation;
use crate::reasoning::{self, ThinkFilter};
use crate::request::{self, Options, Prompt};
use crate::response::{self, Endpoint};
use crate::submit::{submit, Submitted};
use crate::tools;
use crate::{infill, messages, structured, template, AppState};

/// `GET /health`: the status, with the scheduler's counters for clients that may see them
/// (everyone when no API key is set, else those that give it).
pub async fn health(State(state): State<Arc<AppState>>, request: Request) -> Response {
    if !is_authorized(&state, &request) {
        return axum::Json(json!({"status": "ok"})).into_response();
    }
    let stats = state.scheduler.stats();
    axum::Json(json!({
        "status": "ok",
        "active": stats.active,
        "queued": stats.queued,
        "free_blocks": stats.free_blocks,
        "total_blocks": stats.total_blocks,
    }))
    .into_response()
}

/// `GET /v1/models`: the served model under each of its ids.
pub async fn models(State(state): State<Arc<AppState>>) -> Response {
    let data: Vec<Value> = state
        .config
        .model_ids()
        .into_iter()
        .map(|id| model_object(&state, id))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{id}`: the model, when `id` is one of its ids; else a 404.
pub async fn model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match check_model_id(&state, &id) {
        Ok(()) => axum::Json(model_object(&state, &id)).into_response(),
        Err(error) => {
            error.log();
            error.into_response()
        }
    }
}

fn model_object(state: &AppState, id: &str) -> Value {
    json!({
        "id": id,
        "object": "model",
        "created": state.created,
        "owned_by": "runit",
        "meta": {
            "n_ctx": state.scheduler.context_size(),
            "n_vocab": state.tokenizer.n_vocab(),
        },
    })
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let id = state.next_request_id(Endpoint::Chat);
    respond(&id, "/v1/chat/completions", async {
        let body = read_body(&state, body)?;
        let (options, prompt) =
            chat_request(&state, &body, Endpoint::Chat, messages::messages).await?;
        run(
            &state,
            Endpoint::Chat,
            &id,
            vec![prompt],
            "messages",
            options,
        )
        .await
    })
    .await
}

/// The settings and prompt of a chat-shaped request to `endpoint` (chat completions,
/// responses): its options read, its tools offered and its grammar compiled, then its
/// `conversation` read and rendered through the template, and reasoning split off for a
/// template that thinks.
pub(crate) async fn chat_request(
    state: &Arc<AppState>,
    body: &Map<String, Value>,
    endpoint: Endpoint,
    conversation: impl FnOnce(&Map<String, Value>) -> Result<Conversation, ApiError>,
) -> Result<(Options, Vec<u32>), ApiError> {
    let mut options = request::options(body, endpoint, state.tokenizer.n_vocab())?;
    check_model(state, &options)?;
    let mut inputs = TemplateInputs {
        tools: None,
        variables: template::variables(body)?,
    };
    if let Some(tool_request) = tools::read(body, endpoint)? {
        tools::offer(state, &tool_request, &mut options, &mut inputs)?;
    }
    constrain(state, &mut options).await?;
    let prompt = template::chat_prompt(state, conversation(body)?, inputs).await?;
    if ThinkFilter::applies_to(state.template.source()) {
        options.think = Some(ThinkFilter::new(reasoning::opens_thinking(
            &state.tokenizer,
            &prompt,
        )));
    }
    Ok((options, prompt))
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let id = state.next_request_id(Endpoint::Completion);
    respond(&id, "/v1/completions", async {
        let body = read_body(&state, body)?;
        let mut options = request::options(&body, Endpoint::Completion, state.tokenizer.n_vocab())?;
        check_model(&state, &options)?;
        constrain(&state, &mut options).await?;
        let suffix = infill::suffix(&body, &state.tokenizer)?;
        if suffix.is_some() && options.echo {
            return Err(ApiError::invalid(
                "echo",
                "`echo` with `suffix` is not supported: the answer is the middle alone",
            ));
        }
        // A raw prompt is the client's own: special-token text in it is parsed (not before a
        // gap: that text is plain).
        let mut prompts = Vec::new();
        for prompt in request::prompts(&body)? {
            let (ids, text) = match prompt {
                Prompt::Text(text) if suffix.is_some() => {
                    (state.tokenizer.encode(&text, false, false), text)
                }
                Prompt::Text(text) => (state.tokenizer.encode(&text, true, false), text),
                Prompt::Tokens(ids) => {
                    let text = if options.echo {
                        let bytes = state
                            .tokenizer
                            .decode(&ids)
                            .map_err(|error| ApiError::invalid("prompt", error.to_string()))?;
                        String::from_utf8_lossy(&bytes).into_owned()
                    } else {
                        String::new()
                    };
                    (ids, text)
                }
            };
            prompts.push(match &suffix {
                Some(suffix) => infill::prompt(&state.tokenizer, &ids, suffix),
                None => ids,
            });
            if options.echo {
                options.echo_texts.push(text);
            }
        }
        run(
            &state,
            Endpoint::Completion,
            &id,
            prompts,
            "prompt",
            options,
        )
        .await
    })
    .await
}

/// Compiles the grammar `options` asks for into its sampler settings.
async fn constrain(state: &Arc<AppState>, options: &mut Options) -> Result<(), ApiError> {
    if let Some(requested) = options.grammar.take() {
        options.sampling.constraint = Some(structured::compile(state, requested).await?);
    }
    Ok(())
}

/// Runs `handler` in the request's span, logging the error it answers with, if any.
pub(crate) async fn respond(
    id: &str,
    endpoint: &'static str,
    handler: impl Future<Output = Result<Response, ApiError>>,
) -> Response {
    let span = tracing::info_span!("request", id = %id, endpoint = %endpoint);
    async {
        handler.await.unwrap_or_else(|error| {
            error.log();
            error.into_response()
        })
    }
    .instrument(span)
    .await
}

/// Answers unknown routes in the API's error format.
pub async fn not_found(request: Request) -> Response {
    let error = ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("no route for {} {}", request.method(), request.uri().path()),
        kind: "invalid_request_error",
        param: None,
        code: Some("not_found"),
    };
    error.log();
    error.into_response()
}

/// Rejects `/v1` requests without the configured bearer token.
pub async fn require_api_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    if !is_authorized(&state, &request) {
        let error = ApiError::unauthorized();
        error.log();
        return error.into_response();
    }
    next.run(request).await
}

/// Whether the request carries the configured bearer token (always, when none is set).
fn is_authorized(state: &AppState, request: &Request) -> bool {
    let Some(key) = &state.config.api_key else {
        return true;
    };
    request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .is_some_and(|given| keys_match(given.trim().as_bytes(), key.as_bytes()))
}

/// Compares two keys in time that depends on their length only, not on where they differ.
fn keys_match(given: &[u8], expected: &[u8]) -> bool {
    if given.len() != expected.len() {
        return false;
    }
    let difference = given.iter().zip(expected).fold(0u8, |difference, (a, b)| {
        std::hint::black_box(difference | (a ^ b))
    });
    difference == 0
}

pub(crate) fn read_body(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Map<String, Value>, ApiError> {
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            crate::body::too_large(state.config.max_body_bytes)
        } else {
            ApiError::bad_request(format!("could not read the body: {rejection}"))
        }
    })?;
    request::parse_object(&bytes)
}

fn check_model(state: &AppState, options: &Options) -> Result<(), ApiError> {
    match &options.model {
        Some(name) => check_model_id(state, name),
        None => Ok(()),
    }
}

/// Refuses a model id that is not one of the served model's ids.
pub(crate) fn check_model_id(state: &AppState, name: &str) -> Result<(), ApiError> {
    let ids = state.config.model_ids();
    if ids.contains(&name) {
        Ok(())
    } else {
        Err(ApiError::unknown_model(name, &ids.join("`, `")))
    }
}

/// Submits the request's sequences ([`submit`]) and answers with their output, whole or
/// streamed, as chat or text completions.
async fn run(
    state: &Arc<AppState>,
    endpoint: Endpoint,
    id: &str,
    prompts: Vec<Vec<u32>>,
    prompt_param: &str,
    options: Options,
) -> Result<Response, ApiError> {
    let Submitted {
        header,
        streams,
        log,
    } = submit(state, endpoint, id, &prompts, prompt_param, &options)?;
    Ok(if options.stream {
        response::stream(header, streams, options.include_usage, log)
    } else {
        response::complete(header, streams, log).await
    })
}

#[cfg(test)]
mod tests {
    use super::keys_match;

    #[test]
    fn keys_match_only_when_equal() {
        assert!(keys_match(b"secret", b"secret"));
        assert!(!keys_match(b"secreT", b"secret"));
        assert!(!keys_match(b"Secret", b"secret"));
        assert!(!keys_match(b"secret-longer", b"secret"));
        assert!(!keys_match(b"", b"secret"));
    }
}
