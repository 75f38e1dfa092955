//! AVX-512 VNNI kernels of the Q4_0 / IQ4_NL repack order, sixteen weight rows per pass:
//! one 32-bit lane per weight row, as in ggml's interleaved blocks, so a block's sixteen
//! integer sums come out of `vpdpbusd` already in their lanes, with no horizontal sum.
//!
//! Per block the sixteen rows' 16-byte nibble runs are loaded four to a register and
//! transposed (a 4x4 dword transpose per 128-bit lane): register `g` then holds bytes
//! `4g..4g + 4` of every row, whose low nibbles are elements `4g..4g + 4` and high nibbles
//! elements `16 + 4g..`, so each `vpdpbusd` takes one activation dword broadcast to all
//! lanes. The weights enter as unsigned bytes (Q4_0's raw nibble, IQ4_NL's `kvalues + 128`)
//! and each lane starts from `-offset * sum(a)` of the activation block (a per-call table),
//! so the lane ends at the exact i32 sum of `(value) * a`; it is converted and folded in
//! with one FMA by `d_w * d_a`, the scalar twins' arithmetic lane by lane. The weights are
//! decoded once for up to eight activation rows (for these two types ggml's gemv and gemm
//! orders are one order, so any number of rows may share a pass).

use std::arch::x86_64::*;

use super::x86::reduce8;
use super::x86_b32::IQ4NL_UNSIGNED;
use crate::dot::x86::{Avx512Vnni, Isa};

/// Bytes of a Q4_0 / IQ4_NL block: an f16 scale, then 16 bytes of packed nibbles.
const WEIGHT_BYTES: usize = 18;
/// Bytes of a Q8_0 activation block.
const Q8_0_BYTES: usize = 34;
/// Weight rows per pass.
pub(super) const ROWS: usize = 16;
/// Entries of the per-call table of activation block sums (activation rows x blocks):
/// 16 KiB of stack; calls with more activation rows take them in chunks, rows longer
/// than it go to the eight-row kernels.
pub(super) const SUMS_CAPACITY: usize = 4096;

/// Block `b`'s nibbles of sixteen rows, transposed: lane `r` of register `g` holds bytes
/// `4g..4g + 4` of row `r`'s 16 packed bytes.
///
/// # Safety
/// AVX-512 F is available; 16 bytes at `block + r * row_bytes + 2` are readable for
/// every `r < 16`.
#[inline(always)]
unsafe fn transposed_nibbles(block: *const u8, row_bytes: usize) -> [__m512i; 4] {
    let q = |r: usize| _mm_loadu_si128(block.add(r * row_bytes + 2).cast());
    // Lane j of z[k] holds row k + 4 j.
    let mut z = [_mm512_setzero_si512(); 4];
    for (k, z) in z.iter_mut().enumerate() {
        let v = _mm512_castsi128_si512(q(k));
        let v = _mm512_inserti32x4::<1>(v, q(k + 4));
        let v = _mm512_inserti32x4::<2>(v, q(k + 8));
        *z = _mm512_inserti32x4::<3>(v, q(k + 12));
    }
    // Per 128-bit lane j: t0 = [r0g0 r1g0 r0g1 r1g1], t1 = [r0g2 r1g2 r0g3 r1g3] (rows
    // relative to 4 j), t2 and t3 the same for rows 2 and 3.
    let t0 = _mm512_unpacklo_epi32(z[0], z[1]);
    let t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    let t2 = _mm512_unpacklo_epi32(z[2], z[3]);
    let t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    [
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    ]
}

