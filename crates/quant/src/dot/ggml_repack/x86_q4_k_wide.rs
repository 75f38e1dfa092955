//! AVX-512 VNNI kernels of the Q4_K repack order (see the module doc of `ggml_repack`),
//! sixteen weight rows per pass, one 32-bit lane per row as in `x86_b32_wide`.
//!
//! Per super-block the rows' scale bytes are gathered (a dword per row at a time) and
//! unpacked lane-wise with ggml's `kmask` steps into the eight 6-bit scales and minimums
//! of every row; per 64-element chunk the rows' 32 bytes of nibbles are loaded two rows
//! to a register and transposed (an 8x8 dword transpose per 256-bit half, then one
//! `vpermt2q` per output), so register `g` holds bytes `4g..4g + 4` of every row and each
//! `vpdpbusd` takes one broadcast activation dword. A sub-block's sum is multiplied by its
//! scale in the lane; the integer sums are exact, so the lanes hold the scalar twins'
//! integers and the FMAs per span are theirs.

use std::arch::x86_64::*;

/// Bytes of a Q4_K block: `d`, `dmin` (f16), 12 bytes of scales, 128 of nibbles.
const WEIGHT_BYTES: usize = 144;
/// Bytes of a Q8_K activation block (`d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]`).
const Q8_K_BYTES: usize = 292;
/// Offset of `bsums` in a Q8_K block.
const Q8_K_BSUMS: usize = 260;
/// Weight rows per pass.
pub(super) const ROWS: usize = 16;

/// Chunk `c`'s 32 nibble bytes of sixteen rows, transposed: lane `r` of register `g`
/// holds bytes `4g..4g + 4` of row `r`'s chunk.
///
/// # Safety
/// AVX-512 F is available; 32 bytes at `block + r * row_bytes + 16 + 32 c` are readable
/// for every `r < 16`.
#[inline(always)]
unsafe fn transposed_chunk(block: *const u8, row_bytes: usize, c: usize) -> [__m512i; 8] {
    let q = |r: usize| _mm256_loadu_si256(block.add(r * row_bytes + 16 + 32 * c).cast());
    // The lower half of z[k] holds row k, the upper half row k + 8.
    let mut z = [_mm512_setzero_si512(); 8];
    for (k, z) in z.iter_mut().enumerate() {
        *z = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q(k)), q(k + 8));
    }
    // Per 128-bit lane: u[m] holds dword m of rows 0..4 (u[4 + m] of rows 4..8), the
    // lower 128-bit lane of each half dwords 0..4, the upper dwords 4..8.
    let mut t = [_mm512_setzero_si512(); 8];
    for p in 0..2 {
        t[4 * p] = _mm512_unpacklo_epi32(z[4 * p], z[4 * p + 1]);
        t[4 * p + 1] = _mm512_unpackhi_epi32(z[4 * p], z[4 * p + 1]);
        t[4 * p + 2] = _mm512_unpacklo_epi32(z[4 * p + 2], z[4 * p + 3]);
        t[4 * p + 3] = _mm512_unpackhi_epi32(z[4 * p + 2], z[4 * p + 3]);
    }
    let mut u = [_mm512_setzero_si512(); 8];
    for p in 0..2 {
        u[4 * p] = _mm512_unpacklo_epi64(t[4 * p], t[4 * p + 2]);
        u[4 * p + 1] = _mm512_unpackhi_epi64(t[4 * p], t[4 * p + 2]);
        u[4 * p + 2] = _mm512_unpacklo_epi64(t[4 * p + 1], t[4 * p + 3]);
        u[4 * p + 3] = _mm512_unpackhi_epi64(t[4 * p + 1], t[4 * p + 3]);
    }
    // Dword g < 4: 128-bit lanes 0 and 2 of u[g] and u[4 + g], interleaved; g >= 4:
    // lanes 1 and 3 of u[g - 4] and u[g].
    let low_lanes = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    let high_lanes = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    let mut out = [_mm512_setzero_si512(); 8];
    for g in 0..4 {
        out[g] = _mm512_permutex2var_epi64(u[g], low_lanes, u[4 + g]);
        out[4 + g] = _mm512_permutex2var_epi64(u[g], high_lanes, u[4 + g]);
    }
    out
}

