//! Writes a few tiny GGUF files that exercise every value type, nested arrays, a custom
//! alignment and tensors of several types: seeds for the `gguf_reader` fuzz target.
//!
//! Real files given after the directory are shrunk into seeds too: same keys and value types
//! with arrays cut to a few elements, and their first tensors cut to one block each.
//!
//! `cargo run -p runit-gguf --example make_fuzz_seeds -- fuzz/corpus/gguf_reader [real.gguf...]`

use std::borrow::Cow;
use std::path::PathBuf;

use runit_gguf::{Array, GgufError, GgufFile, GgufWriter, Value};
use runit_quant::GgmlType;

fn every_value() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::String("llama".into())),
        ("u8", Value::U8(1)),
        ("i8", Value::I8(-1)),
        ("u16", Value::U16(2)),
        ("i16", Value::I16(-2)),
        ("u32", Value::U32(3)),
        ("i32", Value::I32(-3)),
        ("u64", Value::U64(4)),
        ("i64", Value::I64(-4)),
        ("f32", Value::F32(0.5)),
        ("f64", Value::F64(0.25)),
        ("bool", Value::Bool(true)),
        (
            "tokens",
            Value::Array(Array::String(vec!["<s>".into(), "ab".into(), "é".into()])),
        ),
        ("scores", Value::Array(Array::F32(vec![0.0, -1.0, -2.0]))),
        ("types", Value::Array(Array::I32(vec![3, 1, 1]))),
        (
            "nested",
            Value::Array(Array::Array(vec![
                Array::U8(vec![1, 2]),
                Array::Array(vec![Array::Bool(vec![true, false])]),
            ])),
        ),
    ]
}

fn write_seed(
    path: PathBuf,
    alignment: Option<u32>,
    tensors: &[(GgmlType, Vec<u64>)],
) -> Result<(), GgufError> {
    let mut writer = GgufWriter::new();
    if let Some(alignment) = alignment {
        writer.add_metadata("general.alignment", Value::U32(alignment))?;
    }
    for (key, value) in every_value() {
        writer.add_metadata(key, value)?;
    }
    for (index, (ty, shape)) in tensors.iter().enumerate() {
        writer.add_tensor(format!("blk.{index}.weight"), *ty, shape.clone())?;
    }
    writer.write_to_path(&path, |index, info| {
        Ok(Cow::Owned(vec![index as u8 + 1; info.n_bytes as usize]))
    })?;
    println!("wrote {}", path.display());
    Ok(())
}

/// `array` cut to at most `keep` elements (nested arrays too).
fn shrink(array: &Array, keep: usize) -> Array {
    fn cut<T: Clone>(values: &[T], keep: usize) -> Vec<T> {
        values[..values.len().min(keep)].to_vec()
    }
    match array {
        Array::U8(v) => Array::U8(cut(v, keep)),
        Array::I8(v) => Array::I8(cut(v, keep)),
        Array::U16(v) => Array::U16(cut(v, keep)),
        Array::I16(v) => Array::I16(cut(v, keep)),
        Array::U32(v) => Array::U32(cut(v, keep)),
        Array::I32(v) => Array::I32(cut(v, keep)),
        Array::U64(v) => Array::U64(cut(v, keep)),
        Array::I64(v) => Array::I64(cut(v, keep)),
        Array::F32(v) => Array::F32(cut(v, keep)),
        Array::F64(v) => Array::F64(cut(v, keep)),
        Array::Bool(v) => Array::Bool(cut(v, keep)),
        Array::String(v) => Array::String(cut(v, keep)),
        Array::Array(v) => Array::Array(cut(v, keep).iter().map(|a| shrink(a, keep)).collect()),
    }
}

/// A small copy of the real file at `source`: see the module documentation.
fn write_shrunk(source: &str, path: PathBuf) -> Result<(), GgufError> {
    let file = GgufFile::open(source)?;
    let mut writer = GgufWriter::new();
    for (key, value) in file.metadata() {
        let value = match value {
            Value::Array(array) => Value::Array(shrink(array, 16)),
            scalar => scalar.clone(),
        };
        writer.add_metadata(key.clone(), value)?;
    }
    let tensors: Vec<_> = file.tensors().iter().take(8).collect();
    for tensor in &tensors {
        writer.add_tensor(
            tensor.name.clone(),
            tensor.ty,
            vec![tensor.ty.block_size() as u64],
        )?;
    }
    writer.write_to_path(&path, |index, info| {
        Ok(Cow::Borrowed(
            &file.tensor_data(tensors[index])[..info.n_bytes as usize],
        ))
    })?;
    println!("wrote {} from {source}", path.display());
    Ok(())
}

fn main() -> Result<(), GgufError> {
    let directory = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "fuzz/corpus/gguf_reader".to_string()),
    );
    std::fs::create_dir_all(&directory)?;
    write_seed(directory.join("seed-metadata-only.gguf"), None, &[])?;
    write_seed(
        directory.join("seed-tensors.gguf"),
        None,
        &[
            (GgmlType::F32, vec![4]),
            (GgmlType::Q4_0, vec![32, 2]),
            (GgmlType::Q4_K, vec![256]),
            (GgmlType::F16, vec![2, 2, 2, 2]),
        ],
    )?;
    write_seed(
        directory.join("seed-align8.gguf"),
        Some(8),
        &[(GgmlType::Q8_0, vec![32]), (GgmlType::I8, vec![3])],
    )?;
    for source in std::env::args().skip(2) {
        let stem = PathBuf::from(&source);
        let stem = stem.file_stem().unwrap_or_default().to_string_lossy();
        write_shrunk(&source, directory.join(format!("seed-shrunk-{stem}.gguf")))?;
    }
    Ok(())
}
