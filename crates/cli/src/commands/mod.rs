//! One module per subcommand; each exposes an `Args` struct and a `run` function.

pub mod quantize;
pub mod inspect;
pub mod common;
pub mod dump;
pub mod generate;
pub mod sampling;
pub mod bench;
pub mod perplexity;
pub mod tokenize;
pub mod chat;
