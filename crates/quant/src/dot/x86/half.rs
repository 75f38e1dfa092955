//! AVX2 + F16C kernels of `dot::half_arith` (native f16 arithmetic as AVX512-FP16 does it),
//! eight lanes at a time, and AVX-512 twins of the two hot ones (the dot's steps and the
//! multiply-add) sixteen lanes at a time with mask registers; all bit-identical to the
//! scalar twins there.
//!
//! f16 values are held widened in f32 lanes. A product of two f16 values is exact in f32.
//! On AVX2 a multiply-add is one f32 fused multiply-add rounded again to f16 by `vcvtps2ph`
//! (nearest even), which is the correctly rounded result unless the f32 value is an f16
//! midpoint; registers with such a lane (rare: `may_round_twice`) take the exact path: the
//! sum computed in f32 together with its exact error (two-sum), turned into the
//! round-to-odd value of the exact sum (adjusting its last bit when the sum was inexact),
//! then rounded to f16. Rounding to odd at 24 bits and then to nearest at 11 or fewer bits
//! gives the correctly rounded result, which is what the scalar twins compute from f64.

use std::arch::x86_64::*;

use half::f16;

/// f32 lanes of one register.
const LANES: usize = 8;

/// Rounds eight f32 lanes to f16 and widens them back.
#[target_feature(enable = "avx2,fma,f16c")]
fn round_f16(v: __m256) -> __m256 {
    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
}

/// Whether rounding the f32 lanes `s` (each the f32 rounding of an exact value v) to f16
/// may differ from rounding v itself: f16's midpoints (and its overflow threshold) are f32
/// values, and rounding is monotonic, so `s` and `v` lie on the same side of every midpoint
/// unless `s` is one. A lane is flagged where it is an f16 midpoint: in f16's normal range
/// (|s| >= 2^-14) its 13 bits below f16's last are 1000000000000; below 2^-14 (f16's
/// subnormals, whose midpoints are the odd multiples of 2^-25) every nonzero lane is
/// flagged (a zero sum is exact). Above f16's range a flag is harmless.
#[target_feature(enable = "avx2,fma,f16c")]
fn may_round_twice(s: __m256) -> bool {
    let bits = _mm256_castps_si256(s);
    let tie = _mm256_cmpeq_epi32(
        _mm256_and_si256(bits, _mm256_set1_epi32(0x1fff)),
        _mm256_set1_epi32(0x1000),
    );
    // |s| + 0x7fffffff wraps the nonzero magnitudes below 2^-14's bits (0x38800000) to
    // 0x80000000..=0xb87ffffe, the only values (as signed) below 0xb87fffff; zero becomes
    // 0x7fffffff.
    let magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fff_ffff));
    let tiny = _mm256_cmpgt_epi32(
        _mm256_set1_epi32(0xb87f_ffff_u32 as i32),
        _mm256_add_epi32(magnitude, _mm256_set1_epi32(0x7fff_ffff)),
    );
    let flagged = _mm256_or_si256(tie, tiny);
    _mm256_testz_si256(flagged, flagged) == 0
}

/// `a * b + c` (f32 lanes holding f16 values: the product is exact in f32) correctly
/// rounded to f16: one fused multiply-add rounds the exact value to f32, then to f16, which
/// is the correctly rounded result unless a lane lands on an f16 midpoint
/// ([`may_round_twice`]: rare), where the eight lanes take [`add_rounded_exact`].
#[target_feature(enable = "avx2,fma,f16c")]
fn fma_rounded(a: __m256, b: __m256, c: __m256) -> __m256 {
    let s = _mm256_fmadd_ps(a, b, c);
    if may_round_twice(s) {
        add_rounded_exact(_mm256_mul_ps(a, b), c)
    } else {
        round_f16(s)
    }
}

/// `a + b` (f32 lanes holding f16 values) correctly rounded to f16, as [`fma_rounded`].
#[target_feature(enable = "avx2,fma,f16c")]
fn add_rounded(a: __m256, b: __m256) -> __m256 {
    let s = _mm256_add_ps(a, b);
    if may_round_twice(s) {
        add_rounded_exact(a, b)
    } else {
        round_f16(s)
    }
}

