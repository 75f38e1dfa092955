//! AVX2 and AVX-512 kernels of the float formats (F32, F16, BF16) in the order of the scalar
//! twin (`dot::float`, ggml-cpu's AVX-512 `ggml_vec_dot_{f32,f16,bf16}`): the 64-element steps
//! here, the reductions and the leftovers in the twin's own code. F16 at the AVX2 levels sums
//! in ggml-cpu's AVX2 order instead (`HalfSums::Lanes8`: `lanes8_steps` here, the finish in
//! the twin's `dot_f16_lanes8_finish`), unless the reference order is asked for.

use std::arch::x86_64::*;

use half::f16;

use crate::dot::float::{
    bf16_element, dot_f16_finish, dot_f16_lanes8_finish, dot_f16_with, f16_row, f32_tail, f64_tail,
    reduce16, reduce_four, ExactTail, FLOAT_STEP, LANES8_STEP,
};
use crate::dot::half_arith;

/// How to widen eight / sixteen elements of one float format to f32.
trait Element {
    const BYTES: usize;
    unsafe fn load8(p: *const u8) -> __m256;
    unsafe fn load16(p: *const u8) -> __m512;
}

struct F32;

impl Element for F32 {
    const BYTES: usize = 4;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_loadu_ps(p.cast())
    }
    #[inline(always)]
    unsafe fn load16(p: *const u8) -> __m512 {
        _mm512_loadu_ps(p.cast())
    }
}

/// AVX-512 BF16 (`vdpbf16ps`), as [`crate::cpu`] allows it.
fn has_bf16() -> bool {
    crate::cpu::may_use(crate::cpu::Feature::Avx512Bf16)
}

fn check(n: usize, bytes: usize, w: &[u8], a: &[u8]) {
    assert!(
        w.len() >= n * bytes && a.len() >= n * bytes,
        "float rows of {} and {} bytes are shorter than {n} elements",
        w.len(),
        a.len()
    );
}

/// The four 16-lane accumulators after `steps` 64-element steps, AVX2 form (accumulator
/// `j` as two 8-lane halves).
#[inline(always)]
unsafe fn steps_avx2<E: Element>(steps: usize, w: *const u8, a: *const u8) -> [[f32; 16]; 4] {
    let mut acc = [_mm256_setzero_ps(); 8];
    for step in 0..steps {
        for (k, lanes) in acc.iter_mut().enumerate() {
            let offset = (FLOAT_STEP * step + 8 * k) * E::BYTES;
            *lanes = _mm256_fmadd_ps(E::load8(w.add(offset)), E::load8(a.add(offset)), *lanes);
        }
    }
    let mut out = [[0.0f32; 16]; 4];
    for (k, lanes) in acc.iter().enumerate() {
        _mm256_storeu_ps(out[k / 2][8 * (k % 2)..].as_mut_ptr(), *lanes);
    }
    out
}

/// The four 16-lane accumulators after `steps` 64-element steps, AVX-512 form.
#[inline(always)]
unsafe fn steps_avx512<E: Element>(steps: usize, w: *const u8, a: *const u8) -> [[f32; 16]; 4] {
    let mut acc = [_mm512_setzero_ps(); 4];
    for step in 0..steps {
        for (j, lanes) in acc.iter_mut().enumerate() {
            let offset = (FLOAT_STEP * step + 16 * j) * E::BYTES;
            *lanes = _mm512_fmadd_ps(E::load16(w.add(offset)), E::load16(a.add(offset)), *lanes);
        }
    }
    let mut out = [[0.0f32; 16]; 4];
    for (j, lanes) in acc.iter().enumerate() {
        _mm512_storeu_ps(out[j].as_mut_ptr(), *lanes);
    }
    out
}

