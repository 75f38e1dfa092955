//! The backend contract on [`CpuBackend`]: storage management here, each op in `ops/`.

use std::sync::Arc;

use runit_backend::turbo::TurboLayout;
use runit_backend::{
    pick, Activation, Attention, AttentionOutput, BackendError, Buffer, BufferCopy, Device,
    FusedOps, GatedFfnRun, KvCache, KvRole, KvType, KvWrite, Op, OpResult, Pick, PrimitiveOps,
    Projection, RmsNorm, RopeKvWrite, RopeParams, ScatterAddRows, StepInputs, Weight, WeightSource,
};
use runit_quant::GgmlType;

use crate::cells::Cells;
use crate::ops;
use crate::storage::{
    at_least, data, data_mut, exactly, packed_len, product, CpuBuffer, CpuKv, CpuWeight, TurboCells,
};
use crate::CpuBackend;

/// The picks shared between chunks that each write one of them.
struct SharedPicks(*mut Pick);
// SAFETY: each chunk writes only its own pick.
unsafe impl Sync for SharedPicks {}

impl SharedPicks {
    /// Writes pick `index` (a method, so closures capture the whole wrapper).
    ///
    /// # Safety
    /// `index` lies inside the picks and no other chunk writes it.
    unsafe fn write(&self, index: usize, pick: Pick) {
        // SAFETY: the caller's contract.
        unsafe { self.0.add(index).write(pick) }
    }
}

/// A zeroed vector of `len` elements, or an out-of-memory error.
fn zeroed<T: Clone>(len: usize, zero: T) -> Result<Vec<T>, BackendError> {
    let mut values = Vec::new();
    values
        .try_reserve_exact(len)
        .map_err(|_| BackendError::OutOfMemory {
            backend: "cpu".to_string(),
            bytes: len.saturating_mul(std::mem::size_of::<T>()),
            available: 0,
        })?;
    values.resize(len, zero);
    Ok(values)
}

impl Device for CpuBackend {
    fn name(&self) -> String {
        "cpu".to_string()
    }

    fn supports(&self, op: Op, ty: GgmlType) -> bool {
        match op {
            Op::Embedding => runit_quant::can_dequantize(ty),
            Op::MatMul => ops::linear::supports(ty),
            _ => false,
        }
    }

    fn alloc(&self, len: usize) -> Result<Buffer, BackendError> {
        Ok(Buffer::new(len, Box::new(CpuBuffer(zeroed(len, 0.0f32)?))))
    }

    fn upload(&self, buffer: &mut Buffer, values: &[f32]) -> OpResult {
        let target = data_mut(buffer, "upload", "buffer")?;
        at_least("upload", "buffer elements", values.len(), target.len())?;
        target[..values.len()].copy_from_slice(values);
        Ok(())
    }

    fn download(&self, buffer: &Buffer, out: &mut [f32]) -> OpResult {
        let source = data(buffer, "download", "buffer")?;
        at_least("download", "buffer elements", out.len(), source.len())?;
        out.copy_from_slice(&source[..out.len()]);
        Ok(())
    }

    fn load_weight(&self, source: WeightSource<'_>) -> Result<Weight, BackendError> {
        const OP: &str = "load_weight";
        let (ty, shape, range) = (source.ty, source.shape, source.range.clone());
        let expected = packed_len(ty, shape).ok_or(BackendError::Shape {
            op: OP,
            what: "row length (whole blocks of the type)",
            expected: ty.block_size(),
            found: shape.first().copied().unwrap_or(0),
        })?;
        exactly(OP, "tensor bytes", expected, range.len())?;
        at_least(
            OP,
            "host memory bytes (range end)",
            range.end,
            source.memory.bytes().len(),
        )?;
        if range.start > range.end {
            return Err(BackendError::Shape {
                op: OP,
                what: "range start (at most its end)",
                expected: range.end,
                found: range.start,
            });
        }
        let memory = Arc::clone(&source.memory);
        Ok(Weight::new(&source, Arc::new(CpuWeight { memory, range })))
    }

