//! Backend-owned storage: activation buffers, weights and KV caches.
//!
//! Each handle carries a type-erased payload that only the backend which made it can read
//! (it downcasts to its own type), plus the sizes every backend agrees on.

use std::any::Any;
use std::sync::Arc;

use runit_quant::GgmlType;

/// Host memory holding packed weights (a memory-mapped model file).
pub trait HostMemory: Send + Sync {
    /// The whole mapped region.
    fn bytes(&self) -> &[u8];
}

impl HostMemory for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// An f32 activation buffer.
pub struct Buffer {
    len: usize,
    payload: Box<dyn Any + Send + Sync>,
}

impl Buffer {
    /// Wraps a backend's storage of `len` f32 elements.
    pub fn new(len: usize, payload: Box<dyn Any + Send + Sync>) -> Buffer {
        Buffer { len, payload }
    }

    /// Number of f32 elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The backend's storage, if it is of type `T`.
    pub fn payload<T: 'static>(&self) -> Option<&T> {
        self.payload.downcast_ref()
    }

    /// Mutable twin of [`Buffer::payload`].
    pub fn payload_mut<T: 'static>(&mut self) -> Option<&mut T> {
        self.payload.downcast_mut()
    }
}

/// A weight tensor (packed in its file type) made usable by a backend.
#[derive(Clone)]
pub struct Weight {
    /// Tensor name in the model file, for errors.
    pub name: String,
    pub ty: GgmlType,
    /// ggml order: `shape[0]` is the row length.
    pub shape: Vec<usize>,
    /// Byte offset of this view's first row inside the payload (non-zero for expert slices).
    pub byte_offset: usize,
    payload: Arc<dyn Any + Send + Sync>,
}

impl Weight {
    /// Wraps a backend's storage.
    pub fn new(
        name: String,
        ty: GgmlType,
        shape: Vec<usize>,
        payload: Arc<dyn Any + Send + Sync>,
    ) -> Weight {
        Weight {
            name,
            ty,
            shape,
            byte_offset: 0,
            payload,
        }
    }

    /// Elements per row.
    pub fn row_len(&self) -> usize {
        self.shape[0]
    }

    /// Rows of one matrix (`shape[1]`, or 1 for a vector).
    pub fn rows(&self) -> usize {
        self.shape.get(1).copied().unwrap_or(1)
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.shape[0] / self.ty.block_size() * self.ty.type_size()
    }

    /// Total elements.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// The `index`-th matrix of a 3-D weight (`shape[2]` experts), sharing storage.
    pub fn matrix(&self, index: usize) -> Weight {
        let rows = self.rows();
        Weight {
            name: format!("{}[{index}]", self.name),
            ty: self.ty,
            shape: vec![self.shape[0], rows],
            byte_offset: self.byte_offset + index * rows * self.row_bytes(),
            payload: Arc::clone(&self.payload),
        }
    }

    /// The backend's storage, if it is of type `T`.
    pub fn payload<T: 'static>(&self) -> Option<&T> {
        self.payload.downcast_ref()
    }
}

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    F32,
    /// llama.cpp's default.
    #[default]
    F16,
}

/// One layer's key or value cache: `n_cells` slots of `width` elements.
pub struct KvCache {
    pub n_cells: usize,
    pub width: usize,
    pub ty: KvType,
    payload: Box<dyn Any + Send + Sync>,
}

impl KvCache {
    /// Wraps a backend's storage.
    pub fn new(
        n_cells: usize,
        width: usize,
        ty: KvType,
        payload: Box<dyn Any + Send + Sync>,
    ) -> KvCache {
        KvCache {
            n_cells,
            width,
            ty,
            payload,
        }
    }

    /// The backend's storage, if it is of type `T`.
    pub fn payload<T: 'static>(&self) -> Option<&T> {
        self.payload.downcast_ref()
    }

    /// Mutable twin of [`KvCache::payload`].
    pub fn payload_mut<T: 'static>(&mut self) -> Option<&mut T> {
        self.payload.downcast_mut()
    }
}
