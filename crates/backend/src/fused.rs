//! The third part of the contract: fused ops. Each default body runs the primitive ops in the
//! order the decoder needs them ([`crate::unfused`]), so a backend that does not override
//! them (the CPU reference, mostly) computes exactly what the primitives compute. A backend
//! overrides one to save launches or passes over memory; its result must equal its own
//! primitive sequence value for value.

use crate::args::{
    AddRmsNorm, AttentionOutput, GatedFfnRun, MoeFfnRun, NormFfnResidual, NormInput, RopeKvWrite,
};
use crate::OpResult;
use crate::{unfused, Buffer, PrimitiveOps, Projection};

/// The fused ops of a device.
pub trait FusedOps: PrimitiveOps {
    /// `out[t] = W · x[t] (+ bias)`: [`PrimitiveOps::matmul`] followed by
    /// [`PrimitiveOps::add_bias`] on `out` when the projection has a bias.
    fn matmul_bias(
        &self,
        projection: Projection<'_>,
        x: &Buffer,
        tokens: usize,
        out: &mut Buffer,
    ) -> OpResult {
        unfused::matmul_bias(self, projection, x, tokens, out)
    }

    /// The Q, K and V projections of one input: [`FusedOps::matmul_bias`] of each projection
    /// into its output (a backend may run the three in one kernel; each output must equal
    /// its `matmul_bias` bit for bit).
    fn matmul_qkv(
        &self,
        projections: [Projection<'_>; 3],
        x: &Buffer,
        tokens: usize,
        outs: [&mut Buffer; 3],
    ) -> OpResult {
        unfused::matmul_qkv(self, projections, x, tokens, outs)
    }

    /// The residual add and the next norm ([`AddRmsNorm`]): [`PrimitiveOps::add`], then
    /// [`PrimitiveOps::rms_norm`].
    fn add_rms_norm(&self, op: AddRmsNorm<'_>) -> OpResult {
        unfused::add_rms_norm(self, op)
    }

    /// The QK norms, RoPE and the cache write of a step's queries and keys
    /// ([`RopeKvWrite`]): with QK norms, [`PrimitiveOps::rms_norm_in_place`] of `q` and of
    /// `k` (rows by [`crate::QkNorms::rows`]); then [`PrimitiveOps::rope`] of `q` and of `k`,
    /// then [`PrimitiveOps::kv_write`].
    fn rope_kv_write(&self, op: RopeKvWrite<'_>) -> OpResult {
        unfused::rope_kv_write(self, op)
    }

    /// The hidden layer of a gated FFN ([`GatedFfnRun`]): [`PrimitiveOps::matmul`] of the
    /// gate into `hidden`, of up into `up`, then [`PrimitiveOps::gated_activation`].
    fn gated_ffn_hidden(&self, run: GatedFfnRun<'_>) -> OpResult {
        unfused::gated_ffn_hidden(self, run)
    }

    /// The Q, K and V projections of `x` into `op.q`, `op.k` and `op.v`
    /// ([`FusedOps::matmul_qkv`], one row per position), then [`FusedOps::rope_kv_write`]
    /// of them.
    fn qkv_rope_kv_write(
        &self,
        projections: [Projection<'_>; 3],
        x: &Buffer,
        op: RopeKvWrite<'_>,
    ) -> OpResult {
        let tokens = op.positions.len();
        self.matmul_qkv(projections, x, tokens, [&mut *op.q, &mut *op.k, &mut *op.v])?;
        self.rope_kv_write(op)
    }

    /// Attention and its output projection ([`AttentionOutput`]): [`PrimitiveOps::attention`]
    /// into `attn`, then [`PrimitiveOps::matmul`] of the projection over it. `attn` holds the
    /// attention's output afterwards, as those two ops leave it.
    fn attention_output(&self, op: AttentionOutput<'_>) -> OpResult {
        self.attention(&op.attention, &mut *op.attn)?;
        self.matmul(op.projection, op.attn, op.tokens, op.out)
    }

    /// Whether the decoder hands this backend each layer's residual adds and norms inside
    /// the ops around them ([`FusedOps::norm_matmul_qkv`],
    /// [`FusedOps::attention_output_residual`], [`FusedOps::norm_gated_ffn_residual`]) rather
    /// than as [`FusedOps::add_rms_norm`] between them, where a model's layers allow it
    /// (dense FFNs, no post-norms), for a model whose residual stream has `width` values a
    /// row. Both orders compute the same values; a backend says yes where its kernels take
    /// the norm into the matmul that reads it and the add into the one that makes the
    /// addend, so that neither costs a launch of its own.
    fn norms_in_matmuls(&self, width: usize) -> bool {
        let _ = width;
        false
    }

    /// The norm of the residual stream and the Q, K and V projections of it ([`NormInput`]):
    /// [`PrimitiveOps::rms_norm`] into `input.normed`, then [`FusedOps::matmul_qkv`] over it.
    fn norm_matmul_qkv(
        &self,
        input: NormInput<'_>,
        projections: [Projection<'_>; 3],
        outs: [&mut Buffer; 3],
    ) -> OpResult {
        unfused::norm_matmul_qkv(self, input, projections, outs)
    }

    /// [`FusedOps::attention_output`], then the residual add of its output: `x += op.out`
    /// over `op.tokens` rows. `op.out` holds the projection afterwards.
    fn attention_output_residual(&self, op: AttentionOutput<'_>, x: &mut Buffer) -> OpResult {
        unfused::attention_output_residual(self, op, x)
    }

    /// The FFN half of a layer without post-norms ([`NormFfnResidual`]):
    /// [`PrimitiveOps::rms_norm`], [`FusedOps::gated_ffn`], then [`PrimitiveOps::add`].
    fn norm_gated_ffn_residual(&self, op: NormFfnResidual<'_>) -> OpResult {
        unfused::norm_gated_ffn_residual(self, op)
    }

    /// The dense gated FFN into `out` (`[tokens, embd]`): [`FusedOps::gated_ffn_hidden`],
    /// then [`PrimitiveOps::matmul`] of down over `hidden`. `hidden` holds the activation's
    /// output afterwards, as those two ops leave it.
    fn gated_ffn(&self, mut run: GatedFfnRun<'_>, out: &mut Buffer) -> OpResult {
        self.gated_ffn_hidden(run.reborrow())?;
        self.matmul(run.ffn.down, run.hidden, run.tokens, out)
    }

    /// The mixture-of-experts FFN into `out` (`[tokens, embd]`): the router's logits, each
    /// token's `ffn.used` experts and weights ([`crate::moe::route_tokens`]), and for each
    /// expert the SwiGLU FFN of its rows, added to their `out` rows times their weights,
    /// expert by expert from zero. The default ([`unfused::moe_ffn`]) reads the logits back
    /// to route on the host, then runs [`PrimitiveOps::gather_rows`],
    /// [`PrimitiveOps::matmul`] of the expert's gate and up,
    /// [`PrimitiveOps::gated_activation`], [`PrimitiveOps::matmul`] of its down and
    /// [`PrimitiveOps::scatter_add_rows`] per expert.
    fn moe_ffn(&self, run: MoeFfnRun<'_>, out: &mut Buffer) -> OpResult {
        unfused::moe_ffn(self, run, out)
    }

    /// True when [`FusedOps::moe_ffn`] of `tokens` rows reads nothing back to the host, so a
    /// pass containing it can be captured by [`crate::Device::run_captured`]. The default's
    /// routing reads the router logits: `false`.
    fn moe_ffn_on_device(&self, tokens: usize) -> bool {
        let _ = tokens;
        false
    }
}
