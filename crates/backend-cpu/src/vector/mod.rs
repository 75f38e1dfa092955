//! Vector kernels of the non-matmul ops: dot products, multiply-adds and scalings over f32
//! and f16 rows, with an AVX2 (+FMA, F16C) path and a scalar twin.
//!
//! The twins compute bit-identical results: both keep the same lane structure (four
//! accumulators of eight lanes, reduced in ggml's `GGML_F32x8_REDUCE` order) and both fuse
//! multiply-adds (`f32::mul_add` in the twin). The loops mirror ggml's `ggml_vec_dot_f16`,
//! `ggml_vec_dot_f32`, `ggml_vec_mad_f16/f32` and `ggml_vec_scale_f16/f32`.

#[cfg(target_arch = "x86_64")]
mod x86;

use half::f16;

/// Which kernels run: chosen once by the backend from its SIMD level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Portable code (the twin every fast path is tested against).
    Scalar,
    /// x86-64 AVX2 with FMA and F16C; only constructed after runtime detection.
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Isa {
    /// The best kernels this machine runs, no better than `allow_simd` permits.
    pub fn detect(allow_simd: bool) -> Isa {
        #[cfg(target_arch = "x86_64")]
        if allow_simd
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            return Isa::Avx2;
        }
        let _ = allow_simd;
        Isa::Scalar
    }
}

/// Elements consumed per step of the dot-product loops (4 accumulators × 8 lanes).
const STEP: usize = 32;
const LANES: usize = 8;

/// Reduces four 8-lane accumulators in ggml's `GGML_F32x8_REDUCE` order.
fn reduce(acc: &[[f32; LANES]; 4]) -> f32 {
    let mut x = [0.0f32; LANES];
    for (l, value) in x.iter_mut().enumerate() {
        *value = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
    }
    let t = [x[0] + x[4], x[1] + x[5], x[2] + x[6], x[3] + x[7]];
    (t[0] + t[1]) + (t[2] + t[3])
}

/// `sum_i a[i] * b[i]` of two f16 rows (`a.len() == b.len()`), accumulated in f32 lanes with
/// the tail in f64. Products of two f16 values are exact in f32, so fusing makes no difference.
pub fn dot_f16(isa: Isa, a: &[f16], b: &[f16]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    match isa {
        // SAFETY: `Isa::Avx2` is only constructed after detecting AVX2, FMA and F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::dot_f16(a, b) },
        Isa::Scalar => {
            let body = a.len() / STEP * STEP;
            let mut acc = [[0.0f32; LANES]; 4];
            for (ca, cb) in a[..body]
                .chunks_exact(STEP)
                .zip(b[..body].chunks_exact(STEP))
            {
                for (i, (x, y)) in ca.iter().zip(cb).enumerate() {
                    let lane = &mut acc[i / LANES][i % LANES];
                    *lane += x.to_f32() * y.to_f32();
                }
            }
            let mut sum = f64::from(reduce(&acc));
            for (x, y) in a[body..].iter().zip(&b[body..]) {
                sum += f64::from(x.to_f32() * y.to_f32());
            }
            sum as f32
        }
    }
}

/// `sum_i a[i] * b[i]` of two f32 rows, fused multiply-adds in f32 lanes, tail in f64.
pub fn dot_f32(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    match isa {
        // SAFETY: `Isa::Avx2` is only constructed after detecting AVX2, FMA and F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::dot_f32(a, b) },
        Isa::Scalar => {
            let body = a.len() / STEP * STEP;
            let mut acc = [[0.0f32; LANES]; 4];
            for (ca, cb) in a[..body]
                .chunks_exact(STEP)
                .zip(b[..body].chunks_exact(STEP))
            {
                for (i, (x, y)) in ca.iter().zip(cb).enumerate() {
                    let lane = &mut acc[i / LANES][i % LANES];
                    *lane = x.mul_add(*y, *lane);
                }
            }
            let mut sum = f64::from(reduce(&acc));
            for (x, y) in a[body..].iter().zip(&b[body..]) {
                sum += f64::from(x * y);
            }
            sum as f32
        }
    }
}

/// `y[i] = f16(y[i] + x[i] * v)` with the multiply-add fused in f32.
pub fn mad_f16(isa: Isa, y: &mut [f16], x: &[f16], v: f32) {
    debug_assert_eq!(x.len(), y.len());
    match isa {
        // SAFETY: `Isa::Avx2` is only constructed after detecting AVX2, FMA and F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::mad_f16(y, x, v) },
        Isa::Scalar => {
            for (out, value) in y.iter_mut().zip(x) {
                *out = f16::from_f32(value.to_f32().mul_add(v, out.to_f32()));
            }
        }
    }
}

