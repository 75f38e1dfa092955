//! AVX2 kernels of the K-quants and IQ4_XS against Q8_K activations, each written once for
//! `C` activation rows (`C == 1` is the single-row kernel; the tile forms unpack a
//! super-block once for four rows). Integer work may be organised differently from ggml's,
//! but every lane receives the same integer sum, and the f32 steps are ggml's AVX2 steps.

// Tile kernels index several per-row arrays (accumulators, sums) by the same row `c`.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{f16_at, hsum8, nibbles};
use crate::blocks::KVALUES_IQ4NL;
use crate::dequant::{q3_k_scale, scale_min_k4};
use crate::dot::{checked_blocks, DotFn, MultiDotFn};
use crate::GgmlType;

/// Byte offsets inside a Q8_K block.
const Q8K_BYTES: usize = 292;
const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;

/// The f32 scale of the Q8_K block at `y`.
#[inline(always)]
unsafe fn q8k_scale(y: *const u8) -> f32 {
    y.cast::<f32>().read_unaligned()
}

/// 32 activation quants starting at element `at` of the Q8_K block at `y`.
#[inline(always)]
unsafe fn q8k_quants(y: *const u8, at: usize) -> __m256i {
    _mm256_loadu_si256(y.add(Q8K_QS + at).cast())
}

/// i16 scales: the lower 128 bits all `low`, the upper all `high` (one scale per 16
/// elements of a 32-element group).
#[inline(always)]
unsafe fn scale_pair(low: i16, high: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(high), _mm_set1_epi16(low))
}

/// `scale * (q x y)`: u8 quants `q`, i8 activations `y`, i16 `scales`, into eight i32 lanes.
#[inline(always)]
unsafe fn scaled(q: __m256i, y: __m256i, scales: __m256i) -> __m256i {
    _mm256_madd_epi16(scales, _mm256_maddubs_epi16(q, y))
}

/// Eight sums of 32 activations: pairs of Q8_K's sums of 16 (`vphaddw`).
#[inline(always)]
unsafe fn sums_of_32(y: *const u8) -> __m128i {
    let bsums = _mm256_loadu_si256(y.add(Q8K_BSUMS).cast());
    _mm_hadd_epi16(
        _mm256_castsi256_si128(bsums),
        _mm256_extracti128_si256(bsums, 1),
    )
}

#[inline(always)]
unsafe fn row<const C: usize>(a: *const u8, row_bytes: usize, c: usize, block: usize) -> *const u8 {
    a.add(c * row_bytes + block * Q8K_BYTES)
}

/// Q2_K: the minimum correction enters the same eight lanes first.
#[inline(always)]
unsafe fn q2_k<const C: usize>(
    blocks: usize,
    w: *const u8,
    a: *const u8,
    rb: usize,
    out: *mut f32,
) {
    let mut acc = [_mm256_setzero_ps(); C];
    let mask3 = _mm256_set1_epi8(3);
    for i in 0..blocks {
        let x = w.add(i * 84);
        let packed = _mm_loadu_si128(x.cast());
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(
            _mm_srli_epi16(packed, 4),
            _mm_set1_epi8(0x0f),
        ));
        let scale_bytes = x.cast::<[u8; 16]>().read_unaligned();
        let (dw, dminw) = (f16_at(x.add(80)), f16_at(x.add(82)));
        let mut sumi = [_mm256_setzero_si256(); C];
        for c in 0..C {
            let y = row::<C>(a, rb, c, i);
            let yd = q8k_scale(y);
            let prod = _mm256_madd_epi16(mins, _mm256_loadu_si256(y.add(Q8K_BSUMS).cast()));
            acc[c] = _mm256_fmadd_ps(
                _mm256_set1_ps(-yd * dminw),
                _mm256_cvtepi32_ps(prod),
                acc[c],
            );
        }
        for half in 0..2 {
            let bits = _mm256_loadu_si256(x.add(16 + 32 * half).cast());
            for shift in 0..4 {
                let q = _mm256_and_si256(
                    _mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * shift as i32)),
                    mask3,
                );
                let group = 8 * half + 2 * shift;
                let scales = scale_pair(
                    i16::from(scale_bytes[group] & 0x0f),
                    i16::from(scale_bytes[group + 1] & 0x0f),
                );
                for c in 0..C {
                    let y = q8k_quants(row::<C>(a, rb, c, i), 128 * half + 32 * shift);
                    sumi[c] = _mm256_add_epi32(sumi[c], scaled(q, y, scales));
                }
            }
        }
        for c in 0..C {
            let d = q8k_scale(row::<C>(a, rb, c, i)) * dw;
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
    }
    for c in 0..C {
        *out.add(c) = hsum8(acc[c]);
    }
}

