//! Exact numerics ([`crate::CudaBackend::with_exact_numerics`]): kernels that compute what the
//! CPU backend computes, float operation for float operation, so that results equal it bit
//! for bit (and, through it, llama.cpp's CPU build). The kernels (`kernels/exact_*.cu`,
//! compiled with `--fmad=false`) are twins of the CPU's scalar code, one thread per output;
//! this module picks, per call, the same arithmetic order the CPU backend would pick.
//! TurboQuant caches keep `ops/turbo.rs`'s kernels, which repeat the CPU's scalar twins
//! already; caches of ggml's blocks (q8_0, q4_0) are refused.

pub(crate) mod matmul;
pub(crate) mod ops;
