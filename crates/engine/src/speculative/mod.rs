//! Speculative decoding: a cheap [`Drafter`] proposes the next tokens, the target model
//! evaluates the last accepted token and every draft in one pass (`Session::verify`, whose
//! rows get the numbers one-token steps would give them), the [`Sampler`](crate::Sampler)
//! keeps drafts by speculative sampling (`Sampler::sample_draft`: greedy keeps the argmax,
//! so greedy output is token for token that of plain decoding), and the cache rolls back
//! the rejected drafts' cells (`Session::truncate`). [`DraftLength`] picks each step's
//! draft length from the measured acceptance and pass times, so a poor drafter costs little.

mod adapt;
mod draft_model;
mod ngram;

pub use adapt::DraftLength;
pub use draft_model::{check_vocabularies, DraftModel, DraftModelPool, VocabularyMismatch};
pub use ngram::PromptLookup;

use crate::EngineError;

/// Proposes tokens to follow a sequence. A drafter proposes its best guess for sure (a
/// point mass), which is what `Sampler::sample_draft`'s acceptance rule assumes.
pub trait Drafter: Send {
    /// Up to `max` tokens likely to follow `history` (the prompt and every token generated
    /// so far); fewer, or none, when it has no good guess.
    fn draft(&mut self, history: &[u32], max: usize) -> Result<Vec<u32>, EngineError>;

    /// Reads `history` (the prompt) before the first draft, while the target evaluates
    /// it too: a draft model evaluates it here, so that drafting calls only catch up.
    fn prepare(&mut self, history: &[u32]) -> Result<(), EngineError> {
        let _ = history;
        Ok(())
    }
}

/// Settings of speculative decoding shared by every drafter (llama.cpp's flag names).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftParams {
    /// Most tokens drafted per step (`--draft-max`, at least 1).
    pub max: usize,
    /// Fewest tokens worth verifying: a shorter draft is dropped (`--draft-min`).
    pub min: usize,
    /// A draft model stops drafting at a token it gives less than this probability
    /// (`--draft-p-min`; 0: only the adaptive length decides).
    pub p_min: f32,
}

impl DraftParams {
    /// llama.cpp's defaults for the length (up to 16 tokens, no minimum), but no confidence
    /// cut-off: llama.cpp stops a draft below probability 0.75, which stopped every draft of
    /// SmolLM2-135M's Q4_1 quantization drafting for its F16 requantization on all eight
    /// golden chat prompts (its top token is usually below 0.75 and yet the target's
    /// 89% of the time), while the adaptive length ([`DraftLength`]) already shortens the
    /// drafts of a drafter that is often wrong. `--draft-p-min 0.75` restores llama.cpp's.
    pub const DEFAULT: DraftParams = DraftParams {
        max: 16,
        min: 0,
        p_min: 0.0,
    };

    /// Refuses `max` 0 (speculation without drafts), `min` above `max` and a `p_min`
    /// outside `[0, 1]`.
    pub fn validate(&self) -> Result<(), EngineError> {
        let invalid = |name, message: String| Err(EngineError::InvalidParameter { name, message });
        if self.max == 0 {
            return invalid(
                "draft_max",
                "0 drafts nothing; leave speculation off instead".into(),
            );
        }
        if self.min > self.max {
            return invalid(
                "draft_min",
                format!("{} is above draft_max {}", self.min, self.max),
            );
        }
        if !(0.0..=1.0).contains(&self.p_min) {
            return invalid("draft_p_min", format!("{} is not in [0, 1]", self.p_min));
        }
        Ok(())
    }
}

impl Default for DraftParams {
    fn default() -> Self {
        DraftParams::DEFAULT
    }
}

/// Counts of a speculative run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpeculationStats {
    /// Verification passes (steps that checked at least one draft).
    pub verifications: usize,
    /// Tokens drafted and verified.
    pub drafted: usize,
    /// Drafted tokens kept (OpenAI's `accepted_prediction_tokens`).
    pub accepted: usize,
}

impl SpeculationStats {
    /// Drafted tokens rejected (OpenAI's `rejected_prediction_tokens`).
    pub fn rejected(&self) -> usize {
        self.drafted - self.accepted
    }

    /// Share of drafted tokens kept (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }
}

/// A drafter with its settings and adaptive length, handed to
/// [`generate_with`](crate::generate_with).
pub struct Speculation {
    pub drafter: Box<dyn Drafter>,
    pub params: DraftParams,
    pub length: DraftLength,
    pub stats: SpeculationStats,
    /// Tokens the session holds before the next generation's prompt (a chat's earlier
    /// turns), which the drafter sees before it.
    pub context: Vec<u32>,
}

impl Speculation {
    /// Speculation through `drafter`; fails on invalid `params`.
    pub fn new(drafter: Box<dyn Drafter>, params: DraftParams) -> Result<Speculation, EngineError> {
        params.validate()?;
        Ok(Speculation {
            drafter,
            length: DraftLength::new(params.min, params.max),
            params,
            stats: SpeculationStats::default(),
            context: Vec::new(),
        })
    }

    /// The draft for the next step after `history`, at most `room` tokens: empty when the
    /// adaptive length says a plain step pays more, or the drafter's draft is shorter than
    /// `params.min`.
    pub fn next_draft(&mut self, history: &[u32], room: usize) -> Result<Vec<u32>, EngineError> {
        let length = self.length.choose(room);
        if length == 0 {
            return Ok(Vec::new());
        }
        let started = std::time::Instant::now();
        let mut draft = self.drafter.draft(history, length)?;
        draft.truncate(length);
        self.length
            .record_draft(draft.len(), started.elapsed().as_secs_f64());
        if draft.len() < self.params.min.max(1) {
            draft.clear();
        }
        Ok(draft)
    }

    /// Records a verification of `drafted` tokens of which the first `accepted` were kept.
    pub fn record_verdict(&mut self, drafted: usize, accepted: usize) {
        self.stats.verifications += 1;
        self.stats.drafted += drafted;
        self.stats.accepted += accepted;
        self.length.record_verdict(drafted, accepted);
    }
}
