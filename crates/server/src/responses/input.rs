//! The conversation of a Responses request: `instructions` (a system message, first), then
//! `input` (a string: one user message; or a list of items: messages, `function_call` items,
//! which join the assistant message before them as its `tool_calls`, and
//! `function_call_output` items, which become `tool` messages), checked item by item so that
//! a fault is a 400 naming it (`input[2].content[0]`).

use runit_tokenizer::ChatMessage;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::fields::check_keys;
use crate::messages::{optional_string, part_text, tool_call, Conversation};
use crate::request::{field, wrong_type};

/// The content parts a message may hold: text, as the client wrote it or as an earlier
/// response gave it.
const TEXT_PARTS: &[&str] = &["input_text", "output_text"];

/// The keys of a message item (`id`, `status` and `phase` describe an earlier output).
const MESSAGE_KEYS: &[&str] = &["type", "role", "content", "id", "status", "phase"];

/// The keys of a `function_call` item.
const CALL_KEYS: &[&str] = &["type", "call_id", "name", "arguments", "id", "status"];

/// The keys of a `function_call_output` item.
const CALL_OUTPUT_KEYS: &[&str] = &["type", "call_id", "output", "id", "status"];

/// Reads `instructions` and `input` into the conversation for the template.
pub fn conversation(body: &Map<String, Value>) -> Result<Conversation, ApiError> {
    let mut conversation = Conversation::new("input");
    match field(body, "instructions") {
        None => {}
        Some(Value::String(text)) => conversation.push(
            ChatMessage::new("system", text.clone()),
            "instructions".into(),
        ),
        Some(other) => return Err(wrong_type("instructions", "a string", other)),
    }
    let items = match field(body, "input") {
        None => return Err(ApiError::invalid("input", "`input` is required")),
        Some(Value::String(text)) => {
            conversation.push(ChatMessage::user(text.clone()), "input".into());
            return Ok(conversation);
        }
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid(
                "input",
                "`input` must hold at least one item",
            ))
        }
        Some(Value::Array(items)) => items,
        Some(other) => return Err(wrong_type("input", "a string or an array of items", other)),
    };
    for (i, item) in items.iter().enumerate() {
        let param = format!("input[{i}]");
        let Value::Object(item) = item else {
            return Err(wrong_type(&param, "an object", item));
        };
        // A message may leave out its `type`.
        let kind = match field(item, "type") {
            None => "message",
            Some(Value::String(kind)) => kind.as_str(),
            Some(other) => return Err(wrong_type(&format!("{param}.type"), "a string", other)),
        };
        match kind {
            "message" => {
                let message = message(&param, item)?;
                conversation.push(message, format!("{param}.content"));
            }
            "function_call" => function_call(&param, item, &mut conversation)?,
            "function_call_output" => {
                let message = call_output(&param, item)?;
                conversation.push(message, format!("{param}.output"));
            }
            "reasoning" => {
                return Err(ApiError::invalid(
                    format!("{param}.type"),
                    "reasoning items cannot be given back: the chat template receives no \
                     reasoning; leave them out of `input`",
                ))
            }
            "item_reference" => {
                return Err(ApiError::invalid(
                    format!("{param}.type"),
                    "item references cannot be resolved: nothing is stored by this server",
                ))
            }
            other => {
                return Err(ApiError::invalid(
                    format!("{param}.type"),
                    format!(
                        "input items of type `{other}` are not supported; expected message, \
                         function_call or function_call_output"
                    ),
                ))
            }
        }
    }
    Ok(conversation)
}

/// A message item: a role and its text (a string, or text parts).
fn message(param: &str, item: &Map<String, Value>) -> Result<ChatMessage, ApiError> {
    check_keys(param, item, MESSAGE_KEYS)?;
    let role_param = format!("{param}.role");
    let role = match field(item, "role") {
        Some(Value::String(role)) => role.as_str(),
        Some(other) => return Err(wrong_type(&role_param, "a string", other)),
        None => return Err(ApiError::invalid(role_param, "a message needs a `role`")),
    };
    let role = match role {
        "user" | "system" | "assistant" => role,
        "developer" => "system",
        other => {
            return Err(ApiError::invalid(
                role_param,
                format!("unknown role `{other}`; expected user, system, developer or assistant"),
            ))
        }
    };
    let content_param = format!("{param}.content");
    let text = match field(item, "content") {
        None => {
            return Err(ApiError::invalid(
                content_param,
                "a message needs `content`",
            ))
        }
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, part)| content_part(&format!("{content_param}[{j}]"), part))
            .collect::<Result<String, _>>()?,
        Some(other) => {
            return Err(wrong_type(
                &content_param,
                "a string or an array of parts",
                other,
            ))
        }
    };
    Ok(ChatMessage::new(role, text))
}

