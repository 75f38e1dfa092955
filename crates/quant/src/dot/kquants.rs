//! Scalar twins of the 256-element super-block formats against Q8_K activations
//! (ggml-cpu's `ggml_vec_dot_{q2_k,q3_k,q4_k,q5_k,q6_k,iq4_xs}_q8_k`, AVX2 arithmetic order).
//!
//! Each super-block is decoded to integers, its scaled integer dot product is split into the
//! eight lanes (exact), and the f32 part follows ggml's AVX2 code: `d = d_a * d_w`, one FMA
//! per lane per super-block, the minimum correction either in the same lanes (Q2_K), in four
//! extra lanes (Q4_K) or in a scalar (Q5_K). Q6_K's `-32` offset comes out of the lanes through
//! the activation block sums (ggml's `q8sclsub`), which splits the same integer total across
//! the lanes differently from subtracting it per element — and so rounds differently.

use super::checked_blocks;
use super::lanes::{block, fma_lanes, hsum8, Lanes};
use crate::blocks::{
    BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, KVALUES_IQ4NL,
};
use crate::dequant::{q3_k_scale, scale_min_k4};
use crate::GgmlType;

/// `sum(scale(e) * q[e] * a[e])` split into lanes; `scales` has one entry per 16 elements.
fn scaled_lane_sums<W: Copy + Into<i32>>(
    q: &[W; 256],
    scales: &[i32; 16],
    a: &[i8; 256],
) -> [i32; 8] {
    let mut sums = [0i32; 8];
    for e in 0..256 {
        sums[(e % 32) / 4] += scales[e / 16] * q[e].into() * i32::from(a[e]);
    }
    sums
}

/// Sums of 32 activations (pairs of Q8_K's sums of 16).
fn sums_of_32(y: &BlockQ8K) -> [i32; 8] {
    std::array::from_fn(|m| i32::from(y.bsums[2 * m]) + i32::from(y.bsums[2 * m + 1]))
}

/// Scales and minimums of the eight 32-element sub-blocks of Q4_K / Q5_K.
fn scales_and_mins(packed: &[u8; 12]) -> ([i32; 16], [i32; 8]) {
    let mut scales = [0i32; 16];
    let mut mins = [0i32; 8];
    for j in 0..8 {
        let (scale, min) = scale_min_k4(j, packed);
        scales[2 * j] = i32::from(scale);
        scales[2 * j + 1] = i32::from(scale);
        mins[j] = i32::from(min);
    }
    (scales, mins)
}

/// Q2_K x Q8_K.
pub(crate) fn dot_q2_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let blocks = checked_blocks(GgmlType::Q2_K, n, w, a);
    let mut acc: Lanes = [0.0; 8];
    for i in 0..blocks {
        let x: BlockQ2K = block(w, i);
        let y: BlockQ8K = block(a, i);
        let d = y.d * x.d.to_f32();
        let dmin = -y.d * x.dmin.to_f32();
        let min = |j: usize| i32::from(x.scales[j] >> 4) * i32::from(y.bsums[j]);
        let mins: [i32; 8] = std::array::from_fn(|k| min(2 * k) + min(2 * k + 1));
        fma_lanes(&mut acc, dmin, &mins);
        let scales: [i32; 16] = x.scales.map(|s| i32::from(s & 0x0f));
        let mut q = [0u8; 256];
        for half in 0..2 {
            for shift in 0..4 {
                for l in 0..32 {
                    q[128 * half + 32 * shift + l] = (x.qs[32 * half + l] >> (2 * shift)) & 3;
                }
            }
        }
        fma_lanes(&mut acc, d, &scaled_lane_sums(&q, &scales, &y.qs));
    }
    hsum8(&acc)
}

/// Q3_K x Q8_K.
pub(crate) fn dot_q3_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let blocks = checked_blocks(GgmlType::Q3_K, n, w, a);
    let mut acc: Lanes = [0.0; 8];
    for i in 0..blocks {
        let x: BlockQ3K = block(w, i);
        let y: BlockQ8K = block(a, i);
        let d = y.d * x.d.to_f32();
        let scales: [i32; 16] = std::array::from_fn(|j| i32::from(q3_k_scale(j, &x.scales)));
        let mut q = [0i8; 256];
        for half in 0..2 {
            for shift in 0..4 {
                for l in 0..32 {
                    let low = ((x.qs[32 * half + l] >> (2 * shift)) & 3) as i8;
                    let high_set = (x.hmask[l] >> (4 * half + shift)) & 1 == 1;
                    q[128 * half + 32 * shift + l] = low - if high_set { 0 } else { 4 };
                }
            }
        }
        fma_lanes(&mut acc, d, &scaled_lane_sums(&q, &scales, &y.qs));
    }
    hsum8(&acc)
}

