//! AVX2 + FMA (+ F16C) tinyBLAS kernels of the float types, for CPUs without AVX-512: each
//! output keeps the AVX-512 kernels' 16-lane accumulator, as two 256-bit registers (lanes
//! 0..8 and 8..16), takes the same fused multiply-adds per lane and ends in the same
//! reduction, so it equals the scalar twin (and AVX-512) bit for bit.
//!
//! Tiles of two weight rows by up to three tokens (two for BF16): the 12 (8) accumulators
//! and the operands of one half-step fit the 16 registers.
//!
//! BF16 needs `vdpbf16ps`'s flushing of denormals only where one can occur. A bf16 value of
//! exponent field `e >= 1` is a multiple of `2^(e - 134)`. When every nonzero weight of a
//! tile has `e >= e_w >= 1`, every nonzero activation `e >= e_x >= 1` and
//! `e_w + e_x >= 142`, each product and each rounded partial sum is a multiple of
//! `2^(e_w + e_x - 268) >= 2^-126` (f32's smallest normal), so no denormal arises and plain
//! fused multiply-adds give the twin's numbers. Other tiles flush as the twin does.

// The tile loops index the accumulator grid and the operand arrays by the same `r` and `c`.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::{check, prepared_unit_bytes, KernelFn};
use crate::GgmlType;

/// Weight rows per tile.
const ROWS: usize = 2;
/// Activation bytes of the tokens that every weight row meets in turn (kept in L1).
const ACTIVATION_BLOCK_BYTES: usize = 16 << 10;

/// One half (eight lanes) of a float type's accumulator step.
trait Half {
    /// Elements per step (both halves).
    const ELEMENTS: usize;
    /// Bytes of one weight element.
    const WEIGHT_BYTES: usize;
    /// Bytes of one prepared activation element.
    const ACTIVATION_BYTES: usize;
    /// Most tokens per tile.
    const TOKENS: usize;
    /// Weights of one half-step, ready for [`Half::fma`].
    type Weights: Copy;
    /// Activations of one half-step, ready for [`Half::fma`].
    type Activations: Copy;
    /// The eight lanes' weights of the half-step starting at `w`.
    unsafe fn weights(w: *const u8) -> Self::Weights;
    /// The eight lanes' activations of the half-step starting at `x`.
    unsafe fn activations(x: *const u8) -> Self::Activations;
    /// `acc` plus the products of one half-step.
    unsafe fn fma(acc: __m256, w: Self::Weights, x: Self::Activations) -> __m256;
}

struct F32;
struct F16;
/// BF16 for tiles where no denormal can occur.
struct BF16;
/// BF16 with denormal inputs read as zero and denormal results flushed.
struct BF16Flushed;

impl Half for F32 {
    const ELEMENTS: usize = 16;
    const WEIGHT_BYTES: usize = 4;
    const ACTIVATION_BYTES: usize = 4;
    const TOKENS: usize = 3;
    type Weights = __m256;
    type Activations = __m256;
    #[inline(always)]
    unsafe fn weights(w: *const u8) -> __m256 {
        _mm256_loadu_ps(w.cast())
    }
    #[inline(always)]
    unsafe fn activations(x: *const u8) -> __m256 {
        _mm256_loadu_ps(x.cast())
    }
    #[inline(always)]
    unsafe fn fma(acc: __m256, w: __m256, x: __m256) -> __m256 {
        _mm256_fmadd_ps(w, x, acc)
    }
}

impl Half for F16 {
    const ELEMENTS: usize = 16;
    const WEIGHT_BYTES: usize = 2;
    const ACTIVATION_BYTES: usize = 4;
    const TOKENS: usize = 3;
    type Weights = __m256;
    type Activations = __m256;
    #[inline(always)]
    unsafe fn weights(w: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(w.cast()))
    }
    #[inline(always)]
    unsafe fn activations(x: *const u8) -> __m256 {
        _mm256_loadu_ps(x.cast())
    }
    #[inline(always)]
    unsafe fn fma(acc: __m256, w: __m256, x: __m256) -> __m256 {
        _mm256_fmadd_ps(w, x, acc)
    }
}

