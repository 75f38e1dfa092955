//! Hand-built malformed files: each must be refused with the right typed error and byte offset.

use runit_gguf::{GgufError, GgufFile, MAX_ARRAY_DEPTH};

/// Little-endian GGUF bytes built field by field.
#[derive(Default, Clone)]
struct Bytes(Vec<u8>);

impl Bytes {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Bytes {
        Bytes::default()
            .raw(b"GGUF")
            .u32(version)
            .u64(n_tensors)
            .u64(n_kv)
    }
    fn raw(mut self, bytes: &[u8]) -> Bytes {
        self.0.extend_from_slice(bytes);
        self
    }
    fn u32(self, v: u32) -> Bytes {
        self.raw(&v.to_le_bytes())
    }
    fn u64(self, v: u64) -> Bytes {
        self.raw(&v.to_le_bytes())
    }
    fn string(self, s: &str) -> Bytes {
        self.u64(s.len() as u64).raw(s.as_bytes())
    }
    /// A metadata entry `key: u32 = value`.
    fn kv_u32(self, key: &str, value: u32) -> Bytes {
        self.string(key).u32(4).u32(value)
    }
    /// A tensor-table entry.
    fn tensor(self, name: &str, shape: &[u64], type_id: u32, offset: u64) -> Bytes {
        let mut out = self.string(name).u32(shape.len() as u32);
        for &dim in shape {
            out = out.u64(dim);
        }
        out.u32(type_id).u64(offset)
    }
    /// Zero padding up to a multiple of 32, then `n` data bytes.
    fn data(mut self, n: usize) -> Bytes {
        while !self.0.len().is_multiple_of(32) {
            self.0.push(0);
        }
        self.0.extend(std::iter::repeat_n(0xab, n));
        self
    }
    fn len(&self) -> u64 {
        self.0.len() as u64
    }
    fn parse(self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(self.0)
    }
}

fn error_of(bytes: Bytes) -> GgufError {
    match bytes.parse() {
        Ok(_) => panic!("malformed file accepted"),
        Err(error) => {
            // Every message is printable and names something concrete.
            assert!(!error.to_string().is_empty());
            error
        }
    }
}

#[test]
fn well_formed_v2_and_v3_files_are_read() {
    for version in [2, 3] {
        let file = Bytes::header(version, 1, 1)
            .kv_u32("answer", 42)
            .tensor("t", &[8, 2], 0, 0)
            .data(64)
            .parse()
            .expect("valid file");
        assert_eq!(file.version(), version);
        assert_eq!(file.data_offset(), 96);
        assert_eq!(file.get_u32("answer").expect("u32"), 42);
        let tensor = file.tensor("t").expect("tensor");
        assert_eq!(
            (tensor.n_elements(), tensor.n_rows(), tensor.n_bytes),
            (16, 2, 64)
        );
        assert_eq!(file.tensor_data(tensor), &[0xab; 64][..]);
    }
}

#[test]
fn truncated_header() {
    let error = error_of(Bytes::default().raw(b"GGUF").u32(3).raw(&[1, 0]));
    assert!(
        matches!(
            error,
            GgufError::Truncated {
                offset: 8,
                needed: 8,
                remaining: 2,
                ..
            }
        ),
        "{error}"
    );
    let error = error_of(Bytes::default().raw(b"GG"));
    assert!(
        matches!(error, GgufError::Truncated { offset: 0, .. }),
        "{error}"
    );
}

