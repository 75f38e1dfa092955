//! Writer → reader round trips (property-based), writer refusals, and the typed getters.

use std::borrow::Cow;
use std::collections::HashSet;

use proptest::collection::vec;
use proptest::prelude::*;
use runit_gguf::{Array, GgufError, GgufFile, GgufWriter, TensorInfo, Value, ValueType};
use runit_quant::{GgmlType, ALL_TYPES};

fn finite_f32() -> impl Strategy<Value = f32> {
    any::<f32>().prop_filter("NaN never equals itself", |v| !v.is_nan())
}

fn finite_f64() -> impl Strategy<Value = f64> {
    any::<f64>().prop_filter("NaN never equals itself", |v| !v.is_nan())
}

fn text() -> impl Strategy<Value = String> {
    "\\PC{0,12}"
}

fn flat_array() -> impl Strategy<Value = Array> {
    prop_oneof![
        vec(any::<u8>(), 0..8).prop_map(Array::U8),
        vec(any::<i8>(), 0..8).prop_map(Array::I8),
        vec(any::<u16>(), 0..8).prop_map(Array::U16),
        vec(any::<i16>(), 0..8).prop_map(Array::I16),
        vec(any::<u32>(), 0..8).prop_map(Array::U32),
        vec(any::<i32>(), 0..8).prop_map(Array::I32),
        vec(any::<u64>(), 0..8).prop_map(Array::U64),
        vec(any::<i64>(), 0..8).prop_map(Array::I64),
        vec(finite_f32(), 0..8).prop_map(Array::F32),
        vec(finite_f64(), 0..8).prop_map(Array::F64),
        vec(any::<bool>(), 0..8).prop_map(Array::Bool),
        vec(text(), 0..8).prop_map(Array::String),
    ]
}

fn array() -> impl Strategy<Value = Array> {
    flat_array().prop_recursive(3, 24, 4, |inner| vec(inner, 0..4).prop_map(Array::Array))
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u8>().prop_map(Value::U8),
        any::<i8>().prop_map(Value::I8),
        any::<u16>().prop_map(Value::U16),
        any::<i16>().prop_map(Value::I16),
        any::<u32>().prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        finite_f32().prop_map(Value::F32),
        finite_f64().prop_map(Value::F64),
        any::<bool>().prop_map(Value::Bool),
        text().prop_map(Value::String),
        array().prop_map(Value::Array),
    ]
}

/// A tensor description: type, shape (row a whole number of blocks), seed for its bytes.
fn tensor() -> impl Strategy<Value = (GgmlType, Vec<u64>, u64)> {
    (
        prop::sample::select(ALL_TYPES.to_vec()),
        1u64..3,
        vec(1u64..4, 0..4),
        any::<u64>(),
    )
        .prop_map(|(ty, blocks, mut rest, seed)| {
            rest.insert(0, blocks * ty.block_size() as u64);
            (ty, rest, seed)
        })
}

