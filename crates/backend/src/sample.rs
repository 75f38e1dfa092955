//! Sampling a token from a row of logits, the host form of the one algorithm: logit biases,
//! penalties, then greedy (argmax) or top-k, top-p, min-p, temperature and a draw at a given
//! uniform `u`. The engine's `Sampler` runs these functions (with its grammar's mask between
//! the biases and the penalties), [`crate::PrimitiveOps::sample_pick`]'s default runs
//! [`sample_row`], and a device kernel that samples repeats them step for step (CUDA's
//! `kernels/sample.cu`), so every path draws the same token from the same logits and `u`.

/// A logit bias at this value or below bans its token; at this value or above it forces it
/// (OpenAI's `logit_bias` range is -100 to 100).
pub const LOGIT_BIAS_LIMIT: f32 = 100.0;

/// The filters and the temperature of a draw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Filters {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables top-k.
    pub top_k: usize,
    /// 1.0 disables top-p.
    pub top_p: f32,
    /// 0.0 disables min-p.
    pub min_p: f32,
}

impl Filters {
    /// True when the draw is a plain argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

/// The penalties on tokens of the recent window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Penalties {
    /// Divides positive logits (multiplies negative ones); 1.0 disables.
    pub repeat: f32,
    /// Subtracted once per occurrence in the window.
    pub frequency: f32,
    /// Subtracted once from every token present in the window.
    pub presence: f32,
}

impl Penalties {
    /// True when no penalty changes a logit.
    pub fn is_off(&self) -> bool {
        self.repeat == 1.0 && self.frequency == 0.0 && self.presence == 0.0
    }
}

/// Everything that decides one row's token: [`sample_row`]'s input, and the per-row entry
/// of [`crate::PrimitiveOps::sample_pick`].
#[derive(Debug, Clone, Copy)]
pub struct RowSampling<'a> {
    pub filters: Filters,
    pub penalties: Penalties,
    /// `(token, occurrences)` of the tokens in the penalty window ([`penalty_counts`]).
    pub penalized: &'a [(u32, u32)],
    /// `(token, bias)` in the request's order (a token may repeat: the biases add in order).
    pub logit_bias: &'a [(u32, f32)],
    /// The uniform draw in `[0, 1)` a non-greedy row picks at; unused by greedy rows.
    pub uniform: f64,
}

/// A row's token and its logit after the biases and penalties (`-inf` says the token was
/// banned: every token was).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    pub id: u32,
    pub logit: f32,
}

/// True when a bias of `bias` forces its tokens (only forced tokens stay).
pub fn forces_tokens(bias: &[(u32, f32)]) -> bool {
    bias.iter().any(|&(_, value)| value >= LOGIT_BIAS_LIMIT)
}

/// Adds the biases to `logits` in order: a bias at `-LOGIT_BIAS_LIMIT` or below bans its token
/// (-inf), and when any is at `LOGIT_BIAS_LIMIT` or above every token without such a bias is
/// banned. Fails with the first token outside `logits`, changing nothing.
pub fn apply_logit_bias(logits: &mut [f32], bias: &[(u32, f32)]) -> Result<(), u32> {
    if let Some(&(id, _)) = bias.iter().find(|&&(id, _)| id as usize >= logits.len()) {
        return Err(id);
    }
    if forces_tokens(bias) {
        let mut kept = vec![false; logits.len()];
        for &(id, value) in bias {
            kept[id as usize] |= value >= LOGIT_BIAS_LIMIT;
        }
        for (logit, keep) in logits.iter_mut().zip(kept) {
            if !keep {
                *logit = f32::NEG_INFINITY;
            }
        }
    }
    for &(id, value) in bias {
        let logit = &mut logits[id as usize];
        if value <= -LOGIT_BIAS_LIMIT {
            *logit = f32::NEG_INFINITY;
        } else if value < LOGIT_BIAS_LIMIT {
            *logit += value;
        }
    }
    Ok(())
}

/// `(token, occurrences)` of `window`'s tokens, by token.
pub fn penalty_counts(window: impl IntoIterator<Item = u32>) -> Vec<(u32, u32)> {
    let mut tokens: Vec<u32> = window.into_iter().collect();
    tokens.sort_unstable();
    let mut counts: Vec<(u32, u32)> = Vec::new();
    for token in tokens {
        match counts.last_mut() {
            Some((last, count)) if *last == token => *count += 1,
            _ => counts.push((token, 1)),
        }
    }
    counts
}

/// Applies `penalties` to the logits of `penalized`'s tokens (those outside `logits` are
/// skipped): the repeat penalty divides a positive logit and multiplies another, then
/// `occurrences × frequency + presence` is subtracted (f32, in that order).
pub fn apply_penalties(logits: &mut [f32], penalties: Penalties, penalized: &[(u32, u32)]) {
    if penalties.is_off() {
        return;
    }
    for &(token, count) in penalized {
        let Some(l) = logits.get_mut(token as usize) else {
            continue;
        };
        if *l > 0.0 {
            *l /= penalties.repeat;
        } else {
            *l *= penalties.repeat;
        }
        *l -= count as f32 * penalties.frequency + penalties.presence;
    }
}

