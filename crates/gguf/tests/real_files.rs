//! Reads every real and synthetic model file that is present and checks it against the
//! llama.cpp inventory (`MODELS.json`) and the per-tensor checksums in `dequant/`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;
use runit_gguf::{GgufFile, Value};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/golden");
const MODELS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models");

/// Largest tensor whose bytes are hashed (keeps the test fast on the 500 MB F32 file).
const MAX_HASHED_BYTES: u64 = 8 << 20;
/// Tensors hashed per file.
const HASHED_PER_FILE: usize = 6;

fn gguf_files_in(directory: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(directory) else {
        println!("skipping {}: directory absent", directory.display());
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "gguf"))
        .collect();
    files.sort();
    files
}

fn inventory() -> HashMap<String, Json> {
    let text = std::fs::read_to_string(format!("{GOLDEN}/MODELS.json")).expect("MODELS.json");
    let models: Vec<Json> = serde_json::from_str(&text).expect("MODELS.json parses");
    models
        .into_iter()
        .map(|model| {
            (
                model["file"].as_str().expect("file name").to_string(),
                model,
            )
        })
        .collect()
}

/// Checks tensor count, per-tensor types and the hyperparameters against the inventory entry.
fn check_inventory(file: &GgufFile, model: &Json) {
    let name = file
        .path()
        .expect("opened from a path")
        .display()
        .to_string();
    assert_eq!(
        file.tensors().len() as u64,
        model["n_tensors"].as_u64().expect("n_tensors"),
        "{name}: tensor count"
    );
    let types = model["tensor_types"].as_object().expect("tensor_types");
    assert_eq!(
        types.len(),
        file.tensors().len(),
        "{name}: tensor_types entries"
    );
    for (tensor_name, ty) in types {
        let tensor = file
            .tensor(tensor_name)
            .unwrap_or_else(|| panic!("{name}: tensor {tensor_name} missing"));
        assert_eq!(
            tensor.ty.name(),
            ty.as_str().expect("type name"),
            "{name}: {tensor_name}"
        );
    }
    let arch = file.get_str("general.architecture").expect("architecture");
    assert_eq!(
        arch,
        model["arch"].as_str().expect("arch"),
        "{name}: architecture"
    );
    for (key, expected) in model["hparams"].as_object().expect("hparams") {
        let key = format!("{arch}.{key}");
        match file.get(&key).expect("hparam present") {
            Value::F32(_) | Value::F64(_) => assert_eq!(
                f64::from(file.get_f32(&key).expect("float")),
                expected.as_f64().expect("float"),
                "{name}: {key}"
            ),
            _ => assert_eq!(
                file.get_u64(&key).expect("integer"),
                expected.as_u64().expect("integer"),
                "{name}: {key}"
            ),
        }
    }
    let n_vocab = file
        .get_str_array("tokenizer.ggml.tokens")
        .expect("tokens")
        .len();
    assert_eq!(
        n_vocab as u64,
        model["n_vocab"].as_u64().expect("n_vocab"),
        "{name}: n_vocab"
    );
}

/// Checks `data_sha256` of up to [`HASHED_PER_FILE`] small tensors; returns how many matched.
fn check_checksums(file: &GgufFile, stem: &str) -> usize {
    let path = format!("{GOLDEN}/dequant/{stem}.dequant.jsonl.gz");
    let Ok(gz) = std::fs::File::open(&path) else {
        println!("no dequant checksums for {stem}");
        return 0;
    };
    let mut checked = 0;
    for line in BufReader::new(GzDecoder::new(gz)).lines() {
        let record: Json = serde_json::from_str(&line.expect("gzip line")).expect("json line");
        let Some(name) = record["name"].as_str() else {
            continue; // the header line
        };
        let tensor = file
            .tensor(name)
            .unwrap_or_else(|| panic!("{stem}: tensor {name} listed in dequant but absent"));
        let shape: Vec<u64> = record["ne"]
            .as_array()
            .expect("ne")
            .iter()
            .map(|dim| dim.as_u64().expect("dim"))
            .collect();
        assert_eq!(tensor.shape, shape, "{stem}: {name} shape");
        assert_eq!(
            tensor.ty.name(),
            record["type"].as_str().expect("type"),
            "{stem}: {name}"
        );
        if tensor.n_bytes > MAX_HASHED_BYTES || checked == HASHED_PER_FILE {
            continue;
        }
        let data = file.tensor_data(tensor);
        assert_eq!(data.len() as u64, tensor.n_bytes);
        let digest: String = Sha256::digest(data)
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        assert_eq!(
            digest,
            record["data_sha256"].as_str().expect("sha"),
            "{stem}: {name} bytes"
        );
        checked += 1;
    }
    checked
}

#[test]
fn reads_every_model_file_present() {
    let inventory = inventory();
    let files = gguf_files_in(Path::new(MODELS));
    let mut opened = 0;
    let mut hashed = 0;
    for path in &files {
        let file = GgufFile::open(path).unwrap_or_else(|error| panic!("{error}"));
        let file_name = path
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .to_string();
        assert_eq!(
            file.file_size(),
            std::fs::metadata(path).expect("stat").len()
        );
        match inventory.get(&file_name) {
            Some(model) => check_inventory(&file, model),
            None => println!("{file_name} is not in MODELS.json; only parsed"),
        }
        let stem = file_name.trim_end_matches(".gguf");
        hashed += check_checksums(&file, stem);
        opened += 1;
    }
    println!("opened {opened} model files, hashed {hashed} tensors");
    assert!(opened > 0, "no model file present");
    assert!(hashed > 0, "no tensor checksum checked");
}

#[test]
fn reads_llama_cpp_vocab_files() {
    let files = gguf_files_in(Path::new(&format!(
        "{GOLDEN}/tokenizer/llama_cpp_vocab_tests"
    )));
    for path in &files {
        let file = GgufFile::open(path).unwrap_or_else(|error| panic!("{error}"));
        let tokens = file.get_str_array("tokenizer.ggml.tokens").expect("tokens");
        assert!(!tokens.is_empty(), "{}: empty vocabulary", path.display());
        assert!(file.get_str("tokenizer.ggml.model").is_ok());
        // Vocab-only files: every per-token array has one entry per token.
        if let Some(types) = file
            .get_i32_array_opt("tokenizer.ggml.token_type")
            .expect("i32")
        {
            assert_eq!(types.len(), tokens.len());
        }
    }
    println!("opened {} vocab files", files.len());
    assert!(!files.is_empty(), "no vocab file present");
}
