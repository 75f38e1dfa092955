//! AVX2 kernels of the repack order, eight weight rows per pass: one lane per row, as in
//! ggml's interleaved blocks. Each row's integer sums of a span are reduced exactly into
//! its lane, then one vector FMA per span folds them into the eight accumulators, which
//! is the scalar twins' arithmetic lane by lane. The Q4_K gemm also takes four activation
//! rows per pass (the scales decoded once); Q4_0 and IQ4_NL live in `x86_b32`.

use std::arch::x86_64::*;

use super::x86_b32::{self, Integer};
use super::x86_wide::Wide;
use super::{iq4_nl, q2_k, q4_0, q4_k, rows_by_dot, RowsFn};
use crate::dequant::scale_min_k4;
use crate::dot::{activation_format, activation_row_bytes, DotFn, SimdLevel};
use crate::GgmlType;

/// Bytes of a Q8_K activation block (`d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]`).
const Q8_K_BYTES: usize = 292;
/// Offset of `bsums` in a Q8_K block.
const Q8_K_BSUMS: usize = 260;

/// The eight-row kernels `(gemv, gemm)` of `ty` for `level`; only called once AVX2, FMA
/// and F16C were detected.
pub(super) fn rows(ty: GgmlType, level: SimdLevel) -> Option<(RowsFn, RowsFn)> {
    let integer = if level == SimdLevel::Avx512Vnni && SimdLevel::Avx512Vnni.is_available() {
        Integer::Avx512Vnni
    } else if level == SimdLevel::AvxVnni && SimdLevel::AvxVnni.is_available() {
        Integer::AvxVnni
    } else {
        Integer::Avx2
    };
    macro_rules! b32 {
        ($iq4_nl:literal, $twin:path, $integer:expr) => {{
            fn rows(n: usize, weight_rows: &[u8], activations: &[u8], out: &mut [f32]) {
                let (one, four) = x86_b32::kernels($iq4_nl, $integer);
                let ty = if $iq4_nl {
                    GgmlType::IQ4_NL
                } else {
                    GgmlType::Q4_0
                };
                let wide = match ($integer, $iq4_nl) {
                    (Integer::Avx512Vnni, false) => Some(Wide::Q4_0),
                    (Integer::Avx512Vnni, true) => Some(Wide::Iq4Nl),
                    (Integer::AvxVnni, false) => Some(Wide::Q4_0Eight { vnni: true }),
                    (Integer::AvxVnni, true) => Some(Wide::Iq4NlEight { vnni: true }),
                    (Integer::Avx2, false) => Some(Wide::Q4_0Eight { vnni: false }),
                    (Integer::Avx2, true) => Some(Wide::Iq4NlEight { vnni: false }),
                };
                drive(
                    ty,
                    (n, weight_rows, activations, out),
                    (one, Some(four), wide),
                    $twin,
                );
            }
            rows as RowsFn
        }};
    }
    macro_rules! b32_levels {
        ($iq4_nl:literal, $twin:path) => {
            match integer {
                Integer::Avx2 => b32!($iq4_nl, $twin, Integer::Avx2),
                Integer::AvxVnni => b32!($iq4_nl, $twin, Integer::AvxVnni),
                Integer::Avx512Vnni => b32!($iq4_nl, $twin, Integer::Avx512Vnni),
            }
        };
    }
    Some(match ty {
        GgmlType::Q4_0 => {
            let kernel = b32_levels!(false, q4_0::dot_q4_0);
            (kernel, kernel)
        }
        GgmlType::IQ4_NL => {
            let kernel = b32_levels!(true, iq4_nl::dot_iq4_nl);
            (kernel, kernel)
        }
        GgmlType::Q2_K => (rows_q2_k_gemv, rows_q2_k_gemm),
        GgmlType::Q4_K if integer == Integer::Avx512Vnni => {
            (rows_q4_k_gemv_wide, rows_q4_k_gemm_wide)
        }
        GgmlType::Q4_K => (rows_q4_k_gemv, rows_q4_k_gemm),
        _ => return None,
    })
}

