//! AVX2 / AVX-VNNI / AVX-512 VNNI kernels of the 32-element block formats (Q4_0, Q4_1,
//! Q5_0, Q5_1, Q8_0, IQ4_NL), single-row and multi-row, in ggml's AVX2 arithmetic order.

// Tile kernels index several per-row arrays (accumulators, sums) by the same row `c`.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{bits_to_bytes, f16_splat, hsum8, nibbles, Avx2, Avx512Vnni, AvxVnni, Isa};
use crate::blocks::KVALUES_IQ4NL;
use crate::dot::{checked_blocks, looped, DotFn, MultiDotFn, SimdLevel};
use crate::GgmlType;

/// How to unpack one weight block of a 32-element format.
///
/// Every method is `unsafe`: it needs AVX2 and F16C, and `p` must point at a whole weight
/// block (`BYTES` readable bytes, any alignment).
pub(super) trait Legacy {
    const TYPE: GgmlType;
    /// Bytes of a weight block.
    const BYTES: usize;
    /// Bytes of the paired activation block (34 for Q8_0, 36 for Q8_1).
    const ACTIVATION_BYTES: usize;
    /// Quants are signed (so the sign trick is needed before `vpmaddubsw` / `vpdpbusd`).
    const SIGNED: bool;
    /// The format has a minimum `m` (paired with Q8_1's `s`).
    const HAS_MIN: bool;
    /// The 32 quants of the block at `p`, in element order.
    unsafe fn quants(p: *const u8) -> __m256i;
    /// The block scale in every lane.
    #[inline(always)]
    unsafe fn scale(p: *const u8) -> __m256 {
        f16_splat(p)
    }
    /// The block minimum in every lane (formats with `HAS_MIN`).
    #[inline(always)]
    unsafe fn minimum(p: *const u8) -> __m256 {
        f16_splat(p.add(2))
    }
}

pub(super) struct Q4_0;
pub(super) struct Q4_1;
pub(super) struct Q5_0;
pub(super) struct Q5_1;
pub(super) struct Q8_0;
pub(super) struct IQ4NL;

impl Legacy for Q4_0 {
    const BYTES: usize = 18;
    const TYPE: GgmlType = GgmlType::Q4_0;
    const ACTIVATION_BYTES: usize = 34;
    const SIGNED: bool = true;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        _mm256_sub_epi8(nibbles(p.add(2)), _mm256_set1_epi8(8))
    }
}

impl Legacy for Q4_1 {
    const BYTES: usize = 20;
    const TYPE: GgmlType = GgmlType::Q4_1;
    const ACTIVATION_BYTES: usize = 36;
    const SIGNED: bool = false;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        nibbles(p.add(4))
    }
}

impl Legacy for Q5_0 {
    const BYTES: usize = 22;
    const TYPE: GgmlType = GgmlType::Q5_0;
    const ACTIVATION_BYTES: usize = 34;
    const SIGNED: bool = true;
    const HAS_MIN: bool = false;
    /// `q - 16`: OR-ing 0xF0 into the nibble where the fifth bit is clear.
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        let high_clear =
            _mm256_andnot_si256(bits_to_bytes(p.add(2)), _mm256_set1_epi8(0xF0u8 as i8));
        _mm256_or_si256(nibbles(p.add(6)), high_clear)
    }
}

impl Legacy for Q5_1 {
    const BYTES: usize = 24;
    const TYPE: GgmlType = GgmlType::Q5_1;
    const ACTIVATION_BYTES: usize = 36;
    const SIGNED: bool = false;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        let high = _mm256_and_si256(bits_to_bytes(p.add(4)), _mm256_set1_epi8(0x10));
        _mm256_or_si256(nibbles(p.add(8)), high)
    }
}

impl Legacy for Q8_0 {
    const BYTES: usize = 34;
    const TYPE: GgmlType = GgmlType::Q8_0;
    const ACTIVATION_BYTES: usize = 34;
    const SIGNED: bool = true;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p.add(2).cast())
    }
}

