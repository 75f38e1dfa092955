//! The fused ops of [`FusedOps`] as sequences of primitive ops: the trait's default bodies,
//! and what a backend with fused kernels runs when they are switched off.

use crate::moe::{self, Routes};
use crate::OpResult;
use crate::{
    Activation, AddRmsNorm, AttentionOutput, Buffer, FusedOps, GatedFfnRun, MoeFfnRun,
    NormFfnResidual, NormInput, PrimitiveOps, Projection, QkNorms, RmsNorm, RopeKvWrite,
    ScatterAddRows,
};

/// [`FusedOps::matmul_bias`]: [`PrimitiveOps::matmul`], then [`PrimitiveOps::add_bias`].
pub fn matmul_bias<B: PrimitiveOps + ?Sized>(
    b: &B,
    projection: Projection<'_>,
    x: &Buffer,
    tokens: usize,
    out: &mut Buffer,
) -> OpResult {
    b.matmul(projection.weight, x, tokens, out)?;
    match projection.bias {
        Some(bias) => b.add_bias(out, bias, tokens),
        None => Ok(()),
    }
}

/// [`FusedOps::matmul_qkv`]: [`FusedOps::matmul_bias`] of each projection.
pub fn matmul_qkv<B: FusedOps + ?Sized>(
    b: &B,
    projections: [Projection<'_>; 3],
    x: &Buffer,
    tokens: usize,
    outs: [&mut Buffer; 3],
) -> OpResult {
    for (projection, out) in projections.into_iter().zip(outs) {
        b.matmul_bias(projection, x, tokens, out)?;
    }
    Ok(())
}

/// [`FusedOps::add_rms_norm`]: [`PrimitiveOps::add`], then [`PrimitiveOps::rms_norm`].
pub fn add_rms_norm<B: PrimitiveOps + ?Sized>(b: &B, op: AddRmsNorm<'_>) -> OpResult {
    b.add(op.x, op.delta, op.rows * op.norm.weight.row_len())?;
    b.rms_norm(op.x, op.norm, op.rows, op.out)
}

/// [`FusedOps::norm_matmul_qkv`]: [`PrimitiveOps::rms_norm`] into `input.normed`, then
/// [`FusedOps::matmul_qkv`] over it.
pub fn norm_matmul_qkv<B: FusedOps + ?Sized>(
    b: &B,
    input: NormInput<'_>,
    projections: [Projection<'_>; 3],
    outs: [&mut Buffer; 3],
) -> OpResult {
    let NormInput {
        x,
        norm,
        rows,
        normed,
    } = input;
    b.rms_norm(x, norm, rows, normed)?;
    b.matmul_qkv(projections, normed, rows, outs)
}

/// [`FusedOps::attention_output_residual`]: [`FusedOps::attention_output`], then
/// [`PrimitiveOps::add`] of its output to `x`.
pub fn attention_output_residual<B: FusedOps + ?Sized>(
    b: &B,
    op: AttentionOutput<'_>,
    x: &mut Buffer,
) -> OpResult {
    let AttentionOutput {
        attention,
        attn,
        projection,
        tokens,
        out,
    } = op;
    let len = tokens * projection.rows();
    b.attention_output(AttentionOutput {
        attention,
        attn,
        projection,
        tokens,
        out: &mut *out,
    })?;
    b.add(x, out, len)
}

/// [`FusedOps::norm_gated_ffn_residual`]: [`PrimitiveOps::rms_norm`] of `x` into `normed`,
/// [`FusedOps::gated_ffn`] of it into `delta`, then [`PrimitiveOps::add`] of `delta` to `x`.
pub fn norm_gated_ffn_residual<B: FusedOps + ?Sized>(b: &B, op: NormFfnResidual<'_>) -> OpResult {
    let NormFfnResidual {
        x,
        norm,
        normed,
        ffn,
        tokens,
        up,
        hidden,
        delta,
    } = op;
    let len = tokens * norm.weight.row_len();
    b.rms_norm(x, norm, tokens, normed)?;
    let run = GatedFfnRun {
        ffn,
        x: normed,
        tokens,
        up,
        hidden,
    };
    b.gated_ffn(run, delta)?;
    b.add(x, delta, len)
}

/// The QK norms of [`FusedOps::rope_kv_write`], when it has them:
/// [`PrimitiveOps::rms_norm_in_place`] of `q`, then of `k`, each over its
/// [`QkNorms::rows`].
pub fn qk_norms_in_place<B: PrimitiveOps + ?Sized>(b: &B, op: &mut RopeKvWrite<'_>) -> OpResult {
    let Some(norms) = op.qk_norms else {
        return Ok(());
    };
    let tokens = op.positions.len();
    for (x, weight, rope) in [
        (&mut *op.q, norms.q, op.q_rope),
        (&mut *op.k, norms.k, op.k_rope),
    ] {
        let rows = QkNorms::rows(weight, tokens, rope.heads * rope.head_dim);
        let norm = RmsNorm {
            weight,
            eps: norms.eps,
        };
        b.rms_norm_in_place(x, norm, rows)?;
    }
    Ok(())
}

/// [`FusedOps::rope_kv_write`]: [`qk_norms_in_place`], [`PrimitiveOps::rope`] of `q` and of
/// `k`, then [`PrimitiveOps::kv_write`].
pub fn rope_kv_write<B: PrimitiveOps + ?Sized>(b: &B, mut op: RopeKvWrite<'_>) -> OpResult {
    qk_norms_in_place(b, &mut op)?;
    b.rope(op.q, op.positions, op.q_rope, op.freq_factors)?;
    b.rope(op.k, op.positions, op.k_rope, op.freq_factors)?;
    b.kv_write(op.kv_write())
}

/// [`FusedOps::gated_ffn_hidden`]: [`PrimitiveOps::matmul`] of the gate into `hidden` and of
/// up into `up`, then [`PrimitiveOps::gated_activation`].
pub fn gated_ffn_hidden<B: PrimitiveOps + ?Sized>(b: &B, run: GatedFfnRun<'_>) -> OpResult {
    let ffn = run.ffn;
    b.matmul(ffn.gate, run.x, run.tokens, run.hidden)?;
    b.matmul(ffn.up, run.x, run.tokens, run.up)?;
    let len = run.tokens * ffn.gate.rows();
    b.gated_activation(ffn.activation, run.hidden, run.up, len)
}

/// [`FusedOps::moe_ffn`]: [`PrimitiveOps::matmul`] of the router into `scratch.router`, the
/// logits read back and routed on the host ([`moe::route_tokens`]), then [`moe_experts`].
pub fn moe_ffn<B: PrimitiveOps + ?Sized>(b: &B, run: MoeFfnRun<'_>, out: &mut Buffer) -> OpResult {
    let (ffn, tokens) = (run.ffn, run.tokens);
    b.matmul(ffn.router, run.x, tokens, run.scratch.router)?;
    let mut logits = vec![0.0; tokens * ffn.experts];
    b.download(run.scratch.router, &mut logits)?;
    let routes = moe::route_tokens(&logits, tokens, ffn.experts, ffn.used, ffn.renormalise);
    moe_experts(b, run, &routes, out)
}

/// The expert half of [`moe_ffn`] for routes already made: `out` zeroed, then per expert
/// with rows, [`PrimitiveOps::gather_rows`] of its rows of `x`, [`PrimitiveOps::matmul`] of
/// its gate and up, the SiLU [`PrimitiveOps::gated_activation`], [`PrimitiveOps::matmul`]
/// of its down and [`PrimitiveOps::scatter_add_rows`] of the result with the rows' weights.
pub fn moe_experts<B: PrimitiveOps + ?Sized>(
    b: &B,
    run: MoeFfnRun<'_>,
    routes: &Routes,
    out: &mut Buffer,
) -> OpResult {
    let MoeFfnRun {
        ffn,
        x,
        tokens,
        scratch,
    } = run;
    let (embd, ff) = (ffn.gate.row_len(), ffn.gate.rows());
    b.upload(out, &vec![0.0; tokens * embd])?;
    for (expert, (rows, scales)) in routes.iter().enumerate() {
        if rows.is_empty() {
            continue;
        }
        let n = rows.len();
        b.gather_rows(x, rows, embd, scratch.gathered)?;
        b.matmul(&ffn.gate.matrix(expert), scratch.gathered, n, scratch.gate)?;
        b.matmul(&ffn.up.matrix(expert), scratch.gathered, n, scratch.up)?;
        b.gated_activation(Activation::Silu, scratch.gate, scratch.up, n * ff)?;
        b.matmul(
            &ffn.down.matrix(expert),
            scratch.gate,
            n,
            scratch.expert_out,
        )?;
        b.scatter_add_rows(ScatterAddRows {
            src: scratch.expert_out,
            rows,
            scales,
            width: embd,
            dst: out,
        })?;
    }
    Ok(())
}
