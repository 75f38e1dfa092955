//! Greedy picks from logits: the index of each row's largest value and that choice's
//! log-probability, what greedy generation needs instead of the whole row
//! ([`Backend::greedy_pick`](crate::Backend::greedy_pick); a device backend computes it where
//! the logits are and downloads two numbers per row).

/// The greedy choice of one row of logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pick {
    /// Index of the largest logit (the first one among equals; NaNs never win).
    pub id: u32,
    /// `ln(softmax(row)[id])`.
    pub logprob: f32,
}

/// [`Pick`] of `row` on the host.
pub fn pick_row(row: &[f32]) -> Pick {
    let (mut best, mut best_value) = (None, f32::NEG_INFINITY);
    for (i, &v) in row.iter().enumerate() {
        if v > best_value || (best.is_none() && v == best_value) {
            (best, best_value) = (Some(i), v);
        }
    }
    let id = best.unwrap_or(0);
    let logprob = if best_value.is_finite() {
        log_probability(row, id) as f32
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
    const LANES: usize = 16;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_first_largest_and_its_log_probability() {
        let row = [0.5f32, 2.0, -1.0, 2.0, f32::NAN];
        let pick = pick_row(&row);
        assert_eq!(pick.id, 1);
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
