//! Which top-level request fields each endpoint knows, and what it does with them: a field is
//! read (its value checked where it is parsed) or refused with a 400 naming it and saying
//! why; a field that is neither is unknown and refused too, so nothing a client sends is
//! dropped silently. A refused or unknown field given as `null` counts as absent, as
//! OpenAI's clients send `null` for fields they leave unset.

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::response::Endpoint;

/// What the server does with a known field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Read and honoured; the parser checks the value (and refuses values it cannot honour).
    Read,
    /// Answered with a 400 giving this reason.
    Refused(&'static str),
}

use Support::{Read, Refused};

const STORED: &str = "stored completions are not kept by this server";
const NO_AUDIO: &str = "audio input and output are not supported";
const DEPRECATED_FUNCTIONS: &str =
    "the deprecated function-calling fields are not supported; use `tools` and `tool_choice`";

/// Fields both endpoints read, beyond OpenAI's: llama.cpp's and vLLM's sampling extras.
const EXTRAS: &[(&str, Support)] = &[
    ("top_k", Read),
    ("min_p", Read),
    ("repetition_penalty", Read),
    ("ignore_eos", Read),
    ("grammar", Read),
];

/// `POST /v1/chat/completions`: OpenAI's request fields, then the extras.
pub const CHAT: &[(&str, Support)] = &[
    ("messages", Read),
    ("model", Read),
    ("audio", Refused(NO_AUDIO)),
    ("frequency_penalty", Read),
    ("function_call", Refused(DEPRECATED_FUNCTIONS)),
    ("functions", Refused(DEPRECATED_FUNCTIONS)),
    ("logit_bias", Read),
    ("logprobs", Read),
    ("max_completion_tokens", Read),
    ("max_tokens", Read),
    ("metadata", Refused(STORED)),
    ("modalities", Read),
    ("n", Read),
    ("parallel_tool_calls", Read),
    ("prediction", Read),
    ("presence_penalty", Read),
    (
        "prompt_cache_key",
        Refused("cache routing keys are not supported"),
    ),
    (
        "reasoning_effort",
        Refused("reasoning effort is not supported"),
    ),
    ("response_format", Read),
    ("safety_identifier", Read),
    ("seed", Read),
    ("service_tier", Read),
    ("stop", Read),
    ("store", Read),
    ("stream", Read),
    ("stream_options", Read),
    ("temperature", Read),
    ("tool_choice", Read),
    ("tools", Read),
    ("top_logprobs", Read),
    ("top_p", Read),
    ("user", Read),
    ("verbosity", Refused("verbosity is not supported")),
    // llama.cpp's and vLLM's extra: variables for the chat template.
    ("chat_template_kwargs", Read),
    ("web_search_options", Refused("web search is not supported")),
];

/// `POST /v1/completions`: OpenAI's request fields, then the extras.
pub const COMPLETION: &[(&str, Support)] = &[
    ("model", Read),
    ("prompt", Read),
    ("best_of", Read),
    ("echo", Read),
    ("frequency_penalty", Read),
    ("logit_bias", Read),
    ("logprobs", Read),
    ("max_tokens", Read),
    ("n", Read),
    ("presence_penalty", Read),
    ("seed", Read),
    ("stop", Read),
    ("stream", Read),
    ("stream_options", Read),
    // Refused by `infill` for a model without fill-in-the-middle tokens.
    ("suffix", Read),
    ("temperature", Read),
    ("top_p", Read),
    ("user", Read),
];

/// What `endpoint` does with the field `name`; `None` when it does not know it.
pub fn support(endpoint: Endpoint, name: &str) -> Option<Support> {
    let own = match endpoint {
        Endpoint::Chat => CHAT,
        Endpoint::Completion => COMPLETION,
    };
    own.iter()
        .chain(EXTRAS)
        .find(|(known, _)| *known == name)
        .map(|&(_, support)| support)
}

/// Refuses the first field of `body` that `endpoint` refuses or does not know.
pub fn check(body: &Map<String, Value>, endpoint: Endpoint) -> Result<(), ApiError> {
    for (name, value) in body {
        if value.is_null() {
            continue;
        }
        match support(endpoint, name) {
            Some(Read) => {}
            Some(Refused(reason)) => {
                return Err(ApiError::invalid(
                    name.as_str(),
                    format!("`{name}`: {reason}"),
                ))
            }
            None => {
                return Err(
                    ApiError::invalid(name.as_str(), format!("unknown field `{name}`"))
                        .with_code("unknown_parameter"),
                )
            }
        }
    }
    Ok(())
}

/// Refuses the keys of the object `value` (the field `param`) that are not in `known`.
pub fn check_keys(param: &str, value: &Map<String, Value>, known: &[&str]) -> Result<(), ApiError> {
    match value.keys().find(|key| !known.contains(&key.as_str())) {
        Some(key) => Err(ApiError::invalid(
            format!("{param}.{key}"),
            format!(
                "unknown field `{key}` in `{param}`; known: {}",
                known.join(", ")
            ),
        )
        .with_code("unknown_parameter")),
        None => Ok(()),
    }
}
