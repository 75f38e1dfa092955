//! IQ4_NL in the order of `ggml_gemv_iq4_nl_8x8_q8_0` / `ggml_gemm_iq4_nl_8x8_q8_0` (one
//! FMA per 32-element block, the same for both), scalar twin.

use crate::blocks::{BlockIQ4NL, BlockQ8_0, KVALUES_IQ4NL};
use crate::dot::checked_blocks;
use crate::dot::lanes::block;
use crate::GgmlType;

/// IQ4_NL x Q8_0: `acc = fma(sum_e kvalues[q_e] * a_e, d_w * d_a, acc)` block after block.
pub(crate) fn dot_iq4_nl(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let blocks = checked_blocks(GgmlType::IQ4_NL, n, w, a);
    let mut acc = 0.0f32;
    for i in 0..blocks {
        let x: BlockIQ4NL = block(w, i);
        let y: BlockQ8_0 = block(a, i);
        let isum: i32 = (0..16)
            .map(|j| {
                let low = i32::from(KVALUES_IQ4NL[usize::from(x.qs[j] & 0x0f)]);
                let high = i32::from(KVALUES_IQ4NL[usize::from(x.qs[j] >> 4)]);
                low * i32::from(y.qs[j]) + high * i32::from(y.qs[j + 16])
            })
            .sum();
        acc = (isum as f32).mul_add(x.d.to_f32() * y.d.to_f32(), acc);
    }
    acc
}
