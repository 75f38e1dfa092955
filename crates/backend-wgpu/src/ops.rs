//! The primitive ops: host-side checks and the small host tables (ids, RoPE angles, cache
//! cells), then one kernel dispatch each. Fused ops run their default bodies.

use runit_backend::{
    hadamard, Activation, Attention, BackendError, Buffer, BufferCopy, Device, KvCache, KvType,
    KvWrite, OpResult, PrimitiveOps, RmsNorm, RopeParams, ScatterAddRows, Weight,
};

use crate::backend::{grid, rows_grid};
use crate::batch;
use crate::device::{at_least, buffer, kv, weight};
use crate::kernels::{self, KernelSource};
use crate::WgpuBackend;

/// Most workgroups in one dimension of a dispatch.
pub(crate) const MAX_GROUPS: usize = 65_535;

fn f(value: f32) -> u32 {
    value.to_bits()
}

/// Values a norm kernel holds in registers at most (rms_norm.wgsl's HELD_VALUES).
const NORM_HELD_VALUES: usize = 8192;

impl WgpuBackend {
    /// rms_norm.wgsl's `held`: 1 where a norm of rows of `width` values holds each row in
    /// registers (`normalize_held`: a multiple of 4 values, at most [`NORM_HELD_VALUES`],
    /// unless `RUNIT_WGPU_HELD_NORM=0`), 0 where it loops over the row. Every norm kernel
    /// takes the same, so that the plain and fused norms sum in the same order.
    pub(crate) fn norm_held(&self, width: usize) -> u32 {
        let held = width.is_multiple_of(4) && width <= NORM_HELD_VALUES;
        u32::from(self.held_norms && held)
    }

    pub(crate) fn unsupported_kv(&self, cache: &KvCache) -> BackendError {
        BackendError::UnsupportedKv {
            backend: self.name(),
            ty: cache.ty,
            what: "this backend".to_string(),
            supported: "f16, f32, q8_0, q4_0",
        }
    }

    /// The kernel `of` the key and value caches' types, or the error naming the cache whose
    /// type no kernel stores.
    pub(crate) fn cache_kernel(
        &self,
        of: fn(KvType, KvType) -> Option<KernelSource>,
        k_cache: &KvCache,
        v_cache: &KvCache,
    ) -> Result<KernelSource, BackendError> {
        of(k_cache.ty, v_cache.ty).ok_or_else(|| {
            let unsupported = [k_cache, v_cache]
                .into_iter()
                .find(|c| kernels::cache_code(c.ty).is_none());
            self.unsupported_kv(unsupported.unwrap_or(k_cache))
        })
    }

    /// llama.cpp's Hadamard rotation (`runit_backend::hadamard`) of `count` chunks of `n`
    /// values of `x` from chunk `first`, in place.
    pub(crate) fn rotate(
        &self,
        x: &wgpu::Buffer,
        n: usize,
        first: usize,
        count: usize,
    ) -> OpResult {
        if count == 0 {
            return Ok(());
        }
        let [gx, gy, _] = rows_grid(count);
        let scale = 1.0 / (n as f32).sqrt();
        let params = [n as u32, first as u32, count as u32, f(scale), gx];
        self.dispatch(
            "hadamard",
            Self::plain("hadamard"),
            &params,
            &[x],
            [gx, gy, 1],
        )
    }

    /// A copy of the first `len` values of `x` in a new buffer.
    pub(crate) fn scratch_copy(
        &self,
        x: &Buffer,
        len: usize,
        op: &'static str,
    ) -> Result<Buffer, BackendError> {
        let copy = self.alloc(len)?;
        let (source, target) = (buffer(x, op, "x")?, buffer(&copy, op, "copy")?);
        self.copy_bytes(source, 0, target, 0, len as u64 * 4);
        Ok(copy)
    }

