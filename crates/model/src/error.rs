//! The error type of model loading and evaluation.

use runit_backend::BackendError;
use runit_gguf::GgufError;

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A KV cache type this model's heads cannot be stored in.
    #[error(transparent)]
    KvType(#[from] runit_backend::KvTypeError),
    #[error("unsupported architecture `{found}`; supported: {supported}")]
    UnsupportedArchitecture { found: String, supported: String },
    #[error("required metadata key `{key}` is missing")]
    MissingKey { key: String },
    #[error("hyperparameter {key}: {message}")]
    BadHyperparameter { key: String, message: String },
    /// The file asks for something the engine does not implement (a RoPE scaling type,
    /// pooling, an activation, an attention variant).
    #[error("metadata `{key}` = {value} is not supported; supported: {supported}")]
    UnsupportedMetadata {
        key: String,
        value: String,
        supported: String,
    },
    /// The architecture's row asks for something the decoder does not compute yet.
    #[error(
        "the {arch} architecture needs {feature}, which RunIT's decoder does not implement yet"
    )]
    UnimplementedFeature { arch: String, feature: String },
    /// A batch's window block tables and the caches' windows disagree (one without the
    /// other, or another number of spans).
    #[error("the batch's windowed-layer block tables do not match the KV caches' windows")]
    WindowMismatch,
    #[error("tensor `{name}` is missing from the model file")]
    MissingTensor { name: String },
    /// The file holds a tensor the architecture's schema does not list.
    #[error(
        "tensor `{name}` is not one the {arch} architecture uses; a model with it computes \
         something RunIT does not implement"
    )]
    UnexpectedTensor { name: String, arch: String },
    #[error("tensor `{name}`: expected shape {expected:?}, found {found:?}")]
    TensorShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor `{name}`: type {ty} is not supported by the {backend} backend")]
    TensorType {
        name: String,
        ty: runit_quant::GgmlType,
        backend: String,
    },
    #[error(
        "the weights need {needed} bytes but {backend} has {available} bytes free; use a smaller \
         model or quantization, or another device"
    )]
    InsufficientMemory {
        backend: String,
        needed: u64,
        available: u64,
    },
    #[error("batch of {tokens} tokens exceeds the evaluation buffers ({capacity}); split it")]
    BatchTooLarge { tokens: usize, capacity: usize },
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    TokenOutOfRange { id: u32, n_vocab: usize },
    #[error("position {position} is beyond the context of {context} tokens")]
    ContextOverflow { position: usize, context: usize },
}
