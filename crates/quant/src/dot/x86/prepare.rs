//! AVX-512 preparation of a decode batch's activations for the pair kernel in one pass:
//! each block quantized as ggml-cpu's x86 `quantize_row_q8_0` / `quantize_row_q8_1` does
//! (the AVX2 kernel's `amax` tree, `d = amax / 127`, `round_ties_even(x * (127 / amax))`
//! saturated to i8, `s = f16(d * sum(q))`), written to the activation row and, at once, to
//! the widened scale tables and the paired quant table that [`block_scales`] and
//! [`block_quants`] would make from that row. Sixteen blocks share one division of each
//! kind and one f16 rounding; the results are those of the three separate passes bit for
//! bit (divisions, products and roundings are IEEE operations whatever the vector width).
//!
//! [`block_scales`]: crate::dot::block_scales
//! [`block_quants`]: crate::dot::block_quants

use std::arch::x86_64::*;
use std::ops::Range;

use crate::dot::batched::{MAGIC, PAIR_LANES};

/// Blocks that share one vector of scales.
const GROUP: usize = 16;

/// The AVX2 kernel's `amax` of the 32 values at `x`: eight lanes over the four runs of
/// eight, then the upper lanes onto the lower ones by halves, in `maxps`'s operand order
/// (which decides where a NaN goes).
#[inline(always)]
unsafe fn absolute_max(x: *const f32) -> f32 {
    let magnitude = _mm256_set1_ps(f32::from_bits(0x7fff_ffff));
    let run = |k: usize| _mm256_and_ps(magnitude, _mm256_loadu_ps(x.add(8 * k)));
    let mut lanes = run(0);
    for k in 1..4 {
        lanes = _mm256_max_ps(lanes, run(k));
    }
    let quad = _mm_max_ps(
        _mm256_extractf128_ps::<1>(lanes),
        _mm256_castps256_ps128(lanes),
    );
    let pair = _mm_max_ps(quad, _mm_movehl_ps(quad, quad));
    _mm_cvtss_f32(_mm_max_ss(pair, _mm_movehdup_ps(pair)))
}

/// What one row's blocks go to: the tables (as [`block_scales`] and [`block_quants`] lay
/// them out for `rows` rows) by pointer, since the threads of one matmul may each fill the
/// blocks of their own columns of them at once.
pub(in crate::dot) struct Tables {
    /// Q8_1 (with sums) or Q8_0 (quants offset by 128 in the paired table).
    pub with_sums: bool,
    /// Rows in the tables (`stride` of the scale tables).
    pub rows: usize,
    /// Rows a block takes in the paired quant table (`rows` rounded up to pairs).
    pub block_rows: usize,
    pub d: *mut f32,
    /// Unused without sums.
    pub s: *mut f32,
    pub quants: *mut u8,
    /// The pair kernel's offset table (`block_offsets` of `d`), or null (not made).
    pub offsets: *mut f32,
}

