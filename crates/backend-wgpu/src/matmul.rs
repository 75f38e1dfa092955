//! Matmul: the activations rounded as the CPU's dot products see them (rounding.rs), then per
//! chunk of
//! weight rows: for a prompt (4 tokens or more) the tiled kernel (`matmat.wgsl`, every
//! type), for fewer tokens the word-reading matrix-vector kernel of the type (`matvec.wgsl`,
//! one token per z) or, for the other types, the generic kernel reading values one by one
//! (`matmul.wgsl`), which `with_generic_matmul` also picks for every case.

use std::sync::atomic::Ordering;

use runit_backend::{Activation, BackendError, Buffer, GgmlLayout, OpResult, Weight};
use runit_quant::GgmlType;

use crate::backend::rows_grid;
use crate::batch::{self, Binding, Range, MAX_BINDINGS};
use crate::device::{at_least, buffer, weight};
use crate::kernels::{self, Dot4, KernelSource, MatVecExtra, MATVEC_INT8_TYPES, MAX_PARTS};
use crate::ops::MAX_GROUPS;
use crate::WgpuBackend;

/// Output rows one workgroup of the matrix-vector kernel computes (`ROWS` in matvec.wgsl).
const MATVEC_ROWS: usize = 4;
/// The tiled kernel's tile (`TILE_ROWS`, `TILE_TOKENS` in matmat.wgsl).
const TILE_ROWS: usize = 64;
const TILE_TOKENS: usize = 32;
/// Fewest tokens the tiled kernel runs for; fewer take the matrix-vector kernel per token.
const TILE_MIN_TOKENS: usize = 4;

/// Which matmul kernel runs.
enum Kernel {
    /// `matvec.wgsl` of the type: one token per z, MATVEC_ROWS rows a workgroup.
    MatVec(KernelSource),
    /// `matmat.wgsl`: tiles of TILE_ROWS rows x TILE_TOKENS tokens.
    Tiled(KernelSource),
    /// `matmul.wgsl`: one workgroup per row and token, values read one by one.
    Generic(KernelSource),
    /// `matmul_q0.wgsl`: the CPU's arithmetic, one invocation per output.
    Exact(KernelSource),
}

/// Rows one workgroup of the exact kernel computes.
const EXACT_ROWS: usize = 64;

/// The exact kernel for `w`, if one takes it: the CPU's arithmetic for the weight's type
/// and where ggml-cpu keeps it (a plain buffer: `vec_dot` and tinyBLAS orders; the REPACK
/// buffer: ggml's repacked orders).
pub(crate) fn exact_kernel(exact: bool, w: &Weight) -> Option<KernelSource> {
    if !exact || !w.row_len().is_multiple_of(32) {
        return None;
    }
    if w.ggml_layout() != GgmlLayout::Plain {
        return kernels::matmul_repack(w.ty)
            .filter(|_| w.row_len().is_multiple_of(w.ty.block_size()));
    }
    kernels::matmul_q0(w.ty)
        .or_else(|| kernels::matmul_float(w.ty))
        .or_else(|| kernels::matmul_qk(w.ty).filter(|_| w.row_len().is_multiple_of(256)))
}

/// Bytes of `len` activations in the int8 kernels' layout (quantize_x.wgsl's modes 7 and 8:
/// 288 bytes a group of 256 values).
pub(crate) fn int8_bytes(len: usize) -> u64 {
    len.div_ceil(256) as u64 * 288
}

impl WgpuBackend {
    /// The dot product of the int8 matrix-vector kernel (`matvec_int8.wgsl`) where it
    /// multiplies `tokens` rows of activations by `w`, or `None` where another kernel does.
    pub(crate) fn int8_matvec(&self, w: &Weight, tokens: usize) -> Option<Dot4> {
        let applies = (1..TILE_MIN_TOKENS).contains(&tokens)
            && !self.generic_matmul
            && w.row_len().is_multiple_of(32)
            && MATVEC_INT8_TYPES.contains(&w.ty)
            && exact_kernel(self.exact_matmul, w).is_none();
        self.matvec_int8.filter(|_| applies)
    }

