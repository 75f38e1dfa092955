//! Native half-precision arithmetic as ggml-cpu's f16 vector kernels run it on a CPU with
//! AVX512-FP16 (the reference machine: `-march=native` defines `__AVX512FP16__`).
//!
//! There `GGML_F16_STEP` is 128 and `GGML_F16_EPR` 32: the f16 kernels work on four
//! 32-lane `__m512h` registers and every operation rounds to f16 (`vfmadd…ph`, `vaddph`,
//! `vmulph`). Only the first `n - n % 128` elements take that path; the rest go through
//! ggml's scalar leftover loop in f32/f64, as before. Concretely (ggml `vec.h`/`vec.cpp`):
//!
//! - `ggml_vec_dot_f16`: element `i` of each 128-element step goes by fused multiply-add
//!   (one f16 rounding) into lane `i % 32` of accumulator `(i / 32) % 4`; then
//!   `acc0 += acc2`, `acc1 += acc3`, `acc0 += acc1` and gcc's `_mm512_reduce_add_ph`
//!   (halves 16 + 16, 8 + 8, lanes `j` and `j + 4`, then `(t0 + t2) + (t1 + t3)`), all in
//!   f16; that f16 sum starts the f64 (`ggml_float`) sum of the leftovers ([`dot_body`]).
//! - `ggml_vec_mad_f16`: `y = fma(x, f16(v), y)` in f16 ([`mad_body`]).
//! - `ggml_vec_scale_f16`: `y = y * f16(v)` in f16 ([`scale_body`]).
//!
//! Every result here is the correctly rounded f16 of the exact value, computed from f64
//! (where products of two f16 values are exact) with a round-to-nearest-even that accounts
//! for the f64 rounding error, so no double rounding can occur.

use half::f16;

/// Elements per step of the native f16 kernels (`GGML_F16_STEP` with AVX512-FP16).
pub const HALF_STEP: usize = 128;
/// f16 lanes of one `__m512h` register (`GGML_F16_EPR`).
const HALF_LANES: usize = 32;
/// Largest finite f16.
const F16_MAX: f64 = 65504.0;

/// The elements `0..n - n % HALF_STEP` that ggml's native f16 path handles.
pub fn body_len(n: usize) -> usize {
    n - n % HALF_STEP
}

