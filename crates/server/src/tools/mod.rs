//! Tool calling: the `tools`, `tool_choice` and `parallel_tool_calls` fields, the format the
//! model's chat template writes calls in ([`ToolFormat`]: Qwen 2.5/3 and Hermes
//! `<tool_call>` JSON, Llama 3.x JSON, Mistral `[TOOL_CALLS]`), and the grammar that forces a
//! call when `tool_choice` is `required` or names a function, so that the arguments always
//! parse and match the function's JSON schema. Reading calls out of the output is
//! [`parse`]'s.

pub mod parse;

use runit_engine::constraint::Grammar;
use runit_tokenizer::{TemplateInputs, Tokenizer};
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::fields::check_keys;
use crate::request::{boolean, field, wrong_type, Options};
use crate::response::Endpoint;
use crate::structured::RequestedGrammar;
use crate::AppState;
use parse::CallFilter;

/// How a model writes its tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call
    /// (Qwen 2.5, Qwen 3, Hermes).
    Hermes,
    /// `{"name": ..., "parameters": {...}}` as the whole answer, maybe after
    /// `<|python_tag|>` (Llama 3.1 to 3.3).
    Llama3,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (Mistral).
    Mistral,
    /// `[TOOL_CALLS]name[ARGS]{...}`, once per call (the Mistral templates of late 2025 on:
    /// Magistral, Devstral, Mistral Small 3.2).
    MistralArgs,
}

impl ToolFormat {
    /// The format a chat template's own text shows; `None` when the template does not take
    /// `tools` at all.
    pub fn of_template(source: &str) -> Option<ToolFormat> {
        if !source.contains("tools") {
            return None;
        }
        Some(
            if source.contains("[TOOL_CALLS]") && source.contains("[ARGS]") {
                ToolFormat::MistralArgs
            } else if source.contains("[TOOL_CALLS]") {
                ToolFormat::Mistral
            } else if source.contains("<tool_call>") {
                ToolFormat::Hermes
            } else if source.contains("<|python_tag|>") || source.contains("\"parameters\"") {
                ToolFormat::Llama3
            } else {
                ToolFormat::Hermes
            },
        )
    }

    /// The key that holds a call's arguments.
    pub fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Llama3 => "parameters",
            ToolFormat::Hermes | ToolFormat::Mistral | ToolFormat::MistralArgs => "arguments",
        }
    }
}

/// One function a request offers.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    /// The JSON schema of its arguments (an object schema when the request gives none).
    pub parameters: Value,
}

/// Whether and which tool the model must call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// The tool fields of a chat request.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    pub tools: Vec<Tool>,
    /// The `tools` array as given, for the template.
    pub definitions: Value,
    pub choice: ToolChoice,
    /// Several calls may be made in one answer (`parallel_tool_calls`, default true).
    pub parallel: bool,
}

impl ToolRequest {
    /// True when the model is offered tools (some, and `tool_choice` is not `none`).
    pub fn offers_tools(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }
}

/// Reads `tools`, `tool_choice` and `parallel_tool_calls`; `None` without tools. A tool of
/// the Responses API (`endpoint`) has its function's fields beside its `type`, and a named
/// choice its `name`; the definitions for the template are in chat's shape either way.
pub fn read(
    body: &Map<String, Value>,
    endpoint: Endpoint,
) -> Result<Option<ToolRequest>, ApiError> {
    let flat = endpoint == Endpoint::Responses;
    let parallel = boolean(body, "parallel_tool_calls")?.unwrap_or(true);
    let definitions = match field(body, "tools") {
        None => None,
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid(
                "tools",
                "`tools` must hold at least one tool",
            ))
        }
        Some(Value::Array(items)) => Some(items),
        Some(other) => return Err(wrong_type("tools", "an array", other)),
    };
    let tools = match definitions {
        Some(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| tool(i, item, flat))
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    let choice = match field(body, "tool_choice") {
        None if tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(Value::String(choice)) => match choice.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                    "unknown `tool_choice` `{other}`; expected none, auto, required or a function"
                ),
                ))
            }
        },
        Some(Value::Object(choice)) => named_choice(choice, flat)?,
        Some(other) => return Err(wrong_type("tool_choice", "a string or an object", other)),
    };
    let offered = |name: &str| tools.iter().any(|tool| tool.name == name);
    match &choice {
        ToolChoice::Required if tools.is_empty() => Err(ApiError::invalid(
            "tool_choice",
            "`tool_choice` `required` needs `tools`",
        )),
        ToolChoice::Named(name) if !offered(name) => Err(ApiError::invalid(
            "tool_choice",
            format!("`tool_choice` names `{name}`, which is not among `tools`"),
        )),
        _ => Ok(definitions.map(|items| ToolRequest {
            tools,
            definitions: if flat {
                Value::Array(items.iter().map(nested_definition).collect())
            } else {
                Value::Array(items.clone())
            },
            choice,
            parallel,
        })),
    }
}