/// Q3_K: `q = low2 - 4 * (high bit clear)`, computed as two `vpmaddubsw` and a subtraction.
#[inline(always)]
unsafe fn q3_k<const C: usize>(
    blocks: usize,
    w: *const u8,
    a: *const u8,
    rb: usize,
    out: *mut f32,
) {
    let mut acc = [_mm256_setzero_ps(); C];
    let mask3 = _mm256_set1_epi8(3);
    for i in 0..blocks {
        let x = w.add(i * 110);
        let packed = x.add(96).cast::<[u8; 12]>().read_unaligned();
        let scale: [i16; 16] = std::array::from_fn(|j| i16::from(q3_k_scale(j, &packed)));
        let dw = f16_at(x.add(108));
        let high_bits = _mm256_loadu_si256(x.cast());
        let mut sumi = [_mm256_setzero_si256(); C];
        for half in 0..2 {
            let bits = _mm256_loadu_si256(x.add(32 + 32 * half).cast());
            for shift in 0..4 {
                let low = _mm256_and_si256(
                    _mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * shift as i32)),
                    mask3,
                );
                let bit = _mm256_set1_epi8((1u8 << (4 * half + shift)) as i8);
                let clear =
                    _mm256_cmpeq_epi8(_mm256_and_si256(high_bits, bit), _mm256_setzero_si256());
                let four = _mm256_and_si256(clear, _mm256_set1_epi8(4));
                let group = 8 * half + 2 * shift;
                let scales = scale_pair(scale[group], scale[group + 1]);
                for c in 0..C {
                    let y = q8k_quants(row::<C>(a, rb, c, i), 128 * half + 32 * shift);
                    let p = _mm256_sub_epi16(
                        _mm256_maddubs_epi16(low, y),
                        _mm256_maddubs_epi16(four, y),
                    );
                    sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(scales, p));
                }
            }
        }
        for c in 0..C {
            let d = q8k_scale(row::<C>(a, rb, c, i)) * dw;
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
    }
    for c in 0..C {
        *out.add(c) = hsum8(acc[c]);
    }
}

/// Scales and minimums of the eight sub-blocks of Q4_K / Q5_K (12 bytes at `p`).
#[inline(always)]
unsafe fn scales_and_mins(p: *const u8) -> ([i16; 8], [i16; 8]) {
    let packed = p.cast::<[u8; 12]>().read_unaligned();
    let mut scales = [0i16; 8];
    let mut mins = [0i16; 8];
    for j in 0..8 {
        let (scale, min) = scale_min_k4(j, &packed);
        scales[j] = i16::from(scale);
        mins[j] = i16::from(min);
    }
    (scales, mins)
}

