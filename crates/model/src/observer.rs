//! `--dump-layers`: a backend wrapper that runs each fused op of the decoder as its primitive
//! ops and hands the intermediates to a [`LayerObserver`], under the names of llama.cpp's
//! graph nodes (`embd`, `attn_norm-0`, `Qcur-0`, ..., `l_out-0`).
//!
//! The decoder calls the same ops with or without an observer; [`Observed`] knows which
//! layer runs by counting them: each `matmul_qkv` starts a layer, and a layer's
//! `add_rms_norm` calls are the residual add after its attention (`ffn_inp`, `ffn_norm`) and
//! the one after its FFN (`l_out`, then the next layer's norm, dumped as the next layer's
//! `attn_norm` when its projections start).

use std::cell::RefCell;

use runit_backend::{
    unfused, Activation, AddRmsNorm, Attention, AttentionOutput, Backend, BackendError, Buffer,
    BufferCopy, Device, FusedOps, GatedFfnRun, KvCache, KvRole, KvType, KvWrite, MoeFfnRun, Op,
    OpResult, Pick, PrimitiveOps, Projection, RmsNorm, RopeKvWrite, RopeParams, RowSampling,
    Sampled, ScatterAddRows, StepInputs, Weight, WeightSource,
};
use runit_quant::GgmlType;

/// Receives intermediate tensors for debugging (`--dump-layers`), named like llama.cpp's
/// graph nodes (`attn_norm-0`, `Qcur-0`, `l_out-0`, `result_output`).
pub trait LayerObserver {
    /// `data` is `[rows, width]` row-major.
    fn observe(&mut self, name: &str, rows: usize, width: usize, data: &[f32]);
}

/// The rows of the pass an [`Observed`] backend runs.
pub(crate) struct PassRows {
    /// Rows of the batch.
    pub tokens: usize,
    /// Rows whose logits are wanted.
    pub logits: usize,
    /// Layers of the model.
    pub layers: usize,
}

/// A backend whose fused ops run as the inner backend's primitives, each intermediate
/// downloaded and handed to the observer. Its passes are never captured.
pub(crate) struct Observed<'a> {
    inner: &'a dyn Backend,
    rows: PassRows,
    state: RefCell<State<'a>>,
}

/// What the observer has seen of the pass so far.
struct State<'a> {
    observer: &'a mut (dyn LayerObserver + 'a),
    /// The layer whose ops run (none before the first `matmul_qkv`).
    layer: Option<usize>,
    /// `add_rms_norm` calls of this layer so far.
    residual_adds: usize,
}

impl<'a> Observed<'a> {
    /// `inner` reporting the pass of `rows` to `observer`.
    pub fn new(
        inner: &'a dyn Backend,
        observer: &'a mut (dyn LayerObserver + 'a),
        rows: PassRows,
    ) -> Observed<'a> {
        let state = State {
            observer,
            layer: None,
            residual_adds: 0,
        };
        Observed {
            inner,
            rows,
            state: RefCell::new(state),
        }
    }

    /// The current layer's index.
    fn layer(&self) -> Option<usize> {
        self.state.borrow().layer
    }

    /// Hands the first rows of `buffer` (`width` values each) to the observer as `name`, or
    /// `name-layer`. Every node has a row per token, except in the last layer: there the
    /// nodes after the attention's output (its FFN half) show the rows whose logits are wanted.
    fn dump(&self, name: &str, layer: Option<usize>, buffer: &Buffer, width: usize) {
        let last = self.rows.layers.checked_sub(1);
        let after_gather = matches!(
            name,
            "ffn_inp" | "ffn_norm" | "ffn_swiglu" | "ffn_out" | "l_out"
        );
        let rows = match layer {
            Some(_) if layer == last && after_gather => self.rows.logits,
            _ => self.rows.tokens,
        };
        let mut host = vec![0.0; rows * width];
        if self.inner.download(buffer, &mut host).is_ok() {
            let full = match layer {
                Some(layer) => format!("{name}-{layer}"),
                None => name.to_string(),
            };
            let mut state = self.state.borrow_mut();
            state.observer.observe(&full, rows, width, &host);
        }
    }
}