/// Sixteen bf16 values as f32: (odd elements, even elements). Dword `q` holds elements
/// `2q` (low half) and `2q + 1` (high half).
#[inline(always)]
unsafe fn split_bf16(v: __m256i) -> (__m256, __m256) {
    let odd = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF_0000u32 as i32));
    (
        _mm256_castsi256_ps(odd),
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)),
    )
}

/// Sixteen bf16 values with the denormals made zeros of the same sign.
#[inline(always)]
unsafe fn bf16_denormals_as_zero(v: __m256i) -> __m256i {
    let exponent = _mm256_and_si256(v, _mm256_set1_epi16(0x7F80));
    let denormal = _mm256_cmpeq_epi16(exponent, _mm256_setzero_si256());
    _mm256_andnot_si256(_mm256_and_si256(denormal, _mm256_set1_epi16(0x007F)), v)
}

/// `v` with the denormals flushed to zeros of the same sign.
#[inline(always)]
unsafe fn flush_denormals(v: __m256) -> __m256 {
    let magnitude_bits = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let tiny = _mm256_cmp_ps::<_CMP_LT_OQ>(
        _mm256_and_ps(v, magnitude_bits),
        _mm256_set1_ps(f32::MIN_POSITIVE),
    );
    _mm256_andnot_ps(_mm256_and_ps(tiny, magnitude_bits), v)
}

impl Half for BF16 {
    const ELEMENTS: usize = 32;
    const WEIGHT_BYTES: usize = 2;
    const ACTIVATION_BYTES: usize = 2;
    const TOKENS: usize = 2;
    type Weights = (__m256, __m256);
    type Activations = (__m256, __m256);
    #[inline(always)]
    unsafe fn weights(w: *const u8) -> Self::Weights {
        split_bf16(_mm256_loadu_si256(w.cast()))
    }
    #[inline(always)]
    unsafe fn activations(x: *const u8) -> Self::Activations {
        split_bf16(_mm256_loadu_si256(x.cast()))
    }
    /// `vdpbf16ps` order: the odd element first.
    #[inline(always)]
    unsafe fn fma(acc: __m256, w: Self::Weights, x: Self::Activations) -> __m256 {
        _mm256_fmadd_ps(w.1, x.1, _mm256_fmadd_ps(w.0, x.0, acc))
    }
}

impl Half for BF16Flushed {
    const ELEMENTS: usize = 32;
    const WEIGHT_BYTES: usize = 2;
    const ACTIVATION_BYTES: usize = 2;
    const TOKENS: usize = 2;
    type Weights = (__m256, __m256);
    type Activations = (__m256, __m256);
    #[inline(always)]
    unsafe fn weights(w: *const u8) -> Self::Weights {
        split_bf16(bf16_denormals_as_zero(_mm256_loadu_si256(w.cast())))
    }
    #[inline(always)]
    unsafe fn activations(x: *const u8) -> Self::Activations {
        split_bf16(bf16_denormals_as_zero(_mm256_loadu_si256(x.cast())))
    }
    /// The accumulator needs no flush: it starts at zero and only ever holds flushed sums.
    #[inline(always)]
    unsafe fn fma(acc: __m256, w: Self::Weights, x: Self::Activations) -> __m256 {
        let first = flush_denormals(_mm256_fmadd_ps(w.0, x.0, acc));
        flush_denormals(_mm256_fmadd_ps(w.1, x.1, first))
    }
}

/// One kernel call: `n` elements per row, weight rows `row_bytes` apart from `w`, prepared
/// tokens `unit_bytes` apart from `x`, outputs `[tokens, rows]` at `out`.
#[derive(Clone, Copy)]
struct Operands {
    n: usize,
    w: *const u8,
    row_bytes: usize,
    x: *const u8,
    unit_bytes: usize,
    out: *mut f32,
    rows: usize,
}

