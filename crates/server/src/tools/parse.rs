//! Reading tool calls out of generated text, whole or as it streams: [`CallFilter`] passes
//! text through until a call's marker begins, holds back what might be the start of one,
//! and keeps everything from the marker on. A scanner reads the calls in what is held as far
//! as it goes (names once complete, arguments as their JSON text grows), so that streamed
//! calls go out as OpenAI streams them: a call's `id`, `name` and empty `arguments` first,
//! then pieces of its `arguments`. Text that does not read as calls of offered tools is
//! given back as content (unless calls of it already went out), so nothing the model wrote
//! is lost.

use runit_engine::stop::partial_match_len;

use super::ToolFormat;

/// One parsed call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as the JSON text the model wrote (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// A piece of a streamed call: its first piece has the name; the pieces' `arguments`,
/// joined, are the call's arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallDelta {
    /// The call's position among the choice's calls.
    pub index: usize,
    pub name: Option<String>,
    pub arguments: String,
}

/// Joins streamed pieces into whole calls (in index order).
pub fn join(deltas: &[CallDelta]) -> Vec<ToolCall> {
    let mut calls: Vec<ToolCall> = Vec::new();
    for delta in deltas {
        if delta.index >= calls.len() {
            calls.resize(
                delta.index + 1,
                ToolCall {
                    name: String::new(),
                    arguments: String::new(),
                },
            );
        }
        let call = &mut calls[delta.index];
        if let Some(name) = &delta.name {
            call.name.clone_from(name);
        }
        call.arguments.push_str(&delta.arguments);
    }
    calls
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
    /// Bytes of arguments sent of each call whose name went out.
    sent: Vec<usize>,
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
            sent: Vec::new(),
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

    /// The pieces of calls that the text held so far adds: a call's name once it is complete
    /// and names an offered tool, then its arguments' JSON text as it grows.
    pub fn deltas(&mut self) -> Vec<CallDelta> {
        if !self.capturing {
            return Vec::new();
        }
        let scan = scan(self.format, &self.held);
        let mut deltas = Vec::new();
        for (index, call) in scan.calls.iter().enumerate() {
            let Some(name) = call.name.as_ref().filter(|name| self.offered(name)) else {
                break;
            };
            if index == self.sent.len() {
                self.sent.push(0);
                deltas.push(CallDelta {
                    index,
                    name: Some(name.clone()),
                    arguments: String::new(),
                });
            }
            // Arguments go out as they grow only when they are an object or an array (a
            // scalar's text may still change its meaning); a complete value goes out whole.
            let visible = match (call.arguments, call.container) {
                (Some((start, Some(end))), _) => &self.held[start..end],
                (Some((start, None)), true) => &self.held[start..],
                _ => "",
            };
            if visible.len() > self.sent[index] {
                deltas.push(CallDelta {
                    index,
                    name: None,
                    arguments: visible[self.sent[index]..].to_string(),
                });
                self.sent[index] = visible.len();
            }
            if call.arguments.is_none_or(|(_, end)| end.is_none()) {
                break;
            }
        }
        deltas
    }

    /// Ends the text: the content still held (text that turned out not to be calls), the
    /// pieces of calls not sent yet, and whether there are calls.
    pub fn finish(&mut self) -> (String, Vec<CallDelta>, bool) {
        let held = std::mem::take(&mut self.held);
        if !self.capturing {
            return (held, Vec::new(), !self.sent.is_empty());
        }
        let scan = scan(self.format, &held);
        // The calls that read whole: complete, of offered tools, arguments that parse.
        let mut good = 0;
        for call in &scan.calls {
            let whole = call.closed
                && call.name.as_ref().is_some_and(|name| self.offered(name))
                && call.arguments.is_some_and(|(start, end)| {
                    end.is_some_and(|end| {
                        serde_json::from_str::<serde_json::Value>(&held[start..end]).is_ok()
                    })
                });
            if !whole {
                break;
            }
            good += 1;
        }
        let all = good == scan.calls.len() && good > 0;
        if !all && self.sent.is_empty() {
            // Nothing went out as a call: the text is content.
            return (held, Vec::new(), false);
        }
        // Calls went out (or all read whole): send what is left of them; text after the
        // last call, or from the first call that did not read, is content.
        let kept = good.max(self.sent.len());
        let mut deltas = Vec::new();
        for (index, call) in scan.calls.iter().enumerate().take(kept) {
            if index == self.sent.len() {
                self.sent.push(0);
                deltas.push(CallDelta {
                    index,
                    name: call.name.clone(),
                    arguments: String::new(),
                });
            }
            let arguments = match call.arguments {
                Some((start, end)) => &held[start..end.unwrap_or(held.len())],
                None => "",
            };
            if arguments.len() > self.sent[index] {
                deltas.push(CallDelta {
                    index,
                    name: None,
                    arguments: arguments[self.sent[index]..].to_string(),
                });
            }
        }
        let content = match scan.calls.get(kept) {
            Some(call) => held[call.start..].to_string(),
            None if all => held[scan.end..].trim_start().to_string(),
            None => String::new(),
        };
        (content, deltas, true)
    }

    fn offered(&self, name: &str) -> bool {
        self.names.iter().any(|offered| offered == name)
    }

    fn marker(&self) -> &'static str {
        match self.format {
            ToolFormat::Hermes => "<tool_call>",
            ToolFormat::Mistral | ToolFormat::MistralArgs => "[TOOL_CALLS]",
            ToolFormat::Llama3 => "<|python_tag|>",
        }
    }
}