    /// The kernel for `tokens` rows of activations times `w`.
    fn matmul_kernel(&self, w: &Weight, tokens: usize) -> Result<Kernel, BackendError> {
        let unsupported = || self.unsupported("matmul", w);
        if let Some(kernel) = exact_kernel(self.exact_matmul, w) {
            return Ok(Kernel::Exact(kernel));
        }
        if !w.row_len().is_multiple_of(32) || self.generic_matmul {
            let kernel = kernels::for_weight("matmul", w.ty).ok_or_else(unsupported)?;
            return Ok(Kernel::Generic(kernel));
        }
        if tokens >= TILE_MIN_TOKENS {
            let kernel = kernels::for_weight("matmat", w.ty).ok_or_else(unsupported)?;
            return Ok(Kernel::Tiled(kernel));
        }
        let int8 = self.int8_matvec(w, tokens);
        match kernels::matvec(w.ty, self.reduction, int8, self.q6_k_staged) {
            Some(kernel) => Ok(Kernel::MatVec(kernel)),
            None => {
                let kernel = kernels::for_weight("matmul", w.ty).ok_or_else(unsupported)?;
                Ok(Kernel::Generic(kernel))
            }
        }
    }

    /// The groups of tokens (first, count) one matmul dispatch takes: all of them when `x`
    /// and `out` bind whole, else as many as bind within the storage binding limit
    /// (`x_bytes` and `out_bytes` a token), each group starting at an offset the
    /// adapter can bind (the logits of a long batch over a 262,144-token vocabulary are
    /// 1 MiB a token).
    fn token_groups(
        &self,
        tokens: usize,
        [x_bytes, out_bytes]: [usize; 2],
        [x, out]: [&wgpu::Buffer; 2],
    ) -> Result<Vec<(usize, usize)>, BackendError> {
        if x.size().max(out.size()) <= self.max_binding {
            return Ok(vec![(0, tokens)]);
        }
        let align = self.binding_alignment as usize;
        let step = |row_bytes: usize| align / gcd(row_bytes, align);
        let (a, b) = (step(x_bytes), step(out_bytes));
        let unit = a / gcd(a, b) * b;
        let per_group = (self.max_binding as usize / x_bytes.max(out_bytes)) / unit * unit;
        if per_group == 0 {
            return Err(self.device_error(
                "matmul",
                format!(
                    "a token's {x_bytes} bytes of inputs and {out_bytes} bytes of outputs do \
                     not bind within the adapter's storage binding limit of {} bytes at its \
                     offset alignment of {align}",
                    self.max_binding
                ),
            ));
        }
        Ok((0..tokens)
            .step_by(per_group)
            .map(|t0| (t0, per_group.min(tokens - t0)))
            .collect())
    }

