//! The error type of backend operations.

use runit_quant::GgmlType;

/// The outcome of an op that writes into buffers it was given.
pub type OpResult = Result<(), BackendError>;

/// Why a backend operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The weight type has no kernel for this op on this backend.
    #[error("{backend}: {op} is not supported for weight type {ty} (tensor {tensor})")]
    Unsupported {
        backend: String,
        op: &'static str,
        ty: GgmlType,
        tensor: String,
    },
    /// The backend does not store a KV cache of this type (or not of this width).
    #[error("{backend}: KV cache type {ty} is not supported for {what}; this backend stores {supported}")]
    UnsupportedKv {
        backend: String,
        ty: crate::KvType,
        what: String,
        supported: &'static str,
    },
    /// Operand sizes do not agree.
    #[error("{op}: {what}: expected {expected}, found {found}")]
    Shape {
        op: &'static str,
        what: &'static str,
        expected: usize,
        found: usize,
    },
    /// A buffer or weight made by another backend was passed in.
    #[error("{op}: {what} belongs to another backend")]
    ForeignBuffer {
        op: &'static str,
        what: &'static str,
    },
    /// The device ran out of memory.
    #[error("{backend}: out of memory allocating {bytes} bytes ({available} available)")]
    OutOfMemory {
        backend: String,
        bytes: usize,
        available: usize,
    },
    /// Any other device failure, with the op that caused it.
    #[error("{backend}: {op} failed: {message}")]
    Device {
        backend: String,
        op: &'static str,
        message: String,
    },
}

/// Fails with a shape error unless `found >= expected` (`what` names the operand).
pub fn at_least(op: &'static str, what: &'static str, expected: usize, found: usize) -> OpResult {
    if found < expected {
        return Err(BackendError::Shape {
            op,
            what,
            expected,
            found,
        });
    }
    Ok(())
}
