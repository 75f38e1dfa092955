//! The generation loop: evaluate the prompt, then sample, stream and evaluate one token at a
//! time until a [`StopCondition`] ends it (an end-of-generation token, the token limit or the
//! context end).

use std::time::{Duration, Instant};

use crate::request::check_request;
use crate::sampler::{top_logprobs, Sampler};
use crate::stop::{StopCondition, StopReason};
use crate::{EngineError, Session};

/// One generated token, as handed to the callback.
#[derive(Debug, Clone)]
pub struct GeneratedToken {
    pub id: u32,
    /// Log-probability of `id` before sampling (plain softmax of the logits).
    pub logprob: f64,
    /// The most likely tokens and their log-probabilities, when requested.
    pub top: Vec<(u32, f64)>,
}

/// What a generation did, with timings.
#[derive(Debug, Clone)]
pub struct GenerationOutput {
    pub tokens: Vec<u32>,
    pub stop: StopReason,
    pub prompt_tokens: usize,
    pub prompt_time: Duration,
    pub decode_time: Duration,
}

impl GenerationOutput {
    /// Prompt tokens per second.
    pub fn prompt_tokens_per_second(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_time.as_secs_f64().max(1e-9)
    }

    /// Generated tokens per second (the first token is produced by the prompt pass, so
    /// `n - 1` decode steps are timed).
    pub fn decode_tokens_per_second(&self) -> f64 {
        let steps = self.tokens.len().saturating_sub(1);
        steps as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// Generation settings besides sampling.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    /// Tokens that end generation (EOS, EOT, `<|im_end|>` ...).
    pub end_of_generation: Vec<u32>,
    /// How many top log-probabilities to report per token (0 = none).
    pub top_logprobs: usize,
}

impl GenerateParams {
    /// Checks a generation of `prompt` after what `session` holds (see
    /// [`check_request`](crate::request::check_request)); [`generate`] starts with it.
    pub fn validate(&self, session: &Session, prompt: &[u32]) -> Result<(), EngineError> {
        check_request(
            prompt,
            session.n_past(),
            self.max_tokens,
            session.context_size(),
            session.model().config.vocab_size,
        )?;
        Ok(())
    }

    /// The rules that end the generation in a context of `context_size` cells.
    pub fn stop_condition(&self, context_size: usize) -> StopCondition<'_> {
        StopCondition {
            end_of_generation: &self.end_of_generation,
            max_tokens: self.max_tokens,
            context_size,
        }
    }
}

/// Evaluates `prompt` in `session` (which must be empty or hold its prefix), then generates.
/// `on_token` receives each token as it is produced and returns false to stop early.
pub fn generate(
    session: &mut Session,
    sampler: &mut Sampler,
    prompt: &[u32],
    params: &GenerateParams,
    mut on_token: impl FnMut(&GeneratedToken) -> bool,
) -> Result<GenerationOutput, EngineError> {
    params.validate(session, prompt)?;
    let stop_condition = params.stop_condition(session.context_size());
    for &t in prompt {
        sampler.accept(t);
    }
    // Plain greedy decoding needs only each step's largest logit: picked where the logits
    // are (on a GPU, no vocabulary-sized download per token).
    let plain_greedy = params.top_logprobs == 0 && sampler.is_plain_argmax();
    let started = Instant::now();
    let mut logits = Vec::new();
    let mut pick = None;
    if plain_greedy {
        pick = Some(session.eval_greedy(prompt)?);
    } else {
        logits = session.eval(prompt, false, None)?.to_vec();
    }
    let prompt_time = started.elapsed();
    let decode_started = Instant::now();
    let mut tokens = Vec::new();
    let stop = loop {
        let (id, logprob, top) = match pick {
            Some(pick) => (pick.id, f64::from(pick.logprob), Vec::new()),
            None => {
                let top = if params.top_logprobs > 0 {
                    top_logprobs(&logits, params.top_logprobs)
                } else {
                    Vec::new()
                };
                let logprob_source = logits.clone();
                let id = sampler.sample(&mut logits)?;
                // The same value as in `top` when the token is listed there.
                let logprob = top.iter().find(|&&(token, _)| token == id).map_or_else(
                    || crate::sampler::log_probability(&logprob_source, id),
                    |&(_, value)| value,
                );
                (id, logprob, top)
            }
        };
        sampler.accept(id);
        tokens.push(id);
        let keep_going = on_token(&GeneratedToken { id, logprob, top });
        if let Some(stop) =
            stop_condition.after_token(id, keep_going, tokens.len(), session.n_past())
        {
            break stop;
        }
        if plain_greedy {
            pick = Some(session.eval_greedy(&[id])?);
        } else {
            logits.clear();
            logits.extend_from_slice(session.eval(&[id], false, None)?);
        }
    };
    Ok(GenerationOutput {
        tokens,
        stop,
        prompt_tokens: prompt.len(),
        prompt_time,
        decode_time: decode_started.elapsed(),
    })
}