    /// The source of one cache's write: `src` itself, or a copy of its first `end_rows` rows
    /// rotated as llama.cpp rotates that cache's rows (quantized caches).
    fn cache_source(
        &self,
        src: &Buffer,
        cache: &KvCache,
        end_rows: usize,
        what: &'static str,
    ) -> Result<Option<Buffer>, BackendError> {
        const OP: &str = "kv_write";
        let Some(n) = hadamard::llama_rotation(cache.ty, cache.role, cache.head_dim) else {
            return Ok(None);
        };
        let width = cache.width;
        let copy = self.scratch_copy(src, end_rows * width, OP)?;
        self.rotate(buffer(&copy, OP, what)?, n, 0, end_rows * width / n)?;
        Ok(Some(copy))
    }
}

/// The cache write's table of (source row, cell) entries of `write`'s spans, checked against
/// the sources and caches, and the rows the sources must hold.
pub(crate) fn cache_entries(
    write: &KvWrite<'_>,
    op: &'static str,
) -> Result<(Vec<u32>, usize), BackendError> {
    let mut pairs = Vec::new();
    let mut end_rows = 0;
    for span in write.spans {
        let end_row = span.first_row.saturating_add(span.rows);
        for (src, cache) in [(write.k, &*write.k_cache), (write.v, &*write.v_cache)] {
            at_least(
                op,
                "k/v elements (rows × cache width)",
                end_row.saturating_mul(cache.width),
                src.len(),
            )?;
            let end = span.start_position.saturating_add(span.rows);
            span.check_cells(op, span.start_position..end, cache.n_cells)?;
        }
        end_rows = end_rows.max(end_row);
        for r in 0..span.rows {
            pairs.push((span.first_row + r) as u32);
            pairs.push(span.cell(span.start_position + r) as u32);
        }
    }
    Ok((pairs, end_rows))
}

/// Invocations of `kv_write_one.wgsl` a row of `cache` takes (`row_units` in kv_write.wgsl):
/// a word of f32 or of two f16, or a block of 32 values.
fn cache_row_invocations(cache: &KvCache) -> usize {
    match cache.ty {
        KvType::F32 => cache.width,
        KvType::F16 => cache.width / 2,
        _ => cache.width / 32,
    }
}

/// The code of `activation` in `gated.wgsl` (`p.kind`).
pub(crate) fn activation_kind(activation: Activation) -> u32 {
    match activation {
        Activation::Silu => 0,
        Activation::GeluTanh => 1,
    }
}

impl PrimitiveOps for WgpuBackend {
    fn embedding(&self, table: &Weight, ids: &[u32], out: &mut Buffer) -> OpResult {
        const OP: &str = "embedding";
        let width = table.row_len();
        let first = table.byte_offset / table.row_bytes().max(1);
        let n_rows = table.rows();
        if let Some(id) = ids.iter().find(|id| **id as usize >= n_rows) {
            return Err(BackendError::Shape {
                op: OP,
                what: "token id (exclusive bound: table rows)",
                expected: n_rows,
                found: *id as usize,
            });
        }
        let kernel =
            || kernels::for_weight(OP, table.ty).ok_or_else(|| self.unsupported(OP, table));
        kernel()?;
        at_least(OP, "out elements", ids.len() * width, out.len())?;
        let gpu = weight(table, OP, "table")?;
        let out = buffer(out, OP, "out")?;
        for chunk in &gpu.chunks {
            let lookups: Vec<u32> = ids
                .iter()
                .enumerate()
                .filter_map(|(token, id)| {
                    let row = first + *id as usize;
                    (chunk.first_row..chunk.first_row + chunk.rows)
                        .contains(&row)
                        .then_some([token as u32, (row - chunk.first_row) as u32])
                })
                .flatten()
                .collect();
            for part in lookups.chunks(2 * MAX_GROUPS) {
                let count = part.len() / 2;
                let params = [width as u32, table.row_bytes() as u32, count as u32];
                let bindings = [(&chunk.buffer).into(), batch::table(part), out.into()];
                self.dispatch_ranges(OP, kernel()?, &params, &bindings, [count as u32, 1, 1])?;
            }
        }
        Ok(())
    }

    fn matmul(&self, w: &Weight, x: &Buffer, tokens: usize, out: &mut Buffer) -> OpResult {
        self.matmul_rows(w, x, tokens, out)
    }

