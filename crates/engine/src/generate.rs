//! The generation loop: evaluate the prompt, then sample, stream and evaluate one token at a
//! time until a [`StopCondition`] ends it (an end-of-generation token, the token limit or the
//! context end).

use std::time::{Duration, Instant};

use runit_backend::Pick;

use crate::request::check_request;
use crate::sampler::{top_logprobs, Sampler};
use crate::speculative::{Speculation, SpeculationStats};
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
    /// The prompt's evaluation (and a draft model's, when one drafts).
    pub prompt_time: Duration,
    pub decode_time: Duration,
    /// Drafted and accepted tokens, when the generation speculated.
    pub speculation: Option<SpeculationStats>,
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
    on_token: impl FnMut(&GeneratedToken) -> bool,
) -> Result<GenerationOutput, EngineError> {
    generate_with(session, sampler, prompt, params, None, on_token)
}

/// [`generate`], speculating through `speculation` when given: each step drafts, verifies
/// the last token and the drafts in one pass, hands out the kept drafts and the pass's own
/// token, and rolls the cache back past them. The tokens are distributed as without
/// speculation, and are the same tokens when sampling is greedy (see
/// [`crate::speculative`]); the cache ends as it would without speculation.
pub fn generate_with(
    session: &mut Session,
    sampler: &mut Sampler,
    prompt: &[u32],
    params: &GenerateParams,
    mut speculation: Option<&mut Speculation>,
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
    let mut step = Step {
        sampler,
        top_logprobs: params.top_logprobs,
        logits: Vec::new(),
    };
    let started = Instant::now();
    let mut next = match plain_greedy {
        true => Next::Pick(session.eval_greedy(prompt)?),
        false => Next::Logits(session.eval(prompt, false, None)?.to_vec()),
    };
    if let Some(speculation) = speculation.as_deref_mut() {
        let history: Vec<u32> = speculation.context.iter().chain(prompt).copied().collect();
        speculation.drafter.prepare(&history)?;
    }
    let prompt_time = started.elapsed();
    let decode_started = Instant::now();
    let mut tokens = Vec::new();
    // What the drafters see: the tokens cached before the prompt, the prompt, the output.
    let mut history = speculation
        .as_deref()
        .map_or_else(Vec::new, |speculation| speculation.context.clone());
    history.extend_from_slice(prompt);
    let first_generated = history.len();
    // Hands `token` out; `cells`: the cache's positions a one-token step would hold now.
    let mut emit = |token: &GeneratedToken, cells: usize, history: &mut Vec<u32>| {
        history.push(token.id);
        tokens.push(token.id);
        let keep_going = on_token(token);
        stop_condition.after_token(token.id, keep_going, tokens.len(), cells)
    };
    let stop = 'generation: loop {
        let (token, _) = step.choose(next, None)?;
        if let Some(stop) = emit(&token, session.n_past(), &mut history) {
            break stop;
        }
        let mut last = token.id;
        loop {
            let drafts = match speculation.as_deref_mut() {
                // Room: the pass's rows (the last token and the drafts) fit the batch and
                // the context, and no more drafts than tokens still to generate.
                Some(speculation) => {
                    let generated = history.len() - first_generated;
                    let room = (session.batch_capacity() - 1)
                        .min(session.context_size().saturating_sub(session.n_past() + 2))
                        .min(params.max_tokens.saturating_sub(generated + 1));
                    speculation.next_draft(&history, room)?
                }
                None => Vec::new(),
            };
            let pass_started = Instant::now();
            if drafts.is_empty() {
                next = match plain_greedy {
                    true => Next::Pick(session.eval_greedy(&[last])?),
                    false => Next::Logits(session.eval(&[last], false, None)?.to_vec()),
                };
                if let Some(speculation) = speculation.as_deref_mut() {
                    speculation
                        .length
                        .record_pass(1, pass_started.elapsed().as_secs_f64());
                }
                continue 'generation;
            }
            // Verify: row `i` gives the token after `last` and the first `i` drafts.
            let cached = session.n_past();
            let rows: Vec<u32> = std::iter::once(last)
                .chain(drafts.iter().copied())
                .collect();
            let verdicts: Vec<Next> = match plain_greedy {
                true => session
                    .verify_greedy(&rows)?
                    .into_iter()
                    .map(Next::Pick)
                    .collect(),
                false => {
                    let vocab = session.model().config.vocab_size;
                    let logits = session.verify(&rows)?;
                    logits
                        .chunks(vocab)
                        .map(|row| Next::Logits(row.to_vec()))
                        .collect()
                }
            };
            let speculation = speculation
                .as_deref_mut()
                .expect("drafts come from a speculation");
            speculation
                .length
                .record_pass(rows.len(), pass_started.elapsed().as_secs_f64());
            // Kept drafts, then the first token that is not the draft (the last row has
            // no draft, so its token always ends the step).
            for (accepted, row) in verdicts.into_iter().enumerate() {
                let (token, kept) = step.choose(row, drafts.get(accepted).copied())?;
                let cells = cached + 1 + accepted;
                let stop = emit(&token, cells, &mut history);
                if stop.is_some() || !kept {
                    speculation.record_verdict(drafts.len(), accepted + usize::from(kept));
                    session.truncate(cells)?;
                    last = token.id;
                    match stop {
                        Some(stop) => break 'generation stop,
                        None => break,
                    }
                }
            }
        }
    };
    Ok(GenerationOutput {
        tokens,
        stop,
        prompt_tokens: prompt.len(),
        prompt_time,
        decode_time: decode_started.elapsed(),
        speculation: speculation.map(|speculation| speculation.stats),
    })
}

/// Where the next token comes from.
enum Next {
    /// The greedy pick of a pass.
    Pick(Pick),
    /// A pass's logits, to sample from.
    Logits(Vec<f32>),
}

/// Turns a pass's output into a token, through the sequence's sampler.
struct Step<'a> {
    sampler: &'a mut Sampler,
    top_logprobs: usize,
    /// The logits the sampler modifies, kept between steps.
    logits: Vec<f32>,
}

impl Step<'_> {
    /// The token `next` gives and whether it is `draft` (speculative sampling when a draft
    /// is given); the sampler records it for its penalties.
    fn choose(
        &mut self,
        next: Next,
        draft: Option<u32>,
    ) -> Result<(GeneratedToken, bool), EngineError> {
        let token = match next {
            Next::Pick(pick) => GeneratedToken {
                id: pick.id,
                logprob: f64::from(pick.logprob),
                top: Vec::new(),
            },
            Next::Logits(logits) => {
                let top = match self.top_logprobs {
                    0 => Vec::new(),
                    k => top_logprobs(&logits, k),
                };
                self.logits.clear();
                self.logits.extend_from_slice(&logits);
                let id = match draft {
                    Some(draft) => self.sampler.sample_draft(&mut self.logits, draft)?.0,
                    None => self.sampler.sample(&mut self.logits)?,
                };
                // The same value as in `top` when the token is listed there.
                let logprob = top.iter().find(|&&(token, _)| token == id).map_or_else(
                    || crate::sampler::log_probability(&logits, id),
                    |&(_, value)| value,
                );
                GeneratedToken { id, logprob, top }
            }
        };
        self.sampler.accept(token.id);
        let kept = draft == Some(token.id);
        Ok((token, kept))
    }
}