/// `a + b` (f32 lanes holding f16 values or exact products of two) correctly rounded to f16
/// in every case: the f32 sum and its exact error (two-sum), turned into the sum rounded
/// to odd at 24 bits, then rounded to f16.
#[target_feature(enable = "avx2,fma,f16c")]
fn add_rounded_exact(a: __m256, b: __m256) -> __m256 {
    let sum = _mm256_add_ps(a, b);
    let b_part = _mm256_sub_ps(sum, a);
    let error = _mm256_add_ps(
        _mm256_sub_ps(a, _mm256_sub_ps(sum, b_part)),
        _mm256_sub_ps(b, b_part),
    );
    // Round to odd: where the sum was inexact and its last bit is even, step one unit
    // towards the exact value (away from zero when the error has the sum's sign).
    let bits = _mm256_castps_si256(sum);
    let one = _mm256_set1_epi32(1);
    let inexact = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_NEQ_OQ>(error, _mm256_setzero_ps()));
    let even = _mm256_cmpeq_epi32(_mm256_and_si256(bits, one), _mm256_setzero_si256());
    let opposite = _mm256_srai_epi32::<31>(_mm256_xor_si256(bits, _mm256_castps_si256(error)));
    let step = _mm256_or_si256(opposite, one); // +1 or -1
    let adjust = _mm256_and_si256(step, _mm256_and_si256(inexact, even));
    round_f16(_mm256_castsi256_ps(_mm256_add_epi32(bits, adjust)))
}

/// Loads eight f16 values widened to f32.
///
/// # Safety
/// `p` must point at eight readable f16 values.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load(p: *const f16) -> __m256 {
    // SAFETY: the caller promises eight readable values; `loadu` takes any alignment.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.cast::<__m128i>()) })
}

/// Stores eight f32 lanes rounded to f16 (nearest even; exact for lanes holding f16 values).
///
/// # Safety
/// `p` must point at eight writable f16 values.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store(p: *mut f16, v: __m256) {
    let packed = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
    // SAFETY: the caller promises eight writable values; `storeu` takes any alignment.
    unsafe { _mm_storeu_si128(p.cast::<__m128i>(), packed) }
}

/// `acc[q] = fma(x[step + q], y[step + q], acc[q])` for every 128-element step of the body
/// (`x.len() == y.len()` is a multiple of 128, `acc` holds 128 lanes): the lanes of
/// [`dot_body_avx2`] in memory, for the tests.
///
/// # Safety
/// Requires AVX2, FMA and F16C.
#[cfg(test)]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_steps(x: &[f16], y: &[f16], acc: &mut [f16; 128]) {
    let mut lanes = [_mm256_setzero_ps(); 128 / LANES];
    for (k, lane) in lanes.iter_mut().enumerate() {
        // SAFETY: `k < 16`, so the eight values at `8 k` lie inside `acc`'s 128.
        *lane = unsafe { load(acc.as_ptr().add(k * LANES)) };
    }
    let mut rows = [lanes];
    // SAFETY: the caller promises the features.
    unsafe { steps([x], y, &mut rows, 0) };
    for (k, lane) in rows[0].iter().enumerate() {
        // SAFETY: `k < 16`, so the eight values at `8 k` lie inside `acc`'s 128.
        unsafe { store(acc.as_mut_ptr().add(k * LANES), *lane) };
    }
}

/// The native-f16 part of `ggml_vec_dot_f16` (`half_arith::dot_body`; `x.len() == y.len()`
/// a multiple of 128) on AVX2: [`dot_steps`] and [`reduce_to_four`] in registers, then
/// `(t0 + t2) + (t1 + t3)` there too, prefetching the `ahead`-th elements past `x`'s (the
/// next weight row of a gemv; 0: none). A NaN is the twin's positive one.
///
/// # Safety
/// Requires AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_body_avx2(x: &[f16], y: &[f16], ahead: usize) -> f16 {
    // SAFETY: the caller promises the features.
    unsafe { dot_body_avx2_rows([x], y, ahead)[0] }
}