/// The twin's finish of F32: the leftovers fused in f32.
fn finish<E: Element>(n: usize, w: &[u8], a: &[u8], acc: &[[f32; 16]; 4]) -> f32 {
    f32_tail(reduce_four(acc), n - n % FLOAT_STEP, n, w, a)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_avx2<E: Element>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let acc = steps_avx2::<E>(n / FLOAT_STEP, w.as_ptr(), a.as_ptr());
    finish::<E>(n, w, a, &acc)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn row_avx512<E: Element>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let acc = steps_avx512::<E>(n / FLOAT_STEP, w.as_ptr(), a.as_ptr());
    finish::<E>(n, w, a, &acc)
}

/// The twin's finish of BF16: both halves reduced, summed in f64 with the leftovers.
fn finish_bf16(n: usize, w: &[u8], a: &[u8], halves: &[[f32; 16]; 2]) -> f32 {
    let sum = f64::from(reduce16(&halves[0])) + f64::from(reduce16(&halves[1]));
    f64_tail(
        sum,
        n - n % FLOAT_STEP,
        n,
        |i| bf16_element(w, i),
        |i| bf16_element(a, i),
    )
}

/// Two FMAs per lane in `vdpbf16ps` order (odd element, then even) on dwords holding a pair
/// of bf16 values; equal to `vdpbf16ps` except where it would flush a denormal.
#[inline(always)]
unsafe fn dpbf16_emulated_256(acc: __m256, w: __m256i, x: __m256i) -> __m256 {
    let high = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
    let odd = _mm256_fmadd_ps(
        _mm256_castsi256_ps(_mm256_and_si256(w, high)),
        _mm256_castsi256_ps(_mm256_and_si256(x, high)),
        acc,
    );
    _mm256_fmadd_ps(
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w)),
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(x)),
        odd,
    )
}

/// The 512-bit form of [`dpbf16_emulated_256`].
///
/// # Safety
/// AVX-512 F is available.
#[inline(always)]
pub(in crate::dot) unsafe fn dpbf16_emulated_512(acc: __m512, w: __m512i, x: __m512i) -> __m512 {
    let high = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
    let odd = _mm512_fmadd_ps(
        _mm512_castsi512_ps(_mm512_and_si512(w, high)),
        _mm512_castsi512_ps(_mm512_and_si512(x, high)),
        acc,
    );
    _mm512_fmadd_ps(
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w)),
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(x)),
        odd,
    )
}

#[target_feature(enable = "avx2,fma")]
unsafe fn bf16_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // Accumulator `k`: half `k / 2` (c1, c2), lanes `8 * (k % 2)..` of it.
    let mut acc = [_mm256_setzero_ps(); 4];
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    for step in 0..n / FLOAT_STEP {
        for (k, lanes) in acc.iter_mut().enumerate() {
            let offset = 2 * (FLOAT_STEP * step + 16 * k);
            *lanes = dpbf16_emulated_256(
                *lanes,
                _mm256_loadu_si256(wp.add(offset).cast()),
                _mm256_loadu_si256(ap.add(offset).cast()),
            );
        }
    }
    let mut halves = [[0.0f32; 16]; 2];
    for (k, lanes) in acc.iter().enumerate() {
        _mm256_storeu_ps(halves[k / 2][8 * (k % 2)..].as_mut_ptr(), *lanes);
    }
    finish_bf16(n, w, a, &halves)
}

#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
unsafe fn bf16_avx512_emulated(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 2];
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    for step in 0..n / FLOAT_STEP {
        for (h, lanes) in acc.iter_mut().enumerate() {
            let offset = 2 * (FLOAT_STEP * step + 32 * h);
            *lanes = dpbf16_emulated_512(
                *lanes,
                _mm512_loadu_si512(wp.add(offset).cast()),
                _mm512_loadu_si512(ap.add(offset).cast()),
            );
        }
    }
    let mut halves = [[0.0f32; 16]; 2];
    for (h, lanes) in acc.iter().enumerate() {
        _mm512_storeu_ps(halves[h].as_mut_ptr(), *lanes);
    }
    finish_bf16(n, w, a, &halves)
}

