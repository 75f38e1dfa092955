//! The CPU payloads behind the backend's handles, and checked access to them.
//!
//! Activation buffers own a `Vec<f32>`; weights keep referring to the host memory they were
//! loaded from (zero copy over the memory-mapped model file); KV caches own their cells (f16, f32, ggml blocks or
//! TurboQuant blocks).

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use half::f16;
use runit_backend::{BackendError, Buffer, HostMemory, KvCache, Weight};

use crate::cells::Cells;
use runit_backend::turbo::TurboLayout;
use runit_quant::blocks::{BlockQ4_0, BlockQ8_0};
use runit_quant::GgmlType;

/// Storage of a CPU activation buffer.
pub struct CpuBuffer(pub Vec<f32>);

/// Storage of a CPU weight: a byte range of host memory.
pub struct CpuWeight {
    pub memory: Arc<dyn HostMemory>,
    pub range: Range<usize>,
}

/// Storage of one layer's K or V cache, `[n_cells, width]`: floats, ggml's blocks of 32
/// (a row is `width / 32` blocks), or TurboQuant blocks (`runit_backend::turbo`, bytes).
pub enum CpuKv {
    F16(Cells<f16>),
    F32(Cells<f32>),
    Q8_0(Cells<BlockQ8_0>),
    Q4_0(Cells<BlockQ4_0>),
    Turbo(TurboCells),
}

/// A TurboQuant cache: each row is `blocks` blocks of `layout`, then their outliers'
/// indices (`TurboLayout::row_bytes`).
pub struct TurboCells {
    pub bytes: Cells<u8>,
    pub layout: TurboLayout,
    /// Blocks of a row (`width / turbo::BLOCK`).
    pub blocks: usize,
    /// Keys only: the vector subtracted from every row before it is encoded (`[width]`,
    /// `Device::center_keys`), which moves all the scores of a query by the same amount;
    /// `None` stores the rows as they come.
    pub mean: Option<Vec<f32>>,
}

impl TurboCells {
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.layout.row_bytes(self.blocks)
    }
}

#[cfg(test)]
impl TurboCells {
    /// The bytes of cache row `cell`.
    pub fn bytes_of_row(&self, cell: usize) -> &[u8] {
        let row = self.row_bytes();
        &self.bytes[cell * row..(cell + 1) * row]
    }
}

impl CpuKv {
    /// The bytes of cache row `cell` (of `width` values), or `None` past the end.
    pub fn row_bytes(&self, cell: usize, width: usize) -> Option<&[u8]> {
        fn row<T: bytemuck::Pod>(cells: &[T], cell: usize, per_row: usize) -> Option<&[u8]> {
            cells
                .get(cell * per_row..(cell + 1) * per_row)
                .map(bytemuck::cast_slice)
        }
        match self {
            CpuKv::F16(cells) => row(cells, cell, width),
            CpuKv::F32(cells) => row(cells, cell, width),
            CpuKv::Q8_0(cells) => row(cells, cell, width / 32),
            CpuKv::Q4_0(cells) => row(cells, cell, width / 32),
            CpuKv::Turbo(cells) => row(&cells.bytes, cell, cells.row_bytes()),
        }
    }

    /// Number of stored elements.
    pub fn elements(&self) -> usize {
        match self {
            CpuKv::F16(cells) => cells.len(),
            CpuKv::F32(cells) => cells.len(),
            CpuKv::Q8_0(cells) => cells.len() * 32,
            CpuKv::Q4_0(cells) => cells.len() * 32,
            CpuKv::Turbo(cells) => {
                cells.bytes.len() / cells.row_bytes() * cells.blocks * runit_backend::turbo::BLOCK
            }
        }
    }
}

/// The f32 elements of a CPU buffer.
pub fn data<'a>(
    buffer: &'a Buffer,
    op: &'static str,
    what: &'static str,
) -> Result<&'a [f32], BackendError> {
    buffer
        .payload::<CpuBuffer>()
        .map(|b| b.0.as_slice())
        .ok_or(BackendError::ForeignBuffer { op, what })
}

/// Mutable twin of [`data`].
pub fn data_mut<'a>(
    buffer: &'a mut Buffer,
    op: &'static str,
    what: &'static str,
) -> Result<&'a mut [f32], BackendError> {
    buffer
        .payload_mut::<CpuBuffer>()
        .map(|b| b.0.as_mut_slice())
        .ok_or(BackendError::ForeignBuffer { op, what })
}

