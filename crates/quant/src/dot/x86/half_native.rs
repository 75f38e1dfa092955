//! `dot::half_arith` on CPUs with AVX512-FP16: the very instructions ggml-cpu's f16 vector
//! code runs on the reference machine (`vfmadd…ph` into four 32-lane accumulators, `vaddph`,
//! gcc's `_mm512_reduce_add_ph`), so no emulation is needed and the results are the scalar
//! twins' bit for bit (every operation rounds once to f16, as the twins compute from f64;
//! AVX512-FP16 arithmetic ignores MXCSR's DAZ and FTZ, so subnormals are kept, as there).
//!
//! A NaN result is handed back as it comes; the callers turn it into the twin's positive one.

use std::arch::asm;
use std::arch::x86_64::*;

use half::f16;

/// f16 lanes of one register.
const WIDE: usize = 32;
/// Elements of one step (`GGML_F16_STEP`): four registers.
const STEP: usize = 4 * WIDE;

/// True when this CPU runs the kernels of this module (AVX512-FP16 with AVX-512 F/BW/VL)
/// and [`crate::cpu`] lets it: `RUNIT_CPU_ISA` below `avx512`, or `RUNIT_CPU_NO_AVX512FP16`
/// set, keeps the emulated kernels (those of CPUs without AVX512-FP16) on one that has it,
/// for measuring; the results are the same.
pub(crate) fn has_avx512_fp16() -> bool {
    super::has_avx512() && crate::cpu::may_use(crate::cpu::Feature::Avx512Fp16)
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

/// The native parts of one weight row `w` against `T` activation rows `ys`, each left as the
/// 32-lane sum that [`reduce`] starts from (`(acc0 + acc2) + (acc1 + acc3)`) for
/// [`reduce_32`] to finish; `n` (a multiple of 128) elements of each. The product is ggml's
/// `x * y + acc` with the operands in either order (a product rounds the same either way).
/// `next` (the next weight row) is prefetched as `w` is read.
///
/// # Safety
/// Requires AVX512-FP16 and AVX-512 F/BW/VL; `w` and every `ys[t]` point at `n` readable
/// values.
// The step loop indexes the accumulators and the element offsets by the same register `j`.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
pub(super) unsafe fn body_tokens<const T: usize>(
    w: *const f16,
    ys: [*const f16; T],
    n: usize,
    next: *const f16,
) -> [__m512i; T] {
    let mut acc = [[_mm512_setzero_si512(); 4]; T];
    for step in (0..n).step_by(STEP) {
        for line in 0..4 {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(step + WIDE * line).cast());
        }
        for j in 0..4 {
            let at = step + WIDE * j;
            // SAFETY: `at + 32 <= n`, inside the weight row and every activation row (the
            // caller's promise).
            let a = unsafe { load(w.add(at)) };
            for t in 0..T {
                // SAFETY: as above.
                let b = unsafe { load(ys[t].add(at)) };
                acc[t][j] = fmadd(a, b, acc[t][j]);
            }
        }
    }
    // A plain loop: a closure (`map`) would not inherit the caller's target features, and
    // the additions would become calls.
    let mut sums = [_mm512_setzero_si512(); T];
    for t in 0..T {
        sums[t] = add(add(acc[t][0], acc[t][2]), add(acc[t][1], acc[t][3]));
    }
    sums
}

/// Where [`reduce_32`] wants dot `i`'s register so that lane `i` of its result is that dot's
/// sum (the order its lane-pair shuffles leave the dots in, inverted).
pub(super) const fn reduce_32_slot(i: usize) -> usize {
    16 * (i % 2) + 4 * ((i / 2) % 4) + i / 8
}

