//! [`GgufWriter`]: writes GGUF v3 files. Tensor offsets are computed from types and shapes up
//! front, so tensor data is streamed one tensor at a time (requantizing a 7B model never holds
//! more than one output tensor in memory).

use std::borrow::Cow;
use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::Path;

use runit_quant::GgmlType;

use crate::error::GgufError;
use crate::parse::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH};
use crate::tensor::{align_up, tensor_bytes, ShapeProblem, TensorInfo, MAX_DIMS};
use crate::value::{Array, Value};

/// The GGUF version the writer produces.
pub const WRITE_VERSION: u32 = 3;

/// Builds a GGUF file: metadata and tensor descriptions first, then one write that streams
/// the tensor data.
#[derive(Debug, Clone)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    keys: HashSet<String>,
    tensors: Vec<(String, GgmlType, Vec<u64>, u64)>,
    tensor_names: HashSet<String>,
    alignment: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

impl GgufWriter {
    /// An empty writer: version 3, alignment 32 (or `general.alignment` once that key is added).
    pub fn new() -> GgufWriter {
        GgufWriter {
            metadata: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            tensor_names: HashSet::new(),
            alignment: DEFAULT_ALIGNMENT,
        }
    }

    /// Adds a metadata entry (written in the order added). A duplicate key is an error, and so
    /// is a `general.alignment` that is not a nonzero power of two in u32.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: Value) -> Result<(), GgufError> {
        let key = key.into();
        if self.keys.contains(&key) {
            return Err(GgufError::InvalidMetadata {
                key,
                reason: "the key was already added".to_string(),
            });
        }
        if let Value::Array(array) = &value {
            if array.depth() > MAX_ARRAY_DEPTH {
                return Err(GgufError::InvalidMetadata {
                    key,
                    reason: format!(
                        "arrays nested {} deep; readers accept at most {MAX_ARRAY_DEPTH}",
                        array.depth()
                    ),
                });
            }
        }
        if key == ALIGNMENT_KEY {
            match value {
                Value::U32(alignment) if alignment.is_power_of_two() => {
                    self.alignment = alignment.into();
                }
                _ => {
                    return Err(GgufError::InvalidMetadata {
                        key,
                        reason: format!("must be a u32 nonzero power of two, got {value:?}"),
                    })
                }
            }
        }
        self.keys.insert(key.clone());
        self.metadata.push((key, value));
        Ok(())
    }

    /// Adds a tensor description (written in the order added). `shape` is in ggml order
    /// (`shape[0]` = row length), at most 4 dimensions, the row a whole number of blocks.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        shape: Vec<u64>,
    ) -> Result<(), GgufError> {
        let name = name.into();
        let invalid = |reason: String| GgufError::InvalidTensor {
            tensor: name.clone(),
            reason,
        };
        if self.tensor_names.contains(&name) {
            return Err(invalid(
                "a tensor of that name was already added".to_string(),
            ));
        }
        let n_bytes = tensor_bytes(ty, &shape).map_err(|problem| {
            invalid(match problem {
                ShapeProblem::TooManyDims => {
                    format!("{} dimensions, at most {MAX_DIMS} allowed", shape.len())
                }
                ShapeProblem::Overflow => format!("shape {shape:?} overflows 64-bit sizes"),
                ShapeProblem::RowNotBlockMultiple => format!(
                    "row length {} is not a multiple of {ty}'s block size {}",
                    shape.first().copied().unwrap_or(1),
                    ty.block_size()
                ),
            })
        })?;
        self.tensor_names.insert(name.clone());
        self.tensors.push((name, ty, shape, n_bytes));
        Ok(())
    }

    /// The tensor table as it will be written: offsets relative to the data section.
    pub fn tensor_infos(&self) -> Result<Vec<TensorInfo>, GgufError> {
        let mut offset = 0u64;
        let mut infos = Vec::with_capacity(self.tensors.len());
        for (name, ty, shape, n_bytes) in &self.tensors {
            infos.push(TensorInfo {
                name: name.clone(),
                ty: *ty,
                shape: shape.clone(),
                offset,
                n_bytes: *n_bytes,
            });
            offset = offset
                .checked_add(*n_bytes)
                .and_then(|end| align_up(end, self.alignment))
                .ok_or_else(|| GgufError::InvalidTensor {
                    tensor: name.clone(),
                    reason: "the data section would exceed 64-bit offsets".to_string(),
                })?;
        }
        Ok(infos)
    }

    /// Writes header, metadata and tensor table, then asks `data(index, &info)` for each
    /// tensor's bytes in order (their length must equal `info.n_bytes`), padding each tensor
    /// to the alignment with zeros.
    pub fn write<'data, W, F>(self, out: W, mut data: F) -> Result<(), GgufError>
    where
        W: Write,
        F: FnMut(usize, &TensorInfo) -> Result<Cow<'data, [u8]>, GgufError>,
    {
        let infos = self.tensor_infos()?;
        let mut out = Counting {
            inner: BufWriter::with_capacity(1 << 20, out),
            written: 0,
        };
        out.write_all(b"GGUF")?;
        out.write_all(&WRITE_VERSION.to_le_bytes())?;
        out.write_all(&(infos.len() as u64).to_le_bytes())?;
        out.write_all(&(self.metadata.len() as u64).to_le_bytes())?;
        for (key, value) in &self.metadata {
            write_string(&mut out, key)?;
            out.write_all(&value.value_type().id().to_le_bytes())?;
            write_value(&mut out, value)?;
        }
        for info in &infos {
            write_string(&mut out, &info.name)?;
            out.write_all(&(info.shape.len() as u32).to_le_bytes())?;
            for dim in &info.shape {
                out.write_all(&dim.to_le_bytes())?;
            }
            out.write_all(&info.ty.id().to_le_bytes())?;
            out.write_all(&info.offset.to_le_bytes())?;
        }
        pad(&mut out, self.alignment)?;
        let data_offset = out.written;
        for (index, info) in infos.iter().enumerate() {
            let bytes = data(index, info)?;
            if bytes.len() as u64 != info.n_bytes {
                return Err(GgufError::TensorDataLength {
                    tensor: info.name.clone(),
                    expected: info.n_bytes,
                    found: bytes.len() as u64,
                });
            }
            debug_assert_eq!(out.written - data_offset, info.offset);
            out.write_all(&bytes)?;
            pad(&mut out, self.alignment)?;
        }
        out.flush()?;
        Ok(())
    }

    /// Like [`GgufWriter::write`], into a temporary file beside `path` that is renamed to
    /// `path` once complete (a failed write leaves no partial file behind). Errors name `path`.
    pub fn write_to_path<'data, F>(self, path: impl AsRef<Path>, data: F) -> Result<(), GgufError>
    where
        F: FnMut(usize, &TensorInfo) -> Result<Cow<'data, [u8]>, GgufError>,
    {
        let path = path.as_ref();
        let mut temporary_name = path.file_name().unwrap_or_default().to_os_string();
        temporary_name.push(format!(".tmp-{}", std::process::id()));
        let temporary = path.with_file_name(temporary_name);
        let result = (|| {
            let mut file = File::create(&temporary)?;
            self.write(&mut file, data)?;
            file.sync_all()?;
            fs::rename(&temporary, path)?;
            Ok(())
        })();
        if result.is_err() {
            // Best effort: the temporary file may not exist if creating it failed.
            let _ = fs::remove_file(&temporary);
        }
        result.map_err(|error: GgufError| error.in_file(path))
    }
}