/// Deterministic pseudo-random bytes (xorshift), so shrinking never touches big vectors.
fn bytes_from_seed(seed: u64, length: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn written_files_read_back_identically(
        entries in vec(("[a-z][a-z0-9._]{0,15}", value()), 0..12),
        tensors in vec(tensor(), 0..6),
        alignment in prop::option::of(prop::sample::select(vec![1u32, 8, 32, 64, 4096])),
    ) {
        let mut writer = GgufWriter::new();
        let mut metadata = Vec::new();
        if let Some(alignment) = alignment {
            writer.add_metadata("general.alignment", Value::U32(alignment)).expect("valid");
            metadata.push(("general.alignment".to_string(), Value::U32(alignment)));
        }
        let mut seen: HashSet<String> = metadata.iter().map(|(key, _)| key.clone()).collect();
        for (key, value) in entries {
            if seen.insert(key.clone()) {
                writer.add_metadata(key.clone(), value.clone()).expect("fresh key");
                metadata.push((key, value));
            }
        }
        let mut expected_data = Vec::new();
        for (index, (ty, shape, seed)) in tensors.iter().enumerate() {
            writer.add_tensor(format!("tensor.{index}"), *ty, shape.clone()).expect("valid shape");
            let n_bytes = ty.row_bytes(shape[0]).expect("whole blocks")
                * shape[1..].iter().product::<u64>();
            expected_data.push(bytes_from_seed(*seed, n_bytes));
        }
        let mut bytes = Vec::new();
        writer
            .write(&mut bytes, |index, info| {
                assert_eq!(info.name, format!("tensor.{index}"));
                Ok(Cow::Borrowed(expected_data[index].as_slice()))
            })
            .expect("write to memory");

        let file = GgufFile::from_bytes(bytes).expect("read back");
        let alignment = u64::from(alignment.unwrap_or(32));
        prop_assert_eq!(file.version(), 3);
        prop_assert_eq!(file.alignment(), alignment);
        prop_assert_eq!(file.data_offset() % alignment, 0);
        prop_assert_eq!(file.metadata(), metadata.as_slice());
        prop_assert_eq!(file.tensors().len(), tensors.len());
        for (index, ((ty, shape, _), info)) in tensors.iter().zip(file.tensors()).enumerate() {
            prop_assert_eq!(&info.name, &format!("tensor.{index}"));
            prop_assert_eq!(info.ty, *ty);
            prop_assert_eq!(&info.shape, shape);
            prop_assert_eq!(info.offset % alignment, 0);
            prop_assert_eq!(file.tensor_data(info), expected_data[index].as_slice());
        }
    }
}

fn sample_file() -> GgufFile {
    let mut writer = GgufWriter::new();
    let entries = [
        ("u8", Value::U8(7)),
        ("i32.negative", Value::I32(-5)),
        ("u64.big", Value::U64(u64::MAX)),
        ("f32", Value::F32(1.5)),
        ("f64", Value::F64(0.25)),
        ("bool", Value::Bool(true)),
        ("string", Value::String("llama".into())),
        (
            "strings",
            Value::Array(Array::String(vec!["a".into(), "b".into()])),
        ),
        ("floats", Value::Array(Array::F32(vec![0.5, -1.0]))),
        ("ints", Value::Array(Array::I32(vec![1, -2, 3]))),
    ];
    for (key, value) in entries {
        writer.add_metadata(key, value).expect("unique keys");
    }
    let mut bytes = Vec::new();
    writer
        .write(&mut bytes, |_, _| unreachable!("no tensors"))
        .expect("write");
    GgufFile::from_bytes(bytes).expect("read")
}

#[test]
fn getters_convert_integers_and_floats() {
    let file = sample_file();
    assert_eq!(file.get_u32("u8").expect("u8 fits u32"), 7);
    assert_eq!(file.get_u64("u8").expect("u8 fits u64"), 7);
    assert_eq!(file.get_i64("i32.negative").expect("fits i64"), -5);
    assert_eq!(file.get_u64("u64.big").expect("u64"), u64::MAX);
    assert_eq!(file.get_f32("f32").expect("f32"), 1.5);
    assert_eq!(file.get_f32("f64").expect("f64 accepted"), 0.25);
    assert!(file.get_bool("bool").expect("bool"));
    assert_eq!(file.get_str("string").expect("str"), "llama");
    assert_eq!(file.get_str_array("strings").expect("strings"), ["a", "b"]);
    assert_eq!(file.get_f32_array("floats").expect("floats"), [0.5, -1.0]);
    assert_eq!(file.get_i32_array("ints").expect("ints"), [1, -2, 3]);
    assert_eq!(
        file.get_array("ints").expect("array").element_type(),
        ValueType::I32
    );
    assert_eq!(file.get_u32_opt("absent").expect("absent is fine"), None);
    assert_eq!(file.get_str_opt("string").expect("present"), Some("llama"));
    assert_eq!(file.get("u8").and_then(Value::as_u64), Some(7));
    assert_eq!(file.get("i32.negative").and_then(Value::as_u64), None);
}

