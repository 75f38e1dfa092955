//! The backend contract: the small set of operations a compute device provides to run a
//! decoder, on buffers it owns.
//!
//! Model and engine code hold an `Arc<dyn Backend>` and never name a concrete backend. Every
//! op writes into a preallocated buffer, so a GPU backend can capture a whole decode step once
//! and replay it. Every backend must pass [`testing::parity`] against the CPU reference before
//! it is used.
//!
//! Conventions: activations are f32, row-major `[tokens, width]`. Weight shapes are in ggml
//! order (`shape[0]` is the row length, `shape[1]` the number of rows, `shape[2]` the expert
//! index for MoE tensors). A matmul computes `out[t][o] = sum_i W[o][i] * x[t][i]`.

mod buffer;
mod error;
pub mod moe;
mod ops;
pub mod pick;
pub mod testing;
pub mod unfused;

pub use buffer::{Buffer, GgmlLayout, HostMemory, KvCache, KvType, Weight};
pub use error::BackendError;
pub use ops::{
    AttentionParams, HeadNorms, MoeBuffers, MoeFfn, RopeParams, RopeStyle, SequenceSpan,
    StepInputs, StepKey,
};
pub use pick::Pick;

use runit_quant::GgmlType;

/// Operations whose support may depend on the weight type (see [`Backend::supports`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// Row lookup from an embedding table.
    Embedding,
    /// Weight × activations.
    MatMul,
}

/// A compute device.
pub trait Backend: Send + Sync {
    /// Short name for logs and errors (`"cpu"`, `"cuda:0"`).
    fn name(&self) -> String;

    /// True when `op` can run on weights of type `ty`.
    fn supports(&self, op: Op, ty: GgmlType) -> bool;

    /// A zeroed f32 activation buffer of `len` elements.
    fn alloc(&self, len: usize) -> Result<Buffer, BackendError>;

    /// Copies `data` into the first `data.len()` elements of `buffer`.
    fn upload(&self, buffer: &mut Buffer, data: &[f32]) -> Result<(), BackendError>;

    /// Copies the first `out.len()` elements of `buffer` into `out` (waits for pending work).
    fn download(&self, buffer: &Buffer, out: &mut [f32]) -> Result<(), BackendError>;

    /// The greedy [`Pick`] of each of the first `rows` rows of `width` logits in `logits`
    /// (waits for pending work); without `log_probabilities` a backend may leave each
    /// pick's `logprob` NaN instead of computing it (a pass over the row's exponentials).
    /// The default downloads the rows and picks on the host; a device backend picks on the
    /// device and downloads only the picks.
    fn greedy_pick(
        &self,
        logits: &Buffer,
        rows: usize,
        width: usize,
        log_probabilities: bool,
    ) -> Result<Vec<Pick>, BackendError> {
        let mut host = vec![0.0; rows * width];
        self.download(logits, &mut host)?;
        let pick = |row: &[f32]| pick::pick_row(row, log_probabilities);
        Ok(host.chunks(width.max(1)).map(pick).collect())
    }

    /// Makes a weight usable by this backend. `bytes` is the packed tensor as stored in the
    /// file; a host backend may keep referring to it (zero copy), a device backend uploads it.
    fn load_weight(
        &self,
        name: &str,
        ty: GgmlType,
        shape: &[usize],
        memory: std::sync::Arc<dyn HostMemory>,
        range: std::ops::Range<usize>,
    ) -> Result<Weight, BackendError>;

    /// A KV cache for one layer: `n_cells` token slots of `width` = kv_heads × head_dim.
    fn alloc_kv(&self, n_cells: usize, width: usize, ty: KvType) -> Result<KvCache, BackendError>;

    /// `out[t] = table[ids[t]]` (dequantized), `out` is `[ids.len(), shape[0]]`.
    fn embedding(&self, table: &Weight, ids: &[u32], out: &mut Buffer) -> Result<(), BackendError>;

