//! Reference quantizers: f32 to packed ggml blocks, as llama-quantize does without an
//! importance matrix.
//!
//! Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16 and BF16 follow ggml's deterministic reference rounding
//! and produce the same bytes as llama-quantize. The K-quants and IQ4 types port ggml's
//! scale searches (`make_qkx2_quants`, `make_q3_quants`, `make_qx_quants`, the IQ4 scale
//! sweep) in the same f32 operation order. Q8_1 and Q8_K are activation formats for the
//! dot products.
//!
//! ```
//! use runit_quant::{dequantize, quantize, GgmlType};
//! let x: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
//! let mut packed = vec![0u8; 34];
//! quantize(GgmlType::Q8_0, &x, &mut packed).unwrap();
//! let mut back = vec![0.0f32; 32];
//! dequantize(GgmlType::Q8_0, &packed, &mut back).unwrap();
//! assert!(x.iter().zip(&back).all(|(a, b)| (a - b).abs() <= 16.0 / 127.0));
//! ```

mod iq4;
mod kquants;
mod legacy;
pub mod q8;
pub(crate) mod search;
#[cfg(test)]
mod tests;

use bytemuck::Pod;
use half::f16;

use crate::blocks::{
    cast_blocks_mut, BlockIQ4NL, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1,
    BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use crate::{GgmlType, QuantError};

pub use iq4::{quantize_row_iq4_nl, quantize_row_iq4_xs};
pub use kquants::{
    quantize_row_q2_k, quantize_row_q3_k, quantize_row_q4_k, quantize_row_q5_k, quantize_row_q6_k,
};
pub use legacy::{quantize_row_q4_0, quantize_row_q4_1, quantize_row_q5_0, quantize_row_q5_1};
pub use q8::{quantize_row_q8_0, quantize_row_q8_1, quantize_row_q8_k};

/// True when [`quantize`] handles `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    crate::dequant::can_dequantize(ty)
}

/// Quantizes `src` to type `ty` into `dst`.
///
/// `src.len()` must be a multiple of the block size and `dst.len()` must equal
/// `ty.row_bytes(src.len())`. `dst` may start at any address. Blocks are independent, so a
/// tensor can be quantized whole or row by row with the same result.
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    if !can_quantize(ty) {
        return Err(QuantError::Unsupported { ty, op: "quantize" });
    }
    QuantError::check_sizes(ty, src.len(), ty.block_size(), dst.len(), ty.type_size())?;
    use GgmlType::*;
    match ty {
        F32 => {
            for (bytes, &value) in dst.chunks_exact_mut(4).zip(src) {
                bytes.copy_from_slice(&value.to_le_bytes());
            }
        }
        F16 => {
            for (bytes, &value) in dst.chunks_exact_mut(2).zip(src) {
                bytes.copy_from_slice(&f16::from_f32(value).to_le_bytes());
            }
        }
        BF16 => {
            for (bytes, &value) in dst.chunks_exact_mut(2).zip(src) {
                bytes.copy_from_slice(&f32_to_bf16_bits(value).to_le_bytes());
            }
        }
        Q4_0 => for_each_block::<BlockQ4_0>(src, dst, 32, quantize_row_q4_0),
        Q4_1 => for_each_block::<BlockQ4_1>(src, dst, 32, quantize_row_q4_1),
        Q5_0 => for_each_block::<BlockQ5_0>(src, dst, 32, quantize_row_q5_0),
        Q5_1 => for_each_block::<BlockQ5_1>(src, dst, 32, quantize_row_q5_1),
        Q8_0 => for_each_block::<BlockQ8_0>(src, dst, 32, quantize_row_q8_0),
        Q8_1 => for_each_block::<BlockQ8_1>(src, dst, 32, quantize_row_q8_1),
        IQ4_NL => for_each_block::<BlockIQ4NL>(src, dst, 32, quantize_row_iq4_nl),
        Q2_K => for_each_block::<BlockQ2K>(src, dst, 256, quantize_row_q2_k),
        Q3_K => for_each_block::<BlockQ3K>(src, dst, 256, quantize_row_q3_k),
        Q4_K => for_each_block::<BlockQ4K>(src, dst, 256, quantize_row_q4_k),
        Q5_K => for_each_block::<BlockQ5K>(src, dst, 256, quantize_row_q5_k),
        Q6_K => for_each_block::<BlockQ6K>(src, dst, 256, quantize_row_q6_k),
        Q8_K => for_each_block::<BlockQ8K>(src, dst, 256, quantize_row_q8_k),
        IQ4_XS => for_each_block::<BlockIQ4XS>(src, dst, 256, quantize_row_iq4_xs),
        _ => unreachable!("can_quantize admitted {ty}"),
    }
    Ok(())
}

/// bf16 bits of `value`, rounded to nearest even; a NaN stays a (quiet) NaN. The rounding
/// of ggml's `ggml_compute_fp32_to_bf16` and gguf-py.
pub fn f32_to_bf16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        return ((bits >> 16) | 64) as u16;
    }
    ((u64::from(bits) + u64::from(0x7fff + ((bits >> 16) & 1))) >> 16) as u16
}

/// Runs `row` over the blocks of `dst`: in place when `dst` is aligned for `B`, otherwise
/// one block at a time through a copy. Lengths are checked by the caller.
fn for_each_block<B: Pod>(
    src: &[f32],
    dst: &mut [u8],
    block_size: usize,
    row: fn(&[f32], &mut [B]),
) {
    match cast_blocks_mut::<B>(dst) {
        Some(blocks) => row(src, blocks),
        None => {
            let chunks = dst.chunks_exact_mut(std::mem::size_of::<B>());
            for (bytes, x) in chunks.zip(src.chunks_exact(block_size)) {
                let mut block = B::zeroed();
                row(x, std::slice::from_mut(&mut block));
                bytes.copy_from_slice(bytemuck::bytes_of(&block));
            }
        }
    }
}