/// The f16 nearest to the exact value `high + low` (ties to even), where `high` is an f64
/// and `low` the (possibly zero) error of the f64 that produced it, much smaller than
/// `high`'s last bit.
fn round_exact(high: f64, low: f64) -> f16 {
    if high.is_nan() {
        return f16::NAN;
    }
    let magnitude = high.abs();
    if magnitude == 0.0 || magnitude.is_infinite() {
        return f16::from_f64(high);
    }
    // f16 spacing in this binade: 2^(e - 10), and 2^-24 throughout the subnormals.
    let exponent = ((magnitude.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    let quantum = f64::from_bits(((exponent.max(-14) - 10 + 1023) as u64) << 52);
    let scaled = magnitude / quantum; // exact: a power-of-two scaling
    let floor = scaled.floor();
    let rounded = if scaled - floor == 0.5 && low != 0.0 {
        // `high` sits on a tie only because of the f64 rounding: `low` decides.
        if (low > 0.0) == (high > 0.0) {
            floor + 1.0
        } else {
            floor
        }
    } else {
        scaled.round_ties_even()
    };
    let value = rounded * quantum;
    let value = if value > F16_MAX {
        f64::INFINITY
    } else {
        value
    };
    // `value` is an f16 value (or infinity), so this conversion is exact.
    f16::from_f64(value.copysign(high))
}

/// `a + b` with its exact f64 rounding error (Knuth's two-sum).
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let sum = a + b;
    let b_part = sum - a;
    let error = (a - (sum - b_part)) + (b - b_part);
    (sum, error)
}

/// `a * b + c` rounded once to f16 (`vfmadd…ph`).
pub fn fma(a: f16, b: f16, c: f16) -> f16 {
    // The product of two f16 values is exact in f64 (22 significant bits).
    let product = f64::from(a) * f64::from(b);
    let (sum, error) = two_sum(product, f64::from(c));
    round_exact(sum, error)
}

/// `a + b` rounded to f16 (`vaddph`).
pub fn add(a: f16, b: f16) -> f16 {
    // Two f16 values add exactly in f64.
    round_exact(f64::from(a) + f64::from(b), 0.0)
}

/// `a * b` rounded to f16 (`vmulph`).
pub fn mul(a: f16, b: f16) -> f16 {
    round_exact(f64::from(a) * f64::from(b), 0.0)
}

/// gcc's `_mm512_reduce_add_ph` on 32 f16 lanes.
fn reduce_add(lanes: &[f16; HALF_LANES]) -> f16 {
    let sixteen: [f16; 16] = std::array::from_fn(|j| add(lanes[j], lanes[j + 16]));
    let eight: [f16; 8] = std::array::from_fn(|j| add(sixteen[j], sixteen[j + 8]));
    let four: [f16; 4] = std::array::from_fn(|j| add(eight[j], eight[j + 4]));
    add(add(four[0], four[2]), add(four[1], four[3]))
}

/// True when the AVX2 + F16C kernels of this module run on this CPU.
fn fast() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::dot::x86::has_avx2()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The native-f16 part of `ggml_vec_dot_f16` over `x[..body_len(n)]`, `y[..body_len(n)]`
/// (`n = x.len()`): the f16 the leftover sum starts from (zero when the body is empty).
pub fn dot_body(x: &[f16], y: &[f16]) -> f16 {
    dot_body_at(x, y, fast())
}

/// The scalar twin of [`dot_body`].
pub fn dot_body_scalar(x: &[f16], y: &[f16]) -> f16 {
    dot_body_at(x, y, false)
}

#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn dot_body_at(x: &[f16], y: &[f16], simd: bool) -> f16 {
    let body = body_len(x.len().min(y.len()));
    if body == 0 {
        return f16::ZERO;
    }
    #[cfg(target_arch = "x86_64")]
    if simd && crate::dot::x86::half_native::has_avx512_fp16() {
        // SAFETY: `has_avx512_fp16` confirmed AVX512-FP16 and AVX-512 F/BW/VL.
        let sum = unsafe { crate::dot::x86::half_native::dot_body(&x[..body], &y[..body]) };
        return if sum.is_nan() { f16::NAN } else { sum };
    }
    #[cfg(target_arch = "x86_64")]
    if simd && crate::dot::x86::has_avx512() {
        // SAFETY: `has_avx512` confirmed AVX-512 F/BW/VL; `fast()` F16C.
        let sum = unsafe { crate::dot::x86::half::dot_body_avx512(&x[..body], &y[..body]) };
        // A NaN is the twin's (and the AVX2 path's final scalar additions') positive one.
        return if sum.is_nan() { f16::NAN } else { sum };
    }
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `fast()` confirmed AVX2, FMA and F16C.
        return unsafe { crate::dot::x86::half::dot_body_avx2(&x[..body], &y[..body], 0) };
    }
    // Lane `j * 32 + q` is lane `q` of register `j`.
    let mut acc = [f16::ZERO; HALF_STEP];
    for step in (0..body).step_by(HALF_STEP) {
        let (xs, ys) = (&x[step..step + HALF_STEP], &y[step..step + HALF_STEP]);
        for ((lane, &a), &b) in acc.iter_mut().zip(xs).zip(ys) {
            *lane = fma(a, b, *lane);
        }
    }
    let register =
        |j: usize| -> [f16; HALF_LANES] { std::array::from_fn(|q| acc[j * HALF_LANES + q]) };
    let (mut first, mut second) = (register(0), register(1));
    let (third, fourth) = (register(2), register(3));
    for q in 0..HALF_LANES {
        first[q] = add(first[q], third[q]);
        second[q] = add(second[q], fourth[q]);
    }
    for q in 0..HALF_LANES {
        first[q] = add(first[q], second[q]);
    }
    reduce_add(&first)
}

/// The native-f16 part of `ggml_vec_mad_f16`: `y[i] = fma(x[i], f16(v), y[i])` for
/// `i < body_len(y.len())`.
pub fn mad_body(y: &mut [f16], x: &[f16], v: f32) {
    mad_body_at(y, x, v, fast());
}

