//! Rotary position embedding, as ggml's CPU `rope` computes it (with YaRN's corrections when
//! the rotation has them: `RopeParams::corrections`).
//!
//! For each token, ggml fills a cos/sin cache with a running angle in f32: `θ₀ = pos`, and
//! after each pair `θ *= base^(-2/rotary_dim)`; pair `i` uses `freq_scale * (θᵢ / factor[i])`
//! with `factor` the optional `rope_freqs` tensor. Normal style rotates `(x[2i], x[2i+1])`,
//! NEOX style `(x[i], x[i + rotary_dim/2])`; dims past `rotary_dim` are left as they are.
//! The rotation fuses one product of each output as gcc does ([`rotate_pair`]); cos and sin
//! come from libm's `cosf`/`sinf`, as in ggml ([`RopeParams::angles`]).

use runit_backend::{
    unfused, BackendError, Buffer, PrimitiveOps, RopeKvWrite, RopeParams, RopeStyle, Weight,
};

use crate::storage::{at_least, data_mut, exactly, product, weight_f32};
use crate::{CpuBackend, SharedRows};

const OP: &str = "rope";

/// Rotates every head of the `positions.len()` token rows of `x` in place.
pub fn rope(
    backend: &CpuBackend,
    x: &mut Buffer,
    positions: &[u32],
    params: &RopeParams,
    freq_factors: Option<&Weight>,
) -> Result<(), BackendError> {
    rope_both(backend, x, None, positions, params, params, freq_factors)
}

/// [`FusedOps::rope_kv_write`](runit_backend::FusedOps::rope_kv_write): the cache rows the
/// write stores to prefetched (`kv_write::prefetch_destinations`) while the QK norms and the
/// RoPE run, the QK norms as the default runs them, the queries and keys rotated with one
/// angle table per token ([`rope_both`]; the default computes it twice), then the write.
pub fn rope_kv_write(backend: &CpuBackend, mut op: RopeKvWrite<'_>) -> Result<(), BackendError> {
    super::kv_write::prefetch_destinations(op.k_cache, op.v_cache, op.spans);
    unfused::qk_norms_in_place(backend, &mut op)?;
    let (positions, factors) = (op.positions, op.freq_factors);
    rope_both(
        backend,
        op.q,
        Some(&mut *op.k),
        positions,
        op.q_rope,
        op.k_rope,
        factors,
    )?;
    backend.kv_write(op.kv_write())
}

/// [`rope`] of `q` with `q_params` and, when given, of `k` with `k_params` (the same
/// positions and factors): each token's angles are computed once for both where the two
/// rotate alike (the same style, dims, base and scale; only the head counts differ), and
/// the tokens are split among the threads (a decode step's eight rows are too few for
/// `for_rows`, but their libm `cosf`/`sinf` calls are most of this op).
pub fn rope_both(
    backend: &CpuBackend,
    q: &mut Buffer,
    k: Option<&mut Buffer>,
    positions: &[u32],
    q_params: &RopeParams,
    k_params: &RopeParams,
    freq_factors: Option<&Weight>,
) -> Result<(), BackendError> {
    let alike = |a: &RopeParams, b: &RopeParams| {
        let key = |p: &RopeParams| {
            let (theta, scale) = (p.theta.to_bits(), p.freq_scale.to_bits());
            (p.style, p.head_dim, p.rotary_dim, theta, scale)
        };
        key(a) == key(b) && a.yarn == b.yarn
    };
    match k {
        Some(k) if !alike(q_params, k_params) => {
            rope_both(
                backend,
                q,
                None,
                positions,
                q_params,
                q_params,
                freq_factors,
            )?;
            rope_both(
                backend,
                k,
                None,
                positions,
                k_params,
                k_params,
                freq_factors,
            )
        }
        Some(k) => {
            let k = checked(k, positions, k_params)?;
            let q = checked(q, positions, q_params)?;
            rotate_tokens(
                backend,
                q,
                Some(k),
                positions,
                q_params,
                k_params,
                freq_factors,
            )
        }
        None => {
            let q = checked(q, positions, q_params)?;
            rotate_tokens(
                backend,
                q,
                None,
                positions,
                q_params,
                k_params,
                freq_factors,
            )
        }
    }
}

