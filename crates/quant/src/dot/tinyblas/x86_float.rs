//! AVX-512 tinyBLAS kernels of the float types: tiles of four weight rows by up to six
//! tokens, one 16-lane accumulator per output over the whole row (llamafile's `gemm_bloc`),
//! F16 weights widened with `vcvtph2ps`, BF16 through `vdpbf16ps` where the CPU has it and
//! through the same two fused multiply-adds per lane otherwise.

// The tile loops index the accumulator grid and the operand arrays by the same `r` and `c`.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{check, prepared_unit_bytes, KernelFn};
use crate::GgmlType;

/// Weight rows per tile.
const ROWS: usize = 4;
/// Most tokens per tile (4 x 6 accumulators + 10 operands fit the 32 registers).
const TOKENS: usize = 6;

/// AVX-512 BF16 (`vdpbf16ps`), as [`crate::cpu`] allows it.
fn has_bf16() -> bool {
    crate::cpu::may_use(crate::cpu::Feature::Avx512Bf16)
}

/// One accumulator step of a float type.
trait Step {
    /// Elements per step.
    const ELEMENTS: usize;
    /// Bytes of one weight element.
    const WEIGHT_BYTES: usize;
    /// Bytes of one prepared activation element.
    const ACTIVATION_BYTES: usize;
    /// `acc` plus the products of one step of weights at `w` and activations at `x`.
    unsafe fn step(acc: __m512, w: *const u8, x: *const u8) -> __m512;
}

struct F32;
struct F16;
/// BF16 with `vdpbf16ps`.
struct BF16;
/// BF16 with two FMAs per lane (CPUs without AVX512_BF16).
struct BF16Emulated;

impl Step for F32 {
    const ELEMENTS: usize = 16;
    const WEIGHT_BYTES: usize = 4;
    const ACTIVATION_BYTES: usize = 4;
    #[inline(always)]
    unsafe fn step(acc: __m512, w: *const u8, x: *const u8) -> __m512 {
        _mm512_fmadd_ps(_mm512_loadu_ps(w.cast()), _mm512_loadu_ps(x.cast()), acc)
    }
}

impl Step for F16 {
    const ELEMENTS: usize = 16;
    const WEIGHT_BYTES: usize = 2;
    const ACTIVATION_BYTES: usize = 4;
    #[inline(always)]
    unsafe fn step(acc: __m512, w: *const u8, x: *const u8) -> __m512 {
        let weights = _mm512_cvtph_ps(_mm256_loadu_si256(w.cast()));
        _mm512_fmadd_ps(weights, _mm512_loadu_ps(x.cast()), acc)
    }
}

impl Step for BF16 {
    const ELEMENTS: usize = 32;
    const WEIGHT_BYTES: usize = 2;
    const ACTIVATION_BYTES: usize = 2;
    #[inline(always)]
    unsafe fn step(acc: __m512, w: *const u8, x: *const u8) -> __m512 {
        let weights: __m512bh = std::mem::transmute(_mm512_loadu_si512(w.cast()));
        let activations: __m512bh = std::mem::transmute(_mm512_loadu_si512(x.cast()));
        _mm512_dpbf16_ps(acc, weights, activations)
    }
}

impl Step for BF16Emulated {
    const ELEMENTS: usize = 32;
    const WEIGHT_BYTES: usize = 2;
    const ACTIVATION_BYTES: usize = 2;
    /// Each dword holds elements `2q` (low half) and `2q + 1` (high half); as f32 they are
    /// the dword shifted left by 16 and the dword with its low half cleared. Differs from
    /// `vdpbf16ps` only where a denormal would be flushed.
    #[inline(always)]
    unsafe fn step(acc: __m512, w: *const u8, x: *const u8) -> __m512 {
        crate::dot::x86::float::dpbf16_emulated_512(
            acc,
            _mm512_loadu_si512(w.cast()),
            _mm512_loadu_si512(x.cast()),
        )
    }
}

/// `R` weight rows (`row_bytes` apart) by `C` tokens (`unit_bytes` apart); output
/// `(r, c)` goes to `out[c * out_stride + r]`.
#[inline(always)]
unsafe fn tile<S: Step, const R: usize, const C: usize>(
    n: usize,
    w: *const u8,
    row_bytes: usize,
    x: *const u8,
    unit_bytes: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    for step in (0..n).step_by(S::ELEMENTS) {
        let mut weights = [w; R];
        for (r, at) in weights.iter_mut().enumerate() {
            *at = w.add(r * row_bytes + step * S::WEIGHT_BYTES);
        }
        for c in 0..C {
            let activations = x.add(c * unit_bytes + step * S::ACTIVATION_BYTES);
            for r in 0..R {
                acc[r][c] = S::step(acc[r][c], weights[r], activations);
            }
        }
    }
    for r in 0..R {
        for c in 0..C {
            *out.add(c * out_stride + r) = reduce16(acc[r][c]);
        }
    }
}

