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

/// Which API a response belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
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
        }
    }

    /// The usage object; `speculation`, the choices' drafted tokens together when any
    /// speculated, adds OpenAI's `completion_tokens_details` counts of kept and rejected
    /// predicted tokens.
    fn usage(&self, completion_tokens: usize, speculation: Option<SpeculationStats>) -> Value {
        let mut usage = json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        });
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
    /// the first token in the completion, for the legacy format's `text_offset`).
    fn logprobs(&self, tokens: &[TokenLogprob], text_start: usize) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        match self.endpoint {
            Endpoint::Chat => json!({
                "content": tokens.iter().map(|t| json!({
                    "token": t.token,
                    "logprob": t.logprob,
                    "bytes": t.bytes,
                    "top_logprobs": t.top.iter().map(|(token, bytes, logprob)| json!({
                        "token": token, "logprob": logprob, "bytes": bytes,
                    })).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            }),
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
                Endpoint::Chat => {
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
    );
    axum::Json(body).into_response()
}

/// Streams every choice's deltas as server-sent events. The stream ends when the client
/// goes away, which drops the choices and so cancels their sequences.
pub fn stream(
    header: Header,
    choices: Vec<BoxStream<'static, Delta>>,
    include_usage: bool,
    mut log: RequestLog,
) -> Response {
    let (sender, receiver) = tokio::sync::mpsc::channel::<Event>(64);
    let count = choices.len();
    let task = async move {
        let mut merged = select_all(choices);
        let mut events = Vec::new();
        if header.endpoint == Endpoint::Chat {
            for index in 0..count {
                events.push(chunk(
                    &header,
                    index,
                    json!({"role": "assistant", "content": ""}),
                    Value::Null,
                    None,
                ));
            }
        }
        let mut text_lengths = vec![0usize; count];
        let mut completion_tokens = vec![0usize; count];
        let mut speculation = vec![None; count];
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
                let error = ApiError::sequence_failed(message.clone());
                error.log();
                events.push(data(&error.body()));
                failed = true;
                continue;
            }
            completion_tokens[delta.index] = delta.completion_tokens;
            if delta.speculation.is_some() {
                speculation[delta.index] = delta.speculation;
            }
            if !delta.text.is_empty() || !delta.logprobs.is_empty() {
                let logprobs = header.logprobs(&delta.logprobs, text_lengths[delta.index]);
                text_lengths[delta.index] += delta.text.len();
                let content = match header.endpoint {
                    Endpoint::Chat => json!({"content": delta.text}),
                    Endpoint::Completion => json!(delta.text),
                };
                events.push(chunk(&header, delta.index, content, logprobs, None));
            }
            if !delta.reasoning.is_empty() {
                let reasoning = json!({"reasoning_content": delta.reasoning});
                events.push(chunk(&header, delta.index, reasoning, Value::Null, None));
            }
            if !delta.tool_calls.is_empty() {
                let calls = header.call_deltas(delta.index, &delta.tool_calls);
                events.push(chunk(
                    &header,
                    delta.index,
                    json!({"tool_calls": calls}),
                    Value::Null,
                    None,
                ));
            }
            if let Some(reason) = delta.finish_reason {
                let empty = match header.endpoint {
                    Endpoint::Chat => json!({}),
                    Endpoint::Completion => json!(""),
                };
                events.push(chunk(
                    &header,
                    delta.index,
                    empty,
                    Value::Null,
                    Some(reason),
                ));
            }
        }
        if include_usage {
            let mut body = header.envelope(true, Vec::new());
            body["usage"] = header.usage(
                completion_tokens.iter().sum(),
                total_speculation(speculation.iter().copied()),
            );
            events.push(data(&body));
        }
        events.push(Event::default().data("[DONE]"));
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
        Endpoint::Chat => json!({
            "index": index, "delta": content, "logprobs": logprobs, "finish_reason": finish_reason,
        }),
        Endpoint::Completion => json!({
            "index": index, "text": content, "logprobs": logprobs, "finish_reason": finish_reason,
        }),
    };
    data(&header.envelope(true, vec![choice]))
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