/// A writer that counts the bytes written (to pad to the alignment).
struct Counting<W> {
    inner: W,
    written: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(bytes)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn pad<W: Write>(out: &mut Counting<W>, alignment: u64) -> Result<(), GgufError> {
    let target = align_up(out.written, alignment).expect("file offsets are far below u64::MAX");
    let zeros = vec![0u8; (target - out.written) as usize];
    out.write_all(&zeros)?;
    Ok(())
}

fn write_string(out: &mut impl Write, text: &str) -> Result<(), GgufError> {
    out.write_all(&(text.len() as u64).to_le_bytes())?;
    out.write_all(text.as_bytes())?;
    Ok(())
}

fn write_value(out: &mut impl Write, value: &Value) -> Result<(), GgufError> {
    match value {
        Value::U8(v) => out.write_all(&v.to_le_bytes())?,
        Value::I8(v) => out.write_all(&v.to_le_bytes())?,
        Value::U16(v) => out.write_all(&v.to_le_bytes())?,
        Value::I16(v) => out.write_all(&v.to_le_bytes())?,
        Value::U32(v) => out.write_all(&v.to_le_bytes())?,
        Value::I32(v) => out.write_all(&v.to_le_bytes())?,
        Value::U64(v) => out.write_all(&v.to_le_bytes())?,
        Value::I64(v) => out.write_all(&v.to_le_bytes())?,
        Value::F32(v) => out.write_all(&v.to_le_bytes())?,
        Value::F64(v) => out.write_all(&v.to_le_bytes())?,
        Value::Bool(v) => out.write_all(&[u8::from(*v)])?,
        Value::String(v) => write_string(out, v)?,
        Value::Array(array) => write_array(out, array)?,
    }
    Ok(())
}

/// Writes an array: element type, count, elements.
fn write_array(out: &mut impl Write, array: &Array) -> Result<(), GgufError> {
    out.write_all(&array.element_type().id().to_le_bytes())?;
    out.write_all(&(array.len() as u64).to_le_bytes())?;
    fn each<T, W: Write, const N: usize>(
        out: &mut W,
        values: &[T],
        encode: impl Fn(&T) -> [u8; N],
    ) -> Result<(), GgufError> {
        for value in values {
            out.write_all(&encode(value))?;
        }
        Ok(())
    }
    match array {
        Array::U8(values) => out.write_all(values)?,
        Array::I8(values) => each(out, values, |v| v.to_le_bytes())?,
        Array::U16(values) => each(out, values, |v| v.to_le_bytes())?,
        Array::I16(values) => each(out, values, |v| v.to_le_bytes())?,
        Array::U32(values) => each(out, values, |v| v.to_le_bytes())?,
        Array::I32(values) => each(out, values, |v| v.to_le_bytes())?,
        Array::U64(values) => each(out, values, |v| v.to_le_bytes())?,
        Array::I64(values) => each(out, values, |v| v.to_le_bytes())?,
        Array::F32(values) => each(out, values, |v| v.to_le_bytes())?,
        Array::F64(values) => each(out, values, |v| v.to_le_bytes())?,
        Array::Bool(values) => each(out, values, |v| [u8::from(*v)])?,
        Array::String(values) => {
            for value in values {
                write_string(out, value)?;
            }
        }
        Array::Array(values) => {
            for value in values {
                write_array(out, value)?;
            }
        }
    }
    Ok(())
}