    fn add_bias(&self, x: &mut Buffer, bias: &Weight, tokens: usize) -> OpResult {
        const OP: &str = "add_bias";
        let width = bias.row_len();
        at_least(OP, "x elements", tokens * width, x.len())?;
        let b = self.f32_vector(bias, OP)?;
        let x = buffer(x, OP, "x")?;
        let len = tokens * width;
        let params = [len as u32, width as u32];
        self.dispatch(OP, Self::plain(OP), &params, &[b, x], grid(len))
    }

    fn rms_norm(&self, x: &Buffer, norm: RmsNorm<'_>, rows: usize, out: &mut Buffer) -> OpResult {
        const OP: &str = "rms_norm";
        let width = norm.weight.row_len();
        at_least(OP, "x elements", rows * width, x.len())?;
        at_least(OP, "out elements", rows * width, out.len())?;
        let w = self.f32_vector(norm.weight, OP)?;
        let (x, out) = (buffer(x, OP, "x")?, buffer(out, OP, "out")?);
        if rows == 0 {
            return Ok(());
        }
        let [gx, gy, _] = rows_grid(rows);
        let held = self.norm_held(width);
        let params = [width as u32, rows as u32, f(norm.eps), gx, 0, 0, held];
        let kernel = self.norm_kernel(OP, width);
        self.dispatch(OP, kernel, &params, &[x, w, out], [gx, gy, 1])
    }

    fn rms_norm_in_place(&self, x: &mut Buffer, norm: RmsNorm<'_>, rows: usize) -> OpResult {
        const OP: &str = "rms_norm";
        let len = rows * norm.weight.row_len();
        at_least(OP, "x elements", len, x.len())?;
        let copy = self.alloc(len)?;
        let (source, target) = (buffer(x, OP, "x")?, buffer(&copy, OP, "copy")?);
        self.copy_bytes(source, 0, target, 0, len as u64 * 4);
        self.rms_norm(&copy, norm, rows, x)
    }

    fn rope(
        &self,
        x: &mut Buffer,
        positions: &[u32],
        params: &RopeParams,
        freq_factors: Option<&Weight>,
    ) -> OpResult {
        self.rope_buffers(&[(x, params)], positions, freq_factors)
    }

    fn scale(&self, x: &mut Buffer, factor: f32, len: usize) -> OpResult {
        const OP: &str = "scale";
        at_least(OP, "x elements", len, x.len())?;
        let x = buffer(x, OP, "x")?;
        let params = [len as u32, f(factor)];
        self.dispatch(OP, Self::plain(OP), &params, &[x], grid(len))
    }

    fn add(&self, dst: &mut Buffer, src: &Buffer, len: usize) -> OpResult {
        const OP: &str = "add";
        at_least(OP, "src elements", len, src.len())?;
        at_least(OP, "dst elements", len, dst.len())?;
        let (src, dst) = (buffer(src, OP, "src")?, buffer(dst, OP, "dst")?);
        self.dispatch(OP, Self::plain(OP), &[len as u32], &[src, dst], grid(len))
    }

    fn gated_activation(
        &self,
        activation: Activation,
        gate: &mut Buffer,
        up: &Buffer,
        len: usize,
    ) -> OpResult {
        const OP: &str = "gated_activation";
        at_least(OP, "up elements", len, up.len())?;
        at_least(OP, "gate elements", len, gate.len())?;
        let kind = activation_kind(activation);
        let (up, gate) = (buffer(up, OP, "up")?, buffer(gate, OP, "gate")?);
        let buffers = [up, &self.gelu_table, gate];
        let params = [len as u32, kind];
        self.dispatch(OP, Self::plain("gated"), &params, &buffers, grid(len))
    }