#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn bf16_avx512_native(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 2];
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    for step in 0..n / FLOAT_STEP {
        for (h, lanes) in acc.iter_mut().enumerate() {
            let offset = 2 * (FLOAT_STEP * step + 32 * h);
            let weights: __m512bh = std::mem::transmute(_mm512_loadu_si512(wp.add(offset).cast()));
            let values: __m512bh = std::mem::transmute(_mm512_loadu_si512(ap.add(offset).cast()));
            *lanes = _mm512_dpbf16_ps(*lanes, weights, values);
        }
    }
    let mut halves = [[0.0f32; 16]; 2];
    for (h, lanes) in acc.iter().enumerate() {
        _mm512_storeu_ps(halves[h].as_mut_ptr(), *lanes);
    }
    finish_bf16(n, w, a, &halves)
}

pub(super) fn dot_f32_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check(n, 4, w, a);
    // SAFETY: `dot_fn` and `multi_dot_fn` hand this out only at a level that
    // `SimdLevel::is_available` confirmed (AVX2, FMA, F16C); `check` confirmed both rows
    // hold `n` elements.
    unsafe { row_avx2::<F32>(n, w, a) }
}

pub(super) fn dot_f32_avx512(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check(n, 4, w, a);
    // SAFETY: `dot_fn` and `multi_dot_fn` hand this out only at the AVX-512 level, which
    // `SimdLevel::is_available` confirmed (AVX2, FMA, F16C, AVX-512 F/BW/VL); `check`
    // confirmed both rows hold `n` elements.
    unsafe { row_avx512::<F32>(n, w, a) }
}

/// Checks an F16 gemv's shapes: `out.len()` whole rows of `n` elements in `weight_rows` and
/// an activation of at least `n`; returns the bytes of a row.
fn check_gemv(n: usize, weight_rows: &[u8], activation: &[u8], out: &[f32]) -> usize {
    let row_bytes = 2 * n;
    assert_eq!(
        weight_rows.len(),
        row_bytes * out.len(),
        "{} F16 rows of {n} elements",
        out.len()
    );
    assert!(
        activation.len() >= row_bytes,
        "an F16 activation row of {} bytes is shorter than {n} elements",
        activation.len()
    );
    row_bytes
}

/// The reduced 32-element steps of `R` F16 weight rows against one F16 activation row in
/// ggml-cpu's AVX2 order ([`crate::dot::HalfSums::Lanes8`]: four 8-lane f32 accumulators
/// per row, `GGML_F32x8_REDUCE`), each row's next line fetched `ahead` bytes on.
///
/// # Safety
/// AVX2, FMA and F16C are available; every row and `a` hold `64 * steps` readable bytes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes8_steps<const R: usize>(
    steps: usize,
    rows: [*const u8; R],
    a: *const u8,
    ahead: usize,
) -> [f32; R] {
    let mut acc = [[_mm256_setzero_ps(); 4]; R];
    for step in 0..steps {
        let offset = 64 * step;
        let mut x = [_mm256_setzero_ps(); 4];
        for (j, lanes) in x.iter_mut().enumerate() {
            *lanes = _mm256_cvtph_ps(_mm_loadu_si128(a.add(offset + 16 * j).cast()));
        }
        for (row, acc) in rows.iter().zip(acc.iter_mut()) {
            let row = row.add(offset);
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(ahead).cast());
            for (j, lanes) in acc.iter_mut().enumerate() {
                let w = _mm256_cvtph_ps(_mm_loadu_si128(row.add(16 * j).cast()));
                *lanes = _mm256_fmadd_ps(w, x[j], *lanes);
            }
        }
    }
    let mut out = [0.0f32; R];
    for (value, [a0, a1, a2, a3]) in out.iter_mut().zip(acc) {
        let sum = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
        let quad = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps::<1>(sum));
        let pair = _mm_hadd_ps(quad, quad);
        *value = _mm_cvtss_f32(_mm_hadd_ps(pair, pair));
    }
    out
}

