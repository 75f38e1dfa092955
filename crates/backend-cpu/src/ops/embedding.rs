//! Embedding lookup: each id's row of the table, dequantized exactly (ggml's `get_rows`).

use runit_backend::{BackendError, Buffer, Weight};

use crate::storage::{at_least, data_mut, product, weight_bytes};
use crate::CpuBackend;

const OP: &str = "embedding";

/// `out[t] = table[ids[t]]` as f32.
pub fn embedding(
    backend: &CpuBackend,
    table: &Weight,
    ids: &[u32],
    out: &mut Buffer,
) -> Result<(), BackendError> {
    let width = table.row_len();
    let n_rows = table.rows();
    let row_bytes = table.row_bytes();
    let bytes = weight_bytes(table, OP)?;
    if let Some(id) = ids.iter().find(|id| **id as usize >= n_rows) {
        return Err(BackendError::Shape {
            op: OP,
            what: "token id (exclusive bound: table rows)",
            expected: n_rows,
            found: *id as usize,
        });
    }
    if !runit_quant::can_dequantize(table.ty) {
        return Err(BackendError::Unsupported {
            backend: "cpu".to_string(),
            op: OP,
            ty: table.ty,
            tensor: table.name.clone(),
        });
    }
    let out = data_mut(out, OP, "out")?;
    at_least(
        OP,
        "out elements",
        product(OP, "ids × width", ids.len(), width)?,
        out.len(),
    )?;
    backend.for_rows(out, width, ids.len(), |token, row| {
        let at = ids[token] as usize * row_bytes;
        runit_quant::dequantize(table.ty, &bytes[at..at + row_bytes], row)
            .expect("the type dequantizes and a row is whole blocks of `width` values");
    });
    Ok(())
}
