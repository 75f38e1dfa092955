//! F16 weight rows against a few activation rows, each dot product in the single-row order
//! of `ggml_vec_dot_f16` on an AVX512-FP16 machine (`dot::float::dot_f16`, bit for bit):
//! speculative verification runs its rows so, and a row-by-row loop spent ~39 ns on each
//! 576-wide dot, mostly outside the native multiply-adds. Here the work that does not
//! depend on both operands is done once: each weight row's leftover (the `n % 128` elements
//! ggml adds in f64) is widened and measured once for all tokens, each token's once for
//! all rows; the native parts' reductions run 32 dots at a time ([`half_native::reduce_32`]).
//!
//! The leftover sum is exact whenever no partial sum can round: every product is a multiple
//! of `2^(qx + qy)` (the smallest last-bit exponents among the row's and the token's
//! nonzero values) and the start (the native part's f16) a multiple of its own last bit, so
//! while `|start| + sum|x| * max|y|` stays below `2^(52 + q)` every partial sum in any order
//! is exact in f64 and equals ggml's in-order sum. Where that bound fails (or a value is not
//! finite, or the sum is zero, whose sign the order decides) the dot is finished as the
//! single-row kernel finishes it.

use std::arch::x86_64::*;

use half::f16;

use super::half_native::{self, body_tokens, reduce_32, reduce_32_slot};
use crate::dot::batched::TileOut;
use crate::dot::float::dot_f16_finish;
use crate::dot::half_arith;

/// Dots reduced together.
const GROUP: usize = 32;
/// Activation rows whose native parts run side by side against one weight row.
const TOKENS_AT_ONCE: usize = 4;

/// True when this CPU runs [`tile_rows_f16`] (AVX512-FP16 with AVX-512 F/BW/VL/DQ).
pub(super) fn available() -> bool {
    half_native::has_avx512_fp16() && super::has_avx512_dq()
}

/// A row's or a token's leftover: its largest magnitude and the smallest last-bit exponent
/// among its nonzero values, when every value is finite and one is nonzero.
#[derive(Clone, Copy)]
struct Leftover {
    largest: f64,
    last_bit: i32,
}

/// Up to [`GROUP`] dots whose native parts wait to be reduced together, and what each needs
/// then, one array per field (so that the finish runs eight dots per instruction).
struct Pending {
    /// The registers [`reduce_32`] takes, dot `i` at `reduce_32_slot(i)`.
    staged: [__m512i; GROUP],
    rows: [usize; GROUP],
    tokens: [usize; GROUP],
    /// The leftover products' sums in eight lanes each (their total is exact when the
    /// bound holds, whatever the order).
    sums: [__m512d; GROUP],
    /// `sum|x| * max|y|` (an upper bound of the products' magnitudes); infinite where a
    /// dot must take the single-row finish.
    bounds: [f64; GROUP],
    /// The products' common last-bit exponents.
    last_bits: [i32; GROUP],
    count: usize,
}

