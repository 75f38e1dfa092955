//! The engine: sessions with a KV cache, prompt processing in chunks, the decode loop, the
//! sampler and perplexity.
//!
//! ```no_run
//! # fn demo(model: std::sync::Arc<runit_model::Model>) -> Result<(), runit_engine::EngineError> {
//! use runit_engine::{generate, GenerateParams, Sampler, SamplerParams, Session, SessionConfig};
//! let mut session = Session::new(model, &SessionConfig::default())?;
//! let mut sampler = Sampler::new(SamplerParams::default())?;
//! let params = GenerateParams { max_tokens: 16, end_of_generation: vec![2], top_logprobs: 0 };
//! let out = generate(&mut session, &mut sampler, &[1, 504, 314], &params, |_| true)?;
//! println!("{:?}", out.tokens);
//! # Ok(()) }
//! ```

mod error;
mod generate;
pub mod kv_blocks;
mod perplexity;
pub mod sampler;
pub mod scheduler;
mod session;

pub use error::EngineError;
pub use generate::{generate, GenerateParams, GeneratedToken, GenerationOutput, StopReason};
pub use perplexity::{perplexity, PerplexityReport};
pub use sampler::{Sampler, SamplerParams};
pub use session::{Session, SessionConfig};
