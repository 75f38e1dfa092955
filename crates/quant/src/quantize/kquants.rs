//! Reference quantizers of the K-quant weight formats Q2_K, Q3_K, Q4_K, Q5_K and Q6_K:
//! ggml's `quantize_row_q*_K_ref`, which llama-quantize runs when no importance matrix is
//! given. Each super-block of 256 is split into sub-blocks whose scales (and mins) are
//! searched in f32, then themselves quantized to 4/6/8 bits against one f16 super-scale;
//! the elements are finally re-rounded against the scales as stored.

use half::f16;

use super::search::GROUP_MAX_EPS;
use super::search::{make_q3_quants, make_qkx2_quants, make_qx_quants, nearest_int, Sweep};
use crate::blocks::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K};
use crate::dequant::{q3_k_scale, scale_min_k4};

/// Packs 2-bit levels of a 256-element super-block: byte `l` of each 32-byte run holds
/// elements `l`, `l + 32`, `l + 64`, `l + 96` of its 128-element half.
fn pack_two_bits(levels: &[u8; 256], qs: &mut [u8; 64]) {
    for half in 0..2 {
        let level = &levels[128 * half..128 * half + 128];
        for l in 0..32 {
            qs[32 * half + l] =
                level[l] | (level[l + 32] << 2) | (level[l + 64] << 4) | (level[l + 96] << 6);
        }
    }
}

