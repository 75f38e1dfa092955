//! x86 kernels of [`GatherDotFn`]: at the AVX2 levels each row through the multi-row tile
//! kernel (`legacy::rows`, inlined: no call or length check per row); with AVX-512 VNNI two
//! rows at a time, one in each half of 512-bit registers, and the horizontal sums of eight
//! dot products folded together. Per dot product the integer block sums, the f32 scale
//! products, the fused multiply-adds and `hsum_float_8`'s additions are those of the
//! single-row kernel, so the same bits.

use std::arch::x86_64::*;

use super::legacy::{self, Legacy};
use super::{Avx2, Avx512Vnni, AvxVnni, Isa};
use crate::dot::gather::{check, GatherDotFn, Shape};
use crate::dot::SimdLevel;
use crate::GgmlType;

/// Activation rows a pass over the weight rows takes (the tile kernels' widest).
const ROWS: usize = 4;

/// `rows::<W, I, C>` of the weight row at `w` and the `count` activation rows, four at a
/// time; `out` receives the row's `count` values.
///
/// # Safety
/// The instructions of `I` are available; `w` holds `blocks` weight blocks; `a` holds
/// `count` activation rows of `row_bytes`, each `blocks` blocks; `out` has room for `count`
/// values.
#[inline(always)]
unsafe fn row_by_tiles<W: Legacy, I: Isa>(
    blocks: usize,
    w: *const u8,
    a: *const u8,
    row_bytes: usize,
    count: usize,
    out: *mut f32,
) {
    let mut c = 0;
    while c < count {
        let (a, out) = (a.add(c * row_bytes), out.add(c));
        match count - c {
            1 => legacy::rows::<W, I, 1>(blocks, w, a, row_bytes, out),
            2 => legacy::rows::<W, I, 2>(blocks, w, a, row_bytes, out),
            3 => legacy::rows::<W, I, 3>(blocks, w, a, row_bytes, out),
            _ => legacy::rows::<W, I, 4>(blocks, w, a, row_bytes, out),
        }
        c += ROWS;
    }
}

/// Stamps the AVX2-level kernel of one instruction set: each row through the tile kernels.
macro_rules! by_tiles {
    ($name:ident, $isa:ty, $features:literal) => {
        /// Each row through the tile kernels.
        ///
        /// # Safety
        /// The features are available; the shape was checked by [`check`].
        #[target_feature(enable = $features)]
        unsafe fn $name<W: Legacy>(
            shape: &Shape,
            w: &[u8],
            rows: &[usize],
            a: &[u8],
            out: &mut [f32],
        ) {
            let (blocks, row_bytes, count) = (shape.blocks, shape.activation_bytes, shape.count);
            for (k, &row) in rows.iter().enumerate() {
                let w = w.as_ptr().add(row * W::BYTES);
                let out = out.as_mut_ptr().add(k * count);
                row_by_tiles::<W, $isa>(blocks, w, a.as_ptr(), row_bytes, count, out);
            }
        }
    };
}

by_tiles!(avx2_rows, Avx2, "avx2,fma,f16c");
by_tiles!(avx_vnni_rows, AvxVnni, "avx2,fma,f16c,avxvnni");

/// Two weight rows' blocks, one in each half of a 512-bit register.
///
/// # Safety
/// AVX2 and AVX-512 F are available; both point at a whole weight block.
#[inline(always)]
unsafe fn pair_quants<W: Legacy>(first: *const u8, second: *const u8) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(W::quants(first)), W::quants(second))
}

/// The block scales of two weight rows: the first's in lanes 0-7, the second's in 8-15.
///
/// # Safety
/// AVX-512 F is available; both point at a whole weight block (its scale first).
#[inline(always)]
unsafe fn pair_scales(first: *const u8, second: *const u8) -> __m512 {
    let half = |p: *const u8| _mm_set1_epi16(p.cast::<u16>().read_unaligned() as i16);
    _mm512_cvtph_ps(_mm256_set_m128i(half(second), half(first)))
}

