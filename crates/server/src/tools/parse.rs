//! Reading tool calls out of generated text, whole or as it streams: [`CallFilter`] passes
//! text through until a call's marker begins, holds back what might be the start of one,
//! keeps everything from the marker on, and at the end parses it into [`ToolCall`]s. Text
//! that does not parse as calls of offered tools is given back as content, so nothing the
//! model wrote is lost.

use runit_engine::stop::partial_match_len;
use serde_json::Value;

use super::ToolFormat;

/// One parsed call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as a JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// Splits a choice's text into content and tool calls as it arrives.
#[derive(Debug, Clone)]
pub struct CallFilter {
    format: ToolFormat,
    /// The names of the offered tools.
    names: Vec<String>,
    /// Text not yet given out: a possible marker start, or the calls from the marker on.
    held: String,
    /// A marker was seen: everything from it on is held for parsing.
    capturing: bool,
    /// Some content went out (so a Llama 3 call, which is the whole answer, cannot follow).
    started: bool,
}

impl CallFilter {
    /// A filter for calls in `format` to the tools named `names`.
    pub fn new(format: ToolFormat, names: Vec<String>) -> CallFilter {
        CallFilter {
            format,
            names,
            held: String::new(),
            capturing: false,
            started: false,
        }
    }

    /// Takes the next piece of text; returns the content that can go out now.
    pub fn push(&mut self, text: &str) -> String {
        self.held.push_str(text);
        if self.capturing {
            return String::new();
        }
        match self.format {
            ToolFormat::Llama3 => {
                if self.started {
                    return std::mem::take(&mut self.held);
                }
                let trimmed = self.held.trim_start();
                if trimmed.is_empty() {
                    return String::new();
                }
                let begins_call = ["{", "<|python_tag|>"]
                    .iter()
                    .any(|marker| trimmed.starts_with(marker) || marker.starts_with(trimmed));
                if begins_call {
                    self.capturing =
                        trimmed.starts_with('{') || trimmed.starts_with("<|python_tag|>");
                    return String::new();
                }
                self.started = true;
                std::mem::take(&mut self.held)
            }
            ToolFormat::Hermes | ToolFormat::Mistral | ToolFormat::MistralArgs => {
                let marker = self.marker();
                if let Some(at) = self.held.find(marker) {
                    self.capturing = true;
                    let content: String = self.held.drain(..at).collect();
                    return content;
                }
                // Hold back the longest end of the text that starts the marker.
                let keep = partial_match_len(&self.held, marker);
                let split = self.held.len() - keep;
                let content: String = self.held.drain(..split).collect();
                content
            }
        }
    }

    /// Ends the text: the content still held (text that turned out not to be calls) and
    /// the calls.
    pub fn finish(&mut self) -> (String, Vec<ToolCall>) {
        let held = std::mem::take(&mut self.held);
        if !self.capturing {
            return (held, Vec::new());
        }
        match self.parse(&held) {
            Some((content, calls)) if !calls.is_empty() => (content, calls),
            _ => (held, Vec::new()),
        }
    }

    fn marker(&self) -> &'static str {
        match self.format {
            ToolFormat::Hermes => "<tool_call>",
            ToolFormat::Mistral | ToolFormat::MistralArgs => "[TOOL_CALLS]",
            ToolFormat::Llama3 => "<|python_tag|>",
        }
    }

    /// Content after the calls, and the calls of `text` (which starts at a marker).
    fn parse(&self, text: &str) -> Option<(String, Vec<ToolCall>)> {
        match self.format {
            ToolFormat::Hermes => {
                let mut calls = Vec::new();
                let mut rest = text.trim_start();
                while let Some(after) = rest.strip_prefix("<tool_call>") {
                    let (body, next) = match after.find("</tool_call>") {
                        Some(end) => (&after[..end], &after[end + "</tool_call>".len()..]),
                        None => (after, ""),
                    };
                    calls.push(self.call(&serde_json::from_str(body.trim()).ok()?)?);
                    rest = next.trim_start();
                }
                Some((rest.to_string(), calls))
            }
            ToolFormat::Mistral => {
                let body = text.strip_prefix("[TOOL_CALLS]")?.trim();
                let Value::Array(items) = serde_json::from_str(body).ok()? else {
                    return None;
                };
                let calls = items
                    .iter()
                    .map(|item| self.call(item))
                    .collect::<Option<_>>()?;
                Some((String::new(), calls))
            }
            ToolFormat::MistralArgs => {
                let mut calls = Vec::new();
                let mut rest = text.trim_start();
                while let Some(after) = rest.strip_prefix("[TOOL_CALLS]") {
                    let (name, arguments) = after.split_once("[ARGS]")?;
                    let mut values =
                        serde_json::Deserializer::from_str(arguments).into_iter::<Value>();
                    let value = values.next()?.ok()?;
                    let end = values.byte_offset();
                    let call = json_call(name.trim(), value);
                    calls.push(self.call(&call)?);
                    rest = arguments[end..].trim_start();
                }
                Some((rest.to_string(), calls))
            }
            ToolFormat::Llama3 => {
                let body = text.trim_start();
                let body = body.strip_prefix("<|python_tag|>").unwrap_or(body);
                let calls = body
                    .split(';')
                    .map(|part| self.call(&serde_json::from_str(part.trim()).ok()?))
                    .collect::<Option<_>>()?;
                Some((String::new(), calls))
            }
        }
    }

    /// A call object (`name` and `arguments` or `parameters`) naming an offered tool.
    fn call(&self, value: &Value) -> Option<ToolCall> {
        let name = value.get("name")?.as_str()?;
        if !self.names.iter().any(|offered| offered == name) {
            return None;
        }
        let arguments = value
            .get("arguments")
            .or_else(|| value.get("parameters"))
            .cloned()
            .unwrap_or(Value::Object(serde_json::Map::new()));
        let arguments = match arguments {
            Value::String(text) => text,
            other => other.to_string(),
        };
        Some(ToolCall {
            name: name.to_string(),
            arguments,
        })
    }
}

