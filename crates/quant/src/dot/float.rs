//! Scalar twins of the float dot products (F32 x F32, F16 x F16, BF16 x BF16), in the order of
//! ggml-cpu's AVX-512 `ggml_vec_dot_{f32,f16,bf16}` (what llama.cpp runs for one activation
//! row, or for any row count where tinyBLAS declines).
//!
//! F32 (`GGML_F32_STEP` = 64, four 16-lane accumulators): element `i < n - n % 64` goes by
//! FMA into accumulator `(i / 16) % 4`, lane `i % 16`; then `acc0 += acc2`, `acc1 += acc3`,
//! `acc0 += acc1` and `_mm512_reduce_add_ps(acc0)` ([`reduce16`]). The last `n % 64`
//! products are added one by one in f32 (fused, as gcc contracts `sumf += x[i]*y[i]`).
//!
//! F16: the reference CPU has AVX512-FP16, so `GGML_F16_STEP` is 128 and the first
//! `n - n % 128` products are summed in native f16 arithmetic ([`half_arith`]); the f16
//! result starts an f64 sum of the remaining products, which is then rounded to f32.
//!
//! F16 at the AVX2 levels ([`super::HalfSums::Lanes8`], ggml-cpu's AVX2 build): element
//! `i < n - n % 32` goes by FMA into accumulator `(i / 8) % 4`, lane `i % 8`; then
//! `acc0 += acc2`, `acc1 += acc3`, `acc0 += acc1`, the upper four lanes onto the lower four and
//! two `hadd`s ([`reduce_lanes8`]); that f32 starts the f64 sum of the leftover products.
//!
//! BF16 (AVX512_BF16): per 64 elements, `vdpbf16ps` of elements `[i, i + 32)` into `c1` and of
//! `[i + 32, i + 64)` into `c2` (lane `q` takes the odd element `2q + 1` first, then `2q`);
//! the sum is `f64(reduce(c1)) + f64(reduce(c2))` plus the leftover products in f64, rounded
//! to f32. Products of two f16 or two bf16 values are exact in f32.

use half::f16;

use super::half_arith;
use super::lanes::{hsum8, Lanes};
use crate::dequant::bf16_bits_to_f32;

/// Elements per step of the float kernels (four 16-lane accumulators).
pub(crate) const FLOAT_STEP: usize = 64;

/// `_mm512_reduce_add_ps` as gcc expands it: upper eight lanes onto the lower eight, then
/// `hsum_float_8`.
pub(crate) fn reduce16(lanes: &[f32; 16]) -> f32 {
    let eight: Lanes = std::array::from_fn(|q| lanes[q] + lanes[q + 8]);
    hsum8(&eight)
}

/// Flushes an f32 denormal to a zero of the same sign (`vdpbf16ps`'s DAZ and FTZ).
fn flush_denormal(x: f32) -> f32 {
    if x.is_subnormal() {
        f32::from_bits(x.to_bits() & 0x8000_0000)
    } else {
        x
    }
}

/// One `vdpbf16ps` lane step: `acc + w[1] * x[1]`, then `+ w[0] * x[0]`, each fused, with
/// denormal inputs read as zero and denormal results flushed.
fn dpbf16_lane(acc: f32, w: [f32; 2], x: [f32; 2]) -> f32 {
    let first =
        flush_denormal(flush_denormal(w[1]).mul_add(flush_denormal(x[1]), flush_denormal(acc)));
    flush_denormal(flush_denormal(w[0]).mul_add(flush_denormal(x[0]), first))
}

/// The four 16-lane accumulators of `ggml_vec_dot_f32/f16`, reduced as ggml does.
pub(crate) fn reduce_four(acc: &[[f32; 16]; 4]) -> f32 {
    let mut first = acc[0];
    let mut second = acc[1];
    for q in 0..16 {
        first[q] += acc[2][q];
        second[q] += acc[3][q];
    }
    for q in 0..16 {
        first[q] += second[q];
    }
    reduce16(&first)
}

