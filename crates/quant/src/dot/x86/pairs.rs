//! AVX-512 tile kernel of the 32-element block formats that computes two activation rows
//! per 512-bit register: the weight block's quants sit in both halves, the two rows'
//! activation quants side by side (the block-major copy of [`BlockScales::quants`]), and
//! each half goes through the arithmetic of the single-row kernel (the same integer lane
//! sums, `d_w * d_a` rounded to f32, one FMA per block into eight lanes, then the same
//! horizontal sum), so every result equals the single-row kernel bit for bit. Per pair of
//! rows and block that is one load, one `vpdpbusd`, one conversion, one FMA and one permute
//! of the scale products, about half the instructions of two 256-bit rows. Signed formats
//! need no sign trick per row: their activation quants come offset to unsigned, and the
//! offset's share is taken out once per weight block (`sums_base`).

// Kernels index several per-pair arrays (accumulators, permutations) by the same `p`.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::batched::scale_and_minimum;
use super::hsum8;
use super::legacy::Legacy;
use crate::dot::{checked_blocks, BlockScales};
use crate::GgmlType;

/// Most pairs of activation rows per call (sixteen rows; 16 accumulators of 32 registers).
const MAX_PAIRS: usize = 8;

/// The weight block's 32 quants (as the single-row kernel unpacks them) in both halves.
#[inline(always)]
unsafe fn weight_quants<W: Legacy>(p: *const u8) -> __m512i {
    match W::TYPE {
        // Nibble formats: the 16 packed bytes in all four lanes (a load), the upper lane of
        // each half shifted by four.
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let offset = W::BYTES - 16;
            let packed = _mm512_broadcast_i32x4(_mm_loadu_si128(p.add(offset).cast()));
            let both = _mm512_srlv_epi64(packed, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
            let nibbles = _mm512_and_si512(both, _mm512_set1_epi8(0x0f));
            if W::SIGNED {
                _mm512_sub_epi8(nibbles, _mm512_set1_epi8(8))
            } else {
                nibbles
            }
        }
        _ => _mm512_broadcast_i64x4(W::quants(p)),
    }
}

/// What the `vpdpbusd` of a signed format's block starts from: `-128 * (sum of the four
/// weight quants of each lane)`, so that adding the products with the activation quants
/// offset to unsigned (`y + 128`, as [`block_quants`](crate::dot::block_quants) stores
/// Q8_0's) leaves exactly the lane sums `block_sums` computes with the sign trick (the
/// integers are exact either way). Zero for unsigned formats.
#[inline(always)]
unsafe fn sums_base<W: Legacy>(q: __m512i) -> __m512i {
    let zero = _mm512_setzero_si512();
    if W::SIGNED {
        let offset = _mm512_set1_epi8(0x80u8 as i8);
        _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, offset, q))
    } else {
        zero
    }
}

/// `vpdpbusd` lane sums of the weight quants `q` (both halves) and two activation rows `y`,
/// as `block_sums` computes them for one row: unsigned weights against the activations;
/// signed ones as the offset activations (unsigned) against the weights, from `base`
/// ([`sums_base`]).
#[inline(always)]
unsafe fn pair_sums<W: Legacy>(q: __m512i, base: __m512i, y: __m512i) -> __m512i {
    if W::SIGNED {
        _mm512_dpbusd_epi32(base, y, q)
    } else {
        _mm512_dpbusd_epi32(base, q, y)
    }
}

