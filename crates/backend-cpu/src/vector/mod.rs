//! Vector kernels of the non-matmul ops: dot products, multiply-adds, scalings and the SwiGLU
//! gate over f32 and f16 rows, with an AVX2 (+FMA, F16C) path and a scalar twin.
//!
//! Every kernel reproduces what ggml-cpu computed for the reference outputs (AVX-512 machine,
//! gcc 12, which contracts `a * b + c` into fused multiply-adds): the dot products sum exact
//! products in f64 (see [`dot_f16`]); the multiply-adds are fused and, for f16, rounded back
//! to f16 after each step; the scalings are plain products. That machine also has
//! AVX512-FP16, so the f16 kernels handle the first `n - n % 128` elements of a row in native
//! f16 arithmetic (`runit_quant::dot::half_arith`: head_dim 128 and up). The loops mirror ggml's
//! `ggml_vec_dot_f16`, `ggml_vec_dot_f32`, `ggml_vec_mad_f16/f32`, `ggml_vec_scale_f16/f32`
//! and `ggml_vec_swiglu_f32` (see [`silu`]); the GeGLU gate is a table lookup ([`gelu_mul`]). The AVX2 path and the scalar twin agree bit for
//! bit.

mod silu;
mod softmax;
mod values;
#[cfg(target_arch = "x86_64")]
mod x86;

use half::f16;
use runit_quant::blocks::{BlockQ4_0, BlockQ8_0};
use runit_quant::dot::half_arith;

pub use silu::silu_mul;
pub use softmax::{online_step, soft_max_f32};
pub use values::{accumulate as accumulate_values, softmax_steps, ValueBlocks, ValueSteps};

use runit_backend::{gelu, Activation};

/// `gate[i] = activation(gate[i]) * up[i]`: [`silu_mul`], or [`gelu_mul`].
pub fn gated(isa: Isa, activation: Activation, gate: &mut [f32], up: &[f32]) {
    match activation {
        Activation::Silu => silu_mul(isa, gate, up),
        Activation::GeluTanh => gelu_mul(gate, up),
    }
}

/// `gate[i] = gelu(gate[i]) * up[i]` through ggml's f16 table ([`gelu::gate`]): a lookup per
/// element, the same on every SIMD level.
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    let table = gelu::table();
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu::gate(table, *g, u);
    }
}

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
        if allow_simd && runit_quant::cpu::may_use_all(&runit_quant::cpu::AVX2) {
            return Isa::Avx2;
        }
        let _ = allow_simd;
        Isa::Scalar
    }
}

/// f32 lanes of one ggml SIMD vector on the reference machine (AVX-512): the SwiGLU kernel
/// works in groups of this many values.
const LANES: usize = 16;
/// Values [`silu_mul`] takes in whole groups: a range that starts and ends on a multiple of
/// this gets the same bits from it as the whole row does.
pub(crate) const SILU_GROUP: usize = LANES;
/// f64 partial sums of the dot products (see [`dot_f16`]).
const DOT_LANES: usize = 8;

