//! Converting one tensor's bytes to another type: dequantize to f32, then quantize, a group of
//! rows at a time on rayon's thread pool.
//!
//! Only the output tensor is held in full; each worker needs one group's f32 values. Rows are
//! independent in every ggml quantizer (without an importance matrix), so the grouping does not
//! change a single output byte.

use anyhow::{bail, Context, Result};
use rayon::prelude::*;
use runit_quant::GgmlType;

/// Elements a worker converts at a time (rounded up to whole rows).
const ELEMENTS_PER_TASK: u64 = 64 * 1024;

/// Whether a `from` tensor can be turned into a `to` tensor by [`convert`].
pub fn can_convert(from: GgmlType, to: GgmlType) -> bool {
    from == to
        || ((from == GgmlType::F32 || runit_quant::can_dequantize(from))
            && (to == GgmlType::F32 || runit_quant::can_quantize(to)))
}

/// Converts the bytes of a `from` tensor with rows of `row_length` elements into `to`.
///
/// `source` must hold whole rows. The result holds the same rows in `to`.
pub fn convert(source: &[u8], from: GgmlType, to: GgmlType, row_length: u64) -> Result<Vec<u8>> {
    let (Some(source_row_bytes), Some(target_row_bytes)) =
        (from.row_bytes(row_length), to.row_bytes(row_length))
    else {
        bail!("row length {row_length} is not a whole number of {from} or {to} blocks");
    };
    if source_row_bytes == 0 || !(source.len() as u64).is_multiple_of(source_row_bytes) {
        bail!(
            "{} bytes of {from} data are not whole rows of {source_row_bytes} bytes",
            source.len()
        );
    }
    let num_rows = source.len() as u64 / source_row_bytes;
    let rows_per_task = ELEMENTS_PER_TASK.div_ceil(row_length).max(1);
    let to_usize = |bytes: u64| usize::try_from(bytes).context("tensor larger than memory");
    let source_chunk = to_usize(rows_per_task * source_row_bytes)?;
    let target_chunk = to_usize(rows_per_task * target_row_bytes)?;
    let mut target = vec![0u8; to_usize(num_rows * target_row_bytes)?];
    target
        .par_chunks_mut(target_chunk)
        .zip(source.par_chunks(source_chunk))
        .try_for_each_init(Vec::new, |values: &mut Vec<f32>, (target, source)| {
            let num_values = source.len() / source_row_bytes as usize * row_length as usize;
            values.resize(num_values, 0.0);
            to_f32(from, source, values)?;
            from_f32(to, values, target)
        })?;
    Ok(target)
}

fn to_f32(from: GgmlType, source: &[u8], values: &mut [f32]) -> Result<()> {
    if from == GgmlType::F32 {
        for (value, bytes) in values.iter_mut().zip(source.chunks_exact(4)) {
            *value = f32::from_le_bytes(bytes.try_into().expect("chunks of 4 bytes"));
        }
        return Ok(());
    }
    runit_quant::dequantize(from, source, values)
        .with_context(|| format!("dequantizing {from} data"))
}

fn from_f32(to: GgmlType, values: &[f32], target: &mut [u8]) -> Result<()> {
    if to == GgmlType::F32 {
        for (bytes, value) in target.chunks_exact_mut(4).zip(values) {
            bytes.copy_from_slice(&value.to_le_bytes());
        }
        return Ok(());
    }
    runit_quant::quantize(to, values, target).with_context(|| format!("quantizing to {to}"))
}
