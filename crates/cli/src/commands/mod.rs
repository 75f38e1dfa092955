//! One module per subcommand; each exposes an `Args` struct and a `run` function.

pub mod bench;
pub mod chat;
pub mod common;
pub mod devices;
pub mod dump;
pub mod embed;
pub mod generate;
pub mod inspect;
pub mod models;
pub mod perplexity;
pub mod quantize;
pub mod sampling;
pub mod serve;
pub mod speculative;
pub mod synth;
pub mod tokenize;