/// `_mm512_reduce_add_ps` as gcc expands it: upper 256 bits onto the lower, then
/// `hsum_float_8`.
#[inline(always)]
unsafe fn reduce16(v: __m512) -> f32 {
    let eight = _mm256_add_ps(
        _mm512_castps512_ps256(v),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
    );
    let quad = _mm_add_ps(
        _mm256_extractf128_ps::<1>(eight),
        _mm256_castps256_ps128(eight),
    );
    let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)))
}

/// Every weight row (four at a time, then one at a time) against every token (six at a
/// time, then the rest), token blocks outermost: a block's activations (six rows of f32)
/// stay in L1 while the weight rows, a quarter of their bytes per element, stream past
/// them from L2 (rows outermost streamed every token's activations from L2 per four rows).
/// Each output's arithmetic is the same in either order.
#[inline(always)]
unsafe fn run<S: Step>(n: usize, w: &[u8], prepared: &[u8], tokens: usize, out: &mut [f32]) {
    let rows = out.len() / tokens.max(1);
    if rows == 0 || tokens == 0 {
        return;
    }
    let row_bytes = w.len() / rows;
    let unit_bytes = n * S::ACTIVATION_BYTES;
    let (w, x, o) = (w.as_ptr(), prepared.as_ptr(), out.as_mut_ptr());
    let mut t = 0;
    while t < tokens {
        let count = (tokens - t).min(TOKENS);
        let mut r = 0;
        while r < rows {
            let take = if rows - r >= ROWS { ROWS } else { 1 };
            let (wr, xt, ot) = (
                w.add(r * row_bytes),
                x.add(t * unit_bytes),
                o.add(t * rows + r),
            );
            macro_rules! go {
                ($rows:literal) => {
                    match count {
                        6 => tile::<S, $rows, 6>(n, wr, row_bytes, xt, unit_bytes, ot, rows),
                        5 => tile::<S, $rows, 5>(n, wr, row_bytes, xt, unit_bytes, ot, rows),
                        4 => tile::<S, $rows, 4>(n, wr, row_bytes, xt, unit_bytes, ot, rows),
                        3 => tile::<S, $rows, 3>(n, wr, row_bytes, xt, unit_bytes, ot, rows),
                        2 => tile::<S, $rows, 2>(n, wr, row_bytes, xt, unit_bytes, ot, rows),
                        _ => tile::<S, $rows, 1>(n, wr, row_bytes, xt, unit_bytes, ot, rows),
                    }
                };
            }
            if take == ROWS {
                go!(4)
            } else {
                go!(1)
            }
            r += take;
        }
        t += count;
    }
}

/// Stamps out a safe kernel for one step type and its target features.
macro_rules! kernel_of {
    ($step:ty, $ty:expr, $features:literal) => {{
        #[target_feature(enable = $features)]
        unsafe fn inner(n: usize, w: &[u8], prepared: &[u8], tokens: usize, out: &mut [f32]) {
            run::<$step>(n, w, prepared, tokens, out);
        }
        fn kernel(n: usize, w: &[u8], prepared: &[u8], tokens: usize, out: &mut [f32]) {
            check($ty, n, w, prepared, tokens, out);
            assert!(
                n.is_multiple_of(<$step as Step>::ELEMENTS),
                "rows of {n} are not whole tinyBLAS steps"
            );
            debug_assert_eq!(
                n * <$step as Step>::ACTIVATION_BYTES,
                prepared_unit_bytes($ty, n)
            );
            // SAFETY: `tinyblas::kernel` hands this out only where
            // `SimdLevel::Avx512.is_available()` confirmed AVX2, FMA, F16C and AVX-512
            // F/BW/VL, and the BF16 variant only where `has_bf16` detected AVX512_BF16;
            // `check` confirmed that the weight rows, the prepared units of every token and `out`
            // hold what `run` reads and writes, and `n` is a whole number of steps.
            unsafe { inner(n, w, prepared, tokens, out) }
        }
        kernel as KernelFn
    }};
}

/// The AVX-512 kernel of a float type (the caller checked AVX-512 F/BW/VL).
pub(super) fn kernel(ty: GgmlType) -> Option<KernelFn> {
    Some(match ty {
        GgmlType::F32 => kernel_of!(F32, GgmlType::F32, "avx512f,avx512vl,avx2,fma"),
        GgmlType::F16 => kernel_of!(F16, GgmlType::F16, "avx512f,avx512vl,avx2,fma,f16c"),
        GgmlType::BF16 if has_bf16() => {
            kernel_of!(BF16, GgmlType::BF16, "avx512f,avx512vl,avx512bf16,avx2,fma")
        }
        GgmlType::BF16 => kernel_of!(BF16Emulated, GgmlType::BF16, "avx512f,avx512vl,avx2,fma"),
        _ => return None,
    })
}