impl Device for Observed<'_> {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn supports(&self, op: Op, ty: GgmlType) -> bool {
        self.inner.supports(op, ty)
    }

    fn alloc(&self, len: usize) -> Result<Buffer, BackendError> {
        self.inner.alloc(len)
    }

    fn upload(&self, buffer: &mut Buffer, data: &[f32]) -> OpResult {
        self.inner.upload(buffer, data)
    }

    fn download(&self, buffer: &Buffer, out: &mut [f32]) -> OpResult {
        self.inner.download(buffer, out)
    }

    fn load_weight(&self, source: WeightSource<'_>) -> Result<Weight, BackendError> {
        self.inner.load_weight(source)
    }

    fn alloc_kv(
        &self,
        n_cells: usize,
        width: usize,
        head_dim: usize,
        ty: KvType,
        role: KvRole,
    ) -> Result<KvCache, BackendError> {
        self.inner.alloc_kv(n_cells, width, head_dim, ty, role)
    }

    fn center_keys(&self, cache: &mut KvCache, mean: &[f32]) -> OpResult {
        self.inner.center_keys(cache, mean)
    }

    fn synchronize(&self) -> OpResult {
        self.inner.synchronize()
    }

    fn memory_available(&self) -> Option<usize> {
        self.inner.memory_available()
    }

    fn reads_weights_from_host(&self) -> bool {
        self.inner.reads_weights_from_host()
    }

    fn begin_step(&self, inputs: &StepInputs<'_>) -> OpResult {
        self.inner.begin_step(inputs)
    }

    fn end_step(&self) -> OpResult {
        self.inner.end_step()
    }
}

/// The inner backend's primitives; the embedding is dumped as `embd`.
impl PrimitiveOps for Observed<'_> {
    fn embedding(&self, table: &Weight, ids: &[u32], out: &mut Buffer) -> OpResult {
        self.inner.embedding(table, ids, out)?;
        self.dump("embd", None, out, table.row_len());
        Ok(())
    }

    fn matmul(&self, weight: &Weight, x: &Buffer, tokens: usize, out: &mut Buffer) -> OpResult {
        self.inner.matmul(weight, x, tokens, out)
    }

    fn add_bias(&self, x: &mut Buffer, bias: &Weight, tokens: usize) -> OpResult {
        self.inner.add_bias(x, bias, tokens)
    }

    fn rms_norm(&self, x: &Buffer, norm: RmsNorm<'_>, rows: usize, out: &mut Buffer) -> OpResult {
        self.inner.rms_norm(x, norm, rows, out)
    }

    fn rms_norm_in_place(&self, x: &mut Buffer, norm: RmsNorm<'_>, rows: usize) -> OpResult {
        self.inner.rms_norm_in_place(x, norm, rows)
    }

    fn rope(
        &self,
        x: &mut Buffer,
        positions: &[u32],
        params: &RopeParams,
        freq_factors: Option<&Weight>,
    ) -> OpResult {
        self.inner.rope(x, positions, params, freq_factors)
    }

    fn scale(&self, x: &mut Buffer, factor: f32, len: usize) -> OpResult {
        self.inner.scale(x, factor, len)
    }

    fn add(&self, dst: &mut Buffer, src: &Buffer, len: usize) -> OpResult {
        self.inner.add(dst, src, len)
    }

    fn gated_activation(
        &self,
        activation: Activation,
        gate: &mut Buffer,
        up: &Buffer,
        len: usize,
    ) -> OpResult {
        self.inner.gated_activation(activation, gate, up, len)
    }

    fn kv_write(&self, write: KvWrite<'_>) -> OpResult {
        self.inner.kv_write(write)
    }

    fn attention(&self, attention: &Attention<'_>, out: &mut Buffer) -> OpResult {
        self.inner.attention(attention, out)
    }

    fn gather_rows(&self, src: &Buffer, rows: &[u32], width: usize, out: &mut Buffer) -> OpResult {
        self.inner.gather_rows(src, rows, width, out)
    }

    fn scatter_add_rows(&self, scatter: ScatterAddRows<'_>) -> OpResult {
        self.inner.scatter_add_rows(scatter)
    }

    fn copy(&self, copy: BufferCopy<'_>) -> OpResult {
        self.inner.copy(copy)
    }

    fn greedy_pick(
        &self,
        logits: &Buffer,
        rows: usize,
        width: usize,
        log_probabilities: bool,
    ) -> Result<Vec<Pick>, BackendError> {
        self.inner
            .greedy_pick(logits, rows, width, log_probabilities)
    }

    fn sample_pick(
        &self,
        logits: &mut Buffer,
        rows: usize,
        width: usize,
        sampling: &[RowSampling<'_>],
    ) -> Result<Vec<Sampled>, BackendError> {
        self.inner.sample_pick(logits, rows, width, sampling)
    }
}

