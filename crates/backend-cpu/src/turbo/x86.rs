//! AVX-512 twins of the chunk kernels in `super::chunk` (bit-identical results; that
//! module states the order of the operations).
//!
//! A block's sixteen codes `16 j ..` come out of the packed bytes with one 64-bit load and
//! a byte multishift (AVX-512 VBMI) that puts code `16 j + l` in the low bits of lane `l`;
//! a lane permute of the codebook (`super::Table`, repeated to sixteen entries so the bits
//! above the code do not matter), scaled by the block's norm, turns them into values. The
//! sketch's signs are a 16-bit mask per sixteen coordinates choosing `-alpha` or `alpha`.
//! The scores of sixteen keys are reduced together (a transpose by shuffles, the same
//! additions as `super::reduce`), the softmax's `exp` runs sixteen lanes at once.
//!
//! Every function is `unsafe` because it requires those CPU features: callers hold a
//! `wide` flag, which only [`available`] sets.

use std::arch::x86_64::*;

use runit_backend::turbo::{self, BLOCK};

use super::chunk::{Queries, Side, MAX_HEADS};
use super::{EXP_MIN, EXP_POLYNOMIAL, LANES, LN2_HIGH, LN2_LOW};

/// Whether this CPU runs these kernels (AVX-512 F, BW and VBMI, F16C, FMA) and
/// [`runit_quant::cpu`] allows them.
pub fn available() -> bool {
    use runit_quant::cpu::{may_use_all, Feature};
    may_use_all(&[
        Feature::Avx512F,
        Feature::Avx512Bw,
        Feature::Avx512Vbmi,
        Feature::F16c,
        Feature::Fma,
    ])
}

/// Byte offset, within a block's codes, of the 64-bit word holding codes `16 j ..` of
/// `bits`-bit codes (the last word of the codes where they would run past it), and the
/// bit at which code `16 j` starts in it.
fn word_of(bits: usize, j: usize) -> (usize, usize) {
    let start = 2 * bits * j;
    let at = start.min(8 * bits - 8);
    (at, (start - at) * 8)
}

/// The multishift controls of [`word_of`]'s words: the low byte of lane `l` takes the
/// bits from `shift + l * bits` on.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,f16c,fma")]
fn controls(bits: usize) -> [__m512i; 4] {
    std::array::from_fn(|j| {
        let (_, shift) = word_of(bits, j);
        let words: [u64; 8] = std::array::from_fn(|m| {
            let low = (shift + 2 * m * bits) as u64;
            low | (low + bits as u64) << 32
        });
        // SAFETY: `words` is 64 readable bytes; the load is unaligned.
        unsafe { _mm512_loadu_si512(words.as_ptr().cast()) }
    })
}

/// Codes `16 j .. 16 j + 16` of the codes at `codes`, one in the low bits of each lane.
///
/// # Safety
/// `codes` must point at `8 * bits` readable bytes.
#[inline(always)]
unsafe fn indices(codes: *const u8, bits: usize, j: usize, control: __m512i) -> __m512i {
    let (at, _) = word_of(bits, j);
    // SAFETY: `at + 8 <= 8 * bits` (`word_of`), inside the codes; unaligned read.
    let word = unsafe { std::ptr::read_unaligned(codes.add(at).cast::<u64>()) };
    _mm512_multishift_epi64_epi8(control, _mm512_set1_epi64(word as i64))
}

/// The f16 at `p`.
///
/// # Safety
/// `p` must point at 2 readable bytes.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: the caller's promise; unaligned read.
    let bits = unsafe { std::ptr::read_unaligned(p.cast::<u16>()) };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// Calls `f(index, value)` for the outliers of block `b` of `side`'s KV head in cache row