    fn alloc_kv(
        &self,
        n_cells: usize,
        width: usize,
        head_dim: usize,
        ty: KvType,
        role: KvRole,
    ) -> Result<KvCache, BackendError> {
        let row_bytes = ty
            .row_bytes(width, role)
            .ok_or_else(|| BackendError::UnsupportedKv {
                backend: "cpu".to_string(),
                ty,
                what: format!("rows of {width} values"),
                supported: "f16, f32, q8_0, q4_0, tq4, tq3",
            })?;
        if let Err(error) = ty.check_head_dim(head_dim) {
            return Err(BackendError::UnsupportedKv {
                backend: "cpu".to_string(),
                ty,
                what: error.to_string(),
                supported: "f16, f32, q8_0, q4_0, tq4, tq3",
            });
        }
        if !width.is_multiple_of(head_dim) {
            return Err(BackendError::Shape {
                op: "alloc_kv",
                what: "width (a multiple of head_dim)",
                expected: head_dim,
                found: width,
            });
        }
        let len = product("alloc_kv", "cells × width", n_cells, width)?;
        let out_of_memory = || BackendError::OutOfMemory {
            backend: "cpu".to_string(),
            bytes: n_cells.saturating_mul(row_bytes),
            available: 0,
        };
        let blocks = len / ty.block_size();
        let cells = match ty {
            KvType::F16 => CpuKv::F16(Cells::zeroed(len).ok_or_else(out_of_memory)?),
            KvType::F32 => CpuKv::F32(Cells::zeroed(len).ok_or_else(out_of_memory)?),
            KvType::Q8_0 => CpuKv::Q8_0(Cells::zeroed(blocks).ok_or_else(out_of_memory)?),
            KvType::Q4_0 => CpuKv::Q4_0(Cells::zeroed(blocks).ok_or_else(out_of_memory)?),
            KvType::Tq4 | KvType::Tq3 => {
                let bits = if ty == KvType::Tq4 { 4 } else { 3 };
                let layout = TurboLayout::new(bits, role);
                CpuKv::Turbo(TurboCells {
                    bytes: n_cells
                        .checked_mul(row_bytes)
                        .and_then(Cells::zeroed)
                        .ok_or_else(out_of_memory)?,
                    layout,
                    blocks: width / ty.block_size(),
                    mean: None,
                })
            }
        };
        Ok(KvCache::new(
            n_cells,
            width,
            head_dim,
            ty,
            role,
            Box::new(cells),
        ))
    }

    fn center_keys(&self, cache: &mut KvCache, mean: &[f32]) -> OpResult {
        const OP: &str = "center_keys";
        exactly(OP, "mean (one value a channel)", cache.width, mean.len())?;
        let (ty, role) = (cache.ty, cache.role);
        match cache.payload_mut::<CpuKv>() {
            Some(CpuKv::Turbo(cells)) if role == KvRole::Keys => {
                cells.mean = Some(mean.to_vec());
                Ok(())
            }
            Some(_) => Err(BackendError::UnsupportedKv {
                backend: "cpu".to_string(),
                ty,
                what: format!("centered {role:?}"),
                supported: "tq4, tq3 keys",
            }),
            None => Err(BackendError::ForeignBuffer {
                op: OP,
                what: "cache",
            }),
        }
    }

    fn synchronize(&self) -> OpResult {
        Ok(())
    }

    fn reads_weights_from_host(&self) -> bool {
        true
    }

