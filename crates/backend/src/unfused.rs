//! The fused ops of [`Backend`] as sequences of its primitive ops: the trait's default
//! implementations, and what a backend with fused kernels runs when they are switched off.

use crate::moe::{self, Routes};
use crate::{
    Backend, BackendError, Buffer, HeadNorms, KvCache, MoeBuffers, MoeFfn, RopeParams,
    SequenceSpan, Weight,
};

/// [`Backend::matmul_bias`]: [`Backend::matmul`], then [`Backend::add_bias`].
pub fn matmul_bias<B: Backend + ?Sized>(
    b: &B,
    weight: &Weight,
    bias: Option<&Weight>,
    x: &Buffer,
    tokens: usize,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    b.matmul(weight, x, tokens, out)?;
    match bias {
        Some(bias) => b.add_bias(out, bias, tokens),
        None => Ok(()),
    }
}

/// [`Backend::matmul_qkv`]: [`Backend::matmul_bias`] of each weight.
pub fn matmul_qkv<B: Backend + ?Sized>(
    b: &B,
    weights: [&Weight; 3],
    biases: [Option<&Weight>; 3],
    x: &Buffer,
    tokens: usize,
    outs: [&mut Buffer; 3],
) -> Result<(), BackendError> {
    for ((weight, bias), out) in weights.into_iter().zip(biases).zip(outs) {
        b.matmul_bias(weight, bias, x, tokens, out)?;
    }
    Ok(())
}

/// [`Backend::add_rms_norm`]: [`Backend::add`], then [`Backend::rms_norm`].
pub fn add_rms_norm<B: Backend + ?Sized>(
    b: &B,
    x: &mut Buffer,
    delta: &Buffer,
    weight: &Weight,
    eps: f32,
    rows: usize,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    b.add(x, delta, rows * weight.row_len())?;
    b.rms_norm(x, weight, eps, rows, out)
}

/// The head norms of [`Backend::rope_kv_write`]: [`Backend::rms_norm_in_place`] of every head
/// of `q` (`q_params.heads` per token) and of `k`, for `tokens` tokens.
pub fn head_norms_in_place<B: Backend + ?Sized>(
    b: &B,
    q: &mut Buffer,
    k: &mut Buffer,
    tokens: usize,
    q_params: &RopeParams,
    k_params: &RopeParams,
    norms: HeadNorms<'_>,
) -> Result<(), BackendError> {
    b.rms_norm_in_place(q, norms.q, norms.eps, tokens * q_params.heads)?;
    b.rms_norm_in_place(k, norms.k, norms.eps, tokens * k_params.heads)
}

/// [`Backend::rope_kv_write`]: the head norms ([`Backend::rms_norm_in_place`] of `q` and of
/// `k`) when given, [`Backend::rope`] of `q` and of `k`, then [`Backend::kv_write`].
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_write<B: Backend + ?Sized>(
    b: &B,
    q: &mut Buffer,
    k: &mut Buffer,
    v: &Buffer,
    positions: &[u32],
    q_params: &RopeParams,
    k_params: &RopeParams,
    freq_factors: Option<&Weight>,
    k_cache: &mut KvCache,
    v_cache: &mut KvCache,
    spans: &[SequenceSpan],
    head_norms: Option<HeadNorms<'_>>,
) -> Result<(), BackendError> {
    if let Some(norms) = head_norms {
        head_norms_in_place(b, q, k, positions.len(), q_params, k_params, norms)?;
    }
    b.rope(q, positions, q_params, freq_factors)?;
    b.rope(k, positions, k_params, freq_factors)?;
    b.kv_write(k, v, k_cache, v_cache, spans)
}

/// [`Backend::matmul_swiglu`]: [`Backend::matmul`] of `gate` into `out` and of `up` into
/// `up_out`, then [`Backend::silu_mul`].
pub fn matmul_swiglu<B: Backend + ?Sized>(
    b: &B,
    gate: &Weight,
    up: &Weight,
    x: &Buffer,
    tokens: usize,
    up_out: &mut Buffer,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    b.matmul(gate, x, tokens, out)?;
    b.matmul(up, x, tokens, up_out)?;
    b.silu_mul(out, up_out, tokens * gate.rows())
}

/// [`Backend::moe_ffn`]: [`Backend::matmul`] of the router into `scratch.router`, the logits
/// read back and routed on the host ([`moe::route_tokens`]), then [`moe_experts`].
pub fn moe_ffn<B: Backend + ?Sized>(
    b: &B,
    ffn: &MoeFfn<'_>,
    x: &Buffer,
    tokens: usize,
    scratch: MoeBuffers<'_>,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    b.matmul(ffn.router, x, tokens, scratch.router)?;
    let mut logits = vec![0.0; tokens * ffn.experts];
    b.download(scratch.router, &mut logits)?;
    let routes = moe::route_tokens(&logits, tokens, ffn.experts, ffn.used, ffn.renormalise);
    moe_experts(b, ffn, x, tokens, &routes, scratch, out)
}

/// The expert half of [`moe_ffn`] for routes already made: `out` zeroed, then per expert
/// with rows, [`Backend::gather_rows`] of its rows of `x`, [`Backend::matmul`] of its gate
/// and up, [`Backend::silu_mul`], [`Backend::matmul`] of its down and
/// [`Backend::scatter_add_rows`] of the result with the rows' weights.
pub fn moe_experts<B: Backend + ?Sized>(
    b: &B,
    ffn: &MoeFfn<'_>,
    x: &Buffer,
    tokens: usize,
    routes: &Routes,
    scratch: MoeBuffers<'_>,
    out: &mut Buffer,
) -> Result<(), BackendError> {
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
        b.silu_mul(scratch.gate, scratch.up, n * ff)?;
        b.matmul(
            &ffn.down.matrix(expert),
            scratch.gate,
            n,
            scratch.expert_out,
        )?;
        b.scatter_add_rows(scratch.expert_out, rows, scales, embd, out)?;
    }
    Ok(())
}
