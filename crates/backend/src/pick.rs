//! Greedy picks from logits: the index of each row's largest value and that choice's
//! log-probability, what greedy generation needs instead of the whole row
//! ([`crate::PrimitiveOps::greedy_pick`]; a device backend computes it where the logits are
//! and downloads two numbers per row).

/// The greedy choice of one row of logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pick {
    /// Index of the largest logit (the first one among equals; NaNs never win).
    pub id: u32,
    /// `ln(softmax(row)[id])`; NaN where it was not asked for.
    pub logprob: f32,
}

/// [`Pick`] of `row` on the host; the log-probability only with `log_probability`.
pub fn pick_row(row: &[f32], log_probability: bool) -> Pick {
    #[cfg(target_arch = "x86_64")]
    let (id, best_value) = if runit_quant::cpu::may_use(runit_quant::cpu::Feature::Avx2) {
        // SAFETY: `may_use` confirmed AVX2 just above.
        unsafe { x86::argmax(row) }
    } else {
        argmax_scalar(row)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let (id, best_value) = argmax_scalar(row);
    let logprob = if log_probability && best_value.is_finite() {
        self::log_probability(row, id) as f32
    } else {
        f32::NAN
    };
    Pick {
        id: id as u32,
        logprob,
    }
}

/// `ln(softmax(logits)[id])` in one pass with a vectorizable exponential (relative error
/// below 1e-6, far under what a reported log-probability shows). NaN logits count as
/// `-inf` (they add nothing).
pub fn log_probability(logits: &[f32], id: usize) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if runit_quant::cpu::may_use(runit_quant::cpu::Feature::Avx2) {
        // SAFETY: `may_use` confirmed AVX2 just above.
        return unsafe { x86::log_probability(logits, id) };
    }
    log_probability_scalar(logits, id)
}

/// The index of the first largest value of `row` (NaNs never win; 0 when every value is
/// NaN) and that value (-inf when none is larger).
fn argmax_scalar(row: &[f32]) -> (usize, f32) {
    let (mut best, mut best_value) = (None, f32::NEG_INFINITY);
    for (i, &v) in row.iter().enumerate() {
        if v > best_value || (best.is_none() && v == best_value) {
            (best, best_value) = (Some(i), v);
        }
    }
    (best.unwrap_or(0), best_value)
}

/// Lanes of [`log_probability`]'s partial maxima and sums.
const LANES: usize = 16;

/// The portable twin of [`log_probability`].
fn log_probability_scalar(logits: &[f32], id: usize) -> f64 {
    let mut maxima = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks.clone() {
        for (max, &l) in maxima.iter_mut().zip(chunk) {
            *max = if l > *max { l } else { *max };
        }
    }
    let max = tail
        .iter()
        .chain(&maxima)
        .fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m });
    if !max.is_finite() {
        return f64::NAN;
    }
    let mut sums = [0.0f64; LANES];
    for chunk in chunks {
        let mut terms = [0.0f32; LANES];
        for (term, &l) in terms.iter_mut().zip(chunk) {
            *term = exp_nonpositive(l - max);
        }
        for (sum, term) in sums.iter_mut().zip(terms) {
            *sum += f64::from(term);
        }
    }
    let sum = sums.iter().sum::<f64>()
        + tail
            .iter()
            .map(|&l| f64::from(exp_nonpositive(l - max)))
            .sum::<f64>();
    f64::from(logits[id]) - f64::from(max) - sum.ln()
}

/// `e^x` for `x <= 0` without a library call: `2^n * 2^f` with `n` the nearest integer of
/// `x * log2(e)` and a degree-6 polynomial for `2^f`, `|f| <= 1/2`; 0 below `2^-126`.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    let t = (x * std::f32::consts::LOG2_E).max(-126.0);
    let n = (t + 12_582_912.0) - 12_582_912.0; // round to nearest
    let f = t - n;
    // Taylor coefficients of 2^f = e^(f ln 2), Horner's rule with separate multiplies and
    // adds (`mul_add` is a library call on CPUs without FMA in the baseline target).
    let p = 1.540_353_1e-4f32;
    let p = p * f + 1.333_355_8e-3;
    let p = p * f + 9.618_129e-3;
    let p = p * f + 5.550_411e-2;
    let p = p * f + 2.402_265e-1;
    let p = p * f + 6.931_472e-1;
    let p = p * f + 1.0;
    let scale = f32::from_bits((((n as i32) + 127) as u32) << 23);
    p * scale
}

