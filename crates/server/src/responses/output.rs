//! The output of a response, built from its one choice's deltas: items in the order the
//! model makes them (a `reasoning` item for `<think>` text, a `message` item with one
//! `output_text` part, a `function_call` item per call), each opened, grown and closed with
//! the streaming events OpenAI documents. The whole body and the stream are built by the
//! same [`Output`], so they agree item for item.

use serde_json::{json, Map, Value};

use crate::choice::{Delta, TokenLogprob};
use crate::response::Header;

/// The item being written, by its index in `output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Reasoning(usize),
    Message(usize),
    /// A call, with its position among the response's calls.
    Call(usize, usize),
}

/// A response's output as it grows, and the events that tell a client about it.
pub struct Output {
    header: Header,
    /// The response object without its `status`, `output` and `usage`: the request's
    /// parameters as OpenAI echoes them.
    echo: Map<String, Value>,
    items: Vec<Value>,
    open: Option<Open>,
    /// Log-probabilities of the open message's text.
    logprobs: Vec<TokenLogprob>,
    /// Log-probabilities of tokens that added no text yet; they go out with the next text.
    held: Vec<TokenLogprob>,
    /// The output index of each call so far.
    calls: Vec<usize>,
    sequence: u64,
    completion_tokens: usize,
    reasoning_tokens: usize,
    /// Prompt tokens the prefix cache served (on the last delta).
    cached_tokens: usize,
    finish_reason: Option<&'static str>,
}

impl Output {
    /// An empty output for the response `header` (whose `id` is `resp_…`) with the echoed
    /// request parameters `echo`.
    pub fn new(header: Header, echo: Map<String, Value>) -> Output {
        Output {
            header,
            echo,
            items: Vec::new(),
            open: None,
            logprobs: Vec::new(),
            held: Vec::new(),
            calls: Vec::new(),
            sequence: 0,
            completion_tokens: 0,
            reasoning_tokens: 0,
            cached_tokens: 0,
            finish_reason: None,
        }
    }

    /// The events that start a stream: `response.created` and `response.in_progress`.
    pub fn start(&mut self) -> Vec<Value> {
        let response = self.response("in_progress");
        vec![
            self.event("response.created", json!({"response": response})),
            self.event("response.in_progress", json!({"response": response})),
        ]
    }

    /// Takes one delta of the choice; returns the events it makes.
    pub fn push(&mut self, delta: Delta) -> Vec<Value> {
        let mut events = Vec::new();
        self.completion_tokens = delta.completion_tokens;
        self.reasoning_tokens = delta.reasoning_tokens;
        if let Some(cached) = delta.cached_tokens {
            self.cached_tokens = cached;
        }
        self.held.extend(delta.logprobs);
        if !delta.reasoning.is_empty() {
            let index = match self.open {
                Some(Open::Reasoning(index)) => index,
                _ => self.open_reasoning(&mut events),
            };
            append(
                &mut self.items[index]["content"][0]["text"],
                &delta.reasoning,
            );
            let fields = json!({"item_id": self.item_id(index), "output_index": index,
                "content_index": 0, "delta": delta.reasoning});
            events.push(self.event("response.reasoning_text.delta", fields));
        }
        if !delta.text.is_empty() {
            let index = match self.open {
                Some(Open::Message(index)) => index,
                _ => self.open_message(&mut events),
            };
            self.text_delta(index, &delta.text, &mut events);
        }
        for call in delta.tool_calls {
            let index = match (&call.name, self.calls.get(call.index)) {
                (Some(name), _) => self.open_call(name, &mut events),
                // A later piece of a call (the open one, as the filter writes calls in order).
                (None, Some(&index)) => index,
                (None, None) => {
                    tracing::warn!(call = call.index, "arguments of a call never named");
                    continue;
                }
            };
            if !call.arguments.is_empty() {
                append(&mut self.items[index]["arguments"], &call.arguments);
                let fields = json!({"item_id": self.item_id(index), "output_index": index,
                    "delta": call.arguments});
                events.push(self.event("response.function_call_arguments.delta", fields));
            }
        }
        if let Some(reason) = delta.finish_reason {
            self.finish_reason = Some(reason);
            if let Some(Open::Message(index)) = self.open {
                if !self.held.is_empty() {
                    self.text_delta(index, "", &mut events);
                }
            }
            // An answer with neither text nor calls is an empty message.
            if self.items.iter().all(|item| item["type"] == "reasoning") {
                self.close(&mut events);
                self.open_message(&mut events);
            }
            self.close(&mut events);
            let status = self.status();
            let kind = match status {
                "incomplete" => "response.incomplete",
                _ => "response.completed",
            };
            let response = self.response(status);
            events.push(self.event(kind, json!({"response": response})));
        }
        events
    }

    /// The `error` event for a failed response.
    pub fn error(&mut self, message: &str, code: Option<&str>) -> Value {
        let fields = json!({"code": code, "message": message, "param": null});
        self.event("error", fields)
    }

    /// The response object as it stands: `completed`, or `incomplete` when the token limit
    /// cut it.
    pub fn finished(&self) -> Value {
        self.response(self.status())
    }

