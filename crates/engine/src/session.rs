//! A single-sequence session: a model, its KV cache and evaluation buffers, fed prompt
//! chunks and generated tokens one step at a time.

use std::sync::Arc;

use runit_backend::{KvType, SequenceSpan};
use runit_model::{Batch, KvState, LayerObserver, Model, Scratch};

use crate::kv_blocks::BlockAllocator;
use crate::EngineError;

/// Session settings; see `impl Default` for the defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionConfig {
    /// Token slots in the KV cache (0 = the model's training context).
    pub context_size: usize,
    /// Most tokens evaluated in one forward pass; longer prompts are split.
    pub batch_size: usize,
    pub kv_type: KvType,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            context_size: 4096,
            batch_size: 512,
            kv_type: KvType::F16,
        }
    }
}

/// Cells per KV block.
const BLOCK_SIZE: usize = 16;

/// One sequence being evaluated.
pub struct Session {
    model: Arc<Model>,
    kv: KvState,
    scratch: Scratch,
    blocks: BlockAllocator,
    block_table: Vec<u32>,
    n_past: usize,
    context_size: usize,
    logits: Vec<f32>,
    /// Logits of the last forward pass, kept between steps so a decode step allocates none.
    chunk_logits: Vec<f32>,
}

impl Session {
    /// A session over `model`; the context is capped at the model's training context.
    pub fn new(model: Arc<Model>, config: &SessionConfig) -> Result<Session, EngineError> {
        let trained = model.config.context_length;
        let context_size = match config.context_size {
            0 => trained,
            n => n.min(trained),
        };
        if config.batch_size == 0 {
            return Err(EngineError::InvalidParameter {
                name: "batch_size",
                message: "must be at least 1".into(),
            });
        }
        let n_blocks = context_size.div_ceil(BLOCK_SIZE);
        let kv = KvState::new(&model, n_blocks * BLOCK_SIZE, config.kv_type)?;
        let scratch = Scratch::new(&model, config.batch_size.min(context_size))?;
        Ok(Session {
            model,
            kv,
            scratch,
            blocks: BlockAllocator::new(n_blocks, BLOCK_SIZE),
            block_table: Vec::new(),
            n_past: 0,
            context_size,
            logits: Vec::new(),
            chunk_logits: Vec::new(),
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Tokens already in the cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    pub fn context_size(&self) -> usize {
        self.context_size
    }

    /// Forgets the sequence (the cache is reused).
    pub fn reset(&mut self) {
        self.blocks.release(&mut self.block_table);
        self.n_past = 0;
    }

    /// Evaluates `tokens` after those already cached, in chunks of the batch size, and
    /// returns the logits of the last token (`all_logits`: of every token, `[tokens, vocab]`).
    pub fn eval(
        &mut self,
        tokens: &[u32],
        all_logits: bool,
        mut observer: Option<&mut (dyn LayerObserver + '_)>,
    ) -> Result<&[f32], EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::InvalidParameter {
                name: "tokens",
                message: "nothing to evaluate".into(),
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
        let vocab = self.model.config.vocab_size;
        let mut collected = Vec::new();
        let mut chunk_logits = std::mem::take(&mut self.chunk_logits);
        let chunk_size = self.scratch.capacity;
        for chunk in tokens.chunks(chunk_size) {
            let start = self.n_past;
            let positions: Vec<u32> = (start..start + chunk.len()).map(|p| p as u32).collect();
            let is_last = start + chunk.len() == end;
            let logit_rows: Vec<u32> = if all_logits {
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
                block_size: BLOCK_SIZE,
            }];
            let batch = Batch {
                tokens: chunk,
                positions: &positions,
                spans: &spans,
                logit_rows: &logit_rows,
            };
            self.model.forward(
                &batch,
                &mut self.kv,
                &mut self.scratch,
                &mut chunk_logits,
                observer.as_deref_mut(),
            )?;
            self.n_past = start + chunk.len();
            if all_logits {
                collected.extend_from_slice(&chunk_logits[..chunk.len() * vocab]);
            }
        }
        if all_logits {
            self.logits = collected;
        } else {
            self.logits.clear();
            self.logits.extend_from_slice(&chunk_logits[..vocab]);
        }
        self.chunk_logits = chunk_logits;
        Ok(&self.logits)
    }
}
