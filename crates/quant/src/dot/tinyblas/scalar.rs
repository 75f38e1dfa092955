//! Scalar twins of the tinyBLAS kernels: one output at a time, in exactly the lane order and
//! with exactly the roundings of the AVX-512 code (see the module above).

use super::{check, prepared_unit_bytes, KernelFn, Q0_BLOCK_BYTES};
use crate::blocks::{BlockIQ4NL, BlockQ4_0, BlockQ5_0, BlockQ8_0, KVALUES_IQ4NL};
use crate::dequant::bf16_bits_to_f32;
use crate::dot::float::{f16_element, f32_at};
use crate::dot::lanes::{block, fma_lanes, hsum8, lane_sums, Lanes};
use crate::dot::legacy::{fifth_bits, unpack_nibbles};
use crate::GgmlType;

/// `_mm512_reduce_add_ps`: upper eight lanes onto the lower eight, then `hsum_float_8`.
pub(crate) fn reduce16(lanes: &[f32; 16]) -> f32 {
    let mut eight: Lanes = [0.0; 8];
    for (q, value) in eight.iter_mut().enumerate() {
        *value = lanes[q] + lanes[q + 8];
    }
    hsum8(&eight)
}

/// Flushes an f32 denormal to a zero of the same sign (`vdpbf16ps`'s DAZ and FTZ).
pub(crate) fn flush_denormal(x: f32) -> f32 {
    if x.is_subnormal() {
        f32::from_bits(x.to_bits() & 0x8000_0000)
    } else {
        x
    }
}

/// One `vdpbf16ps` lane step: `acc + w1 * x1`, then `+ w0 * x0`, each a fused multiply-add
/// with denormal inputs read as zero and denormal results flushed.
pub(crate) fn dpbf16_lane(acc: f32, w: [f32; 2], x: [f32; 2]) -> f32 {
    let first =
        flush_denormal(flush_denormal(w[1]).mul_add(flush_denormal(x[1]), flush_denormal(acc)));
    flush_denormal(flush_denormal(w[0]).mul_add(flush_denormal(x[0]), first))
}

/// F32 or F16 weights (element `i` of a row read by `weight`) against f32 activations.
fn float_dot(n: usize, weight: impl Fn(usize) -> f32, x: impl Fn(usize) -> f32) -> f32 {
    let mut lanes = [0.0f32; 16];
    for i in 0..n {
        lanes[i % 16] = weight(i).mul_add(x(i), lanes[i % 16]);
    }
    reduce16(&lanes)
}

/// BF16 weights against BF16 activations, `vdpbf16ps` order.
fn bf16_dot(n: usize, weight: &[u8], x: &[u8]) -> f32 {
    let element = |bytes: &[u8], i: usize| {
        bf16_bits_to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]))
    };
    let mut lanes = [0.0f32; 16];
    for step in (0..n).step_by(32) {
        for (q, lane) in lanes.iter_mut().enumerate() {
            let (even, odd) = (step + 2 * q, step + 2 * q + 1);
            *lane = dpbf16_lane(
                *lane,
                [element(weight, even), element(weight, odd)],
                [element(x, even), element(x, odd)],
            );
        }
    }
    reduce16(&lanes)
}

/// The signed values and scale of weight block `i` of a Q8_0-paired row.
fn q0_block(ty: GgmlType, row: &[u8], i: usize) -> ([i8; 32], f32) {
    match ty {
        GgmlType::Q8_0 => {
            let b: BlockQ8_0 = block(row, i);
            (b.qs, b.d.to_f32())
        }
        GgmlType::Q4_0 => {
            let b: BlockQ4_0 = block(row, i);
            (unpack_nibbles(&b.qs).map(|q| q as i8 - 8), b.d.to_f32())
        }
        GgmlType::Q5_0 => {
            let b: BlockQ5_0 = block(row, i);
            let high = fifth_bits(b.qh);
            let mut values = [0i8; 32];
            for (j, q) in unpack_nibbles(&b.qs).into_iter().enumerate() {
                values[j] = (q | (((high >> j) & 1) as u8) << 4) as i8 - 16;
            }
            (values, b.d.to_f32())
        }
        GgmlType::IQ4_NL => {
            let b: BlockIQ4NL = block(row, i);
            let values = unpack_nibbles(&b.qs).map(|q| KVALUES_IQ4NL[usize::from(q)]);
            (values, b.d.to_f32())
        }
        _ => unreachable!("q0_block is only called for the Q8_0-paired formats"),
    }
}

/// A Q8_0-paired weight row against token `half` (0 or 1) of a prepared unit.
fn q0_dot(ty: GgmlType, blocks: usize, row: &[u8], unit: &[u8], half: usize) -> f32 {
    let mut acc: Lanes = [0.0; 8];
    for i in 0..blocks {
        let (w, d_w) = q0_block(ty, row, i);
        let prepared = &unit[i * Q0_BLOCK_BYTES..(i + 1) * Q0_BLOCK_BYTES];
        let x: [i8; 32] = std::array::from_fn(|j| (prepared[32 * half + j] ^ 0x80) as i8);
        let d_x = f32_at(&prepared[64..], 8 * half);
        fma_lanes(&mut acc, d_w * d_x, &lane_sums(&w, &x));
    }
    hsum8(&acc)
}

/// Every output of a kernel call, one dot product at a time.
fn run(
    ty: GgmlType,
    n: usize,
    weight_rows: &[u8],
    prepared: &[u8],
    tokens: usize,
    out: &mut [f32],
) {
    let rows = check(ty, n, weight_rows, prepared, tokens, out);
    if rows == 0 {
        return;
    }
    let row_bytes = weight_rows.len() / rows;
    let unit_bytes = prepared_unit_bytes(ty, n);
    for (r, row) in weight_rows.chunks_exact(row_bytes).enumerate() {
        for t in 0..tokens {
            out[t * rows + r] = match ty {
                GgmlType::F32 | GgmlType::F16 => {
                    let x = &prepared[t * unit_bytes..(t + 1) * unit_bytes];
                    if ty == GgmlType::F32 {
                        float_dot(n, |i| f32_at(row, i), |i| f32_at(x, i))
                    } else {
                        float_dot(n, |i| f16_element(row, i), |i| f32_at(x, i))
                    }
                }
                GgmlType::BF16 => bf16_dot(n, row, &prepared[t * unit_bytes..(t + 1) * unit_bytes]),
                _ => {
                    let unit = &prepared[t / 2 * unit_bytes..(t / 2 + 1) * unit_bytes];
                    q0_dot(ty, n / 32, row, unit, t % 2)
                }
            };
        }
    }
}

macro_rules! kernel_of {
    ($ty:expr) => {{
        fn kernel(n: usize, w: &[u8], prepared: &[u8], tokens: usize, out: &mut [f32]) {
            run($ty, n, w, prepared, tokens, out);
        }
        kernel as KernelFn
    }};
}

/// The scalar twin of `ty`'s kernel.
pub(super) fn kernel(ty: GgmlType) -> Option<KernelFn> {
    use GgmlType::*;
    Some(match ty {
        F32 => kernel_of!(F32),
        F16 => kernel_of!(F16),
        BF16 => kernel_of!(BF16),
        Q8_0 => kernel_of!(Q8_0),
        Q4_0 => kernel_of!(Q4_0),
        Q5_0 => kernel_of!(Q5_0),
        IQ4_NL => kernel_of!(IQ4_NL),
        _ => return None,
    })
}
