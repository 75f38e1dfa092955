//! Dequantizers of the 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, IQ4_NL.
//!
//! In every 4/5-bit format byte `j` of `qs` holds element `j` in its low nibble and element
//! `j + 16` in its high nibble; the fifth bit of element `j` is bit `j` of `qh`.
//! Each row function writes `32 * blocks.len()` values to `out`.

use crate::blocks::{
    BlockIQ4NL, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, KVALUES_IQ4NL,
};

/// Q4_0: `x = d * (q - 8)`.
pub fn dequantize_row_q4_0(blocks: &[BlockQ4_0], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * 32);
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = block.d.to_f32();
        for (j, &byte) in block.qs.iter().enumerate() {
            let x0 = i32::from(byte & 0x0f) - 8;
            let x1 = i32::from(byte >> 4) - 8;
            y[j] = x0 as f32 * d;
            y[j + 16] = x1 as f32 * d;
        }
    }
}

/// Q4_1: `x = d * q + m`.
pub fn dequantize_row_q4_1(blocks: &[BlockQ4_1], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * 32);
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = block.d.to_f32();
        let m = block.m.to_f32();
        for (j, &byte) in block.qs.iter().enumerate() {
            y[j] = f32::from(byte & 0x0f) * d + m;
            y[j + 16] = f32::from(byte >> 4) * d + m;
        }
    }
}

/// Q5_0: `x = d * (q - 16)`, q five bits.
pub fn dequantize_row_q5_0(blocks: &[BlockQ5_0], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * 32);
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = block.d.to_f32();
        let qh = u32::from_le_bytes(block.qh);
        for (j, &byte) in block.qs.iter().enumerate() {
            let high0 = (((qh >> j) << 4) & 0x10) as u8;
            let high1 = ((qh >> (j + 12)) & 0x10) as u8;
            let x0 = i32::from((byte & 0x0f) | high0) - 16;
            let x1 = i32::from((byte >> 4) | high1) - 16;
            y[j] = x0 as f32 * d;
            y[j + 16] = x1 as f32 * d;
        }
    }
}

/// Q5_1: `x = d * q + m`, q five bits.
pub fn dequantize_row_q5_1(blocks: &[BlockQ5_1], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * 32);
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = block.d.to_f32();
        let m = block.m.to_f32();
        let qh = u32::from_le_bytes(block.qh);
        for (j, &byte) in block.qs.iter().enumerate() {
            let high0 = (((qh >> j) << 4) & 0x10) as u8;
            let high1 = ((qh >> (j + 12)) & 0x10) as u8;
            y[j] = f32::from((byte & 0x0f) | high0) * d + m;
            y[j + 16] = f32::from((byte >> 4) | high1) * d + m;
        }
    }
}

/// Q8_0: `x = d * q`.
pub fn dequantize_row_q8_0(blocks: &[BlockQ8_0], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * 32);
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = block.d.to_f32();
        for (value, &q) in y.iter_mut().zip(block.qs.iter()) {
            *value = f32::from(q) * d;
        }
    }
}

/// Q8_1: `x = d * q` (the block sum `s` is not needed to dequantize).
pub fn dequantize_row_q8_1(blocks: &[BlockQ8_1], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * 32);
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = block.d.to_f32();
        for (value, &q) in y.iter_mut().zip(block.qs.iter()) {
            *value = f32::from(q) * d;
        }
    }
}

/// IQ4_NL: `x = d * KVALUES_IQ4NL[q]`.
pub fn dequantize_row_iq4_nl(blocks: &[BlockIQ4NL], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * 32);
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = block.d.to_f32();
        for (j, &byte) in block.qs.iter().enumerate() {
            y[j] = d * f32::from(KVALUES_IQ4NL[usize::from(byte & 0x0f)]);
            y[j + 16] = d * f32::from(KVALUES_IQ4NL[usize::from(byte >> 4)]);
        }
    }
}
