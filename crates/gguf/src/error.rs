//! The crate's error type: every way a GGUF file can be unreadable, malformed or missing a key.

use std::io;
use std::path::PathBuf;

use runit_quant::GgmlType;

/// Everything that can go wrong reading or writing a GGUF file.
///
/// Parse errors name the byte offset at which the problem was found; errors from
/// [`GgufFile::open`](crate::GgufFile::open) and
/// [`GgufWriter::write_to_path`](crate::GgufWriter::write_to_path) are wrapped in
/// [`GgufError::InFile`] so that their message starts with the file path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The inner error happened while reading or writing the file at `path`.
    #[error("{}: {source}", path.display())]
    InFile {
        /// The file being read or written.
        path: PathBuf,
        /// What went wrong.
        source: Box<GgufError>,
    },

    /// An operating-system I/O error.
    #[error("I/O error: {source}")]
    Io {
        /// The underlying error.
        #[from]
        source: io::Error,
    },

    /// The file does not start with the bytes `GGUF`.
    #[error("not a GGUF file: magic at byte 0 is {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The first four bytes of the file.
        found: [u8; 4],
    },

    /// The version field reads as a byte-swapped small number: a big-endian GGUF file.
    #[error(
        "big-endian GGUF files are not supported: the version field at byte 4 reads \
         {raw:#010x} (version {version} byte-swapped); only little-endian files can be read"
    )]
    BigEndian {
        /// The version field as read little-endian.
        raw: u32,
        /// The version the field holds when read big-endian.
        version: u32,
    },

    /// A GGUF version other than 2 or 3 (version 1 used 32-bit counts and is refused).
    #[error("unsupported GGUF version {version} at byte 4: only versions 2 and 3 are supported")]
    UnsupportedVersion {
        /// The version number found.
        version: u32,
    },

    /// The file ends before a structure that must be present.
    #[error(
        "truncated file: {what} at byte {offset} needs {needed} bytes but only {remaining} remain"
    )]
    Truncated {
        /// What was being read (names the key or tensor when known).
        what: String,
        /// Absolute byte offset of the read.
        offset: u64,
        /// Bytes the read needs.
        needed: u64,
        /// Bytes left in the file from `offset`.
        remaining: u64,
    },

    /// A count (of tensors, keys, array elements) that the rest of the file could not possibly hold.
    #[error(
        "absurd {what} {count} at byte {offset}: the {remaining} bytes left in the file can hold \
         at most {max}"
    )]
    CountTooLarge {
        /// What is being counted (names the key when known).
        what: String,
        /// The count read from the file.
        count: u64,
        /// Absolute byte offset of the count.
        offset: u64,
        /// Bytes left in the file after the count.
        remaining: u64,
        /// The largest count those bytes could hold.
        max: u64,
    },

    /// A string length larger than the rest of the file.
    #[error(
        "absurd string length {length} for {what} at byte {offset}: only {remaining} bytes remain"
    )]
    StringTooLong {
        /// Which string (names the key or tensor when known).
        what: String,
        /// The length read from the file.
        length: u64,
        /// Absolute byte offset of the length field.
        offset: u64,
        /// Bytes left in the file after the length field.
        remaining: u64,
    },

    /// A string that is not valid UTF-8.
    #[error("{what} at byte {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// Which string (names the key or tensor when known).
        what: String,
        /// Absolute byte offset of the string's bytes.
        offset: u64,
    },

    /// A metadata value type id outside 0..=12.
    #[error("unknown metadata value type {type_id} for key `{key}` at byte {offset}")]
    UnknownValueType {
        /// The key whose value has this type.
        key: String,
        /// The type id read.
        type_id: u32,
        /// Absolute byte offset of the type id.
        offset: u64,
    },

    /// Arrays nested deeper than [`MAX_ARRAY_DEPTH`](crate::MAX_ARRAY_DEPTH).
    #[error(
        "array nesting for key `{key}` at byte {offset} exceeds the limit of {max_depth} levels"
    )]
    ArrayTooDeep {
        /// The key whose value is nested too deeply.
        key: String,
        /// Absolute byte offset of the innermost array header.
        offset: u64,
        /// The nesting limit.
        max_depth: usize,
    },

    /// A metadata key that appears twice.
    #[error("duplicate metadata key `{key}` at byte {offset}")]
    DuplicateKey {
        /// The repeated key.
        key: String,
        /// Absolute byte offset of the second occurrence.
        offset: u64,
    },

    /// `general.alignment` is zero or not a power of two.
    #[error("general.alignment at byte {offset} is {value}: must be a nonzero power of two")]
    BadAlignment {
        /// The value found.
        value: u64,
        /// Absolute byte offset of the key/value entry.
        offset: u64,
    },

    /// A tensor type id that ggml does not define.
    #[error("unknown tensor type id {type_id} for tensor `{tensor}` at byte {offset}")]
    UnknownTensorType {
        /// The tensor's name.
        tensor: String,
        /// The type id read.
        type_id: u32,
        /// Absolute byte offset of the type id.
        offset: u64,
    },

    /// A tensor name that appears twice.
    #[error("duplicate tensor name `{tensor}` at byte {offset}")]
    DuplicateTensor {
        /// The repeated name.
        tensor: String,
        /// Absolute byte offset of the second occurrence.
        offset: u64,
    },

    /// A tensor with more than [`MAX_DIMS`](crate::MAX_DIMS) dimensions.
    #[error(
        "tensor `{tensor}` at byte {offset} has {n_dims} dimensions; at most {max} are allowed"
    )]
    TooManyDims {
        /// The tensor's name.
        tensor: String,
        /// The dimension count read.
        n_dims: u32,
        /// Absolute byte offset of the dimension count.
        offset: u64,
        /// The limit (ggml's `GGML_MAX_DIMS`).
        max: usize,
    },

    /// A tensor whose element count or byte size overflows 64-bit (or signed 64-bit) arithmetic.
    #[error("tensor `{tensor}` at byte {offset}: shape {shape:?} overflows 64-bit sizes")]
    ShapeOverflow {
        /// The tensor's name.
        tensor: String,
        /// The shape read (ggml order).
        shape: Vec<u64>,
        /// Absolute byte offset of the shape.
        offset: u64,
    },

    /// A tensor whose row length (`shape[0]`) is not a whole number of its type's blocks.
    #[error(
        "tensor `{tensor}` at byte {offset}: row length {row_length} is not a multiple of \
         {ty}'s block size {block_size}"
    )]
    RowNotBlockMultiple {
        /// The tensor's name.
        tensor: String,
        /// The tensor's type.
        ty: GgmlType,
        /// `shape[0]`.
        row_length: u64,
        /// Elements per block of `ty`.
        block_size: usize,
        /// Absolute byte offset of the tensor's entry.
        offset: u64,
    },

    /// A tensor data offset that is not a multiple of the file's alignment.
    #[error(
        "tensor `{tensor}` at byte {offset}: data offset {data_offset} is not a multiple of the \
         alignment {alignment}"
    )]
    MisalignedTensor {
        /// The tensor's name.
        tensor: String,
        /// The tensor's offset relative to the data section.
        data_offset: u64,
        /// The file's alignment.
        alignment: u64,
        /// Absolute byte offset of the tensor's offset field.
        offset: u64,
    },

    /// A tensor whose bytes extend past the end of the file.
    #[error(
        "tensor `{tensor}` (entry at byte {offset}): data bytes {start}..{end} lie past the end \
         of the file ({file_size} bytes)"
    )]
    TensorOutOfBounds {
        /// The tensor's name.
        tensor: String,
        /// Absolute start of the data (saturated on overflow).
        start: u64,
        /// Absolute end of the data (saturated on overflow).
        end: u64,
        /// The file's size.
        file_size: u64,
        /// Absolute byte offset of the tensor's entry.
        offset: u64,
    },

    /// Two tensors whose data ranges overlap.
    #[error(
        "tensor `{tensor}` (data bytes {start}..{end}) overlaps tensor `{other}` \
         (data bytes {other_start}..{other_end})"
    )]
    TensorOverlap {
        /// The later tensor (by data offset).
        tensor: String,
        /// Its absolute data start.
        start: u64,
        /// Its absolute data end.
        end: u64,
        /// The tensor it overlaps.
        other: String,
        /// The other tensor's absolute data start.
        other_start: u64,
        /// The other tensor's absolute data end.
        other_end: u64,
    },

    /// A metadata key that is not in the file.
    #[error("missing metadata key `{key}`")]
    MissingKey {
        /// The key asked for.
        key: String,
    },

    /// A metadata value of another type than the one asked for.
    #[error("metadata key `{key}`: expected {expected}, found {found}")]
    WrongType {
        /// The key asked for.
        key: String,
        /// The type asked for.
        expected: &'static str,
        /// The type the file holds (`"array of string"` for arrays).
        found: String,
    },

    /// A metadata value of an acceptable type whose value does not fit the type asked for.
    #[error("metadata key `{key}`: value {value} does not fit in {expected}")]
    OutOfRange {
        /// The key asked for.
        key: String,
        /// The type asked for.
        expected: &'static str,
        /// The value found, printed.
        value: String,
    },

    /// A tensor the writer cannot describe (bad shape, too many dims, duplicate name).
    #[error("cannot write tensor `{tensor}`: {reason}")]
    InvalidTensor {
        /// The tensor's name.
        tensor: String,
        /// Why.
        reason: String,
    },

    /// A metadata entry the writer cannot store (duplicate key, bad alignment value).
    #[error("cannot write metadata key `{key}`: {reason}")]
    InvalidMetadata {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },

    /// The writer's data callback returned the wrong number of bytes for a tensor.
    #[error("tensor `{tensor}`: data callback returned {found} bytes, expected {expected}")]
    TensorDataLength {
        /// The tensor's name.
        tensor: String,
        /// Bytes the tensor's type and shape require.
        expected: u64,
        /// Bytes returned.
        found: u64,
    },
}

impl GgufError {
    /// The error without its [`GgufError::InFile`] wrapper (for matching on the cause).
    pub fn cause(&self) -> &GgufError {
        match self {
            GgufError::InFile { source, .. } => source.cause(),
            other => other,
        }
    }

    /// Wraps `self` in [`GgufError::InFile`] with `path`.
    pub(crate) fn in_file(self, path: impl Into<PathBuf>) -> GgufError {
        GgufError::InFile {
            path: path.into(),
            source: Box::new(self),
        }
    }
}
