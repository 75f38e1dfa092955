//! One choice of a request: an engine sequence whose token events become text deltas
//! (complete UTF-8 characters, stop strings cut out) with their log-probabilities. Dropping
//! a [`Choice`] drops its event receiver, which cancels the sequence at the next step.

use std::sync::Arc;
use std::time::Instant;

use futures::stream::{BoxStream, StreamExt};
use runit_engine::scheduler::{EventSink, SequenceEvent};
use runit_engine::speculative::SpeculationStats;
use runit_engine::stop::StopMatcher;
use runit_engine::{GeneratedToken, StopReason};
use runit_tokenizer::Tokenizer;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::reasoning::ThinkFilter;
use crate::tools::parse::{CallDelta, CallFilter};

/// Delivers engine events into a tokio channel, each with the moment the engine sent it
/// (the request log times tokens by it, not by when the handler reads them); closed when
/// the [`Choice`] is dropped.
pub struct ChannelSink(pub UnboundedSender<(SequenceEvent, Instant)>);

impl EventSink for ChannelSink {
    fn send(&mut self, event: SequenceEvent) -> bool {
        self.0.send((event, Instant::now())).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// A token with its log-probability, and the most likely alternatives when asked for.
#[derive(Debug, Clone)]
pub struct TokenLogprob {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f64,
    pub top: Vec<(String, Vec<u8>, f64)>,
}

/// What a choice produced since its last delta.
#[derive(Debug, Clone, Default)]
pub struct Delta {
    pub index: usize,
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    /// `stop`, `length` or `tool_calls` on the last delta.
    pub finish_reason: Option<&'static str>,
    /// Pieces of the tool calls read from the choice's text so far.
    pub tool_calls: Vec<CallDelta>,
    /// Reasoning text (`<think>` blocks), apart from `text`.
    pub reasoning: String,
    /// Tokens generated so far.
    pub completion_tokens: usize,
    /// Of those, the tokens generated inside a `<think>` block (its tags included).
    pub reasoning_tokens: usize,
    /// Drafted tokens kept and rejected (on the last delta, when the sequence speculated).
    pub speculation: Option<SpeculationStats>,
    /// Prompt tokens served by the prefix cache (on the last delta).
    pub cached_tokens: Option<usize>,
    /// Set when the engine failed this sequence.
    pub error: Option<String>,
    /// When the engine sent the event this delta comes from.
    pub sent: Option<Instant>,
}

/// The receiving end of one sequence.
pub struct Choice {
    index: usize,
    receiver: Option<UnboundedReceiver<(SequenceEvent, Instant)>>,
    tokenizer: Arc<Tokenizer>,
    pending: Vec<u8>,
    stop: StopMatcher,
    logprobs: bool,
    generated: usize,
    /// Tokens generated while the think filter was inside a `<think>` block.
    reasoned: usize,
    /// Text that starts the first delta (the echoed prompt), not matched against stops.
    prefix: String,
    /// Separates tool calls from content, when tools are offered.
    calls: Option<CallFilter>,
    /// Control tokens whose text is shown anyway (the markers of tool calls).
    shown: Vec<u32>,
    /// Separates reasoning from content, for reasoning models.
    think: Option<ThinkFilter>,
}

impl Choice {
    /// A choice and the sink to submit its sequence with; its text starts with `prefix`.
    pub fn new(
        index: usize,
        tokenizer: Arc<Tokenizer>,
        stops: Vec<String>,
        logprobs: bool,
        prefix: String,
    ) -> (Choice, ChannelSink) {
        let (sender, receiver) = unbounded_channel();
        let choice = Choice {
            index,
            receiver: Some(receiver),
            tokenizer,
            pending: Vec::new(),
            stop: StopMatcher::new(stops),
            logprobs,
            generated: 0,
            reasoned: 0,
            prefix,
            calls: None,
            shown: Vec::new(),
            think: None,
        };
        (choice, ChannelSink(sender))
    }

    /// Moves `<think>` blocks out of the text into the deltas' reasoning with `filter`.
    pub fn with_reasoning(mut self, filter: ThinkFilter) -> Choice {
        self.think = Some(filter);
        self
    }

    /// Reads tool calls out of the text with `filter`; the control tokens `shown` (call
    /// markers) appear in the text it reads.
    pub fn with_calls(mut self, filter: CallFilter, shown: Vec<u32>) -> Choice {
        self.calls = Some(filter);
        self.shown = shown;
        self
    }

    /// The choice's deltas, ending with the one that has a finish reason or an error.
    pub fn into_stream(self) -> BoxStream<'static, Delta> {
        futures::stream::unfold(self, |mut choice| async move {
            let delta = choice.next_delta().await?;
            Some((delta, choice))
        })
        .boxed()
    }

    /// Waits for the next engine event and turns it into a delta; `None` after the end.
    async fn next_delta(&mut self) -> Option<Delta> {
        let receiver = self.receiver.as_mut()?;
        let (event, sent) = match receiver.recv().await {
            Some((event, sent)) => (Some(event), Some(sent)),
            None => (None, None),
        };
        let mut delta = Delta {
            index: self.index,
            sent,
            ..Delta::default()
        };
        let is_token = matches!(event, Some(SequenceEvent::Token(_)));
        match event {
            Some(SequenceEvent::Token(token)) => {
                self.generated += 1;
                if self.logprobs {
                    delta.logprobs.push(self.logprob(&token));
                }
                let text = self.text_of(token.id);
                let check = self.stop.push(&text);
                delta.text = check.text;
                if check.stopped {
                    delta.finish_reason = Some("stop");
                    self.receiver = None;
                }
            }
            Some(SequenceEvent::Finished {
                stop,
                speculation,
                cached_tokens,
                ..
            }) => {
                delta.speculation = speculation;
                delta.cached_tokens = Some(cached_tokens);
                let rest = String::from_utf8_lossy(&self.pending).into_owned();
                self.pending.clear();
                let check = self.stop.push(&rest);
                delta.text = check.text;
                if !check.stopped {
                    delta.text.push_str(&self.stop.finish());
                }
                delta.finish_reason = Some(match stop {
                    StopReason::Limit if !check.stopped => "length",
                    _ => "stop",
                });
                self.receiver = None;
            }
            Some(SequenceEvent::Failed(message)) => {
                delta.error = Some(message);
                self.receiver = None;
            }
            None => {
                delta.error = Some("the engine dropped the sequence".into());
                self.receiver = None;
            }
        }
        delta.completion_tokens = self.generated;
        if let Some(filter) = &mut self.think {
            let was_thinking = filter.is_thinking();
            let mut split = filter.push(&delta.text);
            // A token that opens, continues or closes the block is a reasoning token.
            if is_token && (was_thinking || filter.is_thinking()) {
                self.reasoned += 1;
            }
            if delta.finish_reason.is_some() {
                let rest = filter.finish();
                split.content.push_str(&rest.content);
                split.reasoning.push_str(&rest.reasoning);
            }
            delta.text = split.content;
            delta.reasoning = split.reasoning;
        }
        delta.reasoning_tokens = self.reasoned;
        if let Some(filter) = &mut self.calls {
            delta.text = filter.push(&delta.text);
            delta.tool_calls = filter.deltas();
            if delta.finish_reason.is_some() {
                let (rest, last, any) = filter.finish();
                delta.text.push_str(&rest);
                delta.tool_calls.extend(last);
                // A call cut off by the token limit still ends with `length`.
                if any && delta.finish_reason == Some("stop") {
                    delta.finish_reason = Some("tool_calls");
                }
            }
        }
        if !self.prefix.is_empty() {
            delta.text.insert_str(0, &std::mem::take(&mut self.prefix));
        }
        Some(delta)
    }

    /// The complete characters that token `id` finishes (control tokens add nothing).
    fn text_of(&mut self, id: u32) -> String {
        if !self.tokenizer.is_control(id) || self.shown.contains(&id) {
            if let Ok(piece) = self.tokenizer.token_piece(id) {
                self.pending.extend_from_slice(piece);
            }
        }
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            // An error with no length is an unfinished character at the end: hold it back.
            Err(error) if error.error_len().is_none() => error.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let complete: Vec<u8> = self.pending.drain(..valid).collect();
        String::from_utf8_lossy(&complete).into_owned()
    }

    fn logprob(&self, token: &GeneratedToken) -> TokenLogprob {
        let describe = |id: u32| {
            let bytes = self
                .tokenizer
                .token_piece(id)
                .map(<[u8]>::to_vec)
                .unwrap_or_default();
            (String::from_utf8_lossy(&bytes).into_owned(), bytes)
        };
        let (text, bytes) = describe(token.id);
        TokenLogprob {
            token: text,
            bytes,
            logprob: token.logprob,
            top: token
                .top
                .iter()
                .map(|&(id, logprob)| {
                    let (text, bytes) = describe(id);
                    (text, bytes, logprob)
                })
                .collect(),
        }
    }
}
