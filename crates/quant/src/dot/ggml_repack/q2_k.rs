//! Q2_K in the order of `ggml_gemv_q2_K_8x8_q8_K` (one FMA per super-block) and
//! `ggml_gemm_q2_K_8x8_q8_K` (one FMA per 128 elements), scalar twins.

use crate::blocks::{BlockQ2K, BlockQ8K};
use crate::dot::checked_blocks;
use crate::dot::lanes::block;
use crate::GgmlType;

/// Q2_K x Q8_K in `ggml_gemv_q2_K_8x8_q8_K` order (one FMA per super-block).
pub(crate) fn dot_q2_k_gemv(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_q2_k(n, w, a, 2)
}

/// Q2_K x Q8_K in `ggml_gemm_q2_K_8x8_q8_K` order (one FMA per 128 elements).
pub(crate) fn dot_q2_k_gemm(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_q2_k(n, w, a, 1)
}

/// Q2_K x Q8_K with one FMA per `halves_per_fma` 128-element halves of each super-block.
///
/// Element `128 h + 32 j + l` is bits `2j..2j+2` of `qs[32 h + l]`; its 16-element
/// sub-block `k = 8 h + 2 j + l / 16` has scale `scales[k] & 15` and minimum
/// `scales[k] >> 4`.
fn dot_q2_k(n: usize, w: &[u8], a: &[u8], halves_per_fma: usize) -> f32 {
    let blocks = checked_blocks(GgmlType::Q2_K, n, w, a);
    let mut acc = 0.0f32;
    let mut acc_min = 0.0f32;
    for i in 0..blocks {
        let x: BlockQ2K = block(w, i);
        let y: BlockQ8K = block(a, i);
        let scale = x.d.to_f32() * y.d;
        let scale_min = x.dmin.to_f32() * y.d;
        let mut isum = 0i32;
        let mut imin = 0i32;
        for half in 0..2 {
            for shift in 0..4 {
                for part in 0..2 {
                    let k = 8 * half + 2 * shift + part;
                    let dot: i32 = (16 * part..16 * part + 16)
                        .map(|l| {
                            let q = (x.qs[32 * half + l] >> (2 * shift)) & 3;
                            i32::from(q) * i32::from(y.qs[128 * half + 32 * shift + l])
                        })
                        .sum();
                    isum += i32::from(x.scales[k] & 0x0f) * dot;
                    imin += i32::from(x.scales[k] >> 4) * i32::from(y.bsums[k]);
                }
            }
            if (half + 1) % halves_per_fma == 0 {
                acc = (isum as f32).mul_add(scale, acc);
                acc_min = (imin as f32).mul_add(scale_min, acc_min);
                isum = 0;
                imin = 0;
            }
        }
    }
    acc - acc_min
}