/// A call as far as the text shows it.
#[derive(Debug, Clone, Default)]
struct Scanned {
    /// Where the call begins (its marker, or its object).
    start: usize,
    /// The tool's name, once complete.
    name: Option<String>,
    /// The span of the arguments' JSON text; no end while it is incomplete.
    arguments: Option<(usize, Option<usize>)>,
    /// The arguments are an object or an array.
    container: bool,
    /// Everything of the call (its closing tag too) has arrived.
    closed: bool,
}

/// The calls of `text` (which starts at a marker, or at a Llama 3 call) as far as they go,
/// and where the last closed call ends.
struct Scan {
    calls: Vec<Scanned>,
    end: usize,
}

/// Reads the calls of `text` in `format` until the text ends or stops reading as calls.
fn scan(format: ToolFormat, text: &str) -> Scan {
    let mut r = Reader { text, at: 0 };
    let mut calls = Vec::new();
    let mut end = 0;
    match format {
        ToolFormat::Hermes => loop {
            r.skip_space();
            let start = r.at;
            if !r.eat("<tool_call>") {
                break;
            }
            let Some(mut call) = object_call(&mut r) else {
                break;
            };
            call.start = start;
            let done = call.closed && {
                r.skip_space();
                r.eat("</tool_call>")
            };
            call.closed = done;
            calls.push(call);
            if !done {
                break;
            }
            end = r.at;
        },
        ToolFormat::Mistral => {
            r.skip_space();
            let opened = r.eat("[TOOL_CALLS]") && {
                r.skip_space();
                r.eat("[")
            };
            if opened && object_calls(&mut r, ",", &mut calls, None) {
                r.skip_space();
                if r.eat("]") {
                    end = r.at;
                } else if let Some(last) = calls.last_mut() {
                    // The array is not closed (yet): the call is not whole.
                    last.closed = false;
                }
            }
        }
        ToolFormat::MistralArgs => loop {
            r.skip_space();
            let start = r.at;
            if !r.eat("[TOOL_CALLS]") {
                break;
            }
            let mut call = Scanned {
                start,
                ..Scanned::default()
            };
            let Some(length) = r.rest().find("[ARGS]") else {
                calls.push(call);
                break;
            };
            call.name = Some(r.rest()[..length].trim().to_string());
            r.at += length + "[ARGS]".len();
            r.skip_space();
            value_into(&mut r, &mut call);
            let closed = call.closed;
            calls.push(call);
            if !closed {
                break;
            }
            end = r.at;
        },
        ToolFormat::Llama3 => {
            r.skip_space();
            r.eat("<|python_tag|>");
            object_calls(&mut r, ";", &mut calls, Some(&mut end));
        }
    }
    Scan { calls, end }
}

