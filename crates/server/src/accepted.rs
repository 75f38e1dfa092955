//! OpenAI fields the server reads only to check that their value asks for nothing it does not
//! do: `modalities` (text only), `store` (false), `service_tier` (there is one tier),
//! `best_of` (equal to `n`), and `user` /
//! `safety_identifier` (logged with the request). Any other value is a 400 naming the field.

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
    if boolean(body, "store")? == Some(true) {
        return Err(ApiError::invalid(
            "store",
            "`store: true`: stored completions are not kept by this server",
        ));
    }
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
/// string.
pub fn caller(body: &Map<String, Value>) -> Result<Option<String>, ApiError> {
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