/// Index of the largest value: the first one on ties; NaNs never win, except that a NaN in
/// the first place is never beaten (every comparison with it is false), so it returns 0.
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best as u32
}

/// The order of candidates: descending logit by `f32::total_cmp` (positive NaNs first,
/// negative ones last, -0 below +0), ties by lower id. A total order, so selecting the top
/// k first and sorting only those gives the candidates that sorting the whole row gives.
pub fn candidate_order(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The distribution a non-greedy draw takes from: leaves the kept candidates in `candidates`
/// (top-k by [`candidate_order`], then top-p and min-p on the probabilities at temperature 1,
/// as llama.cpp orders them) and returns their probabilities at the temperature.
pub fn distribution(
    logits: &[f32],
    filters: Filters,
    candidates: &mut Vec<(u32, f32)>,
) -> Vec<f64> {
    let c = candidates;
    c.clear();
    c.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
    if filters.top_k > 0 && filters.top_k < c.len() {
        c.select_nth_unstable_by(filters.top_k - 1, candidate_order);
        c.truncate(filters.top_k);
    }
    c.sort_unstable_by(candidate_order);
    let probs = softmax_sorted(c, 1.0);
    if filters.top_p < 1.0 {
        let mut cumulative = 0.0;
        let mut keep = c.len();
        for (i, q) in probs.iter().enumerate() {
            cumulative += q;
            if cumulative >= filters.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        c.truncate(keep.max(1));
    }
    if filters.min_p > 0.0 {
        let threshold = c[0].1 + min_p_log(filters.min_p);
        let keep = c.iter().take_while(|(_, l)| *l >= threshold).count();
        c.truncate(keep.max(1));
    }
    softmax_sorted(c, filters.temperature)
}

/// `ln(min_p)` rounded to f32: what min-p adds to the largest logit for its threshold (a
/// device kernel receives it from the host rather than computing its own logarithm).
pub fn min_p_log(min_p: f32) -> f32 {
    (min_p as f64).ln() as f32
}

/// Softmax (in f64) of candidates sorted by descending logit, at `temperature`: the terms
/// `exp((l - max) / t)` summed in order, then each divided by the sum.
pub fn softmax_sorted(candidates: &[(u32, f32)], temperature: f32) -> Vec<f64> {
    let max = candidates[0].1 as f64;
    let t = temperature as f64;
    let mut probs: Vec<f64> = candidates
        .iter()
        .map(|&(_, l)| ((l as f64 - max) / t).exp())
        .collect();
    let sum: f64 = probs.iter().sum();
    for q in probs.iter_mut() {
        *q /= sum;
    }
    probs
}

/// The token at cumulative mass `r` of `(token, probability)` pairs in order; `None` when
/// `r` lies beyond their total (rounding, or NaN probabilities).
pub fn pick_by_mass(mass: impl Iterator<Item = (u32, f64)>, mut r: f64) -> Option<u32> {
    for (id, q) in mass {
        if r < q {
            return Some(id);
        }
        r -= q;
    }
    None
}

/// The draw from logits after biases and penalties: the [`argmax`] when greedy, else the
/// candidate of [`distribution`] at mass `uniform`, or the last candidate when rounding
/// leaves `uniform` beyond their total. `candidates` is working space.
pub fn draw(
    logits: &[f32],
    filters: Filters,
    uniform: f64,
    candidates: &mut Vec<(u32, f32)>,
) -> u32 {
    if filters.is_greedy() {
        return argmax(logits);
    }
    let probs = distribution(logits, filters, candidates);
    let c = &*candidates;
    let mass = probs.iter().zip(c).map(|(&q, &(id, _))| (id, q));
    pick_by_mass(mass, uniform).unwrap_or(c[c.len() - 1].0)
}

/// One row's token: [`apply_logit_bias`], [`apply_penalties`] and [`draw`] on `logits` (left
/// biased and penalized). Fails with a bias token outside the row.
pub fn sample_row(logits: &mut [f32], row: &RowSampling<'_>) -> Result<Sampled, u32> {
    apply_logit_bias(logits, row.logit_bias)?;
    apply_penalties(logits, row.penalties, row.penalized);
    let id = draw(logits, row.filters, row.uniform, &mut Vec::new());
    Ok(Sampled {
        id,
        logit: logits[id as usize],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_window_by_token() {
        assert_eq!(penalty_counts([5, 2, 5, 9, 5]), [(2, 1), (5, 3), (9, 1)]);
        assert!(penalty_counts([]).is_empty());
    }

    #[test]
    fn forced_tokens_leave_only_themselves() {
        let mut logits = [1.0f32, 2.0, 3.0, 4.0];
        apply_logit_bias(&mut logits, &[(1, 100.0), (3, -100.0), (0, 0.5)]).expect("in range");
        assert_eq!(
            logits,
            [f32::NEG_INFINITY, 2.0, f32::NEG_INFINITY, f32::NEG_INFINITY]
        );
        assert_eq!(apply_logit_bias(&mut logits, &[(4, 1.0)]), Err(4));
    }

    #[test]
    fn argmax_keeps_a_leading_nan() {
        assert_eq!(argmax(&[1.0, f32::NAN, 3.0, 3.0]), 2);
        assert_eq!(argmax(&[f32::NAN, 5.0]), 0);
    }
}
