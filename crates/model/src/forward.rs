//! The decoder forward pass: one loop over layers that every architecture row shares.
//!
//! ```text
//! ids -> embedding -> per layer: RMSNorm -> Q/K/V (+bias) -> QK-norm? -> RoPE -> KV write
//!     -> attention -> output proj -> +residual -> RMSNorm -> SwiGLU FFN or MoE -> +residual
//!     -> final RMSNorm (rows that need logits only) -> lm_head -> logits
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use runit_backend::{
    AttentionParams, Backend, BackendError, Buffer, HeadNorms, KvCache, KvType, MoeBuffers, MoeFfn,
    Pick, RopeParams, SequenceSpan, StepInputs, StepKey,
};

use crate::weights::{FfnWeights, LayerWeights};
use crate::{Model, ModelError};

/// Receives intermediate tensors for debugging (`--dump-layers`), named like llama.cpp's
/// graph nodes (`attn_norm-0`, `Qcur-0`, `l_out-0`, `result_output`).
pub trait LayerObserver {
    /// `data` is `[rows, width]` row-major.
    fn observe(&mut self, name: &str, rows: usize, width: usize, data: &[f32]);
}

/// One step's input: tokens of one or more sequences.
pub struct Batch<'a> {
    pub tokens: &'a [u32],
    /// Position of each token in its sequence.
    pub positions: &'a [u32],
    /// Which rows belong to which sequence, and where their KV cells are.
    pub spans: &'a [SequenceSpan],
    /// Rows whose logits are wanted, in output order.
    pub logit_rows: &'a [u32],
}

/// Per-layer key and value caches.
pub struct KvState {
    pub keys: Vec<KvCache>,
    pub values: Vec<KvCache>,
    pub n_cells: usize,
    /// Unique id of these caches (part of a captured step's identity).
    id: u64,
}

/// Source of unique ids for scratch buffers and caches: a captured forward pass is only
/// replayed on the very buffers it was recorded with.
fn next_workspace_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl KvState {
    /// Caches of `n_cells` token slots for every layer of `model`.
    pub fn new(model: &Model, n_cells: usize, ty: KvType) -> Result<KvState, ModelError> {
        let width = model.config.kv_width();
        let mut keys = Vec::with_capacity(model.config.block_count);
        let mut values = Vec::with_capacity(model.config.block_count);
        for _ in 0..model.config.block_count {
            keys.push(model.backend.alloc_kv(n_cells, width, ty)?);
            values.push(model.backend.alloc_kv(n_cells, width, ty)?);
        }
        Ok(KvState {
            keys,
            values,
            n_cells,
            id: next_workspace_id(),
        })
    }
}

/// Activation buffers for batches of up to `capacity` tokens, reused every step.
pub struct Scratch {
    pub capacity: usize,
    id: u64,
    x: Buffer,      // [tokens, embd] residual stream
    normed: Buffer, // [tokens, embd]
    q: Buffer,      // [tokens, heads * head_dim]
    k: Buffer,      // [tokens, kv_heads * head_dim]
    v: Buffer,      // [tokens, kv_heads * head_dim]
    attn: Buffer,   // [tokens, heads * head_dim]
    proj: Buffer,   // [tokens, embd]
    gate: Buffer,   // [tokens, ff]
    up: Buffer,     // [tokens, ff]
    moe: Option<MoeScratch>,
    out_x: Buffer,  // [tokens, embd] rows that need logits
    logits: Buffer, // [tokens, vocab]
}

struct MoeScratch {
    router: Buffer,     // [tokens, experts]
    gathered: Buffer,   // [tokens, embd]
    expert_out: Buffer, // [tokens, embd]
}

impl Scratch {
    /// Buffers for batches of up to `capacity` tokens.
    pub fn new(model: &Model, capacity: usize) -> Result<Scratch, ModelError> {
        let c = &model.config;
        let b = &model.backend;
        let t = capacity.max(1);
        let moe = if c.expert_count > 0 {
            Some(MoeScratch {
                router: b.alloc(t * c.expert_count)?,
                gathered: b.alloc(t * c.embedding_length)?,
                expert_out: b.alloc(t * c.embedding_length)?,
            })
        } else {
            None
        };
        Ok(Scratch {
            capacity: t,
            id: next_workspace_id(),
            x: b.alloc(t * c.embedding_length)?,
            normed: b.alloc(t * c.embedding_length)?,
            q: b.alloc(t * c.q_width())?,
            k: b.alloc(t * c.kv_width())?,
            v: b.alloc(t * c.kv_width())?,
            attn: b.alloc(t * c.q_width())?,
            proj: b.alloc(t * c.embedding_length)?,
            gate: b.alloc(t * c.feed_forward_length)?,
            up: b.alloc(t * c.feed_forward_length)?,
            moe,
            out_x: b.alloc(t * c.embedding_length)?,
            logits: b.alloc(t * c.vocab_size)?,
        })
    }
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