    /// `out[t][r] = W[r] · x[t]` for `tokens` rows of `x` (PrimitiveOps::matmul).
    pub(crate) fn matmul_rows(
        &self,
        w: &Weight,
        x: &Buffer,
        tokens: usize,
        out: &mut Buffer,
    ) -> OpResult {
        const OP: &str = "matmul";
        let (n, rows) = (w.row_len(), w.rows());
        at_least(OP, "x elements (tokens × row length)", tokens * n, x.len())?;
        at_least(OP, "out elements (tokens × rows)", tokens * rows, out.len())?;
        self.matmul_kernel(w, tokens)?;
        if tokens > MAX_GROUPS {
            return Err(BackendError::Shape {
                op: OP,
                what: "tokens (at most one dispatch dimension)",
                expected: MAX_GROUPS,
                found: tokens,
            });
        }
        if tokens == 0 {
            return Ok(());
        }
        let gpu = weight(w, OP, "weight")?;
        let rounded = self.activations_as_cpu(w, x, tokens * n)?;
        let (x, out) = (buffer(x, OP, "x")?, buffer(out, OP, "out")?);
        let x = rounded.as_ref().unwrap_or(x);
        let marked = rounded.is_some();
        let first = w.byte_offset / w.row_bytes();
        // Bytes of one token's activations: packed Q8_0 or Q8_K blocks for the exact kernels.
        let exact = exact_kernel(self.exact_matmul, w).is_some();
        // The int8 kernel binds x from its start (its tokens' groups of 256 values need not
        // start on a binding offset) and takes the group's first token as a parameter.
        let int8 = self.int8_matvec(w, tokens).is_some();
        let x_bytes = match w.ty {
            _ if int8 => 0,
            _ if !exact => n * 4,
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => n * 4,
            GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_0 | GgmlType::IQ4_NL => n / 32 * 36,
            GgmlType::Q4_1 | GgmlType::Q5_1 => n / 32 * 40,
            _ => n / 256 * 260,
        };
        // The exact float kernel's order: tinyBLAS where ggml-cpu hands the matmul to it.
        let rows_alone = self.rows_alone.load(Ordering::Relaxed);
        let tiled = exact
            && tokens >= 2
            && !rows_alone
            && match w.ty {
                GgmlType::F32 | GgmlType::F16 => n.is_multiple_of(16) && rows.is_multiple_of(4),
                GgmlType::BF16 => n.is_multiple_of(32) && rows.is_multiple_of(4),
                GgmlType::IQ4_NL => w.ggml_layout() == GgmlLayout::Plain,
                _ => false,
            };
        // The repacked kernels' gemm order: ggml's groups of four activation rows.
        let gemm_rows = match w.ggml_layout() {
            GgmlLayout::Repacked if exact && !rows_alone => tokens - tokens % 4,
            _ => 0,
        };
        for (t0, count) in self.token_groups(tokens, [x_bytes, rows * 4], [x, out])? {
            // Whole buffers where they bind whole, else each group's rows of them.
            let (x, out) = match count == tokens && x.size().max(out.size()) <= self.max_binding {
                true => (Range::whole(x), Range::whole(out)),
                false if int8 => (
                    Range {
                        buffer: x,
                        offset: 0,
                        bytes: x.size().min(int8_bytes(tokens * n)),
                    },
                    Range {
                        buffer: out,
                        offset: (t0 * rows * 4) as u64,
                        bytes: (count * rows * 4) as u64,
                    },
                ),
                false => (
                    Range {
                        buffer: x,
                        offset: (t0 * x_bytes) as u64,
                        bytes: (count * x_bytes) as u64,
                    },
                    Range {
                        buffer: out,
                        offset: (t0 * rows * 4) as u64,
                        bytes: (count * rows * 4) as u64,
                    },
                ),
            };
            for chunk in &gpu.chunks {
                let start = first.max(chunk.first_row);
                let end = (first + rows).min(chunk.first_row + chunk.rows);
                if start >= end {
                    continue;
                }
                let rows_here = end - start;
                let (kernel, groups, last) = match self.matmul_kernel(w, count)? {
                    Kernel::MatVec(kernel) => {
                        let [gx, gy, _] = rows_grid(rows_here.div_ceil(MATVEC_ROWS));
                        (kernel, [gx, gy, count as u32], gx)
                    }
                    Kernel::Generic(kernel) => {
                        let [gx, gy, _] = rows_grid(rows_here);
                        (kernel, [gx, gy, count as u32], gx)
                    }
                    Kernel::Exact(kernel) => {
                        let [gx, gy, _] = rows_grid(rows_here.div_ceil(EXACT_ROWS));
                        (kernel, [gx, gy, count as u32], gx)
                    }
                    Kernel::Tiled(kernel) => {
                        let groups = [
                            rows_here.div_ceil(TILE_ROWS) as u32,
                            count.div_ceil(TILE_TOKENS) as u32,
                            1,
                        ];
                        (kernel, groups, count as u32)
                    }
                };
                // The last word is the grid's row width, or the tiled kernel's token count.
                let params = [
                    n as u32,
                    rows_here as u32,
                    w.row_bytes() as u32,
                    (start - chunk.first_row) as u32,
                    (start - first) as u32,
                    rows as u32,
                    last,
                    u32::from(tiled) + gemm_rows.saturating_sub(t0).min(count) as u32,
                    // The int8 matrix-vector kernel's first token (`token0`); the exact
                    // kernels' `zero`.
                    if int8 { t0 as u32 } else { 0 },
                    0,
                    0,
                    0,
                    // The matrix-vector kernel's parts past the first (none).
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                ];
                let ranges = [Range::whole(&chunk.buffer).into(), x.into(), out.into()];
                self.dispatch_ranges(OP, kernel, &params, &ranges, groups)?;
            }
        }
        if marked {
            self.mark_rounding_current();
        }
        Ok(())
    }

