//! The GGUF header parser: magic, version, metadata and tensor table, checked against hostile
//! input. Every length and count is compared with the bytes left in the file before anything
//! is allocated, so a file can never make the reader allocate much more than its own size.

use std::collections::HashMap;

use runit_quant::GgmlType;

use crate::error::GgufError;
use crate::tensor::{align_up, tensor_bytes, ShapeProblem, TensorInfo, MAX_DIMS};
use crate::value::{Array, Value, ValueType};

/// Deepest nesting of arrays inside arrays the reader accepts.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The key that sets the data alignment.
pub(crate) const ALIGNMENT_KEY: &str = "general.alignment";

/// The fewest bytes a metadata entry can occupy: key length, value type, one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// The fewest bytes a tensor-table entry can occupy: name length, n_dims, type, offset.
const MIN_TENSOR_BYTES: u64 = 8 + 4 + 4 + 8;

/// Everything the header says, validated.
#[derive(Debug)]
pub(crate) struct Header {
    pub version: u32,
    pub alignment: u64,
    pub data_offset: u64,
    pub metadata: Vec<(String, Value)>,
    pub key_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
}

/// A read position over the file's bytes; every read is bounds-checked.
struct Cursor<'a> {
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.position as u64
    }

    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.position) as u64
    }

    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.offset(),
                needed: n,
                remaining: self.remaining(),
            });
        }
        let start = self.position;
        // `n <= remaining` so it fits in usize.
        self.position += n as usize;
        Ok(&self.bytes[start..self.position])
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, what)?;
        Ok(bytes.try_into().expect("take returned exactly N bytes"))
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Reads a u64 count of items that each take at least `min_item_bytes`, refusing counts the
    /// rest of the file cannot hold.
    fn count(&mut self, min_item_bytes: u64, what: impl Fn() -> String) -> Result<u64, GgufError> {
        let offset = self.offset();
        let count = self.u64(&what)?;
        let max = self.remaining() / min_item_bytes;
        if count > max {
            return Err(GgufError::CountTooLarge {
                what: what(),
                count,
                offset,
                remaining: self.remaining(),
                max,
            });
        }
        Ok(count)
    }

    fn string(&mut self, what: impl Fn() -> String) -> Result<String, GgufError> {
        let offset = self.offset();
        let length = self.u64(|| format!("length of {}", what()))?;
        if length > self.remaining() {
            return Err(GgufError::StringTooLong {
                what: what(),
                length,
                offset,
                remaining: self.remaining(),
            });
        }
        let start = self.offset();
        let bytes = self.take(length, &what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 {
            what: what(),
            offset: start,
        })
    }

    fn value_type(&mut self, key: &str) -> Result<ValueType, GgufError> {
        let offset = self.offset();
        let type_id = self.u32(|| format!("value type of key `{key}`"))?;
        ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_string(),
            type_id,
            offset,
        })
    }

    fn value(&mut self, key: &str, value_type: ValueType) -> Result<Value, GgufError> {
        let what = || format!("value of key `{key}`");
        Ok(match value_type {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => Value::Bool(self.array::<1>(what)?[0] != 0),
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => Value::Array(self.array_value(key, 1)?),
        })
    }

    /// Reads an array header (element type, count) and its elements; `depth` is 1 for an array
    /// that is a metadata value, 2 for an array inside it, and so on.
    fn array_value(&mut self, key: &str, depth: usize) -> Result<Array, GgufError> {
        let header_offset = self.offset();
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::ArrayTooDeep {
                key: key.to_string(),
                offset: header_offset,
                max_depth: MAX_ARRAY_DEPTH,
            });
        }
        let element_type = self.value_type(key)?;
        let count = self.count(element_type.min_encoded_size() as u64, || {
            format!("element count of array `{key}`")
        })?;
        // `count * min_encoded_size <= remaining`, so `count` fits in usize.
        let count = count as usize;
        let what = || format!("elements of array `{key}`");
        if let Some(size) = element_type.fixed_size() {
            let bytes = self.take((count * size) as u64, what)?;
            return Ok(decode_fixed(element_type, bytes));
        }
        let mut array = Array::with_capacity(element_type, count);
        match &mut array {
            Array::String(strings) => {
                for index in 0..count {
                    strings.push(self.string(|| format!("element {index} of array `{key}`"))?);
                }
            }
            Array::Array(arrays) => {
                for _ in 0..count {
                    arrays.push(self.array_value(key, depth + 1)?);
                }
            }
            _ => unreachable!("fixed-size element types returned above"),
        }
        Ok(array)
    }
}

