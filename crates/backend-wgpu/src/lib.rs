//! A portable GPU backend: WGSL kernels run through `wgpu` (Vulkan on Linux and Windows,
//! Metal on Apple, DX12), on weights kept packed as their GGUF bytes and dequantized in the
//! kernels.
//!
//! ```no_run
//! use runit_backend::Device;
//! let backend = runit_backend_wgpu::WgpuBackend::new(0)?;
//! println!("{}", backend.name());
//! # Ok::<(), runit_backend_wgpu::WgpuError>(())
//! ```
//!
//! What runs here: embedding and matmul of F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS weights (one workgroup per output row and token, a shared-memory sum;
//! a prompt's rows loop the matrix-vector kernel), RMS norm, RoPE (both pairings, the angles
//! computed on the host as the CPU computes them), the element-wise ops, f16 and f32 KV
//! caches with causal grouped-query paged attention, and the row ops. Fused ops run their
//! default (primitive) bodies. Other weight types answer `false` to
//! [`runit_backend::Device::supports`] and their ops return `BackendError::Unsupported`.
//!
//! Weights are split by rows at the adapter's binding limit (128 MiB on lavapipe); kernels
//! read each value byte by byte (`value_TYPE` in `dequant.wgsl`); matmul sums in f32 with a
//! fixed shared-memory tree (no subgroup operations yet). Its activations are first rounded
//! as the CPU's dot products see them (`quantize_x.wgsl`: 8-bit blocks of 32 for the legacy
//! types and IQ4_NL, f16 for F16; the K-quants' Q8_K rounding is not repeated). KV caches are
//! f32, f16, and Q8_0/Q4_0 in a word layout of this backend's own, with llama.cpp's Hadamard
//! rotation run on the device (TurboQuant caches are `BackendError::UnsupportedKv`);
//! attention is one workgroup per (query row, head) with an online softmax over tiles of 64
//! keys.

mod backend;
mod device;
mod kernels;
mod ops;

pub use backend::{adapters, AdapterSummary, WgpuBackend, WgpuError};

/// Every WGSL kernel source as the backend compiles it (name, source), for validation and
/// translation tests.
pub fn kernel_sources() -> Vec<(String, String)> {
    kernels::all()
        .into_iter()
        .map(|kernel| (kernel.name, kernel.source))
        .collect()
}