/// A kernel over exactly eight weight rows and one (or, for a gemm kernel, four)
/// activation rows: `(n, rows, row_bytes, activations, activation_bytes, out,
/// out_stride)`, writing `out[t * out_stride + r]`.
pub(super) type GroupFn = unsafe fn(usize, *const u8, usize, *const u8, usize, *mut f32, usize);

/// Checks the shapes (see [`RowsFn`]); with `wide` (on AVX-512 VNNI) runs its
/// sixteen-row kernels on every whole group of sixteen weight rows; then `four` on every group of eight weight rows and four
/// activation rows, `one` on every group of eight weight rows and a remaining activation
/// row, and the scalar `twin` on the weight rows left over.
fn drive(
    ty: GgmlType,
    (n, weight_rows, activations, out): (usize, &[u8], &[u8], &mut [f32]),
    (one, four, wide): (GroupFn, Option<GroupFn>, Option<Wide>),
    twin: DotFn,
) {
    let row_bytes = ty
        .row_bytes(n as u64)
        .unwrap_or_else(|| panic!("{n} elements is not a whole number of {ty} blocks"))
        as usize;
    let format = activation_format(ty).expect("repacked types have an activation format");
    let activation_bytes = activation_row_bytes(format, n);
    assert!(
        weight_rows.len().is_multiple_of(row_bytes)
            && activations.len().is_multiple_of(activation_bytes),
        "{} bytes of {ty} rows or {} bytes of {format:?} activations for {n} elements",
        weight_rows.len(),
        activations.len()
    );
    let (count, tokens) = (
        weight_rows.len() / row_bytes,
        activations.len() / activation_bytes,
    );
    assert_eq!(
        out.len(),
        count * tokens,
        "{count} {ty} rows x {tokens} activation rows"
    );
    let groups = count / 8;
    let mut first_group = 0;
    if let Some(wide) = wide {
        if count >= wide.rows() && wide.fits(n, row_bytes) {
            // SAFETY: `wide` is only set for kernels handed out where their level (AVX-512
            // VNNI with F, BW, VL; AVX-VNNI; AVX2, each with AVX2, FMA and F16C) was
            // available; the shapes were checked above,
            // `fits` checked the kernels' limits and `out` holds `tokens * count` floats.
            unsafe {
                wide.run(
                    n,
                    (weight_rows.as_ptr(), row_bytes, count),
                    (activations.as_ptr(), activation_bytes, tokens),
                    out.as_mut_ptr(),
                )
            };
            first_group = count / wide.rows() * wide.rows() / 8;
        }
    }
    for g in first_group..groups {
        let mut t = 0;
        while t < tokens {
            let (kernel, step) = match four {
                Some(four) if t + 4 <= tokens => (four, 4),
                _ => (one, 1),
            };
            // SAFETY: `rows` hands these kernels out only where `SimdLevel::Avx2` was
            // available (`ggml_repack::repack_rows_fn` checks `is_available` before
            // calling it), and the VNNI variants only where `is_available` confirmed
            // their level; group `g` holds eight whole rows of
            // `n` elements, activation rows `t..t + step` are whole (both checked
            // above), and `out[(t + s) * count + 8 g + r]` for s < step, r < 8 is inside
            // `out`.
            unsafe {
                kernel(
                    n,
                    weight_rows.as_ptr().add(8 * g * row_bytes),
                    row_bytes,
                    activations.as_ptr().add(t * activation_bytes),
                    activation_bytes,
                    out.as_mut_ptr().add(t * count + 8 * g),
                    count,
                )
            };
            t += step;
        }
    }
    for (activation, out) in activations
        .chunks_exact(activation_bytes)
        .zip(out.chunks_exact_mut(count))
    {
        let tail = &weight_rows[8 * groups * row_bytes..];
        rows_by_dot(n, tail, activation, &mut out[8 * groups..], twin);
    }
}