    /// `outs[k][t][r] = ws[k][r] · x[t]` for 2 ..= `MAX_PARTS` weights of one input in one
    /// dispatch of the matrix-vector kernel (`kernels::matvec_parts`), each output equal bit
    /// for bit to its `matmul_rows`. It applies to fewer than TILE_MIN_TOKENS tokens, weights
    /// of one type with a matrix-vector kernel, one row length and each in one chunk, without
    /// the exact or generic matmul, and to buffers that bind whole, on a backend that takes
    /// several weights a dispatch (`WgpuBackend::matvec_parts`). Returns `false`, having
    /// recorded nothing, where it does not apply: the caller then multiplies weight by weight.
    /// With `biases` (each weight's bias, one after another: `joined_biases`), each output
    /// is the product plus its bias, as `add_bias` would leave it. `extra` ([`PartsExtra`])
    /// adds a prologue or an epilogue (one weight for the residual ones); with a norm or an
    /// activation prologue `x` is its input, not the matmul's.
    pub(crate) fn matmul_parts(
        &self,
        ws: &[&Weight],
        x: &Buffer,
        tokens: usize,
        outs: &mut [&mut Buffer],
        biases: Option<&wgpu::Buffer>,
        extra: PartsExtra<'_>,
    ) -> Result<bool, BackendError> {
        const OP: &str = "matmul";
        let Some(w0) = ws.first() else {
            return Ok(false);
        };
        let (ty, n) = (w0.ty, w0.row_len());
        let applies = self.matvec_parts
            && ws.len() == outs.len()
            && (1..TILE_MIN_TOKENS).contains(&tokens)
            && !self.generic_matmul
            && n.is_multiple_of(32)
            && ws.iter().all(|w| {
                w.ty == ty && w.row_len() == n && exact_kernel(self.exact_matmul, w).is_none()
            });
        let int8 = self.int8_matvec(w0, tokens);
        let kernel = match ws.len() {
            1 if biases.is_none() => kernels::matvec(ty, self.reduction, int8, self.q6_k_staged),
            parts => kernels::matvec_parts(
                ty,
                self.reduction,
                parts,
                biases.is_some(),
                int8,
                self.q6_k_staged,
            ),
        };
        // The extra's parameter words (matvec.wgsl's extra0 .. extra2).
        let mut extra_words = [0u32; 3];
        let kernel = match extra {
            PartsExtra::None => kernel.filter(|_| ws.len() > 1),
            PartsExtra::Residual(_) => kernel.and_then(|k| k.with_extra(MatVecExtra::Residual)),
            PartsExtra::Rope {
                head_dim,
                neox,
                cell,
                f16,
                ..
            } => {
                extra_words = [cell, 0, f16];
                let extra = MatVecExtra::Rope { head_dim, neox };
                kernel
                    .and_then(|k| k.with_extra(extra))
                    .filter(|_| tokens == 1)
            }
            PartsExtra::Gated { activation, .. } => {
                let rounding = self.rounding(w0, n).filter(|&(mode, _)| mode == 7);
                let fits = tokens == 1
                    && n <= self.gated_prologue_max
                    && rounding.is_some()
                    && self.workgroup_memory_fits(kernels::rounded_words(n) * 4 + 128 * 16);
                extra_words = [0, 7, crate::ops::activation_kind(activation)];
                let extra = MatVecExtra::GatedResidual { width: n as u32 };
                kernel.and_then(|k| k.with_extra(extra)).filter(|_| fits)
            }
            PartsExtra::Norm { eps, .. } => {
                let lanes = self.norm_lanes(n);
                let rounding = self
                    .rounding(w0, n)
                    .filter(|&(mode, _)| mode == 7 || mode == 8);
                let fits = tokens == 1
                    && !self.subgroup_reductions
                    && self.prologue_fits(n, lanes)
                    && rounding.is_some();
                extra_words = [
                    eps.to_bits(),
                    rounding.map_or(0, |r| r.0),
                    self.norm_held(n),
                ];
                let width = n as u32;
                let extra = MatVecExtra::Norm { lanes, width };
                kernel.and_then(|k| k.with_extra(extra)).filter(|_| fits)
            }
        };
        let (Some(kernel), true) = (kernel, applies) else {
            return Ok(false);
        };
        // Each weight's chunk and its first row there, and its output (in arrays: a decode
        // step makes two of these dispatches a layer), the input in the unused places.
        let parts = ws.len();
        let x_buffer = buffer(x, OP, "x")?;
        let mut chunks = [(x_buffer, 0); MAX_PARTS];
        let mut out_buffers = [x_buffer; MAX_PARTS];
        for (k, (w, out)) in ws.iter().zip(outs.iter()).enumerate() {
            at_least(OP, "x elements (tokens × row length)", tokens * n, x.len())?;
            at_least(
                OP,
                "out elements (tokens × rows)",
                tokens * w.rows(),
                out.len(),
            )?;
            let first = w.byte_offset / w.row_bytes();
            let gpu = weight(w, OP, "weight")?;
            let chunk = gpu
                .chunks
                .iter()
                .find(|c| c.first_row <= first && first + w.rows() <= c.first_row + c.rows);
            match chunk {
                Some(chunk) => chunks[k] = (&chunk.buffer, first - chunk.first_row),
                None => return Ok(false),
            }
            out_buffers[k] = buffer(out, OP, "out")?;
        }
        if std::iter::once(x_buffer)
            .chain(out_buffers[..parts].iter().copied())
            .any(|b| b.size() > self.max_binding)
        {
            return Ok(false);
        }
        let rounded = match extra {
            PartsExtra::Norm { .. } | PartsExtra::Gated { .. } => None,
            _ => self.activations_as_cpu(w0, x, tokens * n)?,
        };
        let x_bound = rounded.as_ref().unwrap_or(x_buffer);
        // Part 0 in the first words (as `matmul_rows` fills them), parts 1.. after the exact
        // kernels' four: (rows, first row in the chunk, output row length, first workgroup).
        let mut params = [0u32; 20];
        let mut groups = 0;
        for (k, (w, (_, row0))) in ws.iter().zip(&chunks).enumerate() {
            let rows = w.rows() as u32;
            match k {
                0 => {
                    let words = [n as u32, rows, w.row_bytes() as u32, *row0 as u32, 0, rows];
                    params[..6].copy_from_slice(&words);
                }
                _ => {
                    let at = 12 + 4 * (k - 1);
                    params[at..at + 4].copy_from_slice(&[rows, *row0 as u32, rows, groups]);
                }
            }
            groups += w.rows().div_ceil(MATVEC_ROWS) as u32;
        }
        let [gx, gy, _] = rows_grid(groups as usize);
        params[6] = gx;
        params[9..12].copy_from_slice(&extra_words);
        // Part 0's weight, x, part 0's output, then each later part's weight and output,
        // the biases, then the extra's buffers.
        let mut buffers = [x_bound; 4 + 2 * MAX_PARTS];
        buffers[0] = chunks[0].0;
        buffers[2] = out_buffers[0];
        for k in 1..parts {
            buffers[1 + 2 * k] = chunks[k].0;
            buffers[2 + 2 * k] = out_buffers[k];
        }
        let mut bound = 1 + 2 * parts;
        if let Some(biases) = biases {
            buffers[bound] = biases;
            bound += 1;
        }
        match extra {
            PartsExtra::None | PartsExtra::Rope { .. } => {}
            PartsExtra::Residual(residual) => {
                buffers[bound] = buffer(residual, OP, "residual")?;
                bound += 1;
            }
            PartsExtra::Gated { residual, up, .. } => {
                at_least(OP, "up elements", n, up.len())?;
                buffers[bound] = buffer(residual, OP, "residual")?;
                buffers[bound + 1] = buffer(up, OP, "up")?;
                buffers[bound + 2] = &self.gelu_table;
                bound += 3;
            }
            PartsExtra::Norm { weight, normed, .. } => {
                at_least(OP, "normed elements", n, normed.len())?;
                buffers[bound] = self.f32_vector(weight, OP)?;
                buffers[bound + 1] = buffer(normed, OP, "normed")?;
                bound += 2;
            }
        }
        let mut bindings = [Binding::Table(&[]); MAX_BINDINGS];
        for (binding, buffer) in bindings.iter_mut().zip(&buffers[..bound]) {
            *binding = Binding::from(*buffer);
        }
        if let PartsExtra::Rope {
            angles,
            k_cache,
            v_cache,
            ..
        } = extra
        {
            bindings[bound] = batch::table(angles);
            bindings[bound + 1] = k_cache.into();
            bindings[bound + 2] = v_cache.into();
            bound += 3;
        }
        // A norm prologue beside three weights and their biases binds ten storage buffers:
        // more than the least adapters grant (8) take the ops apart.
        if bound as u64 > u64::from(self.device.limits().max_storage_buffers_per_shader_stage) {
            return Ok(false);
        }
        self.dispatch_ranges(
            OP,
            kernel,
            &params,
            &bindings[..bound],
            [gx, gy, tokens as u32],
        )?;
        if rounded.is_some() {
            self.mark_rounding_current();
        }
        Ok(true)
    }
}

