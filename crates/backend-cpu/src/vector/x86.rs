//! AVX2 + FMA + F16C versions of the vector kernels, with the same lane structure as the
//! scalar twins in `super` (bit-identical results).
//!
//! Every function is `unsafe` because it requires those CPU features: callers hold an
//! `Isa::Avx2`, which only `Isa::detect` makes, after runtime detection.

use std::arch::x86_64::*;

use half::f16;
use runit_quant::blocks::{BlockQ4_0, BlockQ8_0};

use super::DOT_LANES;

/// f32 lanes of one AVX2 register.
const HALF: usize = 8;

/// The eight f64 partial sums, held as lanes 0-3 and 4-7, added in `super::reduce`'s order.
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce(low: __m256d, high: __m256d) -> f64 {
    // [0+4, 1+5, 2+6, 3+7], then [(0+4) + (2+6), (1+5) + (3+7)], then their sum.
    let pairs = _mm256_add_pd(low, high);
    let folded = _mm_add_pd(
        _mm256_castpd256_pd128(pairs),
        _mm256_extractf128_pd::<1>(pairs),
    );
    _mm_cvtsd_f64(folded) + _mm_cvtsd_f64(_mm_unpackhi_pd(folded, folded))
}

/// Adds the 8 f32 lanes of `products`, widened to f64, to the partial sums.
#[target_feature(enable = "avx2,fma,f16c")]
fn accumulate(low: &mut __m256d, high: &mut __m256d, products: __m256) {
    *low = _mm256_add_pd(*low, _mm256_cvtps_pd(_mm256_castps256_ps128(products)));
    *high = _mm256_add_pd(*high, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(products)));
}

/// Loads 8 f16 values from `p` widened to f32.
///
/// # Safety
/// `p` must point at 8 readable f16 values.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_f16(p: *const f16) -> __m256 {
    // SAFETY: the caller promises 8 readable values; `loadu` accepts any alignment.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.cast::<__m128i>()) })
}

/// Rounds 8 f32 lanes to f16 (nearest even) and stores them at `p`.
///
/// # Safety
/// `p` must point at 8 writable f16 values.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store_f16(p: *mut f16, v: __m256) {
    let packed = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
    // SAFETY: the caller promises 8 writable values; `storeu` accepts any alignment.
    unsafe { _mm_storeu_si128(p.cast::<__m128i>(), packed) }
}

/// AVX2 twin of [`super::dot_f16`].
///
/// # Safety
/// Requires AVX2, FMA and F16C; `a.len() == b.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f16(a: &[f16], b: &[f16]) -> f32 {
    let n = a.len().min(b.len());
    let body = n / DOT_LANES * DOT_LANES;
    let (mut low, mut high) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 8 <= body <= n` for both slices.
        let (x, y) = unsafe { (load_f16(a.as_ptr().add(i)), load_f16(b.as_ptr().add(i))) };
        accumulate(&mut low, &mut high, _mm256_mul_ps(x, y));
        i += DOT_LANES;
    }
    let mut sum = reduce(low, high);
    for (x, y) in a[body..n].iter().zip(&b[body..n]) {
        sum += f64::from(x.to_f32() * y.to_f32());
    }
    sum as f32
}

/// AVX2 twin of [`super::dot_f32`].
///
/// # Safety
/// Requires AVX2, FMA and F16C; `a.len() == b.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let body = n / DOT_LANES * DOT_LANES;
    let (mut low, mut high) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 8 <= body <= n` for both slices.
        let (x, y) = unsafe {
            (
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_loadu_ps(b.as_ptr().add(i)),
            )
        };
        accumulate(&mut low, &mut high, _mm256_mul_ps(x, y));
        i += DOT_LANES;
    }
    let mut sum = reduce(low, high);
    for (x, y) in a[body..n].iter().zip(&b[body..n]) {
        sum += f64::from(x * y);
    }
    sum as f32
}

/// AVX2 twin of [`super::mad_f16`].
///
/// # Safety
/// Requires AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn mad_f16(y: &mut [f16], x: &[f16], v: f32) {
    let n = x.len().min(y.len());
    let body = n / HALF * HALF;
    let scale = _mm256_set1_ps(v);
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 8 <= body <= n` for both slices.
        unsafe {
            let acc = load_f16(y.as_ptr().add(i));
            let value = load_f16(x.as_ptr().add(i));
            store_f16(y.as_mut_ptr().add(i), _mm256_fmadd_ps(value, scale, acc));
        }
        i += HALF;
    }
    for (out, value) in y[body..n].iter_mut().zip(&x[body..n]) {
        *out = f16::from_f32(value.to_f32().mul_add(v, out.to_f32()));
    }
}