/// Q4_K x Q8_K.
pub(crate) fn dot_q4_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let blocks = checked_blocks(GgmlType::Q4_K, n, w, a);
    let mut acc: Lanes = [0.0; 8];
    let mut acc_mins = [0.0f32; 4];
    for i in 0..blocks {
        let x: BlockQ4K = block(w, i);
        let y: BlockQ8K = block(a, i);
        let d = y.d * x.d.to_f32();
        let dmin = -y.d * x.dmin.to_f32();
        let (scales, mins) = scales_and_mins(&x.scales);
        let sums = sums_of_32(&y);
        for (k, lane) in acc_mins.iter_mut().enumerate() {
            let product = mins[2 * k] * sums[2 * k] + mins[2 * k + 1] * sums[2 * k + 1];
            *lane = dmin.mul_add(product as f32, *lane);
        }
        let mut q = [0u8; 256];
        for j in 0..4 {
            for l in 0..32 {
                q[64 * j + l] = x.qs[32 * j + l] & 0x0f;
                q[64 * j + 32 + l] = x.qs[32 * j + l] >> 4;
            }
        }
        fma_lanes(&mut acc, d, &scaled_lane_sums(&q, &scales, &y.qs));
    }
    hsum8(&acc) + ((acc_mins[0] + acc_mins[2]) + (acc_mins[1] + acc_mins[3]))
}

/// Q5_K x Q8_K.
pub(crate) fn dot_q5_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let blocks = checked_blocks(GgmlType::Q5_K, n, w, a);
    let mut acc: Lanes = [0.0; 8];
    let mut minimums = 0.0f32;
    for i in 0..blocks {
        let x: BlockQ5K = block(w, i);
        let y: BlockQ8K = block(a, i);
        let d = y.d * x.d.to_f32();
        let dmin = -y.d * x.dmin.to_f32();
        let (scales, mins) = scales_and_mins(&x.scales);
        let sums = sums_of_32(&y);
        let product: i32 = (0..8).map(|m| mins[m] * sums[m]).sum();
        minimums = dmin.mul_add(product as f32, minimums);
        let mut q = [0u8; 256];
        for j in 0..4 {
            for l in 0..32 {
                let high = x.qh[l] >> (2 * j);
                q[64 * j + l] = (x.qs[32 * j + l] & 0x0f) | ((high & 1) << 4);
                q[64 * j + 32 + l] = (x.qs[32 * j + l] >> 4) | (((high >> 1) & 1) << 4);
            }
        }
        fma_lanes(&mut acc, d, &scaled_lane_sums(&q, &scales, &y.qs));
    }
    hsum8(&acc) + minimums
}

/// Q6_K x Q8_K.
pub(crate) fn dot_q6_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let blocks = checked_blocks(GgmlType::Q6_K, n, w, a);
    let mut acc: Lanes = [0.0; 8];
    for i in 0..blocks {
        let x: BlockQ6K = block(w, i);
        let y: BlockQ8K = block(a, i);
        let d = y.d * x.d.to_f32();
        let scales: [i32; 16] = x.scales.map(i32::from);
        // The six-bit codes 0..63 (the value is code - 32).
        let mut q = [0u8; 256];
        for half in 0..2 {
            let ql = &x.ql[64 * half..64 * half + 64];
            let qh = &x.qh[32 * half..32 * half + 32];
            for l in 0..32 {
                let base = 128 * half + l;
                q[base] = (ql[l] & 0x0f) | ((qh[l] & 3) << 4);
                q[base + 32] = (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4);
                q[base + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                q[base + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        }
        // ggml takes the -32 offset out through the activation sums: lane k loses
        // 32 * (scale * sum of 16) of sub-blocks 2k and 2k+1 (a different split of the same
        // integer total than subtracting per element, so a different f32 rounding).
        let mut lanes = scaled_lane_sums(&q, &scales, &y.qs);
        for (k, lane) in lanes.iter_mut().enumerate() {
            *lane -= 32
                * (scales[2 * k] * i32::from(y.bsums[2 * k])
                    + scales[2 * k + 1] * i32::from(y.bsums[2 * k + 1]));
        }
        fma_lanes(&mut acc, d, &lanes);
    }
    hsum8(&acc)
}

/// IQ4_XS x Q8_K.
pub(crate) fn dot_iq4_xs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let blocks = checked_blocks(GgmlType::IQ4_XS, n, w, a);
    let mut acc: Lanes = [0.0; 8];
    for i in 0..blocks {
        let x: BlockIQ4XS = block(w, i);
        let y: BlockQ8K = block(a, i);
        let d = x.d.to_f32() * y.d;
        let mut scales = [0i32; 16];
        let mut q = [0i8; 256];
        for sub in 0..8 {
            let low = (x.scales_l[sub / 2] >> (4 * (sub % 2))) & 0x0f;
            let high = ((x.scales_h >> (2 * sub)) & 3) as u8;
            let scale = i32::from(low | (high << 4)) - 32;
            scales[2 * sub] = scale;
            scales[2 * sub + 1] = scale;
            for l in 0..16 {
                let byte = x.qs[16 * sub + l];
                q[32 * sub + l] = KVALUES_IQ4NL[usize::from(byte & 0x0f)];
                q[32 * sub + 16 + l] = KVALUES_IQ4NL[usize::from(byte >> 4)];
            }
        }
        fma_lanes(&mut acc, d, &scaled_lane_sums(&q, &scales, &y.qs));
    }
    hsum8(&acc)
}