/// Weight rows `row..row + R` by tokens `token..token + C`.
#[inline(always)]
unsafe fn tile<S: Half, const R: usize, const C: usize>(on: Operands, row: usize, token: usize) {
    let w = on.w.add(row * on.row_bytes);
    let x = on.x.add(token * on.unit_bytes);
    // acc[r][c][h]: lanes 8h..8h + 8 of output (r, c).
    let mut acc = [[[_mm256_setzero_ps(); 2]; C]; R];
    for step in (0..on.n).step_by(S::ELEMENTS) {
        for h in 0..2 {
            let element = step + h * S::ELEMENTS / 2;
            let mut weights = [S::weights(w.add(element * S::WEIGHT_BYTES)); R];
            for r in 1..R {
                weights[r] = S::weights(w.add(r * on.row_bytes + element * S::WEIGHT_BYTES));
            }
            for c in 0..C {
                let activations =
                    S::activations(x.add(c * on.unit_bytes + element * S::ACTIVATION_BYTES));
                for r in 0..R {
                    acc[r][c][h] = S::fma(acc[r][c][h], weights[r], activations);
                }
            }
        }
    }
    for r in 0..R {
        for c in 0..C {
            *on.out.add((token + c) * on.rows + row + r) = reduce16(acc[r][c]);
        }
    }
}

/// Weight rows `row..row + R` against `tokens`, `S::TOKENS` at a time, then the rest; a
/// tile runs `S` where `fast(rows, tokens)` holds, `Slow` otherwise.
#[inline(always)]
unsafe fn row_tiles<S: Half, Slow: Half, const R: usize>(
    on: Operands,
    row: usize,
    tokens: Range<usize>,
    fast: &impl Fn(Range<usize>, Range<usize>) -> bool,
) {
    for token in tokens.clone().step_by(S::TOKENS) {
        let count = (tokens.end - token).min(S::TOKENS);
        let is_fast = fast(row..row + R, token..token + count);
        match (count, is_fast) {
            (3, true) => tile::<S, R, 3>(on, row, token),
            (2, true) => tile::<S, R, 2>(on, row, token),
            (_, true) => tile::<S, R, 1>(on, row, token),
            (3, false) => tile::<Slow, R, 3>(on, row, token),
            (2, false) => tile::<Slow, R, 2>(on, row, token),
            (_, false) => tile::<Slow, R, 1>(on, row, token),
        }
    }
}

/// The scalar twin's `reduce16`: lanes `q + (q + 8)`, then `hsum_float_8`.
#[inline(always)]
unsafe fn reduce16(halves: [__m256; 2]) -> f32 {
    let eight = _mm256_add_ps(halves[0], halves[1]);
    let quad = _mm_add_ps(
        _mm256_castps256_ps128(eight),
        _mm256_extractf128_ps::<1>(eight),
    );
    let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)))
}

/// The smallest magnitude (sign cleared) among the nonzero bf16 values in `bytes`,
/// `u16::MAX` when all are zero.
#[inline(always)]
fn smallest_bf16_magnitude(bytes: &[u8]) -> u16 {
    let below = bytes
        .chunks_exact(2)
        .map(|b| (u16::from_le_bytes([b[0], b[1]]) & 0x7FFF).wrapping_sub(1))
        .fold(u16::MAX, u16::min);
    if below == u16::MAX {
        u16::MAX
    } else {
        below + 1
    }
}

/// True when bf16 products of values no smaller than `w` and `x` (magnitudes from
/// [`smallest_bf16_magnitude`]) and their sums cannot be denormal (see the module doc).
fn denormal_free(w: u16, x: u16) -> bool {
    let (e_w, e_x) = (w >> 7, x >> 7);
    w == u16::MAX || x == u16::MAX || (e_w >= 1 && e_x >= 1 && e_w + e_x >= 142)
}