/// One weight row against `count <= 2 * P` activation rows whose quants are the block-major
/// table `quants` (`32` bytes at `[i * stride + c]`) and whose block scales are `d` and `s`
/// at `[i * stride + c]`; row `c`'s result goes to `out[c * out_stride]`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_pairs<W: Legacy, const P: usize>(
    blocks: usize,
    w: *const u8,
    quants: *const u8,
    d: *const f32,
    s: *const f32,
    stride: usize,
    count: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let mut acc = [_mm512_setzero_ps(); P];
    // Lane c % 4 of minimums[c / 4]: the running `m * s` of row c.
    let mut minimums = [_mm_setzero_ps(); 4];
    let groups = count.div_ceil(4);
    // Pair p takes product 2p into its lower half and 2p + 1 into its upper half.
    let mut spread = [_mm512_setzero_si512(); P];
    for p in 0..P {
        let (low, high) = (2 * p as i32, 2 * p as i32 + 1);
        spread[p] = _mm512_set_epi32(
            high, high, high, high, high, high, high, high, low, low, low, low, low, low, low, low,
        );
    }
    let rows_mask: __mmask16 = if count >= 16 {
        0xffff
    } else {
        (1u16 << count) - 1
    };
    for i in 0..blocks {
        let wb = w.add(i * W::BYTES);
        let q = weight_quants::<W>(wb);
        let base = sums_base::<W>(q);
        let d_w = if W::HAS_MIN {
            let dm = scale_and_minimum(wb);
            let m = _mm_permute_ps::<0b0101_0101>(dm);
            for group in 0..groups {
                let sums = _mm_loadu_ps(s.add(i * stride + 4 * group));
                minimums[group] = _mm_fmadd_ps(m, sums, minimums[group]);
            }
            _mm512_broadcastss_ps(dm)
        } else {
            _mm512_broadcastss_ps(_mm256_castps256_ps128(W::scale(wb)))
        };
        // d_w * d_a of every row in one multiply (masked lanes are zero and unused).
        let products = _mm512_mul_ps(d_w, _mm512_maskz_loadu_ps(rows_mask, d.add(i * stride)));
        let row_quants = quants.add(i * stride * 32);
        for p in 0..P {
            let y = _mm512_loadu_si512(row_quants.add(p * 64).cast());
            let sums = pair_sums::<W>(q, base, y);
            let scale = _mm512_permutexvar_ps(spread[p], products);
            acc[p] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sums), acc[p]);
        }
    }
    let mut minimum = [0.0f32; 16];
    for group in 0..4 {
        _mm_storeu_ps(minimum.as_mut_ptr().add(4 * group), minimums[group]);
    }
    for p in 0..P {
        let halves = [
            _mm512_castps512_ps256(acc[p]),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[p]))),
        ];
        for (half, &value) in halves.iter().enumerate() {
            let c = 2 * p + half;
            if c < count {
                let sum = hsum8(value);
                *out.add(c * out_stride) = if W::HAS_MIN { sum + minimum[c] } else { sum };
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_group<W: Legacy, const P: usize>(
    blocks: usize,
    w: *const u8,
    quants: *const u8,
    d: *const f32,
    s: *const f32,
    stride: usize,
    count: usize,
    out: *mut f32,
    out_stride: usize,
) {
    tile_pairs::<W, P>(blocks, w, quants, d, s, stride, count, out, out_stride);
}

/// [`TileRowsFn`](crate::dot::TileRowsFn): every weight row of `w` (rows of `n` elements,
/// back to back) against the `out.len() / rows` activation rows, `out[c * rows + r]`; the
/// checks run once for all rows. Needs `scales.quants` (else `None`: the caller loops over
/// the single-row [`tile`]).
pub(super) fn tile_rows<W: Legacy>(
    n: usize,
    w: &[u8],
    a: &[u8],
    scales: BlockScales<'_>,
    out: &mut [f32],
) -> bool {
    if scales.quants.is_empty() || out.is_empty() {
        return !scales.quants.is_empty();
    }
    let row_bytes = n / 32 * W::BYTES;
    let rows = w.len() / row_bytes.max(1);
    assert_eq!(rows * row_bytes, w.len(), "whole weight rows");
    let tokens = out.len() / rows.max(1);
    assert_eq!(rows * tokens, out.len(), "out is [tokens x rows]");
    let activation_bytes = a.len() / tokens;
    assert_eq!(
        activation_bytes * tokens,
        a.len(),
        "activation rows of equal length"
    );
    let blocks = checked_blocks(W::TYPE, n, &w[..row_bytes], &a[..activation_bytes]);
    scales.check(blocks, tokens, W::HAS_MIN);
    let out = out.as_mut_ptr();
    for r in 0..rows {
        let w = w[r * row_bytes..].as_ptr();
        let mut start = 0;
        while start < tokens {
            let count = (tokens - start).min(2 * MAX_PAIRS);
            // SAFETY: as in `tile`: features detected before this kernel is handed out, the
            // checks above cover every row (all have `row_bytes` bytes); `out` holds
            // `tokens * rows` values, of which this group writes `(start + c) * rows + r`
            // for `c < count`.
            unsafe {
                run_group::<W>(
                    blocks,
                    w,
                    scales,
                    start,
                    count,
                    out.add(start * rows + r),
                    rows,
                )
            };
            start += count;
        }
    }
    true
}

/// One weight row at `w` against activation rows `start .. start + count` (count <= 16),
/// row `c`'s result to `out[c * out_stride]`.
///
/// # Safety
/// AVX-512 VNNI is available; `scales` passed `check` for `blocks` and at least `start +
/// count` rows; `w` holds `blocks` blocks; `out` has the `count` slots written.
unsafe fn run_group<W: Legacy>(
    blocks: usize,
    w: *const u8,
    scales: BlockScales<'_>,
    start: usize,
    count: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let quants = scales.quants[start * 32..].as_ptr();
    let d = scales.d[start..].as_ptr();
    let s = if W::HAS_MIN {
        scales.s[start..].as_ptr()
    } else {
        d
    };
    let stride = scales.stride;
    // SAFETY: the caller's contract.
    unsafe {
        match count.div_ceil(2) {
            8 => tile_group::<W, 8>(blocks, w, quants, d, s, stride, count, out, out_stride),
            7 => tile_group::<W, 7>(blocks, w, quants, d, s, stride, count, out, out_stride),
            6 => tile_group::<W, 6>(blocks, w, quants, d, s, stride, count, out, out_stride),
            5 => tile_group::<W, 5>(blocks, w, quants, d, s, stride, count, out, out_stride),
            4 => tile_group::<W, 4>(blocks, w, quants, d, s, stride, count, out, out_stride),
            3 => tile_group::<W, 3>(blocks, w, quants, d, s, stride, count, out, out_stride),
            2 => tile_group::<W, 2>(blocks, w, quants, d, s, stride, count, out, out_stride),
            _ => tile_group::<W, 1>(blocks, w, quants, d, s, stride, count, out, out_stride),
        }
    }
}

/// The tile kernel ([`TileFn`](crate::dot::TileFn)): `scales.quants` must hold the block-major copy of the
/// activation quants; without it the 256-bit kernel `fallback` runs.
pub(super) fn tile<W: Legacy>(
    n: usize,
    w: &[u8],
    a: &[u8],
    scales: BlockScales<'_>,
    out: &mut [f32],
    fallback: crate::dot::TileFn,
) {
    if out.is_empty() {
        return;
    }
    if scales.quants.is_empty() {
        return fallback(n, w, a, scales, out);
    }
    let row_bytes = a.len() / out.len();
    assert_eq!(
        row_bytes * out.len(),
        a.len(),
        "activation rows of equal length"
    );
    let blocks = checked_blocks(W::TYPE, n, w, &a[..row_bytes]);
    scales.check(blocks, out.len(), W::HAS_MIN);
    let mut start = 0;
    while start < out.len() {
        let count = (out.len() - start).min(2 * MAX_PAIRS);
        // SAFETY: the caller handed out this kernel only where AVX-512 VNNI was detected;
        // `scales.check` verified that the tables hold every value read (sums four at a
        // time past each block's rows, quants up to the pair partner of the last row, d
        // through a masked load), and `out` has `count` slots from `start`.
        unsafe {
            run_group::<W>(
                blocks,
                w.as_ptr(),
                scales,
                start,
                count,
                out[start..].as_mut_ptr(),
                1,
            )
        };
        start += count;
    }
}