/// Sixteen Q4_K rows against `T` Q8_K activation rows, one FMA per `span_chunks`
/// 64-element chunks (4: the gemv order, 1: the gemm order); writes
/// `out[t * out_stride + r]`.
///
/// # Safety
/// AVX-512 F/BW/VNNI and F16C are available; the rows hold `n / 256` whole blocks, the
/// activation rows `n / 256` Q8_K blocks, `out[t * out_stride + r]` is writable for
/// `t < T`, `r < 16`, and `15 * row_bytes + 12` fits an `i32`.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn group<const T: usize>(
    n: usize,
    rows: *const u8,
    row_bytes: usize,
    activations: *const u8,
    activation_bytes: usize,
    out: *mut f32,
    out_stride: usize,
    span_chunks: usize,
) {
    let m4 = _mm512_set1_epi8(0x0f);
    let kmask1 = _mm512_set1_epi32(0x3f3f_3f3f);
    let kmask2 = _mm512_set1_epi32(0x0f0f_0f0f);
    let kmask3 = _mm512_set1_epi32(0x0303_0303);
    let byte = _mm512_set1_epi32(0xff);
    let offsets = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(row_bytes as i32),
    );
    let mut acc = [_mm512_setzero_ps(); T];
    let mut acc_min = [_mm512_setzero_ps(); T];
    for b in 0..n / 256 {
        let block = rows.add(b * WEIGHT_BYTES);
        for r in 0..ROWS {
            let ahead = block.wrapping_add((ROWS + r) * row_bytes);
            _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64).cast());
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(128).cast());
        }
        let dd = _mm512_i32gather_epi32::<1>(offsets, block.cast());
        let d_w = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
        let dmin_w = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dd)));
        // ggml's unpacking of the 12 scale bytes, every row's in its lane.
        let u0 = _mm512_i32gather_epi32::<1>(offsets, block.add(4).cast());
        let u1 = _mm512_i32gather_epi32::<1>(offsets, block.add(8).cast());
        let u2 = _mm512_i32gather_epi32::<1>(offsets, block.add(12).cast());
        let top = |u: __m512i| {
            _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u), kmask3))
        };
        let packed_scales = [
            _mm512_and_si512(u0, kmask1),
            _mm512_or_si512(_mm512_and_si512(u2, kmask2), top(u0)),
        ];
        let packed_mins = [
            _mm512_and_si512(u1, kmask1),
            _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi32::<4>(u2), kmask2),
                top(u1),
            ),
        ];
        let mut scales = [_mm512_setzero_si512(); 8];
        let mut mins = [_mm512_setzero_si512(); 8];
        for j in 0..8 {
            let shift = _mm_cvtsi32_si128(8 * (j % 4) as i32);
            scales[j] = _mm512_and_si512(_mm512_srl_epi32(packed_scales[j / 4], shift), byte);
            mins[j] = _mm512_and_si512(_mm512_srl_epi32(packed_mins[j / 4], shift), byte);
        }
        let mut isum = [_mm512_setzero_si512(); T];
        let mut imin = [_mm512_setzero_si512(); T];
        for c in 0..4 {
            let packed = transposed_chunk(block, row_bytes, c);
            let mut low = [_mm512_setzero_si512(); 8];
            let mut high = [_mm512_setzero_si512(); 8];
            for g in 0..8 {
                low[g] = _mm512_and_si512(packed[g], m4);
                high[g] = _mm512_and_si512(_mm512_srli_epi16::<4>(packed[g]), m4);
            }
            for t in 0..T {
                let a = activations.add(t * activation_bytes + b * Q8_K_BYTES);
                let quants = a.add(4 + 64 * c).cast::<i32>();
                let mut sum_low = _mm512_setzero_si512();
                let mut sum_high = _mm512_setzero_si512();
                for g in 0..8 {
                    let a_low = _mm512_set1_epi32(quants.add(g).read_unaligned());
                    let a_high = _mm512_set1_epi32(quants.add(8 + g).read_unaligned());
                    sum_low = _mm512_dpbusd_epi32(sum_low, low[g], a_low);
                    sum_high = _mm512_dpbusd_epi32(sum_high, high[g], a_high);
                }
                isum[t] = _mm512_add_epi32(
                    isum[t],
                    _mm512_add_epi32(
                        _mm512_mullo_epi32(sum_low, scales[2 * c]),
                        _mm512_mullo_epi32(sum_high, scales[2 * c + 1]),
                    ),
                );
                // Sums of 32 activations per sub-block.
                let bsums = a.add(Q8_K_BSUMS).cast::<i16>();
                let sub_sum = |j: usize| {
                    i32::from(bsums.add(2 * j).read_unaligned())
                        + i32::from(bsums.add(2 * j + 1).read_unaligned())
                };
                imin[t] = _mm512_add_epi32(
                    imin[t],
                    _mm512_add_epi32(
                        _mm512_mullo_epi32(mins[2 * c], _mm512_set1_epi32(sub_sum(2 * c))),
                        _mm512_mullo_epi32(mins[2 * c + 1], _mm512_set1_epi32(sub_sum(2 * c + 1))),
                    ),
                );
                if (c + 1) % span_chunks == 0 {
                    let d_a = _mm512_set1_ps(a.cast::<f32>().read_unaligned());
                    acc[t] = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(isum[t]),
                        _mm512_mul_ps(d_w, d_a),
                        acc[t],
                    );
                    acc_min[t] = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(imin[t]),
                        _mm512_mul_ps(dmin_w, d_a),
                        acc_min[t],
                    );
                    isum[t] = _mm512_setzero_si512();
                    imin[t] = _mm512_setzero_si512();
                }
            }
        }
    }
    for t in 0..T {
        _mm512_storeu_ps(out.add(t * out_stride), _mm512_sub_ps(acc[t], acc_min[t]));
    }
}

