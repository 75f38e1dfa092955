//! The one check a generation request passes before it runs: [`generate`](crate::generate)
//! and [`Scheduler::submit`](crate::scheduler::Scheduler::submit) both make it, and a front
//! end (the server) asks it before it starts anything, turning the [`RequestError`] into its
//! own words.

use crate::EngineError;

/// Why a generation request cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    #[error("the prompt has no tokens")]
    EmptyPrompt,
    /// `max_tokens` is 0.
    #[error("must be at least 1")]
    NothingToGenerate,
    #[error("token {id} is outside the vocabulary of {vocab_size}")]
    OutsideVocabulary { id: u32, vocab_size: usize },
    /// The prompt (after the positions already cached) leaves no cell to generate into.
    #[error("the prompt has {tokens} tokens, but the context holds {context} (and one more is needed to generate)")]
    PromptTooLong { tokens: usize, context: usize },
    /// The predicted output (OpenAI's `prediction`) cannot fit the context after the prompt.
    #[error("the predicted output has {tokens} tokens, but the context has room for {room} after the prompt")]
    PredictionTooLong { tokens: usize, room: usize },
}

impl RequestError {
    /// The request field at fault: `prompt`, `max_tokens` or `prediction`.
    pub fn parameter(&self) -> &'static str {
        match self {
            RequestError::NothingToGenerate => "max_tokens",
            RequestError::PredictionTooLong { .. } => "prediction",
            _ => "prompt",
        }
    }
}

impl From<RequestError> for EngineError {
    fn from(error: RequestError) -> EngineError {
        match error {
            RequestError::PromptTooLong { tokens, context } => {
                EngineError::PromptTooLong { tokens, context }
            }
            other => EngineError::InvalidParameter {
                name: other.parameter(),
                message: other.to_string(),
            },
        }
    }
}

/// Checks a generation of up to `max_tokens` tokens after `prompt`, which follows `cached`
/// positions already in a context of `context_size` cells, over a vocabulary of
/// `vocab_size` tokens. In order: the prompt has a token, `max_tokens` is at least 1, every
/// prompt token is in the vocabulary, and the context holds the prompt and one more token.
pub fn check_request(
    prompt: &[u32],
    cached: usize,
    max_tokens: usize,
    context_size: usize,
    vocab_size: usize,
) -> Result<(), RequestError> {
    if prompt.is_empty() {
        return Err(RequestError::EmptyPrompt);
    }
    if max_tokens == 0 {
        return Err(RequestError::NothingToGenerate);
    }
    if let Some(&id) = prompt.iter().find(|&&id| id as usize >= vocab_size) {
        return Err(RequestError::OutsideVocabulary { id, vocab_size });
    }
    let tokens = cached + prompt.len();
    if tokens + 1 > context_size {
        return Err(RequestError::PromptTooLong {
            tokens,
            context: context_size,
        });
    }
    Ok(())
}