#[test]
fn getter_errors_name_key_and_types() {
    let file = sample_file();
    let error = file.get_u32("absent").expect_err("missing");
    assert!(matches!(&error, GgufError::MissingKey { key } if key == "absent"));
    assert_eq!(error.to_string(), "missing metadata key `absent`");

    let error = file.get_str("u8").expect_err("wrong type");
    assert!(
        matches!(&error, GgufError::WrongType { key, expected: "string", found } if key == "u8" && found == "u8")
    );
    let error = file.get_str_array("ints").expect_err("wrong element type");
    assert_eq!(
        error.to_string(),
        "metadata key `ints`: expected array of string, found array of i32"
    );
    let error = file
        .get_f32_opt("string")
        .expect_err("present but wrong type");
    assert!(
        error.to_string().contains("expected f32, found string"),
        "{error}"
    );

    let error = file.get_u32("u64.big").expect_err("too big");
    assert!(
        matches!(&error, GgufError::OutOfRange { key, expected: "u32", .. } if key == "u64.big")
    );
    assert!(file.get_u64("i32.negative").is_err());
    assert!(file.get_bool("f32").is_err());
}

#[test]
fn writer_refuses_bad_input() {
    let mut writer = GgufWriter::new();
    writer.add_metadata("k", Value::U8(1)).expect("first");
    assert!(matches!(
        writer.add_metadata("k", Value::U8(2)),
        Err(GgufError::InvalidMetadata { .. })
    ));
    for bad in [Value::U32(0), Value::U32(24), Value::U64(32)] {
        assert!(writer.add_metadata("general.alignment", bad).is_err());
    }
    let mut deep = Array::U8(vec![1]);
    for _ in 0..runit_gguf::MAX_ARRAY_DEPTH {
        deep = Array::Array(vec![deep]);
    }
    assert!(writer.add_metadata("deep", Value::Array(deep)).is_err());

    writer
        .add_tensor("w", GgmlType::Q4_0, vec![64, 2])
        .expect("valid");
    assert!(writer.add_tensor("w", GgmlType::F32, vec![1]).is_err());
    assert!(writer.add_tensor("x", GgmlType::Q4_0, vec![48]).is_err());
    assert!(writer.add_tensor("y", GgmlType::F32, vec![1; 5]).is_err());
    assert!(writer
        .add_tensor("z", GgmlType::F32, vec![u64::MAX, 2])
        .is_err());

    let error = writer
        .write(Vec::new(), |_, info: &TensorInfo| {
            Ok(Cow::Owned(vec![0; info.n_bytes as usize - 1]))
        })
        .expect_err("short data");
    assert!(
        matches!(
            error,
            GgufError::TensorDataLength {
                expected: 72,
                found: 71,
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn write_to_path_renames_a_complete_file() {
    let directory =
        std::env::temp_dir().join(format!("runit-gguf-roundtrip-{}", std::process::id()));
    std::fs::create_dir_all(&directory).expect("temp dir");
    let path = directory.join("tiny.gguf");
    let mut writer = GgufWriter::new();
    writer
        .add_metadata("general.architecture", Value::String("llama".into()))
        .expect("key");
    writer
        .add_tensor("w", GgmlType::F16, vec![8, 3])
        .expect("tensor");
    let data: Vec<u8> = (0..48).collect();
    writer
        .write_to_path(&path, |_, _| Ok(Cow::Borrowed(&data[..])))
        .expect("write");
    let file = GgufFile::open(&path).expect("open");
    assert_eq!(file.path(), Some(path.as_path()));
    assert_eq!(file.tensor_data(&file.tensors()[0]), &data[..]);
    let names: Vec<_> = std::fs::read_dir(&directory)
        .expect("list")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    assert_eq!(names, ["tiny.gguf"], "temporary file left behind");

    // A failing data callback leaves neither the file nor a temporary behind.
    let failed = directory.join("failed.gguf");
    let mut writer = GgufWriter::new();
    writer
        .add_tensor("w", GgmlType::F32, vec![4])
        .expect("tensor");
    let error = writer
        .write_to_path(&failed, |_, _| Ok(Cow::Owned(Vec::new())))
        .expect_err("wrong length");
    assert!(error.to_string().contains("failed.gguf"), "{error}");
    assert_eq!(std::fs::read_dir(&directory).expect("list").count(), 1);
    std::fs::remove_dir_all(&directory).expect("clean up");
}
