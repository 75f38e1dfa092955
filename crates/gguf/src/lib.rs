//! GGUF v2/v3 reader and writer.
//!
//! [`GgufFile`] memory-maps a file, parses its metadata into typed [`Value`]s and its tensor
//! table into [`TensorInfo`]s, and hands out tensor data as zero-copy byte slices. The reader
//! treats every file as hostile: it never panics, never allocates more than the file could
//! hold, and refuses a malformed file with a [`GgufError`] naming the problem and its byte
//! offset (and the path, when opened from one). Big-endian and version-1 files are refused.
//!
//! [`GgufWriter`] writes version-3 files, streaming tensor data one tensor at a time.
//!
//! ```
//! use std::borrow::Cow;
//! use runit_gguf::{Array, GgufFile, GgufWriter, Value};
//! use runit_quant::GgmlType;
//!
//! let mut writer = GgufWriter::new();
//! writer.add_metadata("general.architecture", Value::String("llama".into()))?;
//! writer.add_metadata("llama.block_count", Value::U32(2))?;
//! writer.add_metadata(
//!     "tokenizer.ggml.tokens",
//!     Value::Array(Array::String(vec!["<s>".into(), "hi".into()])),
//! )?;
//! writer.add_tensor("output_norm.weight", GgmlType::F32, vec![4])?;
//! let mut bytes = Vec::new();
//! writer.write(&mut bytes, |_index, _info| {
//!     let weights: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|w| w.to_le_bytes()).collect();
//!     Ok(Cow::Owned(weights))
//! })?;
//!
//! let file = GgufFile::from_bytes(bytes)?;
//! assert_eq!(file.version(), 3);
//! assert_eq!(file.get_str("general.architecture")?, "llama");
//! assert_eq!(file.get_u32("llama.block_count")?, 2);
//! assert_eq!(file.get_str_array("tokenizer.ggml.tokens")?, ["<s>", "hi"]);
//! assert!(file.get_f32("llama.block_count").is_err()); // wrong type: the error says so
//! let norm = file.tensor("output_norm.weight").expect("written above");
//! assert_eq!((norm.ty, norm.shape.as_slice(), norm.n_bytes), (GgmlType::F32, &[4u64][..], 16));
//! assert_eq!(&file.tensor_data(norm)[..4], &1.0f32.to_le_bytes());
//! # Ok::<(), runit_gguf::GgufError>(())
//! ```

mod error;
mod file;
mod parse;
mod tensor;
mod value;
mod writer;

pub use error::GgufError;
pub use file::GgufFile;
pub use parse::{DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH};
pub use tensor::{TensorInfo, MAX_DIMS};
pub use value::{Array, Value, ValueType};
pub use writer::{GgufWriter, WRITE_VERSION};