impl Legacy for IQ4NL {
    const BYTES: usize = 18;
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    const ACTIVATION_BYTES: usize = 34;
    const SIGNED: bool = true;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
        _mm256_shuffle_epi8(_mm256_set_m128i(table, table), nibbles(p.add(2)))
    }
}

/// The eight lane sums of one block: quants `q` (signed or not per `W`) times the
/// activation quants `y`.
///
/// # Safety
/// AVX2 and the instructions of `I` are available.
#[inline(always)]
pub(super) unsafe fn block_sums<W: Legacy, I: Isa>(q: __m256i, y: __m256i) -> __m256i {
    if W::SIGNED {
        I::dot_u8_i8(_mm256_sign_epi8(q, q), _mm256_sign_epi8(y, q))
    } else {
        I::dot_u8_i8(q, y)
    }
}

/// Activation quants of the block at `a`.
///
/// # Safety
/// AVX is available and `a` points at a whole activation block of `W`'s format
/// (`W::ACTIVATION_BYTES` readable bytes).
#[inline(always)]
pub(super) unsafe fn activation_quants<W: Legacy>(a: *const u8) -> __m256i {
    _mm256_loadu_si256(a.add(W::ACTIVATION_BYTES - 32).cast())
}

/// The f16 at byte `offset` of each of the `C` activation blocks `row_bytes` apart,
/// widened together (one `vcvtph2ps` for up to four rows).
#[inline(always)]
unsafe fn halves<const C: usize>(a: *const u8, row_bytes: usize, offset: usize) -> __m128 {
    let half = |c: usize| a.add(c * row_bytes + offset).cast::<u16>().read_unaligned() as i16;
    let packed = _mm_set1_epi16(half(0));
    let packed = if C > 1 {
        _mm_insert_epi16::<1>(packed, i32::from(half(1)))
    } else {
        packed
    };
    let packed = if C > 2 {
        _mm_insert_epi16::<2>(packed, i32::from(half(2)))
    } else {
        packed
    };
    let packed = if C > 3 {
        _mm_insert_epi16::<3>(packed, i32::from(half(3)))
    } else {
        packed
    };
    _mm_cvtph_ps(packed)
}

/// One weight row against `C <= 4` activation rows `row_bytes` apart; `out[c]` receives the
/// dot product with row `c`. `C == 1` is the single-row kernel. Per row the operations are
/// those of the scalar twin: `d_w * d_a` rounded to f32, one lane FMA per block, and for
/// Q4_1/Q5_1 `m * s` fused into a separate sum (kept in lane `c` of one vector).
#[inline(always)]
pub(super) unsafe fn rows<W: Legacy, I: Isa, const C: usize>(
    blocks: usize,
    w: *const u8,
    a: *const u8,
    row_bytes: usize,
    out: *mut f32,
) {
    let mut acc = [_mm256_setzero_ps(); C];
    let mut minimums = _mm_setzero_ps();
    for i in 0..blocks {
        let wb = w.add(i * W::BYTES);
        let ab = a.add(i * W::ACTIVATION_BYTES);
        let q = W::quants(wb);
        let scale = W::scale(wb);
        // d_w * d_a of each row, in lane c (row 0 alone: in every lane).
        let scales = if C == 1 {
            _mm256_mul_ps(scale, f16_splat(ab))
        } else {
            let rows = _mm_mul_ps(_mm256_castps256_ps128(scale), halves::<C>(ab, row_bytes, 0));
            _mm256_castps128_ps256(rows)
        };
        for c in 0..C {
            let sums = block_sums::<W, I>(q, activation_quants::<W>(ab.add(c * row_bytes)));
            let scale = if C == 1 {
                scales
            } else {
                _mm256_permutevar8x32_ps(scales, _mm256_set1_epi32(c as i32))
            };
            acc[c] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums), acc[c]);
        }
        if W::HAS_MIN {
            let sums = halves::<C>(ab, row_bytes, 2);
            let minimum = _mm256_castps256_ps128(W::minimum(wb));
            minimums = _mm_fmadd_ps(minimum, sums, minimums);
        }
    }
    let mut minimum = [0.0f32; 4];
    _mm_storeu_ps(minimum.as_mut_ptr(), minimums);
    for c in 0..C {
        let sum = hsum8(acc[c]);
        *out.add(c) = if W::HAS_MIN { sum + minimum[c] } else { sum };
    }
}

