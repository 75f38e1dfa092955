//! x86-64 kernels: AVX2 (+FMA, F16C) for every type, 256-bit VNNI (`vpdpbusd`, VEX or EVEX)
//! for the 32-element block formats, 512-bit AVX-512 for the float formats.
//!
//! Every kernel is an `unsafe` function compiled with its `#[target_feature]`s; the safe
//! `DotFn`s handed out by [`dot`] check the row lengths and are only handed out for levels
//! that [`SimdLevel::is_available`] confirmed on this CPU.

mod batched;
pub(super) mod float;
pub(super) mod gather;
pub(crate) mod half;
pub(crate) mod half_native;
mod half_tile;
mod kquants;
mod legacy;
pub(super) mod pairs;
pub(super) mod prepare;

use std::arch::x86_64::*;

use super::{
    looped, DotFn, GemvFn, HalfSums, MultiDotFn, PlainTileRowsFn, SimdLevel, TileFn, TileRowsFn,
};
use crate::cpu::{self, Feature};
use crate::GgmlType;

// The feature checks of this module's kernels, each a question to [`crate::cpu`] (what this
// CPU has, within `RUNIT_CPU_ISA`'s cap).

/// AVX2, FMA and F16C.
pub(crate) fn has_avx2() -> bool {
    cpu::may_use_all(&cpu::AVX2)
}

/// AVX-VNNI (256-bit VEX `vpdpbusd`).
pub(super) fn has_avx_vnni() -> bool {
    cpu::may_use(Feature::AvxVnni)
}

/// AVX-512 F/BW/VL.
pub(crate) fn has_avx512() -> bool {
    cpu::may_use_all(&cpu::AVX512)
}

/// AVX-512 F/BW/VL and DQ.
pub(crate) fn has_avx512_dq() -> bool {
    has_avx512() && cpu::may_use(Feature::Avx512Dq)
}

/// AVX-512 VNNI.
pub(super) fn has_avx512_vnni() -> bool {
    cpu::may_use(Feature::Avx512Vnni)
}

/// The single-row kernel of `weight` written for exactly `level`, if there is one.
pub(super) fn dot(weight: GgmlType, level: SimdLevel) -> Option<DotFn> {
    use GgmlType::*;
    match (level, weight) {
        (SimdLevel::Avx2, F32) => Some(float::dot_f32_avx2),
        (SimdLevel::Avx2, F16) => Some(match level.half_sums() {
            HalfSums::Lanes8 => float::dot_f16_lanes8_avx2,
            HalfSums::Reference => float::dot_f16_avx2,
        }),
        (SimdLevel::Avx2, BF16) => Some(float::dot_bf16_avx2),
        (SimdLevel::Avx512, F32) => Some(float::dot_f32_avx512),
        (SimdLevel::Avx512, F16) => Some(float::dot_f16_avx2),
        (SimdLevel::Avx512, BF16) => Some(float::dot_bf16_avx512),
        (SimdLevel::Avx2, _) => legacy::dot(weight, level).or_else(|| kquants::dot(weight)),
        (SimdLevel::AvxVnni | SimdLevel::Avx512Vnni, _) => legacy::dot(weight, level),
        _ => None,
    }
}

/// The multi-row kernel of `weight` at exactly `level`: a tile kernel where one exists,
/// else a loop over this level's single-row kernel.
pub(super) fn multi_dot(weight: GgmlType, level: SimdLevel) -> Option<MultiDotFn> {
    use GgmlType::*;
    match (level, weight) {
        (SimdLevel::Avx2, F32) => Some(looped!(float::dot_f32_avx2)),
        (SimdLevel::Avx2, F16) => Some(match level.half_sums() {
            HalfSums::Lanes8 => looped!(float::dot_f16_lanes8_avx2),
            HalfSums::Reference => looped!(float::dot_f16_avx2),
        }),
        (SimdLevel::Avx2, BF16) => Some(looped!(float::dot_bf16_avx2)),
        (SimdLevel::Avx512, F32) => Some(looped!(float::dot_f32_avx512)),
        (SimdLevel::Avx512, F16) => Some(looped!(float::dot_f16_avx2)),
        (SimdLevel::Avx512, BF16) => Some(looped!(float::dot_bf16_avx512)),
        (SimdLevel::Avx2, _) => {
            legacy::multi_dot(weight, level).or_else(|| kquants::multi_dot(weight))
        }
        (SimdLevel::AvxVnni | SimdLevel::Avx512Vnni, _) => legacy::multi_dot(weight, level),
        _ => None,
    }
}

