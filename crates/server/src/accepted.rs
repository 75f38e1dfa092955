//! OpenAI fields the server reads only to check that their value asks for nothing it does not
//! do: `modalities` (text only), `store` (false), `service_tier` (there is one tier),
//! `best_of` (equal to `n`), `user` / `safety_identifier` (logged with the request) and
//! `prompt_cache_key` (a string: every request already shares the prefix cache by token
//! content, so the key asks for nothing more); for responses also `background` (false),
//! `truncation` (`disabled`), `include` (log-probabilities only), `metadata` (echoed) and
//! `max_tool_calls` (it limits built-in tools, which are never offered). Any other value is a
//! 400 naming the field.

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::request::{boolean, field, integer, wrong_type};

/// Checks the chat-only fields of `body`.
pub fn chat_fields(body: &Map<String, Value>) -> Result<(), ApiError> {
    match field(body, "modalities") {
        None => {}
        Some(Value::Array(items)) if items.iter().all(|item| item == "text") => {}
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid(
                "modalities",
                "only the `text` modality is supported",
            ))
        }
        Some(other) => return Err(wrong_type("modalities", "an array of strings", other)),
    }
    refuse_true(
        body,
        "store",
        "`store: true`: stored completions are not kept by this server",
    )?;
    service_tier(body)
}

/// Refuses the boolean field `name` when it is `true`, saying `why`.
fn refuse_true(body: &Map<String, Value>, name: &str, why: &str) -> Result<(), ApiError> {
    match boolean(body, name)? {
        Some(true) => Err(ApiError::invalid(name, why)),
        _ => Ok(()),
    }
}

/// Checks `service_tier`: `auto` and `default` are the one tier there is.
fn service_tier(body: &Map<String, Value>) -> Result<(), ApiError> {
    match field(body, "service_tier") {
        None => {}
        Some(Value::String(tier)) if tier == "auto" || tier == "default" => {}
        Some(Value::String(tier)) => {
            return Err(ApiError::invalid(
                "service_tier",
                format!("service tier `{tier}` is not offered; this server has only `default`"),
            ))
        }
        Some(other) => return Err(wrong_type("service_tier", "a string", other)),
    }
    Ok(())
}

/// Most `metadata` pairs, and the longest key and value (OpenAI's limits).
const METADATA_PAIRS: usize = 16;
const METADATA_KEY_CHARS: usize = 64;
const METADATA_VALUE_CHARS: usize = 512;

/// Checks the responses-only fields of `body` that ask for nothing beyond the chat path.
pub fn responses_fields(body: &Map<String, Value>) -> Result<(), ApiError> {
    refuse_true(
        body,
        "store",
        "`store: true`: nothing is stored by this server; leave `store` out or set it to false",
    )?;
    refuse_true(
        body,
        "background",
        "`background: true`: responses are not run in the background; nothing is stored to \
         poll",
    )?;
    match field(body, "truncation") {
        None => {}
        Some(Value::String(mode)) if mode == "disabled" => {}
        Some(Value::String(mode)) if mode == "auto" => {
            return Err(ApiError::invalid(
                "truncation",
                "`truncation: auto` is not supported: an input longer than the context is \
                 refused, never cut",
            ))
        }
        Some(Value::String(mode)) => {
            return Err(ApiError::invalid(
                "truncation",
                format!("unknown `truncation` `{mode}`; expected disabled or auto"),
            ))
        }
        Some(other) => return Err(wrong_type("truncation", "a string", other)),
    }
    if let Some(calls) = integer(body, "max_tool_calls")? {
        if calls < 0 {
            return Err(ApiError::invalid(
                "max_tool_calls",
                format!("`max_tool_calls` must be 0 or more, found {calls}"),
            ));
        }
    }
    metadata(body)?;
    service_tier(body)
}

/// Checks `metadata`: at most 16 string pairs, keys up to 64 characters, values up to 512.
fn metadata(body: &Map<String, Value>) -> Result<(), ApiError> {
    let pairs = match field(body, "metadata") {
        None => return Ok(()),
        Some(Value::Object(pairs)) => pairs,
        Some(other) => return Err(wrong_type("metadata", "an object of strings", other)),
    };
    if pairs.len() > METADATA_PAIRS {
        return Err(ApiError::invalid(
            "metadata",
            format!(
                "at most {METADATA_PAIRS} `metadata` pairs, found {}",
                pairs.len()
            ),
        ));
    }
    for (key, value) in pairs {
        let param = format!("metadata.{key}");
        let Value::String(text) = value else {
            return Err(wrong_type(&param, "a string", value));
        };
        if key.chars().count() > METADATA_KEY_CHARS || text.chars().count() > METADATA_VALUE_CHARS {
            return Err(ApiError::invalid(
                param,
                format!(
                    "`metadata` keys hold at most {METADATA_KEY_CHARS} characters and values \
                     at most {METADATA_VALUE_CHARS}"
                ),
            ));
        }
    }
    Ok(())
}

/// What `include` may ask for: the log-probabilities of the output text.
pub const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// Reads `include`: whether it asks for the output text's log-probabilities, the one extra
/// this server can include (the others belong to tools and inputs it does not offer, or to
/// encrypted reasoning it does not produce).
pub fn includes_logprobs(body: &Map<String, Value>) -> Result<bool, ApiError> {
    let items = match field(body, "include") {
        None => return Ok(false),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(wrong_type("include", "an array of strings", other)),
    };
    let mut logprobs = false;
    for (i, item) in items.iter().enumerate() {
        let param = format!("include[{i}]");
        match item {
            Value::String(name) if name == INCLUDE_LOGPROBS => logprobs = true,
            Value::String(name) => {
                return Err(ApiError::invalid(
                    param,
                    format!(
                        "`{name}` cannot be included; this server includes only \
                         `{INCLUDE_LOGPROBS}`"
                    ),
                ))
            }
            other => return Err(wrong_type(&param, "a string", other)),
        }
    }
    Ok(logprobs)
}

/// Checks the completion-only fields of `body` for `n` choices.
pub fn completion_fields(body: &Map<String, Value>, n: usize) -> Result<(), ApiError> {
    if let Some(best_of) = integer(body, "best_of")? {
        if best_of != n as i64 {
            return Err(ApiError::invalid(
                "best_of",
                format!(
                    "`best_of` ({best_of}) must equal `n` ({n}): ranking extra candidates \
                     is not supported"
                ),
            ));
        }
    }
    Ok(())
}

/// The caller's identity for the log (`safety_identifier`, else `user`); each must be a
/// string, as must `prompt_cache_key`.
pub fn caller(body: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    match field(body, "prompt_cache_key") {
        None | Some(Value::String(_)) => {}
        Some(other) => return Err(wrong_type("prompt_cache_key", "a string", other)),
    }
    let mut caller = None;
    for name in ["user", "safety_identifier"] {
        match field(body, name) {
            None => {}
            Some(Value::String(identity)) => caller = Some(identity.clone()),
            Some(other) => return Err(wrong_type(name, "a string", other)),
        }
    }
    Ok(caller)
}
