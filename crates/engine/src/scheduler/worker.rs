//! The scheduler thread: admits queued requests while the cache can hold them (sharing the
//! cached blocks their prompts begin with), then runs steps of one batched decode pass
//! (every sequence with a token to evaluate) and one prefill pass of at most one chunk budget
//! of prompt tokens (chosen by [`plan_pass`]), sampling and reporting tokens, caching full
//! prompt blocks and freeing the blocks of finished sequences.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use runit_backend::{Pick, Sampled, SequenceSpan};
use runit_model::{Batch, KvState, Model, Scratch};

use super::metrics::SchedulerMetrics;
use super::policy::{plan_pass, PromptProgress};
use super::prefix::{cached_prefix, register_prompt_blocks};
use super::{EventSink, Pending, Request, SequenceEvent, Shared, MAX_DECODE_ROWS};
use crate::config::Cache;
use crate::kv_blocks::BlockAllocator;
use crate::sampler::{log_probability, top_logprobs, SAMPLING_FAILED};
use crate::speculative::Speculation;
use crate::window::WindowRings;
use crate::{GeneratedToken, Sampler};

/// An admitted sequence.
struct Sequence {
    request: Request,
    sampler: Sampler,
    /// Its drafter, when it speculates.
    speculation: Option<Speculation>,
    /// The prompt and the tokens generated so far (what the drafter reads).
    history: Vec<u32>,
    sink: Box<dyn EventSink>,
    /// Prompt tokens already in the cache.
    prefilled: usize,
    /// Prompt tokens whose cells the prefix cache gave at admission.
    cached: usize,
    /// Positions in the cache.
    n_past: usize,
    /// The latest sampled token, not yet evaluated.
    next: Option<u32>,
    generated: usize,
    block_table: Vec<u32>,
    /// The windowed layers' ring, when they keep only their windows (`crate::window`).
    window_ring: Vec<u32>,
    /// Blocks of its own (not shared at admission) set aside for the sequence's longest
    /// possible run.
    commitment: usize,
    /// Blocks of its own taken so far (at most `commitment`).
    taken: usize,
    /// Leading blocks of `block_table` in the prefix cache; `None` once one could not be
    /// cached (the blocks after it are not cached either).
    indexed: Option<usize>,
    /// Prefill passes in a row that have left the prompt out.
    skipped: usize,
    /// When the request was submitted.
    submitted: Instant,
    /// When the sequence's latest token was reported.
    last_token: Option<Instant>,
}

/// What a decode pass gave each of its rows.
enum Picked {
    /// Greedy picks made where the logits are.
    Greedy(Vec<Pick>),
    /// Tokens sampled where the logits are.
    Sampled(Vec<Sampled>),
    /// The logits, in `Worker::logits`, for the host's sampler.
    Logits,
}

/// Everything the scheduler thread owns.
pub(super) struct Worker {
    model: Arc<Model>,
    kv: KvState,
    scratch: Scratch,
    blocks: BlockAllocator,
    /// The windowed layers' rings, when they keep only their windows.
    windows: Option<WindowRings>,
    context_size: usize,
    /// Prompt tokens per forward pass (the chunk size of `Session::eval`).
    chunk_size: usize,
    max_sequences: usize,
    waiting: VecDeque<Pending>,
    active: Vec<Sequence>,
    /// Blocks the active sequences may still take (their commitments less what they have
    /// taken); never above the blocks that can be taken.
    promised: usize,
    metrics: SchedulerMetrics,
    /// Seconds of the current step's forward passes, and of their host part.
    pass_time: (f64, f64),
    logits: Vec<f32>,
    /// The queue and the figures shared with the [`Scheduler`](super::Scheduler) handle.
    shared: Arc<Shared>,
}

impl Worker {
    pub(super) fn new(
        model: Arc<Model>,
        cache: Cache,
        scratch: Scratch,
        chunk_size: usize,
        max_sequences: usize,
        shared: Arc<Shared>,
    ) -> Worker {
        Worker {
            model,
            kv: cache.kv,
            scratch,
            blocks: cache.blocks,
            windows: cache.windows,
            context_size: cache.context_size,
            chunk_size,
            max_sequences,
            waiting: VecDeque::new(),
            active: Vec::new(),
            promised: 0,
            metrics: SchedulerMetrics::default(),
            pass_time: (0.0, 0.0),
            logits: Vec::new(),
            shared,
        }
    }