/// Decodes `bytes` (a whole number of `element_type` values) into a typed array.
fn decode_fixed(element_type: ValueType, bytes: &[u8]) -> Array {
    fn collect<const N: usize, T>(bytes: &[u8], decode: fn([u8; N]) -> T) -> Vec<T> {
        bytes
            .chunks_exact(N)
            .map(|chunk| decode(chunk.try_into().expect("chunks_exact yields N bytes")))
            .collect()
    }
    match element_type {
        ValueType::U8 => Array::U8(bytes.to_vec()),
        ValueType::I8 => Array::I8(collect(bytes, i8::from_le_bytes)),
        ValueType::Bool => Array::Bool(bytes.iter().map(|&b| b != 0).collect()),
        ValueType::U16 => Array::U16(collect(bytes, u16::from_le_bytes)),
        ValueType::I16 => Array::I16(collect(bytes, i16::from_le_bytes)),
        ValueType::U32 => Array::U32(collect(bytes, u32::from_le_bytes)),
        ValueType::I32 => Array::I32(collect(bytes, i32::from_le_bytes)),
        ValueType::F32 => Array::F32(collect(bytes, f32::from_le_bytes)),
        ValueType::U64 => Array::U64(collect(bytes, u64::from_le_bytes)),
        ValueType::I64 => Array::I64(collect(bytes, i64::from_le_bytes)),
        ValueType::F64 => Array::F64(collect(bytes, f64::from_le_bytes)),
        ValueType::String | ValueType::Array => unreachable!("not a fixed-size type"),
    }
}

/// Parses and validates the header of a GGUF file whose bytes are `bytes`.
pub(crate) fn parse(bytes: &[u8]) -> Result<Header, GgufError> {
    let mut cursor = Cursor { bytes, position: 0 };
    let magic: [u8; 4] = cursor.array(|| "magic".to_string())?;
    if &magic != b"GGUF" {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = cursor.u32(|| "version".to_string())?;
    if version & 0xffff == 0 && (1..=3).contains(&version.swap_bytes()) {
        return Err(GgufError::BigEndian {
            raw: version,
            version: version.swap_bytes(),
        });
    }
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion { version });
    }

    let n_tensors = cursor.count(MIN_TENSOR_BYTES, || "tensor count".to_string())?;
    let n_kv = cursor.count(MIN_KV_BYTES, || "metadata entry count".to_string())?;
    let table_minimum = n_tensors * MIN_TENSOR_BYTES;
    if table_minimum + n_kv * MIN_KV_BYTES > cursor.remaining() {
        let max = cursor.remaining().saturating_sub(table_minimum) / MIN_KV_BYTES;
        return Err(GgufError::CountTooLarge {
            what: format!("metadata entry count (with {n_tensors} tensors)"),
            count: n_kv,
            offset: 16,
            remaining: cursor.remaining(),
            max,
        });
    }

    // Both counts are bounded by the file size, so the capacities are too.
    let mut metadata = Vec::with_capacity(n_kv as usize);
    let mut key_index = HashMap::with_capacity(n_kv as usize);
    let mut alignment = DEFAULT_ALIGNMENT;
    for index in 0..n_kv {
        let entry_offset = cursor.offset();
        let key = cursor.string(|| format!("key of metadata entry {index}"))?;
        if key_index.contains_key(&key) {
            return Err(GgufError::DuplicateKey {
                key,
                offset: entry_offset,
            });
        }
        let value_type = cursor.value_type(&key)?;
        let value = cursor.value(&key, value_type)?;
        if key == ALIGNMENT_KEY {
            alignment = checked_alignment(&key, &value, entry_offset)?;
        }
        key_index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
    let mut entry_offsets = Vec::with_capacity(n_tensors as usize);
    for index in 0..n_tensors {
        let entry_offset = cursor.offset();
        let tensor = read_tensor_info(&mut cursor, index)?;
        if tensor_index.contains_key(&tensor.name) {
            return Err(GgufError::DuplicateTensor {
                tensor: tensor.name,
                offset: entry_offset,
            });
        }
        tensor_index.insert(tensor.name.clone(), tensors.len());
        tensors.push(tensor);
        entry_offsets.push(entry_offset);
    }

    let data_offset =
        align_up(cursor.offset(), alignment).expect("header end is far below u64::MAX");
    check_tensor_placement(
        &tensors,
        &entry_offsets,
        data_offset,
        alignment,
        bytes.len() as u64,
    )?;
    Ok(Header {
        version,
        alignment,
        data_offset,
        metadata,
        key_index,
        tensors,
        tensor_index,
    })
}

