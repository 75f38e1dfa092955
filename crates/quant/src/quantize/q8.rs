//! Reference quantizers of the 8-bit formats: Q8_0 (weights and activations), Q8_1 and Q8_K
//! (activations paired with Q4_1/Q5_1 and the K-quants). ggml's `quantize_row_q8_*_ref`.

use half::f16;

use crate::blocks::{BlockQ8K, BlockQ8_0, BlockQ8_1};
use crate::quantize::search::nearest_int;

/// Absolute maximum of a block (ggml's `MAX(amax, fabsf(v))` fold).
fn absolute_max(x: &[f32]) -> f32 {
    x.iter().fold(
        0.0f32,
        |amax, &v| if amax > v.abs() { amax } else { v.abs() },
    )
}

/// Q8_0: `d = amax / 127`, `q = round(x / d)` (half away from zero). Byte-identical to ggml.
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    debug_assert_eq!(x.len(), y.len() * 32);
    for (x, block) in x.chunks_exact(32).zip(y.iter_mut()) {
        let d = absolute_max(x) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        block.d = f16::from_f32(d);
        for (q, &value) in block.qs.iter_mut().zip(x) {
            *q = (value * id).round() as i8;
        }
    }
}

/// Q8_1: Q8_0 plus `s = d * sum(q)` (stored as f16).
pub fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    debug_assert_eq!(x.len(), y.len() * 32);
    for (x, block) in x.chunks_exact(32).zip(y.iter_mut()) {
        let d = absolute_max(x) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        block.d = f16::from_f32(d);
        let mut sum = 0i32;
        for (q, &value) in block.qs.iter_mut().zip(x) {
            *q = (value * id).round() as i8;
            sum += i32::from(*q);
        }
        block.s = f16::from_f32(sum as f32 * d);
    }
}

/// Q8_K: `d = max / -127` as f32 (max = the signed element of largest magnitude),
/// `q = nearest(x / d)` capped at 127, plus the sum of each 16 quants in `bsums`.
pub fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    debug_assert_eq!(x.len(), y.len() * 256);
    for (x, block) in x.chunks_exact(256).zip(y.iter_mut()) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &value in x {
            if value.abs() > amax {
                amax = value.abs();
                max = value;
            }
        }
        if amax == 0.0 {
            block.d = 0.0;
            block.qs = [0; 256];
            block.bsums = [0; 16];
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &value) in block.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * value).min(127) as i8;
        }
        for (sum, group) in block.bsums.iter_mut().zip(block.qs.chunks_exact(16)) {
            *sum = group.iter().map(|&q| i16::from(q)).sum();
        }
        block.d = 1.0 / iscale;
    }
}

/// Rounds to the nearest integer, ties to even, for `|value| < 2^22`: what x86's
/// `_mm256_round_ps(v, _MM_ROUND_NEAREST)` does, written so the compiler can vectorize it.
fn round_ties_even(value: f32) -> f32 {
    (value + 12_582_912.0) - 12_582_912.0
}

