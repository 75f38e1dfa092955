//! AVX-512 VNNI tinyBLAS kernels of the Q8_0-paired formats (Q8_0, Q4_0, Q5_0, IQ4_NL):
//! tiles of four weight rows by four token pairs.
//!
//! Each output keeps ggml's 8-lane accumulator; a 512-bit register carries the
//! accumulators of one weight row for two tokens (lanes 0..8 and 8..16), so one `vpdpbusd`
//! serves two outputs. The activation quants are stored XOR 0x80 (`x + 128` as u8, the
//! unsigned operand) and the accumulation starts from `-128 * (lane sum of the weights)`,
//! which leaves exactly the i32 lane sums of `w * x` that ggml's sign trick produces. Then,
//! per block and output, `fma(d_w * d_x, float(sums), acc)` as in ggml, and
//! `hsum_float_8` per token at the end.

#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{check, prepared_unit_bytes, KernelFn, Q0_BLOCK_BYTES};
use crate::blocks::KVALUES_IQ4NL;
use crate::dot::x86::{bits_to_bytes, hsum8, nibbles};
use crate::GgmlType;

/// Weight rows per tile.
const ROWS: usize = 4;
/// Token pairs per tile.
const PAIRS: usize = 4;

/// How a weight block becomes 32 signed quants.
trait Weights {
    const TYPE: GgmlType;
    /// Bytes of a block (the f16 scale first).
    const BYTES: usize;
    /// The 32 quants of the block at `p`, in element order.
    unsafe fn quants(p: *const u8) -> __m256i;
}

struct Q8_0;
struct Q4_0;
struct Q5_0;
struct IQ4NL;

impl Weights for Q8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const BYTES: usize = 34;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p.add(2).cast())
    }
}

impl Weights for Q4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const BYTES: usize = 18;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        _mm256_sub_epi8(nibbles(p.add(2)), _mm256_set1_epi8(8))
    }
}

impl Weights for Q5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const BYTES: usize = 22;
    /// `q - 16`: 0xF0 OR-ed into the nibble where the fifth bit is clear.
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        let high_clear =
            _mm256_andnot_si256(bits_to_bytes(p.add(2)), _mm256_set1_epi8(0xF0u8 as i8));
        _mm256_or_si256(nibbles(p.add(6)), high_clear)
    }
}

impl Weights for IQ4NL {
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    const BYTES: usize = 18;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
        _mm256_shuffle_epi8(_mm256_set_m128i(table, table), nibbles(p.add(2)))
    }
}

/// One weight block ready for the tile loop.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Unpacked {
    /// The 32 signed quants.
    quants: [i8; 32],
    /// `-128 *` the sum of quants `4k..4k+4` in lane `k`.
    offset: [i32; 8],
    /// The block scale.
    scale: f32,
}

const EMPTY: Unpacked = Unpacked {
    quants: [0; 32],
    offset: [0; 8],
    scale: 0.0,
};

/// Unpacks `rows` weight rows into `out[i * ROWS + r]` (block `i` of row `r`).
#[inline(always)]
unsafe fn unpack<W: Weights>(
    blocks: usize,
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    out: &mut [Unpacked],
) {
    let ones = _mm256_set1_epi8(1);
    for r in 0..rows {
        for i in 0..blocks {
            let p = w.add(r * row_bytes + i * W::BYTES);
            let q = W::quants(p);
            let sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);
            let offset = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<7>(sums));
            let entry = &mut out[i * ROWS + r];
            _mm256_storeu_si256(entry.quants.as_mut_ptr().cast(), q);
            _mm256_storeu_si256(entry.offset.as_mut_ptr().cast(), offset);
            let bits = p.cast::<u16>().read_unaligned();
            entry.scale = _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(bits as i16)));
        }
    }
}

/// `R` unpacked rows against `P` prepared token pairs (`unit_bytes` apart); outputs of
/// row `r`, token `t` (relative) go to `out[t * out_stride + r]`, skipping tokens at or
/// past `tokens`.
#[inline(always)]
unsafe fn tile<const R: usize, const P: usize>(
    blocks: usize,
    unpacked: &[Unpacked],
    x: *const u8,
    unit_bytes: usize,
    out: *mut f32,
    out_stride: usize,
    tokens: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    for i in 0..blocks {
        let mut quants = [_mm512_setzero_si512(); P];
        let mut scales = [_mm512_setzero_ps(); P];
        for p in 0..P {
            let at = x.add(p * unit_bytes + i * Q0_BLOCK_BYTES);
            quants[p] = _mm512_loadu_si512(at.cast());
            scales[p] = _mm512_loadu_ps(at.add(64).cast());
        }
        for r in 0..R {
            let entry = &unpacked[i * ROWS + r];
            let weights = _mm512_broadcast_i64x4(_mm256_load_si256(entry.quants.as_ptr().cast()));
            let offset = _mm512_broadcast_i64x4(_mm256_load_si256(entry.offset.as_ptr().cast()));
            let d_w = _mm512_set1_ps(entry.scale);
            for p in 0..P {
                let sums = _mm512_dpbusd_epi32(offset, quants[p], weights);
                let scale = _mm512_mul_ps(d_w, scales[p]);
                acc[r][p] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sums), acc[r][p]);
            }
        }
    }
    for r in 0..R {
        for p in 0..P {
            let low = _mm512_castps512_ps256(acc[r][p]);
            let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[r][p])));
            *out.add(2 * p * out_stride + r) = hsum8(low);
            if 2 * p + 1 < tokens {
                *out.add((2 * p + 1) * out_stride + r) = hsum8(high);
            }
        }
    }
}