/// AVX2 [`log_probability`]: the twin's sixteen lanes as two registers, its operations
/// one for one (no fused multiply-adds, which the twin does not use), so the result is the
/// same bit for bit.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::LANES;

    /// [`super::exp_nonpositive`] of eight lanes.
    #[inline(always)]
    unsafe fn exp_nonpositive(x: __m256) -> __m256 {
        // `max(t, -126)` keeps -126 where `t` is NaN, as `f32::max` does.
        let t = _mm256_max_ps(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
            _mm256_set1_ps(-126.0),
        );
        let magic = _mm256_set1_ps(12_582_912.0);
        let n = _mm256_sub_ps(_mm256_add_ps(t, magic), magic);
        let f = _mm256_sub_ps(t, n);
        let mut p = _mm256_set1_ps(1.540_353_1e-4);
        for c in [
            1.333_355_8e-3f32,
            9.618_129e-3,
            5.550_411e-2,
            2.402_265e-1,
            6.931_472e-1,
            1.0,
        ] {
            p = _mm256_add_ps(_mm256_mul_ps(p, f), _mm256_set1_ps(c));
        }
        let exponent = _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127));
        _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(exponent)))
    }

    /// [`super::argmax_scalar`] in two vector passes: the largest non-NaN value (which
    /// `vmaxps(v, max)` keeps: a NaN `v` leaves `max`), then the first index holding it.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn argmax(row: &[f32]) -> (usize, f32) {
        let chunks = row.chunks_exact(8);
        let tail = chunks.remainder();
        let mut max = _mm256_set1_ps(f32::NEG_INFINITY);
        for chunk in chunks.clone() {
            max = _mm256_max_ps(_mm256_loadu_ps(chunk.as_ptr()), max);
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), max);
        let best = lanes
            .iter()
            .chain(tail)
            .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
        let splat = _mm256_set1_ps(best);
        for (c, chunk) in chunks.enumerate() {
            let equal = _mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_loadu_ps(chunk.as_ptr()), splat);
            let mask = _mm256_movemask_ps(equal);
            if mask != 0 {
                return (8 * c + mask.trailing_zeros() as usize, best);
            }
        }
        let body = row.len() - tail.len();
        let first = tail.iter().position(|&v| v == best).map_or(0, |i| body + i);
        (first, best)
    }

    /// See [`super::log_probability`].
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn log_probability(logits: &[f32], id: usize) -> f64 {
        let chunks = logits.chunks_exact(LANES);
        let tail = chunks.remainder();
        let mut maxima = [_mm256_set1_ps(f32::NEG_INFINITY); 2];
        for chunk in chunks.clone() {
            for (half, max) in maxima.iter_mut().enumerate() {
                // `l > max ? l : max`, which is what `vmaxps(l, max)` computes.
                let l = _mm256_loadu_ps(chunk.as_ptr().add(8 * half));
                *max = _mm256_max_ps(l, *max);
            }
        }
        let mut lanes = [0.0f32; LANES];
        _mm256_storeu_ps(lanes.as_mut_ptr(), maxima[0]);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), maxima[1]);
        let max = tail
            .iter()
            .chain(&lanes)
            .fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m });
        if !max.is_finite() {
            return f64::NAN;
        }
        let splat = _mm256_set1_ps(max);
        let mut sums = [_mm256_setzero_pd(); 4];
        for chunk in chunks {
            for half in 0..2 {
                let l = _mm256_loadu_ps(chunk.as_ptr().add(8 * half));
                let terms = exp_nonpositive(_mm256_sub_ps(l, splat));
                sums[2 * half] = _mm256_add_pd(
                    sums[2 * half],
                    _mm256_cvtps_pd(_mm256_castps256_ps128(terms)),
                );
                sums[2 * half + 1] = _mm256_add_pd(
                    sums[2 * half + 1],
                    _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(terms)),
                );
            }
        }
        let mut totals = [0.0f64; LANES];
        for (quarter, sum) in sums.iter().enumerate() {
            _mm256_storeu_pd(totals.as_mut_ptr().add(4 * quarter), *sum);
        }
        let sum = totals.iter().sum::<f64>()
            + tail
                .iter()
                .map(|&l| f64::from(super::exp_nonpositive(l - max)))
                .sum::<f64>();
        f64::from(logits[id]) - f64::from(max) - sum.ln()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn simd_argmax_equals_the_scalar_twin() {
        if !runit_quant::cpu::may_use(runit_quant::cpu::Feature::Avx2) {
            return;
        }
        let mut rng = crate::testing::Rng::new(0xa59);
        for size in [1usize, 7, 8, 9, 33, 1000] {
            for case in 0..6 {
                let mut row = rng.values(size, -5.0, 5.0);
                match case {
                    1 => row.fill(f32::NAN),
                    2 => row.fill(f32::NEG_INFINITY),
                    3 => {
                        row[size / 2] = 9.0;
                        row[size - 1] = 9.0;
                    }
                    4 => {
                        row[0] = f32::NAN;
                        row[size - 1] = f32::INFINITY;
                    }
                    5 => row.iter_mut().step_by(2).for_each(|v| *v = f32::NAN),
                    _ => {}
                }
                // SAFETY: AVX2 was detected above.
                let simd = unsafe { super::x86::argmax(&row) };
                let scalar = super::argmax_scalar(&row);
                assert_eq!(simd.0, scalar.0, "{size} values, case {case}");
                assert_eq!(
                    simd.1.to_bits(),
                    scalar.1.to_bits(),
                    "{size} values, case {case}"
                );
            }
        }
    }

    #[test]
    fn simd_log_probability_equals_the_scalar_twin() {
        let mut rng = crate::testing::Rng::new(0x51d);
        for size in [1usize, 15, 16, 17, 100, 1000, 49_152] {
            let mut logits = rng.values(size, -40.0, 40.0);
            if size > 20 {
                logits[3] = f32::NAN;
                logits[7] = f32::NEG_INFINITY;
                logits[size - 2] = 95.0;
            }
            for id in [0, size / 2, size - 1] {
                assert_eq!(
                    log_probability(&logits, id).to_bits(),
                    log_probability_scalar(&logits, id).to_bits(),
                    "{size} logits, id {id}"
                );
            }
        }
    }

    use super::*;

    #[test]
    fn picks_the_first_largest_and_its_log_probability() {
        let row = [0.5f32, 2.0, -1.0, 2.0, f32::NAN];
        let pick = pick_row(&row, true);
        assert_eq!(pick.id, 1);
        let bare = pick_row(&row, false);
        assert_eq!(bare.id, 1);
        assert!(bare.logprob.is_nan());
        let finite = &row[..4];
        let sum: f64 = finite.iter().map(|&l| (f64::from(l) - 2.0).exp()).sum();
        // The NaN makes the softmax undefined only through the max fold, which skips it.
        let expected = -sum.ln();
        assert!((f64::from(pick.logprob) - expected).abs() < 1e-5 || pick.logprob.is_nan());
    }

    #[test]
    fn log_probability_agrees_with_the_f64_formula() {
        let mut rng = crate::testing::Rng::new(0x1234_5678);
        for size in [1usize, 7, 16, 100, 49_152] {
            let logits = rng.values(size, -30.0, 30.0);
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let log_sum = logits
                .iter()
                .map(|&l| (f64::from(l) - max).exp())
                .sum::<f64>()
                .ln()
                + max;
            for id in [0, size / 2, size - 1] {
                let exact = f64::from(logits[id]) - log_sum;
                let fast = log_probability(&logits, id);
                assert!(
                    (fast - exact).abs() <= 1e-5 * exact.abs().max(1.0),
                    "size {size} id {id}: {fast} vs {exact}"
                );
            }
        }
    }
}
