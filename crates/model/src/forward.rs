//! The decoder forward pass: one loop over layers that every architecture row shares.
//!
//! ```text
//! ids -> embedding (x scale?) -> RMSNorm -> per layer: Q/K/V (+bias) -> QK-norm? -> RoPE
//!     -> KV write -> (queries x scale?) -> attention -> output proj -> post-norm?
//!     -> +residual, RMSNorm -> gated FFN (SwiGLU, GeGLU) or MoE -> post-norm?
//!     -> +residual, RMSNorm (the next layer's, or the output norm) -> lm_head -> logits
//! ```
//!
//! The last layer's FFN and the output run only on the rows whose logits are wanted.
//!
//! A backend that takes norms into the matmuls reading them and residual adds into the ones
//! making the addends (`FusedOps::norms_in_matmuls`) gets the same ops in a second order
//! where the layers allow it (dense FFNs, no post-norms): per layer the norm with the Q/K/V
//! projections, RoPE and the cache write, attention with the output projection and its
//! residual add, and the FFN with its norm and residual add (tests/norm_order.rs in the
//! engine checks both orders against each other on the CPU).

use runit_backend::{
    AddRmsNorm, Attention, AttentionOutput, AttentionParams, Backend, BackendError, Buffer,
    FusedOps, GatedFfn, GatedFfnRun, MoeBuffers, MoeFfn, MoeFfnRun, NormFfnResidual, NormInput,
    Pick, Projection, QkNorms, RmsNorm, RopeKvWrite, RopeParams, RowSampling, Sampled,
    SequenceSpan, StepInputs, StepKey, Weight,
};

use crate::observer::{LayerObserver, Observed, PassRows};
use crate::weights::{FfnWeights, LayerWeights};
use crate::workspace::{FfnScratch, KvState, Scratch};
use crate::{LayerConfig, Model, ModelError};

/// One step's input: tokens of one or more sequences.
pub struct Batch<'a> {
    pub tokens: &'a [u32],
    /// Position of each token in its sequence.
    pub positions: &'a [u32],
    /// Which rows belong to which sequence, and where their KV cells are.
    pub spans: &'a [SequenceSpan],
    /// The same spans with the windowed layers' block tables, when those layers keep only
    /// their windows (`KvState::window_cells`); `None` when they share `spans`' cells.
    pub window_spans: Option<&'a [SequenceSpan]>,
    /// Rows whose logits are wanted, in output order.
    pub logit_rows: &'a [u32],
    /// Every row computed as it would be in a pass of its own
    /// (`runit_backend::StepInputs::rows_alone`): speculative verification.
    pub rows_alone: bool,
}

/// The rows of the residual stream a layer's FFN half works on: `x` (`[rows, embd]`), the
/// output of the block before it in `delta`, and `normed` for each norm.
struct Residual<'a> {
    rows: usize,
    x: &'a mut Buffer,
    delta: &'a mut Buffer,
    normed: &'a mut Buffer,
}

/// The RoPE and attention parameters of one layer.
struct AttentionShape {
    q_rope: RopeParams,
    k_rope: RopeParams,
    params: AttentionParams,
}

