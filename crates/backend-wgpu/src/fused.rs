//! The fused ops that save dispatches: the residual add with the next norm, and with it the
//! rounding of the norm's results that the matmul reading them took the last time
//! (`WgpuBackend::add_rms_norm_rows`); RoPE of the queries and keys and the cache write of
//! keys and values in one dispatch (`WgpuBackend::rope_kv_write_rows`; where a cache rotates
//! its rows, RoPE of both in one dispatch, then the write); the one-chunk attention with the
//! rounding of its output for the output projection (`WgpuBackend::attention_rows`); the
//! gated activation with the rounding of its results for down
//! (`WgpuBackend::gated_activation_rounded`); at decode, the Q, K and V projections in one
//! matrix-vector dispatch (their three biases in one more), and gate and up in another
//! (`WgpuBackend::matmul_parts`); where V's type is not Q's and K's, Q and K in one and V
//! in another, then their biases in one dispatch. Each
//! result equals the primitive sequence's (`runit_backend::unfused`) bit for bit: the
//! kernels share those ops' functions (tests/fused.rs compares them).
//! `RUNIT_WGPU_FUSED=0` ([`WgpuBackend::without_fused_ops`]) runs the primitive sequences.

use runit_backend::{
    unfused, AddRmsNorm, AttentionOutput, Buffer, FusedOps, GatedFfnRun, NormFfnResidual,
    NormInput, OpResult, PrimitiveOps, Projection, RopeKvWrite, Weight,
};

use runit_backend::BackendError;
use wgpu::util::DeviceExt;

use crate::backend::grid;
use crate::device::{at_least, buffer, weight};
use crate::matmul::PartsExtra;
use crate::rope::same_angles;
use crate::WgpuBackend;

impl FusedOps for WgpuBackend {
    fn add_rms_norm(&self, op: AddRmsNorm<'_>) -> OpResult {
        const OP: &str = "add_rms_norm";
        if !self.fused_ops {
            return unfused::add_rms_norm(self, op);
        }
        let AddRmsNorm {
            x,
            delta,
            norm,
            rows,
            out,
        } = op;
        let width = norm.weight.row_len();
        let len = rows * width;
        at_least(OP, "delta elements", len, delta.len())?;
        at_least(OP, "x elements", len, x.len())?;
        at_least(OP, "out elements", len, out.len())?;
        let w = self.f32_vector(norm.weight, OP)?;
        let (x, delta, out) = (
            buffer(x, OP, "x")?,
            buffer(delta, OP, "delta")?,
            buffer(out, OP, "out")?,
        );
        if rows == 0 {
            return Ok(());
        }
        self.add_rms_norm_rows([x, w, out, delta], width, rows, norm.eps)
    }

    fn rope_kv_write(&self, mut op: RopeKvWrite<'_>) -> OpResult {
        if !self.fused_ops {
            return unfused::rope_kv_write(self, op);
        }
        unfused::qk_norms_in_place(self, &mut op)?;
        if self.rope_kv_write_rows(&mut op)? {
            return Ok(());
        }
        if same_angles(op.q_rope, op.k_rope) {
            let xs = [(&*op.q, op.q_rope), (&*op.k, op.k_rope)];
            self.rope_buffers(&xs, op.positions, op.freq_factors)?;
        } else {
            self.rope(op.q, op.positions, op.q_rope, op.freq_factors)?;
            self.rope(op.k, op.positions, op.k_rope, op.freq_factors)?;
        }
        self.kv_write(op.kv_write())
    }