/// `cell` (whose bytes are `block`), in `Side::outliers`' order and with its values (the
/// f16 widened by F16C, exactly as `half` widens it), without its iterator.
#[inline(always)]
fn each_outlier(
    side: &Side<'_>,
    cell: usize,
    b: usize,
    block: &[u8],
    mut f: impl FnMut(usize, f32),
) {
    let layout = side.layout;
    if layout.outliers == 0 {
        return;
    }
    let indices = side.index_bytes(cell);
    let header = layout.header_bytes();
    assert!(block.len() >= header + 2 * layout.outliers);
    for k in 0..layout.outliers {
        // `turbo::read_index`: INDEX_BITS bits from bit `slot * INDEX_BITS`, little-endian.
        let bit = ((side.first_block + b) * layout.outliers + k) * turbo::INDEX_BITS;
        let next = indices.get(bit / 8 + 1).copied().unwrap_or(0);
        let word = u16::from_le_bytes([indices[bit / 8], next]);
        let index = usize::from(word >> (bit % 8)) & (BLOCK - 1);
        // SAFETY: `header + 2 k + 2 <= block.len()` (asserted above).
        let value = unsafe { f16_at(block.as_ptr().add(header + 2 * k)) };
        f(index, value);
    }
}

/// Sixteen vectors reduced at once: lane `k` of the result is `super::reduce` of
/// `vectors[k]` (the same additions: halves of 256, 128, 64 and 32 bits in turn).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,f16c,fma")]
fn reduce_sixteen(vectors: &[[f32; LANES]; LANES]) -> __m512 {
    // SAFETY: each row is 16 f32, read unaligned.
    let v = |k: usize| unsafe { _mm512_loadu_ps(vectors[k].as_ptr()) };
    // Keys 2p (lanes 0..8) and 2p + 1 (lanes 8..16): `l[i] + l[i + 8]`.
    let w: [__m512; 8] = std::array::from_fn(|p| {
        let (a, b) = (v(2 * p), v(2 * p + 1));
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(a, b),
            _mm512_shuffle_f32x4::<0xee>(a, b),
        )
    });
    // Keys 4q + m in 128-bit lane m: `+ [i + 4]`.
    let x: [__m512; 4] = std::array::from_fn(|q| {
        let (a, b) = (w[2 * q], w[2 * q + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(a, b),
            _mm512_shuffle_f32x4::<0xdd>(a, b),
        )
    });
    // Lane m holds keys 8s + m (elements 0, 1) and 8s + 4 + m (2, 3): `+ [i + 2]`.
    let z: [__m512; 2] = std::array::from_fn(|s| {
        let (a, b) = (x[2 * s], x[2 * s + 1]);
        _mm512_add_ps(
            _mm512_shuffle_ps::<0x44>(a, b),
            _mm512_shuffle_ps::<0xee>(a, b),
        )
    });
    // Element t of lane m: key m + 4t.
    let sums = _mm512_add_ps(
        _mm512_shuffle_ps::<0x88>(z[0], z[1]),
        _mm512_shuffle_ps::<0xdd>(z[0], z[1]),
    );
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(order, sums)
}

