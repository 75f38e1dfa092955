//! Tokenizers for RunIT, built from GGUF metadata alone and token-exact with llama.cpp.
//!
//! * `tokenizer.ggml.model = gpt2`: byte-level BPE with the pre-tokenizer named by
//!   `tokenizer.ggml.pre` ([`pretokenize`]); `llama`: SentencePiece-style BPE with scores and
//!   `<0xXX>` byte fallback.
//! * Special tokens (control, user-defined) in the input, BOS/EOS as the file asks.
//! * [`StreamDecoder`] for streaming valid UTF-8 out of generated ids; [`ChatTemplate`] renders
//!   the model's Jinja chat template.
//! * A `tokenizer.json` can replace the GGUF encoder ([`Tokenizer::from_tokenizer_json`]).
//!
//! ```no_run
//! use runit_tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, StreamOptions, Tokenizer};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = runit_gguf::GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let tokenizer = Tokenizer::from_gguf(&file)?;
//! let prompt = ChatTemplate::from_gguf(&file)?.render(&[ChatMessage::user("Hi!")], true)?;
//! let ids = tokenizer.encode(&prompt, true, true);
//! let mut stream = StreamDecoder::new(&tokenizer, StreamOptions::default());
//! for id in ids {
//!     print!("{}", stream.push(id)?);
//! }
//! # Ok(()) }
//! ```

mod bpe;
mod chat;
mod error;
mod gguf;
mod hf;
pub mod pretokenize;
mod special;
mod spm;
mod stream;
mod tokenizer;
pub mod unicode;
mod vocab;

pub use chat::{
    builtin_template, ChatMessage, ChatTemplate, RenderLimits, RenderedPrompt, TemplateInputs,
    TemplateLimit, BUILTIN_TEMPLATES, CHATML_TEMPLATE,
};
pub use error::TokenizerError;
pub use stream::{StreamDecoder, StreamOptions};
pub use tokenizer::{DecodeOptions, Tokenizer};
pub use vocab::{ModelKind, TokenType, Vocabulary, VocabularySpec};