/// `tile_rows` for F16 (a [`PlainTileRowsFn`](crate::dot::PlainTileRowsFn)): every row of
/// `weight_rows` against every row of `activations` (rows of `n` f16 values back to back),
/// row `r`'s result for token `c` to `out`'s `[c * stride + r]`, each as `dot_f16`.
pub(super) fn tile_rows_f16(n: usize, weight_rows: &[u8], activations: &[u8], out: TileOut<'_>) {
    let row_bytes = 2 * n;
    assert!(available(), "the F16 tile needs AVX512-FP16 and AVX-512 DQ");
    assert_eq!(
        weight_rows.len(),
        out.rows() * row_bytes,
        "{} F16 weight rows of {n} elements",
        out.rows()
    );
    assert_eq!(
        activations.len(),
        out.tokens() * row_bytes,
        "{} F16 activation rows of {n} elements",
        out.tokens()
    );
    // SAFETY: `available` confirmed the features; the lengths were checked above, and
    // `out`'s contract makes its cells writable.
    unsafe { tile(n, weight_rows, activations, out) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c")]
unsafe fn tile(n: usize, weight_rows: &[u8], activations: &[u8], mut out: TileOut<'_>) {
    let (rows, tokens, stride) = (out.rows(), out.tokens(), out.stride());
    let row_bytes = 2 * n;
    let native = half_arith::body_len(n);
    let rest = n - native;
    // The leftovers widened to f64 in whole registers, zero-padded.
    let wide = rest.div_ceil(8) * 8;
    let mut token_rests = vec![0.0f64; tokens * wide];
    let token_stats: Vec<Option<Leftover>> = (0..tokens)
        .map(|t| {
            let values = activations[t * row_bytes + 2 * native..(t + 1) * row_bytes].as_ptr();
            // SAFETY: `rest` values follow `values`; `token_rests` holds `wide >= rest`
            // per token.
            unsafe {
                widen(
                    values.cast(),
                    rest,
                    &mut token_rests[t * wide..(t + 1) * wide],
                );
                leftover(values.cast(), rest)
            }
        })
        .collect();
    let mut row_rest = vec![0.0f64; wide];
    let mut pending = Pending {
        staged: [_mm512_setzero_si512(); GROUP],
        rows: [0; GROUP],
        tokens: [0; GROUP],
        sums: [_mm512_setzero_pd(); GROUP],
        bounds: [0.0; GROUP],
        last_bits: [0; GROUP],
        count: 0,
    };
    let cells = Cells {
        n,
        weight_rows,
        activations,
        start: out.start(),
        stride,
    };
    let weights = weight_rows.as_ptr().cast::<f16>();
    for row in 0..rows {
        let w = weights.wrapping_add(row * n);
        // SAFETY: row `row` holds `n` values, `rest` of them past `native`.
        let (sum_x, row_stats) = unsafe {
            (
                widen(w.add(native), rest, &mut row_rest),
                leftover(w.add(native), rest),
            )
        };
        let next = w.wrapping_add(n);
        let mut token = 0;
        while token < tokens {
            let group = TOKENS_AT_ONCE.min(tokens - token);
            let y = |i: usize| {
                activations
                    .as_ptr()
                    .cast::<f16>()
                    .wrapping_add((token + i) * n)
            };
            let rests = token_rests[token * wide..].as_ptr();
            // SAFETY: the weight row and activation rows `token..token + group` hold `n`
            // values each, `native` of them in the body; `row_rest` and the group's rows of
            // `token_rests` hold `wide` values each, a multiple of 8.
            let (sums, products) = unsafe {
                match group {
                    4 => (
                        body_tokens::<4>(w, [y(0), y(1), y(2), y(3)], native, next),
                        products::<4>(&row_rest, rests, wide),
                    ),
                    3 => (
                        pad(body_tokens::<3>(w, [y(0), y(1), y(2)], native, next)),
                        pad(products::<3>(&row_rest, rests, wide)),
                    ),
                    2 => (
                        pad(body_tokens::<2>(w, [y(0), y(1)], native, next)),
                        pad(products::<2>(&row_rest, rests, wide)),
                    ),
                    _ => (
                        pad(body_tokens::<1>(w, [y(0)], native, next)),
                        pad(products::<1>(&row_rest, rests, wide)),
                    ),
                }
            };
            for (i, sum) in sums.into_iter().take(group).enumerate() {
                let t = token + i;
                let dot = pending.count;
                pending.staged[reduce_32_slot(dot)] = sum;
                pending.rows[dot] = row;
                pending.tokens[dot] = t;
                pending.sums[dot] = products[i];
                (pending.bounds[dot], pending.last_bits[dot]) = match (row_stats, token_stats[t]) {
                    (Some(x), Some(y)) => (sum_x * y.largest, x.last_bit + y.last_bit),
                    _ => (f64::INFINITY, 0),
                };
                pending.count += 1;
                if pending.count == GROUP {
                    // SAFETY: the features are this function's; `pending` names cells of
                    // `out`.
                    unsafe { finish(&mut pending, &cells) };
                }
            }
            token += group;
        }
    }
    if pending.count > 0 {
        // SAFETY: as above.
        unsafe { finish(&mut pending, &cells) };
    }
}

/// What [`finish`] reads and writes besides the pending dots.
struct Cells<'a> {
    n: usize,
    weight_rows: &'a [u8],
    activations: &'a [u8],
    /// `out`'s first cell, and the distance between its tokens' runs.
    start: *mut f32,
    stride: usize,
}

/// Reduces the pending dots' native parts and writes each dot's result: where its bound
/// holds, `start + sum` (eight dots per instruction), else as `dot_f16_finish` makes it.
/// Empties `pending`.
///
/// # Safety
/// Requires AVX512-FP16 and AVX-512 F/BW/VL/DQ; every pending `(row, token)` names a cell
/// of `cells`' output that nothing else reads or writes meanwhile.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c")]
unsafe fn finish(pending: &mut Pending, cells: &Cells) {
    let n = cells.n;
    let row_bytes = 2 * n;
    // SAFETY: the caller's features.
    let starts = unsafe { reduce_32(&pending.staged) };
    let mut values = [0.0f32; GROUP];
    // Bit `i`: dot `i` is done by the bound.
    let mut exact = 0u32;
    if half_arith::body_len(n) == n {
        // No leftovers: the native part is the result (a NaN the twin's positive one).
        let mut bits = [0u16; GROUP];
        // SAFETY: `bits` holds 32 values.
        unsafe { _mm512_storeu_si512(bits.as_mut_ptr().cast(), starts) };
        for (value, bits) in values.iter_mut().zip(bits) {
            let start = f16::from_bits(bits);
            *value = if start.is_nan() {
                f32::NAN
            } else {
                start.to_f32()
            };
        }
        exact = u32::MAX;
    } else {
        for part in 0..GROUP / 8 {
            let at = 8 * part;
            // The eight starts' bits, as f64 and as 64-bit lanes.
            let halves = _mm_loadu_si128((&raw const starts).cast::<u16>().add(at).cast());
            let begin = _mm512_cvtps_pd(_mm256_cvtph_ps(halves));
            let exponent = _mm512_and_si512(
                _mm512_srli_epi64::<10>(_mm512_cvtepu16_epi64(halves)),
                _mm512_set1_epi64(0x1f),
            );
            // A start that is not finite takes the single-row finish.
            let finite = _mm512_cmpneq_epi64_mask(exponent, _mm512_set1_epi64(0x1f));
            // A nonzero start's last bit joins the products'.
            let start_bit = _mm512_sub_epi64(
                _mm512_max_epi64(exponent, _mm512_set1_epi64(1)),
                _mm512_set1_epi64(25),
            );
            let nonzero = _mm512_cmp_pd_mask::<_CMP_NEQ_OQ>(begin, _mm512_setzero_pd());
            let products_bit = _mm512_cvtepi32_epi64(_mm256_loadu_si256(
                pending.last_bits.as_ptr().add(at).cast(),
            ));
            let last_bit = _mm512_mask_min_epi64(products_bit, nonzero, products_bit, start_bit);
            // 2^(52 + q) from its bits (q in -48..=10).
            let limit = _mm512_castsi512_pd(_mm512_slli_epi64::<52>(_mm512_add_epi64(
                last_bit,
                _mm512_set1_epi64(1023 + 52),
            )));
            let bound = _mm512_add_pd(
                _mm512_abs_pd(begin),
                _mm512_loadu_pd(pending.bounds.as_ptr().add(at)),
            );
            let sums: &[__m512d; 8] = (&pending.sums[at..at + 8]).try_into().expect("eight");
            let total = _mm512_add_pd(begin, sum_8(sums));
            let held = finite
                & _mm512_cmp_pd_mask::<_CMP_LT_OQ>(bound, limit)
                & _mm512_cmp_pd_mask::<_CMP_NEQ_OQ>(total, _mm512_setzero_pd());
            _mm256_storeu_ps(values.as_mut_ptr().add(at), _mm512_cvtpd_ps(total));
            exact |= u32::from(held) << at;
        }
    }
    let mut bits = [0u16; GROUP];
    // SAFETY: `bits` holds 32 values.
    unsafe { _mm512_storeu_si512(bits.as_mut_ptr().cast(), starts) };
    for dot in 0..pending.count {
        let (row, token) = (pending.rows[dot], pending.tokens[dot]);
        let value = if exact >> dot & 1 == 1 {
            values[dot]
        } else {
            // A NaN is the twin's positive one (as `half_arith::dot_body`).
            let start = f16::from_bits(bits[dot]);
            let start = if start.is_nan() { f16::NAN } else { start };
            dot_f16_finish(
                n,
                &cells.weight_rows[row * row_bytes..(row + 1) * row_bytes],
                &cells.activations[token * row_bytes..(token + 1) * row_bytes],
                start,
                super::float::exact_tail(),
            )
        };
        // SAFETY: a cell of the output (the caller's promise).
        unsafe { *cells.start.add(token * cells.stride + row) = value };
    }
    pending.count = 0;
}

/// `T` registers padded to four (with zeros, which no one reads).
fn pad<V: Copy, const T: usize>(values: [V; T]) -> [V; TOKENS_AT_ONCE] {
    std::array::from_fn(|i| values[i.min(T - 1)])
}

/// The last-bit exponent of a finite nonzero f16 with bits `bits`: `2^(e - 10)`, `2^-24`
/// for the subnormals.
fn f16_last_bit(bits: u16) -> i32 {
    i32::from((bits >> 10) & 0x1f).max(1) - 25
}

/// `values[..len]` widened to f64 into `out` (zeros past `len`); returns the sum of their
/// magnitudes (exact: at most 127 multiples of 2^-24 below 2^16).
///
/// # Safety
/// Requires AVX-512 F/BW/VL and F16C; `values` points at `len` readable values and
/// `out.len() >= len`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn widen(values: *const f16, len: usize, out: &mut [f64]) -> f64 {
    out.fill(0.0);
    let mut magnitudes = _mm512_setzero_pd();
    for at in (0..len).step_by(16) {
        let mask = lanes_mask(len - at);
        // SAFETY: the masked load reads only values below `len`.
        let halves = unsafe { _mm256_maskz_loadu_epi16(mask, values.add(at).cast()) };
        let singles = _mm512_cvtph_ps(halves);
        let low = _mm512_cvtps_pd(_mm512_castps512_ps256(singles));
        let high = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
            _mm512_castps_pd(singles),
        )));
        magnitudes = _mm512_add_pd(
            magnitudes,
            _mm512_add_pd(_mm512_abs_pd(low), _mm512_abs_pd(high)),
        );
        let mut lanes = [0.0f64; 16];
        // SAFETY: `lanes` holds 16 values.
        unsafe {
            _mm512_storeu_pd(lanes.as_mut_ptr(), low);
            _mm512_storeu_pd(lanes.as_mut_ptr().add(8), high);
        }
        let take = (len - at).min(16);
        out[at..at + take].copy_from_slice(&lanes[..take]);
    }
    _mm512_reduce_add_pd(magnitudes)
}

