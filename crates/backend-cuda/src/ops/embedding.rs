//! Embedding lookup: `out[t] = table[ids[t]]`, dequantized from any weight type by
//! `embedding_<type>` (kernels/embedding.cu), which reads the ids from the step buffer.

use cudarc::driver::LaunchConfig;
use runit_backend::{BackendError, Buffer, Device, Weight};
use runit_quant::GgmlType;

use crate::matmul::{launch_kernel, names};
use crate::memory::{buffer_ptr, check_len, weight_ptr};
use crate::CudaBackend;

const OP: &str = "embedding";

/// Threads per block; each dequantizes 8 elements.
const THREADS: usize = 256;

/// True when [`embedding`] handles tables of type `ty`.
pub fn supports(ty: GgmlType) -> bool {
    names::kernels(ty).is_some()
}

/// `out[t] = dequantize(table row ids[t])`; `out` is `[ids.len(), table.row_len()]`.
pub fn embedding(
    backend: &CudaBackend,
    table: &Weight,
    ids: &[u32],
    out: &mut Buffer,
) -> Result<(), BackendError> {
    let kernels = names::kernels(table.ty).ok_or_else(|| unsupported(backend, OP, table))?;
    let (width, rows) = (table.row_len(), table.rows());
    if let Some(id) = ids.iter().find(|id| **id as usize >= rows) {
        return Err(BackendError::Shape {
            op: OP,
            what: "token id (exclusive bound: table rows)",
            expected: rows,
            found: *id as usize,
        });
    }
    check_len(OP, "out (ids × row length)", out, ids.len() * width)?;
    if ids.is_empty() || width == 0 {
        return Ok(());
    }
    let table_ptr = weight_ptr(OP, "table", table)?;
    let out_ptr = buffer_ptr(OP, "out", out)?;
    let step = backend.step_inputs(OP, Some(ids), None, None, None)?;
    let groups = width.div_ceil(8);
    let config = LaunchConfig {
        grid_dim: (ids.len() as u32, groups.div_ceil(THREADS) as u32, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    launch_kernel!(
        backend,
        OP,
        "embedding.cu",
        kernels.embedding,
        config,
        table_ptr,
        table.row_bytes() as u64,
        width as u64,
        step.ptr,
        out_ptr
    )
}

/// The error for a weight type an op has no kernel for.
pub(crate) fn unsupported(b: &CudaBackend, op: &'static str, w: &Weight) -> BackendError {
    BackendError::Unsupported {
        backend: b.name(),
        op,
        ty: w.ty,
        tensor: w.name.clone(),
    }
}