/// Converts blocks `blocks` of row `t` (`x`, their `32 * blocks.len()` values) into `out`
/// (row `t`'s activation blocks: Q8_1 or Q8_0) and their entries of `tables`.
///
/// # Safety
/// AVX-512 F, BW and VL are available; `out` holds the row's blocks up to `blocks.end`;
/// the tables hold every entry of row `t < tables.rows` (as `block_scales` and
/// `block_quants` lay them out) and nothing else reads or writes those of these blocks
/// meanwhile (nor the partner slots of an odd last row's). Returns false where some
/// block's `d` is not finite.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(in crate::dot) unsafe fn row(
    x: &[f32],
    t: usize,
    blocks: Range<usize>,
    out: *mut u8,
    tables: &Tables,
) -> bool {
    let mut finite = true;
    debug_assert_eq!(x.len(), 32 * blocks.len());
    let block_bytes = if tables.with_sums { 36 } else { 34 };
    let even = t.is_multiple_of(2);
    let slots: __mmask16 = if even { 0x5555 } else { 0xaaaa };
    // Dword `2k` and `2k + 1` of a pair take group `PAIR_SLOTS[k]` (its own inverse).
    let places = _mm512_loadu_si512(PAIR_LANES.as_ptr().cast());
    // Q8_0's paired quants are stored plus 128 (unsigned for `vpdpbusd`).
    let offset = _mm512_set1_epi8(if tables.with_sums { 0 } else { 0x80u8 as i8 });
    // An odd last row's partner slots hold zeros.
    let lone = even && t + 1 == tables.rows && tables.block_rows > tables.rows;
    let mut first = blocks.start;
    while first < blocks.end {
        let count = GROUP.min(blocks.end - first);
        let mask: __mmask16 = if count == GROUP {
            0xffff
        } else {
            (1u16 << count) - 1
        };
        let mut maxima = [0.0f32; GROUP];
        for (b, max) in maxima[..count].iter_mut().enumerate() {
            *max = absolute_max(x.as_ptr().add(32 * (first - blocks.start + b)));
        }
        let amax = _mm512_maskz_loadu_ps(mask, maxima.as_ptr());
        let scales = _mm512_div_ps(amax, _mm512_set1_ps(127.0));
        // `127 / amax` where `amax != 0` (NaN included), else 0.
        let nonzero = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(amax, _mm512_setzero_ps());
        let inverse = _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(127.0), amax);
        let mut inverses = [0.0f32; GROUP];
        _mm512_storeu_ps(inverses.as_mut_ptr(), inverse);
        let mut sums = [0i32; GROUP];
        for b in 0..count {
            let i = first + b;
            let values = x.as_ptr().add(32 * (i - blocks.start));
            let id = _mm512_set1_ps(inverses[b]);
            let round = |k: usize| {
                _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm512_mul_ps(_mm512_loadu_ps(values.add(16 * k)), id),
                )
            };
            // Saturated to i8 (`vpmovsdb`), as the AVX2 kernel's two saturating packs do.
            let (low, high) = (
                _mm512_cvtsepi32_epi8(round(0)),
                _mm512_cvtsepi32_epi8(round(1)),
            );
            let quants = _mm256_set_m128i(high, low);
            let block = out.add(i * block_bytes);
            _mm256_storeu_si256(block.add(block_bytes - 32).cast(), quants);
            if tables.with_sums {
                // The sum of the saturated quants (values past 127 / amax do occur: a NaN
                // can hide a block's largest value from the `amax` tree).
                let both = _mm512_add_epi32(_mm512_cvtepi8_epi32(low), _mm512_cvtepi8_epi32(high));
                sums[b] = _mm512_reduce_add_epi32(both);
            }
            // The pair's 64 bytes: this row's four-byte groups in its slots.
            let pair = tables.quants.add((i * tables.block_rows + t - t % 2) * 32);
            // Group `g` to dword `2 * PAIR_SLOTS[g]` (+1 for the odd row).
            let groups = _mm512_xor_si512(
                _mm512_permutexvar_epi32(places, _mm512_castsi256_si512(quants)),
                offset,
            );
            _mm512_mask_storeu_epi32(pair.cast(), slots, groups);
            if lone {
                _mm512_mask_storeu_epi32(pair.cast(), !slots, _mm512_setzero_si512());
            }
        }
        // f16 `d` (and `s = d * sum`), rounded to nearest even as `vcvtps2ph` does.
        let d16 = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(scales);
        let mut d_bits = [0u16; GROUP];
        _mm256_storeu_si256(d_bits.as_mut_ptr().cast(), d16);
        let mut d_wide = [0.0f32; GROUP];
        _mm512_storeu_ps(d_wide.as_mut_ptr(), _mm512_cvtph_ps(d16));
        let (mut s_bits, mut s_wide) = ([0u16; GROUP], [0.0f32; GROUP]);
        if tables.with_sums {
            let products = _mm512_mul_ps(
                scales,
                _mm512_cvtepi32_ps(_mm512_loadu_si512(sums.as_ptr().cast())),
            );
            let s16 = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(products);
            _mm256_storeu_si256(s_bits.as_mut_ptr().cast(), s16);
            _mm512_storeu_ps(s_wide.as_mut_ptr(), _mm512_cvtph_ps(s16));
        }
        for b in 0..count {
            let i = first + b;
            let block = out.add(i * block_bytes);
            block.cast::<u16>().write_unaligned(d_bits[b].to_le());
            tables.d.add(i * tables.rows + t).write(d_wide[b]);
            if !tables.offsets.is_null() {
                tables
                    .offsets
                    .add(i * tables.rows + t)
                    .write(-MAGIC * d_wide[b]);
            }
            finite &= d_wide[b].is_finite();
            if tables.with_sums {
                block
                    .add(2)
                    .cast::<u16>()
                    .write_unaligned(s_bits[b].to_le());
                tables.s.add(i * tables.rows + t).write(s_wide[b]);
            }
        }
        first += count;
    }
    finite
}
