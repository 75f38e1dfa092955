//! Fused ops (kernels/fused.cu) that save launches in a decode step, each computing exactly
//! what its primitive sequence computes: the residual add with the next RMS norm, and RoPE
//! of the queries and keys with the keys' and values' cache write. (The matmul epilogues, a
//! bias and SwiGLU, are in [`crate::matmul`].)

use cudarc::driver::LaunchConfig;
use runit_backend::{
    unfused, AddRmsNorm, BackendError, KvType, PrimitiveOps, RopeKvWrite, RopeParams, RopeStyle,
    Weight,
};
use runit_quant::GgmlType;

use super::elementwise::{f32_weight, product, threads_for, to_u32};
use super::kv::{check_block_sizes, end_row};
use super::rope::freq_factors_address;
use crate::memory::{buffer_ptr, check_len, kv_ptr, weight_ptr};
use crate::{launch, CudaBackend};

/// `x += delta` for the first `rows` rows of `norm.weight.row_len()` values, then
/// `out = norm(x)`.
pub fn add_rms_norm(backend: &CudaBackend, op: AddRmsNorm<'_>) -> Result<(), BackendError> {
    const OP: &str = "add_rms_norm";
    let AddRmsNorm {
        x,
        delta,
        norm,
        rows,
        out,
    } = op;
    let (weight, eps) = (norm.weight, norm.eps);
    let width = weight.row_len();
    if width == 0 {
        return Err(BackendError::Shape {
            op: OP,
            what: "norm weight length (non-zero)",
            expected: 1,
            found: 0,
        });
    }
    let len = product(OP, "rows × width", rows, width)?;
    check_len(OP, "x", x, len)?;
    check_len(OP, "delta", delta, len)?;
    check_len(OP, "out", out, len)?;
    let weight = f32_weight(backend, OP, "norm weight", weight, width)?;
    let x = buffer_ptr(OP, "x", x)?;
    let delta = buffer_ptr(OP, "delta", delta)?;
    let out = buffer_ptr(OP, "out", out)?;
    if rows == 0 {
        return Ok(());
    }
    // The launch shape of rms_norm_f32 fixes the order its squares are summed in: the fused
    // kernel uses the very same one.
    let config = super::norm::launch_config(width, rows);
    // The f16 copy the next batched matmul reads, written by the same kernel.
    let half = crate::matmul::half_target(backend, rows, width)?;
    let (half_ptr, mode) = half.unwrap_or((0, 0));
    let (width32, rows32) = (to_u32(OP, "row length", width)?, to_u32(OP, "rows", rows)?);
    launch!(
        backend,
        OP,
        "fused.cu",
        "add_rms_norm_f32",
        config,
        x,
        delta,
        out,
        weight,
        width32,
        eps,
        rows32,
        half_ptr,
        mode
    )?;
    if half.is_some() {
        crate::matmul::record_half(backend, out, rows, width, half_ptr, mode);
    }
    Ok(())
}

/// True when the query and key rotations share one angle table (all but the head count
/// equal), as a model's always do.
fn same_rotation(q: &RopeParams, k: &RopeParams) -> bool {
    q.style == k.style
        && q.head_dim == k.head_dim
        && q.rotary_dim == k.rotary_dim
        && q.theta.to_bits() == k.theta.to_bits()
        && q.freq_scale.to_bits() == k.freq_scale.to_bits()
        // The fused kernel rotates without YaRN's corrections; rope.cu applies them.
        && q.yarn.is_none()
        && k.yarn.is_none()
}