/// The scalar twin of [`mad_body`].
pub fn mad_body_scalar(y: &mut [f16], x: &[f16], v: f32) {
    mad_body_at(y, x, v, false);
}

fn mad_body_at(y: &mut [f16], x: &[f16], v: f32, simd: bool) {
    let body = body_len(y.len().min(x.len()));
    let v = f16::from_f32(v);
    #[cfg(target_arch = "x86_64")]
    if simd {
        if crate::dot::x86::half_native::has_avx512_fp16() {
            // SAFETY: `has_avx512_fp16` confirmed AVX512-FP16 and AVX-512 F/BW/VL; `body`
            // is a multiple of 32.
            unsafe { crate::dot::x86::half_native::mad(&mut y[..body], &x[..body], v) };
        } else if crate::dot::x86::has_avx512() {
            // SAFETY: `has_avx512` confirmed AVX-512 F/BW/VL, `fast()` F16C; `body` is a
            // multiple of 16.
            unsafe { crate::dot::x86::half::mad_avx512(&mut y[..body], &x[..body], v) };
        } else {
            // SAFETY: `fast()` confirmed AVX2, FMA and F16C; `body` is a multiple of 8.
            unsafe { crate::dot::x86::half::mad(&mut y[..body], &x[..body], v) };
        }
        return;
    }
    let _ = simd;
    for (out, &value) in y[..body].iter_mut().zip(&x[..body]) {
        *out = fma(value, v, *out);
    }
}

/// The native-f16 part of `ggml_vec_scale_f16`: `y[i] = y[i] * f16(v)` for
/// `i < body_len(y.len())`.
pub fn scale_body(y: &mut [f16], v: f32) {
    scale_body_at(y, v, fast());
}

/// The scalar twin of [`scale_body`].
pub fn scale_body_scalar(y: &mut [f16], v: f32) {
    scale_body_at(y, v, false);
}

