//! The crate's error type.

/// Everything that can go wrong while building or using a tokenizer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A required GGUF key is absent.
    #[error("tokenizer metadata: missing key `{key}`")]
    MissingKey {
        /// The GGUF key.
        key: String,
    },
    /// A GGUF key exists but its value cannot be used.
    #[error("tokenizer metadata: key `{key}`: {message}")]
    InvalidMetadata {
        /// The GGUF key.
        key: String,
        /// What is wrong, with expected and found values.
        message: String,
    },
    /// `tokenizer.ggml.model` names a tokenizer this crate does not implement.
    #[error("tokenizer metadata: key `tokenizer.ggml.model` = `{found}` is not supported (supported: {supported})")]
    UnsupportedModel {
        /// The value in the file.
        found: String,
        /// Comma-separated list of supported values.
        supported: String,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not know.
    #[error("tokenizer metadata: key `tokenizer.ggml.pre` = `{found}` is not a known pre-tokenizer (known: {known})")]
    UnknownPreTokenizer {
        /// The value in the file.
        found: String,
        /// Comma-separated list of known values.
        known: String,
    },
    /// A token id is not below the vocabulary size.
    #[error("token id {id} is outside the vocabulary (n_vocab = {n_vocab})")]
    TokenOutOfRange {
        /// The offending id.
        id: u32,
        /// Vocabulary size.
        n_vocab: usize,
    },
    /// A pre-tokenizer regular expression failed to compile or to run.
    #[error("pre-tokenizer regex `{pattern}`: {message}")]
    Regex {
        /// The pattern.
        pattern: String,
        /// The regex engine's message.
        message: String,
    },
    /// The GGUF reader failed.
    #[error("tokenizer metadata: {0}")]
    Gguf(#[from] runit_gguf::GgufError),
    /// The HF `tokenizers` crate failed (loading `tokenizer.json` or encoding with it).
    #[error("tokenizer.json `{path}`: {message}")]
    TokenizerJson {
        /// The file.
        path: String,
        /// The library's message.
        message: String,
    },
    /// Rendering a chat template failed.
    #[error("chat template error at line {line}: {message}")]
    Template {
        /// 1-based line of the template where the error was detected (0 when unknown).
        line: usize,
        /// What went wrong, with minijinja's explanation.
        message: String,
    },
    /// Rendering a chat template ran into one of its [`crate::RenderLimits`].
    #[error("{0}")]
    TemplateLimit(crate::TemplateLimit),
    /// A message holds special-token text that the chat template transforms, so it cannot
    /// be kept apart from the template's own special tokens (see
    /// [`crate::ChatTemplate::render_prompt`]).
    #[error(
        "message {message} holds special-token text (`{text}`) that the chat template changes \
         or tests for, so it cannot be kept as plain text"
    )]
    SpecialTextInContent {
        /// The message's position in the conversation.
        message: usize,
        /// The special-token text.
        text: String,
    },
}