/// One block of activations as ggml-cpu's x86 `quantize_row_q8_0` rounds it: returns the
/// f32 scale `amax / 127` and fills `q` with `round_ties_even(x * (127 / amax))`.
///
/// This differs from the reference quantizer above (which multiplies by `1 / d` and rounds
/// half away from zero) in rare last-bit cases, and activations must match ggml-cpu.
fn quantize_activation_block(x: &[f32], q: &mut [i8; 32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::may_use(crate::cpu::Feature::Avx2) {
        let x: &[f32; 32] = x.try_into().expect("blocks of 32 values");
        // SAFETY: `may_use` confirmed AVX2 just above.
        return unsafe { x86::quantize_activation_block(x, q) };
    }
    quantize_activation_block_scalar(x, q)
}

/// The portable twin of [`quantize_activation_block`], equal to it for every input, NaNs,
/// infinities and blocks whose `127 / amax` overflows included.
fn quantize_activation_block_scalar(x: &[f32], q: &mut [i8; 32]) -> f32 {
    let amax = absolute_max_x86(x);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    for (q, &value) in q.iter_mut().zip(x) {
        *q = to_i8_x86(round_ties_even(value * id));
    }
    d
}

/// `maxps` on one lane: the first operand when it is the larger, else the second (so a NaN
/// in either gives the second).
fn max_x86(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// The x86 kernel's `amax` of a block of 32, in its reduction tree (the same value as a
/// plain maximum unless a value is NaN): eight lanes over the four rows of eight, then the
/// upper lanes onto the lower ones by halves.
fn absolute_max_x86(x: &[f32]) -> f32 {
    let abs = |v: f32| f32::from_bits(v.to_bits() & 0x7fff_ffff);
    let mut lanes: [f32; 8] = std::array::from_fn(|k| abs(x[k]));
    for row in x.chunks_exact(8).skip(1) {
        for (lane, &v) in lanes.iter_mut().zip(row) {
            *lane = max_x86(*lane, abs(v));
        }
    }
    let quad: [f32; 4] = std::array::from_fn(|k| max_x86(lanes[4 + k], lanes[k]));
    let pair = [max_x86(quad[0], quad[2]), max_x86(quad[1], quad[3])];
    max_x86(pair[0], pair[1])
}

/// A rounded value to i8 as `vcvtps2dq` and the saturating packs take it: NaN and values
/// outside i32 become `i32::MIN`, then everything is clamped to the i8 range.
fn to_i8_x86(rounded: f32) -> i8 {
    let int = if rounded.is_nan() || !(-2_147_483_648.0..2_147_483_648.0).contains(&rounded) {
        i32::MIN
    } else {
        rounded as i32
    };
    int.clamp(i32::from(i8::MIN), i32::from(i8::MAX)) as i8
}

/// Q8_0 activations, bit for bit as ggml-cpu quantizes the activation side of a matmul on
/// x86 (AVX2 `quantize_row_q8_0`): `d = amax / 127` stored as f16, `q = round_ties_even(x *
/// 127 / amax)`.
pub fn quantize_row_q8_0_activation(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(
        x.len(),
        y.len() * 32,
        "Q8_0 activation: 32 values per block"
    );
    for (x, block) in x.chunks_exact(32).zip(y.iter_mut()) {
        let d = quantize_activation_block(x, &mut block.qs);
        block.d = f16::from_f32(d);
    }
}

/// Q8_1 activations as ggml-cpu's x86 `quantize_row_q8_1`: the Q8_0 activation rounding plus
/// `s = f16(d * sum(q))` with the unrounded f32 `d`.
pub fn quantize_row_q8_1_activation(x: &[f32], y: &mut [BlockQ8_1]) {
    assert_eq!(
        x.len(),
        y.len() * 32,
        "Q8_1 activation: 32 values per block"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::may_use_all(&[crate::cpu::Feature::Avx2, crate::cpu::Feature::F16c]) {
        for (x, block) in x.chunks_exact(32).zip(y.iter_mut()) {
            let x: &[f32; 32] = x.try_into().expect("blocks of 32 values");
            // SAFETY: `may_use_all` confirmed AVX2 and F16C just above.
            unsafe { x86::quantize_block_q8_1(x, block) };
        }
        return;
    }
    for (x, block) in x.chunks_exact(32).zip(y.iter_mut()) {
        quantize_block_q8_1_scalar(x, block);
    }
}

/// The portable twin of one block of [`quantize_row_q8_1_activation`].
fn quantize_block_q8_1_scalar(x: &[f32], block: &mut BlockQ8_1) {
    let d = quantize_activation_block_scalar(x, &mut block.qs);
    let sum: i32 = block.qs.iter().map(|&q| i32::from(q)).sum();
    block.d = f16::from_f32(d);
    block.s = f16::from_f32(d * sum as f32);
}

/// AVX2 activation quantization: the same operations as the scalar twin, eight lanes at a
/// time (`max` of absolute values is exact in any order; `vroundps` to nearest is the
/// scalar's ties-to-even rounding).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// [`super::quantize_block_q8_1_scalar`]: the block's quants, then `d` and `d * sum(q)`
    /// rounded to f16 together (`vcvtps2ph`, ties to even like `f16::from_f32`).
    ///
    /// # Safety
    /// The CPU must support AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn quantize_block_q8_1(x: &[f32; 32], block: &mut super::BlockQ8_1) {
        let d = quantize_activation_block(x, &mut block.qs);
        let q = _mm256_loadu_si256(block.qs.as_ptr().cast());
        let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
        let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
        let half = _mm_add_epi32(
            _mm256_castsi256_si128(quads),
            _mm256_extracti128_si256::<1>(quads),
        );
        let two = _mm_add_epi32(half, _mm_unpackhi_epi64(half, half));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(two, _mm_shuffle_epi32::<1>(two)));
        let halves =
            _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_setr_ps(d, d * sum as f32, 0.0, 0.0));
        let bits = _mm_cvtsi128_si32(halves) as u32;
        block.d = half::f16::from_bits(bits as u16);
        block.s = half::f16::from_bits((bits >> 16) as u16);
    }

    /// See [`super::quantize_activation_block`].
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_activation_block(x: &[f32; 32], q: &mut [i8; 32]) -> f32 {
        let sign = _mm256_set1_ps(-0.0);
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
        let mut max = _mm256_andnot_ps(sign, v[0]);
        for lane in &v[1..] {
            max = _mm256_max_ps(max, _mm256_andnot_ps(sign, *lane));
        }
        let quad = _mm_max_ps(_mm256_extractf128_ps::<1>(max), _mm256_castps256_ps128(max));
        let pair = _mm_max_ps(quad, _mm_movehl_ps(quad, quad));
        let amax = _mm_cvtss_f32(_mm_max_ss(pair, _mm_movehdup_ps(pair)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let ints: [__m256i; 4] = std::array::from_fn(|i| {
            let scaled = _mm256_mul_ps(v[i], id);
            _mm256_cvtps_epi32(_mm256_round_ps::<
                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
            >(scaled))
        });
        // Packing interleaves the 128-bit lanes; the permute puts the bytes back in order.
        let words_low = _mm256_packs_epi32(ints[0], ints[1]);
        let words_high = _mm256_packs_epi32(ints[2], ints[3]);
        let bytes = _mm256_packs_epi16(words_low, words_high);
        let ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(q.as_mut_ptr().cast(), ordered);
        d
    }
}

#[cfg(test)]
mod activation_tests {
    use super::*;
    use bytemuck::Zeroable;

    #[test]
    fn activation_rounding_is_ties_to_even_with_127_over_amax() {
        // amax 127 makes id exactly 1, so x * id is x itself and ties are visible.
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = 3.5;
        x[4] = -0.5;
        let mut y = [BlockQ8_0::zeroed()];
        quantize_row_q8_0_activation(&x, &mut y);
        assert_eq!(&y[0].qs[..5], &[127, 2, -2, 4, 0]);
        assert_eq!(y[0].d.to_f32(), 1.0);
        // The reference quantizer rounds the same ties away from zero.
        let mut reference = [BlockQ8_0::zeroed()];
        quantize_row_q8_0(&x, &mut reference);
        assert_eq!(&reference[0].qs[..5], &[127, 3, -3, 4, -1]);
    }

    #[test]
    fn simd_activation_blocks_equal_the_scalar_twin() {
        let mut state = 0x9e37_79b9u32;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        };
        for case in 0..2000 {
            let scale = [1e-3f32, 0.5, 3.0, 1e4][case % 4];
            let mut x: Vec<f32> = (0..32)
                .map(|_| (next() as f32 / u32::MAX as f32 - 0.5) * scale)
                .collect();
            if case % 7 == 0 {
                // Exact ties after scaling by 127 / amax = 1.
                x[0] = 127.0;
                x[1] = 2.5;
                x[2] = -0.5;
            }
            if case % 11 == 0 {
                x.fill(0.0);
            }
            // Blocks whose 127 / amax overflows, infinities and NaNs: the x86 conversion's
            // out-of-range value and the maximum's NaN order.
            match case % 13 {
                1 => x.iter_mut().for_each(|v| *v *= 1e-39),
                2 => x[5] = f32::INFINITY,
                3 => x[9] = f32::NEG_INFINITY,
                4 => x[case % 32] = f32::NAN,
                5 => {
                    x[3] = f32::NAN;
                    x[20] = f32::INFINITY;
                }
                _ => {}
            }
            let (mut simd_block, mut scalar_block) = (BlockQ8_1::zeroed(), BlockQ8_1::zeroed());
            quantize_row_q8_1_activation(&x, std::slice::from_mut(&mut simd_block));
            quantize_block_q8_1_scalar(&x, &mut scalar_block);
            assert_eq!(
                bytemuck::bytes_of(&simd_block),
                bytemuck::bytes_of(&scalar_block),
                "Q8_1 case {case}"
            );
            let (mut simd, mut scalar) = ([0i8; 32], [0i8; 32]);
            let d = quantize_activation_block(&x, &mut simd);
            let d_scalar = quantize_activation_block_scalar(&x, &mut scalar);
            assert_eq!(d.to_bits(), d_scalar.to_bits(), "case {case}");
            assert_eq!(simd, scalar, "case {case}");
        }
    }

    #[test]
    fn q8_1_activation_sum_uses_unrounded_scale() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 10.3) * 0.37).collect();
        let mut y = [BlockQ8_1::zeroed()];
        quantize_row_q8_1_activation(&x, &mut y);
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let sum: i32 = y[0].qs.iter().map(|&q| i32::from(q)).sum();
        assert_eq!(y[0].s, f16::from_f32(d * sum as f32));
        assert_eq!(y[0].d, f16::from_f32(d));
        for (q, v) in y[0].qs.iter().zip(&x) {
            assert!((f32::from(*q) - v * 127.0 / amax).abs() <= 0.5);
        }
    }
}
