//! A single-sequence session: a model, its KV cache and evaluation buffers, fed prompt
//! chunks and generated tokens one step at a time.

use std::sync::Arc;

use runit_backend::{Pick, SequenceSpan};
use runit_model::{Batch, KvState, LayerObserver, Model, Scratch};

use crate::kv_blocks::BlockAllocator;
use crate::window::WindowRings;
use crate::{EngineConfig, EngineError};

/// What [`Session::run_chunks`] runs for each chunk: a forward pass of the batch.
pub(crate) type ChunkPass<'a> = dyn FnMut(&Model, &Batch<'_>, &mut KvState, &mut Scratch) -> Result<(), runit_model::ModelError>
    + 'a;

/// Which rows of a pass get logits (or hidden states) in [`Session::run_chunks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogitRows {
    /// The last token's.
    Last,
    /// Every token's.
    Every,
    /// Every token's, in one pass whose rows are each computed as if alone
    /// (`Batch::rows_alone`): speculative verification.
    Verify,
}

/// One sequence being evaluated.
pub struct Session {
    model: Arc<Model>,
    kv: KvState,
    scratch: Scratch,
    blocks: BlockAllocator,
    block_table: Vec<u32>,
    /// The windowed layers' ring and its blocks, when they keep only their windows.
    windows: Option<(WindowRings, Vec<u32>)>,
    n_past: usize,
    context_size: usize,
    logits: Vec<f32>,
    /// Logits of the last forward pass, kept between steps so a decode step allocates none.
    chunk_logits: Vec<f32>,
}

impl Session {
    /// A session over `model` with the cache, context and batch of `config` (the context is
    /// capped at the model's training context).
    pub fn new(model: Arc<Model>, config: &EngineConfig) -> Result<Session, EngineError> {
        let cache = config.allocate_cache(&model, false, 1)?;
        let scratch = Scratch::new(&model, config.batch_size.min(cache.context_size))?;
        Ok(Session {
            model,
            kv: cache.kv,
            scratch,
            blocks: cache.blocks,
            block_table: Vec::new(),
            windows: cache.windows.map(|rings| (rings, Vec::new())),
            n_past: 0,
            context_size: cache.context_size,
            logits: Vec::new(),
            chunk_logits: Vec::new(),
        })
    }

    /// The model the session evaluates.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Tokens already in the cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Cells of the session's context.
    pub fn context_size(&self) -> usize {
        self.context_size
    }

    /// Bytes of the session's KV cache: every layer's keys and values (windowed layers
    /// hold only their rings when they keep only their windows).
    pub fn kv_cache_bytes(&self) -> usize {
        self.kv.bytes
    }

    /// Cells a windowed layer keeps for the sequence, when the windowed layers keep only
    /// their windows.
    pub fn window_ring_cells(&self) -> Option<usize> {
        self.windows.as_ref().map(|(rings, _)| rings.ring_cells())
    }

    /// Forgets the sequence (the cache is reused).
    pub fn reset(&mut self) {
        self.blocks.release(&mut self.block_table);
        if let Some((rings, ring)) = &mut self.windows {
            rings.release(ring);
        }
        self.n_past = 0;
    }

    /// Rolls the cache back to its first `n_past` positions (a draft's rejected tokens):
    /// the blocks past them return to the pool. Windowed layers' rings need nothing: a
    /// ring holds a batch beyond the window, so a pass never overwrote a cell the kept
    /// positions still attend to.
    pub fn truncate(&mut self, n_past: usize) -> Result<(), EngineError> {
        if n_past > self.n_past {
            return Err(EngineError::InvalidParameter {
                name: "n_past",
                message: format!(
                    "cannot roll {} cached positions forward to {n_past}",
                    self.n_past
                ),
            });
        }
        self.blocks.truncate(&mut self.block_table, n_past);
        self.n_past = n_past;
        Ok(())
    }

    /// Most tokens one pass evaluates (the batch size).
    pub fn batch_capacity(&self) -> usize {
        self.scratch.capacity
    }

