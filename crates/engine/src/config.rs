//! The engine's settings in one struct: the KV cache (its cells, element type and block
//! size, how the scheduler's pool is sized, prefix caching), the prompt batch, and the
//! scheduler's limits. A [`Session`](crate::Session), the
//! [`Scheduler`](crate::scheduler::Scheduler) and the CLI's flags all read [`EngineConfig`].

use runit_backend::{KvType, KvTypes};
use runit_model::{KvState, Model};

use crate::kv_blocks::BlockAllocator;
use crate::window::WindowRings;
use crate::EngineError;

/// Engine settings; [`EngineConfig::DEFAULT`] holds the defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// KV cache cells (0 = the model's training context), capped at the training context: a
    /// session's context, or the cells that the scheduler's sequences share (unless
    /// `device_memory_fraction` sizes them).
    pub context_size: usize,
    /// Most prompt tokens evaluated in one forward pass; longer prompts are split.
    pub batch_size: usize,
    /// Element types of the KV cache's keys and values.
    pub kv_types: KvTypes,
    /// Cells per KV block, the unit in which sequences take cache cells.
    pub kv_block_size: usize,
    /// Most sequences the scheduler decodes at once (`--parallel`), and the most one
    /// request may ask for.
    pub max_sequences: usize,
    /// Most sequences waiting beyond those: the scheduler holds at most `max_sequences +
    /// max_queued` sequences, running or waiting, and refuses a request that would pass it.
    pub max_queued: usize,
    /// Whether the scheduler keeps full prompt blocks for later prompts that begin alike
    /// (off for a model whose windowed layers keep rings: their cells are overwritten).
    pub prefix_cache: bool,
    /// On a backend with device memory, the share of the memory free after the weights and
    /// the step buffers that the scheduler's KV pool takes (vLLM's `--gpu-memory-fraction`);
    /// each sequence may then use `context_size` cells of it (0: the training context).
    /// `None`, or a host backend: the pool holds `context_size` cells.
    pub device_memory_fraction: Option<f64>,
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
        kv_types: KvTypes::uniform(KvType::F16),
        kv_block_size: 16,
        max_sequences: 4,
        max_queued: 64,
        prefix_cache: true,
        device_memory_fraction: None,
        window_rings: true,
    };

    /// vLLM's default share of device memory for the KV pool.
    pub const DEFAULT_DEVICE_MEMORY_FRACTION: f64 = 0.9;

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
    /// whole blocks covering the context, for up to `sequences` sequences at once: a
    /// session's (`pool: false`), or the scheduler's pool (`pool: true`: sized from device
    /// memory when `device_memory_fraction` asks, else `context_size` cells even past the
    /// training context, caching prefixes when `prefix_cache` does). The cache's
    /// `context_size` is the most one sequence may use (at most the training context).
    /// The windowed layers of a model that has them keep rings of their windows (`windows`),
    /// on a backend that takes window spans; such a pool caches no prefixes.
    pub(crate) fn allocate_cache(
        &self,
        model: &Model,
        pool: bool,
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
        // A pool shared by sequences holds all the cells asked for (as llama.cpp's `-c` with
        // `-np`); only each sequence stops at the training context.
        let cells = if pool && self.context_size > 0 {
            self.context_size
        } else {
            context_size
        };
        let n_blocks = match (self.device_memory_fraction, pool) {
            (Some(fraction), true) => self.blocks_in_device_memory(model, fraction)?,
            _ => None,
        }
        .unwrap_or_else(|| cells.div_ceil(self.kv_block_size));
        let context_size = context_size.min(n_blocks * self.kv_block_size);
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
        let kv = KvState::with_windows(model, n_cells, window_cells, self.kv_types)?;
        let blocks = if pool && self.prefix_cache && windows.is_none() {
            BlockAllocator::with_prefix_cache(n_blocks, self.kv_block_size)
        } else {
            BlockAllocator::new(n_blocks, self.kv_block_size)
        };
        Ok(Cache {
            kv,
            blocks,
            windows,
            context_size,
        })
    }

    /// The KV blocks that `fraction` of the backend's free device memory holds; `None` on a
    /// host backend. Refuses a fraction outside (0, 1] and memory too small for one block.
    fn blocks_in_device_memory(
        &self,
        model: &Model,
        fraction: f64,
    ) -> Result<Option<usize>, EngineError> {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(EngineError::InvalidParameter {
                name: "device_memory_fraction",
                message: format!("expected a share in (0, 1], found {fraction}"),
            });
        }
        let Some(free) = model.backend.memory_available() else {
            return Ok(None);
        };
        // Keys and values of every layer.
        let block_bytes = KvState::token_bytes(model, self.kv_types)? * self.kv_block_size;
        blocks_in_memory(free, fraction, block_bytes).map(Some)
    }
}

/// The blocks of `block_bytes` that `fraction` of `free` bytes holds (at most `u32::MAX`, the
/// block numbers' range); refuses memory too small for one block.
fn blocks_in_memory(free: usize, fraction: f64, block_bytes: usize) -> Result<usize, EngineError> {
    let budget = (free as f64 * fraction) as usize;
    let blocks = (budget / block_bytes.max(1)).min(u32::MAX as usize);
    if blocks == 0 {
        return Err(EngineError::InvalidParameter {
            name: "device_memory_fraction",
            message: format!(
                "{fraction} of the {free} bytes free holds no KV block of {block_bytes} bytes"
            ),
        });
    }
    Ok(blocks)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_share_is_cut_into_whole_blocks() {
        // 10 GB free, 0.9 of it, blocks of 1 MiB.
        let blocks = blocks_in_memory(10_000_000_000, 0.9, 1 << 20).expect("room");
        assert_eq!(blocks, 9_000_000_000 / (1 << 20));
        assert!(matches!(
            blocks_in_memory(1000, 0.9, 4096),
            Err(EngineError::InvalidParameter {
                name: "device_memory_fraction",
                ..
            })
        ));
    }
}