/// [`dot_body_avx2`] of `R` weight rows against one activation row, side by side: the
/// activation is widened once for all, and the rows' chains of dependent roundings (the
/// reduction's above all) overlap. `ahead` as there, past each row.
///
/// # Safety
/// Requires AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_body_avx2_rows<const R: usize>(
    xs: [&[f16]; R],
    y: &[f16],
    ahead: usize,
) -> [f16; R] {
    let mut lanes = [[_mm256_setzero_ps(); 128 / LANES]; R];
    // SAFETY: the caller promises the features.
    unsafe { steps(xs, y, &mut lanes, ahead) };
    let mut out = [f16::ZERO; R];
    for (out, lanes) in out.iter_mut().zip(&lanes) {
        // SAFETY: the caller promises the features.
        let four = unsafe { reduce_registers(lanes) };
        // Lanes `[t0 + t2, t1 + t3]`, then their sum in lane 0.
        let two = add_rounded(four, _mm256_permute_ps::<0b01_00_11_10>(four));
        let one = add_rounded(two, _mm256_permute_ps::<0b10_11_00_01>(two));
        let mut sums = [f16::ZERO; LANES];
        // SAFETY: `sums` holds eight writable values.
        unsafe { store(sums.as_mut_ptr(), one) };
        *out = if sums[0].is_nan() { f16::NAN } else { sums[0] };
    }
    out
}

/// The 128-element steps of `R` rows' native parts into their lanes (`lanes[r][k]` is lanes
/// `8 k..8 k + 8` of row `r`), prefetching the `ahead`-th elements past each row (0: none).
///
/// # Safety
/// Requires AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn steps<const R: usize>(
    xs: [&[f16]; R],
    y: &[f16],
    lanes: &mut [[__m256; 128 / LANES]; R],
    ahead: usize,
) {
    let n = xs.iter().fold(y.len(), |n, x| n.min(x.len())) / 128 * 128;
    for step in (0..n).step_by(128) {
        if ahead > 0 {
            for x in xs {
                for line in 0..4 {
                    let next = x.as_ptr().wrapping_add(ahead + step + 32 * line);
                    // A prefetch does not fault, past the end of the rows included.
                    _mm_prefetch::<_MM_HINT_T0>(next.cast());
                }
            }
        }
        for k in 0..128 / LANES {
            let at = step + k * LANES;
            // SAFETY: `at + 8 <= step + 128 <= n`, and `n` is at most every slice's length.
            let b = unsafe { load(y.as_ptr().add(at)) };
            for (x, lanes) in xs.iter().zip(lanes.iter_mut()) {
                // SAFETY: as above.
                let a = unsafe { load(x.as_ptr().add(at)) };
                lanes[k] = fma_rounded(a, b, lanes[k]);
            }
        }
    }
}

/// Rounds sixteen f32 lanes to f16 and widens them back.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn round_f16_x16(v: __m512) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
}

/// `a * b + c` (f32 lanes holding f16 values) correctly rounded to f16, sixteen lanes: the
/// exact value rounded down and up by two fused multiply-adds with embedded rounding, the
/// one of the two with an odd last bit kept (round to odd at 24 bits; both are equal when
/// exact, and an exact zero keeps the upward one, `+0` as nearest-even gives it), then one
/// rounding to f16. Round to odd at 24 bits followed by round to nearest at 11 or fewer
/// gives the correctly rounded result, as in [`add_rounded`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn fma_rounded_x16(a: __m512, b: __m512, c: __m512) -> __m512 {
    let down = _mm512_fmadd_round_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(a, b, c);
    let up = _mm512_fmadd_round_ps::<{ _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC }>(a, b, c);
    let odd = _mm512_test_epi32_mask(_mm512_castps_si512(down), _mm512_set1_epi32(1));
    round_f16_x16(_mm512_mask_blend_ps(odd, up, down))
}

/// `a + b` correctly rounded to f16, sixteen lanes ([`fma_rounded_x16`] with `b = 1`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn add_rounded_x16(a: __m512, b: __m512) -> __m512 {
    fma_rounded_x16(a, _mm512_set1_ps(1.0), b)
}

/// Loads sixteen f16 values widened to f32.
///
/// # Safety
/// `p` must point at sixteen readable f16 values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn load_x16(p: *const f16) -> __m512 {
    // SAFETY: the caller promises sixteen readable values; `loadu` takes any alignment.
    _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.cast::<__m256i>()) })
}

/// Stores sixteen f32 lanes rounded to f16 (exact for lanes holding f16 values).
///
/// # Safety
/// `p` must point at sixteen writable f16 values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn store_x16(p: *mut f16, v: __m512) {
    let packed = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
    // SAFETY: the caller promises sixteen writable values; `storeu` takes any alignment.
    unsafe { _mm256_storeu_si256(p.cast::<__m256i>(), packed) }
}

