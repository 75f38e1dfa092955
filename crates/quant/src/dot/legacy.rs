//! Scalar twins of the 32-element block formats against Q8_0 / Q8_1 activations
//! (ggml-cpu's `ggml_vec_dot_{q4_0,q5_0,q8_0,iq4_nl}_q8_0` and `{q4_1,q5_1}_q8_1`, AVX2
//! arithmetic order).

use super::lanes::{block, fma_lanes, hsum8, lane_sums, Lanes};
use super::{checked_blocks, BlockScales, GemvFn, TileFn};
use crate::blocks::{
    BlockIQ4NL, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, KVALUES_IQ4NL,
};
use crate::GgmlType;

/// Low nibbles are elements 0..16, high nibbles 16..32.
pub(crate) fn unpack_nibbles(qs: &[u8; 16]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (j, &byte) in qs.iter().enumerate() {
        out[j] = byte & 0x0f;
        out[j + 16] = byte >> 4;
    }
    out
}

/// Bit `j` of the little-endian `qh` is the fifth bit of element `j`.
pub(crate) fn fifth_bits(qh: [u8; 4]) -> u32 {
    u32::from_le_bytes(qh)
}

fn q4_0_values(b: &BlockQ4_0) -> [i8; 32] {
    unpack_nibbles(&b.qs).map(|q| q as i8 - 8)
}

fn q5_0_values(b: &BlockQ5_0) -> [i8; 32] {
    let high = fifth_bits(b.qh);
    let mut out = [0i8; 32];
    for (j, q) in unpack_nibbles(&b.qs).into_iter().enumerate() {
        out[j] = (q | (((high >> j) & 1) as u8) << 4) as i8 - 16;
    }
    out
}

fn q5_1_values(b: &BlockQ5_1) -> [u8; 32] {
    let high = fifth_bits(b.qh);
    let mut out = unpack_nibbles(&b.qs);
    for (j, q) in out.iter_mut().enumerate() {
        *q |= (((high >> j) & 1) as u8) << 4;
    }
    out
}

/// Sum over blocks of `d_w * d_a * sumi` in eight lanes.
fn symmetric<W: bytemuck::Pod>(
    ty: GgmlType,
    n: usize,
    weight_row: &[u8],
    activation_row: &[u8],
    values: impl Fn(&W) -> ([i8; 32], f32),
) -> f32 {
    let blocks = checked_blocks(ty, n, weight_row, activation_row);
    let mut acc: Lanes = [0.0; 8];
    for i in 0..blocks {
        let (q, d) = values(&block::<W>(weight_row, i));
        let a: BlockQ8_0 = block(activation_row, i);
        fma_lanes(&mut acc, d * a.d.to_f32(), &lane_sums(&q, &a.qs));
    }
    hsum8(&acc)
}

/// Sum over blocks of `d_w * d_a * sumi` in eight lanes plus `m * s` in a scalar.
fn with_minimum<W: bytemuck::Pod>(
    ty: GgmlType,
    n: usize,
    weight_row: &[u8],
    activation_row: &[u8],
    values: impl Fn(&W) -> ([u8; 32], f32, f32),
) -> f32 {
    let blocks = checked_blocks(ty, n, weight_row, activation_row);
    let mut acc: Lanes = [0.0; 8];
    let mut minimums = 0.0f32;
    for i in 0..blocks {
        let (q, d, m) = values(&block::<W>(weight_row, i));
        let a: BlockQ8_1 = block(activation_row, i);
        minimums = m.mul_add(a.s.to_f32(), minimums);
        fma_lanes(&mut acc, d * a.d.to_f32(), &lane_sums(&q, &a.qs));
    }
    hsum8(&acc) + minimums
}

/// Q4_0 x Q8_0.
pub(crate) fn dot_q4_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    symmetric(GgmlType::Q4_0, n, w, a, |b: &BlockQ4_0| {
        (q4_0_values(b), b.d.to_f32())
    })
}

/// Q5_0 x Q8_0.
pub(crate) fn dot_q5_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    symmetric(GgmlType::Q5_0, n, w, a, |b: &BlockQ5_0| {
        (q5_0_values(b), b.d.to_f32())
    })
}

/// Q8_0 x Q8_0.
pub(crate) fn dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    symmetric(GgmlType::Q8_0, n, w, a, |b: &BlockQ8_0| {
        (b.qs, b.d.to_f32())
    })
}

