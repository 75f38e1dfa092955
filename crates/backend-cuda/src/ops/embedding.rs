//! (in progress) Embedding lookup.
use runit_backend::{BackendError, Buffer, Weight};
use runit_quant::GgmlType;

use crate::CudaBackend;

pub fn supports(_ty: GgmlType) -> bool {
    false
}

pub fn embedding(
    b: &CudaBackend,
    table: &Weight,
    _ids: &[u32],
    _out: &mut Buffer,
) -> Result<(), BackendError> {
    Err(unsupported(b, "embedding", table))
}

pub(crate) fn unsupported(b: &CudaBackend, op: &'static str, w: &Weight) -> BackendError {
    use runit_backend::Backend;
    BackendError::Unsupported {
        backend: b.name(),
        op,
        ty: w.ty,
        tensor: w.name.clone(),
    }
}