/// F16 at the AVX2 levels in ggml-cpu's AVX2 order (twin: `dot::float::dot_f16_lanes8`).
pub(super) fn dot_f16_lanes8_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check(n, 2, w, a);
    // SAFETY: `dot_fn` and `multi_dot_fn` hand this out only at the AVX2 levels, which
    // `SimdLevel::is_available` confirmed (AVX2, FMA, F16C); `check` confirmed both rows
    // hold `n` elements, so `64 * (n / 32)` bytes.
    let [start] = unsafe { lanes8_steps::<1>(n / LANES8_STEP, [w.as_ptr()], a.as_ptr(), 0) };
    dot_f16_lanes8_finish(n, w, a, start)
}

/// F16 gemv at the AVX2 levels in ggml-cpu's AVX2 order: [`dot_f16_lanes8_avx2`] per row,
/// two rows at a time sharing the activation's conversions, each fetching the line of the
/// next pair's row ahead.
pub(super) fn gemv_f16_lanes8_avx2(
    n: usize,
    weight_rows: &[u8],
    activation: &[u8],
    out: &mut [f32],
) {
    const R: usize = 2;
    let row_bytes = check_gemv(n, weight_rows, activation, out);
    let groups = weight_rows.chunks_exact(R * row_bytes);
    let last = groups.remainder();
    let mut outs = out.chunks_exact_mut(R);
    for (group, out) in groups.zip(outs.by_ref()) {
        let rows: [&[u8]; R] = std::array::from_fn(|r| &group[r * row_bytes..(r + 1) * row_bytes]);
        // SAFETY: `gemv_fn` hands this kernel out only at the AVX2 levels, which
        // `SimdLevel::is_available` confirmed (AVX2, FMA, F16C); each row and the
        // activation hold `n` elements (checked above). A prefetch does not fault.
        let starts = unsafe {
            lanes8_steps::<R>(
                n / LANES8_STEP,
                rows.map(<[u8]>::as_ptr),
                activation.as_ptr(),
                R * row_bytes,
            )
        };
        for ((value, row), start) in out.iter_mut().zip(rows).zip(starts) {
            *value = dot_f16_lanes8_finish(n, row, activation, start);
        }
    }
    for (value, row) in outs
        .into_remainder()
        .iter_mut()
        .zip(last.chunks_exact(row_bytes))
    {
        *value = dot_f16_lanes8_avx2(n, row, activation);
    }
}

/// F16 (both levels): the native-f16 part through the AVX2 + F16C kernels of
/// `half_arith`, the leftovers as the twin.
pub(super) fn dot_f16_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_f16_with(n, w, a, half_arith::dot_body, exact_tail())
}

/// The exact leftover sum: sixteen lanes where AVX-512 DQ is, else eight (the F16 kernels
/// are handed out only at levels with AVX2, FMA and F16C).
pub(super) fn exact_tail() -> Option<ExactTail> {
    if super::has_avx512_dq() {
        Some(|x, y, start| {
            // SAFETY: `has_avx512_dq` confirmed AVX-512 F/BW/VL/DQ; the F16 kernels are
            // handed out only where F16C is.
            unsafe { super::half::tail_sum_exact(x, y, start) }
        })
    } else {
        Some(|x, y, start| {
            // SAFETY: the F16 kernels are handed out only at levels that
            // `SimdLevel::is_available` confirmed (AVX2, FMA, F16C).
            unsafe { super::half::tail_sum_exact_avx2(x, y, start) }
        })
    }
}

/// F16 gemv at the AVX-512 levels: [`dot_f16_avx2`] per row, the native parts of several
/// rows at a time so that their chains overlap: four rows through AVX512-FP16's own
/// instructions where the CPU has them (`half_native::dot_body_x4`), else two through the
/// emulation (`half::dot_body_avx512_x2`, whose reductions overlap).
pub(super) fn gemv_f16_avx512(n: usize, weight_rows: &[u8], activation: &[u8], out: &mut [f32]) {
    if super::half_native::has_avx512_fp16() {
        gemv_f16_rows::<4>(n, weight_rows, activation, out, |xs, y, ahead| {
            // SAFETY: `has_avx512_fp16` confirmed AVX512-FP16 and AVX-512 F/BW/VL.
            unsafe { super::half_native::dot_body_x4(xs, y, ahead) }
        });
    } else {
        gemv_f16_rows::<2>(n, weight_rows, activation, out, |[x0, x1], y, ahead| {
            // SAFETY: `gemv_fn` hands this kernel out only at the AVX-512 levels, which
            // `SimdLevel::is_available` confirmed (AVX-512 F/BW/VL, F16C).
            unsafe { super::half::dot_body_avx512_x2(x0, x1, y, ahead) }
        });
    }
}