/// AVX2 twin of [`super::scale_f16`].
///
/// # Safety
/// Requires AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scale_f16(y: &mut [f16], v: f32) {
    let n = y.len();
    let body = n / HALF * HALF;
    let scale = _mm256_set1_ps(v);
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 8 <= body <= n`.
        unsafe {
            let acc = load_f16(y.as_ptr().add(i));
            store_f16(y.as_mut_ptr().add(i), _mm256_mul_ps(acc, scale));
        }
        i += HALF;
    }
    for out in &mut y[body..] {
        *out = f16::from_f32(out.to_f32() * v);
    }
}

/// AVX2 twin of [`super::mad_rows_f32`]: runs of 64 values of `y` stay in eight registers
/// while every row's fused multiply-add goes through them (the same operation per element
/// and the same row order as [`mad_f32`] row by row).
///
/// # Safety
/// Requires AVX2, FMA and F16C; `rows.len() == coefficients.len() * y.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn mad_rows_f32(y: &mut [f32], rows: &[f32], coefficients: &[f32], skip_zero: bool) {
    const RUN: usize = 8 * HALF;
    let width = y.len();
    let body = width / HALF * HALF;
    let mut start = 0;
    while start < body {
        let lanes = ((body - start) / HALF).min(RUN / HALF);
        let mut acc = [_mm256_setzero_ps(); RUN / HALF];
        for (k, acc) in acc.iter_mut().enumerate().take(lanes) {
            // SAFETY: start + 8k + 8 <= body <= width.
            *acc = unsafe { _mm256_loadu_ps(y.as_ptr().add(start + k * HALF)) };
        }
        for (r, &c) in coefficients.iter().enumerate() {
            if skip_zero && c == 0.0 {
                continue;
            }
            let scale = _mm256_set1_ps(c);
            let row = r * width + start;
            for (k, acc) in acc.iter_mut().enumerate().take(lanes) {
                // SAFETY: row + 8k + 8 <= r * width + body <= rows.len(), since
                // r < coefficients.len() and rows.len() == coefficients.len() * width.
                let value = unsafe { _mm256_loadu_ps(rows.as_ptr().add(row + k * HALF)) };
                *acc = _mm256_fmadd_ps(value, scale, *acc);
            }
        }
        for (k, acc) in acc.iter().enumerate().take(lanes) {
            // SAFETY: `start + 8k + 8 <= body <= width`, as for the loads above.
            unsafe { _mm256_storeu_ps(y.as_mut_ptr().add(start + k * HALF), *acc) };
        }
        start += lanes * HALF;
    }
    for (r, &c) in coefficients.iter().enumerate() {
        if skip_zero && c == 0.0 {
            continue;
        }
        for (i, out) in y.iter_mut().enumerate().skip(body) {
            *out = rows[r * width + i].mul_add(c, *out);
        }
    }
}

/// AVX2 twin of [`super::mad_f32`].
///
/// # Safety
/// Requires AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn mad_f32(y: &mut [f32], x: &[f32], v: f32) {
    let n = x.len().min(y.len());
    let body = n / HALF * HALF;
    let scale = _mm256_set1_ps(v);
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 8 <= body <= n` for both slices.
        unsafe {
            let acc = _mm256_loadu_ps(y.as_ptr().add(i));
            let value = _mm256_loadu_ps(x.as_ptr().add(i));
            _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_fmadd_ps(value, scale, acc));
        }
        i += HALF;
    }
    for (out, value) in y[body..n].iter_mut().zip(&x[body..n]) {
        *out = value.mul_add(v, *out);
    }
}

/// [`super::dequant_q8_0`]: eight codes at a time widened to i32, converted (exactly) and
/// multiplied by the block's scale (one rounding, as the scalar twin).
///
/// # Safety
/// Requires AVX2 and F16C; `out.len() >= 32 * blocks.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dequant_q8_0(blocks: &[BlockQ8_0], out: &mut [f32]) {
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = _mm256_set1_ps(block.d.to_f32());
        for part in 0..4 {
            // SAFETY: `qs` holds 32 bytes (8 read at offset 8 part) and `y` 32 values (8
            // written at offset 8 part).
            unsafe {
                let codes = _mm_loadl_epi64(block.qs.as_ptr().add(8 * part).cast());
                let values = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes));
                _mm256_storeu_ps(y.as_mut_ptr().add(8 * part), _mm256_mul_ps(values, d));
            }
        }
    }
}

/// [`super::dequant_q4_0`]: the low nibbles (values 0-15) and the high ones (16-31), less
/// 8, widened, converted and multiplied by the block's scale.
///
/// # Safety
/// Requires AVX2 and F16C; `out.len() >= 32 * blocks.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dequant_q4_0(blocks: &[BlockQ4_0], out: &mut [f32]) {
    let mask = _mm_set1_epi8(0x0f);
    let eight = _mm_set1_epi8(8);
    for (block, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = _mm256_set1_ps(block.d.to_f32());
        // SAFETY: `qs` holds 16 bytes.
        let bytes = unsafe { _mm_loadu_si128(block.qs.as_ptr().cast()) };
        let low = _mm_sub_epi8(_mm_and_si128(bytes, mask), eight);
        let high = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(bytes), mask), eight);
        for (half, codes) in [low, high].into_iter().enumerate() {
            for part in 0..2 {
                let eight_codes = if part == 0 {
                    codes
                } else {
                    _mm_srli_si128::<8>(codes)
                };
                let values = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight_codes));
                // SAFETY: `y` holds 32 values; this writes 8 at offset 16 half + 8 part.
                unsafe {
                    _mm256_storeu_ps(
                        y.as_mut_ptr().add(16 * half + 8 * part),
                        _mm256_mul_ps(values, d),
                    );
                }
            }
        }
    }
}
