//! `impl Backend for CpuBackend`: storage management here, each op in `ops/`.

use std::ops::Range;
use std::sync::Arc;

use runit_backend::{
    pick, unfused, AttentionParams, Backend, BackendError, Buffer, HeadNorms, HostMemory, KvCache,
    KvType, Op, Pick, RopeParams, SequenceSpan, Weight,
};
use runit_quant::GgmlType;

use crate::cells::Cells;
use crate::ops;
use crate::storage::{
    at_least, data, data_mut, exactly, packed_len, product, CpuBuffer, CpuKv, CpuWeight,
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

impl Backend for CpuBackend {
    fn name(&self) -> String {
        "cpu".to_string()
    }

    fn reads_weights_from_host(&self) -> bool {
        true
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

    fn upload(&self, buffer: &mut Buffer, values: &[f32]) -> Result<(), BackendError> {
        let target = data_mut(buffer, "upload", "buffer")?;
        at_least("upload", "buffer elements", values.len(), target.len())?;
        target[..values.len()].copy_from_slice(values);
        Ok(())
    }

    fn download(&self, buffer: &Buffer, out: &mut [f32]) -> Result<(), BackendError> {
        let source = data(buffer, "download", "buffer")?;
        at_least("download", "buffer elements", out.len(), source.len())?;
        out.copy_from_slice(&source[..out.len()]);
        Ok(())
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

    fn load_weight(
        &self,
        name: &str,
        ty: GgmlType,
        shape: &[usize],
        memory: Arc<dyn HostMemory>,
        range: Range<usize>,
    ) -> Result<Weight, BackendError> {
        const OP: &str = "load_weight";
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
            memory.bytes().len(),
        )?;
        if range.start > range.end {
            return Err(BackendError::Shape {
                op: OP,
                what: "range start (at most its end)",
                expected: range.end,
                found: range.start,
            });
        }
        Ok(Weight::new(
            name.to_string(),
            ty,
            shape.to_vec(),
            Arc::new(CpuWeight { memory, range }),
        ))
    }

    fn alloc_kv(&self, n_cells: usize, width: usize, ty: KvType) -> Result<KvCache, BackendError> {
        let len = product("alloc_kv", "cells × width", n_cells, width)?;
        let out_of_memory = |element: usize| BackendError::OutOfMemory {
            backend: "cpu".to_string(),
            bytes: len.saturating_mul(element),
            available: 0,
        };
        let cells = match ty {
            KvType::F16 => CpuKv::F16(Cells::zeroed(len).ok_or_else(|| out_of_memory(2))?),
            KvType::F32 => CpuKv::F32(Cells::zeroed(len).ok_or_else(|| out_of_memory(4))?),
        };
        Ok(KvCache::new(n_cells, width, ty, Box::new(cells)))
    }

    fn embedding(&self, table: &Weight, ids: &[u32], out: &mut Buffer) -> Result<(), BackendError> {
        ops::embedding::embedding(self, table, ids, out)
    }

    fn matmul(
        &self,
        weight: &Weight,
        x: &Buffer,
        tokens: usize,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        ops::linear::matmul(self, weight, x, tokens, out)
    }

    fn matmul_qkv(
        &self,
        weights: [&Weight; 3],
        biases: [Option<&Weight>; 3],
        x: &Buffer,
        tokens: usize,
        outs: [&mut Buffer; 3],
    ) -> Result<(), BackendError> {
        ops::linear::matmul_qkv(self, weights, biases, x, tokens, outs)
    }

    fn matmul_swiglu(
        &self,
        gate: &Weight,
        up: &Weight,
        x: &Buffer,
        tokens: usize,
        up_out: &mut Buffer,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        ops::linear::matmul_swiglu(self, gate, up, x, tokens, up_out, out)
    }

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
        ops::linear::matmul_swiglu_down(self, [gate, up, down], x, tokens, up_out, hidden, out)
    }

    fn add_bias(&self, x: &mut Buffer, bias: &Weight, tokens: usize) -> Result<(), BackendError> {
        ops::elementwise::add_bias(self, x, bias, tokens)
    }

    fn rms_norm(
        &self,
        x: &Buffer,
        weight: &Weight,
        eps: f32,
        rows: usize,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        ops::norm::rms_norm(self, x, weight, eps, rows, out)
    }

    fn rms_norm_in_place(
        &self,
        x: &mut Buffer,
        weight: &Weight,
        eps: f32,
        rows: usize,
    ) -> Result<(), BackendError> {
        ops::norm::rms_norm_in_place(self, x, weight, eps, rows)
    }

    fn rope(
        &self,
        x: &mut Buffer,
        positions: &[u32],
        params: &RopeParams,
        freq_factors: Option<&Weight>,
    ) -> Result<(), BackendError> {
        ops::rope::rope(self, x, positions, params, freq_factors)
    }

    fn add(&self, dst: &mut Buffer, src: &Buffer, len: usize) -> Result<(), BackendError> {
        ops::elementwise::add(self, dst, src, len)
    }

    fn silu_mul(&self, gate: &mut Buffer, up: &Buffer, len: usize) -> Result<(), BackendError> {
        ops::elementwise::silu_mul(self, gate, up, len)
    }

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
        // The cache rows the write below stores to, fetched while the RoPE runs.
        ops::kv_write::prefetch_destinations(k_cache, v_cache, spans);
        if let Some(norms) = head_norms {
            let tokens = positions.len();
            unfused::head_norms_in_place(self, q, k, tokens, q_params, k_params, norms)?;
        }
        // Q and K with one angle table per token (the unfused default computes it twice).
        ops::rope::rope_both(
            self,
            q,
            Some(k),
            positions,
            q_params,
            k_params,
            freq_factors,
        )?;
        self.kv_write(k, v, k_cache, v_cache, spans)
    }

    fn kv_write(
        &self,
        k: &Buffer,
        v: &Buffer,
        k_cache: &mut KvCache,
        v_cache: &mut KvCache,
        spans: &[SequenceSpan],
    ) -> Result<(), BackendError> {
        ops::kv_write::kv_write(k, v, k_cache, v_cache, spans)
    }

    fn attention(
        &self,
        q: &Buffer,
        k_cache: &KvCache,
        v_cache: &KvCache,
        spans: &[SequenceSpan],
        params: &AttentionParams,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        ops::attention::attention(self, q, k_cache, v_cache, spans, params, out)
    }

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
        ops::linear::attention_output(
            self, q, k_cache, v_cache, spans, params, attn, wo, tokens, out,
        )
    }

    fn gather_rows(
        &self,
        src: &Buffer,
        rows: &[u32],
        width: usize,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        ops::rows::gather_rows(src, rows, width, out)
    }

    fn scatter_add_rows(
        &self,
        src: &Buffer,
        rows: &[u32],
        scales: &[f32],
        width: usize,
        dst: &mut Buffer,
    ) -> Result<(), BackendError> {
        ops::rows::scatter_add_rows(src, rows, scales, width, dst)
    }

    fn copy(
        &self,
        src: &Buffer,
        src_offset: usize,
        dst: &mut Buffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<(), BackendError> {
        ops::rows::copy(src, src_offset, dst, dst_offset, len)
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        Ok(())
    }
}
