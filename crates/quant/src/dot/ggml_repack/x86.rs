//! AVX2 kernels of the repack order, eight weight rows per pass: one lane per row, as in
//! ggml's interleaved blocks. Each row's integer sums of a span are reduced exactly into
//! its lane, then one vector FMA per span folds them into the eight accumulators, which
//! is the scalar twins' arithmetic lane by lane.

use std::arch::x86_64::*;

use super::{iq4_nl, q2_k, q4_0, q4_k, rows_by_dot, RowsFn};
use crate::blocks::KVALUES_IQ4NL;
use crate::dequant::scale_min_k4;
use crate::dot::x86::nibbles;
use crate::dot::{activation_format, activation_row_bytes, DotFn};
use crate::GgmlType;

/// Bytes of a Q8_0 activation block.
const Q8_0_BYTES: usize = 34;
/// Bytes of a Q8_K activation block (`d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]`).
const Q8_K_BYTES: usize = 292;
/// Offset of `bsums` in a Q8_K block.
const Q8_K_BSUMS: usize = 260;

/// The eight-row kernels `(gemv, gemm)` of `ty`; only called once AVX2, FMA and F16C
/// were detected.
pub(super) fn rows(ty: GgmlType) -> Option<(RowsFn, RowsFn)> {
    Some(match ty {
        GgmlType::Q4_0 => (rows_q4_0, rows_q4_0),
        GgmlType::IQ4_NL => (rows_iq4_nl, rows_iq4_nl),
        GgmlType::Q2_K => (rows_q2_k_gemv, rows_q2_k_gemm),
        GgmlType::Q4_K => (rows_q4_k_gemv, rows_q4_k_gemm),
        _ => return None,
    })
}

/// A kernel over exactly eight rows: `(n, rows, row_bytes, activation, out)`.
type GroupFn = unsafe fn(usize, *const u8, usize, *const u8, *mut f32);

/// Checks the shapes, runs `group` on every whole group of eight rows and the scalar
/// `twin` on the rows left over.
fn drive(
    ty: GgmlType,
    (n, weight_rows, activation, out): (usize, &[u8], &[u8], &mut [f32]),
    group: GroupFn,
    twin: DotFn,
) {
    let row_bytes = ty
        .row_bytes(n as u64)
        .unwrap_or_else(|| panic!("{n} elements is not a whole number of {ty} blocks"))
        as usize;
    assert_eq!(
        weight_rows.len(),
        out.len() * row_bytes,
        "{} {ty} rows of {n} elements",
        out.len()
    );
    let format = activation_format(ty).expect("repacked types have an activation format");
    assert!(
        activation.len() >= activation_row_bytes(format, n),
        "{format:?} activation row of {} bytes is shorter than {n} elements",
        activation.len()
    );
    let groups = out.len() / 8;
    for g in 0..groups {
        // SAFETY: `rows` hands these kernels out only when AVX2, FMA and F16C are
        // present; group `g` holds eight whole rows of `n` elements and the activation
        // row `n` elements (both checked above); `out` has eight values from `8 g`.
        unsafe {
            group(
                n,
                weight_rows.as_ptr().add(8 * g * row_bytes),
                row_bytes,
                activation.as_ptr(),
                out.as_mut_ptr().add(8 * g),
            )
        };
    }
    rows_by_dot(
        n,
        &weight_rows[8 * groups * row_bytes..],
        activation,
        &mut out[8 * groups..],
        twin,
    );
}

fn rows_q4_0(n: usize, weight_rows: &[u8], activation: &[u8], out: &mut [f32]) {
    let args = (n, weight_rows, activation, out);
    drive(GgmlType::Q4_0, args, group_q4_0, q4_0::dot_q4_0);
}

fn rows_iq4_nl(n: usize, weight_rows: &[u8], activation: &[u8], out: &mut [f32]) {
    let args = (n, weight_rows, activation, out);
    drive(GgmlType::IQ4_NL, args, group_iq4_nl, iq4_nl::dot_iq4_nl);
}

fn rows_q4_k_gemv(n: usize, weight_rows: &[u8], activation: &[u8], out: &mut [f32]) {
    let args = (n, weight_rows, activation, out);
    drive(GgmlType::Q4_K, args, group_q4_k_gemv, q4_k::dot_q4_k_gemv);
}

fn rows_q4_k_gemm(n: usize, weight_rows: &[u8], activation: &[u8], out: &mut [f32]) {
    let args = (n, weight_rows, activation, out);
    drive(GgmlType::Q4_K, args, group_q4_k_gemm, q4_k::dot_q4_k_gemm);
}

