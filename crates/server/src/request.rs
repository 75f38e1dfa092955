//! Reading OpenAI request bodies field by field, so that a wrong type or value is answered
//! with a 400 naming the field (`param`) instead of a generic deserialisation failure.

use runit_engine::sampler::random_seed;
use runit_engine::SamplerParams;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::reasoning::ThinkFilter;
use crate::response::Endpoint;
use crate::structured::{self, RequestedGrammar};
use crate::tools::parse::CallFilter;
use crate::{accepted, fields};

/// Most choices (`n`) one request may ask for.
pub const MAX_CHOICES: usize = 16;
/// Most prompts one text-completion request may give.
pub const MAX_PROMPTS: usize = 16;
/// Most sequences (prompts × `n`) one request may start.
pub const MAX_SEQUENCES: usize = 64;
/// Most stop strings one request may give.
pub const MAX_STOPS: usize = 16;
/// Most top log-probabilities per token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The generation settings shared by chat and text completions and responses.
#[derive(Debug, Clone)]
pub struct Options {
    pub model: Option<String>,
    pub max_tokens: Option<TokenLimit>,
    /// The fields the request gives over [`SamplerParams::DEFAULT`] (and a random seed).
    pub sampling: SamplerParams,
    pub stop: Vec<String>,
    /// Log-probabilities of the chosen tokens are wanted.
    pub logprobs: bool,
    pub top_logprobs: usize,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// `ignore_eos` (an extension that llama.cpp's server and vLLM also accept): generation
    /// runs on past end-of-generation tokens until `max_tokens` or the context ends them.
    pub ignore_eos: bool,
    /// The grammar the output must follow (`response_format` or `grammar`), not compiled yet.
    pub grammar: Option<RequestedGrammar>,
    /// `echo` (completions): the prompt's text starts each choice's text.
    pub echo: bool,
    /// The text of each prompt, when `echo` is set (the completions handler fills it).
    pub echo_texts: Vec<String>,
    /// `safety_identifier` or `user`, for the log.
    pub caller: Option<String>,
    /// Reads tool calls out of each choice's text, when tools are offered.
    pub calls: Option<CallFilter>,
    /// Moves reasoning out of each choice's text, for reasoning models.
    pub think: Option<ThinkFilter>,
    /// `prediction`: the text the answer is expected to repeat (seeds the drafter).
    pub prediction: Option<String>,
}

/// The most tokens a request asks for, and the field it named them in (`max_tokens`,
/// `max_completion_tokens` or `max_output_tokens`). The engine's request check refuses 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenLimit {
    /// The field that gave the count.
    pub param: &'static str,
    pub count: usize,
}

impl TokenLimit {
    /// The answer to a count below 1 (`found`) in this field.
    pub fn too_few(param: &str, found: i64) -> ApiError {
        ApiError::invalid(
            param,
            format!("`{param}` must be at least 1, found {found}"),
        )
    }
}

/// The body as a JSON object; malformed JSON or another JSON type is a 400.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|error| ApiError::bad_request(format!("the body is not valid JSON: {error}")))?;
    match value {
        Value::Object(map) => Ok(map),
        other => Err(ApiError::bad_request(format!(
            "the body must be a JSON object, found {}",
            type_name(&other)
        ))),
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(crate) fn wrong_type(param: &str, expected: &str, found: &Value) -> ApiError {
    ApiError::invalid(
        param,
        format!("`{param}` must be {expected}, found {}", type_name(found)),
    )
}

/// A field that is absent or null reads as `None`.
pub(crate) fn field<'a>(body: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    body.get(name).filter(|value| !value.is_null())
}

fn number(body: &Map<String, Value>, name: &str) -> Result<Option<f64>, ApiError> {
    match field(body, name) {
        None => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(other) => Err(wrong_type(name, "a number", other)),
    }
}

pub(crate) fn integer(body: &Map<String, Value>, name: &str) -> Result<Option<i64>, ApiError> {
    match field(body, name) {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(i) => Ok(Some(i)),
            None => Err(ApiError::invalid(
                name,
                format!("`{name}` must be an integer, found {n}"),
            )),
        },
        Some(other) => Err(wrong_type(name, "an integer", other)),
    }
}

pub(crate) fn boolean(body: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match field(body, name) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(wrong_type(name, "a boolean", other)),
    }
}

fn in_range(name: &str, value: f64, low: f64, high: f64) -> Result<f32, ApiError> {
    if value.is_finite() && (low..=high).contains(&value) {
        Ok(value as f32)
    } else {
        Err(ApiError::invalid(
            name,
            format!("`{name}` must be between {low} and {high}, found {value}"),
        ))
    }
}

