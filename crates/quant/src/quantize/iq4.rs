//! Quantizers of the non-linear 4-bit formats IQ4_NL and IQ4_XS, as llama-quantize runs
//! them without an importance matrix (ggml's `quantize_iq4_nl` / `quantize_iq4_xs`, weights
//! `x^2`, 15 candidate scales per 32-element block).

use half::f16;

use super::search::{best_index_int8, nearest_int, GROUP_MAX_EPS};
use crate::blocks::{BlockIQ4NL, BlockIQ4XS, KVALUES_IQ4NL};

/// Candidate scales tried on each side of the first guess.
const SCALE_TRIES: i32 = 7;

/// Best scale for one 32-element block against the IQ4 grid (0 for an all-zero block),
/// with the grid indices chosen for the first guess in `levels`.
fn best_block_scale(x: &[f32], levels: &mut [u8]) -> f32 {
    let values = &KVALUES_IQ4NL;
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &value in x {
        if value.abs() > amax {
            amax = value.abs();
            max = value;
        }
    }
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let fit = |id: f32, levels: Option<&mut [u8]>| {
        let mut sumqx = 0.0f32;
        let mut sumq2 = 0.0f32;
        let mut levels = levels;
        for (j, &value) in x.iter().enumerate() {
            let l = best_index_int8(values, id * value);
            if let Some(levels) = levels.as_deref_mut() {
                levels[j] = l as u8;
            }
            let q = f32::from(values[l]);
            let w = value * value;
            sumqx += w * q * value;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let d = -max / f32::from(values[0]);
    let (sumqx, sumq2) = fit(1.0 / d, Some(levels));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for attempt in -SCALE_TRIES..=SCALE_TRIES {
        let id = (attempt + i32::from(values[0])) as f32 / max;
        let (sumqx, sumq2) = fit(id, None);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs 4-bit grid indices: byte `j` of each 16-byte run holds element `j` (low nibble)
/// and `j + 16` (high nibble) of its 32-element block.
fn pack_nibbles(levels: &[u8], qs: &mut [u8]) {
    for (block, q) in levels.chunks_exact(32).zip(qs.chunks_exact_mut(16)) {
        for j in 0..16 {
            q[j] = block[j] | (block[j + 16] << 4);
        }
    }
}

/// IQ4_NL: one f16 scale per 32 elements, `x ~ d * KVALUES_IQ4NL[q]`.
pub fn quantize_row_iq4_nl(x: &[f32], y: &mut [BlockIQ4NL]) {
    debug_assert_eq!(x.len(), y.len() * 32);
    let mut levels = [0u8; 32];
    for (x, block) in x.chunks_exact(32).zip(y.iter_mut()) {
        let scale = best_block_scale(x, &mut levels);
        block.d = f16::from_f32(scale);
        let id = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        for (level, &value) in levels.iter_mut().zip(x) {
            *level = best_index_int8(&KVALUES_IQ4NL, id * value) as u8;
        }
        pack_nibbles(&levels, &mut block.qs);
    }
}

/// IQ4_XS: 8 blocks of 32 with 6-bit scales (bias 32) against one f16 super-scale.
pub fn quantize_row_iq4_xs(x: &[f32], y: &mut [BlockIQ4XS]) {
    debug_assert_eq!(x.len(), y.len() * 256);
    let mut levels = [0u8; 256];
    for (x, block) in x.chunks_exact(256).zip(y.iter_mut()) {
        let mut scales = [0.0f32; 8];
        let mut max_scale = 0.0f32;
        let mut amax_scale = 0.0f32;
        for (ib, scale) in scales.iter_mut().enumerate() {
            let range = 32 * ib..32 * ib + 32;
            *scale = best_block_scale(&x[range.clone()], &mut levels[range]);
            if scale.abs() > amax_scale {
                amax_scale = scale.abs();
                max_scale = *scale;
            }
        }
        let d = -max_scale / 32.0;
        block.d = f16::from_f32(d);
        block.scales_h = 0;
        block.scales_l = [0; 4];
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (ib, &scale) in scales.iter().enumerate() {
            let l = nearest_int(id * scale).clamp(-32, 31);
            let dl = d * l as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for i in 32 * ib..32 * ib + 32 {
                levels[i] = best_index_int8(&KVALUES_IQ4NL, idl * x[i]) as u8;
            }
            let biased = (l + 32) as u8;
            block.scales_l[ib / 2] |= (biased & 0x0f) << (4 * (ib % 2));
            block.scales_h |= u16::from(biased >> 4) << (2 * ib);
        }
        pack_nibbles(&levels, &mut block.qs);
    }
}
