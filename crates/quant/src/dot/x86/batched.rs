//! Batched kernels of the 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0):
//! several weight rows against one activation row (decode, [`GemvFn`]) and one weight row
//! against a tile of activation rows whose block scales were widened to f32 beforehand
//! (prompt processing, [`TileFn`]).
//!
//! Each (weight row, activation row) pair keeps its own accumulator and sees exactly the
//! operations of the single-row kernel in `legacy.rs`, so results are bit-identical to it
//! and to the scalar twin. What changes is the port pressure: the single-row and old tile
//! kernels spend most of their shuffle port (p5 on Intel) on f16 scale broadcasts and
//! inserts. Here the activation scale of a block is converted once for four weight rows
//! (gemv) or read as an f32 broadcast from memory (tile, a pure load), Q4_1/Q5_1 convert
//! `d` and `m` with one `vcvtph2ps`, and the independent accumulators of several rows or
//! tokens hide the FMA latency that chains one row's blocks.

// Kernels index several per-row arrays (accumulators, sums) by the same row `c`.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::legacy::{activation_quants, block_sums, Legacy};
use super::{f16_splat, hsum8, Avx2, Avx512Vnni, AvxVnni, Isa};
use crate::dot::{
    checked_blocks, BlockScales, GemvFn, HalfSums, QuantLayout, SimdLevel, TileFn, TileOut,
    TileRowsFn,
};
use crate::GgmlType;

/// `[d, m, d, m]` of a Q4_1/Q5_1 block: its first four bytes, one load and one conversion.
#[inline(always)]
unsafe fn scale_and_minimum(p: *const u8) -> __m128 {
    let bits = p.cast::<i32>().read_unaligned();
    _mm_cvtph_ps(_mm_set1_epi32(bits))
}

/// How far ahead (in weight rows) the gemv kernel prefetches.
const PREFETCH_ROWS: usize = 16;

/// `R` weight rows `row_bytes` apart against the activation row `a`; `out[r]` receives
/// the dot product of row `r`.
#[inline(always)]
unsafe fn gemv_rows<W: Legacy, I: Isa, const R: usize>(
    blocks: usize,
    w: *const u8,
    row_bytes: usize,
    a: *const u8,
    out: *mut f32,
) {
    let mut acc = [_mm256_setzero_ps(); R];
    // Lane 1 of each: the row's running `m * s` (lane 0 collects an unused `d * s`).
    let mut minimums = [_mm_setzero_ps(); R];
    for i in 0..blocks {
        let ab = a.add(i * W::ACTIVATION_BYTES);
        let y = activation_quants::<W>(ab);
        let d_a = f16_splat(ab);
        let s_a = if W::HAS_MIN {
            _mm256_castps256_ps128(f16_splat(ab.add(2)))
        } else {
            _mm_setzero_ps()
        };
        for r in 0..R {
            let wb = w.add(r * row_bytes + i * W::BYTES);
            _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH_ROWS * row_bytes).cast());
            let sums = block_sums::<W, I>(W::quants(wb), y);
            let d_w = if W::HAS_MIN {
                let dm = scale_and_minimum(wb);
                minimums[r] = _mm_fmadd_ps(dm, s_a, minimums[r]);
                _mm256_broadcastss_ps(dm)
            } else {
                W::scale(wb)
            };
            let scale = _mm256_mul_ps(d_w, d_a);
            acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums), acc[r]);
        }
    }
    for r in 0..R {
        let sum = hsum8(acc[r]);
        *out.add(r) = if W::HAS_MIN {
            sum + _mm_cvtss_f32(_mm_movehdup_ps(minimums[r]))
        } else {
            sum
        };
    }
}

