//! OpenAI's `prediction` (predicted outputs): `{"type": "content", "content": ...}`, the
//! text the caller expects most of the answer to repeat. It seeds the sequence's drafter
//! (prompt lookup over the prediction, `runit_engine::scheduler::DraftRequest`); the answer
//! is the model's own either way, and `usage.completion_tokens_details` counts the drafted
//! tokens kept and rejected.

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::fields;
use crate::request::field;

/// The predicted text of a request, if it gives one; content parts are joined.
pub fn prediction(body: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    let Some(value) = field(body, "prediction") else {
        return Ok(None);
    };
    let Value::Object(object) = value else {
        return Err(ApiError::invalid(
            "prediction",
            "`prediction` must be an object",
        ));
    };
    fields::check_keys("prediction", object, &["type", "content"])?;
    if object.get("type").and_then(Value::as_str) != Some("content") {
        return Err(ApiError::invalid(
            "prediction.type",
            "the only prediction type is `content`",
        ));
    }
    let text = match object.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match part.as_object() {
                    Some(part)
                        if part.get("type").and_then(Value::as_str) == Some("text")
                            && part.len() == 2 =>
                    {
                        let Some(piece) = part.get("text").and_then(Value::as_str) else {
                            return Err(part_error());
                        };
                        text.push_str(piece);
                    }
                    _ => return Err(part_error()),
                }
            }
            text
        }
        _ => {
            return Err(ApiError::invalid(
                "prediction.content",
                "`content` must be a string or an array of text parts",
            ))
        }
    };
    Ok(Some(text))
}

fn part_error() -> ApiError {
    ApiError::invalid(
        "prediction.content",
        "each content part must be `{\"type\": \"text\", \"text\": ...}`",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: Value) -> Result<Option<String>, ApiError> {
        let body = serde_json::json!({ "prediction": value });
        prediction(body.as_object().expect("object"))
    }

    #[test]
    fn content_as_text_or_parts() {
        let text = serde_json::json!({"type": "content", "content": "fn main() {}"});
        assert_eq!(parse(text).expect("valid").as_deref(), Some("fn main() {}"));
        let parts = serde_json::json!({"type": "content", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        assert_eq!(parse(parts).expect("valid").as_deref(), Some("ab"));
    }

    #[test]
    fn other_shapes_are_refused() {
        for bad in [
            serde_json::json!("text"),
            serde_json::json!({"type": "other", "content": "x"}),
            serde_json::json!({"type": "content", "content": 3}),
            serde_json::json!({"type": "content", "content": [{"type": "image"}]}),
            serde_json::json!({"type": "content", "content": "x", "extra": 1}),
        ] {
            assert!(parse(bad).is_err());
        }
    }
}
