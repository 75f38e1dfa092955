//! `#[repr(C)]` block layouts of the quantized types, byte-for-byte as ggml stores them
//! (ggml-common.h). Each block carries a compile-time size check and its bits per weight.
//!
//! Blocks are `bytemuck::Pod`, so a tensor's bytes can be viewed as `&[BlockQ4_0]` without a
//! copy (see [`cast_blocks`]).

use bytemuck::{Pod, Zeroable};
use half::f16;

use crate::QK_K;

/// Elements per block of the 32-element legacy formats.
pub const QK4_0: usize = 32;
pub const QK4_1: usize = 32;
pub const QK5_0: usize = 32;
pub const QK5_1: usize = 32;
pub const QK8_0: usize = 32;
pub const QK8_1: usize = 32;
pub const QK4_NL: usize = 32;
/// Bytes of packed scales/mins in Q4_K and Q5_K super-blocks.
pub const K_SCALE_SIZE: usize = 12;

/// Q4_0: 4.5 bpw. `x = d * (q - 8)`, q in 0..16; low nibbles hold elements 0..16,
/// high nibbles elements 16..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK4_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

/// Q4_1: 5.0 bpw. `x = d * q + m`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK4_1 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

/// Q5_0: 5.5 bpw. `x = d * (q - 16)`; the fifth bit of element j is bit j of `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK5_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

/// Q5_1: 6.0 bpw. `x = d * q + m`, q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK5_1 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

/// Q8_0: 8.5 bpw. `x = d * q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK8_0],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

/// Q8_1: 9.0 bpw activation format. `x = d * q`; `s = d * sum(q)` (used by Q4_1/Q5_1 dots).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK8_1],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

/// Q2_K: 2.625 bpw. 16 sub-blocks of 16; `scales` packs a 4-bit scale (low) and 4-bit min
/// (high) per sub-block; `x = d * sc * q - dmin * m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: f16,
    pub dmin: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

/// Q3_K: 3.4375 bpw. 2 low bits in `qs`, high bit in `hmask` (set means +0, clear means -4),
/// 16 six-bit scales packed into 12 bytes; `x = d * (sc - 32) * q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

/// Q4_K: 4.5 bpw. 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes;
/// `x = d * sc * q - dmin * m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

/// Q5_K: 5.5 bpw. Q4_K plus a fifth bit per element in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

/// Q6_K: 6.5625 bpw. 4 low bits in `ql`, 2 high bits in `qh`, 16 signed 8-bit scales;
/// `x = d * sc * (q - 32)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

/// Q8_K: 9.125 bpw activation format paired with the K-quants. `x = d * q`; `bsums` holds
/// the sum of each group of 16 quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

/// IQ4_NL: 4.5 bpw. `x = d * KVALUES_IQ4NL[q]`, nibble order as Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ4NL {
    pub d: f16,
    pub qs: [u8; QK4_NL / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIQ4NL>() == 18);

/// IQ4_XS: 4.25 bpw. 8 sub-blocks of 32 with 6-bit scales (low 4 bits in `scales_l`, high 2
/// bits in `scales_h`), `x = d * (ls - 32) * KVALUES_IQ4NL[q]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ4XS {
    pub d: f16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIQ4XS>() == 136);

/// The non-linear 4-bit grid of IQ4_NL and IQ4_XS.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Views `bytes` as a slice of blocks `B` without copying.
///
/// Returns `None` when the length is not a whole number of blocks or the start is not
/// aligned for `B` (GGUF tensor data is 32-byte aligned, so mapped tensors always qualify).
pub fn cast_blocks<B: Pod>(bytes: &[u8]) -> Option<&[B]> {
    bytemuck::try_cast_slice(bytes).ok()
}

/// Mutable twin of [`cast_blocks`].
pub fn cast_blocks_mut<B: Pod>(bytes: &mut [u8]) -> Option<&mut [B]> {
    bytemuck::try_cast_slice_mut(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GgmlType;

    #[test]
    fn block_sizes_agree_with_the_type_table() {
        use std::mem::size_of;
        let pairs = [
            (GgmlType::Q4_0, size_of::<BlockQ4_0>()),
            (GgmlType::Q4_1, size_of::<BlockQ4_1>()),
            (GgmlType::Q5_0, size_of::<BlockQ5_0>()),
            (GgmlType::Q5_1, size_of::<BlockQ5_1>()),
            (GgmlType::Q8_0, size_of::<BlockQ8_0>()),
            (GgmlType::Q8_1, size_of::<BlockQ8_1>()),
            (GgmlType::Q2_K, size_of::<BlockQ2K>()),
            (GgmlType::Q3_K, size_of::<BlockQ3K>()),
            (GgmlType::Q4_K, size_of::<BlockQ4K>()),
            (GgmlType::Q5_K, size_of::<BlockQ5K>()),
            (GgmlType::Q6_K, size_of::<BlockQ6K>()),
            (GgmlType::Q8_K, size_of::<BlockQ8K>()),
            (GgmlType::IQ4_NL, size_of::<BlockIQ4NL>()),
            (GgmlType::IQ4_XS, size_of::<BlockIQ4XS>()),
        ];
        for (ty, size) in pairs {
            assert_eq!(ty.type_size(), size, "{ty}");
        }
    }
}