/// The eight `hsum_float_8` of four registers each holding two eight-lane accumulators
/// (`z[c]` = row pair's first in lanes 0-7, second in 8-15), as
/// `[first of z0, z1, z2, z3, second of z0, z1, z2, z3]` in `out`: the same additions of
/// the same lanes (`hi + lo` halves, then quarters `0 + 2` and `1 + 3`, then their sum).
///
/// # Safety
/// AVX-512 F is available; `out` has room for eight values.
#[inline(always)]
unsafe fn hsum8_pairs(z: [__m512; 4], out: *mut f32) {
    // 128-bit chunks [z0 lo, z0' lo, z1 lo, z1' lo] + [z0 hi, z0' hi, z1 hi, z1' hi] (' the
    // second row): the quads of eight sums.
    let low = |a: __m512, b: __m512| _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b);
    let high = |a: __m512, b: __m512| _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b);
    let quads01 = _mm512_add_ps(high(z[0], z[1]), low(z[0], z[1]));
    let quads23 = _mm512_add_ps(high(z[2], z[3]), low(z[2], z[3]));
    // Per chunk [q01[0], q01[1], q23[0], q23[1]] + [q01[2], q01[3], q23[2], q23[3]].
    let pairs = _mm512_add_ps(
        _mm512_shuffle_ps::<0b01_00_01_00>(quads01, quads23),
        _mm512_shuffle_ps::<0b11_10_11_10>(quads01, quads23),
    );
    // Lanes 0 and 2 of each chunk: pair[0] + pair[1].
    let sums = _mm512_add_ps(pairs, _mm512_movehdup_ps(pairs));
    // Chunk 0: z0 (lane 0), z2 (lane 2); chunk 1: z0', z2'; chunk 2: z1, z3; chunk 3: z1', z3'.
    let order = _mm512_setr_epi32(0, 8, 2, 10, 4, 12, 6, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm256_storeu_ps(
        out,
        _mm512_castps512_ps256(_mm512_permutexvar_ps(order, sums)),
    );
}

/// Weight rows `first` and `second` against `C` activation rows from `a` (`row_bytes`
/// apart): `out_first[c]` and `out_second[c]` receive the dot products. Per row and
/// activation row the operations of `legacy::rows`: the block's integer lane sums (the
/// same bytes of the same lanes, `vpdpbusd` on |w| and the activation with w's sign),
/// `d_w * d_a` in f32, one FMA per lane and block, then `hsum_float_8`.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI are available; each weight row holds
/// `blocks` blocks; `a` holds `C` activation rows of `blocks` blocks; `C <= 4`; the outputs
/// have room for `C` values.
#[inline(always)]
unsafe fn pair<W: Legacy, const C: usize>(
    blocks: usize,
    first: *const u8,
    second: *const u8,
    a: *const u8,
    row_bytes: usize,
    out_first: *mut f32,
    out_second: *mut f32,
) {
    debug_assert!(W::SIGNED && !W::HAS_MIN);
    let mut acc = [_mm512_setzero_ps(); C];
    for i in 0..blocks {
        let (wa, wb) = (first.add(i * W::BYTES), second.add(i * W::BYTES));
        let quants = pair_quants::<W>(wa, wb);
        let magnitudes = _mm512_abs_epi8(quants);
        let negative = _mm512_movepi8_mask(quants);
        let scales = pair_scales(wa, wb);
        for (c, acc) in acc.iter_mut().enumerate() {
            let ab = a.add(c * row_bytes + i * W::ACTIVATION_BYTES);
            let y = _mm512_broadcast_i64x4(legacy::activation_quants::<W>(ab));
            // The activation negated where the weight is negative (`vpsignb`'s product
            // with the magnitude: where the weight is zero, so is its magnitude).
            let signed = _mm512_mask_sub_epi8(y, negative, _mm512_setzero_si512(), y);
            let sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), magnitudes, signed);
            let d = _mm512_set1_ps(super::f16_at(ab));
            *acc = _mm512_fmadd_ps(_mm512_mul_ps(scales, d), _mm512_cvtepi32_ps(sums), *acc);
        }
    }
    let mut sums = [0.0f32; 8];
    let mut z = [_mm512_setzero_ps(); 4];
    z[..C].copy_from_slice(&acc);
    hsum8_pairs(z, sums.as_mut_ptr());
    for c in 0..C {
        *out_first.add(c) = sums[c];
        *out_second.add(c) = sums[4 + c];
    }
}