    fn status(&self) -> &'static str {
        match self.finish_reason {
            Some("length") => "incomplete",
            _ => "completed",
        }
    }

    /// The response object with `status`.
    fn response(&self, status: &str) -> Value {
        let mut response = self.echo.clone();
        response.insert("status".into(), json!(status));
        response.insert(
            "incomplete_details".into(),
            if status == "incomplete" {
                json!({"reason": "max_output_tokens"})
            } else {
                Value::Null
            },
        );
        response.insert("output".into(), Value::Array(self.items.clone()));
        let usage = if status == "in_progress" {
            Value::Null
        } else {
            let input = self.header.prompt_tokens;
            json!({
                "input_tokens": input,
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                "total_tokens": input + self.completion_tokens,
            })
        };
        response.insert("usage".into(), usage);
        Value::Object(response)
    }

    /// An event of `kind` with `fields` and the next sequence number.
    fn event(&mut self, kind: &str, fields: Value) -> Value {
        let mut event = json!({"type": kind, "sequence_number": self.sequence});
        self.sequence += 1;
        if let (Value::Object(event), Value::Object(fields)) = (&mut event, fields) {
            event.extend(fields);
        }
        event
    }

    /// The id of output item `index`: its kind's prefix and the response's id.
    fn item_id(&self, index: usize) -> String {
        self.items[index]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// A fresh item id with `prefix` (`msg`, `rs`, `fc`, `call`) for output index `index`.
    fn new_id(&self, prefix: &str, index: usize) -> String {
        let stem = self.header.id.trim_start_matches("resp_");
        format!("{prefix}_{stem}_{index}")
    }

    /// Adds `item` as the next output item and announces it.
    fn add(&mut self, item: Value, events: &mut Vec<Value>) -> usize {
        self.close(events);
        let index = self.items.len();
        self.items.push(item.clone());
        events.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        index
    }

    fn open_reasoning(&mut self, events: &mut Vec<Value>) -> usize {
        let id = self.new_id("rs", self.items.len());
        let index = self.add(
            json!({"id": id, "type": "reasoning", "summary": [], "content": [],
                "status": "in_progress"}),
            events,
        );
        self.open_part(index, json!({"type": "reasoning_text", "text": ""}), events);
        self.open = Some(Open::Reasoning(index));
        index
    }

    fn open_message(&mut self, events: &mut Vec<Value>) -> usize {
        let id = self.new_id("msg", self.items.len());
        let index = self.add(
            json!({"id": id, "type": "message", "role": "assistant", "status": "in_progress",
                "content": []}),
            events,
        );
        let part = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
        self.open_part(index, part, events);
        self.logprobs.clear();
        self.open = Some(Open::Message(index));
        index
    }

    fn open_call(&mut self, name: &str, events: &mut Vec<Value>) -> usize {
        let k = self.calls.len();
        let index = self.items.len();
        let item = json!({"id": self.new_id("fc", index), "type": "function_call",
            "status": "in_progress", "call_id": self.new_id("call", index), "name": name,
            "arguments": ""});
        let index = self.add(item, events);
        self.calls.push(index);
        self.open = Some(Open::Call(index, k));
        index
    }

    /// Announces content part 0 of item `index` and adds it, empty, to the item.
    fn open_part(&mut self, index: usize, part: Value, events: &mut Vec<Value>) {
        let fields = json!({"item_id": self.item_id(index), "output_index": index,
            "content_index": 0, "part": part});
        self.items[index]["content"] = json!([part]);
        events.push(self.event("response.content_part.added", fields));
    }

    /// Adds `text` to message `index`, with the log-probabilities held so far.
    fn text_delta(&mut self, index: usize, text: &str, events: &mut Vec<Value>) {
        append(&mut self.items[index]["content"][0]["text"], text);
        let tokens = std::mem::take(&mut self.held);
        let logprobs = self.logprobs_of(&tokens);
        self.logprobs.extend(tokens);
        let fields = json!({"item_id": self.item_id(index), "output_index": index,
            "content_index": 0, "delta": text, "logprobs": logprobs});
        events.push(self.event("response.output_text.delta", fields));
    }

    fn logprobs_of(&self, tokens: &[TokenLogprob]) -> Value {
        match self.header.logprobs(tokens, 0) {
            Value::Null => json!([]),
            logprobs => logprobs,
        }
    }

    /// Closes the open item, if any, with its `done` events.
    fn close(&mut self, events: &mut Vec<Value>) {
        let Some(open) = self.open.take() else {
            return;
        };
        let status = match self.finish_reason {
            Some("length") => "incomplete",
            _ => "completed",
        };
        let (Open::Reasoning(index) | Open::Message(index) | Open::Call(index, _)) = open;
        let item_id = self.item_id(index);
        match open {
            Open::Reasoning(_) => {
                let text = self.items[index]["content"][0]["text"].clone();
                let fields = json!({"item_id": item_id, "output_index": index,
                    "content_index": 0, "text": text});
                events.push(self.event("response.reasoning_text.done", fields));
                self.close_part(index, events);
            }
            Open::Message(_) => {
                let logprobs = self.logprobs_of(&self.logprobs);
                self.items[index]["content"][0]["logprobs"] = logprobs.clone();
                let text = self.items[index]["content"][0]["text"].clone();
                let fields = json!({"item_id": item_id, "output_index": index,
                    "content_index": 0, "text": text, "logprobs": logprobs});
                events.push(self.event("response.output_text.done", fields));
                self.close_part(index, events);
            }
            Open::Call(..) => {
                let arguments = self.items[index]["arguments"].clone();
                let fields =
                    json!({"item_id": item_id, "output_index": index, "arguments": arguments});
                events.push(self.event("response.function_call_arguments.done", fields));
            }
        }
        self.items[index]["status"] = json!(status);
        let item = self.items[index].clone();
        events.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
    }

    fn close_part(&mut self, index: usize, events: &mut Vec<Value>) {
        let part = self.items[index]["content"][0].clone();
        let fields = json!({"item_id": self.item_id(index), "output_index": index,
            "content_index": 0, "part": part});
        events.push(self.event("response.content_part.done", fields));
    }
}

/// Appends `text` to the JSON string `value`.
fn append(value: &mut Value, text: &str) {
    if let Value::String(string) = value {
        string.push_str(text);
    }
}

#[cfg(test)]
mod tests;
