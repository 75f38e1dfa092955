//! The buffers a forward pass works in: each layer's key and value caches, and the
//! activation scratch of a batch. Each set has a unique id: a captured pass is replayed only
//! on the very buffers it was recorded with.

use std::sync::atomic::{AtomicU64, Ordering};

use runit_backend::{BackendError, Buffer, KvCache, KvRole, KvTypes};

use crate::{Model, ModelError};

/// Per-layer key and value caches.
pub struct KvState {
    pub keys: Vec<KvCache>,
    pub values: Vec<KvCache>,
    /// Cells of the global layers' caches: the positions a sequence may reach.
    pub n_cells: usize,
    /// Cells of the windowed layers' caches when they hold only their windows (rings the
    /// batch's `window_spans` map positions into); `None` when they hold `n_cells` too.
    pub window_cells: Option<usize>,
    /// Bytes of every layer's keys and values.
    pub bytes: usize,
    /// The element types of the keys and the values.
    pub types: KvTypes,
    /// Unique id of these caches (part of a captured step's identity).
    pub(crate) id: u64,
}

/// Source of unique ids for scratch buffers and caches: a captured forward pass is only
/// replayed on the very buffers it was recorded with.
fn next_workspace_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl KvState {
    /// Caches of `n_cells` token slots for every layer of `model`.
    pub fn new(model: &Model, n_cells: usize, types: KvTypes) -> Result<KvState, ModelError> {
        KvState::with_windows(model, n_cells, None, types)
    }

    /// Bytes of one token's keys and values over every layer of `model` stored as `types`
    /// (refusing types the heads cannot be stored in: `KvTypes::check`).
    pub fn token_bytes(model: &Model, types: KvTypes) -> Result<usize, ModelError> {
        types.check(model.config.head_dim)?;
        let layer = types
            .token_bytes(model.config.kv_width())
            .expect("whole blocks: the head dimension is a multiple of the block size");
        Ok(layer * model.config.block_count)
    }

    /// Caches of `n_cells` token slots for the global layers of `model` and of
    /// `window_cells` (when given) for its windowed layers.
    pub fn with_windows(
        model: &Model,
        n_cells: usize,
        window_cells: Option<usize>,
        types: KvTypes,
    ) -> Result<KvState, ModelError> {
        let width = model.config.kv_width();
        let head_dim = model.config.head_dim;
        KvState::token_bytes(model, types)?;
        let row_bytes = types
            .token_bytes(width)
            .expect("checked by token_bytes: whole blocks");
        let layer_cells = |layer: &crate::LayerConfig| match (layer.sliding_window, window_cells) {
            (Some(_), Some(cells)) => cells,
            _ => n_cells,
        };
        // Refused before anything is allocated when it cannot fit: a host allocation of
        // zeroed pages succeeds and the process is killed only when they are touched.
        let bytes = model
            .config
            .layers()
            .iter()
            .try_fold(0usize, |total, layer| {
                let layer_bytes = layer_cells(layer).checked_mul(row_bytes)?;
                total.checked_add(layer_bytes)
            })
            .unwrap_or(usize::MAX);
        let available = if model.backend.reads_weights_from_host() {
            crate::resident::HostMemoryFacts::of_this_machine()
                .available
                .map(|a| usize::try_from(a).unwrap_or(usize::MAX))
        } else {
            model.backend.memory_available()
        };
        if let Some(available) = available.filter(|&available| bytes > available) {
            return Err(BackendError::OutOfMemory {
                backend: model.backend.name(),
                bytes,
                available,
            }
            .into());
        }
        let mut keys = Vec::with_capacity(model.config.block_count);
        let mut values = Vec::with_capacity(model.config.block_count);
        for (index, layer) in model.config.layers().iter().enumerate() {
            let cells = layer_cells(layer);
            let mut layer_keys =
                model
                    .backend
                    .alloc_kv(cells, width, head_dim, types.keys, KvRole::Keys)?;
            if types.keys.is_turbo() {
                let mean = &model.key_means()?[index];
                model.backend.center_keys(&mut layer_keys, mean)?;
            }
            keys.push(layer_keys);
            values.push(model.backend.alloc_kv(
                cells,
                width,
                head_dim,
                types.values,
                KvRole::Values,
            )?);
        }
        Ok(KvState {
            keys,
            values,
            n_cells,
            window_cells,
            bytes,
            types,
            id: next_workspace_id(),
        })
    }
}

/// Activation buffers for batches of up to `capacity` tokens, reused every step.
pub struct Scratch {
    pub capacity: usize,
    pub(crate) id: u64,
    pub(crate) x: Buffer,      // [tokens, embd] residual stream
    pub(crate) normed: Buffer, // [tokens, embd] the residual stream's norm before each block
    pub(crate) q: Buffer,      // [tokens, heads * head_dim]
    pub(crate) k: Buffer,      // [tokens, kv_heads * head_dim]
    pub(crate) v: Buffer,      // [tokens, kv_heads * head_dim]
    pub(crate) attn: Buffer,   // [tokens, heads * head_dim]
    pub(crate) proj: Buffer,   // [tokens, embd] each block's output (attention, FFN)
    pub(crate) ffn: FfnScratch,
    pub(crate) out_x: Buffer, // [logit rows, embd] the residual rows whose logits are wanted
    pub(crate) out_proj: Buffer, // [logit rows, embd] their blocks' outputs
    pub(crate) logits: Buffer, // [logit rows, vocab]
    /// Seconds the latest pass took on the host to check, build and submit its work: on a
    /// GPU the device goes on with it afterwards (reading results waits for it), on the CPU
    /// it is the work itself.
    pub submit_seconds: f64,
}

/// Buffers of the FFN inside a layer.
pub(crate) struct FfnScratch {
    pub(crate) hidden: Buffer, // [tokens, ff] the activation's output
    pub(crate) up: Buffer,     // [tokens, ff]
    pub(crate) moe: Option<MoeScratch>,
}

/// Buffers of a mixture-of-experts FFN.
pub(crate) struct MoeScratch {
    pub(crate) router: Buffer,     // [tokens, experts]
    pub(crate) gathered: Buffer,   // [tokens, embd]
    pub(crate) expert_out: Buffer, // [tokens, embd]
}

impl Scratch {
    /// Buffers for batches of up to `capacity` tokens.
    pub fn new(model: &Model, capacity: usize) -> Result<Scratch, ModelError> {
        let c = &model.config;
        let b = &model.backend;
        let t = capacity.max(1);
        let moe = if c.expert_count > 0 {
            Some(MoeScratch {
                router: b.alloc(t * c.expert_count)?,
                gathered: b.alloc(t * c.embedding_length)?,
                expert_out: b.alloc(t * c.embedding_length)?,
            })
        } else {
            None
        };
        Ok(Scratch {
            capacity: t,
            id: next_workspace_id(),
            x: b.alloc(t * c.embedding_length)?,
            normed: b.alloc(t * c.embedding_length)?,
            q: b.alloc(t * c.q_width())?,
            k: b.alloc(t * c.kv_width())?,
            v: b.alloc(t * c.kv_width())?,
            attn: b.alloc(t * c.q_width())?,
            proj: b.alloc(t * c.embedding_length)?,
            ffn: FfnScratch {
                hidden: b.alloc(t * c.feed_forward_length)?,
                up: b.alloc(t * c.feed_forward_length)?,
                moe,
            },
            out_x: b.alloc(t * c.embedding_length)?,
            out_proj: b.alloc(t * c.embedding_length)?,
            logits: b.alloc(t * c.vocab_size)?,
            submit_seconds: 0.0,
        })
    }
}