fn checked_len(n: usize, element_bytes: usize, w: &[u8], a: &[u8]) {
    assert!(
        w.len() >= n * element_bytes && a.len() >= n * element_bytes,
        "float rows of {} and {} bytes are shorter than {n} elements",
        w.len(),
        a.len()
    );
}

pub(crate) fn f32_at(bytes: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([
        bytes[4 * i],
        bytes[4 * i + 1],
        bytes[4 * i + 2],
        bytes[4 * i + 3],
    ])
}

pub(crate) fn f16_element(bytes: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32()
}

pub(crate) fn bf16_element(bytes: &[u8], i: usize) -> f32 {
    bf16_bits_to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]))
}

/// The four accumulators after the whole 64-element steps.
fn steps_of_four(
    n: usize,
    weight: impl Fn(usize) -> f32,
    activation: impl Fn(usize) -> f32,
) -> [[f32; 16]; 4] {
    let mut acc = [[0.0f32; 16]; 4];
    for i in 0..n - n % FLOAT_STEP {
        let lane = &mut acc[(i / 16) % 4][i % 16];
        *lane = weight(i).mul_add(activation(i), *lane);
    }
    acc
}

/// F32 leftovers: `sum += w[i] * a[i]` (fused) for `i` in `start..n`.
pub(crate) fn f32_tail(mut sum: f32, start: usize, n: usize, w: &[u8], a: &[u8]) -> f32 {
    for i in start..n {
        sum = f32_at(w, i).mul_add(f32_at(a, i), sum);
    }
    sum
}

/// Leftovers of the f16 / bf16 kernels: exact f32 products summed in f64, rounded to f32.
pub(crate) fn f64_tail(
    mut sum: f64,
    start: usize,
    n: usize,
    weight: impl Fn(usize) -> f32,
    activation: impl Fn(usize) -> f32,
) -> f32 {
    for i in start..n {
        sum += f64::from(weight(i) * activation(i));
    }
    sum as f32
}

/// F32 x F32.
pub(crate) fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    checked_len(n, 4, w, a);
    let acc = steps_of_four(n, |i| f32_at(w, i), |i| f32_at(a, i));
    f32_tail(reduce_four(&acc), n - n % FLOAT_STEP, n, w, a)
}

/// F16 x F16 (scalar twin): the first `n - n % 128` products in native f16 arithmetic (see
/// [`half_arith`]), the rest added in f64, rounded to f32.
pub(crate) fn dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_f16_with(n, w, a, half_arith::dot_body_scalar, None)
}

/// Elements of one step of ggml-cpu's AVX2 F16 `vec_dot` (`GGML_F16_STEP`): four registers
/// of eight f32 lanes.
pub(crate) const LANES8_STEP: usize = 32;

/// F16 x F16 in ggml-cpu's AVX2 order (scalar twin of the AVX2 levels' F16 kernels, see the
/// module notes).
pub(crate) fn dot_f16_lanes8(n: usize, w: &[u8], a: &[u8]) -> f32 {
    checked_len(n, 2, w, a);
    let mut acc = [[0.0f32; 8]; 4];
    for i in 0..n - n % LANES8_STEP {
        let lane = &mut acc[(i / 8) % 4][i % 8];
        *lane = f16_element(w, i).mul_add(f16_element(a, i), *lane);
    }
    dot_f16_lanes8_finish(n, w, a, reduce_lanes8(&acc))
}

/// `GGML_F32x8_REDUCE` on ggml-cpu's AVX build: `acc0 + acc2` and `acc1 + acc3` added, the
/// upper four lanes onto the lower four, then `_mm_hadd_ps` twice.
pub(crate) fn reduce_lanes8(acc: &[[f32; 8]; 4]) -> f32 {
    let sum: [f32; 8] = std::array::from_fn(|q| (acc[0][q] + acc[2][q]) + (acc[1][q] + acc[3][q]));
    let quad: [f32; 4] = std::array::from_fn(|q| sum[q] + sum[q + 4]);
    (quad[0] + quad[1]) + (quad[2] + quad[3])
}