fn gcd(a: usize, b: usize) -> usize {
    match b {
        0 => a,
        _ => gcd(b, a % b),
    }
}

/// What [`WgpuBackend::matmul_parts`] does besides the products.
#[derive(Clone, Copy)]
pub(crate) enum PartsExtra<'a> {
    None,
    /// Each output also added to this buffer (one weight): `FusedOps::attention_output_residual`
    /// and the down projection of `FusedOps::norm_gated_ffn_residual`.
    Residual(&'a Buffer),
    /// x is the residual stream's row (one token), normalized by `weight` (`eps`) inside the
    /// dispatch, the norm also written to `normed` (`kernels::MatVecExtra::Norm`).
    Norm {
        weight: &'a Weight,
        eps: f32,
        normed: &'a Buffer,
    },
    /// RoPE of Q's and K's rows and the cache write of K's and V's in the epilogue of the
    /// three projections (one token, `kernels::MatVecExtra::Rope`): the token's angles
    /// (`half` (cos, sin) pairs), its cell, and bit 0 (keys) and 1 (values) set for f16
    /// caches (else f32).
    Rope {
        angles: &'a [f32],
        k_cache: &'a wgpu::Buffer,
        v_cache: &'a wgpu::Buffer,
        cell: u32,
        head_dim: u32,
        neox: bool,
        f16: u32,
    },
    /// x is the gate's output (one token): the activation with `up` made and rounded inside
    /// the dispatch (`kernels::MatVecExtra::GatedResidual`), each output also added to
    /// `residual`.
    Gated {
        residual: &'a Buffer,
        up: &'a Buffer,
        activation: Activation,
    },
}
