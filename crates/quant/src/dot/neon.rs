//! aarch64 Advanced SIMD kernels for the most common formats (Q4_0, Q4_1, Q8_0), in the
//! same eight-lane order as the scalar twins (two four-lane f32 accumulators; lane sums of
//! four adjacent products built with `vmull_s8` and pairwise adds, which needs no `dotprod`
//! extension). Other types fall back to the scalar twins.
//!
//! Compiled and type-checked for `aarch64-unknown-linux-gnu`; not yet run on hardware.

use std::arch::aarch64::*;

use super::{checked_blocks, looped, DotFn, MultiDotFn, SimdLevel};
use crate::GgmlType;

/// Eight lane sums (lanes 0..4, 4..8) of 32 i8 x i8 products.
#[inline(always)]
unsafe fn lane_sums(q: [int8x16_t; 2], y: [int8x16_t; 2]) -> (int32x4_t, int32x4_t) {
    let mut pairs = [vdupq_n_s32(0); 4];
    for half in 0..2 {
        let low = vmull_s8(vget_low_s8(q[half]), vget_low_s8(y[half]));
        let high = vmull_s8(vget_high_s8(q[half]), vget_high_s8(y[half]));
        pairs[2 * half] = vpaddlq_s16(low);
        pairs[2 * half + 1] = vpaddlq_s16(high);
    }
    // pairs[k] holds sums of products 2j, 2j+1 for 8 elements; adjacent pairs give quads.
    let first = vpaddq_s32(pairs[0], pairs[1]);
    let second = vpaddq_s32(pairs[2], pairs[3]);
    (first, second)
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    half::f16::from_bits(p.cast::<u16>().read_unaligned()).to_f32()
}

/// ggml's `hsum_float_8` over lanes (0..4, 4..8).
#[inline(always)]
unsafe fn hsum8(low: float32x4_t, high: float32x4_t) -> f32 {
    let quad = vaddq_f32(low, high);
    let q = [
        vgetq_lane_f32(quad, 0),
        vgetq_lane_f32(quad, 1),
        vgetq_lane_f32(quad, 2),
        vgetq_lane_f32(quad, 3),
    ];
    (q[0] + q[2]) + (q[1] + q[3])
}

/// Weight quants of Q4_0 (`MIN == false`, minus 8) or Q4_1 (unsigned), element order.
#[inline(always)]
unsafe fn nibbles(p: *const u8, offset: i8) -> [int8x16_t; 2] {
    let packed = vld1q_u8(p);
    let low = vreinterpretq_s8_u8(vandq_u8(packed, vdupq_n_u8(0x0f)));
    let high = vreinterpretq_s8_u8(vshrq_n_u8(packed, 4));
    [
        vsubq_s8(low, vdupq_n_s8(offset)),
        vsubq_s8(high, vdupq_n_s8(offset)),
    ]
}

#[target_feature(enable = "neon")]
unsafe fn row<const KIND: u8>(blocks: usize, w: *const u8, a: *const u8) -> f32 {
    // KIND: 0 = Q4_0, 1 = Q4_1, 2 = Q8_0.
    let (block_bytes, act_bytes) = match KIND {
        0 => (18, 34),
        1 => (20, 36),
        _ => (34, 34),
    };
    let mut low = vdupq_n_f32(0.0);
    let mut high = vdupq_n_f32(0.0);
    let mut minimums = 0.0f32;
    for i in 0..blocks {
        let x = w.add(i * block_bytes);
        let y = a.add(i * act_bytes);
        let q = match KIND {
            0 => nibbles(x.add(2), 8),
            1 => nibbles(x.add(4), 0),
            _ => [vld1q_s8(x.add(2).cast()), vld1q_s8(x.add(18).cast())],
        };
        let qs = y.add(act_bytes - 32);
        let ys = [vld1q_s8(qs.cast()), vld1q_s8(qs.add(16).cast())];
        let (s0, s1) = lane_sums(q, ys);
        let d = vdupq_n_f32(f16_at(x) * f16_at(y));
        low = vfmaq_f32(low, d, vcvtq_f32_s32(s0));
        high = vfmaq_f32(high, d, vcvtq_f32_s32(s1));
        if KIND == 1 {
            minimums = f16_at(x.add(2)).mul_add(f16_at(y.add(2)), minimums);
        }
    }
    if KIND == 1 {
        hsum8(low, high) + minimums
    } else {
        hsum8(low, high)
    }
}

macro_rules! entry {
    ($name:ident, $ty:expr, $kind:expr) => {
        fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let blocks = checked_blocks($ty, n, w, a);
            // SAFETY: `dot_fn` and `multi_dot_fn` hand this out only at the NEON level, which
            // `SimdLevel::is_available` confirmed; both rows hold `blocks` blocks
            // (`checked_blocks` above).
            unsafe { row::<$kind>(blocks, w.as_ptr(), a.as_ptr()) }
        }
    };
}

entry!(dot_q4_0, GgmlType::Q4_0, 0);
entry!(dot_q4_1, GgmlType::Q4_1, 1);
entry!(dot_q8_0, GgmlType::Q8_0, 2);

pub(super) fn dot(weight: GgmlType, level: SimdLevel) -> Option<DotFn> {
    if level != SimdLevel::Neon {
        return None;
    }
    Some(match weight {
        GgmlType::Q4_0 => dot_q4_0,
        GgmlType::Q4_1 => dot_q4_1,
        GgmlType::Q8_0 => dot_q8_0,
        _ => return None,
    })
}

pub(super) fn multi_dot(weight: GgmlType, level: SimdLevel) -> Option<MultiDotFn> {
    if level != SimdLevel::Neon {
        return None;
    }
    Some(match weight {
        GgmlType::Q4_0 => looped!(dot_q4_0),
        GgmlType::Q4_1 => looped!(dot_q4_1),
        GgmlType::Q8_0 => looped!(dot_q8_0),
        _ => return None,
    })
}