/// Every weight row (two at a time, then one) against every token, the tokens in blocks
/// whose activations stay in L1 while all the rows pass ([`row_tiles`]).
#[inline(always)]
unsafe fn run<S: Half, Slow: Half>(
    n: usize,
    w: &[u8],
    prepared: &[u8],
    tokens: usize,
    out: &mut [f32],
    fast: impl Fn(Range<usize>, Range<usize>) -> bool,
) {
    let rows = out.len() / tokens.max(1);
    if rows == 0 || tokens == 0 {
        return;
    }
    let on = Operands {
        n,
        w: w.as_ptr(),
        row_bytes: w.len() / rows,
        x: prepared.as_ptr(),
        unit_bytes: n * S::ACTIVATION_BYTES,
        out: out.as_mut_ptr(),
        rows,
    };
    let block = (ACTIVATION_BLOCK_BYTES / on.unit_bytes)
        .max(1)
        .next_multiple_of(S::TOKENS);
    let paired = rows - rows % ROWS;
    for first in (0..tokens).step_by(block) {
        let block_tokens = first..(first + block).min(tokens);
        for row in (0..paired).step_by(ROWS) {
            row_tiles::<S, Slow, ROWS>(on, row, block_tokens.clone(), &fast);
        }
        for row in paired..rows {
            row_tiles::<S, Slow, 1>(on, row, block_tokens.clone(), &fast);
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn run_f32(n: usize, w: &[u8], prepared: &[u8], tokens: usize, out: &mut [f32]) {
    run::<F32, F32>(n, w, prepared, tokens, out, |_, _| true);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_f16(n: usize, w: &[u8], prepared: &[u8], tokens: usize, out: &mut [f32]) {
    run::<F16, F16>(n, w, prepared, tokens, out, |_, _| true);
}

#[target_feature(enable = "avx2,fma")]
unsafe fn run_bf16(n: usize, w: &[u8], prepared: &[u8], tokens: usize, out: &mut [f32]) {
    let bytes_per_row = 2 * n;
    let smallest = |bytes: &[u8]| -> Vec<u16> {
        bytes
            .chunks_exact(bytes_per_row)
            .map(smallest_bf16_magnitude)
            .collect()
    };
    let (rows, units) = (smallest(w), smallest(&prepared[..tokens * bytes_per_row]));
    let fast = |r: Range<usize>, t: Range<usize>| {
        let least = |values: &[u16]| values.iter().copied().fold(u16::MAX, u16::min);
        denormal_free(least(&rows[r]), least(&units[t]))
    };
    run::<BF16, BF16Flushed>(n, w, prepared, tokens, out, fast);
}

/// Stamps out a safe kernel around one of the `run_*` functions.
macro_rules! kernel_of {
    ($run:ident, $step:ty, $ty:expr) => {{
        fn kernel(n: usize, w: &[u8], prepared: &[u8], tokens: usize, out: &mut [f32]) {
            check($ty, n, w, prepared, tokens, out);
            assert!(
                n.is_multiple_of(<$step as Half>::ELEMENTS),
                "rows of {n} are not whole tinyBLAS steps"
            );
            debug_assert_eq!(
                n * <$step as Half>::ACTIVATION_BYTES,
                prepared_unit_bytes($ty, n)
            );
            // SAFETY: `tinyblas::kernel` hands this out only where
            // `SimdLevel::Avx2.is_available()` confirmed AVX2, FMA and F16C; `check`
            // confirmed that the weight rows, the prepared units of every token and `out`
            // hold what `run` reads and writes, and `n` is a whole number of steps.
            unsafe { $run(n, w, prepared, tokens, out) }
        }
        kernel as KernelFn
    }};
}

/// The AVX2 kernel of a float type (the caller checked AVX2, FMA and F16C).
pub(super) fn kernel(ty: GgmlType) -> Option<KernelFn> {
    Some(match ty {
        GgmlType::F32 => kernel_of!(run_f32, F32, GgmlType::F32),
        GgmlType::F16 => kernel_of!(run_f16, F16, GgmlType::F16),
        GgmlType::BF16 => kernel_of!(run_bf16, BF16, GgmlType::BF16),
        _ => return None,
    })
}