/// Adds the f64 partial sums in a fixed tree order.
fn reduce(acc: &[f64; DOT_LANES]) -> f64 {
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// `sum_i a[i] * b[i]` of two f16 rows (`a.len() == b.len()`), rounded to f32.
///
/// The reference machine has AVX512-FP16, so ggml's `ggml_vec_dot_f16` sums the first
/// `n - n % 128` products in native f16 arithmetic (`runit_quant::dot::half_arith`); the
/// remaining (exact f32) products are added one by one in f64 (`ggml_float`) and the total
/// rounded to f32. Below 128 elements everything is that f64 loop: an f64 sum of such
/// products is exact unless their exponents span more than ~30 binades, so the eight f64
/// partial sums used here give the same f32 result as the sequential loop in practice, at
/// SIMD speed.
pub fn dot_f16(isa: Isa, a: &[f16], b: &[f16]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    let native = half_arith::body_len(n);
    if native > 0 {
        // `sumf` starts from the f16 sum of the native part, then takes the leftovers in order.
        let mut sum = f64::from(half_arith::dot_body(&a[..n], &b[..n]));
        for (x, y) in a[native..n].iter().zip(&b[native..n]) {
            sum += f64::from(x.to_f32() * y.to_f32());
        }
        return sum as f32;
    }
    match isa {
        // SAFETY: `Isa::Avx2` is made only by `Isa::detect`, after detecting AVX2, FMA and F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::dot_f16(a, b) },
        Isa::Scalar => {
            let mut acc = [0.0f64; DOT_LANES];
            let body = a.len() / DOT_LANES * DOT_LANES;
            for (ca, cb) in a[..body]
                .chunks_exact(DOT_LANES)
                .zip(b[..body].chunks_exact(DOT_LANES))
            {
                for ((lane, x), y) in acc.iter_mut().zip(ca).zip(cb) {
                    *lane += f64::from(x.to_f32() * y.to_f32());
                }
            }
            let mut sum = reduce(&acc);
            for (x, y) in a[body..].iter().zip(&b[body..]) {
                sum += f64::from(x.to_f32() * y.to_f32());
            }
            sum as f32
        }
    }
}

/// `sum_i a[i] * b[i]` of two f32 rows: each product rounded to f32, the sum kept in f64
/// and rounded to f32 at the end (ggml's scalar `ggml_vec_dot_f32`; see [`dot_f16`]).
pub fn dot_f32(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    match isa {
        // SAFETY: `Isa::Avx2` is made only by `Isa::detect`, after detecting AVX2, FMA and F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::dot_f32(a, b) },
        Isa::Scalar => {
            let mut acc = [0.0f64; DOT_LANES];
            let body = a.len() / DOT_LANES * DOT_LANES;
            for (ca, cb) in a[..body]
                .chunks_exact(DOT_LANES)
                .zip(b[..body].chunks_exact(DOT_LANES))
            {
                for ((lane, x), y) in acc.iter_mut().zip(ca).zip(cb) {
                    *lane += f64::from(x * y);
                }
            }
            let mut sum = reduce(&acc);
            for (x, y) in a[body..].iter().zip(&b[body..]) {
                sum += f64::from(x * y);
            }
            sum as f32
        }
    }
}

/// `y[i] = f16(y[i] + x[i] * v)` with the multiply-add fused in f32; the first
/// `n - n % 128` elements in native f16 arithmetic as the reference computes them
/// (`y[i] = fma(x[i], f16(v), y[i])`, see [`dot_f16`]).
pub fn mad_f16(isa: Isa, y: &mut [f16], x: &[f16], v: f32) {
    debug_assert_eq!(x.len(), y.len());
    let native = half_arith::body_len(y.len().min(x.len()));
    half_arith::mad_body(y, x, v);
    let (y, x) = (&mut y[native..], &x[native..]);
    match isa {
        // SAFETY: `Isa::Avx2` is made only by `Isa::detect`, after detecting AVX2, FMA and F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::mad_f16(y, x, v) },
        Isa::Scalar => {
            for (out, value) in y.iter_mut().zip(x) {
                *out = f16::from_f32(value.to_f32().mul_add(v, out.to_f32()));
            }
        }
    }
}

/// `y[i] = f16(y[i] * v)`; the first `n - n % 128` elements as `f16(y[i] * f16(v))` in
/// native f16 arithmetic (see [`dot_f16`]).
pub fn scale_f16(isa: Isa, y: &mut [f16], v: f32) {
    let native = half_arith::body_len(y.len());
    half_arith::scale_body(y, v);
    let y = &mut y[native..];
    match isa {
        // SAFETY: `Isa::Avx2` is made only by `Isa::detect`, after detecting AVX2, FMA and F16C.
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
        // SAFETY: `Isa::Avx2` is made only by `Isa::detect`, after detecting AVX2, FMA and F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::mad_f32(y, x, v) },
        Isa::Scalar => {
            for (out, value) in y.iter_mut().zip(x) {
                *out = value.mul_add(v, *out);
            }
        }
    }
}

/// `y = y + c[r] * rows[r]` for each row `r` in order (each element one fused multiply-add
/// per row, exactly [`mad_f32`] called row after row), skipping rows whose coefficient is 0
/// when `skip_zero`. `rows` holds `coefficients.len()` rows of `y.len()` values. The SIMD
/// version keeps a run of `y` in registers across all rows instead of reloading it per row.
pub fn mad_rows_f32(isa: Isa, y: &mut [f32], rows: &[f32], coefficients: &[f32], skip_zero: bool) {
    let width = y.len();
    assert_eq!(rows.len(), coefficients.len() * width, "rows x width");
    match isa {
        // SAFETY: `Isa::Avx2` is made only by `Isa::detect`, after detecting AVX2, FMA and
        // F16C; the lengths were checked above (`rows.len() == coefficients.len() * width`).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::mad_rows_f32(y, rows, coefficients, skip_zero) },
        Isa::Scalar => {
            for (row, &c) in rows.chunks_exact(width.max(1)).zip(coefficients) {
                if !(skip_zero && c == 0.0) {
                    mad_f32(Isa::Scalar, y, row, c);
                }
            }
        }
    }
}

/// A row of Q8_0 blocks as f32 values (`out.len() == 32 * blocks.len()`): ggml's
/// `dequantize_row_q8_0`, each value `f32(q) * d` (one rounding), so every path gives the
/// same bits.
pub fn dequant_q8_0(isa: Isa, blocks: &[BlockQ8_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32, "values of the blocks");
    match isa {
        // SAFETY: `Isa::Avx2` is made only by `Isa::detect`, after detecting AVX2, FMA and
        // F16C; the lengths were checked above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::dequant_q8_0(blocks, out) },
        Isa::Scalar => runit_quant::dequant::dequantize_row_q8_0(blocks, out),
    }
}

/// A row of Q4_0 blocks as f32 values: ggml's `dequantize_row_q4_0`, each value
/// `f32(nibble - 8) * d`, byte j's low nibble value j of its block and the high one value
/// j + 16.
pub fn dequant_q4_0(isa: Isa, blocks: &[BlockQ4_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32, "values of the blocks");
    match isa {
        // SAFETY: as in `dequant_q8_0`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::dequant_q4_0(blocks, out) },
        Isa::Scalar => runit_quant::dequant::dequantize_row_q4_0(blocks, out),
    }
}

/// `y[i] *= v` (exact elementwise; plain code vectorises).
pub fn scale_f32(y: &mut [f32], v: f32) {
    for out in y.iter_mut() {
        *out *= v;
    }
}

/// `sum_i x[i]²` with each square rounded to f32 and added in order to an f64 sum (ggml's
/// `ggml_float` loop in `rms_norm`, which the compiler may not reorder).
pub fn sum_squares(x: &[f32]) -> f64 {
    let mut sum = 0.0f64;
    for value in x {
        sum += f64::from(value * value);
    }
    sum
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
    fn dequantization_twins_agree_bit_for_bit() {
        let best = Isa::detect(true);
        let n = 7;
        let q8: Vec<BlockQ8_0> = (0..n)
            .map(|b| BlockQ8_0 {
                d: f16::from_f32(0.013 * (b as f32 - 3.0) + 1e-5),
                qs: std::array::from_fn(|i| ((i * 37 + b * 11) % 256) as u8 as i8),
            })
            .collect();
        let q4: Vec<BlockQ4_0> = (0..n)
            .map(|b| BlockQ4_0 {
                d: f16::from_f32(0.7 - 0.2 * b as f32),
                qs: std::array::from_fn(|i| ((i * 53 + b * 29) % 256) as u8),
            })
            .collect();
        let (mut fast, mut twin) = (vec![0.0f32; 32 * n], vec![0.0f32; 32 * n]);
        dequant_q8_0(best, &q8, &mut fast);
        dequant_q8_0(Isa::Scalar, &q8, &mut twin);
        assert_eq!(
            fast.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            twin.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        dequant_q4_0(best, &q4, &mut fast);
        dequant_q4_0(Isa::Scalar, &q4, &mut twin);
        assert_eq!(
            fast.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            twin.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn twins_agree_bit_for_bit() {
        let best = Isa::detect(true);
        for n in [1, 7, 32, 64, 100, 128, 130, 192, 200] {
            let a = values(n, 1);
            let b = values(n, 7);
            let mut a16 = vec![f16::ZERO; n];
            let mut b16 = vec![f16::ZERO; n];
            to_f16(&a, &mut a16);
            to_f16(&b, &mut b16);
            assert_eq!(dot_f16(best, &a16, &b16), dot_f16(Isa::Scalar, &a16, &b16));
            assert_eq!(dot_f32(best, &a, &b), dot_f32(Isa::Scalar, &a, &b));
            let mut y1 = b16.clone();
            let mut y2 = b16.clone();
            mad_f16(best, &mut y1, &a16, 0.37);
            mad_f16(Isa::Scalar, &mut y2, &a16, 0.37);
            assert_eq!(y1, y2);
            scale_f16(best, &mut y1, 0.61);
            scale_f16(Isa::Scalar, &mut y2, 0.61);
            assert_eq!(y1, y2);
            for skip_zero in [false, true] {
                let rows = 5;
                let matrix = values(rows * n, 3);
                let mut coefficients = values(rows, 9);
                coefficients[2] = 0.0;
                let (mut m1, mut m2) = (b.clone(), b.clone());
                mad_rows_f32(best, &mut m1, &matrix, &coefficients, skip_zero);
                mad_rows_f32(Isa::Scalar, &mut m2, &matrix, &coefficients, skip_zero);
                assert_eq!(m1, m2, "mad_rows_f32 n={n} skip_zero={skip_zero}");
            }
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
        assert!((sum_squares(&a) - squares).abs() < 1e-5);
    }

    #[test]
    fn mad_f16_rounds_to_f16() {
        let mut y = [f16::from_f32(1.0)];
        mad_f16(Isa::Scalar, &mut y, &[f16::from_f32(1.0)], 1.0e-4);
        // 1 + 1e-4 is below half an f16 ulp at 1.0 (2^-11 ≈ 4.9e-4): stays 1.
        assert_eq!(y[0].to_f32(), 1.0);
    }
}