/// Calls written as objects separated by `separator`, pushed onto `calls` (a call's start is
/// 0 for the first); `end`, when given, follows the end of each closed call. True when the
/// last one read is closed and no separator follows (the reader is then just past it).
fn object_calls(
    r: &mut Reader<'_>,
    separator: &str,
    calls: &mut Vec<Scanned>,
    mut end: Option<&mut usize>,
) -> bool {
    loop {
        r.skip_space();
        let start = r.at;
        let Some(mut call) = object_call(r) else {
            return false;
        };
        call.start = if calls.is_empty() { 0 } else { start };
        let closed = call.closed;
        calls.push(call);
        if !closed {
            return false;
        }
        let after = r.at;
        if let Some(end) = end.as_deref_mut() {
            *end = after;
        }
        r.skip_space();
        if !r.eat(separator) {
            r.at = after;
            return true;
        }
    }
}

/// A call written as an object with `name` and `arguments` (or `parameters`); `None` when
/// the text there is no object.
fn object_call(r: &mut Reader<'_>) -> Option<Scanned> {
    r.skip_space();
    let mut call = Scanned {
        start: r.at,
        ..Scanned::default()
    };
    if r.rest().is_empty() {
        return Some(call);
    }
    if !r.eat("{") {
        return None;
    }
    loop {
        r.skip_space();
        if r.rest().is_empty() {
            return Some(call);
        }
        if r.eat("}") {
            call.closed = true;
            return Some(call);
        }
        let key_start = r.at;
        let Some(key_end) = value_end(r.text, key_start) else {
            return Some(call);
        };
        let key: String = serde_json::from_str(&r.text[key_start..key_end]).ok()?;
        r.at = key_end;
        r.skip_space();
        if r.rest().is_empty() {
            return Some(call);
        }
        if !r.eat(":") {
            return None;
        }
        r.skip_space();
        if r.rest().is_empty() {
            return Some(call);
        }
        match key.as_str() {
            "arguments" | "parameters" => {
                value_into(r, &mut call);
                if !call.closed {
                    return Some(call);
                }
                call.closed = false;
            }
            _ => {
                let start = r.at;
                let end = value_end(r.text, start)?;
                if key == "name" {
                    call.name = Some(serde_json::from_str(&r.text[start..end]).ok()?);
                }
                r.at = end;
            }
        }
        r.skip_space();
        if !r.eat(",") && !r.rest().starts_with('}') && !r.rest().is_empty() {
            return None;
        }
    }
}

/// Reads a JSON value at the reader into `call.arguments`; `call.closed` when it is whole.
fn value_into(r: &mut Reader<'_>, call: &mut Scanned) {
    let start = r.at;
    call.container = r.rest().starts_with(['{', '[']);
    match value_end(r.text, start) {
        Some(end) => {
            call.arguments = Some((start, Some(end)));
            call.closed = true;
            r.at = end;
        }
        None => {
            call.arguments = Some((start, None));
            r.at = r.text.len();
        }
    }
}