/// Q4_K (`FIVE == false`) and Q5_K (`FIVE == true`): the quant loops are shared; the
/// minimum correction goes to four extra lanes (Q4_K) or a scalar (Q5_K), as in ggml.
#[inline(always)]
unsafe fn q45_k<const C: usize, const FIVE: bool>(
    blocks: usize,
    w: *const u8,
    a: *const u8,
    rb: usize,
    out: *mut f32,
) {
    let block_bytes = if FIVE { 176 } else { 144 };
    let quants_at = if FIVE { 48 } else { 16 };
    let mask4 = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); C];
    let mut acc_mins = [_mm_setzero_ps(); C];
    let mut minimums = [0.0f32; C];
    for i in 0..blocks {
        let x = w.add(i * block_bytes);
        let (dw, dminw) = (f16_at(x), f16_at(x.add(2)));
        let (scale, min) = scales_and_mins(x.add(4));
        let mins = _mm_loadu_si128(min.as_ptr().cast());
        for c in 0..C {
            let y = row::<C>(a, rb, c, i);
            let dmin = -q8k_scale(y) * dminw;
            let prod = _mm_madd_epi16(mins, sums_of_32(y));
            if FIVE {
                let total = _mm_add_epi32(prod, _mm_unpackhi_epi64(prod, prod));
                let total = _mm_add_epi32(total, _mm_shuffle_epi32(total, 0b01));
                minimums[c] = dmin.mul_add(_mm_cvtsi128_si32(total) as f32, minimums[c]);
            } else {
                acc_mins[c] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_mins[c]);
            }
        }
        let high_bits = _mm256_loadu_si256(x.add(16).cast());
        let mut sumi = [_mm256_setzero_si256(); C];
        for j in 0..4 {
            let bits = _mm256_loadu_si256(x.add(quants_at + 32 * j).cast());
            let mut low = _mm256_and_si256(bits, mask4);
            let mut high = _mm256_and_si256(_mm256_srli_epi16(bits, 4), mask4);
            if FIVE {
                let fifth = |bit: i32| {
                    let select = _mm256_set1_epi8((1u8 << bit) as i8);
                    let set = _mm256_cmpeq_epi8(_mm256_and_si256(high_bits, select), select);
                    _mm256_and_si256(set, _mm256_set1_epi8(16))
                };
                low = _mm256_or_si256(low, fifth(2 * j as i32));
                high = _mm256_or_si256(high, fifth(2 * j as i32 + 1));
            }
            let scale_low = _mm256_set1_epi16(scale[2 * j]);
            let scale_high = _mm256_set1_epi16(scale[2 * j + 1]);
            for c in 0..C {
                let y = row::<C>(a, rb, c, i);
                let part_low = scaled(low, q8k_quants(y, 64 * j), scale_low);
                let part_high = scaled(high, q8k_quants(y, 64 * j + 32), scale_high);
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(part_low, part_high));
            }
        }
        for c in 0..C {
            let d = q8k_scale(row::<C>(a, rb, c, i)) * dw;
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
    }
    for c in 0..C {
        *out.add(c) = if FIVE {
            hsum8(acc[c]) + minimums[c]
        } else {
            let m = _mm_add_ps(acc_mins[c], _mm_movehl_ps(acc_mins[c], acc_mins[c]));
            let m = _mm_add_ss(m, _mm_movehdup_ps(m));
            hsum8(acc[c]) + _mm_cvtss_f32(m)
        };
    }
}

