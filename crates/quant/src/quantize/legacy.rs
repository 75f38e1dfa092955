//! Reference quantizers of the 32-element weight formats Q4_0, Q4_1, Q5_0 and Q5_1: ggml's
//! `quantize_row_*_ref`, which llama-quantize runs when no importance matrix is given.
//!
//! The scale comes from the block's extremes and is stored as f16, but the quants are
//! computed from the unrounded f32 scale, truncating `x / d + offset + 0.5` toward zero,
//! exactly as ggml does; the output is byte-identical to ggml's.

use half::f16;

use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1};

/// The element of largest magnitude (the first one on ties).
fn signed_absolute_max(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &value in x {
        if amax < value.abs() {
            amax = value.abs();
            max = value;
        }
    }
    max
}

/// Smallest and largest element.
fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &value in x {
        if value < min {
            min = value;
        }
        if value > max {
            max = value;
        }
    }
    (min, max)
}

/// Inverse of `d`, or 0 for a zero scale.
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Packs five-bit quants: low nibbles into `qs` (element `j` low, `j + 16` high), fifth
/// bits into the 32-bit `qh`.
fn pack_five_bits(quants: &[u8; 32], qs: &mut [u8; 16]) -> [u8; 4] {
    let mut qh = 0u32;
    for j in 0..16 {
        let (q0, q1) = (quants[j], quants[j + 16]);
        qs[j] = (q0 & 0x0f) | ((q1 & 0x0f) << 4);
        qh |= u32::from((q0 & 0x10) >> 4) << j;
        qh |= u32::from((q1 & 0x10) >> 4) << (j + 16);
    }
    qh.to_le_bytes()
}

/// Q4_0: `d = max / -8` (max = the signed element of largest magnitude), `q = x / d + 8`.
pub fn quantize_row_q4_0(x: &[f32], y: &mut [BlockQ4_0]) {
    debug_assert_eq!(x.len(), y.len() * 32);
    for (x, block) in x.chunks_exact(32).zip(y.iter_mut()) {
        let d = signed_absolute_max(x) / -8.0;
        let id = inverse(d);
        block.d = f16::from_f32(d);
        for j in 0..16 {
            let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
            block.qs[j] = q0 | (q1 << 4);
        }
    }
}

/// Q4_1: `d = (max - min) / 15`, `m = min`, `q = (x - min) / d`.
pub fn quantize_row_q4_1(x: &[f32], y: &mut [BlockQ4_1]) {
    debug_assert_eq!(x.len(), y.len() * 32);
    for (x, block) in x.chunks_exact(32).zip(y.iter_mut()) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = inverse(d);
        block.d = f16::from_f32(d);
        block.m = f16::from_f32(min);
        for j in 0..16 {
            let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
            block.qs[j] = q0 | (q1 << 4);
        }
    }
}

/// Q5_0: `d = max / -16`, `q = x / d + 16`.
pub fn quantize_row_q5_0(x: &[f32], y: &mut [BlockQ5_0]) {
    debug_assert_eq!(x.len(), y.len() * 32);
    for (x, block) in x.chunks_exact(32).zip(y.iter_mut()) {
        let d = signed_absolute_max(x) / -16.0;
        let id = inverse(d);
        block.d = f16::from_f32(d);
        let mut quants = [0u8; 32];
        for (q, &value) in quants.iter_mut().zip(x) {
            *q = ((value * id + 16.5) as i8).min(31) as u8;
        }
        block.qh = pack_five_bits(&quants, &mut block.qs);
    }
}

/// Q5_1: `d = (max - min) / 31`, `m = min`, `q = (x - min) / d`.
pub fn quantize_row_q5_1(x: &[f32], y: &mut [BlockQ5_1]) {
    debug_assert_eq!(x.len(), y.len() * 32);
    for (x, block) in x.chunks_exact(32).zip(y.iter_mut()) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = inverse(d);
        block.d = f16::from_f32(d);
        block.m = f16::from_f32(min);
        let mut quants = [0u8; 32];
        for (q, &value) in quants.iter_mut().zip(x) {
            *q = ((value - min) * id + 0.5) as u8;
        }
        block.qh = pack_five_bits(&quants, &mut block.qs);
    }
}
