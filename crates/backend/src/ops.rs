//! Parameter types of the backend operations: what a norm, a projection, an FFN, RoPE and
//! attention are, independent of the buffers an op works on (those are in `args`).

use crate::{at_least, BackendError, Buffer, OpResult, Weight};

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
    /// YaRN's corrections and a magnitude factor; `None` for plain RoPE.
    pub yarn: Option<Yarn>,
}

/// YaRN ("YaRN: Efficient Context Window Extension of Large Language Models", Peng et al.
/// 2023) as ggml's `rope_yarn` applies it: each pair's angle mixes the interpolated angle
/// (`freq_scale * θ`) with the extrapolated one (`θ`) by a ramp over the pairs between the
/// correction dims of `beta_fast` and `beta_slow` rotations in `original_context` tokens,
/// weighted by `ext_factor`; cos and sin are multiplied by `attn_factor`, and by `1 + 0.1 ·
/// ln(1 / freq_scale)` when `ext_factor` is not 0. With `ext_factor` 0 only `attn_factor`
/// applies (llama.cpp's `rope.scaling.attn_factor` on plain RoPE).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// The training context the scaling extends (`rope.scaling.original_context_length`).
    pub original_context: u32,
}

impl Yarn {
    /// ggml's `ggml_rope_yarn_corr_dims`: where the ramp starts and ends, for `rotary_dim`
    /// rotated dims and base `theta` (dimension indices, which ggml compares with the pair
    /// index).
    pub fn correction_dims(&self, rotary_dim: usize, theta: f32) -> [f32; 2] {
        let dim = |rotations: f32| {
            let turns = self.original_context as f32 / (rotations * 2.0 * std::f32::consts::PI);
            rotary_dim as f32 * turns.ln() / (2.0 * theta.ln())
        };
        let start = dim(self.beta_fast).floor();
        let end = dim(self.beta_slow).ceil();
        [start.max(0.0), end.min(rotary_dim as f32 - 1.0)]
    }
}

/// What [`Yarn`] (or its absence) makes of one rotation's angles, the same for every pair
/// but the ramp: what the CPU computes and what the device kernels are given.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeCorrections {
    /// The extrapolation weight (0: the interpolated angle alone).
    pub ext_factor: f32,
    /// The factor on cos and sin: `attn_factor`, times `1 + 0.1 · ln(1 / freq_scale)` when
    /// `ext_factor` is not 0 (ggml's `mscale`, one fused multiply-add as gcc contracts it).
    pub magnitude: f32,
    /// The ramp's ends ([`Yarn::correction_dims`]).
    pub ramp: [f32; 2],
}

impl RopeCorrections {
    /// The mixed angle of pair `pair` from its unscaled angle (`extrapolated`) and its
    /// scaled one (`interpolated`): ggml's `rope_yarn_ramp` and blend, the blend one fused
    /// multiply-add as gcc contracts it.
    pub fn angle(&self, pair: usize, extrapolated: f32, interpolated: f32) -> f32 {
        if self.ext_factor == 0.0 {
            return interpolated;
        }
        let [low, high] = self.ramp;
        let y = (pair as f32 - low) / (high - low).max(0.001);
        let mix = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
        interpolated.mul_add(1.0 - mix, extrapolated * mix)
    }
}

impl RopeParams {
    /// The rotation's [`RopeCorrections`]: none (0, 1) for plain RoPE.
    pub fn corrections(&self) -> RopeCorrections {
        let Some(yarn) = self.yarn else {
            return RopeCorrections {
                ext_factor: 0.0,
                magnitude: 1.0,
                ramp: [0.0, 0.0],
            };
        };
        let mut magnitude = yarn.attn_factor;
        if yarn.ext_factor != 0.0 {
            magnitude *= 0.1f32.mul_add((1.0 / self.freq_scale).ln(), 1.0);
        }
        RopeCorrections {
            ext_factor: yarn.ext_factor,
            magnitude,
            ramp: yarn.correction_dims(self.rotary_dim, self.theta),
        }
    }

    /// `(cos, sin)` of every pair's angle at `position` (`cache.len()` pairs, normally
    /// `rotary_dim / 2`), as ggml's CPU rope computes them: a running angle in f32, `θ₀ =
    /// position` and `θ *= θ_base^(-2/rotary_dim)` after each pair; pair `i` takes
    /// `freq_scale * (θᵢ / factors[i])` (`factors`: the optional `rope_freqs` tensor),
    /// mixed and scaled by the [`RopeCorrections`], then libm's `cosf` and `sinf`. Every
    /// backend rotates with these values (the CUDA exact mode uploads them), so the angles
    /// are computed in this one place.
    pub fn angles(&self, position: u32, factors: Option<&[f32]>, cache: &mut [(f32, f32)]) {
        let theta_scale = self.theta.powf(-2.0 / self.rotary_dim as f32);
        let corrections = self.corrections();
        let mut theta = position as f32;
        for (pair, slot) in cache.iter_mut().enumerate() {
            let extrapolated = theta / factors.map_or(1.0, |f| f[pair]);
            let angle = corrections.angle(pair, extrapolated, self.freq_scale * extrapolated);
            *slot = (
                angle.cos() * corrections.magnitude,
                angle.sin() * corrections.magnitude,
            );
            theta *= theta_scale;
        }
    }
}