/// The cells of a CPU KV cache (checked to hold `n_cells × width` elements).
pub fn kv<'a>(
    cache: &'a KvCache,
    op: &'static str,
    what: &'static str,
) -> Result<&'a CpuKv, BackendError> {
    let expected = product(op, "cache cells × width", cache.n_cells, cache.width)?;
    let cells = cache
        .payload::<CpuKv>()
        .ok_or(BackendError::ForeignBuffer { op, what })?;
    exactly(op, "cache storage elements", expected, cells.elements())?;
    Ok(cells)
}

/// Mutable twin of [`kv`].
pub fn kv_mut<'a>(
    cache: &'a mut KvCache,
    op: &'static str,
    what: &'static str,
) -> Result<&'a mut CpuKv, BackendError> {
    let expected = product(op, "cache cells × width", cache.n_cells, cache.width)?;
    let cells = cache
        .payload_mut::<CpuKv>()
        .ok_or(BackendError::ForeignBuffer { op, what })?;
    exactly(op, "cache storage elements", expected, cells.elements())?;
    Ok(cells)
}

/// The packed bytes of a weight view (all of its rows, from its `byte_offset`).
pub fn weight_bytes<'a>(weight: &'a Weight, op: &'static str) -> Result<&'a [u8], BackendError> {
    let storage = weight
        .payload::<CpuWeight>()
        .ok_or(BackendError::ForeignBuffer { op, what: "weight" })?;
    let all = &storage.memory.bytes()[storage.range.clone()];
    let len = weight_len(weight, op)?;
    let end = weight.byte_offset.saturating_add(len);
    all.get(weight.byte_offset..end).ok_or(BackendError::Shape {
        op,
        what: "weight bytes",
        expected: end,
        found: all.len(),
    })
}

/// Bytes a weight of this type and shape occupies.
pub fn weight_len(weight: &Weight, op: &'static str) -> Result<usize, BackendError> {
    packed_len(weight.ty, &weight.shape).ok_or(BackendError::Shape {
        op,
        what: "weight row length (whole blocks)",
        expected: weight.ty.block_size(),
        found: weight.shape.first().copied().unwrap_or(0),
    })
}

/// Bytes of a tensor of type `ty` and ggml shape `shape`, or `None` when the rows are not
/// whole blocks or the size overflows.
pub fn packed_len(ty: GgmlType, shape: &[usize]) -> Option<usize> {
    let (&row, rest) = shape.split_first()?;
    let row_bytes = ty.row_bytes(row as u64)?;
    let rows = rest
        .iter()
        .try_fold(1usize, |acc, &dim| acc.checked_mul(dim))?;
    usize::try_from(row_bytes).ok()?.checked_mul(rows)
}

/// A weight's values as f32: borrowed when it is an aligned F32 tensor, else dequantized.
pub fn weight_f32<'a>(
    weight: &'a Weight,
    op: &'static str,
) -> Result<Cow<'a, [f32]>, BackendError> {
    let bytes = weight_bytes(weight, op)?;
    if weight.ty == GgmlType::F32 {
        if let Ok(values) = bytemuck::try_cast_slice::<u8, f32>(bytes) {
            return Ok(Cow::Borrowed(values));
        }
    }
    let mut values = vec![0.0f32; weight.n_elements()];
    runit_quant::dequantize(weight.ty, bytes, &mut values).map_err(|error| {
        BackendError::Device {
            backend: "cpu".to_string(),
            op,
            message: format!("tensor {}: {error}", weight.name),
        }
    })?;
    Ok(Cow::Owned(values))
}

/// Fails with a shape error unless `found == expected`.
pub fn exactly(
    op: &'static str,
    what: &'static str,
    expected: usize,
    found: usize,
) -> Result<(), BackendError> {
    if found != expected {
        return Err(BackendError::Shape {
            op,
            what,
            expected,
            found,
        });
    }
    Ok(())
}

/// `a * b`, or a shape error naming `what` when it overflows.
pub fn product(
    op: &'static str,
    what: &'static str,
    a: usize,
    b: usize,
) -> Result<usize, BackendError> {
    a.checked_mul(b).ok_or(BackendError::Shape {
        op,
        what,
        expected: usize::MAX,
        found: a,
    })
}

pub use runit_backend::at_least;