/// The token rows of `x` that `params` rotate, after the shape checks.
fn checked<'b>(
    x: &'b mut Buffer,
    positions: &[u32],
    params: &RopeParams,
) -> Result<&'b mut [f32], BackendError> {
    let (head_dim, rotary_dim) = (params.head_dim, params.rotary_dim);
    if !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
        return Err(BackendError::Shape {
            op: OP,
            what: "rotary_dim (even, at most head_dim)",
            expected: head_dim,
            found: rotary_dim,
        });
    }
    let width = product(OP, "heads × head_dim", params.heads, head_dim)?;
    let len = product(OP, "tokens × width", positions.len(), width)?;
    let x = data_mut(x, OP, "x")?;
    at_least(OP, "x elements", len, x.len())?;
    Ok(&mut x[..len])
}

/// Tokens from which [`rotate_tokens`] splits its work among the threads.
const PARALLEL_TOKENS: usize = 4;

/// Rotates each token's row of `q` (and of `k`) with the token's angles.
fn rotate_tokens(
    backend: &CpuBackend,
    q: &mut [f32],
    k: Option<&mut [f32]>,
    positions: &[u32],
    q_params: &RopeParams,
    k_params: &RopeParams,
    freq_factors: Option<&Weight>,
) -> Result<(), BackendError> {
    let rotary_dim = q_params.rotary_dim;
    let factors = match freq_factors {
        Some(weight) => {
            let values = weight_f32(weight, OP)?;
            exactly(OP, "rope_freqs elements", rotary_dim / 2, values.len())?;
            Some(values)
        }
        None => None,
    };
    if rotary_dim == 0 {
        return Ok(());
    }
    let q_width = q_params.heads * q_params.head_dim;
    let k_width = k_params.heads * k_params.head_dim;
    let q_rows = SharedRows::new(q, q_width);
    let k_rows = k.map(|k| SharedRows::new(k, k_width));
    let token = |t: usize| {
        let mut cache = [(0.0f32, 0.0f32); MAX_CACHED_PAIRS];
        let mut heap = Vec::new();
        let cache: &mut [(f32, f32)] = if rotary_dim / 2 <= MAX_CACHED_PAIRS {
            &mut cache[..rotary_dim / 2]
        } else {
            heap.resize(rotary_dim / 2, (0.0, 0.0));
            &mut heap
        };
        q_params.angles(positions[t], factors.as_deref(), cache);
        let rows = [
            Some((&q_rows, q_params)),
            k_rows.as_ref().map(|k| (k, k_params)),
        ];
        for (rows, params) in rows.into_iter().flatten() {
            // SAFETY: token `t`'s row, which only this call touches (each token is one
            // chunk), so no other reference to it is alive; `row` asserts that it lies
            // inside the buffer, which outlives `run_chunks`.
            let row = unsafe { rows.row(t) };
            for head in row.chunks_exact_mut(params.head_dim) {
                rotate_head(params.style, cache, &mut head[..rotary_dim]);
            }
        }
    };
    let tokens = positions.len();
    if backend.threads > 1 && tokens >= PARALLEL_TOKENS {
        backend.run_chunks(tokens, &token);
    } else {
        (0..tokens).for_each(token);
    }
    Ok(())
}

/// Pairs whose angles one token keeps on the stack (a head of 256 dimensions).
const MAX_CACHED_PAIRS: usize = 128;

/// One rotated pair as ggml computes it: gcc contracts `x0*cos - x1*sin` and
/// `x0*sin + x1*cos` into a fused multiply-add on the first product of each.
#[inline(always)]
fn rotate_pair(x0: f32, x1: f32, cos: f32, sin: f32) -> (f32, f32) {
    (x0.mul_add(cos, -(x1 * sin)), x0.mul_add(sin, x1 * cos))
}

