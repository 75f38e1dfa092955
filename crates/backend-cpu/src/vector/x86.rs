//! AVX2 + FMA + F16C versions of the vector kernels (same lane structure as the scalar twins
//! in `super`, so results are bit-identical).
//!
//! Every function is `unsafe` because it requires those CPU features: callers hold an
//! `Isa::Avx2`, which is only made after runtime detection.

use std::arch::x86_64::*;

use half::f16;

use super::{LANES, STEP};

/// `(acc0 + acc1) + (acc2 + acc3)`, then the 8 lanes in `GGML_F32x8_REDUCE` order.
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce(acc: [__m256; 4]) -> f32 {
    let x = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let t = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let t = _mm_hadd_ps(t, t);
    _mm_cvtss_f32(_mm_hadd_ps(t, t))
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
    let body = n / STEP * STEP;
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < body {
        for (j, lane) in acc.iter_mut().enumerate() {
            let at = i + j * LANES;
            // SAFETY: `at + 8 <= body <= n` for both slices.
            let (x, y) = unsafe { (load_f16(a.as_ptr().add(at)), load_f16(b.as_ptr().add(at))) };
            *lane = _mm256_fmadd_ps(x, y, *lane);
        }
        i += STEP;
    }
    let mut sum = f64::from(reduce(acc));
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
    let body = n / STEP * STEP;
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < body {
        for (j, lane) in acc.iter_mut().enumerate() {
            let at = i + j * LANES;
            // SAFETY: `at + 8 <= body <= n` for both slices.
            let (x, y) = unsafe {
                (
                    _mm256_loadu_ps(a.as_ptr().add(at)),
                    _mm256_loadu_ps(b.as_ptr().add(at)),
                )
            };
            *lane = _mm256_fmadd_ps(x, y, *lane);
        }
        i += STEP;
    }
    let mut sum = f64::from(reduce(acc));
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
    let body = n / LANES * LANES;
    let scale = _mm256_set1_ps(v);
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 8 <= body <= n` for both slices.
        unsafe {
            let acc = load_f16(y.as_ptr().add(i));
            let value = load_f16(x.as_ptr().add(i));
            store_f16(y.as_mut_ptr().add(i), _mm256_fmadd_ps(value, scale, acc));
        }
        i += LANES;
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
    let body = n / LANES * LANES;
    let scale = _mm256_set1_ps(v);
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 8 <= body <= n`.
        unsafe {
            let acc = load_f16(y.as_ptr().add(i));
            store_f16(y.as_mut_ptr().add(i), _mm256_mul_ps(acc, scale));
        }
        i += LANES;
    }
    for out in &mut y[body..] {
        *out = f16::from_f32(out.to_f32() * v);
    }
}

/// AVX2 twin of [`super::mad_f32`].
///
/// # Safety
/// Requires AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn mad_f32(y: &mut [f32], x: &[f32], v: f32) {
    let n = x.len().min(y.len());
    let body = n / LANES * LANES;
    let scale = _mm256_set1_ps(v);
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 8 <= body <= n` for both slices.
        unsafe {
            let acc = _mm256_loadu_ps(y.as_ptr().add(i));
            let value = _mm256_loadu_ps(x.as_ptr().add(i));
            _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_fmadd_ps(value, scale, acc));
        }
        i += LANES;
    }
    for (out, value) in y[body..n].iter_mut().zip(&x[body..n]) {
        *out = value.mul_add(v, *out);
    }
}

/// AVX2 twin of [`super::sum_squares`].
///
/// # Safety
/// Requires AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn sum_squares(x: &[f32]) -> f64 {
    let body = x.len() / 4 * 4;
    let mut acc = _mm256_setzero_pd();
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 4 <= body <= x.len()`.
        let v = unsafe { _mm_loadu_ps(x.as_ptr().add(i)) };
        acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm_mul_ps(v, v)));
        i += 4;
    }
    let pair = _mm_add_pd(_mm256_castpd256_pd128(acc), _mm256_extractf128_pd::<1>(acc));
    let mut sum = _mm_cvtsd_f64(pair) + _mm_cvtsd_f64(_mm_unpackhi_pd(pair, pair));
    for value in &x[body..] {
        sum += f64::from(value * value);
    }
    sum
}