/// `y[i] = f16(y[i] * v)`.
pub fn scale_f16(isa: Isa, y: &mut [f16], v: f32) {
    match isa {
        // SAFETY: `Isa::Avx2` is only constructed after detecting AVX2, FMA and F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::scale_f16(y, v) },
        Isa::Scalar => {
            for out in y.iter_mut() {
                *out = f16::from_f32(out.to_f32() * v);
            }
        }
    }
}

/// `y[i] += x[i] * v`, fused.
pub fn mad_f32(isa: Isa, y: &mut [f32], x: &[f32], v: f32) {
    debug_assert_eq!(x.len(), y.len());
    match isa {
        // SAFETY: `Isa::Avx2` is only constructed after detecting AVX2, FMA and F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::mad_f32(y, x, v) },
        Isa::Scalar => {
            for (out, value) in y.iter_mut().zip(x) {
                *out = value.mul_add(v, *out);
            }
        }
    }
}

/// `y[i] *= v` (exact elementwise; plain code vectorises).
pub fn scale_f32(y: &mut [f32], v: f32) {
    for out in y.iter_mut() {
        *out *= v;
    }
}

/// `sum_i x[i]²` with each square rounded to f32 and the sum kept in f64 (ggml's
/// `ggml_float` sum of `rms_norm`), over four f64 lanes.
pub fn sum_squares(isa: Isa, x: &[f32]) -> f64 {
    match isa {
        // SAFETY: `Isa::Avx2` is only constructed after detecting AVX2, FMA and F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::sum_squares(x) },
        Isa::Scalar => {
            let body = x.len() / 4 * 4;
            let mut acc = [0.0f64; 4];
            for chunk in x[..body].chunks_exact(4) {
                for (lane, value) in acc.iter_mut().zip(chunk) {
                    *lane += f64::from(value * value);
                }
            }
            let mut sum = (acc[0] + acc[2]) + (acc[1] + acc[3]);
            for value in &x[body..] {
                sum += f64::from(value * value);
            }
            sum
        }
    }
}

/// Rounds `src` to f16 (round to nearest even, as F16C's `vcvtps2ph` with mode 0).
pub fn to_f16(src: &[f32], dst: &mut [f16]) {
    use half::slice::HalfFloatSliceExt;
    dst.convert_from_f32_slice(src);
}

/// Widens f16 values to f32 (exact).
pub fn to_f32(src: &[f16], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    src.convert_to_f32_slice(dst);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    #[test]
    fn twins_agree_bit_for_bit() {
        let best = Isa::detect(true);
        for n in [1, 7, 32, 64, 100, 128, 130] {
            let a = values(n, 1);
            let b = values(n, 7);
            let mut a16 = vec![f16::ZERO; n];
            let mut b16 = vec![f16::ZERO; n];
            to_f16(&a, &mut a16);
            to_f16(&b, &mut b16);
            assert_eq!(dot_f16(best, &a16, &b16), dot_f16(Isa::Scalar, &a16, &b16));
            assert_eq!(dot_f32(best, &a, &b), dot_f32(Isa::Scalar, &a, &b));
            assert_eq!(sum_squares(best, &a), sum_squares(Isa::Scalar, &a));
            let mut y1 = b16.clone();
            let mut y2 = b16.clone();
            mad_f16(best, &mut y1, &a16, 0.37);
            mad_f16(Isa::Scalar, &mut y2, &a16, 0.37);
            assert_eq!(y1, y2);
            scale_f16(best, &mut y1, 0.61);
            scale_f16(Isa::Scalar, &mut y2, 0.61);
            assert_eq!(y1, y2);
            let mut z1 = b.clone();
            let mut z2 = b.clone();
            mad_f32(best, &mut z1, &a, -1.3);
            mad_f32(Isa::Scalar, &mut z2, &a, -1.3);
            assert_eq!(z1, z2);
        }
    }

    #[test]
    fn dot_matches_f64_reference() {
        let a = values(100, 3);
        let b = values(100, 5);
        let exact: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        let got = dot_f32(Isa::Scalar, &a, &b);
        assert!((f64::from(got) - exact).abs() < 1e-5, "{got} vs {exact}");
        let squares: f64 = a.iter().map(|x| f64::from(*x) * f64::from(*x)).sum();
        assert!((sum_squares(Isa::Scalar, &a) - squares).abs() < 1e-5);
    }

    #[test]
    fn mad_f16_rounds_to_f16() {
        let mut y = [f16::from_f32(1.0)];
        mad_f16(Isa::Scalar, &mut y, &[f16::from_f32(1.0)], 1.0e-4);
        // 1 + 1e-4 is below half an f16 ulp at 1.0 (2^-11 ≈ 4.9e-4): stays 1.
        assert_eq!(y[0].to_f32(), 1.0);
    }
}