/// Sums of four adjacent u8 x i8 products into eight i32 lanes: `vpmaddubsw` + `vpmaddwd`
/// on AVX2 (the i16 pair sums cannot saturate for the operand ranges used here), `vpdpbusd`
/// with VNNI. Both give the same integers.
pub(super) trait Isa {
    /// `a` unsigned, `b` signed.
    ///
    /// # Safety
    /// The implementing type's instructions are available: AVX2, AVX-VNNI or AVX-512 VNNI
    /// with VL.
    unsafe fn dot_u8_i8(a: __m256i, b: __m256i) -> __m256i;
}

/// Plain AVX2.
pub(super) struct Avx2;
/// AVX-VNNI (VEX encoded `vpdpbusd`).
pub(super) struct AvxVnni;
/// AVX-512 VNNI on 256-bit registers (EVEX encoded `vpdpbusd`).
pub(super) struct Avx512Vnni;

impl Isa for Avx2 {
    #[inline(always)]
    unsafe fn dot_u8_i8(a: __m256i, b: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
    }
}

impl Isa for AvxVnni {
    #[inline(always)]
    unsafe fn dot_u8_i8(a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, b)
    }
}

impl Isa for Avx512Vnni {
    #[inline(always)]
    unsafe fn dot_u8_i8(a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
    }
}

/// ggml's `hsum_float_8`.
///
/// # Safety
/// AVX is available (every caller is compiled with AVX2).
#[inline(always)]
pub(super) unsafe fn hsum8(v: __m256) -> f32 {
    let quad = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)))
}

/// The f16 stored at `p` (any alignment), widened with F16C.
///
/// # Safety
/// F16C is available and `p` points at two readable bytes.
#[inline(always)]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    // A broadcast load: `_mm_cvtsi32_si128` becomes a `vpinsrw` into whatever register is
    // free, a false dependency that can chain loop iterations together.
    let bits = p.cast::<u16>().read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(bits as i16)))
}

/// The f16 stored at `p` (any alignment) widened into all eight lanes. Keeping every lane
/// live makes the compiler emit a broadcast load: a scalar form gets folded into a
/// `vpinsrw` merging into an arbitrary register, a false dependency that can chain the
/// loop's iterations through the accumulator.
///
/// # Safety
/// AVX2 and F16C are available and `p` points at two readable bytes.
#[inline(always)]
pub(super) unsafe fn f16_splat(p: *const u8) -> __m256 {
    let bits = p.cast::<u16>().read_unaligned();
    _mm256_cvtph_ps(_mm_set1_epi16(bits as i16))
}

/// 16 bytes of packed nibbles to 32 bytes: low nibbles first, then high nibbles. The
/// bytes are loaded into both halves (`vbroadcasti128`, a plain load) and only the upper
/// half shifted (`vpsrlvq` by 0 and 4), which keeps the shuffle port free (`vinserti128`
/// would use it). A blend of a shifted copy instead lets the compiler drop the broadcast
/// for an insert into whatever register is free, often the accumulator: a false
/// dependency that chains the loop's iterations.
///
/// # Safety
/// AVX2 is available and `p` points at 16 readable bytes.
#[inline(always)]
pub(super) unsafe fn nibbles(p: *const u8) -> __m256i {
    let packed = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
    let both = _mm256_srlv_epi64(packed, _mm256_set_epi64x(4, 4, 0, 0));
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// The 32 bits at `p` spread to 32 bytes: 0xFF where the bit is set, 0 elsewhere.
///
/// # Safety
/// AVX2 is available and `p` points at four readable bytes (any alignment).
#[inline(always)]
pub(super) unsafe fn bits_to_bytes(p: *const u8) -> __m256i {
    let bits = p.cast::<u32>().read_unaligned();
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select)
}

/// The many-weight-rows kernel of `weight` at exactly `level`, if there is one.
pub(super) fn gemv(weight: GgmlType, level: SimdLevel) -> Option<GemvFn> {
    batched::gemv(weight, level)
}

/// The tile kernel (f32 activation scales) of `weight` at exactly `level`, if there is one.
pub(super) fn tile(weight: GgmlType, level: SimdLevel) -> Option<TileFn> {
    batched::tile(weight, level)
}

/// The several-weight-rows tile kernel of `weight` written for exactly `level`, if any.
pub(super) fn tile_rows(weight: GgmlType, level: SimdLevel) -> Option<TileRowsFn> {
    batched::tile_rows_kernel(weight, level)
}

/// The float formats' several-weight-rows kernel of `weight` at exactly `level`, if any:
/// F16 at the AVX-512 level on CPUs with AVX512-FP16.
pub(super) fn plain_tile_rows(weight: GgmlType, level: SimdLevel) -> Option<PlainTileRowsFn> {
    match (level, weight) {
        (SimdLevel::Avx512, GgmlType::F16) if half_tile::available() => {
            Some(half_tile::tile_rows_f16)
        }
        _ => None,
    }
}
