//! The error type of the engine.

use runit_model::ModelError;

/// Why a generation or evaluation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Backend(#[from] runit_backend::BackendError),
    #[error("invalid {name}: {message}")]
    InvalidParameter { name: &'static str, message: String },
    #[error("the prompt has {tokens} tokens, but the context holds {context} (and one more is needed to generate); use a larger --ctx-size or a shorter prompt")]
    PromptTooLong { tokens: usize, context: usize },
    #[error(transparent)]
    Constraint(#[from] crate::constraint::ConstraintError),
    #[error("the context of {context} tokens is full ({needed} needed)")]
    ContextFull { needed: usize, context: usize },
}