/// F16 gemv at the AVX2 levels in the reference order (`RUNIT_CPU_F16_REFERENCE`):
/// [`dot_f16_avx2`] per row, each row's native part prefetching the next row's
/// (`half::dot_body_avx2`).
pub(super) fn gemv_f16_avx2(n: usize, weight_rows: &[u8], activation: &[u8], out: &mut [f32]) {
    gemv_f16_rows::<2>(n, weight_rows, activation, out, |xs, y, ahead| {
        // SAFETY: `gemv_fn` hands this kernel out only at the AVX2 levels, which
        // `SimdLevel::is_available` confirmed (AVX2, FMA, F16C).
        unsafe { super::half::dot_body_avx2_rows(xs, y, ahead) }
    });
}

/// [`gemv_f16_avx512`] with `body` computing the native parts of `R` rows at once
/// (prefetching `ahead` elements past each), the leftovers and a last group of fewer rows
/// as [`dot_f16_avx2`].
fn gemv_f16_rows<const R: usize>(
    n: usize,
    weight_rows: &[u8],
    activation: &[u8],
    out: &mut [f32],
    body: impl Fn([&[f16]; R], &[f16], usize) -> [f16; R],
) {
    let row_bytes = check_gemv(n, weight_rows, activation, out);
    let native = half_arith::body_len(n);
    let tail = exact_tail();
    let y = f16_row(&activation[..2 * native]);
    // The weights as f16 values once for the call (borrowed: a model's rows are aligned),
    // not a copy-or-borrow per row of every group, which cost ~6% of an F16 decode step.
    let values = f16_row(&weight_rows[..weight_rows.len() / row_bytes / R * R * row_bytes]);
    let groups = weight_rows.chunks_exact(R * row_bytes);
    let last = groups.remainder();
    let mut outs = out.chunks_exact_mut(R);
    for ((index, group), out) in groups.enumerate().zip(outs.by_ref()) {
        let rows: [&[u8]; R] = std::array::from_fn(|r| &group[r * row_bytes..(r + 1) * row_bytes]);
        let starts = if native > 0 {
            let first = index * R * n;
            let xs: [&[f16]; R] =
                std::array::from_fn(|r| &values[first + r * n..first + r * n + native]);
            body(xs, &y, R * n)
        } else {
            [f16::ZERO; R]
        };
        // The leftovers of the next rows (the body prefetched their native parts).
        for line in (2 * native..row_bytes).step_by(64) {
            for r in 0..R {
                let next = group.as_ptr().wrapping_add((R + r) * row_bytes + line);
                // SAFETY: a prefetch does not fault, past the end of the rows included.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(next.cast()) };
            }
        }
        // A NaN is the twin's positive one (as `half_arith::dot_body`).
        let starts = starts.map(|start| if start.is_nan() { f16::NAN } else { start });
        let sums = if native == n {
            starts.map(|start| Some(f64::from(start)))
        } else if super::has_avx512_dq() {
            let xs = rows.map(|row| row[2 * native..].as_ptr().cast::<f16>());
            let y = activation[2 * native..].as_ptr().cast::<f16>();
            // SAFETY: `has_avx512_dq` confirmed AVX-512 F/BW/VL/DQ, and the F16 kernels are
            // handed out only where F16C is; every row and the activation hold `n` values
            // (checked above), so `n - native` past `native`. Unaligned values are read
            // with unaligned loads.
            unsafe { super::half::tail_sums_exact(xs, y, n - native, starts.map(f64::from)) }
        } else {
            [None; R]
        };
        for (((value, row), start), sum) in out.iter_mut().zip(rows).zip(starts).zip(sums) {
            *value = match sum {
                Some(sum) => sum as f32,
                None => dot_f16_finish(n, row, activation, start, tail),
            };
        }
    }
    for (value, row) in outs
        .into_remainder()
        .iter_mut()
        .zip(last.chunks_exact(row_bytes))
    {
        *value = dot_f16_avx2(n, row, activation);
    }
}

