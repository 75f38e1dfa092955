//! Which top-level request fields each endpoint knows, and what it does with them: a field is
//! read (its value checked where it is parsed) or refused with a 400 naming it and saying
//! why; a field that is neither is unknown and refused too, so nothing a client sends is
//! dropped silently. A refused or unknown field given as `null` counts as absent (at any
//! depth: [`check_keys`]), as OpenAI's clients send `null` for fields they leave unset.

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
const NOT_STORED: &str =
    "nothing is stored by this server, so no earlier response or conversation \
                          can be continued; send the whole conversation in `input`";
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
    ("prompt_cache_key", Read),
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

/// `POST /v1/responses`: the fields of OpenAI's Responses create request, then the extras
/// (and `chat_template_kwargs`, as on chat). Values are checked where they are read
/// (`responses::fields`): `store`, `background`, `truncation`, `include`, ...
pub const RESPONSES: &[(&str, Support)] = &[
    ("input", Read),
    ("model", Read),
    (
        "access_programs",
        Refused("access programs are not offered by this server"),
    ),
    ("background", Read),
    (
        "background_options",
        Refused("background execution is not supported"),
    ),
    (
        "context_management",
        Refused("context compaction is not supported"),
    ),
    ("conversation", Refused(NOT_STORED)),
    ("image", Refused("image input is not supported")),
    ("include", Read),
    ("instructions", Read),
    ("max_output_tokens", Read),
    ("max_tool_calls", Read),
    ("metadata", Read),
    ("moderation", Refused("moderation is not offered by this server")),
    ("parallel_tool_calls", Read),
    ("previous_response_id", Refused(NOT_STORED)),
    (
        "prompt",
        Refused("stored prompt templates are not kept by this server; send `input`"),
    ),
    ("prompt_cache_key", Read),
    (
        "prompt_cache_options",
        Refused("prompt cache options are not supported (common prefixes are cached for every request)"),
    ),
    (
        "prompt_cache_retention",
        Refused("prompt cache retention is not supported (common prefixes are cached while they fit)"),
    ),
    (
        "reasoning",
        Refused("reasoning effort, summaries and modes are not supported; a model that thinks in `<think>` answers with a `reasoning` item as its template makes it think"),
    ),
    ("safety_identifier", Read),
    ("service_tier", Read),
    ("store", Read),
    ("stream", Read),
    ("stream_options", Read),
    ("temperature", Read),
    ("text", Read),
    ("tool_choice", Read),
    ("tools", Read),
    ("top_logprobs", Read),
    ("top_p", Read),
    ("truncation", Read),
    ("user", Read),
    ("chat_template_kwargs", Read),
];

/// What `endpoint` does with the field `name`; `None` when it does not know it.
pub fn support(endpoint: Endpoint, name: &str) -> Option<Support> {
    let own = match endpoint {
        Endpoint::Chat => CHAT,
        Endpoint::Completion => COMPLETION,
        Endpoint::Responses => RESPONSES,
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

/// Refuses the keys of the object `value` (the field `param`) that are not in `known`; a key
/// given as `null` counts as absent, as at the top level (clients that echo an earlier
/// output item back write its unset fields as `null`).
pub fn check_keys(param: &str, value: &Map<String, Value>, known: &[&str]) -> Result<(), ApiError> {
    let unknown = value
        .iter()
        .find(|(key, item)| !item.is_null() && !known.contains(&key.as_str()));
    match unknown {
        Some((key, _)) => Err(ApiError::invalid(
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