/// A kernel over sixteen weight rows and `T` activation rows.
type WideFn = unsafe fn(usize, *const u8, usize, *const u8, usize, *mut f32, usize);

macro_rules! wide {
    ($name:ident, $t:literal, $span:literal) => {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
        unsafe fn $name(
            n: usize,
            w: *const u8,
            rb: usize,
            a: *const u8,
            ab: usize,
            o: *mut f32,
            os: usize,
        ) {
            group::<$t>(n, w, rb, a, ab, o, os, $span);
        }
    };
}

wide!(gemv_1, 1, 4);
wide!(gemv_2, 2, 4);
wide!(gemv_4, 4, 4);
wide!(gemm_1, 1, 1);
wide!(gemm_2, 2, 1);
wide!(gemm_4, 4, 1);

/// Runs the sixteen-row kernels (`gemm`: ggml's gemm order, else its gemv order) over the
/// first `count / 16 * 16` of `count` weight rows and every one of `tokens` activation
/// rows, writing `out[t * count + r]`. Each activation row gets its own order's
/// arithmetic whatever rows share its pass.
///
/// # Safety
/// AVX-512 VNNI (with F, BW, AVX2, F16C) is available; `weight_rows` holds `count` rows
/// of `row_bytes` (whole Q4_K blocks of `n`), `activations` `tokens` Q8_K rows of
/// `activation_bytes`, `out` `tokens * count` floats; `15 * row_bytes + 12` fits an `i32`.
pub(super) unsafe fn run(
    gemm: bool,
    n: usize,
    (weight_rows, row_bytes, count): (*const u8, usize, usize),
    (activations, activation_bytes, tokens): (*const u8, usize, usize),
    out: *mut f32,
) {
    let kernels: [WideFn; 3] = if gemm {
        [gemm_1, gemm_2, gemm_4]
    } else {
        [gemv_1, gemv_2, gemv_4]
    };
    for g in 0..count / ROWS {
        let mut t = 0;
        while t < tokens {
            let (kernel, step) = match tokens - t {
                4.. => (kernels[2], 4),
                2 | 3 => (kernels[1], 2),
                _ => (kernels[0], 1),
            };
            kernel(
                n,
                weight_rows.add(ROWS * g * row_bytes),
                row_bytes,
                activations.add(t * activation_bytes),
                activation_bytes,
                out.add(t * count + ROWS * g),
                count,
            );
            t += step;
        }
    }
}