/// An RMS norm: `y = x / sqrt(mean(x²) + eps) * weight` over rows of `weight.row_len()`
/// values.
#[derive(Clone, Copy)]
pub struct RmsNorm<'a> {
    pub weight: &'a Weight,
    pub eps: f32,
}

/// The RMS norms of the queries and keys before RoPE, of either kind: per head (Qwen3's
/// `attn_q_norm`: a weight of `head_dim` values applied to every head) or over the whole
/// projection (OLMoE: a weight of `heads × head_dim` values applied to every token).
#[derive(Clone, Copy)]
pub struct QkNorms<'a> {
    pub q: &'a Weight,
    pub k: &'a Weight,
    pub eps: f32,
}

impl QkNorms<'_> {
    /// Rows `norm` normalises in `tokens` rows of `width` values: `tokens × heads` for a
    /// per-head norm, `tokens` for a full-width one.
    pub fn rows(norm: &Weight, tokens: usize, width: usize) -> usize {
        tokens * width / norm.row_len()
    }
}

/// A linear projection: `y = W · x (+ bias)`.
#[derive(Clone, Copy)]
pub struct Projection<'a> {
    pub weight: &'a Weight,
    pub bias: Option<&'a Weight>,
}

/// The activation of a gated FFN: `hidden = act(gate · x) * (up · x)`. A new activation is a
/// variant here and its kernels; every backend matches on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SiLU, `x · sigmoid(x)` (SwiGLU: LLaMA, Qwen, OLMoE), as ggml's `ggml_vec_swiglu_f32`.
    Silu,
    /// GELU with the tanh approximation (GeGLU: Gemma), as ggml's CPU `ggml_vec_geglu_f32`
    /// computes it: through a table of f16 values ([`crate::gelu`]).
    GeluTanh,
}

/// A dense gated FFN: `out[t] = down · (act(gate · x[t]) * (up · x[t]))`.
#[derive(Clone, Copy)]
pub struct GatedFfn<'a> {
    pub gate: &'a Weight, // [embd, ff]
    pub up: &'a Weight,   // [embd, ff]
    pub down: &'a Weight, // [ff, embd]
    pub activation: Activation,
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

    /// Fails unless every position in `positions` maps through the block table to a cell
    /// below `n_cells` (the check every backend's KV write and attention make first).
    pub fn check_cells(
        &self,
        op: &'static str,
        positions: std::ops::Range<usize>,
        n_cells: usize,
    ) -> OpResult {
        if positions.is_empty() {
            return Ok(());
        }
        if self.block_size == 0 {
            return Err(BackendError::Shape {
                op,
                what: "block_size (non-zero)",
                expected: 1,
                found: 0,
            });
        }
        let last_block = (positions.end - 1) / self.block_size;
        at_least(
            op,
            "block table entries",
            last_block + 1,
            self.block_table.len(),
        )?;
        for block in &self.block_table[positions.start / self.block_size..=last_block] {
            let end = (*block as usize + 1).saturating_mul(self.block_size);
            at_least(op, "cache cells (block end)", end, n_cells)?;
        }
        Ok(())
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
/// [`crate::Device::begin_step`]).
#[derive(Debug, Clone, Copy)]
pub struct StepInputs<'a> {
    /// Token id of each row.
    pub tokens: &'a [u32],
    /// Position of each row in its sequence.
    pub positions: &'a [u32],
    /// The sequences of the batch.
    pub spans: &'a [SequenceSpan],
    /// The same sequences with the windowed layers' block tables, when those keep only their
    /// windows ([`crate::Device::takes_window_spans`]).
    pub window_spans: Option<&'a [SequenceSpan]>,
    /// Rows whose logits are computed.
    pub logit_rows: &'a [u32],
    /// Every row must get the numbers it would get in a pass of its own (speculative
    /// verification compares them with one-token decode steps): a backend whose arithmetic
    /// depends on the batch's shape computes this pass in its one-row order.
    pub rows_alone: bool,
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
    pub router: &'a Weight, // [embd, experts]
    pub gate: &'a Weight,   // [embd, ff, experts]
    pub up: &'a Weight,     // [embd, ff, experts]
    pub down: &'a Weight,   // [ff, embd, experts]
    pub experts: usize,
    /// Experts each token is routed to.
    pub used: usize,
    /// Divide the chosen experts' weights by their sum.
    pub renormalise: bool,
}

/// Scratch buffers of [`crate::FusedOps::moe_ffn`] for batches of up to `tokens` rows (what
/// the default needs; a backend may leave any of them untouched).
pub struct MoeBuffers<'a> {
    pub router: &'a mut Buffer,     // [tokens, experts] router logits
    pub gathered: &'a mut Buffer,   // [tokens, embd] one expert's input rows
    pub gate: &'a mut Buffer,       // [tokens, ff]
    pub up: &'a mut Buffer,         // [tokens, ff]
    pub expert_out: &'a mut Buffer, // [tokens, embd] one expert's output rows
}