/// One weight row against `C` activation rows `row_bytes` apart, whose block scales are
/// `d[i * stride + c]` (read eight at a time) and Q8_1's sums `s[i * stride + c]` (four at a
/// time).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_rows<W: Legacy, I: Isa, const C: usize>(
    blocks: usize,
    w: *const u8,
    a: *const u8,
    row_bytes: usize,
    d: *const f32,
    s: *const f32,
    stride: usize,
    out: *mut f32,
) {
    let mut acc = [_mm256_setzero_ps(); C];
    // Lane c % 4 of minimums[c / 4]: the running `m * s` of row c.
    let mut minimums = [_mm_setzero_ps(); 2];
    for i in 0..blocks {
        let wb = w.add(i * W::BYTES);
        let ab = a.add(i * W::ACTIVATION_BYTES);
        let q = W::quants(wb);
        let d_w = if W::HAS_MIN {
            let dm = scale_and_minimum(wb);
            let m = _mm_permute_ps::<0b0101_0101>(dm);
            for group in 0..C.div_ceil(4) {
                let sums = _mm_loadu_ps(s.add(i * stride + 4 * group));
                minimums[group] = _mm_fmadd_ps(m, sums, minimums[group]);
            }
            _mm256_broadcastss_ps(dm)
        } else {
            W::scale(wb)
        };
        // d_w * d_a of up to eight rows in one multiply (lanes past C are unused).
        let mut scales = [0.0f32; 8];
        _mm256_storeu_ps(
            scales.as_mut_ptr(),
            _mm256_mul_ps(d_w, _mm256_loadu_ps(d.add(i * stride))),
        );
        for c in 0..C {
            let sums = block_sums::<W, I>(q, activation_quants::<W>(ab.add(c * row_bytes)));
            let scale = _mm256_set1_ps(scales[c]);
            acc[c] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums), acc[c]);
        }
    }
    let mut minimum = [0.0f32; 8];
    _mm_storeu_ps(minimum.as_mut_ptr(), minimums[0]);
    _mm_storeu_ps(minimum.as_mut_ptr().add(4), minimums[1]);
    for c in 0..C {
        let sum = hsum8(acc[c]);
        *out.add(c) = if W::HAS_MIN { sum + minimum[c] } else { sum };
    }
}

/// How far ahead of the block being summed [`tile_block_major`] prefetches the weight (a few
/// rows: the rows follow one another in memory, and a weight that does not fit the cache
/// otherwise arrives a line at a time).
const TILE_PREFETCH_BYTES: usize = 4096;

/// Blocks whose `d_w * d_a` products one pass of [`tile_block_major`] stores before using.
const SCALE_BLOCKS: usize = 16;

/// One weight row against `C` (at most eight) activation rows read from the block-major
/// quant table `q` (block `i` of row `c` at `(i * stride + c) * 32`; Q8_0's stored plus 128)
/// with scales `d` and Q8_1 sums `s` laid out alike; row `c`'s result to
/// `out[c * out_stride]`.
///
/// Per block the products `d_w * d_a` of all rows are formed in one multiply and stored,
/// and the accumulation reads each back as a broadcast load: a register broadcast would
/// cost a shuffle per (block, row), and on AVX2 the per-row work (two integer multiplies,
/// a conversion, an FMA) already saturates the vector ports. The arithmetic per (row,
/// token) pair is that of the single-row kernel.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_block_major<W: Legacy, I: Isa, const C: usize>(
    blocks: usize,
    w: *const u8,
    q: *const u8,
    d: *const f32,
    s: *const f32,
    stride: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let mut acc = [_mm256_setzero_ps(); C];
    // Lane c: the running `m * s` of row c (formats with a minimum).
    let mut minimums = _mm256_setzero_ps();
    let mut scales = [0.0f32; 8 * SCALE_BLOCKS];
    let offset = _mm256_set1_epi8(if W::SIGNED { 0x80u8 as i8 } else { 0 });
    let mut start = 0;
    while start < blocks {
        let end = (start + SCALE_BLOCKS).min(blocks);
        for i in start..end {
            let wb = w.add(i * W::BYTES);
            let d_w = if W::HAS_MIN {
                let dm = scale_and_minimum(wb);
                let m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
                minimums = _mm256_fmadd_ps(m, _mm256_loadu_ps(s.add(i * stride)), minimums);
                _mm256_broadcastss_ps(dm)
            } else {
                W::scale(wb)
            };
            _mm256_storeu_ps(
                scales.as_mut_ptr().add(8 * (i - start)),
                _mm256_mul_ps(d_w, _mm256_loadu_ps(d.add(i * stride))),
            );
        }
        for i in start..end {
            _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(i * W::BYTES + TILE_PREFETCH_BYTES).cast());
            let quants = W::quants(w.add(i * W::BYTES));
            let row_scales = scales.as_ptr().add(8 * (i - start));
            for c in 0..C {
                let stored = _mm256_loadu_si256(q.add((i * stride + c) * 32).cast());
                // Q8_0's quants come back from their unsigned form (a no-op for Q8_1's).
                let y = _mm256_xor_si256(stored, offset);
                let sums = block_sums::<W, I>(quants, y);
                let scale = _mm256_broadcast_ss(&*row_scales.add(c));
                acc[c] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums), acc[c]);
            }
        }
        start = end;
    }
    let mut minimum = [0.0f32; 8];
    _mm256_storeu_ps(minimum.as_mut_ptr(), minimums);
    for c in 0..C {
        let sum = hsum8(acc[c]);
        *out.add(c * out_stride) = if W::HAS_MIN { sum + minimum[c] } else { sum };
    }
}