fn rows_q2_k_gemv(n: usize, weight_rows: &[u8], activation: &[u8], out: &mut [f32]) {
    let args = (n, weight_rows, activation, out);
    drive(GgmlType::Q2_K, args, group_q2_k_gemv, q2_k::dot_q2_k_gemv);
}

fn rows_q2_k_gemm(n: usize, weight_rows: &[u8], activation: &[u8], out: &mut [f32]) {
    let args = (n, weight_rows, activation, out);
    drive(GgmlType::Q2_K, args, group_q2_k_gemm, q2_k::dot_q2_k_gemm);
}

/// Lane `r` = the sum of the eight i32 of `v[r]` (exact, so the order is free).
#[inline(always)]
unsafe fn reduce8(v: &[__m256i; 8]) -> __m256i {
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
#[inline(always)]
unsafe fn f16x8(rows: *const u8, row_bytes: usize, offset: usize) -> __m256 {
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

/// The f16 at `p`, widened.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    half::f16::from_bits(p.cast::<u16>().read_unaligned()).to_f32()
}

/// Q4_0 / IQ4_NL: eight rows of 18-byte blocks whose nibbles index `table` (16 i8).
#[inline(always)]
unsafe fn group_b32(
    n: usize,
    rows: *const u8,
    row_bytes: usize,
    activation: *const u8,
    out: *mut f32,
    table: &[i8; 16],
) {
    let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr().cast()));
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for b in 0..n / 32 {
        let a = activation.add(b * Q8_0_BYTES);
        let quants = _mm256_loadu_si256(a.add(2).cast());
        let mut v = [_mm256_setzero_si256(); 8];
        for (r, sums) in v.iter_mut().enumerate() {
            let w = _mm256_shuffle_epi8(lut, nibbles(rows.add(r * row_bytes + b * 18 + 2)));
            let products =
                _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(quants, w));
            *sums = _mm256_madd_epi16(products, ones);
        }
        let scale = _mm256_mul_ps(
            f16x8(rows.add(b * 18), row_bytes, 0),
            _mm256_set1_ps(f16_at(a)),
        );
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(&v)), scale, acc);
    }
    _mm256_storeu_ps(out, acc);
}

/// The signed 4-bit values of Q4_0 (`q - 8`).
const Q4_0_VALUES: [i8; 16] = [-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7];

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_q4_0(n: usize, rows: *const u8, rb: usize, a: *const u8, out: *mut f32) {
    group_b32(n, rows, rb, a, out, &Q4_0_VALUES);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_iq4_nl(n: usize, rows: *const u8, rb: usize, a: *const u8, out: *mut f32) {
    group_b32(n, rows, rb, a, out, &KVALUES_IQ4NL);
}

/// Q4_K, one FMA per `span_chunks` 64-element chunks (4 for the gemv, 1 for the gemm).
#[inline(always)]
unsafe fn group_q4_k(
    n: usize,
    rows: *const u8,
    row_bytes: usize,
    activation: *const u8,
    out: *mut f32,
    span_chunks: usize,
) {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = _mm256_setzero_ps();
    let mut acc_min = _mm256_setzero_ps();
    for b in 0..n / 256 {
        let a = activation.add(b * Q8_K_BYTES);
        let d_a = _mm256_set1_ps(a.cast::<f32>().read_unaligned());
        let base = rows.add(b * 144);
        let scale = _mm256_mul_ps(f16x8(base, row_bytes, 0), d_a);
        let scale_min = _mm256_mul_ps(f16x8(base, row_bytes, 2), d_a);
        // [row][sub-block] scales and minimums; sums of 32 activations per sub-block.
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
        let bsums = a.add(Q8_K_BSUMS).cast::<[i16; 16]>().read_unaligned();
        let sub_sums: [i32; 8] =
            std::array::from_fn(|j| i32::from(bsums[2 * j]) + i32::from(bsums[2 * j + 1]));
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
                    imin[r] +=
                        mins[r][2 * c] * sub_sums[2 * c] + mins[r][2 * c + 1] * sub_sums[2 * c + 1];
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
unsafe fn group_q4_k_gemv(n: usize, rows: *const u8, rb: usize, a: *const u8, out: *mut f32) {
    group_q4_k(n, rows, rb, a, out, 4);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_q4_k_gemm(n: usize, rows: *const u8, rb: usize, a: *const u8, out: *mut f32) {
    group_q4_k(n, rows, rb, a, out, 1);
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
unsafe fn group_q2_k_gemv(n: usize, rows: *const u8, rb: usize, a: *const u8, out: *mut f32) {
    group_q2_k(n, rows, rb, a, out, 2);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_q2_k_gemm(n: usize, rows: *const u8, rb: usize, a: *const u8, out: *mut f32) {
    group_q2_k(n, rows, rb, a, out, 1);
}
