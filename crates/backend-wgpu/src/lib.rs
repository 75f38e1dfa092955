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
//! Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS weights, RMS norm, RoPE (both pairings,
//! the angles computed on the host as the CPU computes them), the element-wise ops, f16 and
//! f32 KV caches with causal grouped-query paged attention, and the row ops. The fused ops
//! that save dispatches have kernels (`src/fused.rs`: add + RMS norm with the rounding of
//! its results for the matmul that read them the last step, RoPE of queries and keys with
//! the cache write, the one-chunk attention with the rounding of its output for the output
//! projection, the gated activation with the rounding of down's activations, and at decode
//! the Q/K/V and gate/up products each in one dispatch of `kernels::matvec_parts`, with
//! Qwen2's three Q/K/V biases added in its epilogue, off by default on CPU adapters), equal
//! to their primitive sequences bit for bit; the others run
//! their default bodies. Other weight types answer
//! `false` to [`runit_backend::Device::supports`] and their ops return
//! `BackendError::Unsupported`.
//!
//! Matmul has three kernels (`src/matmul.rs` picks one per call):
//! - `matvec.wgsl` for fewer than 4 tokens (decode) on F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0,
//!   Q4_K, Q5_K and Q6_K rows of a multiple of 32 values: 4 output rows a workgroup of 128
//!   invocations, every invocation on all 4 rows. Rows are cut into pieces of 4 to 32 values
//!   (`matvec_dot.wgsl`: a quarter of a Q8_0 block, 16 bytes of a Q4_K block, ...), piece i
//!   to invocation i % 128, so that a subgroup's loads read neighbouring words; an invocation
//!   reads a piece's activations once for the 4 rows and has the 4 rows' weight loads in
//!   flight together. Q4_K, Q5_K and the float types are read as 16-byte vectors, the
//!   2-byte-aligned blocks as words (Q6_K's 210-byte blocks too: staging a workgroup's rows
//!   through workgroup memory first, `matvec_staged.wgsl` under `RUNIT_WGPU_Q6K_ALIGNED=1`,
//!   measured 23% slower on an H100's Vulkan driver). Q4_0, Q4_1, Q5_0,
//!   Q8_0, Q4_K, Q5_K and Q6_K read their activations as int8 with a scale a block
//!   (`matvec_int8.wgsl`: the CPU's Q8_0 or Q8_K rounding kept as integers, groups of 256
//!   values in 288 bytes) and multiply four bytes an instruction (`dot4I8Packed`), the
//!   scales applied once a piece
//!   (`RUNIT_WGPU_MATVEC_INT8=0`: f32 activations, `matvec_dot.wgsl`; `=plain`: the dot
//!   product in plain arithmetic). The invocations' sums are reduced with `subgroupAdd`
//!   where the adapter grants subgroups of at most 32 invocations (`reduce_subgroup.wgsl`),
//!   else by a shared-memory tree (`reduce_shared.wgsl`); the choice is made when the
//!   backend opens ([`WgpuBackend::without_subgroups`] forces the second, and the parity
//!   tests run both).
//! - `matmat.wgsl` for 4 tokens or more (prompts), every type: tiles of 64 rows x 32 tokens,
//!   the weight tile dequantized once into shared memory per step of 32 values (by
//!   `value_TYPE` in `dequant.wgsl`, byte by byte) and used by all the tile's tokens.
//! - `matmul.wgsl`, the generic twin: one workgroup per output row and token, values read one
//!   by one through `value_TYPE`, a shared-memory sum; it runs for the other types at decode
//!   and for rows not a multiple of 32, and for every case under
//!   [`WgpuBackend::with_generic_matmul`] (`examples/matmul_speed.rs` times the kernels
//!   against it).
//!
//! Activations are first rounded as the CPU's dot products see them (`quantize_x.wgsl`:
//! 8-bit blocks of 32 for the legacy types and IQ4_NL, f16 for F16, bf16 for BF16, Q8_K
//! blocks of 256 for the K-quants and IQ4_XS; a workgroup rounds 256 consecutive values,
//! reducing each block's largest magnitude in workgroup memory, `quantize_coop.wgsl`; for the
//! int8 matrix-vector kernels the same roundings kept as integers and scales); sums
//! are f32 in each kernel's own order, within the parity suite's NMSE bounds.
//!
//! Exact matmul (`RUNIT_WGPU_EXACT=1`, [`WgpuBackend::with_exact_matmul`]; the counterpart
//! of the CUDA backend's `RUNIT_CUDA_EXACT`): every type then runs a kernel that repeats the
//! CPU's arithmetic bit for bit, one invocation per output, on activations kept as ggml's
//! blocks (`matmul_q0.wgsl`: the 32-value types in a plain buffer, `vec_dot` and tinyBLAS
//! orders; `matmul_qk.wgsl`: the K-quants and IQ4_XS; `matmul_repack.wgsl`: the types
//! ggml-cpu repacks, in its gemv and gemm orders; `matmul_float.wgsl`: F32, F16, BF16), so
//! that greedy ids and log-probabilities equal llama.cpp's goldens. The other kernels
//! repeat the CPU's roundings always: RMSNorm's f64 sum (a float-float), SiLU's polynomial
//! exp, RoPE's fused products, the one-chunk attention; `precise.wgsl` holds the exact
//! fused multiply-add they need (WGSL's `fma` may round the product first, as lavapipe's
//! does) and hides two-sums from the shader compiler's algebra.
//!
//! Work is recorded, not submitted, op by op (`src/batch.rs`): the dispatches of a forward
//! pass go into one command encoder and one open compute pass, each taking its parameters
//! (a uniform slot) and its small host tables (token ids, cache cells, RoPE angles, query
//! lists) from one ring buffer written once per submit; the batch is
//! submitted at a read-back, a wait, an upload, or every 512 commands, and on a GPU adapter
//! early, in batches growing from 16 commands, so that the device runs a step's first layers
//! while the host records the rest (`RUNIT_WGPU_EARLY_SUBMIT`). Bind groups are kept
//! by what they bind (pipeline, parameter slot, buffer ranges; `src/bind_groups.rs`) and
//! reused by later batches: a decode step repeats the last one's dispatches, parameter slots
//! and table places, so its bind groups are looked up, not made. `RUNIT_WGPU_COUNTS=1`
//! prints the dispatches and submits a backend made when it is dropped
//! ([`WgpuBackend::counts`]), and per decode step its dispatches, submits, wall time, the
//! recording thread's CPU time and of it the time inside dispatches and submits, and the
//! bind groups made ([`WgpuBackend::step_costs`]).
//!
//! Weights are split by rows at the adapter's binding limit (128 MiB on lavapipe), each chunk
//! with a spare word at its end (`word_at` in `bytes.wgsl` reads the word after the one it
//! needs). KV caches are f32, f16, and Q8_0/Q4_0 in a word layout of this backend's own,
//! with llama.cpp's Hadamard rotation run on the device (TurboQuant caches are
//! `BackendError::UnsupportedKv`); attention is one workgroup per (query row, head) with an
//! online softmax over tiles of 64 keys for spans of 64 rows and more (ggml's tiled path),
//! and ggml's one-chunk path for shorter spans (`attention_chunk.wgsl`: the query rounded to
//! the key cache's type, keys one by one, an f16 accumulator for an f16 value cache) under
//! exact matmul; otherwise shorter spans (decode) take the split path: each (query, head)'s
//! keys cut into chunks of whole tiles of 32, a workgroup a chunk with an f32 online softmax
//! (`attention_split.wgsl`, about 1,024 workgroups a dispatch where the keys allow), then a
//! workgroup a (query, head) merging the chunks and rounding the output for the output
//! projection where the one-chunk kernel would, or a workgroup a group of heads where the
//! rounding's blocks span whole heads (Q8_K blocks of 256 values from heads of 128:
//! `attention_merge.wgsl`).
//!
//! RMS norms hold a row of up to 8,192 values in registers (`normalize_held` in
//! `rms_norm.wgsl`: every load of the row in flight at once), one workgroup a row of 1,024
//! invocations where the adapter grants them (a vec4 an invocation for rows of up to 4,096
//! values; 256 for rows of at most 1,024 values, on CPU adapters and under
//! `RUNIT_WGPU_NORM_THREADS=256`: `WgpuBackend::norm_kernel`); wider rows and rows
//! of a width not a multiple of 4 loop over the row (`RUNIT_WGPU_HELD_NORM=0`: every width).