/// `$function::<W, C>(args)` for the row count `$count` known at run time: 1 to 8 (callers
/// never pass more).
macro_rules! with_count {
    ($count:expr, $function:ident ($($arg:expr),* $(,)?)) => {
        match $count {
            8 => $function::<W, 8>($($arg),*),
            7 => $function::<W, 7>($($arg),*),
            6 => $function::<W, 6>($($arg),*),
            5 => $function::<W, 5>($($arg),*),
            4 => $function::<W, 4>($($arg),*),
            3 => $function::<W, 3>($($arg),*),
            2 => $function::<W, 2>($($arg),*),
            _ => $function::<W, 1>($($arg),*),
        }
    };
}

/// Stamps out the `#[target_feature]` entry points of one instruction set.
macro_rules! entry_points {
    ($module:ident, $isa:ty, $features:literal, $tile:literal) => {
        mod $module {
            use super::*;

            /// Activation rows per tile call (bounded by the registers of the level).
            const TILE: usize = $tile;

            #[target_feature(enable = $features)]
            unsafe fn gemv_group<W: Legacy, const R: usize>(
                blocks: usize,
                w: *const u8,
                row_bytes: usize,
                a: *const u8,
                out: *mut f32,
            ) {
                gemv_rows::<W, $isa, R>(blocks, w, row_bytes, a, out);
            }

            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn tile_group<W: Legacy, const C: usize>(
                blocks: usize,
                w: *const u8,
                a: *const u8,
                row_bytes: usize,
                d: *const f32,
                s: *const f32,
                stride: usize,
                out: *mut f32,
            ) {
                tile_rows::<W, $isa, C>(blocks, w, a, row_bytes, d, s, stride, out);
            }

            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn block_major_group<W: Legacy, const C: usize>(
                blocks: usize,
                w: *const u8,
                q: *const u8,
                d: *const f32,
                s: *const f32,
                stride: usize,
                out: *mut f32,
                out_stride: usize,
            ) {
                tile_block_major::<W, $isa, C>(blocks, w, q, d, s, stride, out, out_stride);
            }

            /// [`TileRowsFn`]: every weight row of `w` against `out`'s tokens, eight at a
            /// time, from the block-major tables ([`QuantLayout::Rows`]), into `out` in
            /// place; `false` without them. (AVX-512 VNNI
            /// hands out its pair kernel instead.)
            #[allow(dead_code)]
            pub(super) fn block_major<W: Legacy>(
                n: usize,
                w: &[u8],
                a: &[u8],
                scales: BlockScales<'_>,
                mut out: TileOut<'_>,
            ) -> bool {
                let rows_table = scales.layout == QuantLayout::Rows && !scales.quants.is_empty();
                let tokens = out.tokens();
                if !rows_table || tokens == 0 || w.is_empty() {
                    return rows_table;
                }
                let row_bytes = n / 32 * W::BYTES;
                let rows = w.len() / row_bytes.max(1);
                assert_eq!(rows * row_bytes, w.len(), "whole weight rows");
                assert_eq!(rows, out.rows(), "one output per weight row");
                let activation_bytes = a.len() / tokens;
                assert_eq!(
                    activation_bytes * tokens,
                    a.len(),
                    "activation rows of equal length"
                );
                let blocks = checked_blocks(W::TYPE, n, &w[..row_bytes], &a[..activation_bytes]);
                scales.check(blocks, tokens, W::HAS_MIN);
                let s = if W::HAS_MIN { scales.s } else { scales.d };
                let (out_stride, out) = (out.stride(), out.start());
                for r in 0..rows {
                    let w = w[r * row_bytes..].as_ptr();
                    let mut start = 0;
                    while start < tokens {
                        let count = (tokens - start).min(8);
                        let q = scales.quants[32 * start..].as_ptr();
                        let d = scales.d[start..].as_ptr();
                        let s = s[start..].as_ptr();
                        let out = out.wrapping_add(start * out_stride + r);
                        let stride = scales.stride;
                        // SAFETY: `tile_rows_fn` hands this kernel out only at a level that
                        // `SimdLevel::is_available` confirmed (covering `$features`); every
                        // weight row holds `blocks` blocks; `scales.check` verified that the
                        // tables hold the `tokens` rows of every block (plus the padding the
                        // eight-wide scale loads read); `out` may be written at `c *
                        // out_stride + r` for every token and row (`TileOut`'s promise), of
                        // which this group writes `(start + c) * out_stride + r`, `c < count`.
                        unsafe {
                            with_count!(
                                count,
                                block_major_group(blocks, w, q, d, s, stride, out, out_stride)
                            )
                        }
                        start += count;
                    }
                }
                true
            }

            pub(super) fn gemv<W: Legacy>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
                if out.is_empty() {
                    return;
                }
                let row_bytes = w.len() / out.len();
                assert_eq!(
                    row_bytes * out.len(),
                    w.len(),
                    "weight rows of equal length"
                );
                let blocks = checked_blocks(W::TYPE, n, &w[..row_bytes], a);
                let mut start = 0;
                while start < out.len() {
                    let count = (out.len() - start).min(4);
                    let w_at = w[start * row_bytes..].as_ptr();
                    let out_at = out[start..].as_mut_ptr();
                    // SAFETY: `gemv_fn` hands this kernel out only at a level that
                    // `SimdLevel::is_available` confirmed (covering `$features`); `count`
                    // weight rows of `row_bytes` bytes (each holding `blocks` blocks) start
                    // at `w_at`, `a` holds `blocks` blocks, `out_at` has `count` slots.
                    unsafe {
                        match count {
                            4 => gemv_group::<W, 4>(blocks, w_at, row_bytes, a.as_ptr(), out_at),
                            3 => gemv_group::<W, 3>(blocks, w_at, row_bytes, a.as_ptr(), out_at),
                            2 => gemv_group::<W, 2>(blocks, w_at, row_bytes, a.as_ptr(), out_at),
                            _ => gemv_group::<W, 1>(blocks, w_at, row_bytes, a.as_ptr(), out_at),
                        }
                    }
                    start += count;
                }
            }

            pub(super) fn tile<W: Legacy>(
                n: usize,
                w: &[u8],
                a: &[u8],
                scales: BlockScales<'_>,
                out: &mut [f32],
            ) {
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
                scales.check(blocks, out.len(), W::HAS_MIN);
                let mut start = 0;
                while start < out.len() {
                    let count = (out.len() - start).min(TILE);
                    let a_at = a[start * row_bytes..].as_ptr();
                    let d_at = scales.d[start..].as_ptr();
                    let s_at = if W::HAS_MIN {
                        scales.s[start..].as_ptr()
                    } else {
                        d_at
                    };
                    let out_at = out[start..].as_mut_ptr();
                    let w = w.as_ptr();
                    let stride = scales.stride;
                    // SAFETY: `tile_fn` hands this kernel out (or the pair kernel falls back
                    // to it) only at a level that `SimdLevel::is_available` confirmed
                    // (covering `$features`); `count` activation rows of `row_bytes` bytes
                    // start at `a_at`; `scales.check` verified that the tables hold every
                    // index the kernel reads (eight values past each block's first row of
                    // the group); `out_at` has room.
                    unsafe {
                        with_count!(
                            count,
                            tile_group(blocks, w, a_at, row_bytes, d_at, s_at, stride, out_at)
                        )
                    }
                    start += count;
                }
            }
        }
    };
}

