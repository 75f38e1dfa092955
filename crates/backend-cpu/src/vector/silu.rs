//! The SwiGLU gate `silu(gate) * up` as ggml's `ggml_vec_swiglu_f32` computes it on the
//! reference machine: whole groups of 16 values go through `ggml_v_silu` (AVX-512), whose
//! `exp` is ggml's polynomial `ggml_v_expf` (adapted from ARM's optimized routines, fused
//! multiply-adds, `scalef` by the integer part); the leftover values use the scalar
//! `ggml_silu_f32`, `x / (1 + expf(-x))` with libm's `expf`.
//!
//! Each lane's arithmetic is independent, so the AVX2 path (8 lanes) gives the same bits as
//! the scalar twin.

use super::{Isa, LANES};

// The constants of `ggml_v_expf`, as f32 bit patterns (hex floats in ggml's source).
/// `0x1.8p23`: adding it rounds to an integer.
pub(super) const SHIFT: u32 = 0x4b40_0000;
/// `0x1.715476p+0` ≈ log2(e).
pub(super) const LOG2_E: u32 = 0x3fb8_aa3b;
/// `0x1.62e4p-1` and `0x1.7f7d1cp-20`: ln 2 split in a high and a low part.
pub(super) const LN2_HIGH: u32 = 0x3f31_7200;
pub(super) const LN2_LOW: u32 = 0x35bf_be8e;
/// Polynomial coefficients `0x1.0e4020p-7`, `0x1.573e2ep-5`, `0x1.555e66p-3`,
/// `0x1.fffdb6p-2`, `0x1.ffffecp-1`.
pub(super) const C5: u32 = 0x3c07_2010;
pub(super) const C4: u32 = 0x3d2b_9f17;
pub(super) const C3: u32 = 0x3e2a_af33;
pub(super) const C2: u32 = 0x3eff_fedb;
pub(super) const C1: u32 = 0x3f7f_fff6;

pub(super) fn constant(bits: u32) -> f32 {
    f32::from_bits(bits)
}

/// `j * 2^n` for an integral `n`, rounded once (`_mm512_scalef_ps`).
fn scale_by_power_of_two(j: f32, n: f32) -> f32 {
    if (-126.0..=127.0).contains(&n) {
        // 2^n is a normal f32: one multiplication, one rounding.
        j * f32::from_bits(((n as i32 + 127) as u32) << 23)
    } else {
        // Exact in f64, then a single rounding to f32.
        (f64::from(j) * 2.0f64.powi(n as i32)) as f32
    }
}