/// The rest of [`reduce`] (from its first 32-lane sum) for 32 dot products at once: the
/// same additions of the same lanes, two to thirty-two dots per instruction. Lane `i` of
/// the result is the sum of the register at `sums[reduce_32_slot(i)]`.
///
/// # Safety
/// Requires AVX512-FP16 and AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn reduce_32(sums: &[__m512i; 32]) -> __m512i {
    // Plain loops: closures (`from_fn`) would not inherit this function's target features.
    // Lanes j and j + 16 of registers p, q: [p's 16 | q's 16].
    let mut sixteen = [_mm512_setzero_si512(); 16];
    for k in 0..16 {
        let (p, q) = (sums[2 * k], sums[2 * k + 1]);
        sixteen[k] = add(
            _mm512_shuffle_i64x2::<0b01_00_01_00>(p, q),
            _mm512_shuffle_i64x2::<0b11_10_11_10>(p, q),
        );
    }
    // Lanes j and j + 8 of each 16: four dots' 8 lanes, one per 128-bit quarter.
    let mut eight = [_mm512_setzero_si512(); 8];
    for k in 0..8 {
        let (u, v) = (sixteen[2 * k], sixteen[2 * k + 1]);
        eight[k] = add(
            _mm512_shuffle_i64x2::<0b10_00_10_00>(u, v),
            _mm512_shuffle_i64x2::<0b11_01_11_01>(u, v),
        );
    }
    // Lanes j and j + 4 of each 8: two dots' 4 lanes per quarter.
    let mut four = [_mm512_setzero_si512(); 4];
    for k in 0..4 {
        let (w, z) = (eight[2 * k], eight[2 * k + 1]);
        four[k] = add(_mm512_unpacklo_epi64(w, z), _mm512_unpackhi_epi64(w, z));
    }
    // `[t0 + t2, t1 + t3]`: one dot per 32-bit lane.
    let mut two = [_mm512_setzero_si512(); 2];
    for k in 0..2 {
        let (m, n) = (
            _mm512_castsi512_ps(four[2 * k]),
            _mm512_castsi512_ps(four[2 * k + 1]),
        );
        two[k] = add(
            _mm512_castps_si512(_mm512_shuffle_ps::<0b10_00_10_00>(m, n)),
            _mm512_castps_si512(_mm512_shuffle_ps::<0b11_01_11_01>(m, n)),
        );
    }
    // The two halves of each 32-bit lane: the first register's dots in the even lanes, the
    // second's in the odd ones.
    let odd = 0xaaaa_aaaa;
    let (g, h) = (two[0], two[1]);
    add(
        _mm512_mask_blend_epi16(odd, g, _mm512_slli_epi32::<16>(h)),
        _mm512_mask_blend_epi16(odd, _mm512_srli_epi32::<16>(g), h),
    )
}

/// The sum [`reduce`] makes of `sum` (`(acc0 + acc2) + (acc1 + acc3)`), for tests.
#[cfg(test)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn reduce_one(sum: __m512i) -> f16 {
    let zero = _mm512_setzero_si512();
    reduce([sum, zero, zero, zero])
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

#[cfg(test)]
mod tests {
    use super::*;

    /// [`reduce_32`] adds the lanes of 32 registers exactly as [`reduce`] adds each one's,
    /// with the dots where [`reduce_32_slot`] says, on values whose sums round, overflow
    /// and hit NaN.
    #[test]
    fn reduce_32_equals_reduce_per_dot() {
        if !has_avx512_fp16() {
            eprintln!("no AVX512-FP16 here; nothing to compare");
            return;
        }
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..200 {
            let lanes: Vec<[u16; 32]> = (0..32)
                .map(|dot| {
                    std::array::from_fn(|_| {
                        let r = next();
                        let value = match (round + dot) % 7 {
                            0 => (r % 60_000) as f32 - 30_000.0,
                            1 if r % 5 == 0 => f32::INFINITY,
                            2 if r % 61 == 0 => f32::NAN,
                            _ => ((r % 2001) as f32 - 1000.0) / 97.0,
                        };
                        f16::from_f32(value).to_bits()
                    })
                })
                .collect();
            // SAFETY: AVX512-FP16 and AVX-512 F/BW/VL were confirmed above; every array
            // holds 32 values.
            unsafe {
                let registers: Vec<__m512i> = lanes
                    .iter()
                    .map(|l| _mm512_loadu_si512(l.as_ptr().cast()))
                    .collect();
                let mut staged = [_mm512_setzero_si512(); 32];
                for (dot, register) in registers.iter().enumerate() {
                    staged[reduce_32_slot(dot)] = *register;
                }
                let mut out = [0u16; 32];
                _mm512_storeu_si512(out.as_mut_ptr().cast(), reduce_32(&staged));
                for (dot, register) in registers.iter().enumerate() {
                    let want = reduce_one(*register);
                    let got = f16::from_bits(out[dot]);
                    assert!(
                        got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                        "round {round} dot {dot}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