/// IQ4_NL single row: ggml pairs blocks into an even and an odd accumulator and finishes an
/// odd last block with a scalar FMA.
#[inline(always)]
unsafe fn iq4_nl_row<I: Isa>(blocks: usize, w: *const u8, a: *const u8) -> f32 {
    let contribution = |i: usize| {
        let wb = w.add(i * IQ4NL::BYTES);
        let ab = a.add(i * IQ4NL::ACTIVATION_BYTES);
        let sums = block_sums::<IQ4NL, I>(IQ4NL::quants(wb), activation_quants::<IQ4NL>(ab));
        (_mm256_mul_ps(f16_splat(ab), f16_splat(wb)), sums)
    };
    let mut even = _mm256_setzero_ps();
    let mut odd = _mm256_setzero_ps();
    for pair in 0..blocks / 2 {
        let (d, sums) = contribution(2 * pair);
        even = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums), even);
        let (d, sums) = contribution(2 * pair + 1);
        odd = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums), odd);
    }
    let mut sum = hsum8(_mm256_add_ps(even, odd));
    if blocks % 2 == 1 {
        let (d, sums) = contribution(blocks - 1);
        let total = _mm256_extracti128_si256(sums, 1);
        let total = _mm_add_epi32(total, _mm256_castsi256_si128(sums));
        let total = _mm_add_epi32(total, _mm_unpackhi_epi64(total, total));
        let total = _mm_add_epi32(total, _mm_shuffle_epi32(total, 0b01));
        sum = _mm256_cvtss_f32(d).mul_add(_mm_cvtsi128_si32(total) as f32, sum);
    }
    sum
}

/// Stamps out the `#[target_feature]` entry points of one instruction set: safe single-row
/// and multi-row kernels generic over the weight format.
macro_rules! entry_points {
    ($module:ident, $isa:ty, $features:literal) => {
        mod $module {
            use super::*;

            #[target_feature(enable = $features)]
            unsafe fn row<W: Legacy>(blocks: usize, w: *const u8, a: *const u8) -> f32 {
                let mut out = 0.0f32;
                rows::<W, $isa, 1>(blocks, w, a, 0, &mut out);
                out
            }

            #[target_feature(enable = $features)]
            unsafe fn tile<W: Legacy, const C: usize>(
                blocks: usize,
                w: *const u8,
                a: *const u8,
                row_bytes: usize,
                out: *mut f32,
            ) {
                rows::<W, $isa, C>(blocks, w, a, row_bytes, out);
            }

            #[target_feature(enable = $features)]
            unsafe fn iq4_nl(blocks: usize, w: *const u8, a: *const u8) -> f32 {
                iq4_nl_row::<$isa>(blocks, w, a)
            }

            pub(super) fn dot<W: Legacy>(n: usize, w: &[u8], a: &[u8]) -> f32 {
                let blocks = checked_blocks(W::TYPE, n, w, a);
                // SAFETY: `dot_fn` and `multi_dot_fn` hand these kernels out only at a
                // level that `SimdLevel::is_available` confirmed, which covers `$features`;
                // both rows hold `blocks` blocks (`checked_blocks` above).
                unsafe { row::<W>(blocks, w.as_ptr(), a.as_ptr()) }
            }

            pub(super) fn dot_iq4_nl(n: usize, w: &[u8], a: &[u8]) -> f32 {
                let blocks = checked_blocks(GgmlType::IQ4_NL, n, w, a);
                // SAFETY: handed out as `dot` is, at a level `SimdLevel::is_available`
                // confirmed; both rows hold `blocks` blocks (`checked_blocks` above).
                unsafe { iq4_nl(blocks, w.as_ptr(), a.as_ptr()) }
            }

            pub(super) fn multi<W: Legacy>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
                if out.is_empty() {
                    return;
                }
                let row_bytes = a.len() / out.len();
                assert_eq!(
                    row_bytes * out.len(),
                    a.len(),
                    "activation rows of equal length"
                );
                let blocks = checked_blocks(W::TYPE, n, w, &a[..row_bytes]);
                let mut start = 0;
                while start < out.len() {
                    let count = (out.len() - start).min(4);
                    let rows_at = a[start * row_bytes..].as_ptr();
                    let out_at = out[start..].as_mut_ptr();
                    // SAFETY: handed out as `dot` is, at a level `SimdLevel::is_available`
                    // confirmed; `count` rows of `row_bytes` bytes (each holding `blocks`
                    // blocks) start at `rows_at`, and `out_at` has room for `count` values.
                    unsafe {
                        match count {
                            4 => tile::<W, 4>(blocks, w.as_ptr(), rows_at, row_bytes, out_at),
                            3 => tile::<W, 3>(blocks, w.as_ptr(), rows_at, row_bytes, out_at),
                            2 => tile::<W, 2>(blocks, w.as_ptr(), rows_at, row_bytes, out_at),
                            _ => tile::<W, 1>(blocks, w.as_ptr(), rows_at, row_bytes, out_at),
                        }
                    }
                    start += count;
                }
            }
        }
    };
}

