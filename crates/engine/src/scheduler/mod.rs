//! Continuous batching: one thread owns the model and a KV cache shared by every sequence
//! through a [`BlockAllocator`](crate::kv_blocks::BlockAllocator); requests queue up, are
//! admitted while the cache can hold them, have their prompts evaluated chunk by chunk, and
//! decode together, one token of every active sequence per forward pass. Each step decodes
//! every running sequence and evaluates at most one chunk budget of prompt tokens, shared
//! between the waiting prompts so that a short one is not held behind a long one (the
//! order is the private `policy` module's). A sequence whose receiver goes away is dropped (its blocks
//! freed) at the next step.
//!
//! Admission is exact: the scheduler holds at most `max_sequences + max_queued` sequences,
//! running or waiting, and a request's sequences are queued together or refused together
//! by the room left at the moment it is submitted (a sequence's place is free again before
//! its last event is sent).
//!
//! Greedy outputs do not depend on what else runs: prompts are chunked exactly as
//! [`Session::eval`](crate::Session::eval) chunks them (the chunks of several prompts may
//! share a prefill pass, each its own span), the backend attends each span as it would
//! alone, and the matmul computes each row the same whatever the batch (on the CPU; GPU
//! kernels chosen by row count part within near-ties).
//!
//! ```no_run
//! # fn demo(model: std::sync::Arc<runit_model::Model>) -> Result<(), Box<dyn std::error::Error>> {
//! use runit_engine::scheduler::{Request, Scheduler, SequenceEvent};
//! use runit_engine::EngineConfig;
//! let scheduler = Scheduler::start(model, &EngineConfig::default())?;
//! let (sender, receiver) = std::sync::mpsc::channel();
//! scheduler.submit(Request::greedy(vec![1, 504, 314], 16), Box::new(sender))?;
//! for event in receiver {
//!     if let SequenceEvent::Token(token) = event {
//!         println!("{}", token.id);
//!     }
//! }
//! # Ok(()) }
//! ```

mod metrics;
mod policy;
mod prefix;
mod worker;

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use runit_model::{Model, Scratch};

use crate::request::{check_request, RequestError};
use crate::speculative::{
    DraftModelPool, DraftParams, PromptLookup, Speculation, SpeculationStats,
};
use crate::stop::StopCondition;
use crate::{EngineConfig, EngineError, GeneratedToken, Sampler, SamplerParams, StopReason};

pub use metrics::{Histogram, SchedulerMetrics};
pub use prefix::TILED_ATTENTION_ROWS;

/// Most rows of one decode pass (every running sequence's token and drafts; the batched
/// GPU kernels are built for up to 256 rows). Backends attend each span as it would alone,
/// so the rows' count changes no sequence's numbers; more sequences than this decode in
/// several passes a step, each a fixed cost on a GPU.
pub const MAX_DECODE_ROWS: usize = 256;

/// One generation to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Prompt token ids (at least one).
    pub prompt: Vec<u32>,
    pub sampling: SamplerParams,
    /// Most tokens to generate (at least 1); generation also ends at the context end.
    pub max_tokens: usize,
    /// Tokens that end generation (EOS, EOT, `<|im_end|>` ...).
    pub end_of_generation: Vec<u32>,
    /// How many top log-probabilities to report per token (0 = none).
    pub top_logprobs: usize,
    /// Whether each token's log-probability is reported ([`GeneratedToken::logprob`];
    /// without it that may be NaN, which spares greedy decoding a pass over every logit and
    /// lets a sampled step draw where the logits are, downloading only the tokens).
    pub logprobs: bool,
    /// Speculative decoding of the sequence by prompt lookup, when asked for.
    pub draft: Option<DraftRequest>,
}

/// A sequence's speculation: a draft model's session of its own (taken from `model`'s
/// pool), or prompt lookup over its prompt and output and over the caller's predicted
/// output (OpenAI's `prediction`), which the output is expected to follow from its start.
/// A prediction is drafted from by prompt lookup even when a draft model is given. Each
/// step's drafts are verified in the decode pass with the other sequences' rows.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftRequest {
    /// Tokens matched by prompt lookup.
    pub ngram: usize,
    pub params: DraftParams,
    /// The predicted output's tokens (may be empty).
    pub prediction: Vec<u32>,
    /// Drafts from a draft model instead of prompt lookup, when there is no prediction.
    pub model: Option<DraftModelPool>,
}

impl DraftRequest {
    /// The speculation of a sequence whose prompt has `prompt_len` tokens.
    fn speculation(&self, prompt_len: usize) -> Result<Speculation, EngineError> {
        let drafter = match &self.model {
            Some(pool) if self.prediction.is_empty() => pool.take()?,
            _ => Box::new(
                PromptLookup::new(self.ngram)?.with_reference(self.prediction.clone(), prompt_len),
            ),
        };
        Speculation::new(drafter, self.params)
    }
}