/// The native-f16 part of `ggml_vec_dot_f16` sixteen lanes at a time (`x.len() == y.len()`
/// a multiple of 128; `half_arith::dot_body`): [`dot_steps`] into eight registers (register
/// `j` of ggml's four 32-lane ones is `lanes[2 j]`, `lanes[2 j + 1]`), [`reduce_to_four`]
/// and the final `(t0 + t2) + (t1 + t3)`, all without leaving the registers.
///
/// # Safety
/// Requires AVX-512 F/BW/VL and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub unsafe fn dot_body_avx512(x: &[f16], y: &[f16]) -> f16 {
    // SAFETY: the caller promises the features.
    unsafe { dot_body_rows([x], y, 0)[0] }
}

/// [`dot_body_avx512`] of two weight rows against one activation row: the activation is
/// widened once for both, and the two rows' chains of dependent rounded additions (the
/// reduction, ~45% of a row) run side by side. `ahead` (in elements) is how far past each
/// row the next rows' values lie, prefetched as the rows are read (0: none); prefetches do
/// not fault, so it may point past the matrix.
///
/// # Safety
/// Requires AVX-512 F/BW/VL and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub unsafe fn dot_body_avx512_x2(x0: &[f16], x1: &[f16], y: &[f16], ahead: usize) -> [f16; 2] {
    // SAFETY: the caller promises the features.
    unsafe { dot_body_rows([x0, x1], y, ahead) }
}

/// [`dot_body_avx512`] of `R` weight rows, each in its own registers, prefetching `ahead`
/// elements past each row (see [`dot_body_avx512_x2`]).
///
/// # Safety
/// Requires AVX-512 F/BW/VL and F16C.
#[inline(always)]
unsafe fn dot_body_rows<const R: usize>(xs: [&[f16]; R], y: &[f16], ahead: usize) -> [f16; R] {
    const WIDE: usize = 16;
    let n = xs.iter().fold(y.len(), |n, x| n.min(x.len())) / 128 * 128;
    let mut lanes = [[_mm512_setzero_ps(); 128 / WIDE]; R];
    for step in (0..n).step_by(128) {
        if ahead > 0 {
            for x in xs {
                for line in 0..4 {
                    let next = x.as_ptr().wrapping_add(ahead + step + 32 * line);
                    _mm_prefetch::<_MM_HINT_T0>(next.cast());
                }
            }
        }
        for k in 0..128 / WIDE {
            let at = step + k * WIDE;
            // SAFETY: `at + 16 <= step + 128 <= n`, and `n` is at most every slice's length.
            let b = unsafe { load_x16(y.as_ptr().add(at)) };
            for (x, lanes) in xs.iter().zip(lanes.iter_mut()) {
                // SAFETY: as above.
                let a = unsafe { load_x16(x.as_ptr().add(at)) };
                lanes[k] = fma_rounded_x16(a, b, lanes[k]);
            }
        }
    }
    let mut out = [f16::ZERO; R];
    for (out, lanes) in out.iter_mut().zip(lanes.iter()) {
        // (r0 + r2) + (r1 + r3) per 16-lane half of the 32 lanes.
        let half = |h: usize| {
            add_rounded_x16(
                add_rounded_x16(lanes[h], lanes[4 + h]),
                add_rounded_x16(lanes[2 + h], lanes[6 + h]),
            )
        };
        // 32 lanes: 16 + 16, then 8 + 8, then lanes `j` and `j + 4`.
        let sixteen = add_rounded_x16(half(0), half(1));
        let eight = add_rounded_x16(
            sixteen,
            _mm512_shuffle_f32x4::<0b00_00_11_10>(sixteen, sixteen),
        );
        let four = add_rounded_x16(eight, _mm512_shuffle_f32x4::<0b00_00_00_01>(eight, eight));
        // Lanes `[t0 + t2, t1 + t3]`, then their sum in lane 0.
        let two = add_rounded_x16(four, _mm512_permute_ps::<0b01_00_11_10>(four));
        let one = add_rounded_x16(two, _mm512_permute_ps::<0b10_11_00_01>(two));
        let mut sums = [f16::ZERO; WIDE];
        // SAFETY: `sums` holds sixteen writable values.
        unsafe { store_x16(sums.as_mut_ptr(), one) };
        *out = sums[0];
    }
    out
}

