//! The backend contract: the small set of operations a compute device provides to run a
//! decoder, on buffers it owns.
//!
//! The contract has three parts: [`Device`] (buffers, weights, caches, transfers and the
//! hooks of a forward pass), [`PrimitiveOps`] (one step of arithmetic each) and [`FusedOps`]
//! (sequences of primitives a backend may run in one kernel; the default bodies run the
//! primitives). [`Backend`] is all three. Model and engine code hold an `Arc<dyn Backend>`
//! and never name a concrete backend. An op with more than four operands takes one argument
//! struct naming them ([`RopeKvWrite`], [`AttentionOutput`], [`GatedFfnRun`], ...). Every
//! op writes into a preallocated buffer, so a GPU backend can capture a whole decode step
//! once and replay it. Every backend must pass [`testing::parity`] against the CPU reference
//! before it is used.
//!
//! Conventions: activations are f32, row-major `[tokens, width]`. Weight shapes are in ggml
//! order (`shape[0]` is the row length, `shape[1]` the number of rows, `shape[2]` the expert
//! index for MoE tensors). A matmul computes `out[t][o] = sum_i W[o][i] * x[t][i]`.

mod args;
mod buffer;
pub mod clock;
mod device;
mod error;
mod fused;
pub mod gelu;
pub mod hadamard;
pub mod moe;
mod ops;
pub mod pick;
mod primitives;
pub mod profile;
pub mod sample;
pub mod testing;
pub mod turbo;
pub mod unfused;

pub use args::{
    AddRmsNorm, Attention, AttentionOutput, BufferCopy, GatedFfnRun, KvWrite, MoeFfnRun,
    NormFfnResidual, NormInput, RopeKvWrite, ScatterAddRows,
};
pub use buffer::{
    Buffer, GgmlLayout, HostMemory, KvCache, KvRole, KvType, KvTypeError, KvTypes, Weight,
    WeightRole, WeightSource,
};
pub use device::Device;
pub use error::{at_least, BackendError, OpResult};
pub use fused::FusedOps;
pub use ops::{
    Activation, AttentionParams, GatedFfn, MoeBuffers, MoeFfn, Projection, QkNorms, RmsNorm,
    RopeCorrections, RopeParams, RopeStyle, SequenceSpan, StepInputs, StepKey, Yarn,
};
pub use pick::Pick;
pub use primitives::{sample_pick_on_host, PrimitiveOps};
pub use sample::{RowSampling, Sampled};

/// Operations whose support may depend on the weight type (see [`Device::supports`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// Row lookup from an embedding table.
    Embedding,
    /// Weight × activations.
    MatMul,
}

/// A compute device with the whole contract: [`Device`] (memory, transfers, step hooks),
/// [`PrimitiveOps`] and [`FusedOps`], shareable between threads. Implemented for every type
/// that implements the three.
pub trait Backend: FusedOps + Send + Sync {}

impl<T: FusedOps + Send + Sync + ?Sized> Backend for T {}