    /// The thread's loop: wait for work, step, publish stats; on shutdown fail what is left.
    pub(super) fn run(mut self) {
        let shared = Arc::clone(&self.shared);
        loop {
            {
                let mut state = shared.lock();
                loop {
                    self.waiting.extend(state.incoming.drain(..));
                    state.stats.queued = self.waiting.len();
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
            self.publish(0);
        }
        let mut sinks: Vec<Box<dyn EventSink>> =
            self.waiting.drain(..).map(|pending| pending.sink).collect();
        sinks.extend(self.active.drain(..).map(|sequence| sequence.sink));
        self.publish(sinks.len());
        for mut sink in sinks {
            sink.send(SequenceEvent::Failed("the scheduler stopped".into()));
        }
    }

    /// Publishes the load to the handle after `ended` sequences have ended (their places
    /// are free from now on) and wakes whoever waits for progress.
    fn publish(&self, ended: usize) {
        let mut state = self.shared.lock();
        state.held -= ended;
        state.stats.free_blocks = self.blocks.free_blocks();
        state.stats.active = self.active.len();
        state.stats.queued = self.waiting.len();
        state.metrics.clone_from(&self.metrics);
        state.metrics.cached_blocks = self.blocks.idle_cached_blocks();
        state.metrics.evicted_blocks = self.blocks.evicted_blocks();
        drop(state);
        self.shared.progress.notify_all();
    }

    /// One step: drop cancelled sequences, admit, decode, evaluate one prefill pass; its
    /// time and its passes' time counted in the metrics.
    fn step(&mut self) {
        let started = Instant::now();
        self.pass_time = (0.0, 0.0);
        self.run_step();
        let (pass, submit) = self.pass_time;
        self.metrics
            .step(started.elapsed().as_secs_f64(), pass, submit);
    }

    fn run_step(&mut self) {
        let mut cancelled = Vec::new();
        for (i, sequence) in self.active.iter().enumerate() {
            if sequence.sink.is_closed() {
                cancelled.push(i);
            }
        }
        let waiting = self.waiting.len();
        self.waiting.retain(|pending| !pending.sink.is_closed());
        let cancelled_waiting = waiting - self.waiting.len();
        for &i in cancelled.iter().rev() {
            self.remove(i);
        }
        let admitted = self.admit();
        if cancelled_waiting + cancelled.len() + admitted > 0 {
            self.publish(cancelled_waiting + cancelled.len());
        }
        self.decode();
        self.prefill();
    }

    /// Admits waiting requests in order while there is a free slot and the cache can hold
    /// their longest run (less the cached blocks their prompts begin with) next to what the
    /// active sequences may still take; returns how many.
    fn admit(&mut self) -> usize {
        let mut admitted = 0;
        let mut failed = Vec::new();
        while self.active.len() < self.max_sequences {
            let Some(pending) = self.waiting.front() else {
                break;
            };
            let request = &pending.request;
            let longest = (request.prompt.len() + request.max_tokens).min(self.context_size);
            let shared = cached_prefix(&self.blocks, &request.prompt, self.chunk_size);
            let commitment = longest.div_ceil(self.blocks.block_size()) - shared.len();
            // Sharing an idle cached block takes it out of the blocks that can be taken.
            let pinned = self.blocks.idle_among(&shared);
            if self.promised + commitment + pinned > self.blocks.free_blocks() {
                break;
            }
            let Pending {
                request,
                mut sampler,
                mut speculation,
                sink,
                submitted,
            } = self.waiting.pop_front().expect("front exists");
            // A draft model reads the prompt now (prompt lookup needs nothing).
            let prepared = match &mut speculation {
                Some(speculation) => speculation.drafter.prepare(&request.prompt),
                None => Ok(()),
            };
            if let Err(error) = prepared {
                failed.push((
                    self.active.len(),
                    SequenceEvent::Failed(format!("drafting failed: {error}")),
                ));
            }
            for &token in &request.prompt {
                sampler.accept(token);
            }
            let mut block_table = Vec::new();
            self.blocks.share(&mut block_table, &shared);
            let reused = shared.len() * self.blocks.block_size();
            self.metrics.admit(request.prompt.len(), reused);
            self.promised += commitment;
            let mut window_ring = Vec::new();
            if let Some(rings) = &mut self.windows {
                let taken = rings.take(&mut window_ring);
                assert!(taken, "a ring for each of max_sequences sequences");
            }
            self.active.push(Sequence {
                history: if speculation.is_some() {
                    request.prompt.clone()
                } else {
                    Vec::new()
                },
                request,
                sampler,
                speculation,
                sink,
                prefilled: reused,
                cached: reused,
                n_past: reused,
                next: None,
                generated: 0,
                block_table,
                window_ring,
                commitment,
                taken: 0,
                indexed: Some(shared.len()),
                skipped: 0,
                submitted,
                last_token: None,
            });
            admitted += 1;
        }
        self.end_all(failed);
        admitted
    }

    /// Evaluates the pending token of every decoding sequence, with its drafts when it
    /// speculates, in passes of at most `MAX_DECODE_ROWS` rows, and samples each one's next
    /// tokens: one, or the drafts it keeps and one more.
    fn decode(&mut self) {
        let group_rows = MAX_DECODE_ROWS.min(self.scratch.capacity);
        let mut finished = Vec::new();
        // (sequence, drafts) of every decoding sequence.
        let mut ready = Vec::new();
        for i in 0..self.active.len() {
            if self.active[i].next.is_none() {
                continue;
            }
            match self.draft(i, group_rows - 1) {
                Ok(drafts) => ready.push((i, drafts)),
                Err(error) => {
                    let failed = SequenceEvent::Failed(format!("drafting failed: {error}"));
                    finished.push((i, failed));
                }
            }
        }
        let mut group = Vec::new();
        let mut rows = 0;
        for (i, drafts) in ready {
            if rows + 1 + drafts.len() > group_rows {
                self.decode_group(&std::mem::take(&mut group), &mut finished);
                rows = 0;
            }
            rows += 1 + drafts.len();
            group.push((i, drafts));
        }
        if !group.is_empty() {
            self.decode_group(&group, &mut finished);
        }
        self.end_all(finished);
    }

    /// Sequence `i`'s drafts for this step, at most `room` (none when it does not
    /// speculate): no more than fit the context and the tokens it may still generate.
    fn draft(&mut self, i: usize, room: usize) -> Result<Vec<u32>, crate::EngineError> {
        let context_size = self.context_size;
        let sequence = &mut self.active[i];
        let Some(speculation) = &mut sequence.speculation else {
            return Ok(Vec::new());
        };
        let room = room
            .min(context_size.saturating_sub(sequence.n_past + 2))
            .min(
                sequence
                    .request
                    .max_tokens
                    .saturating_sub(sequence.generated + 1),
            );
        speculation.next_draft(&sequence.history, room)
    }

    /// One decode pass of `group`'s sequences (each its pending token and its drafts);
    /// a pass that verifies drafts computes every row as if alone, so greedy tokens are
    /// those of plain decoding.
    fn decode_group(
        &mut self,
        group: &[(usize, Vec<u32>)],
        finished: &mut Vec<(usize, SequenceEvent)>,
    ) {
        let mut tokens = Vec::new();
        let mut positions = Vec::new();
        let mut spans = Vec::with_capacity(group.len());
        for (i, drafts) in group {
            let n_past = self.active[*i].n_past;
            let rows = 1 + drafts.len();
            spans.push(self.span(*i, tokens.len(), n_past, n_past + rows));
            tokens.push(self.active[*i].next.expect("ready sequences have a token"));
            tokens.extend_from_slice(drafts);
            positions.extend((n_past..n_past + rows).map(|p| p as u32));
        }
        let logit_rows: Vec<u32> = (0..tokens.len() as u32).collect();
        let window_spans = self.window_spans(group.iter().map(|(i, _)| *i).zip(&spans));
        let batch = Batch {
            tokens: &tokens,
            positions: &positions,
            spans: &spans,
            window_spans: window_spans.as_deref(),
            logit_rows: &logit_rows,
            rows_alone: tokens.len() > group.len(),
        };
        // Every row plain greedy: pick where the logits are (a GPU downloads two numbers
        // per row instead of the vocabulary); the picks equal the host's argmax. Else, when
        // every row can be, sample where the logits are (the tokens equal the host
        // sampler's); else download the logits for the host's sampler.
        let greedy = group.iter().all(|(i, _)| self.takes_greedy_pick(*i));
        let sampled = !greedy
            && group
                .iter()
                .all(|(i, drafts)| self.takes_sample_pick(*i, drafts.len()));
        // The log-probabilities only where some request reports them.
        let log_probabilities = group.iter().any(|(i, _)| self.active[*i].request.logprobs);
        let started = Instant::now();
        let picks = if greedy {
            self.model
                .forward_greedy(&batch, &mut self.kv, &mut self.scratch, log_probabilities)
                .map(Picked::Greedy)
        } else if sampled {
            self.forward_sample(&batch, group).map(Picked::Sampled)
        } else {
            let sampled: Vec<usize> = group.iter().map(|(i, _)| *i).collect();
            self.forward(&batch, &sampled).map(|()| Picked::Logits)
        };
        let seconds = started.elapsed().as_secs_f64();
        self.pass_time.0 += seconds;
        self.pass_time.1 += self.scratch.submit_seconds;
        let picks = match picks {
            Ok(picks) => picks,
            Err(error) => {
                for (i, _) in group {
                    let failed = SequenceEvent::Failed(format!("decode failed: {error}"));
                    finished.push((*i, failed));
                }
                return;
            }
        };
        let vocab = self.model.config.vocab_size;
        let logits = std::mem::take(&mut self.logits);
        let mut row = 0;
        for (i, drafts) in group {
            let start = self.active[*i].n_past;
            // Kept drafts, then the first token that is not the draft (the last row has
            // no draft, so its token always ends the sequence's rows).
            let mut kept = 0;
            for (j, draft) in drafts.iter().map(Some).chain([None]).enumerate() {
                self.active[*i].n_past = start + 1 + j;
                let draft = draft.copied();
                let (event, is_draft) = match &picks {
                    Picked::Greedy(picks) => {
                        let pick = picks[row + j];
                        let token = GeneratedToken {
                            id: pick.id,
                            logprob: f64::from(pick.logprob),
                            top: Vec::new(),
                        };
                        (self.report(*i, token), draft == Some(pick.id))
                    }
                    Picked::Sampled(picks) => self.emit_sampled(*i, picks[row + j], draft),
                    Picked::Logits => {
                        self.emit(*i, &logits[(row + j) * vocab..(row + j + 1) * vocab], draft)
                    }
                };
                kept += usize::from(is_draft);
                if let Some(event) = event {
                    finished.push((*i, event));
                    break;
                }
                if !is_draft {
                    break;
                }
            }
            row += 1 + drafts.len();
            self.settle_verification(*i, drafts.len(), kept, seconds);
            // A sequence that ended in this pass reports the counts with this verdict.
            if let Some((ended, SequenceEvent::Finished { speculation, .. })) = finished.last_mut()
            {
                if ended == i {
                    *speculation = self.active[*i].speculation.as_ref().map(|s| s.stats);
                }
            }
        }
        self.logits = logits;
    }

    /// After sequence `i` verified `drafted` drafts and kept `kept`: its cache rolls back
    /// past the rows it keeps (their blocks return to its commitment), and its speculation
    /// records the verdict and the pass's time.
    fn settle_verification(&mut self, i: usize, drafted: usize, kept: usize, seconds: f64) {
        let sequence = &mut self.active[i];
        let Some(speculation) = &mut sequence.speculation else {
            return;
        };
        speculation.length.record_pass(1 + drafted, seconds);
        if drafted == 0 {
            return;
        }
        speculation.record_verdict(drafted, kept);
        let before = sequence.block_table.len();
        self.blocks
            .truncate(&mut sequence.block_table, sequence.n_past);
        let returned = before - sequence.block_table.len();
        sequence.taken -= returned;
        self.promised += returned;
    }

    /// Evaluates, in one pass, the prompt chunks that [`plan_pass`] picks from the sequences
    /// whose prompts are not in the cache yet: at most `chunk_size` tokens, each chunk the
    /// one the sequence alone would evaluate next (as `Session::eval` cuts it), and each span
    /// of the pass attended and multiplied as if alone, so prompts share passes without
    /// changing anyone's numbers. The chunk that ends a prompt yields its first token.
    fn prefill(&mut self) {
        let prefilling: Vec<usize> = (0..self.active.len())
            .filter(|&i| self.active[i].prefilled < self.active[i].request.prompt.len())
            .collect();
        let progress: Vec<PromptProgress> = prefilling
            .iter()
            .map(|&i| {
                let sequence = &self.active[i];
                PromptProgress {
                    prompt_len: sequence.request.prompt.len(),
                    prefilled: sequence.prefilled,
                    skipped: sequence.skipped,
                }
            })
            .collect();
        // (sequence, first prompt position, end) of each chunk of the pass.
        let chunks: Vec<(usize, usize, usize)> = plan_pass(&progress, self.chunk_size)
            .into_iter()
            .map(|chunk| (prefilling[chunk.index], chunk.start, chunk.end))
            .collect();
        if chunks.is_empty() {
            return;
        }
        for &i in &prefilling {
            let sequence = &mut self.active[i];
            if chunks.iter().any(|&(chosen, ..)| chosen == i) {
                sequence.skipped = 0;
            } else {
                sequence.skipped += 1;
            }
        }
        let total = chunks.iter().map(|&(_, start, end)| end - start).sum();
        let mut tokens = Vec::with_capacity(total);
        let mut positions = Vec::with_capacity(total);
        let mut spans = Vec::with_capacity(chunks.len());
        let mut logit_rows = Vec::new();
        // The sequences whose prompts this pass ends, in the order of `logit_rows`.
        let mut ending = Vec::new();
        for &(i, start, end) in &chunks {
            spans.push(self.span(i, tokens.len(), start, end));
            let sequence = &self.active[i];
            tokens.extend_from_slice(&sequence.request.prompt[start..end]);
            positions.extend((start..end).map(|p| p as u32));
            if end == sequence.request.prompt.len() {
                logit_rows.push(tokens.len() as u32 - 1);
                ending.push(i);
            }
        }
        let window_spans = self.window_spans(chunks.iter().map(|&(i, ..)| i).zip(&spans));
        let batch = Batch {
            tokens: &tokens,
            positions: &positions,
            spans: &spans,
            window_spans: window_spans.as_deref(),
            logit_rows: &logit_rows,
            rows_alone: false,
        };
        let started = Instant::now();
        let evaluated = self.forward(&batch, &ending);
        self.pass_time.0 += started.elapsed().as_secs_f64();
        self.pass_time.1 += self.scratch.submit_seconds;
        if let Err(error) = evaluated {
            let failed = chunks
                .iter()
                .map(|&(i, ..)| (i, SequenceEvent::Failed(format!("prompt failed: {error}"))))
                .collect();
            self.end_all(failed);
            return;
        }
        for &(i, _, end) in &chunks {
            let sequence = &mut self.active[i];
            sequence.prefilled = end;
            sequence.n_past = end;
            register_prompt_blocks(
                &mut self.blocks,
                &sequence.block_table,
                &sequence.request.prompt[..end],
                sequence.request.prompt.len(),
                self.chunk_size,
                &mut sequence.indexed,
            );
        }
        let vocab = self.model.config.vocab_size;
        let logits = std::mem::take(&mut self.logits);
        let mut finished = Vec::new();
        for (row, &i) in ending.iter().enumerate() {
            if let (Some(last), _) = self.emit(i, &logits[row * vocab..(row + 1) * vocab], None) {
                finished.push((i, last));
            }
        }
        self.logits = logits;
        self.end_all(finished);
    }

    /// Grows sequence `i`'s block table to cover positions up to `end` (from its
    /// commitment) and returns the span of its positions `start..end` at batch row
    /// `first_row`.
    fn span(&mut self, i: usize, first_row: usize, start: usize, end: usize) -> SequenceSpan {
        let sequence = &mut self.active[i];
        let before = sequence.block_table.len();
        let reserved = self.blocks.reserve(&mut sequence.block_table, end);
        assert!(reserved, "commitments keep enough blocks free");
        let taken = sequence.block_table.len() - before;
        sequence.taken += taken;
        self.promised -= taken;
        SequenceSpan {
            first_row,
            rows: end - start,
            start_position: start,
            block_table: sequence.block_table.clone(),
            block_size: self.blocks.block_size(),
        }
    }

    /// Runs `batch` into `self.logits`. The grammar masks of `sampled` (the sequences that
    /// sample from this pass's logits) are computed meanwhile on a thread of their own: their
    /// states are known before the pass, and on a device backend the pass leaves the host's
    /// cores idle.
    fn forward(
        &mut self,
        batch: &Batch<'_>,
        sampled: &[usize],
    ) -> Result<(), runit_model::ModelError> {
        let Worker {
            model,
            kv,
            scratch,
            logits,
            active,
            ..
        } = self;
        let constrained: Vec<&mut Sequence> = active
            .iter_mut()
            .enumerate()
            .filter(|(i, sequence)| sampled.contains(i) && sequence.sampler.constraint().is_some())
            .map(|(_, sequence)| sequence)
            .collect();
        if constrained.is_empty() {
            return model.forward(batch, kv, scratch, logits, None);
        }
        std::thread::scope(|scope| {
            scope.spawn(move || {
                for sequence in constrained {
                    sequence.sampler.prepare_mask();
                }
            });
            model.forward(batch, kv, scratch, logits, None)
        })
    }

    /// Runs `batch` (the rows of `group`'s sequences) and samples each row's token where
    /// the logits are ([`Model::forward_sample`]), under its sampler's settings: the
    /// penalty window's counts and the biases go with each row, the uniform draws are taken
    /// on the host (one per sampled sequence; greedy rows take none).
    fn forward_sample(
        &mut self,
        batch: &Batch<'_>,
        group: &[(usize, Vec<u32>)],
    ) -> Result<Vec<Sampled>, runit_model::ModelError> {
        let mut penalized = Vec::with_capacity(group.len());
        let mut uniforms = Vec::with_capacity(group.len());
        for (i, _) in group {
            let sampler = &mut self.active[*i].sampler;
            penalized.push(sampler.penalty_counts());
            uniforms.push(sampler.take_uniform());
        }
        let mut sampling = Vec::with_capacity(batch.logit_rows.len());
        for (((i, drafts), counts), &uniform) in group.iter().zip(&penalized).zip(&uniforms) {
            let sampler = &self.active[*i].sampler;
            // A sequence with drafts is greedy (`takes_sample_pick`): its rows draw nothing.
            for _ in 0..1 + drafts.len() {
                sampling.push(sampler.row_sampling(counts, uniform));
            }
        }
        self.model
            .forward_sample(batch, &mut self.kv, &mut self.scratch, &sampling)
    }

    /// Reports sequence `i`'s token `sampled` where the logits are (see
    /// [`Worker::forward_sample`]), after the checks [`Sampler::sample`] makes; as
    /// [`Worker::emit`] (no log-probability: none was asked for).
    fn emit_sampled(
        &mut self,
        i: usize,
        sampled: Sampled,
        draft: Option<u32>,
    ) -> (Option<SequenceEvent>, bool) {
        let sequence = &mut self.active[i];
        let id = match sequence.sampler.commit_sampled(sampled) {
            Ok(id) => id,
            Err(error) => {
                sequence.next = None;
                let failed = SequenceEvent::Failed(format!("{SAMPLING_FAILED}: {error}"));
                return (Some(failed), false);
            }
        };
        let token = GeneratedToken {
            id,
            logprob: f64::NAN,
            top: Vec::new(),
        };
        (self.report(i, token), draft == Some(id))
    }

    /// Samples sequence `i`'s next token from `logits` and reports it; the sequence's last
    /// event when it is over, as `generate` decides it (see [`Worker::report`]).
    fn emit(
        &mut self,
        i: usize,
        logits: &[f32],
        draft: Option<u32>,
    ) -> (Option<SequenceEvent>, bool) {
        let sequence = &mut self.active[i];
        let top = if sequence.request.top_logprobs > 0 {
            top_logprobs(logits, sequence.request.top_logprobs)
        } else {
            Vec::new()
        };
        let mut candidates = logits.to_vec();
        let sampled = match draft {
            Some(draft) => sequence.sampler.sample_draft(&mut candidates, draft),
            None => sequence
                .sampler
                .sample(&mut candidates)
                .map(|id| (id, false)),
        };
        let (id, is_draft) = match sampled {
            Ok(sampled) => sampled,
            Err(error) => {
                sequence.next = None;
                let failed = SequenceEvent::Failed(format!("{SAMPLING_FAILED}: {error}"));
                return (Some(failed), false);
            }
        };
        // The same value as in `top` when the token is listed there (exact softmax).
        let logprob = top
            .iter()
            .find(|&&(token, _)| token == id)
            .map_or_else(|| log_probability(logits, id), |&(_, value)| value);
        (
            self.report(i, GeneratedToken { id, logprob, top }),
            is_draft,
        )
    }

    /// True when sequence `i`'s next token is the plain argmax of its logits with nothing
    /// else asked of them (see [`Model::forward_greedy`]).
    fn takes_greedy_pick(&self, i: usize) -> bool {
        let sequence = &self.active[i];
        sequence.request.top_logprobs == 0 && sequence.sampler.is_plain_argmax()
    }

    /// True when sequence `i`'s next token (with `drafts` drafts to verify) can be drawn
    /// where the logits are, equal to the host's draw (see [`Model::forward_sample`]): no
    /// log-probabilities asked for, and plain greedy, or else no drafts (speculative
    /// sampling needs the draft's probability; the penalty window of a draft's row holds
    /// the drafts before it) and a sampler that [`Sampler::samples_anywhere`] (no grammar).
    fn takes_sample_pick(&self, i: usize, drafts: usize) -> bool {
        let sequence = &self.active[i];
        let request = &sequence.request;
        let sampler = &sequence.sampler;
        !request.logprobs
            && request.top_logprobs == 0
            && (sampler.is_plain_argmax()
                || (drafts == 0 && sampler.samples_anywhere(self.model.config.vocab_size)))
    }

    /// Reports sequence `i`'s next token `token`; when the sequence is over, by the
    /// [`StopCondition`](crate::stop::StopCondition) that `generate` also ends with, returns
    /// its `Finished` event, which [`Worker::end_all`] sends once the sequence has ended.
    fn report(&mut self, i: usize, token: GeneratedToken) -> Option<SequenceEvent> {
        let context_size = self.context_size;
        let sequence = &mut self.active[i];
        let GeneratedToken { id, logprob, top } = token;
        sequence.sampler.accept(id);
        sequence.generated += 1;
        if sequence.speculation.is_some() {
            sequence.history.push(id);
        }
        let now = Instant::now();
        let since = now - sequence.last_token.unwrap_or(sequence.submitted);
        self.metrics.token(sequence.last_token.is_none(), since);
        sequence.last_token = Some(now);
        let delivered =
            sequence
                .sink
                .send(SequenceEvent::Token(GeneratedToken { id, logprob, top }));
        let stop_condition = sequence.request.stop_condition(context_size);
        match stop_condition.after_token(id, delivered, sequence.generated, sequence.n_past) {
            None => {
                sequence.next = Some(id);
                None
            }
            Some(stop) => {
                sequence.next = None;
                Some(SequenceEvent::Finished {
                    stop,
                    prompt_tokens: sequence.request.prompt.len(),
                    cached_tokens: sequence.cached,
                    generated_tokens: sequence.generated,
                    speculation: sequence
                        .speculation
                        .as_ref()
                        .map(|speculation| speculation.stats),
                })
            }
        }
    }

    /// Ends the sequences at the given indices (any order, no duplicates): frees their
    /// blocks and places, publishes the load, then sends each its last event, so a client
    /// that has seen its sequence end finds its place free.
    fn end_all(&mut self, mut endings: Vec<(usize, SequenceEvent)>) {
        if endings.is_empty() {
            return;
        }
        endings.sort_unstable_by_key(|&(i, _)| std::cmp::Reverse(i));
        let ended: Vec<(Box<dyn EventSink>, SequenceEvent)> = endings
            .into_iter()
            .map(|(i, event)| (self.remove(i), event))
            .collect();
        self.publish(ended.len());
        for (mut sink, event) in ended.into_iter().rev() {
            sink.send(event);
        }
    }

    /// The windowed layers' spans of `(sequence, span)` pairs, when they keep only their
    /// windows.
    fn window_spans<'s>(
        &self,
        spans: impl Iterator<Item = (usize, &'s SequenceSpan)>,
    ) -> Option<Vec<SequenceSpan>> {
        self.windows.as_ref()?;
        let span = |(i, span): (usize, &SequenceSpan)| {
            WindowRings::span(&self.active[i].window_ring, span)
        };
        Some(spans.map(span).collect())
    }

    /// Frees sequence `i`'s blocks and commitment; returns its sink.
    fn remove(&mut self, i: usize) -> Box<dyn EventSink> {
        let mut sequence = self.active.remove(i);
        self.blocks.release(&mut sequence.block_table);
        if let Some(rings) = &mut self.windows {
            rings.release(&mut sequence.window_ring);
        }
        self.promised -= sequence.commitment - sequence.taken;
        sequence.sink
    }
}
