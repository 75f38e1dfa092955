//! [`GgufFile`]: an opened GGUF file (memory map or owned bytes), its metadata with typed
//! getters, and zero-copy views of its tensors.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::GgufError;
use crate::parse::{parse, Header};
use crate::tensor::TensorInfo;
use crate::value::{Array, Value};

/// Where the file's bytes live.
enum Storage {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(map) => map,
            Storage::Owned(bytes) => bytes,
        }
    }
}

/// A parsed and validated GGUF file (version 2 or 3, little-endian).
///
/// Opening checks the whole header against the file size: every tensor lies inside the file,
/// aligned, overlapping no other, so [`GgufFile::tensor_data`] is a plain slice.
pub struct GgufFile {
    storage: Storage,
    path: Option<PathBuf>,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("file_size", &self.file_size())
            .field("metadata_entries", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish_non_exhaustive()
    }
}

impl GgufFile {
    /// Memory-maps the file at `path`, then parses and validates it. Errors name the path.
    ///
    /// The file must not be modified or truncated while the returned `GgufFile` (or any
    /// tensor borrowed from it) lives: the map reads the file's current contents.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| GgufError::from(source).in_file(path))?;
        // SAFETY: the map is only sound while nobody modifies or truncates the file: RunIT
        // never writes to a model file it has open, and the caller must not let other
        // processes change it while this `GgufFile` lives (a truncated file would make reads
        // of the map fault). Every read goes through bounds-checked slices of the map.
        let map =
            unsafe { Mmap::map(&file) }.map_err(|source| GgufError::from(source).in_file(path))?;
        GgufFile::from_storage(Storage::Mapped(map), Some(path.to_path_buf()))
            .map_err(|error| error.in_file(path))
    }

    /// Parses and validates a GGUF file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        GgufFile::from_storage(Storage::Owned(bytes), None)
    }

    fn from_storage(storage: Storage, path: Option<PathBuf>) -> Result<GgufFile, GgufError> {
        let Header {
            version,
            alignment,
            data_offset,
            metadata,
            key_index,
            tensors,
            tensor_index,
        } = parse(storage.bytes())?;
        Ok(GgufFile {
            storage,
            path,
            version,
            alignment,
            data_offset,
            metadata,
            key_index,
            tensors,
            tensor_index,
        })
    }

    /// The path the file was opened from (`None` for [`GgufFile::from_bytes`]).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data alignment: `general.alignment`, or 32 when absent.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the tensor data section (the end of the tensor table, aligned up).
    /// For a file without tensors this may lie past the end of the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the file in bytes.
    pub fn file_size(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    /// All metadata entries in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of metadata key `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index
            .get(key)
            .map(|&index| &self.metadata[index].1)
    }

    /// All tensor-table entries in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index
            .get(name)
            .map(|&index| &self.tensors[index])
    }

    /// The whole file's bytes (the memory map), for backends that read weights in place
    /// through absolute offsets (`data_offset() + tensor.offset`).
    pub fn as_bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// The tensor's bytes: a zero-copy slice of the file, exactly `tensor.n_bytes` long.
    ///
    /// # Panics
    /// When `tensor` does not come from this file and does not fit inside it.
    pub fn tensor_data(&self, tensor: &TensorInfo) -> &[u8] {
        let start = self.data_offset + tensor.offset;
        let end = start + tensor.n_bytes;
        self.storage
            .bytes()
            .get(start as usize..end as usize)
            .expect("the TensorInfo comes from this file, whose tensors were checked to fit")
    }

    fn required(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    /// `Ok(None)` when absent, else `convert` of the value.
    fn optional<'a, T>(
        &'a self,
        key: &str,
        convert: impl FnOnce(&'a GgufFile, &str) -> Result<T, GgufError>,
    ) -> Result<Option<T>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => convert(self, key).map(Some),
        }
    }

    fn integer<T: TryFrom<i128>>(&self, key: &str, expected: &'static str) -> Result<T, GgufError> {
        let value = self.required(key)?;
        let integer = value
            .as_integer()
            .ok_or_else(|| wrong_type(key, expected, value))?;
        T::try_from(integer).map_err(|_| GgufError::OutOfRange {
            key: key.to_string(),
            expected,
            value: integer.to_string(),
        })
    }

    /// An integer value of any width that fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.integer(key, "u32")
    }

    /// An integer value of any width that fits in `u64`.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.integer(key, "u64")
    }

    /// An integer value of any width that fits in `i64`.
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        self.integer(key, "i64")
    }

    /// An `f32` value, or an `f64` value rounded to `f32`.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.required(key)? {
            Value::F32(v) => Ok(*v),
            Value::F64(v) => Ok(*v as f32),
            other => Err(wrong_type(key, "f32", other)),
        }
    }

    /// A boolean value.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        let value = self.required(key)?;
        value
            .as_bool()
            .ok_or_else(|| wrong_type(key, "bool", value))
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let value = self.required(key)?;
        value
            .as_str()
            .ok_or_else(|| wrong_type(key, "string", value))
    }

    /// An array value of any element type.
    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        let value = self.required(key)?;
        value
            .as_array()
            .ok_or_else(|| wrong_type(key, "array", value))
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<&[String], GgufError> {
        match self.required(key)? {
            Value::Array(Array::String(strings)) => Ok(strings),
            other => Err(wrong_type(key, "array of string", other)),
        }
    }

    /// An array of `f32`.
    pub fn get_f32_array(&self, key: &str) -> Result<&[f32], GgufError> {
        match self.required(key)? {
            Value::Array(Array::F32(values)) => Ok(values),
            other => Err(wrong_type(key, "array of f32", other)),
        }
    }

    /// An array of `i32`.
    pub fn get_i32_array(&self, key: &str) -> Result<&[i32], GgufError> {
        match self.required(key)? {
            Value::Array(Array::I32(values)) => Ok(values),
            other => Err(wrong_type(key, "array of i32", other)),
        }
    }

    /// Like [`GgufFile::get_u32`], but `Ok(None)` when the key is absent.
    pub fn get_u32_opt(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.optional(key, GgufFile::get_u32)
    }

    /// Like [`GgufFile::get_u64`], but `Ok(None)` when the key is absent.
    pub fn get_u64_opt(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.optional(key, GgufFile::get_u64)
    }

    /// Like [`GgufFile::get_i64`], but `Ok(None)` when the key is absent.
    pub fn get_i64_opt(&self, key: &str) -> Result<Option<i64>, GgufError> {
        self.optional(key, GgufFile::get_i64)
    }

    /// Like [`GgufFile::get_f32`], but `Ok(None)` when the key is absent.
    pub fn get_f32_opt(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.optional(key, GgufFile::get_f32)
    }

    /// Like [`GgufFile::get_bool`], but `Ok(None)` when the key is absent.
    pub fn get_bool_opt(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.optional(key, GgufFile::get_bool)
    }

    /// Like [`GgufFile::get_str`], but `Ok(None)` when the key is absent.
    pub fn get_str_opt(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.optional(key, GgufFile::get_str)
    }

    /// Like [`GgufFile::get_array`], but `Ok(None)` when the key is absent.
    pub fn get_array_opt(&self, key: &str) -> Result<Option<&Array>, GgufError> {
        self.optional(key, GgufFile::get_array)
    }

    /// Like [`GgufFile::get_str_array`], but `Ok(None)` when the key is absent.
    pub fn get_str_array_opt(&self, key: &str) -> Result<Option<&[String]>, GgufError> {
        self.optional(key, GgufFile::get_str_array)
    }

    /// Like [`GgufFile::get_f32_array`], but `Ok(None)` when the key is absent.
    pub fn get_f32_array_opt(&self, key: &str) -> Result<Option<&[f32]>, GgufError> {
        self.optional(key, GgufFile::get_f32_array)
    }

    /// Like [`GgufFile::get_i32_array`], but `Ok(None)` when the key is absent.
    pub fn get_i32_array_opt(&self, key: &str) -> Result<Option<&[i32]>, GgufError> {
        self.optional(key, GgufFile::get_i32_array)
    }
}

fn wrong_type(key: &str, expected: &'static str, found: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: found.type_description(),
    }
}