/// Rotates the first `rotary_dim` elements of one head (`head.len() == rotary_dim`).
fn rotate_head(style: RopeStyle, cache: &[(f32, f32)], head: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if runit_quant::cpu::may_use(runit_quant::cpu::Feature::Fma) {
        // SAFETY: `may_use` just above confirmed the one feature `rotate_head_fma` is
        // compiled with.
        return unsafe { rotate_head_fma(style, cache, head) };
    }
    rotate_head_portable(style, cache, head);
}

/// [`rotate_head`] compiled with FMA, so the fused multiply-adds of `rotate_pair` are single
/// instructions instead of library calls; the same operations and results.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn rotate_head_fma(style: RopeStyle, cache: &[(f32, f32)], head: &mut [f32]) {
    rotate_head_portable(style, cache, head);
}

/// The body of [`rotate_head`], inlined into each compiled variant.
#[inline(always)]
fn rotate_head_portable(style: RopeStyle, cache: &[(f32, f32)], head: &mut [f32]) {
    match style {
        RopeStyle::Normal => {
            for (pair, &(cos, sin)) in head.chunks_exact_mut(2).zip(cache) {
                let (x0, x1) = (pair[0], pair[1]);
                (pair[0], pair[1]) = rotate_pair(x0, x1, cos, sin);
            }
        }
        RopeStyle::Neox => {
            let (first, second) = head.split_at_mut(cache.len());
            for ((a, b), &(cos, sin)) in first.iter_mut().zip(second.iter_mut()).zip(cache) {
                let (x0, x1) = (*a, *b);
                (*a, *b) = rotate_pair(x0, x1, cos, sin);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(style: RopeStyle) -> RopeParams {
        RopeParams {
            style,
            heads: 1,
            head_dim: 4,
            rotary_dim: 4,
            theta: 100.0,
            freq_scale: 1.0,
            yarn: None,
        }
    }

    #[test]
    fn rotates_a_known_vector() {
        // base 100, rotary_dim 4: pair 0 turns by pos, pair 1 by pos / 10.
        let mut cache = [(0.0, 0.0); 2];
        params(RopeStyle::Normal).angles(3, None, &mut cache);
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let (a0, a1) = (3.0f64, 0.3f64);
        let mut normal = x;
        rotate_head(RopeStyle::Normal, &cache, &mut normal);
        let expected = [
            a0.cos() - 2.0 * a0.sin(),
            a0.sin() + 2.0 * a0.cos(),
            3.0 * a1.cos() - 4.0 * a1.sin(),
            3.0 * a1.sin() + 4.0 * a1.cos(),
        ];
        for (got, want) in normal.iter().zip(expected) {
            assert!((f64::from(*got) - want).abs() < 1e-5, "{got} vs {want}");
        }
        let mut neox = x;
        rotate_head(RopeStyle::Neox, &cache, &mut neox);
        let expected = [
            a0.cos() - 3.0 * a0.sin(),
            2.0 * a1.cos() - 4.0 * a1.sin(),
            a0.sin() + 3.0 * a0.cos(),
            2.0 * a1.sin() + 4.0 * a1.cos(),
        ];
        for (got, want) in neox.iter().zip(expected) {
            assert!((f64::from(*got) - want).abs() < 1e-5, "{got} vs {want}");
        }
    }

    #[test]
    fn factors_and_scale_divide_the_angle() {
        let mut p = params(RopeStyle::Normal);
        p.freq_scale = 0.5;
        let mut cache = [(0.0, 0.0); 2];
        p.angles(8, Some(&[2.0, 4.0]), &mut cache);
        // pair 0: 0.5 * 8 / 2 = 2; pair 1: 0.5 * 0.8 / 4 = 0.1.
        assert!((cache[0].0 - 2.0f32.cos()).abs() < 1e-6);
        assert!((cache[1].1 - 0.1f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn position_zero_is_identity() {
        let mut cache = [(0.0, 0.0); 2];
        params(RopeStyle::Neox).angles(0, None, &mut cache);
        let mut x = [1.0f32, -2.0, 3.5, 4.0];
        rotate_head(RopeStyle::Neox, &cache, &mut x);
        assert_eq!(x, [1.0, -2.0, 3.5, 4.0]);
    }
}
