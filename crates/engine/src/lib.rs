//! The engine: sessions with a KV cache, prompt processing in chunks, the decode loop, the
//! sampler, the continuous-batching scheduler with its prefix cache, and perplexity. Each
//! rule has one home here: the settings in [`EngineConfig`], the sampling defaults in
//! [`SamplerParams::DEFAULT`], the stop rules in [`stop`], and the request checks in
//! [`request`].
//!
//! ```no_run
//! # fn demo(model: std::sync::Arc<runit_model::Model>) -> Result<(), runit_engine::EngineError> {
//! use runit_engine::{generate, EngineConfig, GenerateParams, Sampler, SamplerParams, Session};
//! let mut session = Session::new(model, &EngineConfig::default())?;
//! let mut sampler = Sampler::new(SamplerParams::greedy())?;
//! let params = GenerateParams { max_tokens: 16, end_of_generation: vec![2], top_logprobs: 0 };
//! let out = generate(&mut session, &mut sampler, &[1, 504, 314], &params, |_| true)?;
//! println!("{:?}", out.tokens);
//! # Ok(()) }
//! ```

mod config;
pub mod constraint;
mod embed;
mod error;
mod generate;
pub mod kv_blocks;
mod perplexity;
pub mod prefix_cache;
pub mod request;
pub mod sampler;
pub mod scheduler;
mod session;
pub mod speculative;
pub mod stop;
mod window;

pub use config::EngineConfig;
pub use embed::embed;
pub use error::EngineError;
pub use generate::{generate, generate_with, GenerateParams, GeneratedToken, GenerationOutput};
pub use perplexity::{perplexity, PerplexityReport};
pub use request::RequestError;
pub use sampler::{Sampler, SamplerParams};
pub use session::Session;
pub use stop::StopReason;