/// See `super::chunk::scores`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,f16c,fma")]
pub fn scores(
    queries: &Queries,
    keys: &Side<'_>,
    cells: &[usize],
    scale: f32,
    out: &mut [f32],
    stride: usize,
) {
    match queries.heads {
        1 => scores_of::<1>(queries, keys, cells, scale, out, stride),
        2 => scores_of::<2>(queries, keys, cells, scale, out, stride),
        3 => scores_of::<3>(queries, keys, cells, scale, out, stride),
        4 => scores_of::<4>(queries, keys, cells, scale, out, stride),
        heads => unreachable!("at most {MAX_HEADS} heads a call, not {heads}"),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,f16c,fma")]
fn scores_of<const N: usize>(
    queries: &Queries,
    keys: &Side<'_>,
    cells: &[usize],
    scale: f32,
    out: &mut [f32],
    stride: usize,
) {
    let head_dim = queries.head_dim;
    let layout = keys.layout;
    let (bits, block_bytes) = (layout.code_bits, layout.block_bytes());
    let controls = controls(bits);
    // SAFETY: the table is 16 f32, read unaligned.
    let table = unsafe { _mm512_loadu_ps(keys.table.0.as_ptr()) };
    let sketch_factor = turbo::sketch_factor();
    let mut lanes = [[[0.0f32; LANES]; LANES]; N];
    // The outliers of a tile's keys, decoded once for the N heads: key k's block b's
    // outlier j at `(k * blocks + b) * per_block + j`.
    let (blocks, per_block) = (head_dim / BLOCK, layout.outliers);
    let mut outliers = vec![(0usize, 0.0f32); LANES * blocks * per_block];
    for (t, tile) in cells.chunks(LANES).enumerate() {
        for (k, &cell) in tile.iter().enumerate() {
            let row = keys.row(cell);
            for (b, block) in row.chunks_exact(block_bytes).enumerate() {
                let mut j = (k * blocks + b) * per_block;
                each_outlier(keys, cell, b, block, |index, value| {
                    outliers[j] = (index, value);
                    j += 1;
                });
            }
        }
        for (k, &cell) in tile.iter().enumerate() {
            let row = keys.row(cell);
            let mut acc = [_mm512_setzero_ps(); N];
            for (b, block) in row.chunks_exact(block_bytes).enumerate() {
                let p = block.as_ptr();
                // SAFETY: the block holds its header, codes and signs (`block_bytes`);
                // every query read is inside a `head_dim` row (`b < head_dim / BLOCK`).
                unsafe {
                    let norm = f16_at(p);
                    let values = _mm512_mul_ps(table, _mm512_set1_ps(norm));
                    let codes = p.add(layout.code_offset());
                    for (j, &control) in controls.iter().enumerate() {
                        let c = _mm512_permutexvar_ps(indices(codes, bits, j, control), values);
                        for (g, acc) in acc.iter_mut().enumerate() {
                            let q = queries.rotated.as_ptr().add(g * head_dim + b * BLOCK);
                            *acc = _mm512_fmadd_ps(_mm512_loadu_ps(q.add(j * LANES)), c, *acc);
                        }
                    }
                    if layout.sketch {
                        let alpha = sketch_factor * f16_at(p.add(2)) * norm;
                        let signs =
                            std::ptr::read_unaligned(p.add(layout.sign_offset()).cast::<u64>());
                        let (plus, minus) = (_mm512_set1_ps(alpha), _mm512_set1_ps(-alpha));
                        for j in 0..BLOCK / LANES {
                            let s =
                                _mm512_mask_blend_ps((signs >> (j * LANES)) as u16, plus, minus);
                            for (g, acc) in acc.iter_mut().enumerate() {
                                let q = queries.sketched.as_ptr().add(g * head_dim + b * BLOCK);
                                *acc = _mm512_fmadd_ps(_mm512_loadu_ps(q.add(j * LANES)), s, *acc);
                            }
                        }
                    }
                }
            }
            for (lanes, acc) in lanes.iter_mut().zip(acc) {
                // SAFETY: 16 f32 written unaligned.
                unsafe { _mm512_storeu_ps(lanes[k].as_mut_ptr(), acc) };
            }
        }
        for (g, lanes) in lanes.iter().enumerate() {
            let mut dots = [0.0f32; LANES];
            // SAFETY: 16 f32 written unaligned.
            unsafe { _mm512_storeu_ps(dots.as_mut_ptr(), reduce_sixteen(lanes)) };
            for (k, mut dot) in dots.into_iter().enumerate().take(tile.len()) {
                for b in 0..blocks {
                    let plain = &queries.plain[g * head_dim + b * BLOCK..];
                    let at = (k * blocks + b) * per_block;
                    for &(index, value) in &outliers[at..at + per_block] {
                        dot = plain[index].mul_add(value, dot);
                    }
                }
                out[g * stride + t * LANES + k] = dot * scale;
            }
        }
    }
}

/// `exp` of sixteen lanes (`super::exp`, the same operations).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,f16c,fma")]
fn exp(x: __m512) -> __m512 {
    let keep = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(EXP_MIN));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HIGH), x);
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LOW), r);
    let mut p = _mm512_set1_ps(EXP_POLYNOMIAL[0]);
    for &c in &EXP_POLYNOMIAL[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let y = _mm512_add_ps(
        _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
        _mm512_set1_ps(1.0),
    );
    let exponent = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    let power = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(exponent));
    _mm512_maskz_mul_ps(keep, y, power)
}