    fn kv_write(&self, write: KvWrite<'_>) -> OpResult {
        const OP: &str = "kv_write";
        let kernel = self.cache_kernel(kernels::kv_write, write.k_cache, write.v_cache)?;
        let (pairs, end_rows) = cache_entries(&write, OP)?;
        let KvWrite {
            k,
            v,
            k_cache,
            v_cache,
            ..
        } = write;
        let entries = pairs.len() / 2;
        if entries == 0 {
            return Ok(());
        }
        let k_rotated = self.cache_source(k, k_cache, end_rows, "k")?;
        let v_rotated = self.cache_source(v, v_cache, end_rows, "v")?;
        let k_source = buffer(k_rotated.as_ref().unwrap_or(k), OP, "k")?;
        let v_source = buffer(v_rotated.as_ref().unwrap_or(v), OP, "v")?;
        let (k_gpu, v_gpu) = (kv(k_cache, OP, "k")?, kv(v_cache, OP, "v")?);
        let (len_k, len_v) = (
            entries * cache_row_invocations(k_cache),
            entries * cache_row_invocations(v_cache),
        );
        let params = [
            len_k as u32,
            len_v as u32,
            k_cache.width as u32,
            v_cache.width as u32,
            0, // zero
        ];
        let bindings = [
            k_source.into(),
            v_source.into(),
            batch::table(&pairs),
            (&k_gpu.buffer).into(),
            (&v_gpu.buffer).into(),
        ];
        self.dispatch_ranges(OP, kernel, &params, &bindings, grid(len_k + len_v))
    }

    fn attention(&self, attention: &Attention<'_>, out: &mut Buffer) -> OpResult {
        self.attention_rows(attention, out, None)
    }

    fn gather_rows(&self, src: &Buffer, rows: &[u32], width: usize, out: &mut Buffer) -> OpResult {
        const OP: &str = "gather_rows";
        let available = src.len().checked_div(width).unwrap_or(0);
        if let Some(row) = rows.iter().find(|row| **row as usize >= available) {
            return Err(BackendError::Shape {
                op: OP,
                what: "row index (exclusive bound)",
                expected: available,
                found: *row as usize,
            });
        }
        let len = rows.len() * width;
        at_least(OP, "out elements", len, out.len())?;
        if len == 0 {
            return Ok(());
        }
        let (src, out) = (buffer(src, OP, "src")?, buffer(out, OP, "out")?);
        let params = [len as u32, width as u32];
        let bindings = [src.into(), batch::table(rows), out.into()];
        self.dispatch_ranges(OP, Self::plain(OP), &params, &bindings, grid(len))
    }

    fn scatter_add_rows(&self, scatter: ScatterAddRows<'_>) -> OpResult {
        const OP: &str = "scatter_add_rows";
        let ScatterAddRows {
            src,
            rows,
            scales,
            width,
            dst,
        } = scatter;
        at_least(OP, "scales", rows.len(), scales.len())?;
        at_least(OP, "src elements", rows.len() * width, src.len())?;
        let available = dst.len().checked_div(width).unwrap_or(0);
        if let Some(row) = rows.iter().find(|row| **row as usize >= available) {
            return Err(BackendError::Shape {
                op: OP,
                what: "row index (exclusive bound)",
                expected: available,
                found: *row as usize,
            });
        }
        if rows.is_empty() || width == 0 {
            return Ok(());
        }
        let (src, dst) = (buffer(src, OP, "src")?, buffer(dst, OP, "dst")?);
        let params = [rows.len() as u32, width as u32];
        let bindings = [
            src.into(),
            batch::table(rows),
            batch::table(scales),
            dst.into(),
        ];
        self.dispatch_ranges(OP, Self::plain(OP), &params, &bindings, grid(width))
    }

    fn copy(&self, copy: BufferCopy<'_>) -> OpResult {
        const OP: &str = "copy";
        let BufferCopy {
            src,
            src_offset,
            dst,
            dst_offset,
            len,
        } = copy;
        at_least(
            OP,
            "src elements",
            src_offset.saturating_add(len),
            src.len(),
        )?;
        at_least(
            OP,
            "dst elements",
            dst_offset.saturating_add(len),
            dst.len(),
        )?;
        let (src, dst) = (buffer(src, OP, "src")?, buffer(dst, OP, "dst")?);
        self.copy_bytes(
            src,
            src_offset as u64 * 4,
            dst,
            dst_offset as u64 * 4,
            len as u64 * 4,
        );
        Ok(())
    }
}