/// Reads the settings of a request to `endpoint` after refusing the fields it does not
/// support ([`fields::check`]); `endpoint` also selects how `logprobs` is read (a boolean
/// with `top_logprobs` for chat, an integer count for text completions, `include` or
/// `top_logprobs` for responses). Token ids (in
/// `logit_bias`) must be below `vocab_size`.
pub fn options(
    body: &Map<String, Value>,
    endpoint: Endpoint,
    vocab_size: usize,
) -> Result<Options, ApiError> {
    fields::check(body, endpoint)?;
    let model = match field(body, "model") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => return Err(wrong_type("model", "a string", other)),
    };
    let max_tokens = match (
        integer(body, "max_output_tokens")?,
        integer(body, "max_completion_tokens")?,
        integer(body, "max_tokens")?,
    ) {
        (Some(n), _, _) => Some(("max_output_tokens", n)),
        (None, Some(n), _) => Some(("max_completion_tokens", n)),
        (None, None, Some(n)) => Some(("max_tokens", n)),
        (None, None, None) => None,
    };
    // A negative number is no count; 0 is a count that the engine's check refuses.
    let max_tokens = match max_tokens {
        Some((param, n)) => Some(TokenLimit {
            param,
            count: usize::try_from(n).map_err(|_| TokenLimit::too_few(param, n))?,
        }),
        None => None,
    };
    let mut sampling = SamplerParams {
        seed: random_seed(),
        ..SamplerParams::DEFAULT
    };
    if let Some(t) = number(body, "temperature")? {
        sampling.temperature = in_range("temperature", t, 0.0, 2.0)?;
    }
    if let Some(p) = number(body, "top_p")? {
        sampling.top_p = in_range("top_p", p, f64::MIN_POSITIVE, 1.0)?;
    }
    if let Some(p) = number(body, "min_p")? {
        sampling.min_p = in_range("min_p", p, 0.0, 1.0)?;
    }
    if let Some(k) = integer(body, "top_k")? {
        if k < 0 {
            return Err(ApiError::invalid("top_k", "`top_k` must be 0 or more"));
        }
        sampling.top_k = k as usize;
    }
    if let Some(p) = number(body, "presence_penalty")? {
        sampling.presence_penalty = in_range("presence_penalty", p, -2.0, 2.0)?;
    }
    if let Some(p) = number(body, "frequency_penalty")? {
        sampling.frequency_penalty = in_range("frequency_penalty", p, -2.0, 2.0)?;
    }
    if let Some(p) = number(body, "repetition_penalty")? {
        sampling.repeat_penalty = in_range("repetition_penalty", p, 0.01, 10.0)?;
    }
    if let Some(seed) = integer(body, "seed")? {
        sampling.seed = seed as u64;
    }
    sampling.logit_bias = structured::logit_bias(body, vocab_size)?;
    let stop = stop_strings(body)?;
    let (logprobs, top_logprobs) = match endpoint {
        Endpoint::Chat => {
            let wanted = boolean(body, "logprobs")?.unwrap_or(false);
            let top = integer(body, "top_logprobs")?.unwrap_or(0);
            (wanted, top)
        }
        Endpoint::Completion => {
            let top = integer(body, "logprobs")?;
            (top.is_some(), top.unwrap_or(0))
        }
        // Asked for by `include`, or by a count of alternatives.
        Endpoint::Responses => {
            let top = integer(body, "top_logprobs")?.unwrap_or(0);
            (accepted::includes_logprobs(body)? || top > 0, top)
        }
    };
    let top_param = match endpoint {
        Endpoint::Completion => "logprobs",
        Endpoint::Chat | Endpoint::Responses => "top_logprobs",
    };
    if !(0..=MAX_TOP_LOGPROBS as i64).contains(&top_logprobs) {
        return Err(ApiError::invalid(
            top_param,
            format!("`{top_param}` must be between 0 and {MAX_TOP_LOGPROBS}"),
        ));
    }
    let n = integer(body, "n")?.unwrap_or(1);
    if !(1..=MAX_CHOICES as i64).contains(&n) {
        return Err(ApiError::invalid(
            "n",
            format!("`n` must be between 1 and {MAX_CHOICES}, found {n}"),
        ));
    }
    let stream = boolean(body, "stream")?.unwrap_or(false);
    let include_usage = stream_options(body, endpoint)?;
    let ignore_eos = boolean(body, "ignore_eos")?.unwrap_or(false);
    let grammar = structured::grammar(body, endpoint)?;
    if let (Some(requested), true) = (&grammar, ignore_eos) {
        return Err(ApiError::invalid(
            requested.param,
            "a grammar ends generation when it is complete; it cannot be combined with \
             `ignore_eos`",
        ));
    }
    let echo = match endpoint {
        Endpoint::Chat => {
            accepted::chat_fields(body)?;
            false
        }
        Endpoint::Completion => {
            accepted::completion_fields(body, n as usize)?;
            boolean(body, "echo")?.unwrap_or(false)
        }
        Endpoint::Responses => {
            accepted::responses_fields(body)?;
            false
        }
    };
    if echo && logprobs {
        return Err(ApiError::invalid(
            "echo",
            "`echo` with `logprobs` asks for the prompt's log-probabilities, which are not \
             computed",
        ));
    }
    Ok(Options {
        model,
        max_tokens,
        sampling,
        stop,
        logprobs,
        top_logprobs: top_logprobs as usize,
        n: n as usize,
        stream,
        include_usage,
        ignore_eos,
        grammar,
        echo,
        echo_texts: Vec::new(),
        caller: accepted::caller(body)?,
        calls: None,
        think: None,
        prediction: crate::prediction::prediction(body)?,
    })
}

