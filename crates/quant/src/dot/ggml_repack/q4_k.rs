//! Q4_K in the order of `ggml_gemv_q4_K_8x8_q8_K` (one FMA per super-block) and
//! `ggml_gemm_q4_K_8x8_q8_K` (one FMA per 64 elements), scalar twins.

use crate::blocks::{BlockQ4K, BlockQ8K};
use crate::dequant::scale_min_k4;
use crate::dot::checked_blocks;
use crate::dot::lanes::block;
use crate::GgmlType;

/// `sum(q[e] * a[e])` over one 32-element sub-block.
fn sub_block_dot(q: &[u8; 32], a: &[i8]) -> i32 {
    q.iter()
        .zip(a)
        .map(|(&q, &a)| i32::from(q) * i32::from(a))
        .sum()
}

/// Q4_K x Q8_K in `ggml_gemv_q4_K_8x8_q8_K` order (one FMA per super-block).
pub(crate) fn dot_q4_k_gemv(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_q4_k(n, w, a, 4)
}

/// Q4_K x Q8_K in `ggml_gemm_q4_K_8x8_q8_K` order (one FMA per 64 elements).
pub(crate) fn dot_q4_k_gemm(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_q4_k(n, w, a, 1)
}

/// Q4_K x Q8_K with one FMA per `chunks_per_fma` 64-element chunks of each super-block.
fn dot_q4_k(n: usize, w: &[u8], a: &[u8], chunks_per_fma: usize) -> f32 {
    let blocks = checked_blocks(GgmlType::Q4_K, n, w, a);
    let mut acc = 0.0f32;
    let mut acc_min = 0.0f32;
    for i in 0..blocks {
        let x: BlockQ4K = block(w, i);
        let y: BlockQ8K = block(a, i);
        let scale = x.d.to_f32() * y.d;
        let scale_min = x.dmin.to_f32() * y.d;
        let mut isum = 0i32;
        let mut imin = 0i32;
        for chunk in 0..4 {
            let packed = &x.qs[32 * chunk..32 * chunk + 32];
            let low: [u8; 32] = std::array::from_fn(|l| packed[l] & 0x0f);
            let high: [u8; 32] = std::array::from_fn(|l| packed[l] >> 4);
            for (half, q) in [low, high].iter().enumerate() {
                let sub = 2 * chunk + half;
                let (scale, min) = scale_min_k4(sub, &x.scales);
                isum += i32::from(scale) * sub_block_dot(q, &y.qs[32 * sub..32 * sub + 32]);
                let bsum = i32::from(y.bsums[2 * sub]) + i32::from(y.bsums[2 * sub + 1]);
                imin += i32::from(min) * bsum;
            }
            if (chunk + 1) % chunks_per_fma == 0 {
                acc = (isum as f32).mul_add(scale, acc);
                acc_min = (imin as f32).mul_add(scale_min, acc_min);
                isum = 0;
                imin = 0;
            }
        }
    }
    acc - acc_min
}