mod attention;
mod backend;
mod batch;
mod bind_groups;
mod clock;
mod device;
mod fused;
mod kernels;
mod matmul;
mod ops;
mod profile;
mod rope;
mod rounding;

pub use backend::{adapters, AdapterSummary, DispatchCounts, WgpuBackend, WgpuError};
pub use clock::{thread_cpu_ns, StepCosts};
pub use kernels::{Dot4, MATVEC_INT8_TYPES, MATVEC_TYPES};

/// Every WGSL kernel source as the backend compiles it (name, source), for validation and
/// translation tests.
pub fn kernel_sources() -> Vec<(String, String)> {
    let mut sources: Vec<(String, String)> = kernels::all()
        .into_iter()
        .map(|kernel| (kernel.name(), kernel.source()))
        .collect();
    // The kernels as the backend rewrites them to reduce on subgroups.
    let subgroup_norms: Vec<(String, String)> = sources
        .iter()
        .filter(|(_, source)| {
            source.contains(kernels::NORM_SUM_SHARED)
                || source.contains(kernels::COOP_REDUCE_SHARED)
        })
        .map(|(name, source)| {
            (
                format!("{name} (reductions on subgroups)"),
                kernels::on_subgroups(source),
            )
        })
        .collect();
    sources.extend(subgroup_norms);
    sources
}