    /// Evaluates `tokens` after those already cached, in chunks of the batch size, and
    /// returns the logits of the last token (`all_logits`: of every token, `[tokens, vocab]`).
    pub fn eval(
        &mut self,
        tokens: &[u32],
        all_logits: bool,
        observer: Option<&mut (dyn LayerObserver + '_)>,
    ) -> Result<&[f32], EngineError> {
        let rows = match all_logits {
            true => LogitRows::Every,
            false => LogitRows::Last,
        };
        self.eval_rows(tokens, rows, observer)
    }

    /// Evaluates `tokens` (at most [`Session::batch_capacity`]) in one pass whose every row
    /// gets the numbers a one-token step would give it, and returns every row's logits
    /// (`[tokens, vocab]`): a speculative draft's verification.
    pub fn verify(&mut self, tokens: &[u32]) -> Result<&[f32], EngineError> {
        self.eval_rows(tokens, LogitRows::Verify, None)
    }

    fn eval_rows(
        &mut self,
        tokens: &[u32],
        rows: LogitRows,
        mut observer: Option<&mut (dyn LayerObserver + '_)>,
    ) -> Result<&[f32], EngineError> {
        let vocab = self.model.config.vocab_size;
        let all_logits = rows != LogitRows::Last;
        let mut collected = Vec::new();
        let mut chunk_logits = std::mem::take(&mut self.chunk_logits);
        let ran = self.run_chunks(tokens, rows, &mut |model, batch, kv, scratch| {
            model.forward(
                batch,
                kv,
                scratch,
                &mut chunk_logits,
                observer.as_deref_mut(),
            )?;
            if all_logits {
                collected.extend_from_slice(&chunk_logits[..batch.tokens.len() * vocab]);
            }
            Ok(())
        });
        if ran.is_ok() {
            if all_logits {
                self.logits = collected;
            } else {
                self.logits.clear();
                self.logits.extend_from_slice(&chunk_logits[..vocab]);
            }
        }
        self.chunk_logits = chunk_logits;
        ran?;
        Ok(&self.logits)
    }

    /// Evaluates `tokens` as [`Session::eval`] does and returns the greedy [`Pick`] of the
    /// last token (its largest logit and that token's log-probability), picked where the
    /// logits are: on a GPU, two numbers cross to the host instead of the vocabulary.
    pub fn eval_greedy(&mut self, tokens: &[u32]) -> Result<Pick, EngineError> {
        self.picks(tokens, LogitRows::Last)?
            .pop()
            .ok_or(EngineError::InvalidParameter {
                name: "tokens",
                message: "no logits were computed".into(),
            })
    }

    /// [`Session::verify`], returning each row's greedy [`Pick`] (as [`Session::eval_greedy`]
    /// picks) instead of its logits.
    pub fn verify_greedy(&mut self, tokens: &[u32]) -> Result<Vec<Pick>, EngineError> {
        self.picks(tokens, LogitRows::Verify)
    }

    fn picks(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Vec<Pick>, EngineError> {
        let mut picks = Vec::new();
        self.run_chunks(tokens, rows, &mut |model, batch, kv, scratch| {
            if batch.logit_rows.is_empty() {
                model.forward(batch, kv, scratch, &mut Vec::new(), None)?;
            } else {
                picks = model.forward_greedy(batch, kv, scratch, true)?;
            }
            Ok(())
        })?;
        Ok(picks)
    }

    /// Runs `tokens` through `pass` chunk by chunk (each a [`Batch`] whose logit rows are
    /// those `rows` names), reserving cache blocks and advancing the position.
    pub(crate) fn run_chunks(
        &mut self,
        tokens: &[u32],
        rows: LogitRows,
        pass: &mut ChunkPass<'_>,
    ) -> Result<(), EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::InvalidParameter {
                name: "tokens",
                message: "nothing to evaluate".into(),
            });
        }
        if rows == LogitRows::Verify && tokens.len() > self.scratch.capacity {
            return Err(EngineError::InvalidParameter {
                name: "tokens",
                message: format!(
                    "a verification pass of {} tokens exceeds the batch of {}",
                    tokens.len(),
                    self.scratch.capacity
                ),
            });
        }
        let end = self.n_past + tokens.len();
        if end > self.context_size {
            return Err(EngineError::ContextFull {
                needed: end,
                context: self.context_size,
            });
        }
        if !self.blocks.reserve(&mut self.block_table, end) {
            return Err(EngineError::ContextFull {
                needed: end,
                context: self.context_size,
            });
        }
        if let Some((rings, ring)) = &mut self.windows {
            let taken = rings.take(ring);
            assert!(taken, "a session's one ring is always free");
        }
        let chunk_size = self.scratch.capacity;
        for chunk in tokens.chunks(chunk_size) {
            let start = self.n_past;
            let positions: Vec<u32> = (start..start + chunk.len()).map(|p| p as u32).collect();
            let is_last = start + chunk.len() == end;
            let logit_rows: Vec<u32> = if rows != LogitRows::Last {
                (0..chunk.len() as u32).collect()
            } else if is_last {
                vec![chunk.len() as u32 - 1]
            } else {
                Vec::new()
            };
            let spans = [SequenceSpan {
                first_row: 0,
                rows: chunk.len(),
                start_position: start,
                block_table: self.block_table.clone(),
                block_size: self.blocks.block_size(),
            }];
            let window_spans = self
                .windows
                .as_ref()
                .map(|(_, ring)| [WindowRings::span(ring, &spans[0])]);
            let batch = Batch {
                tokens: chunk,
                positions: &positions,
                spans: &spans,
                window_spans: window_spans.as_ref().map(|spans| &spans[..]),
                logit_rows: &logit_rows,
                rows_alone: rows == LogitRows::Verify,
            };
            pass(&self.model, &batch, &mut self.kv, &mut self.scratch)?;
            self.n_past = start + chunk.len();
        }
        Ok(())
    }
}