impl Request {
    /// A greedy request without end-of-generation tokens.
    pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
        Request {
            prompt,
            sampling: SamplerParams::greedy(),
            max_tokens,
            end_of_generation: Vec::new(),
            top_logprobs: 0,
            logprobs: true,
            draft: None,
        }
    }

    /// Checks the request for a context of `context_size` cells and a vocabulary of
    /// `vocab_size` tokens (see [`check_request`]); [`Scheduler::submit`] starts with it.
    pub fn validate(&self, context_size: usize, vocab_size: usize) -> Result<(), RequestError> {
        check_request(&self.prompt, 0, self.max_tokens, context_size, vocab_size)?;
        if let Some(draft) = &self.draft {
            let room = context_size - self.prompt.len();
            if draft.prediction.len() > room {
                return Err(RequestError::PredictionTooLong {
                    tokens: draft.prediction.len(),
                    room,
                });
            }
        }
        Ok(())
    }

    /// The rules that end the request's generation in a context of `context_size` cells.
    pub fn stop_condition(&self, context_size: usize) -> StopCondition<'_> {
        StopCondition {
            end_of_generation: &self.end_of_generation,
            max_tokens: self.max_tokens,
            context_size,
        }
    }
}

/// What a sequence reports to its submitter, in order: tokens, then one `Finished` or
/// `Failed`.
#[derive(Debug, Clone)]
pub enum SequenceEvent {
    Token(GeneratedToken),
    Finished {
        stop: StopReason,
        prompt_tokens: usize,
        /// Of the prompt tokens, those whose KV cells came from the prefix cache.
        cached_tokens: usize,
        generated_tokens: usize,
        /// Drafted tokens kept and verified, when the sequence speculated.
        speculation: Option<SpeculationStats>,
    },
    /// The forward pass failed or the scheduler stopped; the message says why.
    Failed(String),
}

/// Where a sequence's events go (a channel sender, usually).
pub trait EventSink: Send {
    /// Delivers `event`; false when the receiver has gone away (the sequence is cancelled).
    fn send(&mut self, event: SequenceEvent) -> bool;

    /// True when the receiver has gone away; checked before every step.
    fn is_closed(&self) -> bool {
        false
    }
}

impl EventSink for std::sync::mpsc::Sender<SequenceEvent> {
    fn send(&mut self, event: SequenceEvent) -> bool {
        std::sync::mpsc::Sender::send(self, event).is_ok()
    }
}

/// Why a request was not queued.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The running and waiting sequences leave room for fewer than the request asks for.
    #[error(
        "the queue is full: room for {room} more sequences, {requested} asked for; try again later"
    )]
    QueueFull { requested: usize, room: usize },
    /// One request asks for more sequences than run at once (`max_sequences`).
    #[error("{requested} sequences asked for at once; at most {max_sequences} run at once")]
    TooManySequences {
        requested: usize,
        max_sequences: usize,
    },
    #[error("invalid {name}: {message}")]
    InvalidParameter { name: &'static str, message: String },
    #[error("the prompt has {tokens} tokens, but the context holds {context} (and one more is needed to generate)")]
    PromptTooLong { tokens: usize, context: usize },
    #[error("the scheduler has stopped")]
    Stopped,
}

impl From<RequestError> for SubmitError {
    fn from(error: RequestError) -> SubmitError {
        match error {
            RequestError::PromptTooLong { tokens, context } => {
                SubmitError::PromptTooLong { tokens, context }
            }
            other => SubmitError::InvalidParameter {
                name: other.parameter(),
                message: other.to_string(),
            },
        }
    }
}

/// A snapshot of the scheduler's load, refreshed whenever a sequence is admitted or ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerStats {
    pub free_blocks: usize,
    pub total_blocks: usize,
    /// Sequences admitted and not finished.
    pub active: usize,
    /// Sequences submitted and not admitted yet.
    pub queued: usize,
}

/// A submitted request before admission.
struct Pending {
    request: Request,
    sampler: Sampler,
    speculation: Option<Speculation>,
    sink: Box<dyn EventSink>,
    submitted: Instant,
}

/// State shared by the handle and the worker thread.
struct Shared {
    state: Mutex<QueueState>,
    /// Signalled when work arrives or the scheduler stops.
    wake: Condvar,
    /// Signalled when the stats change.
    progress: Condvar,
}

