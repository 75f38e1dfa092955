//! Tensor descriptions from the tensor table, and the size arithmetic shared by reader and writer.

use runit_quant::GgmlType;

/// ggml's `GGML_MAX_DIMS`: a tensor has at most this many dimensions.
pub const MAX_DIMS: usize = 4;

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// The element type.
    pub ty: GgmlType,
    /// ggml order: `shape[0]` = ne0 = row length (fastest varying), `shape[1]` = rows, ...
    pub shape: Vec<u64>,
    /// Offset of the tensor's first byte, relative to the data section.
    pub offset: u64,
    /// Bytes the tensor occupies (whole blocks of `ty`).
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Total number of elements (the product of `shape`; saturates for a shape the reader
    /// would have refused).
    pub fn n_elements(&self) -> u64 {
        self.shape
            .iter()
            .try_fold(1u64, |total, &dim| total.checked_mul(dim))
            .unwrap_or(u64::MAX)
    }

    /// Number of rows: the product of `shape[1..]` (1 for a vector).
    pub fn n_rows(&self) -> u64 {
        self.shape
            .iter()
            .skip(1)
            .try_fold(1u64, |total, &dim| total.checked_mul(dim))
            .unwrap_or(u64::MAX)
    }

    /// Row length: `shape[0]` (1 for a zero-dimensional tensor).
    pub fn row_length(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1)
    }
}

/// Why a type and shape cannot describe a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShapeProblem {
    TooManyDims,
    Overflow,
    RowNotBlockMultiple,
}

/// Bytes a tensor of type `ty` and `shape` occupies, checking what ggml checks: at most
/// [`MAX_DIMS`] dimensions, every dimension and the element count within `i64`, the row a
/// whole number of blocks, and the byte size within `u64`.
pub(crate) fn tensor_bytes(ty: GgmlType, shape: &[u64]) -> Result<u64, ShapeProblem> {
    if shape.len() > MAX_DIMS {
        return Err(ShapeProblem::TooManyDims);
    }
    let limit = i64::MAX as u64;
    let mut n_elements = 1u64;
    for &dim in shape {
        n_elements = n_elements
            .checked_mul(dim)
            .filter(|&n| n <= limit && dim <= limit)
            .ok_or(ShapeProblem::Overflow)?;
    }
    let row_length = shape.first().copied().unwrap_or(1);
    if row_length % ty.block_size() as u64 != 0 {
        return Err(ShapeProblem::RowNotBlockMultiple);
    }
    let row_bytes = ty.row_bytes(row_length).ok_or(ShapeProblem::Overflow)?;
    let n_rows = shape
        .iter()
        .skip(1)
        .try_fold(1u64, |total, &dim| total.checked_mul(dim))
        .ok_or(ShapeProblem::Overflow)?;
    row_bytes.checked_mul(n_rows).ok_or(ShapeProblem::Overflow)
}

/// `value` rounded up to a multiple of `alignment` (a power of two), or `None` on overflow.
pub(crate) fn align_up(value: u64, alignment: u64) -> Option<u64> {
    let mask = alignment - 1;
    value.checked_add(mask).map(|v| v & !mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_blocks() {
        assert_eq!(tensor_bytes(GgmlType::Q4_0, &[64, 3]), Ok(3 * 36));
        assert_eq!(tensor_bytes(GgmlType::F32, &[]), Ok(4));
        assert_eq!(
            tensor_bytes(GgmlType::Q4_K, &[32, 1]),
            Err(ShapeProblem::RowNotBlockMultiple)
        );
        assert_eq!(
            tensor_bytes(GgmlType::F32, &[1 << 40, 1 << 40]),
            Err(ShapeProblem::Overflow)
        );
        assert_eq!(
            tensor_bytes(GgmlType::F32, &[1, 1, 1, 1, 1]),
            Err(ShapeProblem::TooManyDims)
        );
        assert_eq!(align_up(33, 32), Some(64));
        assert_eq!(align_up(64, 32), Some(64));
        assert_eq!(align_up(u64::MAX, 32), None);
    }
}
