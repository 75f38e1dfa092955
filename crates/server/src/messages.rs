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

/// A conversation for the chat template, with where each message came from in the request.
#[derive(Debug, Clone, Default)]
pub struct Conversation {
    pub messages: Vec<ChatMessage>,
    /// The field that holds the conversation (`messages`, `input`).
    pub param: &'static str,
    /// The field of each message's text (`messages[2].content`), for errors about it.
    pub content_params: Vec<String>,
}

impl Conversation {
    /// An empty conversation held in the field `param`.
    pub fn new(param: &'static str) -> Conversation {
        Conversation {
            param,
            ..Conversation::default()
        }
    }

    /// Adds `message`, whose text is in the field `content_param`.
    pub fn push(&mut self, message: ChatMessage, content_param: String) {
        self.messages.push(message);
        self.content_params.push(content_param);
    }
}

/// The conversation of a chat request.
pub fn messages(body: &Map<String, Value>) -> Result<Conversation, ApiError> {
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
    let mut conversation = Conversation::new("messages");
    for (i, item) in items.iter().enumerate() {
        conversation.push(message(i, item)?, format!("messages[{i}].content"));
    }
    Ok(conversation)
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

pub(crate) fn optional_string(
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
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, part)| part_text(&format!("{content_param}[{j}]"), part, &["text"]))
            .collect(),
        Some(other) => Err(wrong_type(
            &content_param,
            "a string or an array of parts",
            other,
        )),
    }
}

/// The text of one content part (the field `param`) whose `type` is one of `kinds`; a part
/// of another type (an image, a file, audio) is refused.
pub(crate) fn part_text<'a>(
    param: &str,
    part: &'a Value,
    kinds: &[&str],
) -> Result<&'a str, ApiError> {
    let kind = part.get("type").and_then(Value::as_str);
    match (kind, part.get("text")) {
        (Some(kind), Some(Value::String(text))) if kinds.contains(&kind) => Ok(text),
        (Some(kind), _) if kinds.contains(&kind) => Err(ApiError::invalid(
            param,
            format!("a `{kind}` part needs a string `text`"),
        )),
        (kind, _) => Err(ApiError::invalid(
            param,
            format!(
                "content parts of type {} are not supported; only {}",
                kind.unwrap_or("(none)"),
                kinds.join(", ")
            ),
        )),
    }
}

/// One call of an assistant message, as templates take it: its `arguments` (a JSON text,
/// the field `arguments_param`; absent is `{}`) parsed into JSON; text that is not JSON is a
/// 400.
pub(crate) fn tool_call(
    id: &str,
    name: &str,
    arguments: Option<&str>,
    arguments_param: &str,
) -> Result<Value, ApiError> {
    let arguments = match arguments {
        None => Value::Object(Map::new()),
        Some(text) => serde_json::from_str(text).map_err(|error| {
            ApiError::invalid(
                arguments_param,
                format!("`arguments` must be a JSON text: {error}"),
            )
        })?,
    };
    Ok(serde_json::json!({
        "id": id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }))
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
            let arguments = optional_string(&function_param, function, "arguments")?;
            tool_call(
                &id,
                &name,
                arguments.as_deref(),
                &format!("{function_param}.arguments"),
            )
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}