    /// The checks and ops of a pass, leaving the logits of `batch.logit_rows` in
    /// `scratch.logits`.
    fn run_pass(
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
            logit_rows: batch.logit_rows,
        };
        // A pass with one row per sequence (decode) is captured once and replayed; prompt
        // chunks vary in length, MoE routing may read the router on the host (the backend
        // says when it does not), and the observer downloads intermediates, so those run op
        // by op.
        let capture = observer.is_none()
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
        let ran = if capture {
            b.run_captured(key, &mut || self.run_layers(batch, kv, scratch, None))
        } else {
            self.run_layers(batch, kv, scratch, observer)
        };
        let ended = b.end_step();
        ran?;
        ended?;
        Ok(())
    }

    /// The ops of one pass, from the embedding to the logits left in `scratch.logits`.
    fn run_layers(
        &self,
        batch: &Batch<'_>,
        kv: &mut KvState,
        s: &mut Scratch,
        mut observer: Option<&mut (dyn LayerObserver + '_)>,
    ) -> Result<(), BackendError> {
        let c = &self.config;
        let b: &dyn Backend = self.backend.as_ref();
        let tokens = batch.tokens.len();
        let embd = c.embedding_length;
        let out_rows = batch.logit_rows.len();
        let last = self.weights.layers.len().saturating_sub(1);
        // Without an observer the fused ops run (fewer launches on a device backend, the
        // same numbers); with one, the primitives, so that every intermediate can be dumped.
        let fused = observer.is_none();
        // Rows of the residual stream at each point: every token, except after the last
        // layer's attention output projection, where (as llama.cpp's `inp_out_ids` does) only
        // the rows whose logits are wanted go on, so that layer's FFN and the output matmul
        // run with as many rows as there are logits (one for generation: the vec_dot order).
        let mut dump = |name: &str, layer: Option<usize>, buf: &Buffer, width: usize| {
            if let Some(obs) = observer.as_deref_mut() {
                let rows = match layer {
                    Some(l) if l == last && !matches!(name, "attn_out" | "kqv_out") => out_rows,
                    _ => tokens,
                };
                let mut host = vec![0.0; rows * width];
                if b.download(buf, &mut host).is_ok() {
                    let full = match layer {
                        Some(l) => format!("{name}-{l}"),
                        None => name.to_string(),
                    };
                    obs.observe(&full, rows, width, &host);
                }
            }
        };
        b.embedding(&self.weights.token_embd, batch.tokens, &mut s.x)?;
        dump("embd", None, &s.x, embd);
        let q_rope = self.rope_params(c.head_count);
        let k_rope = self.rope_params(c.head_count_kv);
        let attention = AttentionParams {
            heads: c.head_count,
            kv_heads: c.head_count_kv,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
            sliding_window: c.sliding_window,
        };
        for (i, layer) in self.weights.layers.iter().enumerate() {
            // Fused: the previous layer's residual add already normed `x` into `normed`.
            if !fused || i == 0 {
                b.rms_norm(
                    &s.x,
                    &layer.attn_norm,
                    c.rms_norm_eps,
                    tokens,
                    &mut s.normed,
                )?;
            }
            dump("attn_norm", Some(i), &s.normed, embd);
            // Per-head q/k norms go into the fused RoPE + KV write (one kernel on a GPU).
            let head_norms = match (&layer.q_norm, &layer.k_norm) {
                (Some(q), Some(k))
                    if fused && q.row_len() == c.head_dim && k.row_len() == c.head_dim =>
                {
                    Some(HeadNorms {
                        q,
                        k,
                        eps: c.rms_norm_eps,
                    })
                }
                _ => None,
            };
            self.project_qkv(layer, tokens, s, head_norms.is_none())?;
            dump("Qcur", Some(i), &s.q, c.q_width());
            dump("Kcur", Some(i), &s.k, c.kv_width());
            dump("Vcur", Some(i), &s.v, c.kv_width());
            let freq_factors = self.weights.rope_freqs.as_ref();
            if fused {
                b.rope_kv_write(
                    &mut s.q,
                    &mut s.k,
                    &s.v,
                    batch.positions,
                    &q_rope,
                    &k_rope,
                    freq_factors,
                    &mut kv.keys[i],
                    &mut kv.values[i],
                    batch.spans,
                    head_norms,
                )?;
            } else {
                b.rope(&mut s.q, batch.positions, &q_rope, freq_factors)?;
                b.rope(&mut s.k, batch.positions, &k_rope, freq_factors)?;
                dump("Qrope", Some(i), &s.q, c.q_width());
                dump("Krope", Some(i), &s.k, c.kv_width());
                b.kv_write(&s.k, &s.v, &mut kv.keys[i], &mut kv.values[i], batch.spans)?;
            }
            if fused {
                b.attention_output(
                    &s.q,
                    &kv.keys[i],
                    &kv.values[i],
                    batch.spans,
                    &attention,
                    &mut s.attn,
                    &layer.attn_output,
                    tokens,
                    &mut s.proj,
                )?;
            } else {
                b.attention(
                    &s.q,
                    &kv.keys[i],
                    &kv.values[i],
                    batch.spans,
                    &attention,
                    &mut s.attn,
                )?;
                dump("kqv_out", Some(i), &s.attn, c.q_width());
                b.matmul(&layer.attn_output, &s.attn, tokens, &mut s.proj)?;
            }
            dump("attn_out", Some(i), &s.proj, embd);
            let rows = if i == last {
                if out_rows == 0 {
                    // No logits wanted: the keys and values were all this pass had to make.
                    return Ok(());
                }
                // [out_rows, embd]: the residual rows into `out_x`, their attention
                // outputs into `normed` (free until the FFN norm), then added.
                b.gather_rows(&s.x, batch.logit_rows, embd, &mut s.out_x)?;
                b.gather_rows(&s.proj, batch.logit_rows, embd, &mut s.normed)?;
                std::mem::swap(&mut s.x, &mut s.out_x);
                std::mem::swap(&mut s.proj, &mut s.normed);
                out_rows
            } else {
                tokens
            };
            if fused {
                b.add_rms_norm(
                    &mut s.x,
                    &s.proj,
                    &layer.ffn_norm,
                    c.rms_norm_eps,
                    rows,
                    &mut s.normed,
                )?;
            } else {
                b.add(&mut s.x, &s.proj, rows * embd)?;
                dump("ffn_inp", Some(i), &s.x, embd);
                b.rms_norm(&s.x, &layer.ffn_norm, c.rms_norm_eps, rows, &mut s.normed)?;
                dump("ffn_norm", Some(i), &s.normed, embd);
            }
            self.feed_forward(layer, rows, s, fused)?;
            if matches!(layer.ffn, FfnWeights::Dense { .. }) {
                dump("ffn_swiglu", Some(i), &s.gate, c.feed_forward_length);
            }
            dump("ffn_out", Some(i), &s.proj, embd);
            if fused {
                // The residual add with the norm after it: the next layer's attention norm
                // into `normed`, or after the last layer the output norm of the logit rows
                // into `out_x` (whose full-width residual rows are no longer needed).
                match self.weights.layers.get(i + 1) {
                    Some(next) => b.add_rms_norm(
                        &mut s.x,
                        &s.proj,
                        &next.attn_norm,
                        c.rms_norm_eps,
                        rows,
                        &mut s.normed,
                    )?,
                    None => b.add_rms_norm(
                        &mut s.x,
                        &s.proj,
                        &self.weights.output_norm,
                        c.rms_norm_eps,
                        rows,
                        &mut s.out_x,
                    )?,
                }
            } else {
                b.add(&mut s.x, &s.proj, rows * embd)?;
                dump("l_out", Some(i), &s.x, embd);
            }
        }
        if out_rows == 0 {
            return Ok(());
        }
        if self.weights.layers.is_empty() {
            b.gather_rows(&s.x, batch.logit_rows, embd, &mut s.out_x)?;
        } else {
            // The last layer swapped the gathered rows into `x` and `proj`; swap back so that
            // a captured pass leaves the scratch as it found it.
            std::mem::swap(&mut s.x, &mut s.out_x);
            std::mem::swap(&mut s.proj, &mut s.normed);
            if fused {
                // The last layer's fused add left the normed logit rows in (what is now) `x`.
                return b.matmul(&self.weights.output, &s.x, out_rows, &mut s.logits);
            }
        }
        b.rms_norm_in_place(
            &mut s.out_x,
            &self.weights.output_norm,
            c.rms_norm_eps,
            out_rows,
        )?;
        b.matmul(&self.weights.output, &s.out_x, out_rows, &mut s.logits)
    }

    fn rope_params(&self, heads: usize) -> RopeParams {
        let c = &self.config;
        RopeParams {
            style: c.arch.rope_style,
            heads,
            head_dim: c.head_dim,
            rotary_dim: c.rope_dim,
            theta: c.rope_theta,
            freq_scale: c.rope_freq_scale,
        }
    }

    /// Q, K, V projections with optional biases and QK-norm, into `s.q`, `s.k`, `s.v`.
    fn project_qkv(
        &self,
        layer: &LayerWeights,
        tokens: usize,
        s: &mut Scratch,
        with_norms: bool,
    ) -> Result<(), BackendError> {
        let c = &self.config;
        let b = self.backend.as_ref();
        // The biases come all three or none (as the weights loader reads them).
        let biases = match (&layer.q_bias, &layer.k_bias, &layer.v_bias) {
            (Some(qb), Some(kb), Some(vb)) => [Some(qb), Some(kb), Some(vb)],
            _ => [None; 3],
        };
        b.matmul_qkv(
            [&layer.q, &layer.k, &layer.v],
            biases,
            &s.normed,
            tokens,
            [&mut s.q, &mut s.k, &mut s.v],
        )?;
        if let (true, Some(qn), Some(kn)) = (with_norms, &layer.q_norm, &layer.k_norm) {
            // Rows are heads for a per-head norm, whole projections for a full-width one.
            let q_rows = tokens * c.q_width() / qn.row_len();
            let k_rows = tokens * c.kv_width() / kn.row_len();
            b.rms_norm_in_place(&mut s.q, qn, c.rms_norm_eps, q_rows)?;
            b.rms_norm_in_place(&mut s.k, kn, c.rms_norm_eps, k_rows)?;
        }
        Ok(())
    }

    /// The FFN of `s.normed` into `s.proj`; a dense one's gate and up projections through
    /// [`Backend::matmul_swiglu`], a mixture of experts through [`Backend::moe_ffn`] when
    /// `fused` (else their primitive sequences).
    fn feed_forward(
        &self,
        layer: &LayerWeights,
        tokens: usize,
        s: &mut Scratch,
        fused: bool,
    ) -> Result<(), BackendError> {
        let c = &self.config;
        let b = self.backend.as_ref();
        match &layer.ffn {
            FfnWeights::Dense { gate, up, down } => {
                if fused {
                    b.matmul_swiglu_down(
                        gate,
                        up,
                        down,
                        &s.normed,
                        tokens,
                        &mut s.up,
                        &mut s.gate,
                        &mut s.proj,
                    )?;
                } else {
                    b.matmul(gate, &s.normed, tokens, &mut s.gate)?;
                    b.matmul(up, &s.normed, tokens, &mut s.up)?;
                    b.silu_mul(&mut s.gate, &s.up, tokens * c.feed_forward_length)?;
                    b.matmul(down, &s.gate, tokens, &mut s.proj)?;
                }
            }
            FfnWeights::Moe {
                router,
                gate,
                up,
                down,
            } => {
                let moe = s.moe.as_mut().expect("MoE scratch exists for MoE models");
                let ffn = MoeFfn {
                    router,
                    gate,
                    up,
                    down,
                    experts: c.expert_count,
                    used: c.expert_used_count,
                    renormalise: c.expert_weights_norm,
                };
                let buffers = MoeBuffers {
                    router: &mut moe.router,
                    gathered: &mut moe.gathered,
                    gate: &mut s.gate,
                    up: &mut s.up,
                    expert_out: &mut moe.expert_out,
                };
                if fused {
                    b.moe_ffn(&ffn, &s.normed, tokens, buffers, &mut s.proj)?;
                } else {
                    runit_backend::unfused::moe_ffn(
                        b,
                        &ffn,
                        &s.normed,
                        tokens,
                        buffers,
                        &mut s.proj,
                    )?;
                }
            }
        }
        Ok(())
    }
}
