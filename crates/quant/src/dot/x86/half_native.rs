//! `dot::half_arith` on CPUs with AVX512-FP16: the very instructions ggml-cpu's f16 vector
//! code runs on the reference machine (`vfmadd…ph` into four 32-lane accumulators, `vaddph`,
//! gcc's `_mm512_reduce_add_ph`), so no emulation is needed and the results are the scalar
//! twins' bit for bit (every operation rounds once to f16, as the twins compute from f64;
//! AVX512-FP16 arithmetic ignores MXCSR's DAZ and FTZ, so subnormals are kept, as there).
//!
//! A NaN result is handed back as it comes; the callers turn it into the twin's positive one.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use half::f16;

/// f16 lanes of one register.
const WIDE: usize = 32;
/// Elements of one step (`GGML_F16_STEP`): four registers.
const STEP: usize = 4 * WIDE;

/// True when this CPU runs the kernels of this module (AVX512-FP16 with AVX-512 F/BW/VL),
/// unless `RUNIT_CPU_NO_AVX512FP16` is set (a measuring knob: the emulated kernels, which
/// CPUs without AVX512-FP16 run, on one that has it; the results are the same).
pub(crate) fn has_avx512_fp16() -> bool {
    static FLAG: OnceLock<bool> = OnceLock::new();
    *FLAG.get_or_init(|| {
        super::has_avx512()
            && is_x86_feature_detected!("avx512fp16")
            && std::env::var_os("RUNIT_CPU_NO_AVX512FP16").is_none()
    })
}

// The AVX512-FP16 intrinsics are newer than this workspace's Rust (1.94 against 1.89), so
// the arithmetic is written as one instruction of inline assembly each, on integer-typed
// registers holding 32 (16, 8) f16 lanes.

/// `a * b + c` per lane, one rounding (`vfmadd231ph`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn fmadd(a: __m512i, b: __m512i, c: __m512i) -> __m512i {
    let mut acc = c;
    // SAFETY: the caller's AVX512-FP16 (the enclosing kernels require it); registers only.
    unsafe {
        asm!(
            "vfmadd231ph {acc}, {a}, {b}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    acc
}

/// A lane-wise f16 instruction `op out, a, b` on one register width, rounded once.
macro_rules! binary {
    ($(#[$doc:meta])* $name:ident, $op:literal, $reg:ident, $ty:ty) => {
        $(#[$doc])*
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        fn $name(a: $ty, b: $ty) -> $ty {
            let out;
            // SAFETY: as in [`fmadd`].
            unsafe {
                asm!(
                    concat!($op, " {out}, {a}, {b}"),
                    out = lateout($reg) out,
                    a = in($reg) a,
                    b = in($reg) b,
                    options(pure, nomem, nostack, preserves_flags)
                )
            };
            out
        }
    };
}

binary!(
    /// `a * b` per lane, rounded (`vmulph`).
    mul, "vmulph", zmm_reg, __m512i
);
binary!(
    /// `a + b` per lane of 32, rounded (`vaddph`).
    add, "vaddph", zmm_reg, __m512i
);
binary!(
    /// [`add`] on 16 lanes.
    add16, "vaddph", ymm_reg, __m256i
);
binary!(
    /// [`add`] on 8 lanes.
    add8, "vaddph", xmm_reg, __m128i
);

/// Thirty-two f16 values at `p` (any alignment).
///
/// # Safety
/// AVX-512 F is available and `p` points at 32 readable f16 values.
#[inline(always)]
unsafe fn load(p: *const f16) -> __m512i {
    // SAFETY: the caller promises 32 readable values; `loadu` takes any alignment.
    unsafe { _mm512_loadu_si512(p.cast()) }
}

/// `acc0 += acc2`, `acc1 += acc3`, `acc0 += acc1` (`GGML_F16x32_REDUCE`), then gcc's
/// `_mm512_reduce_add_ph`: 16 + 16 lanes, 8 + 8, lanes `j` and `j + 4`, then
/// `(t0 + t2) + (t1 + t3)`; every addition in f16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn reduce(acc: [__m512i; 4]) -> f16 {
    let sum = add(add(acc[0], acc[2]), add(acc[1], acc[3]));
    let sixteen = add16(
        _mm512_castsi512_si256(sum),
        _mm512_extracti64x4_epi64::<1>(sum),
    );
    let eight = add8(
        _mm256_castsi256_si128(sixteen),
        _mm256_extracti128_si256::<1>(sixteen),
    );
    // Lanes j + 4 onto lanes j (the two 64-bit halves swapped).
    let four = add8(eight, _mm_shuffle_epi32::<0b01_00_11_10>(eight));
    // Lanes 2, 3 onto lanes 0, 1: `[t0 + t2, t1 + t3]`.
    let two = add8(four, _mm_shuffle_epi32::<0b11_10_00_01>(four));
    // Lane 1 onto lane 0.
    let one = add8(two, _mm_srli_epi32::<16>(two));
    f16::from_bits(_mm_cvtsi128_si32(one) as u16)
}

/// The native-f16 part of `ggml_vec_dot_f16` of `R` weight rows against one activation
/// row, each row in its own four accumulators (`R` independent chains of fused
/// multiply-adds, so their latencies overlap). `n` (a multiple of 128) elements of each
/// row; `ahead` (elements) is how far past each row the values to prefetch as it is read
/// lie (0: none).
///
/// # Safety
/// Requires AVX512-FP16 and AVX-512 F/BW/VL; every `xs[r]` and `y` point at `n` readable
/// values.
// The step loop indexes the accumulators and the element offsets by the same register `j`.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn body_rows<const R: usize>(
    xs: [*const f16; R],
    y: *const f16,
    n: usize,
    ahead: usize,
) -> [f16; R] {
    let mut acc = [[_mm512_setzero_si512(); 4]; R];
    for step in (0..n).step_by(STEP) {
        if ahead > 0 {
            for x in xs {
                for line in 0..4 {
                    let next = x.wrapping_add(ahead + step + WIDE * line);
                    _mm_prefetch::<_MM_HINT_T0>(next.cast());
                }
            }
        }
        for j in 0..4 {
            let at = step + WIDE * j;
            // SAFETY: `at + 32 <= n`, inside every row (the caller's promise).
            let b = unsafe { load(y.add(at)) };
            for r in 0..R {
                // SAFETY: as above.
                let a = unsafe { load(xs[r].add(at)) };
                // ggml's `GGML_F16x32_FMA(acc, x, y)`: `x * y + acc`, one rounding.
                acc[r][j] = fmadd(a, b, acc[r][j]);
            }
        }
    }
    let mut out = [f16::ZERO; R];
    for (out, acc) in out.iter_mut().zip(acc) {
        *out = reduce(acc);
    }
    out
}

/// The native-f16 part of `ggml_vec_dot_f16` (`half_arith::dot_body`) over the first
/// `n - n % 128` elements of `x` and `y` (`n` the shorter length).
///
/// # Safety
/// Requires AVX512-FP16 and AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn dot_body(x: &[f16], y: &[f16]) -> f16 {
    let n = x.len().min(y.len()) / STEP * STEP;
    // SAFETY: the caller promises the features; both slices hold `n` values.
    unsafe { body_rows([x.as_ptr()], y.as_ptr(), n, 0)[0] }
}

