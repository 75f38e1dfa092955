//! Scalar reference dequantizers: packed ggml blocks to f32, bit for bit as ggml's
//! `dequantize_row_*` (and gguf-py's numpy ports) compute them.
//!
//! Every routine multiplies and adds in the same order as ggml, in plain f32 IEEE arithmetic
//! (Rust never contracts `a * b + c` into a fused multiply-add), so the results are exact
//! copies of the reference values, not approximations.
//!
//! ```
//! use runit_quant::{dequantize, GgmlType};
//! // One Q8_0 block: scale 0.5 (f16 0x3800), then 32 quants.
//! let mut block = vec![0x00, 0x38];
//! block.extend((0..32).map(|i| i as u8));
//! let mut out = vec![0.0f32; 32];
//! dequantize(GgmlType::Q8_0, &block, &mut out).unwrap();
//! assert_eq!(out[3], 1.5);
//! ```

mod kquants;
mod legacy;

use bytemuck::Pod;
use half::f16;

use crate::blocks::{
    cast_blocks, BlockIQ4NL, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1,
    BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use crate::{GgmlType, QuantError};

pub use kquants::{
    dequantize_row_iq4_xs, dequantize_row_q2_k, dequantize_row_q3_k, dequantize_row_q4_k,
    dequantize_row_q5_k, dequantize_row_q6_k, dequantize_row_q8_k,
};
pub(crate) use kquants::{q3_k_scale, scale_min_k4};
pub use legacy::{
    dequantize_row_iq4_nl, dequantize_row_q4_0, dequantize_row_q4_1, dequantize_row_q5_0,
    dequantize_row_q5_1, dequantize_row_q8_0, dequantize_row_q8_1,
};

/// True when [`dequantize`] handles `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | BF16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | Q8_1
            | Q2_K
            | Q3_K
            | Q4_K
            | Q5_K
            | Q6_K
            | Q8_K
            | IQ4_NL
            | IQ4_XS
    )
}

/// Dequantizes the packed tensor data `src` of type `ty` into `dst`.
///
/// `src` holds whole blocks and may start at any address (aligned data is read in place,
/// unaligned data block by block through a copy); `dst.len()` must be
/// `src.len() / type_size * block_size`.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    if !can_dequantize(ty) {
        return Err(QuantError::Unsupported {
            ty,
            op: "dequantize",
        });
    }
    QuantError::check_sizes(ty, src.len(), ty.type_size(), dst.len(), ty.block_size())?;
    use GgmlType::*;
    match ty {
        F32 => {
            for (bytes, out) in src.chunks_exact(4).zip(dst.iter_mut()) {
                *out = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            }
        }
        F16 => {
            for (bytes, out) in src.chunks_exact(2).zip(dst.iter_mut()) {
                *out = f16::from_le_bytes([bytes[0], bytes[1]]).to_f32();
            }
        }
        BF16 => {
            for (bytes, out) in src.chunks_exact(2).zip(dst.iter_mut()) {
                *out = bf16_bits_to_f32(u16::from_le_bytes([bytes[0], bytes[1]]));
            }
        }
        Q4_0 => for_each_block::<BlockQ4_0>(src, dst, 32, dequantize_row_q4_0),
        Q4_1 => for_each_block::<BlockQ4_1>(src, dst, 32, dequantize_row_q4_1),
        Q5_0 => for_each_block::<BlockQ5_0>(src, dst, 32, dequantize_row_q5_0),
        Q5_1 => for_each_block::<BlockQ5_1>(src, dst, 32, dequantize_row_q5_1),
        Q8_0 => for_each_block::<BlockQ8_0>(src, dst, 32, dequantize_row_q8_0),
        Q8_1 => for_each_block::<BlockQ8_1>(src, dst, 32, dequantize_row_q8_1),
        IQ4_NL => for_each_block::<BlockIQ4NL>(src, dst, 32, dequantize_row_iq4_nl),
        Q2_K => for_each_block::<BlockQ2K>(src, dst, 256, dequantize_row_q2_k),
        Q3_K => for_each_block::<BlockQ3K>(src, dst, 256, dequantize_row_q3_k),
        Q4_K => for_each_block::<BlockQ4K>(src, dst, 256, dequantize_row_q4_k),
        Q5_K => for_each_block::<BlockQ5K>(src, dst, 256, dequantize_row_q5_k),
        Q6_K => for_each_block::<BlockQ6K>(src, dst, 256, dequantize_row_q6_k),
        Q8_K => for_each_block::<BlockQ8K>(src, dst, 256, dequantize_row_q8_k),
        IQ4_XS => for_each_block::<BlockIQ4XS>(src, dst, 256, dequantize_row_iq4_xs),
        _ => unreachable!("can_dequantize admitted {ty}"),
    }
    Ok(())
}

/// The f32 whose upper half is the bf16 bit pattern `bits`.
pub fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Runs `row` over the blocks of `src`: in place when `src` is aligned for `B`, otherwise
/// one copied block at a time. `src.len()` is a whole number of blocks and `dst` holds
/// `block_size` values per block (checked by the caller).
fn for_each_block<B: Pod>(
    src: &[u8],
    dst: &mut [f32],
    block_size: usize,
    row: fn(&[B], &mut [f32]),
) {
    match cast_blocks::<B>(src) {
        Some(blocks) => row(blocks, dst),
        None => {
            let chunks = src.chunks_exact(std::mem::size_of::<B>());
            for (bytes, out) in chunks.zip(dst.chunks_exact_mut(block_size)) {
                let block: B = bytemuck::pod_read_unaligned(bytes);
                row(std::slice::from_ref(&block), out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_lengths_and_types() {
        let mut out = vec![0.0; 32];
        assert_eq!(
            dequantize(GgmlType::Q4_0, &[0; 17], &mut out),
            Err(QuantError::NotBlockMultiple {
                ty: GgmlType::Q4_0,
                n: 17,
                block: 18
            })
        );
        assert_eq!(
            dequantize(GgmlType::Q4_0, &[0; 36], &mut out),
            Err(QuantError::Length {
                ty: GgmlType::Q4_0,
                expected: 64,
                found: 32
            })
        );
        assert!(matches!(
            dequantize(GgmlType::IQ2_XXS, &[0; 66], &mut vec![0.0; 256]),
            Err(QuantError::Unsupported { .. })
        ));
    }

    #[test]
    fn unaligned_source_gives_the_same_values() {
        // Two Q8_K blocks (f32 scale: alignment 4) read from an address that is off by one.
        let mut bytes = vec![0u8; 1 + 2 * 292];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 37 % 251) as u8;
        }
        // Keep the scales finite: little-endian 0.25 at the start of each block.
        for block in 0..2 {
            let at = 1 + block * 292;
            bytes[at..at + 4].copy_from_slice(&0.25f32.to_le_bytes());
        }
        let aligned: Vec<u8> = bytes[1..].to_vec();
        let mut from_aligned = vec![0.0; 512];
        let mut from_unaligned = vec![0.0; 512];
        dequantize(GgmlType::Q8_K, &aligned, &mut from_aligned).unwrap();
        dequantize(GgmlType::Q8_K, &bytes[1..], &mut from_unaligned).unwrap();
        assert_eq!(from_aligned, from_unaligned);
        assert_eq!(from_aligned[0], 0.25 * (bytes[5] as i8) as f32);
    }
}