/// The alignment `value` sets, when it is an integer that is a nonzero power of two within u32.
fn checked_alignment(key: &str, value: &Value, offset: u64) -> Result<u64, GgufError> {
    let Some(integer) = value.as_integer() else {
        return Err(GgufError::WrongType {
            key: key.to_string(),
            expected: "u32",
            found: value.type_description(),
        });
    };
    match u32::try_from(integer) {
        Ok(alignment) if alignment.is_power_of_two() => Ok(alignment.into()),
        _ => Err(GgufError::BadAlignment {
            value: value.as_u64().unwrap_or(0),
            offset,
        }),
    }
}

/// Reads one tensor-table entry and checks its type and shape.
fn read_tensor_info(cursor: &mut Cursor<'_>, index: u64) -> Result<TensorInfo, GgufError> {
    let entry_offset = cursor.offset();
    let name = cursor.string(|| format!("name of tensor {index}"))?;
    let dims_offset = cursor.offset();
    let n_dims = cursor.u32(|| format!("dimension count of tensor `{name}`"))?;
    if n_dims as usize > MAX_DIMS {
        return Err(GgufError::TooManyDims {
            tensor: name,
            n_dims,
            offset: dims_offset,
            max: MAX_DIMS,
        });
    }
    let mut shape = Vec::with_capacity(n_dims as usize);
    for axis in 0..n_dims {
        shape.push(cursor.u64(|| format!("dimension {axis} of tensor `{name}`"))?);
    }
    let type_offset = cursor.offset();
    let type_id = cursor.u32(|| format!("type of tensor `{name}`"))?;
    let Some(ty) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnknownTensorType {
            tensor: name,
            type_id,
            offset: type_offset,
        });
    };
    let offset = cursor.u64(|| format!("data offset of tensor `{name}`"))?;
    let n_bytes = match tensor_bytes(ty, &shape) {
        Ok(n_bytes) => n_bytes,
        Err(ShapeProblem::RowNotBlockMultiple) => {
            return Err(GgufError::RowNotBlockMultiple {
                tensor: name,
                ty,
                row_length: shape.first().copied().unwrap_or(1),
                block_size: ty.block_size(),
                offset: entry_offset,
            })
        }
        Err(ShapeProblem::Overflow | ShapeProblem::TooManyDims) => {
            return Err(GgufError::ShapeOverflow {
                tensor: name,
                shape,
                offset: dims_offset,
            })
        }
    };
    Ok(TensorInfo {
        name,
        ty,
        shape,
        offset,
        n_bytes,
    })
}

/// Checks that every tensor is aligned, lies inside the file, and overlaps no other tensor.
fn check_tensor_placement(
    tensors: &[TensorInfo],
    entry_offsets: &[u64],
    data_offset: u64,
    alignment: u64,
    file_size: u64,
) -> Result<(), GgufError> {
    let mut ranges = Vec::with_capacity(tensors.len());
    for (index, (tensor, &entry_offset)) in tensors.iter().zip(entry_offsets).enumerate() {
        if tensor.offset % alignment != 0 {
            return Err(GgufError::MisalignedTensor {
                tensor: tensor.name.clone(),
                data_offset: tensor.offset,
                alignment,
                offset: entry_offset,
            });
        }
        let start = data_offset.checked_add(tensor.offset);
        let end = start.and_then(|start| start.checked_add(tensor.n_bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_size => ranges.push((start, end, index)),
            _ => {
                let start = data_offset.saturating_add(tensor.offset);
                return Err(GgufError::TensorOutOfBounds {
                    tensor: tensor.name.clone(),
                    start,
                    end: start.saturating_add(tensor.n_bytes),
                    file_size,
                    offset: entry_offset,
                });
            }
        }
    }
    ranges.retain(|&(start, end, _)| start < end);
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        let (other_start, other_end, other) = pair[0];
        let (start, end, index) = pair[1];
        if start < other_end {
            return Err(GgufError::TensorOverlap {
                tensor: tensors[index].name.clone(),
                start,
                end,
                other: tensors[other].name.clone(),
                other_start,
                other_end,
            });
        }
    }
    Ok(())
}
