//! The scheduler thread: admits queued requests while the cache can hold them, then runs
//! steps of one batched decode pass (every sequence with a token to evaluate) and one prompt
//! chunk, sampling and reporting tokens and freeing the blocks of finished sequences.

use std::collections::VecDeque;
use std::sync::Arc;

use runit_backend::SequenceSpan;
use runit_model::{Batch, KvState, Model, Scratch};

use super::{EventSink, Pending, Request, SequenceEvent, Shared, MAX_DECODE_ROWS};
use crate::config::Cache;
use crate::kv_blocks::BlockAllocator;
use crate::sampler::{log_probability, top_logprobs};
use crate::{GeneratedToken, Sampler};

/// An admitted sequence.
struct Sequence {
    request: Request,
    sampler: Sampler,
    sink: Box<dyn EventSink>,
    /// Prompt tokens already in the cache.
    prefilled: usize,
    /// Positions in the cache.
    n_past: usize,
    /// The latest sampled token, not yet evaluated.
    next: Option<u32>,
    generated: usize,
    block_table: Vec<u32>,
    /// Blocks set aside for the sequence's longest possible run.
    commitment: usize,
}

/// Everything the scheduler thread owns.
pub(super) struct Worker {
    model: Arc<Model>,
    kv: KvState,
    scratch: Scratch,
    blocks: BlockAllocator,
    context_size: usize,
    /// Prompt tokens per forward pass (the chunk size of `Session::eval`).
    chunk_size: usize,
    max_sequences: usize,
    waiting: VecDeque<Pending>,
    active: Vec<Sequence>,
    /// Sum of the active sequences' commitments; never above the total blocks.
    committed: usize,
    logits: Vec<f32>,
}

impl Worker {
    pub(super) fn new(
        model: Arc<Model>,
        cache: Cache,
        scratch: Scratch,
        chunk_size: usize,
        max_sequences: usize,
    ) -> Worker {
        Worker {
            model,
            kv: cache.kv,
            scratch,
            blocks: cache.blocks,
            context_size: cache.context_size,
            chunk_size,
            max_sequences,
            waiting: VecDeque::new(),
            active: Vec::new(),
            committed: 0,
            logits: Vec::new(),
        }
    }

