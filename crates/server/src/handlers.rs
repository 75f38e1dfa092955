//! The endpoints: `/health`, `/v1/models`, `/v1/chat/completions`, `/v1/completions`, and
//! the bearer-token check in front of the `/v1` routes.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use runit_engine::scheduler::Request as EngineRequest;
use serde_json::{json, Map, Value};

use crate::choice::Choice;
use crate::error::ApiError;
use crate::request::{self, Options, Prompt};
use crate::response::{self, Endpoint, Header};
use crate::AppState;

/// `GET /health`.
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
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

/// `GET /v1/models`.
pub async fn models(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": state.config.model_name,
            "object": "model",
            "created": state.created,
            "owned_by": "runit",
            "meta": {
                "n_ctx": state.scheduler.context_size(),
                "n_vocab": state.tokenizer.n_vocab(),
            },
        }],
    }))
    .into_response()
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        let body = read_body(body)?;
        let options = request::options(&body, true)?;
        check_model(&state, &options)?;
        let messages = request::messages(&body)?;
        let text = state
            .template
            .render(&messages, true)
            .map_err(|error| ApiError::invalid("messages", error.to_string()))?;
        let prompt = state.tokenizer.encode(&text, true, true);
        run(&state, Endpoint::Chat, prompt, "messages", options).await
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        let body = read_body(body)?;
        let options = request::options(&body, false)?;
        check_model(&state, &options)?;
        let prompt = match request::prompt(&body)? {
            Prompt::Text(text) => state.tokenizer.encode(&text, true, false),
            Prompt::Tokens(ids) => ids,
        };
        if let Some(&id) = prompt
            .iter()
            .find(|&&id| id as usize >= state.tokenizer.n_vocab())
        {
            return Err(ApiError::invalid(
                "prompt",
                format!(
                    "token id {id} is outside the vocabulary of {}",
                    state.tokenizer.n_vocab()
                ),
            ));
        }
        run(&state, Endpoint::Completion, prompt, "prompt", options).await
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

/// Answers unknown routes in the API's error format.
pub async fn not_found(request: Request) -> Response {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("no route for {} {}", request.method(), request.uri().path()),
        kind: "invalid_request_error",
        param: None,
        code: Some("not_found"),
    }
    .into_response()
}

/// Rejects `/v1` requests without the configured bearer token.
pub async fn require_api_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(key) = &state.config.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        if given.map(str::trim) != Some(key.as_str()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

fn read_body(body: Result<Bytes, BytesRejection>) -> Result<Map<String, Value>, ApiError> {
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                message: "the request body is too large".into(),
                kind: "invalid_request_error",
                param: None,
                code: Some("request_too_large"),
            }
        } else {
            ApiError::bad_request(format!("could not read the body: {rejection}"))
        }
    })?;
    request::parse_object(&bytes)
}

fn check_model(state: &AppState, options: &Options) -> Result<(), ApiError> {
    match &options.model {
        Some(name) if *name != state.config.model_name => {
            Err(ApiError::unknown_model(name, &state.config.model_name))
        }
        _ => Ok(()),
    }
}

/// Checks lengths, submits one sequence per choice and answers with their output.
async fn run(
    state: &Arc<AppState>,
    endpoint: Endpoint,
    prompt: Vec<u32>,
    prompt_param: &str,
    options: Options,
) -> Result<Response, ApiError> {
    let context = state.scheduler.context_size();
    if prompt.is_empty() {
        return Err(ApiError::invalid(prompt_param, "the prompt has no tokens"));
    }
    if prompt.len() + 1 > context {
        return Err(ApiError::invalid(
            prompt_param,
            format!(
                "the prompt has {} tokens, but the context holds {context} (and one more is \
                 needed to generate)",
                prompt.len()
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let room = context - prompt.len();
    let max_tokens = match options.max_tokens {
        Some(n) if n > room => {
            return Err(ApiError::invalid(
                "max_tokens",
                format!(
                    "the prompt ({} tokens) plus max_tokens ({n}) exceeds the context of \
                     {context} tokens",
                    prompt.len()
                ),
            )
            .with_code("context_length_exceeded"))
        }
        Some(n) => n,
        None => state.config.default_max_tokens.min(room),
    };
    let mut streams = Vec::with_capacity(options.n);
    for index in 0..options.n {
        let (choice, sink) = Choice::new(
            index,
            Arc::clone(&state.tokenizer),
            options.stop.clone(),
            options.logprobs,
        );
        let mut sampling = options.sampling.clone();
        sampling.seed = sampling.seed.wrapping_add(index as u64);
        let engine_request = EngineRequest {
            prompt: prompt.clone(),
            sampling,
            max_tokens,
            end_of_generation: state.tokenizer.eog_ids(),
            top_logprobs: options.top_logprobs,
        };
        // On failure the choices already submitted are dropped, which cancels them.
        state.scheduler.submit(engine_request, Box::new(sink))?;
        streams.push(choice.into_stream());
    }
    let serial = state.next_id.fetch_add(1, Ordering::Relaxed);
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completion => "cmpl",
    };
    let header = Header {
        id: format!("{prefix}-{:x}{serial:06x}", state.created),
        created: crate::unix_time(),
        model: state.config.model_name.clone(),
        endpoint,
        prompt_tokens: prompt.len(),
        logprobs: options.logprobs,
    };
    tracing::debug!(id = %header.id, prompt_tokens = prompt.len(), max_tokens, n = options.n, "request");
    Ok(if options.stream {
        response::stream(header, streams, options.include_usage)
    } else {
        response::complete(header, streams).await
    })
}
