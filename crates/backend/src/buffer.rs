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

/// Element type of a KV cache (keys and values each have their own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum KvType {
    F32,
    /// llama.cpp's default.
    #[default]
    F16,
    /// ggml's Q8_0 blocks: 32 values, an f16 scale and 32 signed bytes (8.5 bits a value).
    Q8_0,
    /// ggml's Q4_0 blocks: 32 values, an f16 scale and 32 nibbles (4.5 bits a value).
    Q4_0,
    /// TurboQuant at 4 bits a coordinate (`runit_backend::turbo`).
    Tq4,
    /// TurboQuant at 3 bits a coordinate (`runit_backend::turbo`).
    Tq3,
}

impl KvType {
    /// Every type, in the order the flags list them.
    pub const ALL: [KvType; 6] = [
        KvType::F16,
        KvType::F32,
        KvType::Q8_0,
        KvType::Q4_0,
        KvType::Tq4,
        KvType::Tq3,
    ];

    /// The name the flags and llama.cpp (`-ctk`, `-ctv`) use.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
            KvType::Tq4 => "tq4",
            KvType::Tq3 => "tq3",
        }
    }

    /// Values stored together (a row's width must be a multiple): 1 for the float types,
    /// ggml's 32 for Q8_0 and Q4_0, a rotation block for TurboQuant.
    pub fn block_size(self) -> usize {
        match self {
            KvType::F32 | KvType::F16 => 1,
            KvType::Q8_0 | KvType::Q4_0 => 32,
            KvType::Tq4 | KvType::Tq3 => crate::turbo::BLOCK,
        }
    }

    /// Bytes of one block of [`KvType::block_size`] values in a cache of `role` (for
    /// TurboQuant without its outliers' indices, which the row keeps after its blocks).
    pub fn block_bytes(self, role: KvRole) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
            KvType::Q8_0 => 34,
            KvType::Q4_0 => 18,
            KvType::Tq4 => crate::turbo::TurboLayout::new(4, role).block_bytes(),
            KvType::Tq3 => crate::turbo::TurboLayout::new(3, role).block_bytes(),
        }
    }

    /// Bytes of one cache row of `width` values in a cache of `role`, or `None` when the
    /// width is not a whole number of blocks.
    pub fn row_bytes(self, width: usize, role: KvRole) -> Option<usize> {
        let blocks = width / self.block_size();
        width.is_multiple_of(self.block_size()).then(|| match self {
            KvType::Tq4 => crate::turbo::TurboLayout::new(4, role).row_bytes(blocks),
            KvType::Tq3 => crate::turbo::TurboLayout::new(3, role).row_bytes(blocks),
            _ => blocks * self.block_bytes(role),
        })
    }

    /// Whether this is a TurboQuant type.
    pub fn is_turbo(self) -> bool {
        matches!(self, KvType::Tq4 | KvType::Tq3)
    }

    /// Refuses a row of `head_dim` values per head that this type cannot store (a head
    /// must be a whole number of blocks: blocks never straddle two heads).
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), KvTypeError> {
        if head_dim.is_multiple_of(self.block_size()) && head_dim > 0 {
            Ok(())
        } else {
            Err(KvTypeError::HeadDim {
                ty: self,
                head_dim,
                block: self.block_size(),
            })
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvType {
    type Err = KvTypeError;

    fn from_str(name: &str) -> Result<KvType, KvTypeError> {
        KvType::ALL
            .into_iter()
            .find(|ty| ty.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| KvTypeError::Unknown(name.to_string()))
    }
}

/// Whether a cache holds keys or values (TurboQuant stores them differently: keys carry
/// the sign sketch of their residual).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvRole {
    Keys,
    Values,
}

/// The element types of the key and the value caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct KvTypes {
    pub keys: KvType,
    pub values: KvType,
}

impl KvTypes {
    /// TurboQuant's pair (`--tq`): 4-bit keys (3-bit codes and the 1-bit residual sketch)
    /// and 3-bit values.
    pub const TURBO: KvTypes = KvTypes {
        keys: KvType::Tq4,
        values: KvType::Tq3,
    };

    /// Keys and values of one type.
    pub const fn uniform(ty: KvType) -> KvTypes {
        KvTypes {
            keys: ty,
            values: ty,
        }
    }

    /// Bytes of one token's keys and values in one layer of `width` values each, or
    /// `None` when the width is not a whole number of either type's blocks.
    pub fn token_bytes(self, width: usize) -> Option<usize> {
        Some(
            self.keys.row_bytes(width, KvRole::Keys)?
                + self.values.row_bytes(width, KvRole::Values)?,
        )
    }

    /// Refuses what no backend stores: heads that are not a whole number of either type's
    /// blocks, and TurboQuant for only one of keys and values (its attention runs in the
    /// rotated basis of both).
    pub fn check(self, head_dim: usize) -> Result<(), KvTypeError> {
        self.keys.check_head_dim(head_dim)?;
        self.values.check_head_dim(head_dim)?;
        if self.keys.is_turbo() != self.values.is_turbo() {
            return Err(KvTypeError::HalfTurbo(self));
        }
        Ok(())
    }

    /// The type of the cache of `role`.
    pub fn of(self, role: KvRole) -> KvType {
        match role {
            KvRole::Keys => self.keys,
            KvRole::Values => self.values,
        }
    }
}

impl From<KvType> for KvTypes {
    fn from(ty: KvType) -> KvTypes {
        KvTypes::uniform(ty)
    }
}

impl std::fmt::Display for KvTypes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "K {} / V {}", self.keys, self.values)
    }
}

/// A KV cache type that was asked for and cannot be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KvTypeError {
    #[error("unknown KV cache type {0:?}; supported: f16, f32, q8_0, q4_0, tq4, tq3")]
    Unknown(String),
    #[error(
        "KV cache type {ty} stores heads in blocks of {block} values; head dimension {head_dim} is not a multiple"
    )]
    HeadDim {
        ty: KvType,
        head_dim: usize,
        block: usize,
    },
    #[error("KV cache types {0}: TurboQuant (tq4, tq3) is for keys and values together")]
    HalfTurbo(KvTypes),
}

/// One layer's key or value cache: `n_cells` slots of `width` elements (heads of
/// `head_dim`).
pub struct KvCache {
    pub n_cells: usize,
    pub width: usize,
    pub head_dim: usize,
    pub ty: KvType,
    pub role: KvRole,
    payload: Box<dyn Any + Send + Sync>,
}

impl KvCache {
    /// Wraps a backend's storage.
    pub fn new(
        n_cells: usize,
        width: usize,
        head_dim: usize,
        ty: KvType,
        role: KvRole,
        payload: Box<dyn Any + Send + Sync>,
    ) -> KvCache {
        KvCache {
            n_cells,
            width,
            head_dim,
            ty,
            role,
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
