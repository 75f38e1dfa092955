//! Turning choice deltas into OpenAI responses: one JSON body, or server-sent events of
//! chunks ending in `data: [DONE]`.

use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{select_all, BoxStream, StreamExt};
use serde_json::{json, Value};
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

use runit_engine::speculative::SpeculationStats;

use crate::choice::{Delta, TokenLogprob};
use crate::error::ApiError;
use crate::log::RequestLog;
use crate::tools::parse::{join, CallDelta, ToolCall};

/// Which API a response belongs to. The bodies and events of `Responses` are
/// `responses::output`'s; [`complete`] and [`stream`] answer the other two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
    Responses,
}

/// What every response object repeats.
#[derive(Debug, Clone)]
pub struct Header {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
    pub prompt_tokens: usize,
    pub logprobs: bool,
}

impl Header {
    fn object(&self, streaming: bool) -> &'static str {
        match (self.endpoint, streaming) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
            (Endpoint::Responses, _) => "response",
        }
    }

    /// The usage object; `speculation`, the choices' drafted tokens together when any
    /// speculated, adds OpenAI's `completion_tokens_details` counts of kept and rejected
    /// predicted tokens; `cached`, the prompt tokens the prefix cache served, its
    /// `prompt_tokens_details.cached_tokens`.
    fn usage(
        &self,
        completion_tokens: usize,
        speculation: Option<SpeculationStats>,
        cached: Option<usize>,
    ) -> Value {
        let mut usage = json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        });
        if let Some(cached) = cached {
            usage["prompt_tokens_details"] = json!({"cached_tokens": cached});
        }
        if let Some(stats) = speculation {
            usage["completion_tokens_details"] = json!({
                "accepted_prediction_tokens": stats.accepted,
                "rejected_prediction_tokens": stats.rejected(),
            });
        }
        usage
    }

    fn envelope(&self, streaming: bool, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": self.object(streaming),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        })
    }

    /// The id of call `k` of choice `choice`.
    fn call_id(&self, choice: usize, k: usize) -> String {
        format!("call-{}-{choice}-{k}", self.id)
    }

    /// The `tool_calls` of choice `choice`'s message, as OpenAI writes them.
    fn tool_calls(&self, choice: usize, calls: &[ToolCall]) -> Value {
        let calls = calls
            .iter()
            .enumerate()
            .map(|(k, call)| {
                json!({
                    "id": self.call_id(choice, k),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                })
            })
            .collect();
        Value::Array(calls)
    }

    /// Streamed pieces of choice `choice`'s calls as OpenAI streams them: a call's first
    /// piece with its `index`, `id`, `type` and `name`, later ones with `index` and a piece
    /// of `arguments`.
    fn call_deltas(&self, choice: usize, deltas: &[CallDelta]) -> Value {
        let deltas = deltas
            .iter()
            .map(|delta| match &delta.name {
                Some(name) => json!({
                    "index": delta.index,
                    "id": self.call_id(choice, delta.index),
                    "type": "function",
                    "function": {"name": name, "arguments": delta.arguments},
                }),
                None => json!({
                    "index": delta.index,
                    "function": {"arguments": delta.arguments},
                }),
            })
            .collect();
        Value::Array(deltas)
    }

    /// The `logprobs` member of a choice for these tokens (`text_start`: byte offset of
    /// the first token in the completion, for the legacy format's `text_offset`); for
    /// responses, the `logprobs` array of an output text.
    pub fn logprobs(&self, tokens: &[TokenLogprob], text_start: usize) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let entries = || {
            tokens
                .iter()
                .map(|t| {
                    json!({
                        "token": t.token,
                        "logprob": t.logprob,
                        "bytes": t.bytes,
                        "top_logprobs": t.top.iter().map(|(token, bytes, logprob)| json!({
                            "token": token, "logprob": logprob, "bytes": bytes,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect::<Vec<_>>()
        };
        match self.endpoint {
            Endpoint::Chat => json!({"content": entries()}),
            Endpoint::Responses => Value::Array(entries()),
            Endpoint::Completion => {
                let mut offset = text_start;
                let mut offsets = Vec::with_capacity(tokens.len());
                for t in tokens {
                    offsets.push(offset);
                    offset += t.bytes.len();
                }
                json!({
                    "tokens": tokens.iter().map(|t| &t.token).collect::<Vec<_>>(),
                    "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
                    "top_logprobs": tokens.iter().map(|t| {
                        t.top.iter().map(|(token, _, logprob)| (token.clone(), json!(logprob)))
                            .collect::<serde_json::Map<String, Value>>()
                    }).collect::<Vec<_>>(),
                    "text_offset": offsets,
                })
            }
        }
    }
}

/// Accumulated output of one choice.
#[derive(Default)]
struct Finished {
    text: String,
    reasoning: String,
    tool_calls: Vec<CallDelta>,
    logprobs: Vec<TokenLogprob>,
    finish_reason: Option<&'static str>,
    completion_tokens: usize,
    speculation: Option<SpeculationStats>,
    cached_tokens: Option<usize>,
}

/// Waits for every choice and answers one JSON body (choice `i` is `choices[i]`).
pub async fn complete(
    header: Header,
    choices: Vec<BoxStream<'static, Delta>>,
    mut log: RequestLog,
) -> Response {
    let mut results: Vec<Finished> = (0..choices.len()).map(|_| Finished::default()).collect();
    let mut merged = select_all(choices);
    while let Some(delta) = merged.next().await {
        log.record(&delta);
        if let Some(message) = delta.error {
            log.finish(Some("error"));
            let error = ApiError::sequence_failed(message);
            error.log();
            return error.into_response();
        }
        let result = &mut results[delta.index];
        result.text.push_str(&delta.text);
        result.logprobs.extend(delta.logprobs);
        result.completion_tokens = delta.completion_tokens;
        result.speculation = result.speculation.or(delta.speculation);
        result.cached_tokens = result.cached_tokens.or(delta.cached_tokens);
        result.tool_calls.extend(delta.tool_calls);
        result.reasoning.push_str(&delta.reasoning);
        if delta.finish_reason.is_some() {
            result.finish_reason = delta.finish_reason;
        }
    }
    log.finish(None);
    let completion_tokens = results.iter().map(|r| r.completion_tokens).sum();
    let choices = results
        .iter()
        .enumerate()
        .map(|(index, r)| {
            let logprobs = header.logprobs(&r.logprobs, 0);
            match header.endpoint {
                Endpoint::Chat | Endpoint::Responses => {
                    let mut message = json!({"role": "assistant", "content": r.text});
                    if !r.reasoning.is_empty() {
                        message["reasoning_content"] = json!(r.reasoning);
                    }
                    if !r.tool_calls.is_empty() {
                        message["tool_calls"] = header.tool_calls(index, &join(&r.tool_calls));
                        if r.text.is_empty() {
                            message["content"] = Value::Null;
                        }
                    }
                    json!({
                        "index": index,
                        "message": message,
                        "logprobs": logprobs,
                        "finish_reason": r.finish_reason,
                    })
                }
                Endpoint::Completion => json!({
                    "index": index,
                    "text": r.text,
                    "logprobs": logprobs,
                    "finish_reason": r.finish_reason,
                }),
            }
        })
        .collect();
    let mut body = header.envelope(false, choices);
    body["usage"] = header.usage(
        completion_tokens,
        total_speculation(results.iter().map(|r| r.speculation)),
        cached_of_every_choice(results.iter().map(|r| r.cached_tokens)),
    );
    axum::Json(body).into_response()
}

/// What a stream of server-sent events says: its first events, the events of each delta,
/// and its last ones.
pub trait EventSource: Send + 'static {
    fn start(&mut self) -> Vec<Event>;
    /// The events of `delta` (an error delta's too: the stream goes on with the other
    /// choices).
    fn delta(&mut self, delta: Delta) -> Vec<Event>;
    /// The events after the last delta; `failed` when some choice failed.
    fn end(&mut self, failed: bool) -> Vec<Event>;
}

/// Streams the events `source` makes of the choices' deltas, logging the request when it
/// ends. The stream ends when the client goes away, which drops the choices and so cancels
/// their sequences.
pub fn serve_events(
    choices: Vec<BoxStream<'static, Delta>>,
    mut log: RequestLog,
    mut source: impl EventSource,
) -> Response {
    let (sender, receiver) = tokio::sync::mpsc::channel::<Event>(64);
    let task = async move {
        let mut merged = select_all(choices);
        let mut events = source.start();
        let mut failed = false;
        loop {
            for event in events.drain(..) {
                if sender.send(event).await.is_err() {
                    log.finish(Some("cancelled"));
                    return;
                }
            }
            let delta = tokio::select! {
                _ = sender.closed() => {
                    log.finish(Some("cancelled"));
                    return;
                }
                delta = merged.next() => delta,
            };
            let Some(delta) = delta else { break };
            log.record(&delta);
            if let Some(message) = &delta.error {
                ApiError::sequence_failed(message.clone()).log();
                failed = true;
            }
            events = source.delta(delta);
        }
        let events = source.end(failed);
        log.finish(failed.then_some("error"));
        for event in events {
            if sender.send(event).await.is_err() {
                return;
            }
        }
    };
    tokio::spawn(task.instrument(tracing::Span::current()));
    Sse::new(ReceiverStream::new(receiver).map(Ok::<Event, Infallible>)).into_response()
}

/// Streams every choice's deltas as chat or completion chunks, ending in `data: [DONE]`.
pub fn stream(
    header: Header,
    choices: Vec<BoxStream<'static, Delta>>,
    include_usage: bool,
    log: RequestLog,
) -> Response {
    let count = choices.len();
    let chunks = Chunks {
        header,
        include_usage,
        text_lengths: vec![0; count],
        completion_tokens: vec![0; count],
        speculation: vec![None; count],
        cached_tokens: vec![None; count],
    };
    serve_events(choices, log, chunks)
}

/// The chunks of a chat or completion stream, and what each choice has produced so far.
struct Chunks {
    header: Header,
    include_usage: bool,
    text_lengths: Vec<usize>,
    completion_tokens: Vec<usize>,
    speculation: Vec<Option<SpeculationStats>>,
    cached_tokens: Vec<Option<usize>>,
}

impl EventSource for Chunks {
    fn start(&mut self) -> Vec<Event> {
        if self.header.endpoint == Endpoint::Completion {
            return Vec::new();
        }
        let first = json!({"role": "assistant", "content": ""});
        (0..self.text_lengths.len())
            .map(|index| chunk(&self.header, index, first.clone(), Value::Null, None))
            .collect()
    }

    fn delta(&mut self, delta: Delta) -> Vec<Event> {
        let header = &self.header;
        let mut events = Vec::new();
        if let Some(message) = &delta.error {
            events.push(data(&ApiError::sequence_failed(message.clone()).body()));
            return events;
        }
        self.completion_tokens[delta.index] = delta.completion_tokens;
        if delta.speculation.is_some() {
            self.speculation[delta.index] = delta.speculation;
        }
        if delta.cached_tokens.is_some() {
            self.cached_tokens[delta.index] = delta.cached_tokens;
        }
        if !delta.text.is_empty() || !delta.logprobs.is_empty() {
            let logprobs = header.logprobs(&delta.logprobs, self.text_lengths[delta.index]);
            self.text_lengths[delta.index] += delta.text.len();
            let content = match header.endpoint {
                Endpoint::Chat | Endpoint::Responses => json!({"content": delta.text}),
                Endpoint::Completion => json!(delta.text),
            };
            events.push(chunk(header, delta.index, content, logprobs, None));
        }
        if !delta.reasoning.is_empty() {
            let reasoning = json!({"reasoning_content": delta.reasoning});
            events.push(chunk(header, delta.index, reasoning, Value::Null, None));
        }
        if !delta.tool_calls.is_empty() {
            let calls = header.call_deltas(delta.index, &delta.tool_calls);
            let calls = json!({"tool_calls": calls});
            events.push(chunk(header, delta.index, calls, Value::Null, None));
        }
        if let Some(reason) = delta.finish_reason {
            let empty = match header.endpoint {
                Endpoint::Chat | Endpoint::Responses => json!({}),
                Endpoint::Completion => json!(""),
            };
            events.push(chunk(header, delta.index, empty, Value::Null, Some(reason)));
        }
        events
    }

    fn end(&mut self, _failed: bool) -> Vec<Event> {
        let mut events = Vec::new();
        if self.include_usage {
            let mut body = self.header.envelope(true, Vec::new());
            body["usage"] = self.header.usage(
                self.completion_tokens.iter().sum(),
                total_speculation(self.speculation.iter().copied()),
                cached_of_every_choice(self.cached_tokens.iter().copied()),
            );
            events.push(data(&body));
        }
        events.push(Event::default().data("[DONE]"));
        events
    }
}

fn data(value: &Value) -> Event {
    Event::default().data(value.to_string())
}

/// One streamed chunk of choice `index`: `content` is the chat `delta` or the completion
/// `text`.
fn chunk(
    header: &Header,
    index: usize,
    content: Value,
    logprobs: Value,
    finish_reason: Option<&'static str>,
) -> Event {
    let choice = match header.endpoint {
        Endpoint::Chat | Endpoint::Responses => json!({
            "index": index, "delta": content, "logprobs": logprobs, "finish_reason": finish_reason,
        }),
        Endpoint::Completion => json!({
            "index": index, "text": content, "logprobs": logprobs, "finish_reason": finish_reason,
        }),
    };
    data(&header.envelope(true, vec![choice]))
}

/// The prompt tokens the prefix cache served every choice (each choice is a sequence of
/// its own over the one prompt: the least of theirs), once every choice has reported.
pub(crate) fn cached_of_every_choice(
    choices: impl Iterator<Item = Option<usize>>,
) -> Option<usize> {
    choices.reduce(|a, b| Some(a?.min(b?))).flatten()
}

/// The choices' drafted tokens together, when any choice speculated.
fn total_speculation(
    choices: impl Iterator<Item = Option<SpeculationStats>>,
) -> Option<SpeculationStats> {
    choices.flatten().reduce(|a, b| SpeculationStats {
        verifications: a.verifications + b.verifications,
        drafted: a.drafted + b.drafted,
        accepted: a.accepted + b.accepted,
    })
}