/// The [`Leftover`] of `values[..len]`: `None` when one is not finite or none is nonzero.
///
/// # Safety
/// Requires AVX-512 F/BW/VL; `values` points at `len` readable values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn leftover(values: *const f16, len: usize) -> Option<Leftover> {
    let magnitude = _mm256_set1_epi16(0x7fff);
    let (mut largest, mut lowest) = (_mm256_setzero_si256(), _mm256_set1_epi16(-1));
    for at in (0..len).step_by(16) {
        // SAFETY: the masked load reads only values below `len`.
        let bits = unsafe { _mm256_maskz_loadu_epi16(lanes_mask(len - at), values.add(at).cast()) };
        let bits = _mm256_and_si256(bits, magnitude);
        largest = _mm256_max_epu16(largest, bits);
        let nonzero = _mm256_test_epi16_mask(bits, bits);
        lowest = _mm256_mask_min_epu16(lowest, nonzero, lowest, bits);
    }
    let mut lanes = [[0u16; 16]; 2];
    // SAFETY: each array holds 16 values.
    unsafe {
        _mm256_storeu_si256(lanes[0].as_mut_ptr().cast(), largest);
        _mm256_storeu_si256(lanes[1].as_mut_ptr().cast(), lowest);
    }
    let largest = lanes[0].iter().copied().max().unwrap_or(0);
    let lowest = lanes[1].iter().copied().min().unwrap_or(u16::MAX);
    // No nonzero value (all ones stays), or an infinity or NaN (exponent all ones).
    if lowest == u16::MAX || largest >= 0x7c00 {
        return None;
    }
    Some(Leftover {
        largest: f16::from_bits(largest).to_f64(),
        // The smallest nonzero magnitude has the smallest exponent field.
        last_bit: f16_last_bit(lowest),
    })
}

