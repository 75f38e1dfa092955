//! The argument structs of the ops with more than four operands: each names the buffers an
//! op reads and writes, so that no long positional signature is repeated by the backends,
//! the default bodies and their callers.

use crate::{
    AttentionParams, Buffer, GatedFfn, KvCache, MoeBuffers, MoeFfn, QkNorms, RmsNorm, RopeParams,
    SequenceSpan, Weight,
};

/// [`crate::PrimitiveOps::kv_write`]: the keys and values of each span's tokens (`k`, `v`:
/// `[tokens, width]`) into the cache cells its block table maps their positions to.
pub struct KvWrite<'a> {
    pub k: &'a Buffer,
    pub v: &'a Buffer,
    pub k_cache: &'a mut KvCache,
    pub v_cache: &'a mut KvCache,
    pub spans: &'a [SequenceSpan],
}

/// [`crate::PrimitiveOps::attention`]: causal grouped-query attention of each span's queries
/// (`q`: `[tokens, heads, head_dim]`) over that sequence's cached keys and values (positions
/// `0 ..= pos` of each query, limited to the sliding window when one is set).
#[derive(Clone, Copy)]
pub struct Attention<'a> {
    pub q: &'a Buffer,
    pub k_cache: &'a KvCache,
    pub v_cache: &'a KvCache,
    pub spans: &'a [SequenceSpan],
    pub params: &'a AttentionParams,
}

impl Attention<'_> {
    /// Values of one output row: `heads × head_dim`.
    pub fn width(&self) -> usize {
        self.params.heads * self.params.head_dim
    }
}

/// [`crate::PrimitiveOps::scatter_add_rows`]: `dst[rows[i]] += scales[i] * src[i]` for rows of
/// `width` elements (the MoE combine).
pub struct ScatterAddRows<'a> {
    pub src: &'a Buffer,
    pub rows: &'a [u32],
    pub scales: &'a [f32],
    pub width: usize,
    pub dst: &'a mut Buffer,
}

/// [`crate::PrimitiveOps::copy`]: `len` elements from `src[src_offset..]` to
/// `dst[dst_offset..]`.
pub struct BufferCopy<'a> {
    pub src: &'a Buffer,
    pub src_offset: usize,
    pub dst: &'a mut Buffer,
    pub dst_offset: usize,
    pub len: usize,
}

/// [`crate::FusedOps::add_rms_norm`]: the residual add and the norm after it, `x += delta`
/// over the first `rows` rows of `norm.weight.row_len()` values, then `out = norm(x)`. `out`
/// may not alias `x` or `delta`.
pub struct AddRmsNorm<'a> {
    pub x: &'a mut Buffer,
    pub delta: &'a Buffer,
    pub norm: RmsNorm<'a>,
    pub rows: usize,
    pub out: &'a mut Buffer,
}

/// [`crate::FusedOps::norm_matmul_qkv`]: the norm of the residual stream `x` (its first
/// `rows` rows) into `normed`, which the Q, K and V projections then read. `normed` holds the
/// norm afterwards; it may not alias `x`.
pub struct NormInput<'a> {
    pub x: &'a Buffer,
    pub norm: RmsNorm<'a>,
    pub rows: usize,
    pub normed: &'a mut Buffer,
}

/// [`crate::FusedOps::norm_gated_ffn_residual`]: the FFN half of a layer without post-norms
/// over the first `tokens` rows of the residual stream `x`: `normed = norm(x)`, the gated
/// FFN `ffn` of `normed` into `delta` (with `up` and `hidden` as [`GatedFfnRun`]'s), then
/// `x += delta`. `normed` and `delta` hold those values afterwards; `up` and `hidden` are
/// scratch whose contents afterwards a fused implementation leaves unspecified (one that
/// makes the activation inside the down projection never writes it out).
pub struct NormFfnResidual<'a> {
    pub x: &'a mut Buffer,
    pub norm: RmsNorm<'a>,
    pub normed: &'a mut Buffer,
    pub ffn: GatedFfn<'a>,
    pub tokens: usize,
    pub up: &'a mut Buffer,
    pub hidden: &'a mut Buffer,
    pub delta: &'a mut Buffer,
}

/// [`crate::FusedOps::rope_kv_write`]: the QK norms when given, RoPE of the queries `q` with
/// `q_rope` and of the keys `k` with `k_rope` (one row per position of `positions`, the same
/// frequency factors), then the keys and the values `v` into the caches.
pub struct RopeKvWrite<'a> {
    pub q: &'a mut Buffer, // [tokens, heads * head_dim]
    pub k: &'a mut Buffer, // [tokens, kv_heads * head_dim]
    pub v: &'a mut Buffer, // [tokens, kv_heads * head_dim]
    pub positions: &'a [u32],
    pub q_rope: &'a RopeParams,
    pub k_rope: &'a RopeParams,
    pub freq_factors: Option<&'a Weight>,
    pub k_cache: &'a mut KvCache,
    pub v_cache: &'a mut KvCache,
    pub spans: &'a [SequenceSpan],
    pub qk_norms: Option<QkNorms<'a>>,
}

impl RopeKvWrite<'_> {
    /// The cache write that ends the op: its keys and values into its caches.
    pub fn kv_write(&mut self) -> KvWrite<'_> {
        KvWrite {
            k: self.k,
            v: &*self.v,
            k_cache: self.k_cache,
            v_cache: self.v_cache,
            spans: self.spans,
        }
    }
}

/// [`crate::FusedOps::attention_output`]: the attention into `attn` (`[tokens, heads *
/// head_dim]`), then the output projection `out = projection · attn` over `tokens` rows.
pub struct AttentionOutput<'a> {
    pub attention: Attention<'a>,
    pub attn: &'a mut Buffer,
    pub projection: &'a Weight, // [heads * head_dim, embd]
    pub tokens: usize,
    pub out: &'a mut Buffer, // [tokens, embd]
}

/// [`crate::FusedOps::gated_ffn_hidden`] and [`crate::FusedOps::gated_ffn`]: `ffn` over the
/// first `tokens` rows of `x` (`[tokens, embd]`). `hidden` (`[tokens, ff]`) receives
/// `act(gate · x) * (up · x)`; `up` (`[tokens, ff]`) is scratch for `up · x` that a fused
/// implementation may leave untouched.
pub struct GatedFfnRun<'a> {
    pub ffn: GatedFfn<'a>,
    pub x: &'a Buffer,
    pub tokens: usize,
    pub up: &'a mut Buffer,
    pub hidden: &'a mut Buffer,
}

impl GatedFfnRun<'_> {
    /// The same run, borrowing this one's buffers (for a first op when a second follows).
    pub fn reborrow(&mut self) -> GatedFfnRun<'_> {
        GatedFfnRun {
            ffn: self.ffn,
            x: self.x,
            tokens: self.tokens,
            up: self.up,
            hidden: self.hidden,
        }
    }
}

/// [`crate::FusedOps::moe_ffn`]: `ffn` over the first `tokens` rows of `x` (`[tokens, embd]`),
/// with its scratch buffers.
pub struct MoeFfnRun<'a> {
    pub ffn: MoeFfn<'a>,
    pub x: &'a Buffer,
    pub tokens: usize,
    pub scratch: MoeBuffers<'a>,
}