/// A Responses API tool (`{type, name, parameters, ...}`, checked) in chat's shape
/// (`{type, function: {name, parameters, ...}}`), as templates take it.
fn nested_definition(item: &Value) -> Value {
    let mut function = item.as_object().cloned().unwrap_or_default();
    function.remove("type");
    json!({"type": "function", "function": function})
}

/// Reads a named `tool_choice`: `{type: "function", function: {name}}`, or with `flat`
/// (responses) `{type: "function", name}`; other types name tools that are never offered.
fn named_choice(choice: &Map<String, Value>, flat: bool) -> Result<ToolChoice, ApiError> {
    if let Some(kind) = field(choice, "type").filter(|kind| *kind != "function") {
        return Err(ApiError::invalid(
            "tool_choice.type",
            format!("only a `function` can be chosen, found {kind}"),
        ));
    }
    let (name, param) = if flat {
        check_keys("tool_choice", choice, &["type", "name"])?;
        (choice.get("name"), "tool_choice.name")
    } else {
        check_keys("tool_choice", choice, &["type", "function"])?;
        let name = choice
            .get("function")
            .and_then(|function| function.get("name"));
        (name, "tool_choice.function.name")
    };
    let name = name.and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(param, format!("a named `tool_choice` needs `{param}`"))
    })?;
    Ok(ToolChoice::Named(name.to_string()))
}

/// The keys of a function definition.
const FUNCTION_KEYS: [&str; 5] = ["type", "name", "description", "parameters", "strict"];

fn tool(i: usize, item: &Value, flat: bool) -> Result<Tool, ApiError> {
    let param = format!("tools[{i}]");
    let Value::Object(item) = item else {
        return Err(wrong_type(&param, "an object", item));
    };
    if let Some(kind) = field(item, "type").filter(|kind| *kind != "function") {
        return Err(ApiError::invalid(
            format!("{param}.type"),
            format!("only `function` tools are supported, found {kind}"),
        ));
    }
    let (function, function_param) = if flat {
        check_keys(&param, item, &FUNCTION_KEYS)?;
        (item, param)
    } else {
        check_keys(&param, item, &["type", "function"])?;
        let function_param = format!("{param}.function");
        match field(item, "function") {
            Some(Value::Object(function)) => {
                check_keys(&function_param, function, &FUNCTION_KEYS[1..])?;
                (function, function_param)
            }
            Some(other) => return Err(wrong_type(&function_param, "an object", other)),
            None => {
                return Err(ApiError::invalid(
                    function_param,
                    "a tool needs a `function`",
                ))
            }
        }
    };
    let name_param = format!("{function_param}.name");
    let name = match field(function, "name") {
        Some(Value::String(name)) => name.clone(),
        Some(other) => return Err(wrong_type(&name_param, "a string", other)),
        None => return Err(ApiError::invalid(name_param, "a tool needs a `name`")),
    };
    let valid_name = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid_name {
        return Err(ApiError::invalid(
            name_param,
            format!("tool names are 1 to 64 letters, digits, `_` or `-`, found `{name}`"),
        ));
    }
    let parameters = match field(function, "parameters") {
        None => json!({"type": "object"}),
        Some(schema @ Value::Object(_)) => schema.clone(),
        Some(other) => {
            return Err(wrong_type(
                &format!("{function_param}.parameters"),
                "an object (a JSON schema)",
                other,
            ))
        }
    };
    Ok(Tool { name, parameters })
}