#[inline(always)]
unsafe fn run<W: Weights>(n: usize, w: &[u8], prepared: &[u8], tokens: usize, out: &mut [f32]) {
    let rows = out.len() / tokens.max(1);
    if rows == 0 || tokens == 0 {
        return;
    }
    let blocks = n / 32;
    let row_bytes = w.len() / rows;
    let unit_bytes = prepared_unit_bytes(W::TYPE, n);
    let pairs = tokens.div_ceil(2);
    let mut unpacked = vec![EMPTY; blocks * ROWS];
    let (x, o) = (prepared.as_ptr(), out.as_mut_ptr());
    for r in (0..rows).step_by(ROWS) {
        let take = (rows - r).min(ROWS);
        unpack::<W>(
            blocks,
            w.as_ptr().add(r * row_bytes),
            row_bytes,
            take,
            &mut unpacked,
        );
        for p in (0..pairs).step_by(PAIRS) {
            let count = (pairs - p).min(PAIRS);
            let xp = x.add(p * unit_bytes);
            let op = o.add(2 * p * rows + r);
            let left = tokens - 2 * p;
            macro_rules! go {
                ($rows:literal) => {
                    match count {
                        4 => tile::<$rows, 4>(blocks, &unpacked, xp, unit_bytes, op, rows, left),
                        3 => tile::<$rows, 3>(blocks, &unpacked, xp, unit_bytes, op, rows, left),
                        2 => tile::<$rows, 2>(blocks, &unpacked, xp, unit_bytes, op, rows, left),
                        _ => tile::<$rows, 1>(blocks, &unpacked, xp, unit_bytes, op, rows, left),
                    }
                };
            }
            match take {
                4 => go!(4),
                3 => go!(3),
                2 => go!(2),
                _ => go!(1),
            }
        }
    }
}

/// Stamps out the safe kernel of one weight format.
macro_rules! kernel_of {
    ($weights:ty) => {{
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        unsafe fn inner(n: usize, w: &[u8], prepared: &[u8], tokens: usize, out: &mut [f32]) {
            run::<$weights>(n, w, prepared, tokens, out);
        }
        fn kernel(n: usize, w: &[u8], prepared: &[u8], tokens: usize, out: &mut [f32]) {
            check(<$weights as Weights>::TYPE, n, w, prepared, tokens, out);
            // SAFETY: `tinyblas::kernel` hands this out only where
            // `SimdLevel::Avx512Vnni.is_available()` confirmed AVX2, FMA, F16C, AVX-512
            // F/BW/VL and VNNI; `check` confirmed the sizes of the weight rows (whole
            // blocks), of the prepared pairs of every token and of `out`.
            unsafe { inner(n, w, prepared, tokens, out) }
        }
        kernel as KernelFn
    }};
}

/// The AVX-512 VNNI kernel of a Q8_0-paired format (the caller checked the features).
pub(super) fn kernel(ty: GgmlType) -> Option<KernelFn> {
    Some(match ty {
        GgmlType::Q8_0 => kernel_of!(Q8_0),
        GgmlType::Q4_0 => kernel_of!(Q4_0),
        GgmlType::Q5_0 => kernel_of!(Q5_0),
        GgmlType::IQ4_NL => kernel_of!(IQ4NL),
        _ => return None,
    })
}

/// [`super::prepare`] of the Q8_0 formats with AVX-512: the same quantization as
/// `quantize_row_q8_0_activation` (`amax` by lanes, `d = amax / 127` rounded to f16,
/// `q = round_ties_even(x * (127 / amax))`, the MXCSR default of `vcvtps2dq`), written
/// straight into the interleaved layout. `None` without AVX-512.
pub(super) fn prepare(x: &[f32], n: usize, rows: usize, out: &mut [u8]) -> Option<()> {
    if !crate::dot::SimdLevel::Avx512.is_available() {
        return None;
    }
    assert!(
        n.is_multiple_of(32) && x.len() == rows * n && rows <= 2,
        "{rows} rows of {n} in {} values",
        x.len()
    );
    assert_eq!(out.len(), n / 32 * Q0_BLOCK_BYTES, "prepared Q8_0 unit");
    // SAFETY: `SimdLevel::Avx512.is_available()` above confirmed AVX-512 F/BW/VL with AVX2,
    // FMA and F16C; the lengths of `x`
    // and `out` were checked against `rows`, `n` and the layout.
    unsafe { prepare_avx512(x, n, rows, out) };
    Some(())
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn prepare_avx512(x: &[f32], n: usize, rows: usize, out: &mut [u8]) {
    let sign = _mm512_set1_epi32(0x7FFF_FFFF);
    let flip = _mm_set1_epi8(0x80u8 as i8);
    for i in 0..n / 32 {
        let unit = out.as_mut_ptr().add(i * Q0_BLOCK_BYTES);
        for half in 0..2 {
            let (quants, d) = if half < rows {
                let p = x.as_ptr().add(half * n + 32 * i);
                let (v0, v1) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
                let a0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v0), sign));
                let a1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v1), sign));
                let amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
                let d = amax / 127.0;
                let id = _mm512_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
                let q0 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, id)));
                let q1 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, id)));
                let stored =
                    _mm_cvtph_ps(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set1_ps(d)));
                (
                    _mm256_set_m128i(_mm_xor_si128(q1, flip), _mm_xor_si128(q0, flip)),
                    _mm256_broadcastss_ps(stored),
                )
            } else {
                (_mm256_set1_epi8(0x80u8 as i8), _mm256_setzero_ps())
            };
            _mm256_storeu_si256(unit.add(32 * half).cast(), quants);
            _mm256_storeu_ps(unit.add(64 + 32 * half).cast(), d);
        }
    }
}
