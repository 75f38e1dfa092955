//! Backend-owned storage: activation buffers, weights and KV caches.
//!
//! Each handle carries a type-erased payload that only the backend which made it can read
//! (it downcasts to its own type), plus the sizes every backend agrees on.

use std::any::Any;
use std::ops::Range;
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

/// What a weight is for, set when it is loaded. Its role, never its name, decides the
/// order of a matmul's dot products ([`Weight::ggml_layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightRole {
    /// The token embedding table, also when a model ties its output projection to it.
    TokenEmbedding,
    /// Any other 2-D weight (a projection).
    Matrix,
    /// A 1-D weight (a norm, a bias, RoPE frequency factors).
    Vector,
    /// The matrices of a mixture-of-experts layer's experts, stacked (`shape[2]` experts).
    StackedExperts,
    /// One expert's matrix of a stacked weight ([`Weight::matrix`]).
    ExpertSlice,
}

impl WeightRole {
    /// The role of a weight of `shape` that is not the token embedding: a vector, a matrix
    /// or stacked experts by its number of dimensions.
    pub fn of_shape(shape: &[usize]) -> WeightRole {
        match shape.len() {
            0 | 1 => WeightRole::Vector,
            2 => WeightRole::Matrix,
            _ => WeightRole::StackedExperts,
        }
    }
}

/// A tensor to load ([`crate::Device::load_weight`]): what it is and where its packed bytes
/// are.
pub struct WeightSource<'a> {
    /// Tensor name in the model file, for errors.
    pub name: &'a str,
    pub role: WeightRole,
    pub ty: GgmlType,
    /// ggml order: `shape[0]` is the row length.
    pub shape: &'a [usize],
    /// The memory holding the tensor as stored in the file (a backend computing from host
    /// memory may keep referring to it), and the range of its bytes there.
    pub memory: Arc<dyn HostMemory>,
    pub range: Range<usize>,
}

/// A weight tensor (packed in its file type) made usable by a backend.
#[derive(Clone)]
pub struct Weight {
    /// Tensor name in the model file, for errors.
    pub name: String,
    pub role: WeightRole,
    pub ty: GgmlType,
    /// ggml order: `shape[0]` is the row length.
    pub shape: Vec<usize>,
    /// Byte offset of this view's first row inside the payload (non-zero for expert slices).
    pub byte_offset: usize,
    payload: Arc<dyn Any + Send + Sync>,
}

impl Weight {
    /// Wraps a backend's storage of the tensor `source` describes.
    pub fn new(source: &WeightSource<'_>, payload: Arc<dyn Any + Send + Sync>) -> Weight {
        Weight {
            name: source.name.to_string(),
            role: source.role,
            ty: source.ty,
            shape: source.shape.to_vec(),
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
            role: WeightRole::ExpertSlice,
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
    /// tensor goes through MUL_MAT_ID.
    pub fn ggml_layout(&self) -> GgmlLayout {
        if !runit_quant::dot::is_repacked(self.ty, self.rows()) {
            return GgmlLayout::Plain;
        }
        match self.role {
            WeightRole::TokenEmbedding => GgmlLayout::Plain,
            WeightRole::ExpertSlice => GgmlLayout::RepackedExpert,
            WeightRole::Matrix | WeightRole::Vector | WeightRole::StackedExperts => {
                GgmlLayout::Repacked
            }
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

    fn weight(role: WeightRole, ty: GgmlType, shape: &[usize]) -> Weight {
        let source = WeightSource {
            name: "w",
            role,
            ty,
            shape,
            memory: Arc::new(Vec::new()),
            range: 0..0,
        };
        Weight::new(&source, Arc::new(()))
    }

    #[test]
    fn ggml_layout_follows_ggml_cpu_repack_rules() {
        let up = weight(WeightRole::Matrix, GgmlType::Q4_0, &[64, 16]);
        assert_eq!(up.ggml_layout(), GgmlLayout::Repacked);
        let embedding = weight(WeightRole::TokenEmbedding, GgmlType::Q4_0, &[64, 16]);
        assert_eq!(embedding.ggml_layout(), GgmlLayout::Plain);
        let experts = weight(WeightRole::StackedExperts, GgmlType::Q4_K, &[256, 8, 4]);
        assert_eq!(experts.matrix(2).ggml_layout(), GgmlLayout::RepackedExpert);
        // No repack kernel for the type, or rows not a multiple of 8.
        assert_eq!(
            weight(WeightRole::Matrix, GgmlType::Q8_0, &[64, 16]).ggml_layout(),
            GgmlLayout::Plain
        );
        assert_eq!(
            weight(WeightRole::Matrix, GgmlType::Q4_0, &[64, 12]).ggml_layout(),
            GgmlLayout::Plain
        );
    }

    #[test]
    fn roles_by_shape() {
        assert_eq!(WeightRole::of_shape(&[64]), WeightRole::Vector);
        assert_eq!(WeightRole::of_shape(&[64, 16]), WeightRole::Matrix);
        assert_eq!(
            WeightRole::of_shape(&[64, 16, 4]),
            WeightRole::StackedExperts
        );
    }
}