    /// `out[t] = W · x[t]` for the first `tokens` rows; `x` is `[tokens, shape[0]]`,
    /// `out` is `[tokens, shape[1]]`.
    fn matmul(
        &self,
        weight: &Weight,
        x: &Buffer,
        tokens: usize,
        out: &mut Buffer,
    ) -> Result<(), BackendError>;

    /// `x[t] += bias` for the first `tokens` rows of width `bias.shape[0]`.
    fn add_bias(&self, x: &mut Buffer, bias: &Weight, tokens: usize) -> Result<(), BackendError>;

    /// RMS-normalises each row of `weight.shape[0]` elements of `x` (the first `rows` rows) and
    /// multiplies by `weight`: `out = x / sqrt(mean(x²) + eps) * weight`. Per-head norms pass
    /// rows = tokens × heads. `out` may not alias `x`; use [`Backend::rms_norm_in_place`].
    fn rms_norm(
        &self,
        x: &Buffer,
        weight: &Weight,
        eps: f32,
        rows: usize,
        out: &mut Buffer,
    ) -> Result<(), BackendError>;

    /// [`Backend::rms_norm`] writing back into `x`.
    fn rms_norm_in_place(
        &self,
        x: &mut Buffer,
        weight: &Weight,
        eps: f32,
        rows: usize,
    ) -> Result<(), BackendError>;

    /// Rotates the first `params.rotary_dim` dims of every head of `x` (`[tokens, heads,
    /// head_dim]`) by the angle of token `t`'s position `positions[t]`.
    fn rope(
        &self,
        x: &mut Buffer,
        positions: &[u32],
        params: &RopeParams,
        freq_factors: Option<&Weight>,
    ) -> Result<(), BackendError>;

    /// `dst[i] += src[i]` for the first `len` elements.
    fn add(&self, dst: &mut Buffer, src: &Buffer, len: usize) -> Result<(), BackendError>;

    /// `gate[i] = silu(gate[i]) * up[i]` for the first `len` elements.
    fn silu_mul(&self, gate: &mut Buffer, up: &Buffer, len: usize) -> Result<(), BackendError>;

    /// Writes the keys and values of each span's tokens (`k`, `v`: `[tokens, width]`) into the
    /// cache cells its block table maps their positions to.
    fn kv_write(
        &self,
        k: &Buffer,
        v: &Buffer,
        k_cache: &mut KvCache,
        v_cache: &mut KvCache,
        spans: &[SequenceSpan],
    ) -> Result<(), BackendError>;

    /// Causal grouped-query attention of each span's queries (`q`: `[tokens, heads,
    /// head_dim]`) over that sequence's cached keys and values (positions `0 ..= pos` of each
    /// query, limited to the sliding window when one is set). `out` is `[tokens, heads, head_dim]`.
    fn attention(
        &self,
        q: &Buffer,
        k_cache: &KvCache,
        v_cache: &KvCache,
        spans: &[SequenceSpan],
        params: &AttentionParams,
        out: &mut Buffer,
    ) -> Result<(), BackendError>;

    /// `out[i] = src[rows[i]]` for rows of `width` elements (MoE token gathering).
    fn gather_rows(
        &self,
        src: &Buffer,
        rows: &[u32],
        width: usize,
        out: &mut Buffer,
    ) -> Result<(), BackendError>;

    /// `dst[rows[i]] += scales[i] * src[i]` for rows of `width` elements (MoE combine).
    fn scatter_add_rows(
        &self,
        src: &Buffer,
        rows: &[u32],
        scales: &[f32],
        width: usize,
        dst: &mut Buffer,
    ) -> Result<(), BackendError>;

