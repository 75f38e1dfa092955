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

    /// Where llama.cpp's CPU backend would keep this matrix, which decides the order of its
    /// dot products: ggml-cpu repacks the types with a repack kernel
    /// (`runit_quant::dot::is_repacked`) except the token embedding, which GET_ROWS reads from
    /// a plain buffer (so a tied output matmul stays in `vec_dot` order); one expert of a 3-D
    /// tensor (`Weight::matrix` names it `name[index]`) goes through MUL_MAT_ID.
    pub fn ggml_layout(&self) -> GgmlLayout {
        if self.name == "token_embd.weight" || !runit_quant::dot::is_repacked(self.ty, self.rows())
        {
            GgmlLayout::Plain
        } else if self.name.ends_with(']') {
            GgmlLayout::RepackedExpert
        } else {
            GgmlLayout::Repacked
        }
    }
}

/// Where ggml-cpu keeps a weight ([`Weight::ggml_layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GgmlLayout {
    /// A plain buffer: `vec_dot` (or tinyBLAS) order.
    #[default]
    Plain,
    /// The REPACK buffer, as a 2-D matrix (MUL_MAT: gemm order for groups of four
    /// activation rows, gemv order for the rest).
    Repacked,
    /// The REPACK buffer, as one expert of a 3-D tensor (MUL_MAT_ID: gemv order for every
    /// activation row).
    RepackedExpert,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn weight(name: &str, ty: GgmlType, shape: Vec<usize>) -> Weight {
        Weight::new(name.into(), ty, shape, Arc::new(()))
    }

    #[test]
    fn ggml_layout_follows_ggml_cpu_repack_rules() {
        let up = weight("blk.0.ffn_up.weight", GgmlType::Q4_0, vec![64, 16]);
        assert_eq!(up.ggml_layout(), GgmlLayout::Repacked);
        let embedding = weight("token_embd.weight", GgmlType::Q4_0, vec![64, 16]);
        assert_eq!(embedding.ggml_layout(), GgmlLayout::Plain);
        let experts = weight("blk.0.ffn_up_exps.weight", GgmlType::Q4_K, vec![256, 8, 4]);
        assert_eq!(experts.matrix(2).ggml_layout(), GgmlLayout::RepackedExpert);
        // No repack kernel for the type, or rows not a multiple of 8.
        assert_eq!(
            weight("w", GgmlType::Q8_0, vec![64, 16]).ggml_layout(),
            GgmlLayout::Plain
        );
        assert_eq!(
            weight("w", GgmlType::Q4_0, vec![64, 12]).ggml_layout(),
            GgmlLayout::Plain
        );
    }
}