/// Q6_K: the unsigned six-bit codes against the activations, the `-32` offset taken out
/// per lane through the Q8_K block sums (`32 * vpmaddwd(bsums, scales)`), as ggml does.
#[inline(always)]
unsafe fn q6_k<const C: usize>(
    blocks: usize,
    w: *const u8,
    a: *const u8,
    rb: usize,
    out: *mut f32,
) {
    let mask4 = _mm256_set1_epi8(0x0f);
    let mask2 = _mm256_set1_epi8(3);
    let mut acc = [_mm256_setzero_ps(); C];
    for i in 0..blocks {
        let x = w.add(i * 210);
        let scale = x.add(192).cast::<[i8; 16]>().read_unaligned();
        let scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(x.add(192).cast()));
        let dw = f16_at(x.add(208));
        let mut sumi = [_mm256_setzero_si256(); C];
        for half in 0..2 {
            let low0 = _mm256_loadu_si256(x.add(64 * half).cast());
            let low1 = _mm256_loadu_si256(x.add(64 * half + 32).cast());
            let high = _mm256_loadu_si256(x.add(128 + 32 * half).cast());
            let top = |shift: i32| {
                let two = _mm256_and_si256(_mm256_srl_epi16(high, _mm_cvtsi32_si128(shift)), mask2);
                _mm256_slli_epi16(two, 4)
            };
            let quants = [
                _mm256_or_si256(_mm256_and_si256(low0, mask4), top(0)),
                _mm256_or_si256(_mm256_and_si256(low1, mask4), top(2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low0, 4), mask4), top(4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low1, 4), mask4), top(6)),
            ];
            for (k, &q) in quants.iter().enumerate() {
                let group = 8 * half + 2 * k;
                let scales = scale_pair(i16::from(scale[group]), i16::from(scale[group + 1]));
                for c in 0..C {
                    let y = q8k_quants(row::<C>(a, rb, c, i), 128 * half + 32 * k);
                    sumi[c] = _mm256_add_epi32(sumi[c], scaled(q, y, scales));
                }
            }
        }
        for c in 0..C {
            let y = row::<C>(a, rb, c, i);
            let bsums = _mm256_loadu_si256(y.add(Q8K_BSUMS).cast());
            let offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums, scales16), 5);
            let d = q8k_scale(y) * dw;
            let lanes = _mm256_sub_epi32(sumi[c], offset);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc[c]);
        }
    }
    for c in 0..C {
        *out.add(c) = hsum8(acc[c]);
    }
}

/// IQ4_XS: table lookup of the nibbles, sign trick, one i16 scale per 32 elements.
#[inline(always)]
unsafe fn iq4_xs<const C: usize>(
    blocks: usize,
    w: *const u8,
    a: *const u8,
    rb: usize,
    out: *mut f32,
) {
    let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
    let table = _mm256_set_m128i(table, table);
    let mut acc = [_mm256_setzero_ps(); C];
    for i in 0..blocks {
        let x = w.add(i * 136);
        let dw = f16_at(x);
        let scales_high = x.add(2).cast::<u16>().read_unaligned();
        let mut sumi = [_mm256_setzero_si256(); C];
        for sub in 0..8 {
            let low = (*x.add(4 + sub / 2) >> (4 * (sub % 2))) & 0x0f;
            let high = ((scales_high >> (2 * sub)) & 3) as u8;
            let scale = _mm256_set1_epi16(i16::from(low | (high << 4)) - 32);
            let q = _mm256_shuffle_epi8(table, nibbles(x.add(8 + 16 * sub)));
            let magnitude = _mm256_sign_epi8(q, q);
            for c in 0..C {
                let y = q8k_quants(row::<C>(a, rb, c, i), 32 * sub);
                let p = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(y, q));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(p, scale));
            }
        }
        for c in 0..C {
            let d = dw * q8k_scale(row::<C>(a, rb, c, i));
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
    }
    for c in 0..C {
        *out.add(c) = hsum8(acc[c]);
    }
}

/// A tile kernel: `C` activation rows `row_bytes` apart, `C` results.
type Tile = unsafe fn(usize, *const u8, *const u8, usize, *mut f32);

/// Runs `one` on a single row (checked).
fn single(ty: GgmlType, one: Tile, n: usize, w: &[u8], a: &[u8]) -> f32 {
    let blocks = checked_blocks(ty, n, w, a);
    let mut out = 0.0f32;
    // SAFETY: `dot_fn` and `multi_dot_fn` hand these kernels out only at the AVX2 level,
    // after `SimdLevel::is_available` confirmed AVX2, FMA and F16C; both rows hold
    // `blocks` blocks (`checked_blocks` above).
    unsafe { one(blocks, w.as_ptr(), a.as_ptr(), 0, &mut out) };
    out
}