/// Packs six-bit sub-block scales and mins into Q4_K/Q5_K's 12 bytes (see `scale_min_k4`).
fn pack_scales_k4(scales: &[u8; 8], mins: &[u8; 8]) -> [u8; 12] {
    let mut packed = [0u8; 12];
    for j in 0..8 {
        let (ls, lm) = (scales[j], mins[j]);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0x0f) | ((lm & 0x0f) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    packed
}

/// Q2_K: per 16 elements a 4-bit scale and a 4-bit min, searched with weights `|x|`
/// minimising the absolute error.
pub fn quantize_row_q2_k(x: &[f32], y: &mut [BlockQ2K]) {
    debug_assert_eq!(x.len(), y.len() * 256);
    const Q4_SCALE: f32 = 15.0;
    let sweep = Sweep {
        rmin: -0.5,
        rdelta: 0.1,
        steps: 15,
        use_mad: true,
    };
    let mut levels = [0u8; 256];
    let mut scratch = [0u8; 16];
    let mut weights = [0.0f32; 16];
    for (x, block) in x.chunks_exact(256).zip(y.iter_mut()) {
        let mut scales = [0.0f32; 16];
        let mut mins = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            for (w, &value) in weights.iter_mut().zip(xs) {
                *w = value.abs();
            }
            let level = &mut levels[16 * j..16 * j + 16];
            (scales[j], mins[j]) = make_qkx2_quants(3, xs, &weights, level, &mut scratch, &sweep);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        if max_scale > 0.0 {
            let iscale = Q4_SCALE / max_scale;
            for (packed, &scale) in block.scales.iter_mut().zip(&scales) {
                *packed = nearest_int(iscale * scale) as u8;
            }
            block.d = f16::from_f32(max_scale / Q4_SCALE);
        } else {
            block.scales = [0; 16];
            block.d = f16::from_f32(0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4_SCALE / max_min;
            for (packed, &min) in block.scales.iter_mut().zip(&mins) {
                *packed |= (nearest_int(iscale * min) as u8) << 4;
            }
            block.dmin = f16::from_f32(max_min / Q4_SCALE);
        } else {
            block.dmin = f16::from_f32(0.0);
        }
        for j in 0..16 {
            let d = block.d.to_f32() * f32::from(block.scales[j] & 0x0f);
            if d == 0.0 {
                continue;
            }
            let dm = block.dmin.to_f32() * f32::from(block.scales[j] >> 4);
            for i in 16 * j..16 * j + 16 {
                levels[i] = nearest_int((x[i] + dm) / d).clamp(0, 3) as u8;
            }
        }
        pack_two_bits(&levels, &mut block.qs);
    }
}

/// Q3_K: per 16 elements a signed 6-bit scale, quants in -4..4 (2 bits in `qs`, the high
/// bit in `hmask`).
pub fn quantize_row_q3_k(x: &[f32], y: &mut [BlockQ3K]) {
    debug_assert_eq!(x.len(), y.len() * 256);
    let mut levels = [0i8; 256];
    for (x, block) in x.chunks_exact(256).zip(y.iter_mut()) {
        let mut scales = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let mut amax = 0.0f32;
        for j in 0..16 {
            scales[j] =
                make_q3_quants(4, &x[16 * j..16 * j + 16], &mut levels[16 * j..16 * j + 16]);
            if scales[j].abs() > amax {
                amax = scales[j].abs();
                max_scale = scales[j];
            }
        }
        block.scales = [0; 12];
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for (j, &scale) in scales.iter().enumerate() {
                let l = ((nearest_int(iscale * scale) as i8).clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    block.scales[j] = l & 0x0f;
                } else {
                    block.scales[j - 8] |= (l & 0x0f) << 4;
                }
                block.scales[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
            }
            block.d = f16::from_f32(1.0 / iscale);
        } else {
            block.d = f16::from_f32(0.0);
        }
        for j in 0..16 {
            let d = block.d.to_f32() * f32::from(q3_k_scale(j, &block.scales));
            if d == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                levels[i] = (nearest_int(x[i] / d).clamp(-4, 3) + 4) as i8;
            }
        }
        // High bit of element j goes to bit j / 32 of hmask[j % 32].
        block.hmask = [0; 32];
        let mut unsigned = [0u8; 256];
        for (j, (&level, low)) in levels.iter().zip(unsigned.iter_mut()).enumerate() {
            let mut level = level as u8;
            if level > 3 {
                block.hmask[j % 32] |= 1 << (j / 32);
                level -= 4;
            }
            *low = level;
        }
        pack_two_bits(&unsigned, &mut block.qs);
    }
}

/// Shared body of Q4_K and Q5_K: per 32 elements a 6-bit scale and a 6-bit min, searched
/// with weights `rms(sub-block) + |x|`. Returns the levels (`0..=nmax`) and packed fields.
fn quantize_scale_min_k(
    x: &[f32],
    nmax: i32,
    sweep: &Sweep,
    levels: &mut [u8; 256],
) -> (f16, f16, [u8; 12]) {
    let mut scratch = [0u8; 32];
    let mut weights = [0.0f32; 32];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &value in xs {
            sum_x2 += value * value;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &value) in weights.iter_mut().zip(xs) {
            *w = av_x + value.abs();
        }
        let level = &mut levels[32 * j..32 * j + 32];
        (scales[j], mins[j]) = make_qkx2_quants(nmax, xs, &weights, level, &mut scratch, sweep);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut scale_levels = [0u8; 8];
    let mut min_levels = [0u8; 8];
    for j in 0..8 {
        scale_levels[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        min_levels[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    let packed = pack_scales_k4(&scale_levels, &min_levels);
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);
    for j in 0..8 {
        let (scale, min) = scale_min_k4(j, &packed);
        let d = d.to_f32() * f32::from(scale);
        if d == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * f32::from(min);
        for i in 32 * j..32 * j + 32 {
            levels[i] = nearest_int((x[i] + dm) / d).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed)
}

/// Q4_K: 8 sub-blocks of 32 with 6-bit scales and mins, 4-bit quants.
pub fn quantize_row_q4_k(x: &[f32], y: &mut [BlockQ4K]) {
    debug_assert_eq!(x.len(), y.len() * 256);
    let sweep = Sweep {
        rmin: -1.0,
        rdelta: 0.1,
        steps: 20,
        use_mad: false,
    };
    let mut levels = [0u8; 256];
    for (x, block) in x.chunks_exact(256).zip(y.iter_mut()) {
        (block.d, block.dmin, block.scales) = quantize_scale_min_k(x, 15, &sweep, &mut levels);
        for pair in 0..4 {
            for l in 0..32 {
                block.qs[32 * pair + l] = levels[64 * pair + l] | (levels[64 * pair + l + 32] << 4);
            }
        }
    }
}

/// Q5_K: Q4_K with 5-bit quants (the fifth bit in `qh`).
pub fn quantize_row_q5_k(x: &[f32], y: &mut [BlockQ5K]) {
    debug_assert_eq!(x.len(), y.len() * 256);
    let sweep = Sweep {
        rmin: -0.5,
        rdelta: 0.1,
        steps: 15,
        use_mad: false,
    };
    let mut levels = [0u8; 256];
    for (x, block) in x.chunks_exact(256).zip(y.iter_mut()) {
        (block.d, block.dmin, block.scales) = quantize_scale_min_k(x, 31, &sweep, &mut levels);
        block.qh = [0; 32];
        for pair in 0..4 {
            let (bit1, bit2) = (1u8 << (2 * pair), 2u8 << (2 * pair));
            for j in 0..32 {
                let mut l1 = levels[64 * pair + j];
                if l1 > 15 {
                    l1 -= 16;
                    block.qh[j] |= bit1;
                }
                let mut l2 = levels[64 * pair + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    block.qh[j] |= bit2;
                }
                block.qs[32 * pair + j] = l1 | (l2 << 4);
            }
        }
    }
}

/// Q6_K: per 16 elements a signed 8-bit scale, 6-bit quants in -32..32.
pub fn quantize_row_q6_k(x: &[f32], y: &mut [BlockQ6K]) {
    debug_assert_eq!(x.len(), y.len() * 256);
    let mut levels = [0i8; 256];
    for (x, block) in x.chunks_exact(256).zip(y.iter_mut()) {
        let mut scales = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for ib in 0..16 {
            let scale = make_qx_quants(
                32,
                &x[16 * ib..16 * ib + 16],
                &mut levels[16 * ib..16 * ib + 16],
            );
            scales[ib] = scale;
            if scale.abs() > max_abs_scale {
                max_abs_scale = scale.abs();
                max_scale = scale;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *block = bytemuck::Zeroable::zeroed();
            continue;
        }
        let iscale = -128.0 / max_scale;
        block.d = f16::from_f32(1.0 / iscale);
        for (packed, &scale) in block.scales.iter_mut().zip(&scales) {
            *packed = nearest_int(iscale * scale).min(127) as i8;
        }
        for j in 0..16 {
            let d = block.d.to_f32() * f32::from(block.scales[j]);
            if d == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                levels[i] = (nearest_int(x[i] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        for half in 0..2 {
            let level = &levels[128 * half..128 * half + 128];
            let ql = &mut block.ql[64 * half..64 * half + 64];
            let qh = &mut block.qh[32 * half..32 * half + 32];
            for l in 0..32 {
                let [q1, q2, q3, q4] = [0, 32, 64, 96].map(|offset| level[l + offset] as u8);
                ql[l] = (q1 & 0x0f) | ((q3 & 0x0f) << 4);
                ql[l + 32] = (q2 & 0x0f) | ((q4 & 0x0f) << 4);
                qh[l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
    }
}
