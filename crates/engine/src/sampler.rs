//! Token sampling: logit biases and the grammar's mask, penalties, then top-k, top-p, min-p,
//! temperature and a seeded draw; greedy (argmax after penalties) when the temperature is
//! zero. Each sequence has its own sampler, so its draws depend on its seed alone.

use std::collections::VecDeque;

use crate::constraint::Constraint;
use crate::EngineError;

/// How the scheduler's failure message for a sequence starts when its own sampling settings
/// (a grammar, logit biases) left no token to pick: the request's fault, not the engine's.
pub const SAMPLING_FAILED: &str = "sampling failed";

/// A logit bias at this value or below bans its token; at this value or above it forces it
/// (OpenAI's `logit_bias` range is -100 to 100).
pub const LOGIT_BIAS_LIMIT: f32 = 100.0;

/// Sampling settings; [`SamplerParams::DEFAULT`] holds the one set of defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables top-k.
    pub top_k: usize,
    /// 1.0 disables top-p.
    pub top_p: f32,
    /// 0.0 disables min-p.
    pub min_p: f32,
    /// Divides positive logits (multiplies negative ones) of recent tokens; 1.0 disables.
    pub repeat_penalty: f32,
    /// Subtracted once per earlier occurrence of a token in the window.
    pub frequency_penalty: f32,
    /// Subtracted once from every token present in the window.
    pub presence_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_window: usize,
    /// Seeds the draws: the same seed and settings give the same tokens.
    pub seed: u64,
    /// Added to the logits of these token ids before anything else; -100 bans a token,
    /// +100 forces it (only forced tokens stay when any is forced).
    pub logit_bias: Vec<(u32, f32)>,
    /// The grammar the generated tokens must follow, in its starting state.
    pub constraint: Option<Constraint>,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams::DEFAULT
    }
}

impl SamplerParams {
    /// The sampling defaults of every entry point: the engine's [`Default`], the flags of
    /// `runit generate` and `runit chat`, and the fields a server request leaves out.
    ///
    /// They are llama.cpp's (`common_params_sampling`): RunIT answers as llama.cpp does, and
    /// llama.cpp applies these same values in its CLI and to requests of its server that omit
    /// a field, so a llama.cpp user gets what they are used to from every entry point.
    /// OpenAI's API documents temperature 1 and top-p 1 for requests that omit them; a client
    /// that wants those sends them. Greedy decoding is `temperature: 0` ([`Self::greedy`]).
    ///
    /// The seed here is fixed so that a library caller that sets none draws reproducibly; the
    /// CLI and the server draw a [`random_seed`] when none is given, as llama.cpp does.
    pub const DEFAULT: SamplerParams = SamplerParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        repeat_penalty: 1.0,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        penalty_window: 64,
        seed: 0x5eed,
        logit_bias: Vec::new(),
        constraint: None,
    };

    /// The defaults with temperature 0: the most likely token every time.
    pub fn greedy() -> SamplerParams {
        SamplerParams {
            temperature: 0.0,
            ..SamplerParams::DEFAULT
        }
    }

    /// Rejects NaN, negative and out-of-range settings with a message naming the setting.
    pub fn validate(&self) -> Result<(), EngineError> {
        let check = |name: &'static str, value: f32, ok: bool| {
            if value.is_finite() && ok {
                Ok(())
            } else {
                Err(EngineError::InvalidParameter {
                    name,
                    message: format!("invalid value {value}"),
                })
            }
        };
        check("temperature", self.temperature, self.temperature >= 0.0)?;
        check("top_p", self.top_p, self.top_p > 0.0 && self.top_p <= 1.0)?;
        check("min_p", self.min_p, (0.0..=1.0).contains(&self.min_p))?;
        check(
            "repeat_penalty",
            self.repeat_penalty,
            self.repeat_penalty > 0.0,
        )?;
        check("frequency_penalty", self.frequency_penalty, true)?;
        check("presence_penalty", self.presence_penalty, true)?;
        for &(_, bias) in &self.logit_bias {
            check(
                "logit_bias",
                bias,
                (-LOGIT_BIAS_LIMIT..=LOGIT_BIAS_LIMIT).contains(&bias),
            )?;
        }
        Ok(())
    }

    /// True when the draw is a plain argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

/// A seed from the clock, for runs that give none (the CLI and the server).
pub fn random_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(SamplerParams::DEFAULT.seed, |since| since.as_nanos() as u64)
}

/// A small, fast, seedable generator (xoshiro256**), seeded through splitmix64.
#[derive(Debug, Clone)]
pub struct Rng {
    state: [u64; 4],
}

impl Rng {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            state: [next(), next(), next(), next()],
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.state;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Samples tokens from logits under [`SamplerParams`], remembering recent tokens for the
/// penalties.
pub struct Sampler {
    params: SamplerParams,
    rng: Rng,
    recent: VecDeque<u32>,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler; fails on invalid settings.
    pub fn new(params: SamplerParams) -> Result<Sampler, EngineError> {
        params.validate()?;
        Ok(Sampler {
            rng: Rng::new(params.seed),
            params,
            recent: VecDeque::new(),
            candidates: Vec::new(),
        })
    }

