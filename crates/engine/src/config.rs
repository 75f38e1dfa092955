//! The engine's settings in one struct: the KV cache (its cells, element type and block
//! size), the prompt batch, and the scheduler's limits. A [`Session`](crate::Session), the
//! [`Scheduler`](crate::scheduler::Scheduler) and the CLI's flags all read [`EngineConfig`].

use runit_backend::KvType;
use runit_model::{KvState, Model};

use crate::kv_blocks::BlockAllocator;
use crate::window::WindowRings;
use crate::EngineError;

/// Engine settings; [`EngineConfig::DEFAULT`] holds the defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// KV cache cells (0 = the model's training context), capped at the training context: a
    /// session's context, or the cells that the scheduler's sequences share.
    pub context_size: usize,
    /// Most prompt tokens evaluated in one forward pass; longer prompts are split.
    pub batch_size: usize,
    /// Element type of the KV cache.
    pub kv_type: KvType,
    /// Cells per KV block, the unit in which sequences take cache cells.
    pub kv_block_size: usize,
    /// Most sequences the scheduler decodes at once (`--parallel`), and the most one
    /// request may ask for.
    pub max_sequences: usize,
    /// Most sequences waiting beyond those: the scheduler holds at most `max_sequences +
    /// max_queued` sequences, running or waiting, and refuses a request that would pass it.
    pub max_queued: usize,
    /// Windowed layers (Gemma 3's local ones) keep only their windows' cells, in rings
    /// reused as a sequence advances, where the backend runs passes op by op; `false` gives
    /// them the whole context like the other layers.
    pub window_rings: bool,
}

impl EngineConfig {
    /// The defaults: llama.cpp's context and batch (4096 and 512 tokens) and f16 cache,
    /// blocks of 16 cells, 4 sequences at once and 64 waiting.
    pub const DEFAULT: EngineConfig = EngineConfig {
        context_size: 4096,
        batch_size: 512,
        kv_type: KvType::F16,
        kv_block_size: 16,
        max_sequences: 4,
        max_queued: 64,
        window_rings: true,
    };

    /// The context in cells for `model`: `context_size`, or the training context when that
    /// is 0 or smaller.
    pub fn context_size_for(&self, model: &Model) -> usize {
        let trained = model.config.context_length;
        match self.context_size {
            0 => trained,
            n => n.min(trained),
        }
    }

    /// Checks the settings (every size at least 1) and allocates `model`'s KV cache in
    /// whole blocks covering the context, for up to `sequences` sequences at once: the
    /// windowed layers of a model that has them keep rings of their windows (`window`), on
    /// a backend that runs passes op by op (captured passes know one set of block tables).
    pub(crate) fn allocate_cache(
        &self,
        model: &Model,
        sequences: usize,
    ) -> Result<Cache, EngineError> {
        let context_size = self.context_size_for(model);
        for (name, value) in [
            ("batch_size", self.batch_size),
            ("max_sequences", self.max_sequences),
            ("context_size", context_size),
            ("kv_block_size", self.kv_block_size),
        ] {
            if value == 0 {
                return Err(EngineError::InvalidParameter {
                    name,
                    message: "must be at least 1".into(),
                });
            }
        }
        let n_blocks = context_size.div_ceil(self.kv_block_size);
        let window = model
            .config
            .layers()
            .iter()
            .filter_map(|layer| layer.sliding_window)
            .max();
        let windows = window
            .filter(|_| self.window_rings && model.backend.takes_window_spans())
            .and_then(|window| {
                let batch = self.batch_size.min(context_size);
                WindowRings::new(window, batch, self.kv_block_size, sequences, context_size)
            });
        let window_cells = windows.as_ref().map(WindowRings::cells);
        let n_cells = n_blocks * self.kv_block_size;
        let kv = KvState::with_windows(model, n_cells, window_cells, self.kv_type)?;
        Ok(Cache {
            kv,
            blocks: BlockAllocator::new(n_blocks, self.kv_block_size),
            windows,
            context_size,
        })
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig::DEFAULT
    }
}

/// A KV cache allocated for an [`EngineConfig`], with the pool of its blocks.
pub(crate) struct Cache {
    pub kv: KvState,
    pub blocks: BlockAllocator,
    /// The windowed layers' rings, when they keep only their windows.
    pub windows: Option<WindowRings>,
    /// Cells one sequence may use: the configured context, capped at the training context.
    pub context_size: usize,
}