/// [`mad`] sixteen lanes at a time (`y.len()` a multiple of 16).
///
/// # Safety
/// Requires AVX-512 F/BW/VL and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub unsafe fn mad_avx512(y: &mut [f16], x: &[f16], v: f16) {
    const WIDE: usize = 16;
    let n = y.len().min(x.len()) / WIDE * WIDE;
    let scale = _mm512_set1_ps(v.to_f32());
    for at in (0..n).step_by(WIDE) {
        // SAFETY: `at + 16 <= n`, and `n` is at most either slice's length.
        unsafe {
            let (a, b) = (load_x16(x.as_ptr().add(at)), load_x16(y.as_ptr().add(at)));
            store_x16(y.as_mut_ptr().add(at), fma_rounded_x16(a, scale, b));
        }
    }
}

/// `y[i] = fma(x[i], v, y[i])` in f16 for `i < y.len()` (a multiple of 8, `<= x.len()`).
///
/// # Safety
/// Requires AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn mad(y: &mut [f16], x: &[f16], v: f16) {
    let n = y.len().min(x.len()) / LANES * LANES;
    let scale = _mm256_set1_ps(v.to_f32());
    for at in (0..n).step_by(LANES) {
        // SAFETY: `at + 8 <= n`, and `n` is at most either slice's length.
        unsafe {
            let (a, b) = (load(x.as_ptr().add(at)), load(y.as_ptr().add(at)));
            store(y.as_mut_ptr().add(at), fma_rounded(a, scale, b));
        }
    }
}

/// `y[i] = y[i] * v` in f16 for `i < y.len()` (a multiple of 8).
///
/// # Safety
/// Requires AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scale(y: &mut [f16], v: f16) {
    let n = y.len() / LANES * LANES;
    let factor = _mm256_set1_ps(v.to_f32());
    for at in (0..n).step_by(LANES) {
        // The exact f32 product is rounded once to f16.
        // SAFETY: `at + 8 <= n <= y.len()`.
        unsafe {
            let product = _mm256_mul_ps(load(y.as_ptr().add(at)), factor);
            store(y.as_mut_ptr().add(at), product);
        }
    }
}

/// The reduction of `ggml_vec_dot_f16`'s four 32-lane accumulators (`acc[32 j + q]` is lane
/// `q` of register `j`): `r0 += r2`, `r1 += r3`, `r0 += r1`, then gcc's
/// `_mm512_reduce_add_ph` down to four lanes `[t0, t1, t2, t3]` (the caller finishes with
/// `(t0 + t2) + (t1 + t3)`). Every addition rounds to f16.
///
/// # Safety
/// Requires AVX2, FMA and F16C.
#[cfg(test)]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn reduce_to_four(acc: &[f16; 128]) -> [f16; 4] {
    // SAFETY: `k < 16`, so the eight values at `8 k` lie inside `acc`'s 128.
    let lanes: [__m256; 16] = std::array::from_fn(|k| unsafe { load(acc.as_ptr().add(k * LANES)) });
    // SAFETY: the caller promises the features.
    let four = unsafe { reduce_registers(&lanes) };
    let mut out = [f16::ZERO; LANES];
    // SAFETY: `out` holds eight writable values.
    unsafe { store(out.as_mut_ptr(), four) };
    [out[0], out[1], out[2], out[3]]
}

/// [`reduce_to_four`] on registers: `[t0, t1, t2, t3]` in the low four lanes.
///
/// # Safety
/// Requires AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn reduce_registers(lanes: &[__m256; 128 / LANES]) -> __m256 {
    // Registers 0..4 are vectors 4j..4j + 4.
    let mut first = [lanes[0], lanes[1], lanes[2], lanes[3]];
    for (k, lane) in first.iter_mut().enumerate() {
        let (second, third, fourth) = (lanes[4 + k], lanes[8 + k], lanes[12 + k]);
        *lane = add_rounded(add_rounded(*lane, third), add_rounded(second, fourth));
    }
    // 32 lanes: 16 + 16, then 8 + 8.
    let sixteen = [
        add_rounded(first[0], first[2]),
        add_rounded(first[1], first[3]),
    ];
    let eight = add_rounded(sixteen[0], sixteen[1]);
    add_rounded(eight, _mm256_permute2f128_ps::<1>(eight, eight))
}

