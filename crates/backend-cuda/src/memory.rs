//! The payloads this backend puts inside [`runit_backend::Buffer`], [`Weight`] and
//! [`KvCache`], and the device pointers kernels take.
//!
//! Kernels receive raw device addresses (`u64`); the owning `CudaSlice` lives in the payload
//! and frees the memory (stream-ordered) when the handle is dropped.

use cudarc::driver::CudaSlice;
use runit_backend::{BackendError, Buffer, KvCache, Weight};

/// Payload of an activation [`Buffer`]: `len` f32 values on the device.
pub struct DeviceBuffer {
    pub slice: CudaSlice<f32>,
    pub ptr: u64,
}

/// Payload of a [`Weight`]: the packed tensor bytes exactly as in the file.
pub struct DeviceWeight {
    /// Owns the allocation (freed on drop); kernels use `ptr`.
    #[allow(dead_code)]
    pub bytes: CudaSlice<u8>,
    pub ptr: u64,
}

/// Payload of a [`KvCache`]: `n_cells` rows of f16 (as u16) or f32 elements, ggml blocks or
/// TurboQuant blocks (`KvType::row_bytes` each).
pub struct DeviceKv {
    /// Owns the allocation (freed on drop); kernels use `ptr`.
    #[allow(dead_code)]
    pub bytes: CudaSlice<u8>,
    pub ptr: u64,
    /// TurboQuant keys only: the vector subtracted from every row before it is encoded
    /// (`[width]`, `Device::center_keys`) and its address; `None` stores rows as they come.
    pub mean: Option<(CudaSlice<f32>, u64)>,
}

/// The device address of an activation buffer.
pub fn buffer_ptr(
    op: &'static str,
    what: &'static str,
    buffer: &Buffer,
) -> Result<u64, BackendError> {
    buffer
        .payload::<DeviceBuffer>()
        .map(|b| b.ptr)
        .ok_or(BackendError::ForeignBuffer { op, what })
}

/// The device address of a weight's first byte (its view offset included).
pub fn weight_ptr(
    op: &'static str,
    what: &'static str,
    weight: &Weight,
) -> Result<u64, BackendError> {
    weight
        .payload::<DeviceWeight>()
        .map(|w| w.ptr + weight.byte_offset as u64)
        .ok_or(BackendError::ForeignBuffer { op, what })
}

/// The device address of a KV cache.
pub fn kv_ptr(op: &'static str, what: &'static str, cache: &KvCache) -> Result<u64, BackendError> {
    cache
        .payload::<DeviceKv>()
        .map(|c| c.ptr)
        .ok_or(BackendError::ForeignBuffer { op, what })
}

/// The device address of a TurboQuant key cache's mean (`Device::center_keys`), 0 for none.
pub fn kv_mean_ptr(
    op: &'static str,
    what: &'static str,
    cache: &KvCache,
) -> Result<u64, BackendError> {
    cache
        .payload::<DeviceKv>()
        .map(|c| c.mean.as_ref().map_or(0, |(_, ptr)| *ptr))
        .ok_or(BackendError::ForeignBuffer { op, what })
}

/// Fails unless `buffer` holds at least `needed` elements.
pub fn check_len(
    op: &'static str,
    what: &'static str,
    buffer: &Buffer,
    needed: usize,
) -> Result<(), BackendError> {
    if buffer.len() < needed {
        return Err(BackendError::Shape {
            op,
            what,
            expected: needed,
            found: buffer.len(),
        });
    }
    Ok(())
}