entry_points!(avx2, Avx2, "avx2,fma,f16c", 4);
entry_points!(avx_vnni, AvxVnni, "avx2,fma,f16c,avxvnni", 4);
entry_points!(
    avx512_vnni,
    Avx512Vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    8
);

/// Stamps the per-type table of one instruction set.
macro_rules! table {
    ($weight:expr, $module:ident, $entry:ident, $kind:ty) => {{
        use super::legacy::{Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
        match $weight {
            GgmlType::Q4_0 => Some($module::$entry::<Q4_0> as $kind),
            GgmlType::Q4_1 => Some($module::$entry::<Q4_1> as $kind),
            GgmlType::Q5_0 => Some($module::$entry::<Q5_0> as $kind),
            GgmlType::Q5_1 => Some($module::$entry::<Q5_1> as $kind),
            GgmlType::Q8_0 => Some($module::$entry::<Q8_0> as $kind),
            _ => None,
        }
    }};
}

/// The gemv kernel of `weight` written for exactly `level`, if there is one.
pub(super) fn gemv(weight: GgmlType, level: SimdLevel) -> Option<GemvFn> {
    if weight == GgmlType::F16 && matches!(level, SimdLevel::Avx512 | SimdLevel::Avx512Vnni) {
        return Some(super::float::gemv_f16_avx512);
    }
    if weight == GgmlType::F16 && matches!(level, SimdLevel::Avx2 | SimdLevel::AvxVnni) {
        return Some(match level.half_sums() {
            HalfSums::Lanes8 => super::float::gemv_f16_lanes8_avx2,
            HalfSums::Reference => super::float::gemv_f16_avx2,
        });
    }
    match level {
        SimdLevel::Avx2 => table!(weight, avx2, gemv, GemvFn),
        SimdLevel::AvxVnni => table!(weight, avx_vnni, gemv, GemvFn),
        SimdLevel::Avx512Vnni => table!(weight, avx512_vnni, gemv, GemvFn),
        _ => None,
    }
}

/// The tile kernel of `weight` written for exactly `level`, if there is one.
pub(super) fn tile(weight: GgmlType, level: SimdLevel) -> Option<TileFn> {
    match level {
        SimdLevel::Avx2 => table!(weight, avx2, tile, TileFn),
        SimdLevel::AvxVnni => table!(weight, avx_vnni, tile, TileFn),
        SimdLevel::Avx512Vnni => table!(weight, self, pairs_tile, TileFn),
        _ => None,
    }
}

/// The several-weight-rows tile kernel of `weight` for exactly `level`.
pub(super) fn tile_rows_kernel(weight: GgmlType, level: SimdLevel) -> Option<TileRowsFn> {
    match level {
        SimdLevel::Avx2 => table!(weight, avx2, block_major, TileRowsFn),
        SimdLevel::AvxVnni => table!(weight, avx_vnni, block_major, TileRowsFn),
        SimdLevel::Avx512Vnni => table!(weight, self, pairs_tile_rows, TileRowsFn),
        _ => None,
    }
}

/// [`super::pairs::tile_rows`] as a [`TileRowsFn`].
fn pairs_tile_rows<W: Legacy>(
    n: usize,
    w: &[u8],
    a: &[u8],
    scales: BlockScales<'_>,
    out: TileOut<'_>,
) -> bool {
    super::pairs::tile_rows::<W>(n, w, a, scales, out)
}

/// The AVX-512 tile kernel: two activation rows per register where the block-major quants
/// are at hand (`pairs.rs`), the 256-bit kernel otherwise.
fn pairs_tile<W: Legacy>(n: usize, w: &[u8], a: &[u8], scales: BlockScales<'_>, out: &mut [f32]) {
    super::pairs::tile::<W>(n, w, a, scales, out, avx512_vnni::tile::<W>)
}