/// Runs `four` over groups of four activation rows and `one` over the rest.
fn multi(ty: GgmlType, four: Tile, one: Tile, n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    if out.is_empty() {
        return;
    }
    let row_bytes = a.len() / out.len();
    assert_eq!(
        row_bytes * out.len(),
        a.len(),
        "activation rows of equal length"
    );
    let blocks = checked_blocks(ty, n, w, &a[..row_bytes]);
    let mut start = 0;
    while start < out.len() {
        let count = if out.len() - start >= 4 { 4 } else { 1 };
        let kernel = if count == 4 { four } else { one };
        // SAFETY: handed out as in `single`, after `SimdLevel::is_available` confirmed AVX2,
        // FMA and F16C; `count` rows of `row_bytes` bytes (each of `blocks` blocks) start at
        // this offset and `out` has `count` slots there.
        unsafe {
            kernel(
                blocks,
                w.as_ptr(),
                a[start * row_bytes..].as_ptr(),
                row_bytes,
                out[start..].as_mut_ptr(),
            )
        };
        start += count;
    }
}

/// Stamps the `#[target_feature]` tile functions and the safe entry points of one type.
macro_rules! kernels {
    ($dot:ident, $multi:ident, $ty:expr, $body:ident $(, $extra:expr)?) => {
        pub(super) fn $dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn one(blocks: usize, w: *const u8, a: *const u8, rb: usize, out: *mut f32) {
                $body::<1 $(, $extra)?>(blocks, w, a, rb, out)
            }
            single($ty, one, n, w, a)
        }

        pub(super) fn $multi(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn one(blocks: usize, w: *const u8, a: *const u8, rb: usize, out: *mut f32) {
                $body::<1 $(, $extra)?>(blocks, w, a, rb, out)
            }
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn four(blocks: usize, w: *const u8, a: *const u8, rb: usize, out: *mut f32) {
                $body::<4 $(, $extra)?>(blocks, w, a, rb, out)
            }
            multi($ty, four, one, n, w, a, out)
        }
    };
}

kernels!(dot_q2_k_avx2, multi_q2_k_avx2, GgmlType::Q2_K, q2_k);
kernels!(dot_q3_k_avx2, multi_q3_k_avx2, GgmlType::Q3_K, q3_k);
kernels!(dot_q4_k_avx2, multi_q4_k_avx2, GgmlType::Q4_K, q45_k, false);
kernels!(dot_q5_k_avx2, multi_q5_k_avx2, GgmlType::Q5_K, q45_k, true);
kernels!(dot_q6_k_avx2, multi_q6_k_avx2, GgmlType::Q6_K, q6_k);
kernels!(dot_iq4_xs_avx2, multi_iq4_xs_avx2, GgmlType::IQ4_XS, iq4_xs);

/// The single-row AVX2 kernel of a K-quant type.
pub(super) fn dot(weight: GgmlType) -> Option<DotFn> {
    use GgmlType::*;
    Some(match weight {
        Q2_K => dot_q2_k_avx2,
        Q3_K => dot_q3_k_avx2,
        Q4_K => dot_q4_k_avx2,
        Q5_K => dot_q5_k_avx2,
        Q6_K => dot_q6_k_avx2,
        IQ4_XS => dot_iq4_xs_avx2,
        _ => return None,
    })
}

/// The four-row AVX2 tile kernel of a K-quant type.
pub(super) fn multi_dot(weight: GgmlType) -> Option<MultiDotFn> {
    use GgmlType::*;
    Some(match weight {
        Q2_K => multi_q2_k_avx2,
        Q3_K => multi_q3_k_avx2,
        Q4_K => multi_q4_k_avx2,
        Q5_K => multi_q5_k_avx2,
        Q6_K => multi_q6_k_avx2,
        IQ4_XS => multi_iq4_xs_avx2,
        _ => return None,
    })
}