    fn qkv_rope_kv_write(
        &self,
        projections: [Projection<'_>; 3],
        x: &Buffer,
        mut op: RopeKvWrite<'_>,
    ) -> OpResult {
        if self.qkv_rope_epilogue(&projections, x, &mut op)? {
            return Ok(());
        }
        let tokens = op.positions.len();
        self.matmul_qkv(projections, x, tokens, [&mut *op.q, &mut *op.k, &mut *op.v])?;
        self.rope_kv_write(op)
    }

    fn matmul_qkv(
        &self,
        projections: [Projection<'_>; 3],
        x: &Buffer,
        tokens: usize,
        outs: [&mut Buffer; 3],
    ) -> OpResult {
        let mut outs = outs;
        let weights = projections.map(|projection| projection.weight);
        let biases = match self.fused_ops {
            true => self.epilogue_biases(&projections)?,
            false => None,
        };
        if let Some(biases) = &biases {
            if self.matmul_parts(
                &weights,
                x,
                tokens,
                &mut outs,
                Some(biases),
                PartsExtra::None,
            )? {
                return Ok(());
            }
        }
        if !self.fused_ops {
            return unfused::matmul_qkv(self, projections, x, tokens, outs);
        }
        if !self.matmul_parts(&weights, x, tokens, &mut outs, None, PartsExtra::None)? {
            // Weights no one dispatch takes (Q4_K_M's Q6_K V beside Q4_K Q and K in half the
            // layers): Q and K in one where they can be, V alone, all before any bias, so
            // that the activations' rounding the first makes serves the others (a bias
            // dispatch between two matmuls made the next round them again: two quantize_x a
            // layer).
            let [q, k, v] = &mut outs;
            let mut qk = [&mut **q, &mut **k];
            if !self.matmul_parts(&weights[..2], x, tokens, &mut qk, None, PartsExtra::None)? {
                self.matmul(weights[0], x, tokens, qk[0])?;
                self.matmul(weights[1], x, tokens, qk[1])?;
            }
            self.matmul(weights[2], x, tokens, v)?;
        }
        if let [Some(b0), Some(b1), Some(b2)] = projections.map(|p| p.bias) {
            return self.add_biases([b0, b1, b2], outs, tokens);
        }
        for (projection, out) in projections.iter().zip(outs) {
            if let Some(bias) = projection.bias {
                self.add_bias(out, bias, tokens)?;
            }
        }
        Ok(())
    }

    fn attention_output(&self, op: AttentionOutput<'_>) -> OpResult {
        let next = Some((op.projection, op.tokens)).filter(|_| self.fused_ops);
        self.attention_rows(&op.attention, op.attn, next)?;
        self.matmul(op.projection, op.attn, op.tokens, op.out)
    }

    fn norms_in_matmuls(&self, width: usize) -> bool {
        // The int8 matrix-vector dispatches of several weights take the norm (and the
        // shared-memory norm sum it repeats); a row too wide keeps the add-and-norm order.
        self.fused_ops
            && self.matvec_parts
            && self.matvec_int8.is_some()
            && !self.subgroup_reductions
            && self.prologue_fits(width, self.norm_lanes(width))
    }

    fn norm_matmul_qkv(
        &self,
        input: NormInput<'_>,
        projections: [Projection<'_>; 3],
        outs: [&mut Buffer; 3],
    ) -> OpResult {
        let mut outs = outs;
        let weights = projections.map(|projection| projection.weight);
        let biases = self.epilogue_biases(&projections)?;
        if biases.is_none() && projections.iter().any(|p| p.bias.is_some()) {
            // Biases no epilogue adds: the norm and the products as two ops.
            return unfused::norm_matmul_qkv(self, input, projections, outs);
        }
        let extra = PartsExtra::Norm {
            weight: input.norm.weight,
            eps: input.norm.eps,
            normed: input.normed,
        };
        let (x, rows) = (input.x, input.rows);
        let fused = self.norms_in_matmuls(input.norm.weight.row_len())
            && self.matmul_parts(&weights, x, rows, &mut outs, biases.as_ref(), extra)?;
        match fused {
            true => Ok(()),
            false => unfused::norm_matmul_qkv(self, input, projections, outs),
        }
    }

    fn attention_output_residual(&self, op: AttentionOutput<'_>, x: &mut Buffer) -> OpResult {
        if !self.fused_ops {
            return unfused::attention_output_residual(self, op, x);
        }
        let AttentionOutput {
            attention,
            attn,
            projection,
            tokens,
            out,
        } = op;
        self.attention_rows(&attention, attn, Some((projection, tokens)))?;
        self.projection_residual(projection, attn, tokens, out, x)
    }

    fn norm_gated_ffn_residual(&self, op: NormFfnResidual<'_>) -> OpResult {
        let width = op.norm.weight.row_len();
        if !self.norms_in_matmuls(width) {
            return unfused::norm_gated_ffn_residual(self, op);
        }
        let NormFfnResidual {
            x,
            norm,
            normed,
            ffn,
            tokens,
            up,
            hidden,
            delta,
        } = op;
        // Gate and up with the norm in their prologue, else the norm, then the two.
        let extra = PartsExtra::Norm {
            weight: norm.weight,
            eps: norm.eps,
            normed,
        };
        let mut outs = [&mut *hidden, &mut *up];
        if !self.matmul_parts(&[ffn.gate, ffn.up], x, tokens, &mut outs, None, extra)? {
            self.rms_norm(x, norm, tokens, normed)?;
            let mut run = GatedFfnRun {
                ffn,
                x: normed,
                tokens,
                up: &mut *up,
                hidden: &mut *hidden,
            };
            self.gate_and_up(&mut run)?;
        }
        // The activation inside down's dispatch, else with the rounding for down, then down.
        let extra = PartsExtra::Gated {
            residual: x,
            up,
            activation: ffn.activation,
        };
        if self.matmul_parts(&[ffn.down], hidden, tokens, &mut [&mut *delta], None, extra)? {
            return Ok(());
        }
        let len = tokens * ffn.gate.rows();
        if !self.gated_activation_rounded(ffn.activation, hidden, up, len, ffn.down)? {
            self.gated_activation(ffn.activation, hidden, up, len)?;
        }
        self.projection_residual(ffn.down, hidden, tokens, delta, x)
    }

    fn gated_ffn_hidden(&self, mut run: GatedFfnRun<'_>) -> OpResult {
        if !self.fused_ops {
            return unfused::gated_ffn_hidden(self, run);
        }
        self.gate_and_up(&mut run)?;
        let len = run.tokens * run.ffn.gate.rows();
        self.gated_activation(run.ffn.activation, run.hidden, run.up, len)
    }

    fn gated_ffn(&self, mut run: GatedFfnRun<'_>, out: &mut Buffer) -> OpResult {
        let (ffn, tokens) = (run.ffn, run.tokens);
        if !self.fused_ops {
            unfused::gated_ffn_hidden(self, run.reborrow())?;
            return self.matmul(ffn.down, run.hidden, tokens, out);
        }
        self.gate_and_up(&mut run)?;
        let len = tokens * ffn.gate.rows();
        // The activation, with the rounding of its results for down where down takes one.
        if !self.gated_activation_rounded(ffn.activation, run.hidden, run.up, len, ffn.down)? {
            self.gated_activation(ffn.activation, run.hidden, run.up, len)?;
        }
        self.matmul(ffn.down, run.hidden, tokens, out)
    }
}

/// Joined biases a backend keeps at most (`WgpuBackend::joined_biases`).
const MAX_JOINED_BIASES: usize = 1024;

impl WgpuBackend {
    /// The Q/K/V biases joined for the matrix-vector epilogue (`matmul_parts`' `biased`),
    /// where all three have one as long as their weight's rows (the epilogue adds bias
    /// element r to row r) and the epilogue is on; else `None`.
    pub(crate) fn epilogue_biases(
        &self,
        projections: &[Projection<'_>; 3],
    ) -> Result<Option<wgpu::Buffer>, BackendError> {
        let fits = projections
            .iter()
            .all(|p| p.bias.is_some_and(|bias| bias.row_len() == p.weight.rows()));
        match projections.map(|p| p.bias) {
            [Some(b0), Some(b1), Some(b2)] if self.bias_epilogue && fits => {
                self.joined_biases([b0, b1, b2])
            }
            _ => Ok(None),
        }
    }

    /// `out = w · input` and `x += out`: one dispatch where the matrix-vector kernel takes
    /// the residual add in its epilogue, else the matmul and the add.
    fn projection_residual(
        &self,
        w: &Weight,
        input: &Buffer,
        tokens: usize,
        out: &mut Buffer,
        x: &mut Buffer,
    ) -> OpResult {
        let extra = PartsExtra::Residual(x);
        if self.matmul_parts(&[w], input, tokens, &mut [&mut *out], None, extra)? {
            return Ok(());
        }
        self.matmul(w, input, tokens, out)?;
        self.add(x, out, tokens * w.rows())
    }

    /// The gate and up products of `run` into its `hidden` and `up`: one dispatch where
    /// `matmul_parts` applies, else a matmul each.
    fn gate_and_up(&self, run: &mut GatedFfnRun<'_>) -> OpResult {
        let (ffn, x, tokens) = (run.ffn, run.x, run.tokens);
        let mut outs = [&mut *run.hidden, &mut *run.up];
        if self.matmul_parts(
            &[ffn.gate, ffn.up],
            x,
            tokens,
            &mut outs,
            None,
            PartsExtra::None,
        )? {
            return Ok(());
        }
        self.matmul(ffn.gate, x, tokens, run.hidden)?;
        self.matmul(ffn.up, x, tokens, run.up)
    }

    /// The three projections' biases one after another in one buffer, for the Q/K/V
    /// dispatch to add (`matmul_parts`), made from their host copies the first time and kept
    /// by their buffers; `None` where a bias has no host copy.
    fn joined_biases(&self, biases: [&Weight; 3]) -> Result<Option<wgpu::Buffer>, BackendError> {
        const OP: &str = "add_bias";
        let mut buffers = [&self.gelu_table; 3];
        for (slot, bias) in buffers.iter_mut().zip(biases) {
            *slot = self.f32_vector(bias, OP)?;
        }
        let mut joined = self.joined_biases.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, buffer)) = joined.iter().find(|(of, _)| of.iter().eq(buffers)) {
            return Ok(Some(buffer.clone()));
        }
        let mut values = Vec::new();
        for bias in biases {
            match &weight(bias, OP, "bias")?.host {
                Some(host) => values.extend_from_slice(&host[..bias.row_len()]),
                None => return Ok(None),
            }
        }
        // A backend serving model after model keeps at most this many (about one a layer).
        if joined.len() >= MAX_JOINED_BIASES {
            joined.clear();
        }
        let buffer = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(OP),
                contents: bytemuck::cast_slice(&values),
                usage: wgpu::BufferUsages::STORAGE,
            });
        joined.push((buffers.map(Clone::clone), buffer.clone()));
        Ok(Some(buffer))
    }

    /// `add_bias` of each of the three projections' biases to its output, in one dispatch
    /// (add_bias3.wgsl: the same additions).
    fn add_biases(&self, biases: [&Weight; 3], outs: [&mut Buffer; 3], tokens: usize) -> OpResult {
        const OP: &str = "add_bias";
        let mut params = [0u32; 6];
        let mut bindings = Vec::with_capacity(6);
        for (n, (bias, out)) in biases.iter().zip(outs).enumerate() {
            let width = bias.row_len();
            at_least(OP, "x elements", tokens * width, out.len())?;
            params[n] = (tokens * width) as u32;
            params[3 + n] = width as u32;
            bindings.push(self.f32_vector(bias, OP)?);
            bindings.push(buffer(out, OP, "x")?);
        }
        let len = params[..3].iter().map(|&l| l as usize).sum();
        self.dispatch(OP, Self::plain("add_bias3"), &params, &bindings, grid(len))
    }
}
