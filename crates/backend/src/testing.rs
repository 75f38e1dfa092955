//! Test support shared by every backend: [`parity`], the suite each backend passes against the
//! CPU reference (per op, per weight type, NMSE bounds), and the seeded inputs it is built on
//! (also used by the device backends' own tests: [`MoeCase`]).

mod attention_setup;
mod moe_setup;
pub mod parity;
mod random;
mod report;

pub use moe_setup::{LoadedMoe, MoeCase, MoeWorkspace};
pub use parity::run_parity;
pub use random::{make_weight, make_weight_as, Rng};
pub use report::{nmse, ParityCase, ParityOutcome, ParityReport};