/// The leftover sum of `ggml_vec_dot_f16` (`start + x[i] * y[i]` for every `i`, each exact
/// f32 product added in f64 in order) when no addition in that order can round: every
/// product (and `start`, an f16 value) is a multiple of 2^q, q the smallest last-bit
/// exponent among them, and the sum of their magnitudes stays below 2^(52 + q), so every
/// partial sum in any order is exact in f64 and the order does not matter. `None` when that
/// does not hold (the caller adds in order).
///
/// # Safety
/// Requires AVX-512 F/BW/VL/DQ and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c")]
pub unsafe fn tail_sum_exact(x: &[f16], y: &[f16], start: f64) -> Option<f64> {
    let n = x.len().min(y.len());
    // SAFETY: the caller promises the features; both slices hold `n` values.
    unsafe { tail_sums_exact([x.as_ptr()], y.as_ptr(), n, [start])[0] }
}

/// [`tail_sum_exact`] of `R` weight rows against one activation row, sharing the
/// activation's widening, the sum of the magnitudes bounded from above by f32 additions
/// rounded upwards. `xs[r]` and `y` point at `len` values
/// each; `None` for a row where the bound does not hold (the caller adds in order).
///
/// # Safety
/// Requires AVX-512 F/BW/VL/DQ and F16C; every `xs[r]` and `y` point at `len` readable
/// values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c")]
pub unsafe fn tail_sums_exact<const R: usize>(
    xs: [*const f16; R],
    y: *const f16,
    len: usize,
    starts: [f64; R],
) -> [Option<f64>; R] {
    const WIDE: usize = 16;
    let wide = len / WIDE * WIDE;
    let mut sums = [_mm512_setzero_pd(); R];
    // Upper bounds of the sums of |product| per lane, and the bits of the smallest nonzero
    // |product| (all ones until one is seen).
    let mut magnitudes = [_mm512_setzero_ps(); R];
    let mut smallest = [_mm512_set1_epi32(-1); R];
    let magnitude = _mm512_set1_epi32(0x7fff_ffff);
    for at in (0..wide).step_by(WIDE) {
        // SAFETY: `at + 16 <= wide <= len`, inside every row (the caller's promise).
        let b = unsafe { load_x16(y.add(at)) };
        for r in 0..R {
            // SAFETY: as above.
            let product = _mm512_mul_ps(unsafe { load_x16(xs[r].add(at)) }, b);
            let bits = _mm512_and_si512(_mm512_castps_si512(product), magnitude);
            magnitudes[r] = _mm512_add_round_ps::<{ _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC }>(
                magnitudes[r],
                _mm512_castsi512_ps(bits),
            );
            let nonzero = _mm512_test_epi32_mask(bits, bits);
            smallest[r] = _mm512_mask_min_epu32(smallest[r], nonzero, smallest[r], bits);
            let low = _mm512_cvtps_pd(_mm512_castps512_ps256(product));
            let high = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                _mm512_castps_pd(product),
            )));
            sums[r] = _mm512_add_pd(sums[r], _mm512_add_pd(low, high));
        }
    }
    std::array::from_fn(|r| {
        // Four rounded-to-nearest f32 additions: within a relative 2^-21 of the lanes' sum,
        // which the limit's halved headroom (2^52 rather than 2^53) covers.
        let lanes = Leftover {
            total: starts[r] + _mm512_reduce_add_pd(sums[r]),
            bound: f64::from(_mm512_reduce_add_ps(magnitudes[r])),
            low: _mm512_reduce_min_epu32(smallest[r]),
        };
        // SAFETY: every row and `y` hold `len` values (the caller's promise).
        unsafe { lanes.finish(xs[r], y, wide..len, starts[r]) }
    })
}

/// The vector part of an exact leftover sum: `start` plus the products' sum, an upper
/// bound of the sum of their magnitudes (within a relative 2^-21), and the bits of the
/// smallest nonzero |product| (`u32::MAX` when none).
struct Leftover {
    total: f64,
    bound: f64,
    low: u32,
}