/// The end of the JSON value that starts at `start` (which is not whitespace), or `None`
/// when the text ends inside it. Only the value's extent is read: whether its text is
/// valid JSON is checked when the call is whole.
fn value_end(text: &str, start: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let first = *bytes.get(start)?;
    match first {
        b'"' => {
            let mut i = start + 1;
            while i < bytes.len() {
                match bytes[i] {
                    b'\\' => i += 2,
                    b'"' => return Some(i + 1),
                    _ => i += 1,
                }
            }
            None
        }
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = start;
            while i < bytes.len() {
                match bytes[i] {
                    b'"' => {
                        i = value_end(text, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            None
        }
        _ => {
            // A number or a literal: up to the next delimiter (the text may still go on).
            let length =
                text[start..].find([',', '}', ']', ';', ' ', '\n', '\t', '\r', '<', '['])?;
            Some(start + length)
        }
    }
}

/// A position in a text.
struct Reader<'a> {
    text: &'a str,
    at: usize,
}

impl Reader<'_> {
    fn rest(&self) -> &str {
        &self.text[self.at..]
    }

    fn skip_space(&mut self) {
        let rest = self.rest();
        self.at += rest.len() - rest.trim_start().len();
    }

    /// Moves past `token` when the text goes on with it.
    fn eat(&mut self, token: &str) -> bool {
        if self.rest().starts_with(token) {
            self.at += token.len();
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Content and calls of `pieces` streamed through a filter; the calls are joined from
    /// the pieces sent along the way and at the end.
    fn run(format: ToolFormat, pieces: &[&str]) -> (String, Vec<ToolCall>) {
        let mut filter = CallFilter::new(format, vec!["get_weather".into()]);
        let mut content = String::new();
        let mut deltas = Vec::new();
        for piece in pieces {
            content.push_str(&filter.push(piece));
            deltas.extend(filter.deltas());
        }
        let (rest, last, any) = filter.finish();
        content.push_str(&rest);
        deltas.extend(last);
        assert_eq!(any, !deltas.is_empty());
        // The arguments are the model's text; compared here in compact form.
        let calls = join(&deltas)
            .into_iter()
            .map(|call| ToolCall {
                arguments: serde_json::from_str::<serde_json::Value>(&call.arguments)
                    .map_or(call.arguments, |value| value.to_string()),
                ..call
            })
            .collect();
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
        assert_eq!(
            (content.as_str(), calls),
            ("Checking. Done.", vec![weather("Rome")])
        );
        for broken in [
            "[TOOL_CALLS]get_weather{\"city\": \"Oslo\"}",
            "[TOOL_CALLS]other[ARGS]{}",
        ] {
            let (content, calls) = run(ToolFormat::MistralArgs, &[broken]);
            assert_eq!(content, broken);
            assert!(calls.is_empty(), "{broken}");
        }
        // Once a call of an offered tool has begun it goes out as a call, as streamed,
        // even when its arguments end unfinished (as OpenAI's can).
        let (content, calls) = run(
            ToolFormat::MistralArgs,
            &["[TOOL_CALLS]get_weather[ARGS]{broken"],
        );
        assert_eq!(content, "");
        assert_eq!(calls[0].arguments, "{broken");
    }

    #[test]
    fn streamed_calls_go_out_name_first_then_arguments_as_they_grow() {
        let mut filter = CallFilter::new(ToolFormat::Hermes, vec!["get_weather".into()]);
        let mut deltas = Vec::new();
        let mut pieces = Vec::new();
        for piece in [
            "Sure.<tool",
            "_call>\n{\"name\": \"get_wea",
            "ther\", \"arguments\": {\"ci",
            "ty\": \"Par",
            "is\"}}\n</tool_call>",
        ] {
            filter.push(piece);
            let new = filter.deltas();
            pieces.push(new.len());
            deltas.extend(new);
        }
        // Nothing before the name is complete; then the name, then growing arguments.
        assert_eq!(pieces, [0, 0, 2, 1, 1]);
        assert_eq!(deltas[0].name.as_deref(), Some("get_weather"));
        assert_eq!(deltas[1].arguments, "{\"ci");
        let (rest, last, any) = filter.finish();
        assert!(
            any && rest.is_empty() && last.is_empty(),
            "{rest:?} {last:?}"
        );
        assert_eq!(join(&deltas)[0].arguments, "{\"city\": \"Paris\"}");
        // A call cut off mid-arguments keeps what was sent; no content is made of it.
        let mut filter = CallFilter::new(ToolFormat::Hermes, vec!["get_weather".into()]);
        filter.push("<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Os");
        let sent = filter.deltas();
        let (rest, last, any) = filter.finish();
        assert!(any && rest.is_empty() && last.is_empty());
        assert_eq!(join(&sent)[0].arguments, "{\"city\": \"Os");
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