pub(super) fn dot_bf16_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check(n, 2, w, a);
    // SAFETY: `dot_fn` and `multi_dot_fn` hand this out only at a level that
    // `SimdLevel::is_available` confirmed (AVX2, FMA); `check` confirmed both rows hold `n`
    // elements.
    unsafe { bf16_avx2(n, w, a) }
}

pub(super) fn dot_bf16_avx512(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check(n, 2, w, a);
    if has_bf16() {
        // SAFETY: `has_bf16` just detected AVX512_BF16; `dot_fn` and `multi_dot_fn` hand
        // this kernel out only at the AVX-512 level, which `SimdLevel::is_available`
        // confirmed (AVX2, FMA, AVX-512 F/BW/VL); `check` confirmed both rows hold `n`
        // elements.
        unsafe { bf16_avx512_native(n, w, a) }
    } else {
        // SAFETY: `dot_fn` and `multi_dot_fn` hand this kernel out only at the AVX-512
        // level, which `SimdLevel::is_available` confirmed (AVX2, FMA, AVX-512 F/BW/VL);
        // `check` confirmed both rows hold `n` elements.
        unsafe { bf16_avx512_emulated(n, w, a) }
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use crate::dot::{dot_fn, gemv_fn, twin_dot_fn, SimdLevel};
    use crate::GgmlType;

    /// The F16 gemv of every level this CPU has against its scalar twin on rows with
    /// overflowing sums, infinities, NaNs and subnormals, odd row counts and rows with and
    /// without leftovers.
    #[test]
    fn f16_gemv_equals_the_scalar_twin_on_extreme_rows() {
        for level in SimdLevel::ALL.into_iter().filter(|l| l.is_available()) {
            if let Some(gemv) = gemv_fn(GgmlType::F16, level) {
                let twin = twin_dot_fn(GgmlType::F16, level).expect("scalar twin");
                extreme_rows(level, gemv, twin);
            }
        }
        // The AVX2 levels' reference-order gemv (`RUNIT_CPU_F16_REFERENCE`).
        if SimdLevel::Avx2.is_available() {
            let twin = dot_fn(GgmlType::F16, SimdLevel::Scalar).expect("scalar twin");
            extreme_rows(SimdLevel::Avx2, super::gemv_f16_avx2, twin);
        }
    }

    fn extreme_rows(level: SimdLevel, gemv: crate::dot::GemvFn, twin: crate::dot::DotFn) {
        for n in [128, 200, 576] {
            let special = [
                f16::INFINITY,
                f16::NEG_INFINITY,
                f16::NAN,
                f16::from_f32(6e-8),
            ];
            let value = |r: usize, i: usize| -> f16 {
                match (r + i) % 97 {
                    0 if r % 3 == 1 => special[(r / 3) % 4],
                    _ => f16::from_f32(((r * 31 + i * 7) as f32 * 0.37).sin() * 300.0),
                }
            };
            let rows = 9;
            let bytes =
                |v: Vec<f16>| -> Vec<u8> { v.iter().flat_map(|h| h.to_le_bytes()).collect() };
            let w = bytes((0..rows * n).map(|k| value(k / n, k % n)).collect());
            let a = bytes(
                (0..n)
                    .map(|i| f16::from_f32((i as f32 * 0.11).cos() * 200.0))
                    .collect(),
            );
            let mut out = vec![0.0f32; rows];
            gemv(n, &w, &a, &mut out);
            for (r, value) in out.iter().enumerate() {
                let want = twin(n, &w[r * 2 * n..(r + 1) * 2 * n], &a);
                assert_eq!(
                    value.to_bits(),
                    want.to_bits(),
                    "{level:?} n {n} row {r}: {value} vs {want}"
                );
            }
        }
    }
}
