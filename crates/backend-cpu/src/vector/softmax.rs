//! The exponentials of a softmax row as ggml's `ggml_vec_soft_max_f32` computes them on the
//! reference machine (AVX-512): `y[i] = v_expf(x[i] - max)` with ggml's polynomial
//! `ggml_v_expf` (see [`super::silu`]) for whole groups of 16 values, each group summed in f32
//! in `_mm512_reduce_add_ps` order and added to an f64 total; leftover values use libm's
//! `expf` and are added to the total one by one. Returns the total.
//!
//! ggml's tiled flash attention normalises every key tile this way, so RunIT's tiled
//! attention does too (a libm `exp` and a per-element f64 sum differ in the last bits, which
//! quantized models amplify).

use super::silu::vector_exp;
use super::Isa;

/// Values per AVX-512 register.
const GROUP: usize = 16;

/// `_mm512_reduce_add_ps` as gcc expands it: halves, then quarters, then `(0+2) + (1+3)`.
fn reduce_add_16(x: &[f32; GROUP]) -> f32 {
    let halves: [f32; 8] = std::array::from_fn(|i| x[i] + x[i + 8]);
    let quarters: [f32; 4] = std::array::from_fn(|i| halves[i] + halves[i + 4]);
    (quarters[0] + quarters[2]) + (quarters[1] + quarters[3])
}

/// ggml's online-softmax step for one key's `score` against a head's running maximum: a score
/// above it becomes the maximum, with `(rescale, weight) = (exp(old max - score), 1)` (what was
/// accumulated shrinks by `rescale`); any other gives `(1, exp(score - max))`. The running sum
/// then becomes `sum.mul_add(rescale, weight)` (ggml's `S = S*ms + vs`, fused by gcc).
#[inline(always)]
pub fn online_step(score: f32, max: &mut f32) -> (f32, f32) {
    if score > *max {
        let rescale = (*max - score).exp();
        *max = score;
        (rescale, 1.0)
    } else {
        (1.0, (score - *max).exp())
    }
}

/// `values[i] = exp(values[i] - max)`; returns the sum of the new values (see the module docs).
pub fn soft_max_f32(isa: Isa, values: &mut [f32], max: f32) -> f64 {
    let mut total = 0.0f64;
    let body = values.len() / GROUP * GROUP;
    for group in values[..body].chunks_exact_mut(GROUP) {
        let group: &mut [f32; GROUP] = group.try_into().expect("chunks of GROUP");
        let sum = match isa {
            // SAFETY: `Isa::Avx2` is made only by `Isa::detect`, after detecting AVX2, FMA
            // and F16C (the kernel needs AVX2 and FMA).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { x86::exp_group(group, max) },
            Isa::Scalar => exp_group(group, max),
        };
        total += f64::from(sum);
    }
    for v in &mut values[body..] {
        *v = (*v - max).exp();
        total += f64::from(*v);
    }
    total
}