impl Leftover {
    /// Adds the products of `range` one at a time and returns the sum where no addition in
    /// any order can round (see [`tail_sum_exact`]), else `None`.
    ///
    /// # Safety
    /// `x` and `y` must point at values readable over `range`.
    unsafe fn finish(
        mut self,
        x: *const f16,
        y: *const f16,
        range: std::ops::Range<usize>,
        start: f64,
    ) -> Option<f64> {
        for i in range {
            // SAFETY: `i` lies in `range`, readable (the caller's promise).
            let product =
                unsafe { x.add(i).read_unaligned().to_f32() * y.add(i).read_unaligned().to_f32() };
            let bits = product.to_bits() & 0x7fff_ffff;
            self.bound += f64::from(product).abs();
            if bits != 0 {
                self.low = self.low.min(bits);
            }
            self.total += f64::from(product);
        }
        // The last-bit exponent of an f32 product: its exponent less 23 (a nonzero product
        // of two f16 values is normal); none when every product is zero.
        let mut q = if self.low == u32::MAX {
            i32::MAX
        } else {
            (self.low >> 23) as i32 - 127 - 23
        };
        if start != 0.0 {
            // An f16 value is a multiple of 2^(e - 10) (2^-24 for subnormals).
            let e = ((start.to_bits() >> 52) & 0x7ff) as i32 - 1023;
            q = q.min(e.max(-14) - 10);
        }
        if q == i32::MAX {
            // Every term is zero; from a `+0` start the in-order sum is `+0` too.
            return (start.to_bits() == 0).then_some(self.total);
        }
        let bound = self.bound + start.abs();
        // 2^(52 + q) from its bits: q lies in -71..=105, inside f64's normal exponents.
        let limit = f64::from_bits(((1023 + 52 + q) as u64) << 52);
        (bound.is_finite() && bound < limit).then_some(self.total)
    }
}

/// [`tail_sum_exact`] on AVX2: eight products at a time, each lane's sum and magnitudes
/// in f64 (exact while the bound holds, which is all the check needs).
///
/// # Safety
/// Requires AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tail_sum_exact_avx2(x: &[f16], y: &[f16], start: f64) -> Option<f64> {
    let n = x.len().min(y.len());
    let wide = n / LANES * LANES;
    let mut sums = [_mm256_setzero_pd(); 2];
    let mut magnitudes = [_mm256_setzero_pd(); 2];
    let mut smallest = _mm256_set1_epi32(-1);
    let magnitude = _mm256_set1_epi32(0x7fff_ffff);
    let sign = _mm256_set1_pd(-0.0);
    for at in (0..wide).step_by(LANES) {
        // SAFETY: `at + 8 <= wide <= n`, and `n` is at most either slice's length.
        let product = unsafe { _mm256_mul_ps(load(x.as_ptr().add(at)), load(y.as_ptr().add(at))) };
        let bits = _mm256_and_si256(_mm256_castps_si256(product), magnitude);
        // Zero lanes become all ones, which the unsigned minimum never keeps.
        let zero = _mm256_cmpeq_epi32(bits, _mm256_setzero_si256());
        smallest = _mm256_min_epu32(smallest, _mm256_or_si256(bits, zero));
        let halves = [
            _mm256_cvtps_pd(_mm256_castps256_ps128(product)),
            _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(product)),
        ];
        for h in 0..2 {
            sums[h] = _mm256_add_pd(sums[h], halves[h]);
            magnitudes[h] = _mm256_add_pd(magnitudes[h], _mm256_andnot_pd(sign, halves[h]));
        }
    }
    let mut lanes = [0.0f64; 8];
    let mut bounds = [0.0f64; 8];
    let mut lows = [0u32; 8];
    // SAFETY: each array holds the eight values stored into it.
    unsafe {
        _mm256_storeu_pd(lanes.as_mut_ptr(), sums[0]);
        _mm256_storeu_pd(lanes.as_mut_ptr().add(4), sums[1]);
        _mm256_storeu_pd(bounds.as_mut_ptr(), magnitudes[0]);
        _mm256_storeu_pd(bounds.as_mut_ptr().add(4), magnitudes[1]);
        _mm256_storeu_si256(lows.as_mut_ptr().cast(), smallest);
    }
    let mut total = start;
    let mut bound = 0.0;
    let mut low = u32::MAX;
    for i in 0..8 {
        total += lanes[i];
        bound += bounds[i];
        low = low.min(lows[i]);
    }
    let lanes = Leftover { total, bound, low };
    // SAFETY: both slices hold `n` values.
    unsafe { lanes.finish(x.as_ptr(), y.as_ptr(), wide..n, start) }
}