/// Reads `stream_options`: `include_usage` (chat and completions: whether a usage chunk
/// ends the stream), or `include_obfuscation` (responses: no padding is added, so `true`
/// is refused).
fn stream_options(body: &Map<String, Value>, endpoint: Endpoint) -> Result<bool, ApiError> {
    let options = match field(body, "stream_options") {
        None => return Ok(false),
        Some(Value::Object(options)) => options,
        Some(other) => return Err(wrong_type("stream_options", "an object", other)),
    };
    let key = match endpoint {
        Endpoint::Chat | Endpoint::Completion => "include_usage",
        Endpoint::Responses => "include_obfuscation",
    };
    let param = format!("stream_options.{key}");
    let value = fields::check_keys("stream_options", options, &[key])
        .and_then(|()| boolean(options, key))
        .map_err(|e| ApiError {
            param: Some(param.clone()),
            ..e
        })?
        .unwrap_or(false);
    if endpoint == Endpoint::Responses && value {
        return Err(ApiError::invalid(
            param,
            "`include_obfuscation: true`: this server does not pad stream events",
        ));
    }
    Ok(endpoint != Endpoint::Responses && value)
}

fn stop_strings(body: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let stops = match field(body, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => Ok(s.clone()),
                other => Err(wrong_type(&format!("stop[{i}]"), "a string", other)),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(wrong_type("stop", "a string or an array of strings", other)),
    };
    if stops.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {MAX_STOPS} stop strings, found {}", stops.len()),
        ));
    }
    Ok(stops)
}

/// One prompt of a text completion: text, or token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// Reads `prompt`: a string, an array of strings, an array of token ids, or an array of
/// token-id arrays; each string or id array is one prompt.
pub fn prompts(body: &Map<String, Value>) -> Result<Vec<Prompt>, ApiError> {
    prompt_list(body, "prompt", MAX_PROMPTS)
}

/// Reads the field `name` as [`prompts`] reads `prompt` (the embeddings' `input` too): at
/// most `most` of them.
pub fn prompt_list(
    body: &Map<String, Value>,
    name: &str,
    most: usize,
) -> Result<Vec<Prompt>, ApiError> {
    let value = match field(body, name) {
        None => return Err(ApiError::invalid(name, format!("`{name}` is required"))),
        Some(value) => value,
    };
    let prompts = match value {
        Value::String(text) => vec![Prompt::Text(text.clone())],
        Value::Array(items) if items.is_empty() => {
            return Err(ApiError::invalid(
                name,
                format!("`{name}` must not be empty"),
            ))
        }
        Value::Array(items) if items.iter().all(Value::is_number) => {
            vec![Prompt::Tokens(token_ids(name, items)?)]
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let param = format!("{name}[{i}]");
                match item {
                    Value::String(text) => Ok(Prompt::Text(text.clone())),
                    Value::Array(ids) if !ids.is_empty() => {
                        Ok(Prompt::Tokens(token_ids(&param, ids)?))
                    }
                    other => Err(wrong_type(
                        &param,
                        "a string or a non-empty array of token ids",
                        other,
                    )),
                }
            })
            .collect::<Result<_, _>>()?,
        other => return Err(wrong_type(name, "a string or an array", other)),
    };
    if prompts.len() > most {
        return Err(ApiError::invalid(
            name,
            format!("at most {most} in `{name}`, found {}", prompts.len()),
        ));
    }
    Ok(prompts)
}

/// Token ids from JSON numbers; anything but an integer that fits in 32 bits is a 400.
fn token_ids(param: &str, items: &[Value]) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            item.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    ApiError::invalid(
                        param,
                        format!("token ids must be integers from 0 to 2^32-1, found {item} at {i}"),
                    )
                })
        })
        .collect()
}
