//! Dequantization against gguf-py / ggml, bit for bit: every tensor of every model file
//! that has a `golden/dequant/*.dequant.jsonl.gz` and can be found here.

mod common;

use std::collections::BTreeMap;

use common::{find_model, golden_dir, read_jsonl_gz, sha256_hex, Gguf};
use runit_quant::{dequantize, GgmlType};

/// Neumaier-compensated f64 sum: accurate enough that the golden pairwise sums are the
/// only source of difference.
#[derive(Default)]
struct Sum {
    sum: f64,
    compensation: f64,
}

impl Sum {
    fn add(&mut self, value: f64) {
        let total = self.sum + value;
        if self.sum.abs() >= value.abs() {
            self.compensation += (self.sum - total) + value;
        } else {
            self.compensation += (value - total) + self.sum;
        }
        self.sum = total;
    }
    fn value(&self) -> f64 {
        self.sum + self.compensation
    }
}

fn as_f32(value: &serde_json::Value) -> f32 {
    value.as_f64().expect("number") as f32
}

/// Checks one golden tensor line against the file; returns the tensor type.
fn check_tensor(gguf: &Gguf, golden: &serde_json::Value) -> GgmlType {
    let name = golden["name"].as_str().expect("name");
    let where_ = format!("{}: {name}", gguf.path.display());
    let tensor = gguf
        .tensor(name)
        .unwrap_or_else(|| panic!("{where_}: missing"));
    let ty = GgmlType::from_name(golden["type"].as_str().expect("type")).expect("known type");
    assert_eq!(tensor.ty, ty, "{where_}: type");
    let ne: Vec<u64> = golden["ne"]
        .as_array()
        .expect("ne")
        .iter()
        .map(|v| v.as_u64().expect("ne entry"))
        .collect();
    assert_eq!(tensor.ne, ne, "{where_}: shape");
    let bytes = gguf.read(tensor);
    assert_eq!(
        sha256_hex(&bytes),
        golden["data_sha256"].as_str().expect("sha"),
        "{where_}: raw bytes (reader bug?)"
    );

    let n = tensor.n_elements() as usize;
    assert_eq!(golden["n_elements"].as_u64(), Some(n as u64), "{where_}");
    let mut values = vec![0.0f32; n];
    dequantize(ty, &bytes, &mut values).unwrap_or_else(|e| panic!("{where_}: {e}"));

    for (i, expected) in golden["first"]
        .as_array()
        .expect("first")
        .iter()
        .enumerate()
    {
        let expected = as_f32(expected);
        assert_eq!(
            values[i].to_bits(),
            expected.to_bits(),
            "{where_} ({ty}): element {i} is {}, expected {expected}",
            values[i]
        );
    }
    for pair in golden["samples"].as_array().expect("samples") {
        let i = pair[0].as_u64().expect("index") as usize;
        let expected = as_f32(&pair[1]);
        assert_eq!(
            values[i].to_bits(),
            expected.to_bits(),
            "{where_} ({ty}): element {i} is {}, expected {expected}",
            values[i]
        );
    }

    let (mut sum, mut sum_sq, mut sum_abs) = (Sum::default(), Sum::default(), Sum::default());
    for &v in &values {
        let v = f64::from(v);
        sum.add(v);
        sum_sq.add(v * v);
        sum_abs.add(v.abs());
    }
    let expected_abs = golden["sum_abs"].as_f64().expect("sum_abs");
    let close = |found: f64, expected: f64, scale: f64| {
        (found - expected).abs() <= 1e-9 * scale.abs() + f64::MIN_POSITIVE
    };
    let expected_sum = golden["sum"].as_f64().expect("sum");
    assert!(
        close(sum.value(), expected_sum, expected_abs),
        "{where_}: sum {} vs {expected_sum}",
        sum.value()
    );
    let expected_sq = golden["sum_sq"].as_f64().expect("sum_sq");
    assert!(
        close(sum_sq.value(), expected_sq, expected_sq),
        "{where_}: sum_sq {} vs {expected_sq}",
        sum_sq.value()
    );
    assert!(
        close(sum_abs.value(), expected_abs, expected_abs),
        "{where_}: sum_abs {} vs {expected_abs}",
        sum_abs.value()
    );
    ty
}

/// Checks every golden file whose name passes `select`; returns (files checked, tensors).
fn check_files(select: impl Fn(&str) -> bool) -> (usize, usize) {
    let dir = golden_dir().join("dequant");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("dir entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".dequant.jsonl.gz"))
        .collect();
    paths.sort();
    let (mut files, mut total) = (0, 0);
    for path in paths {
        let lines = read_jsonl_gz(&path);
        let header = &lines[0]["header"];
        let file_name = header["file"].as_str().expect("header.file");
        if !select(file_name) {
            continue;
        }
        let Some(model) = find_model(file_name) else {
            println!("skipped {file_name}: model file not found here");
            continue;
        };
        let gguf = Gguf::open(&model);
        let mut per_type: BTreeMap<GgmlType, usize> = BTreeMap::new();
        for golden in &lines[1..] {
            *per_type.entry(check_tensor(&gguf, golden)).or_default() += 1;
        }
        let checked: usize = per_type.values().sum();
        assert_eq!(
            Some(checked as u64),
            header["n_tensors"].as_u64(),
            "{file_name}: tensors"
        );
        println!("{file_name}: {checked} tensors bit-exact {per_type:?}");
        files += 1;
        total += checked;
    }
    (files, total)
}

#[test]
fn synthetic_models_dequantize_bit_exact() {
    let (files, tensors) = check_files(|name| name.starts_with("synth-"));
    println!("synthetic: {files} files, {tensors} tensors");
    // The 16 shipped synthetic files are always present.
    assert!(files >= 16, "only {files} synthetic files checked");
    assert!(tensors > 0);
}

#[test]
fn real_models_dequantize_bit_exact() {
    let (files, tensors) = check_files(|name| !name.starts_with("synth-"));
    println!("real: {files} files, {tensors} tensors");
    if files == 0 {
        println!("no real model file found (run scripts/fetch_models.py)");
    }
    // A file that was found but held no tensors would have failed above; when files exist,
    // something must have been checked.
    assert!(files == 0 || tensors > 0);
}