/// The QK norms, RoPE of `q` and `k`, then `k` and `v` into the caches, in one launch.
/// Unusual arguments (different rotations of q and k, caches of other widths or types,
/// ggml-quantized and TurboQuant caches: only f16 and f32 caches are written in the kernel)
/// take the primitive ops (`rope`, then `kv_write`); QK norms other than per-head ones of f32 weights (full-width norms)
/// run as the default runs them, before the launch.
pub fn rope_kv_write(backend: &CudaBackend, mut op: RopeKvWrite<'_>) -> Result<(), BackendError> {
    const OP: &str = "rope_kv_write";
    let (q_params, k_params) = (op.q_rope, op.k_rope);
    let (head_dim, rotary_dim) = (k_params.head_dim, k_params.rotary_dim);
    let width = k_params.heads.saturating_mul(head_dim);
    let rotation_fits = same_rotation(q_params, k_params)
        && op.k_cache.width == width
        && op.v_cache.width == width
        && rotary_dim.is_multiple_of(2)
        && rotary_dim <= head_dim;
    let fused = rotation_fits
        && op.k_cache.ty == op.v_cache.ty
        && matches!(op.k_cache.ty, KvType::F16 | KvType::F32);
    // TurboQuant caches (any pair of types): rope_kv_write_turbo, the q/k norms run first.
    // `RUNIT_CUDA_TQ_ROPE_WRITE=0` (a measuring knob) runs the primitives instead.
    static TURBO_FUSED: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let turbo = rotation_fits
        && op.k_cache.ty.is_turbo()
        && op.v_cache.ty.is_turbo()
        && crate::env_count(&TURBO_FUSED, "RUNIT_CUDA_TQ_ROPE_WRITE", 1) != 0;
    // Caches of blocks (Q8_0 or Q4_0 each): rope_kv_write_blocks, opt-in until it has run on
    // a GPU (`RUNIT_CUDA_BLOCK_ROPE_WRITE=1`); else the primitives.
    static BLOCKS_FUSED: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let of_blocks = |ty: KvType| matches!(ty, KvType::Q8_0 | KvType::Q4_0);
    let blocks_fused = rotation_fits
        && of_blocks(op.k_cache.ty)
        && of_blocks(op.v_cache.ty)
        && crate::env_count(&BLOCKS_FUSED, "RUNIT_CUDA_BLOCK_ROPE_WRITE", 0) != 0;
    // Per-head norms of f32 weights of head_dim values run inside the kernel; others first.
    let in_kernel = |w: &Weight| w.ty == GgmlType::F32 && w.shape == [head_dim];
    let norms_in_kernel = fused
        && op
            .qk_norms
            .is_some_and(|n| in_kernel(n.q) && in_kernel(n.k));
    let kernel_norms = op.qk_norms.filter(|_| norms_in_kernel);
    if !norms_in_kernel {
        unfused::qk_norms_in_place(backend, &mut op)?;
    }
    if !fused && !turbo && !blocks_fused {
        backend.rope(op.q, op.positions, q_params, op.freq_factors)?;
        backend.rope(op.k, op.positions, k_params, op.freq_factors)?;
        return backend.kv_write(op.kv_write());
    }
    let RopeKvWrite {
        q,
        k,
        v,
        positions,
        freq_factors,
        k_cache,
        v_cache,
        spans,
        ..
    } = op;
    let tokens = positions.len();
    let q_width = product(OP, "heads × head_dim", q_params.heads, head_dim)?;
    check_len(OP, "q", q, product(OP, "tokens × width", tokens, q_width)?)?;
    check_len(OP, "k", k, product(OP, "tokens × width", tokens, width)?)?;
    // As kv_write: every span's rows in k and v, its cells in the caches.
    check_block_sizes(OP, spans)?;
    for span in spans {
        let rows_end = span.first_row.saturating_add(span.rows);
        let needed = product(OP, "rows × cache width", rows_end, width)?;
        check_len(OP, "k/v elements (rows × cache width)", k, needed)?;
        check_len(OP, "k/v elements (rows × cache width)", v, needed)?;
        let end = span.start_position.saturating_add(span.rows);
        span.check_cells(OP, span.start_position..end, k_cache.n_cells)?;
        span.check_cells(OP, span.start_position..end, v_cache.n_cells)?;
    }
    let factors = freq_factors_address(backend, OP, freq_factors, rotary_dim)?;
    let kv_rows = end_row(spans);
    let blocks = tokens.max(kv_rows);
    if blocks == 0 {
        return Ok(());
    }
    let q_ptr = buffer_ptr(OP, "q", q)?;
    let k_ptr = buffer_ptr(OP, "k", k)?;
    let v_ptr = buffer_ptr(OP, "v", v)?;
    // As ops/rope.rs computes it.
    let theta_scale = k_params.theta.powf(-2.0 / rotary_dim as f32);
    let step = backend.step_inputs(OP, None, Some(positions), Some(spans), None)?;
    let args = (
        factors.unwrap_or(0),
        u32::from(factors.is_some()),
        to_u32(OP, "heads", q_params.heads)?,
        to_u32(OP, "kv heads", k_params.heads)?,
        to_u32(OP, "head_dim", head_dim)?,
        to_u32(OP, "rotary_dim", rotary_dim)?,
    );
    let neox = u32::from(k_params.style == RopeStyle::Neox);
    let k_cells = kv_ptr(OP, "k", k_cache)?;
    let v_cells = kv_ptr(OP, "v", v_cache)?;
    let tokens = to_u32(OP, "tokens", tokens)?;
    let width32 = to_u32(OP, "cache width", width)?;
    let kv_rows = to_u32(OP, "rows", kv_rows)?;
    let (k_n, v_n) = (k_cache.n_cells as u64, v_cache.n_cells as u64);
    // The launch of rope_kv_write_f16/f32 (fused.cu), rope_kv_write_turbo (turbo.cu) or
    // rope_kv_write_blocks (kv.cu): the same parameters up to the caches' cell counts, then
    // each kernel's own.
    macro_rules! launch_rope_kv {
        ($file:expr, $name:expr, $config:expr, $($own:expr),+) => {
            launch!(
                backend,
                OP,
                $file,
                $name,
                $config,
                q_ptr,
                k_ptr,
                v_ptr,
                k_cells,
                v_cells,
                step.ptr,
                args.0,
                args.1,
                args.2,
                args.3,
                args.4,
                args.5,
                theta_scale,
                k_params.freq_scale,
                neox,
                tokens,
                width32,
                kv_rows,
                k_n,
                v_n,
                $($own),+
            )
        };
    }
    if turbo {
        let (_, k_mean, _, k_bits, k_sketch) = super::turbo::cache_args(OP, k_cache)?;
        let (_, v_mean, _, v_bits, v_sketch) = super::turbo::cache_args(OP, v_cache)?;
        // The row writer's blocks; a query head's block rotates with as many threads.
        let config = super::turbo::writer_config(OP, width, blocks, q_params.heads + 2)?;
        return launch_rope_kv!(
            "turbo.cu",
            "rope_kv_write_turbo",
            config,
            backend.turbo_tables()?,
            k_mean,
            v_mean,
            k_bits,
            k_sketch,
            v_bits,
            v_sketch
        );
    }
    if blocks_fused {
        // A row writer's block (kv_write_q8_0/q4_0's shape); a query head's rotates with as
        // many threads.
        let config = LaunchConfig {
            grid_dim: (
                to_u32(OP, "rows", blocks)?,
                to_u32(OP, "heads", q_params.heads + 2)?,
                1,
            ),
            block_dim: (threads_for(width, 256), 1, 1),
            shared_mem_bytes: to_u32(OP, "row bytes", width * 4)?,
        };
        let rotation = |cache: &runit_backend::KvCache| {
            runit_backend::hadamard::llama_rotation(cache.ty, cache.role, cache.head_dim)
                .unwrap_or(0) as u32
        };
        return launch_rope_kv!(
            "kv.cu",
            "rope_kv_write_blocks",
            config,
            u32::from(k_cache.ty == KvType::Q8_0),
            u32::from(v_cache.ty == KvType::Q8_0),
            rotation(k_cache),
            rotation(v_cache)
        );
    }
    // One block per (row, head); a thread per rotary pair (and per two cache elements).
    let config = LaunchConfig {
        grid_dim: (
            to_u32(OP, "rows", blocks)?,
            to_u32(OP, "heads", q_params.heads + k_params.heads)?,
            1,
        ),
        block_dim: (threads_for(head_dim.div_ceil(2), 256), 1, 1),
        shared_mem_bytes: 0,
    };
    let (q_norm, k_norm, norm_eps) = match kernel_norms {
        Some(n) => (
            weight_ptr(OP, "q norm", n.q)?,
            weight_ptr(OP, "k norm", n.k)?,
            n.eps,
        ),
        None => (0, 0, 0.0),
    };
    let name = match k_cache.ty {
        KvType::F16 => "rope_kv_write_f16",
        KvType::F32 => "rope_kv_write_f32",
        other => return Err(crate::kv_type_refused(other, OP)),
    };
    launch_rope_kv!(
        "fused.cu",
        name,
        config,
        q_norm,
        k_norm,
        u32::from(kernel_norms.is_some()),
        norm_eps
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotations_differing_in_more_than_heads_are_not_fused() {
        let q = RopeParams {
            style: RopeStyle::Neox,
            heads: 14,
            head_dim: 64,
            rotary_dim: 64,
            theta: 1e6,
            freq_scale: 1.0,
            yarn: None,
        };
        let k = RopeParams { heads: 2, ..q };
        assert!(same_rotation(&q, &k));
        assert!(!same_rotation(&q, &RopeParams { theta: 1e4, ..k }));
    }
}