/// The end of [`dot_f16_lanes8`] from the reduced steps `start`: the leftover products in
/// f64, rounded to f32 (a NaN `start` as the positive one: lane order makes its sign).
pub(crate) fn dot_f16_lanes8_finish(n: usize, w: &[u8], a: &[u8], start: f32) -> f32 {
    let start = if start.is_nan() { f32::NAN } else { start };
    f64_tail(
        f64::from(start),
        n - n % LANES8_STEP,
        n,
        |i| f16_element(w, i),
        |i| f16_element(a, i),
    )
}

/// An exact leftover sum of F16 products from a start value, where one can be had (see
/// `x86::half::tail_sum_exact`).
pub(crate) type ExactTail = fn(&[f16], &[f16], f64) -> Option<f64>;

/// `ggml_vec_dot_f16` on an AVX512-FP16 machine, with `body` computing the native part and
/// `tail`, when given, the leftover sum where it can do so exactly (else it is added in
/// order).
pub(crate) fn dot_f16_with(
    n: usize,
    w: &[u8],
    a: &[u8],
    body: fn(&[f16], &[f16]) -> f16,
    tail: Option<ExactTail>,
) -> f32 {
    checked_len(n, 2, w, a);
    let native = half_arith::body_len(n);
    let start = if native > 0 {
        let bytes = 2 * native;
        let (w_row, a_row) = (f16_row(&w[..bytes]), f16_row(&a[..bytes]));
        body(&w_row, &a_row)
    } else {
        f16::ZERO
    };
    dot_f16_finish(n, w, a, start, tail)
}

/// The end of [`dot_f16_with`]: the leftover sum from `start`, the native part's result
/// (`w` and `a` hold `n` elements, checked by the caller).
pub(crate) fn dot_f16_finish(
    n: usize,
    w: &[u8],
    a: &[u8],
    start: f16,
    tail: Option<ExactTail>,
) -> f32 {
    let native = half_arith::body_len(n);
    let start = f64::from(start);
    if let Some(tail) = tail.filter(|_| native < n) {
        let (w_rest, a_rest) = (
            f16_row(&w[2 * native..2 * n]),
            f16_row(&a[2 * native..2 * n]),
        );
        if let Some(sum) = tail(&w_rest, &a_rest, start) {
            return sum as f32;
        }
    }
    f64_tail(
        start,
        native,
        n,
        |i| f16_element(w, i),
        |i| f16_element(a, i),
    )
}

/// `bytes` as f16 values: borrowed when aligned, copied otherwise.
pub(crate) fn f16_row(bytes: &[u8]) -> std::borrow::Cow<'_, [f16]> {
    match bytemuck::try_cast_slice::<u8, f16>(bytes) {
        Ok(values) => std::borrow::Cow::Borrowed(values),
        Err(_) => std::borrow::Cow::Owned(
            bytes
                .chunks_exact(2)
                .map(|pair| f16::from_le_bytes([pair[0], pair[1]]))
                .collect(),
        ),
    }
}

/// BF16 x BF16.
pub(crate) fn dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    checked_len(n, 2, w, a);
    let mut halves = [[0.0f32; 16]; 2];
    for step in (0..n - n % FLOAT_STEP).step_by(FLOAT_STEP) {
        for (h, lanes) in halves.iter_mut().enumerate() {
            let base = step + 32 * h;
            for (q, lane) in lanes.iter_mut().enumerate() {
                let (even, odd) = (base + 2 * q, base + 2 * q + 1);
                *lane = dpbf16_lane(
                    *lane,
                    [bf16_element(w, even), bf16_element(w, odd)],
                    [bf16_element(a, even), bf16_element(a, odd)],
                );
            }
        }
    }
    let sum = f64::from(reduce16(&halves[0])) + f64::from(reduce16(&halves[1]));
    f64_tail(
        sum,
        n - n % FLOAT_STEP,
        n,
        |i| bf16_element(w, i),
        |i| bf16_element(a, i),
    )
}