/// One-activation-row kernels of the K-quants, as [`GroupFn`]s.
macro_rules! k_rows {
    ($name:ident, $ty:expr, $group:ident, $twin:path) => {
        fn $name(n: usize, weight_rows: &[u8], activations: &[u8], out: &mut [f32]) {
            let args = (n, weight_rows, activations, out);
            drive($ty, args, ($group as GroupFn, None, None), $twin);
        }
    };
}

k_rows!(
    rows_q4_k_gemv,
    GgmlType::Q4_K,
    group_q4_k_gemv,
    q4_k::dot_q4_k_gemv
);
fn rows_q4_k_gemm(n: usize, weight_rows: &[u8], activations: &[u8], out: &mut [f32]) {
    rows_q4_k_gemm_with(n, weight_rows, activations, out, None);
}
fn rows_q4_k_gemm_with(
    n: usize,
    weight_rows: &[u8],
    activations: &[u8],
    out: &mut [f32],
    wide: Option<Wide>,
) {
    let args = (n, weight_rows, activations, out);
    let kernels = (
        group_q4_k_gemm as GroupFn,
        Some(group_q4_k_gemm4 as GroupFn),
        wide,
    );
    drive(GgmlType::Q4_K, args, kernels, q4_k::dot_q4_k_gemm);
}
/// Q4_K with the sixteen-row kernels first (only handed out where AVX-512 VNNI is).
fn rows_q4_k_gemv_wide(n: usize, weight_rows: &[u8], activations: &[u8], out: &mut [f32]) {
    let args = (n, weight_rows, activations, out);
    let kernels = (group_q4_k_gemv as GroupFn, None, Some(Wide::Q4KGemv));
    drive(GgmlType::Q4_K, args, kernels, q4_k::dot_q4_k_gemv);
}
fn rows_q4_k_gemm_wide(n: usize, weight_rows: &[u8], activations: &[u8], out: &mut [f32]) {
    rows_q4_k_gemm_with(n, weight_rows, activations, out, Some(Wide::Q4KGemm));
}
k_rows!(
    rows_q2_k_gemv,
    GgmlType::Q2_K,
    group_q2_k_gemv,
    q2_k::dot_q2_k_gemv
);
k_rows!(
    rows_q2_k_gemm,
    GgmlType::Q2_K,
    group_q2_k_gemm,
    q2_k::dot_q2_k_gemm
);

/// Lane `r` = the sum of the eight i32 of `v[r]` (exact, so the order is free).
///
/// # Safety
/// AVX2 is available.
#[inline(always)]
pub(super) unsafe fn reduce8(v: &[__m256i; 8]) -> __m256i {
    let t0 = _mm256_hadd_epi32(v[0], v[1]);
    let t1 = _mm256_hadd_epi32(v[2], v[3]);
    let t2 = _mm256_hadd_epi32(v[4], v[5]);
    let t3 = _mm256_hadd_epi32(v[6], v[7]);
    // [r0..r3 of elements 0..4 | r0..r3 of elements 4..8], then the same for r4..r7.
    let u0 = _mm256_hadd_epi32(t0, t1);
    let u1 = _mm256_hadd_epi32(t2, t3);
    _mm256_add_epi32(
        _mm256_permute2x128_si256(u0, u1, 0x20),
        _mm256_permute2x128_si256(u0, u1, 0x31),
    )
}

/// The f16 at `offset` of each of eight rows `row_bytes` apart, widened (exactly).
///
/// # Safety
/// AVX and F16C are available; the two bytes at `rows + r * row_bytes + offset` are
/// readable for every `r < 8`.
#[inline(always)]
pub(super) unsafe fn f16x8(rows: *const u8, row_bytes: usize, offset: usize) -> __m256 {
    let h = |r: usize| {
        rows.add(r * row_bytes + offset)
            .cast::<i16>()
            .read_unaligned()
    };
    _mm256_cvtph_ps(_mm_setr_epi16(
        h(0),
        h(1),
        h(2),
        h(3),
        h(4),
        h(5),
        h(6),
        h(7),
    ))
}