    /// Copies `len` elements from `src[src_offset..]` to `dst[dst_offset..]`.
    fn copy(
        &self,
        src: &Buffer,
        src_offset: usize,
        dst: &mut Buffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<(), BackendError>;

    /// Waits until all submitted work is done.
    fn synchronize(&self) -> Result<(), BackendError>;

    // Fused ops: each default composes the primitives above in the same order, so a backend
    // that does not override them (the CPU reference) computes exactly what the model did
    // before. A device backend overrides them to save launches; its fused result must equal
    // its own primitive sequence value for value.

    /// `out[t] = W · x[t] (+ bias)`: [`Backend::matmul`] followed by [`Backend::add_bias`]
    /// on `out` when a bias is given.
    fn matmul_bias(
        &self,
        weight: &Weight,
        bias: Option<&Weight>,
        x: &Buffer,
        tokens: usize,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        unfused::matmul_bias(self, weight, bias, x, tokens, out)
    }

    /// The Q, K and V projections of one input: [`Backend::matmul_bias`] of each weight with
    /// its bias into its output (a backend may run the three in one kernel; each output must
    /// equal its `matmul_bias` bit for bit).
    fn matmul_qkv(
        &self,
        weights: [&Weight; 3],
        biases: [Option<&Weight>; 3],
        x: &Buffer,
        tokens: usize,
        outs: [&mut Buffer; 3],
    ) -> Result<(), BackendError> {
        unfused::matmul_qkv(self, weights, biases, x, tokens, outs)
    }

    /// The residual add and the next norm: `x += delta` for the first `rows` rows of
    /// `weight.shape[0]` values, then `out = rms_norm(x)` ([`Backend::add`] followed by
    /// [`Backend::rms_norm`]). `out` may not alias `x` or `delta`.
    fn add_rms_norm(
        &self,
        x: &mut Buffer,
        delta: &Buffer,
        weight: &Weight,
        eps: f32,
        rows: usize,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        unfused::add_rms_norm(self, x, delta, weight, eps, rows, out)
    }

    /// RoPE on the queries and keys of a step, then the keys and values into the cache:
    /// with `head_norms`, first [`Backend::rms_norm_in_place`] of every head of `q` and of
    /// `k`; then [`Backend::rope`] of `q` with `q_params`, of `k` with `k_params` (same
    /// positions and frequency factors), then [`Backend::kv_write`] of `k` and `v`.
    #[allow(clippy::too_many_arguments)]
    fn rope_kv_write(
        &self,
        q: &mut Buffer,
        k: &mut Buffer,
        v: &Buffer,
        positions: &[u32],
        q_params: &RopeParams,
        k_params: &RopeParams,
        freq_factors: Option<&Weight>,
        k_cache: &mut KvCache,
        v_cache: &mut KvCache,
        spans: &[SequenceSpan],
        head_norms: Option<HeadNorms<'_>>,
    ) -> Result<(), BackendError> {
        unfused::rope_kv_write(
            self,
            q,
            k,
            v,
            positions,
            q_params,
            k_params,
            freq_factors,
            k_cache,
            v_cache,
            spans,
            head_norms,
        )
    }

    /// The SwiGLU FFN input: `out[t] = silu(gate · x[t]) * (up · x[t])` ([`Backend::matmul`]
    /// of `gate` into `out`, of `up` into `up_out`, then [`Backend::silu_mul`]). `gate` and
    /// `up` have the same shape; `up_out` (`[tokens, up.shape[1]]`) is scratch that a fused
    /// implementation may leave untouched.
    fn matmul_swiglu(
        &self,
        gate: &Weight,
        up: &Weight,
        x: &Buffer,
        tokens: usize,
        up_out: &mut Buffer,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        unfused::matmul_swiglu(self, gate, up, x, tokens, up_out, out)
    }

    /// Attention ([`Backend::attention`] into `attn`) followed by its output projection
    /// (`out = wo · attn` over `tokens` rows, [`Backend::matmul`]). `attn` holds the
    /// attention's output afterwards, as those two ops leave it.
    #[allow(clippy::too_many_arguments)]
    fn attention_output(
        &self,
        q: &Buffer,
        k_cache: &KvCache,
        v_cache: &KvCache,
        spans: &[SequenceSpan],
        params: &AttentionParams,
        attn: &mut Buffer,
        wo: &Weight,
        tokens: usize,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        self.attention(q, k_cache, v_cache, spans, params, attn)?;
        self.matmul(wo, attn, tokens, out)
    }

    /// The dense SwiGLU FFN: `out[t] = down · (silu(gate · x[t]) * (up · x[t]))`
    /// ([`Backend::matmul_swiglu`] into `hidden`, `[tokens, gate.shape[1]]`, with `up_out` as
    /// its scratch, then [`Backend::matmul`] of `down` over `hidden`). `hidden` holds the
    /// SwiGLU's output afterwards, as those two ops leave it.
    #[allow(clippy::too_many_arguments)]
    fn matmul_swiglu_down(
        &self,
        gate: &Weight,
        up: &Weight,
        down: &Weight,
        x: &Buffer,
        tokens: usize,
        up_out: &mut Buffer,
        hidden: &mut Buffer,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        self.matmul_swiglu(gate, up, x, tokens, up_out, hidden)?;
        self.matmul(down, hidden, tokens, out)
    }

    /// The mixture-of-experts FFN of `x` (`[tokens, embd]`) into `out` (`[tokens, embd]`):
    /// the router's logits, each token's `ffn.used` experts and weights
    /// ([`moe::route_tokens`]), and for each expert the SwiGLU FFN of its rows, added to
    /// their `out` rows times their weights, expert by expert from zero. The default
    /// ([`unfused::moe_ffn`]) reads the logits back to route on the host, then runs
    /// [`Backend::gather_rows`], [`Backend::matmul`] of the expert's gate and up,
    /// [`Backend::silu_mul`], [`Backend::matmul`] of its down and
    /// [`Backend::scatter_add_rows`] per expert.
    fn moe_ffn(
        &self,
        ffn: &MoeFfn<'_>,
        x: &Buffer,
        tokens: usize,
        scratch: MoeBuffers<'_>,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        unfused::moe_ffn(self, ffn, x, tokens, scratch, out)
    }

    /// True when [`Backend::moe_ffn`] of `tokens` rows reads nothing back to the host, so a
    /// pass containing it can be captured by [`Backend::run_captured`]. The default's
    /// routing reads the router logits: `false`.
    fn moe_ffn_on_device(&self, tokens: usize) -> bool {
        let _ = tokens;
        false
    }

    /// True when the backend computes straight from the host memory its weights are loaded
    /// from (the CPU backend) instead of copying them to a device: the loader may then copy
    /// that memory into a faster layout first (huge pages; `runit_model::WeightPlacement`).
    fn reads_weights_from_host(&self) -> bool {
        false
    }

    /// Device memory free for weights and caches, in bytes (`None`: host memory, not checked).
    fn memory_available(&self) -> Option<usize> {
        None
    }

    /// Announces the host-side inputs of the forward pass whose ops follow, until
    /// [`Backend::end_step`]. Ops of the pass are called with these very slices; a device
    /// backend copies them to device memory once, so its ops read them there and a captured
    /// pass stays valid when they change. The default does nothing.
    fn begin_step(&self, inputs: &StepInputs<'_>) -> Result<(), BackendError> {
        let _ = inputs;
        Ok(())
    }

    /// Ends the pass started by [`Backend::begin_step`].
    fn end_step(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// True when [`Backend::run_captured`] records and replays passes (CUDA graphs).
    fn captures_steps(&self) -> bool {
        false
    }

    /// Runs `body`, the ops of one forward pass between `begin_step` and `end_step`, or
    /// replays the capture of an earlier pass with the same `key` instead of calling it. The
    /// body must not read device results back to the host. The default runs `body`.
    fn run_captured(
        &self,
        key: StepKey,
        body: &mut dyn FnMut() -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let _ = key;
        body()
    }
}