/// The call object of a call written as a name and its arguments.
fn json_call(name: &str, arguments: Value) -> Value {
    serde_json::json!({"name": name, "arguments": arguments})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(format: ToolFormat, pieces: &[&str]) -> (String, Vec<ToolCall>) {
        let mut filter = CallFilter::new(format, vec!["get_weather".into()]);
        let mut content: String = pieces.iter().map(|piece| filter.push(piece)).collect();
        let (rest, calls) = filter.finish();
        content.push_str(&rest);
        (content, calls)
    }

    fn weather(city: &str) -> ToolCall {
        ToolCall {
            name: "get_weather".into(),
            arguments: format!("{{\"city\":\"{city}\"}}"),
        }
    }

    #[test]
    fn hermes_calls_after_content_in_small_pieces() {
        let text = "Let me look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lima\"}}\n</tool_call>";
        let pieces: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let (content, calls) = run(ToolFormat::Hermes, &pieces);
        assert_eq!(content, "Let me look.");
        assert_eq!(calls, [weather("Paris"), weather("Lima")]);
    }

    #[test]
    fn mistral_and_llama3_calls() {
        let (content, calls) = run(
            ToolFormat::Mistral,
            &[
                "[TOOL_",
                "CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]",
            ],
        );
        assert_eq!((content.as_str(), calls), ("", vec![weather("Oslo")]));
        let (content, calls) = run(
            ToolFormat::Llama3,
            &[
                " {\"name\": \"get_weather\",",
                " \"parameters\": {\"city\": \"Rome\"}}",
            ],
        );
        assert_eq!((content.as_str(), calls), ("", vec![weather("Rome")]));
    }

    #[test]
    fn mistral_name_and_args_calls() {
        let text = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Lima\"}";
        let pieces: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let (content, calls) = run(ToolFormat::MistralArgs, &pieces);
        assert_eq!(content, "");
        assert_eq!(calls, [weather("Oslo"), weather("Lima")]);
        let (content, calls) = run(
            ToolFormat::MistralArgs,
            &["Checking. [TOOL_CALLS]get_weather[ARGS]{\"city\":\"Rome\"} Done."],
        );
        assert_eq!((content.as_str(), calls), ("Checking. Done.", vec![weather("Rome")]));
        for broken in [
            "[TOOL_CALLS]get_weather{\"city\": \"Oslo\"}",
            "[TOOL_CALLS]other[ARGS]{}",
            "[TOOL_CALLS]get_weather[ARGS]{broken",
        ] {
            let (content, calls) = run(ToolFormat::MistralArgs, &[broken]);
            assert_eq!(content, broken);
            assert!(calls.is_empty(), "{broken}");
        }
    }

    #[test]
    fn text_that_is_not_a_call_stays_content() {
        for (format, text) in [
            (ToolFormat::Hermes, "A <tool_ca is not a tag"),
            (
                ToolFormat::Hermes,
                "<tool_call>{\"name\": \"other\", \"arguments\": {}}</tool_call>",
            ),
            (ToolFormat::Hermes, "<tool_call>{broken"),
            (ToolFormat::Llama3, "Sunny {\"name\": \"get_weather\"}"),
            (ToolFormat::Llama3, "{\"not\": \"a call\"}"),
        ] {
            let (content, calls) = run(format, &[text]);
            assert_eq!(content, text, "{format:?}");
            assert!(calls.is_empty(), "{format:?} {text}");
        }
    }
}
