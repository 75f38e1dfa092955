//! Scalar twins of the float dot products (F32 x F32, F16 x F16, BF16 x BF16).
//!
//! These do not try to copy a ggml routine (ggml-cpu takes several different paths for float
//! weights); they fix one order that the SIMD kernels reproduce: element `i` goes to lane
//! `i % 32` by FMA, and the 32 lanes are reduced as `t = l[0..16] + l[16..32]`,
//! `u = t[0..8] + t[8..16]`, then ggml's `hsum_float_8(u)`. Products of two f16 or two bf16
//! values are exact in f32, so for those types only the summation rounds.

use super::lanes::{hsum8, Lanes};
use crate::dequant::bf16_bits_to_f32;

/// Lanes of the float kernels.
pub(crate) const FLOAT_LANES: usize = 32;

/// Reduces 32 lanes in the order described in the module documentation.
pub(crate) fn reduce32(lanes: &[f32; FLOAT_LANES]) -> f32 {
    let mut sixteen = [0.0f32; 16];
    for i in 0..16 {
        sixteen[i] = lanes[i] + lanes[i + 16];
    }
    let mut eight: Lanes = [0.0; 8];
    for j in 0..8 {
        eight[j] = sixteen[j] + sixteen[j + 8];
    }
    hsum8(&eight)
}

/// Accumulates elements `start..n` into `lanes` (the SIMD kernels finish their tails here).
pub(crate) fn accumulate_tail(
    lanes: &mut [f32; FLOAT_LANES],
    start: usize,
    n: usize,
    weight: impl Fn(usize) -> f32,
    activation: impl Fn(usize) -> f32,
) {
    for i in start..n {
        let lane = &mut lanes[i % FLOAT_LANES];
        *lane = weight(i).mul_add(activation(i), *lane);
    }
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

/// F32 x F32.
pub(crate) fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    checked_len(n, 4, w, a);
    let mut lanes = [0.0f32; FLOAT_LANES];
    accumulate_tail(&mut lanes, 0, n, |i| f32_at(w, i), |i| f32_at(a, i));
    reduce32(&lanes)
}

/// F16 x F16.
pub(crate) fn dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    checked_len(n, 2, w, a);
    let mut lanes = [0.0f32; FLOAT_LANES];
    accumulate_tail(
        &mut lanes,
        0,
        n,
        |i| f16_element(w, i),
        |i| f16_element(a, i),
    );
    reduce32(&lanes)
}

/// BF16 x BF16.
pub(crate) fn dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    checked_len(n, 2, w, a);
    let mut lanes = [0.0f32; FLOAT_LANES];
    accumulate_tail(
        &mut lanes,
        0,
        n,
        |i| bf16_element(w, i),
        |i| bf16_element(a, i),
    );
    reduce32(&lanes)
}
