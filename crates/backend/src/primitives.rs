//! The second part of the contract: the primitive ops, each one step of the decoder's
//! arithmetic, into a preallocated buffer.

use crate::args::{Attention, BufferCopy, KvWrite, ScatterAddRows};
use crate::sample::{self, RowSampling, Sampled};
use crate::OpResult;
use crate::{pick, Activation, BackendError, Buffer, Device, Pick, RmsNorm, RopeParams, Weight};

/// The primitive ops of a device.
pub trait PrimitiveOps: Device {
    /// `out[t] = table[ids[t]]` (dequantized), `out` is `[ids.len(), shape[0]]`.
    fn embedding(&self, table: &Weight, ids: &[u32], out: &mut Buffer) -> OpResult;

    /// `out[t] = W · x[t]` for the first `tokens` rows; `x` is `[tokens, shape[0]]`,
    /// `out` is `[tokens, shape[1]]`.
    fn matmul(&self, weight: &Weight, x: &Buffer, tokens: usize, out: &mut Buffer) -> OpResult;

    /// `x[t] += bias` for the first `tokens` rows of width `bias.shape[0]`.
    fn add_bias(&self, x: &mut Buffer, bias: &Weight, tokens: usize) -> OpResult;

    /// `out = norm(x)` for the first `rows` rows of `norm.weight.row_len()` elements of `x`.
    /// Per-head norms pass rows = tokens × heads. `out` may not alias `x`; use
    /// [`PrimitiveOps::rms_norm_in_place`].
    fn rms_norm(&self, x: &Buffer, norm: RmsNorm<'_>, rows: usize, out: &mut Buffer) -> OpResult;

    /// [`PrimitiveOps::rms_norm`] writing back into `x`.
    fn rms_norm_in_place(&self, x: &mut Buffer, norm: RmsNorm<'_>, rows: usize) -> OpResult;

    /// Rotates the first `params.rotary_dim` dims of every head of `x` (`[tokens, heads,
    /// head_dim]`) by the angle of token `t`'s position `positions[t]`.
    fn rope(
        &self,
        x: &mut Buffer,
        positions: &[u32],
        params: &RopeParams,
        freq_factors: Option<&Weight>,
    ) -> OpResult;

    /// `x[i] *= factor` for the first `len` elements (ggml's `ggml_scale`: the scaled
    /// embeddings and queries of Gemma).
    fn scale(&self, x: &mut Buffer, factor: f32, len: usize) -> OpResult;

    /// `dst[i] += src[i]` for the first `len` elements.
    fn add(&self, dst: &mut Buffer, src: &Buffer, len: usize) -> OpResult;

    /// The gate of a gated FFN: `gate[i] = activation(gate[i]) * up[i]` for the first `len`
    /// elements.
    fn gated_activation(
        &self,
        activation: Activation,
        gate: &mut Buffer,
        up: &Buffer,
        len: usize,
    ) -> OpResult;

    /// Writes keys and values into the cache cells of their positions ([`KvWrite`]).
    fn kv_write(&self, write: KvWrite<'_>) -> OpResult;

    /// [`Attention`] of a step's queries into `out` (`[tokens, heads, head_dim]`).
    fn attention(&self, attention: &Attention<'_>, out: &mut Buffer) -> OpResult;

    /// `out[i] = src[rows[i]]` for rows of `width` elements (MoE token gathering, the rows
    /// that need logits).
    fn gather_rows(&self, src: &Buffer, rows: &[u32], width: usize, out: &mut Buffer) -> OpResult;

    /// Adds scaled rows into their places ([`ScatterAddRows`]: the MoE combine).
    fn scatter_add_rows(&self, scatter: ScatterAddRows<'_>) -> OpResult;

    /// Copies a range of elements between buffers ([`BufferCopy`]).
    fn copy(&self, copy: BufferCopy<'_>) -> OpResult;

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

    /// The token of each of the first `rows` rows of `width` logits in `logits`, sampled
    /// under `sampling[row]` by [`sample::sample_row`] (waits for pending work), with its
    /// logit after the biases and penalties. The rows may be left biased and penalized.
    /// Fails when `sampling` does not hold `rows` entries or a bias names a token outside
    /// the row. The default downloads the rows and samples on the host; a device backend
    /// samples on the device and downloads only the tokens, drawing exactly the tokens the
    /// default draws (see its implementation for the rows it hands to the host).
    fn sample_pick(
        &self,
        logits: &mut Buffer,
        rows: usize,
        width: usize,
        sampling: &[RowSampling<'_>],
    ) -> Result<Vec<Sampled>, BackendError> {
        sample_pick_on_host(self, logits, rows, width, sampling)
    }
}

/// [`PrimitiveOps::sample_pick`] on the host: downloads the first `rows` rows of `width`
/// logits and samples each by [`sample::sample_row`] (the default of the primitive, which a
/// device backend may also fall back to).
pub fn sample_pick_on_host<B: PrimitiveOps + ?Sized>(
    backend: &B,
    logits: &mut Buffer,
    rows: usize,
    width: usize,
    sampling: &[RowSampling<'_>],
) -> Result<Vec<Sampled>, BackendError> {
    const OP: &str = "sample_pick";
    if sampling.len() != rows {
        return Err(BackendError::Shape {
            op: OP,
            what: "sampling settings (one per row)",
            expected: rows,
            found: sampling.len(),
        });
    }
    let mut host = vec![0.0; rows * width];
    backend.download(logits, &mut host)?;
    host.chunks_mut(width.max(1))
        .zip(sampling)
        .map(|(row, settings)| {
            sample::sample_row(row, settings).map_err(|id| BackendError::Shape {
                op: OP,
                what: "logit bias token (below the row width)",
                expected: width,
                found: id as usize,
            })
        })
        .collect()
}
