//! The endpoints: `/health`, `/v1/models` (and `/v1/models/{id}`), `/v1/chat/completions`,
//! `/v1/completions`, and
//! the bearer-token check in front of the `/v1` routes (a constant-time comparison).

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use runit_engine::request::{check_request, RequestError};
use runit_engine::scheduler::{DraftRequest, EventSink, Request as EngineRequest};
use runit_engine::speculative::DraftParams;
use runit_tokenizer::TemplateInputs;
use serde_json::{json, Map, Value};
use tracing::Instrument;

use crate::choice::Choice;
use crate::error::ApiError;
use crate::log::RequestLog;
use crate::reasoning::{self, ThinkFilter};
use crate::request::{self, Options, Prompt, TokenLimit, MAX_SEQUENCES};
use crate::response::{self, Endpoint, Header};
use crate::tools;
use crate::{infill, messages, structured, template, AppState, PREDICTION_NGRAM};

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
        let mut options = request::options(&body, Endpoint::Chat, state.tokenizer.n_vocab())?;
        check_model(&state, &options)?;
        let mut inputs = TemplateInputs {
            tools: None,
            variables: template::variables(&body)?,
        };
        if let Some(tool_request) = tools::read(&body)? {
            tools::offer(&state, &tool_request, &mut options, &mut inputs)?;
        }
        constrain(&state, &mut options).await?;
        let messages = messages::messages(&body)?;
        let prompt = template::chat_prompt(&state, messages, inputs).await?;
        if ThinkFilter::applies_to(state.template.source()) {
            options.think = Some(ThinkFilter::new(reasoning::opens_thinking(
                &state.tokenizer,
                &prompt,
            )));
        }
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
async fn respond(
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

/// The answer to a request that the engine's check refuses: `which` prompt (`the prompt`,
/// `prompt 1`), given in the field `prompt_param`.
fn refusal(error: RequestError, which: &str, prompt_param: &str, options: &Options) -> ApiError {
    match error {
        RequestError::EmptyPrompt => {
            ApiError::invalid(prompt_param, format!("{which} has no tokens"))
        }
        RequestError::NothingToGenerate => {
            let param = options.max_tokens.map_or("max_tokens", |limit| limit.param);
            TokenLimit::too_few(param, 0)
        }
        RequestError::OutsideVocabulary { id, vocab_size } => ApiError::invalid(
            prompt_param,
            format!("token id {id} is outside the vocabulary of {vocab_size}"),
        ),
        RequestError::PromptTooLong { tokens, context } => ApiError::invalid(
            prompt_param,
            format!(
                "{which} has {tokens} tokens, but the context holds {context} (and one more is \
                 needed to generate)"
            ),
        )
        .with_code("context_length_exceeded"),
        other => ApiError::invalid(other.parameter(), other.to_string()),
    }
}

/// Checks the request (every prompt through the engine's [`check_request`], before anything
/// is submitted), submits `n` sequences per prompt (choice `prompt_index * n + i`) and
/// answers with their output.
async fn run(
    state: &Arc<AppState>,
    endpoint: Endpoint,
    id: &str,
    prompts: Vec<Vec<u32>>,
    prompt_param: &str,
    options: Options,
) -> Result<Response, ApiError> {
    let context = state.scheduler.context_size();
    let sequences = prompts.len() * options.n;
    let parallel = state.scheduler.max_sequences();
    if sequences > MAX_SEQUENCES.min(parallel) {
        return Err(ApiError::invalid(
            "n",
            format!(
                "{} prompts times n = {} asks for {sequences} sequences; at most {} are \
                 allowed (the server runs {parallel} at once)",
                prompts.len(),
                options.n,
                MAX_SEQUENCES.min(parallel)
            ),
        ));
    }
    let requested = options
        .max_tokens
        .map_or(state.config.default_max_tokens, |limit| limit.count);
    for (index, prompt) in prompts.iter().enumerate() {
        let which = if prompts.len() > 1 {
            format!("prompt {index}")
        } else {
            "the prompt".into()
        };
        check_request(prompt, 0, requested, context, state.tokenizer.n_vocab())
            .map_err(|error| refusal(error, &which, prompt_param, &options))?;
    }
    // The explicit limit must fit next to the longest prompt; the default is cut to fit.
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let room = context - longest;
    let max_tokens = match options.max_tokens {
        Some(limit) if limit.count > room => {
            return Err(ApiError::invalid(
                "max_tokens",
                format!(
                    "the prompt ({longest} tokens) plus max_tokens ({}) exceeds the context \
                     of {context} tokens",
                    limit.count
                ),
            )
            .with_code("context_length_exceeded"))
        }
        Some(limit) => limit.count,
        None => state.config.default_max_tokens.min(room),
    };
    if let Some(caller) = &options.caller {
        tracing::info!(caller = %caller, "caller");
    }
    let prompt_tokens = prompts.iter().map(Vec::len).sum();
    let draft = draft_request(state, options.prediction.as_deref());
    let log = RequestLog::new(prompt_tokens, sequences);
    let mut streams = Vec::with_capacity(sequences);
    let mut submissions = Vec::with_capacity(sequences);
    for (prompt_index, prompt) in prompts.iter().enumerate() {
        for i in 0..options.n {
            let (choice, sink) = Choice::new(
                prompt_index * options.n + i,
                Arc::clone(&state.tokenizer),
                options.stop.clone(),
                options.logprobs,
                options
                    .echo_texts
                    .get(prompt_index)
                    .cloned()
                    .unwrap_or_default(),
            );
            let choice = match &options.think {
                Some(filter) => choice.with_reasoning(filter.clone()),
                None => choice,
            };
            let choice = match &options.calls {
                Some(filter) => {
                    choice.with_calls(filter.clone(), tools::call_markers(&state.tokenizer))
                }
                None => choice,
            };
            // The i-th choice of every prompt draws as the i-th choice of a lone request.
            let mut sampling = options.sampling.clone();
            sampling.seed = sampling.seed.wrapping_add(i as u64);
            let engine_request = EngineRequest {
                prompt: prompt.clone(),
                sampling,
                max_tokens,
                end_of_generation: if options.ignore_eos {
                    Vec::new()
                } else {
                    state.tokenizer.eog_ids()
                },
                top_logprobs: options.top_logprobs,
                logprobs: options.logprobs,
                draft: draft.clone(),
            };
            submissions.push((engine_request, Box::new(sink) as Box<dyn EventSink>));
            streams.push(choice.into_stream());
        }
    }
    // All the sequences are queued or none is.
    state.scheduler.submit_all(submissions)?;
    let header = Header {
        id: id.to_string(),
        created: crate::unix_time(),
        model: state.config.model_name.clone(),
        endpoint,
        prompt_tokens,
        logprobs: options.logprobs,
    };
    tracing::debug!(
        prompt_tokens,
        max_tokens,
        prompts = prompts.len(),
        n = options.n,
        "submitted"
    );
    Ok(if options.stream {
        response::stream(header, streams, options.include_usage, log)
    } else {
        response::complete(header, streams, log).await
    })
}

/// The speculation of a request's sequences: the server's draft model or prompt lookup,
/// a request's `prediction` drafted from by prompt lookup when it gives one; a
/// prediction alone speculates too.
fn draft_request(state: &AppState, prediction: Option<&str>) -> Option<DraftRequest> {
    let prediction = prediction.map(|text| state.tokenizer.encode(text, false, false));
    let (ngram, params) = match (state.config.speculation, &prediction) {
        (Some(speculation), _) => speculation,
        (None, Some(_)) => (PREDICTION_NGRAM, DraftParams::DEFAULT),
        (None, None) => return None,
    };
    Some(DraftRequest {
        ngram,
        params,
        prediction: prediction.unwrap_or_default(),
        model: state.config.draft_model.clone(),
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