/// [`dot_body`] of four weight rows against one activation row, prefetching `ahead`
/// elements past each row (prefetches do not fault, so it may point past the matrix).
///
/// # Safety
/// Requires AVX512-FP16 and AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn dot_body_x4(xs: [&[f16]; 4], y: &[f16], ahead: usize) -> [f16; 4] {
    let n = xs.iter().fold(y.len(), |n, x| n.min(x.len())) / STEP * STEP;
    let pointers = xs.map(|x| x.as_ptr());
    // SAFETY: the caller promises the features; every slice holds `n` values.
    unsafe { body_rows(pointers, y.as_ptr(), n, ahead) }
}

/// `y[i] = fma(x[i], v, y[i])` in f16 (`ggml_vec_mad_f16`'s native part) for
/// `i < y.len()` rounded down to a multiple of 32 (`<= x.len()`).
///
/// # Safety
/// Requires AVX512-FP16 and AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn mad(y: &mut [f16], x: &[f16], v: f16) {
    let n = y.len().min(x.len()) / WIDE * WIDE;
    let scale = _mm512_set1_epi16(v.to_bits() as i16);
    for at in (0..n).step_by(WIDE) {
        // SAFETY: `at + 32 <= n`, and `n` is at most either slice's length.
        unsafe {
            let sum = fmadd(load(x.as_ptr().add(at)), scale, load(y.as_ptr().add(at)));
            _mm512_storeu_si512(y.as_mut_ptr().add(at).cast(), sum);
        }
    }
}

/// `y[i] = y[i] * v` in f16 (`ggml_vec_scale_f16`'s native part) for `i < y.len()` rounded
/// down to a multiple of 32.
///
/// # Safety
/// Requires AVX512-FP16 and AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn scale(y: &mut [f16], v: f16) {
    let n = y.len() / WIDE * WIDE;
    let factor = _mm512_set1_epi16(v.to_bits() as i16);
    for at in (0..n).step_by(WIDE) {
        // SAFETY: `at + 32 <= n <= y.len()`.
        unsafe {
            let product = mul(load(y.as_ptr().add(at)), factor);
            _mm512_storeu_si512(y.as_mut_ptr().add(at).cast(), product);
        }
    }
}