/// The fused ops as the inner backend's primitives, with their intermediates dumped (the Q,
/// K and V projections stay the inner backend's `matmul_qkv`, as each output equals its
/// `matmul_bias`).
impl FusedOps for Observed<'_> {
    fn matmul_bias(
        &self,
        projection: Projection<'_>,
        x: &Buffer,
        tokens: usize,
        out: &mut Buffer,
    ) -> OpResult {
        self.inner.matmul_bias(projection, x, tokens, out)
    }

    /// Starts the next layer: its input is that layer's `attn_norm`.
    fn matmul_qkv(
        &self,
        projections: [Projection<'_>; 3],
        x: &Buffer,
        tokens: usize,
        outs: [&mut Buffer; 3],
    ) -> OpResult {
        let layer = self.layer().map_or(0, |layer| layer + 1);
        {
            let mut state = self.state.borrow_mut();
            state.layer = Some(layer);
            state.residual_adds = 0;
        }
        self.dump("attn_norm", Some(layer), x, projections[0].weight.row_len());
        self.inner.matmul_qkv(projections, x, tokens, outs)
    }

    /// `Qcur`, `Kcur`, `Vcur` after the QK norms, `Qrope` and `Krope` after RoPE.
    fn rope_kv_write(&self, mut op: RopeKvWrite<'_>) -> OpResult {
        let layer = self.layer();
        let q_width = op.q_rope.heads * op.q_rope.head_dim;
        let kv_width = op.k_rope.heads * op.k_rope.head_dim;
        unfused::qk_norms_in_place(self.inner, &mut op)?;
        self.dump("Qcur", layer, op.q, q_width);
        self.dump("Kcur", layer, op.k, kv_width);
        self.dump("Vcur", layer, op.v, kv_width);
        self.inner
            .rope(op.q, op.positions, op.q_rope, op.freq_factors)?;
        self.inner
            .rope(op.k, op.positions, op.k_rope, op.freq_factors)?;
        self.dump("Qrope", layer, op.q, q_width);
        self.dump("Krope", layer, op.k, kv_width);
        self.inner.kv_write(op.kv_write())
    }

    /// `kqv_out` after the attention, `attn_out` after the projection.
    fn attention_output(&self, op: AttentionOutput<'_>) -> OpResult {
        let layer = self.layer();
        self.inner.attention(&op.attention, &mut *op.attn)?;
        self.dump("kqv_out", layer, op.attn, op.attention.width());
        self.inner
            .matmul(op.projection, op.attn, op.tokens, &mut *op.out)?;
        self.dump("attn_out", layer, op.out, op.projection.rows());
        Ok(())
    }

    /// After the attention, `ffn_inp` and `ffn_norm`; after the FFN, `l_out` (the norm is the
    /// next layer's `attn_norm`, or the output norm).
    fn add_rms_norm(&self, op: AddRmsNorm<'_>) -> OpResult {
        let layer = self.layer();
        let adds = {
            let mut state = self.state.borrow_mut();
            state.residual_adds += 1;
            state.residual_adds
        };
        let width = op.norm.weight.row_len();
        self.inner.add(op.x, op.delta, op.rows * width)?;
        if adds == 1 {
            self.dump("ffn_inp", layer, op.x, width);
            self.inner.rms_norm(op.x, op.norm, op.rows, &mut *op.out)?;
            self.dump("ffn_norm", layer, op.out, width);
            return Ok(());
        }
        self.dump("l_out", layer, op.x, width);
        self.inner.rms_norm(op.x, op.norm, op.rows, op.out)
    }

    /// `ffn_swiglu` after the activation, `ffn_out` after the down projection.
    fn gated_ffn(&self, mut run: GatedFfnRun<'_>, out: &mut Buffer) -> OpResult {
        let layer = self.layer();
        unfused::gated_ffn_hidden(self.inner, run.reborrow())?;
        self.dump("ffn_swiglu", layer, run.hidden, run.ffn.gate.rows());
        self.inner
            .matmul(run.ffn.down, run.hidden, run.tokens, out)?;
        self.dump("ffn_out", layer, out, run.ffn.down.rows());
        Ok(())
    }

    /// `ffn_out` after the experts.
    fn moe_ffn(&self, run: MoeFfnRun<'_>, out: &mut Buffer) -> OpResult {
        let layer = self.layer();
        let width = run.ffn.down.rows();
        unfused::moe_ffn(self.inner, run, out)?;
        self.dump("ffn_out", layer, out, width);
        Ok(())
    }
}
