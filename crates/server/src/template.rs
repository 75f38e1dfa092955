//! Chat prompts rendered off the async runtime: a template comes from the model file and may
//! be slow, so rendering and tokenizing run on the blocking pool, at most
//! [`TemplateLimits::workers`] at a time, under a deadline; the runtime keeps answering
//! (`/health` included) meanwhile.

use std::sync::Arc;
use std::time::Instant;

use axum::http::StatusCode;
use runit_tokenizer::{TemplateInputs, TokenizerError};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::messages::Conversation;
use crate::request::{field, wrong_type};
use crate::AppState;

/// The prompt token ids of a chat request: the template rendered, then tokenized with the
/// special-token text of message contents as plain text. Errors name the conversation's
/// fields.
pub(crate) async fn chat_prompt(
    state: &Arc<AppState>,
    conversation: Conversation,
    inputs: TemplateInputs,
) -> Result<Vec<u32>, ApiError> {
    let Conversation {
        messages,
        param,
        content_params,
    } = conversation;
    let limits = state.config.template;
    let start = Instant::now();
    let permit = tokio::time::timeout(limits.timeout, Arc::clone(&state.renders).acquire_owned())
        .await
        .map_err(|_| busy(limits.timeout.as_secs_f64()))?
        .map_err(|_| ApiError::internal("the template workers are gone"))?;
    let worker_state = Arc::clone(state);
    let rendering = tokio::task::spawn_blocking(move || {
        // The permit is held until the rendering ends, even when the request gave up on it.
        let _permit = permit;
        let prompt = worker_state.template.render_prompt_with(
            &worker_state.tokenizer,
            &messages,
            true,
            &inputs,
        )?;
        Ok::<_, TokenizerError>(worker_state.tokenizer.encode_prompt(&prompt, true))
    });
    let remaining = limits.timeout.saturating_sub(start.elapsed());
    match tokio::time::timeout(remaining, rendering).await {
        Err(_) => Err(ApiError::invalid(
            param,
            format!(
                "the chat template ran past its time limit of {} s",
                limits.timeout.as_secs_f64()
            ),
        )
        .with_code("template_limit_exceeded")),
        Ok(Err(join_error)) => Err(ApiError::internal(format!(
            "rendering the chat template failed: {join_error}"
        ))),
        Ok(Ok(result)) => result.map_err(|error| template_error(error, param, &content_params)),
    }
}

/// Names a template's scope gives the conversation; `chat_template_kwargs` may not set them.
const RESERVED: &[&str] = &[
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// Reads `chat_template_kwargs` (as llama.cpp's server and vLLM take it): variables for the
/// template, such as `enable_thinking`.
pub(crate) fn variables(body: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let param = "chat_template_kwargs";
    match field(body, param) {
        None => Ok(Map::new()),
        Some(Value::Object(variables)) => match variables
            .keys()
            .find(|key| RESERVED.contains(&key.as_str()))
        {
            Some(key) => Err(ApiError::invalid(
                format!("{param}.{key}"),
                format!("`{key}` is set by the request itself, not by `{param}`"),
            )),
            None => Ok(variables.clone()),
        },
        Some(other) => Err(wrong_type(param, "an object", other)),
    }
}

/// A 503 for a request that found every template worker busy until its deadline.
fn busy(seconds: f64) -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: format!("every chat-template worker stayed busy for {seconds} s; try again later"),
        kind: "server_error",
        param: None,
        code: Some("server_busy"),
    }
}

/// The 400 for a template that failed on the conversation in the field `param`, whose
/// messages' texts are in `content_params`.
fn template_error(error: TokenizerError, param: &str, content_params: &[String]) -> ApiError {
    match error {
        TokenizerError::TemplateLimit(limit) => {
            ApiError::invalid(param, limit.to_string()).with_code("template_limit_exceeded")
        }
        TokenizerError::SpecialTextInContent { message, .. } => ApiError::invalid(
            content_params.get(message).map_or(param, String::as_str),
            error.to_string(),
        ),
        other => ApiError::invalid(param, other.to_string()),
    }
}
