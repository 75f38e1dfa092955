//! Parameter types of the backend operations.

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(x[2i], x[2i+1])` (LLaMA, Mistral; ggml's "normal" mode).
    Normal,
    /// Halves `(x[i], x[i + d/2])` (Qwen2, Qwen3, OLMoE; ggml's NEOX mode).
    Neox,
}

/// Rotary position embedding parameters of one projection.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeParams {
    pub style: RopeStyle,
    /// Heads in the buffer (query heads or key heads).
    pub heads: usize,
    pub head_dim: usize,
    /// Dimensions rotated at the start of each head (usually `head_dim`).
    pub rotary_dim: usize,
    /// Base frequency θ.
    pub theta: f32,
    /// Linear position scaling: positions are multiplied by this (1.0 = none).
    pub freq_scale: f32,
}

impl RopeParams {
    /// `(cos, sin)` of every pair's angle at `position` (`cache.len()` pairs, normally
    /// `rotary_dim / 2`), as ggml's CPU rope computes them: a running angle in f32, `θ₀ =
    /// position` and `θ *= θ_base^(-2/rotary_dim)` after each pair; pair `i` takes
    /// `freq_scale * (θᵢ / factors[i])` (`factors`: the optional `rope_freqs` tensor), then
    /// libm's `cosf` and `sinf`. Every backend rotates with these values (the CUDA exact mode
    /// uploads them), so the angles are computed in this one place.
    pub fn angles(&self, position: u32, factors: Option<&[f32]>, cache: &mut [(f32, f32)]) {
        let theta_scale = self.theta.powf(-2.0 / self.rotary_dim as f32);
        let mut theta = position as f32;
        for (pair, slot) in cache.iter_mut().enumerate() {
            let factor = factors.map_or(1.0, |f| f[pair]);
            let angle = self.freq_scale * (theta / factor);
            *slot = (angle.cos(), angle.sin());
            theta *= theta_scale;
        }
    }
}

/// Per-head RMS norms of the queries and keys (Qwen3's `attn_q_norm` / `attn_k_norm`): one
/// weight of `head_dim` values each, applied to every head before RoPE.
#[derive(Clone, Copy)]
pub struct HeadNorms<'a> {
    pub q: &'a crate::Weight,
    pub k: &'a crate::Weight,
    pub eps: f32,
}

/// The part of a batch that belongs to one sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceSpan {
    /// Rows of the batch (`q`, `k`, `v`) holding this sequence's tokens of this step.
    pub first_row: usize,
    pub rows: usize,
    /// Position of the span's first token in its sequence; the cache already holds
    /// positions `0 .. start_position` of this sequence.
    pub start_position: usize,
    /// Cache block of each run of `block_size` positions: position `p` lives in cell
    /// `block_table[p / block_size] * block_size + p % block_size`.
    pub block_table: Vec<u32>,
    pub block_size: usize,
}

impl SequenceSpan {
    /// The cache cell of position `position`.
    pub fn cell(&self, position: usize) -> usize {
        self.block_table[position / self.block_size] as usize * self.block_size
            + position % self.block_size
    }
}

/// Attention shape and masking.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionParams {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies `q · k` before the softmax (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
    /// When set, a query at position `p` sees keys at positions `> p - window` only.
    pub sliding_window: Option<usize>,
}

/// The host-side inputs of one forward pass, known before its first op (see
/// [`crate::Backend::begin_step`]).
#[derive(Debug, Clone, Copy)]
pub struct StepInputs<'a> {
    /// Token id of each row.
    pub tokens: &'a [u32],
    /// Position of each row in its sequence.
    pub positions: &'a [u32],
    /// The sequences of the batch.
    pub spans: &'a [SequenceSpan],
    /// Rows whose logits are computed.
    pub logit_rows: &'a [u32],
}

/// Identity of a capturable forward pass: passes with equal keys launch the same kernels with
/// the same shapes on the same buffers, so one captured graph serves them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StepKey {
    /// Unique id of the scratch buffers and KV cache the pass uses.
    pub workspace: u64,
    pub tokens: usize,
    pub spans: usize,
    pub logit_rows: usize,
}

/// One mixture-of-experts FFN layer (OLMoE, Qwen3-MoE, Mixtral): the router, the experts'
/// stacked SwiGLU weights (`Weight::matrix(e)` is expert `e`) and the routing rule.
#[derive(Clone, Copy)]
pub struct MoeFfn<'a> {
    pub router: &'a crate::Weight, // [embd, experts]
    pub gate: &'a crate::Weight,   // [embd, ff, experts]
    pub up: &'a crate::Weight,     // [embd, ff, experts]
    pub down: &'a crate::Weight,   // [ff, embd, experts]
    pub experts: usize,
    /// Experts each token is routed to.
    pub used: usize,
    /// Divide the chosen experts' weights by their sum.
    pub renormalise: bool,
}

/// Scratch buffers of [`crate::Backend::moe_ffn`] for batches of up to `tokens` rows (what
/// the default needs; a backend may leave any of them untouched).
pub struct MoeBuffers<'a> {
    pub router: &'a mut crate::Buffer, // [tokens, experts] router logits
    pub gathered: &'a mut crate::Buffer, // [tokens, embd] one expert's input rows
    pub gate: &'a mut crate::Buffer,   // [tokens, ff]
    pub up: &'a mut crate::Buffer,     // [tokens, ff]
    pub expert_out: &'a mut crate::Buffer, // [tokens, embd] one expert's output rows
}