/// Q4_K, one FMA per `span_chunks` 64-element chunks (4 for the gemv, 1 for the gemm),
/// eight weight rows against `T` activation rows (`activation_bytes` apart), writing
/// `out[t * out_stride + r]`; the scales are decoded once for the `T` rows.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn group_q4_k<const T: usize>(
    n: usize,
    rows: *const u8,
    row_bytes: usize,
    activations: *const u8,
    activation_bytes: usize,
    out: *mut f32,
    out_stride: usize,
    span_chunks: usize,
) {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); T];
    let mut acc_min = [_mm256_setzero_ps(); T];
    for b in 0..n / 256 {
        let base = rows.add(b * 144);
        let d_w = f16x8(base, row_bytes, 0);
        let dmin_w = f16x8(base, row_bytes, 2);
        // [row][sub-block] scales and minimums.
        let mut scales = [[0i16; 8]; 8];
        let mut mins = [[0i32; 8]; 8];
        for r in 0..8 {
            let packed: [u8; 12] = base
                .add(r * row_bytes + 4)
                .cast::<[u8; 12]>()
                .read_unaligned();
            for j in 0..8 {
                let (s, m) = scale_min_k4(j, &packed);
                scales[r][j] = i16::from(s);
                mins[r][j] = i32::from(m);
            }
        }
        for t in 0..T {
            let a = activations.add(t * activation_bytes + b * Q8_K_BYTES);
            let d_a = _mm256_set1_ps(a.cast::<f32>().read_unaligned());
            let scale = _mm256_mul_ps(d_w, d_a);
            let scale_min = _mm256_mul_ps(dmin_w, d_a);
            // Sums of 32 activations per sub-block.
            let bsums = a.add(Q8_K_BSUMS).cast::<[i16; 16]>().read_unaligned();
            let mut sub_sums = [0i32; 8];
            for j in 0..8 {
                sub_sums[j] = i32::from(bsums[2 * j]) + i32::from(bsums[2 * j + 1]);
            }
            for first in (0..4).step_by(span_chunks) {
                let mut v = [_mm256_setzero_si256(); 8];
                let mut imin = [0i32; 8];
                for c in first..first + span_chunks {
                    let a_low = _mm256_loadu_si256(a.add(4 + 64 * c).cast());
                    let a_high = _mm256_loadu_si256(a.add(4 + 64 * c + 32).cast());
                    for r in 0..8 {
                        let q = _mm256_loadu_si256(base.add(r * row_bytes + 16 + 32 * c).cast());
                        let low = _mm256_and_si256(q, m4);
                        let high = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                        let p_low = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(low, a_low),
                            _mm256_set1_epi16(scales[r][2 * c]),
                        );
                        let p_high = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(high, a_high),
                            _mm256_set1_epi16(scales[r][2 * c + 1]),
                        );
                        v[r] = _mm256_add_epi32(v[r], _mm256_add_epi32(p_low, p_high));
                        imin[r] += mins[r][2 * c] * sub_sums[2 * c]
                            + mins[r][2 * c + 1] * sub_sums[2 * c + 1];
                    }
                }
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(&v)), scale, acc[t]);
                let imin = _mm256_loadu_si256(imin.as_ptr().cast());
                acc_min[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), scale_min, acc_min[t]);
            }
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(out.add(t * out_stride), _mm256_sub_ps(acc[t], acc_min[t]));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_q4_k_gemv(
    n: usize,
    w: *const u8,
    rb: usize,
    a: *const u8,
    ab: usize,
    o: *mut f32,
    os: usize,
) {
    group_q4_k::<1>(n, w, rb, a, ab, o, os, 4);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_q4_k_gemm(
    n: usize,
    w: *const u8,
    rb: usize,
    a: *const u8,
    ab: usize,
    o: *mut f32,
    os: usize,
) {
    group_q4_k::<1>(n, w, rb, a, ab, o, os, 1);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_q4_k_gemm4(
    n: usize,
    w: *const u8,
    rb: usize,
    a: *const u8,
    ab: usize,
    o: *mut f32,
    os: usize,
) {
    group_q4_k::<4>(n, w, rb, a, ab, o, os, 1);
}

/// Q2_K, one FMA per `span_halves` 128-element halves (2 for the gemv, 1 for the gemm).
#[inline(always)]
unsafe fn group_q2_k(
    n: usize,
    rows: *const u8,
    row_bytes: usize,
    activation: *const u8,
    out: *mut f32,
    span_halves: usize,
) {
    let m3 = _mm256_set1_epi8(3);
    let mut acc = _mm256_setzero_ps();
    let mut acc_min = _mm256_setzero_ps();
    for b in 0..n / 256 {
        let a = activation.add(b * Q8_K_BYTES);
        let d_a = _mm256_set1_ps(a.cast::<f32>().read_unaligned());
        let base = rows.add(b * 84);
        let scale = _mm256_mul_ps(f16x8(base, row_bytes, 80), d_a);
        let scale_min = _mm256_mul_ps(f16x8(base, row_bytes, 82), d_a);
        let bsums = a.add(Q8_K_BSUMS).cast::<[i16; 16]>().read_unaligned();
        for first in (0..2).step_by(span_halves) {
            let mut v = [_mm256_setzero_si256(); 8];
            let mut imin = [0i32; 8];
            for half in first..first + span_halves {
                let a_parts: [__m256i; 4] = std::array::from_fn(|j| {
                    _mm256_loadu_si256(a.add(4 + 128 * half + 32 * j).cast())
                });
                for r in 0..8 {
                    let block = base.add(r * row_bytes);
                    let scales = block.cast::<[u8; 16]>().read_unaligned();
                    let packed = _mm256_loadu_si256(block.add(16 + 32 * half).cast());
                    for (j, a_part) in a_parts.iter().enumerate() {
                        let shifted = _mm256_srl_epi16(packed, _mm_cvtsi32_si128(2 * j as i32));
                        let q = _mm256_and_si256(shifted, m3);
                        let k = 8 * half + 2 * j;
                        let sub_scales = _mm256_set_m128i(
                            _mm_set1_epi16(i16::from(scales[k + 1] & 0x0f)),
                            _mm_set1_epi16(i16::from(scales[k] & 0x0f)),
                        );
                        let products = _mm256_maddubs_epi16(q, *a_part);
                        v[r] = _mm256_add_epi32(v[r], _mm256_madd_epi16(products, sub_scales));
                    }
                    for k in 8 * half..8 * half + 8 {
                        imin[r] += i32::from(scales[k] >> 4) * i32::from(bsums[k]);
                    }
                }
            }
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(&v)), scale, acc);
            let imin = _mm256_loadu_si256(imin.as_ptr().cast());
            acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), scale_min, acc_min);
        }
    }
    _mm256_storeu_ps(out, _mm256_sub_ps(acc, acc_min));
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_q2_k_gemv(
    n: usize,
    rows: *const u8,
    rb: usize,
    a: *const u8,
    _ab: usize,
    out: *mut f32,
    _os: usize,
) {
    group_q2_k(n, rows, rb, a, out, 2);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_q2_k_gemm(
    n: usize,
    rows: *const u8,
    rb: usize,
    a: *const u8,
    _ab: usize,
    out: *mut f32,
    _os: usize,
) {
    group_q2_k(n, rows, rb, a, out, 1);
}
