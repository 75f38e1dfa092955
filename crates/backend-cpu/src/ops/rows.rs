//! Row movement: `gather_rows` and `scatter_add_rows` (MoE token routing) and `copy`.

use runit_backend::{BackendError, Buffer, BufferCopy, ScatterAddRows};

use crate::storage::{at_least, data, data_mut, product};

/// `out[i] = src[rows[i]]` for rows of `width` elements.
pub fn gather_rows(
    src: &Buffer,
    rows: &[u32],
    width: usize,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    const OP: &str = "gather_rows";
    let src = data(src, OP, "src")?;
    let src_rows = src.len().checked_div(width).unwrap_or(0);
    check_rows(OP, rows, src_rows)?;
    let out = data_mut(out, OP, "out")?;
    at_least(
        OP,
        "out elements",
        product(OP, "rows × width", rows.len(), width)?,
        out.len(),
    )?;
    for (row, target) in rows.iter().zip(out.chunks_exact_mut(width.max(1))) {
        let at = *row as usize * width;
        target[..width].copy_from_slice(&src[at..at + width]);
    }
    Ok(())
}

/// `dst[rows[i]] += scales[i] * src[i]`, in the order of `rows` (ggml's `mul` then `add`:
/// the product is rounded before the sum).
pub fn scatter_add_rows(scatter: ScatterAddRows<'_>) -> Result<(), BackendError> {
    const OP: &str = "scatter_add_rows";
    let ScatterAddRows {
        src,
        rows,
        scales,
        width,
        dst,
    } = scatter;
    at_least(OP, "scales", rows.len(), scales.len())?;
    let src = data(src, OP, "src")?;
    at_least(
        OP,
        "src elements",
        product(OP, "rows × width", rows.len(), width)?,
        src.len(),
    )?;
    let dst = data_mut(dst, OP, "dst")?;
    let dst_rows = dst.len().checked_div(width).unwrap_or(0);
    check_rows(OP, rows, dst_rows)?;
    for (i, (row, scale)) in rows.iter().zip(scales).enumerate() {
        let at = *row as usize * width;
        let source = &src[i * width..(i + 1) * width];
        for (d, s) in dst[at..at + width].iter_mut().zip(source) {
            *d += scale * s;
        }
    }
    Ok(())
}

/// Copies `len` elements from `src[src_offset..]` to `dst[dst_offset..]`.
pub fn copy(copy: BufferCopy<'_>) -> Result<(), BackendError> {
    const OP: &str = "copy";
    let BufferCopy {
        src,
        src_offset,
        dst,
        dst_offset,
        len,
    } = copy;
    let src = data(src, OP, "src")?;
    let src_end = src_offset.saturating_add(len);
    at_least(OP, "src elements", src_end, src.len())?;
    let dst = data_mut(dst, OP, "dst")?;
    let dst_end = dst_offset.saturating_add(len);
    at_least(OP, "dst elements", dst_end, dst.len())?;
    dst[dst_offset..dst_end].copy_from_slice(&src[src_offset..src_end]);
    Ok(())
}

/// Fails unless every row index is below `available`.
fn check_rows(op: &'static str, rows: &[u32], available: usize) -> Result<(), BackendError> {
    match rows.iter().find(|row| **row as usize >= available) {
        Some(row) => Err(BackendError::Shape {
            op,
            what: "row index (exclusive bound)",
            expected: available,
            found: *row as usize,
        }),
        None => Ok(()),
    }
}