#[test]
fn bad_magic_old_version_and_big_endian_are_refused() {
    let error = error_of(Bytes::default().raw(b"GGML").u32(3).u64(0).u64(0));
    assert!(
        matches!(error, GgufError::BadMagic { found } if &found == b"GGML"),
        "{error}"
    );
    let error = error_of(Bytes::header(1, 0, 0));
    assert!(
        matches!(error, GgufError::UnsupportedVersion { version: 1 }),
        "{error}"
    );
    let error = error_of(Bytes::header(4, 0, 0));
    assert!(
        matches!(error, GgufError::UnsupportedVersion { version: 4 }),
        "{error}"
    );
    let error = error_of(Bytes::header(0x0300_0000, 0, 0));
    assert!(
        matches!(
            error,
            GgufError::BigEndian {
                raw: 0x0300_0000,
                version: 3
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("big-endian"), "{error}");
}

#[test]
fn truncated_metadata_names_the_key() {
    // The value of `answer` is cut after two of its four bytes.
    let bytes = Bytes::header(3, 0, 1).string("answer").u32(4).raw(&[1, 2]);
    let error = error_of(bytes);
    let GgufError::Truncated { what, offset, .. } = &error else {
        panic!("{error}");
    };
    assert!(what.contains("answer"), "{error}");
    assert_eq!(*offset, 24 + 8 + 6 + 4);
}

#[test]
fn truncated_tensor_table_names_the_tensor() {
    let bytes = Bytes::header(3, 1, 0).string("weights").u32(2).u64(8);
    let error = error_of(bytes);
    let GgufError::Truncated { what, offset, .. } = &error else {
        panic!("{error}");
    };
    assert!(
        what.contains("weights") && what.contains("dimension 1"),
        "{error}"
    );
    assert_eq!(*offset, 24 + 8 + 7 + 4 + 8);
}

#[test]
fn absurd_counts_are_refused_before_allocating() {
    let error = error_of(Bytes::header(3, u64::MAX, 0));
    assert!(
        matches!(error, GgufError::CountTooLarge { offset: 8, .. }),
        "{error}"
    );
    let error = error_of(Bytes::header(3, 0, 1 << 60));
    assert!(
        matches!(error, GgufError::CountTooLarge { offset: 16, .. }),
        "{error}"
    );
    // Each count alone fits, together they do not.
    let bytes = Bytes::header(3, 1, 1).raw(&[0; 30]);
    let error = error_of(bytes);
    assert!(matches!(error, GgufError::CountTooLarge { .. }), "{error}");
    // An array of a billion u32 in a file of a few dozen bytes.
    let bytes = Bytes::header(3, 0, 1)
        .string("big")
        .u32(9)
        .u32(4)
        .u64(1 << 30)
        .raw(&[0; 16]);
    let error = error_of(bytes);
    let GgufError::CountTooLarge {
        what,
        offset,
        count,
        ..
    } = &error
    else {
        panic!("{error}");
    };
    assert!(what.contains("big"), "{error}");
    assert_eq!((*offset, *count), (24 + 8 + 3 + 4 + 4, 1 << 30));
    // An array of strings: each needs at least its 8-byte length.
    let bytes = Bytes::header(3, 0, 1)
        .string("s")
        .u32(9)
        .u32(8)
        .u64(3)
        .u64(0)
        .u64(0);
    assert!(matches!(
        error_of(bytes),
        GgufError::CountTooLarge { max: 2, .. }
    ));
}

#[test]
fn absurd_string_lengths_are_refused() {
    let error = error_of(Bytes::header(3, 0, 1).u64(u64::MAX - 3).raw(&[0; 20]));
    assert!(
        matches!(
            error,
            GgufError::StringTooLong {
                offset: 24,
                remaining: 20,
                ..
            }
        ),
        "{error}"
    );
    let bytes = Bytes::header(3, 0, 1)
        .string("name")
        .u32(8)
        .u64(1 << 40)
        .raw(b"short");
    let error = error_of(bytes);
    let GgufError::StringTooLong { what, offset, .. } = &error else {
        panic!("{error}");
    };
    assert!(what.contains("name"), "{error}");
    assert_eq!(*offset, 24 + 8 + 4 + 4);
}

#[test]
fn invalid_utf8_is_refused() {
    let bytes = Bytes::header(3, 0, 1)
        .u64(2)
        .raw(&[0xff, 0xfe])
        .u32(4)
        .u32(0);
    let error = error_of(bytes);
    assert!(
        matches!(error, GgufError::InvalidUtf8 { offset: 32, .. }),
        "{error}"
    );
    let bytes = Bytes::header(3, 0, 1)
        .string("text")
        .u32(8)
        .u64(1)
        .raw(&[0x80]);
    let error = error_of(bytes);
    assert!(error.to_string().contains("text"), "{error}");
}

#[test]
fn unknown_value_and_tensor_types_are_refused() {
    let error = error_of(Bytes::header(3, 0, 1).string("k").u32(13).u32(0));
    assert!(
        matches!(error, GgufError::UnknownValueType { type_id: 13, offset: 33, ref key } if key == "k"),
        "{error}"
    );
    // Unknown array element type.
    let error = error_of(Bytes::header(3, 0, 1).string("k").u32(9).u32(99).u64(0));
    assert!(matches!(
        error,
        GgufError::UnknownValueType {
            type_id: 99,
            offset: 37,
            ..
        }
    ));
    // Type id 4 (the removed Q4_2) is not a ggml type.
    let error = error_of(Bytes::header(3, 1, 0).tensor("w", &[32], 4, 0).data(32));
    let GgufError::UnknownTensorType {
        tensor,
        type_id: 4,
        offset,
    } = &error
    else {
        panic!("{error}");
    };
    assert_eq!((tensor.as_str(), *offset), ("w", 24 + 8 + 1 + 4 + 8));
}

#[test]
fn tensor_data_past_the_end_is_refused() {
    let error = error_of(Bytes::header(3, 1, 0).tensor("w", &[16], 0, 0).data(60));
    assert!(
        matches!(
            error,
            GgufError::TensorOutOfBounds {
                start: 64,
                end: 128,
                file_size: 124,
                offset: 24,
                ..
            }
        ),
        "{error}"
    );
    // An offset so large the end overflows.
    let error = error_of(
        Bytes::header(3, 1, 0)
            .tensor("w", &[16], 0, u64::MAX - 31)
            .data(64),
    );
    assert!(
        matches!(error, GgufError::TensorOutOfBounds { .. }),
        "{error}"
    );
}

#[test]
fn overlapping_tensors_are_refused() {
    let bytes = Bytes::header(3, 2, 0)
        .tensor("a", &[16], 0, 0)
        .tensor("b", &[8], 0, 32)
        .data(128);
    let error = error_of(bytes);
    let GgufError::TensorOverlap { tensor, other, .. } = &error else {
        panic!("{error}");
    };
    assert_eq!((tensor.as_str(), other.as_str()), ("b", "a"));
    // Adjacent tensors are fine.
    let bytes = Bytes::header(3, 2, 0)
        .tensor("a", &[8], 0, 0)
        .tensor("b", &[8], 0, 32)
        .data(64);
    assert!(bytes.parse().is_ok());
}

#[test]
fn overflowing_and_excess_dimensions_are_refused() {
    let bytes = Bytes::header(3, 1, 0)
        .tensor("w", &[1 << 32, 1 << 32], 0, 0)
        .data(0);
    let error = error_of(bytes);
    assert!(
        matches!(error, GgufError::ShapeOverflow { offset: 33, .. }),
        "{error}"
    );
    // Fits in u64 but not in ggml's signed 64-bit element count.
    let bytes = Bytes::header(3, 1, 0)
        .tensor("w", &[1 << 63], 24, 0)
        .data(0);
    assert!(matches!(error_of(bytes), GgufError::ShapeOverflow { .. }));
    let bytes = Bytes::header(3, 1, 0)
        .tensor("w", &[1, 1, 1, 1, 1], 0, 0)
        .data(4);
    let error = error_of(bytes);
    assert!(
        matches!(
            error,
            GgufError::TooManyDims {
                n_dims: 5,
                offset: 33,
                max: 4,
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn row_length_must_be_whole_blocks() {
    // Q4_K (id 12) has 256-element blocks.
    let bytes = Bytes::header(3, 1, 0)
        .tensor("w", &[32, 2], 12, 0)
        .data(1024);
    let error = error_of(bytes);
    assert!(
        matches!(
            error,
            GgufError::RowNotBlockMultiple {
                row_length: 32,
                block_size: 256,
                offset: 24,
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn misaligned_offsets_are_refused() {
    let bytes = Bytes::header(3, 1, 0).tensor("w", &[4], 0, 4).data(64);
    let error = error_of(bytes);
    assert!(
        matches!(
            error,
            GgufError::MisalignedTensor {
                data_offset: 4,
                alignment: 32,
                offset: 24,
                ..
            }
        ),
        "{error}"
    );
    // With general.alignment = 4 the same offset is fine.
    let bytes = Bytes::header(3, 1, 1)
        .kv_u32("general.alignment", 4)
        .tensor("w", &[4], 0, 4)
        .data(64);
    let file = bytes.parse().expect("aligned to 4");
    assert_eq!(file.alignment(), 4);
}

#[test]
fn alignment_must_be_a_power_of_two() {
    for bad in [0, 3, 48] {
        let bytes = Bytes::header(3, 0, 1).kv_u32("general.alignment", bad);
        let error = error_of(bytes);
        assert!(
            matches!(error, GgufError::BadAlignment { value, offset: 24 } if value == u64::from(bad)),
            "{error}"
        );
    }
    let bytes = Bytes::header(3, 0, 1)
        .string("general.alignment")
        .u32(6)
        .u32(0);
    assert!(matches!(error_of(bytes), GgufError::WrongType { .. }));
}

#[test]
fn duplicates_are_refused() {
    let bytes = Bytes::header(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2);
    let error = error_of(bytes);
    assert!(
        matches!(error, GgufError::DuplicateKey { ref key, offset: 41 } if key == "k"),
        "{error}"
    );
    let bytes = Bytes::header(3, 2, 0)
        .tensor("w", &[8], 0, 0)
        .tensor("w", &[8], 0, 32)
        .data(64);
    let error = error_of(bytes);
    assert!(
        matches!(error, GgufError::DuplicateTensor { ref tensor, offset: 57 } if tensor == "w"),
        "{error}"
    );
}

#[test]
fn nested_array_depth_is_bounded() {
    let nested = |depth: usize| {
        let mut bytes = Bytes::header(3, 0, 1).string("deep").u32(9);
        for _ in 1..depth {
            bytes = bytes.u32(9).u64(1);
        }
        bytes.u32(4).u64(1).u32(7)
    };
    let file = nested(MAX_ARRAY_DEPTH).parse().expect("depth at the limit");
    assert_eq!(
        file.get_array("deep").expect("array").depth(),
        MAX_ARRAY_DEPTH
    );
    let error = error_of(nested(MAX_ARRAY_DEPTH + 1));
    assert!(matches!(error, GgufError::ArrayTooDeep { .. }), "{error}");
}

#[test]
fn every_prefix_of_a_valid_file_is_refused_without_panicking() {
    let bytes = Bytes::header(3, 2, 3)
        .kv_u32("general.alignment", 32)
        .string("strings")
        .u32(9)
        .u32(8)
        .u64(2)
        .string("a")
        .string("bc")
        .string("nested")
        .u32(9)
        .u32(9)
        .u64(1)
        .u32(6)
        .u64(1)
        .u32(0)
        .tensor("a", &[8], 0, 0)
        .tensor("b", &[32, 2], 8, 32)
        .data(32 + 68);
    let full = bytes.0.clone();
    let file = bytes.parse().expect("valid file");
    assert_eq!(file.tensors().len(), 2);
    for length in 0..full.len() {
        let result = GgufFile::from_bytes(full[..length].to_vec());
        assert!(result.is_err(), "prefix of {length} bytes accepted");
    }
}

#[test]
fn errors_from_open_name_the_path() {
    let directory = std::env::temp_dir().join(format!("runit-gguf-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&directory).expect("temp dir");
    let path = directory.join("bad.gguf");
    std::fs::write(&path, Bytes::header(1, 0, 0).0).expect("write");
    let error = GgufFile::open(&path).expect_err("version 1");
    assert!(
        error.to_string().contains(&*path.to_string_lossy()),
        "{error}"
    );
    assert!(matches!(
        error.cause(),
        GgufError::UnsupportedVersion { version: 1 }
    ));
    let missing = directory.join("absent.gguf");
    let error = GgufFile::open(&missing).expect_err("absent");
    assert!(error.to_string().contains("absent.gguf"), "{error}");
    assert!(matches!(error.cause(), GgufError::Io { .. }));
    std::fs::remove_dir_all(&directory).expect("clean up");
    assert!(Bytes::header(3, 0, 0).len() == 24);
}
