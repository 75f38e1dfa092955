//! Q4_0 in the order of `ggml_gemv_q4_0_8x8_q8_0` / `ggml_gemm_q4_0_8x8_q8_0` (one FMA per
//! 32-element block, the same for both), scalar twin.

use crate::blocks::{BlockQ4_0, BlockQ8_0};
use crate::dot::checked_blocks;
use crate::dot::lanes::block;
use crate::GgmlType;

/// Q4_0 x Q8_0: `acc = fma(sum_e (q_e - 8) * a_e, d_w * d_a, acc)` block after block.
pub(crate) fn dot_q4_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let blocks = checked_blocks(GgmlType::Q4_0, n, w, a);
    let mut acc = 0.0f32;
    for i in 0..blocks {
        let x: BlockQ4_0 = block(w, i);
        let y: BlockQ8_0 = block(a, i);
        let isum: i32 = (0..16)
            .map(|j| {
                let low = i32::from(x.qs[j] & 0x0f) - 8;
                let high = i32::from(x.qs[j] >> 4) - 8;
                low * i32::from(y.qs[j]) + high * i32::from(y.qs[j + 16])
            })
            .sum();
        acc = (isum as f32).mul_add(x.d.to_f32() * y.d.to_f32(), acc);
    }
    acc
}