struct QueueState {
    /// Submitted and not yet taken by the worker.
    incoming: VecDeque<Pending>,
    /// The worker's figures; `queued` counts its waiting sequences, not `incoming`.
    stats: SchedulerStats,
    /// The worker's counters.
    metrics: SchedulerMetrics,
    /// Sequences submitted and not ended (incoming, waiting or active); a sequence stops
    /// counting before its last event is sent.
    held: usize,
    shutdown: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A poisoned lock means the worker panicked; its state is still consistent enough
        // to read stats and refuse work.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Handle of the scheduler thread; dropping it stops the thread (pending sequences fail).
pub struct Scheduler {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    context_size: usize,
    max_sequences: usize,
    max_queued: usize,
    vocab_size: usize,
}

impl Scheduler {
    /// Allocates the shared KV cache of `config` and starts the scheduler thread, which
    /// decodes up to `config.max_sequences` sequences at once.
    pub fn start(model: Arc<Model>, config: &EngineConfig) -> Result<Scheduler, EngineError> {
        // The step buffers first: a pool sized from device memory takes what they leave.
        let trained = config.context_size_for(&model);
        let capacity = config.batch_size.min(trained);
        let scratch = Scratch::new(&model, capacity.max(MAX_DECODE_ROWS.min(trained)))?;
        let cache = config.allocate_cache(&model, true, config.max_sequences)?;
        let context_size = cache.context_size;
        let capacity = capacity.min(context_size);
        let stats = SchedulerStats {
            free_blocks: cache.blocks.free_blocks(),
            total_blocks: cache.blocks.total_blocks(),
            active: 0,
            queued: 0,
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(QueueState {
                incoming: VecDeque::new(),
                stats,
                metrics: SchedulerMetrics::default(),
                held: 0,
                shutdown: false,
            }),
            wake: Condvar::new(),
            progress: Condvar::new(),
        });
        let vocab_size = model.config.vocab_size;
        let worker = worker::Worker::new(
            model,
            cache,
            scratch,
            capacity,
            config.max_sequences,
            Arc::clone(&shared),
        );
        let thread = std::thread::Builder::new()
            .name("runit-scheduler".into())
            .spawn(move || worker.run())
            .map_err(|error| EngineError::InvalidParameter {
                name: "scheduler thread",
                message: error.to_string(),
            })?;
        Ok(Scheduler {
            shared,
            thread: Some(thread),
            context_size,
            max_sequences: config.max_sequences,
            max_queued: config.max_queued,
            vocab_size,
        })
    }

    /// The most KV cells one sequence can use: the pool's cells, at most the model's
    /// training context (the pool's size is `stats().total_blocks` blocks).
    pub fn context_size(&self) -> usize {
        self.context_size
    }

    /// Most sequences decoded at once; a request may ask for no more.
    pub fn max_sequences(&self) -> usize {
        self.max_sequences
    }

    /// Queues `request`; its events go to `sink`. The same as [`Scheduler::submit_all`]
    /// with one sequence.
    pub fn submit(&self, request: Request, sink: Box<dyn EventSink>) -> Result<(), SubmitError> {
        self.submit_all(vec![(request, sink)])
    }

    /// Queues the sequences of one request (each request's events go to its sink), all of
    /// them or none: each must pass [`Request::validate`] and its sampler settings, there
    /// may be at most [`Scheduler::max_sequences`], and the sequences running or waiting
    /// must leave room for them (at most `max_sequences + max_queued` in all, counted at
    /// this moment).
    pub fn submit_all(
        &self,
        requests: Vec<(Request, Box<dyn EventSink>)>,
    ) -> Result<(), SubmitError> {
        let requested = requests.len();
        if requested > self.max_sequences {
            return Err(SubmitError::TooManySequences {
                requested,
                max_sequences: self.max_sequences,
            });
        }
        let mut pending = Vec::with_capacity(requested);
        for (request, sink) in requests {
            request.validate(self.context_size, self.vocab_size)?;
            let invalid = |name: &'static str| {
                move |error: EngineError| match error {
                    EngineError::InvalidParameter { name, message } => {
                        SubmitError::InvalidParameter { name, message }
                    }
                    other => SubmitError::InvalidParameter {
                        name,
                        message: other.to_string(),
                    },
                }
            };
            let sampler = Sampler::new(request.sampling.clone()).map_err(invalid("sampling"))?;
            let speculation = request
                .draft
                .as_ref()
                .map(|draft| draft.speculation(request.prompt.len()))
                .transpose()
                .map_err(invalid("draft"))?;
            pending.push(Pending {
                request,
                sampler,
                speculation,
                sink,
                submitted: Instant::now(),
            });
        }
        let mut state = self.shared.lock();
        if state.shutdown {
            return Err(SubmitError::Stopped);
        }
        let room = (self.max_sequences + self.max_queued).saturating_sub(state.held);
        if requested > room {
            return Err(SubmitError::QueueFull { requested, room });
        }
        state.held += requested;
        state.incoming.extend(pending);
        drop(state);
        self.shared.wake.notify_all();
        Ok(())
    }

    /// The load: the worker's latest figures, with the submissions it has not taken yet
    /// counted as queued.
    pub fn stats(&self) -> SchedulerStats {
        let state = self.shared.lock();
        let mut stats = state.stats;
        stats.queued += state.incoming.len();
        stats
    }

    /// The counters since the start, as of the worker's latest step.
    pub fn metrics(&self) -> SchedulerMetrics {
        self.shared.lock().metrics.clone()
    }

    /// Waits until no sequence is active or queued; false if `timeout` passed first.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        loop {
            if state.held == 0 {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            state = self
                .shared
                .progress
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            // A panicked worker has nothing left to clean up.
            let _ = thread.join();
        }
    }
}
