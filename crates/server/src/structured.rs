//! The fields that shape which tokens may be sampled: `logit_bias`, `response_format`
//! (`text`, `json_object`, `json_schema`) and `grammar` (GBNF, as llama.cpp's server takes
//! it); a grammar is compiled against the vocabulary before anything is submitted, so a
//! schema that does not compile is a 400 naming the field.

use std::sync::Arc;

use runit_engine::constraint::{Constraint, ConstraintError, Grammar};
use runit_engine::sampler::LOGIT_BIAS_LIMIT;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::fields::check_keys;
use crate::request::{field, wrong_type};
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

/// Reads `response_format` and `grammar`; at most one of them may ask for a grammar.
pub fn grammar(body: &Map<String, Value>) -> Result<Option<RequestedGrammar>, ApiError> {
    let from_format = match field(body, "response_format") {
        None => None,
        Some(Value::Object(format)) => response_format(format)?,
        Some(other) => return Err(wrong_type("response_format", "an object", other)),
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
            "give either `grammar` or a JSON `response_format`, not both",
        )),
        (format, grammar) => Ok(format.or(grammar)),
    }
}

fn response_format(format: &Map<String, Value>) -> Result<Option<RequestedGrammar>, ApiError> {
    let param = "response_format";
    let kind = match format.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        Some(other) => return Err(wrong_type("response_format.type", "a string", other)),
        None => {
            return Err(ApiError::invalid(
                "response_format.type",
                "`response_format` needs a `type`: text, json_object or json_schema",
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
            check_keys(param, format, &["type", "json_schema"])?;
            let param_schema = "response_format.json_schema";
            let wrapper = match format.get("json_schema") {
                Some(Value::Object(wrapper)) => wrapper,
                Some(other) => return Err(wrong_type(param_schema, "an object", other)),
                None => {
                    return Err(ApiError::invalid(
                        param_schema,
                        "a `json_schema` response format needs `json_schema`",
                    ))
                }
            };
            check_keys(
                param_schema,
                wrapper,
                &["name", "description", "schema", "strict"],
            )?;
            if let Some(strict) = wrapper.get("strict").filter(|value| !value.is_null()) {
                // The schema is enforced as written whether or not `strict` is set.
                if !strict.is_boolean() {
                    return Err(wrong_type(
                        "response_format.json_schema.strict",
                        "a boolean",
                        strict,
                    ));
                }
            }
            let schema = match wrapper.get("schema") {
                Some(schema @ Value::Object(_)) => schema.clone(),
                Some(other) => {
                    return Err(wrong_type(
                        "response_format.json_schema.schema",
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
            "response_format.type",
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
