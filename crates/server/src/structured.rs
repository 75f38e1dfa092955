//! The fields that shape which tokens may be sampled: `logit_bias`, `response_format`
//! (`text`, `json_object`, `json_schema`; `text.format` of responses) and `grammar` (GBNF, as llama.cpp's server takes
//! it); a grammar is compiled against the vocabulary before anything is submitted, so a
//! schema that does not compile is a 400 naming the field.

use std::sync::Arc;

use runit_engine::constraint::{Constraint, ConstraintError, Grammar};
use runit_engine::sampler::LOGIT_BIAS_LIMIT;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::fields::check_keys;
use crate::request::{field, wrong_type};
use crate::response::Endpoint;
use crate::AppState;

/// A grammar a request asks for, and the field that asked.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestedGrammar {
    pub param: &'static str,
    pub grammar: Grammar,
}

/// Reads `logit_bias`: an object from token ids (as strings) to biases in [-100, 100]; an
/// id outside the vocabulary of `vocab_size` is a 400.
pub fn logit_bias(
    body: &Map<String, Value>,
    vocab_size: usize,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let object = match field(body, "logit_bias") {
        None => return Ok(Vec::new()),
        Some(Value::Object(object)) => object,
        Some(other) => return Err(wrong_type("logit_bias", "an object", other)),
    };
    object
        .iter()
        .map(|(key, value)| {
            let param = format!("logit_bias.{key}");
            let id = key
                .parse::<u32>()
                .ok()
                .filter(|&id| (id as usize) < vocab_size)
                .ok_or_else(|| {
                    ApiError::invalid(
                        &param,
                        format!(
                            "`logit_bias` keys must be token ids from 0 to {}, found `{key}`",
                            vocab_size.saturating_sub(1)
                        ),
                    )
                })?;
            let bias = value
                .as_f64()
                .filter(|bias| (-100.0..=100.0).contains(bias))
                .ok_or_else(|| {
                    ApiError::invalid(
                        &param,
                        format!(
                            "a bias must be a number from -{LOGIT_BIAS_LIMIT} to \
                             {LOGIT_BIAS_LIMIT}, found {value}"
                        ),
                    )
                })?;
            Ok((id, bias as f32))
        })
        .collect()
}

/// Reads the output format (`response_format` of chat and completions, `text.format` of
/// responses) and `grammar`; at most one of them may ask for a grammar.
pub fn grammar(
    body: &Map<String, Value>,
    endpoint: Endpoint,
) -> Result<Option<RequestedGrammar>, ApiError> {
    let (format_param, from_format) = match endpoint {
        Endpoint::Responses => ("text.format", text_format(body)?),
        Endpoint::Chat | Endpoint::Completion => match field(body, "response_format") {
            None => ("response_format", None),
            Some(Value::Object(format)) => (
                "response_format",
                response_format(format, "response_format", true)?,
            ),
            Some(other) => return Err(wrong_type("response_format", "an object", other)),
        },
    };
    let from_grammar = match field(body, "grammar") {
        None => None,
        Some(Value::String(source)) => Some(RequestedGrammar {
            param: "grammar",
            grammar: Grammar::Gbnf(source.clone()),
        }),
        Some(other) => return Err(wrong_type("grammar", "a string (GBNF)", other)),
    };
    match (from_format, from_grammar) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "grammar",
            format!("give either `grammar` or a JSON `{format_param}`, not both"),
        )),
        (format, grammar) => Ok(format.or(grammar)),
    }
}

/// Reads the Responses API's `text`: its `format` (the fields of a `json_schema` format
/// beside its `type`); `verbosity` is refused, as on chat.
fn text_format(body: &Map<String, Value>) -> Result<Option<RequestedGrammar>, ApiError> {
    let text = match field(body, "text") {
        None => return Ok(None),
        Some(Value::Object(text)) => text,
        Some(other) => return Err(wrong_type("text", "an object", other)),
    };
    check_keys("text", text, &["format", "verbosity"])?;
    if field(text, "verbosity").is_some() {
        return Err(ApiError::invalid(
            "text.verbosity",
            "`text.verbosity`: verbosity is not supported",
        ));
    }
    match field(text, "format") {
        None => Ok(None),
        Some(Value::Object(format)) => response_format(format, "text.format", false),
        Some(other) => Err(wrong_type("text.format", "an object", other)),
    }
}

