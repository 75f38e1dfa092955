//! The conversation of a chat request: each message's role, text content, and the tool
//! fields (`tool_calls` of assistant messages, `tool_call_id` of tool messages, `name`),
//! checked field by field so that a fault is a 400 naming it (`messages[2].tool_call_id`).

use runit_tokenizer::ChatMessage;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::fields::check_keys;
use crate::request::{field, wrong_type};

/// The keys a message may have.
const MESSAGE_KEYS: &[&str] = &[
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "refusal",
];

/// The conversation of a chat request.
pub fn messages(body: &Map<String, Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match field(body, "messages") {
        None => return Err(ApiError::invalid("messages", "`messages` is required")),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(wrong_type("messages", "an array", other)),
    };
    if items.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| message(i, item))
        .collect()
}

fn message(i: usize, item: &Value) -> Result<ChatMessage, ApiError> {
    let param = format!("messages[{i}]");
    let Value::Object(object) = item else {
        return Err(wrong_type(&param, "an object", item));
    };
    check_keys(&param, object, MESSAGE_KEYS)?;
    let role = match field(object, "role") {
        Some(Value::String(role)) => role.as_str(),
        Some(other) => return Err(wrong_type(&format!("{param}.role"), "a string", other)),
        None => {
            return Err(ApiError::invalid(
                format!("{param}.role"),
                "every message needs a `role`",
            ))
        }
    };
    let role = match role {
        "system" | "user" | "assistant" | "tool" => role,
        "developer" => "system",
        other => {
            return Err(ApiError::invalid(
                format!("{param}.role"),
                format!(
                    "unknown role `{other}`; expected system, developer, user, assistant or tool"
                ),
            ))
        }
    };
    let mut message = ChatMessage::new(role, content(&param, object)?);
    message.name = optional_string(&param, object, "name")?;
    if field(object, "refusal").is_some() {
        // A template has no place for it; dropping it would change the conversation.
        return Err(ApiError::invalid(
            format!("{param}.refusal"),
            "an assistant's `refusal` cannot be given back to the model; put its text in \
             `content`",
        ));
    }
    match field(object, "tool_calls") {
        None => {}
        Some(_) if role != "assistant" => {
            return Err(ApiError::invalid(
                format!("{param}.tool_calls"),
                "only assistant messages carry `tool_calls`",
            ))
        }
        Some(Value::Array(calls)) => message.tool_calls = Some(tool_calls(&param, calls)?),
        Some(other) => {
            return Err(wrong_type(
                &format!("{param}.tool_calls"),
                "an array",
                other,
            ))
        }
    }
    message.tool_call_id = optional_string(&param, object, "tool_call_id")?;
    match (role, &message.tool_call_id) {
        ("tool", None) => Err(ApiError::invalid(
            format!("{param}.tool_call_id"),
            "a `tool` message needs the `tool_call_id` of the call it answers",
        )),
        ("tool", Some(_)) | (_, None) => Ok(message),
        (_, Some(_)) => Err(ApiError::invalid(
            format!("{param}.tool_call_id"),
            "only `tool` messages carry `tool_call_id`",
        )),
    }
}

fn optional_string(
    param: &str,
    object: &Map<String, Value>,
    name: &str,
) -> Result<Option<String>, ApiError> {
    match field(object, name) {
        None => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(other) => Err(wrong_type(&format!("{param}.{name}"), "a string", other)),
    }
}

/// A message's text: a string, or an array of `text` parts; absent or null is empty.
fn content(param: &str, object: &Map<String, Value>) -> Result<String, ApiError> {
    let content_param = format!("{param}.content");
    match field(object, "content") {
        None => Ok(String::new()),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let part_param = format!("{content_param}[{j}]");
                let kind = part.get("type").and_then(Value::as_str);
                match (kind, part.get("text")) {
                    (Some("text"), Some(Value::String(piece))) => text.push_str(piece),
                    (Some("text"), _) => {
                        return Err(ApiError::invalid(
                            part_param,
                            "a text part needs a string `text`",
                        ))
                    }
                    (kind, _) => {
                        return Err(ApiError::invalid(
                            part_param,
                            format!(
                                "content parts of type {} are not supported; only `text`",
                                kind.unwrap_or("(none)")
                            ),
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(other) => Err(wrong_type(
            &content_param,
            "a string or an array of parts",
            other,
        )),
    }
}

/// The calls of an assistant message, with each `function.arguments` string parsed into
/// JSON for the template (a string that is not JSON is a 400).
fn tool_calls(param: &str, calls: &[Value]) -> Result<Value, ApiError> {
    calls
        .iter()
        .enumerate()
        .map(|(j, call)| {
            let call_param = format!("{param}.tool_calls[{j}]");
            let Value::Object(call) = call else {
                return Err(wrong_type(&call_param, "an object", call));
            };
            check_keys(&call_param, call, &["id", "type", "function"])?;
            let id = optional_string(&call_param, call, "id")?.ok_or_else(|| {
                ApiError::invalid(format!("{call_param}.id"), "a tool call needs an `id`")
            })?;
            if let Some(kind) = field(call, "type").filter(|kind| *kind != "function") {
                return Err(ApiError::invalid(
                    format!("{call_param}.type"),
                    format!("tool calls are of type `function`, found {kind}"),
                ));
            }
            let function_param = format!("{call_param}.function");
            let function = match field(call, "function") {
                Some(Value::Object(function)) => function,
                Some(other) => return Err(wrong_type(&function_param, "an object", other)),
                None => {
                    return Err(ApiError::invalid(
                        function_param,
                        "a tool call needs a `function`",
                    ))
                }
            };
            check_keys(&function_param, function, &["name", "arguments"])?;
            let name = optional_string(&function_param, function, "name")?.ok_or_else(|| {
                ApiError::invalid(
                    format!("{function_param}.name"),
                    "a tool call needs the function's `name`",
                )
            })?;
            let arguments_param = format!("{function_param}.arguments");
            let arguments = match optional_string(&function_param, function, "arguments")? {
                None => Value::Object(Map::new()),
                Some(text) => serde_json::from_str(&text).map_err(|error| {
                    ApiError::invalid(
                        &arguments_param,
                        format!("`arguments` must be a JSON text: {error}"),
                    )
                })?,
            };
            Ok(serde_json::json!({
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}