/// See `super::chunk::softmax`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,f16c,fma")]
pub fn softmax(scores: &mut [f32]) -> (f32, f32) {
    let low = _mm512_set1_ps(f32::NEG_INFINITY);
    let mask = |tile: &[f32]| (1u32 << tile.len()).wrapping_sub(1) as u16;
    let mut max = low;
    for tile in scores.chunks(LANES) {
        // SAFETY: the masked load reads the tile's lanes only.
        let x = unsafe { _mm512_mask_loadu_ps(low, mask(tile), tile.as_ptr()) };
        max = _mm512_max_ps(max, x);
    }
    let max = _mm512_reduce_max_ps(max);
    let mut sum = _mm512_setzero_ps();
    for tile in scores.chunks_mut(LANES) {
        let m = mask(tile);
        // SAFETY: the masked load and store touch the tile's lanes only.
        unsafe {
            let x = _mm512_mask_loadu_ps(low, m, tile.as_ptr());
            let w = exp(_mm512_sub_ps(x, _mm512_set1_ps(max)));
            sum = _mm512_add_ps(sum, w);
            _mm512_mask_storeu_ps(tile.as_mut_ptr(), m, w);
        }
    }
    let mut lanes = [0.0f32; LANES];
    // SAFETY: 16 f32 written unaligned.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), sum) };
    (max, super::reduce(&lanes))
}

/// See `super::chunk::values`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,f16c,fma")]
pub fn values(
    values: &Side<'_>,
    cells: &[usize],
    heads: usize,
    weights: &[f32],
    stride: usize,
    accumulator: &mut [f32],
    outliers: &mut [f32],
) {
    match heads {
        1 => values_of::<1>(values, cells, weights, stride, accumulator, outliers),
        2 => values_of::<2>(values, cells, weights, stride, accumulator, outliers),
        3 => values_of::<3>(values, cells, weights, stride, accumulator, outliers),
        4 => values_of::<4>(values, cells, weights, stride, accumulator, outliers),
        heads => unreachable!("at most {MAX_HEADS} heads a call, not {heads}"),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,f16c,fma")]
fn values_of<const N: usize>(
    values: &Side<'_>,
    cells: &[usize],
    weights: &[f32],
    stride: usize,
    accumulator: &mut [f32],
    outliers: &mut [f32],
) {
    let head_dim = accumulator.len() / N;
    let layout = values.layout;
    let (bits, block_bytes) = (layout.code_bits, layout.block_bytes());
    let controls = controls(bits);
    // SAFETY: the table is 16 f32, read unaligned.
    let table = unsafe { _mm512_loadu_ps(values.table.0.as_ptr()) };
    // Block by block, the block's accumulators held in registers over all the keys.
    for b in 0..head_dim / BLOCK {
        let at = |g: usize, j: usize| g * head_dim + b * BLOCK + j * LANES;
        let mut acc: [[__m512; BLOCK / LANES]; N] = std::array::from_fn(|g| {
            // SAFETY: `at(g, j) + 16 <= N * head_dim`, read unaligned.
            std::array::from_fn(|j| unsafe { _mm512_loadu_ps(accumulator.as_ptr().add(at(g, j))) })
        });
        for (k, &cell) in cells.iter().enumerate() {
            let block = &values.row(cell)[b * block_bytes..(b + 1) * block_bytes];
            let p = block.as_ptr();
            // SAFETY: the block holds its header and codes (`block_bytes`).
            unsafe {
                let scaled = _mm512_mul_ps(table, _mm512_set1_ps(f16_at(p)));
                let codes = p.add(layout.code_offset());
                let c: [__m512; BLOCK / LANES] = std::array::from_fn(|j| {
                    _mm512_permutexvar_ps(indices(codes, bits, j, controls[j]), scaled)
                });
                for (g, acc) in acc.iter_mut().enumerate() {
                    let weight = _mm512_set1_ps(weights[g * stride + k]);
                    for (acc, &c) in acc.iter_mut().zip(&c) {
                        *acc = _mm512_fmadd_ps(c, weight, *acc);
                    }
                }
            }
            each_outlier(values, cell, b, block, |index, value| {
                for g in 0..N {
                    let o = &mut outliers[g * head_dim + b * BLOCK + index];
                    *o = value.mul_add(weights[g * stride + k], *o);
                }
            });
        }
        for (g, acc) in acc.iter().enumerate() {
            for (j, &acc) in acc.iter().enumerate() {
                // SAFETY: `at(g, j) + 16 <= N * head_dim`, written unaligned.
                unsafe { _mm512_storeu_ps(accumulator.as_mut_ptr().add(at(g, j)), acc) };
            }
        }
    }
}