    fn begin_step(&self, inputs: &StepInputs<'_>) -> OpResult {
        self.rows_alone
            .store(inputs.rows_alone, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn end_step(&self) -> OpResult {
        self.rows_alone
            .store(false, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

impl PrimitiveOps for CpuBackend {
    fn embedding(&self, table: &Weight, ids: &[u32], out: &mut Buffer) -> OpResult {
        ops::embedding::embedding(self, table, ids, out)
    }

    fn matmul(&self, weight: &Weight, x: &Buffer, tokens: usize, out: &mut Buffer) -> OpResult {
        ops::linear::matmul(self, weight, x, tokens, out)
    }

    fn add_bias(&self, x: &mut Buffer, bias: &Weight, tokens: usize) -> OpResult {
        ops::elementwise::add_bias(self, x, bias, tokens)
    }

    fn rms_norm(&self, x: &Buffer, norm: RmsNorm<'_>, rows: usize, out: &mut Buffer) -> OpResult {
        ops::norm::rms_norm(self, x, norm, rows, out)
    }

    fn rms_norm_in_place(&self, x: &mut Buffer, norm: RmsNorm<'_>, rows: usize) -> OpResult {
        ops::norm::rms_norm_in_place(self, x, norm, rows)
    }

    fn rope(
        &self,
        x: &mut Buffer,
        positions: &[u32],
        params: &RopeParams,
        freq_factors: Option<&Weight>,
    ) -> OpResult {
        ops::rope::rope(self, x, positions, params, freq_factors)
    }

    fn scale(&self, x: &mut Buffer, factor: f32, len: usize) -> OpResult {
        ops::elementwise::scale(self, x, factor, len)
    }

    fn add(&self, dst: &mut Buffer, src: &Buffer, len: usize) -> OpResult {
        ops::elementwise::add(self, dst, src, len)
    }

    fn gated_activation(
        &self,
        activation: Activation,
        gate: &mut Buffer,
        up: &Buffer,
        len: usize,
    ) -> OpResult {
        ops::elementwise::gated_activation(self, activation, gate, up, len)
    }

    fn kv_write(&self, write: KvWrite<'_>) -> OpResult {
        ops::kv_write::kv_write(write)
    }

    fn attention(&self, attention: &Attention<'_>, out: &mut Buffer) -> OpResult {
        ops::attention::attention(self, attention, out)
    }

    fn gather_rows(&self, src: &Buffer, rows: &[u32], width: usize, out: &mut Buffer) -> OpResult {
        ops::rows::gather_rows(src, rows, width, out)
    }

    fn scatter_add_rows(&self, scatter: ScatterAddRows<'_>) -> OpResult {
        ops::rows::scatter_add_rows(scatter)
    }

    fn copy(&self, copy: BufferCopy<'_>) -> OpResult {
        ops::rows::copy(copy)
    }

    /// Picks in place (no copy of the logits), one row per chunk of the thread team.
    fn greedy_pick(
        &self,
        logits: &Buffer,
        rows: usize,
        width: usize,
        log_probabilities: bool,
    ) -> Result<Vec<Pick>, BackendError> {
        let source = data(logits, "greedy_pick", "logits")?;
        let needed = product("greedy_pick", "rows × width", rows, width)?;
        at_least("greedy_pick", "logit elements", needed, source.len())?;
        let mut picks = vec![
            Pick {
                id: 0,
                logprob: f32::NAN
            };
            rows
        ];
        let out = SharedPicks(picks.as_mut_ptr());
        self.run_chunks(rows, &|row| {
            let pick = pick::pick_row(&source[row * width..(row + 1) * width], log_probabilities);
            // SAFETY: chunk `row` alone writes pick `row` (< rows, inside `picks`).
            unsafe { out.write(row, pick) };
        });
        Ok(picks)
    }
}

/// The CPU's fused ops; `matmul_bias` and `add_rms_norm` keep the default sequences.
impl FusedOps for CpuBackend {
    fn norms_in_matmuls(&self, _width: usize) -> bool {
        self.norms_in_matmuls
    }

    fn matmul_qkv(
        &self,
        projections: [Projection<'_>; 3],
        x: &Buffer,
        tokens: usize,
        outs: [&mut Buffer; 3],
    ) -> OpResult {
        ops::linear::matmul_qkv(self, projections, x, tokens, outs)
    }

    fn rope_kv_write(&self, op: RopeKvWrite<'_>) -> OpResult {
        ops::rope::rope_kv_write(self, op)
    }

    fn gated_ffn_hidden(&self, run: GatedFfnRun<'_>) -> OpResult {
        ops::linear::gated_ffn_hidden(self, run)
    }

    fn attention_output(&self, op: AttentionOutput<'_>) -> OpResult {
        ops::linear::attention_output(self, op)
    }

    fn gated_ffn(&self, run: GatedFfnRun<'_>, out: &mut Buffer) -> OpResult {
        ops::linear::gated_ffn(self, run, out)
    }
}