/// Sixteen weight rows (`row_bytes` apart) against `T` activation rows (`activation_bytes`
/// apart) whose block sums, times `-offset`, are `sums[t * blocks + b]` and whose block
/// scales, widened, are `scales[t * blocks + b]`; writes `out[t * out_stride + r]`. `IQ4`
/// maps the nibbles through `kvalues + 128`.
///
/// # Safety
/// AVX-512 F/BW/VNNI and F16C are available; the rows hold `n / 32` whole blocks, the
/// activation rows `n / 32` Q8_0 blocks, `sums` and `scales` `T * n / 32` entries, and
/// `out[t * out_stride + r]` is writable for `t < T`, `r < 16`; `15 * row_bytes` fits
/// an `i32`.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn group<const T: usize, const IQ4: bool>(
    n: usize,
    rows: *const u8,
    row_bytes: usize,
    activations: *const u8,
    activation_bytes: usize,
    (sums, scales): (*const i32, *const f32),
    out: *mut f32,
    out_stride: usize,
) {
    let blocks = n / 32;
    let m4 = _mm512_set1_epi8(0x0f);
    let table = _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4NL_UNSIGNED.as_ptr().cast()));
    let offsets = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(row_bytes as i32),
    );
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..blocks {
        let block = rows.add(b * WEIGHT_BYTES);
        // The same block of the next sixteen rows (the rows follow one another in memory;
        // a weight streamed from memory otherwise arrives a line at a time). Prefetches
        // do not fault, past the end included.
        for r in 0..ROWS {
            let ahead = block.wrapping_add((ROWS + r) * row_bytes);
            _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
        }
        let packed = transposed_nibbles(block, row_bytes);
        let mut low = [_mm512_setzero_si512(); 4];
        let mut high = [_mm512_setzero_si512(); 4];
        for g in 0..4 {
            low[g] = _mm512_and_si512(packed[g], m4);
            high[g] = _mm512_and_si512(_mm512_srli_epi16::<4>(packed[g]), m4);
            if IQ4 {
                low[g] = _mm512_shuffle_epi8(table, low[g]);
                high[g] = _mm512_shuffle_epi8(table, high[g]);
            }
        }
        // Each row's f16 scale (and two bytes of its quants, dropped by the narrowing).
        let weight_scales = _mm512_i32gather_epi32::<1>(offsets, block.cast());
        let d_w = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(weight_scales));
        for t in 0..T {
            let a = activations.add(t * activation_bytes + b * Q8_0_BYTES);
            let quants = a.add(2).cast::<i32>();
            // One chain per activation row: the `T` rows' chains overlap.
            let mut isum = _mm512_set1_epi32(*sums.add(t * blocks + b));
            for g in 0..4 {
                let a_low = _mm512_set1_epi32(quants.add(g).read_unaligned());
                isum = _mm512_dpbusd_epi32(isum, low[g], a_low);
            }
            for g in 0..4 {
                let a_high = _mm512_set1_epi32(quants.add(4 + g).read_unaligned());
                isum = _mm512_dpbusd_epi32(isum, high[g], a_high);
            }
            let d_a = _mm512_set1_ps(*scales.add(t * blocks + b));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d_w, d_a), acc[t]);
        }
    }
    for t in 0..T {
        _mm512_storeu_ps(out.add(t * out_stride), acc[t]);
    }
}

/// `sums[t * blocks + b] = -offset * sum(a)` over Q8_0 block `b` of activation row `t`
/// (not written when `offset` is 0), and `scales[t * blocks + b]` its scale widened
/// (exactly):
/// each block's 32 quants summed in eight lanes against ones (`I::dot_u8_i8`), eight
/// blocks' lanes then reduced together (`x86::reduce8`). Exact, so the same at every `I`.
///
/// # Safety
/// AVX2, F16C and what `I` uses are available; `activations` holds `tokens` rows of `blocks`
/// Q8_0 blocks, `activation_bytes` apart, and `sums` and `scales` have room for
/// `tokens * blocks` entries.
#[inline(always)]
pub(super) unsafe fn block_sums<I: Isa>(
    (blocks, tokens): (usize, usize),
    activations: *const u8,
    activation_bytes: usize,
    offset: i32,
    (sums, scales): (*mut i32, *mut f32),
) {
    let ones = _mm256_set1_epi8(1);
    let factor = _mm256_set1_epi32(-offset);
    for t in 0..tokens {
        let row = activations.add(t * activation_bytes);
        for first in (0..blocks).step_by(8) {
            let count = (blocks - first).min(8);
            let mut lanes = [_mm256_setzero_si256(); 8];
            let mut bits = [0u16; 8];
            for (k, (lanes, bits)) in lanes.iter_mut().zip(&mut bits).enumerate().take(count) {
                let block = row.add((first + k) * Q8_0_BYTES);
                *bits = block.cast::<u16>().read_unaligned();
                if offset != 0 {
                    let quants = _mm256_loadu_si256(block.add(2).cast());
                    *lanes = I::dot_u8_i8(ones, quants);
                }
            }
            if offset != 0 {
                let totals = _mm256_mullo_epi32(reduce8(&lanes), factor);
                let mut values = [0i32; 8];
                _mm256_storeu_si256(values.as_mut_ptr().cast(), totals);
                std::ptr::copy_nonoverlapping(values.as_ptr(), sums.add(t * blocks + first), count);
            }
            // The eight scales widened together (exactly).
            let mut widened = [0.0f32; 8];
            _mm256_storeu_ps(
                widened.as_mut_ptr(),
                _mm256_cvtph_ps(_mm_loadu_si128(bits.as_ptr().cast())),
            );
            std::ptr::copy_nonoverlapping(widened.as_ptr(), scales.add(t * blocks + first), count);
        }
    }
}

/// [`block_sums`] with `vpdpbusd`.
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn block_sums_vnni(
    shape: (usize, usize),
    activations: *const u8,
    activation_bytes: usize,
    offset: i32,
    out: (*mut i32, *mut f32),
) {
    block_sums::<Avx512Vnni>(shape, activations, activation_bytes, offset, out);
}

macro_rules! wide {
    ($name:ident, $t:literal, $iq4:literal) => {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name(
            n: usize,
            w: *const u8,
            rb: usize,
            a: *const u8,
            ab: usize,
            s: (*const i32, *const f32),
            o: *mut f32,
            os: usize,
        ) {
            group::<$t, $iq4>(n, w, rb, a, ab, s, o, os);
        }
    };
}