/// Two rows at a time through [`pair`], a last odd one through the tile kernel.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI are available; the shape was checked by
/// [`check`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn avx512_vnni_rows<W: Legacy>(
    shape: &Shape,
    w: &[u8],
    rows: &[usize],
    a: &[u8],
    out: &mut [f32],
) {
    let (blocks, row_bytes, count) = (shape.blocks, shape.activation_bytes, shape.count);
    let (w, a, out) = (w.as_ptr(), a.as_ptr(), out.as_mut_ptr());
    let mut pairs = rows.chunks_exact(2);
    for (p, rows) in pairs.by_ref().enumerate() {
        let (first, second) = (w.add(rows[0] * W::BYTES), w.add(rows[1] * W::BYTES));
        let (out_first, out_second) = (out.add(2 * p * count), out.add((2 * p + 1) * count));
        let mut c = 0;
        while c < count {
            let (a, of, os) = (a.add(c * row_bytes), out_first.add(c), out_second.add(c));
            match count - c {
                1 => pair::<W, 1>(blocks, first, second, a, row_bytes, of, os),
                2 => pair::<W, 2>(blocks, first, second, a, row_bytes, of, os),
                3 => pair::<W, 3>(blocks, first, second, a, row_bytes, of, os),
                _ => pair::<W, 4>(blocks, first, second, a, row_bytes, of, os),
            }
            c += ROWS;
        }
    }
    if let [last] = *pairs.remainder() {
        let k = rows.len() - 1;
        let (w, out) = (w.add(last * W::BYTES), out.add(k * count));
        row_by_tiles::<W, Avx512Vnni>(blocks, w, a, row_bytes, count, out);
    }
}

/// Stamps the safe [`GatherDotFn`] of one kernel and weight format.
macro_rules! entry {
    ($kernel:ident, $format:ident) => {{
        fn gather(n: usize, weights: &[u8], rows: &[usize], activations: &[u8], out: &mut [f32]) {
            let shape = check(GgmlType::$format, n, weights, rows, activations, out);
            // SAFETY: `gather_dot` hands this out only at a level that
            // `SimdLevel::is_available` confirmed, which covers the kernel's features;
            // `check` confirmed every row inside `weights`, whole activation rows and room
            // in `out` for each (row, activation row).
            unsafe { $kernel::<legacy::$format>(&shape, weights, rows, activations, out) }
        }
        gather as GatherDotFn
    }};
}

/// The gathering kernel of `weight` (Q4_0 or Q8_0) written for exactly `level`.
pub(in crate::dot) fn gather_dot(weight: GgmlType, level: SimdLevel) -> Option<GatherDotFn> {
    match (level, weight) {
        (SimdLevel::Avx2, GgmlType::Q4_0) => Some(entry!(avx2_rows, Q4_0)),
        (SimdLevel::Avx2, GgmlType::Q8_0) => Some(entry!(avx2_rows, Q8_0)),
        (SimdLevel::AvxVnni, GgmlType::Q4_0) => Some(entry!(avx_vnni_rows, Q4_0)),
        (SimdLevel::AvxVnni, GgmlType::Q8_0) => Some(entry!(avx_vnni_rows, Q8_0)),
        (SimdLevel::Avx512Vnni, GgmlType::Q4_0) => Some(entry!(avx512_vnni_rows, Q4_0)),
        (SimdLevel::Avx512Vnni, GgmlType::Q8_0) => Some(entry!(avx512_vnni_rows, Q8_0)),
        _ => None,
    }
}
