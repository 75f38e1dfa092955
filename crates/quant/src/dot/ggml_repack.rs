//! Dot products in the arithmetic order of ggml-cpu's REPACK kernels (`arch/x86/repack.cpp`),
//! which llama.cpp's x86 build uses instead of `vec_dot` for some weight types.
//!
//! ggml-cpu re-lays out a 2-D (or 3-D expert) weight whose type has an x86 repack kernel
//! and whose row count is a multiple of 8 (Q4_K as `block_q4_Kx8`, when AVX2 is present),
//! except the token embedding, which stays in a plain buffer for GET_ROWS. Such weights
//! then go through `ggml_gemv_*` (one activation row, and the rows left over after groups
//! of four) or `ggml_gemm_*` (groups of four rows) for every matmul, whatever the number
//! of activation rows.
//!
//! **Q4_K numerics**: the scaled integer dot product `sum_j scale_j * dot(q_j, a_j)` and
//! the minimum correction `sum_j min_j * bsum_j` of a span are exact i32 sums; each is
//! converted to f32 and folded into its own accumulator with one FMA, `acc = fma(isum,
//! d_w * d_a, acc)` and `acc_min = fma(imin, dmin_w * d_a, acc_min)`; the result is
//! `acc - acc_min` (no lanes, no horizontal sum). The span is the whole super-block in
//! `ggml_gemv_q4_K_8x8_q8_K` and each 64-element half-pair of sub-blocks in
//! `ggml_gemm_q4_K_8x8_q8_K`.

use super::checked_blocks;
use super::lanes::block;
use super::DotFn;
use crate::blocks::{BlockQ4K, BlockQ8K};
use crate::dequant::scale_min_k4;
use crate::GgmlType;

/// The repack-order dot products for weights of `ty` that ggml-cpu's x86 build repacks
/// (see the module doc): `(gemv, gemm)`, the order of one activation row and the order of
/// activation rows taken four at a time; `None` when the type keeps its `vec_dot` order.
pub fn repack_dot_fn(ty: GgmlType) -> Option<(DotFn, DotFn)> {
    match ty {
        GgmlType::Q4_K => Some((dot_q4_k_gemv, dot_q4_k_gemm)),
        _ => None,
    }
}

/// True when ggml-cpu's x86 build (AVX2 or better) repacks a weight of `ty` with `rows`
/// rows that is not the token embedding.
pub fn is_repacked(ty: GgmlType, rows: usize) -> bool {
    repack_dot_fn(ty).is_some() && rows.is_multiple_of(8)
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dot::{activation_format, activation_row_bytes, quantize_activation};
    use crate::quantize;

    #[test]
    fn q4_k_repack_order_is_close_to_the_exact_dot() {
        let n = 512;
        let w: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut packed = vec![0u8; 2 * 144];
        quantize(GgmlType::Q4_K, &w, &mut packed).expect("quantize Q4_K");
        let format = activation_format(GgmlType::Q4_K).expect("Q4_K has a format");
        let mut activation = vec![0u8; activation_row_bytes(format, n)];
        quantize_activation(format, &x, &mut activation);
        let lanes = crate::dot::kquants::dot_q4_k(n, &packed, &activation);
        let exact: f32 = w.iter().zip(&x).map(|(a, b)| a * b).sum();
        for repack in [
            dot_q4_k_gemv(n, &packed, &activation),
            dot_q4_k_gemm(n, &packed, &activation),
        ] {
            assert!((repack - exact).abs() < 0.5, "{repack} vs {exact}");
            assert!((repack - lanes).abs() < 1e-3, "{repack} vs {lanes}");
        }
    }
}