    /// The settings the sampler draws with.
    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Records a token (prompt or generated) for the penalty window.
    pub fn accept(&mut self, token: u32) {
        if self.params.penalty_window == 0 {
            return;
        }
        if self.recent.len() == self.params.penalty_window {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// Picks the next token from `logits` (modified in place by the biases, the grammar's
    /// mask and the penalties), and advances the grammar past it. Fails when a bias names a
    /// token outside `logits`, or when no token is left to pick.
    pub fn sample(&mut self, logits: &mut [f32]) -> Result<u32, EngineError> {
        self.shape(logits)?;
        let id = self.draw(logits);
        self.commit(logits, id)
    }

    /// Speculative sampling (Leviathan et al. 2023, Chen et al. 2023) of the position a
    /// drafter proposed `draft` for, with a drafter that proposes one token for sure (its
    /// distribution a point mass): the draft is kept with the probability `p(draft)` that
    /// [`Sampler::sample`] would draw it with, else a token is drawn from `p` without the
    /// draft, renormalised, so that the token returned is distributed as `sample`'s. Greedy
    /// settings keep the draft when it is the argmax. Returns the token and whether it is
    /// the draft; advances the grammar as `sample` does.
    pub fn sample_draft(
        &mut self,
        logits: &mut [f32],
        draft: u32,
    ) -> Result<(u32, bool), EngineError> {
        self.shape(logits)?;
        let id = if self.params.is_greedy() {
            argmax(logits)
        } else {
            let probs = self.distribution(logits);
            let candidates = &self.candidates;
            let kept = candidates.iter().position(|&(id, _)| id == draft);
            let p_draft = kept.map_or(0.0, |i| probs[i]);
            if self.rng.next_f64() < p_draft {
                draft
            } else {
                let rest = probs
                    .iter()
                    .zip(candidates)
                    .filter(|&(_, &(id, _))| id != draft)
                    .map(|(&q, &(id, _))| (id, q));
                pick_by_mass(rest, self.rng.next_f64() * (1.0 - p_draft))
                    .or_else(|| candidates.iter().rev().map(|c| c.0).find(|&id| id != draft))
                    .unwrap_or(draft)
            }
        };
        let id = self.commit(logits, id)?;
        Ok((id, id == draft))
    }

    /// Biases, the grammar's mask and the penalties, applied to `logits` before a draw.
    fn shape(&mut self, logits: &mut [f32]) -> Result<(), EngineError> {
        self.apply_logit_bias(logits)?;
        if let Some(constraint) = &mut self.params.constraint {
            constraint.mask(logits)?;
        }
        self.apply_penalties(logits);
        Ok(())
    }

    /// Checks the drawn `id` and advances the grammar past it.
    fn commit(&mut self, logits: &[f32], id: u32) -> Result<u32, EngineError> {
        if logits[id as usize] == f32::NEG_INFINITY {
            return Err(EngineError::InvalidParameter {
                name: "logit_bias",
                message: "every token is banned".into(),
            });
        }
        if let Some(constraint) = &mut self.params.constraint {
            constraint.accept(id)?;
        }
        Ok(id)
    }

    /// Follows `constraint` from now on (or no grammar), keeping the penalty window and
    /// the random state: a chat starts each answer's grammar afresh.
    pub fn set_constraint(&mut self, constraint: Option<Constraint>) {
        self.params.constraint = constraint;
    }

    /// Computes the grammar's next mask ahead of [`Sampler::sample`] (see
    /// [`Constraint::prepare`]); nothing without a grammar.
    pub fn prepare_mask(&mut self) {
        if let Some(constraint) = &mut self.params.constraint {
            constraint.prepare();
        }
    }

    /// The grammar's state, when the sampler follows one.
    pub fn constraint(&self) -> Option<&Constraint> {
        self.params.constraint.as_ref()
    }

    fn apply_logit_bias(&self, logits: &mut [f32]) -> Result<(), EngineError> {
        let bias = &self.params.logit_bias;
        if bias.is_empty() {
            return Ok(());
        }
        if let Some(&(id, _)) = bias.iter().find(|&&(id, _)| id as usize >= logits.len()) {
            return Err(EngineError::InvalidParameter {
                name: "logit_bias",
                message: format!("token {id} is outside the vocabulary of {}", logits.len()),
            });
        }
        let forced = bias.iter().any(|&(_, value)| value >= LOGIT_BIAS_LIMIT);
        if forced {
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

    /// The draw from logits after biases, mask and penalties.
    fn draw(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let probs = self.distribution(logits);
        let c = &self.candidates;
        let mass = probs.iter().zip(c).map(|(&q, &(id, _))| (id, q));
        pick_by_mass(mass, self.rng.next_f64()).unwrap_or(c[c.len() - 1].0)
    }

    /// The distribution a non-greedy draw takes from: leaves the kept candidates in
    /// `self.candidates` (top-k, top-p, min-p, by descending logit) and returns their
    /// probabilities at the temperature.
    fn distribution(&mut self, logits: &[f32]) -> Vec<f64> {
        let p = &self.params;
        let c = &mut self.candidates;
        c.clear();
        c.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        // Descending logits, ties by id: a total order, so selecting the top k first and
        // sorting only those gives the same candidates as sorting the whole vocabulary.
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < c.len() {
            c.select_nth_unstable_by(p.top_k - 1, order);
            c.truncate(p.top_k);
        }
        c.sort_unstable_by(order);
        // Probabilities at temperature 1 for top-p and min-p, as llama.cpp orders them.
        let probs = softmax_sorted(c, 1.0);
        if p.top_p < 1.0 {
            let mut cumulative = 0.0;
            let mut keep = c.len();
            for (i, q) in probs.iter().enumerate() {
                cumulative += q;
                if cumulative >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep.max(1));
        }
        if p.min_p > 0.0 {
            let threshold = c[0].1 + (p.min_p as f64).ln() as f32;
            let keep = c.iter().take_while(|(_, l)| *l >= threshold).count();
            c.truncate(keep.max(1));
        }
        softmax_sorted(c, p.temperature)
    }

    /// True when [`Sampler::sample`] is the plain argmax of the logits: greedy, with no
    /// bias, grammar or penalty that would change them.
    pub fn is_plain_argmax(&self) -> bool {
        let p = &self.params;
        p.is_greedy()
            && p.logit_bias.is_empty()
            && p.constraint.is_none()
            && p.repeat_penalty == 1.0
            && p.frequency_penalty == 0.0
            && p.presence_penalty == 0.0
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        if self.recent.is_empty()
            || (p.repeat_penalty == 1.0 && p.frequency_penalty == 0.0 && p.presence_penalty == 0.0)
        {
            return;
        }
        let mut counts: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
        for &t in &self.recent {
            *counts.entry(t).or_default() += 1;
        }
        for (&token, &count) in &counts {
            let Some(l) = logits.get_mut(token as usize) else {
                continue;
            };
            if *l > 0.0 {
                *l /= p.repeat_penalty;
            } else {
                *l *= p.repeat_penalty;
            }
            *l -= count as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }
}

/// Index of the largest value (the first one on ties).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best as u32
}

/// The token at cumulative mass `r` of `(token, probability)` pairs in order; `None` when
/// `r` lies beyond their total (rounding).
fn pick_by_mass(mass: impl Iterator<Item = (u32, f64)>, mut r: f64) -> Option<u32> {
    for (id, q) in mass {
        if r < q {
            return Some(id);
        }
        r -= q;
    }
    None
}

/// Softmax (in f64) of candidates sorted by descending logit, at `temperature`.
fn softmax_sorted(candidates: &[(u32, f32)], temperature: f32) -> Vec<f64> {
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

/// `ln(softmax(logits)[id])` for a generated token, in one vectorizable pass (see
/// [`runit_backend::pick::log_probability`]); perplexity keeps the exact [`log_softmax`].
pub fn log_probability(logits: &[f32], id: u32) -> f64 {
    runit_backend::pick::log_probability(logits, id as usize)
}

/// Natural-log softmax of `logits` in f64 (for log-probabilities and perplexity).
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let log_sum = sum.ln() + max;
    logits.iter().map(|&l| l as f64 - log_sum).collect()
}

/// The `k` most likely tokens with their log-probabilities, most likely first.
pub fn top_logprobs(logits: &[f32], k: usize) -> Vec<(u32, f64)> {
    let logp = log_softmax(logits);
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    let k = k.min(ids.len());
    if k == 0 {
        return Vec::new();
    }
    ids.select_nth_unstable_by(k - 1, |&a, &b| {
        logp[b as usize].total_cmp(&logp[a as usize])
    });
    ids.truncate(k);
    ids.sort_by(|&a, &b| {
        logp[b as usize]
            .total_cmp(&logp[a as usize])
            .then(a.cmp(&b))
    });
    ids.into_iter().map(|i| (i, logp[i as usize])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_probability_agrees_with_log_softmax() {
        let mut rng = runit_backend::testing::Rng::new(0x1234_5678);
        for size in [1usize, 7, 16, 100, 49_152] {
            let logits = rng.values(size, -30.0, 30.0);
            let exact = log_softmax(&logits);
            for id in [0, size / 2, size - 1] {
                let fast = log_probability(&logits, id as u32);
                assert!(
                    (fast - exact[id]).abs() <= 1e-5 * exact[id].abs().max(1.0),
                    "size {size} id {id}: {fast} vs {}",
                    exact[id]
                );
            }
        }
    }
}