/// The text of one part: `input_text`, or `output_text` as an earlier response gave it (its
/// log-probabilities are not the model's input; citations would be, and are never made).
fn content_part(param: &str, part: &Value) -> Result<String, ApiError> {
    let text = part_text(param, part, TEXT_PARTS)?;
    if let Value::Object(part) = part {
        check_keys(param, part, &["type", "text", "annotations", "logprobs"])?;
        match field(part, "annotations") {
            None => {}
            Some(Value::Array(notes)) if notes.is_empty() => {}
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("{param}.annotations"),
                    "annotations cannot be given back to the model; send them as text",
                ))
            }
        }
    }
    Ok(text.to_string())
}

/// A `function_call` item: a call of the assistant message before it, or of a new one.
fn function_call(
    param: &str,
    item: &Map<String, Value>,
    conversation: &mut Conversation,
) -> Result<(), ApiError> {
    check_keys(param, item, CALL_KEYS)?;
    let required = |name: &str| {
        optional_string(param, item, name)?.ok_or_else(|| {
            ApiError::invalid(
                format!("{param}.{name}"),
                format!("a `function_call` item needs `{name}`"),
            )
        })
    };
    let call_id = required("call_id")?;
    let name = required("name")?;
    let arguments = required("arguments")?;
    let call = tool_call(
        &call_id,
        &name,
        Some(&arguments),
        &format!("{param}.arguments"),
    )?;
    let joins = conversation
        .messages
        .last()
        .is_some_and(|last| last.role == "assistant");
    if !joins {
        conversation.push(ChatMessage::assistant(""), format!("{param}.arguments"));
    }
    let Some(message) = conversation.messages.last_mut() else {
        return Err(ApiError::internal("the conversation lost its last message"));
    };
    match &mut message.tool_calls {
        Some(Value::Array(calls)) => calls.push(call),
        calls => *calls = Some(Value::Array(vec![call])),
    }
    Ok(())
}

/// A `function_call_output` item: the `tool` message that answers a call.
fn call_output(param: &str, item: &Map<String, Value>) -> Result<ChatMessage, ApiError> {
    check_keys(param, item, CALL_OUTPUT_KEYS)?;
    let call_id = optional_string(param, item, "call_id")?.ok_or_else(|| {
        ApiError::invalid(
            format!("{param}.call_id"),
            "a `function_call_output` item needs the `call_id` of the call it answers",
        )
    })?;
    let output_param = format!("{param}.output");
    let text = match field(item, "output") {
        None => {
            return Err(ApiError::invalid(
                output_param,
                "a `function_call_output` item needs `output`",
            ))
        }
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, part)| content_part(&format!("{output_param}[{j}]"), part))
            .collect::<Result<String, _>>()?,
        Some(other) => {
            return Err(wrong_type(
                &output_param,
                "a string or an array of parts",
                other,
            ))
        }
    };
    let mut message = ChatMessage::new("tool", text);
    message.tool_call_id = Some(call_id);
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(body: Value) -> Result<Conversation, ApiError> {
        match body {
            Value::Object(body) => conversation(&body),
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn calls_join_the_assistant_message_and_outputs_become_tool_messages() {
        let call = |id: &str| {
            json!({"type": "function_call", "call_id": id, "name": "f",
                "arguments": "{\"x\": 1}", "id": "fc_1", "status": "completed"})
        };
        let conversation = read(json!({
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "Use tools."},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "Two "}, {"type": "input_text", "text": "calls?"}]},
                {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                    "content": [{"type": "output_text", "text": "Calling.", "annotations": []}]},
                call("a"), call("b"),
                {"type": "function_call_output", "call_id": "a", "output": "1"},
                {"type": "function_call_output", "call_id": "b",
                    "output": [{"type": "input_text", "text": "2"}]},
                call("c"),
            ],
        }))
        .expect("a valid conversation");
        let roles: Vec<&str> = conversation
            .messages
            .iter()
            .map(|m| m.role.as_str())
            .collect();
        assert_eq!(
            roles,
            [
                "system",
                "system",
                "user",
                "assistant",
                "tool",
                "tool",
                "assistant"
            ]
        );
        let messages = &conversation.messages;
        assert_eq!(messages[0].content, "Be brief.");
        assert_eq!(messages[2].content, "Two calls?");
        assert_eq!(messages[3].content, "Calling.");
        let calls = messages[3].tool_calls.as_ref().expect("calls");
        assert_eq!(
            calls,
            &json!([
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}},
                {"id": "b", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}},
            ])
        );
        assert_eq!(messages[4].tool_call_id.as_deref(), Some("a"));
        assert_eq!(messages[5].content, "2");
        assert_eq!(messages[6].content, "");
        assert_eq!(messages[6].tool_calls.as_ref().expect("call")[0]["id"], "c");
        assert_eq!(
            conversation.content_params,
            [
                "instructions",
                "input[0].content",
                "input[1].content",
                "input[2].content",
                "input[5].output",
                "input[6].output",
                "input[7].arguments",
            ]
        );
    }

    #[test]
    fn a_string_input_is_one_user_message() {
        let conversation = read(json!({"input": "Hi"})).expect("valid");
        assert_eq!(conversation.messages.len(), 1);
        assert_eq!(conversation.messages[0].role, "user");
        assert_eq!(conversation.messages[0].content, "Hi");
        assert_eq!(conversation.param, "input");
    }
}