/// One lane of ggml's AVX-512 `ggml_v_expf`.
pub(super) fn vector_exp(x: f32) -> f32 {
    let shift = constant(SHIFT);
    let z = x.mul_add(constant(LOG2_E), shift);
    let n = z - shift;
    let b = (-n).mul_add(constant(LN2_LOW), (-n).mul_add(constant(LN2_HIGH), x));
    let u = b * b;
    let j = constant(C5)
        .mul_add(b, constant(C4))
        .mul_add(u, constant(C3).mul_add(b, constant(C2)))
        .mul_add(u, constant(C1).mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    scale_by_power_of_two(j, n)
}

/// One lane of ggml's `ggml_v_silu`: `x / (1 + v_expf(0 - x))`.
fn vector_silu(x: f32) -> f32 {
    x / (1.0 + vector_exp(0.0 - x))
}

/// ggml's scalar `ggml_silu_f32`.
fn scalar_silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `gate[i] = silu(gate[i]) * up[i]` for one row of `gate.len()` values (ggml applies
/// `ggml_vec_swiglu_f32` row by row, so the 16-value groups start at each row's start).
pub fn silu_mul(isa: Isa, gate: &mut [f32], up: &[f32]) {
    debug_assert_eq!(gate.len(), up.len());
    let body = gate.len() / LANES * LANES;
    match isa {
        // SAFETY: `Isa::Avx2` is made only by `Isa::detect`, after detecting AVX2, FMA and F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::silu_mul(&mut gate[..body], &up[..body]) },
        Isa::Scalar => {
            for (g, u) in gate[..body].iter_mut().zip(&up[..body]) {
                *g = vector_silu(*g) * u;
            }
        }
    }
    for (g, u) in gate[body..].iter_mut().zip(&up[body..]) {
        *g = scalar_silu(*g) * u;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! AVX2 + FMA lanes of `ggml_v_silu`; the rare lanes whose exponent leaves the normal
    //! range are redone by the scalar twin.

    use std::arch::x86_64::*;

    use super::{constant, vector_silu, C1, C2, C3, C4, C5, LN2_HIGH, LN2_LOW, LOG2_E, SHIFT};

    /// `gate[i] = v_silu(gate[i]) * up[i]`, 8 lanes at a time (`gate.len()` a multiple of 8).
    ///
    /// # Safety
    /// Requires AVX2 and FMA; `gate.len() == up.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
        let shift = _mm256_set1_ps(constant(SHIFT));
        let log2_e = _mm256_set1_ps(constant(LOG2_E));
        let ln2_high = _mm256_set1_ps(constant(LN2_HIGH));
        let ln2_low = _mm256_set1_ps(constant(LN2_LOW));
        let c = [C5, C4, C3, C2, C1].map(|bits| _mm256_set1_ps(constant(bits)));
        let one = _mm256_set1_ps(1.0);
        let limit = _mm256_set1_ps(126.0);
        let sign = _mm256_set1_ps(-0.0);
        for (g, u) in gate.chunks_exact_mut(8).zip(up.chunks_exact(8)) {
            // SAFETY: both chunks hold 8 values; `loadu`/`storeu` accept any alignment.
            let (x, factor) = unsafe { (_mm256_loadu_ps(g.as_ptr()), _mm256_loadu_ps(u.as_ptr())) };
            let minus_x = _mm256_sub_ps(_mm256_setzero_ps(), x);
            let z = _mm256_fmadd_ps(minus_x, log2_e, shift);
            let n = _mm256_sub_ps(z, shift);
            let b = _mm256_fnmadd_ps(n, ln2_low, _mm256_fnmadd_ps(n, ln2_high, minus_x));
            let squared = _mm256_mul_ps(b, b);
            let j = _mm256_fmadd_ps(
                _mm256_fmadd_ps(
                    _mm256_fmadd_ps(c[0], b, c[1]),
                    squared,
                    _mm256_fmadd_ps(c[2], b, c[3]),
                ),
                squared,
                _mm256_fmadd_ps(c[4], b, one),
            );
            let outside = _mm256_cmp_ps::<_CMP_GT_OQ>(_mm256_andnot_ps(sign, n), limit);
            if _mm256_movemask_ps(outside) != 0 {
                for (value, factor) in g.iter_mut().zip(u) {
                    *value = vector_silu(*value) * factor;
                }
                continue;
            }
            // 2^n for |n| <= 126: the exponent field n + 127.
            let power = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_cvtps_epi32(n),
                _mm256_set1_epi32(127),
            )));
            let exp = _mm256_mul_ps(j, power);
            let silu = _mm256_div_ps(x, _mm256_add_ps(one, exp));
            // SAFETY: `g` holds 8 writable values.
            unsafe { _mm256_storeu_ps(g.as_mut_ptr(), _mm256_mul_ps(silu, factor)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_exp_is_close_to_libm() {
        for i in -2000..2000 {
            let x = i as f32 * 0.0437;
            let ours = vector_exp(x);
            let libm = x.exp();
            assert!(
                (ours - libm).abs() <= 3.0 * f32::EPSILON * libm,
                "{x}: {ours} vs {libm}"
            );
        }
        assert_eq!(vector_exp(-200.0), 0.0);
        assert_eq!(vector_exp(200.0), f32::INFINITY);
    }

    #[test]
    fn twins_agree_bit_for_bit() {
        let n = 16 * 40 + 5;
        let gate: Vec<f32> = (0..n)
            .map(|i| ((i as f32 * 0.731).sin() * 30.0) * if i % 37 == 0 { 4.0 } else { 1.0 })
            .collect();
        let up: Vec<f32> = (0..n).map(|i| (i as f32 * 0.193).cos()).collect();
        let mut scalar = gate.clone();
        silu_mul(Isa::Scalar, &mut scalar, &up);
        let mut best = gate.clone();
        silu_mul(Isa::detect(true), &mut best, &up);
        assert_eq!(scalar, best);
        for (i, (s, g)) in scalar.iter().zip(&gate).enumerate() {
            let reference = f64::from(*g) / (1.0 + (-f64::from(*g)).exp()) * f64::from(up[i]);
            assert!((f64::from(*s) - reference).abs() < 1e-5 * (1.0 + reference.abs()));
        }
    }
}
