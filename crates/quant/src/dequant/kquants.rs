//! Dequantizers of the 256-element super-block formats: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K
//! and IQ4_XS.
//!
//! The 2/3/6-bit formats pack four 32-element groups into each 32-byte run of `qs`
//! (element `l + 32 * g` of a 128-element half sits at bits `2g..2g+2` of byte `l`);
//! Q4_K/Q5_K pack two 32-element groups per 32-byte run (low nibble, then high nibble).
//! Each row function writes `256 * blocks.len()` values to `out`.

use crate::blocks::{
    BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, KVALUES_IQ4NL,
};

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes of Q4_K/Q5_K: six bits
/// each; sub-blocks 4..8 keep their low four bits in bytes 8..12 and their top two bits in
/// the top bits of bytes 0..8.
pub(crate) fn scale_min_k4(j: usize, packed: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (packed[j] & 63, packed[j + 4] & 63)
    } else {
        let scale = (packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4);
        let min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
        (scale, min)
    }
}

/// Signed scale of sub-block `j` (0..16) from the 12 packed bytes of Q3_K: low four bits in
/// bytes 0..8 (sub-blocks 8..16 in the high nibbles), top two bits in bytes 8..12; stored
/// with a bias of 32.
pub(crate) fn q3_k_scale(j: usize, packed: &[u8; 12]) -> i8 {
    let low = if j < 8 {
        packed[j] & 0x0f
    } else {
        packed[j - 8] >> 4
    };
    let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    ((low | (high << 4)) as i8) - 32
}

/// Q2_K: `x = d * sc * q - dmin * m` per 16-element sub-block.
pub fn dequantize_row_q2_k(blocks: &[BlockQ2K], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * 256);
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d = block.d.to_f32();
        let min = block.dmin.to_f32();
        let mut at = 0;
        let mut sub_block = 0;
        for half in 0..2 {
            let q = &block.qs[32 * half..32 * half + 32];
            for shift in [0, 2, 4, 6] {
                for part in 0..2 {
                    let scale = block.scales[sub_block];
                    sub_block += 1;
                    let dl = d * f32::from(scale & 0x0f);
                    let ml = min * f32::from(scale >> 4);
                    for &byte in &q[16 * part..16 * part + 16] {
                        y[at] = dl * f32::from((byte >> shift) & 3) - ml;
                        at += 1;
                    }
                }
            }
        }
    }
}

/// Q3_K: `x = d * (sc - 32) * (q - 4 * !h)`, `h` the element's bit in `hmask`.
pub fn dequantize_row_q3_k(blocks: &[BlockQ3K], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * 256);
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d_all = block.d.to_f32();
        let mut at = 0;
        let mut sub_block = 0;
        let mut mask = 1u8;
        for half in 0..2 {
            let q = &block.qs[32 * half..32 * half + 32];
            for shift in [0, 2, 4, 6] {
                for part in 0..2 {
                    let dl = d_all * f32::from(q3_k_scale(sub_block, &block.scales));
                    sub_block += 1;
                    let range = 16 * part..16 * part + 16;
                    for (&byte, &high) in q[range.clone()].iter().zip(&block.hmask[range]) {
                        let low = ((byte >> shift) & 3) as i8;
                        let offset = if high & mask != 0 { 0 } else { 4 };
                        y[at] = dl * f32::from(low - offset);
                        at += 1;
                    }
                }
                mask <<= 1;
            }
        }
    }
}

/// Q4_K: `x = d * sc * q - dmin * m` per 32-element sub-block.
pub fn dequantize_row_q4_k(blocks: &[BlockQ4K], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * 256);
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d = block.d.to_f32();
        let min = block.dmin.to_f32();
        for (pair, y) in y.chunks_exact_mut(64).enumerate() {
            let q = &block.qs[32 * pair..32 * pair + 32];
            let (scale, m) = scale_min_k4(2 * pair, &block.scales);
            let (d1, m1) = (d * f32::from(scale), min * f32::from(m));
            let (scale, m) = scale_min_k4(2 * pair + 1, &block.scales);
            let (d2, m2) = (d * f32::from(scale), min * f32::from(m));
            for (l, &byte) in q.iter().enumerate() {
                y[l] = d1 * f32::from(byte & 0x0f) - m1;
                y[l + 32] = d2 * f32::from(byte >> 4) - m2;
            }
        }
    }
}

/// Q5_K: Q4_K with a fifth bit per element from `qh`.
pub fn dequantize_row_q5_k(blocks: &[BlockQ5K], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * 256);
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d = block.d.to_f32();
        let min = block.dmin.to_f32();
        for (pair, y) in y.chunks_exact_mut(64).enumerate() {
            let ql = &block.qs[32 * pair..32 * pair + 32];
            let (bit1, bit2) = (1u8 << (2 * pair), 2u8 << (2 * pair));
            let (scale, m) = scale_min_k4(2 * pair, &block.scales);
            let (d1, m1) = (d * f32::from(scale), min * f32::from(m));
            let (scale, m) = scale_min_k4(2 * pair + 1, &block.scales);
            let (d2, m2) = (d * f32::from(scale), min * f32::from(m));
            for (l, &byte) in ql.iter().enumerate() {
                let high1 = if block.qh[l] & bit1 != 0 { 16 } else { 0 };
                let high2 = if block.qh[l] & bit2 != 0 { 16 } else { 0 };
                y[l] = d1 * f32::from((byte & 0x0f) + high1) - m1;
                y[l + 32] = d2 * f32::from((byte >> 4) + high2) - m2;
            }
        }
    }
}

/// Q6_K: `x = d * sc * (q - 32)` per 16-element sub-block, q six bits.
pub fn dequantize_row_q6_k(blocks: &[BlockQ6K], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * 256);
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d = block.d.to_f32();
        for (half, y) in y.chunks_exact_mut(128).enumerate() {
            let ql = &block.ql[64 * half..64 * half + 64];
            let qh = &block.qh[32 * half..32 * half + 32];
            let sc = &block.scales[8 * half..8 * half + 8];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i8 - 32;
                let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                y[l] = d * f32::from(sc[is]) * f32::from(q1);
                y[l + 32] = d * f32::from(sc[is + 2]) * f32::from(q2);
                y[l + 64] = d * f32::from(sc[is + 4]) * f32::from(q3);
                y[l + 96] = d * f32::from(sc[is + 6]) * f32::from(q4);
            }
        }
    }
}

/// Q8_K: `x = d * q`, `d` stored as f32.
pub fn dequantize_row_q8_k(blocks: &[BlockQ8K], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * 256);
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        for (value, &q) in y.iter_mut().zip(block.qs.iter()) {
            *value = block.d * f32::from(q);
        }
    }
}

/// IQ4_XS: `x = d * (ls - 32) * KVALUES_IQ4NL[q]` per 32-element sub-block.
pub fn dequantize_row_iq4_xs(blocks: &[BlockIQ4XS], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * 256);
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d = block.d.to_f32();
        let scales_h = block.scales_h;
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let low = (block.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
            let high = ((scales_h >> (2 * ib)) & 3) as u8;
            let dl = d * f32::from(i16::from(low | (high << 4)) - 32);
            let qs = &block.qs[16 * ib..16 * ib + 16];
            for (j, &byte) in qs.iter().enumerate() {
                y[j] = dl * f32::from(KVALUES_IQ4NL[usize::from(byte & 0x0f)]);
                y[j + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(byte >> 4)]);
            }
        }
    }
}