entry_points!(avx2, Avx2, "avx2,fma,f16c");
entry_points!(avx_vnni, AvxVnni, "avx2,fma,f16c,avxvnni");
entry_points!(
    avx512_vnni,
    Avx512Vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
);

/// Stamps the per-type table of one instruction set.
macro_rules! table {
    ($weight:expr, $module:ident, $entry:ident, $iq4:expr, $kind:ty) => {{
        use GgmlType::*;
        match $weight {
            Q4_0 => Some($module::$entry::<self::Q4_0> as $kind),
            Q4_1 => Some($module::$entry::<self::Q4_1> as $kind),
            Q5_0 => Some($module::$entry::<self::Q5_0> as $kind),
            Q5_1 => Some($module::$entry::<self::Q5_1> as $kind),
            Q8_0 => Some($module::$entry::<self::Q8_0> as $kind),
            IQ4_NL => Some($iq4 as $kind),
            _ => None,
        }
    }};
}

pub(super) fn dot(weight: GgmlType, level: SimdLevel) -> Option<DotFn> {
    match level {
        SimdLevel::Avx2 => table!(weight, avx2, dot, avx2::dot_iq4_nl, DotFn),
        SimdLevel::AvxVnni => table!(weight, avx_vnni, dot, avx_vnni::dot_iq4_nl, DotFn),
        SimdLevel::Avx512Vnni => {
            table!(weight, avx512_vnni, dot, avx512_vnni::dot_iq4_nl, DotFn)
        }
        _ => None,
    }
}

/// IQ4_NL has no tile kernel: its multi-row form loops over the single-row one.
pub(super) fn multi_dot(weight: GgmlType, level: SimdLevel) -> Option<MultiDotFn> {
    match level {
        SimdLevel::Avx2 => table!(weight, avx2, multi, looped!(avx2::dot_iq4_nl), MultiDotFn),
        SimdLevel::AvxVnni => table!(
            weight,
            avx_vnni,
            multi,
            looped!(avx_vnni::dot_iq4_nl),
            MultiDotFn
        ),
        SimdLevel::Avx512Vnni => table!(
            weight,
            avx512_vnni,
            multi,
            looped!(avx512_vnni::dot_iq4_nl),
            MultiDotFn
        ),
        _ => None,
    }
}