impl Model {
    /// Runs one batch through the decoder, writing its keys and values into `kv` and the
    /// logits of `batch.logit_rows` into `logits` (`[logit_rows.len(), vocab]`).
    pub fn forward(
        &self,
        batch: &Batch<'_>,
        kv: &mut KvState,
        scratch: &mut Scratch,
        logits: &mut Vec<f32>,
        mut observer: Option<&mut (dyn LayerObserver + '_)>,
    ) -> Result<(), ModelError> {
        self.run_pass(batch, kv, scratch, observer.as_deref_mut())?;
        let c = &self.config;
        let out_rows = batch.logit_rows.len();
        if out_rows == 0 {
            logits.clear();
            return Ok(());
        }
        logits.resize(out_rows * c.vocab_size, 0.0);
        self.backend.download(&scratch.logits, logits)?;
        if let Some(obs) = observer {
            obs.observe("result_output", out_rows, c.vocab_size, logits);
        }
        Ok(())
    }

    /// [`Model::forward`] for greedy decoding: the [`Pick`] (largest logit and, with
    /// `log_probabilities`, its log-probability; else NaN or it) of each of
    /// `batch.logit_rows`, computed where the logits are, so a device backend downloads two
    /// numbers per row instead of the vocabulary.
    pub fn forward_greedy(
        &self,
        batch: &Batch<'_>,
        kv: &mut KvState,
        scratch: &mut Scratch,
        log_probabilities: bool,
    ) -> Result<Vec<Pick>, ModelError> {
        self.run_pass(batch, kv, scratch, None)?;
        let rows = batch.logit_rows.len();
        Ok(self.backend.greedy_pick(
            &scratch.logits,
            rows,
            self.config.vocab_size,
            log_probabilities,
        )?)
    }

    /// [`Model::forward`] for sampling where the logits are: the token of each of
    /// `batch.logit_rows` drawn under its `sampling` entry
    /// ([`runit_backend::PrimitiveOps::sample_pick`]), so a device backend downloads the
    /// tokens instead of the vocabulary.
    pub fn forward_sample(
        &self,
        batch: &Batch<'_>,
        kv: &mut KvState,
        scratch: &mut Scratch,
        sampling: &[RowSampling<'_>],
    ) -> Result<Vec<Sampled>, ModelError> {
        self.run_pass(batch, kv, scratch, None)?;
        let rows = batch.logit_rows.len();
        Ok(self
            .backend
            .sample_pick(&mut scratch.logits, rows, self.config.vocab_size, sampling)?)
    }

    /// The checks and ops of a pass, leaving the logits of `batch.logit_rows` in
    /// `scratch.logits`; the host's time for them in `scratch.submit_seconds`.
    pub(crate) fn run_pass(
        &self,
        batch: &Batch<'_>,
        kv: &mut KvState,
        scratch: &mut Scratch,
        observer: Option<&mut (dyn LayerObserver + '_)>,
    ) -> Result<(), ModelError> {
        let started = std::time::Instant::now();
        let submitted = self.submit_pass(batch, kv, scratch, observer);
        scratch.submit_seconds = started.elapsed().as_secs_f64();
        submitted
    }

    fn submit_pass(
        &self,
        batch: &Batch<'_>,
        kv: &mut KvState,
        scratch: &mut Scratch,
        observer: Option<&mut (dyn LayerObserver + '_)>,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let b: &dyn Backend = self.backend.as_ref();
        let tokens = batch.tokens.len();
        if tokens > scratch.capacity || batch.logit_rows.len() > scratch.capacity {
            return Err(ModelError::BatchTooLarge {
                tokens,
                capacity: scratch.capacity,
            });
        }
        if let Some(&id) = batch.tokens.iter().find(|&&id| id as usize >= c.vocab_size) {
            return Err(ModelError::TokenOutOfRange {
                id,
                n_vocab: c.vocab_size,
            });
        }
        if batch.window_spans.is_some() != kv.window_cells.is_some()
            || batch
                .window_spans
                .is_some_and(|spans| spans.len() != batch.spans.len())
        {
            return Err(ModelError::WindowMismatch);
        }
        if let Some(&p) = batch.positions.iter().find(|&&p| p as usize >= kv.n_cells) {
            return Err(ModelError::ContextOverflow {
                position: p as usize,
                context: kv.n_cells,
            });
        }
        let inputs = StepInputs {
            tokens: batch.tokens,
            positions: batch.positions,
            spans: batch.spans,
            window_spans: batch.window_spans,
            logit_rows: batch.logit_rows,
            rows_alone: batch.rows_alone,
        };
        // A pass with one row per sequence (decode) is captured once and replayed; prompt
        // chunks vary in length, MoE routing may read the router on the host (the backend
        // says when it does not), and the observer downloads intermediates, so those run op
        // by op; so do windowed block tables where the backend's captures cannot hold them.
        let capture = observer.is_none()
            && (batch.window_spans.is_none() || b.takes_window_spans())
            && (c.expert_count == 0 || b.moe_ffn_on_device(tokens))
            && tokens == batch.spans.len()
            && !batch.logit_rows.is_empty()
            && b.captures_steps();
        let key = StepKey {
            workspace: (scratch.id << 32) ^ kv.id,
            tokens,
            spans: batch.spans.len(),
            logit_rows: batch.logit_rows.len(),
        };
        b.begin_step(&inputs)?;
        let ran = match observer {
            Some(observer) => {
                let rows = PassRows {
                    tokens,
                    logits: batch.logit_rows.len(),
                    layers: self.weights.layers.len(),
                };
                let observed = Observed::new(b, observer, rows);
                self.run_layers(&observed, batch, kv, scratch)
            }
            None if capture => b.run_captured(key, &mut || self.run_layers(b, batch, kv, scratch)),
            None => self.run_layers(b, batch, kv, scratch),
        };
        let ended = b.end_step();
        ran?;
        ended?;
        Ok(())
    }

    /// The ops of one pass, from the embedding to the logits left in `s.logits`.
    fn run_layers(
        &self,
        b: &dyn FusedOps,
        batch: &Batch<'_>,
        kv: &mut KvState,
        s: &mut Scratch,
    ) -> Result<(), BackendError> {
        let w = &self.weights;
        let tokens = batch.tokens.len();
        b.embedding(&w.token_embd, batch.tokens, &mut s.x)?;
        if let Some(factor) = self.config.embedding_scale() {
            b.scale(&mut s.x, factor, tokens * self.config.embedding_length)?;
        }
        let Some(last) = w.layers.len().checked_sub(1) else {
            return self.logits_without_layers(b, batch.logit_rows, s);
        };
        let width = self.config.embedding_length;
        if b.norms_in_matmuls(width) && self.norms_in_matmuls_fit() {
            return self.run_layers_norms_in_matmuls(b, batch, kv, s, last);
        }
        b.rms_norm(
            &s.x,
            self.norm(&w.layers[0].attn_norm),
            tokens,
            &mut s.normed,
        )?;
        for i in 0..last {
            self.attention(b, i, batch, kv, s, false)?;
            let residual = Residual {
                rows: tokens,
                x: &mut s.x,
                delta: &mut s.proj,
                normed: &mut s.normed,
            };
            let next_norm = &w.layers[i + 1].attn_norm;
            self.feed_forward_block(b, &w.layers[i], next_norm, residual, &mut s.ffn)?;
        }
        self.attention(b, last, batch, kv, s, false)?;
        // Without logits wanted (a prompt chunk before the last), the keys and values were
        // all this pass had to make.
        if !batch.logit_rows.is_empty() {
            self.last_rows(b, &w.layers[last], batch.logit_rows, s)?;
        }
        Ok(())
    }

    /// Whether every layer fits [`FusedOps::norms_in_matmuls`]'s order: a dense FFN and no
    /// post-norms.
    fn norms_in_matmuls_fit(&self) -> bool {
        self.weights.layers.iter().all(|layer| {
            matches!(layer.ffn, FfnWeights::Dense { .. })
                && layer.post_attention_norm.is_none()
                && layer.post_ffn_norm.is_none()
        })
    }

    /// [`Model::run_layers`] in [`FusedOps::norms_in_matmuls`]'s order: each norm inside the
    /// op that reads it (the Q/K/V projections, the FFN), each residual add inside the op
    /// that makes the addend (the output projection, the FFN). The same values as the
    /// add-and-norm order, op for op: only where the adds and norms sit differs.
    fn run_layers_norms_in_matmuls(
        &self,
        b: &dyn FusedOps,
        batch: &Batch<'_>,
        kv: &mut KvState,
        s: &mut Scratch,
        last: usize,
    ) -> Result<(), BackendError> {
        let w = &self.weights;
        let tokens = batch.tokens.len();
        for i in 0..last {
            self.attention(b, i, batch, kv, s, true)?;
            let Scratch {
                x,
                normed,
                proj,
                ffn,
                ..
            } = s;
            self.feed_forward_residual(b, &w.layers[i], tokens, [x, normed, proj], ffn)?;
        }
        self.attention(b, last, batch, kv, s, true)?;
        let logit_rows = batch.logit_rows;
        if logit_rows.is_empty() {
            return Ok(());
        }
        // The last layer's FFN over the logit rows alone, as `last_rows` runs it.
        let rows = logit_rows.len();
        b.gather_rows(&s.x, logit_rows, self.config.embedding_length, &mut s.out_x)?;
        let buffers = [&mut s.out_x, &mut s.normed, &mut s.out_proj];
        self.feed_forward_residual(b, &w.layers[last], rows, buffers, &mut s.ffn)?;
        b.rms_norm(&s.out_x, self.norm(&w.output_norm), rows, &mut s.normed)?;
        b.matmul(&w.output, &s.normed, rows, &mut s.logits)
    }

    /// The FFN half of `layer` (dense, no post-norms) over `rows` rows of the residual stream
    /// `x`: [`FusedOps::norm_gated_ffn_residual`] with `normed` and `delta` as its buffers.
    fn feed_forward_residual(
        &self,
        b: &dyn FusedOps,
        layer: &LayerWeights,
        rows: usize,
        [x, normed, delta]: [&mut Buffer; 3],
        ffn: &mut FfnScratch,
    ) -> Result<(), BackendError> {
        let FfnWeights::Dense { gate, up, down } = &layer.ffn else {
            unreachable!("norms_in_matmuls_fit admits dense FFNs alone");
        };
        b.norm_gated_ffn_residual(NormFfnResidual {
            x,
            norm: self.norm(&layer.ffn_norm),
            normed,
            ffn: GatedFfn {
                gate,
                up,
                down,
                activation: self.activation,
            },
            tokens: rows,
            up: &mut ffn.up,
            hidden: &mut ffn.hidden,
            delta,
        })
    }

    /// After the last layer's attention, as llama.cpp's `inp_out_ids` does: only the rows
    /// whose logits are wanted go on (gathered into `s.out_x` and `s.out_proj`), so that
    /// layer's FFN and the output matmul run with as many rows as there are logits (one for
    /// generation: the `vec_dot` order); the FFN half, the output norm, the logits.
    fn last_rows(
        &self,
        b: &dyn FusedOps,
        last: &LayerWeights,
        logit_rows: &[u32],
        s: &mut Scratch,
    ) -> Result<(), BackendError> {
        let embd = self.config.embedding_length;
        b.gather_rows(&s.x, logit_rows, embd, &mut s.out_x)?;
        b.gather_rows(&s.proj, logit_rows, embd, &mut s.out_proj)?;
        let residual = Residual {
            rows: logit_rows.len(),
            x: &mut s.out_x,
            delta: &mut s.out_proj,
            normed: &mut s.normed,
        };
        let output_norm = &self.weights.output_norm;
        self.feed_forward_block(b, last, output_norm, residual, &mut s.ffn)?;
        b.matmul(
            &self.weights.output,
            &s.normed,
            logit_rows.len(),
            &mut s.logits,
        )
    }

    /// The logits of a model without layers: the output norm and projection of the logit
    /// rows' embeddings.
    fn logits_without_layers(
        &self,
        b: &dyn FusedOps,
        logit_rows: &[u32],
        s: &mut Scratch,
    ) -> Result<(), BackendError> {
        if logit_rows.is_empty() {
            return Ok(());
        }
        let (embd, rows) = (self.config.embedding_length, logit_rows.len());
        b.gather_rows(&s.x, logit_rows, embd, &mut s.out_x)?;
        b.rms_norm(
            &s.out_x,
            self.norm(&self.weights.output_norm),
            rows,
            &mut s.normed,
        )?;
        b.matmul(&self.weights.output, &s.normed, rows, &mut s.logits)
    }

    /// Layer `index`'s attention block over every row of `s.normed`, into `s.proj`: the Q, K
    /// and V projections, the QK norms, RoPE and the cache write, attention and its output
    /// projection. With `residual` ([`FusedOps::norms_in_matmuls`]'s order) the block starts
    /// from `s.x`, its norm inside the Q/K/V op, and ends with the output added to `s.x`.
    fn attention(
        &self,
        b: &dyn FusedOps,
        index: usize,
        batch: &Batch<'_>,
        kv: &mut KvState,
        s: &mut Scratch,
        residual: bool,
    ) -> Result<(), BackendError> {
        let layer = &self.weights.layers[index];
        let config = self.config.layer(index);
        let shape = self.attention_shape(config);
        let tokens = batch.tokens.len();
        let spans = match (config.sliding_window, batch.window_spans) {
            (Some(_), Some(window_spans)) => window_spans,
            _ => batch.spans,
        };
        // The biases come all three or none (as the weights loader reads them).
        let biases = match (&layer.q_bias, &layer.k_bias, &layer.v_bias) {
            (Some(q), Some(k), Some(v)) => [Some(q), Some(k), Some(v)],
            _ => [None; 3],
        };
        let weights = [&layer.q, &layer.k, &layer.v];
        let projections = std::array::from_fn(|i| Projection {
            weight: weights[i],
            bias: biases[i],
        });
        let qk_norms = match (&layer.q_norm, &layer.k_norm) {
            (Some(q), Some(k)) => Some(QkNorms {
                q,
                k,
                eps: self.config.rms_norm_eps,
            }),
            _ => None,
        };
        if residual {
            let input = NormInput {
                x: &s.x,
                norm: self.norm(&layer.attn_norm),
                rows: tokens,
                normed: &mut s.normed,
            };
            b.norm_matmul_qkv(input, projections, [&mut s.q, &mut s.k, &mut s.v])?;
        }
        let op = RopeKvWrite {
            q: &mut s.q,
            k: &mut s.k,
            v: &mut s.v,
            positions: batch.positions,
            q_rope: &shape.q_rope,
            k_rope: &shape.k_rope,
            freq_factors: self.weights.rope_freqs.as_ref(),
            k_cache: &mut kv.keys[index],
            v_cache: &mut kv.values[index],
            spans,
            qk_norms,
        };
        match residual {
            true => b.rope_kv_write(op)?,
            false => b.qkv_rope_kv_write(projections, &s.normed, op)?,
        }
        if let Some(factor) = self.config.query_scale() {
            b.scale(&mut s.q, factor, tokens * self.config.q_width())?;
        }
        let attention = Attention {
            q: &s.q,
            k_cache: &kv.keys[index],
            v_cache: &kv.values[index],
            spans,
            params: &shape.params,
        };
        let op = AttentionOutput {
            attention,
            attn: &mut s.attn,
            projection: &layer.attn_output,
            tokens,
            out: &mut s.proj,
        };
        match residual {
            true => b.attention_output_residual(op, &mut s.x),
            false => b.attention_output(op),
        }
    }

    /// The FFN half of `layer` over the rows of `residual`: the residual add of the
    /// attention's output (after its post-norm, in a row that has one) with the FFN norm, the
    /// FFN into `residual.delta` (and its post-norm), and its residual add with `next_norm`
    /// (the next layer's attention norm, or the output norm) into `residual.normed`.
    fn feed_forward_block(
        &self,
        b: &dyn FusedOps,
        layer: &LayerWeights,
        next_norm: &Weight,
        residual: Residual<'_>,
        ffn: &mut FfnScratch,
    ) -> Result<(), BackendError> {
        let Residual {
            rows,
            x,
            delta,
            normed,
        } = residual;
        if let Some(post) = &layer.post_attention_norm {
            b.rms_norm_in_place(delta, self.norm(post), rows)?;
        }
        b.add_rms_norm(AddRmsNorm {
            x: &mut *x,
            delta,
            norm: self.norm(&layer.ffn_norm),
            rows,
            out: &mut *normed,
        })?;
        self.feed_forward(b, layer, normed, rows, ffn, delta)?;
        if let Some(post) = &layer.post_ffn_norm {
            b.rms_norm_in_place(delta, self.norm(post), rows)?;
        }
        b.add_rms_norm(AddRmsNorm {
            x,
            delta,
            norm: self.norm(next_norm),
            rows,
            out: normed,
        })
    }

    /// The FFN of `layer` over `rows` rows of `x` into `out`: a dense gated FFN
    /// ([`FusedOps::gated_ffn`]) or a mixture of experts ([`FusedOps::moe_ffn`]).
    fn feed_forward(
        &self,
        b: &dyn FusedOps,
        layer: &LayerWeights,
        x: &Buffer,
        rows: usize,
        ffn: &mut FfnScratch,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        let c = &self.config;
        match &layer.ffn {
            FfnWeights::Dense { gate, up, down } => {
                let dense = GatedFfn {
                    gate,
                    up,
                    down,
                    activation: self.activation,
                };
                let run = GatedFfnRun {
                    ffn: dense,
                    x,
                    tokens: rows,
                    up: &mut ffn.up,
                    hidden: &mut ffn.hidden,
                };
                b.gated_ffn(run, out)
            }
            FfnWeights::Moe {
                router,
                gate,
                up,
                down,
            } => {
                let moe = ffn.moe.as_mut().expect("MoE scratch exists for MoE models");
                let experts = MoeFfn {
                    router,
                    gate,
                    up,
                    down,
                    experts: c.expert_count,
                    used: c.expert_used_count,
                    renormalise: c.expert_weights_norm,
                };
                let scratch = MoeBuffers {
                    router: &mut moe.router,
                    gathered: &mut moe.gathered,
                    gate: &mut ffn.hidden,
                    up: &mut ffn.up,
                    expert_out: &mut moe.expert_out,
                };
                let run = MoeFfnRun {
                    ffn: experts,
                    x,
                    tokens: rows,
                    scratch,
                };
                b.moe_ffn(run, out)
            }
        }
    }

    /// The model's RMS norm with weight `weight`.
    fn norm<'a>(&self, weight: &'a Weight) -> RmsNorm<'a> {
        RmsNorm {
            weight,
            eps: self.config.rms_norm_eps,
        }
    }

    /// The RoPE of the queries and keys and the attention of a layer configured as `layer`.
    fn attention_shape(&self, layer: &LayerConfig) -> AttentionShape {
        let c = &self.config;
        let rope = |heads: usize| RopeParams {
            style: c.arch.rope_style,
            heads,
            head_dim: c.head_dim,
            rotary_dim: c.rope_dim,
            theta: layer.rope_theta,
            freq_scale: layer.rope_freq_scale,
            yarn: layer.rope_yarn,
        };
        AttentionShape {
            q_rope: rope(c.head_count),
            k_rope: rope(c.head_count_kv),
            params: AttentionParams {
                heads: c.head_count,
                kv_heads: c.head_count_kv,
                head_dim: c.head_dim,
                // Queries scaled beforehand take the scores as they are.
                scale: match c.query_scale() {
                    Some(_) => 1.0,
                    None => 1.0 / (c.head_dim as f32).sqrt(),
                },
                sliding_window: layer.sliding_window,
            },
        }
    }
}