/// The grammar that forces a call in `format` when `request` asks for one (`required` or a
/// named function); `None` otherwise. Marker texts that are control tokens of `tokenizer`
/// are matched as those tokens.
pub fn forced_grammar(
    request: &ToolRequest,
    format: ToolFormat,
    tokenizer: &Tokenizer,
) -> Option<Grammar> {
    let callable: Vec<&Tool> = match &request.choice {
        ToolChoice::None | ToolChoice::Auto => return None,
        ToolChoice::Required => request.tools.iter().collect(),
        ToolChoice::Named(name) => request.tools.iter().filter(|t| &t.name == name).collect(),
    };
    let calls: Vec<Value> = callable
        .iter()
        .map(|tool| {
            json!({
                "type": "object",
                "properties": {
                    "name": {"const": tool.name},
                    format.arguments_key(): tool.parameters,
                },
                "required": ["name", format.arguments_key()],
                "additionalProperties": false,
            })
        })
        .collect();
    let call = json!({"anyOf": calls});
    let more = if request.parallel {
        "(\"\\n\" call)*"
    } else {
        ""
    };
    let lark = match format {
        ToolFormat::Hermes => format!(
            "start: call {more}\ncall: {} \"\\n\" %json {call} \"\\n\" {}\n",
            marker(tokenizer, "<tool_call>"),
            marker(tokenizer, "</tool_call>"),
        ),
        ToolFormat::Llama3 => format!("start: %json {call}\n"),
        ToolFormat::Mistral => {
            let mut array = json!({"type": "array", "items": call, "minItems": 1});
            if !request.parallel {
                array["maxItems"] = json!(1);
            }
            format!(
                "start: {} %json {array}\n",
                marker(tokenizer, "[TOOL_CALLS]")
            )
        }
        ToolFormat::MistralArgs => {
            let alternatives: Vec<String> = callable
                .iter()
                .map(|tool| {
                    format!(
                        "{} {} {} %json {}",
                        marker(tokenizer, "[TOOL_CALLS]"),
                        Value::String(tool.name.clone()),
                        marker(tokenizer, "[ARGS]"),
                        tool.parameters
                    )
                })
                .collect();
            let more = if request.parallel { "call*" } else { "" };
            format!("start: call {more}\ncall: {}\n", alternatives.join(" | "))
        }
    };
    Some(Grammar::Lark(lark))
}

/// A marker in a Lark grammar: the control token of that text (`<[id]>`) when the
/// vocabulary has one, else the text.
fn marker(tokenizer: &Tokenizer, text: &str) -> String {
    match tokenizer.vocabulary().token_id(text) {
        Some(id) if tokenizer.is_control(id) => format!("<[{id}]>"),
        _ => Value::String(text.into()).to_string(),
    }
}

/// Offers the tools of `request` to the model: through the template's `tools`, with a
/// filter that reads calls out of each choice's text, and with a grammar that forces a call
/// when `tool_choice` asks for one. A template that does not take tools is a 400.
pub fn offer(
    state: &AppState,
    request: &ToolRequest,
    options: &mut Options,
    inputs: &mut TemplateInputs,
) -> Result<(), ApiError> {
    if !request.offers_tools() {
        return Ok(());
    }
    let Some(format) = ToolFormat::of_template(state.template.source()) else {
        return Err(ApiError::invalid(
            "tools",
            "this model's chat template does not take `tools`, so the model cannot be told \
             about them",
        ));
    };
    inputs.tools = Some(request.definitions.clone());
    let names = request.tools.iter().map(|tool| tool.name.clone()).collect();
    options.calls = Some(CallFilter::new(format, names));
    if let Some(grammar) = forced_grammar(request, format, &state.tokenizer) {
        if options.grammar.is_some() {
            return Err(ApiError::invalid(
                "tool_choice",
                "a forced tool call cannot be combined with `response_format` or `grammar`",
            ));
        }
        options.grammar = Some(RequestedGrammar {
            param: "tool_choice",
            grammar,
        });
    }
    Ok(())
}

/// The control tokens that mark tool calls in some vocabulary, shown in a choice's text
/// when tools are offered.
pub fn call_markers(tokenizer: &runit_tokenizer::Tokenizer) -> Vec<u32> {
    [
        "<tool_call>",
        "</tool_call>",
        "[TOOL_CALLS]",
        "[ARGS]",
        "<|python_tag|>",
    ]
    .iter()
    .filter_map(|text| tokenizer.vocabulary().token_id(text))
    .collect()
}
