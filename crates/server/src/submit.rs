//! Submitting a request's sequences to the scheduler, shared by every generating endpoint:
//! each prompt checked by the engine's [`check_request`] before anything is submitted (a
//! refusal names the field at fault), the token limit fitted to the context, and `n`
//! sequences per prompt queued together, each with its [`Choice`] reading its events.

use std::sync::Arc;

use futures::stream::BoxStream;
use runit_engine::request::{check_request, RequestError};
use runit_engine::scheduler::{DraftRequest, EventSink, Request as EngineRequest};
use runit_engine::speculative::DraftParams;

use crate::choice::{Choice, Delta};
use crate::error::ApiError;
use crate::log::RequestLog;
use crate::request::{Options, TokenLimit, MAX_SEQUENCES};
use crate::response::{Endpoint, Header};
use crate::tools;
use crate::{AppState, PREDICTION_NGRAM};

/// The answer to a request that the engine's check refuses: `which` prompt (`the prompt`,
/// `prompt 1`), given in the field `prompt_param`.
fn refusal(error: RequestError, which: &str, prompt_param: &str, options: &Options) -> ApiError {
    match error {
        RequestError::EmptyPrompt => {
            ApiError::invalid(prompt_param, format!("{which} has no tokens"))
        }
        RequestError::NothingToGenerate => {
            let param = options.max_tokens.map_or("max_tokens", |limit| limit.param);
            TokenLimit::too_few(param, 0)
        }
        RequestError::OutsideVocabulary { id, vocab_size } => ApiError::invalid(
            prompt_param,
            format!("token id {id} is outside the vocabulary of {vocab_size}"),
        ),
        RequestError::PromptTooLong { tokens, context } => ApiError::invalid(
            prompt_param,
            format!(
                "{which} has {tokens} tokens, but the context holds {context} (and one more is \
                 needed to generate)"
            ),
        )
        .with_code("context_length_exceeded"),
        other => ApiError::invalid(other.parameter(), other.to_string()),
    }
}

/// A request's submitted sequences: what every answer repeats, each choice's deltas, and
/// the request's log line.
pub(crate) struct Submitted {
    pub header: Header,
    pub streams: Vec<BoxStream<'static, Delta>>,
    pub log: RequestLog,
}

/// Checks the request (every prompt through the engine's [`check_request`], before anything
/// is submitted) and submits `n` sequences per prompt (choice `prompt_index * n + i`).
pub(crate) fn submit(
    state: &Arc<AppState>,
    endpoint: Endpoint,
    id: &str,
    prompts: &[Vec<u32>],
    prompt_param: &str,
    options: &Options,
) -> Result<Submitted, ApiError> {
    let context = state.scheduler.context_size();
    let sequences = prompts.len() * options.n;
    let parallel = state.scheduler.max_sequences();
    if sequences > MAX_SEQUENCES.min(parallel) {
        return Err(ApiError::invalid(
            "n",
            format!(
                "{} prompts times n = {} asks for {sequences} sequences; at most {} are \
                 allowed (the server runs {parallel} at once)",
                prompts.len(),
                options.n,
                MAX_SEQUENCES.min(parallel)
            ),
        ));
    }
    let requested = options
        .max_tokens
        .map_or(state.config.default_max_tokens, |limit| limit.count);
    for (index, prompt) in prompts.iter().enumerate() {
        let which = if prompts.len() > 1 {
            format!("prompt {index}")
        } else {
            "the prompt".into()
        };
        check_request(prompt, 0, requested, context, state.tokenizer.n_vocab())
            .map_err(|error| refusal(error, &which, prompt_param, options))?;
    }
    // The explicit limit must fit next to the longest prompt; the default is cut to fit.
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let room = context - longest;
    let max_tokens = match options.max_tokens {
        Some(limit) if limit.count > room => {
            return Err(ApiError::invalid(
                limit.param,
                format!(
                    "the prompt ({longest} tokens) plus {} ({}) exceeds the context of \
                     {context} tokens",
                    limit.param, limit.count
                ),
            )
            .with_code("context_length_exceeded"))
        }
        Some(limit) => limit.count,
        None => state.config.default_max_tokens.min(room),
    };
    if let Some(caller) = &options.caller {
        tracing::info!(caller = %caller, "caller");
    }
    let prompt_tokens = prompts.iter().map(Vec::len).sum();
    let draft = draft_request(state, options.prediction.as_deref());
    let log = RequestLog::new(prompt_tokens, sequences);
    let mut streams = Vec::with_capacity(sequences);
    let mut submissions = Vec::with_capacity(sequences);
    for (prompt_index, prompt) in prompts.iter().enumerate() {
        for i in 0..options.n {
            let (choice, sink) = Choice::new(
                prompt_index * options.n + i,
                Arc::clone(&state.tokenizer),
                options.stop.clone(),
                options.logprobs,
                options
                    .echo_texts
                    .get(prompt_index)
                    .cloned()
                    .unwrap_or_default(),
            );
            let choice = match &options.think {
                Some(filter) => choice.with_reasoning(filter.clone()),
                None => choice,
            };
            let choice = match &options.calls {
                Some(filter) => {
                    choice.with_calls(filter.clone(), tools::call_markers(&state.tokenizer))
                }
                None => choice,
            };
            // The i-th choice of every prompt draws as the i-th choice of a lone request.
            let mut sampling = options.sampling.clone();
            sampling.seed = sampling.seed.wrapping_add(i as u64);
            let engine_request = EngineRequest {
                prompt: prompt.clone(),
                sampling,
                max_tokens,
                end_of_generation: if options.ignore_eos {
                    Vec::new()
                } else {
                    state.tokenizer.eog_ids()
                },
                top_logprobs: options.top_logprobs,
                logprobs: options.logprobs,
                draft: draft.clone(),
            };
            submissions.push((engine_request, Box::new(sink) as Box<dyn EventSink>));
            streams.push(choice.into_stream());
        }
    }
    // All the sequences are queued or none is.
    state.scheduler.submit_all(submissions)?;
    let header = Header {
        id: id.to_string(),
        created: crate::unix_time(),
        model: state.config.model_name.clone(),
        endpoint,
        prompt_tokens,
        logprobs: options.logprobs,
    };
    tracing::debug!(
        prompt_tokens,
        max_tokens,
        prompts = prompts.len(),
        n = options.n,
        "submitted"
    );
    Ok(Submitted {
        header,
        streams,
        log,
    })
}

/// The speculation of a request's sequences: the server's draft model or prompt lookup,
/// a request's `prediction` drafted from by prompt lookup when it gives one; a
/// prediction alone speculates too.
fn draft_request(state: &AppState, prediction: Option<&str>) -> Option<DraftRequest> {
    let prediction = prediction.map(|text| state.tokenizer.encode(text, false, false));
    let (ngram, params) = match (state.config.speculation, &prediction) {
        (Some(speculation), _) => speculation,
        (None, Some(_)) => (PREDICTION_NGRAM, DraftParams::DEFAULT),
        (None, None) => return None,
    };
    Some(DraftRequest {
        ngram,
        params,
        prediction: prediction.unwrap_or_default(),
        model: state.config.draft_model.clone(),
    })
}