/// A mask of the first `left.min(16)` lanes.
fn lanes_mask(left: usize) -> __mmask16 {
    if left >= 16 {
        0xffff
    } else {
        (1u16 << left) - 1
    }
}

/// `sum x[i] * y_t[i]` for `T` token rows `y_t` (`wide` values apart from `y`) in eight
/// f64 lanes of fused multiply-adds each; the lanes' total is exact where the caller's
/// bound holds, whatever the order.
///
/// # Safety
/// Requires AVX-512 F; `x` holds `wide` values (a multiple of 8) and `y` points at `T`
/// rows of `wide` values.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn products<const T: usize>(x: &[f64], y: *const f64, wide: usize) -> [__m512d; T] {
    let mut sums = [_mm512_setzero_pd(); T];
    for at in (0..wide).step_by(8) {
        // SAFETY: `at + 8 <= wide`, inside `x` and each token's row.
        let xs = unsafe { _mm512_loadu_pd(x.as_ptr().add(at)) };
        for (t, sum) in sums.iter_mut().enumerate() {
            // SAFETY: as above.
            *sum = _mm512_fmadd_pd(xs, unsafe { _mm512_loadu_pd(y.add(t * wide + at)) }, *sum);
        }
    }
    sums
}

/// The lane totals of eight registers: lane `i` of the result sums `v[i]`'s lanes (in an
/// order of its own: every use is exact).
#[inline]
#[target_feature(enable = "avx512f")]
fn sum_8(v: &[__m512d; 8]) -> __m512d {
    let (a0, a1) = (pairs(v[0], v[1]), pairs(v[2], v[3]));
    let (a2, a3) = (pairs(v[4], v[5]), pairs(v[6], v[7]));
    halves(halves(a0, a1), halves(a2, a3))
}

/// Adjacent lanes added: `[a's, b's]` in each 128-bit quarter.
#[inline]
#[target_feature(enable = "avx512f")]
fn pairs(a: __m512d, b: __m512d) -> __m512d {
    _mm512_add_pd(_mm512_unpacklo_pd(a, b), _mm512_unpackhi_pd(a, b))
}

/// Quarters 0 + 1 and 2 + 3 of `a`, then of `b`.
#[inline]
#[target_feature(enable = "avx512f")]
fn halves(a: __m512d, b: __m512d) -> __m512d {
    _mm512_add_pd(
        _mm512_shuffle_f64x2::<0b10_00_10_00>(a, b),
        _mm512_shuffle_f64x2::<0b11_01_11_01>(a, b),
    )
}
