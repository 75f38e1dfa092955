//! The error type of this crate.

use crate::GgmlType;

/// Why a dequantization or quantization request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuantError {
    /// RunIT has no routine for this type in this direction.
    #[error("{op} is not supported for tensor type {ty}")]
    Unsupported {
        /// The tensor type asked for.
        ty: GgmlType,
        /// `"dequantize"` or `"quantize"`.
        op: &'static str,
    },
    /// The destination does not have the length the source implies.
    #[error("{ty}: destination holds {found} elements, expected {expected}")]
    Length {
        /// The tensor type.
        ty: GgmlType,
        /// Length the source implies (f32 values when dequantizing, bytes when quantizing).
        expected: usize,
        /// Length of the destination given.
        found: usize,
    },
    /// The source is not a whole number of blocks.
    #[error("{ty}: source length {n} is not a multiple of the block of {block}")]
    NotBlockMultiple {
        /// The tensor type.
        ty: GgmlType,
        /// Source length (bytes when dequantizing, f32 values when quantizing).
        n: usize,
        /// Block length in the same unit (type size in bytes, or elements per block).
        block: usize,
    },
}

impl QuantError {
    /// Checks that an input of `n` items is a whole number of `unit`-item blocks and that the
    /// output holds `per_unit` items for each of them: the size contract shared by
    /// [`crate::dequantize`] (units are block bytes) and [`crate::quantize`] (units are block
    /// elements).
    pub(crate) fn check_sizes(
        ty: crate::GgmlType,
        n: usize,
        unit: usize,
        out_len: usize,
        per_unit: usize,
    ) -> Result<(), QuantError> {
        if !n.is_multiple_of(unit) {
            return Err(QuantError::NotBlockMultiple { ty, n, block: unit });
        }
        let expected = n / unit * per_unit;
        if out_len != expected {
            return Err(QuantError::Length {
                ty,
                expected,
                found: out_len,
            });
        }
        Ok(())
    }
}
