//! `POST /v1/embeddings`: each input (a string, or token ids) runs through the decoder in the
//! embedder's own session, one request at a time on the blocking pool, pooled as the model
//! declares (mean when it declares none) and L2-normalised; answered as floats or as base64
//! of little-endian f32s.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use runit_engine::{embed, EngineConfig, Session};
use runit_model::{Model, Pooling};
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::fields::check_keys;
use crate::request::{field, wrong_type};
use crate::AppState;

/// Most inputs one request may embed.
pub const MAX_INPUTS: usize = 256;

const FIELDS: &[&str] = &["input", "model", "encoding_format", "dimensions", "user"];

/// The model and the session embeddings run in (made at the first request).
pub struct Embedder {
    model: Arc<Model>,
    config: EngineConfig,
    session: Mutex<Option<Session>>,
}

/// The largest context the embedding session gets, whatever the scheduler's: its KV cache is
/// held beside the scheduler's.
pub const MAX_CONTEXT: usize = 8192;

impl Embedder {
    /// An embedder over `model` whose session holds `context_size` tokens (at most
    /// [`MAX_CONTEXT`]) with the engine's default batch and cache types.
    pub fn new(model: Arc<Model>, context_size: usize) -> Embedder {
        Embedder {
            model,
            config: EngineConfig {
                context_size: context_size.clamp(1, MAX_CONTEXT),
                max_sequences: 1,
                ..EngineConfig::default()
            },
            session: Mutex::new(None),
        }
    }

    /// The pooling of the model, mean when it declares none.
    fn pooling(&self) -> Pooling {
        self.model.config.pooling.unwrap_or(Pooling::Mean)
    }

    /// The embeddings of `inputs`, in order.
    fn run(&self, inputs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ApiError> {
        let mut session = self
            .session
            .lock()
            .map_err(|_| ApiError::internal("the embedding session was poisoned"))?;
        if session.is_none() {
            let fresh = Session::new(Arc::clone(&self.model), &self.config).map_err(|error| {
                ApiError::internal(format!("could not make the embedding session: {error}"))
            })?;
            *session = Some(fresh);
        }
        let session = session.as_mut().expect("the session was just made");
        inputs
            .iter()
            .map(|tokens| {
                embed(session, tokens, self.pooling())
                    .map_err(|error| ApiError::internal(format!("embedding failed: {error}")))
            })
            .collect()
    }
}

/// `POST /v1/embeddings`.
pub async fn embeddings(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let answer = async {
        let body = crate::handlers::read_body(&state, body)?;
        answer(&state, &body).await
    };
    answer.await.unwrap_or_else(|error| {
        error.log();
        error.into_response()
    })
}

async fn answer(state: &Arc<AppState>, body: &Map<String, Value>) -> Result<Response, ApiError> {
    check_keys("body", body, FIELDS).map_err(|error| ApiError {
        param: error
            .param
            .map(|param| param.trim_start_matches("body.").to_string()),
        ..error
    })?;
    let Some(embedder) = &state.embedder else {
        return Err(ApiError::invalid(
            "model",
            "this server was started without embeddings",
        ));
    };
    if let Some(Value::String(model)) = field(body, "model") {
        crate::handlers::check_model_id(state, model)?;
    }
    let base64 = match field(body, "encoding_format") {
        None => false,
        Some(Value::String(format)) if format == "float" => false,
        Some(Value::String(format)) if format == "base64" => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("`encoding_format` must be `float` or `base64`, found {other}"),
            ))
        }
    };
    let width = embedder.model.config.embedding_length;
    if let Some(dimensions) = field(body, "dimensions") {
        if dimensions.as_u64() != Some(width as u64) {
            return Err(ApiError::invalid(
                "dimensions",
                format!(
                    "this model's embeddings have {width} dimensions and cannot be shortened, \
                     found `dimensions` {dimensions}"
                ),
            ));
        }
    }
    if let Some(user) = field(body, "user") {
        if !user.is_string() {
            return Err(wrong_type("user", "a string", user));
        }
    }
    let inputs = inputs(state, body, embedder.config.context_size)?;
    let prompt_tokens: usize = inputs.iter().map(Vec::len).sum();
    let worker = Arc::clone(state);
    let vectors = tokio::task::spawn_blocking(move || {
        let embedder = worker.embedder.as_ref().expect("checked above");
        embedder.run(&inputs)
    })
    .await
    .map_err(|error| ApiError::internal(format!("the embedding task failed: {error}")))??;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(vector)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(axum::Json(json!({
        "object": "list",
        "data": data,
        "model": state.config.model_name,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }))
    .into_response())
}

/// The token ids of each input: a string, an array of strings, an array of token ids, or
/// an array of token-id arrays; each must be non-empty, fit in `context` and name tokens of
/// the vocabulary.
fn inputs(
    state: &AppState,
    body: &Map<String, Value>,
    context: usize,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let prompts = crate::request::prompt_list(body, "input", MAX_INPUTS)?;
    let vocab = state.tokenizer.n_vocab();
    let several = prompts.len() > 1;
    prompts
        .into_iter()
        .enumerate()
        .map(|(i, prompt)| {
            let param = if several {
                format!("input[{i}]")
            } else {
                "input".to_string()
            };
            let tokens = match prompt {
                crate::request::Prompt::Text(text) => state.tokenizer.encode(&text, true, false),
                crate::request::Prompt::Tokens(ids) => ids,
            };
            if tokens.is_empty() {
                return Err(ApiError::invalid(param, "an input has no tokens"));
            }
            if tokens.len() > context {
                return Err(ApiError::invalid(
                    param,
                    format!(
                        "an input has {} tokens; at most {context} fit",
                        tokens.len()
                    ),
                )
                .with_code("context_length_exceeded"));
            }
            if let Some(id) = tokens.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::invalid(
                    param,
                    format!("token id {id} is outside the vocabulary of {vocab}"),
                ));
            }
            Ok(tokens)
        })
        .collect()
}
