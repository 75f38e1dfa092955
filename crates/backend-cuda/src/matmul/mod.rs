//! (in progress) Matrix multiplication on packed weights.
use runit_backend::{BackendError, Buffer, Weight};
use runit_quant::GgmlType;

use crate::CudaBackend;

/// State shared by matmul calls.
#[derive(Default)]
pub struct MatmulState {}

pub fn supports(_ty: GgmlType) -> bool {
    false
}

pub fn matmul(
    b: &CudaBackend,
    weight: &Weight,
    _x: &Buffer,
    _tokens: usize,
    _out: &mut Buffer,
) -> Result<(), BackendError> {
    Err(crate::ops::embedding::unsupported(b, "matmul", weight))
}