/// Reads an output format given in the field `param`; `nested`: the fields of a
/// `json_schema` format sit in its `json_schema` object (chat), else beside `type`.
fn response_format(
    format: &Map<String, Value>,
    param: &'static str,
    nested: bool,
) -> Result<Option<RequestedGrammar>, ApiError> {
    let type_param = format!("{param}.type");
    let kind = match format.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        Some(other) => return Err(wrong_type(&type_param, "a string", other)),
        None => {
            return Err(ApiError::invalid(
                type_param,
                format!("`{param}` needs a `type`: text, json_object or json_schema"),
            ))
        }
    };
    match kind {
        "text" => {
            check_keys(param, format, &["type"])?;
            Ok(None)
        }
        "json_object" => {
            check_keys(param, format, &["type"])?;
            Ok(Some(RequestedGrammar {
                param,
                grammar: Grammar::JsonObject,
            }))
        }
        "json_schema" => {
            const SCHEMA_KEYS: [&str; 5] = ["type", "name", "description", "schema", "strict"];
            let (wrapper, wrapper_param, known) = if nested {
                check_keys(param, format, &["type", "json_schema"])?;
                let wrapper_param = format!("{param}.json_schema");
                match format.get("json_schema") {
                    Some(Value::Object(wrapper)) => (wrapper, wrapper_param, &SCHEMA_KEYS[1..]),
                    Some(other) => return Err(wrong_type(&wrapper_param, "an object", other)),
                    None => {
                        return Err(ApiError::invalid(
                            wrapper_param,
                            "a `json_schema` response format needs `json_schema`",
                        ))
                    }
                }
            } else {
                (format, param.to_string(), &SCHEMA_KEYS[..])
            };
            check_keys(&wrapper_param, wrapper, known)?;
            if let Some(strict) = wrapper.get("strict").filter(|value| !value.is_null()) {
                // The schema is enforced as written whether or not `strict` is set.
                if !strict.is_boolean() {
                    return Err(wrong_type(
                        &format!("{wrapper_param}.strict"),
                        "a boolean",
                        strict,
                    ));
                }
            }
            let schema = match wrapper.get("schema") {
                Some(schema @ Value::Object(_)) => schema.clone(),
                Some(other) => {
                    return Err(wrong_type(
                        &format!("{wrapper_param}.schema"),
                        "an object",
                        other,
                    ))
                }
                // The schema is optional in OpenAI's API: without one, any JSON object.
                None => serde_json::json!({"type": "object"}),
            };
            Ok(Some(RequestedGrammar {
                param,
                grammar: Grammar::JsonSchema(schema),
            }))
        }
        other => Err(ApiError::invalid(
            type_param,
            format!("unknown response format `{other}`; expected text, json_object or json_schema"),
        )),
    }
}

/// Compiles `requested` against the model's vocabulary on the blocking pool; a grammar that
/// does not compile is a 400 naming the field that gave it.
pub async fn compile(
    state: &Arc<AppState>,
    requested: RequestedGrammar,
) -> Result<Constraint, ApiError> {
    let compiler = match &state.grammars {
        Ok(compiler) => compiler.clone(),
        Err(error) => {
            return Err(ApiError::invalid(
                requested.param,
                format!("structured output is not available for this model: {error}"),
            ))
        }
    };
    let param = requested.param;
    let compiled = tokio::task::spawn_blocking(move || compiler.compile(&requested.grammar))
        .await
        .map_err(|error| ApiError::internal(format!("compiling the grammar failed: {error}")))?;
    compiled.map_err(|error: ConstraintError| ApiError::invalid(param, error.to_string()))
}
