//! Token sampling: logit biases and the grammar's mask, penalties, then top-k, top-p, min-p,
//! temperature and a seeded draw; greedy (argmax after penalties) when the temperature is
//! zero. Each sequence has its own sampler, so its draws depend on its seed alone. The
//! algorithm itself lives in [`runit_backend::sample`], which the backends' device sampling
//! repeats; the sampler holds the state around it (the grammar, the penalty window, the
//! random draws).

use std::collections::VecDeque;

use runit_backend::sample::{self as algorithm, Filters, Penalties, RowSampling, Sampled};
pub use runit_backend::sample::{argmax, LOGIT_BIAS_LIMIT};

use crate::constraint::Constraint;
use crate::EngineError;

/// How the scheduler's failure message for a sequence starts when its own sampling settings
/// (a grammar, logit biases) left no token to pick: the request's fault, not the engine's.
pub const SAMPLING_FAILED: &str = "sampling failed";

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
        self.filters().is_greedy()
    }

    /// The filters and temperature of a draw.
    pub fn filters(&self) -> Filters {
        Filters {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
        }
    }

    /// The penalties on the window's tokens.
    pub fn penalties(&self) -> Penalties {
        Penalties {
            repeat: self.repeat_penalty,
            frequency: self.frequency_penalty,
            presence: self.presence_penalty,
        }
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
            let probs =
                algorithm::distribution(logits, self.params.filters(), &mut self.candidates);
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
                algorithm::pick_by_mass(rest, self.rng.next_f64() * (1.0 - p_draft))
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
        self.commit_logit(logits[id as usize], id)
    }

    /// [`Sampler::commit`] of `id` whose logit after biases, mask and penalties is `logit`.
    fn commit_logit(&mut self, logit: f32, id: u32) -> Result<u32, EngineError> {
        if logit == f32::NEG_INFINITY {
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
        algorithm::apply_logit_bias(logits, &self.params.logit_bias).map_err(|id| {
            EngineError::InvalidParameter {
                name: "logit_bias",
                message: format!("token {id} is outside the vocabulary of {}", logits.len()),
            }
        })
    }

    /// The draw from logits after biases, mask and penalties (a uniform is drawn only
    /// when the draw is not greedy).
    fn draw(&mut self, logits: &[f32]) -> u32 {
        let uniform = self.next_uniform();
        algorithm::draw(logits, self.params.filters(), uniform, &mut self.candidates)
    }

    /// The uniform a draw picks at: the next of the random sequence, or 0 without taking
    /// one when the draw is greedy.
    fn next_uniform(&mut self) -> f64 {
        if self.params.is_greedy() {
            0.0
        } else {
            self.rng.next_f64()
        }
    }

    /// True when [`Sampler::sample`] can run where the logits are
    /// ([`runit_backend::PrimitiveOps::sample_pick`]) for a row of `width` logits: no
    /// grammar (its mask needs the host) and every bias inside the row (the host path
    /// reports the one that is not). Forced tokens and top-k settings a device does not
    /// keep are the backend's to hand to the host (see `sample_pick`).
    pub fn samples_anywhere(&self, width: usize) -> bool {
        let p = &self.params;
        p.constraint.is_none() && p.logit_bias.iter().all(|&(id, _)| (id as usize) < width)
    }

    /// `(token, occurrences)` of the penalty window, empty when no penalty applies.
    pub fn penalty_counts(&self) -> Vec<(u32, u32)> {
        if self.params.penalties().is_off() {
            return Vec::new();
        }
        algorithm::penalty_counts(self.recent.iter().copied())
    }

    /// The uniform [`Sampler::sample`]'s next draw picks at, taken from the random sequence
    /// (nothing is taken when the draw is greedy): for [`Sampler::row_sampling`], whose
    /// draw must be finished by [`Sampler::commit_sampled`].
    pub fn take_uniform(&mut self) -> f64 {
        self.next_uniform()
    }

    /// The settings of [`Sampler::sample`]'s next draw, at `uniform` ([`Sampler::take_uniform`]),
    /// for [`runit_backend::PrimitiveOps::sample_pick`]; `penalized` is
    /// [`Sampler::penalty_counts`]. Only for a sampler that [`Sampler::samples_anywhere`].
    pub fn row_sampling<'a>(
        &'a self,
        penalized: &'a [(u32, u32)],
        uniform: f64,
    ) -> RowSampling<'a> {
        RowSampling {
            filters: self.params.filters(),
            penalties: self.params.penalties(),
            penalized,
            logit_bias: &self.params.logit_bias,
            uniform,
        }
    }

    /// Finishes a draw that `sample_pick` made under [`Sampler::row_sampling`]'s settings as
    /// [`Sampler::sample`] finishes its own: fails when the token is banned (every token
    /// was), else advances the grammar (none: such samplers follow none) and returns it.
    pub fn commit_sampled(&mut self, sampled: Sampled) -> Result<u32, EngineError> {
        self.commit_logit(sampled.logit, sampled.id)
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
        if self.recent.is_empty() {
            return;
        }
        algorithm::apply_penalties(logits, self.params.penalties(), &self.penalty_counts());
    }
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