fn scale_body_at(y: &mut [f16], v: f32, simd: bool) {
    let body = body_len(y.len());
    let v = f16::from_f32(v);
    #[cfg(target_arch = "x86_64")]
    if simd {
        if crate::dot::x86::half_native::has_avx512_fp16() {
            // SAFETY: `has_avx512_fp16` confirmed AVX512-FP16 and AVX-512 F/BW/VL; `body`
            // is a multiple of 32.
            unsafe { crate::dot::x86::half_native::scale(&mut y[..body], v) };
        } else {
            // SAFETY: `fast()` confirmed AVX2, FMA and F16C; `body` is a multiple of 8.
            unsafe { crate::dot::x86::half::scale(&mut y[..body], v) };
        }
        return;
    }
    let _ = simd;
    for out in &mut y[..body] {
        *out = mul(*out, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every f16 bit pattern that is finite.
    fn finite_halves() -> impl Iterator<Item = f16> {
        (0..=u16::MAX).map(f16::from_bits).filter(|h| h.is_finite())
    }

    #[test]
    fn rounding_of_exact_values_is_nearest_even() {
        // Sums of two f16 values are exact in f64 and in f32 for nearby exponents, where
        // half's f32 conversion is a single correct rounding: the two must agree.
        let values: Vec<f16> = finite_halves().step_by(97).collect();
        for &a in &values {
            for &b in values.iter().step_by(13) {
                let exact = f32::from(a) + f32::from(b);
                if f64::from(exact) == f64::from(a) + f64::from(b) {
                    assert_eq!(
                        add(a, b).to_bits(),
                        f16::from_f32(exact).to_bits(),
                        "{a} + {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_tie_created_by_f64_rounding_follows_the_lost_bits() {
        // 1 + 2^-11 is the tie between 1 and 1 + 2^-10; a tiny positive addend must round
        // it up, a negative one down, although f64 alone would report the tie.
        let one = f16::ONE;
        let half_ulp = f16::from_f32(2f32.powi(-11));
        assert_eq!(add(one, half_ulp), one, "exact tie: to even");
        let tiny = f16::from_f32(2f32.powi(-24)); // smallest subnormal
        assert_eq!(
            fma(tiny, tiny, f16::ZERO),
            f16::ZERO,
            "2^-48 rounds to zero"
        );
        // The f64 sum of 1 + 2^-11 + 2^-80 is the tie itself; the error term decides.
        let lifted = round_exact(1.0 + 2f64.powi(-11), 2f64.powi(-80));
        assert_eq!(lifted, f16::from_f32(1.0 + 2f32.powi(-10)));
        let lowered = round_exact(1.0 + 2f64.powi(-11), -(2f64.powi(-80)));
        assert_eq!(lowered, one);
    }

    #[test]
    fn overflow_and_subnormals() {
        let max = f16::MAX;
        assert_eq!(add(max, max), f16::INFINITY);
        assert_eq!(mul(max, f16::from_f32(-2.0)), f16::NEG_INFINITY);
        // 65504 + 16 is the tie between 65504 and 65536 (infinity): ties to even = inf.
        assert_eq!(add(max, f16::from_f32(16.0)), f16::INFINITY);
        assert_eq!(add(max, f16::from_f32(8.0)), max);
        let tiny = f16::from_bits(1);
        assert_eq!(add(tiny, tiny), f16::from_bits(2));
        assert_eq!(mul(tiny, f16::from_f32(0.5)), f16::ZERO, "tie to even zero");
        assert_eq!(
            mul(f16::from_bits(3), f16::from_f32(0.5)),
            f16::from_bits(2)
        );
    }

    #[test]
    fn dot_body_is_zero_below_one_step_and_sums_in_f16() {
        let x = vec![f16::ONE; 127];
        assert_eq!(dot_body(&x, &x), f16::ZERO);
        let x = vec![f16::ONE; 256];
        assert_eq!(dot_body(&x, &x), f16::from_f32(256.0));
        let small = vec![f16::from_f32(1.0 / 1024.0); 128];
        let ones = vec![f16::from_f32(3.0); 128];
        let expected = 128.0 * 3.0 / 1024.0;
        assert_eq!(f64::from(dot_body(&small, &ones)), expected);
    }

    /// Values spread over many binades (and their negatives), with ties and subnormals.
    fn spread(n: usize, seed: u32) -> Vec<f16> {
        (0..n)
            .map(|i| {
                let k = (i as u32).wrapping_mul(2654435761) ^ seed;
                let exponent = (k % 23) as i32 - 16;
                let mantissa = ((k >> 8) % 2048) as f32 / 1024.0;
                let sign = if k & 0x8000_0000 != 0 { -1.0 } else { 1.0 };
                f16::from_f32(sign * mantissa * 2f32.powi(exponent))
            })
            .collect()
    }

    /// The AVX-512 kernels equal the AVX2 ones (which the dispatch skips where AVX-512 is
    /// there) bit for bit.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_kernels_equal_the_avx2_ones() {
        use crate::dot::x86::{half, has_avx2, has_avx512};
        if !(has_avx2() && has_avx512()) {
            eprintln!("skipping: no AVX-512 here");
            return;
        }
        for n in [128, 256, 1024] {
            for seed in 0..20u32 {
                let x = spread(n, seed);
                let y = spread(n, seed.wrapping_mul(7919) + 1);
                let bits = |v: &[f16]| v.iter().map(|h| h.to_bits()).collect::<Vec<_>>();
                let narrow_body = |x: &[f16], y: &[f16]| {
                    let mut acc = [f16::ZERO; 128];
                    // SAFETY: AVX2, FMA and F16C were confirmed above.
                    let four = unsafe {
                        half::dot_steps(x, y, &mut acc);
                        half::reduce_to_four(&acc)
                    };
                    add(add(four[0], four[2]), add(four[1], four[3]))
                };
                // Exact cancellations and signed zeros: the second step's products undo
                // the first's, and `0 * -y` is `-0`.
                let twice = |v: &[f16], sign: f16| -> Vec<f16> {
                    v[..128]
                        .iter()
                        .chain(v[..128].iter())
                        .enumerate()
                        .map(|(i, &e)| if i < 128 { e } else { e * sign })
                        .collect()
                };
                let zeros = vec![f16::ZERO; n];
                let cases = [
                    (x.clone(), y.clone()),
                    (twice(&x, f16::ONE), twice(&y, -f16::ONE)),
                    (zeros.clone(), y.iter().map(|v| -*v).collect()),
                ];
                for (a, b) in &cases {
                    // SAFETY: AVX-512 F/BW/VL and F16C were confirmed above.
                    let wide = unsafe { half::dot_body_avx512(a, b) };
                    let narrow = narrow_body(a, b);
                    assert_eq!(narrow.to_bits(), wide.to_bits(), "dot n {n} seed {seed}");
                    assert_eq!(dot_body_scalar(a, b).to_bits(), wide.to_bits());
                }
                for v in [0.3f32, -1.7, 1e-3, 65000.0] {
                    let (mut a, mut b) = (y.clone(), y.clone());
                    // SAFETY: as above; `n` is a multiple of 16.
                    unsafe {
                        half::mad(&mut a, &x, f16::from_f32(v));
                        half::mad_avx512(&mut b, &x, f16::from_f32(v));
                    }
                    assert_eq!(bits(&a), bits(&b), "mad n {n} seed {seed} v {v}");
                }
            }
        }
    }

    /// The AVX2 kernels' one-rounding fast path steps aside wherever the f32 result lands on
    /// an f16 midpoint: sums built so that the f32 rounding makes a tie the exact value is
    /// not on (normal and subnormal accumulators, both signs), equal to the scalar twin.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_kernels_round_once_where_f32_makes_a_tie() {
        use crate::dot::x86::{half, has_avx2};
        if !has_avx2() {
            eprintln!("skipping: no AVX2 here");
            return;
        }
        let h = |v: f64| {
            let h = f16::from_f64(v);
            assert_eq!(f64::from(h), v, "{v} is an f16 value");
            h
        };
        // (first product, second step's factors): the accumulator after the first step is
        // an f16 value with an odd last bit; the second product is just below half its last
        // place, by less than f32 keeps, so the f32 sum is the midpoint above it.
        let ulp10 = 2f64.powi(-10);
        let cases = [
            // 1 + 2^-10, then 2^-11 (1 - 2^-20): nearest even would give 1 + 2^-9.
            (1.0 + ulp10, (1.0 + ulp10, 2f64.powi(-11) * (1.0 - ulp10))),
            // The same, negated.
            (
                -(1.0 + ulp10),
                (1.0 + ulp10, -(2f64.powi(-11) * (1.0 - ulp10))),
            ),
            // A subnormal accumulator: 513 * 2^-24, then 2^-25 (1 - 2^-20).
            (
                513.0 * 2f64.powi(-24),
                (
                    2f64.powi(-11) * (1.0 + ulp10),
                    2f64.powi(-14) * (1.0 - ulp10),
                ),
            ),
        ];
        for (first, (a, b)) in cases {
            for lanes in [1usize, 5, 128] {
                let mut x = vec![f16::ZERO; 256];
                let mut y = vec![f16::ZERO; 256];
                for lane in 0..lanes {
                    x[lane] = h(first);
                    y[lane] = f16::ONE;
                    x[128 + lane] = h(a);
                    y[128 + lane] = h(b);
                }
                let mut acc = [f16::ZERO; 128];
                // SAFETY: AVX2 was confirmed above (F16C and FMA come with it on x86-64
                // CPUs that the dispatch hands these kernels to).
                unsafe { half::dot_steps(&x, &y, &mut acc) };
                for lane in 0..128 {
                    let expected = fma(
                        x[128 + lane],
                        y[128 + lane],
                        fma(x[lane], y[lane], f16::ZERO),
                    );
                    assert_eq!(
                        acc[lane].to_bits(),
                        expected.to_bits(),
                        "first {first} lane {lane}"
                    );
                }
                assert_eq!(acc[0], fma(h(a), h(b), h(first)));
                assert_ne!(
                    acc[0],
                    f16::from_f32((h(a).to_f32() * h(b).to_f32()) + h(first).to_f32()),
                    "the case rounds twice in f32"
                );
                let (mut mad_y, mut twin) = (x[..128].to_vec(), x[..128].to_vec());
                let scaled: Vec<f16> = (0..128).map(|_| h(a)).collect();
                // SAFETY: as above; 128 values.
                unsafe { half::mad(&mut mad_y, &scaled, h(b)) };
                mad_body_scalar(&mut twin, &scaled, b as f32);
                assert_eq!(mad_y, twin, "mad first {first}");
            }
        }
    }

    /// The AVX512-FP16 kernels (where this CPU has them) equal the scalar twins bit for bit,
    /// on spread values, overflowing sums, subnormal products and exact cancellations.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn native_fp16_kernels_equal_the_scalar_twins() {
        use crate::dot::x86::half_native;
        if !half_native::has_avx512_fp16() {
            eprintln!("skipping: no AVX512-FP16 here");
            return;
        }
        let bits = |v: &[f16]| v.iter().map(|h| h.to_bits()).collect::<Vec<_>>();
        for n in [128, 256, 1024, 1536] {
            for seed in 0..20u32 {
                let x = spread(n, seed);
                let y = spread(n, seed.wrapping_mul(7919) + 1);
                let big: Vec<f16> = x.iter().map(|v| *v * f16::from_f32(4096.0)).collect();
                let tiny: Vec<f16> = y.iter().map(|v| *v * f16::from_f32(1.0 / 4096.0)).collect();
                let negated: Vec<f16> = y.iter().map(|v| -*v).collect();
                let cases = [
                    (&x, &y),
                    (&big, &y),
                    (&x, &tiny),
                    (&tiny, &tiny),
                    (&y, &negated),
                ];
                for (a, b) in cases {
                    // SAFETY: `has_avx512_fp16` confirmed AVX512-FP16 and AVX-512 F/BW/VL.
                    let native = unsafe { half_native::dot_body(a, b) };
                    let twin = dot_body_scalar(a, b);
                    let native = if native.is_nan() { f16::NAN } else { native };
                    assert_eq!(native.to_bits(), twin.to_bits(), "dot n {n} seed {seed}");
                    let rows = [&a[..], &b[..], &x[..], &y[..]];
                    // SAFETY: as above.
                    let four = unsafe { half_native::dot_body_x4(rows, b, 0) };
                    for (row, sum) in rows.iter().zip(four) {
                        let sum = if sum.is_nan() { f16::NAN } else { sum };
                        assert_eq!(sum.to_bits(), dot_body_scalar(row, b).to_bits());
                    }
                }
                for v in [0.3f32, -1.7, 1e-3, 7.5, 65000.0] {
                    let (mut native, mut twin) = (y.clone(), y.clone());
                    // SAFETY: as above; `n` is a multiple of 32.
                    unsafe { half_native::mad(&mut native, &x, f16::from_f32(v)) };
                    mad_body_scalar(&mut twin, &x, v);
                    assert_eq!(bits(&native), bits(&twin), "mad n {n} seed {seed} v {v}");
                    // SAFETY: as above.
                    unsafe { half_native::scale(&mut native, f16::from_f32(v)) };
                    scale_body_scalar(&mut twin, v);
                    assert_eq!(bits(&native), bits(&twin), "scale n {n} seed {seed} v {v}");
                }
            }
        }
    }

    #[test]
    fn fast_kernels_equal_their_scalar_twins_bit_for_bit() {
        for n in [128, 256, 384, 130, 300] {
            for seed in 0..20u32 {
                let x = spread(n, seed);
                let y = spread(n, seed.wrapping_mul(7919) + 1);
                assert_eq!(
                    dot_body(&x, &y).to_bits(),
                    dot_body_scalar(&x, &y).to_bits(),
                    "dot n {n} seed {seed}"
                );
                for v in [0.3f32, -1.7, 1e-3, 0.999, 7.5] {
                    let (mut fast_y, mut twin_y) = (y.clone(), y.clone());
                    mad_body(&mut fast_y, &x, v);
                    mad_body_scalar(&mut twin_y, &x, v);
                    assert_eq!(fast_y, twin_y, "mad n {n} seed {seed} v {v}");
                    scale_body(&mut fast_y, v);
                    scale_body_scalar(&mut twin_y, v);
                    assert_eq!(fast_y, twin_y, "scale n {n} seed {seed} v {v}");
                }
            }
        }
    }
}