/// One group of 16: the exponentials in place, their `_mm512_reduce_add_ps` sum returned.
fn exp_group(group: &mut [f32; GROUP], max: f32) -> f32 {
    for v in group.iter_mut() {
        *v = vector_exp(*v - max);
    }
    reduce_add_16(group)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! Eight AVX2 + FMA lanes of `ggml_v_expf`; a half group with a lane whose power of two
    //! leaves the normal range (other than underflow to zero) is redone by the scalar twin.

    use std::arch::x86_64::*;

    use super::super::silu::{constant, C1, C2, C3, C4, C5, LN2_HIGH, LN2_LOW, LOG2_E, SHIFT};
    use super::GROUP;

    /// `exp(x)` of eight lanes, or `None` when a lane needs the scalar path.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp8(x: __m256) -> Option<__m256> {
        let shift = _mm256_set1_ps(constant(SHIFT));
        let z = _mm256_fmadd_ps(x, _mm256_set1_ps(constant(LOG2_E)), shift);
        let n = _mm256_sub_ps(z, shift);
        let b = _mm256_fnmadd_ps(
            n,
            _mm256_set1_ps(constant(LN2_LOW)),
            _mm256_fnmadd_ps(n, _mm256_set1_ps(constant(LN2_HIGH)), x),
        );
        let u = _mm256_mul_ps(b, b);
        let c = |bits: u32| _mm256_set1_ps(constant(bits));
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(c(C5), b, c(C4)),
                u,
                _mm256_fmadd_ps(c(C3), b, c(C2)),
            ),
            u,
            _mm256_fmadd_ps(c(C1), b, _mm256_set1_ps(1.0)),
        );
        // Lanes below -192 (masked keys: -inf) are exactly zero, as in ggml; lanes between
        // the normal exponent range and that limit are rare and go to the scalar twin.
        let zero = _mm256_cmp_ps::<_CMP_LT_OQ>(n, _mm256_set1_ps(-192.0));
        let normal = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_GE_OQ>(n, _mm256_set1_ps(-126.0)),
            _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_set1_ps(126.0)),
        );
        if _mm256_movemask_ps(_mm256_or_ps(zero, normal)) != 0xff {
            return None;
        }
        let safe_n = _mm256_and_ps(n, normal);
        let power = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(safe_n),
            _mm256_set1_epi32(127),
        )));
        Some(_mm256_and_ps(_mm256_mul_ps(j, power), normal))
    }

    /// AVX2 twin of [`super::exp_group`].
    ///
    /// # Safety
    /// Requires AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_group(group: &mut [f32; GROUP], max: f32) -> f32 {
        let m = _mm256_set1_ps(max);
        // SAFETY: the group holds 16 values; `loadu` accepts any alignment.
        let (low, high) = unsafe {
            (
                _mm256_loadu_ps(group.as_ptr()),
                _mm256_loadu_ps(group.as_ptr().add(8)),
            )
        };
        let (Some(low), Some(high)) = (exp8(_mm256_sub_ps(low, m)), exp8(_mm256_sub_ps(high, m)))
        else {
            return super::exp_group(group, max);
        };
        // SAFETY: the group holds 16 writable values; `storeu` accepts any alignment.
        unsafe {
            _mm256_storeu_ps(group.as_mut_ptr(), low);
            _mm256_storeu_ps(group.as_mut_ptr().add(8), high);
        }
        // reduce_add: x[i] + x[i+8], then [i] + [i+4], then (0+2) + (1+3).
        let halves = _mm256_add_ps(low, high);
        let quarters = _mm_add_ps(
            _mm256_castps256_ps128(halves),
            _mm256_extractf128_ps::<1>(halves),
        );
        let mut q = [0.0f32; 4];
        // SAFETY: `q` holds 4 writable values.
        unsafe { _mm_storeu_ps(q.as_mut_ptr(), quarters) };
        (q[0] + q[2]) + (q[1] + q[3])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_values_vanish_and_the_sum_is_close_to_exact() {
        let mut values: Vec<f32> = (0..67).map(|i| (i as f32 * 0.37).sin() * 5.0).collect();
        values[3] = f32::NEG_INFINITY;
        let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let original = values.clone();
        let total = soft_max_f32(Isa::Scalar, &mut values, max);
        assert_eq!(values[3], 0.0);
        // The difference is taken in f32, as ggml does; the exponential is compared in f64.
        let exact: f64 = original.iter().map(|v| f64::from(*v - max).exp()).sum();
        assert!((total - exact).abs() < 1e-5 * exact, "{total} vs {exact}");
        for (v, o) in values.iter().zip(&original) {
            let e = f64::from(*o - max).exp();
            assert!((f64::from(*v) - e).abs() <= 4.0 * f64::from(f32::EPSILON) * e.max(1e-30));
        }
    }

    #[test]
    fn groups_are_summed_in_register_order() {
        // Values chosen so that the f32 grouping is visible: 1 + 16 tiny values.
        let mut values = [0.0f32; 16];
        values[0] = 0.0;
        for v in values.iter_mut().skip(1) {
            *v = -17.0; // exp(-17) ~ 4e-8, below half an ulp of 1.0 alone but not together
        }
        let mut copy = values;
        let total = soft_max_f32(Isa::Scalar, &mut copy, 0.0);
        let exps: [f32; 16] = std::array::from_fn(|i| copy[i]);
        assert_eq!(total, f64::from(reduce_add_16(&exps)));
    }

    #[test]
    fn twins_agree_bit_for_bit() {
        let mut values: Vec<f32> = (0..16 * 12 + 5)
            .map(|i| (i as f32 * 0.731).sin() * 12.0 - if i % 29 == 0 { 100.0 } else { 0.0 })
            .collect();
        for i in (0..values.len()).step_by(7) {
            values[i] = f32::NEG_INFINITY;
        }
        let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut scalar = values.clone();
        let mut best = values.clone();
        let a = soft_max_f32(Isa::Scalar, &mut scalar, max);
        let b = soft_max_f32(Isa::detect(true), &mut best, max);
        assert_eq!(a.to_bits(), b.to_bits());
        assert_eq!(
            scalar.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            best.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}