/// Q4_1 x Q8_1.
pub(crate) fn dot_q4_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    with_minimum(GgmlType::Q4_1, n, w, a, |b: &BlockQ4_1| {
        (unpack_nibbles(&b.qs), b.d.to_f32(), b.m.to_f32())
    })
}

/// Q5_1 x Q8_1.
pub(crate) fn dot_q5_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    with_minimum(GgmlType::Q5_1, n, w, a, |b: &BlockQ5_1| {
        (q5_1_values(b), b.d.to_f32(), b.m.to_f32())
    })
}

/// IQ4_NL x Q8_0. ggml's AVX2 loop takes blocks in pairs with one accumulator for even and
/// one for odd blocks, adds them, and finishes an odd last block with a scalar FMA.
pub(crate) fn dot_iq4_nl(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let blocks = checked_blocks(GgmlType::IQ4_NL, n, w, a);
    let mut even: Lanes = [0.0; 8];
    let mut odd: Lanes = [0.0; 8];
    let contribution = |i: usize| {
        let b: BlockIQ4NL = block(w, i);
        let act: BlockQ8_0 = block(a, i);
        let q = unpack_nibbles(&b.qs).map(|q| KVALUES_IQ4NL[usize::from(q)]);
        (act.d.to_f32() * b.d.to_f32(), lane_sums(&q, &act.qs))
    };
    let pairs = blocks / 2;
    for pair in 0..pairs {
        let (d, sums) = contribution(2 * pair);
        fma_lanes(&mut even, d, &sums);
        let (d, sums) = contribution(2 * pair + 1);
        fma_lanes(&mut odd, d, &sums);
    }
    let mut both: Lanes = [0.0; 8];
    for k in 0..8 {
        both[k] = even[k] + odd[k];
    }
    let mut sum = hsum8(&both);
    if blocks % 2 == 1 {
        let (d, sums) = contribution(blocks - 1);
        sum = d.mul_add(sums.iter().sum::<i32>() as f32, sum);
    }
    sum
}

/// Scalar twins of the batched kernels: one single-row call per weight row.
macro_rules! gemv_by_rows {
    ($dot:path) => {{
        fn gemv(n: usize, weight_rows: &[u8], activation_row: &[u8], out: &mut [f32]) {
            if out.is_empty() {
                return;
            }
            let row_bytes = weight_rows.len() / out.len();
            for (value, row) in out.iter_mut().zip(weight_rows.chunks_exact(row_bytes)) {
                *value = $dot(n, row, activation_row);
            }
        }
        gemv as GemvFn
    }};
}

/// Scalar twins of the tile kernels: one single-row call per activation row (the f32
/// scale tables hold the same values as the blocks, so they are not needed here).
macro_rules! tile_by_rows {
    ($dot:path) => {{
        fn tile(
            n: usize,
            weight_row: &[u8],
            activations: &[u8],
            _: BlockScales<'_>,
            out: &mut [f32],
        ) {
            crate::dot::multi_by_rows(n, weight_row, activations, out, $dot);
        }
        tile as TileFn
    }};
}

/// The scalar gemv twin of a 32-element format.
pub(crate) fn gemv(weight: GgmlType) -> Option<GemvFn> {
    Some(match weight {
        GgmlType::Q4_0 => gemv_by_rows!(dot_q4_0),
        GgmlType::Q4_1 => gemv_by_rows!(dot_q4_1),
        GgmlType::Q5_0 => gemv_by_rows!(dot_q5_0),
        GgmlType::Q5_1 => gemv_by_rows!(dot_q5_1),
        GgmlType::Q8_0 => gemv_by_rows!(dot_q8_0),
        _ => return None,
    })
}

/// The scalar tile twin of a 32-element format.
pub(crate) fn tile(weight: GgmlType) -> Option<TileFn> {
    Some(match weight {
        GgmlType::Q4_0 => tile_by_rows!(dot_q4_0),
        GgmlType::Q4_1 => tile_by_rows!(dot_q4_1),
        GgmlType::Q5_0 => tile_by_rows!(dot_q5_0),
        GgmlType::Q5_1 => tile_by_rows!(dot_q5_1),
        GgmlType::Q8_0 => tile_by_rows!(dot_q8_0),
        _ => return None,
    })
}