wide!(q4_0_1, 1, false);
wide!(q4_0_2, 2, false);
wide!(q4_0_4, 4, false);
wide!(q4_0_8, 8, false);
wide!(iq4_nl_1, 1, true);
wide!(iq4_nl_2, 2, true);
wide!(iq4_nl_4, 4, true);
wide!(iq4_nl_8, 8, true);

/// Runs the sixteen-row kernels over the first `groups * 16` of `count` weight rows and
/// every one of `tokens` activation rows, writing `out[t * count + r]`; the caller
/// (`x86::drive`) checked the shapes, that AVX-512 VNNI is available, that
/// `n / 32 <= SUMS_CAPACITY` and that `15 * row_bytes` fits an `i32`.
///
/// # Safety
/// As stated: `weight_rows` holds `count` rows of `row_bytes`, `activations` `tokens`
/// rows of `activation_bytes`, `out` `tokens * count` floats.
pub(super) unsafe fn run(
    iq4_nl: bool,
    n: usize,
    weights: (*const u8, usize, usize),
    activations: (*const u8, usize, usize),
    out: *mut f32,
) {
    let kernels: [(usize, TableKernel); 4] = if iq4_nl {
        [(8, iq4_nl_8), (4, iq4_nl_4), (2, iq4_nl_2), (1, iq4_nl_1)]
    } else {
        [(8, q4_0_8), (4, q4_0_4), (2, q4_0_2), (1, q4_0_1)]
    };
    let offset = if iq4_nl { 128 } else { 8 };
    run_with_tables(
        n,
        weights,
        activations,
        out,
        (ROWS, &kernels),
        (offset, block_sums_vnni),
    );
}

/// A lane-per-row kernel over a group of weight rows and some activation rows, with the
/// block tables of those activation rows: `(n, rows, row_bytes, activations,
/// activation_bytes, (sums, scales), out, out_stride)`, writing `out[t * out_stride + r]`.
pub(super) type TableKernel =
    unsafe fn(usize, *const u8, usize, *const u8, usize, (*const i32, *const f32), *mut f32, usize);

/// A maker of [`block_sums`]' tables (one per target feature set).
pub(super) type TableMaker = unsafe fn((usize, usize), *const u8, usize, i32, (*mut i32, *mut f32));

/// Runs lane-per-row kernels over the whole groups of `group` rows of `count` weight rows
/// and every one of `tokens` activation rows, writing `out[t * count + r]`: activation rows
/// in chunks whose tables (made by `make` with `offset`) fit, each chunk's rows taken by the
/// first of `kernels` (activation rows per call, largest first, the last taking one) that
/// fits what is left.
///
/// # Safety
/// `weight_rows` holds `count` rows of `row_bytes`, `activations` `tokens` rows of
/// `activation_bytes`, `out` `tokens * count` floats; `n / 32 <= SUMS_CAPACITY`; the
/// kernels' and the maker's features are available and their other conditions hold.
pub(super) unsafe fn run_with_tables(
    n: usize,
    (weight_rows, row_bytes, count): (*const u8, usize, usize),
    (activations, activation_bytes, tokens): (*const u8, usize, usize),
    out: *mut f32,
    (group, kernels): (usize, &[(usize, TableKernel)]),
    (offset, make): (i32, TableMaker),
) {
    let blocks = n / 32;
    if blocks == 0 {
        return;
    }
    // Left unset (zeroing 16 KiB per call cost more than the tables): `block_sums` writes
    // the entries the kernels read.
    let mut sums = std::mem::MaybeUninit::<[i32; SUMS_CAPACITY]>::uninit();
    let sums = sums.as_mut_ptr().cast::<i32>();
    let mut scales = std::mem::MaybeUninit::<[f32; SUMS_CAPACITY]>::uninit();
    let scales = scales.as_mut_ptr().cast::<f32>();
    // Activation rows in chunks whose tables fit; the weights stream once per chunk.
    let chunk = SUMS_CAPACITY / blocks;
    for first in (0..tokens).step_by(chunk) {
        let rows_here = chunk.min(tokens - first);
        let activations = activations.add(first * activation_bytes);
        make(
            (blocks, rows_here),
            activations,
            activation_bytes,
            offset,
            (sums, scales),
        );
        for g in 0..count / group {
            let mut t = 0;
            while t < rows_here {
                let &(step, kernel) = kernels
                    .iter()
                    .find(|(step, _)| *step <= rows_here - t)
                    .expect("a kernel of one activation row");
                kernel(
                    n,
                    weight_rows.add(group * g * row_bytes),
                    row_bytes,
                    activations.add(t * activation_bytes),
                    activation_bytes,
                    (sums.add(t * blocks), scales.add(t * blocks)),
                    out.add((first + t) * count + group * g),
                    count,
                );
                t += step;
            }
        }
    }
}