    /// The thread's loop: wait for work, step, publish stats; on shutdown fail what is left.
    pub(super) fn run(mut self, shared: &Shared) {
        loop {
            {
                let mut state = shared.lock();
                loop {
                    self.waiting.extend(state.incoming.drain(..));
                    if state.shutdown || !self.waiting.is_empty() || !self.active.is_empty() {
                        break;
                    }
                    state = shared
                        .wake
                        .wait(state)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
                if state.shutdown {
                    break;
                }
            }
            self.step();
            let mut state = shared.lock();
            state.stats.free_blocks = self.blocks.free_blocks();
            state.stats.active = self.active.len();
            state.stats.queued = self.waiting.len();
            drop(state);
            shared.progress.notify_all();
        }
        for mut pending in self.waiting.drain(..) {
            pending
                .sink
                .send(SequenceEvent::Failed("the scheduler stopped".into()));
        }
        for mut sequence in self.active.drain(..) {
            sequence
                .sink
                .send(SequenceEvent::Failed("the scheduler stopped".into()));
        }
    }

    /// One step: drop cancelled sequences, admit, decode, evaluate one prompt chunk.
    fn step(&mut self) {
        let mut index = 0;
        while index < self.active.len() {
            if self.active[index].sink.is_closed() {
                self.remove(index);
            } else {
                index += 1;
            }
        }
        self.waiting.retain(|pending| !pending.sink.is_closed());
        self.admit();
        self.decode();
        self.prefill();
    }

    /// Admits waiting requests in order while there is a free slot and the cache can hold
    /// their longest run next to the commitments of the active sequences.
    fn admit(&mut self) {
        while self.active.len() < self.max_sequences {
            let Some(pending) = self.waiting.front() else {
                break;
            };
            let request = &pending.request;
            let longest = (request.prompt.len() + request.max_tokens).min(self.context_size);
            let commitment = longest.div_ceil(self.blocks.block_size());
            if self.committed + commitment > self.blocks.total_blocks() {
                break;
            }
            let Pending {
                request,
                mut sampler,
                sink,
            } = self.waiting.pop_front().expect("front exists");
            for &token in &request.prompt {
                sampler.accept(token);
            }
            self.committed += commitment;
            self.active.push(Sequence {
                request,
                sampler,
                sink,
                prefilled: 0,
                n_past: 0,
                next: None,
                generated: 0,
                block_table: Vec::new(),
                commitment,
            });
        }
    }

    /// Evaluates the pending token of every decoding sequence, in passes of at most
    /// `MAX_DECODE_ROWS` rows, and samples each one's next token.
    fn decode(&mut self) {
        let ready: Vec<usize> = (0..self.active.len())
            .filter(|&i| self.active[i].next.is_some())
            .collect();
        let group_size = MAX_DECODE_ROWS.min(self.scratch.capacity);
        let mut finished = Vec::new();
        for group in ready.chunks(group_size) {
            let mut tokens = Vec::with_capacity(group.len());
            let mut positions = Vec::with_capacity(group.len());
            let mut spans = Vec::with_capacity(group.len());
            for (row, &i) in group.iter().enumerate() {
                let sequence = &mut self.active[i];
                let reserved = self
                    .blocks
                    .reserve(&mut sequence.block_table, sequence.n_past + 1);
                assert!(reserved, "commitments keep enough blocks free");
                tokens.push(sequence.next.expect("ready sequences have a token"));
                positions.push(sequence.n_past as u32);
                spans.push(SequenceSpan {
                    first_row: row,
                    rows: 1,
                    start_position: sequence.n_past,
                    block_table: sequence.block_table.clone(),
                    block_size: self.blocks.block_size(),
                });
            }
            let logit_rows: Vec<u32> = (0..group.len() as u32).collect();
            let batch = Batch {
                tokens: &tokens,
                positions: &positions,
                spans: &spans,
                logit_rows: &logit_rows,
            };
            // Every row plain greedy: pick where the logits are (a GPU downloads two numbers
            // per row instead of the vocabulary); the picks equal the host's argmax.
            let greedy = group.iter().all(|&i| self.takes_greedy_pick(i));
            // The log-probabilities only where some request reports them.
            let log_probabilities = group.iter().any(|&i| self.active[i].request.logprobs);
            let picks = if greedy {
                self.model
                    .forward_greedy(&batch, &mut self.kv, &mut self.scratch, log_probabilities)
                    .map(Some)
            } else {
                self.forward(&batch).map(|()| None)
            };
            let picks = match picks {
                Ok(picks) => picks,
                Err(error) => {
                    for &i in group {
                        self.active[i]
                            .sink
                            .send(SequenceEvent::Failed(format!("decode failed: {error}")));
                        finished.push(i);
                    }
                    continue;
                }
            };
            if let Some(picks) = picks {
                for (&i, pick) in group.iter().zip(picks) {
                    self.active[i].n_past += 1;
                    let token = GeneratedToken {
                        id: pick.id,
                        logprob: f64::from(pick.logprob),
                        top: Vec::new(),
                    };
                    if self.report(i, token) {
                        finished.push(i);
                    }
                }
                continue;
            }
            let vocab = self.model.config.vocab_size;
            let logits = std::mem::take(&mut self.logits);
            for (row, &i) in group.iter().enumerate() {
                let sequence = &mut self.active[i];
                sequence.n_past += 1;
                let row_logits = &logits[row * vocab..(row + 1) * vocab];
                if self.emit(i, row_logits) {
                    finished.push(i);
                }
            }
            self.logits = logits;
        }
        self.remove_all(finished);
    }

    /// Evaluates, in one pass, the next prompt chunk of the sequences whose prompts are not
    /// in the cache yet, oldest first, while their chunks fit in one pass of `chunk_size`
    /// tokens (the oldest always goes). Each chunk is the one the sequence alone would
    /// evaluate next (chunks start at multiples of `chunk_size`, as `Session::eval` cuts
    /// them), and each span of the pass is attended and multiplied as if alone, so several
    /// prompts arriving together start in one pass without changing anyone's numbers. The
    /// chunk that ends a prompt yields its first token.
    fn prefill(&mut self) {
        // (sequence, first prompt position, end) of each chunk of the pass.
        let mut chunks = Vec::new();
        let mut total = 0;
        for (i, sequence) in self.active.iter().enumerate() {
            let len = sequence.request.prompt.len();
            if sequence.prefilled >= len {
                continue;
            }
            let start = sequence.prefilled;
            let end = (start + self.chunk_size).min(len);
            if !chunks.is_empty() && total + (end - start) > self.chunk_size {
                break;
            }
            chunks.push((i, start, end));
            total += end - start;
        }
        if chunks.is_empty() {
            return;
        }
        let mut tokens = Vec::with_capacity(total);
        let mut positions = Vec::with_capacity(total);
        let mut spans = Vec::with_capacity(chunks.len());
        let mut logit_rows = Vec::new();
        // The sequences whose prompts this pass ends, in the order of `logit_rows`.
        let mut ending = Vec::new();
        for &(i, start, end) in &chunks {
            let sequence = &mut self.active[i];
            let reserved = self.blocks.reserve(&mut sequence.block_table, end);
            assert!(reserved, "commitments keep enough blocks free");
            spans.push(SequenceSpan {
                first_row: tokens.len(),
                rows: end - start,
                start_position: start,
                block_table: sequence.block_table.clone(),
                block_size: self.blocks.block_size(),
            });
            tokens.extend_from_slice(&sequence.request.prompt[start..end]);
            positions.extend((start..end).map(|p| p as u32));
            if end == sequence.request.prompt.len() {
                logit_rows.push(tokens.len() as u32 - 1);
                ending.push(i);
            }
        }
        let batch = Batch {
            tokens: &tokens,
            positions: &positions,
            spans: &spans,
            logit_rows: &logit_rows,
        };
        if let Err(error) = self.forward(&batch) {
            for &(i, ..) in &chunks {
                self.active[i]
                    .sink
                    .send(SequenceEvent::Failed(format!("prompt failed: {error}")));
            }
            self.remove_all(chunks.iter().map(|&(i, ..)| i).collect());
            return;
        }
        for &(i, _, end) in &chunks {
            let sequence = &mut self.active[i];
            sequence.prefilled = end;
            sequence.n_past = end;
        }
        let vocab = self.model.config.vocab_size;
        let logits = std::mem::take(&mut self.logits);
        let mut finished = Vec::new();
        for (row, &i) in ending.iter().enumerate() {
            if self.emit(i, &logits[row * vocab..(row + 1) * vocab]) {
                finished.push(i);
            }
        }
        self.logits = logits;
        self.remove_all(finished);
    }

    fn forward(&mut self, batch: &Batch<'_>) -> Result<(), runit_model::ModelError> {
        self.model.forward(
            batch,
            &mut self.kv,
            &mut self.scratch,
            &mut self.logits,
            None,
        )
    }

    /// Samples sequence `i`'s next token from `logits` and reports it (and the end, if this
    /// is the last one); true when the sequence is over, as `generate` decides it.
    fn emit(&mut self, i: usize, logits: &[f32]) -> bool {
        let sequence = &mut self.active[i];
        let top = if sequence.request.top_logprobs > 0 {
            top_logprobs(logits, sequence.request.top_logprobs)
        } else {
            Vec::new()
        };
        let mut candidates = logits.to_vec();
        let id = sequence.sampler.sample(&mut candidates);
        // The same value as in `top` when the token is listed there (exact softmax).
        let logprob = top
            .iter()
            .find(|&&(token, _)| token == id)
            .map_or_else(|| log_probability(logits, id), |&(_, value)| value);
        self.report(i, GeneratedToken { id, logprob, top })
    }

    /// True when sequence `i`'s next token is the plain argmax of its logits with nothing
    /// else asked of them (see [`Model::forward_greedy`]).
    fn takes_greedy_pick(&self, i: usize) -> bool {
        let sequence = &self.active[i];
        sequence.request.top_logprobs == 0 && sequence.sampler.is_plain_argmax()
    }

    /// Reports sequence `i`'s next token `token` (and the end, if it is the last one); true
    /// when the sequence is over, by the [`StopCondition`](crate::stop::StopCondition) that `generate` also ends with.
    fn report(&mut self, i: usize, token: GeneratedToken) -> bool {
        let context_size = self.context_size;
        let sequence = &mut self.active[i];
        let GeneratedToken { id, logprob, top } = token;
        sequence.sampler.accept(id);
        sequence.generated += 1;
        let delivered =
            sequence
                .sink
                .send(SequenceEvent::Token(GeneratedToken { id, logprob, top }));
        let stop_condition = sequence.request.stop_condition(context_size);
        match stop_condition.after_token(id, delivered, sequence.generated, sequence.n_past) {
            None => {
                sequence.next = Some(id);
                false
            }
            Some(stop) => {
                sequence.next = None;
                sequence.sink.send(SequenceEvent::Finished {
                    stop,
                    prompt_tokens: sequence.request.prompt.len(),
                    generated_tokens: sequence.generated,
                });
                true
            }
        }
    }

    /// Removes the sequences at `indices` (any order, no duplicates).
    fn remove_all(&mut self, mut indices: Vec<usize>) {
        indices.sort_unstable();
        for &i in indices.iter().rev() {
            self.remove(i);
        }
    }

    /// Frees sequence `i`'s blocks and commitment.
    fn remove(&mut self, i: usize) {
        let mut sequence = self.active.remove(i);
        self.blocks.release(&mut sequence.block_table);
        self.committed -= sequence.commitment;
    }
}
